//! Chaos: `serve` in front of three `mock-engine` processes for 30 s of mixed streamed and
//! plain traffic from several clients, while one engine is killed and restarted, another
//! answers 500s for a while, a third stalls, and the config is reloaded twice (once with
//! a broken file).
//!
//! It asserts what a client may see: successes, an engine's own error answer, an answer
//! cut because its engine died or stalled mid-way, or a gateway 502/504 with a JSON body
//! for a request that had reached a failing engine. Never a 503 (some cluster could always
//! serve), never a refused or dropped connection to the gateway, never a failure of a
//! request that only failed to connect (those are retried). The gateway's RSS stays flat
//! and it exits 0 on SIGTERM.
#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_tests::{
    HttpClient, PROCESS_WAIT, client, eventually_within, exit_within, free_port, generation,
    metric, signal, try_send, wait_generation,
};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::Value;

const RUN: Duration = Duration::from_secs(30);
const CLIENTS: usize = 6;

/// A `mock-engine` process.
struct EngineProcess {
    name: &'static str,
    port: u16,
    child: Child,
}

impl EngineProcess {
    async fn start(name: &'static str, port: u16) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
            .args(["mock-engine", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--name", name, "--decode-ms-per-token", "15"])
            .args(["--prefill-tokens-per-second", "2000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let engine = Self { name, port, child };
        let health = format!("{}/health", engine.url());
        eventually_within(&format!("{name} answers"), PROCESS_WAIT, || async {
            try_send(Method::GET, &health, "").await.is_some()
        })
        .await;
        engine
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    async fn knob(&self, path: &str, body: &str) {
        let url = format!("{}{path}", self.url());
        let status = try_send(Method::POST, &url, body.to_owned())
            .await
            .unwrap()
            .status;
        assert_eq!(status, StatusCode::OK, "{} {path}", self.name);
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chaos_config(listen: u16, admin: u16, engines: &[&EngineProcess], window_secs: u64) -> String {
    let mut yaml = format!(
        "listen: 127.0.0.1:{listen}\nadmin_listen: 127.0.0.1:{admin}\n\
         queue: {{ poll_interval_ms: 50, window_secs: {window_secs} }}\n\
         timeouts: {{ upstream_connect_ms: 500, upstream_first_byte_secs: 2, upstream_idle_secs: 5 }}\n\
         outlier: {{ consecutive_failures: 3, ejection_secs: 2 }}\n\
         sites:\n"
    );
    for engine in engines {
        let site = engine.name.trim_end_matches("-a");
        let _ = writeln!(
            yaml,
            "  - name: {site}\n    clusters:\n      - {{ name: {}, models: [demo-model], endpoints: [{}] }}",
            engine.name,
            engine.url()
        );
    }
    yaml
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// What a client saw for one request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Ok,
    /// An engine's own error answer (status, engine).
    EngineError(u16, String),
    /// The answer began, then was cut (engine).
    Cut(String),
    /// The gateway's own error answer (status, code).
    Gateway(u16, String),
    /// Anything else: the failure the test exists to catch.
    Broken(String),
}

async fn one_request(client: &HttpClient, url: &str, body: String) -> Seen {
    let request = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = match client.request(request).await {
        Ok(response) => response,
        Err(error) => return Seen::Broken(format!("request failed: {error}")),
    };
    let status = response.status();
    let engine = response
        .headers()
        .get("x-mock-engine")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) if status == StatusCode::OK => {
            return match engine {
                Some(engine) => Seen::Cut(engine),
                None => Seen::Broken("a cut answer with no engine".to_owned()),
            };
        }
        Err(error) => return Seen::Broken(format!("{status} body failed: {error}")),
    };
    if status.is_success() {
        return Seen::Ok;
    }
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let Some(json) = json.filter(|j| j["error"].is_object()) else {
        return Seen::Broken(format!("{status} without a JSON error: {body:?}"));
    };
    match engine {
        Some(engine) => Seen::EngineError(status.as_u16(), engine),
        None => Seen::Gateway(
            status.as_u16(),
            json["error"]["code"].as_str().unwrap_or("").to_owned(),
        ),
    }
}

/// Outcomes with the time each request ended, from the start of the run.
type Outcomes = Arc<Mutex<Vec<(Duration, Seen)>>>;

/// [`CLIENTS`] clients sending requests back to back until [`RUN`] is over.
fn spawn_clients(url: &str, started: Instant, seen: &Outcomes) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|c| {
            let url = url.to_owned();
            let seen = Arc::clone(seen);
            tokio::spawn(async move {
                let client = client();
                let mut turn = 0;
                while started.elapsed() < RUN {
                    turn += 1;
                    // Each client keeps a conversation with a long shared prefix, so
                    // affinity has something to stick to; every other request streams.
                    let stream = turn % 2 == 0;
                    let body = format!(
                        r#"{{"model":"demo-model","stream":{stream},"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"client {c} turn {turn}"}}]}}"#,
                        format!("client {c} system prompt ").repeat(60)
                    );
                    let outcome = one_request(&client, &url, body).await;
                    seen.lock().unwrap().push((started.elapsed(), outcome));
                }
            })
        })
        .collect()
}

/// When each fault began and ended, from the start of the run.
struct Timeline {
    east_down: Duration,
    east_up: Duration,
    north_stalled: Duration,
    north_back: Duration,
}

fn tally(seen: &[(Duration, Seen)]) -> BTreeMap<String, usize> {
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for (_, outcome) in seen {
        let key = match outcome {
            Seen::Ok => "ok".to_owned(),
            Seen::EngineError(status, engine) => format!("{status} from {engine}"),
            Seen::Cut(engine) => format!("cut by {engine}"),
            Seen::Gateway(status, code) => format!("gateway {status} {code}"),
            Seen::Broken(what) => format!("BROKEN {what}"),
        };
        *tally.entry(key).or_default() += 1;
    }
    tally
}

/// Every failure a client saw is one the faults explain.
fn assert_explained(seen: &[(Duration, Seen)], faults: &Timeline) {
    for (at, outcome) in seen {
        match outcome {
            Seen::Ok => {}
            Seen::EngineError(500, engine) => assert_eq!(engine, "west-a", "at {at:?}"),
            Seen::EngineError(status, engine) => panic!("{status} from {engine} at {at:?}"),
            // Answers in flight on east when it was killed.
            Seen::Cut(engine) => assert_eq!(engine, "east-a", "cut at {at:?}"),
            Seen::Gateway(502, code) => {
                assert_eq!(code, "backend_unreachable");
                // Answers cut by the kill, and requests that met east's dead or restarting
                // port before outlier ejection or the poller took it out; on a loaded
                // 2-core machine that can take until it is back.
                assert!(
                    *at >= faults.east_down && *at < faults.east_up + Duration::from_secs(3),
                    "a 502 outside east's death, at {at:?}"
                );
            }
            Seen::Gateway(504, code) => {
                assert_eq!(code, "upstream_timeout", "at {at:?}");
                assert!(
                    *at >= faults.north_stalled && *at < faults.north_back + Duration::from_secs(3),
                    "a 504 outside north's stall, at {at:?}"
                );
            }
            other => panic!("{other:?} at {at:?}"),
        }
    }
    let failed_in_flight = seen
        .iter()
        .filter(|(at, o)| {
            matches!(o, Seen::Gateway(502, _) | Seen::Cut(_))
                && *at >= faults.east_down
                && *at < faults.east_up
        })
        .count();
    assert!(
        failed_in_flight <= CLIENTS,
        "{failed_in_flight} requests failed with east down: more than were in flight"
    );
}

/// Most requests succeeded, and ejection kept west's 500s to a few: each ejection follows
/// 3 in a row, and requests already on their way when it came may add one each.
fn assert_contained(tally: &BTreeMap<String, usize>, requests: usize, ejections: f64) {
    let ok = tally.get("ok").copied().unwrap_or(0);
    assert!(
        ok * 10 >= requests * 9,
        "fewer than 90% succeeded: {tally:?}"
    );
    let west_500s = tally.get("500 from west-a").copied().unwrap_or(0);
    assert!(ejections >= 1.0, "west was never ejected");
    assert!(
        west_500s <= 3 * (ejections as usize + 1) + CLIENTS,
        "{west_500s} 500s from west with {ejections} ejections"
    );
}

/// Starts `serve` on `file` and waits until it serves generation 0.
async fn start_gateway(file: &std::path::Path, log: &std::path::Path, admin: &str) -> Child {
    let gateway = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
        .args(["serve", "--config"])
        .arg(file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_generation(admin, 0).await;
    gateway
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_holds_up_through_engine_deaths_500s_stalls_and_reloads() {
    let (east_port, west_port, north_port) = (free_port(), free_port(), free_port());
    let mut east = EngineProcess::start("east-a", east_port).await;
    let west = EngineProcess::start("west-a", west_port).await;
    let north = EngineProcess::start("north-a", north_port).await;
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("gateway.yaml");
    let (listen, admin_port) = (free_port(), free_port());
    let admin = format!("http://127.0.0.1:{admin_port}");
    let engines = [&east, &west, &north];
    std::fs::write(&file, chaos_config(listen, admin_port, &engines, 2)).unwrap();
    let reloaded = chaos_config(listen, admin_port, &engines, 3);
    let mut gateway = start_gateway(&file, &dir.join("gateway.log"), &admin).await;
    let pid = gateway.id();

    let url = format!("http://127.0.0.1:{listen}/v1/chat/completions");
    let seen: Outcomes = Arc::default();
    let started = Instant::now();
    let clients = spawn_clients(&url, started, &seen);
    let pause = |secs| tokio::time::sleep(Duration::from_secs(secs));
    pause(3).await;
    let rss_warm = rss_kib(pid);
    // 4 s: east dies; 10 s: it comes back on its port.
    pause(1).await;
    // Each fault's start is read before it is made and its end after it is undone: on a
    // loaded machine this task can be scheduled late, after clients have already seen the
    // fault, and a window read the other way round would blame the gateway for it.
    let east_down = started.elapsed();
    east.kill();
    // 7 s: a valid reload (a longer queue window).
    pause(3).await;
    std::fs::write(&file, reloaded).unwrap();
    signal(pid, "-HUP");
    pause(3).await;
    east = EngineProcess::start("east-a", east_port).await;
    let east_up = started.elapsed();
    // 12 s - 18 s: west answers 500; at 15 s a broken config file is refused.
    pause(2).await;
    west.knob("/mock/fail", r#"{"status":500,"count":100000}"#)
        .await;
    pause(3).await;
    std::fs::write(&file, "sites: [").unwrap();
    signal(pid, "-HUP");
    pause(3).await;
    west.knob("/mock/fail", r#"{"status":500,"count":0}"#).await;
    // 20 s - 26 s: north takes 5 s to answer (the gateway waits 2 s).
    pause(2).await;
    let north_stalled = started.elapsed();
    north.knob("/mock/stall", r#"{"head_ms":5000}"#).await;
    pause(6).await;
    north.knob("/mock/stall", "{}").await;
    let north_back = started.elapsed();
    for client in clients {
        client.await.unwrap();
    }
    let rss_end = rss_kib(pid);

    assert_eq!(
        generation(&admin).await,
        Some(1),
        "the valid reload did not apply"
    );
    assert_eq!(
        metric(
            &admin,
            r#"grid_serving_config_reload_total{result="rejected"}"#
        )
        .await,
        Some(1.0)
    );
    let ejections = metric(
        &admin,
        r#"grid_route_ejections_total{site="west",cluster="west-a"}"#,
    )
    .await
    .unwrap_or(0.0);
    signal(pid, "-TERM");
    let exit = exit_within(&mut gateway, PROCESS_WAIT).await;

    let seen = seen.lock().unwrap().clone();
    let tally = tally(&seen);
    println!(
        "chaos: {} requests in {RUN:?}: {tally:?}; RSS {rss_warm} KiB warm, {rss_end} KiB at the end; west ejected {ejections} times",
        seen.len()
    );
    assert!(exit.success(), "{exit}");
    let faults = Timeline {
        east_down,
        east_up,
        north_stalled,
        north_back,
    };
    assert_explained(&seen, &faults);
    assert_contained(&tally, seen.len(), ejections);
    assert!(
        rss_end <= rss_warm + rss_warm / 2 + 8 * 1024,
        "RSS grew from {rss_warm} KiB to {rss_end} KiB"
    );
    drop(east);
}
