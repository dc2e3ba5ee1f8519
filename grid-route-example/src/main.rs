//! The example gateway built from the grid-route layers.
//!
//! Subcommands: `demo` (the default, with no command) runs the gateway against three mock
//! sites with prefix affinity on and off and prints a comparison; `serve` runs the gateway
//! from a config file; `keys` prints a body's prefix keys; `mock-engine` runs a mock
//! inference engine; `simulate` replays a trace through the routing policies.

use std::process::ExitCode;

use grid_route_example::{demo, gateway, keys, simulate};
use grid_route_mock_engine as mock_engine;

const USAGE: &str = "usage: grid-route-example [command] [args]

commands:
  demo [--conversations N] [--turns N] [--concurrency N] [--quick]
                        three mock sites behind the gateway, a multi-turn workload with
                        prefix affinity on and off, and a table comparing them
                        (the default when no command is given; see demo --help)
  serve --config FILE.yaml [--log-format text|json]
                        run the gateway (SIGHUP reloads FILE, SIGTERM drains and stops)
  keys --api chat|completions|messages|responses FILE...
                        print each body's prefix keys as one JSON line
  mock-engine --listen ADDR --name NAME [options]
                        run a mock OpenAI-compatible engine (see mock-engine --help)
  simulate --trace FILE [options]
                        replay a trace through grid-route and other routing policies
                        in virtual time (see simulate --help)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        return run_demo(&[]);
    };
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        "demo" => run_demo(rest),
        // `grid-route-example --quick` is the default command with options.
        option if option.starts_with("--") => run_demo(&args),
        "serve" => run_serve(rest),
        "keys" => run_keys(rest),
        "mock-engine" => run_mock_engine(rest),
        "simulate" => run_simulate(rest),
        other => {
            eprintln!("unknown command {other:?}; {rest:?} not run\n");
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr as text, filtered by `RUST_LOG` (default `info`).
fn init_tracing() {
    init_tracing_at("info", LogFormat::Text);
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// One human-readable line per event; coloured only on a terminal.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `default_filter`). Text is coloured
/// only when stderr, where the lines go, is a terminal: a file or a pipe gets no escape
/// codes.
fn init_tracing_at(default_filter: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// A subcommand's arguments parsed by `parse`; `--help` prints `usage` and exits 0, bad
/// arguments print the error and `usage` and exit 2.
fn parsed<T, E: std::fmt::Display>(
    args: &[String],
    command: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> Result<T, E>,
) -> Result<T, ExitCode> {
    if args.iter().any(|arg| arg == "-h" || arg == "--help") {
        print!("{usage}");
        return Err(ExitCode::SUCCESS);
    }
    parse(args).map_err(|error| {
        eprintln!("{command}: {error}\n");
        eprint!("{usage}");
        ExitCode::from(2)
    })
}

fn run_demo(args: &[String]) -> ExitCode {
    let options = match parsed(args, "demo", demo::USAGE, demo::parse_args) {
        Ok(options) => options,
        Err(exit) => return exit,
    };
    // The gateway's request log would drown the progress lines: warnings only, unless
    // RUST_LOG asks for more.
    init_tracing_at("warn", LogFormat::Text);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let report = match runtime.block_on(demo::run(&options, demo::Progress::Stderr)) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("demo: {error}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!();
    print!("{report}");
    let mut failed = false;
    for run in [&report.affinity_on, &report.affinity_off] {
        if !run.all_ok() {
            failed = true;
            let mode = if run.affinity { "on" } else { "off" };
            eprintln!(
                "demo: with affinity {mode}, {} of {} requests failed; first failures: {:?}",
                run.requests - run.requests_ok,
                run.requests,
                run.failures
            );
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn run_keys(args: &[String]) -> ExitCode {
    let args = match parsed(args, "keys", keys::USAGE, keys::parse_args) {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    let stdout = std::io::stdout();
    match keys::run(&args, &mut stdout.lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("keys: cannot write the output: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run_mock_engine(args: &[String]) -> ExitCode {
    let args = match parsed(
        args,
        "mock-engine",
        mock_engine::USAGE,
        mock_engine::parse_args,
    ) {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mock-engine: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(mock_engine::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "mock engine failed");
            ExitCode::FAILURE
        }
    }
}

fn run_simulate(args: &[String]) -> ExitCode {
    let args = match parsed(args, "simulate", simulate::USAGE, simulate::parse_args) {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    let report = match simulate::run(&args, simulate::progress_wanted()) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("simulate: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.plot
        && let Err(error) = report.write_svg(path)
    {
        eprintln!("simulate: cannot write {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    if args.json {
        match serde_json::to_string(&report) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                eprintln!("simulate: cannot write the JSON: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{report}");
    }
    ExitCode::SUCCESS
}

const SERVE_USAGE: &str =
    "usage: grid-route-example serve --config FILE.yaml [--log-format text|json]

Runs the gateway. SIGHUP re-reads FILE (a bad file keeps the running config);
SIGTERM or ctrl-c stops accepting connections and drains requests in flight.
Logs go to stderr, filtered by RUST_LOG (default info): text lines (coloured only on a
terminal), or one JSON object per line with --log-format json.
";

fn run_serve(args: &[String]) -> ExitCode {
    let mut config = None;
    let mut log_format = LogFormat::Text;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{SERVE_USAGE}");
                return ExitCode::SUCCESS;
            }
            "--config" => match rest.next() {
                Some(path) => config = Some(std::path::PathBuf::from(path)),
                None => return serve_usage_error("--config needs a file"),
            },
            "--log-format" => match rest.next().map(String::as_str) {
                Some("text") => log_format = LogFormat::Text,
                Some("json") => log_format = LogFormat::Json,
                Some(other) => {
                    return serve_usage_error(&format!(
                        "--log-format must be text or json, got {other:?}"
                    ));
                }
                None => return serve_usage_error("--log-format needs text or json"),
            },
            other => {
                if let Some(path) = other.strip_prefix("--config=") {
                    config = Some(std::path::PathBuf::from(path));
                } else {
                    return serve_usage_error(&format!("unknown argument {other:?}"));
                }
            }
        }
    }
    let Some(config) = config else {
        return serve_usage_error("--config is required");
    };
    init_tracing_at("info", log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("serve: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(gateway::serve(&config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "gateway failed");
            ExitCode::FAILURE
        }
    }
}

fn serve_usage_error(message: &str) -> ExitCode {
    eprintln!("serve: {message}\n");
    eprint!("{SERVE_USAGE}");
    ExitCode::from(2)
}
