//! The demo end to end: its library entry in quick mode, and its command line.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use grid_route_example::demo::{self, DemoOptions, Progress, TABLE_LEGEND, TABLE_ROWS};
use grid_route_layer::affinity::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_demo_shows_affinity_raising_the_cache_hit_share() {
    let report = demo::run(&DemoOptions::quick(), Progress::Quiet)
        .await
        .unwrap();
    let (on, off) = (&report.affinity_on, &report.affinity_off);
    for run in [on, off] {
        assert!(run.requests > 0);
        assert_eq!(run.requests_ok, run.requests, "{:?}", run.failures);
        assert!(
            run.pinned_follow_ups > 0,
            "the workload has pinned follow-ups"
        );
        assert_eq!(
            run.pinned_follow_ups_ok, run.pinned_follow_ups,
            "{:?}",
            run.failures
        );
        assert!(run.all_ok());
        let answered: u64 = run.requests_per_site.iter().map(|(_, n)| n).sum();
        assert_eq!(answered, run.requests, "every answer came from a site");
        assert!(run.ttft_p50().is_some() && run.ttft_p99() >= run.ttft_p50());
    }
    assert_eq!(on.requests, off.requests, "the same workload twice");
    assert!(
        on.cache_hit_share() > off.cache_hit_share(),
        "cache-hit share with affinity {:.3} <= without {:.3}",
        on.cache_hit_share(),
        off.cache_hit_share()
    );
    assert!(
        on.outcome(Outcome::Sticky) > 0,
        "{:?}",
        on.affinity_outcomes
    );
    assert!(
        off.affinity_outcomes.iter().all(|(_, n)| *n == 0),
        "affinity off decides nothing: {:?}",
        off.affinity_outcomes
    );

    let table = report.to_string();
    for row in TABLE_ROWS {
        assert!(table.contains(row), "no {row:?} row in\n{table}");
    }
    for site in ["us-east", "eu-west", "ap-south"] {
        assert!(table.contains(&format!("requests to {site}")), "{table}");
    }
    for outcome in Outcome::ALL {
        assert!(table.contains(&format!("affinity {outcome}")), "{table}");
    }
    let header = table.lines().next().unwrap();
    assert!(header.contains("affinity on") && header.contains("affinity off"));
    assert!(table.trim_end().ends_with(TABLE_LEGEND));
}

fn demo_command(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_demo_arguments_print_what_is_wrong_and_exit_2() {
    for args in [
        &["demo", "--turns", "0"][..],
        &["demo", "--concurrency"],
        &["demo", "--fast"],
        &["--conversations", "x"],
    ] {
        let output = demo_command(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains("try '--help'"), "{stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn demo_help_prints_the_usage() {
    let output = demo_command(&["demo", "--help"]);
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("Usage: grid-route-example demo [OPTIONS]"),
        "{stdout}"
    );
    assert!(stdout.contains("--conversations <N>") && stdout.contains("--quick"));

    // With no command the demo runs, so the top-level help shows its options too.
    let output = demo_command(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("--conversations <N>"), "{stdout}");
    assert!(stdout.contains("demo "), "{stdout}");
}
