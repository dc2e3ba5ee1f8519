//! The `keys` command, run as the binary: one JSON line per file, all in one process.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

fn run_raw(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .arg("keys")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
    )
}

fn run(args: &[&str]) -> (i32, Vec<Value>) {
    let (status, stdout) = run_raw(args);
    let lines = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (status, lines)
}

fn write(dir: &std::path::Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn prints_one_line_per_file_with_comparable_keys() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let text = "The same long system prompt for both turns. ".repeat(30);
    let turn1 = write(dir, "turn1.json", &serde_json::json!({"model":"m","messages":[{"role":"system","content":text},{"role":"user","content":"hi"}]}).to_string());
    let turn2 = write(dir, "turn2.json", &serde_json::json!({"model":"m","messages":[{"role":"system","content":text},{"role":"user","content":"hi"},{"role":"assistant","content":text}]}).to_string());
    let short = write(
        dir,
        "short.json",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let tokens = write(
        dir,
        "tokens.json",
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"hologram"}]}]}"#,
    );
    let duplicate = write(
        dir,
        "dup.json",
        r#"{"model":"a","model":"b","messages":[]}"#,
    );

    let (status, lines) = run(&["--api", "chat", &turn1, &turn2, &short, &tokens, &duplicate]);
    assert_eq!(status, 0);
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["file"], turn1.as_str());
    let keys = |line: &Value| -> Vec<String> {
        line["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    };
    let (first, second) = (keys(&lines[0]), keys(&lines[1]));
    assert!(
        first
            .iter()
            .all(|k| k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
    );
    assert!(second.len() > first.len());
    assert_eq!(
        &second[..first.len()],
        &first[..],
        "keys from one process compare"
    );
    assert_eq!(lines[0]["blocks"].as_u64().unwrap(), first.len() as u64);
    for line in &lines[2..] {
        assert!(line["keys"].is_null());
        assert!(!line["reason"].as_str().unwrap().is_empty());
    }
    assert!(lines[4]["reason"].as_str().unwrap().contains("400"));
}

#[test]
fn an_unreadable_file_gets_a_reason_and_a_failing_status() {
    let (status, lines) = run(&["--api", "responses", "/nonexistent/body.json"]);
    assert_eq!(status, 1);
    assert!(lines[0]["keys"].is_null());
    assert!(lines[0]["reason"].as_str().unwrap().contains("cannot read"));
}

#[test]
fn fields_print_in_the_documented_order() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let text = "A prompt long enough for a block or two. ".repeat(20);
    let keyed = write(
        dir,
        "keyed.json",
        &serde_json::json!({"model":"m","prompt":text}).to_string(),
    );
    let short = write(dir, "short.json", r#"{"model":"m","prompt":"hi"}"#);
    let (status, stdout) = run_raw(&["--api", "completions", &keyed, &short]);
    assert_eq!(status, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!(r#"{{"file":{keyed:?},"keys":["#)),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains(r#"],"blocks":"#), "{}", lines[0]);
    assert!(
        lines[1].starts_with(&format!(r#"{{"file":{short:?},"keys":null,"reason":""#)),
        "{}",
        lines[1]
    );
}

#[test]
fn a_file_that_is_not_json_fails_after_printing_its_line() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let text = "A prompt long enough for a block or two. ".repeat(20);
    let good = write(
        dir,
        "good.json",
        &serde_json::json!({"model":"m","prompt":text}).to_string(),
    );
    let bad = write(dir, "notes.txt", "these are notes, not a request body");
    let (status, lines) = run(&["--api", "completions", &bad, &good]);
    assert_eq!(status, 1);
    assert_eq!(lines.len(), 2, "every file still gets its line");
    assert!(lines[0]["keys"].is_null());
    assert!(lines[0]["reason"].as_str().unwrap().contains("unreadable"));
    assert!(lines[1]["keys"].is_array());
}

#[test]
fn bad_arguments_exit_2() {
    assert_eq!(run(&["--api", "grpc", "x.json"]).0, 2);
    assert_eq!(run(&["x.json"]).0, 2);
    assert_eq!(run(&["--api", "chat"]).0, 2);
}
