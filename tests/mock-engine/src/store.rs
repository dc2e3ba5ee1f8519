//! The in-memory Responses and Conversations store, and the list pages both APIs answer.
//!
//! Like vLLM's, the store lives in the engine's memory and answers 404 for ids it never
//! stored (or deleted, or forgot on `POST /mock/reset`). It is unbounded: a mock engine lives
//! as long as a test or a demo.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use tokio::task::AbortHandle;

use super::engine::Engine;
use super::error::ApiError;

/// Items a list page holds when the client names no `limit`.
const DEFAULT_PAGE_ITEMS: usize = 20;
/// The most items a list page holds.
const MAX_PAGE_ITEMS: usize = 100;

/// A stored response.
#[derive(Debug)]
pub(crate) struct StoredResponse {
    /// The response object, as `GET /v1/responses/{id}` returns it.
    pub(crate) object: Value,
    /// The items of the request's `input`, with ids.
    pub(crate) input_items: Vec<Value>,
    /// The items of earlier turns that preceded the input (from `previous_response_id` or
    /// the conversation).
    pub(crate) context: Vec<Value>,
    /// The generation of a `background` response, while it runs.
    pub(crate) task: Option<AbortHandle>,
}

impl StoredResponse {
    /// The items a response continuing this one starts from: earlier turns, this input, this
    /// output.
    pub(crate) fn continuation(&self) -> Vec<Value> {
        let output = self.object.get("output").and_then(Value::as_array);
        self.context
            .iter()
            .chain(&self.input_items)
            .chain(output.into_iter().flatten())
            .cloned()
            .collect()
    }
}

/// A stored conversation.
#[derive(Debug)]
pub(crate) struct Conversation {
    pub(crate) id: String,
    pub(crate) created_at: u64,
    pub(crate) metadata: Value,
    pub(crate) items: Vec<Value>,
}

impl Conversation {
    pub(crate) fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        })
    }
}

/// Stored responses and conversations by id.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(crate) responses: HashMap<String, StoredResponse>,
    pub(crate) conversations: HashMap<String, Conversation>,
}

impl Store {
    pub(crate) fn clear(&mut self) {
        for response in self.responses.values() {
            if let Some(task) = &response.task {
                task.abort();
            }
        }
        self.responses.clear();
        self.conversations.clear();
    }
}

/// Turns a Responses `input` or a Conversations `items` value into items with ids and
/// statuses: a string becomes one user message; a message's string `content` becomes one
/// text part.
pub(crate) fn normalize_items(engine: &Engine, value: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match value {
        Value::String(text) => {
            return Ok(vec![json!({
                "type": "message",
                "id": engine.new_id("msg_"),
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
                "status": "completed",
            })]);
        }
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::bad_request(
                "`input` must be a string or an array of items",
            ));
        }
    };
    items
        .iter()
        .map(|item| {
            let Some(item) = item.as_object() else {
                return Err(ApiError::bad_request("each input item must be an object"));
            };
            Ok(Value::Object(normalize_item(engine, item.clone())))
        })
        .collect()
}

fn normalize_item(engine: &Engine, mut item: Map<String, Value>) -> Map<String, Value> {
    if !item.contains_key("type") && item.contains_key("role") {
        item.insert("type".into(), "message".into());
    }
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
        .to_owned();
    if kind == "message" {
        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
        let part = if role == "assistant" {
            "output_text"
        } else {
            "input_text"
        };
        if let Some(Value::String(text)) = item.get("content") {
            let content = json!([{"type": part, "text": text}]);
            item.insert("content".into(), content);
        }
    }
    // Stored items are finished: OpenAI lists every stored message and tool call with a
    // status, and the SDKs' item types require one.
    if matches!(
        kind.as_str(),
        "message" | "function_call" | "function_call_output"
    ) && !item.contains_key("status")
    {
        item.insert("status".into(), "completed".into());
    }
    if !item.contains_key("id") {
        let prefix = match kind.as_str() {
            "message" => "msg_",
            "function_call" => "fc_",
            _ => "item_",
        };
        item.insert("id".into(), engine.new_id(prefix).into());
    }
    item
}

/// The `limit`, `order` and `after` of a list request.
#[derive(Debug)]
pub(crate) struct ListQuery {
    limit: usize,
    descending: bool,
    after: Option<String>,
}

impl ListQuery {
    /// Reads the query; `order` defaults to `desc`, as in OpenAI's item lists.
    pub(crate) fn parse(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let limit = match query.get("limit") {
            None => DEFAULT_PAGE_ITEMS,
            Some(limit) => limit
                .parse::<usize>()
                .ok()
                .filter(|limit| (1..=MAX_PAGE_ITEMS).contains(limit))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`limit` must be an integer from 1 to {MAX_PAGE_ITEMS}, got {limit:?}"
                    ))
                    .param("limit")
                })?,
        };
        let descending = match query.get("order").map(String::as_str) {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "`order` must be `asc` or `desc`, got {other:?}"
                ))
                .param("order"));
            }
        };
        Ok(Self {
            limit,
            descending,
            after: query.get("after").cloned(),
        })
    }

    /// One page of `items` (kept oldest first) as an OpenAI list object.
    pub(crate) fn page(&self, items: &[Value]) -> Result<Value, ApiError> {
        let ordered: Vec<&Value> = if self.descending {
            items.iter().rev().collect()
        } else {
            items.iter().collect()
        };
        let start = match &self.after {
            None => 0,
            Some(after) => {
                ordered
                    .iter()
                    .position(|item| item.get("id").and_then(Value::as_str) == Some(after))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("no item with id '{after}'")).param("after")
                    })?
                    + 1
            }
        };
        let rest = &ordered[start..];
        let data: Vec<Value> = rest
            .iter()
            .take(self.limit)
            .map(|&item| item.clone())
            .collect();
        let id_of = |item: Option<&Value>| item.and_then(|item| item.get("id")).cloned();
        Ok(json!({
            "object": "list",
            "first_id": id_of(data.first()),
            "last_id": id_of(data.last()),
            "has_more": rest.len() > data.len(),
            "data": data,
        }))
    }
}
