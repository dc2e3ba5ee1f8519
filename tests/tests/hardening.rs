//! The gateway when clients, engines and operators misbehave: what it forwards, how long
//! it waits, where it retries, which endpoints it takes out of rotation, and what its
//! metrics forget. `Gateway::start` in process, mock engines behind it, real sockets.
//!
//! Waits poll a condition with a deadline; none guesses a duration.

// Test code: a failed unwrap is a failed test. Queue depths are small integers read back
// exactly, so they compare exactly.
#![allow(clippy::unwrap_used, clippy::float_cmp)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_example::config::GatewayConfig;
use grid_route_example::gateway::{Gateway, MIN_HEAD_SAMPLES};
use grid_route_mock_engine::{MockEngine, MockEngineConfig};
use grid_route_tests::{
    ClusterYaml, MODEL, WAIT, chat, client, cluster, cluster_id, config_yaml, empty_vllm_metrics,
    engine, engine_requests, engine_serving, eventually, gateway, metric, read_head, send,
    set_queue, try_send_with,
};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A config with one cluster per `(site, cluster, endpoints)`, no exploration, then
/// `extra` YAML.
fn yaml_of(clusters: &[(&str, &str, Vec<String>)], extra: &str) -> String {
    let mut sites: Vec<(&str, Vec<ClusterYaml>)> = Vec::new();
    for (site, name, endpoints) in clusters {
        let c = cluster(name, &[]).at(endpoints.clone());
        match sites.iter_mut().find(|(s, _)| s == site) {
            Some((_, clusters)) => clusters.push(c),
            None => sites.push((site, vec![c])),
        }
    }
    let extra = format!("grid_site_route: {{ prefix_affinity: {{ exploration: 0.0 }} }}\n{extra}");
    config_yaml(&sites, &extra)
}

// ---- what is forwarded --------------------------------------------------------------

#[tokio::test]
async fn the_consumer_role_forwards_only_the_llm_api() {
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(&[("east", "east-a", vec![east.url()])], "")).await;
    let url = |path: &str| format!("{}{path}", gateway.url());

    let chat_answer = send(Method::POST, &url("/v1/chat/completions"), chat("hi")).await;
    assert_eq!(chat_answer.status, StatusCode::OK);
    let stored = chat_answer.json();
    assert_eq!(chat_answer.engine(), Some("east-a"));
    assert!(stored["id"].is_string());
    let response = send(
        Method::POST,
        &url("/v1/responses"),
        format!(r#"{{"model":"{MODEL}","input":"hello"}}"#),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    let id = response.json()["id"].as_str().unwrap().to_owned();
    let fetched = send(Method::GET, &url(&format!("/v1/responses/{id}")), "").await;
    assert_eq!(fetched.status, StatusCode::OK, "{:?}", fetched.body);
    assert_eq!(fetched.engine(), Some("east-a"));

    let before = engine_requests(&east);
    for (method, path) in [
        (Method::GET, "/mock/last_body"),
        (Method::POST, "/mock/reset"),
        (Method::GET, "/metrics"),
        (Method::GET, "/health"),
        (Method::POST, "/tokenize"),
        (Method::GET, "/v1/responses/../../mock/last_body"),
        (Method::GET, "/v1/responses/%2e%2e"),
        (Method::POST, "/v1/chat/completions/extra"),
    ] {
        let refused = send(method.clone(), &url(path), "{}").await;
        assert_eq!(refused.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(refused.error_code(), "not_found", "{method} {path}");
        assert_eq!(refused.engine(), None, "{method} {path} reached an engine");
    }
    let refused = send(Method::GET, &url("/v1/chat/completions"), "").await;
    assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused.headers["allow"], "POST");
    assert_eq!(refused.error_code(), "method_not_allowed");
    let refused = send(Method::PUT, &url(&format!("/v1/responses/{id}")), "{}").await;
    assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused.headers["allow"], "GET, DELETE");
    assert_eq!(
        engine_requests(&east),
        before,
        "a refused request was forwarded"
    );
}

#[tokio::test]
async fn forward_paths_replaces_the_default_list_and_reloads() {
    let east = engine("east-a").await;
    let extra = "forward_paths:\n  - { path: /v1/chat/completions, methods: [POST] }\n  \
                 - { path: \"/mock/stats\", methods: [GET] }\n";
    let gateway = gateway(&yaml_of(&[("east", "east-a", vec![east.url()])], extra)).await;
    let url = |path: &str| format!("{}{path}", gateway.url());
    let stats = send(Method::GET, &url("/mock/stats"), "").await;
    assert_eq!(stats.status, StatusCode::OK);
    assert_eq!(stats.engine(), Some("east-a"));
    let refused = send(Method::POST, &url("/v1/completions"), "{}").await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let refused = send(Method::GET, &url("/v1/models"), "").await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);

    // A reload back to the default list applies to the next request.
    let default = yaml_of(&[("east", "east-a", vec![east.url()])], "");
    gateway
        .reload(&GatewayConfig::from_yaml(&default).unwrap())
        .unwrap();
    let refused = send(Method::GET, &url("/mock/stats"), "").await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let models = send(Method::GET, &url("/v1/models"), "").await;
    assert_eq!(models.status, StatusCode::OK);
}

// ---- clients that stall -------------------------------------------------------------

/// Reads from `socket` until the gateway closes it, or fails after [`WAIT`]; returns
/// what it sent.
async fn read_until_closed(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut received = Vec::new();
    let read = tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 4096];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the gateway kept the connection open");
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn a_client_that_never_finishes_its_head_is_disconnected() {
    use tokio::io::AsyncWriteExt as _;
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "timeouts: { client_header_secs: 1 }\n",
    ))
    .await;
    // Too short to tell the protocol, and a head cut after its first header.
    for partial in ["POST", "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"] {
        let mut socket = tokio::net::TcpStream::connect(gateway.addr())
            .await
            .unwrap();
        socket.write_all(partial.as_bytes()).await.unwrap();
        let started = Instant::now();
        let answer = read_until_closed(&mut socket).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900),
            "{partial:?}: closed after {waited:?}"
        );
        assert!(!answer.contains("200 OK"), "{partial:?}: {answer}");
    }
    assert_eq!(engine_requests(&east), 0);
}

#[tokio::test]
async fn a_request_body_that_stalls_gets_a_408() {
    use tokio::io::AsyncWriteExt as _;
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "timeouts: { client_body_idle_secs: 1 }\n",
    ))
    .await;
    // A keyed body (buffered by the gateway) and an unkeyed one (streamed to the engine).
    for path in ["/v1/chat/completions", "/v1/embeddings"] {
        let mut socket = tokio::net::TcpStream::connect(gateway.addr())
            .await
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
             content-length: 100\r\nconnection: close\r\n\r\n{{\"model\":"
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        let answer = read_until_closed(&mut socket).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
        let json: Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "request_timeout", "{path}: {body}");
    }
}

// ---- HTTP/2 -------------------------------------------------------------------------

#[tokio::test]
async fn the_client_port_speaks_http2_with_prior_knowledge() {
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(&[("east", "east-a", vec![east.url()])], "")).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let stream = format!(
        r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"over h2"}}]}}"#
    );
    for body in [chat("over h2"), stream] {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/v1/chat/completions", gateway.url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-mock-engine"], "east-a");
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&text).contains("h2"), "{text:?}");
    }
    let models = Request::builder()
        .uri(format!("{}/v1/models", gateway.url()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(models).await.unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
}

// ---- engines that stall -------------------------------------------------------------

/// A base URL nothing listens on.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn stream_chat(content: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"{content}"}}]}}"#
    )
}

fn endpoint_healthy(gateway: &Gateway, cluster: &str, url: &str) -> Option<bool> {
    let view = gateway.grid().view();
    let cluster = view.clusters().iter().find(|c| c.id().name() == cluster)?;
    cluster.load().endpoint_healthy(url)
}

#[tokio::test]
async fn an_engine_that_sends_no_head_in_time_is_a_504() {
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "timeouts: { upstream_first_byte_secs: 1 }\n",
    ))
    .await;
    east.stall(Duration::from_secs(3), Duration::ZERO);
    let started = Instant::now();
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = send(Method::POST, &url, chat("slow prefill")).await;
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(answer.error_code(), "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The request reached the engine: it is not sent again.
    assert_eq!(engine_requests(&east), 1);
}

#[tokio::test]
async fn a_stream_that_goes_quiet_is_cut_not_ended() {
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "timeouts: { upstream_idle_secs: 1 }\n",
    ))
    .await;
    east.stall(Duration::ZERO, Duration::from_secs(3));
    let client = client();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(stream_chat("quiet engine"))))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let started = Instant::now();
    let mut body = response.into_body();
    let mut received = Vec::new();
    let ended = loop {
        match body.frame().await {
            Some(Ok(frame)) => received.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(error)) => break Err(error),
            None => break Ok(()),
        }
    };
    assert!(ended.is_err(), "the stream ended cleanly: {received:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // What came before the stall reached the client.
    assert!(String::from_utf8_lossy(&received).contains("\"role\":\"assistant\""));
}

// ---- retries ------------------------------------------------------------------------

#[tokio::test]
async fn a_refused_connection_is_retried_on_another_endpoint_of_the_cluster() {
    let east = engine("east-a").await;
    let dead = dead_url();
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![dead.clone(), east.url()])],
        "",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    // p2c picks the dead endpoint sooner or later; every request must still succeed.
    for i in 0..40 {
        let answer = send(Method::POST, &url, chat(&format!("retry {i}"))).await;
        assert_eq!(answer.status, StatusCode::OK, "request {i}");
        assert_eq!(answer.engine(), Some("east-a"));
        if endpoint_healthy(&gateway, "east-a", &dead) == Some(false) {
            return;
        }
    }
    panic!("the dead endpoint was never tried");
}

/// Gives `west` a queue of 5 and waits until the gateway has read it and east's empty
/// one: east, the shorter, is where a request goes (with window_secs 30, its samples
/// last after it is gone).
async fn east_preferred(gateway: &Gateway, west: &MockEngine) {
    set_queue(west, 5).await;
    eventually("both measured, west deeper", || async {
        let view = gateway.grid().view();
        let now = Instant::now();
        let depth = |name: &str| {
            view.clusters()
                .iter()
                .find(|c| c.id().name() == name)
                .unwrap()
                .load()
                .queue_depth(now)
        };
        depth("east-a") == 0.0 && depth("west-a") == 5.0
    })
    .await;
}

#[tokio::test]
async fn a_cluster_that_cannot_connect_hands_the_request_to_the_next_one() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    // East is preferred (a shorter queue) and its samples last while it is down.
    let yaml = yaml_of(
        &[
            ("east", "east-a", vec![east.url()]),
            ("west", "west-a", vec![west.url()]),
        ],
        "",
    )
    .replace("window_secs: 1", "window_secs: 30");
    let gateway = gateway(&yaml).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let east_id = cluster_id(&gateway, "east-a");
    east_preferred(&gateway, &west).await;
    let prompt = chat(&"a long shared system prompt ".repeat(400));
    let first = send(Method::POST, &url, prompt.clone()).await;
    assert_eq!(first.engine(), Some("east-a"));
    assert!(gateway.index().entries(&east_id) > 0);

    let east_url = east.url();
    east.shutdown().await.unwrap();
    let answer = send(Method::POST, &url, prompt).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.engine(), Some("west-a"));
    assert_eq!(endpoint_healthy(&gateway, "east-a", &east_url), Some(false));
    assert_eq!(
        gateway.index().entries(&east_id),
        0,
        "the failed cluster kept the prompt's keys"
    );
}

/// An engine that dies the moment a request reaches it: it answers `/metrics` (an empty
/// vLLM queue) until the first POST, which it reads the head of and drops with the
/// connection, and then it stops listening, so any later connection is refused. Its URL.
async fn engine_that_dies_on_the_first_request() -> String {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (died, mut dead) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                _ = dead.wait_for(|dead| *dead) => return,
            };
            let (died, mut gone) = (died.clone(), dead.clone());
            tokio::spawn(async move {
                let mut read = Vec::new();
                loop {
                    // A killed process closes every connection, not only its listener.
                    let head_end = tokio::select! {
                        head = read_head(&mut socket, &mut read) => match head {
                            Some(end) => end,
                            None => return,
                        },
                        _ = gone.wait_for(|dead| *dead) => return,
                    };
                    if !read.starts_with(b"GET ") {
                        // Gone with the request unanswered, and the port closed after it.
                        died.send_replace(true);
                        return;
                    }
                    read.drain(..head_end);
                    let answer = empty_vllm_metrics(false);
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// The engine the request was sticky to dies as the request reaches it: the engine
/// closed the connection unanswered (when that connection was a reused one, the gateway's
/// resend on a new connection is refused), and the request is not sent to another cluster, since a byte of it may have
/// reached an engine (the contract retries only where none did): 502 naming the cluster.
/// The next request goes to the other cluster.
#[tokio::test]
async fn a_request_whose_engine_dies_as_it_arrives_is_not_sent_to_another_cluster() {
    let east = engine_that_dies_on_the_first_request().await;
    let west = engine("west-a").await;
    // East is preferred (a shorter queue) and its samples last after it is gone.
    let yaml = yaml_of(
        &[
            ("east", "east-a", vec![east.clone()]),
            ("west", "west-a", vec![west.url()]),
        ],
        "",
    )
    .replace("window_secs: 1", "window_secs: 30");
    let gateway = gateway(&yaml).await;
    east_preferred(&gateway, &west).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = send(Method::POST, &url, chat("to the engine that dies")).await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.text());
    assert_eq!(answer.error_code(), "backend_unreachable");
    assert!(
        answer
            .text()
            .contains("backend cluster east/east-a failed before answering"),
        "{}",
        answer.text()
    );
    assert_eq!(
        engine_requests(&west),
        0,
        "sent again after it may have reached east"
    );
    assert_eq!(endpoint_healthy(&gateway, "east-a", &east), Some(false));
    let next = send(Method::POST, &url, chat("after east died")).await;
    assert_eq!(next.status, StatusCode::OK, "{}", next.text());
    assert_eq!(next.engine(), Some("west-a"));
}

/// An engine that reads a whole request on the connection opened for it, works on it for
/// 200 ms and closes the connection unanswered (a crash mid-prefill, or a pod behind a
/// load balancer's address dying) may have acted on it: the gateway does not send it again
/// (it does only on a reused connection, which llama.cpp closes after a stream before
/// reading what comes next). 502, and the engine saw the request once.
#[tokio::test]
async fn a_request_an_engine_read_before_closing_its_new_connection_is_not_sent_again() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&posts);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut read = Vec::new();
                if read_head(&mut socket, &mut read).await.is_none() {
                    return;
                }
                if read.starts_with(b"POST") {
                    seen.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    // The poller's reads: answered, each on its own connection.
                    let _ = socket.write_all(empty_vllm_metrics(true).as_bytes()).await;
                }
            });
        }
    });
    let gateway = gateway(&yaml_of(&[("east", "east-a", vec![url])], "")).await;
    let answer = send(
        Method::POST,
        &format!("{}/v1/chat/completions", gateway.url()),
        chat("read, then the engine died"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.text());
    assert_eq!(answer.error_code(), "backend_unreachable");
    assert_eq!(
        posts.load(Ordering::SeqCst),
        1,
        "sent again after it was read"
    );
}

/// A request whose body is over the keying limit carries no prompt, only the model its
/// first bytes name. When its cluster cannot be reached, the retry goes only to clusters
/// serving that model: none here, so 502, and the cluster serving another model is never
/// sent it.
#[tokio::test]
async fn a_retry_goes_only_to_clusters_serving_the_request_model() {
    let west = engine_serving("west-b", &["other-model"]).await;
    let yaml = config_yaml(
        &[
            ("east", vec![cluster("east-a", &[]).at(vec![dead_url()])]),
            (
                "west",
                vec![cluster("west-b", &[&west]).serving(&["other-model"])],
            ),
        ],
        "max_body_bytes: 1024\n",
    );
    let gateway = gateway(&yaml).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    // The model first, as clients write it, so the gateway's scan of the first bytes finds it.
    let over_limit = |model: &str| {
        let content = "x ".repeat(1500);
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"{content}"}}]}}"#)
    };
    let answer = send(Method::POST, &url, over_limit(MODEL)).await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.text());
    assert_eq!(answer.error_code(), "backend_unreachable");
    assert_eq!(
        engine_requests(&west),
        0,
        "sent to a cluster without {MODEL}"
    );
    // The same request for west's model reaches it: the limit did not hide the model.
    let answer = send(Method::POST, &url, over_limit("other-model")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.engine(), Some("west-b"));
}

#[tokio::test]
async fn retries_stop_at_max_attempts() {
    let (first, second) = (dead_url(), dead_url());
    for (max_attempts, tried) in [(1, 1), (3, 2)] {
        let gateway = gateway(&yaml_of(
            &[("east", "east-a", vec![first.clone(), second.clone()])],
            &format!("retries: {{ max_attempts: {max_attempts} }}\n"),
        ))
        .await;
        let url = format!("{}/v1/chat/completions", gateway.url());
        let answer = send(Method::POST, &url, chat("nowhere")).await;
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
        assert_eq!(answer.error_code(), "backend_unreachable");
        let down = [&first, &second]
            .iter()
            .filter(|url| endpoint_healthy(&gateway, "east-a", url) == Some(false))
            .count();
        assert_eq!(down, tried, "max_attempts {max_attempts}");
    }
}

#[tokio::test]
async fn an_engine_error_is_not_retried() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let gateway = gateway(&yaml_of(
        &[
            ("east", "east-a", vec![east.url()]),
            ("west", "west-a", vec![west.url()]),
        ],
        "",
    ))
    .await;
    east.fail_next(StatusCode::INTERNAL_SERVER_ERROR, 100);
    west.fail_next(StatusCode::INTERNAL_SERVER_ERROR, 100);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = send(Method::POST, &url, chat("fails once")).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(engine_requests(&east) + engine_requests(&west), 1);
}

// ---- outlier ejection ---------------------------------------------------------------

#[tokio::test]
async fn an_endpoint_failing_in_a_row_is_ejected_counted_and_its_cluster_not_admitted() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let yaml = yaml_of(
        &[
            ("east", "east-a", vec![east.url()]),
            ("west", "west-a", vec![west.url()]),
        ],
        "outlier: { consecutive_failures: 3, ejection_secs: 60 }\n",
    );
    let gateway = gateway(&yaml).await;
    east.fail_next(StatusCode::SERVICE_UNAVAILABLE, 1000);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut east_failures = 0;
    for i in 0..60 {
        let answer = send(Method::POST, &url, chat(&format!("ejection {i}"))).await;
        if answer.engine() == Some("east-a") {
            assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
            east_failures += 1;
        } else {
            assert_eq!(answer.status, StatusCode::OK);
        }
        if east_failures == 3 {
            break;
        }
    }
    assert_eq!(east_failures, 3, "east was not tried three times");
    let view = gateway.grid().view();
    let east_cluster = view
        .clusters()
        .iter()
        .find(|c| c.id().name() == "east-a")
        .unwrap();
    assert!(
        !east_cluster.admits(),
        "a cluster with every endpoint ejected still admits"
    );
    drop(view);
    // The poller reads east's metrics fine, but the ejection holds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..10 {
        let answer = send(Method::POST, &url, chat(&format!("after {i}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.engine(), Some("west-a"));
    }
    let ejections = metric(
        &gateway.admin_url(),
        r#"grid_route_ejections_total{site="east",cluster="east-a"}"#,
    )
    .await;
    assert_eq!(ejections, Some(1.0));
}

/// Two endpoints of cluster `east-a` behind a gateway with `extra` config; the first
/// answers its next request 429 with `Retry-After: retry_after`. Sends requests until the
/// 429 comes; returns both engines, the gateway and when the 429 came.
async fn throttled_once(extra: &str, retry_after: u64) -> ([MockEngine; 2], Gateway, Instant) {
    let east = engine("east-a").await;
    let spare = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url(), spare.url()])],
        extra,
    ))
    .await;
    let fail = format!("{}/mock/fail", east.url());
    let plan = format!(r#"{{"status":429,"count":1,"retry_after":{retry_after}}}"#);
    assert_eq!(send(Method::POST, &fail, plan).await.status, StatusCode::OK);
    let url = format!("{}/v1/chat/completions", gateway.url());
    for i in 0..40 {
        let answer = send(Method::POST, &url, chat(&format!("busy {i}"))).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            return ([east, spare], gateway, Instant::now());
        }
    }
    panic!("the 429 never came in 40 requests");
}

#[tokio::test]
async fn a_429_with_retry_after_holds_the_endpoint_out_that_long() {
    let ([east, _spare], gateway, throttled_at) = throttled_once("", 2).await;
    assert_eq!(
        endpoint_healthy(&gateway, "east-a", &east.url()),
        Some(false)
    );
    eventually("the endpoint back after its Retry-After", || async {
        endpoint_healthy(&gateway, "east-a", &east.url()) == Some(true)
    })
    .await;
    let held = throttled_at.elapsed();
    assert!(held >= Duration::from_millis(1900), "back after {held:?}");
}

/// A gateway with every default but the listen addresses: `(site, cluster, engine URL)`s.
fn default_yaml(clusters: &[(&str, &str, String)]) -> String {
    let mut yaml = String::from("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nsites:\n");
    for (site, cluster, url) in clusters {
        let _ = writeln!(
            yaml,
            "  - {{ name: {site}, clusters: [{{ name: {cluster}, models: [{MODEL}], \
             endpoints: [{url}] }}] }}"
        );
    }
    yaml
}

#[tokio::test]
async fn a_retry_after_past_any_clock_answers_every_request_at_the_defaults() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let gateway = gateway(&default_yaml(&[
        ("east", "east-a", east.url()),
        ("west", "west-a", west.url()),
    ]))
    .await;
    // u64::MAX seconds: added to the clock as it was, it overflowed and the panic dropped
    // the client's connection.
    let fail = format!("{}/mock/fail", east.url());
    let plan = r#"{"status":429,"count":6,"retry_after":18446744073709551615}"#;
    assert_eq!(send(Method::POST, &fail, plan).await.status, StatusCode::OK);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut throttled = 0;
    for i in 0..6 {
        // `send` fails the test on a dropped connection: every request has an answer.
        let answer = send(Method::POST, &url, chat(&format!("retry after {i}"))).await;
        match answer.status {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => throttled += 1,
            other => panic!("answered {other}: {:?}", answer.body),
        }
    }
    // East is held out after its first 429, so at most that one reached the client.
    assert!(throttled <= 1, "{throttled} requests answered 429");
    assert_eq!(
        endpoint_healthy(&gateway, "east-a", &east.url()),
        Some(false)
    );
}

#[tokio::test]
async fn a_huge_retry_after_holds_an_endpoint_out_for_at_most_the_longest_ejection() {
    // A year; the longest ejection is 10 × 1 s.
    let year = 365 * 24 * 3600;
    let ([east, _spare], gateway, throttled_at) =
        throttled_once("outlier: { ejection_secs: 1 }\n", year).await;
    let deadline = throttled_at + Duration::from_secs(15);
    while endpoint_healthy(&gateway, "east-a", &east.url()) != Some(true) {
        assert!(
            Instant::now() < deadline,
            "the endpoint asked to be left alone for a year is still out after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = throttled_at.elapsed();
    assert!(held >= Duration::from_secs(9), "back after only {held:?}");
}

/// Engines `east-a` and `west-a` behind a gateway at its defaults, which has seen
/// [`MIN_HEAD_SAMPLES`] answers (before that, no request counts as stalled); the gateway's
/// chat URL.
async fn two_sites_that_answered() -> (MockEngine, MockEngine, Gateway, String) {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let gateway = gateway(&default_yaml(&[
        ("east", "east-a", east.url()),
        ("west", "west-a", west.url()),
    ]))
    .await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    for i in 0..MIN_HEAD_SAMPLES {
        let answer = send(Method::POST, &url, chat(&format!("warm up {i}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    (east, west, gateway, url)
}

/// An engine that takes requests and never answers them while its `/metrics` says its
/// queue is empty (a hung worker behind a live HTTP server), at the gateway's defaults.
/// A whole (non-streamed) answer's head comes only once the engine generated it, long
/// after a stream's. On a grid that has seen only streams it is not taken for a wedge:
/// whole answers are held to whole answers' heads, and to none until the grid has seen
/// enough of them. The engine stays in, and its answer comes.
#[tokio::test]
async fn a_long_whole_answer_on_a_grid_of_streams_does_not_eject_its_engine() {
    long_whole_answer_on_a_grid_of_streams(true).await;
}

/// The same with prefix affinity off, where keying reads the model alone: it still tells
/// streams from whole answers.
#[tokio::test]
async fn a_long_whole_answer_on_a_grid_of_streams_does_not_eject_its_engine_without_affinity() {
    long_whole_answer_on_a_grid_of_streams(false).await;
}

/// Warms a one-engine grid with streams, then sends a whole answer whose head comes after
/// the stall mark, with prefix affinity on or off.
async fn long_whole_answer_on_a_grid_of_streams(affinity: bool) {
    // A cluster of its own: ejections are counted process-wide, and other tests here eject
    // east-a.
    let name = if affinity { "whole-a" } else { "whole-off-a" };
    let config = MockEngineConfig {
        prefill_tokens_per_second: 0,
        decode_delay_per_token: Duration::from_millis(600),
        ..MockEngineConfig::named(name)
    };
    let east = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    // A 1 s stall mark: the streams' heads take milliseconds.
    let mut yaml = yaml_of(
        &[("east", name, vec![east.url()])],
        "outlier: { stall_min_secs: 1 }\n",
    );
    if !affinity {
        let on = "prefix_affinity: { exploration: 0.0 }";
        assert!(yaml.contains(on), "{yaml}");
        yaml = yaml.replace(on, "prefix_affinity: { enabled: false }");
    }
    let gateway = gateway(&yaml).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let body = |stream: bool, max_tokens: u32, content: &str| {
        serde_json::json!({"model": MODEL, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]})
        .to_string()
    };
    let mut warm = tokio::task::JoinSet::new();
    for i in 0..MIN_HEAD_SAMPLES {
        let (url, body) = (url.clone(), body(true, 1, &format!("warm {i}")));
        warm.spawn(async move { send(Method::POST, &url, body).await.status });
    }
    while let Some(status) = warm.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    // Four tokens at 600 ms: the head comes after about 2.4 s.
    let whole = tokio::spawn({
        let (url, body) = (url.clone(), body(false, 4, "a whole answer"));
        async move { send(Method::POST, &url, body).await }
    });
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(endpoint_healthy(&gateway, name, &east.url()), Some(true));
    let answer = whole.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let ejections = format!(r#"grid_route_ejections_total{{site="east",cluster="{name}"}}"#);
    assert_eq!(metric(&gateway.admin_url(), &ejections).await, None);
}

#[tokio::test]
async fn a_wedged_engine_costs_at_most_one_request_at_the_defaults() {
    let (east, _west, gateway, url) = two_sites_that_answered().await;
    east.stall(Duration::from_secs(3600), Duration::ZERO);
    east.override_waiting(grid_route_mock_engine::WaitingOverride::Set(0));

    // Clients that give up after 15 s, one request after another: past the 5 s stall mark
    // with room for slow warm-up heads on a loaded machine (the mark is 8× the slowest).
    let patience = Duration::from_secs(15);
    let mut waited_on_the_wedge = 0;
    for i in 0..20 {
        let body = chat(&format!("after the wedge {i}"));
        match try_send_with(
            Method::POST,
            &url,
            &[("content-type", "application/json")],
            body,
            patience,
        )
        .await
        {
            Some(answer) => {
                assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
                assert_eq!(answer.engine(), Some("west-a"));
            }
            None => waited_on_the_wedge += 1,
        }
    }
    assert!(
        waited_on_the_wedge <= 1,
        "{waited_on_the_wedge} of 20 requests waited on the wedged engine"
    );
    let ejections = metric(
        &gateway.admin_url(),
        r#"grid_route_ejections_total{site="east",cluster="east-a"}"#,
    )
    .await;
    assert!(ejections.is_some_and(|n| n >= 1.0), "{ejections:?}");
}

#[tokio::test]
async fn an_engine_that_stalled_comes_back_as_soon_as_it_answers() {
    let (east, _west, gateway, url) = two_sites_that_answered().await;
    // A head that takes 10 s, past the 5 s the grid waits before calling an engine wedged
    // (with room for warm-up heads of up to 1.25 s, whose 8× would raise that mark).
    east.stall(Duration::from_secs(10), Duration::ZERO);
    east.override_waiting(grid_route_mock_engine::WaitingOverride::Set(0));
    let east_took = || {
        east.stats()
            .requests
            .get("POST /v1/chat/completions")
            .copied()
            .unwrap_or(0)
    };
    let before = east_took();
    let mut slow = None;
    let started = Instant::now();
    'requests: for i in 0..40 {
        let url = url.clone();
        let request =
            tokio::spawn(async move { send(Method::POST, &url, chat(&format!("slow {i}"))).await });
        // Each request either reaches east (the slow one, kept) or is answered by west.
        let deadline = Instant::now() + WAIT;
        loop {
            if east_took() > before {
                slow = Some(request);
                break 'requests;
            }
            if request.is_finished() {
                assert_eq!(request.await.unwrap().status, StatusCode::OK);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "request {i} neither reached east nor ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let slow = slow.expect("east never took a request");
    east.stall(Duration::ZERO, Duration::ZERO);
    let deadline = started + Duration::from_secs(10);
    while endpoint_healthy(&gateway, "east-a", &east.url()) != Some(false) {
        assert!(
            Instant::now() < deadline,
            "the stall was never noticed in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let noticed = started.elapsed();
    assert!(
        noticed >= Duration::from_secs(4),
        "ejected after only {noticed:?}"
    );
    let answer = slow.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "the slow request is answered"
    );
    // Its answer ends the ejection well before the 30 s it would last.
    let answered = Instant::now();
    while endpoint_healthy(&gateway, "east-a", &east.url()) != Some(true) {
        assert!(
            answered.elapsed() < Duration::from_secs(5),
            "east still out 5 s after it answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- metrics of removed clusters ----------------------------------------------------

#[tokio::test]
async fn metrics_of_a_removed_cluster_leave_at_the_reload_that_removes_it() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let both = yaml_of(
        &[
            ("east", "east-a", vec![east.url()]),
            ("west", "west-b", vec![west.url()]),
        ],
        "",
    );
    let gateway = gateway(&both).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let page = || async {
        let answer = send(Method::GET, &format!("{}/metrics", gateway.admin_url()), "").await;
        String::from_utf8(answer.body.to_vec()).unwrap()
    };
    eventually("a request on each cluster", || async {
        send(
            Method::POST,
            &url,
            chat(&format!("spread {:?}", Instant::now())),
        )
        .await;
        let text = page().await;
        text.contains(r#"grid_route_decisions_total{site="west",cluster="west-b"}"#)
            && text.contains(r#"grid_route_decisions_total{site="east",cluster="east-a"}"#)
    })
    .await;
    let text = page().await;
    assert!(
        text.contains(r#"grid_route_index_entries{site="west",cluster="west-b"}"#),
        "{text}"
    );

    let east_only = yaml_of(&[("east", "east-a", vec![east.url()])], "");
    gateway
        .reload(&GatewayConfig::from_yaml(&east_only).unwrap())
        .unwrap();
    let text = page().await;
    assert!(!text.contains("west-b"), "{text}");
    assert!(
        text.contains(r#"grid_route_decisions_total{site="east",cluster="east-a"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"grid_route_queue_depth{site="east",cluster="east-a"}"#),
        "{text}"
    );

    gateway
        .reload(&GatewayConfig::from_yaml(&both).unwrap())
        .unwrap();
    let text = page().await;
    assert!(
        text.contains(r#"grid_route_queue_depth{site="west",cluster="west-b"}"#),
        "{text}"
    );
}

#[tokio::test]
async fn only_failures_in_a_row_eject_an_endpoint() {
    let east = engine("east-a").await;
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "outlier: { consecutive_failures: 3, ejection_secs: 60 }\n",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut statuses = Vec::new();
    for (i, failures) in [2, 2, 3].into_iter().enumerate() {
        east.fail_next(StatusCode::INTERNAL_SERVER_ERROR, failures);
        for j in 0..=failures {
            let answer = send(Method::POST, &url, chat(&format!("round {i} {j}"))).await;
            statuses.push(answer.status.as_u16());
        }
        let healthy = endpoint_healthy(&gateway, "east-a", &east.url());
        if failures < 3 {
            assert_eq!(healthy, Some(true), "ejected after {statuses:?}");
        } else {
            assert_eq!(healthy, Some(false), "not ejected after {statuses:?}");
        }
    }
    // Two failures, a success, two failures, a success: in; three in a row: out, so the
    // fourth request of the last round found no admitted cluster.
    assert_eq!(statuses, [500, 500, 200, 500, 500, 200, 500, 500, 500, 503]);
}

#[tokio::test]
async fn a_long_answer_outlives_the_head_deadline() {
    let config = MockEngineConfig {
        decode_delay_per_token: Duration::from_millis(400),
        ..MockEngineConfig::named("east-a")
    };
    let east = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let gateway = gateway(&yaml_of(
        &[("east", "east-a", vec![east.url()])],
        "timeouts: { client_header_secs: 1 }\n",
    ))
    .await;
    let started = Instant::now();
    let url = format!("{}/v1/chat/completions", gateway.url());
    // Seven tokens at 400 ms: the answer takes about three head deadlines.
    let answer = send(
        Method::POST,
        &url,
        stream_chat("one two three four five six"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(
        String::from_utf8_lossy(&answer.body).ends_with("data: [DONE]\n\n"),
        "{:?}",
        answer.body
    );
}
