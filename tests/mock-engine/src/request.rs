//! Reading an inference request: its JSON, model, cache namespace, reply and streaming flag.

use serde_json::{Map, Value};

use super::cache::namespace;
use super::engine::{Engine, Job, unix_now};
use super::error::ApiError;
use super::prompt::{PromptText, reply_tokens};

/// Parses a body that must be a JSON object; a 400 otherwise.
pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(error) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {error}"
        ))),
    }
}

/// A generation the engine will run: what it prefills and what it answers.
pub(crate) struct Generation {
    pub(crate) job: Job,
    pub(crate) tokens: Vec<String>,
    /// Whether `tokens` was cut by the request's token limit.
    pub(crate) cut: bool,
    pub(crate) stream: bool,
    pub(crate) created: u64,
}

impl Generation {
    /// Reads the generation a request asks for; `limit_fields` name its output token limit,
    /// first match wins.
    pub(crate) fn prepare(
        engine: &Engine,
        body: &Map<String, Value>,
        prompt: PromptText,
        limit_fields: &[&'static str],
    ) -> Result<Self, ApiError> {
        let model = match body.get("model") {
            None | Some(Value::Null) => engine.resolve_model(None)?,
            Some(Value::String(model)) => engine.resolve_model(Some(model))?,
            Some(_) => return Err(ApiError::bad_request("`model` must be a string").param("model")),
        };
        let cache_salt = body.get("cache_salt").and_then(Value::as_str);
        let mut max_tokens = None;
        for &field in limit_fields {
            match body.get(field) {
                None | Some(Value::Null) => {}
                Some(value) => {
                    let limit = value.as_u64().ok_or_else(|| {
                        ApiError::bad_request(format!("`{field}` must be a non-negative integer"))
                            .param(field)
                    })?;
                    max_tokens = Some(limit);
                    break;
                }
            }
        }
        let (tokens, cut) = reply_tokens(&engine.config.name, &prompt.last_user_text, max_tokens);
        Ok(Self {
            job: Job {
                namespace: namespace(&model, cache_salt),
                model,
                prompt: prompt.bytes,
            },
            tokens,
            cut,
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            created: unix_now(),
        })
    }

    pub(crate) fn text(&self) -> String {
        self.tokens.concat()
    }

    pub(crate) fn completion_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }
}
