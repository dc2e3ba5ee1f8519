//! [`PinService`]: reads the tagged ids a request names, pins it to their cluster (or
//! answers it), and marks the answers whose ids get tagged.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_LENGTH, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri};
use tower::{Layer, Service};

use super::body::PinBody;
use super::future::ResponseFuture;
use super::layer::{PinKeys, PinLayer, Shared};
use super::reference::{
    BodyId, BodyIds, CONVERSATIONS_PATH, RESPONSES_PATH, StoredPath, is_stored_state_api, splice,
};
use super::tag::{BadTag, IdKind, TagKeys, UntaggedId};
use crate::answer::ErrorAnswer;
use crate::grid::{Cluster, ClusterId, Grid};
use crate::metrics::{OUTCOME_LABEL, PIN_TOTAL};
use crate::route::{BufferedBody, Pinned, RequestModel, record_on_span};
use crate::select::least_loaded;

/// The `Retry-After` of a 503 for a pinned cluster that admits no new request, in
/// seconds.
pub const RETRY_AFTER_SECS: u64 = 5;

/// The service [`PinLayer`](super::PinLayer) wraps around an inner service.
#[derive(Clone)]
pub struct PinService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> PinService<S> {
    /// Pins `inner`'s requests to the clusters of `grid`, checking and writing tags with
    /// `keys`: the service `PinLayer::new(grid, keys)` builds.
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use bytes::Bytes;
    /// use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
    /// use grid_route_layer::pin::{IdKind, PinKeys, PinService};
    /// use grid_route_layer::route::Pinned;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::{ServiceExt, service_fn};
    ///
    /// let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
    ///     .with_models(["m"])
    ///     .with_endpoints(["http://10.0.0.1:8000"])])]);
    /// let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    /// let east_a = grid.view().clusters()[0].id().clone();
    /// let keys = PinKeys::default();
    /// let tagged = keys.stamp(east_a.site(), east_a.digest()).tag(IdKind::Response, "resp_1").unwrap();
    ///
    /// // Answers 200 when the request reached it pinned to east-a.
    /// let pinned_to = east_a.clone();
    /// let inner = service_fn(move |req: Request<Full<Bytes>>| {
    ///     let pinned = req.extensions().get::<Pinned>().map(|p| p.cluster() == &pinned_to);
    ///     let mut response = Response::new(Full::<Bytes>::default());
    ///     if pinned != Some(true) {
    ///         *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    ///     }
    ///     async move { Ok::<_, Infallible>(response) }
    /// });
    /// let service = PinService::new(inner, grid, keys);
    /// let request = Request::get(format!("/v1/responses/{tagged}")).body(Full::default()).unwrap();
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let response = service.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), StatusCode::OK);
    /// # });
    /// ```
    pub fn new(inner: S, grid: Grid, keys: PinKeys) -> Self {
        PinLayer::new(grid, keys).layer(inner)
    }

    pub(crate) fn with_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    crate::define_inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for PinService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinService")
            .field("inner", &self.inner)
            .field("keys", &self.shared.keys)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PinService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: From<Bytes>,
{
    type Response = Response<PinBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        if let Err(answer) = self.pin(&mut request) {
            return ResponseFuture::answer(answer);
        }
        if !is_stored_state_api(request.uri().path()) {
            return ResponseFuture::forwarded(self.inner.call(request), None);
        }
        // The answer's ids are rewritten on the way out, which needs the bytes as the
        // engine wrote them: ask for no content coding.
        request
            .headers_mut()
            .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        let keys = self.shared.keys.clone();
        ResponseFuture::forwarded(self.inner.call(request), Some(keys))
    }
}

/// How a pinning decision is counted in `grid_route_pin_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pinned,
    Gone,
    Unavailable,
    BadTag,
    ModelNotServed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::Gone => "gone",
            Self::Unavailable => "unavailable",
            Self::BadTag => "bad_tag",
            Self::ModelNotServed => "model_not_served",
        }
    }

    fn count(self) {
        metrics::counter!(PIN_TOTAL, OUTCOME_LABEL => self.as_str()).increment(1);
        record_on_span("outcome", self.as_str());
    }
}

/// Where a request named an id: the URI path or a body field.
#[derive(Debug, Clone, Copy)]
enum Place {
    Path,
    Field(&'static str),
}

impl<S> PinService<S> {
    /// Pins `request` when it names stored state (rewriting its path or body to the
    /// engine's ids), or says how to refuse it. Requests that name nothing pass as they
    /// are.
    fn pin<B: From<Bytes>>(&self, request: &mut Request<B>) -> Result<(), ErrorAnswer> {
        let now = Instant::now();
        let keys = self.shared.keys.load();
        let model = RequestModel::of(request.extensions());
        let by_path = StoredPath::read(request.uri().path())
            .map(|stored| self.pin_path(&keys, &stored, request.uri(), model));
        if let Some(pinned) = by_path {
            let (cluster, uri) = pinned?;
            *request.uri_mut() = uri;
            pin_to(request, cluster, "path");
            return Ok(());
        }
        if request.method() != Method::POST {
            return Ok(());
        }
        match request.uri().path() {
            RESPONSES_PATH => self.pin_body(&keys, request),
            CONVERSATIONS_PATH => {
                let cluster = self.new_conversation_cluster(now)?;
                pin_to(request, cluster, "new_conversation");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Checks the id segment of a stored-state path and the segments after it; returns the
    /// cluster and the URI with the engine's id in place of the tag (query kept).
    fn pin_path(
        &self,
        keys: &TagKeys,
        stored: &StoredPath<'_>,
        uri: &Uri,
        model: Option<&str>,
    ) -> Result<(ClusterId, Uri), ErrorAnswer> {
        // The path is read as written, never percent-decoded: a tag holds only unreserved
        // characters, so a `%` anywhere makes the id unsafe and the core refuses it.
        let untagged = keys
            .untag(stored.kind, stored.id)
            .map_err(|bad| refuse_bad_tag(stored.kind, Place::Path, bad))?;
        if !stored.rest_is_plain() {
            return Err(refuse_bad_tag(stored.kind, Place::Path, BadTag::UnsafeId));
        }
        let cluster = self.admitted_cluster(&untagged, model)?;
        let mut path = stored.with_id(untagged.engine_id());
        if let Some(query) = uri.query() {
            path.push('?');
            path.push_str(query);
        }
        let mut parts = uri.clone().into_parts();
        // Both steps only fail on bytes a URI cannot hold; the path is made of plain
        // segments and the query was already valid. Refusing beats forwarding a tag.
        parts.path_and_query = PathAndQuery::try_from(path).ok();
        let uri = Uri::from_parts(parts)
            .map_err(|_| refuse_bad_tag(stored.kind, Place::Path, BadTag::UnsafeId))?;
        Ok((cluster, uri))
    }

    /// Pins a `POST /v1/responses` by its `previous_response_id` and `conversation`,
    /// splicing the engine's ids into the buffered body.
    fn pin_body<B: From<Bytes>>(
        &self,
        keys: &TagKeys,
        request: &mut Request<B>,
    ) -> Result<(), ErrorAnswer> {
        // A body keying did not buffer (over its limit, unreadable) streams through as
        // sent: it cannot be read without holding it all.
        let Some(buffered) = request.extensions().get::<BufferedBody>() else {
            return Ok(());
        };
        let body = buffered.bytes().clone();
        let model: Option<Arc<str>> = RequestModel::of(request.extensions()).map(Arc::from);
        let ids = match BodyIds::read(&body) {
            BodyIds::Found(ids) => ids,
            BodyIds::Duplicate(field) => return Err(refuse_duplicate(field)),
            // The engine answers a body it cannot parse; nothing here names a cluster.
            BodyIds::Unreadable => return Ok(()),
        };
        let mut tagged: Vec<(BodyId, UntaggedId)> = Vec::with_capacity(ids.len());
        for id in ids {
            let checked = match &id.text {
                Some(text) => keys.untag(id.kind, text),
                None => Err(BadTag::UnsafeId),
            };
            match checked {
                Ok(untagged) => tagged.push((id, untagged)),
                // An id the gateway never tagged: the engine is the judge of it, and the
                // request routes like any other.
                Err(BadTag::Untagged) => {
                    tracing::debug!(field = id.field, "untagged id in the body, not pinned");
                }
                Err(bad) => return Err(refuse_bad_tag(id.kind, Place::Field(id.field), bad)),
            }
        }
        let Some((_, first)) = tagged.first() else {
            return Ok(());
        };
        if tagged
            .iter()
            .any(|(_, other)| other.site() != first.site() || other.digest() != first.digest())
        {
            return Err(refuse_conflict());
        }
        let cluster = self.admitted_cluster(first, model.as_deref())?;
        let edits: Vec<(Range<usize>, &str)> = tagged
            .iter()
            .map(|(id, untagged)| (id.content.clone(), untagged.engine_id()))
            .collect();
        let rewritten = splice(&body, &edits);
        if request.headers().contains_key(CONTENT_LENGTH) {
            request
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
        }
        request
            .extensions_mut()
            .insert(BufferedBody::new(rewritten.clone()));
        *request.body_mut() = B::from(rewritten);
        pin_to(request, cluster, "body");
        Ok(())
    }

    /// The cluster a checked tag names, when it is in the grid, admits requests and serves
    /// the request's `model` (when the body named one): a pinned request still passes
    /// admission.
    fn admitted_cluster(
        &self,
        untagged: &UntaggedId,
        model: Option<&str>,
    ) -> Result<ClusterId, ErrorAnswer> {
        let view = self.shared.grid.view();
        let kind = untagged.kind();
        match view.by_tag(untagged.site().as_str(), untagged.digest()) {
            None => {
                Outcome::Gone.count();
                tracing::debug!(
                    outcome = Outcome::Gone.as_str(),
                    site = %untagged.site(),
                    digest = %untagged.digest(),
                    "pinned cluster left the grid"
                );
                Err(ErrorAnswer::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "No {} found with that id: the cluster that stored it is no longer \
                         part of this gateway.",
                        noun(kind)
                    ),
                )
                .code("stored_state_gone"))
            }
            Some(cluster) if !cluster.admits() => {
                Outcome::Unavailable.count();
                tracing::debug!(
                    outcome = Outcome::Unavailable.as_str(),
                    cluster = %cluster.id(),
                    "pinned cluster admits no new request"
                );
                Err(ErrorAnswer::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "The cluster that stores this {} is not taking requests right now; \
                         retry later.",
                        noun(kind)
                    ),
                )
                .code("stored_state_unavailable")
                .retry_after(RETRY_AFTER_SECS))
            }
            Some(cluster) if model.is_some_and(|m| !cluster.serves(m)) => {
                Outcome::ModelNotServed.count();
                tracing::debug!(
                    outcome = Outcome::ModelNotServed.as_str(),
                    cluster = %cluster.id(),
                    "pinned cluster does not serve the request's model"
                );
                Err(ErrorAnswer::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "The model {:?} is not served where this {} is stored.",
                        model.unwrap_or_default(),
                        noun(kind)
                    ),
                )
                .code("model_not_found")
                .param("model"))
            }
            Some(cluster) => Ok(cluster.id().clone()),
        }
    }

    /// Where a new conversation is stored: the least loaded admitted cluster of the local
    /// site, else the least loaded admitted cluster anywhere. Conversations name no model,
    /// so every admitted cluster may hold one.
    fn new_conversation_cluster(&self, now: Instant) -> Result<ClusterId, ErrorAnswer> {
        let view = self.shared.grid.view();
        let turn = self.shared.turn.fetch_add(1, Ordering::Relaxed);
        let admitted: Vec<&Arc<Cluster>> = view.clusters().iter().filter(|c| c.admits()).collect();
        let local = view.local_site().and_then(|site| {
            least_loaded(
                admitted.iter().copied().filter(|c| c.site() == site),
                now,
                turn,
            )
        });
        let Some(cluster) = local.or_else(|| least_loaded(admitted.iter().copied(), now, turn))
        else {
            Outcome::Unavailable.count();
            tracing::debug!(
                outcome = Outcome::Unavailable.as_str(),
                "no admitted cluster for a new conversation"
            );
            return Err(ErrorAnswer::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "No backend cluster is taking new conversations right now; retry later.",
            )
            .code("no_available_cluster")
            .retry_after(RETRY_AFTER_SECS));
        };
        Ok(cluster.id().clone())
    }
}

fn pin_to<B>(request: &mut Request<B>, cluster: ClusterId, by: &'static str) {
    Outcome::Pinned.count();
    tracing::debug!(outcome = Outcome::Pinned.as_str(), cluster = %cluster, by, "pinned");
    request.extensions_mut().insert(Pinned::new(cluster));
}

fn noun(kind: IdKind) -> &'static str {
    match kind {
        IdKind::Response => "response",
        IdKind::Conversation => "conversation",
    }
}

/// A 404 for an id that is not a tag this grid issued (or not one safe path segment).
fn refuse_bad_tag(kind: IdKind, place: Place, bad: BadTag) -> ErrorAnswer {
    Outcome::BadTag.count();
    tracing::debug!(
        outcome = Outcome::BadTag.as_str(),
        reason = bad.as_str(),
        ?place,
        "tagged id refused"
    );
    let answer = match place {
        Place::Path => ErrorAnswer::new(
            StatusCode::NOT_FOUND,
            format!("No {} found with the id in the path: {bad}.", noun(kind)),
        ),
        Place::Field(field) => ErrorAnswer::new(
            StatusCode::NOT_FOUND,
            format!("No {} found with the id in '{field}': {bad}.", noun(kind)),
        )
        .param(field),
    };
    answer.code("invalid_id")
}

fn refuse_duplicate(field: &'static str) -> ErrorAnswer {
    tracing::debug!(field, "duplicate stored-state field refused");
    ErrorAnswer::new(
        StatusCode::BAD_REQUEST,
        format!("The field '{field}' is given more than once."),
    )
    .code("duplicate_field")
    .param(field)
}

fn refuse_conflict() -> ErrorAnswer {
    tracing::debug!("previous_response_id and conversation name different clusters");
    ErrorAnswer::new(
        StatusCode::BAD_REQUEST,
        "'previous_response_id' and 'conversation' name state stored in different places; \
         give one of them.",
    )
    .code("conflicting_stored_state")
    .param("conversation")
}
