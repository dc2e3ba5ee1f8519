//! The OpenAI Conversations API: conversations and their items, kept in the engine's store.
//!
//! `POST /v1/conversations` (optional `items`, `metadata`) creates one; responses created with
//! `"conversation"` append their input and output items to it. Unknown conversation or item
//! ids answer 404.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::engine::{Engine, lock, unix_now};
use super::error::ApiError;
use super::request::parse_object;
use super::responses::{list_query, path_param};
use super::store::{Conversation, normalize_items};

fn conversation_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Conversation with id '{id}' not found."))
        .code("conversation_not_found")
}

fn item_not_found(conversation_id: &str, item_id: &str) -> ApiError {
    ApiError::not_found(format!(
        "Item with id '{item_id}' not found in conversation '{conversation_id}'."
    ))
    .code("item_not_found")
}

fn metadata(body: &serde_json::Map<String, Value>) -> Result<Option<Value>, ApiError> {
    match body.get("metadata") {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(json!({}))),
        Some(metadata @ Value::Object(_)) => Ok(Some(metadata.clone())),
        Some(_) => Err(ApiError::bad_request("`metadata` must be an object").param("metadata")),
    }
}

/// Reads a body that may be empty (no fields) or a JSON object.
fn optional_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(serde_json::Map::new())
    } else {
        parse_object(body)
    }
}

/// `POST /v1/conversations`.
pub(crate) async fn create(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = optional_object(&body)?;
    let items = match body.get("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(items @ Value::Array(_)) => normalize_items(&engine, items)?,
        Some(_) => return Err(ApiError::bad_request("`items` must be an array").param("items")),
    };
    let conversation = Conversation {
        id: engine.new_id("conv_"),
        created_at: unix_now(),
        metadata: metadata(&body)?.unwrap_or_else(|| json!({})),
        items,
    };
    let object = conversation.object();
    lock(&engine.store)
        .conversations
        .insert(conversation.id.clone(), conversation);
    Ok(Json(object).into_response())
}

/// `GET /v1/conversations/{id}`.
pub(crate) async fn retrieve(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let store = lock(&engine.store);
    let conversation = store
        .conversations
        .get(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    Ok(Json(conversation.object()).into_response())
}

/// `POST /v1/conversations/{id}`: replaces the conversation's metadata.
pub(crate) async fn update(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let body = parse_object(&body)?;
    let metadata = metadata(&body)?;
    let mut store = lock(&engine.store);
    let conversation = store
        .conversations
        .get_mut(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    if let Some(metadata) = metadata {
        conversation.metadata = metadata;
    }
    Ok(Json(conversation.object()).into_response())
}

/// `DELETE /v1/conversations/{id}`.
pub(crate) async fn delete(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let removed = lock(&engine.store).conversations.remove(&id);
    removed.ok_or_else(|| conversation_not_found(&id))?;
    Ok(Json(json!({"id": id, "object": "conversation.deleted", "deleted": true})).into_response())
}

/// `GET /v1/conversations/{id}/items` (`limit`, `order`, `after`; newest first by default).
pub(crate) async fn list_items(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let query = list_query(query)?;
    let store = lock(&engine.store);
    let conversation = store
        .conversations
        .get(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    Ok(Json(query.page(&conversation.items)?).into_response())
}

/// `POST /v1/conversations/{id}/items`: appends `items`; answers the added items.
pub(crate) async fn add_items(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = path_param(path)?;
    let body = parse_object(&body)?;
    let items = match body.get("items") {
        Some(items @ Value::Array(_)) => normalize_items(&engine, items)?,
        _ => return Err(ApiError::bad_request("`items` must be an array").param("items")),
    };
    let mut store = lock(&engine.store);
    let conversation = store
        .conversations
        .get_mut(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    conversation.items.extend(items.iter().cloned());
    let id_of = |item: Option<&Value>| item.and_then(|item| item.get("id")).cloned();
    Ok(Json(json!({
        "object": "list",
        "first_id": id_of(items.first()),
        "last_id": id_of(items.last()),
        "has_more": false,
        "data": items,
    }))
    .into_response())
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub(crate) async fn retrieve_item(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (id, item_id) = path_param(path)?;
    let store = lock(&engine.store);
    let conversation = store
        .conversations
        .get(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    let item = conversation
        .items
        .iter()
        .find(|item| item.get("id").and_then(Value::as_str) == Some(&item_id))
        .ok_or_else(|| item_not_found(&id, &item_id))?;
    Ok(Json(item.clone()).into_response())
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: answers the conversation, as OpenAI does.
pub(crate) async fn delete_item(
    State(engine): State<Arc<Engine>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (id, item_id) = path_param(path)?;
    let mut store = lock(&engine.store);
    let conversation = store
        .conversations
        .get_mut(&id)
        .ok_or_else(|| conversation_not_found(&id))?;
    let position = conversation
        .items
        .iter()
        .position(|item| item.get("id").and_then(Value::as_str) == Some(&item_id))
        .ok_or_else(|| item_not_found(&id, &item_id))?;
    conversation.items.remove(position);
    Ok(Json(conversation.object()).into_response())
}
