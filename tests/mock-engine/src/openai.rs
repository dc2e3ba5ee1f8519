//! `POST /v1/chat/completions` and `POST /v1/completions`, in OpenAI's (and vLLM's) shapes.
//!
//! Streams end with `data: [DONE]`. As in OpenAI's API, a stream carries usage only when the
//! request sets `stream_options.include_usage`: then every chunk has `"usage": null` and a
//! last chunk with empty `choices` holds the usage.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::CachedTokens;
use super::engine::{Engine, PromptUsage};
use super::error::ApiError;
use super::prompt::{render_chat, render_completion};
use super::request::{Generation, parse_object};
use super::sse::{Gone, SseSender, sse_response};

fn usage(engine: &Engine, prompt: PromptUsage, completion_tokens: u64) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt.prompt_tokens + completion_tokens,
    });
    let counted = match engine.cached_tokens() {
        CachedTokens::Always => true,
        CachedTokens::UnlessNone => prompt.cached_tokens > 0,
        CachedTokens::Never => false,
    };
    if counted {
        usage["prompt_tokens_details"] = json!({"cached_tokens": prompt.cached_tokens});
    }
    usage
}

fn finish_reason(generation: &Generation) -> &'static str {
    if generation.cut { "length" } else { "stop" }
}

fn include_usage(body: &serde_json::Map<String, Value>) -> bool {
    body.get("stream_options")
        .and_then(|options| options.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Which of the two APIs a stream speaks.
#[derive(Clone, Copy)]
enum Api {
    Chat,
    Completions,
}

impl Api {
    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }

    /// A choice carrying `text` (a delta when streaming).
    fn choice(self, text: Option<&str>, finish: Option<&str>, stream: bool) -> Value {
        match (self, stream) {
            (Api::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Api::Chat, true) => json!({
                "index": 0,
                "delta": text.map_or_else(|| json!({}), |text| json!({"content": text})),
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Api::Completions, _) => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
                "stop_reason": null,
            }),
        }
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse_object(&body)?;
    let prompt = render_chat(&body)?;
    let generation = Generation::prepare(
        &engine,
        &body,
        prompt,
        &["max_completion_tokens", "max_tokens"],
    )?;
    let id = engine.new_id("chatcmpl-");
    generate(engine, generation, id, Api::Chat, include_usage(&body)).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse_object(&body)?;
    let prompt = render_completion(&body)?;
    let generation = Generation::prepare(&engine, &body, prompt, &["max_tokens"])?;
    let id = engine.new_id("cmpl-");
    generate(
        engine,
        generation,
        id,
        Api::Completions,
        include_usage(&body),
    )
    .await
}

async fn generate(
    engine: Arc<Engine>,
    generation: Generation,
    id: String,
    api: Api,
    include_usage: bool,
) -> Result<Response, ApiError> {
    if generation.stream {
        return Ok(sse_response(move |events| {
            stream(engine, generation, id, api, include_usage, events)
        }));
    }
    let running = engine.prefill(&generation.job).await?;
    for _ in &generation.tokens {
        engine.decode_token().await;
    }
    let text = generation.text();
    Ok(Json(json!({
        "id": id,
        "object": api.object(false),
        "created": generation.created,
        "model": generation.job.model,
        "choices": [api.choice(Some(&text), Some(finish_reason(&generation)), false)],
        "usage": usage(&engine, running.usage, generation.completion_tokens()),
        "system_fingerprint": null,
    }))
    .into_response())
}

async fn stream(
    engine: Arc<Engine>,
    generation: Generation,
    id: String,
    api: Api,
    include_usage: bool,
    events: SseSender,
) -> Result<(), Gone> {
    let chunk = |choices: Vec<Value>| {
        let mut chunk = json!({
            "id": id,
            "object": api.object(true),
            "created": generation.created,
            "model": generation.job.model,
            "choices": choices,
        });
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    };
    let running = match events.until_gone(engine.prefill(&generation.job)).await? {
        Ok(running) => running,
        Err(error) => return events.data(&error.body()).await,
    };
    if let Api::Chat = api {
        let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                          "logprobs": null, "finish_reason": null});
        events.data(&chunk(vec![role])).await?;
    }
    for token in &generation.tokens {
        engine.decode_token().await;
        events
            .data(&chunk(vec![api.choice(Some(token), None, true)]))
            .await?;
    }
    let finish = api.choice(
        matches!(api, Api::Completions).then_some(""),
        Some(finish_reason(&generation)),
        true,
    );
    events.data(&chunk(vec![finish])).await?;
    if include_usage {
        let mut last = chunk(Vec::new());
        last["usage"] = usage(&engine, running.usage, generation.completion_tokens());
        events.data(&last).await?;
    }
    events.done().await
}
