//! The example gateway built from the grid-route layers.
//!
//! Subcommands: `demo` (the default, with no command) runs the gateway against three mock
//! sites with prefix affinity on and off and prints a comparison; `serve` runs the gateway
//! from a config file; `keys` prints a body's prefix keys; `mock-engine` runs a mock
//! inference engine. The trace simulator, once `simulate` here, is its own binary now
//! (`grid-route-simulate`, in `benches/simulate`); `simulate` says so.
//!
//! One parser (clap's derive: each subcommand's arguments live next to the code they
//! configure) and one Tokio runtime, on which the chosen subcommand runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use grid_route_example::demo::{self, DemoArgs};
use grid_route_example::gateway;
use grid_route_example::keys::{self, KeysArgs};
use grid_route_mock_engine::{self as mock_engine, MockEngineArgs};

/// An LLM gateway that keeps conversations on the site whose engines hold their prompt
/// prefix in cache, built from the grid-route Tower layers.
///
/// With no command, runs the demo (and takes the demo's options).
#[derive(Debug, Parser)]
#[command(
    name = "grid-route-example",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The demo's options, for the default command.
    #[command(flatten)]
    demo: DemoArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Three mock sites behind the gateway, a multi-turn workload with prefix affinity on
    /// and off, and a table comparing them (the default command)
    Demo(DemoArgs),
    /// Run the gateway from a config file (SIGHUP reloads it, SIGTERM drains and stops)
    Serve(ServeArgs),
    /// Print each request body's prefix keys as one JSON line
    Keys(KeysArgs),
    /// Run a mock OpenAI-compatible inference engine
    MockEngine(MockEngineArgs),
    /// Moved: the trace simulator is the `grid-route-simulate` binary (benches/simulate)
    #[command(hide = true, disable_help_flag = true)]
    Simulate(MovedArgs),
}

/// Whatever followed a command that moved, so that it gets the same answer with any
/// arguments (`--help` included).
#[derive(Debug, clap::Args)]
struct MovedArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// The arguments of `grid-route-example serve`.
///
/// SIGHUP re-reads the config file (a bad file keeps the running config); SIGTERM or
/// ctrl-c stops accepting connections and drains requests in flight. Logs go to stderr,
/// filtered by RUST_LOG (default info).
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The gateway's YAML config file
    #[arg(long, value_name = "FILE.yaml")]
    config: PathBuf,
    /// How log lines are written
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One human-readable line per event; coloured only on a terminal
    Text,
    /// One JSON object per line, for log shippers
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Demo(cli.demo));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("grid-route-example: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(command))
}

/// Runs `command` on the runtime. `keys` does no I/O worth overlapping: it
/// runs on this thread, which `block_on` owns, so no worker is kept from other tasks.
async fn run(command: Command) -> ExitCode {
    match command {
        Command::Demo(args) => run_demo(&args).await,
        Command::Serve(args) => run_serve(&args).await,
        Command::Keys(args) => run_keys(&args),
        Command::MockEngine(args) => run_mock_engine(args).await,
        Command::Simulate(_) => simulate_moved(),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `default_filter`). Text is coloured
/// only when stderr, where the lines go, is a terminal: a file or a pipe gets no escape
/// codes.
fn init_tracing(default_filter: &str, format: LogFormat) {
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

async fn run_demo(args: &DemoArgs) -> ExitCode {
    // The gateway's request log would drown the progress lines: warnings only, unless
    // RUST_LOG asks for more.
    init_tracing("warn", LogFormat::Text);
    let report = match demo::run(&args.options(), demo::Progress::Stderr).await {
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

async fn run_serve(args: &ServeArgs) -> ExitCode {
    init_tracing("info", args.log_format);
    match gateway::serve(&args.config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "gateway failed");
            ExitCode::FAILURE
        }
    }
}

fn run_keys(args: &KeysArgs) -> ExitCode {
    let stdout = std::io::stdout();
    match keys::run(args, &mut stdout.lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("keys: cannot write the output: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run_mock_engine(args: MockEngineArgs) -> ExitCode {
    init_tracing("info", LogFormat::Text);
    match mock_engine::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "mock engine failed");
            ExitCode::FAILURE
        }
    }
}

/// `simulate` left the gateway's binary (it measures routing quality, as the benches
/// measure speed, and its plotting dependency has no place in a gateway): the new spelling.
fn simulate_moved() -> ExitCode {
    eprintln!(
        "grid-route-example: `simulate` moved to its own binary, grid-route-simulate; run\n  \
         cargo run --release -p grid-route-simulate -- ARGS\n\
         with the same ARGS (`-- --help` lists them)"
    );
    ExitCode::from(2)
}
