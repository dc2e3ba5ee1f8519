//! The routing stack: the library's layers over the per-cluster balancers, assembled in
//! one place.
//!
//! The order, outermost first, is the request path of `docs/architecture.md` (its one
//! diagram): request decompression, the error answers (`NoCandidate` → 404
//! `model_not_found` or 503 with `Retry-After: 5`, no head in time → 504, `DispatchError`
//! → 502), keying, pinning, confirmation, affinity, the route note the request log reads,
//! engine feedback, retries of failed connects, and `Select` over each cluster's p2c
//! balancer (see `upstream`).
//!
//! A reload builds the layers above `Select` afresh (they hold the settings it may
//! change) but hands them the gateway's one `Select`, whose per-cluster balancers outlive
//! reloads that leave their cluster's endpoints alone.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::error_handling::HandleError;
use axum::response::Response;
use grid_route_layer::affinity::{Affinity, AffinityLayer, Outcome};
use grid_route_layer::answer::ErrorAnswer;
use grid_route_layer::confirm::ConfirmLayer;
use grid_route_layer::feedback::FeedbackLayer;
use grid_route_layer::grid::Grid;
use grid_route_layer::keying::{Api, KeySeed, KeyingLayer};
use grid_route_layer::pin::{PinKeys, PinLayer, is_stored_state_api};
use grid_route_layer::route::{BoxError, DispatchError, NoCandidate, Pinned, find_source};
use http::header::CONTENT_ENCODING;
use http::{Request, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::Limited;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_http::decompression::{DecompressionBody, RequestDecompressionLayer};

use super::retry::RetryLayer;
use super::upstream::{Balancers, UpstreamTimeout};

/// `Retry-After` of the 503 answered when no cluster may take a request: the pin layer's,
/// so every "try again" of the gateway says the same.
pub use grid_route_layer::pin::RETRY_AFTER_SECS;

/// The whole routing stack as one cloneable service that never fails: errors are answers.
pub(crate) type Routing = BoxCloneSyncService<Request<Body>, Response, Infallible>;

/// What the routing stack is built from.
pub(crate) struct StackParts<'a> {
    pub(crate) grid: &'a Grid,
    pub(crate) affinity: &'a Affinity,
    pub(crate) seed: &'a KeySeed,
    /// The pin layer's keys, rotated on reload.
    pub(crate) tag_keys: &'a PinKeys,
    pub(crate) max_body_bytes: usize,
    /// `prefix_affinity.session_headers` (read only while `session_affinity` is on).
    pub(crate) session_headers: &'a [http::HeaderName],
    /// The per-cluster balancers, shared by every routing stack of the gateway.
    pub(crate) balancers: &'a Balancers,
    /// `retries.max_attempts`.
    pub(crate) max_attempts: u32,
}

/// Assembles the routing stack. The one place the layers are ordered.
pub(crate) fn routing_stack(parts: &StackParts<'_>) -> Routing {
    let layers = ServiceBuilder::new()
        .layer(
            KeyingLayer::new(parts.seed.clone())
                .body_limit(parts.max_body_bytes)
                .session_headers(parts.session_headers.iter().cloned())
                .with_affinity(parts.affinity.clone()),
        )
        .layer(PinLayer::new(parts.grid.clone(), parts.tag_keys.clone()))
        .layer(ConfirmLayer::new(parts.affinity.clone()))
        .layer(AffinityLayer::new(
            parts.grid.clone(),
            parts.affinity.clone(),
        ))
        .layer(RouteNoteLayer)
        .layer(FeedbackLayer::new().with_affinity(parts.affinity.clone()))
        .map_request(to_engine_body)
        .layer(RetryLayer::new(
            parts.grid.clone(),
            Arc::clone(parts.affinity.index()),
            parts.max_attempts,
        ))
        .service(parts.balancers.clone());
    BoxCloneSyncService::new(DecodeBodies {
        inner: HandleError::new(layers, answer_error),
        limit: parts.max_body_bytes,
    })
}

/// Decodes the compressed request bodies of the keyed and stored-state paths, so that
/// keying and pinning read them (a tagged id inside a gzip body must not reach an engine)
/// and the engine gets the decoded bytes (`Content-Encoding` and `Content-Length` go).
///
/// The decoded body is capped at `limit` bytes ([`Limited`]): the keying layer answers a
/// body that grows past it with 413, so a zip bomb costs at most `limit` bytes of memory.
/// Other paths, and encodings other than gzip, deflate, br and zstd, pass as sent (the
/// keying layer refuses what it cannot read on a stored-state path).
#[derive(Clone)]
struct DecodeBodies<S> {
    inner: S,
    limit: usize,
}

impl<S> Service<Request<Body>> for DecodeBodies<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        if !decodes(&request) {
            return Box::pin(inner.oneshot(request));
        }
        let limit = self.limit;
        let capped = inner.map_request(move |request: Request<DecompressionBody<Body>>| {
            request.map(|body| Body::new(Limited::new(body, limit)))
        });
        let decoding = RequestDecompressionLayer::new()
            .pass_through_unaccepted(true)
            .layer(capped);
        Box::pin(async move {
            let response = decoding.oneshot(request).await?;
            Ok(response.map(Body::new))
        })
    }
}

/// A keyed or stored-state request whose body is in an encoding the gateway decodes.
fn decodes(request: &Request<Body>) -> bool {
    let path = request.uri().path();
    let read = Api::from_path(path).is_some() || is_stored_state_api(path);
    read && request
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|value| DECODED_ENCODINGS.contains(&value.as_bytes()))
}

/// The `Content-Encoding` values decoded (as tower-http matches them: exactly, lowercase).
const DECODED_ENCODINGS: [&[u8]; 4] = [b"gzip", b"deflate", b"br", b"zstd"];

/// Any request body, boxed into the one type the engine client sends.
fn to_engine_body<B>(request: Request<B>) -> Request<Body>
where
    B: HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    request.map(Body::new)
}

/// The answer to a request the stack could not serve.
async fn answer_error(error: BoxError) -> Response {
    if let Some(none) = find_source::<NoCandidate>(&*error) {
        tracing::debug!(%none, "no candidate");
        if none.model_not_served() {
            return ErrorAnswer::new(StatusCode::NOT_FOUND, format!("{none}; see GET /v1/models"))
                .code("model_not_found")
                .param("model")
                .into_http_response::<axum::body::Body>();
        }
        return ErrorAnswer::new(StatusCode::SERVICE_UNAVAILABLE, none.to_string())
            .code("no_backend_available")
            .retry_after(RETRY_AFTER_SECS)
            .into_http_response::<axum::body::Body>();
    }
    if let Some(timeout) = find_source::<UpstreamTimeout>(&*error) {
        let cluster = DispatchError::find_in(&*error).map(|failed| failed.cluster().to_string());
        tracing::warn!(%timeout, cluster, "backend cluster sent no answer in time");
        return ErrorAnswer::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("the backend sent no answer in time: {timeout}"),
        )
        .code("upstream_timeout")
        .into_http_response::<axum::body::Body>();
    }
    if let Some(failed) = DispatchError::find_in(&*error) {
        tracing::warn!(error = %failed, "backend cluster failed before answering");
        return ErrorAnswer::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "backend cluster {} failed before answering",
                failed.cluster()
            ),
        )
        .code("backend_unreachable")
        .into_http_response::<axum::body::Body>();
    }
    tracing::error!(%error, "request failed in the gateway");
    ErrorAnswer::new(StatusCode::INTERNAL_SERVER_ERROR, "the gateway failed")
        .code("gateway_error")
        .into_http_response::<axum::body::Body>()
}

/// How a request was routed, on its response, for the request log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteNote {
    /// Affinity decided (with at least two admitted candidates).
    Affinity(Outcome),
    /// Pinned to the cluster holding its stored state.
    Pinned,
}

impl RouteNote {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Affinity(outcome) => outcome.as_str(),
            Self::Pinned => "pinned",
        }
    }
}

/// Copies the request's [`Outcome`] or [`Pinned`] onto its response as a [`RouteNote`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouteNoteLayer;

impl<S> Layer<S> for RouteNoteLayer {
    type Service = RouteNoteService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RouteNoteService { inner }
    }
}

/// See [`RouteNoteLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RouteNoteService<S> {
    inner: S,
}

impl<S, B, ResB> Service<Request<B>> for RouteNoteService<S>
where
    S: Service<Request<B>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let ext = request.extensions();
        let note = if ext.get::<Pinned>().is_some() {
            Some(RouteNote::Pinned)
        } else {
            ext.get::<Outcome>().copied().map(RouteNote::Affinity)
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            if let Some(note) = note {
                response.extensions_mut().insert(note);
            }
            Ok(response)
        })
    }
}
