//! Mock engines: fast ones, named after their cluster, so an answer's `x-mock-engine`
//! header says where a request went.

use std::time::Duration;

use grid_route_mock_engine::{MockEngine, MockEngineConfig};
use hyper::{Method, StatusCode};

use super::http::send;

/// The model every test engine serves unless told otherwise.
pub const MODEL: &str = "demo-model";
/// The sites of a two-site test, each with one cluster `<site>-a` of one engine of that
/// name.
pub const SITES: [&str; 2] = ["east", "west"];

/// A fast mock engine (prefill in microseconds, no decode delay) named `name` serving
/// `models`.
pub async fn engine_serving(name: &str, models: &[&str]) -> MockEngine {
    let config = MockEngineConfig {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        prefill_tokens_per_second: 50_000_000,
        decode_delay_per_token: Duration::ZERO,
        ..MockEngineConfig::named(name)
    };
    MockEngine::start("127.0.0.1:0", config).await.unwrap()
}

/// A fast mock engine named `name` serving [`MODEL`].
pub async fn engine(name: &str) -> MockEngine {
    engine_serving(name, &[MODEL]).await
}

/// Makes `engine` report `waiting` requests in its queue metric, exactly.
pub async fn set_queue(engine: &MockEngine, waiting: u64) {
    let url = format!("{}/mock/queue", engine.url());
    let body = format!(r#"{{"waiting":{waiting},"exact":true}}"#);
    assert_eq!(send(Method::POST, &url, body).await.status, StatusCode::OK);
}

/// Requests `engine` counted, over every route but the queue poller's `/metrics`.
pub fn engine_requests(engine: &MockEngine) -> u64 {
    engine
        .stats()
        .requests
        .iter()
        .filter(|(route, _)| route.as_str() != "GET /metrics")
        .map(|(_, count)| count)
        .sum()
}

/// A one-message Chat Completions body for [`MODEL`]; `content` is JSON-escaped.
pub fn chat(content: &str) -> String {
    serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
        .to_string()
}

/// Of the two engines of a two-site test, `east-a` and `west-a`, the one `engine` is not.
pub fn other(engine: &str) -> &'static str {
    if engine == "east-a" {
        "west-a"
    } else {
        "east-a"
    }
}

/// The site of a two-site test's engine: `east` for `east-a`, else `west`.
pub fn site_of(engine: &str) -> &'static str {
    if engine == "east-a" { "east" } else { "west" }
}
