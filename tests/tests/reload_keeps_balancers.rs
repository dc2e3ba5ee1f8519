//! A reload rebuilds only the clusters whose endpoints changed: the others keep their p2c
//! balancer, and with it the requests pending on each endpoint.
//!
//! The observable is p2c itself. Cluster `east-a` has two engines: `east-a-stalled`
//! (its answers' heads never come) and `east-a-fast`. Once one request waits on the
//! stalled engine, a balancer that remembers it sends every later request to the fast
//! one (p2c over two endpoints always compares both, and the stalled one has a request
//! pending); a balancer built afresh knows no pending request and sends half of them to
//! the stalled engine.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_example::config::GatewayConfig;
use grid_route_example::gateway::Gateway;
use grid_route_mock_engine::MockEngine;
use grid_route_tests::{HttpClient, REQUEST_DEADLINE, client, engine_serving};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use tokio::task::JoinHandle;

const CHAT: &str = "POST /v1/chat/completions";
/// Requests sent after a reload that must all avoid the stalled engine: a rebuilt
/// balancer would pass all of them with probability 2^-20.
const AFTER_RELOAD: usize = 20;
/// Requests sent until one reaches the stalled engine (each does with probability 1/2
/// from a balancer that knows no pending request).
const UNTIL_STALLED: usize = 64;

fn two_cluster_config(east: &[&MockEngine], west: &MockEngine) -> GatewayConfig {
    let urls = |engines: &[&MockEngine]| {
        engines
            .iter()
            .map(|e| e.url())
            .collect::<Vec<_>>()
            .join(", ")
    };
    GatewayConfig::from_yaml(&format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n\
         queue: {{ poll_interval_ms: 50 }}\n\
         sites:\n  - name: east\n    clusters:\n\
         \x20     - {{ name: east-a, models: [demo-model], endpoints: [{}] }}\n\
         \x20     - {{ name: east-b, models: [other-model], endpoints: [{}] }}\n",
        urls(east),
        west.url()
    ))
    .unwrap()
}

/// Sends a streamed chat request for `model`; resolves to the answering engine's name
/// once the whole answer is read.
fn streamed_chat(
    client: &HttpClient,
    gateway: &Gateway,
    model: &str,
    n: usize,
) -> JoinHandle<String> {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"request {n}"}}]}}"#
    );
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let client = client.clone();
    tokio::spawn(async move {
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let engine = response.headers()["x-mock-engine"]
            .to_str()
            .unwrap()
            .to_owned();
        response.into_body().collect().await.unwrap();
        engine
    })
}

fn chats_reaching(engine: &MockEngine) -> u64 {
    engine.stats().requests.get(CHAT).copied().unwrap_or(0)
}

/// Where a request went: answered by the named engine, or held by the stalled one.
enum Landed {
    Answered(String),
    Stalled(JoinHandle<String>),
}

/// Sends request `n` and waits until it is answered or reaches `stalled`.
async fn send_until_landed(
    client: &HttpClient,
    gateway: &Gateway,
    stalled: &MockEngine,
    n: usize,
) -> Landed {
    let before = chats_reaching(stalled);
    let mut request = streamed_chat(client, gateway, "demo-model", n);
    let deadline = Instant::now() + REQUEST_DEADLINE;
    loop {
        tokio::select! {
            answered = &mut request => return Landed::Answered(answered.unwrap()),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if chats_reaching(stalled) > before {
            return Landed::Stalled(request);
        }
        assert!(Instant::now() < deadline, "request {n} went nowhere");
    }
}

/// Sends requests until one waits on `stalled`; every other one must come from `fast`.
async fn stall_one(
    client: &HttpClient,
    gateway: &Gateway,
    stalled: &MockEngine,
    fast: &MockEngine,
    first: usize,
) -> JoinHandle<String> {
    for n in first..first + UNTIL_STALLED {
        match send_until_landed(client, gateway, stalled, n).await {
            Landed::Stalled(request) => return request,
            Landed::Answered(engine) => assert_eq!(engine, fast.name()),
        }
    }
    panic!("none of {UNTIL_STALLED} requests reached the stalled engine");
}

#[tokio::test]
async fn a_reload_that_leaves_a_cluster_alone_keeps_its_balancer_and_rebuilds_the_changed_one() {
    let stalled = engine_serving("east-a-stalled", &["demo-model"]).await;
    stalled.stall(Duration::from_secs(3600), Duration::ZERO);
    let fast = engine_serving("east-a-fast", &["demo-model"]).await;
    let replacement = engine_serving("east-a-replacement", &["demo-model"]).await;
    let west = engine_serving("east-b-first", &["other-model"]).await;
    let west_moved = engine_serving("east-b-second", &["other-model"]).await;
    let gateway = Gateway::start(two_cluster_config(&[&stalled, &fast], &west))
        .await
        .unwrap();
    let client = client();
    let east_a = |gateway: &Gateway| {
        let view = gateway.grid().view();
        view.clusters()
            .iter()
            .find(|c| c.id().name() == "east-a")
            .unwrap()
            .clone()
    };

    // One streamed request waits on the stalled engine for its answer's head.
    let held = stall_one(&client, &gateway, &stalled, &fast, 0).await;
    assert_eq!(east_a(&gateway).load().in_flight(), 1);

    // A reload that changes only east-b (its engine moves).
    gateway
        .reload(&two_cluster_config(&[&stalled, &fast], &west_moved))
        .unwrap();
    assert_eq!(
        east_a(&gateway).load().in_flight(),
        1,
        "the held request no longer counts in flight on east-a"
    );
    for n in 100..100 + AFTER_RELOAD {
        match send_until_landed(&client, &gateway, &stalled, n).await {
            Landed::Answered(engine) => assert_eq!(engine, fast.name()),
            Landed::Stalled(_) => panic!(
                "request {n} went to the engine a request is pending on: the reload rebuilt \
                 east-a's balancer although its endpoints did not change"
            ),
        }
    }
    // East-b's change applied.
    let other = streamed_chat(&client, &gateway, "other-model", 200)
        .await
        .unwrap();
    assert_eq!(other, west_moved.name());
    assert_eq!(chats_reaching(&west), 0);

    // A reload that changes east-a's endpoints builds it a new balancer: it knows no
    // pending request, so requests reach the stalled engine again.
    gateway
        .reload(&two_cluster_config(&[&stalled, &replacement], &west_moved))
        .unwrap();
    let held_again = stall_one(&client, &gateway, &stalled, &replacement, 300).await;
    assert_eq!(chats_reaching(&stalled), 2);

    // The held requests' clients give up; the gateway drops them and stops at once.
    held.abort();
    held_again.abort();
    let _ = held.await;
    let _ = held_again.await;
    gateway.shutdown_within(REQUEST_DEADLINE).await.unwrap();
}
