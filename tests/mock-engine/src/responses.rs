//! The OpenAI Responses API: `POST /v1/responses` and the stored-response endpoints.
//!
//! A response is stored unless the request says `"store": false`. A request continues stored
//! state with `previous_response_id` (the earlier response's context, input and output come
//! before the new input) or `conversation` (the conversation's items come first, and the
//! input and output are appended to it); naming an id the engine never stored is a 404, as in
//! vLLM and OpenAI. `"background": true` answers at once with a `queued` response that
//! `GET` follows and `POST .../cancel` can cancel. A stream is the event sequence
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed` (or
//! `response.incomplete` when cut by `max_output_tokens`), each with a `sequence_number`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::engine::{Engine, PromptUsage, lock};
use super::error::ApiError;
use super::prompt::render_responses;
use super::request::{Generation, parse_object};
use super::sse::{Gone, SseSender, sse_response};
use super::store::{ListQuery, StoredResponse, normalize_items};

/// Reads a path's id, answering a JSON 400 for a path axum cannot decode.
pub(crate) fn path_param<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(value)| value)
        .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
}

/// Reads a list request's query, answering a JSON 400 for a malformed one.
pub(crate) fn list_query(
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<ListQuery, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    ListQuery::parse(&query)
}

fn response_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found.")).code("response_not_found")
}

fn optional_string<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
) -> Result<Option<&'a str>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value)),
        Some(_) => Err(ApiError::bad_request(format!("`{field}` must be a string")).param(field)),
    }
}

/// The request's conversation id, given as a string or as `{"id": ...}`.
fn conversation_id(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match body.get("conversation") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(Value::Object(object)) => {
            match object.get("id") {
                Some(Value::String(id)) => Ok(Some(id.clone())),
                _ => Err(ApiError::bad_request("`conversation.id` must be a string")
                    .param("conversation")),
            }
        }
        Some(_) => Err(ApiError::bad_request(
            "`conversation` must be a string or an object with an `id`",
        )
        .param("conversation")),
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A response being generated: everything needed to write its object at each stage.
struct Draft {
    id: String,
    message_id: String,
    /// The response object's fields that do not change as it is generated.
    fields: Map<String, Value>,
    generation: Generation,
    context: Vec<Value>,
    input_items: Vec<Value>,
    conversation_id: Option<String>,
    store: bool,
}

impl Draft {
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<PromptUsage>) -> Value {
        let mut object = self.fields.clone();
        object.insert("status".into(), status.into());
        object.insert("output".into(), output.into());
        if let Some(prompt) = usage {
            let output_tokens = self.generation.completion_tokens();
            object.insert(
                "usage".into(),
                json!({
                    "input_tokens": prompt.prompt_tokens,
                    // OpenAI's schema requires `cache_write_tokens` (the SDKs' types mark it
                    // required); the mock counts no cache writes, as vLLM reports none.
                    "input_tokens_details": {
                        "cached_tokens": prompt.cached_tokens,
                        "cache_write_tokens": 0,
                    },
                    "output_tokens": output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": prompt.prompt_tokens + output_tokens,
                }),
            );
        }
        if status == "incomplete" {
            object.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
        }
        Value::Object(object)
    }

    fn final_status(&self) -> &'static str {
        if self.generation.cut {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn message(&self, status: &str, text: Option<&str>) -> Value {
        let content = text.map_or_else(Vec::new, |text| vec![text_part(text)]);
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    fn finished(&self, usage: PromptUsage) -> Value {
        let status = self.final_status();
        let text = self.generation.text();
        self.object(status, vec![self.message(status, Some(&text))], Some(usage))
    }

    /// Stores a new response (when it is to be stored).
    fn store_new(&self, engine: &Engine, object: Value) {
        if self.store {
            let stored = StoredResponse {
                object,
                input_items: self.input_items.clone(),
                context: self.context.clone(),
                task: None,
            };
            lock(&engine.store)
                .responses
                .insert(self.id.clone(), stored);
        }
    }

    /// Records the finished response: updates the stored one (unless it was cancelled or
    /// deleted meanwhile; a deleted response stays deleted) and appends the turn to its
    /// conversation.
    fn record_finished(&self, engine: &Engine, object: &Value) {
        let mut store = lock(&engine.store);
        if let Some(stored) = store.responses.get_mut(&self.id)
            && stored.object.get("status").and_then(Value::as_str) != Some("cancelled")
        {
            stored.object = object.clone();
            stored.task = None;
        }
        if let Some(conversation) = self
            .conversation_id
            .as_ref()
            .and_then(|id| store.conversations.get_mut(id))
        {
            let output = object.get("output").and_then(Value::as_array);
            conversation.items.extend(
                self.input_items
                    .iter()
                    .chain(output.into_iter().flatten())
                    .cloned(),
            );
        }
    }

    /// Sets the stored response's status while it is still in flight.
    fn set_stored_status(&self, engine: &Engine, status: &str) {
        if let Some(stored) = lock(&engine.store).responses.get_mut(&self.id) {
            let current = stored.object.get("status").and_then(Value::as_str);
            if matches!(current, Some("queued" | "in_progress")) {
                stored.object["status"] = status.into();
            }
        }
    }
}

/// The items a request continues from: the previous response's continuation, the
/// conversation's items, or none; 404 for an id the engine does not hold.
fn stored_context(
    engine: &Engine,
    previous_id: Option<&str>,
    conversation_id: Option<&str>,
) -> Result<Vec<Value>, ApiError> {
    let store = lock(&engine.store);
    if let Some(previous_id) = previous_id {
        let previous = store.responses.get(previous_id).ok_or_else(|| {
            ApiError::not_found(format!(
                "Previous response with id '{previous_id}' not found."
            ))
            .param("previous_response_id")
            .code("previous_response_not_found")
        })?;
        Ok(previous.continuation())
    } else if let Some(id) = conversation_id {
        let conversation = store.conversations.get(id).ok_or_else(|| {
            ApiError::not_found(format!("Conversation with id '{id}' not found."))
                .param("conversation")
                .code("conversation_not_found")
        })?;
        Ok(conversation.items.clone())
    } else {
        Ok(Vec::new())
    }
}

/// The fields of a new response object that echo its request.
fn response_fields(
    body: &Map<String, Value>,
    id: &str,
    generation: &Generation,
    conversation_id: Option<&str>,
) -> Map<String, Value> {
    let echo = |field: &str, default: Value| body.get(field).cloned().unwrap_or(default);
    let mut fields = Map::new();
    fields.insert("id".into(), id.into());
    fields.insert("object".into(), "response".into());
    fields.insert("created_at".into(), generation.created.into());
    for (field, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("metadata", json!({})),
        ("parallel_tool_calls", true.into()),
        ("previous_response_id", Value::Null),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("temperature", 1.0.into()),
        ("text", json!({"format": {"type": "text"}})),
        ("tool_choice", "auto".into()),
        ("tools", json!([])),
        ("top_p", 1.0.into()),
        ("truncation", "disabled".into()),
        ("user", Value::Null),
    ] {
        fields.insert(field.into(), echo(field, default));
    }
    fields.insert("model".into(), generation.job.model.clone().into());
    fields.insert("error".into(), Value::Null);
    fields.insert("incomplete_details".into(), Value::Null);
    fields.insert("service_tier".into(), "auto".into());
    fields.insert("usage".into(), Value::Null);
    if let Some(conversation_id) = conversation_id {
        fields.insert("conversation".into(), json!({"id": conversation_id}));
    }
    fields
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse_object(&body)?;
    let previous_id = optional_string(&body, "previous_response_id")?;
    let conversation_id = conversation_id(&body)?;
    if previous_id.is_some() && conversation_id.is_some() {
        return Err(ApiError::bad_request(
            "Mutually exclusive parameters: `previous_response_id` and `conversation` cannot both be set.",
        )
        .param("conversation"));
    }
    let input = body
        .get("input")
        .ok_or_else(|| ApiError::bad_request("`input` is required").param("input"))?;
    let input_items = normalize_items(&engine, input)?;
    let context = stored_context(&engine, previous_id, conversation_id.as_deref())?;
    let prompt = render_responses(&body, context.iter().chain(&input_items));
    let generation = Generation::prepare(&engine, &body, prompt, &["max_output_tokens"])?;
    let store = body.get("store").and_then(Value::as_bool).unwrap_or(true);
    let background = body
        .get("background")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if background && !store {
        return Err(ApiError::bad_request("background responses must be stored").param("store"));
    }
    if background && generation.stream {
        return Err(
            ApiError::bad_request("the mock engine does not stream background responses")
                .param("background"),
        );
    }
    let id = engine.new_id("resp_");
    let mut fields = response_fields(&body, &id, &generation, conversation_id.as_deref());
    fields.insert("store".into(), store.into());
    fields.insert("background".into(), background.into());
    let draft = Draft {
        message_id: engine.new_id("msg_"),
        id,
        fields,
        generation,
        context,
        input_items,
        conversation_id,
        store,
    };

    if draft.generation.stream {
        return Ok(sse_response(move |events| stream(engine, draft, events)));
    }
    if background {
        return Ok(Json(start_background(&engine, draft)).into_response());
    }
    let running = engine.prefill(&draft.generation.job).await?;
    for _ in &draft.generation.tokens {
        engine.decode_token().await;
    }
    let object = draft.finished(running.usage);
    draft.store_new(&engine, object.clone());
    draft.record_finished(&engine, &object);
    Ok(Json(object).into_response())
}

/// Stores a `queued` response and generates it in a task; returns the queued object.
fn start_background(engine: &Arc<Engine>, draft: Draft) -> Value {
    let queued = draft.object("queued", Vec::new(), None);
    let id = draft.id.clone();
    let input_items = draft.input_items.clone();
    let context = draft.context.clone();
    let task_engine = Arc::clone(engine);
    // The store stays locked until the task's handle is stored, so the task cannot finish
    // (and clear its handle) before the handle is there.
    let mut store = lock(&engine.store);
    let task = tokio::spawn(async move {
        let engine = task_engine;
        draft.set_stored_status(&engine, "in_progress");
        let object = match engine.prefill(&draft.generation.job).await {
            Ok(running) => {
                for _ in &draft.generation.tokens {
                    engine.decode_token().await;
                }
                draft.finished(running.usage)
            }
            Err(error) => {
                let mut failed = draft.object("failed", Vec::new(), None);
                failed["error"] = json!({"code": "server_error", "message": error.message()});
                failed
            }
        };
        draft.record_finished(&engine, &object);
    });
    store.responses.insert(
        id,
        StoredResponse {
            object: queued.clone(),
            input_items,
            context,
            task: Some(task.abort_handle()),
        },
    );
    queued
}

struct Sequenced<'a> {
    events: &'a SseSender,
    next: u64,
}

impl Sequenced<'_> {
    async fn emit(&mut self, kind: &str, mut payload: Value) -> Result<(), Gone> {
        payload["type"] = kind.into();
        payload["sequence_number"] = self.next.into();
        self.next += 1;
        self.events.event(kind, &payload).await
    }
}

async fn stream(engine: Arc<Engine>, draft: Draft, events: SseSender) -> Result<(), Gone> {
    let in_progress = draft.object("in_progress", Vec::new(), None);
    draft.store_new(&engine, in_progress.clone());
    let outcome = stream_events(&engine, &draft, &events, in_progress).await;
    if outcome.is_err() {
        draft.set_stored_status(&engine, "cancelled");
    }
    outcome
}

async fn stream_events(
    engine: &Engine,
    draft: &Draft,
    events: &SseSender,
    in_progress: Value,
) -> Result<(), Gone> {
    let mut out = Sequenced { events, next: 0 };
    out.emit("response.created", json!({"response": in_progress}))
        .await?;
    out.emit("response.in_progress", json!({"response": in_progress}))
        .await?;
    let running = match events
        .until_gone(engine.prefill(&draft.generation.job))
        .await?
    {
        Ok(running) => running,
        Err(error) => {
            let mut failed = draft.object("failed", Vec::new(), None);
            failed["error"] = json!({"code": "server_error", "message": error.message()});
            draft.record_finished(engine, &failed);
            return out
                .emit("response.failed", json!({"response": failed}))
                .await;
        }
    };
    let item = |status: &str, text: Option<&str>| draft.message(status, text);
    let at = |payload: Value| {
        let mut payload = payload;
        payload["item_id"] = draft.message_id.clone().into();
        payload["output_index"] = 0.into();
        payload["content_index"] = 0.into();
        payload
    };
    out.emit(
        "response.output_item.added",
        json!({"output_index": 0, "item": item("in_progress", None)}),
    )
    .await?;
    out.emit(
        "response.content_part.added",
        at(json!({"part": text_part("")})),
    )
    .await?;
    for token in &draft.generation.tokens {
        engine.decode_token().await;
        out.emit(
            "response.output_text.delta",
            at(json!({"delta": token, "logprobs": []})),
        )
        .await?;
    }
    let text = draft.generation.text();
    out.emit(
        "response.output_text.done",
        at(json!({"text": text, "logprobs": []})),
    )
    .await?;
    out.emit(
        "response.content_part.done",
        at(json!({"part": text_part(&text)})),
    )
    .await?;
    let status = draft.final_status();
    out.emit(
        "response.output_item.done",
        json!({"output_index": 0, "item": item(status, Some(&text))}),
    )
    .await?;
    let finished = draft.finished(running.usage);
    draft.record_finished(engine, &finished);
    out.emit(&format!("response.{status}"), json!({"response": finished}))
        .await
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn retrieve(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let store = lock(&engine.store);
    let stored = store
        .responses
        .get(&id)
        .ok_or_else(|| response_not_found(&id))?;
    Ok(Json(stored.object.clone()).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let removed = lock(&engine.store).responses.remove(&id);
    let removed = removed.ok_or_else(|| response_not_found(&id))?;
    if let Some(task) = removed.task {
        task.abort();
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}

/// `POST /v1/responses/{id}/cancel`: cancels a background response still queued or running.
pub(crate) async fn cancel(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let mut store = lock(&engine.store);
    let stored = store
        .responses
        .get_mut(&id)
        .ok_or_else(|| response_not_found(&id))?;
    let background = stored.object["background"].as_bool().unwrap_or(false);
    let status = stored.object["status"].as_str().unwrap_or("").to_owned();
    if !background {
        return Err(ApiError::bad_request(
            "Cannot cancel a synchronous response.",
        ));
    }
    match status.as_str() {
        "queued" | "in_progress" => {
            if let Some(task) = stored.task.take() {
                task.abort();
            }
            stored.object["status"] = "cancelled".into();
        }
        "cancelled" => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "Cannot cancel a response with status '{other}'."
            )));
        }
    }
    Ok(Json(stored.object.clone()).into_response())
}

/// `GET /v1/responses/{id}/input_items`: the response's input items (`limit`, `order`,
/// `after`; newest first by default).
pub(crate) async fn input_items(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let query = list_query(query)?;
    let store = lock(&engine.store);
    let stored = store
        .responses
        .get(&id)
        .ok_or_else(|| response_not_found(&id))?;
    Ok(Json(query.page(&stored.input_items)?).into_response())
}
