//! The `demo` subcommand's arguments.

use clap::builder::RangedU64ValueParser;

use super::DemoOptions;

/// The most of each option the demo accepts: enough for a long run, not a typo's worth.
const MAX_CONVERSATIONS: u64 = 10_000;
const MAX_TURNS: u64 = 100;
const MAX_CONCURRENCY: u64 = 1_000;

/// The arguments of `grid-route-example demo`, also taken by `grid-route-example` with no
/// command.
///
/// Starts three mock engines (sites us-east, eu-west, ap-south) and the gateway in this
/// process, replays a multi-turn workload with prefix affinity on, then the same workload
/// against fresh engines and a fresh gateway with it off, and prints a table comparing
/// them. Progress goes to stderr, the table to stdout.
///
/// The defaults depend on `--quick`, so each flag's help names both (a test checks them
/// against [`DemoOptions::default`] and [`DemoOptions::quick`]).
///
/// ```
/// use clap::Parser;
/// use grid_route_example::demo::DemoArgs;
///
/// #[derive(Parser)]
/// struct Demo {
///     #[command(flatten)]
///     args: DemoArgs,
/// }
///
/// let options = Demo::parse_from(["demo", "--quick", "--turns=4"]).args.options();
/// assert_eq!((options.conversations, options.turns), (6, 4));
/// assert!(Demo::try_parse_from(["demo", "--turns", "0"]).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct DemoArgs {
    /// Chat conversations, each on a shared or a private system prompt; also sets the
    /// Responses chains (one per 10, at least 1) [default: 30; 6 with --quick]
    #[arg(
        long,
        value_name = "N",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_CONVERSATIONS),
    )]
    pub conversations: Option<usize>,
    /// Turns of each conversation, chain and stored conversation [default: 5; 3 with
    /// --quick]
    #[arg(
        long,
        value_name = "N",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_TURNS),
    )]
    pub turns: Option<usize>,
    /// Sessions in flight at once [default: 10; 4 with --quick]
    #[arg(
        long,
        value_name = "N",
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_CONCURRENCY),
    )]
    pub concurrency: Option<usize>,
    /// A small workload (6 conversations, 3 turns, 4 at once); the flags above still
    /// override it
    #[arg(long)]
    pub quick: bool,
}

impl DemoArgs {
    /// The workload these flags ask for: the full or the quick defaults, overridden by
    /// each flag given.
    pub fn options(&self) -> DemoOptions {
        let options = if self.quick {
            DemoOptions::quick()
        } else {
            DemoOptions::default()
        };
        let conversations = self.conversations.unwrap_or(options.conversations);
        let turns = self.turns.unwrap_or(options.turns);
        let concurrency = self.concurrency.unwrap_or(options.concurrency);
        options
            .conversations(conversations)
            .turns(turns)
            .concurrency(concurrency)
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Demo {
        #[command(flatten)]
        args: DemoArgs,
    }

    fn parse(args: &[&str]) -> Result<DemoOptions, String> {
        Demo::try_parse_from(std::iter::once("demo").chain(args.iter().copied()))
            .map(|demo| demo.args.options())
            .map_err(|error| error.to_string())
    }

    #[test]
    fn no_arguments_give_the_full_demo() {
        let options = parse(&[]).unwrap();
        assert_eq!(options, DemoOptions::default());
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
        assert!(error(&["--turns"]).contains("a value is required for '--turns <N>'"));
        assert!(error(&["--turns", "0"]).contains("0 is not in 1..=100"));
        assert!(error(&["--concurrency", "many"]).contains("'many'"));
        assert!(error(&["--fast"]).contains("unexpected argument '--fast'"));
        assert!(error(&["extra"]).contains("unexpected argument 'extra'"));
    }

    #[test]
    fn the_help_names_the_defaults_the_demo_runs_with() {
        let help = Demo::command().render_help().to_string();
        let (full, quick) = (DemoOptions::default(), DemoOptions::quick());
        for (default, quick) in [
            (full.conversations, quick.conversations),
            (full.turns, quick.turns),
            (full.concurrency, quick.concurrency),
        ] {
            let named = format!("[default: {default}; {quick} with --quick]");
            assert!(help.contains(&named), "{named} not in\n{help}");
        }
    }
}
