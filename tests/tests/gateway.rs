//! The example gateway end to end: `Gateway::start` in process, mock engines behind it,
//! real sockets between them, a plain hyper client in front.
//!
//! Each test runs its own engines (one per cluster, named after the cluster, so the
//! `x-mock-engine` header says where a request went) and its own gateway: polls every
//! 20 ms, a 1 s queue window, no exploration. Waits poll a condition with a deadline;
//! none guesses a duration.

// Test code: a failed unwrap is a failed test. Queue depths are small integers read back
// exactly, so they compare exactly.
#![allow(clippy::unwrap_used, clippy::float_cmp)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_example::gateway::Gateway;
use grid_route_example::prometheus;
use grid_route_layer::grid::{SLOT_RECLAIM_HOLD, SLOT_RECLAIM_WINDOW};
use grid_route_mock_engine::{CachedTokens, MockEngine, MockEngineConfig};
use grid_route_tests::{
    Answer, ClusterYaml, Conversation, MODEL, REQUEST_DEADLINE, chat, client, cluster, cluster_id,
    config_yaml, empty_vllm_metrics, engine, engine_requests, engine_serving, eventually,
    measured_gateway, metric, other, parse, read_request, scratch_dir, send, send_with, set_queue,
    text, wait_measured, whole_answer,
};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

// ---- engines and gateways ----------------------------------------------------------

/// The affinity block of most tests: no exploration, the contract's fixed prices.
const FIXED_PRICES: &str = "grid_site_route: { prefix_affinity: { exploration: 0.0, \
    prefill_tokens_per_second: 10000, queued_request_seconds: 2 } }\n";

/// A CPU engine's prefill price (100 tokens a second) with the contract's queued request (2
/// s), and no exploration: a 15-block head saves about 10 s there, five queued requests.
const CPU_PRICES: &str = "grid_site_route: { prefix_affinity: { exploration: 0.0, \
    prefill_tokens_per_second: 100, queued_request_seconds: 2 } }\n";

/// [`config_yaml`], with the contract's fixed prices unless `extra` holds its own
/// `grid_site_route`: these tests weigh a match against queues in the contract's units,
/// and the mock engines answer in microseconds, which would teach a prefill speed that
/// makes any match worth nothing. The learned prices have their own tests.
fn priced_yaml(sites: &[(&str, Vec<ClusterYaml>)], extra: &str) -> String {
    if extra.contains("grid_site_route") {
        config_yaml(sites, extra)
    } else {
        config_yaml(sites, &format!("{extra}{FIXED_PRICES}"))
    }
}

fn queue_depth(gateway: &Gateway, name: &str) -> f64 {
    let view = gateway.grid().view();
    let id = cluster_id(gateway, name);
    view.cluster(&id)
        .unwrap()
        .load()
        .queue_depth(Instant::now())
}

fn entries(gateway: &Gateway, name: &str) -> usize {
    gateway.index().entries(&cluster_id(gateway, name))
}

// ---- the client ---------------------------------------------------------------------

async fn post(gateway: &Gateway, path: &str, body: impl Into<Bytes>) -> Answer {
    let url = format!("{}{path}", gateway.url());
    send(Method::POST, &url, body).await
}

async fn get(url: String) -> Answer {
    send_with(Method::GET, &url, &[], Bytes::new()).await
}

// ---- prompts ------------------------------------------------------------------------

async fn two_sites() -> (MockEngine, MockEngine, Gateway) {
    two_sites_named("east", "west").await
}

/// Two sites, each with one cluster `<site>-a` of one engine named after it.
async fn two_sites_named(east_site: &str, west_site: &str) -> (MockEngine, MockEngine, Gateway) {
    two_sites_with(east_site, west_site, "").await
}

/// [`two_sites_named`], with `extra` top-level YAML (see [`priced_yaml`]).
async fn two_sites_with(
    east_site: &str,
    west_site: &str,
    extra: &str,
) -> (MockEngine, MockEngine, Gateway) {
    let (east_name, west_name) = (format!("{east_site}-a"), format!("{west_site}-a"));
    let east = engine(&east_name).await;
    let west = engine(&west_name).await;
    let yaml = priced_yaml(
        &[
            (east_site, vec![cluster(&east_name, &[&east])]),
            (west_site, vec![cluster(&west_name, &[&west])]),
        ],
        extra,
    );
    let gateway = measured_gateway(&yaml).await;
    (east, west, gateway)
}

/// Gives `home`'s engine (`east` or `west`) `waiting` queued requests and the other's none,
/// waits until the gateway has read both, and returns `home`'s engine.
async fn queue_at<'a>(
    gateway: &Gateway,
    (east, west): (&'a MockEngine, &'a MockEngine),
    home: &str,
    waiting: u64,
) -> &'a MockEngine {
    let (busy, idle) = if home == "east-a" {
        (east, west)
    } else {
        (west, east)
    };
    set_queue(busy, waiting).await;
    set_queue(idle, 0).await;
    eventually("the gateway sees the queues", || async {
        queue_depth(gateway, home) == waiting as f64 && queue_depth(gateway, other(home)) == 0.0
    })
    .await;
    busy
}

// ---- affinity -----------------------------------------------------------------------

#[tokio::test]
async fn conversation_turns_stay_on_their_site() {
    let (_east, _west, gateway) = two_sites().await;
    for topic in ["billing", "travel"] {
        let mut conversation = Conversation::new(topic, 9 * 1024);
        let first = conversation.turn(&gateway.url(), "hello there").await;
        assert_eq!(first.status, StatusCode::OK);
        let home = first.engine_name();
        for question in ["and then?", "why so?", "tell me more", "thanks"] {
            let answer = conversation.turn(&gateway.url(), question).await;
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(answer.engine_name(), home, "{topic}: {question}");
        }
    }
}

#[tokio::test]
async fn distinct_first_turns_spread_over_the_sites() {
    let (_east, _west, gateway) = two_sites().await;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..8 {
        let mut conversation = Conversation::new(&format!("topic-{i}"), 9 * 1024);
        let answer = conversation.turn(&gateway.url(), "hello").await;
        *seen.entry(answer.engine_name()).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.values().all(|&n| n >= 2), "{seen:?}");
}

#[tokio::test]
async fn identical_short_prompts_spread_by_load() {
    let (_east, _west, gateway) = two_sites().await;
    // Three blocks: a match this short never sticks.
    let body = chat(&text("short", 3 * 256 + 10));
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let answer = post(&gateway, "/v1/chat/completions", body.clone()).await;
        assert_eq!(answer.status, StatusCode::OK);
        seen.insert(answer.engine_name());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[tokio::test]
async fn a_deeper_queue_overrides_a_short_match() {
    let (east, west, gateway) = two_sites().await;
    let mut conversation = Conversation::new("gate", 9 * 1024);
    let home = conversation
        .turn(&gateway.url(), "hello")
        .await
        .engine_name();
    // 9 KiB saves about 0.1 of a queued request: 5 waiting outweighs it.
    queue_at(&gateway, (&east, &west), &home, 5).await;
    let answer = conversation.turn(&gateway.url(), "next").await;
    assert_eq!(answer.engine_name(), other(&home));
}

#[tokio::test]
async fn a_long_match_keeps_its_site_one_queued_request_heavier() {
    let (east, west, gateway) = two_sites().await;
    // 110 KiB: about 1.4 queued requests of prefill saved.
    let mut conversation = Conversation::new("long", 110 * 1024);
    let home = conversation
        .turn(&gateway.url(), "hello")
        .await
        .engine_name();
    let busy = queue_at(&gateway, (&east, &west), &home, 1).await;
    assert_eq!(
        conversation
            .turn(&gateway.url(), "next")
            .await
            .engine_name(),
        home
    );
    // Two queued requests are worth more than the match.
    set_queue(busy, 2).await;
    eventually("the gateway sees the deeper queue", || async {
        queue_depth(&gateway, &home) == 2.0
    })
    .await;
    assert_eq!(
        conversation
            .turn(&gateway.url(), "again")
            .await
            .engine_name(),
        other(&home)
    );
}

#[tokio::test]
async fn an_unmeasured_site_gives_way_to_a_measured_one() {
    let (east, west, gateway) = two_sites().await;
    let mut conversation = Conversation::new("blind", 9 * 1024);
    let home = conversation
        .turn(&gateway.url(), "hello")
        .await
        .engine_name();
    let blind = if home == "east-a" { &east } else { &west };
    blind.fail_metrics(true);
    eventually("the site's window empties", || async {
        queue_depth(&gateway, &home).is_infinite()
    })
    .await;
    let answer = conversation.turn(&gateway.url(), "next").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.engine_name(), other(&home));
    // Unmeasured is not unhealthy: the site still admits.
    let view = gateway.grid().view();
    assert!(view.cluster(&cluster_id(&gateway, &home)).unwrap().admits());
}

// ---- the defaults learn: queue gauges, prices -----------------------------------------

/// A stand-in engine that answers every request with `page` as Prometheus text, one
/// request a connection.
async fn metrics_page(page: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The poller's GET has no body: its head is all there is to read.
                let mut head = [0u8; 4096];
                let _ = socket.read(&mut head).await;
                let answer = whole_answer(
                    200,
                    "content-type: text/plain\r\nconnection: close\r\n",
                    page,
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

/// A stand-in llama.cpp engine: `/metrics` answers `metrics`, `/props` answers `props`
/// with `status`, one request a connection. Returns its URL and how many times `/props`
/// was read.
async fn llama_pages(
    metrics: &'static str,
    status: u16,
    props: &'static str,
) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let props_reads = Arc::new(AtomicUsize::new(0));
    let reads = Arc::clone(&props_reads);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let reads = Arc::clone(&reads);
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let n = socket.read(&mut head).await.unwrap_or(0);
                let (status, page) = if head[..n].starts_with(b"GET /props ") {
                    reads.fetch_add(1, Ordering::SeqCst);
                    (status, props)
                } else {
                    (200, metrics)
                };
                let answer = whole_answer(
                    status,
                    "content-type: application/json\r\nconnection: close\r\n",
                    page,
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, props_reads)
}

fn slots(gateway: &Gateway, name: &str) -> Option<usize> {
    let view = gateway.grid().view();
    view.cluster(&cluster_id(gateway, name))
        .unwrap()
        .load()
        .slots()
}

#[tokio::test]
async fn a_llama_cpp_engines_slots_are_read_from_its_props_and_anything_else_has_none() {
    const LLAMA: &str = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n";
    let (two, two_reads) =
        llama_pages(LLAMA, 200, r#"{"total_slots": 2, "model_alias": "m"}"#).await;
    let (missing, missing_reads) = llama_pages(LLAMA, 404, "{}").await;
    let (garbled, _) = llama_pages(LLAMA, 200, r#"{"total_slots": "two"}"#).await;
    let (absurd, _) = llama_pages(LLAMA, 200, r#"{"total_slots": 1000000}"#).await;
    let (sglang, sglang_reads) =
        llama_pages("sglang:num_queue_reqs 0\n", 200, r#"{"total_slots": 2}"#).await;
    let mut yaml = String::from(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nqueue: { poll_interval_ms: 50 }\nsites:\n",
    );
    for (site, url) in [
        ("slots-two", &two),
        ("slots-missing", &missing),
        ("slots-garbled", &garbled),
        ("slots-absurd", &absurd),
        ("slots-sglang", &sglang),
    ] {
        let _ = writeln!(
            yaml,
            "  - {{ name: {site}, clusters: [{{ name: {site}-a, models: [{MODEL}], endpoints: [{url}] }}] }}"
        );
    }
    let gateway = Gateway::start(parse(&yaml)).await.unwrap();
    eventually("the slots read", || async {
        slots(&gateway, "slots-two-a") == Some(2)
            && missing_reads.load(Ordering::SeqCst) >= 1
            && queue_depth(&gateway, "slots-sglang-a") == 0.0
    })
    .await;
    // Read once, not at every poll: 50 ms polls for 300 ms more read /props no more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(two_reads.load(Ordering::SeqCst), 1);
    // A page that could not be read, or did not say, waits SLOTS_REFRESH for the next try.
    assert_eq!(missing_reads.load(Ordering::SeqCst), 1);
    for name in ["slots-missing-a", "slots-garbled-a", "slots-absurd-a"] {
        assert_eq!(slots(&gateway, name), None, "{name}");
        assert_eq!(
            queue_depth(&gateway, name),
            0.0,
            "{name}: its queue is read still"
        );
    }
    // Not a llama.cpp page: its /props is never asked for.
    assert_eq!(slots(&gateway, "slots-sglang-a"), None);
    assert_eq!(sglang_reads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn with_no_queue_block_each_endpoint_is_read_by_the_gauge_it_serves() {
    let sglang =
        metrics_page("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{dp=\"0\"} 3\n")
            .await;
    let llama = metrics_page(
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 4\nllamacpp:n_busy_slots_per_decode 1\n",
    )
    .await;
    let other = metrics_page("process_cpu_seconds_total 9\n").await;
    let vllm = engine("gauge-vllm-a").await;
    set_queue(&vllm, 5).await;
    let mut yaml = String::from("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nsites:\n");
    for (site, url) in [
        ("gauge-sglang", sglang),
        ("gauge-llama", llama),
        ("gauge-other", other),
        ("gauge-vllm", vllm.url()),
    ] {
        let _ = writeln!(
            yaml,
            "  - {{ name: {site}, clusters: [{{ name: {site}-a, models: [{MODEL}], endpoints: [{url}] }}] }}"
        );
    }
    let gateway = Gateway::start(parse(&yaml)).await.unwrap();
    eventually("every gauge read", || async {
        queue_depth(&gateway, "gauge-sglang-a") == 3.0
            && queue_depth(&gateway, "gauge-llama-a") == 4.0
            && queue_depth(&gateway, "gauge-vllm-a") == 5.0
    })
    .await;
    // A page with none of the known gauges is unmeasured, and still admits.
    assert!(queue_depth(&gateway, "gauge-other-a").is_infinite());
    let view = gateway.grid().view();
    assert!(
        view.cluster(&cluster_id(&gateway, "gauge-other-a"))
            .unwrap()
            .admits()
    );
    // A configured metric still wins: vLLM's name reads nothing at the llama.cpp page.
    let named = yaml.replace(
        "sites:\n",
        "queue: { metric: \"vllm:num_requests_waiting\" }\nsites:\n",
    );
    let gateway = Gateway::start(parse(&named)).await.unwrap();
    eventually("the vLLM engine read by name", || async {
        queue_depth(&gateway, "gauge-vllm-a") == 5.0
    })
    .await;
    assert!(queue_depth(&gateway, "gauge-llama-a").is_infinite());
    assert!(queue_depth(&gateway, "gauge-sglang-a").is_infinite());
}

/// A gateway at the default (learned) prices in front of one engine, cluster `name` of
/// site `site`, that prefills 100,000 tokens a second: a 40 KiB prompt (10,000 tokens by
/// the gateway's 4 bytes a token) takes 0.1 s. Its output tokens take `decode` each.
async fn one_learning_cluster(
    site: &str,
    name: &str,
    decode: Duration,
) -> (MockEngine, String, Gateway) {
    let config = MockEngineConfig {
        models: vec![MODEL.to_owned()],
        prefill_tokens_per_second: 100_000,
        decode_delay_per_token: decode,
        ..MockEngineConfig::named(name)
    };
    let engine = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let yaml = priced_yaml(
        &[(site, vec![cluster(name, &[&engine])])],
        "grid_site_route: { prefix_affinity: { exploration: 0.0 } }\n",
    );
    let gateway = measured_gateway(&yaml).await;
    (engine, yaml, gateway)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_defaults_each_cluster_learns_its_prices_from_its_answers_and_exports_them() {
    let (_engine, yaml, gateway) = one_learning_cluster(
        "learner",
        "learner-a",
        MockEngineConfig::default().decode_delay_per_token,
    )
    .await;
    let prefill = "grid_route_prefill_tokens_per_second{site=\"learner\",cluster=\"learner-a\"}";
    let queued = "grid_route_queued_request_seconds{site=\"learner\",cluster=\"learner-a\"}";
    let url = format!("{}/v1/chat/completions", gateway.url());
    // A JSON answer's head comes once it is whole: its time teaches nothing.
    let json_answer = send(Method::POST, &url, chat(&text("whole", 40 * 1024))).await;
    assert_eq!(json_answer.status, StatusCode::OK);
    assert_eq!(
        metric(&gateway.admin_url(), prefill).await,
        None,
        "nothing learned"
    );
    // Streams, each a new prompt: one at a time (load 0), then four at once (loads 0 to 3).
    let streamed = |topic: String| {
        serde_json::to_vec(&json!({
            "model": MODEL, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": text(&topic, 40 * 1024)}],
        }))
        .unwrap()
    };
    for i in 0..6 {
        let answer = send(Method::POST, &url, streamed(format!("learn{i}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..4 {
        let (url, body) = (url.clone(), streamed(format!("burst{i}")));
        sent.spawn(async move { send(Method::POST, &url, body).await });
    }
    while let Some(answer) = sent.join_next().await {
        assert_eq!(answer.unwrap().status, StatusCode::OK);
    }
    let rate = metric(&gateway.admin_url(), prefill)
        .await
        .expect("a learned prefill speed");
    // The engine's speed, less what the network and the mock's own work add.
    assert!((30_000.0..=150_000.0).contains(&rate), "{rate}");
    let seconds = metric(&gateway.admin_url(), queued)
        .await
        .expect("a learned queued price");
    // The mock engine runs the four side by side: more load cost them far less than the
    // prior's 2 s a request.
    assert!(seconds < 1.0, "{seconds}");
    // The same as the decision reads.
    let id = cluster_id(&gateway, "learner-a");
    assert_eq!(gateway.affinity().prefill_rate(&id), rate);
    assert_eq!(gateway.affinity().queued_request_seconds(&id), seconds);
    // A reload that removes the cluster forgets what it learned, as it drops the
    // cluster's index entries; added back, it starts from the priors, and so do its
    // gauges.
    gateway
        .reload(&parse(&yaml.replace("learner-a", "learner-b")))
        .unwrap();
    gateway.reload(&parse(&yaml)).unwrap();
    assert_eq!(gateway.affinity().prefill_rate(&id), 10_000.0);
    assert_eq!(gateway.affinity().queued_request_seconds(&id), 2.0);
    assert_eq!(metric(&gateway.admin_url(), prefill).await, Some(10_000.0));
    assert_eq!(metric(&gateway.admin_url(), queued).await, Some(2.0));
}

/// A Responses stream opens with `response.created` and `response.in_progress` before the
/// engine prefills: its time to first token is taken at its first output, so it teaches
/// the engine's prefill speed as a Chat stream does, not one many times faster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_streams_teach_the_prefill_speed_from_their_first_output() {
    let (_engine, _yaml, gateway) = one_learning_cluster(
        "opener",
        "opener-a",
        MockEngineConfig::default().decode_delay_per_token,
    )
    .await;
    let rate = speed_learned_from_responses_streams(&gateway, "opener-a", 40 * 1024).await;
    // The engine's 100,000 tokens a second, less what the network and the mock add.
    assert!((30_000.0..=150_000.0).contains(&rate), "{rate}");
}

/// Sends `gateway` ten streamed Responses requests of `prompt_bytes` each, all answered by
/// `cluster`, and returns the prefill speed the cluster learned from them.
async fn speed_learned_from_responses_streams(
    gateway: &Gateway,
    cluster: &str,
    prompt_bytes: usize,
) -> f64 {
    let url = format!("{}/v1/responses", gateway.url());
    for i in 0..10 {
        let body = serde_json::to_vec(&json!({
            "model": MODEL, "stream": true, "input": text(&format!("{cluster} {i}"), prompt_bytes),
        }))
        .unwrap();
        let answer = send(Method::POST, &url, body).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(answer.text().starts_with("event: response.created"));
    }
    let id = cluster_id(gateway, cluster);
    eventually("a learned prefill speed", || async {
        gateway.affinity().prefill_rate(&id) != 10_000.0
    })
    .await;
    gateway.affinity().prefill_rate(&id)
}

/// An engine on a raw socket that streams Responses answers as a real one may reach the
/// gateway: its `response.created` event echoes long instructions and comes in two
/// pieces, 20 ms apart, and its first output only after `prefill`. Every answer counts
/// 20,000 prompt tokens, none cached. It answers `/metrics` with an empty vLLM queue.
async fn engine_splitting_its_opening_event(prefill: Duration) -> String {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut read = Vec::new();
                while let Some(head) = read_request(&mut socket, &mut read).await {
                    if head.starts_with("get ") {
                        let answer = empty_vllm_metrics(false);
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let instructions = "Answer briefly. ".repeat(2_000);
                    let created = format!(
                        "event: response.created\ndata: {{\"type\":\"response.created\",\
                         \"response\":{{\"instructions\":\"{instructions}\"}}}}\n\n"
                    );
                    let (first, rest) = created.split_at(created.len() / 2);
                    let output = "event: response.output_text.delta\ndata: \
                        {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n\
                        event: response.completed\ndata: {\"type\":\"response.completed\",\
                        \"response\":{\"usage\":{\"input_tokens\":20000,\
                        \"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":1}}}\n\n";
                    let pieces = [
                        (
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                 transfer-encoding: chunked\r\n\r\n{}",
                                chunk(first)
                            ),
                            Duration::from_millis(20),
                        ),
                        (chunk(rest), prefill),
                        (format!("{}0\r\n\r\n", chunk(output)), Duration::ZERO),
                    ];
                    for (piece, then) in pieces {
                        if socket.write_all(piece.as_bytes()).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(then).await;
                    }
                }
            });
        }
    });
    url
}

/// The same with the opening event cut in two, as a long one reaches the gateway: the
/// second piece is not taken for the first output, so the learned speed is the engine's
/// (20,000 tokens in 300 ms), not one of the 20 ms between the pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_whose_opening_event_is_split_teaches_the_engines_speed() {
    let engine = engine_splitting_its_opening_event(Duration::from_millis(300)).await;
    let yaml = priced_yaml(
        &[(
            "splitter",
            vec![cluster("splitter-a", &[]).at(vec![engine])],
        )],
        "grid_site_route: { prefix_affinity: { exploration: 0.0 } }\n",
    );
    let gateway = measured_gateway(&yaml).await;
    let rate = speed_learned_from_responses_streams(&gateway, "splitter-a", 4 * 1024).await;
    // 20,000 tokens in 300 ms is 67,000 a second; taken at the second piece, 1,000,000.
    assert!((30_000.0..=80_000.0).contains(&rate), "{rate}");
}

/// vLLM and SGLang at their defaults count no cached tokens in their usage, so an answer
/// does not say how much of its prompt was prefilled: a cluster of such engines learns no
/// prices (its gauges stay unset, the priors in force). vLLM with
/// `--enable-prompt-tokens-details` leaves only a count of 0 out: once its engine has
/// counted, its answers teach as any engine's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_that_never_count_cached_tokens_teach_no_prices() {
    for (cached_tokens, teaches) in [
        (CachedTokens::Never, false),
        (CachedTokens::UnlessNone, true),
    ] {
        let name = format!("{}-a", if teaches { "counts" } else { "silent" });
        let config = MockEngineConfig {
            models: vec![MODEL.to_owned()],
            prefill_tokens_per_second: 100_000,
            cached_tokens,
            ..MockEngineConfig::named(&name)
        };
        let engine = MockEngine::start("127.0.0.1:0", config).await.unwrap();
        let site = &name[..name.len() - 2];
        let yaml = priced_yaml(
            &[(site, vec![cluster(&name, &[&engine])])],
            "grid_site_route: { prefix_affinity: { exploration: 0.0 } }\n",
        );
        let gateway = measured_gateway(&yaml).await;
        let prefill =
            format!("grid_route_prefill_tokens_per_second{{site=\"{site}\",cluster=\"{name}\"}}");
        let url = format!("{}/v1/chat/completions", gateway.url());
        let streamed = |topic: &str| {
            serde_json::to_vec(&json!({
                "model": MODEL, "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": text(topic, 40 * 1024)}],
            }))
            .unwrap()
        };
        // A prompt twice (the second served from cache: a count even from UnlessNone),
        // then new prompts, none of them cached.
        for topic in [
            "again", "again", "new0", "new1", "new2", "new3", "new4", "new5",
        ] {
            let answer = send(Method::POST, &url, streamed(topic)).await;
            assert_eq!(answer.status, StatusCode::OK);
        }
        let id = cluster_id(&gateway, &name);
        if teaches {
            eventually("a learned prefill speed", || async {
                metric(&gateway.admin_url(), &prefill).await.is_some()
            })
            .await;
            let rate = gateway.affinity().prefill_rate(&id);
            assert!((30_000.0..=150_000.0).contains(&rate), "{rate}");
        } else {
            // Usage is counted when the gateway drops the answer's body, just after the
            // client read its end: give a (wrong) lesson the time to land.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(metric(&gateway.admin_url(), &prefill).await, None);
            assert_eq!(gateway.affinity().prefill_rate(&id), 10_000.0);
            assert_eq!(gateway.affinity().queued_request_seconds(&id), 2.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_ends_after_a_reload_removed_its_cluster_teaches_nothing() {
    // 40 output tokens at 50 ms each: two seconds of stream in which to remove the cluster.
    let (engine, yaml, gateway) =
        one_learning_cluster("leaver", "leaver-a", Duration::from_millis(50)).await;
    let id = cluster_id(&gateway, "leaver-a");
    let body = serde_json::to_vec(&json!({
        "model": MODEL, "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 40,
        "messages": [{"role": "user", "content": text("leaving", 40 * 1024)}],
    }))
    .unwrap();
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = tokio::spawn(async move { send(Method::POST, &url, body).await });
    eventually("the stream running at the engine", || async {
        engine.stats().running == 1
    })
    .await;
    gateway
        .reload(&parse(&yaml.replace("leaver-a", "leaver-b")))
        .unwrap();
    // Removed while its answer still streams (else this test would prove nothing).
    assert_eq!(
        engine.stats().running,
        1,
        "the stream ended before the reload"
    );
    // The gateway learns as it drops the answer's body, before the client reads its end.
    let answer = answer.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        answer.text().contains("\"prompt_tokens\""),
        "a usage to learn from"
    );
    // Its prefill (10,000 tokens in about 0.1 s) would teach a speed near 100,000 tokens a
    // second; the cluster was gone, so nothing was kept for it, as its index entries were
    // not written back. Added again, it starts from the priors.
    gateway.reload(&parse(&yaml)).unwrap();
    assert_eq!(gateway.affinity().prefill_rate(&id), 10_000.0);
    assert_eq!(gateway.affinity().queued_request_seconds(&id), 2.0);
    let prefill = "grid_route_prefill_tokens_per_second{site=\"leaver\",cluster=\"leaver-a\"}";
    assert_eq!(metric(&gateway.admin_url(), prefill).await, Some(10_000.0));
}

// ---- new conversations on engines with slots ----------------------------------------

/// A stand-in llama.cpp engine with two slots, named `name`: `/metrics` reads no request
/// waiting, `/props` says two slots, and every other request gets a chat completion with
/// `x-mock-engine: name`, `x-mock-arrival: n` (the n-th such request to reach it, from 1)
/// and `x-mock-at-us` (the microseconds from the engine's start to the request's head),
/// once `release` turns `true` when it carries `x-hold`. One that carries `x-stream`
/// gets it as an event stream whose head comes at once, before the hold, and with
/// `x-first-token` its first token too.
async fn two_slot_engine(
    name: &'static str,
    release: tokio::sync::watch::Receiver<bool>,
) -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let arrivals = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut release = release.clone();
            let arrivals = Arc::clone(&arrivals);
            tokio::spawn(async move {
                let mut read = Vec::new();
                while let Some(head) = read_request(&mut socket, &mut read).await {
                    let at = started.elapsed().as_micros();
                    let polled =
                        head.starts_with("get /metrics ") || head.starts_with("get /props ");
                    let arrival = if polled {
                        0
                    } else {
                        arrivals.fetch_add(1, Ordering::SeqCst) + 1
                    };
                    let (kind, body) = if head.starts_with("get /metrics ") {
                        ("text/plain", "llamacpp:requests_deferred 0\n".to_owned())
                    } else if head.starts_with("get /props ") {
                        ("application/json", r#"{"total_slots": 2}"#.to_owned())
                    } else if head.contains("\r\nx-stream:") {
                        // As llama.cpp streams: the head at once, the first token once the
                        // prompt is prefilled (here: once released, when held).
                        let answer_head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                             x-mock-engine: {name}\r\nx-mock-arrival: {arrival}\r\n\
                             x-mock-at-us: {at}\r\ntransfer-encoding: chunked\r\n\r\n"
                        );
                        if socket.write_all(answer_head.as_bytes()).await.is_err() {
                            return;
                        }
                        let chunk = json!({
                            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL,
                            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}],
                        });
                        // With `x-first-token`, the first token comes before the hold: the
                        // answer is streaming while held.
                        if head.contains("\r\nx-first-token:") {
                            let first = format!("data: {chunk}\n\n");
                            let first = format!("{:x}\r\n{first}\r\n", first.len());
                            if socket.write_all(first.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        if head.contains("\r\nx-hold:") {
                            let _ = release.wait_for(|released| *released).await;
                        }
                        let events = format!("data: {chunk}\n\ndata: [DONE]\n\n");
                        let body = format!("{:x}\r\n{events}\r\n0\r\n\r\n", events.len());
                        if socket.write_all(body.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    } else {
                        if head.contains("\r\nx-hold:") {
                            let _ = release.wait_for(|released| *released).await;
                        }
                        // The cached tokens the request's `x-cached-tokens` asks for, as
                        // llama.cpp reports them; none without it.
                        let cached = head
                            .lines()
                            .find_map(|line| line.strip_prefix("x-cached-tokens:"))
                            .map(|value| value.trim().parse::<u64>().unwrap());
                        let usage = match cached {
                            Some(cached) => json!({"prompt_tokens": 4000, "completion_tokens": 1,
                                "total_tokens": 4001,
                                "prompt_tokens_details": {"cached_tokens": cached}}),
                            None => json!({"prompt_tokens": 10, "completion_tokens": 1,
                                "total_tokens": 11}),
                        };
                        let answer = json!({
                            "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": "ok"}}],
                            "usage": usage,
                        });
                        ("application/json", answer.to_string())
                    };
                    let headers = format!(
                        "content-type: {kind}\r\nx-mock-engine: {name}\r\nx-mock-arrival: {arrival}\r\n\
                         x-mock-at-us: {at}\r\n"
                    );
                    let answer = whole_answer(200, &headers, &body);
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A gateway, exploration off, over one [`two_slot_engine`] a site: each `(site, cluster)`
/// is a site with one cluster of that name, whose engine answers as the cluster's name.
/// Returned once every engine's slots and queue are read; `released` lets held requests go.
async fn two_slot_gateway(
    sites: &[(&'static str, &'static str)],
    released: &tokio::sync::watch::Receiver<bool>,
) -> Arc<Gateway> {
    two_slot_gateway_with(
        sites,
        released,
        "grid_site_route: { prefix_affinity: { exploration: 0.0 } }\n",
    )
    .await
}

/// [`two_slot_gateway`] with `grid_site_route` as given.
async fn two_slot_gateway_with(
    sites: &[(&'static str, &'static str)],
    released: &tokio::sync::watch::Receiver<bool>,
    grid_site_route: &str,
) -> Arc<Gateway> {
    let sites: Vec<_> = sites
        .iter()
        .map(|&(site, cluster)| (site, cluster, released.clone()))
        .collect();
    two_slot_gateway_releasing(&sites, grid_site_route).await
}

/// [`two_slot_gateway_with`], each engine's held requests let go by a receiver of its own.
async fn two_slot_gateway_releasing(
    sites: &[(
        &'static str,
        &'static str,
        tokio::sync::watch::Receiver<bool>,
    )],
    grid_site_route: &str,
) -> Arc<Gateway> {
    let mut yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nqueue: {{ poll_interval_ms: 50 }}\n\
         {grid_site_route}sites:\n"
    );
    for (site, cluster, released) in sites {
        let url = two_slot_engine(cluster, released.clone()).await;
        let _ = writeln!(
            yaml,
            "  - {{ name: {site}, clusters: [{{ name: {cluster}, models: [{MODEL}], endpoints: [{url}] }}] }}"
        );
    }
    let gateway = Arc::new(Gateway::start(parse(&yaml)).await.unwrap());
    eventually("every engine's slots and queue read", || async {
        sites.iter().all(|&(_, cluster, _)| {
            slots(&gateway, cluster) == Some(2) && queue_depth(&gateway, cluster) == 0.0
        })
    })
    .await;
    gateway
}

/// A gateway over two [`two_slot_engine`]s, `east` and `west` (`(site, cluster)` each),
/// with [`CPU_PRICES`]; each engine's held requests go when its sender says `true`.
async fn two_slot_pair(
    east: (&'static str, &'static str),
    west: (&'static str, &'static str),
) -> (
    Arc<Gateway>,
    tokio::sync::watch::Sender<bool>,
    tokio::sync::watch::Sender<bool>,
) {
    let (release_east, east_released) = tokio::sync::watch::channel(false);
    let (release_west, west_released) = tokio::sync::watch::channel(false);
    let sites = [
        (east.0, east.1, east_released),
        (west.0, west.1, west_released),
    ];
    let gateway = two_slot_gateway_releasing(&sites, CPU_PRICES).await;
    (gateway, release_east, release_west)
}

/// A chat completion of `messages` sent to `url`, held at its [`two_slot_engine`] until
/// released when `hold`.
async fn chat_completion(url: &str, messages: Value, hold: bool) -> Answer {
    let mut headers = vec![("content-type", "application/json")];
    if hold {
        headers.push(("x-hold", "1"));
    }
    let body = json!({"model": MODEL, "messages": messages}).to_string();
    send_with(Method::POST, url, &headers, body).await
}

/// A new conversation's first turn: a system prompt of its own, `blocks` keying blocks
/// long, and a greeting.
fn new_conversation(topic: &str, blocks: usize) -> String {
    json!({"model": MODEL, "messages": [
        {"role": "system", "content": text(topic, blocks * 256)},
        {"role": "user", "content": "hi"},
    ]})
    .to_string()
}

/// The requests `gateway` has in flight at the cluster named `name`.
fn in_flight_at(gateway: &Gateway, name: &str) -> usize {
    let view = gateway.grid().view();
    view.cluster(&cluster_id(gateway, name))
        .unwrap()
        .load()
        .in_flight()
}

/// A [`new_conversation`] to `url`, answered at once: the engine that served it.
async fn answered_new_conversation(url: &str, topic: &str, blocks: usize) -> String {
    send(Method::POST, url, new_conversation(topic, blocks))
        .await
        .engine_name()
}

/// A streamed chat completion of `messages` sent to `url`, whose answer sends its first
/// token at once and then is held at its [`two_slot_engine`] until released (the answer
/// streaming while held); the task answers with the engine that served it.
fn held_stream(url: &str, messages: Value) -> tokio::task::JoinHandle<String> {
    let url = url.to_owned();
    tokio::spawn(async move {
        let headers = [
            ("content-type", "application/json"),
            ("x-hold", "1"),
            ("x-stream", "1"),
            ("x-first-token", "1"),
        ];
        let body = json!({"model": MODEL, "messages": messages, "stream": true}).to_string();
        send_with(Method::POST, &url, &headers, body)
            .await
            .engine_name()
    })
}

/// Two [`held_new_conversation`]s, once both run at the cluster named `name`, where the
/// index holds least (the caller's setup puts them there): its slots busy until released.
async fn two_held_at(
    gateway: &Gateway,
    url: &str,
    name: &str,
) -> [tokio::task::JoinHandle<String>; 2] {
    let held = [
        held_new_conversation(url, "one", 8),
        held_new_conversation(url, "two", 8),
    ];
    eventually("two held requests run there", || async {
        in_flight_at(gateway, name) == 2
    })
    .await;
    held
}

/// Which request to reach its [`two_slot_engine`] `answer` answered (from 1).
fn arrival(answer: &Answer) -> usize {
    answer.headers["x-mock-arrival"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The `n`-th turn of a conversation behind `system`: its greeting, then a question after
/// each answer before.
fn nth_turn(system: &str, n: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "hi"}),
    ];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        messages.push(json!({"role": "user", "content": format!("question {i}")}));
    }
    Value::Array(messages)
}

/// A [`new_conversation`] to `url`, held at its [`two_slot_engine`] until released; the
/// task answers with the engine that served it.
fn held_new_conversation(url: &str, topic: &str, blocks: usize) -> tokio::task::JoinHandle<String> {
    let body = new_conversation(topic, blocks);
    let url = url.to_owned();
    tokio::spawn(async move {
        send_with(
            Method::POST,
            &url,
            &[("content-type", "application/json"), ("x-hold", "1")],
            body,
        )
        .await
        .engine_name()
    })
}

#[tokio::test]
async fn on_slot_engines_a_new_conversation_takes_a_free_slot_where_the_index_holds_least() {
    let (release, released) = tokio::sync::watch::channel(false);
    let gateway = two_slot_gateway(
        &[
            ("room-east", "room-east-a"),
            ("room-west", "room-west-a"),
            ("room-north", "room-north-a"),
        ],
        &released,
    )
    .await;
    let in_flight = |name: &str| in_flight_at(&gateway, name);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let place = |topic: &'static str, blocks: usize| answered_new_conversation(&url, topic, blocks);
    // Nothing held anywhere yet: the first; then wherever the index holds least.
    assert_eq!(place("first", 40).await, "room-east-a");
    assert_eq!(place("second", 36).await, "room-west-a");
    assert_eq!(place("third", 30).await, "room-north-a");
    // The second conversation grows where it sticks (36 blocks held): west-a's cache
    // fills, though no new conversation went there.
    let grown = json!({"model": MODEL, "messages": [
        {"role": "system", "content": text("second", 36 * 256)},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": text("a long question", 40 * 256)},
    ]})
    .to_string();
    assert_eq!(
        send(Method::POST, &url, grown).await.engine_name(),
        "room-west-a"
    );
    // A request held at north-a (holding least, 30 blocks) fills one of its two slots.
    let hold = |topic: &'static str| held_new_conversation(&url, topic, 8);
    let first_held = hold("held");
    eventually("north-a runs the held request", || async {
        in_flight("room-north-a") == 1
    })
    .await;
    // Busier than the two idle ones, north-a still has a free slot and holds least: the
    // next new conversation goes there. By load first it would go to an idle one; by the
    // new prompt sent lately, to west-a (36 blocks to 38).
    assert_eq!(place("fourth", 4).await, "room-north-a");
    let second_held = hold("held again");
    eventually("north-a's two slots busy", || async {
        in_flight("room-north-a") == 2
    })
    .await;
    // No slot free there: the free one holding least, east-a (40 blocks to west-a's 76;
    // west-a was sent less new prompt).
    assert_eq!(place("fifth", 4).await, "room-east-a");
    release.send(true).unwrap();
    for held in [first_held, second_held] {
        assert_eq!(held.await.unwrap(), "room-north-a");
    }
}

#[tokio::test]
async fn on_slot_engines_a_new_conversation_behind_a_shared_head_takes_the_roomier_free_slot() {
    let (_release, released) = tokio::sync::watch::channel(false);
    let gateway = two_slot_gateway(
        &[("head-east", "head-east-a"), ("head-west", "head-west-a")],
        &released,
    )
    .await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let place = |system: &str, question: &str| {
        let body = json!({"model": MODEL, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]})
        .to_string();
        let url = url.clone();
        async move { send(Method::POST, &url, body).await.engine_name() }
    };
    // A house system prompt of 20 blocks: the first conversation behind it goes to the
    // first engine (nothing held anywhere), and a stranger to the other, which holds less.
    let house = text("house", 20 * 256);
    assert_eq!(place(&house, "hi").await, "head-east-a");
    assert_eq!(place(&text("stranger", 4 * 256), "hi").await, "head-west-a");
    // A second conversation behind the house prompt, with a question of 10 blocks: east-a
    // holds 20 of its 30 blocks, too little to stick (under 32 blocks and under 80%). Its
    // idle slot there holds the first conversation, which llama.cpp would hand the
    // newcomer for the longest common prefix: it takes west-a's free slot, where the
    // index holds less, instead.
    let question = text("a long question", 10 * 256);
    assert_eq!(place(&house, &question).await, "head-west-a");
}

/// Where a new conversation behind a short house system prompt goes, on two two-slot
/// engines, when its holder east-a is a request busier with a slot free: after one earlier
/// first turn there found the head cached (`found`), or found none of it.
async fn newcomer_beside_a_busier_holder(prefix: &'static str, found: bool) -> String {
    let (east, west) = if found {
        (("kept-east", "kept-east-a"), ("kept-west", "kept-west-a"))
    } else {
        (("lost-east", "lost-east-a"), ("lost-west", "lost-west-a"))
    };
    let (release, released) = tokio::sync::watch::channel(false);
    // At a CPU engine's prefill speed: the head saves 12.8 s there, worth more than the
    // one request's load, so the load gate alone would let the newcomer stick.
    let gateway = two_slot_gateway_with(&[east, west], &released, CPU_PRICES).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    // A 20-block system prompt (1,280 tokens at 4 bytes a token): a greeting behind it
    // sticks by covering 80% of the prompt, under 32 blocks.
    let house = text(prefix, 20 * 256);
    let first_turn = |question: &str, cached: &'static str, hold: bool| {
        let body = json!({"model": MODEL, "messages": [
            {"role": "system", "content": house},
            {"role": "user", "content": question},
        ]})
        .to_string();
        let url = url.clone();
        async move {
            let mut headers = vec![
                ("content-type", "application/json"),
                ("x-cached-tokens", cached),
            ];
            if hold {
                headers.push(("x-hold", "1"));
            }
            send_with(Method::POST, &url, &headers, body)
                .await
                .engine_name()
        }
    };
    // The first conversation behind it: nothing held anywhere, the first engine.
    assert_eq!(first_turn("hi", "0", false).await, east.1);
    // The second: both engines idle, so it sticks to east-a for the head, and east-a's
    // answer says whether the head was still cached. Sent once the first answer ended
    // longer ago than the window: with nothing learned, a newcomer passes over a holder
    // whose slot just went idle (the test of slots that just went idle, below).
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    let cached = if found { "1280" } else { "0" };
    assert_eq!(first_turn("hello", cached, false).await, east.1);
    let east_id = cluster_id(&gateway, east.1);
    eventually("the answer counted", || async {
        scraped_gauge(
            &gateway,
            &format!(
                r#"grid_route_shared_head_found_share{{site="{}",cluster="{}"}}"#,
                east.0, east.1
            ),
        )
        .await
            == Some(if found { 1.0 } else { 0.0 })
    })
    .await;
    assert_eq!(gateway.affinity().keeps_shared_heads(&east_id), found);
    // A third, held at east-a (idle again, so it sticks there): east-a is a request
    // busier, with one slot free. Sent once east-a's answers ended longer ago than the
    // window, as above.
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    let held = tokio::spawn(first_turn("held", "1280", true));
    eventually("east-a runs the held request", || async {
        in_flight_at(&gateway, east.1) == 1
    })
    .await;
    let newcomer = first_turn("a newcomer", "1280", false).await;
    // Answered, the newcomer counts nowhere: a join counted in flight at its decision is
    // taken over by the balancer, not counted twice or left behind.
    eventually("the newcomer counts nowhere once answered", || async {
        (
            in_flight_at(&gateway, east.1),
            in_flight_at(&gateway, west.1),
        ) == (1, 0)
    })
    .await;
    // A join is counted where it was sent; a first turn that went by load is not.
    let joins = |at| cluster_metric(&gateway, "grid_route_shared_head_joins_total", at);
    assert_eq!(joins(east).await, found.then_some(1.0));
    assert_eq!(joins(west).await, None);
    release.send(true).unwrap();
    assert_eq!(held.await.unwrap(), east.1);
    newcomer
}

#[tokio::test]
async fn on_slot_engines_that_kept_a_shared_head_a_new_conversation_joins_its_busier_holder() {
    // East-a's engine kept the head while it served others (llama.cpp's host prompt
    // cache): the newcomer takes its free slot and finds the head there.
    assert_eq!(
        newcomer_beside_a_busier_holder("kept house", true).await,
        "kept-east-a"
    );
    // Its engine had lost the head: the newcomer is not crowded in beside the
    // conversation there, and goes by load.
    assert_eq!(
        newcomer_beside_a_busier_holder("lost house", false).await,
        "lost-west-a"
    );
}

#[tokio::test]
async fn on_slot_engines_a_new_request_leaves_a_slot_that_just_went_idle() {
    let (east, west) = (
        ("freed-east", "freed-east-a"),
        ("freed-west", "freed-west-a"),
    );
    let (gateway, release_east, release_west) = two_slot_pair(east, west).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let chat = |messages: Value, hold: bool| {
        let url = url.clone();
        async move { chat_completion(&url, messages, hold).await.engine_name() }
    };
    // A conversation behind a 40-block system prompt of its own: nothing is held
    // anywhere, the first engine.
    let long = text("a long system prompt", 40 * 256);
    let opening = json!([{"role": "system", "content": long}, {"role": "user", "content": "hi"}]);
    assert_eq!(chat(opening, false).await, east.1);
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    // A first turn behind a 20-block house prompt goes where the index holds less (west).
    let house = text("a house prompt", 20 * 256);
    let house_turn = |question: &str| json!([{"role": "system", "content": house}, {"role": "user", "content": question}]);
    assert_eq!(chat(house_turn("hi"), false).await, west.1);
    // Its answer ended a moment ago at west, the head's only holder, and nothing says
    // west's engine would keep that conversation's prompt if another took its slot (a host
    // cache): a second first turn behind the head, which would take that slot for the
    // longest common prefix, goes to east's free slot, placed as a prompt matching nothing.
    assert_eq!(chat(house_turn("hello"), false).await, east.1);
    assert!(
        !gateway
            .affinity()
            .keeps_shared_heads(&cluster_id(&gateway, west.1))
    );
    // Both of east's slots busy with later turns of the long conversation, one of west's
    // with the first house conversation's next turn, all held.
    let later_turn = |system: &str, question: &'static str| {
        let turn = json!([
            {"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": question},
        ]);
        tokio::spawn(chat(turn, true))
    };
    let at_east = [
        later_turn(&long, "and then?"),
        later_turn(&long, "and else?"),
    ];
    let at_west = later_turn(&house, "and then?");
    eventually("east runs two requests, west one", || async {
        (
            in_flight_at(&gateway, east.1),
            in_flight_at(&gateway, west.1),
        ) == (2, 1)
    })
    .await;
    // Every answer so far ended longer ago than the window.
    tokio::time::sleep(SLOT_RECLAIM_WINDOW + Duration::from_millis(100)).await;
    release_east.send(true).unwrap();
    for turn in at_east {
        assert_eq!(turn.await.unwrap(), east.1);
    }
    eventually("east's slots idle", || async {
        in_flight_at(&gateway, east.1) == 0
    })
    .await;
    // East is the less loaded, but its slots just went idle and the long conversation may
    // be back at once: a prompt too short to key, which goes by load, takes west's free
    // slot instead.
    let short = || json!([{"role": "user", "content": "hi"}]);
    assert_eq!(chat(short(), false).await, west.1);
    // Each cluster passed over is counted: west once, for the first turn behind its
    // head, east once, for the short prompt.
    let passed = |at| cluster_metric(&gateway, "grid_route_slot_passed_over_total", at);
    assert_eq!(passed(west).await, Some(1.0));
    assert_eq!(passed(east).await, Some(1.0));
    // Once the window has passed, load decides again.
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    assert_eq!(chat(short(), false).await, east.1);
    release_west.send(true).unwrap();
    assert_eq!(at_west.await.unwrap(), west.1);
}

#[tokio::test]
async fn on_slot_engines_a_later_turn_moved_off_its_cluster_never_takes_the_one_slot_that_just_went_idle()
 {
    let (east, west) = (
        ("moved-east", "moved-east-a"),
        ("moved-west", "moved-west-a"),
    );
    let (gateway, release_east, release_west) = two_slot_pair(east, west).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let chat = |messages: Value, hold: bool| {
        let url = url.clone();
        async move { chat_completion(&url, messages, hold).await.engine_name() }
    };
    // A conversation opened with a question too short to key, on idle engines: the
    // first. Its next turn's thread names east.
    assert_eq!(
        chat(json!([{"role": "user", "content": "hi"}]), false).await,
        east.1
    );
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    // Two conversations behind 40-block system prompts of their own, each placed where the
    // index holds less: west, then east.
    let opening = |system: &str| json!([{"role": "system", "content": system}, {"role": "user", "content": "hi"}]);
    let (at_w, at_e) = (
        text("west's system prompt", 40 * 256),
        text("east's system prompt", 40 * 256),
    );
    assert_eq!(chat(opening(&at_w), false).await, west.1);
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    assert_eq!(chat(opening(&at_e), false).await, east.1);
    let later_turn = |system: &str, question: &str, hold: bool| {
        let turn = json!([
            {"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": question},
        ]);
        tokio::spawn(chat(turn, hold))
    };
    // One of east's slots busy with the second's next turn, waiting for its first token;
    // one of west's with the first's, streaming: both held. East is the busier.
    let at_east = later_turn(&at_e, "and then?", true);
    let streaming = json!([
        {"role": "system", "content": at_w}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"},
    ]);
    let at_west = held_stream(&url, streaming);
    let streams_at_west = || {
        let view = gateway.grid().view();
        view.cluster(&cluster_id(&gateway, west.1))
            .unwrap()
            .load()
            .streaming()
    };
    eventually("east waits on one request, west streams one", || async {
        (in_flight_at(&gateway, east.1), streams_at_west()) == (1, 1)
    })
    .await;
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    // Another turn answered at west just now, in its other slot: the one free there just
    // went idle, and its conversation may send its next turn at once.
    assert_eq!(later_turn(&at_w, "and else?", false).await.unwrap(), west.1);
    // The short conversation's second turn: east holds nothing of it that was keyed and is
    // the busier, so the load gate would move it, but the only lighter place is that slot,
    // and a slot is free at east.
    // It stays with its conversation (the engine here serves it beside the held two).
    let next = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": text("an answer", 4 * 256)},
        {"role": "user", "content": "tell me more"},
    ]);
    assert_eq!(chat(next, false).await, east.1);
    // West was passed over for it, and counted; east, where it stayed, was not.
    let passed = |at| cluster_metric(&gateway, "grid_route_slot_passed_over_total", at);
    assert_eq!(passed(west).await, Some(1.0));
    assert_eq!(passed(east).await, None);
    release_east.send(true).unwrap();
    assert_eq!(at_east.await.unwrap(), east.1);
    release_west.send(true).unwrap();
    assert_eq!(at_west.await.unwrap(), west.1);
}

#[tokio::test]
async fn on_slot_engines_a_first_turn_leaves_a_holder_whose_slot_just_went_idle_for_another() {
    let (release, released) = tokio::sync::watch::channel(false);
    let sites = [
        ("holder-one", "holder-one-a"),
        ("holder-two", "holder-two-a"),
        ("holder-three", "holder-three-a"),
    ];
    let gateway = two_slot_gateway_with(&sites, &released, CPU_PRICES).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let house = text("a house prompt", 20 * 256);
    let first_turn = |question: &str, hold: bool| {
        let url = url.clone();
        let body = json!({"model": MODEL, "messages": [
            {"role": "system", "content": house}, {"role": "user", "content": question},
        ]})
        .to_string();
        async move {
            let mut headers = vec![("content-type", "application/json")];
            if hold {
                headers.push(("x-hold", "1"));
            }
            send_with(Method::POST, &url, &headers, body)
                .await
                .engine_name()
        }
    };
    // Nothing held anywhere: the first engine. Its answer just ended, so the next first
    // turn behind the head is placed at another engine, which then holds the head too.
    let one = sites[0].1;
    assert_eq!(first_turn("q1", false).await, one);
    let two = first_turn("q2", false).await;
    assert_ne!(two, one);
    let holders = [one, two.as_str()];
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    // One holder runs a held first turn; another goes to the other, less loaded holder,
    // and its answer ends there.
    let held = tokio::spawn(first_turn("q3", true));
    eventually("a holder runs the held first turn", || async {
        holders.iter().any(|h| in_flight_at(&gateway, h) == 1)
    })
    .await;
    let busy = *holders
        .iter()
        .find(|h| in_flight_at(&gateway, h) == 1)
        .unwrap();
    let freed = first_turn("q4", false).await;
    assert!(holders.contains(&freed.as_str()) && freed != busy);
    // The less loaded holder's slot just went idle; the busier one has a free slot that did
    // not. The next first turn finds the head there, leaving the live conversation's slot.
    assert_eq!(first_turn("q5", false).await, busy);
    let passed = |cluster: &str| {
        let at = *sites.iter().find(|s| s.1 == cluster).unwrap();
        cluster_metric(&gateway, "grid_route_slot_passed_over_total", at)
    };
    // Passed over: the first holder for q2, the freed one for q5.
    if freed == one {
        assert_eq!(passed(one).await, Some(2.0));
    } else {
        assert_eq!(passed(one).await, Some(1.0));
        assert_eq!(passed(&freed).await, Some(1.0));
    }
    release.send(true).unwrap();
    assert_eq!(held.await.unwrap(), busy);
}

#[tokio::test]
async fn on_slot_engines_a_held_request_waits_on_when_a_second_slot_goes_idle_during_its_hold() {
    let (east, west) = (
        ("hold-on-east", "hold-on-east-a"),
        ("hold-on-west", "hold-on-west-a"),
    );
    let (gateway, release_east, release_west) = two_slot_pair(east, west).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let (a, b) = (
        text("the first conversation's system prompt", 40 * 256),
        text("the second conversation's system prompt", 40 * 256),
    );
    // Conversation A at east; west's two slots then busy with held requests.
    let answer = chat_completion(&url, nth_turn(&a, 1), false).await;
    assert_eq!(answer.engine_name(), east.1);
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    let at_west = two_held_at(&gateway, &url, west.1).await;
    // Conversation B in east's other slot, streaming, held at the engine.
    let at_east = held_stream(&url, nth_turn(&b, 1));
    eventually("east streams B's answer", || async {
        in_flight_at(&gateway, east.1) == 1
    })
    .await;
    // A's second turn, its last, answered at east: a slot there just went idle. A prompt
    // too short to key, with no free slot elsewhere, is held 100 ms for A's next turn.
    let answer = chat_completion(&url, nth_turn(&a, 2), false).await;
    assert_eq!(answer.engine_name(), east.1);
    let ended = tokio::time::Instant::now();
    let short = json!([{"role": "user", "content": "hi"}]);
    let url_n = url.clone();
    let newcomer = tokio::spawn(async move { chat_completion(&url_n, short, false).await });
    // B's answer ends during that hold: east's other slot goes idle, and B's next turn,
    // sent once the first hold is over, still reaches the engine before the newcomer.
    tokio::time::sleep_until(ended + Duration::from_millis(50)).await;
    release_east.send(true).unwrap();
    assert_eq!(at_east.await.unwrap(), east.1);
    tokio::time::sleep_until(ended + SLOT_RECLAIM_HOLD + Duration::from_millis(25)).await;
    let b_next = chat_completion(&url, nth_turn(&b, 2), false).await;
    assert_eq!(b_next.engine_name(), east.1);
    let newcomer = newcomer.await.unwrap();
    assert_eq!(newcomer.engine_name(), east.1);
    assert!(
        arrival(&b_next) < arrival(&newcomer),
        "the newcomer reached east (arrival {}) before B's next turn ({})",
        arrival(&newcomer),
        arrival(&b_next)
    );
    // Held once, counted once.
    let holds = cluster_metric(&gateway, "grid_route_slot_holds_total", east).await;
    assert_eq!(holds, Some(1.0));
    release_west.send(true).unwrap();
    for held in at_west {
        assert_eq!(held.await.unwrap(), west.1);
    }
}

#[tokio::test]
async fn on_slot_engines_a_new_request_waits_for_the_live_turn_where_a_slot_just_went_idle() {
    let (east, west) = (
        ("reclaim-east", "reclaim-east-a"),
        ("reclaim-west", "reclaim-west-a"),
    );
    let (gateway, release_east, release_west) = two_slot_pair(east, west).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    // The engine and the arrival number at it of each answer.
    let chat = |messages: Value, hold: bool| {
        let url = url.clone();
        async move {
            let answer = chat_completion(&url, messages, hold).await;
            (answer.engine_name(), arrival(&answer))
        }
    };
    let long = text("a long system prompt", 40 * 256);
    let turn = |n: usize| nth_turn(&long, n);
    // A conversation at east; west's two slots then busy with held requests.
    assert_eq!(chat(turn(1), false).await.0, east.1);
    tokio::time::sleep(SLOT_RECLAIM_WINDOW).await;
    // New conversations held at the engine: placed where the index holds least, west.
    let at_west = two_held_at(&gateway, &url, west.1).await;
    // The conversation's second turn ends at east: one of its slots just went idle, and the
    // third turn is about to come. A prompt too short to key, sent just before it, has
    // nowhere else to go: it waits, and the third turn reaches its slot first.
    let (engine, second) = chat(turn(2), false).await;
    assert_eq!(engine, east.1);
    let short = || json!([{"role": "user", "content": "hi"}]);
    let newcomer = tokio::spawn(chat(short(), false));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (engine, third) = chat(turn(3), false).await;
    assert_eq!(engine, east.1);
    let (engine, arrival) = newcomer.await.unwrap();
    assert_eq!(engine, east.1);
    assert_eq!((third, arrival), (second + 1, second + 2));
    let holds = || cluster_metric(&gateway, "grid_route_slot_holds_total", east);
    assert_eq!(holds().await, Some(1.0));
    // The live turn itself never waits, and once the hold is over nothing does.
    tokio::time::sleep(SLOT_RECLAIM_HOLD).await;
    let (engine, _) = chat(short(), false).await;
    assert_eq!(engine, east.1);
    assert_eq!(holds().await, Some(1.0));
    release_west.send(true).unwrap();
    release_east.send(true).unwrap();
    for held in at_west {
        assert_eq!(held.await.unwrap(), west.1);
    }
}

#[tokio::test]
async fn on_slot_engines_a_prompt_right_behind_one_still_waiting_reaches_the_engine_a_pass_later() {
    let (release, released) = tokio::sync::watch::channel(false);
    let (site, cluster) = ("pass-east", "pass-east-a");
    let gateway = two_slot_gateway(&[(site, cluster)], &released).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    // When each answer's request reached the engine, by the engine's clock.
    let reached = |answer: &Answer| -> u64 {
        answer.headers["x-mock-at-us"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let chat = |topic: &str| {
        let url = url.clone();
        let messages = json!([{"role": "user", "content": text(topic, 8 * 256)}]);
        tokio::spawn(async move { chat_completion(&url, messages, true).await })
    };
    // Two prompts sent at once, both waiting at the engine for their first token: the one
    // `Select` takes second goes 50 ms after the first.
    let (one, two) = (chat("one"), chat("two"));
    eventually("the engine has both", || async {
        in_flight_at(&gateway, cluster) == 2
    })
    .await;
    release.send(true).unwrap();
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert_eq!((one.status, two.status), (StatusCode::OK, StatusCode::OK));
    let apart = reached(&one).abs_diff(reached(&two));
    assert!(apart >= 30_000, "reached the engine {apart} µs apart");
    let spacings = || cluster_metric(&gateway, "grid_route_pass_spacings_total", (site, cluster));
    assert_eq!(spacings().await, Some(1.0));
    // With nothing waiting there for its first token, the next one goes at once.
    let three = chat("three").await.unwrap();
    assert_eq!(three.status, StatusCode::OK);
    assert_eq!(spacings().await, Some(1.0));
}

#[tokio::test]
async fn a_stream_counts_its_prompt_held_from_its_first_token_not_its_head() {
    let (release, released) = tokio::sync::watch::channel(false);
    let gateway = two_slot_gateway(
        &[
            ("token-east", "token-east-a"),
            ("token-west", "token-west-a"),
        ],
        &released,
    )
    .await;
    let entries = |name: &str| {
        gateway
            .affinity()
            .index()
            .entries(&cluster_id(&gateway, name))
    };
    let url = format!("{}/v1/chat/completions", gateway.url());
    // Two first turns behind one long system prompt (40 blocks: enough to stick to).
    let turn = |user: &str| {
        json!({"model": MODEL, "stream": true, "messages": [
            {"role": "system", "content": text("house", 40 * 256)},
            {"role": "user", "content": user},
        ]})
        .to_string()
    };
    let request = Request::post(&url)
        .header("content-type", "application/json")
        .header("x-stream", "1")
        .header("x-hold", "1")
        .body(Full::new(Bytes::from(turn("a"))))
        .unwrap();
    let held = tokio::time::timeout(REQUEST_DEADLINE, client().request(request))
        .await
        .expect("the held stream's head within the deadline")
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let first = held.headers()["x-mock-engine"].to_str().unwrap().to_owned();
    let other = if first == "token-east-a" {
        "token-west-a"
    } else {
        "token-east-a"
    };
    // Its head is back, its first token is not: its engine has not prefilled the prompt,
    // so the index holds it nowhere.
    assert_eq!((entries(&first), entries(other)), (0, 0));
    // The second turn goes by load to the other engine's free slot. Confirmed at the
    // first stream's head, it would follow it, to wait behind its prefill.
    let json = ("content-type", "application/json");
    let second = send_with(Method::POST, &url, &[json, ("x-stream", "1")], turn("b")).await;
    assert_eq!(second.engine_name(), other);
    assert_eq!(entries(&first), 0);
    let keys = entries(other);
    assert!(keys > 0, "the second stream, read to its end, is confirmed");
    // The first stream's first token confirms its prompt where it is served.
    release.send(true).unwrap();
    let body = tokio::time::timeout(REQUEST_DEADLINE, held.into_body().collect())
        .await
        .expect("the released stream's end within the deadline")
        .unwrap()
        .to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(entries(&first), keys);
}

#[tokio::test]
async fn on_slot_engines_a_new_conversation_takes_the_free_slot_behind_the_least_prefill() {
    let (release, released) = tokio::sync::watch::channel(false);
    let gateway = two_slot_gateway(
        &[
            ("burst-east", "burst-east-a"),
            ("burst-west", "burst-west-a"),
            ("burst-north", "burst-north-a"),
        ],
        &released,
    )
    .await;
    let load = |name: &str| {
        let view = gateway.grid().view();
        let load = view.cluster(&cluster_id(&gateway, name)).unwrap().load();
        (load.in_flight(), load.prefill_waiting_bytes())
    };
    let url = format!("{}/v1/chat/completions", gateway.url());
    // New conversations, all held at their engines before their first token, as in an
    // opening burst: nothing is confirmed anywhere, so every index holds nothing.
    let hold = |topic: &'static str, blocks: usize| held_new_conversation(&url, topic, blocks);
    // Each placed before the next is sent.
    let in_flight = |count: usize| {
        eventually("the request is in flight", move || async move {
            ["burst-east-a", "burst-west-a", "burst-north-a"]
                .iter()
                .map(|name| load(name).0)
                .sum::<usize>()
                == count
        })
    };
    // One each while an engine is idle: the least loaded first.
    let long = hold("long", 40);
    in_flight(1).await;
    let short = hold("short", 4);
    in_flight(2).await;
    let longer = hold("longer", 36);
    in_flight(3).await;
    let (east, west, north) = (
        load("burst-east-a"),
        load("burst-west-a"),
        load("burst-north-a"),
    );
    assert_eq!((east.0, west.0, north.0), (1, 1, 1));
    assert!(
        west.1 < north.1 && north.1 < east.1,
        "{east:?} {west:?} {north:?}"
    );
    // Every engine has a slot free, holds nothing and is as loaded as the others: the
    // next long prompt goes where the least prompt is still being prefilled (west-a,
    // the short one), not to the first (east-a), where it would wait for 40 blocks of
    // someone else's prefill before its own began.
    let third = hold("third", 38);
    in_flight(4).await;
    // Of the two slots left, north-a's waits behind 36 blocks, east-a's behind 40.
    let fourth = hold("fourth", 4);
    in_flight(5).await;
    assert_eq!(load("burst-west-a").0, 2);
    assert_eq!(load("burst-north-a").0, 2);
    release.send(true).unwrap();
    let engines = [long, short, longer, third, fourth];
    let mut served = Vec::new();
    for answer in engines {
        served.push(answer.await.unwrap());
    }
    assert_eq!(
        served,
        [
            "burst-east-a",
            "burst-west-a",
            "burst-north-a",
            "burst-west-a",
            "burst-north-a"
        ]
    );
    // Answered: nothing waits to be prefilled.
    eventually("every answer ended", || async {
        ["burst-east-a", "burst-west-a", "burst-north-a"]
            .iter()
            .all(|name| load(name) == (0, 0))
    })
    .await;
}

#[tokio::test]
async fn on_slot_engines_a_new_conversation_passes_over_a_roomy_free_slot_behind_a_long_prefill() {
    let (release, released) = tokio::sync::watch::channel(false);
    let gateway = two_slot_gateway(
        &[("wait-east", "wait-east-a"), ("wait-west", "wait-west-a")],
        &released,
    )
    .await;
    let in_flight = |name: &str| in_flight_at(&gateway, name);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let place = |topic: &'static str, blocks: usize| answered_new_conversation(&url, topic, blocks);
    // Nothing held anywhere: the first goes to the first engine, which holds it.
    assert_eq!(place("first", 40).await, "wait-east-a");
    // The next new conversation takes west-a's free slot, where the index holds least,
    // and is held there before its first token: 40 blocks wait to be prefilled.
    let long = held_new_conversation(&url, "long", 40);
    eventually("west-a runs the held request", || async {
        in_flight("wait-west-a") == 1
    })
    .await;
    // A short new conversation would wait there behind ten times its own prefill (4
    // blocks to 40, past the default six): it takes east-a's free slot, though east-a
    // holds more. By room alone it would have gone to west-a.
    assert_eq!(place("short", 4).await, "wait-east-a");
    // One of 10 blocks would wait four times its own: room decides, west-a.
    assert_eq!(place("longer", 10).await, "wait-west-a");
    release.send(true).unwrap();
    assert_eq!(long.await.unwrap(), "wait-west-a");
}

#[tokio::test]
async fn a_gateway_sharing_its_index_tells_placement_so_and_a_reload_changes_it() {
    // Behind a shared index every replica reads the same entries, so placement goes by
    // this replica's own placements instead (the rule's unit tests show both orders).
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let scratch = scratch_dir("index-shared");
    let key = scratch.path().join("tag.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    // A Redis nobody answers: the gateway serves on its local index after a bounded wait.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redis = format!("redis://{}/0", closed.local_addr().unwrap());
    drop(closed);
    let yaml = |shared: bool| {
        let sharing = if shared {
            format!(", shared_index: {{ redis_url: \"{redis}\" }}")
        } else {
            String::new()
        };
        let affinity = format!(
            "grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}{sharing} }} }}\n",
            key.display()
        );
        priced_yaml(
            &[
                ("east", vec![cluster("east-a", &[&east])]),
                ("west", vec![cluster("west-a", &[&west])]),
            ],
            &affinity,
        )
    };
    let gateway = Gateway::start(parse(&yaml(true))).await.unwrap();
    assert!(gateway.affinity().index_shared());
    gateway.reload(&parse(&yaml(false))).unwrap();
    assert!(!gateway.affinity().index_shared());
    gateway.reload(&parse(&yaml(true))).unwrap();
    assert!(gateway.affinity().index_shared());
    let alone = Gateway::start(parse(&yaml(false))).await.unwrap();
    assert!(!alone.affinity().index_shared());
}

// ---- our own in-flight load (queue.count_in_flight) ----------------------------------

/// Two sites of slow engines (about 2 s an answer) behind a gateway that reads their
/// queues once, at start, and then not for ten minutes: every decision of a test is made
/// between the same two polls. West's engine reports one request waiting.
async fn two_slow_sites_read_once(count_in_flight: bool) -> (MockEngine, MockEngine, Gateway) {
    let slow = |name: &str| MockEngineConfig {
        models: vec![MODEL.to_owned()],
        prefill_tokens_per_second: 50_000_000,
        decode_delay_per_token: Duration::from_millis(300),
        ..MockEngineConfig::named(name)
    };
    let east = MockEngine::start("127.0.0.1:0", slow("east-a"))
        .await
        .unwrap();
    let west = MockEngine::start("127.0.0.1:0", slow("west-a"))
        .await
        .unwrap();
    set_queue(&west, 1).await;
    let yaml = priced_yaml(
        &[
            ("east", vec![cluster("east-a", &[&east])]),
            ("west", vec![cluster("west-a", &[&west])]),
        ],
        "",
    )
    .replace(
        "queue: { poll_interval_ms: 20, window_secs: 1 }",
        &format!(
            "queue: {{ poll_interval_ms: 600000, window_secs: 1200, \
             count_in_flight: {count_in_flight} }}"
        ),
    );
    let gateway = measured_gateway(&yaml).await;
    assert_eq!(queue_depth(&gateway, "west-a"), 1.0);
    (east, west, gateway)
}

/// Sends `bodies` to the chat endpoint, each as soon as the one before counts in flight at
/// the gateway, so all are in flight together; returns how many each engine answered.
/// Sent at the same instant, two decisions on the runtime's two threads could both read
/// the loads before either request counted, a race these tests are not about.
async fn burst<B: Into<Bytes> + Send + 'static>(
    gateway: &Gateway,
    bodies: Vec<B>,
) -> BTreeMap<String, usize> {
    let url = format!("{}/v1/chat/completions", gateway.url());
    let in_flight = || {
        let view = gateway.grid().view();
        view.clusters()
            .iter()
            .map(|c| c.load().in_flight())
            .sum::<usize>()
    };
    eventually("nothing in flight before the burst", || async {
        in_flight() == 0
    })
    .await;
    let mut sent = tokio::task::JoinSet::new();
    for (i, body) in bodies.into_iter().enumerate() {
        let url = url.clone();
        sent.spawn(async move { send(Method::POST, &url, body).await });
        eventually("the request counts in flight", || async { in_flight() > i }).await;
    }
    let mut seen = BTreeMap::new();
    while let Some(answer) = sent.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        *seen.entry(answer.engine_name()).or_default() += 1;
    }
    seen
}

fn distinct_chats(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| chat(&format!("question {i} about something else entirely")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_queue_alone_a_burst_between_two_polls_piles_onto_the_lightest_queue() {
    let (_east, _west, gateway) = two_slow_sites_read_once(false).await;
    let seen = burst(&gateway, distinct_chats(4)).await;
    assert_eq!(seen, BTreeMap::from([("east-a".to_owned(), 4)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_in_flight_a_burst_between_two_polls_spreads_over_the_sites() {
    let (_east, _west, gateway) = two_slow_sites_read_once(true).await;
    let seen = burst(&gateway, distinct_chats(4)).await;
    // Loads east|west: 0|1, 1|1 (tie: fewer in flight), 1|2, 2|2 (tie again).
    assert_eq!(
        seen,
        BTreeMap::from([("east-a".to_owned(), 2), ("west-a".to_owned(), 2)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_in_flight_a_stream_counts_until_its_last_token_not_its_head_at_half_from_its_first()
 {
    let (_east, _west, gateway) = two_slow_sites_read_once(true).await;
    let load = |name: &str| {
        let view = gateway.grid().view();
        let load = view.cluster(&cluster_id(&gateway, name)).unwrap().load();
        (load.in_flight(), load.streaming())
    };
    let in_flight = |name: &str| load(name).0;
    // Queues read east 0, west 1: a first request goes east. Its head comes at once and
    // its tokens 300 ms apart, as llama.cpp and vLLM stream.
    let body = json!({
        "model": MODEL,
        "stream": true,
        "messages": [{"role": "user", "content": "tell me a story in seven words"}],
    });
    let request = Request::post(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-mock-engine"], "east-a");
    // The head is in and the engine is still generating: the stream counts at east, which
    // now ties west (1|1) and loses on requests in flight.
    assert_eq!(in_flight("east-a"), 1);
    let second = post(
        &gateway,
        "/v1/chat/completions",
        chat("something else entirely"),
    )
    .await;
    assert_eq!(second.engine_name(), "west-a");
    // Once its first token is out it counts as a stream, at STREAM_WEIGHT (half) of a
    // request: east weighs 0.5 against west's queued 1, and takes the next one.
    eventually("the story's first token", || async {
        load("east-a") == (1, 1)
    })
    .await;
    assert_eq!(in_flight("west-a"), 0);
    let third = post(
        &gateway,
        "/v1/chat/completions",
        chat("a third thing while the story streams"),
    )
    .await;
    assert_eq!(third.engine_name(), "east-a");
    // Read to its end, the stream stops counting, and east is the lighter again.
    let mut stream = response.into_body();
    let mut text = Vec::new();
    while let Some(frame) = stream.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            text.extend_from_slice(&data);
        }
    }
    assert!(text.ends_with(b"data: [DONE]\n\n"));
    eventually("the stream stopped counting", || async {
        in_flight("east-a") == 0
    })
    .await;
    assert_eq!(load("east-a"), (0, 0));
    assert_eq!(in_flight("west-a"), 0);
    let fourth = post(&gateway, "/v1/chat/completions", chat("a fourth thing")).await;
    assert_eq!(fourth.engine_name(), "east-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_in_flight_a_burst_of_follow_ups_spills_past_the_sticky_site() {
    for (count_in_flight, spills) in [(false, false), (true, true)] {
        let (_east, _west, gateway) = two_slow_sites_read_once(count_in_flight).await;
        let mut conversation = Conversation::new("burst", 9 * 1024);
        let home = conversation
            .turn(&gateway.url(), "hello there")
            .await
            .engine_name();
        let follow_ups = (0..4)
            .map(|i| {
                let mut next = Conversation {
                    messages: conversation.messages.clone(),
                };
                next.ask(&format!("follow-up {i}"))
            })
            .collect();
        let seen = burst(&gateway, follow_ups).await;
        if spills {
            // Each follow-up in flight at home weighs a whole queued request against a
            // 9 KiB match worth about a tenth of one.
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert!(seen.values().all(|&n| n >= 1), "{seen:?}");
        } else {
            assert_eq!(seen, BTreeMap::from([(home.clone(), 4)]));
        }
    }
}

// ---- engines that close a kept-alive connection (llama.cpp) ----------------------------

/// An engine that behaves as llama.cpp's `llama-server` does after a streamed answer: its
/// headers promise keep-alive, yet it never reads another request on that connection. Here
/// it reads the next one and closes without answering, which is what the gateway sees when
/// its reuse of the connection crosses the engine's close. Answers `/metrics` with an
/// empty queue. Returns its URL and how many requests it dropped so.
async fn closes_after_each_stream() -> (String, Arc<AtomicUsize>) {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&dropped);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let dropped = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut streamed = false;
                let mut buffer = Vec::new();
                while let Some(head) = read_request(&mut socket, &mut buffer).await {
                    if streamed {
                        dropped.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let answer = if head.starts_with("get /metrics") {
                        empty_vllm_metrics(false)
                    } else {
                        streamed = true;
                        let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
                        let done = "data: [DONE]\n\n";
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                             keep-alive: timeout=5, max=100\r\ntransfer-encoding: chunked\r\n\r\n\
                             {:x}\r\n{event}\r\n{:x}\r\n{done}\r\n0\r\n\r\n",
                            event.len(),
                            done.len()
                        )
                    };
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, dropped)
}

#[tokio::test]
async fn a_request_the_engine_dropped_with_its_connection_after_a_stream_is_sent_again() {
    let (url, dropped) = closes_after_each_stream().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n\
         queue: {{ poll_interval_ms: 600000, window_secs: 1200 }}\n\
         sites:\n  - name: east\n    clusters:\n\
         \x20     - {{ name: east-a, models: [{MODEL}], endpoints: [{url}] }}\n"
    );
    let gateway = measured_gateway(&yaml).await;
    let streamed = |content: &str| {
        json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": content}]})
            .to_string()
    };
    // Each turn goes out on the connection the last stream left in the pool; the engine
    // drops it unanswered, and the gateway sends the (buffered) request again on a new one.
    for turn in 0..4 {
        let answer = post(
            &gateway,
            "/v1/chat/completions",
            streamed(&format!("turn {turn}")),
        )
        .await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "turn {turn}: {}",
            answer.text()
        );
        assert!(
            answer.text().ends_with("data: [DONE]\n\n"),
            "{}",
            answer.text()
        );
    }
    assert!(
        dropped.load(Ordering::SeqCst) >= 1,
        "no request went out on a closing connection"
    );
}

#[tokio::test]
async fn a_5xx_or_a_429_answer_drops_the_prompt_from_its_cluster() {
    let (east, west, gateway) = two_sites().await;
    for (topic, status) in [
        ("failing", StatusCode::SERVICE_UNAVAILABLE),
        ("throttled", StatusCode::TOO_MANY_REQUESTS),
    ] {
        let mut conversation = Conversation::new(topic, 9 * 1024);
        let before = [entries(&gateway, "east-a"), entries(&gateway, "west-a")];
        let home = conversation
            .turn(&gateway.url(), "hello")
            .await
            .engine_name();
        let held = entries(&gateway, &home);
        assert!(held > before[usize::from(home == "west-a")], "{topic}");
        let engine = if home == "east-a" { &east } else { &west };
        engine.fail_next(status, 1);
        let failed = conversation.turn(&gateway.url(), "next").await;
        // Sticky to its site, which answers the failure; the client sees it as is.
        assert_eq!(failed.status, status, "{topic}");
        assert_eq!(failed.engine_name(), home);
        assert!(failed.json()["error"].is_object());
        assert_eq!(
            entries(&gateway, &home),
            before[usize::from(home == "west-a")],
            "{topic}: its blocks are dropped"
        );
    }
}

#[tokio::test]
async fn a_drained_site_takes_no_new_request() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let sites = |drain_west: bool| {
        let mut west_cluster = cluster("west-a", &[&west]);
        west_cluster.admit = !drain_west;
        priced_yaml(
            &[
                ("east", vec![cluster("east-a", &[&east])]),
                ("west", vec![west_cluster]),
            ],
            "",
        )
    };
    let gateway = measured_gateway(&sites(false)).await;
    // Find a conversation that lives on west.
    let mut conversation = loop {
        let mut candidate = Conversation::new(&format!("drain-{}", rand_topic()), 9 * 1024);
        if candidate.turn(&gateway.url(), "hello").await.engine_name() == "west-a" {
            break candidate;
        }
    };
    gateway.reload(&parse(&sites(true))).unwrap();
    for question in ["next", "and next", "last"] {
        assert_eq!(
            conversation
                .turn(&gateway.url(), question)
                .await
                .engine_name(),
            "east-a"
        );
    }
    for i in 0..4 {
        let answer = post(&gateway, "/v1/chat/completions", chat(&format!("q{i}"))).await;
        assert_eq!(answer.engine_name(), "east-a");
    }
}

/// A conversation without a system prompt whose every turn adds more than a fifth of its
/// prompt, and stays under 8 KiB: no turn can stick by its prefix match.
struct ShortTurns {
    messages: Vec<Value>,
    topic: String,
    headers: Vec<(String, String)>,
    /// Whether the client rewrites its history at each turn (it stamps the turn on its
    /// first message), so that no turn continues the prompt before it to the byte.
    rewrites_history: bool,
}

impl ShortTurns {
    fn new(topic: &str, headers: &[(&str, &str)]) -> Self {
        Self {
            messages: Vec::new(),
            topic: topic.to_owned(),
            headers: headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            rewrites_history: false,
        }
    }

    /// The same conversation, its client rewriting its history at each turn.
    fn rewriting_history(mut self) -> Self {
        self.rewrites_history = true;
        self
    }

    /// Sends turn `n` (from 0; at most 2): 700 bytes (under the four keys a match needs to
    /// count), then 3 and 4 KiB more.
    async fn turn(&mut self, gateway: &Gateway) -> Answer {
        let n = self.messages.len() / 2;
        let question = text(&format!("{}-{n}", self.topic), [700, 3072, 4096][n]);
        self.messages
            .push(json!({"role": "user", "content": question}));
        let mut messages = self.messages.clone();
        if self.rewrites_history {
            let first = messages[0]["content"].as_str().unwrap_or_default();
            messages[0]["content"] = format!("[turn {n}] {first}").into();
        }
        let body = serde_json::to_vec(&json!({"model": MODEL, "messages": messages})).unwrap();
        let url = format!("{}/v1/chat/completions", gateway.url());
        let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json")];
        headers.extend(self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let answer = send_with(Method::POST, &url, &headers, body).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        let reply = answer.json()["choices"][0]["message"]["content"].clone();
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
        answer
    }
}

#[tokio::test]
async fn a_session_header_keeps_turns_that_cannot_stick_on_their_cluster_until_it_is_drained() {
    let names = ["east-a", "west-a", "north-a"];
    let mut engines = Vec::new();
    for name in names {
        engines.push(engine(name).await);
    }
    let sites = |drained: Option<&str>| {
        let sites: Vec<_> = names
            .iter()
            .zip(&engines)
            .map(|(name, engine)| {
                let mut c = cluster(name, &[engine]);
                c.admit = drained != Some(*name);
                (name.trim_end_matches("-a"), vec![c])
            })
            .collect();
        priced_yaml(&sites, "")
    };
    let gateway = measured_gateway(&sites(None)).await;
    // Without a session, on a fresh gateway, from a client that rewrites its history at
    // each turn: the second turn is a no-match, which goes to the clusters whose index holds
    // less, away from the one that holds the first turn.
    let mut anonymous =
        ShortTurns::new(&format!("anonymous-{}", rand_topic()), &[]).rewriting_history();
    let anonymous_home = anonymous.turn(&gateway).await.engine_name();
    assert_ne!(anonymous.turn(&gateway).await.engine_name(), anonymous_home);
    // The same client naming a session: the session keeps it.
    let session = format!("session-{}", rand_topic());
    let mut conversation =
        ShortTurns::new("header", &[("x-session-id", &session)]).rewriting_history();
    let home = conversation.turn(&gateway).await.engine_name();
    assert_eq!(conversation.turn(&gateway).await.engine_name(), home);
    // Drained, the session's cluster takes nothing: the last turn is decided between the
    // two others.
    gateway.reload(&parse(&sites(Some(&home)))).unwrap();
    wait_measured(&gateway).await;
    assert_ne!(conversation.turn(&gateway).await.engine_name(), home);
}

/// The body of one Chat turn under `system`: the messages so far, then `question`.
fn turn_under(system: &str, earlier: &[(&str, &str)], question: &str) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (role, content) in earlier {
        messages.push(json!({"role": role, "content": content}));
    }
    messages.push(json!({"role": "user", "content": question}));
    serde_json::to_vec(&json!({"model": MODEL, "messages": messages})).unwrap()
}

/// Sends a Chat body, with the `x-session-id` header when `session` is given.
async fn chat_as(gateway: &Gateway, session: Option<&str>, body: Vec<u8>) -> Answer {
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut headers = vec![("content-type", "application/json")];
    if let Some(session) = session {
        headers.push(("x-session-id", session));
    }
    let answer = send_with(Method::POST, &url, &headers, body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    answer
}

#[tokio::test]
async fn a_new_conversation_under_a_short_shared_system_prompt_is_not_crowded_onto_a_busier_cluster()
 {
    // A CPU-like prefill price: the 6 KiB system prompt saves about 15 s there, seven
    // queued requests, so the load gate alone would keep it one queued request heavier.
    let (east, west, gateway) = two_sites_with("east", "west", CPU_PRICES).await;
    let topic = rand_topic();
    let system = text(&format!("house rules {topic}"), 6 * 1024);
    let a = format!("a-{topic}");
    // Each question is longer than a keying block, so a's own prompt reaches past the
    // system prompt's keys.
    let a_asks = text("a asks", 1024);
    let first = chat_as(&gateway, Some(&a), turn_under(&system, &[], &a_asks)).await;
    let home = first.engine_name();
    let reply = first.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    queue_at(&gateway, (&east, &west), &home, 1).await;
    // A first turn naming no session holds no earlier answer: it opens a conversation, and
    // would only share a's system prompt, so it goes by load.
    let anonymous = turn_under(&system, &[], &text("someone asks", 1024));
    assert_eq!(
        chat_as(&gateway, None, anonymous).await.engine_name(),
        other(&home)
    );
    // a's own next turn keeps its cluster through the same queue, with its session or
    // without: it holds a's answer.
    let a_next = || turn_under(&system, &[("user", &a_asks), ("assistant", &reply)], "and?");
    assert_eq!(
        chat_as(&gateway, Some(&a), a_next()).await.engine_name(),
        home
    );
    assert_eq!(chat_as(&gateway, None, a_next()).await.engine_name(), home);
}

#[tokio::test]
async fn conversations_tied_at_a_shared_head_go_back_where_their_own_last_turns_were_answered() {
    // A CPU-like prefill price: the 15-block head saves about 10 s there, five queued
    // requests, so the gate lets a turn wait one queued request for the engine holding it.
    let (east, west, gateway) = two_sites_with("east", "west", CPU_PRICES).await;
    let topic = rand_topic();
    // A head of 15 keying blocks; each first question ends inside its last block, so the
    // two first turns have the same keys: the index alone cannot tell them apart.
    let system = text(&format!("house rules {topic}"), 15 * 256);
    let (a_asks, b_asks) = ("why is the sky blue?", "why is the sea salty?");
    let seed = grid_route_layer::keying::KeySeed::random();
    let keys = |question| {
        let body = turn_under(&system, &[], question);
        let api = grid_route_layer::keying::Api::ChatCompletions;
        let prompt = grid_route_layer::keying::key_body(&seed, api, &body).unwrap();
        prompt.keys().unwrap().clone()
    };
    assert_eq!(keys(a_asks), keys(b_asks));
    assert_eq!(keys(a_asks).len(), 15);
    let first = |question| chat_as(&gateway, None, turn_under(&system, &[], question));
    let a_first = first(a_asks).await;
    let a_home = a_first.engine_name();
    // b opens a conversation beside a busier holder of the head: it goes by load, and a's
    // engine stays a queued request busier.
    queue_at(&gateway, (&east, &west), &a_home, 1).await;
    let b_first = first(b_asks).await;
    let b_home = b_first.engine_name();
    assert_eq!(b_home, other(&a_home));
    // Each second turn sends its history back as it was, with a question long enough that
    // the head cannot stick. Both match both engines alike; by load alone a's would go to
    // b's engine. Each goes where its own first turn was answered.
    let reply = |answer: &Answer| {
        answer.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let follow_up = text("and then, in detail", 2048);
    for (asks, answer, home) in [(a_asks, &a_first, &a_home), (b_asks, &b_first, &b_home)] {
        let next = turn_under(
            &system,
            &[("user", asks), ("assistant", &reply(answer))],
            &follow_up,
        );
        assert_eq!(
            chat_as(&gateway, None, next).await.engine_name(),
            *home,
            "{asks}"
        );
    }
}

/// A topic no other conversation of the test used.
fn rand_topic() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

// ---- reload -------------------------------------------------------------------------

#[tokio::test]
async fn reload_adds_and_removes_clusters() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let east_only = priced_yaml(&[("east", vec![cluster("east-a", &[&east])])], "");
    let both = priced_yaml(
        &[
            ("east", vec![cluster("east-a", &[&east])]),
            ("west", vec![cluster("west-a", &[&west])]),
        ],
        "",
    );
    let west_only = priced_yaml(&[("west", vec![cluster("west-a", &[&west])])], "");
    let gateway = measured_gateway(&east_only).await;
    for i in 0..3 {
        let answer = post(&gateway, "/v1/chat/completions", chat(&format!("a{i}"))).await;
        assert_eq!(answer.engine_name(), "east-a");
    }

    gateway.reload(&parse(&both)).unwrap();
    assert_eq!(gateway.index().clusters().len(), 2);
    wait_measured(&gateway).await;
    let mut seen = BTreeSet::new();
    for i in 0..6 {
        let mut conversation = Conversation::new(&format!("grow-{i}"), 2048);
        seen.insert(
            conversation
                .turn(&gateway.url(), "hello")
                .await
                .engine_name(),
        );
    }
    assert_eq!(seen.len(), 2, "{seen:?}");

    gateway.reload(&parse(&west_only)).unwrap();
    assert_eq!(gateway.index().clusters(), [cluster_id(&gateway, "west-a")]);
    for i in 0..3 {
        let answer = post(&gateway, "/v1/chat/completions", chat(&format!("b{i}"))).await;
        assert_eq!(answer.engine_name(), "west-a");
    }
    assert_eq!(gateway.grid().view().generation(), 2);
}

#[tokio::test]
async fn the_local_site_can_lose_its_last_cluster_by_reload() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let sites = |with_east: bool| {
        let mut sites = vec![];
        if with_east {
            sites.push(("east", vec![cluster("east-a", &[&east])]));
        } else {
            sites.push(("east", vec![]));
        }
        sites.push(("west", vec![cluster("west-a", &[&west])]));
        priced_yaml(&sites, "local_site: east\n")
    };
    let gateway = measured_gateway(&sites(true)).await;
    // A conversation stored on the local site.
    let created = post(&gateway, "/v1/conversations", "{}").await;
    assert_eq!(created.engine_name(), "east-a");
    let conversation = created.json()["id"].as_str().unwrap().to_owned();

    // East's engines are taken out: the site stays, with no cluster; then it goes too.
    gateway.reload(&parse(&sites(false))).unwrap();
    let gone = get(format!("{}/v1/conversations/{conversation}", gateway.url())).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.error_code(), "stored_state_gone");
    let moved = post(&gateway, "/v1/conversations", "{}").await;
    assert_eq!(
        moved.engine_name(),
        "west-a",
        "new conversations go by load elsewhere"
    );
    let answer = post(&gateway, "/v1/chat/completions", chat("hello")).await;
    assert_eq!(answer.engine_name(), "west-a");
    let without_east = priced_yaml(
        &[("west", vec![cluster("west-a", &[&west])])],
        "local_site: east\n",
    );
    gateway.reload(&parse(&without_east)).unwrap();
    assert_eq!(
        post(&gateway, "/v1/conversations", "{}")
            .await
            .engine_name(),
        "west-a"
    );
    // And back.
    gateway.reload(&parse(&sites(true))).unwrap();
    wait_measured(&gateway).await;
    let back = get(format!("{}/v1/conversations/{conversation}", gateway.url())).await;
    assert_eq!(back.engine_name(), "east-a");
}

#[tokio::test]
async fn a_bad_reload_keeps_the_running_config_and_says_why() {
    let east = engine("east-a").await;
    let yaml = priced_yaml(&[("east", vec![cluster("east-a", &[&east])])], "");
    let gateway = measured_gateway(&yaml).await;
    let error = gateway
        .reload(&parse(&yaml.replace("name: east\n", "name: East\n")))
        .unwrap_err();
    assert!(
        error.to_string().starts_with(r#"sites[0].name "East""#),
        "{error}"
    );
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("gateway.yaml");
    std::fs::write(&file, format!("{yaml}surprise: 1\n")).unwrap();
    let error = gateway.reload_file(&file).unwrap_err();
    assert!(
        error.to_string().contains("unknown field `surprise`"),
        "{error}"
    );
    std::fs::write(&file, &yaml).unwrap();
    gateway.reload_file(&file).unwrap();
    assert_eq!(gateway.grid().view().generation(), 1);
    let answer = post(&gateway, "/v1/chat/completions", chat("still here")).await;
    assert_eq!(answer.engine_name(), "east-a");
}

// ---- forwarding ---------------------------------------------------------------------

#[tokio::test]
async fn bodies_reach_the_engine_byte_for_byte() {
    let east = engine("east-a").await;
    let yaml = priced_yaml(
        &[("east", vec![cluster("east-a", &[&east])])],
        "max_body_bytes: 4096\n",
    );
    let gateway = measured_gateway(&yaml).await;
    let last_body = || get(format!("{}/mock/last_body", east.url()));

    // Keyed: escapes, spacing, field order and unknown fields as the client wrote them.
    let keyed = " {\"messages\" : [ {\"content\":\"caf\\u00e9 \\/ ok\",\"role\":\"user\", \"x\":1} ],\n\"temperature\":0.5,  \"model\":\"demo-model\"}  ";
    let answer = post(&gateway, "/v1/chat/completions", keyed).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(last_body().await.body, keyed.as_bytes());

    // Over the keying limit: streamed through unkeyed.
    let large = chat(&text("large", 20_000));
    let answer = post(&gateway, "/v1/chat/completions", large.clone()).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(last_body().await.body, large);

    // A path and a body the layers do not read.
    let url = format!("{}/v1/embeddings?trace=1", gateway.url());
    let odd = "not json \u{0} at all";
    let answer = send_with(Method::POST, &url, &[("content-type", "text/plain")], odd).await;
    assert_eq!(answer.engine_name(), "east-a");
    let kept = last_body().await;
    assert_eq!(kept.body, odd.as_bytes());
    assert_eq!(kept.headers["x-mock-path"], "/v1/embeddings");
}

#[tokio::test]
async fn server_sent_events_stream_through_as_the_engine_writes_them() {
    let config = MockEngineConfig {
        prefill_tokens_per_second: 50_000_000,
        decode_delay_per_token: Duration::from_millis(40),
        ..MockEngineConfig::named("east-a")
    };
    let east = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let yaml = priced_yaml(&[("east", vec![cluster("east-a", &[&east])])], "");
    let gateway = measured_gateway(&yaml).await;
    let body = json!({
        "model": MODEL,
        "stream": true,
        "messages": [{"role": "user", "content": "one two three four five six"}],
    });
    let answer = post(&gateway, "/v1/chat/completions", body.to_string()).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        answer.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = answer.text();
    // Forwarded byte for byte, and whole: seven deltas and more, then the end marker.
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(answer.event_data().len() >= 7, "{text}");
    // Seven tokens 40 ms apart: frames arrive spread over the stream, not at its end.
    let times = &answer.frame_times;
    assert!(times.len() >= 5, "{} frames", times.len());
    let spread = times.last().unwrap().saturating_sub(times[0]);
    assert!(
        spread >= Duration::from_millis(150),
        "frames within {spread:?}"
    );
}

#[tokio::test]
async fn a_cluster_spreads_its_requests_over_its_endpoints() {
    let a = engine("east-a").await;
    let b = engine("east-a").await;
    let yaml = priced_yaml(&[("east", vec![cluster("east-a", &[&a, &b])])], "");
    let gateway = measured_gateway(&yaml).await;
    for i in 0..24 {
        let answer = post(&gateway, "/v1/chat/completions", chat(&format!("p{i}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let counts = [a.stats(), b.stats()].map(|s| {
        s.requests
            .get("POST /v1/chat/completions")
            .copied()
            .unwrap_or(0)
    });
    assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
}

// ---- errors -------------------------------------------------------------------------

#[tokio::test]
async fn a_model_no_cluster_serves_is_a_404_and_a_drained_one_a_503() {
    let east = engine("east-a").await;
    let west = engine_serving("west-a", &["embedder"]).await;
    let mut drained = cluster("west-a", &[&west]);
    drained = drained.serving(&["embedder"]);
    drained.admit = false;
    let yaml = priced_yaml(
        &[
            ("east", vec![cluster("east-a", &[&east])]),
            ("west", vec![drained]),
        ],
        "",
    );
    let gateway = measured_gateway(&yaml).await;
    let body =
        json!({"model": "nobody-serves-this", "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(&gateway, "/v1/chat/completions", body.to_string()).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(answer.headers.get("retry-after").is_none());
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(answer.error_code(), "model_not_found");
    assert_eq!(answer.json()["error"]["param"], "model");
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nobody-serves-this")
    );
    // Served, but only by a drained cluster: worth retrying.
    let body = json!({"model": "embedder", "input": "hi"});
    let answer = post(&gateway, "/v1/embeddings", body.to_string()).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.headers["retry-after"], "5");
    assert_eq!(answer.error_code(), "no_backend_available");
}

#[tokio::test]
async fn requests_the_layers_do_not_key_still_go_only_where_their_model_is_served() {
    let east = engine("east-a").await;
    let west = engine_serving("west-a", &["embedder"]).await;
    let mut embedder = cluster("west-a", &[&west]);
    embedder = embedder.serving(&["embedder"]);
    let yaml = priced_yaml(
        &[
            ("east", vec![cluster("east-a", &[&east])]),
            ("west", vec![embedder]),
        ],
        "max_body_bytes: 4096\nforward_paths:\n  - { path: /v1/embeddings, methods: [POST] }\n  \
         - { path: /v1/rerank, methods: [POST] }\n  - { path: /v1/chat/completions, methods: [POST] }\n",
    );
    let gateway = measured_gateway(&yaml).await;
    for i in 0..6 {
        // The model after the input, as SDKs write it; then one with no content type.
        let body = format!(r#"{{"input":["text {i}"],"model":"embedder"}}"#);
        let answer = post(&gateway, "/v1/embeddings", body.clone()).await;
        assert_eq!(answer.engine_name(), "west-a");
        let url = format!("{}/v1/rerank", gateway.url());
        let answer = send_with(Method::POST, &url, &[], body).await;
        assert_eq!(answer.engine_name(), "west-a");
    }
    // Over the body limit: the model in the first max_body_bytes routes it, and the whole
    // body still reaches the engine.
    let large = format!(
        r#"{{"model":"embedder","input":[{:?}]}}"#,
        text("large", 20_000)
    );
    let answer = post(&gateway, "/v1/embeddings", large.clone()).await;
    assert_eq!(answer.engine_name(), "west-a");
    let kept = get(format!("{}/mock/last_body", west.url())).await;
    assert_eq!(kept.body, large.as_bytes());
    // A chat body over the limit is routed by its model too.
    let large_chat = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":{:?}}}]}}"#,
        text("chat", 20_000)
    );
    for _ in 0..4 {
        let answer = post(&gateway, "/v1/chat/completions", large_chat.clone()).await;
        assert_eq!(answer.engine_name(), "east-a");
    }
    // An unknown model on an unkeyed path: 404, nothing forwarded.
    let answer = post(
        &gateway,
        "/v1/embeddings",
        r#"{"model":"nope","input":"x"}"#,
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.error_code(), "model_not_found");
    assert!(answer.headers.get("x-mock-engine").is_none());
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_502_and_stops_taking_requests() {
    let east = engine("east-a").await;
    // A port that was free a moment ago: nothing listens there.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let yaml = priced_yaml(
        &[
            ("east", vec![cluster("east-a", &[&east])]),
            ("west", vec![cluster("west-a", &[])]),
        ],
        "",
    )
    .replace("endpoints: [] }", &format!("endpoints: [{dead}] }}"));
    let gateway = Gateway::start(parse(&yaml)).await.unwrap();
    let west = cluster_id(&gateway, "west-a");
    eventually("east measured", || async {
        queue_depth(&gateway, "east-a").is_finite()
    })
    .await;
    // West is unmeasured, so it loses to east until it is the only candidate: drain east.
    let view = gateway.grid().view();
    assert!(view.cluster(&west).unwrap().admits());
    drop(view);
    let drained = yaml.replace(
        "name: east-a, models: [demo-model], admit: true",
        "name: east-a, models: [demo-model], admit: false",
    );
    gateway.reload(&parse(&drained)).unwrap();
    let answer = post(&gateway, "/v1/chat/completions", chat("hello")).await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert_eq!(answer.error_code(), "backend_unreachable");
    assert!(answer.text().contains("west/west-a"));
    let view = gateway.grid().view();
    assert!(!view.cluster(&west).unwrap().admits());
    // Nothing admits now: the next request is a 503, not another failed connection.
    let answer = post(&gateway, "/v1/chat/completions", chat("again")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
}

// ---- roles, models, admin -----------------------------------------------------------

#[tokio::test]
async fn the_provider_role_forwards_only_its_allowed_paths() {
    let east = engine("east-a").await;
    let yaml = priced_yaml(
        &[("east", vec![cluster("east-a", &[&east])])],
        "role: provider\n",
    );
    let gateway = measured_gateway(&yaml).await;
    let allowed = post(&gateway, "/v1/chat/completions", chat("hi")).await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(allowed.engine_name(), "east-a");
    let models = get(format!("{}/v1/models", gateway.url())).await;
    assert_eq!(models.status, StatusCode::OK);

    for path in [
        "/v1/responses/resp_abc",
        "/v1/conversations",
        "/v1/responses",
    ] {
        let refused = post(&gateway, path, "{}").await;
        assert_eq!(refused.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(refused.error_code(), "not_found");
        assert!(refused.headers.get("x-mock-engine").is_none());
    }
    let url = format!("{}/v1/chat/completions", gateway.url());
    let refused = send_with(Method::DELETE, &url, &[], Bytes::new()).await;
    assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused.headers["allow"], "GET, POST");
    assert_eq!(refused.error_code(), "method_not_allowed");
    // The path is exact: no prefix matching.
    let refused = post(&gateway, "/v1/chat/completions/x", "{}").await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn models_are_the_union_over_the_admitted_clusters() {
    let a = engine_serving("east-a", &["alpha", "beta"]).await;
    let b = engine_serving("west-a", &["beta", "gamma"]).await;
    let c = engine_serving("west-b", &["delta"]).await;
    let yaml = priced_yaml(
        &[
            (
                "east",
                vec![cluster("east-a", &[&a]).serving(&["alpha", "beta"])],
            ),
            (
                "west",
                vec![
                    cluster("west-a", &[&b]).serving(&["beta", "gamma"]),
                    cluster("west-b", &[&c]).serving(&["delta"]).drained(),
                ],
            ),
        ],
        "",
    );
    let gateway = measured_gateway(&yaml).await;
    let answer = get(format!("{}/v1/models", gateway.url())).await;
    assert_eq!(answer.status, StatusCode::OK);
    let list = answer.json();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            m["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(ids, ["alpha", "beta", "gamma"]);
}

/// The sum of the samples of `series` on the admin port; 0 when absent.
async fn scraped(gateway: &Gateway, series: &str) -> u64 {
    let text = get(format!("{}/metrics", gateway.admin_url())).await.text();
    scraped_from(&text, series)
}

/// The sum of the samples of `series` (a name, and the labels they carry) in a scrape; 0
/// when absent.
fn scraped_from(text: &str, series: &str) -> u64 {
    prometheus::series(text, series).map_or(0, |value| value as u64)
}

#[tokio::test]
async fn the_engines_prompt_and_cached_tokens_are_counted_per_cluster() {
    // A site of its own: no other test of this binary counts under its labels.
    let engine = engine("usage-a").await;
    let yaml = priced_yaml(&[("usage", vec![cluster("usage-a", &[&engine])])], "");
    let gateway = measured_gateway(&yaml).await;
    let mut conversation = Conversation::new("usage", 9 * 1024);
    assert_eq!(
        conversation.turn(&gateway.url(), "hello").await.status,
        StatusCode::OK
    );
    // A streamed follow-up reports its usage in the last chunk before [DONE].
    let mut streamed: Value = serde_json::from_slice(&conversation.ask("again")).unwrap();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let answer = post(&gateway, "/v1/chat/completions", streamed.to_string()).await;
    assert!(answer.text().ends_with("data: [DONE]\n\n"));
    let system = text("usage", 9 * 1024);
    let anthropic = json!({"model": MODEL, "max_tokens": 8, "stream": true, "system": system,
        "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(
        post(&gateway, "/v1/messages", anthropic.to_string())
            .await
            .status,
        StatusCode::OK
    );
    let responses = json!({"model": MODEL, "instructions": system, "input": "hello",
        "store": true});
    let made = post(&gateway, "/v1/responses", responses.to_string()).await;
    assert_eq!(made.status, StatusCode::OK);
    // Read back, the stored response carries the usage of the request that made it, which
    // is not counted twice.
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let stored = get(format!("{}/v1/responses/{id}", gateway.url())).await;
    assert_eq!(stored.status, StatusCode::OK);
    assert!(stored.json()["usage"]["input_tokens"].as_u64().unwrap() > 0);

    // Every answer's usage was read once, whatever its API and framing: the counters hold
    // what the engine itself tallied.
    let stats = engine.stats();
    let labels = r#"{site="usage",cluster="usage-a"}"#;
    let prompt = scraped(&gateway, &format!("grid_route_prompt_tokens_total{labels}")).await;
    let cached = scraped(
        &gateway,
        &format!("grid_route_cached_prompt_tokens_total{labels}"),
    )
    .await;
    assert_eq!((prompt, cached), (stats.prompt_tokens, stats.cached_tokens));
    assert!(cached > 0 && cached < prompt, "{cached} of {prompt}");
}

#[tokio::test]
async fn an_engine_that_evicted_a_conversation_makes_the_index_forget_what_came_before_it() {
    // Sites of their own: no other test of this binary counts under their labels.
    let (east, west, gateway) = two_sites_named("evict-east", "evict-west").await;
    let counters = |home: String| {
        let gateway = &gateway;
        async move {
            let labels = format!(r#"{{site="{}",cluster="{home}"}}"#, &home[..home.len() - 2]);
            let predicted = format!("grid_route_predicted_cached_tokens_total{labels}");
            let delivered = format!("grid_route_delivered_cached_tokens_total{labels}");
            (
                scraped(gateway, &predicted).await,
                scraped(gateway, &delivered).await,
            )
        }
    };
    // An older conversation, then (a second later: the index keeps time to the second) a
    // newer one on the same engine.
    let mut older = Conversation::new("older", 12 * 1024);
    let home = older.turn(&gateway.url(), "hello").await.engine_name();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut newer = None;
    for attempt in 0..30 {
        let mut conversation = Conversation::new(&format!("newer {attempt}"), 12 * 1024);
        if conversation
            .turn(&gateway.url(), "hello")
            .await
            .engine_name()
            == home
        {
            newer = Some(conversation);
            break;
        }
    }
    let mut newer = newer.expect("a first turn by load lands on either engine");
    assert_eq!(
        newer.turn(&gateway.url(), "and then?").await.engine_name(),
        home
    );
    // A sticky turn the engine served from cache: predicted and delivered agree.
    eventually("the sticky turn counted", || async {
        counters(home.clone()).await.0 > 0
    })
    .await;
    let seen = counters(home.clone()).await;
    assert!(seen.1 * 2 >= seen.0, "delivered {} of {}", seen.1, seen.0);

    // The engine loses its cache; the index still predicts both conversations there.
    let engine = if home == east.name() { &east } else { &west };
    let reset = send_with(
        Method::POST,
        &format!("{}/mock/reset", engine.url()),
        &[],
        "",
    )
    .await;
    assert_eq!(reset.status, StatusCode::OK);
    let entries_before = entries(&gateway, &home);
    let answer = newer.turn(&gateway.url(), "still there?").await;
    assert_eq!(answer.engine_name(), home, "the index still predicted it");
    assert_eq!(
        answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    // It reported nothing cached: the index forgot what it had recorded there before the
    // newer conversation (the older one), and kept the newer one, which the engine has
    // just prefilled again.
    let forgotten = format!(
        r#"grid_route_index_forgotten_total{{site="{}",cluster="{home}"}}"#,
        &home[..home.len() - 2]
    );
    eventually("the index forgot the older conversation", || async {
        scraped(&gateway, &forgotten).await > 0
    })
    .await;
    assert!(entries(&gateway, &home) < entries_before);
    let after_eviction = counters(home.clone()).await;
    assert!(after_eviction.0 > seen.0, "the evicted turn was predicted");
    assert_eq!(after_eviction.1, seen.1, "and nothing of it delivered");

    // The newer conversation stays sticky, and the engine holds it again.
    let answer = newer.turn(&gateway.url(), "once more").await;
    assert_eq!(answer.engine_name(), home);
    assert!(
        answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    eventually("the sticky turn after the eviction counted", || async {
        counters(home.clone()).await.0 > after_eviction.0
    })
    .await;
    // The older one is no longer predicted anywhere: its turn adds nothing to home's
    // prediction, wherever it goes.
    let before_older = counters(home.clone()).await;
    assert_eq!(
        older.turn(&gateway.url(), "and you?").await.status,
        StatusCode::OK
    );
    // Usage is counted when the gateway drops the answer's body, just after the client
    // read its end: give a (wrong) count the time to land before looking.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(counters(home.clone()).await.0, before_older.0);
}

/// An engine that stops counting cached tokens behind the same URL (restarted without
/// vLLM's `--enable-prompt-tokens-details`, say) would, read as reporting 0, make every
/// sticky answer look evicted for good. After `SILENT_PREDICTED_ANSWERS` sticky answers in a
/// row without a count the gateway takes its cluster's count for unknown and stops weighing
/// its answers, until one counts again.
#[tokio::test]
async fn an_engine_that_stops_counting_cached_tokens_stops_being_weighed() {
    use grid_route_layer::feedback::SILENT_PREDICTED_ANSWERS;
    // Sites of their own: no other test of this binary counts under their labels.
    let (east, west, gateway) = two_sites_named("mute-east", "mute-west").await;
    let mut conversation = Conversation::new("muted", 12 * 1024);
    let home = conversation
        .turn(&gateway.url(), "hello")
        .await
        .engine_name();
    let predicted = format!(
        r#"grid_route_predicted_cached_tokens_total{{site="{}",cluster="{home}"}}"#,
        &home[..home.len() - 2]
    );
    let engine = if home == east.name() { &east } else { &west };
    assert_eq!(
        conversation
            .turn(&gateway.url(), "and then?")
            .await
            .engine_name(),
        home
    );
    eventually("the sticky turn weighed", || async {
        scraped(&gateway, &predicted).await > 0
    })
    .await;

    engine.count_cached_tokens(CachedTokens::Never);
    // Until the limit each silent sticky answer is weighed as a reported 0.
    for turn in 1..SILENT_PREDICTED_ANSWERS {
        let before = scraped(&gateway, &predicted).await;
        let answer = conversation
            .turn(&gateway.url(), &format!("silent {turn}"))
            .await;
        assert_eq!(answer.engine_name(), home, "still sticky");
        assert!(answer.json()["usage"]["prompt_tokens_details"].is_null());
        eventually("the silent answer weighed", || async {
            scraped(&gateway, &predicted).await > before
        })
        .await;
    }
    // The limit's answer and those after it are not.
    let stopped = scraped(&gateway, &predicted).await;
    for turn in 0..3 {
        let answer = conversation
            .turn(&gateway.url(), &format!("unweighed {turn}"))
            .await;
        assert_eq!(answer.engine_name(), home, "still sticky");
        // Usage is counted when the gateway drops the answer's body, just after the client
        // read its end: give a (wrong) weighing the time to land before looking.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(scraped(&gateway, &predicted).await, stopped, "turn {turn}");
    }
    // The engine counts again: its answers are weighed again.
    engine.count_cached_tokens(CachedTokens::Always);
    let answer = conversation.turn(&gateway.url(), "counted").await;
    assert_eq!(answer.engine_name(), home);
    assert!(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    eventually("the counted answer weighed", || async {
        scraped(&gateway, &predicted).await > stopped
    })
    .await;
}

/// The value of the gauge `series` on the admin port, when present.
async fn scraped_gauge(gateway: &Gateway, series: &str) -> Option<f64> {
    let text = get(format!("{}/metrics", gateway.admin_url())).await.text();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

/// The per-cluster metric `name` of `(site, cluster)` on `gateway`'s `/metrics`: `None`
/// until its first count.
async fn cluster_metric(
    gateway: &Gateway,
    name: &str,
    (site, cluster): (&str, &str),
) -> Option<f64> {
    let series = format!(r#"{name}{{site="{site}",cluster="{cluster}"}}"#);
    scraped_gauge(gateway, &series).await
}

#[tokio::test]
async fn with_an_auto_price_the_gateway_learns_the_engines_prefill_speed() {
    // An engine that prefills 40,000 tokens a second, four times the prior.
    let config = MockEngineConfig {
        prefill_tokens_per_second: 40_000,
        decode_delay_per_token: Duration::ZERO,
        ..MockEngineConfig::named("prefill-a")
    };
    let engine = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let yaml = priced_yaml(
        &[("prefill", vec![cluster("prefill-a", &[&engine])])],
        // The prefill speed learned alone (a fixed queued price): its moving average.
        "grid_site_route: { prefix_affinity: { exploration: 0.0, \
         prefill_tokens_per_second: auto, prefill_prior_tokens_per_second: 10000, \
         queued_request_seconds: 2 } }\n",
    );
    let gateway = measured_gateway(&yaml).await;
    let series = r#"grid_route_prefill_tokens_per_second{site="prefill",cluster="prefill-a"}"#;
    let ask = |i: usize| {
        let gateway = &gateway;
        async move {
            // Distinct prompts: nothing cached, ~6,000 tokens to prefill, ~0.15 s.
            let body = chat(&text(&format!("prefill {i}"), 24 * 1024));
            assert_eq!(
                post(gateway, "/v1/chat/completions", body).await.status,
                StatusCode::OK
            );
        }
    };
    ask(0).await;
    eventually("the first sample", || async {
        scraped_gauge(&gateway, series).await.is_some()
    })
    .await;
    let first = scraped_gauge(&gateway, series).await.unwrap();
    // One answer moves the estimate a fifth of the way from the prior.
    assert!((10_000.0..17_000.0).contains(&first), "{first}");
    for i in 1..30 {
        ask(i).await;
    }
    eventually("the estimate converges", || async {
        scraped_gauge(&gateway, series).await.unwrap() > 30_000.0
    })
    .await;
    let learned = scraped_gauge(&gateway, series).await.unwrap();
    // Time to the answer includes the gateway and the network, never less: the estimate
    // stays at or under the engine's speed.
    assert!(learned <= 40_500.0, "{learned}");
    let view = gateway.grid().view();
    let id = view.clusters()[0].id().clone();
    assert!((gateway.affinity().prefill_rate(&id) - learned).abs() < 1.0);
}

#[tokio::test]
async fn the_admin_port_serves_every_metric_with_help_text_and_health() {
    let (_east, _west, gateway) = two_sites().await;
    // The recorder is process-wide and registers some series at zero up front, so a series
    // being there proves nothing: this test's traffic must move the counters between two
    // scrapes (other tests only ever add to them).
    let before = get(format!("{}/metrics", gateway.admin_url())).await.text();
    let mut conversation = Conversation::new("metrics", 9 * 1024);
    conversation.turn(&gateway.url(), "hello").await;
    conversation.turn(&gateway.url(), "again").await;
    let first = post(&gateway, "/v1/responses", responses_body("hello", None)).await;
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let chained = post(&gateway, "/v1/responses", responses_body("more", Some(&id))).await;
    assert_eq!(chained.status, StatusCode::OK);
    let scrape = get(format!("{}/metrics", gateway.admin_url())).await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(
        scrape.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = scrape.text();
    for name in [
        "grid_route_prefix_affinity_total",
        "grid_route_pin_total",
        "grid_route_decisions_total",
        "grid_route_prompt_tokens_total",
        "grid_route_cached_prompt_tokens_total",
        "grid_route_predicted_cached_tokens_total",
        "grid_route_delivered_cached_tokens_total",
        "grid_route_keying_seconds",
        "grid_route_keys_per_request",
        "grid_route_index_entries",
        "grid_route_queue_depth",
        "grid_serving_config_reload_total",
        "grid_route_shared_index_events_total",
        "grid_route_shared_index_errors_total",
    ] {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} help:\n{text}"
        );
        assert!(
            text.contains(&format!("\n{name}")),
            "{name} sample:\n{text}"
        );
    }
    // Every per-cluster series names the cluster alike: by `site` and `cluster`.
    let index_lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("grid_route_index_entries{"))
        .collect();
    assert!(!index_lines.is_empty(), "{text}");
    for line in index_lines {
        assert!(
            line.contains("site=\"") && line.contains("cluster=\"") && !line.contains('/'),
            "{line}"
        );
    }
    // Counted by this test's requests (two chat turns, two responses): at least the
    // difference they make.
    let grew = |series: &str, by: f64| {
        let was = prometheus::series(&before, series).unwrap_or(0.0);
        let is = prometheus::series(&text, series).unwrap_or(0.0);
        assert!(is >= was + by, "{series}: {was} then {is}, not {by} more");
    };
    grew("grid_route_prefix_affinity_total", 2.0);
    grew("grid_route_decisions_total", 2.0);
    grew("grid_route_pin_total", 1.0);
    grew("grid_route_prompt_tokens_total", 4.0);
    grew("grid_route_cached_prompt_tokens_total", 1.0);
    grew("grid_route_keying_seconds_count", 2.0);
    grew("grid_route_keys_per_request_count", 2.0);
    assert!(
        scraped_from(
            &text,
            r#"grid_route_prefix_affinity_total{outcome="sticky"}"#
        ) > scraped_from(
            &before,
            r#"grid_route_prefix_affinity_total{outcome="sticky"}"#
        ),
        "the second turn stuck"
    );
    assert!(
        scraped_from(&text, r#"grid_route_pin_total{outcome="pinned"}"#)
            > scraped_from(&before, r#"grid_route_pin_total{outcome="pinned"}"#),
        "the chained response was pinned"
    );
    assert!(text.contains(r#"grid_route_queue_depth{site="east",cluster="east-a"}"#));
    for histogram in ["grid_route_keying_seconds", "grid_route_keys_per_request"] {
        assert!(
            text.contains(&format!("# TYPE {histogram} histogram")),
            "{histogram} type:\n{text}"
        );
        assert!(
            text.contains(&format!("{histogram}_bucket{{le=\"")),
            "{histogram} buckets:\n{text}"
        );
    }
    assert!(text.contains(r#"grid_route_keys_per_request_bucket{le="512"}"#));
    assert!(text.contains(r#"grid_route_keying_seconds_bucket{le="0.00001"}"#));

    let health = get(format!("{}/healthz", gateway.admin_url())).await;
    assert_eq!(health.status, StatusCode::OK);
    let health = health.json();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["clusters"], 2);
    assert_eq!(health["admitted"], 2);
}

#[tokio::test]
async fn shutdown_lets_a_stream_in_flight_finish() {
    let config = MockEngineConfig {
        decode_delay_per_token: Duration::from_millis(30),
        ..MockEngineConfig::named("east-a")
    };
    let east = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let yaml = priced_yaml(&[("east", vec![cluster("east-a", &[&east])])], "");
    let gateway = measured_gateway(&yaml).await;
    let body = json!({
        "model": MODEL,
        "stream": true,
        "messages": [{"role": "user", "content": "one two three four five six"}],
    });
    let url = format!("{}/v1/chat/completions", gateway.url());
    let stream = tokio::spawn(async move { send(Method::POST, &url, body.to_string()).await });
    eventually("the stream started", || async {
        east.stats()
            .requests
            .contains_key("POST /v1/chat/completions")
    })
    .await;
    let addr = gateway.addr();
    gateway.shutdown().await.unwrap();
    let answer = stream.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.text().ends_with("data: [DONE]\n\n"));
    // Stopped: no new connection is accepted.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

// ---- pinning ------------------------------------------------------------------------

/// `resp_<site>.<digest>.<mac>.<id>`: the site and whether the mac is 16 hex digits.
fn tag_of(id: &str) -> (String, bool) {
    let tail = id.split_once('_').unwrap().1;
    let parts: Vec<&str> = tail.splitn(4, '.').collect();
    assert_eq!(parts.len(), 4, "not a tagged id: {id}");
    assert_eq!(parts[1].len(), 8, "digest of {id}");
    let mac = parts[2];
    assert!(mac.is_empty() || mac.len() == 16, "mac of {id}");
    (parts[0].to_owned(), !mac.is_empty())
}

/// The engine's id inside a tagged id.
fn untagged(id: &str) -> String {
    let (kind, tail) = id.split_once('_').unwrap();
    format!("{kind}_{}", tail.splitn(4, '.').nth(3).unwrap())
}

fn responses_body(input: &str, previous: Option<&str>) -> String {
    let mut body = json!({"model": MODEL, "input": input});
    if let Some(previous) = previous {
        body["previous_response_id"] = json!(previous);
    }
    body.to_string()
}

/// The contract's 503 for a cluster in the grid that admits nothing, reached the way the
/// soak met it: the cluster's only engine answered 429 with a `Retry-After`, which holds
/// it out; a follow-up stored there is answered 503 with `Retry-After: 5` by the gateway,
/// and no engine, in that cluster or another, sees it.
#[tokio::test]
async fn a_follow_up_pinned_to_a_cluster_a_429_holds_out_is_503_and_reaches_no_engine() {
    let (east, west, gateway) = two_sites().await;
    let mut stored_on_west = None;
    for i in 0..40 {
        let answer = post(
            &gateway,
            "/v1/responses",
            responses_body(&format!("hi {i}"), None),
        )
        .await;
        if answer.engine_name() == "west-a" {
            stored_on_west = Some(answer.json()["id"].as_str().unwrap().to_owned());
            break;
        }
    }
    let id = stored_on_west.expect("no response stored on west in 40 requests");
    let plan = r#"{"status":429,"count":1,"retry_after":60}"#;
    let fail = send(Method::POST, &format!("{}/mock/fail", west.url()), plan).await;
    assert_eq!(fail.status, StatusCode::OK);
    // The 429 itself reached west's engine: passed through, never retried elsewhere.
    let throttled = post(&gateway, "/v1/responses", responses_body("more", Some(&id))).await;
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(throttled.engine_name(), "west-a");

    let (east_before, west_before) = (engine_requests(&east), engine_requests(&west));
    let held_out = post(
        &gateway,
        "/v1/responses",
        responses_body("again", Some(&id)),
    )
    .await;
    assert_eq!(held_out.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(held_out.error_code(), "stored_state_unavailable");
    assert_eq!(held_out.headers["retry-after"], "5");
    assert!(held_out.headers.get("x-mock-engine").is_none());
    assert_eq!(engine_requests(&east), east_before);
    assert_eq!(engine_requests(&west), west_before);
}

#[tokio::test]
async fn a_stored_response_chain_stays_pinned_to_its_cluster() {
    let (east, west, gateway) = two_sites().await;
    let first = post(&gateway, "/v1/responses", responses_body("hello", None)).await;
    assert_eq!(first.status, StatusCode::OK);
    let home = first.engine_name();
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let (site, signed) = tag_of(&id);
    assert_eq!(site, home.trim_end_matches("-a"));
    assert!(!signed, "no tag key configured: empty mac");

    // However deep its queue, the chain goes where its state is.
    let busy = queue_at(&gateway, (&east, &west), &home, 50).await;
    let mut previous = id.clone();
    for turn in ["second", "third"] {
        let next = post(
            &gateway,
            "/v1/responses",
            responses_body(turn, Some(&previous)),
        )
        .await;
        assert_eq!(next.status, StatusCode::OK, "{}", next.text());
        assert_eq!(next.engine_name(), home);
        // The engine saw its own id, never the tag.
        let sent = get(format!("{}/mock/last_body", busy.url())).await.json();
        let engine_id = sent["previous_response_id"].as_str().unwrap();
        assert_eq!(engine_id, untagged(&previous));
        let json = next.json();
        assert_eq!(json["previous_response_id"], previous.as_str());
        previous = json["id"].as_str().unwrap().to_owned();
        assert_eq!(tag_of(&previous).0, site);
    }

    let fetched = get(format!("{}/v1/responses/{id}", gateway.url())).await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.engine_name(), home);
    assert_eq!(fetched.json()["id"], id.as_str());
}

#[tokio::test]
async fn a_new_conversation_lives_on_the_local_site() {
    let (_east, _west, gateway) = two_sites().await;
    // `local_site` defaults to the first site: east.
    for _ in 0..3 {
        let created = post(&gateway, "/v1/conversations", "{}").await;
        assert_eq!(created.status, StatusCode::OK, "{}", created.text());
        assert_eq!(created.engine_name(), "east-a");
        let id = created.json()["id"].as_str().unwrap().to_owned();
        assert_eq!(tag_of(&id).0, "east");
        let items = json!({"items": [{"type": "message", "role": "user", "content": "hi"}]});
        let added = post(
            &gateway,
            &format!("/v1/conversations/{id}/items"),
            items.to_string(),
        )
        .await;
        assert_eq!(added.status, StatusCode::OK, "{}", added.text());
        let listed = get(format!("{}/v1/conversations/{id}/items", gateway.url())).await;
        assert_eq!(listed.status, StatusCode::OK);
        assert_eq!(listed.engine_name(), "east-a");
    }
}

#[tokio::test]
async fn stored_ids_that_cannot_be_served_are_404_or_503() {
    let east = engine("east-a").await;
    let west = engine("west-a").await;
    let scratch = scratch_dir("pin-answers");
    let dir = scratch.path();
    let key = dir.join("tag.key");
    std::fs::write(&key, [42u8; 32]).unwrap();
    let affinity = format!(
        "grid_site_route: {{ prefix_affinity: {{ exploration: 0.0, tag_key_path: {} }} }}\n",
        key.display()
    );
    let sites = |west_admits: bool, with_west: bool| {
        let mut west_cluster = cluster("west-a", &[&west]);
        west_cluster.admit = west_admits;
        let mut sites = vec![("east", vec![cluster("east-a", &[&east])])];
        if with_west {
            sites.push(("west", vec![west_cluster]));
        }
        priced_yaml(&sites, &affinity)
    };
    let gateway = measured_gateway(&sites(true, true)).await;
    // A response stored on west.
    let id = loop {
        let answer = post(&gateway, "/v1/responses", responses_body("hi", None)).await;
        if answer.engine_name() == "west-a" {
            break answer.json()["id"].as_str().unwrap().to_owned();
        }
    };
    assert_eq!(tag_of(&id), ("west".to_owned(), true));
    let fetch = |id: String| get(format!("{}/v1/responses/{id}", gateway.url()));
    assert_eq!(fetch(id.clone()).await.status, StatusCode::OK);

    // Untagged, malformed or forged: 404, and no engine sees it.
    let engine_id = untagged(&id);
    let (head, tail) = id.rsplit_once('.').unwrap();
    let mac_start = head.len() - 16;
    let forged = format!("{}{}.{tail}", &head[..mac_start], "0".repeat(16));
    for bad in [engine_id, "resp_east.zz..x".to_owned(), forged] {
        let answer = fetch(bad.clone()).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{bad}");
        assert!(answer.json()["error"].is_object());
        assert!(answer.headers.get("x-mock-engine").is_none(), "{bad}");
    }

    // Drained: 503 with Retry-After; gone from the grid: 404.
    gateway.reload(&parse(&sites(false, true))).unwrap();
    let answer = fetch(id.clone()).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.headers["retry-after"], "5");
    gateway.reload(&parse(&sites(true, false))).unwrap();
    let answer = fetch(id.clone()).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    // Back again: the id still works.
    gateway.reload(&parse(&sites(true, true))).unwrap();
    wait_measured(&gateway).await;
    assert_eq!(fetch(id.clone()).await.engine_name(), "west-a");

    // A new key with the old one named as previous: old ids keep working.
    let next_key = dir.join("tag.next.key");
    std::fs::write(&next_key, [7u8; 40]).unwrap();
    let keyed = |previous: bool| {
        let keys = if previous {
            format!(
                "tag_key_path: {}, previous_tag_key_path: {}",
                next_key.display(),
                key.display()
            )
        } else {
            format!("tag_key_path: {}", next_key.display())
        };
        sites(true, true).replace(&format!("tag_key_path: {}", key.display()), &keys)
    };
    gateway.reload(&parse(&keyed(true))).unwrap();
    assert_eq!(fetch(id.clone()).await.status, StatusCode::OK);
    let fresh = post(&gateway, "/v1/responses", responses_body("again", None)).await;
    let fresh_id = fresh.json()["id"].as_str().unwrap().to_owned();
    assert_ne!(tag_of(&fresh_id).0, "", "{fresh_id}");
    assert_eq!(fetch(fresh_id.clone()).await.status, StatusCode::OK);
    // The old key named no longer: its ids are revoked at once (404 invalid_id, nothing
    // forwarded), the new key's keep working.
    gateway.reload(&parse(&keyed(false))).unwrap();
    let revoked = fetch(id.clone()).await;
    assert_eq!(revoked.status, StatusCode::NOT_FOUND);
    assert_eq!(revoked.json()["error"]["code"], "invalid_id");
    assert!(revoked.headers.get("x-mock-engine").is_none());
    assert_eq!(fetch(fresh_id).await.status, StatusCode::OK);
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test]
async fn compressed_bodies_are_decoded_keyed_pinned_and_forwarded_decoded() {
    let (east, west, gateway) = two_sites().await;
    let engines = |name: &str| {
        if name == "east-a" {
            east.url()
        } else {
            west.url()
        }
    };
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut conversation = Conversation::new("zipped", 9 * 1024);
    let mut home = None;
    for (i, question) in ["hello", "and then?", "why?", "thanks"].iter().enumerate() {
        let body = conversation.ask(question);
        let (encoding, encoded) = if i % 2 == 0 {
            ("gzip", gzip(&body))
        } else {
            ("deflate", zlib(&body))
        };
        let headers = [
            ("content-type", "application/json"),
            ("content-encoding", encoding),
        ];
        let answer = send_with(Method::POST, &url, &headers, encoded).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        let engine = answer.engine_name();
        // The engine got the decoded JSON, byte for byte.
        let kept = get(format!("{}/mock/last_body", engines(&engine))).await;
        assert_eq!(kept.body, body, "{encoding}");
        // Keyed after decoding: every turn stays where the first went.
        assert_eq!(engine, *home.get_or_insert(engine.clone()), "{question}");
        let reply = answer.json()["choices"][0]["message"]["content"].clone();
        conversation
            .messages
            .push(json!({"role": "assistant", "content": reply}));
    }

    // A tagged id in a gzip Responses body is pinned and untagged, never forwarded as is.
    let first = post(&gateway, "/v1/responses", responses_body("hello", None)).await;
    let stored_at = first.engine_name();
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let next = responses_body("again", Some(&id));
    let headers = [
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ];
    let url = format!("{}/v1/responses", gateway.url());
    let answer = send_with(Method::POST, &url, &headers, gzip(next.as_bytes())).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.engine_name(), stored_at);
    let sent = get(format!("{}/mock/last_body", engines(&stored_at)))
        .await
        .json();
    assert_eq!(sent["previous_response_id"], untagged(&id).as_str());

    // Mislabelled as text: still read, so the tag is checked and stripped.
    let answer = send_with(
        Method::POST,
        &url,
        &[("content-type", "text/plain")],
        next.clone(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.engine_name(), stored_at);
    let sent = get(format!("{}/mock/last_body", engines(&stored_at)))
        .await
        .json();
    assert_eq!(sent["previous_response_id"], untagged(&id).as_str());
}

#[tokio::test]
async fn a_zip_bomb_or_a_stored_state_body_over_the_limit_is_a_413() {
    let east = engine("east-a").await;
    let yaml = priced_yaml(
        &[("east", vec![cluster("east-a", &[&east])])],
        "max_body_bytes: 65536\n",
    );
    let gateway = measured_gateway(&yaml).await;
    let before = get(format!("{}/mock/stats", east.url())).await.json();
    // 64 MiB of zeros compress to about 64 KiB.
    let zeros = vec![b' '; 64 << 20];
    let mut bomb = br#"{"model":"demo-model","input":""#.to_vec();
    bomb.extend_from_slice(&zeros);
    bomb.extend_from_slice(br#""}"#);
    let bomb = gzip(&bomb);
    assert!(bomb.len() < 1 << 20);
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let url = format!("{}{path}", gateway.url());
        let headers = [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ];
        let answer = send_with(Method::POST, &url, &headers, bomb.clone()).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        assert_eq!(answer.error_code(), "request_too_large");
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("65536")
        );
    }
    // Uncompressed but over the limit on a stored-state path: 413 too.
    let large = responses_body(&text("large", 100_000), Some("resp_east.1ef772aa..abc"));
    let answer = post(&gateway, "/v1/responses", large).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.error_code(), "request_too_large");
    let after = get(format!("{}/mock/stats", east.url())).await.json();
    assert_eq!(posts(&before), posts(&after), "nothing forwarded");
}

/// `POST` requests an engine's `/mock/stats` counted (the gateway's queue polls are GETs).
fn posts(stats: &Value) -> u64 {
    stats["requests"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(route, _)| route.starts_with("POST "))
        .map(|(_, count)| count.as_u64().unwrap())
        .sum()
}

#[tokio::test]
async fn a_pinned_request_for_a_model_its_cluster_does_not_serve_is_a_404() {
    let east = engine_serving("east-a", &[MODEL, "other-model"]).await;
    let west = engine("west-a").await;
    let mut both = cluster("east-a", &[&east]);
    both = both.serving(&[MODEL, "other-model"]);
    let yaml = priced_yaml(
        &[
            ("east", vec![both]),
            ("west", vec![cluster("west-a", &[&west])]),
        ],
        "",
    );
    let gateway = measured_gateway(&yaml).await;
    let id = loop {
        let answer = post(&gateway, "/v1/responses", responses_body("hi", None)).await;
        if answer.engine_name() == "west-a" {
            break answer.json()["id"].as_str().unwrap().to_owned();
        }
    };
    let before = get(format!("{}/mock/stats", west.url())).await.json();
    let mut body: Value = serde_json::from_str(&responses_body("more", Some(&id))).unwrap();
    body["model"] = json!("other-model");
    let answer = post(&gateway, "/v1/responses", body.to_string()).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.error_code(), "model_not_found");
    assert!(answer.headers.get("x-mock-engine").is_none());
    let after = get(format!("{}/mock/stats", west.url())).await.json();
    assert_eq!(posts(&before), posts(&after), "nothing forwarded");
    // The model it does serve still goes through.
    let answer = post(&gateway, "/v1/responses", responses_body("more", Some(&id))).await;
    assert_eq!(answer.engine_name(), "west-a");
}

#[tokio::test]
async fn ids_in_a_streamed_response_are_tagged_as_they_flow() {
    let config = MockEngineConfig {
        prefill_tokens_per_second: 50_000_000,
        decode_delay_per_token: Duration::from_millis(40),
        ..MockEngineConfig::named("east-a")
    };
    let east = MockEngine::start("127.0.0.1:0", config).await.unwrap();
    let yaml = priced_yaml(&[("east", vec![cluster("east-a", &[&east])])], "");
    let gateway = measured_gateway(&yaml).await;
    let body = json!({"model": MODEL, "stream": true, "input": "one two three four five six"});
    let answer = post(&gateway, "/v1/responses", body.to_string()).await;
    assert_eq!(answer.status, StatusCode::OK);
    let text = answer.text();
    let mut ids = BTreeSet::new();
    for data in answer.event_data() {
        let event: Value = serde_json::from_str(&data).unwrap();
        if let Some(id) = event["response"]["id"].as_str() {
            ids.insert(id.to_owned());
        }
    }
    assert_eq!(ids.len(), 1, "{text}");
    let id = ids.into_iter().next().unwrap();
    assert_eq!(tag_of(&id).0, "east");
    let spread = answer
        .frame_times
        .last()
        .unwrap()
        .saturating_sub(answer.frame_times[0]);
    assert!(
        spread >= Duration::from_millis(150),
        "frames within {spread:?}"
    );
    // The stored response is found through its tagged id.
    let fetched = get(format!("{}/v1/responses/{id}", gateway.url())).await;
    assert_eq!(fetched.status, StatusCode::OK);
}
