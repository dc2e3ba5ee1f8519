//! `grid-route-simulate`: replays a request trace through grid-route's routing code and
//! other routers' policies in virtual time, and prints a table (or JSON) of cache hit share
//! and time to first token per policy. See the library's docs and `docs/routing.md`.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;
use grid_route_simulate::{self as simulate, SimulateArgs};

/// Replay a trace through grid-route and other routing policies in virtual time
#[derive(Debug, Parser)]
#[command(name = "grid-route-simulate", version)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn main() -> ExitCode {
    let args = Cli::parse().args;
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
    let text = if args.json {
        match serde_json::to_string(&report) {
            Ok(json) => json + "\n",
            Err(error) => {
                eprintln!("simulate: cannot write the JSON: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        report.to_string()
    };
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped early (`| head`) wanted no more: not an error of the run.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("simulate: cannot write the output: {error}");
            ExitCode::FAILURE
        }
    }
}
