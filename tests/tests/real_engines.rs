//! Real engines: the example gateway in front of two llama.cpp `llama-server` processes.
//!
//! Each test starts two engines (SmolLM2-135M-Instruct, one CPU thread, one slot, with
//! `--metrics`) on free ports and `Gateway::start` in front of them as two sites, which
//! finds the engines' `llamacpp:requests_deferred` gauge itself (no `queue.metric`), all
//! over real sockets. Which engine answered
//! is read from the engines' own `/metrics` (`llamacpp:n_decode_total` moves only on the
//! engine that ran the request); cached prompt tokens from the usage the engine reports.
//!
//! The engine and the model come from PyPI and are built and cached by `tests/llama/setup`,
//! so these tests are behind the `llama` feature:
//!
//! ```sh
//! tests/llama/setup && cargo test -p grid-route-tests --features llama --test real_engines
//! ```
//!
//! The binary and the model are `$GRID_ROUTE_LLAMA_SERVER` and `$GRID_ROUTE_LLAMA_MODEL`
//! (what the setup prints), else the files in the setup's default cache. A missing one
//! fails the test, naming that command: with the feature on, these tests never pass
//! without running.
//!
//! Each engine writes its log to `grid-route-llama-<pid>-<site>-<port>.log` in the
//! temporary folder, kept when its test fails.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_example::config::GatewayConfig;
use grid_route_example::gateway::Gateway;
use grid_route_tests::{Answer, SITES, free_port, try_send, try_send_with, workspace_root};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

/// The name the engines serve the model under (`--alias`) and the clusters list.
const LLAMA_MODEL: &str = "smollm2";
/// Generous for loading a 100 MB model on a busy 2-core machine.
const ENGINE_START: Duration = Duration::from_secs(120);
/// Longest any one request may take: a ~1k-token prefill on one thread of a busy machine.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Enough to tell text apart and short enough to keep each request within seconds.
const MAX_TOKENS: u32 = 24;
const LLAMA_SETUP: &str =
    "tests/llama/setup && cargo test -p grid-route-tests --features llama --test real_engines";

// ---- the engine and the model -------------------------------------------------------

/// `tests/llama/setup`'s cache folder: the same rule as the script's.
fn setup_cache() -> PathBuf {
    if let Some(cache) = std::env::var_os("GRID_ROUTE_LLAMA_CACHE") {
        return PathBuf::from(cache);
    }
    let pins = std::fs::read_to_string(workspace_root().join("tests/llama/pins")).unwrap();
    let version = pins
        .lines()
        .find_map(|line| line.strip_prefix("LLAMA_CPP_PYTHON="))
        .expect("tests/llama/pins names LLAMA_CPP_PYTHON");
    let base = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"),
        PathBuf::from,
    );
    base.join("grid-route/llama").join(version.trim())
}

/// `$var`, else `default` under the setup's cache; a failure naming the setup otherwise.
fn setup_file(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| setup_cache().join(default), PathBuf::from);
    assert!(
        path.is_file(),
        "no {} at {}: run `{LLAMA_SETUP}` from the workspace root (or set {var})",
        Path::new(default).file_name().unwrap().to_string_lossy(),
        path.display()
    );
    path
}

/// A running `llama-server`, killed when dropped.
struct Engine {
    url: String,
    process: tokio::process::Child,
    log: PathBuf,
}

impl Engine {
    async fn start(name: &str) -> Self {
        Self::start_with(name, &[]).await
    }

    /// Starts one with `extra` arguments after the usual ones.
    async fn start_with(name: &str, extra: &[&str]) -> Self {
        let server = setup_file("GRID_ROUTE_LLAMA_SERVER", "bin/llama-server");
        let model = setup_file("GRID_ROUTE_LLAMA_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf");
        Self::launch(&server, &model, name, extra)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `server` on `model` with `extra` arguments and waits until it is healthy, or
    /// says why it is not.
    async fn launch(
        server: &Path,
        model: &Path,
        name: &str,
        extra: &[&str],
    ) -> Result<Self, String> {
        // The port is free when asked for; llama-server binds it moments later.
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "grid-route-llama-{}-{name}-{port}.log",
            std::process::id()
        ));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = tokio::process::Command::new(server);
        command
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--model")
            .arg(model)
            .args(["--alias", LLAMA_MODEL, "--metrics"])
            // One thread and one slot each: the engines of the issue's measurements, and
            // two of them fit on a 2-core machine beside the build.
            .args(["--threads", "1", "--threads-batch", "1", "--parallel", "1"])
            .args(["--ctx-size", "4096", "--seed", "7"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .kill_on_drop(true);
        // A binary written moments ago (the stand-in of the dying-engine test) can be busy
        // for an instant while another test's fork still holds its write descriptor.
        let mut tries = 0;
        let process = loop {
            match command.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                spawned => {
                    break spawned.map_err(|e| format!("cannot run {}: {e}", server.display()))?;
                }
            }
        };
        let mut engine = Self {
            url: format!("http://127.0.0.1:{port}"),
            process,
            log,
        };
        engine.wait_healthy().await?;
        Ok(engine)
    }

    /// Waits until `/health` says the model is loaded; fails at once, with the engine's last
    /// log lines, when the process exits first.
    async fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + ENGINE_START;
        loop {
            if let Some(answer) = try_send(Method::GET, &format!("{}/health", self.url), "").await
                && answer.status == StatusCode::OK
            {
                return Ok(());
            }
            if let Some(status) = self.process.try_wait().unwrap() {
                return Err(format!(
                    "llama-server at {} exited before it was healthy ({}); run \
                     tests/llama/setup, which checks the binary on this CPU; the engine's \
                     last log lines:\n{}",
                    self.url,
                    describe_exit(status),
                    last_lines(&self.log, 20)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "llama-server at {} did not become healthy in {ENGINE_START:?}; its last \
                     log lines:\n{}",
                    self.url,
                    last_lines(&self.log, 20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A `llamacpp:<name>` value from the engine's `/metrics`.
    async fn metric(&self, name: &str) -> f64 {
        let answer = send_slow(Method::GET, &format!("{}/metrics", self.url), "").await;
        let text = answer.text();
        let prefix = format!("llamacpp:{name} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no llamacpp:{name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// How a process ended: its exit status, or the signal that killed it.
fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// The last `count` lines of the file at `path`, or why there are none.
fn last_lines(path: &Path, count: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(count)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

impl Drop for Engine {
    /// Keeps the engine's log only when a test failed, to read after it.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Two engines, one per site, and the gateway in front of them.
struct TwoSites {
    sites: [&'static str; 2],
    engines: Vec<Engine>,
    gateway: Gateway,
}

impl TwoSites {
    async fn start() -> Self {
        Self::start_as(SITES).await
    }

    /// With sites named `sites`: the gateway's counters are per process, so a test that
    /// reads them names its sites apart from the others'.
    async fn start_as(sites: [&'static str; 2]) -> Self {
        let mut engines = Vec::new();
        for site in sites {
            engines.push(Engine::start(site).await);
        }
        let mut yaml = String::from(
            // No queue metric named: the gateway finds llama.cpp's `requests_deferred`
            // on each engine's page (the loop below waits until it has read both).
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n\
             queue: { poll_interval_ms: 100, window_secs: 2 }\n\
             grid_site_route: { prefix_affinity: { exploration: 0.0 } }\nsites:\n",
        );
        for (site, engine) in sites.iter().zip(&engines) {
            let _ = writeln!(
                yaml,
                "  - {{ name: {site}, clusters: [{{ name: {site}-a, models: [{LLAMA_MODEL}], \
                 endpoints: [{}] }}] }}",
                engine.url
            );
        }
        let gateway = Gateway::start(GatewayConfig::from_yaml(&yaml).unwrap())
            .await
            .unwrap();
        let deadline = Instant::now() + ENGINE_START;
        loop {
            let view = gateway.grid().view();
            let now = Instant::now();
            if view
                .clusters()
                .iter()
                .all(|c| c.load().queue_depth(now).is_finite())
            {
                break;
            }
            assert!(now < deadline, "the gateway never read the engines' queues");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            sites,
            engines,
            gateway,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Answer {
        let url = format!("{}{path}", self.gateway.url());
        let answer = send_slow(Method::POST, &url, body.to_string()).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.text());
        answer
    }

    /// Posts `body` and says which site's engine ran it, by the engines' decode counters.
    async fn post_and_locate(&self, path: &str, body: &Value) -> (Answer, &'static str) {
        let mut before = Vec::new();
        for engine in &self.engines {
            before.push(engine.metric("n_decode_total").await);
        }
        let answer = self.post(path, body).await;
        let mut ran = Vec::new();
        for ((site, engine), before) in self.sites.iter().zip(&self.engines).zip(before) {
            if engine.metric("n_decode_total").await > before {
                ran.push(*site);
            }
        }
        assert_eq!(
            ran.len(),
            1,
            "expected one engine to run {path}, got {ran:?}"
        );
        (answer, ran[0])
    }
}

// ---- the client ---------------------------------------------------------------------

/// Sends a JSON request and reads its whole answer, within [`REQUEST_TIMEOUT`] (a real
/// engine's prefill on a busy machine takes longer than the harness's deadline).
async fn send_slow(method: Method, url: &str, body: impl Into<Bytes>) -> Answer {
    let json = [("content-type", "application/json")];
    try_send_with(method.clone(), url, &json, body, REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|| panic!("no whole answer to {method} {url} within {REQUEST_TIMEOUT:?}"))
}

/// The `data:` payloads of `answer`'s server-sent event stream, in order, each parsed as
/// JSON except the `[DONE]` sentinel, which is returned as a JSON string. A stream cut
/// mid-event loses that event, so its API's closing event is missing ([`streamed_text`]
/// checks it).
fn json_events(answer: &Answer) -> Vec<Value> {
    assert!(
        answer.content_type().starts_with("text/event-stream"),
        "not an event stream: {} {}",
        answer.content_type(),
        answer.text()
    );
    answer
        .event_data()
        .into_iter()
        .map(|data| {
            if data == "[DONE]" {
                Value::String("[DONE]".to_owned())
            } else {
                serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {data:?}"))
            }
        })
        .collect()
}

// ---- prompts ------------------------------------------------------------------------

/// A system prompt of about `bytes` bytes that differs by `topic`.
fn system_prompt(topic: &str, bytes: usize) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < bytes {
        let _ = write!(
            text,
            "Rule {i} of the {topic} desk: answer in one short sentence, stay on the {topic} \
             topic, and never repeat the question. "
        );
        i += 1;
    }
    text
}

/// A request's sampling: greedy, so the same prompt gives the same text on either engine.
fn greedy(mut body: Value) -> Value {
    body["model"] = json!(LLAMA_MODEL);
    body["temperature"] = json!(0.0);
    body["seed"] = json!(7);
    body
}

/// The text of a non-streamed answer of `path`'s API.
fn answer_text(path: &str, answer: &Value) -> String {
    let text = match path {
        "/v1/chat/completions" => &answer["choices"][0]["message"]["content"],
        "/v1/completions" => &answer["choices"][0]["text"],
        "/v1/messages" => &answer["content"][0]["text"],
        "/v1/responses" => &answer["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["type"] == "message")
            .unwrap_or_else(|| panic!("no message in {answer}"))["content"][0]["text"],
        _ => unreachable!("{path}"),
    };
    text.as_str()
        .unwrap_or_else(|| panic!("no text in {answer}"))
        .to_owned()
}

/// The text a stream of `path`'s API carried, after checking that it ended the way its
/// API ends a stream.
fn streamed_text(path: &str, events: &[Value]) -> String {
    let mut text = String::new();
    match path {
        "/v1/chat/completions" | "/v1/completions" => {
            assert_eq!(events.last().unwrap(), "[DONE]", "{events:?}");
            let field = if path == "/v1/completions" {
                "/choices/0/text"
            } else {
                "/choices/0/delta/content"
            };
            for event in &events[..events.len() - 1] {
                if let Some(piece) = event.pointer(field).and_then(Value::as_str) {
                    text.push_str(piece);
                }
            }
        }
        "/v1/messages" => {
            assert_eq!(events.last().unwrap()["type"], "message_stop", "{events:?}");
            for event in events {
                if event["type"] == "content_block_delta" && event["delta"]["type"] == "text_delta"
                {
                    text.push_str(event["delta"]["text"].as_str().unwrap());
                }
            }
        }
        "/v1/responses" => {
            let last = events.last().unwrap();
            assert_eq!(last["type"], "response.completed", "{events:?}");
            for event in events {
                if event["type"] == "response.output_text.delta" {
                    text.push_str(event["delta"].as_str().unwrap());
                }
            }
            // The closing event repeats the whole answer: it must be what the deltas built.
            assert_eq!(answer_text(path, &last["response"]), text);
        }
        _ => unreachable!("{path}"),
    }
    text
}

/// The same greedy request through the gateway, streamed and not: both arrive whole and
/// carry the same text.
async fn assert_streams_through_whole(path: &str, body: Value) {
    let sites = TwoSites::start().await;
    let body = greedy(body);
    let whole = sites.post(path, &body).await;
    let whole_text = answer_text(path, &whole.json());
    assert!(!whole_text.trim().is_empty(), "{path}: empty answer");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let streamed = sites.post(path, &streaming).await;
    let streamed_text = streamed_text(path, &json_events(&streamed));
    assert_eq!(
        streamed_text, whole_text,
        "{path}: the stream carried other text"
    );
}

// ---- tests --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_turn_stays_on_its_site_and_the_engine_serves_it_from_cache() {
    let sites = TwoSites::start_as(["sticky-east", "sticky-west"]).await;
    let mut messages = vec![
        json!({"role": "system", "content": system_prompt("astronomy", 3000)}),
        json!({"role": "user", "content": "Name one planet."}),
    ];
    let first_body = greedy(json!({"messages": messages, "max_tokens": MAX_TOKENS}));
    let (first, first_site) = sites
        .post_and_locate("/v1/chat/completions", &first_body)
        .await;
    let first = first.json();
    let first_prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(first_prompt_tokens > 500, "{}", first["usage"]);

    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And one moon?"}));
    let second_body = greedy(json!({"messages": messages, "max_tokens": MAX_TOKENS}));
    let (second, second_site) = sites
        .post_and_locate("/v1/chat/completions", &second_body)
        .await;
    assert_eq!(second_site, first_site, "the follow-up left its site");
    // This llama-server reports `usage.prompt_tokens_details.cached_tokens` and keeps a
    // slot's prompt for the next request by default (`cache_prompt: true`): nothing to ask.
    let usage = &second.json()["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {usage}"));
    // The engine kept the first turn's prompt: nearly all of it is served from its cache.
    assert!(
        cached * 10 >= first_prompt_tokens * 9,
        "{cached} of the first turn's {first_prompt_tokens} prompt tokens cached: {usage}"
    );

    // The gateway read both answers' usage: its counters for the site hold both turns.
    let prompt_tokens = first_prompt_tokens + usage["prompt_tokens"].as_u64().unwrap();
    let labels = format!(r#"{{site="{first_site}",cluster="{first_site}-a"}}"#);
    let scrape = send_slow(
        Method::GET,
        &format!("{}/metrics", sites.gateway.admin_url()),
        "",
    )
    .await
    .text();
    let counted = |name: &str| -> u64 {
        let series = format!("{name}{labels} ");
        scrape
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in {scrape}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(counted("grid_route_prompt_tokens_total"), prompt_tokens);
    // The first turn found nothing cached: the engines were fresh.
    assert_eq!(counted("grid_route_cached_prompt_tokens_total"), cached);
    // The follow-up was sticky: the index's prediction (4 bytes a token) against what the
    // engine's own tokenizer reported. A faithful engine delivers at least half of it, so
    // engine feedback forgets nothing.
    let predicted = counted("grid_route_predicted_cached_tokens_total");
    assert_eq!(counted("grid_route_delivered_cached_tokens_total"), cached);
    assert!(
        predicted > 0 && cached * 2 >= predicted,
        "{cached} of {predicted}"
    );
    // Both turns were JSON answers, whose head comes once they are whole: at the defaults
    // their time teaches the prices nothing (event streams do; tests/tests/gateway.rs).
    let gauge = format!("grid_route_prefill_tokens_per_second{labels} ");
    assert!(
        !scrape.lines().any(|line| line.starts_with(&gauge)),
        "a JSON answer taught a price: {scrape}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Loads are sums of whole requests and halves: exactly representable.
#[allow(clippy::float_cmp)]
async fn an_engines_slots_are_read_from_it_and_a_stream_filling_them_counts_whole() {
    use http_body_util::{BodyExt as _, Full};

    let sites = TwoSites::start_as(["slots-east", "slots-west"]).await;
    // Each engine runs one slot (`--parallel 1`): its `/props` says so.
    let deadline = Instant::now() + ENGINE_START;
    while !sites
        .gateway
        .grid()
        .view()
        .clusters()
        .iter()
        .all(|c| c.load().slots() == Some(1))
    {
        assert!(
            Instant::now() < deadline,
            "the engines' slots were never read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A long streamed answer: once its first token is out, it holds its engine's one slot,
    // so it counts whole where on an engine that batches it would count half.
    let body = json!({
        "messages": [{"role": "user", "content": "Count from one to two hundred, in words."}],
        "max_tokens": 400,
        "stream": true,
        "temperature": 0.0,
        "ignore_eos": true,
    });
    let request = hyper::Request::post(format!("{}/v1/chat/completions", sites.gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response =
        tokio::time::timeout(REQUEST_TIMEOUT, grid_route_tests::client().request(request))
            .await
            .expect("the stream's head within the deadline")
            .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.into_body();
    let frame = tokio::time::timeout(REQUEST_TIMEOUT, stream.frame())
        .await
        .expect("the stream's first data within the deadline");
    assert!(frame.is_some_and(|f| f.is_ok()));
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let (stream_load, other_load) = loop {
        let view = sites.gateway.grid().view();
        let now = Instant::now();
        let streaming: Vec<_> = view
            .clusters()
            .iter()
            .map(|c| {
                (
                    c.load().streaming(),
                    c.load().routing_load(now) - c.load().queue_depth(now),
                )
            })
            .collect();
        match streaming.as_slice() {
            [(1, load), (0, other)] | [(0, other), (1, load)] => break (*load, *other),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no cluster counted the stream: {streaming:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        stream_load, 1.0,
        "a stream filling its engine's slot counts whole"
    );
    assert_eq!(other_load, 0.0);
    // Read to its end: it stops counting.
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        while stream.frame().await.is_some() {}
    })
    .await
    .expect("the stream's end within the deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_started_with_an_api_key_is_read_with_the_key_the_config_names() {
    const KEY: &str = "sk-real-engine-key";
    let engine = Engine::start_with("keyed", &["--api-key", KEY]).await;
    let scratch = tempfile::tempdir().unwrap();
    let key_file = scratch.path().join("engine.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let config = |queue: String| {
        GatewayConfig::from_yaml(&format!(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nqueue: {{ {queue} }}\n\
             sites:\n  - {{ name: keyed, clusters: [{{ name: keyed-a, models: [{LLAMA_MODEL}], \
             endpoints: [{}] }}] }}\n",
            engine.url
        ))
        .unwrap()
    };
    let read = |gateway: &Gateway| {
        let view = gateway.grid().view();
        let load = view.clusters()[0].load();
        (load.queue_depth(Instant::now()).is_finite(), load.slots())
    };

    // The engine refuses both pages without its key...
    for page in ["/metrics", "/props"] {
        let answer = try_send(Method::GET, &format!("{}{page}", engine.url), "")
            .await
            .expect("the engine answers");
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{page}");
    }
    // ...so a gateway without it has no queue and no slots, however long it polls
    // (twenty polls here).
    let gateway = Gateway::start(config("poll_interval_ms: 50".to_owned()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        read(&gateway),
        (false, None),
        "read without the engine's key"
    );

    // A reload that names the key: both, the engine's queue gauge and its one slot.
    gateway
        .reload(&config(format!(
            "poll_interval_ms: 50, api_key_path: {}",
            key_file.display()
        )))
        .unwrap();
    let deadline = Instant::now() + ENGINE_START;
    while read(&gateway) != (true, Some(1)) {
        assert!(
            Instant::now() < deadline,
            "the gateway never read the keyed engine: {:?}",
            read(&gateway)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_arrives_whole() {
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Write two sentences about rivers."},
        ],
        "max_tokens": MAX_TOKENS,
        "stream_options": {"include_usage": true},
    });
    assert_streams_through_whole("/v1/chat/completions", body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_completions_arrive_whole() {
    let body = json!({"prompt": "The three largest oceans are", "max_tokens": MAX_TOKENS});
    assert_streams_through_whole("/v1/completions", body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_anthropic_messages_arrive_whole() {
    let body = json!({
        "system": "You are a concise assistant.",
        "messages": [{"role": "user", "content": "Write two sentences about mountains."}],
        "max_tokens": MAX_TOKENS,
    });
    assert_streams_through_whole("/v1/messages", body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_responses_arrive_whole() {
    let body = json!({
        "instructions": "You are a concise assistant.",
        "input": "Write two sentences about forests.",
        "max_output_tokens": MAX_TOKENS,
        "store": false,
    });
    assert_streams_through_whole("/v1/responses", body).await;
}

/// An engine that dies while loading (as a native build did on Intel CPUs with AMX) fails its
/// test at once, with its own last log lines, instead of waiting out `ENGINE_START`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_dies_while_loading_fails_its_test_at_once_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("llama-server");
    std::fs::write(
        &server,
        "#!/bin/sh\necho 'llama threadpool init, n_threads = 1'\nkill -SEGV $$\n",
    )
    .unwrap();
    std::fs::set_permissions(&server, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"not a model").unwrap();

    let started = Instant::now();
    let Err(why) = Engine::launch(&server, &model, "dying", &[]).await else {
        panic!("a server that kills itself was taken for healthy");
    };
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?} to notice the engine had died",
        started.elapsed()
    );
    assert!(why.contains("killed by signal 11"), "{why}");
    assert!(why.contains("llama threadpool init"), "{why}");
}
