//! `grid-route-example serve --config FILE` as a process: it serves, reloads on SIGHUP
//! (refusing a bad file and keeping the running config), logs one line per request
//! without the query or the prompt, and drains and exits 0 on SIGTERM.
#![cfg(unix)]
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_mock_engine::{MockEngine, MockEngineConfig};
use grid_route_tests::{
    PROCESS_WAIT, client, eventually_within, exit_within, free_port, metric, signal, try_send,
    wait_generation,
};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::Value;

fn one_engine_config(listen: u16, admin: u16, engine: &MockEngine, window_secs: u64) -> String {
    format!(
        "listen: 127.0.0.1:{listen}\nadmin_listen: 127.0.0.1:{admin}\n\
         queue: {{ poll_interval_ms: 50, window_secs: {window_secs} }}\n\
         sites:\n  - name: east\n    clusters:\n      - {{ name: east-a, models: [demo-model], endpoints: [{}] }}\n",
        engine.url()
    )
}

/// The log without terminal colour codes.
fn plain_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap();
    let mut plain = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence runs to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[tokio::test]
async fn serve_reloads_on_sighup_and_drains_on_sigterm() {
    let engine = MockEngine::start("127.0.0.1:0", MockEngineConfig::named("east-a"))
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("gateway.yaml");
    let log = dir.join("gateway.log");
    let (listen, admin_port) = (free_port(), free_port());
    std::fs::write(&file, one_engine_config(listen, admin_port, &engine, 10)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(["serve", "--config"])
        .arg(&file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let admin = format!("http://127.0.0.1:{admin_port}");
    wait_generation(&admin, 0).await;

    let secret = "a very secret prompt";
    let body =
        format!(r#"{{"model":"demo-model","messages":[{{"role":"user","content":"{secret}"}}]}}"#);
    let url = format!("http://127.0.0.1:{listen}/v1/chat/completions?api_key=hidden");
    let status = try_send(Method::POST, &url, body.clone())
        .await
        .unwrap()
        .status;
    assert_eq!(status, StatusCode::OK);

    std::fs::write(&file, one_engine_config(listen, admin_port, &engine, 5)).unwrap();
    signal(child.id(), "-HUP");
    wait_generation(&admin, 1).await;

    std::fs::write(&file, "sites: [").unwrap();
    signal(child.id(), "-HUP");
    let rejected = r#"grid_serving_config_reload_total{result="rejected"}"#;
    eventually_within("the bad reload is counted", PROCESS_WAIT, || async {
        metric(&admin, rejected).await == Some(1.0)
    })
    .await;
    wait_generation(&admin, 1).await;
    let status = try_send(Method::POST, &url, body.clone())
        .await
        .unwrap()
        .status;
    assert_eq!(status, StatusCode::OK);

    signal(child.id(), "-TERM");
    let exit = exit_within(&mut child, PROCESS_WAIT).await;
    assert!(exit.success(), "{exit}");

    let raw = std::fs::read_to_string(&log).unwrap();
    assert!(
        !raw.contains('\u{1b}'),
        "colour codes in a log that is not a terminal"
    );
    let log = plain_log(&log);
    assert!(log.contains("config reload applied"), "{log}");
    assert!(log.contains("config reload rejected"), "{log}");
    let requests: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("grid_route_example::access"))
        .collect();
    assert_eq!(requests.len(), 2, "{log}");
    for line in requests {
        for field in [
            "method=POST",
            r#"path="/v1/chat/completions""#,
            "outcome=",
            r#"site="east""#,
            r#"cluster="east-a""#,
            "status=200",
            "latency_ms=",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
    }
    assert!(!log.contains(secret), "the prompt reached the log");
    assert!(!log.contains("hidden"), "the query reached the log");
}

#[tokio::test]
async fn sigterm_drains_streams_in_flight_and_closes_idle_and_half_open_connections_at_once() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let engine_config = MockEngineConfig {
        decode_delay_per_token: Duration::from_millis(150),
        ..MockEngineConfig::named("east-a")
    };
    let engine = MockEngine::start("127.0.0.1:0", engine_config)
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("gateway.yaml");
    let (listen, admin_port) = (free_port(), free_port());
    // Heads may take a minute: only the shutdown can close the half-open connections soon.
    let yaml = format!(
        "timeouts: {{ client_header_secs: 60 }}\n{}",
        one_engine_config(listen, admin_port, &engine, 10)
    );
    std::fs::write(&file, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(["serve", "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_generation(&format!("http://127.0.0.1:{admin_port}"), 0).await;

    let mut half_open = Vec::new();
    // An idle kept-alive connection: one whole request answered, then nothing.
    let mut idle = tokio::net::TcpStream::connect(("127.0.0.1", listen))
        .await
        .unwrap();
    idle.write_all(b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    half_open.push(idle);
    for partial in ["PO", "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"] {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", listen))
            .await
            .unwrap();
        socket.write_all(partial.as_bytes()).await.unwrap();
        half_open.push(socket);
    }
    let client = client();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1:{listen}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            r#"{"model":"demo-model","stream":true,"messages":[{"role":"user","content":"one two three four five six"}]}"#,
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());

    let signalled = Instant::now();
    signal(child.id(), "-TERM");
    for socket in &mut half_open {
        // Whatever is left of an answer, then the end.
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            let mut buf = [0u8; 4096];
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "an idle or half-open connection stayed open after SIGTERM"
        );
    }
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "the stream in flight was cut: {rest:?}"
    );
    let exit = exit_within(&mut child, PROCESS_WAIT).await;
    assert!(exit.success(), "{exit}");
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "draining took {:?}",
        signalled.elapsed()
    );
}

/// A `mock-engine` process on a free port, answering `/health`.
async fn engine_process(name: &str, decode_ms: u64) -> (Child, String) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(["mock-engine", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--name",
            name,
            "--decode-ms-per-token",
            &decode_ms.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let health = format!("{url}/health");
    eventually_within("the mock engine answers", PROCESS_WAIT, || async {
        try_send(Method::GET, &health, "").await.is_some()
    })
    .await;
    (child, url)
}

#[tokio::test]
async fn json_logs_name_the_site_and_cluster_of_an_engine_that_died_mid_stream() {
    let (mut engine, engine_url) = engine_process("east-a", 200).await;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("gateway.yaml");
    let log = dir.join("gateway.log");
    let (listen, admin_port) = (free_port(), free_port());
    let yaml = format!(
        "listen: 127.0.0.1:{listen}\nadmin_listen: 127.0.0.1:{admin_port}\n\
         queue: {{ poll_interval_ms: 50 }}\n\
         sites:\n  - name: east\n    clusters:\n      - {{ name: east-a, models: [demo-model], endpoints: [{engine_url}] }}\n"
    );
    std::fs::write(&file, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(["serve", "--log-format", "json", "--config"])
        .arg(&file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_generation(&format!("http://127.0.0.1:{admin_port}"), 0).await;

    let client = client();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1:{listen}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            r#"{"model":"demo-model","stream":true,"messages":[{"role":"user","content":"one two three four five six"}]}"#,
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    engine.kill().unwrap();
    engine.wait().unwrap();
    let cut = loop {
        match body.frame().await {
            Some(Ok(_)) => {}
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(
        cut,
        "the client's stream ended cleanly after the engine died"
    );

    signal(child.id(), "-TERM");
    let exit = exit_within(&mut child, PROCESS_WAIT).await;
    assert!(exit.success(), "{exit}");
    let raw = std::fs::read_to_string(&log).unwrap();
    assert!(!raw.contains('\u{1b}'), "colour codes in JSON logs");
    let lines: Vec<Value> = raw
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let access = lines
        .iter()
        .find(|line| line["target"] == "grid_route_example::access")
        .unwrap_or_else(|| panic!("no request line: {raw}"));
    assert_eq!(access["fields"]["method"], "POST");
    assert_eq!(access["fields"]["cluster"], "east-a");
    let failure = lines
        .iter()
        .find(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("failed mid-stream"))
        })
        .unwrap_or_else(|| panic!("no mid-stream failure logged: {raw}"));
    assert_eq!(failure["level"], "WARN");
    assert_eq!(failure["fields"]["site"], "east");
    assert_eq!(failure["fields"]["cluster"], "east-a");
    assert_eq!(failure["fields"]["endpoint"], engine_url.as_str());
    let cut = lines
        .iter()
        .find(|line| line["target"] == "grid_route_example::access" && line["level"] == "WARN")
        .unwrap_or_else(|| panic!("no cut stream in the request log: {raw}"));
    assert_eq!(cut["fields"]["method"], "POST");
    assert_eq!(cut["fields"]["path"], "/v1/chat/completions");
}
