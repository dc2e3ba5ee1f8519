//! The client-facing listener: the request log, the provider role's gate, `/v1/models`,
//! and everything else through the routing stack.
//!
//! - **`GET /v1/models`** is answered by the gateway: the union of the models of the
//!   admitted clusters (configured, not asked of the engines), in config order, as an
//!   OpenAI `list`.
//! - **Consumer role**: only the paths of `forward_paths` pass, each with its methods
//!   (see [`forward_paths`](crate::forward_paths)); another path is a 404 `not_found`, a
//!   listed path with another method a 405 `method_not_allowed` with `Allow`, both
//!   OpenAI-style JSON, and nothing reaches an engine.
//! - **Provider role**: only the exact `provider_allowed_paths` pass, with GET or POST;
//!   another path is a 404, another method a 405 with `Allow: GET, POST`, both
//!   OpenAI-style JSON.
//! - **A stalled request body** (nothing for `timeouts.client_body_idle_secs`) is
//!   answered 408 `request_timeout`, whether keying or the engine client was reading it.
//! - **The request log and request ids** (`gateway/access.rs` says what each line holds):
//!   one `info` line per request, a `warn` line when an answer fails after its head, and
//!   an `x-request-id` on every request and answer. No line holds prompt text, keys, or
//!   the values of credential headers (marked sensitive before any layer sees the
//!   request).
//! - **A panic** anywhere below the request log (a bug: nothing a client or an engine sends
//!   should cause one) becomes a 500 `internal_error` OpenAI-style answer and an `error`
//!   log line, and the request log records the 500; the connection and every other
//!   request go on. A panic while the answer's body streams ends that stream early.

use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use grid_route_layer::answer::ErrorAnswer;
use http::header::{ALLOW, HeaderValue};
use http::{Method, StatusCode};
use serde_json::json;
use tower::Service;
use tower::util::Oneshot;
use tower_http::catch_panic::CatchPanicLayer;

use super::Live;
use super::access;
use super::idle_body::IdleTimeoutBody;
use super::stack::Routing;
use crate::config::Role;
use crate::forward_paths::PathCheck;

/// The front listener's router.
pub(crate) fn router(live: Arc<Live>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback_service(CurrentRouting {
            live: Arc::clone(&live),
        })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&live),
            client_body_timeout,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&live), path_gate))
        .layer(catch_panics())
        .layer(access::sensitive_response_headers())
        .layer(middleware::from_fn(access::keep_request_line))
        .layer(access::access_log())
        .layer(access::propagate_request_id())
        .layer(access::set_request_id())
        .layer(middleware::from_fn(access::drop_unreadable_request_id))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&live),
            sensitive_session_headers,
        ))
        .layer(access::sensitive_request_headers())
        .with_state(live)
}

/// The layer that turns a panic into a 500 answer (tower-http's `CatchPanicLayer`).
pub(crate) fn catch_panics() -> CatchPanicLayer<fn(Box<dyn Any + Send + 'static>) -> Response> {
    CatchPanicLayer::custom(answer_panic as fn(Box<dyn Any + Send + 'static>) -> Response)
}

/// The answer to a request whose handling panicked. The payload is not logged: it may
/// quote a request, and the panic hook has already printed it with its location.
fn answer_panic(_payload: Box<dyn Any + Send + 'static>) -> Response {
    tracing::error!("a request's handling panicked (a bug); answered 500");
    ErrorAnswer::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the gateway failed while handling this request",
    )
    .code("internal_error")
    .into_http_response::<axum::body::Body>()
}

/// Sends each request through the routing stack of the current configuration.
#[derive(Clone)]
struct CurrentRouting {
    live: Arc<Live>,
}

impl Service<Request> for CurrentRouting {
    type Response = Response;
    type Error = Infallible;
    type Future = Oneshot<Routing, Request>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is the stack's, checked by the oneshot for each request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let routing = Routing::clone(&self.live.routing.load());
        Oneshot::new(routing, request)
    }
}

/// `GET /v1/models`: the models the admitted clusters serve.
async fn models(State(live): State<Arc<Live>>) -> Response {
    let view = live.grid.view();
    let mut models: Vec<&str> = Vec::new();
    for cluster in view.clusters().iter().filter(|c| c.admits()) {
        for model in cluster.models() {
            if !models.contains(&&**model) {
                models.push(model);
            }
        }
    }
    let data: Vec<_> = models
        .iter()
        .map(|id| {
            json!({
                "id": id,
                "object": "model",
                "created": live.started_unix,
                "owned_by": "grid-route",
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn method_not_allowed(method: Method) -> Response {
    ErrorAnswer::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed here"),
    )
    .code("method_not_allowed")
    .into_http_response::<axum::body::Body>()
}

/// Marks the configured session headers sensitive, as credentials are (outside the request
/// log, so it prints them as `Sensitive`): a session id is client data, like a prompt.
async fn sensitive_session_headers(
    State(live): State<Arc<Live>>,
    mut request: Request,
    next: Next,
) -> Response {
    let settings = live.settings.load();
    for name in settings.session_headers.iter() {
        if let http::header::Entry::Occupied(mut entry) = request.headers_mut().entry(name) {
            for value in entry.iter_mut() {
                value.set_sensitive(true);
            }
        }
    }
    next.run(request).await
}

/// The consumer role forwards only `forward_paths`; the provider role only its allowed
/// exact paths, with GET or POST.
async fn path_gate(State(live): State<Arc<Live>>, request: Request, next: Next) -> Response {
    let settings = live.settings.load();
    let path = request.uri().path();
    let method = request.method();
    let config = &settings.config;
    let check = match config.role {
        Role::Consumer => config.forward_paths.check(method, path),
        Role::Provider => {
            if !config.provider_allowed_paths.iter().any(|p| p == path) {
                PathCheck::NotFound
            } else if method != Method::GET && method != Method::POST {
                PathCheck::MethodNotAllowed("GET, POST".to_owned())
            } else {
                PathCheck::Forward
            }
        }
    };
    match check {
        PathCheck::Forward => {
            drop(settings);
            next.run(request).await
        }
        PathCheck::NotFound => ErrorAnswer::new(
            StatusCode::NOT_FOUND,
            format!("{path} is not served by this gateway"),
        )
        .code("not_found")
        .into_http_response::<axum::body::Body>(),
        PathCheck::MethodNotAllowed(allow) => {
            let mut response = ErrorAnswer::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {method} is not allowed on {path}"),
            )
            .code("method_not_allowed")
            .into_http_response::<axum::body::Body>();
            if let Ok(allow) = HeaderValue::from_str(&allow) {
                response.headers_mut().insert(ALLOW, allow);
            }
            response
        }
    }
}

/// A request body that sends nothing for `timeouts.client_body_idle_secs` fails whoever
/// reads it (keying or the engine client); the client then gets 408, whatever the
/// reader made of the failure.
async fn client_body_timeout(
    State(live): State<Arc<Live>>,
    request: Request,
    next: Next,
) -> Response {
    let idle = live.settings.load().config.timeouts.client_body_idle;
    let (parts, body) = request.into_parts();
    let body = IdleTimeoutBody::new(idle, body);
    let stalled = body.stall_flag();
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if stalled.load(Ordering::Relaxed) {
        tracing::debug!(?idle, "the client's request body stalled");
        return ErrorAnswer::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body sent nothing for {} s", idle.as_secs()),
        )
        .code("request_timeout")
        .into_http_response::<axum::body::Body>();
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::Json;
    use axum::routing::post;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    #[tokio::test]
    async fn a_panic_while_handling_a_request_is_a_500_json_answer() {
        let router = Router::new()
            .route(
                "/v1/chat/completions",
                post(|body: String| async move {
                    // What an unchecked engine value did before: a panic mid-request.
                    let depth: u64 = body.parse().expect("a bug on the request path");
                    Json(depth)
                }),
            )
            .route("/ok", get(|| async { "ok" }))
            .layer(catch_panics());
        let request = http::Request::post("/v1/chat/completions")
            .body(Body::from("not a number"))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "internal_error");
        assert_eq!(body["error"]["type"], "server_error");
        // The router serves the next request as before.
        let request = http::Request::get("/ok").body(Body::empty()).unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}
