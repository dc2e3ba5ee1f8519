//! The binary's command line: every subcommand's `--help`, clap's exit status for a bad
//! flag, options with no command going to the demo, and the `keys` commands of
//! docs/architecture.md run
//! exactly as written on the sample bodies the repository ships.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use grid_route_tests::workspace_root;
use serde_json::Value;

fn grid_route_example(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Each subcommand and the flags its help must name.
const SUBCOMMANDS: [(&str, &[&str]); 4] = [
    (
        "demo",
        &["--conversations", "--turns", "--concurrency", "--quick"],
    ),
    ("serve", &["--config", "--log-format", "text", "json"]),
    (
        "keys",
        &[
            "--api",
            "<FILE>",
            "chat",
            "completions",
            "messages",
            "responses",
        ],
    ),
    (
        "mock-engine",
        &[
            "--listen",
            "--name",
            "--model",
            "--max-running",
            "--prefill-tokens-per-second",
            "--decode-ms-per-token",
            "--cache-blocks",
            "--block-bytes",
        ],
    ),
];

#[test]
fn every_subcommand_help_exits_0_and_names_its_flags() {
    for (subcommand, flags) in SUBCOMMANDS {
        let output = grid_route_example(&[subcommand, "--help"]);
        assert_eq!(output.status.code(), Some(0), "{subcommand}");
        let help = stdout(&output);
        assert!(
            help.contains(&format!("Usage: grid-route-example {subcommand}")),
            "{help}"
        );
        for flag in flags {
            assert!(
                help.contains(flag),
                "{subcommand} --help names no {flag}:\n{help}"
            );
        }
    }
}

#[test]
fn the_top_level_help_lists_every_subcommand_and_the_demo_options() {
    let output = grid_route_example(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = stdout(&output);
    for (subcommand, _) in SUBCOMMANDS {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(&format!("{subcommand} "))),
            "no {subcommand} in\n{help}"
        );
    }
    assert!(help.contains("--quick"), "{help}");
}

#[test]
fn help_shows_the_defaults_the_commands_run_with() {
    let mock_engine = stdout(&grid_route_example(&["mock-engine", "--help"]));
    for default in [
        "[default: demo-model]",
        "[default: 4]",
        "[default: 20000]",
        "[default: 4096]",
        "[default: 256]",
    ] {
        assert!(mock_engine.contains(default), "{default}:\n{mock_engine}");
    }
    let serve = stdout(&grid_route_example(&["serve", "--help"]));
    assert!(serve.contains("[default: text]"), "{serve}");
}

#[test]
fn an_unknown_flag_exits_2_with_clap_message_and_prints_nothing_on_stdout() {
    for args in [
        &["--no-such-flag"][..],
        &["demo", "--no-such-flag"],
        &["serve", "--config", "gateway.yaml", "--no-such-flag"],
        &["keys", "--api", "chat", "--no-such-flag", "body.json"],
        &[
            "mock-engine",
            "--listen",
            "127.0.0.1:0",
            "--name",
            "a",
            "--no-such-flag",
        ],
    ] {
        let output = grid_route_example(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = stderr(&output);
        assert!(
            message.starts_with("error: unexpected argument '--no-such-flag' found"),
            "{args:?}: {message}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_bad_value_exits_2_naming_the_flag_and_the_rule() {
    for (args, expected) in [
        (
            &["serve", "--config", "g.yaml", "--log-format", "xml"][..],
            "invalid value 'xml' for '--log-format <FORMAT>'",
        ),
        (
            &["mock-engine", "--listen", "nowhere", "--name", "a"],
            "invalid value 'nowhere' for '--listen <ADDR>'",
        ),
        (&["serve"], "--config <FILE.yaml>"),
    ] {
        let output = grid_route_example(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = stderr(&output);
        assert!(message.contains(expected), "{args:?}: {message}");
    }
}

#[test]
fn simulate_moved_and_says_where_with_any_arguments() {
    for args in [
        &["simulate"][..],
        &["simulate", "--help"],
        &["simulate", "--trace", "t.jsonl", "--sites", "8"],
    ] {
        let output = grid_route_example(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = stderr(&output);
        assert!(
            message.contains("cargo run --release -p grid-route-simulate -- ARGS"),
            "{args:?}: {message}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    // Hidden from the top-level help: only the new spelling is offered.
    let help = stdout(&grid_route_example(&["--help"]));
    assert!(!help.contains("simulate"), "{help}");
}

#[test]
fn options_without_a_command_are_the_demo_options() {
    // Checked by the demo's own parser before anything starts: the demo's `--turns` bound.
    let output = grid_route_example(&["--quick", "--turns", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("invalid value '0' for '--turns <N>'"),
        "{}",
        stderr(&output)
    );
    // The demo's options and another command do not mix.
    let output = grid_route_example(&["--quick", "serve", "--config", "g.yaml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("cannot be used with '--quick'"));
}

/// The `keys` commands of docs/architecture.md, as argument lists after `cargo run ... --`.
fn readme_keys_commands(readme: &str) -> Vec<Vec<String>> {
    const PREFIX: &str = "cargo run -p grid-route-example -- keys ";
    readme
        .lines()
        .filter_map(|line| line.strip_prefix(PREFIX))
        .map(|rest| {
            std::iter::once("keys".to_owned())
                .chain(rest.split_whitespace().map(str::to_owned))
                .collect()
        })
        .collect()
}

/// The output lines docs/architecture.md shows, in its first `json` block after the first `keys`
/// command.
fn readme_keys_output(readme: &str) -> Vec<Value> {
    let after = &readme[readme.find("-- keys --api").unwrap()..];
    let block = &after[after.find("```json\n").unwrap() + "```json\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    block
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The files a `keys` argument list names.
fn files(args: &[String]) -> Vec<&str> {
    args.iter()
        .skip(3) // keys --api API
        .map(String::as_str)
        .collect()
}

/// Checks a keyed line's shape: `file`, `keys` (16 hex digits each), `blocks`, in that
/// order; returns its keys.
fn keyed_line(line: &str, file: &str) -> Vec<String> {
    let value: Value = serde_json::from_str(line).unwrap();
    let mut fields: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(fields, ["blocks", "file", "keys"], "{line}");
    assert!(
        line.starts_with(&format!(r#"{{"file":{file:?},"keys":["#)),
        "{line}"
    );
    let keys: Vec<String> = value["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key.as_str().unwrap().to_owned())
        .collect();
    assert!(!keys.is_empty(), "{line}");
    for key in &keys {
        assert!(
            key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()),
            "{line}"
        );
    }
    assert_eq!(
        value["blocks"].as_u64().unwrap(),
        keys.len() as u64,
        "{line}"
    );
    keys
}

#[test]
fn the_documented_keys_commands_print_one_keyed_line_per_sample_body() {
    let readme = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).unwrap();
    let commands = readme_keys_commands(&readme);
    assert!(commands.len() >= 2, "{commands:?}");
    for args in &commands {
        let args_str: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = grid_route_example(&args_str);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let stdout = stdout(&output);
        let lines: Vec<&str> = stdout.lines().collect();
        let files = files(args);
        assert!(!files.is_empty(), "{args:?}");
        assert_eq!(lines.len(), files.len(), "{stdout}");
        for (line, file) in lines.iter().zip(&files) {
            assert!(
                file.starts_with("grid-route-example/examples/bodies/"),
                "{file}"
            );
            keyed_line(line, file);
        }
    }

    // The first command's two chat turns: turn 2's keys extend turn 1's, and the output
    // has the shape and the key counts the page shows.
    let chat = &commands[0];
    let output = grid_route_example(&chat.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = stdout(&output);
    let lines: Vec<&str> = stdout.lines().collect();
    let files = files(chat);
    let (turn1, turn2) = (
        keyed_line(lines[0], files[0]),
        keyed_line(lines[1], files[1]),
    );
    assert!(turn2.len() > turn1.len());
    assert_eq!(turn2[..turn1.len()], turn1[..]);
    let shown = readme_keys_output(&readme);
    assert_eq!(shown.len(), lines.len());
    for (shown, line) in shown.iter().zip(&lines) {
        let printed: Value = serde_json::from_str(line).unwrap();
        assert_eq!(shown["file"], printed["file"]);
        assert_eq!(shown["blocks"], printed["blocks"]);
        assert_eq!(
            shown["keys"].as_array().unwrap().len(),
            printed["keys"].as_array().unwrap().len()
        );
    }
}

#[test]
fn every_sample_body_keys_under_its_api() {
    let dir = workspace_root().join("grid-route-example/examples/bodies");
    let mut apis = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        // `chat-turn1.json` is a chat body, `messages.json` a messages body.
        let api = name.split(['-', '.']).next().unwrap().to_owned();
        let file = format!("grid-route-example/examples/bodies/{name}");
        let output = grid_route_example(&["keys", "--api", &api, &file]);
        assert_eq!(output.status.code(), Some(0), "{file}: {}", stderr(&output));
        keyed_line(stdout(&output).trim_end(), &file);
        apis.push(api);
    }
    apis.sort_unstable();
    apis.dedup();
    assert_eq!(apis, ["chat", "completions", "messages", "responses"]);
}
