//! `POST /v1/messages`, in Anthropic's Messages shapes (as vLLM's Anthropic front end serves).
//!
//! Usage follows Anthropic's accounting: `input_tokens` counts the prompt tokens read from
//! outside the cache, `cache_read_input_tokens` those read from it, so their sum is the
//! prompt. Errors use Anthropic's error format. A stream is the event sequence
//! `message_start`, `content_block_start`, `ping`, `content_block_delta`...,
//! `content_block_stop`, `message_delta`, `message_stop`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::engine::{Engine, PromptUsage};
use super::error::ApiError;
use super::prompt::render_messages;
use super::request::{Generation, parse_object};
use super::sse::{Gone, SseSender, sse_response};

fn usage(prompt: PromptUsage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": prompt.prompt_tokens - prompt.cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": prompt.cached_tokens,
    })
}

fn stop_reason(generation: &Generation) -> &'static str {
    if generation.cut {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let prepared = parse_object(&body).and_then(|body| {
        let prompt = render_messages(&body)?;
        Generation::prepare(&engine, &body, prompt, &["max_tokens"])
    });
    let generation = prepared.map_err(ApiError::anthropic)?;
    let id = engine.new_id("msg_");
    if generation.stream {
        return Ok(sse_response(move |events| {
            stream(engine, generation, id, events)
        }));
    }
    let running = engine
        .prefill(&generation.job)
        .await
        .map_err(ApiError::anthropic)?;
    for _ in &generation.tokens {
        engine.decode_token().await;
    }
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": generation.job.model,
        "content": [{"type": "text", "text": generation.text()}],
        "stop_reason": stop_reason(&generation),
        "stop_sequence": null,
        "usage": usage(running.usage, generation.completion_tokens()),
    }))
    .into_response())
}

async fn stream(
    engine: Arc<Engine>,
    generation: Generation,
    id: String,
    events: SseSender,
) -> Result<(), Gone> {
    let running = match events.until_gone(engine.prefill(&generation.job)).await? {
        Ok(running) => running,
        Err(error) => return events.event("error", &error.anthropic().body()).await,
    };
    let start = json!({
        "type": "message_start",
        "message": {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": generation.job.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(running.usage, 1),
        },
    });
    events.event("message_start", &start).await?;
    let block_start = json!({"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}});
    events.event("content_block_start", &block_start).await?;
    events.event("ping", &json!({"type": "ping"})).await?;
    for token in &generation.tokens {
        engine.decode_token().await;
        let delta = json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": token}});
        events.event("content_block_delta", &delta).await?;
    }
    let block_stop = json!({"type": "content_block_stop", "index": 0});
    events.event("content_block_stop", &block_stop).await?;
    let message_delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(&generation), "stop_sequence": null},
        "usage": {"output_tokens": generation.completion_tokens()},
    });
    events.event("message_delta", &message_delta).await?;
    events
        .event("message_stop", &json!({"type": "message_stop"}))
        .await
}
