//! The `demo` subcommand's arguments.

use super::DemoOptions;

/// Usage of the `demo` subcommand.
pub const USAGE: &str =
    "usage: grid-route-example [demo] [--conversations N] [--turns N] [--concurrency N] [--quick]

Starts three mock engines (sites us-east, eu-west, ap-south) and the gateway in this
process, replays a multi-turn workload with prefix affinity on, then the same workload
against fresh engines and a fresh gateway with it off, and prints a table comparing them.
Progress goes to stderr, the table to stdout. Running grid-route-example with no command
runs the demo.

options:
  --conversations N  chat conversations, each on a shared or a private system prompt
                     (default 30; also sets the Responses chains: one per 10, at least 1)
  --turns N          turns of each conversation, chain and stored conversation (default 5)
  --concurrency N    sessions in flight at once (default 10)
  --quick            a small workload (6 conversations, 3 turns, 4 at once); the options
                     above still override it
";

/// The most of each option the demo accepts: enough for a long run, not a typo's worth.
const MAX_CONVERSATIONS: usize = 10_000;
const MAX_TURNS: usize = 100;
const MAX_CONCURRENCY: usize = 1_000;

fn count(flag: &str, value: &str, max: usize) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("{flag} must be an integer from 1 to {max}, got {value:?}"))
}

/// Parses the arguments after `demo`; the error says what is wrong, for a usage message.
/// Flags take their value as the next argument or after `=`.
///
/// ```
/// use grid_route_example::demo::parse_args;
///
/// let args = ["--quick", "--turns=4"].map(String::from);
/// let options = parse_args(&args).unwrap();
/// assert_eq!((options.conversations, options.turns), (6, 4));
/// assert!(parse_args(&["--turns".to_owned(), "0".to_owned()]).is_err());
/// ```
pub fn parse_args(args: &[String]) -> Result<DemoOptions, String> {
    let quick = args.iter().any(|arg| arg == "--quick");
    let mut options = if quick {
        DemoOptions::quick()
    } else {
        DemoOptions::default()
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--quick" {
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let (field, max) = match flag {
            "--conversations" => (&mut options.conversations, MAX_CONVERSATIONS),
            "--turns" => (&mut options.turns, MAX_TURNS),
            "--concurrency" => (&mut options.concurrency, MAX_CONCURRENCY),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other => return Err(format!("unexpected argument {other:?}")),
        };
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        *field = count(flag, &value, max)?;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<DemoOptions, String> {
        parse_args(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn no_arguments_give_the_full_demo() {
        let options = parse(&[]).unwrap();
        assert_eq!(
            (options.conversations, options.turns, options.concurrency),
            (30, 5, 10)
        );
        assert!(!options.quick);
    }

    #[test]
    fn flags_take_their_value_either_way_and_override_quick() {
        let options = parse(&["--conversations", "12", "--quick", "--concurrency=3"]).unwrap();
        assert!(options.quick);
        assert_eq!(
            (options.conversations, options.turns, options.concurrency),
            (12, 3, 3)
        );
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let error = |args: &[&str]| parse(args).unwrap_err();
        assert!(error(&["--turns"]).contains("--turns needs a value"));
        assert!(error(&["--turns", "0"]).contains("from 1 to 100"));
        assert!(error(&["--concurrency", "many"]).contains("\"many\""));
        assert!(error(&["--fast"]).contains("unknown option --fast"));
        assert!(error(&["extra"]).contains("unexpected argument"));
    }
}
