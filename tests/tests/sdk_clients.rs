//! Real clients: the official OpenAI and Anthropic Python SDKs drive the example gateway.
//!
//! The test starts a mock engine for each of two sites and the gateway in front of them
//! (with a tag key, so stored ids carry a mac), then runs `tests/sdk/test_clients.py` with
//! the gateway's URL in its environment and asserts that it exits 0. The scenarios (chat,
//! streamed chat, a `previous_response_id` chain, streamed responses, conversations,
//! Anthropic messages, streamed and not, and sessions named by `prompt_cache_key`,
//! Anthropic `metadata.user_id` and a configured header) live in that file.
//!
//! It needs a Python with the pinned SDKs, so it is behind the `sdk` feature:
//!
//! ```sh
//! tests/sdk/setup && cargo test -p grid-route-tests --features sdk --test sdk_clients
//! ```
//!
//! The interpreter is `$GRID_ROUTE_SDK_PYTHON`, else `<workspace>/.venv-sdk/bin/python`
//! (what `tests/sdk/setup` makes). A missing one fails the test, naming that command: with
//! the feature on, the SDK tests never pass without running.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use grid_route_example::gateway::Gateway;
use grid_route_mock_engine::MockEngine;
use grid_route_tests::{
    ClusterYaml, MODEL, SITES, cluster, config_yaml, engine, measured_gateway, workspace_root,
};

/// Longer than the SDK scenarios take by far (a few seconds), short enough to end a hang.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(180);
/// The header the gateway reads a session id from: not the default, so the scenarios see
/// that the configured one is read and the default is not.
const SESSION_HEADER: &str = "x-session-affinity";
const SDK_SETUP: &str =
    "tests/sdk/setup && cargo test -p grid-route-tests --features sdk --test sdk_clients";

/// The interpreter with the SDKs installed; a failure naming the setup command otherwise.
fn sdk_python() -> PathBuf {
    let python = std::env::var_os("GRID_ROUTE_SDK_PYTHON").map_or_else(
        || workspace_root().join(".venv-sdk/bin/python"),
        PathBuf::from,
    );
    assert!(
        python.is_file(),
        "no Python for the SDK tests at {}: run `{SDK_SETUP}` from the workspace root \
         (or set GRID_ROUTE_SDK_PYTHON to a Python with tests/sdk/requirements.txt installed)",
        python.display()
    );
    python
}

/// Starts the gateway over `engines` (one per site, in [`SITES`] order) and waits until it
/// has read every cluster's queue, so no scenario races the first poll.
async fn sdk_gateway(engines: &[MockEngine], tag_key: &Path) -> Gateway {
    let sites: Vec<(&str, Vec<ClusterYaml>)> = SITES
        .iter()
        .zip(engines)
        .map(|(site, engine)| (*site, vec![cluster(&format!("{site}-a"), &[engine])]))
        .collect();
    let extra = format!(
        "grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, exploration: 0.0, \
         prefill_tokens_per_second: 10000, queued_request_seconds: 2, \
         session_headers: [{SESSION_HEADER}] }} }}\n",
        tag_key.display()
    );
    measured_gateway(&config_yaml(&sites, &extra)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdks_work_through_the_gateway() {
    let python = sdk_python();
    let scratch = tempfile::tempdir().unwrap();
    let tag_key = scratch.path().join("tag.key");
    std::fs::write(&tag_key, [7_u8; 32]).unwrap();

    let mut engines = Vec::new();
    for site in SITES {
        engines.push(engine(&format!("{site}-a")).await);
    }
    let gateway = sdk_gateway(&engines, &tag_key).await;
    let engine_names: Vec<String> = SITES
        .iter()
        .map(|site| format!("{site}={site}-a"))
        .collect();
    let engine_urls: Vec<String> = SITES
        .iter()
        .zip(&engines)
        .map(|(site, engine)| format!("{site}-a={}", engine.url()))
        .collect();

    let script = workspace_root().join("tests/sdk/test_clients.py");
    let child = tokio::process::Command::new(&python)
        .arg(&script)
        .env("GRID_ROUTE_GATEWAY_URL", gateway.url())
        .env("GRID_ROUTE_ENGINES", engine_names.join(","))
        .env("GRID_ROUTE_MODEL", MODEL)
        .env("GRID_ROUTE_ADMIN_URL", gateway.admin_url())
        .env("GRID_ROUTE_ENGINE_URLS", engine_urls.join(","))
        .env("GRID_ROUTE_SESSION_HEADER", SESSION_HEADER)
        // Whatever the caller's environment says, the clients talk to the gateway directly.
        .env("NO_PROXY", "*")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run `{SDK_SETUP}`", python.display()));
    let output = tokio::time::timeout(PYTHON_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} ran over {PYTHON_TIMEOUT:?}", script.display()))
        .unwrap();
    let report = format!(
        "{} {} exited with {}\n--- stdout\n{}\n--- stderr\n{}",
        python.display(),
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{report}");

    // The scenarios reached the engines through the gateway, on every API they cover.
    let mut routes = std::collections::BTreeMap::<String, u64>::new();
    for engine in &engines {
        for (route, count) in engine.stats().requests {
            *routes.entry(route).or_default() += count;
        }
    }
    for route in [
        "POST /v1/chat/completions",
        "POST /v1/responses",
        "GET /v1/responses/{id}",
        "GET /v1/responses/{id}/input_items",
        "POST /v1/conversations",
        "GET /v1/conversations/{id}",
        "GET /v1/conversations/{id}/items",
        "POST /v1/messages",
    ] {
        assert!(
            routes.get(route).copied().unwrap_or(0) > 0,
            "no {route} reached an engine: {routes:?}\n{report}"
        );
    }
    println!("{report}");
    gateway.shutdown().await.unwrap();
}
