//! The `grid-route-simulate` binary, run on a slice of the bundled production trace: its
//! output, its flags and defaults, and its bad-input answers.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The bundled trace (docs/traces), relative to this crate.
fn bundled_trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/traces/mooncake_conversation_trace.jsonl")
}

/// `name` in a fresh directory, removed when the returned guard drops.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// The first `n` requests of the bundled trace, as a file.
fn head_of_trace(n: usize) -> (tempfile::TempDir, PathBuf) {
    let text = std::fs::read_to_string(bundled_trace()).unwrap();
    let head: String = text.lines().take(n).flat_map(|l| [l, "\n"]).collect();
    let (dir, path) = scratch(&format!("head-{n}.jsonl"));
    std::fs::write(&path, head).unwrap();
    (dir, path)
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grid-route-simulate"))
        .args(args)
        .output()
        .unwrap()
}

/// The `results` of `--json` on `trace` at `sites` sites for `policies`, `flags` added.
fn results(trace: &str, sites: &str, policies: &str, flags: &[&str]) -> Vec<Value> {
    let base = [
        "--trace",
        trace,
        "--sites",
        sites,
        "--policies",
        policies,
        "--json",
    ];
    let output = simulate(&[&base[..], flags].concat());
    assert!(
        output.status.success(),
        "{flags:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    report["results"].as_array().unwrap().clone()
}

fn sorted_keys(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    keys.sort();
    keys
}

#[test]
fn json_output_has_the_documented_fields_for_every_policy() {
    let (_dir, trace) = head_of_trace(600);
    let output = simulate(&["--trace", trace.to_str().unwrap(), "--sites", "3", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.starts_with("{\"trace\":"), "{text}");
    let report: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        sorted_keys(&report),
        sorted(&[
            "trace",
            "requests",
            "conversations",
            "sites",
            "engines_per_site",
            "replicas",
            "shared_index",
            "seed",
            "results",
        ])
    );
    assert_eq!(report["requests"], 600);
    // As the library derives them from the blocks: the trace names none.
    let text = std::fs::read(&trace).unwrap();
    let requests = grid_route_simulate::read_trace(&text[..]).unwrap();
    let derived = grid_route_simulate::trace::continued_of(&requests);
    let conversations = derived.iter().filter(|earlier| earlier.is_none()).count();
    assert!(conversations > 0 && conversations < 600);
    assert_eq!(report["conversations"], conversations);
    assert_eq!(report["sites"], 3);
    assert_eq!(report["replicas"], 1);
    assert_eq!(report["shared_index"], false);
    assert_eq!(report["seed"], 1);
    let results = report["results"].as_array().unwrap();
    let policies: Vec<&str> = results
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        [
            "grid-route",
            "round-robin",
            "least-queue",
            "cache-aware",
            "chwbl",
            "oracle"
        ]
    );
    for result in results {
        assert_eq!(
            sorted_keys(result),
            sorted(&[
                "policy",
                "requests",
                "hit_share",
                "held_anywhere_share",
                "ttft_p50_s",
                "ttft_p90_s",
                "ttft_p99_s",
                "max_over_mean_requests",
                "outcomes"
            ])
        );
        assert_eq!(result["requests"], 600);
        let hit = result["hit_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&hit), "{result}");
        let held = result["held_anywhere_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&held), "{result}");
        let (p50, p99) = (
            result["ttft_p50_s"].as_f64().unwrap(),
            result["ttft_p99_s"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99, "{result}");
        assert!(result["max_over_mean_requests"].as_f64().unwrap() >= 1.0);
    }
    // grid-route counts every decision under one of the affinity outcomes.
    let outcomes = results[0]["outcomes"].as_object().unwrap();
    let decided: u64 = outcomes.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(decided, 600);
    assert!(outcomes["sticky"].as_u64().unwrap() > 0, "{outcomes:?}");
}

#[test]
fn the_same_seed_gives_byte_identical_json_and_another_seed_differs() {
    let (_dir, trace) = head_of_trace(800);
    let trace = trace.to_str().unwrap();
    let args = [
        "--trace",
        trace,
        "--sites",
        "4",
        "--replicas",
        "3",
        "--json",
    ];
    let first = simulate(&args);
    let second = simulate(&args);
    assert!(first.status.success());
    assert_eq!(first.stdout, second.stdout);
    let other = simulate(&[&args[..], &["--seed", "2"]].concat());
    assert_ne!(first.stdout, other.stdout);
}

#[test]
fn a_malformed_line_is_refused_with_its_line_number() {
    let (_dir, path) = scratch("bad.jsonl");
    let good = r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}"#;
    std::fs::write(&path, format!("{good}\n{good}\n{{\"timestamp\": 3}}\n")).unwrap();
    let output = simulate(&["--trace", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("simulate: line 3: missing field"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn a_reader_that_closed_early_ends_the_run_quietly() {
    let (_dir, path) = head_of_trace(200);
    for format in [&[][..], &["--json"][..]] {
        // A pipe whose reader is gone, as `simulate | head -c 0` leaves it.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = Command::new(env!("CARGO_BIN_EXE_grid-route-simulate"))
            .args(["--trace", path.to_str().unwrap()])
            .args(format)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "simulate did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "{format:?}: {status}: {stderr}");
        assert!(!stderr.contains("panicked"), "{format:?}: {stderr}");
    }
}

#[test]
fn the_table_and_the_chart_name_every_policy() {
    let (_trace_dir, trace) = head_of_trace(300);
    let (_svg_dir, svg) = scratch("cdf.svg");
    let output = simulate(&[
        "--trace",
        trace.to_str().unwrap(),
        "--policies",
        "grid-route,cache-aware",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).unwrap();
    let head = std::fs::read(&trace).unwrap();
    let requests = grid_route_simulate::read_trace(&head[..]).unwrap();
    let conversations = grid_route_simulate::trace::continued_of(&requests)
        .iter()
        .filter(|earlier| earlier.is_none())
        .count();
    assert!(
        table.contains(&format!(
            "300 requests in {conversations} conversations, 4 sites x 1 engines"
        )),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.starts_with("grid-route ")),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.starts_with("cache-aware ")),
        "{table}"
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg"),
        "{}",
        &chart[..80.min(chart.len())]
    );
    assert!(chart.contains("grid-route (hit "));
    assert!(chart.contains("cache-aware (hit "));
}

#[test]
fn a_flag_without_its_value_exits_2() {
    // Every flag and its default in `--help`: tests/cli.rs.
    let bad = simulate(&["--trace"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_gateway_load_flags_reach_the_run() {
    let (_dir, trace) = head_of_trace(800);
    let trace = trace.to_str().unwrap();
    let run = |extra: &[&str]| {
        let base = [
            "--trace",
            trace,
            "--sites",
            "4",
            "--policies",
            "grid-route",
            "--json",
        ];
        let output = simulate(&[&base[..], extra].concat());
        assert!(output.status.success(), "{extra:?}");
        output.stdout
    };
    let defaults = run(&[]);
    // Written out at their defaults, the flags change nothing; set, they change the run.
    assert_eq!(
        run(&[
            "--count-in-flight",
            "true",
            "--queued-request-seconds",
            "auto",
            "--prefill-price",
            "auto",
            "--queue-window-secs",
            "1",
        ]),
        defaults
    );
    let queue_only = run(&["--count-in-flight", "false"]);
    assert_ne!(queue_only, defaults);
    let fixed = run(&["--queued-request-seconds", "8"]);
    assert_ne!(fixed, defaults);
    assert_ne!(run(&["--queued-request-seconds", "2"]), fixed);
    assert_ne!(run(&["--prefill-price", "10000"]), defaults);
}

#[test]
fn one_prefill_at_a_time_slows_slot_engines_and_leaves_batching_ones_alone() {
    let (_dir, trace) = head_of_trace(400);
    let trace = trace.to_str().unwrap();
    let run = |engine: &[&str], extra: &[&str]| {
        results(trace, "2", "round-robin", &[engine, extra].concat())[0].clone()
    };
    let slots = ["--engine", "slots", "--slots", "8", "--prefill-tps", "2000"];
    let side_by_side = run(&slots, &[]);
    let one_at_a_time = run(&slots, &["--one-prefill-at-a-time"]);
    // Eight slots prefilling at 2,000 tokens a second each against one line at that
    // speed: the prompts that overlap wait for one another.
    for p in ["ttft_p50_s", "ttft_p99_s"] {
        let (side, one) = (
            side_by_side[p].as_f64().unwrap(),
            one_at_a_time[p].as_f64().unwrap(),
        );
        assert!(
            one > side,
            "{p}: {one} s one at a time, {side} s side by side"
        );
    }
    // A batching engine already prefills one request at a time.
    assert_eq!(run(&[], &[]), run(&[], &["--one-prefill-at-a-time"]));
}

#[test]
fn llama_cpp_host_cache_finds_less_than_restoring_every_saved_prompt() {
    let (_dir, trace) = head_of_trace(2000);
    let trace = trace.to_str().unwrap();
    let slots = [
        "--engine",
        "slots",
        "--slots",
        "4",
        "--host-cache-tokens",
        "65536",
    ];
    let share = |extra: &[&str]| {
        results(trace, "2", "round-robin", &[&slots[..], extra].concat())[0]["hit_share"]
            .as_f64()
            .unwrap()
    };
    // Round-robin places the same requests either way: llama.cpp's server searches its host
    // cache only for a slot keeping under half its prompt, so it finds less there.
    let restoring = share(&[]);
    let llama_cpp = share(&["--llama-cpp-host-cache"]);
    assert!(
        llama_cpp < restoring,
        "{llama_cpp} with llama.cpp's rule, {restoring} restoring"
    );
}

#[test]
fn answers_cached_credits_a_continuing_turn_where_its_earlier_turn_was_served() {
    let (_dir, trace) = head_of_trace(2000);
    let trace = trace.to_str().unwrap();
    // Cache-aware's hit share, with `--answers-cached` as given.
    let run = |engine: &[&str], answers: &[&str]| {
        results(trace, "4", "cache-aware", &[engine, answers].concat())[0]["hit_share"]
            .as_f64()
            .unwrap()
    };
    let slots = [
        "--engine",
        "slots",
        "--slots",
        "8",
        "--prefill-tps",
        "10000",
        "--decode-tps",
        "50",
        "--host-cache-tokens",
        "65536",
    ];
    for engine in [&[][..], &slots[..]] {
        let with = run(engine, &["--answers-cached", "true"]);
        let without = run(engine, &["--answers-cached", "false"]);
        // Cache-aware sends a continuing turn to where its history is: it finds the answer
        // there too.
        assert!(
            with > without,
            "{engine:?}: cache-aware {with} with answers, {without} without"
        );
        // Off is the default: the tables of docs/routing.md were made so.
        // The same run to the bit: the simulator draws from its seed alone.
        assert_eq!(run(engine, &[]).to_bits(), without.to_bits(), "{engine:?}");
    }
}

#[test]
fn help_names_every_flag_and_the_defaults_it_runs_with() {
    let output = simulate(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("Usage: grid-route-simulate"), "{help}");
    for flag in [
        "--trace",
        "--sites",
        "--engines-per-site",
        "--replicas",
        "--shared-index",
        "--sessions",
        "--no-threads",
        "--closed-loop",
        "--policies",
        "--seed",
        "--fail-share",
        "--json",
        "--plot",
        "--engine",
        "--slots",
        "--host-cache-tokens",
        "--one-prefill-at-a-time",
        "--llama-cpp-host-cache",
        "--kv-tokens",
        "--max-running",
        "--prefill-tps",
        "--prefill-overhead-ms",
        "--decode-tps",
        "--answers-cached",
        "--poll-interval-ms",
        "--queue-window-secs",
        "--threshold",
        "--exploration",
        "--prefill-price",
        "--queued-request-seconds",
        "--count-in-flight",
        "--engine-feedback",
        "--capacity",
        "--ttl-secs",
    ] {
        assert!(help.contains(flag), "--help names no {flag}:\n{help}");
    }
    for default in [
        "[default: 400000]",
        "[default: 500]",
        "[default: 0.8]",
        "[default: grid-route round-robin least-queue cache-aware chwbl oracle]",
    ] {
        assert!(help.contains(default), "{default}:\n{help}");
    }
}

#[test]
fn the_gateway_defaults_are_the_example_gateways() {
    let queue = grid_route_example::config::QueueConfig::default();
    let args = grid_route_simulate::GatewayArgs::default();
    assert_eq!(
        grid_route_simulate::GATEWAY_POLL_INTERVAL_MS,
        queue.poll_interval_ms
    );
    assert_eq!(args.poll_interval_ms, queue.poll_interval_ms);
    assert_eq!(args.queue_window_secs, queue.window_secs);
    assert_eq!(args.count_in_flight, queue.count_in_flight);
}

#[test]
fn a_bad_flag_or_value_exits_2_naming_the_flag_and_the_rule() {
    for (args, expected) in [
        (
            &["--trace", "trace.jsonl", "--no-such-flag"][..],
            "error: unexpected argument '--no-such-flag' found",
        ),
        (
            &["--trace", "t.jsonl", "--threshold", "1.5"],
            "prefix_affinity.threshold must be in (0, 1], got 1.5",
        ),
        (
            &["--trace", "t.jsonl", "--policies", "grid-route,fastest"],
            "invalid value 'fastest' for '--policies <LIST>'",
        ),
    ] {
        let output = simulate(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = String::from_utf8(output.stderr).unwrap();
        assert!(message.contains(expected), "{args:?}: {message}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
// The JSON's times are rounded to the millisecond: hand-computed ones compare exactly.
#[allow(clippy::float_cmp)]
fn closed_loop_clients_send_each_turn_after_the_answer_before_it() {
    // Conversation 0's two turns and conversation 1's one, sent 1 ms apart, on one engine
    // prefilling 1,000 tokens a second after 0.1 s, and answering 1,000 tokens a second.
    let (_dir, path) = scratch("conversations.jsonl");
    let line = |at: u64, tokens: u64, blocks: &str, conversation: u64| {
        format!(
            r#"{{"timestamp": {at}, "input_length": {tokens}, "output_length": 10, "hash_ids": [{blocks}], "conversation": {conversation}}}"#
        )
    };
    let lines = [
        line(0, 1024, "1, 2", 0),
        line(1, 1536, "1, 2, 3", 0),
        line(2, 1024, "7, 8", 1),
    ];
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let trace = path.to_str().unwrap();
    let engine = [
        "--prefill-tps",
        "1000",
        "--prefill-overhead-ms",
        "100",
        "--decode-tps",
        "1000",
    ];
    let ttfts = |clients: &[&str]| {
        let result =
            results(trace, "1", "round-robin", &[&engine[..], clients].concat())[0].clone();
        ["ttft_p50_s", "ttft_p99_s"].map(|p| result[p].as_f64().unwrap())
    };
    // Open-loop: the second turn waits behind the first's prefill (1.735 s), the other
    // conversation behind both (2.858 s).
    assert_eq!(ttfts(&[]), [1.735, 2.858]);
    // One client: each request starts on an idle engine, the second turn finding the
    // first's 1,024 tokens (0.612 s).
    assert_eq!(ttfts(&["--closed-loop", "1"]), [1.124, 1.124]);
    // Two: conversation 1 begins at once (2.246 s behind the first prefill), and the
    // second turn still waits for the first's answer (1.726 s).
    assert_eq!(ttfts(&["--closed-loop", "2"]), [1.726, 2.246]);
    // Two conversations, as the trace names them.
    let output = simulate(&["--trace", trace, "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["conversations"], 2);
    // A trace names every request's conversation or none.
    let unnamed =
        r#"{"timestamp": 3, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}"#;
    std::fs::write(&path, format!("{}\n{unnamed}\n", lines[0])).unwrap();
    let output = simulate(&["--trace", trace]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("simulate: line 2: no conversation, where the first request names one"),
        "{stderr}"
    );
}
