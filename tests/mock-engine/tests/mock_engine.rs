//! The mock engine over real sockets, driven by a plain hyper client.

// The helpers below are test code too: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use grid_route_mock_engine::sse::{SseStream, read_events};
use grid_route_mock_engine::{MockEngine, MockEngineConfig};
use grid_route_tests::{Answer, client, send};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

/// The server-sent events of `answer`'s stream: (event name or "", data).
fn named_events(answer: &Answer) -> Vec<(String, String)> {
    read_events(&answer.body)
        .unwrap()
        .into_iter()
        .map(|event| {
            (
                event.event.unwrap_or_default(),
                event.data.unwrap_or_default(),
            )
        })
        .collect()
}

/// The JSON data of `answer`'s server-sent events, `[DONE]` left out.
fn json_data(answer: &Answer) -> Vec<Value> {
    answer
        .event_data()
        .into_iter()
        .filter(|data| data != "[DONE]")
        .map(|data| serde_json::from_str(&data).unwrap())
        .collect()
}

/// Sends a request to `engine`; returns the answer and the time from sending to its first
/// body frame.
async fn timed(
    engine: &MockEngine,
    method: Method,
    path: &str,
    body: impl Into<Bytes>,
) -> (Answer, Duration) {
    let started = Instant::now();
    let answer = send(method, &format!("{}{path}", engine.url()), body).await;
    let first = answer
        .frame_times
        .first()
        .copied()
        .unwrap_or_else(|| started.elapsed());
    (answer, first)
}

/// Sends a request to `engine`'s `path`.
async fn call(engine: &MockEngine, method: Method, path: &str, body: impl Into<Bytes>) -> Answer {
    timed(engine, method, path, body).await.0
}

async fn post_to(engine: &MockEngine, path: &str, body: &Value) -> Answer {
    call(engine, Method::POST, path, body.to_string()).await
}

async fn get_from(engine: &MockEngine, path: &str) -> Answer {
    call(engine, Method::GET, path, Bytes::new()).await
}

async fn delete(engine: &MockEngine, path: &str) -> Answer {
    call(engine, Method::DELETE, path, Bytes::new()).await
}

async fn start(config: MockEngineConfig) -> MockEngine {
    MockEngine::start("127.0.0.1:0", config).await.unwrap()
}

async fn start_named(name: &str) -> MockEngine {
    start(MockEngineConfig::named(name)).await
}

fn chat_value(text: &str) -> Value {
    json!({"model": "demo-model", "messages": [{"role": "user", "content": text}]})
}

/// The reported waiting count of `demo-model` on `/metrics`.
async fn reported_waiting(engine: &MockEngine) -> u64 {
    engine_metric(engine, "vllm:num_requests_waiting").await
}

async fn engine_metric(engine: &MockEngine, name: &str) -> u64 {
    let text = get_from(engine, "/metrics").await.text();
    let prefix = format!("{name}{{model_name=\"demo-model\"}} ");
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.parse().unwrap()
}

#[tokio::test]
async fn a_chat_completion_is_in_openai_shape_and_names_the_engine() {
    let engine = start_named("east-a").await;
    let answer = post_to(&engine, "/v1/chat/completions", &chat_value("hello there")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["x-mock-engine"], "east-a");
    let body = answer.json();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "demo-model");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "[east-a] hello there"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let usage = &body["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(usage["completion_tokens"], 3);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn a_chat_stream_sends_deltas_then_usage_then_done() {
    let engine = start_named("east-a").await;
    let mut body = chat_value("one two three");
    body["stream"] = true.into();
    body["stream_options"] = json!({"include_usage": true});
    let answer = post_to(&engine, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    assert_eq!(named_events(&answer).last().unwrap().1, "[DONE]");
    let chunks = json_data(&answer);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "[east-a] one two three");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 4);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_chat_stream_carries_usage_only_when_asked() {
    let engine = start_named("east-a").await;
    let mut body = chat_value("one two");
    body["stream"] = true.into();
    let answer = post_to(&engine, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(named_events(&answer).last().unwrap().1, "[DONE]");
    let chunks = json_data(&answer);
    // An empty stream would carry no usage either: the reply must be there, usage not.
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "[east-a] one two");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn completions_answer_text_completions_streamed_or_not() {
    let engine = start_named("west-b").await;
    let body = json!({"model": "demo-model", "prompt": "say this", "max_tokens": 2});
    let answer = post_to(&engine, "/v1/completions", &body).await.json();
    assert!(answer["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["choices"][0]["text"], "[west-b] say");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["prompt_tokens"], 2);

    let mut body = body;
    body["stream"] = true.into();
    let answer = post_to(&engine, "/v1/completions", &body).await;
    let text: String = json_data(&answer)
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "[west-b] say");
    assert_eq!(named_events(&answer).last().unwrap().1, "[DONE]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_is_cached_and_reaches_its_first_token_sooner() {
    // 40 KiB of prompt at 40,000 tokens/s: about 256 ms of prefill the first time, about
    // 2 ms (one block) the second.
    let engine = start(MockEngineConfig {
        prefill_tokens_per_second: 40_000,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let long = "token ".repeat(40 * 1024 / 6);
    let mut body = chat_value(&long);
    body["stream"] = true.into();
    body["stream_options"] = json!({"include_usage": true});
    let body = body.to_string();

    let (first, first_ttft) =
        timed(&engine, Method::POST, "/v1/chat/completions", body.clone()).await;
    let (second, second_ttft) = timed(&engine, Method::POST, "/v1/chat/completions", body).await;

    let usage = |answer: &Answer| json_data(answer).last().unwrap()["usage"].clone();
    assert_eq!(usage(&first)["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = usage(&second)["prompt_tokens"].as_u64().unwrap();
    let cached = usage(&second)["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached < prompt_tokens,
        "{cached} of {prompt_tokens}"
    );
    assert!(
        prompt_tokens - cached <= 128,
        "all but the last block or two are cached"
    );
    assert!(first_ttft >= Duration::from_millis(250), "{first_ttft:?}");
    assert!(
        second_ttft * 3 <= first_ttft
            && first_ttft.saturating_sub(second_ttft) >= Duration::from_millis(50),
        "first {first_ttft:?}, second {second_ttft:?}"
    );
    let stats = engine.stats();
    assert_eq!(stats.cached_tokens, cached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_prefill_and_decode_rates_answer_at_once() {
    // scripts/load-check measures the gateway against engines that take no time. A 4 MiB
    // prompt is a million tokens: 52 s of prefill at the default rate, 3 s even at 350,000
    // tokens a second.
    let engine = start(MockEngineConfig {
        prefill_tokens_per_second: 0,
        decode_delay_per_token: Duration::ZERO,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let body = chat_value(&"z".repeat(4 << 20)).to_string();
    let started = Instant::now();
    let answer = call(&engine, Method::POST, "/v1/chat/completions", body).await;
    let elapsed = started.elapsed();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(
        answer.json()["usage"]["prompt_tokens"].as_u64().unwrap() >= 1 << 20,
        "the whole prompt was counted"
    );
    // Far below the 52 s the default rate would take, and far above what an unoptimised
    // build on a loaded 2-core machine needs to read and count 4 MiB.
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
}

#[tokio::test]
async fn models_and_cache_salts_do_not_share_cached_blocks() {
    let engine = start(MockEngineConfig {
        models: vec!["demo-model".into(), "other-model".into()],
        prefill_tokens_per_second: 0,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let long = "x".repeat(4096);
    let cached =
        |answer: Answer| answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    let mut body = chat_value(&long);
    post_to(&engine, "/v1/chat/completions", &body).await;
    body["model"] = "other-model".into();
    assert_eq!(
        cached(post_to(&engine, "/v1/chat/completions", &body).await),
        0
    );
    body["cache_salt"] = "tenant-1".into();
    assert_eq!(
        cached(post_to(&engine, "/v1/chat/completions", &body).await),
        0
    );
    assert!(
        cached(post_to(&engine, "/v1/chat/completions", &body).await)
            .as_u64()
            .unwrap()
            > 0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_max_running_wait_and_show_in_the_queue_metric() {
    // Each prompt is about 500 tokens: half a second of prefill at 1000 tokens/s.
    let engine = start(MockEngineConfig {
        max_running: 1,
        prefill_tokens_per_second: 1000,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let url = engine.url();
    let requests: Vec<_> = (0..3)
        .map(|i| {
            let body = chat_value(&format!("{i} {}", "y".repeat(2000))).to_string();
            let url = url.clone();
            tokio::spawn(async move {
                let request = Request::post(format!("{url}/v1/chat/completions"))
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                client().request(request).await.unwrap().status()
            })
        })
        .collect();

    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = (0, 0);
    while Instant::now() < deadline {
        seen = (
            reported_waiting(&engine).await,
            engine_metric(&engine, "vllm:num_requests_running").await,
        );
        if seen.0 == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, (2, 1), "(waiting, running) while all three are in");
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(reported_waiting(&engine).await, 0);
    assert_eq!(engine_metric(&engine, "vllm:num_requests_running").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_stops_counting_as_waiting() {
    // The first request holds the only running slot for about 20 s (2000 bytes at
    // 100 tokens/s); the test ends long before.
    let engine = start(MockEngineConfig {
        max_running: 1,
        prefill_tokens_per_second: 100,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let url = engine.url();
    let send_for = |body: Value, patience: Duration| {
        let url = url.clone();
        tokio::spawn(async move {
            let request = Request::post(format!("{url}/v1/chat/completions"))
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            let _ = tokio::time::timeout(patience, async {
                let response = client().request(request).await.unwrap();
                response.into_body().collect().await.map(|_| ())
            })
            .await;
        })
    };
    let holder = send_for(chat_value(&"h".repeat(2000)), Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine_metric(&engine, "vllm:num_requests_running").await == 0
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut streaming = chat_value("second");
    streaming["stream"] = true.into();
    let quitters = [
        send_for(chat_value("first"), Duration::from_millis(300)),
        send_for(streaming, Duration::from_millis(300)),
    ];
    let mut waiting = Vec::new();
    while Instant::now() < deadline {
        let now = reported_waiting(&engine).await;
        if waiting.last() != Some(&now) {
            waiting.push(now);
        }
        if now == 0 && waiting.contains(&2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting.contains(&2), "both quitters waited: {waiting:?}");
    assert_eq!(
        waiting.last(),
        Some(&0),
        "and stopped waiting when they left: {waiting:?}"
    );
    assert_eq!(engine_metric(&engine, "vllm:num_requests_running").await, 1);
    for quitter in quitters {
        quitter.await.unwrap();
    }
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flushes_each_event_and_a_client_that_leaves_frees_its_running_slot() {
    // Seven reply tokens 2 s apart: the whole stream would take 14 s.
    let decode_delay = Duration::from_secs(2);
    let engine = start(MockEngineConfig {
        decode_delay_per_token: decode_delay,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let mut body = chat_value("one two three four five six");
    body["stream"] = true.into();
    let request = Request::post(format!("{}/v1/chat/completions", engine.url()))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let sent = Instant::now();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = SseStream::new(response.into_body());
    let first = events.next().await.unwrap().unwrap();
    let first: Value = serde_json::from_str(first.data.as_deref().unwrap()).unwrap();
    // The role chunk arrives on its own, before the first token is decoded: the body is
    // not held back until the stream ends.
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(engine_metric(&engine, "vllm:num_requests_running").await, 1);

    drop(events);
    let full_stream = sent + decode_delay * 7;
    while engine_metric(&engine, "vllm:num_requests_running").await != 0 {
        assert!(
            Instant::now() < full_stream,
            "the abandoned stream kept its running slot to the end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_queue_override_shows_in_the_metrics() {
    let engine = start_named("east-a").await;
    let metrics = get_from(&engine, "/metrics").await;
    assert!(
        metrics
            .text()
            .contains("# TYPE vllm:num_requests_waiting gauge")
    );
    assert!(metrics.text().contains("# HELP vllm:num_requests_waiting "));
    assert_eq!(reported_waiting(&engine).await, 0);

    let answer = post_to(&engine, "/mock/queue", &json!({"waiting": 7})).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(reported_waiting(&engine).await, 7);
    post_to(
        &engine,
        "/mock/queue",
        &json!({"waiting": 3, "exact": true}),
    )
    .await;
    assert_eq!(reported_waiting(&engine).await, 3);
    post_to(&engine, "/mock/queue", &json!({"waiting": 0})).await;
    assert_eq!(reported_waiting(&engine).await, 0);

    let refused = post_to(&engine, "/mock/queue", &json!({"waiting": -1})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_metrics_knob_makes_the_queue_unreadable_until_cleared() {
    let engine = start_named("east-a").await;
    let knob = post_to(&engine, "/mock/metrics", &json!({"fail": true})).await;
    assert_eq!(knob.status, StatusCode::OK);
    let failed = get_from(&engine, "/metrics").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!failed.text().contains("vllm:num_requests_waiting"));
    // Generation is not affected.
    let answer = post_to(&engine, "/v1/chat/completions", &chat_value("hi")).await;
    assert_eq!(answer.status, StatusCode::OK);
    post_to(&engine, "/mock/metrics", &json!({"fail": false})).await;
    assert_eq!(get_from(&engine, "/metrics").await.status, StatusCode::OK);
    engine.fail_metrics(true);
    assert_eq!(
        get_from(&engine, "/metrics").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    engine.reset();
    assert_eq!(get_from(&engine, "/metrics").await.status, StatusCode::OK);
    let refused = post_to(&engine, "/mock/metrics", &json!({"fail": 1})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_fail_knob_fails_the_next_requests_then_recovers() {
    let engine = start_named("east-a").await;
    let knob = json!({"status": 503, "count": 2, "retry_after": 1});
    assert_eq!(
        post_to(&engine, "/mock/fail", &knob).await.status,
        StatusCode::OK
    );

    // Endpoints that do not generate are not affected.
    assert_eq!(get_from(&engine, "/v1/models").await.status, StatusCode::OK);
    for _ in 0..2 {
        let failed = post_to(&engine, "/v1/chat/completions", &chat_value("hi")).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(failed.headers["retry-after"], "1");
        assert_eq!(failed.headers["x-mock-engine"], "east-a");
        let error = &failed.json()["error"];
        assert_eq!(error["type"], "server_error");
        assert!(error["message"].as_str().unwrap().contains("injected"));
    }
    let recovered = post_to(&engine, "/v1/chat/completions", &chat_value("hi")).await;
    assert_eq!(recovered.status, StatusCode::OK);
    assert_eq!(engine.stats().injected_failures, 2);

    post_to(&engine, "/mock/fail", &json!({"status": 429})).await;
    let body = json!({"model": "demo-model", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]});
    let failed = post_to(&engine, "/v1/messages", &body).await;
    assert_eq!(failed.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(failed.json()["type"], "error");
    assert_eq!(failed.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        post_to(&engine, "/v1/messages", &body).await.status,
        StatusCode::OK
    );

    let refused = post_to(&engine, "/mock/fail", &json!({"status": 200})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bad_requests_are_400s_with_error_bodies_never_panics() {
    let engine = start_named("east-a").await;
    for (path, body) in [
        ("/v1/chat/completions", "{not json"),
        ("/v1/chat/completions", "[1, 2]"),
        ("/v1/chat/completions", r#"{"messages": "nope"}"#),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"content": "no role"}]}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [], "max_tokens": -3}"#,
        ),
        ("/v1/completions", r#"{"prompt": {"a": 1}}"#),
        ("/v1/completions", r#"{"prompt": [99999999999]}"#),
        ("/v1/responses", r#"{"model": "demo-model"}"#),
        ("/v1/responses", r#"{"input": 7}"#),
        (
            "/v1/responses",
            r#"{"input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"}"#,
        ),
        ("/v1/conversations", r#"{"items": 3}"#),
        ("/mock/fail", "{}"),
    ] {
        let answer = call(&engine, Method::POST, path, body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path} {body}");
        assert_eq!(
            answer.json()["error"]["type"],
            "invalid_request_error",
            "{path} {body}"
        );
    }
    let answer = call(&engine, Method::POST, "/v1/messages", "{oops").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(answer.json()["type"], "error");

    let answer = get_from(&engine, "/no/such/path").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(answer.json()["error"]["message"].is_string());
}

#[tokio::test]
async fn models_lists_the_served_models_and_others_are_404() {
    let engine = start(MockEngineConfig {
        models: vec!["a".into(), "b".into()],
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let models = get_from(&engine, "/v1/models").await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);

    let mut body = chat_value("hi");
    body["model"] = "c".into();
    let answer = post_to(&engine, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.json()["error"]["code"], "model_not_found");
    body.as_object_mut().unwrap().remove("model");
    let answer = post_to(&engine, "/v1/chat/completions", &body).await;
    assert_eq!(
        answer.json()["model"],
        "a",
        "a request naming no model gets the first"
    );
}

#[tokio::test]
async fn anthropic_messages_answer_with_cache_reads_and_stream_the_event_sequence() {
    let engine = start_named("east-a").await;
    let long = "z ".repeat(1024);
    let body = json!({"model": "demo-model", "max_tokens": 64, "system": "be brief",
                      "messages": [{"role": "user", "content": [{"type": "text", "text": long}]}]});
    let first = post_to(&engine, "/v1/messages", &body).await.json();
    assert!(first["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(first["type"], "message");
    assert_eq!(first["content"][0]["type"], "text");
    assert_eq!(first["stop_reason"], "end_turn");
    assert_eq!(first["usage"]["cache_read_input_tokens"], 0);
    let again = post_to(&engine, "/v1/messages", &body).await.json();
    let cache_read = again["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cache_read > 0);
    assert_eq!(
        again["usage"]["input_tokens"].as_u64().unwrap() + cache_read,
        first["usage"]["input_tokens"].as_u64().unwrap(),
        "input_tokens counts only what was not read from the cache"
    );

    let mut body = body;
    body["stream"] = true.into();
    let answer = post_to(&engine, "/v1/messages", &body).await;
    let names: Vec<String> = named_events(&answer)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 7]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let data = json_data(&answer);
    for (name, event) in names.iter().zip(&data) {
        assert_eq!(&event["type"], name.as_str());
    }
    assert!(
        data[0]["message"]["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(data[names.len() - 2]["delta"]["stop_reason"], "end_turn");
}

#[tokio::test]
async fn responses_are_stored_retrievable_and_deletable() {
    let engine = start_named("east-a").await;
    let created = post_to(
        &engine,
        "/v1/responses",
        &json!({"model": "demo-model", "input": "hello"}),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK);
    let created = created.json();
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id[5..].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "completed");
    assert!(
        created["output"][0]["id"]
            .as_str()
            .unwrap()
            .starts_with("msg_")
    );
    assert_eq!(created["output"][0]["content"][0]["text"], "[east-a] hello");
    assert_eq!(created["usage"]["input_tokens_details"]["cached_tokens"], 0);
    // Required by OpenAI's schema (and the SDKs' types), though the mock counts no writes.
    assert_eq!(
        created["usage"]["input_tokens_details"]["cache_write_tokens"],
        0
    );
    assert!(created.get("conversation").is_none());

    assert_eq!(
        get_from(&engine, &format!("/v1/responses/{id}"))
            .await
            .json(),
        created
    );
    let items = get_from(&engine, &format!("/v1/responses/{id}/input_items"))
        .await
        .json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(items["data"][0]["content"][0]["text"], "hello");
    assert_eq!(items["data"][0]["status"], "completed");

    let deleted = delete(&engine, &format!("/v1/responses/{id}")).await.json();
    assert_eq!(deleted["deleted"], true);
    for path in [
        format!("/v1/responses/{id}"),
        format!("/v1/responses/{id}/input_items"),
    ] {
        let answer = get_from(&engine, &path).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    }
    assert_eq!(
        delete(&engine, &format!("/v1/responses/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_response_with_store_false_is_not_kept() {
    let engine = start_named("east-a").await;
    let created = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "hello", "store": false}),
    )
    .await
    .json();
    let answer = get_from(
        &engine,
        &format!("/v1/responses/{}", created["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn previous_response_id_chains_turns_and_reuses_their_cached_prefix() {
    let engine = start_named("east-a").await;
    let long = "a long shared context ".repeat(100);
    let first = post_to(&engine, "/v1/responses", &json!({"input": long}))
        .await
        .json();
    let first_id = first["id"].as_str().unwrap();
    let second = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "and then?", "previous_response_id": first_id}),
    )
    .await
    .json();
    assert_eq!(second["previous_response_id"], first_id);
    assert_ne!(second["id"], first["id"]);
    let usage = &second["usage"];
    assert!(
        usage["input_tokens"].as_u64().unwrap() > first["usage"]["input_tokens"].as_u64().unwrap()
    );
    assert!(
        usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let items = get_from(
        &engine,
        &format!(
            "/v1/responses/{}/input_items",
            second["id"].as_str().unwrap()
        ),
    )
    .await
    .json();
    assert_eq!(
        items["data"].as_array().unwrap().len(),
        1,
        "only the new turn's input"
    );
}

#[tokio::test]
async fn an_unknown_previous_response_id_is_a_404_with_its_code() {
    let engine = start_named("east-a").await;
    let answer = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "hi", "previous_response_id": "resp_0123abcd"}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"], "previous_response_id");
    assert_eq!(error["code"], "previous_response_not_found");
    assert!(error["message"].as_str().unwrap().contains("resp_0123abcd"));
}

#[tokio::test]
async fn responses_stream_their_events_in_order_with_sequence_numbers() {
    let engine = start_named("east-a").await;
    let answer = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "one two", "stream": true}),
    )
    .await;
    let names: Vec<String> = named_events(&answer)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(["response.output_text.delta"; 3]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    let data = json_data(&answer);
    for (n, (name, event)) in names.iter().zip(&data).enumerate() {
        assert_eq!(&event["type"], name.as_str());
        assert_eq!(event["sequence_number"], n);
    }
    let completed = &data.last().unwrap()["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(data[0]["response"]["id"], completed["id"]);
    let stored = get_from(
        &engine,
        &format!("/v1/responses/{}", completed["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(&stored.json(), completed);
}

#[tokio::test]
async fn conversations_hold_items_and_responses_append_their_turns() {
    let engine = start_named("east-a").await;
    let created = post_to(
        &engine,
        "/v1/conversations",
        &json!({"items": [{"type": "message", "role": "user", "content": "first"}],
                "metadata": {"topic": "demo"}}),
    )
    .await
    .json();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("conv_"));
    assert_eq!(created["object"], "conversation");
    assert_eq!(created["metadata"]["topic"], "demo");
    assert_eq!(
        get_from(&engine, &format!("/v1/conversations/{id}"))
            .await
            .json(),
        created
    );

    let added = post_to(
        &engine,
        &format!("/v1/conversations/{id}/items"),
        &json!({"items": [{"role": "assistant", "content": "second"}]}),
    )
    .await
    .json();
    let added_id = added["data"][0]["id"].as_str().unwrap().to_owned();
    let item = get_from(&engine, &format!("/v1/conversations/{id}/items/{added_id}"))
        .await
        .json();
    assert_eq!(item["content"][0]["text"], "second");

    let response = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "third", "conversation": id}),
    )
    .await
    .json();
    assert_eq!(response["conversation"], json!({"id": id}));
    let items = get_from(&engine, &format!("/v1/conversations/{id}/items?order=asc"))
        .await
        .json();
    let texts: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["first", "second", "third", "[east-a] third"]);
    // Stored items are finished, each with a status, as OpenAI lists them.
    assert!(
        items["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|item| item["status"] == "completed"),
        "{items}"
    );
    let newest = get_from(&engine, &format!("/v1/conversations/{id}/items?limit=1"))
        .await
        .json();
    assert_eq!(newest["data"][0]["content"][0]["text"], "[east-a] third");
    assert_eq!(newest["has_more"], true);

    let after_delete = delete(&engine, &format!("/v1/conversations/{id}/items/{added_id}")).await;
    assert_eq!(after_delete.json()["id"], id.as_str());
    let gone = get_from(&engine, &format!("/v1/conversations/{id}/items/{added_id}")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);

    let deleted = delete(&engine, &format!("/v1/conversations/{id}"))
        .await
        .json();
    assert_eq!(deleted["deleted"], true);
    assert_eq!(
        get_from(&engine, &format!("/v1/conversations/{id}"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn unknown_conversations_are_404s() {
    let engine = start_named("east-a").await;
    for answer in [
        get_from(&engine, "/v1/conversations/conv_nope").await,
        get_from(&engine, "/v1/conversations/conv_nope/items").await,
        get_from(&engine, "/v1/conversations/conv_nope/items/msg_x").await,
        delete(&engine, "/v1/conversations/conv_nope").await,
        post_to(
            &engine,
            "/v1/conversations/conv_nope/items",
            &json!({"items": []}),
        )
        .await,
        post_to(
            &engine,
            "/v1/responses",
            &json!({"input": "hi", "conversation": {"id": "conv_nope"}}),
        )
        .await,
    ] {
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("conv_nope")
        );
    }
}

#[tokio::test]
async fn a_background_response_can_be_cancelled_and_a_synchronous_one_cannot() {
    let engine = start(MockEngineConfig {
        prefill_tokens_per_second: 10,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let queued = post_to(
        &engine,
        "/v1/responses",
        &json!({"input": "a prompt that takes seconds to prefill", "background": true}),
    )
    .await
    .json();
    assert_eq!(queued["status"], "queued");
    let id = queued["id"].as_str().unwrap();
    let cancelled = post_to(&engine, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK);
    assert_eq!(cancelled.json()["status"], "cancelled");
    assert_eq!(
        get_from(&engine, &format!("/v1/responses/{id}"))
            .await
            .json()["status"],
        "cancelled"
    );

    let quick = start_named("east-b").await;
    let done = post_to(&quick, "/v1/responses", &json!({"input": "hi"}))
        .await
        .json();
    let refused = post_to(
        &quick,
        &format!("/v1/responses/{}/cancel", done["id"].as_str().unwrap()),
        &json!({}),
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn last_body_returns_the_exact_bytes_received() {
    let engine = start_named("east-a").await;
    assert_eq!(
        get_from(&engine, "/mock/last_body").await.status,
        StatusCode::NOT_FOUND
    );
    let first = r#"{"model":"demo-model","prompt":"x"}"#;
    let second =
        "{ \"messages\" : [ {\"content\":\"caf\\u00e9 \\/ \u{1F600}\", \"role\":\"user\"} ] }\n";
    call(&engine, Method::POST, "/v1/completions", first).await;
    assert_eq!(
        call(&engine, Method::POST, "/v1/chat/completions", second)
            .await
            .status,
        StatusCode::OK
    );

    let last = get_from(&engine, "/mock/last_body").await;
    assert_eq!(last.body, second.as_bytes());
    assert_eq!(last.headers["x-mock-path"], "/v1/chat/completions");
    let before = get_from(&engine, "/mock/last_body?back=1").await;
    assert_eq!(before.body, first.as_bytes());
    assert_eq!(before.headers["x-mock-path"], "/v1/completions");

    let stats = get_from(&engine, "/mock/stats").await.json();
    assert_eq!(stats["last_body"]["len"], second.len());
    assert_eq!(stats["requests"]["POST /v1/chat/completions"], 1);
    assert_eq!(stats["requests"]["POST /v1/completions"], 1);
}

#[tokio::test]
async fn reset_forgets_the_cache_the_stores_and_the_counters() {
    let engine = start_named("east-a").await;
    let body = chat_value(&"r".repeat(2048));
    post_to(&engine, "/v1/chat/completions", &body).await;
    let response = post_to(&engine, "/v1/responses", &json!({"input": "hi"}))
        .await
        .json();
    post_to(&engine, "/mock/queue", &json!({"waiting": 5})).await;

    assert_eq!(
        post_to(&engine, "/mock/reset", &json!({})).await.status,
        StatusCode::OK
    );
    assert_eq!(reported_waiting(&engine).await, 0);
    let path = format!("/v1/responses/{}", response["id"].as_str().unwrap());
    assert_eq!(get_from(&engine, &path).await.status, StatusCode::NOT_FOUND);
    let again = post_to(&engine, "/v1/chat/completions", &body).await.json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(engine.stats().requests.get("POST /v1/responses"), None);
}

#[tokio::test]
async fn a_stopped_engine_refuses_connections() {
    let engine = start_named("east-a").await;
    let addr = engine.local_addr();
    engine.shutdown().await.unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn the_stall_knob_delays_heads_and_tokens_until_cleared() {
    let engine = start(MockEngineConfig {
        decode_delay_per_token: Duration::ZERO,
        ..MockEngineConfig::named("east-a")
    })
    .await;
    let knob = post_to(&engine, "/mock/stall", &json!({"head_ms": 400})).await;
    assert_eq!(knob.status, StatusCode::OK);
    let started = Instant::now();
    let answer = post_to(&engine, "/v1/chat/completions", &chat_value("slow head")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(400));
    // Only generation stalls.
    let started = Instant::now();
    assert_eq!(get_from(&engine, "/v1/models").await.status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_millis(400));

    post_to(&engine, "/mock/stall", &json!({"token_ms": 100})).await;
    let streamed = json!({"model": "demo-model", "stream": true,
                          "messages": [{"role": "user", "content": "a b c"}]});
    let started = Instant::now();
    let (answer, first_frame) = timed(
        &engine,
        Method::POST,
        "/v1/chat/completions",
        streamed.to_string(),
    )
    .await;
    let whole = started.elapsed();
    assert_eq!(answer.status, StatusCode::OK);
    // The head and the role chunk come at once, then four tokens at 100 ms each.
    assert!(first_frame < Duration::from_millis(100), "{first_frame:?}");
    assert!(whole >= Duration::from_millis(400), "{whole:?}");

    post_to(&engine, "/mock/stall", &json!({})).await;
    let started = Instant::now();
    post_to(&engine, "/v1/chat/completions", &chat_value("fast again")).await;
    assert!(started.elapsed() < Duration::from_millis(300));
    let refused = post_to(&engine, "/mock/stall", &json!({"head_ms": -1})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}
