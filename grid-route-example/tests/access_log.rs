//! The request log of `grid-route-example serve`, read from its JSON log: one line per
//! request with its fields, and credentials that never show, even at `trace` level with
//! every crate logging.
#![cfg(unix)]
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use grid_route_mock_engine::{MockEngine, MockEngineConfig};
use grid_route_tests::{
    PROCESS_WAIT, REQUEST_DEADLINE, exit_within, free_port, signal, try_send_with,
};
use hyper::{Method, StatusCode};
use serde_json::Value;

const PROMPT: &str = "a prompt nobody may read";
/// Each credential header the client sends, with a value that must never be logged, and
/// the default session header, whose id is client data too.
const CREDENTIALS: [(&str, &str); 6] = [
    ("authorization", "Bearer sk-secret-bearer-token"),
    ("x-api-key", "secret-anthropic-key"),
    ("api-key", "secret-azure-key"),
    ("proxy-authorization", "Basic secret-proxy-credential"),
    ("cookie", "session=secret-cookie-value"),
    ("x-session-id", "secret-session-id"),
];
/// A session named in the body, which no log may print either.
const BODY_SESSION: &str = "secret-prompt-cache-key";

/// `serve` running at `RUST_LOG=rust_log` with JSON logs, on a config of `sites` (the YAML
/// after the listen addresses), until [`Serving::stop`].
struct Serving {
    child: std::process::Child,
    log: std::path::PathBuf,
    listen: u16,
    admin: u16,
    scratch: tempfile::TempDir,
}

impl Serving {
    fn start(rest_of_config: &str, rust_log: &str) -> Self {
        let scratch = tempfile::tempdir().unwrap();
        let file = scratch.path().join("gateway.yaml");
        let log = scratch.path().join("gateway.log");
        let (listen, admin) = (free_port(), free_port());
        std::fs::write(
            &file,
            format!(
                "listen: 127.0.0.1:{listen}\nadmin_listen: 127.0.0.1:{admin}\n{rest_of_config}"
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
            .args(["serve", "--log-format", "json", "--config"])
            .arg(&file)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            listen,
            admin,
            scratch,
        }
    }

    /// Rewrites the config file with `rest_of_config` after the same listen addresses,
    /// sends SIGHUP, and waits until the log says the reload was applied (its `applied`-th
    /// reload in all).
    async fn reload(&self, rest_of_config: &str, applied: usize) {
        std::fs::write(
            self.scratch.path().join("gateway.yaml"),
            format!(
                "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\n{rest_of_config}",
                self.listen, self.admin
            ),
        )
        .unwrap();
        signal(self.child.id(), "-HUP");
        self.eventually("serve applies the reload", || async {
            self.lines("config reload applied").len() >= applied
        })
        .await;
    }

    /// Waits up to [`PROCESS_WAIT`] for `done`; on timeout fails with `what` and serve's
    /// log so far, which says why when serve could not start (its port taken between
    /// [`free_port`] and its bind) or stopped.
    async fn eventually<F, Fut>(&self, what: &str, done: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + PROCESS_WAIT;
        while !done().await {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for: {what}; serve's log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The JSON lines of its log so far whose message is `message`.
    fn lines(&self, message: &str) -> Vec<Value> {
        log_lines(
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
            message,
        )
    }

    /// Stops it with SIGTERM, checks that it exits 0 in time, and returns its log.
    async fn stop(mut self) -> String {
        signal(self.child.id(), "-TERM");
        let exit = exit_within(&mut self.child, PROCESS_WAIT).await;
        assert!(exit.success(), "{exit}");
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// Sends a request with every credential header; `None` while nothing answers.
async fn send_with_credentials(method: Method, url: &str, body: &str) -> Option<StatusCode> {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(CREDENTIALS);
    let answer = try_send_with(method, url, &headers, body.to_owned(), REQUEST_DEADLINE).await?;
    Some(answer.status)
}

/// Runs `serve` at `RUST_LOG=trace` with JSON logs in front of `engine`, sends it a chat
/// request and a request for a path it does not serve, stops it, and returns its log.
async fn serve_two_requests(engine: &MockEngine) -> String {
    let serving = Serving::start(
        &format!(
            "sites:\n  - name: east\n    clusters:\n\
             \x20     - {{ name: east-a, models: [demo-model], endpoints: [{}] }}\n",
            engine.url()
        ),
        "trace",
    );
    let health = format!("http://127.0.0.1:{}/healthz", serving.admin);
    serving
        .eventually("serve answers", || async {
            send_with_credentials(Method::GET, &health, "")
                .await
                .is_some()
        })
        .await;

    let body = format!(
        r#"{{"model":"demo-model","prompt_cache_key":"{BODY_SESSION}","messages":[{{"role":"user","content":"{PROMPT}"}}]}}"#
    );
    let front = format!("http://127.0.0.1:{}", serving.listen);
    let chat = format!("{front}/v1/chat/completions?api_key=secret-query");
    assert_eq!(
        send_with_credentials(Method::POST, &chat, &body).await,
        Some(StatusCode::OK)
    );
    assert_eq!(
        send_with_credentials(Method::GET, &format!("{front}/not-served"), "").await,
        Some(StatusCode::NOT_FOUND)
    );
    serving.stop().await
}

#[tokio::test]
async fn the_request_log_has_one_line_per_request_and_never_a_credential_even_at_trace() {
    let engine = MockEngine::start("127.0.0.1:0", MockEngineConfig::named("east-a"))
        .await
        .unwrap();
    let raw = serve_two_requests(&engine).await;
    let lines: Vec<Value> = raw
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let access = |message: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|line| {
                line["target"] == "grid_route_example::access"
                    && line["fields"]["message"] == message
            })
            .collect()
    };

    let requests = access("request");
    assert_eq!(requests.len(), 2, "{raw}");
    let routed = &requests[0];
    assert_eq!(routed["level"], "INFO");
    let fields = &routed["fields"];
    assert_eq!(fields["method"], "POST");
    assert_eq!(fields["path"], "/v1/chat/completions");
    assert!(fields["outcome"].is_string(), "{routed}");
    assert_eq!(fields["site"], "east");
    assert_eq!(fields["cluster"], "east-a");
    assert_eq!(fields["status"], 200);
    let latency: f64 = fields["latency_ms"].as_str().unwrap().parse().unwrap();
    assert!(latency >= 0.0, "{routed}");
    let refused = &requests[1]["fields"];
    assert_eq!(refused["method"], "GET");
    assert_eq!(refused["path"], "/not-served");
    assert_eq!(refused["outcome"], "-");
    assert_eq!(refused["site"], "-");
    assert_eq!(refused["status"], 404);

    // At trace, each request's headers are logged, credentials as `Sensitive`.
    let heads = access("request head");
    assert_eq!(heads.len(), 2, "{raw}");
    let headers = heads[0]["fields"]["headers"].as_str().unwrap();
    for (name, _) in CREDENTIALS {
        assert!(
            headers.contains(&format!("\"{name}\": Sensitive")),
            "{name} not marked sensitive: {headers}"
        );
    }
    assert!(headers.contains("\"content-type\": \"application/json\""));

    for (name, value) in CREDENTIALS {
        let secret = value.split_once(['=', ' ']).map_or(value, |(_, s)| s);
        assert!(!raw.contains(secret), "the {name} header reached the log");
    }
    assert!(!raw.contains(PROMPT), "the prompt reached the log");
    assert!(
        !raw.contains(BODY_SESSION),
        "the body's session reached the log"
    );
    assert!(!raw.contains("secret-query"), "the query reached the log");
}

/// An engine serving only `/metrics`, with `page` as its text, polled every 20 ms by a
/// `serve` of one cluster (east/east-a) in front of it at `RUST_LOG=info`, until the page
/// was read ten times. Returns the engine's URL and `serve`'s log.
async fn serve_polling_a_metrics_page(page: &'static str) -> (String, String) {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async move { page }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let serving = Serving::start(
        &format!(
            "queue: {{ poll_interval_ms: 20 }}\n\
             sites:\n  - name: east\n    clusters:\n\
             \x20     - {{ name: east-a, models: [demo-model], endpoints: [{endpoint}] }}\n"
        ),
        "info",
    );
    serving
        .eventually("serve reads the page ten times", || async {
            reads.load(Ordering::Relaxed) >= 10
        })
        .await;
    (endpoint, serving.stop().await)
}

/// An endpoint whose `/metrics` serves no known queue gauge: `serve` says so once at
/// `warn`, however often it reads the page, and keeps reading it.
#[tokio::test]
async fn a_metrics_page_without_a_known_gauge_is_logged_once() {
    // Ten reads of the page at least, each of which finds no known gauge.
    let (_, raw) =
        serve_polling_a_metrics_page("# a page of other metrics\nprocess_cpu_seconds_total 1.5\n")
            .await;
    let warned: Vec<Value> = raw
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("metrics page serves no known queue gauge"))
        })
        .collect();
    assert_eq!(warned.len(), 1, "{raw}");
    assert_eq!(warned[0]["level"], "WARN");
    assert_eq!(warned[0]["fields"]["cluster"], "east/east-a");
}

/// A stand-in for llama.cpp's server started with `--api-key key`: `/metrics` (one slot
/// engine's gauge) and `/props` (two slots) answer 401 without `Authorization: Bearer
/// key`. Returns its URL and how many `/metrics` reads it refused and served.
async fn engine_with_api_key(key: &'static str) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (refused, allowed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (count_refused, count_allowed) = (Arc::clone(&refused), Arc::clone(&allowed));
    let keyed = move |headers: &http::HeaderMap| {
        headers
            .get(http::header::AUTHORIZATION)
            .is_some_and(|v| v == format!("Bearer {key}").as_str())
    };
    let refusal = (
        StatusCode::UNAUTHORIZED,
        r#"{"error":{"message":"Invalid API Key"}}"#,
    );
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move |headers: http::HeaderMap| {
                let keyed = keyed(&headers);
                let counter = if keyed {
                    &count_allowed
                } else {
                    &count_refused
                };
                counter.fetch_add(1, Ordering::Relaxed);
                async move {
                    if keyed {
                        (StatusCode::OK, "llamacpp:requests_deferred 0\n")
                    } else {
                        refusal
                    }
                }
            }),
        )
        .route(
            "/props",
            axum::routing::get(move |headers: http::HeaderMap| async move {
                if keyed(&headers) {
                    (StatusCode::OK, r#"{"total_slots":2}"#)
                } else {
                    refusal
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, refused, allowed)
}

/// An engine started with an API key, as llama.cpp's `--api-key` makes it: `/metrics`
/// answers 401 without `Authorization: Bearer KEY`. Without `queue.api_key_path`, `serve`
/// warns once with the status and what to do; with it, every read carries the key, the
/// gauge and the slots are found, and the key shows in no line even at `trace`.
#[tokio::test]
async fn an_engine_that_wants_its_api_key_is_read_with_it_and_warned_about_without() {
    const KEY: &str = "sk-engine-poll-secret";
    let (endpoint, refused, allowed) = engine_with_api_key(KEY).await;
    let sites = format!(
        "sites:\n  - name: east\n    clusters:\n\
         \x20     - {{ name: east-a, models: [demo-model], endpoints: [{endpoint}] }}\n"
    );
    let lines = |raw: &str, message: &str| -> Vec<Value> {
        raw.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["fields"]["message"] == message)
            .collect()
    };

    // Without the key: ten refused reads, one warning.
    let serving = Serving::start(
        &format!("queue: {{ poll_interval_ms: 20 }}\n{sites}"),
        "info",
    );
    serving
        .eventually("serve reads the page ten times", || async {
            refused.load(Ordering::Relaxed) >= 10
        })
        .await;
    let raw = serving.stop().await;
    let warned = lines(&raw, "metrics page refused; unmeasured");
    assert_eq!(warned.len(), 1, "{raw}");
    assert_eq!(warned[0]["level"], "WARN");
    assert_eq!(warned[0]["fields"]["cluster"], "east/east-a");
    assert_eq!(warned[0]["fields"]["status"], 401);
    assert_eq!(warned[0]["fields"]["keyed"], false);
    assert!(
        warned[0]["fields"]["hint"]
            .as_str()
            .is_some_and(|hint| hint.contains("queue.api_key_path")),
        "{raw}"
    );
    assert_eq!(allowed.load(Ordering::Relaxed), 0);

    // With it: read with the key, found, and never shown.
    let scratch = tempfile::tempdir().unwrap();
    let key_file = scratch.path().join("engine.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let refused_before = refused.load(Ordering::Relaxed);
    let serving = Serving::start(
        &format!(
            "queue: {{ poll_interval_ms: 20, api_key_path: {} }}\n{sites}",
            key_file.display()
        ),
        "trace",
    );
    serving
        .eventually("serve reads the page ten times with the key", || async {
            allowed.load(Ordering::Relaxed) >= 10
        })
        .await;
    let raw = serving.stop().await;
    assert_eq!(
        refused.load(Ordering::Relaxed),
        refused_before,
        "a read without the key"
    );
    let found = lines(&raw, "queue gauge found");
    assert_eq!(found.len(), 1, "{raw}");
    assert_eq!(found[0]["fields"]["gauge"], "llamacpp:requests_deferred");
    // The slots page, read with the key too.
    let slots = lines(
        &raw,
        "engine slots found: its streams count whole while they fill them",
    );
    assert_eq!(slots.len(), 1, "{raw}");
    assert_eq!(slots[0]["fields"]["slots"], 2);
    assert!(
        lines(&raw, "metrics page refused; unmeasured").is_empty(),
        "{raw}"
    );
    assert!(!raw.contains(KEY), "the engines' key reached the log");
}

/// A llama.cpp engine whose `/props` cannot be read (here a proxy in front serves only
/// `/metrics`) runs without its slots known, which changes how its load counts: `serve`
/// says so once at `warn`, naming the endpoint, not read after read at `debug`.
#[tokio::test]
async fn a_llama_engine_whose_slots_cannot_be_read_is_warned_about_once() {
    let (endpoint, raw) = serve_polling_a_metrics_page("llamacpp:requests_deferred 0\n").await;
    let warned = log_lines(
        &raw,
        "engine slots unknown: llama.cpp's /props unreadable or without total_slots; \
         its streams count at half, as on an engine that batches",
    );
    assert_eq!(warned.len(), 1, "{raw}");
    assert_eq!(warned[0]["level"], "WARN");
    assert_eq!(warned[0]["fields"]["cluster"], "east/east-a");
    assert_eq!(warned[0]["fields"]["endpoint"], endpoint.as_str());
    assert_eq!(warned[0]["fields"]["read_again_secs"], 60);
}

/// The JSON lines of `raw` whose message is `message`.
fn log_lines(raw: &str, message: &str) -> Vec<Value> {
    raw.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == message)
        .collect()
}

/// A read of an endpoint's metrics that began before a reload removed the endpoint, and
/// ended after, does not write what it found back: when a later reload adds the endpoint
/// again, what its page serves is logged again, as for any new endpoint.
#[tokio::test]
async fn an_endpoint_removed_while_its_page_was_read_is_logged_again_when_it_comes_back() {
    use std::sync::atomic::AtomicBool;

    // A page without a known gauge. While `hold` is set, a read of it waits (up to 1.5 s,
    // under the poller's 2 s timeout) for `release`: the test holds one across a reload.
    let (hold, holding, reads) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let release = Arc::new(tokio::sync::Notify::new());
    let page = (
        Arc::clone(&hold),
        Arc::clone(&holding),
        Arc::clone(&reads),
        Arc::clone(&release),
    );
    let slow = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (hold, holding, reads, release) = page.clone();
            async move {
                if hold.swap(false, Ordering::SeqCst) {
                    holding.store(true, Ordering::SeqCst);
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_millis(1500),
                        release.notified(),
                    )
                    .await;
                    holding.store(false, Ordering::SeqCst);
                }
                reads.fetch_add(1, Ordering::SeqCst);
                "process_cpu_seconds_total 1\n"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, slow).await });
    let other = MockEngine::start("127.0.0.1:0", MockEngineConfig::named("east-b"))
        .await
        .unwrap();
    let config = |endpoint: &str| {
        format!(
            "queue: {{ poll_interval_ms: 20 }}\n\
             sites:\n  - name: east\n    clusters:\n\
             \x20     - {{ name: east-a, models: [demo-model], endpoints: [{endpoint}] }}\n"
        )
    };
    let warning =
        "metrics page serves no known queue gauge; unmeasured (set queue.metric to name one)";

    let serving = Serving::start(&config(&slow_url), "info");
    serving
        .eventually("the slow page is logged", || async {
            serving.lines(warning).len() == 1
        })
        .await;
    // Removed while a read of it is holding, ...
    hold.store(true, Ordering::SeqCst);
    serving
        .eventually("a read of the page held", || async {
            holding.load(Ordering::SeqCst)
        })
        .await;
    serving.reload(&config(&other.url()), 1).await;
    // ... and ends once the poller has moved to the new endpoints (it reads the new one
    // only after pruning its log to them); then no read of it runs any more.
    serving
        .eventually("the new endpoint is read", || async {
            !serving.lines("queue gauge found").is_empty()
        })
        .await;
    let before = reads.load(Ordering::SeqCst);
    release.notify_one();
    serving
        .eventually("the held read ends", || async {
            reads.load(Ordering::SeqCst) > before
        })
        .await;
    // Added again: logged again, after that reload (the read that ended after the
    // first reload wrote nothing, so neither logged then nor kept the endpoint known).
    serving.reload(&config(&slow_url), 2).await;
    serving
        .eventually("the slow page is logged again", || async {
            serving.lines(warning).len() >= 2
        })
        .await;
    let raw = serving.stop().await;
    let order: Vec<&str> = raw
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|line| match line["fields"]["message"].as_str() {
            Some("config reload applied") => Some("reload"),
            Some(message) if message == warning => Some("warning"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["warning", "reload", "reload", "warning"], "{raw}");
}

/// A stand-in vLLM engine: `/metrics` reads an empty queue, a chat request gets a
/// completion, its `x-request-id` (or `None`) kept in the list returned, and a completions
/// request gets a stream cut after its first event.
async fn engine_keeping_request_ids() -> (String, Arc<std::sync::Mutex<Vec<Option<String>>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async { "vllm:num_requests_waiting 0\n" }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |headers: http::HeaderMap| {
                let id = headers
                    .get("x-request-id")
                    .map(|id| id.to_str().unwrap().to_owned());
                keep.lock().unwrap().push(id);
                async {
                    axum::Json(serde_json::json!({
                        "id": "chatcmpl-1", "object": "chat.completion", "model": "demo-model",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                    }))
                }
            }),
        );
    let app = app.route(
        "/v1/completions",
        axum::routing::post(|| async {
            let event = bytes::Bytes::from_static(
                b"data: {\"choices\":[{\"index\":0,\"text\":\"o\"}]}\n\n",
            );
            // The cut comes 200 ms after the event, once the head has left.
            let pieces = futures_util::StreamExt::then(
                futures_util::stream::iter([Some(event), None]),
                |piece| async move {
                    if let Some(event) = piece {
                        Ok(event)
                    } else {
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        Err(std::io::Error::other("the engine died"))
                    }
                },
            );
            (
                [("content-type", "text/event-stream")],
                axum::body::Body::from_stream(pieces),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, seen)
}

/// Whether `id` reads as a UUID as the gateway makes them: 36 bytes, hex digits and four
/// hyphens where a UUID has them.
fn is_uuid(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(at, c)| {
            if [8, 13, 18, 23].contains(&at) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// Every request gets an `x-request-id`: the client's when it reads as an id, else a new
/// UUID. The engine gets that id with the request, the client gets it on the answer (the
/// gateway's own answers too), and the request log's line carries it, so one id finds a
/// request in all three; an answer cut after its head is logged under it too. A client's
/// id that could be prose, or that is sent twice, never reaches the log or the engine.
#[tokio::test]
async fn every_request_has_one_id_that_the_client_the_engine_and_the_log_share() {
    let (endpoint, seen) = engine_keeping_request_ids().await;
    let serving = Serving::start(
        &format!(
            "sites:\n  - name: east\n    clusters:\n\
             \x20     - {{ name: east-a, models: [demo-model], endpoints: [{endpoint}] }}\n"
        ),
        "info",
    );
    let health = format!("http://127.0.0.1:{}/healthz", serving.admin);
    serving
        .eventually("serve answers", || async {
            try_send_with(Method::GET, &health, &[], "", REQUEST_DEADLINE)
                .await
                .is_some()
        })
        .await;
    let front = format!("http://127.0.0.1:{}", serving.listen);
    let chat = format!("{front}/v1/chat/completions");
    let body = r#"{"model":"demo-model","messages":[{"role":"user","content":"hi"}]}"#;
    let long = "x".repeat(129);
    // What the client sends as x-request-id, and whether the gateway keeps it.
    let sent: [(&[&str], bool); 5] = [
        (&["req_7f3A-01.b:c/d+e="], true),
        (&[], false),
        (&["two words"], false),
        (&[long.as_str()], false),
        (&["dup-id-a", "dup-id-b"], false),
    ];
    let mut answered = Vec::new();
    for (ids, kept) in sent {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(ids.iter().map(|id| ("x-request-id", *id)));
        let answer = try_send_with(Method::POST, &chat, &headers, body, REQUEST_DEADLINE)
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        let id = answer.headers["x-request-id"].to_str().unwrap().to_owned();
        if kept {
            assert_eq!(id, ids[0]);
        } else {
            assert!(is_uuid(&id), "{ids:?} answered with {id}");
        }
        answered.push(id);
    }
    let refused = try_send_with(
        Method::GET,
        &format!("{front}/not-served"),
        &[],
        "",
        REQUEST_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let id = refused.headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(is_uuid(&id), "{id}");
    answered.push(id);

    // A stream the engine cuts: the client gets no whole answer, and the log says so.
    let cut = try_send_with(
        Method::POST,
        &format!("{front}/v1/completions"),
        &[
            ("content-type", "application/json"),
            ("x-request-id", "cut-stream-1"),
        ],
        r#"{"model":"demo-model","prompt":"hi","stream":true}"#,
        REQUEST_DEADLINE,
    )
    .await;
    assert!(
        cut.is_none(),
        "the cut stream reached the client whole: {:?}",
        cut.map(|a| (a.status, a.body))
    );
    answered.push("cut-stream-1".to_owned());

    let distinct: std::collections::HashSet<&String> = answered.iter().collect();
    assert_eq!(distinct.len(), answered.len(), "{answered:?}");
    let engine_saw: Vec<String> = seen.lock().unwrap().iter().flatten().cloned().collect();
    assert_eq!(engine_saw, answered[..5], "the engine got each answer's id");
    serving
        .eventually("the cut stream is logged", || async {
            !serving
                .lines("the answer failed after its head; the client's stream is cut")
                .is_empty()
        })
        .await;
    let raw = serving.stop().await;
    let failed = log_lines(
        &raw,
        "the answer failed after its head; the client's stream is cut",
    );
    assert_eq!(failed.len(), 1, "{raw}");
    assert_eq!(failed[0]["fields"]["request_id"], "cut-stream-1");
    let logged: Vec<String> = log_lines(&raw, "request")
        .iter()
        .filter(|line| line["target"] == "grid_route_example::access")
        .map(|line| line["fields"]["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(logged, answered, "{raw}");
    for unread in ["two words", long.as_str(), "dup-id-a", "dup-id-b"] {
        assert!(!raw.contains(unread), "{unread} reached the log");
    }
}
