//! The example gateway built from the grid-route layers.
//!
//! Subcommands: `keys` prints a body's prefix keys.

use std::process::ExitCode;

const USAGE: &str = "usage: grid-route-example <command> [args]

commands:
  keys --api chat|completions|messages|responses FILE...
                        print each body's prefix keys as one JSON line
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("unknown command {other:?}; {rest:?} not run\n");
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
