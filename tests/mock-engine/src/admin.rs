//! The test knobs under `/mock/`, the request intake that feeds them, and the small vLLM
//! endpoints (`/v1/models`, `/metrics`, `/health`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{MatchedPath, Query, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::WaitingOverride;
use super::engine::{Engine, unix_now};
use super::error::ApiError;
use super::request::parse_object;

/// The header naming the engine that answered.
pub(crate) const ENGINE_HEADER: HeaderName = HeaderName::from_static("x-mock-engine");
/// The header of `GET /mock/last_body` naming the path the body was sent to.
const PATH_HEADER: HeaderName = HeaderName::from_static("x-mock-path");

/// The paths whose requests generate, and so can be made to fail.
const INFERENCE_PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
];

/// Counts each request, keeps the raw bytes of each `POST /v1/...` body, answers injected
/// failures, and names the engine on every answer.
pub(crate) async fn intake(
    State(engine): State<Arc<Engine>>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = intake_inner(&engine, matched, request, next).await;
    if let Ok(name) = HeaderValue::from_str(&engine.config.name) {
        response.headers_mut().insert(ENGINE_HEADER, name);
    }
    response
}

async fn intake_inner(
    engine: &Engine,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    if path.starts_with("/mock/") {
        return next.run(request).await;
    }
    let route = matched.as_ref().map_or("(unmatched)", MatchedPath::as_str);
    engine.count_request(format!("{} {route}", request.method()));
    if request.method() != Method::POST || !path.starts_with("/v1/") {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let limit = engine.config.max_body_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {limit} bytes or could not be read"),
        )
        .into_response();
    };
    engine.keep_body(path.clone(), bytes.clone());
    if INFERENCE_PATHS.contains(&path.as_str())
        && let Some(error) = engine.take_failure(path == "/v1/messages")
    {
        return error.into_response();
    }
    if INFERENCE_PATHS.contains(&path.as_str()) {
        let stall = engine.head_stall();
        if !stall.is_zero() {
            tokio::time::sleep(stall).await;
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn body_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    parse_object(body)
}

fn optional_u64(
    body: &serde_json::Map<String, Value>,
    field: &'static str,
) -> Result<Option<u64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            ApiError::bad_request(format!("`{field}` must be a non-negative integer")).param(field)
        }),
    }
}

/// `POST /mock/fail {"status": 503, "count": 2, "retry_after": 1}`: the next `count`
/// (default 1; 0 clears) inference requests answer `status` with an error body, and a
/// `Retry-After` header when `retry_after` is given.
pub(crate) async fn fail(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = body_object(&body)?;
    let status = optional_u64(&body, "status")?
        .and_then(|status| u16::try_from(status).ok())
        .and_then(|status| StatusCode::from_u16(status).ok())
        .filter(|status| status.is_client_error() || status.is_server_error())
        .ok_or_else(|| {
            ApiError::bad_request("`status` must be an HTTP error status (400-599)").param("status")
        })?;
    let count = optional_u64(&body, "count")?.unwrap_or(1);
    let count = u32::try_from(count)
        .map_err(|_| ApiError::bad_request("`count` is too large").param("count"))?;
    let retry_after = optional_u64(&body, "retry_after")?;
    engine.fail_next(status, count, retry_after);
    Ok(Json(json!({"status": status.as_u16(), "count": count})).into_response())
}

/// `POST /mock/stall {"head_ms": 3000, "token_ms": 500}`: every generation request waits
/// `head_ms` before answering and every output token takes `token_ms` longer; both default
/// to 0, so `{}` ends the stall.
pub(crate) async fn stall(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = body_object(&body)?;
    let head_ms = optional_u64(&body, "head_ms")?.unwrap_or(0);
    let token_ms = optional_u64(&body, "token_ms")?.unwrap_or(0);
    engine.set_stall(
        std::time::Duration::from_millis(head_ms),
        std::time::Duration::from_millis(token_ms),
    );
    Ok(Json(json!({"head_ms": head_ms, "token_ms": token_ms})).into_response())
}

/// `POST /mock/queue {"waiting": 7}` adds 7 to the reported waiting count of each model;
/// `{"waiting": 7, "exact": true}` reports exactly 7; `{"waiting": 0}` turns it off.
pub(crate) async fn queue(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = body_object(&body)?;
    let waiting = optional_u64(&body, "waiting")?
        .ok_or_else(|| ApiError::bad_request("`waiting` is required").param("waiting"))?;
    let exact = body.get("exact").and_then(Value::as_bool).unwrap_or(false);
    let waiting_override = if exact {
        WaitingOverride::Set(waiting)
    } else {
        WaitingOverride::Add(waiting)
    };
    engine.set_waiting_override(waiting_override);
    Ok(Json(json!({"waiting": waiting, "exact": exact})).into_response())
}

/// `POST /mock/metrics {"fail": true}`: `/metrics` answers 503 until `{"fail": false}`, so
/// a gateway cannot read this engine's queue.
pub(crate) async fn metrics_knob(
    State(engine): State<Arc<Engine>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = body_object(&body)?;
    let fail = body
        .get("fail")
        .and_then(Value::as_bool)
        .ok_or_else(|| ApiError::bad_request("`fail` must be true or false").param("fail"))?;
    engine.set_metrics_failing(fail);
    Ok(Json(json!({"fail": fail})).into_response())
}

/// `GET /mock/stats`.
pub(crate) async fn stats(State(engine): State<Arc<Engine>>) -> Response {
    Json(engine.stats()).into_response()
}

/// `GET /mock/last_body[?back=N]`: the exact bytes of the last (or N-th last, up to 15)
/// `POST /v1/...` body received, with its path in `x-mock-path`.
pub(crate) async fn last_body(
    State(engine): State<Arc<Engine>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let back = match query.get("back") {
        None => 0,
        Some(back) => back
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request("`back` must be a non-negative integer"))?,
    };
    let (path, body) = engine
        .kept_body(back)
        .ok_or_else(|| ApiError::not_found("no such request body kept"))?;
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(path) = HeaderValue::from_str(&path) {
        headers.insert(PATH_HEADER, path);
    }
    Ok(response)
}

/// `POST /mock/reset`: forgets knobs, counters, kept bodies, the prefix cache and the stores.
pub(crate) async fn reset(State(engine): State<Arc<Engine>>) -> Response {
    engine.reset();
    Json(json!({"reset": true})).into_response()
}

/// `GET /v1/models`.
pub(crate) async fn models(State(engine): State<Arc<Engine>>) -> Response {
    let created = unix_now();
    let data: Vec<Value> = engine
        .config
        .models
        .iter()
        .map(|model| {
            json!({
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "grid-route-mock-engine",
                "root": model,
                "parent": null,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    if engine.metrics_failing() {
        return ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics made to fail by /mock/metrics",
        )
        .into_response();
    }
    let mut response = super::metrics::render(&engine).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Any other path: a JSON 404.
pub(crate) async fn unknown_path(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path())).code("not_found")
}
