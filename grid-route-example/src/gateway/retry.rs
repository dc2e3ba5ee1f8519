//! Retries of requests that never reached an engine.
//!
//! A request whose connection failed ([`ConnectFailed`]: refused, unreachable, or over
//! `timeouts.upstream_connect_ms`) is sent again, at most `retries.max_attempts` times in
//! all: first to the same cluster while it still has a healthy endpoint (the failed one
//! is now marked unhealthy, so the cluster's balancer picks a sibling), then to the next
//! admitted candidate — the request's other candidates, or, when affinity had narrowed
//! them to the failed cluster, every admitted cluster serving its model. A pinned request
//! stays on its cluster. The prefix keys of each cluster that failed are dropped there,
//! as confirmation does for the last one.
//!
//! Nothing is retried once a byte of the request may have reached an engine: only
//! connect failures are retried (hyper-util's pool already resends a request whose
//! reused connection closed before it was written), and only while the body is
//! untouched. The body sits in a [`BodySlot`] that the first read empties; a retry sends
//! the same body again only if the failed attempt never took it. A buffered body (keying
//! read it whole) and a streamed one are treated alike: the engine client reads the body
//! only after connecting, so a connect failure leaves either in its slot.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use grid_route_layer::confirm::Verdict;
use grid_route_layer::grid::{ClusterId, Grid, GridView};
use grid_route_layer::index::PrefixIndex;
use grid_route_layer::route::{
    BoxError, Candidates, DispatchError, Pinned, Prompt, RequestModel, find_source,
};
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tower::{Layer, Service, ServiceExt};

use super::upstream::ConnectFailed;

/// Retries connect failures on the next candidate. See the [module docs](self).
#[derive(Clone)]
pub(crate) struct RetryLayer {
    grid: Grid,
    index: Arc<PrefixIndex>,
    max_attempts: u32,
}

impl RetryLayer {
    pub(crate) fn new(grid: Grid, index: Arc<PrefixIndex>, max_attempts: u32) -> Self {
        Self {
            grid,
            index,
            max_attempts: max_attempts.max(1),
        }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`RetryLayer`].
#[derive(Clone)]
pub(crate) struct Retry<S> {
    inner: S,
    layer: RetryLayer,
}

impl<S> fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("max_attempts", &self.layer.max_attempts)
            .finish_non_exhaustive()
    }
}

impl<S, ResB> Service<Request<Body>> for Retry<S>
where
    S: Service<Request<Body>, Response = Response<ResB>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each attempt waits for the inner service's readiness itself (a oneshot).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let layer = self.layer.clone();
        Box::pin(async move { layer.send(inner, request).await })
    }
}

impl RetryLayer {
    async fn send<S, ResB>(
        &self,
        inner: S,
        request: Request<Body>,
    ) -> Result<Response<ResB>, BoxError>
    where
        S: Service<Request<Body>, Response = Response<ResB>, Error = BoxError> + Clone,
    {
        let (parts, body) = request.into_parts();
        let slot = BodySlot::new(body);
        let mut failed: Vec<ClusterId> = Vec::new();
        let mut candidates: Option<Candidates> = None;
        let mut attempt = 1;
        loop {
            let mut request = Request::new(slot.body());
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = parts.uri.clone();
            *request.version_mut() = parts.version;
            *request.headers_mut() = parts.headers.clone();
            *request.extensions_mut() = parts.extensions.clone();
            if let Some(candidates) = &candidates {
                request.extensions_mut().insert(candidates.clone());
            }
            let error = match inner.clone().oneshot(request).await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            let Some(cluster) = DispatchError::find_in(&*error).map(|d| d.cluster().clone()) else {
                return Err(error);
            };
            if attempt >= self.max_attempts
                || find_source::<ConnectFailed>(&*error).is_none()
                || !slot.untouched()
            {
                return Err(error);
            }
            // Confirmation drops the keys, session and thread of the last failure; the earlier
            // ones are ours.
            if let Some(prompt) = parts.extensions.get::<Prompt>() {
                Verdict::of_failed_connection().apply_to_request(
                    &self.index,
                    &cluster,
                    prompt.keys().ok(),
                    prompt.session().into_iter().chain(prompt.thread()),
                    Instant::now(),
                );
            }
            if !failed.contains(&cluster) {
                failed.push(cluster.clone());
            }
            let next = next_candidates(&self.grid.view(), &parts.extensions, &cluster, &failed);
            if next.is_empty() {
                return Err(error);
            }
            tracing::info!(
                cluster = %cluster,
                attempt,
                next = next.len(),
                "could not connect; trying the next candidate"
            );
            candidates = Some(next);
            attempt += 1;
        }
    }
}

/// Where a request goes after `cluster` failed to connect: `cluster` again while it has
/// a healthy endpoint; else, unless pinned there, its other admitted candidates, or every
/// admitted cluster serving its model when affinity left it none; never a cluster in
/// `failed` but `cluster` itself.
fn next_candidates(
    view: &GridView,
    extensions: &http::Extensions,
    cluster: &ClusterId,
    failed: &[ClusterId],
) -> Candidates {
    if view.cluster(cluster).is_some_and(|c| c.admits()) {
        return Candidates::new(vec![cluster.clone()]);
    }
    if extensions.get::<Pinned>().is_some() {
        return Candidates::new(Vec::new());
    }
    let admitted =
        |id: &&ClusterId| !failed.contains(id) && view.cluster(id).is_some_and(|c| c.admits());
    let others: Vec<ClusterId> = extensions
        .get::<Candidates>()
        .map(|c| c.as_slice().iter().filter(admitted).cloned().collect())
        .unwrap_or_default();
    if !others.is_empty() {
        return Candidates::new(others);
    }
    // The model the request names, keyed or not: a body over the keying limit or an
    // unkeyed API still names one, and only clusters serving it may take the request.
    let model = RequestModel::of(extensions);
    let serving: Vec<ClusterId> = view
        .candidates(model)
        .iter()
        .map(|c| c.id().clone())
        .filter(|id| !failed.contains(id))
        .collect();
    Candidates::new(serving)
}

/// A request body that can be sent again as long as no attempt read from it.
#[derive(Clone)]
struct BodySlot(Arc<Mutex<Option<Body>>>);

impl BodySlot {
    fn new(body: Body) -> Self {
        Self(Arc::new(Mutex::new(Some(body))))
    }

    /// A body for one attempt: it takes the real body out of the slot at its first read.
    fn body(&self) -> Body {
        Body::new(SlotBody {
            slot: self.clone(),
            body: None,
        })
    }

    /// Whether no attempt has read from the body.
    fn untouched(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn take(&self) -> Option<Body> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn peek<T>(&self, f: impl FnOnce(&Body) -> T) -> Option<T> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(f)
    }
}

struct SlotBody {
    slot: BodySlot,
    body: Option<Body>,
}

impl HttpBody for SlotBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.body.is_none() {
            let Some(body) = self.slot.take() else {
                // Another attempt read the body: never send a part of it as the whole.
                return Poll::Ready(Some(Err(axum::Error::new(BodyGone))));
            };
            self.body = Some(body);
        }
        match self.body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(body) => body.is_end_stream(),
            None => self.slot.peek(Body::is_end_stream).unwrap_or(false),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(body) => body.size_hint(),
            None => self.slot.peek(Body::size_hint).unwrap_or_default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body was read by an earlier attempt")]
struct BodyGone;
