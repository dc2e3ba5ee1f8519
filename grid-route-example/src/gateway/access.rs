//! The request log, as tower-http's [`TraceLayer`], and the headers no log may show.
//!
//! - **One `info` line per request** (target `grid_route_example::access`, message
//!   `request`) when the answer's head leaves: `method`, `path` (never the query),
//!   `request_id`, `outcome` (the affinity outcome, `pinned`, or `-` when nothing was
//!   decided), `site` and `cluster` (where [`Select`](grid_route_layer::select::Select)
//!   sent it, or `-`), `status` and `latency_ms` (to the answer's head: time to first
//!   byte for a stream).
//! - **A `warn` line on the same target when an answer fails after its head** (the
//!   engine died or went quiet mid-stream: the client's stream is cut), with `method`,
//!   `path`, `request_id` and the error.
//! - **Every request has an id** in [`REQUEST_ID`] (`x-request-id`, as OpenAI's API
//!   answers with and vLLM reads): the client's when it reads as one ([`readable_id`]),
//!   else a new UUID. The engine gets it with the request and the client gets it on the
//!   answer (unless the engine answered with its own), so one id finds a request in the
//!   client's, the gateway's and the engine's logs.
//! - **At `trace`, each request's headers** ("request head"), with the
//!   [credentials](SENSITIVE_REQUEST_HEADERS) marked sensitive before any layer sees the
//!   request, so their `Debug` prints `Sensitive` in this line or any other. The engine's
//!   `Set-Cookie` is marked the same way on the answer.
//! - Each request runs in a `debug` span `request` with its method and path.
//!
//! No line holds prompt text, keys or a query string.

use std::fmt;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use grid_route_layer::route::Served;
use http::Method;
use http::header::{
    AUTHORIZATION, COOKIE, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHORIZATION, SET_COOKIE,
};
use tower_http::classify::{ClassifiedResponse, ClassifyEos, ClassifyResponse, MakeClassifier};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::{
    SetSensitiveRequestHeadersLayer, SetSensitiveResponseHeadersLayer,
};
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::stack::RouteNote;

/// The `tracing` target of the request log.
pub const ACCESS_TARGET: &str = "grid_route_example::access";

/// Request headers that carry credentials: OpenAI's and Azure OpenAI's keys, Anthropic's,
/// a proxy's, and cookies. Marked sensitive as a request arrives.
pub const SENSITIVE_REQUEST_HEADERS: [HeaderName; 5] = [
    AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    PROXY_AUTHORIZATION,
    COOKIE,
];

/// The header that carries each request's id, to the engine and back to the client.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client request id kept (a UUID is 36 bytes).
pub const REQUEST_ID_MAX_BYTES: usize = 128;

/// Whether a client's request id is kept: one to [`REQUEST_ID_MAX_BYTES`] ASCII letters,
/// digits or `- _ . : + / =` (UUIDs, ULIDs, base64 and `req_…` ids all are). Anything
/// else could be prose, or text that forges a log line, and is replaced.
#[must_use]
pub(crate) fn readable_id(value: &[u8]) -> bool {
    (1..=REQUEST_ID_MAX_BYTES).contains(&value.len())
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(b))
}

/// Drops a client's [`REQUEST_ID`] that is not [`readable_id`], or is sent more than
/// once, so that [`SetRequestIdLayer`] (inside it) gives the request a new one. Only its
/// length is logged, at `debug`.
pub(crate) async fn drop_unreadable_request_id(mut request: Request, next: Next) -> Response {
    let values = request.headers().get_all(&REQUEST_ID);
    let mut sent = values.iter();
    if let Some(first) = sent.next() {
        let once = sent.next().is_none();
        if !once || !readable_id(first.as_bytes()) {
            tracing::debug!(
                target: ACCESS_TARGET,
                bytes = first.len(),
                once,
                "the client's x-request-id is not one; a new id replaces it"
            );
            request.headers_mut().remove(&REQUEST_ID);
        }
    }
    next.run(request).await
}

/// Gives a request without a [`REQUEST_ID`] a new UUID (tower-http's
/// `SetRequestIdLayer`); inside [`drop_unreadable_request_id`].
pub(crate) fn set_request_id() -> SetRequestIdLayer<MakeRequestUuid> {
    SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid)
}

/// Copies the request's [`REQUEST_ID`] onto its answer when the answer has none
/// (tower-http's `PropagateRequestIdLayer`); inside [`set_request_id`].
pub(crate) fn propagate_request_id() -> PropagateRequestIdLayer {
    PropagateRequestIdLayer::new(REQUEST_ID)
}

/// Marks [`SENSITIVE_REQUEST_HEADERS`] on each request; the outermost layer of the front
/// listener, so that no layer inside prints them.
pub(crate) fn sensitive_request_headers() -> SetSensitiveRequestHeadersLayer {
    SetSensitiveRequestHeadersLayer::new(SENSITIVE_REQUEST_HEADERS)
}

/// Marks `Set-Cookie` on each answer, as it comes out of the routes (so the layers
/// around them see it marked).
pub(crate) fn sensitive_response_headers() -> SetSensitiveResponseHeadersLayer {
    SetSensitiveResponseHeadersLayer::new([SET_COOKIE])
}

/// The request log. It reads the [`RequestLine`] that [`keep_request_line`] (inside it)
/// copies onto the answer, and the [`Served`] and [`RouteNote`] extensions the routing
/// stack leaves there.
pub(crate) type AccessLogLayer = TraceLayer<
    StreamFailures,
    fn(&Request) -> Span,
    fn(&Request, &Span),
    fn(&Response, Duration, &Span),
    (),
    (),
    fn(StreamFailed, Duration, &Span),
>;

/// See [`AccessLogLayer`].
pub(crate) fn access_log() -> AccessLogLayer {
    TraceLayer::new(StreamFailures)
        .make_span_with(request_span as fn(&Request) -> Span)
        .on_request(log_head as fn(&Request, &Span))
        .on_response(log_request as fn(&Response, Duration, &Span))
        .on_body_chunk(())
        .on_eos(())
        .on_failure(log_stream_failure as fn(StreamFailed, Duration, &Span))
}

fn request_span(request: &Request) -> Span {
    tracing::debug_span!(
        target: ACCESS_TARGET,
        "request",
        method = %request.method(),
        path = request.uri().path(),
    )
}

/// At `trace` only: the request's headers, credentials shown as `Sensitive`.
fn log_head(request: &Request, _span: &Span) {
    tracing::trace!(target: ACCESS_TARGET, headers = ?request.headers(), "request head");
}

fn log_request(response: &Response, latency: Duration, _span: &Span) {
    let extensions = response.extensions();
    let line = extensions.get::<RequestLine>();
    let served = extensions.get::<Served>();
    let outcome = extensions
        .get::<RouteNote>()
        .map_or("-", |note| note.as_str());
    let latency_ms = latency.as_secs_f64() * 1000.0;
    tracing::info!(
        target: ACCESS_TARGET,
        method = %line.map_or("-", |line| line.method.as_str()),
        path = line.map_or("-", |line| line.path.as_str()),
        request_id = line.map_or("-", RequestLine::id),
        outcome,
        site = served.map_or("-", |s| s.site().as_str()),
        cluster = served.map_or("-", |s| s.cluster().name()),
        status = response.status().as_u16(),
        latency_ms = format_args!("{latency_ms:.1}"),
        "request"
    );
}

// tower-http's `OnFailure` hands the failure over by value.
#[allow(clippy::needless_pass_by_value)]
fn log_stream_failure(failed: StreamFailed, since_last_chunk: Duration, _span: &Span) {
    tracing::warn!(
        target: ACCESS_TARGET,
        method = %failed.line.method,
        path = failed.line.path,
        request_id = failed.line.id(),
        error = failed.error,
        since_last_chunk_ms = since_last_chunk.as_millis(),
        "the answer failed after its head; the client's stream is cut"
    );
}

/// A request's method, path (never its query) and id, copied onto its answer for the
/// request log: tower-http's `on_response` sees only the answer.
#[derive(Debug, Clone)]
pub(crate) struct RequestLine {
    method: Method,
    path: String,
    id: Option<HeaderValue>,
}

impl RequestLine {
    fn of<B>(request: &http::Request<B>) -> Self {
        Self {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            id: request.headers().get(&REQUEST_ID).cloned(),
        }
    }

    /// The request's id, or `-` (a request the id layers did not see: none in the
    /// gateway, whose layers give every request one).
    fn id(&self) -> &str {
        self.id
            .as_ref()
            .and_then(|id| id.to_str().ok())
            .unwrap_or("-")
    }
}

/// Copies the request's [`RequestLine`] onto its answer.
pub(crate) async fn keep_request_line(request: Request, next: Next) -> Response {
    let line = RequestLine::of(&request);
    let mut response = next.run(request).await;
    response.extensions_mut().insert(line);
    response
}

/// Classifies an answer as failed when its body fails after the head; its status is the
/// request log's business (a 503 while clusters drain is an answer, not a failure).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamFailures;

impl MakeClassifier for StreamFailures {
    type Classifier = StreamClassifier;
    type FailureClass = StreamFailed;
    type ClassifyEos = StreamClassifier;

    fn make_classifier<B>(&self, request: &http::Request<B>) -> StreamClassifier {
        StreamClassifier {
            line: RequestLine::of(request),
        }
    }
}

/// See [`StreamFailures`].
#[derive(Debug, Clone)]
pub(crate) struct StreamClassifier {
    line: RequestLine,
}

impl ClassifyResponse for StreamClassifier {
    type FailureClass = StreamFailed;
    type ClassifyEos = Self;

    fn classify_response<B>(
        self,
        _response: &http::Response<B>,
    ) -> ClassifiedResponse<StreamFailed, Self> {
        ClassifiedResponse::RequiresEos(self)
    }

    fn classify_error<E: fmt::Display + 'static>(self, error: &E) -> StreamFailed {
        StreamFailed {
            line: self.line,
            error: error.to_string(),
        }
    }
}

impl ClassifyEos for StreamClassifier {
    type FailureClass = StreamFailed;

    fn classify_eos(self, _trailers: Option<&HeaderMap>) -> Result<(), StreamFailed> {
        Ok(())
    }

    fn classify_error<E: fmt::Display + 'static>(self, error: &E) -> StreamFailed {
        StreamFailed {
            line: self.line,
            error: error.to_string(),
        }
    }
}

/// An answer whose body failed after its head.
#[derive(Debug)]
pub(crate) struct StreamFailed {
    line: RequestLine,
    error: String,
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::body::Body;
    use http::HeaderValue;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    use super::*;

    #[tokio::test]
    async fn credentials_are_marked_on_the_request_and_set_cookie_on_the_answer() {
        let service = ServiceBuilder::new()
            .layer(sensitive_request_headers())
            .layer(sensitive_response_headers())
            .service(service_fn(|request: Request| async move {
                for name in SENSITIVE_REQUEST_HEADERS {
                    assert!(request.headers()[&name].is_sensitive(), "{name}");
                }
                assert!(!request.headers()["content-type"].is_sensitive());
                let shown = format!("{:?}", request.headers());
                assert!(!shown.contains("secret"), "{shown}");
                let mut response = Response::new(Body::empty());
                response
                    .headers_mut()
                    .insert(SET_COOKIE, HeaderValue::from_static("session=secret"));
                Ok::<_, Infallible>(response)
            }));
        let mut request = Request::new(Body::empty());
        for name in SENSITIVE_REQUEST_HEADERS {
            request
                .headers_mut()
                .insert(name, HeaderValue::from_static("secret"));
        }
        request
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        let response = service.oneshot(request).await.unwrap();
        assert!(response.headers()[SET_COOKIE].is_sensitive());
        assert_eq!(
            format!("{:?}", response.headers()),
            r#"{"set-cookie": Sensitive}"#
        );
    }

    #[test]
    fn a_client_request_id_is_kept_only_when_it_reads_as_an_id() {
        for id in [
            "0f8e2c1a-5b7d-4c3e-9a1f-2b3c4d5e6f70",
            "01JDQ2ZK8V3N5P7R9T1W3Y5A7C",
            "req_abc123",
            "trace:span/1+2=",
            "a",
        ] {
            assert!(readable_id(id.as_bytes()), "{id}");
        }
        let longest = "x".repeat(REQUEST_ID_MAX_BYTES);
        assert!(readable_id(longest.as_bytes()));
        for id in [
            String::new(),
            "x".repeat(REQUEST_ID_MAX_BYTES + 1),
            "two words".to_owned(),
            "quote\"d".to_owned(),
            "line\tbreak".to_owned(),
            "caf\u{e9}".to_owned(),
            "a=b; c".to_owned(),
        ] {
            assert!(!readable_id(id.as_bytes()), "{id:?}");
        }
    }
}
