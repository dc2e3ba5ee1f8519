//! Sending requests to the engines: one pooled HTTP client, one service per endpoint, and
//! `tower::balance` p2c over each cluster's endpoints.
//!
//! - **The client** is hyper-util's pooled HTTP/1.1 client, shared by every endpoint and
//!   the queue poller. Connecting times out after `timeouts.upstream_connect_ms`.
//! - **Timeouts**: the response head must come within `timeouts.upstream_first_byte_secs`
//!   of sending the request (a long prompt's prefill can take minutes), else the request
//!   fails with [`UpstreamTimeout`] (a 504); after the head, each chunk of the answer must
//!   come within `timeouts.upstream_idle_secs` of the previous one, else the answer's
//!   body fails and the client's stream is cut (an aborted chunked encoding, not a clean
//!   end). An answer that fails mid-stream, for that reason or because the engine died,
//!   is logged as a failure with its site, cluster and endpoint.
//! - **Failures feed outlier ejection** (see `gateway/outlier.rs`): 5xx heads, failed
//!   connects, timeouts and answers that die mid-stream count; a clean end resets.
//! - **Bodies stream both ways**: the request body is handed to the client as it comes
//!   (bytes as sent, or the buffered bytes keying read), the response body is returned as
//!   the client's incoming body, frame by frame — SSE events flow as the engine writes
//!   them.
//! - **Headers**: hop-by-hop headers (`connection` and those it names, `keep-alive`,
//!   `proxy-connection`, `te`, `trailer`, `transfer-encoding`, `upgrade`) are dropped both
//!   ways; `host` becomes the endpoint's authority; everything else passes untouched.
//! - **Health**: a request that cannot connect marks its endpoint unhealthy in the grid's
//!   [`ClusterLoad`](grid_route_layer::grid::ClusterLoad), until the queue poller next
//!   reads its metrics. Other transport failures (a reset mid-answer) fail that request
//!   (a 502, and confirmation drops its keys) but are not taken as the endpoint being
//!   down. An unhealthy endpoint takes no request inside its cluster while a sibling is
//!   healthy (it reports not ready, and re-checks every poll interval); a cluster with no
//!   healthy endpoint is not admitted, and a request that had already chosen it tries its
//!   endpoints anyway rather than wait.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use axum::body::Body;
use grid_route_layer::grid::{Cluster, ClusterId, Grid};
use grid_route_layer::metrics::{CLUSTER_LABEL, SITE_LABEL};
use grid_route_layer::route::{BoxError, BufferedBody};
use grid_route_layer::select::Select;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::Service;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequests};

use super::idle_body::IdleTimeoutBody;
use super::outlier::{Change, Event, Outliers};
use super::telemetry::EJECTIONS_TOTAL;
use crate::config::Timeouts;

/// How long connecting to an engine may take by default (`timeouts.upstream_connect_ms`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an idle pooled connection to an engine is kept for reuse.
///
/// Below the 5 s after which the engines' HTTP servers close an idle keep-alive connection
/// (uvicorn's `timeout_keep_alive`, which vLLM's and SGLang's servers run with, and
/// cpp-httplib's keep-alive timeout in llama.cpp's `llama-server`). A connection the server
/// is closing at the moment the gateway reuses it fails the request after its bytes were
/// written, so the gateway must not hold connections that long (this used to be 90 s).
/// `llama-server` also closes a connection right after each streamed answer, whatever
/// its headers say; the engine client sends a buffered request again in that case.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Requests a cluster's balancer queues while it picks endpoints.
pub const CLUSTER_QUEUE_CAPACITY: usize = 1024;

/// The pooled HTTP client that reaches every engine.
pub(crate) type HttpClient = Client<HttpConnector, Body>;

/// Builds the gateway's engine client, connecting within `connect_timeout`.
pub(crate) fn http_client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One endpoint's service inside its cluster's p2c balancer.
type Balanced = PendingRequests<Endpoint, CompleteOnResponse>;
type ClusterBalance = Balance<ServiceList<Vec<Balanced>>, Request<Body>>;

/// A cluster's service: p2c over its endpoints, behind a buffer so that it is cheap to
/// clone for each request.
pub(crate) type ClusterService =
    Buffer<Request<Body>, <ClusterBalance as Service<Request<Body>>>::Future>;

/// What every endpoint reads afresh for each request, so that a reload changing it
/// reaches the balancers in place instead of rebuilding them (and losing their load).
pub(crate) struct EngineSettings {
    /// Replaced when `timeouts.upstream_connect_ms` changes (a new pool with it).
    pub(crate) client: HttpClient,
    pub(crate) timeouts: Timeouts,
    /// How often an unhealthy endpoint re-checks whether it may take requests.
    pub(crate) recheck_every: Duration,
}

/// The engine settings in force, shared by the gateway (which swaps them on reload) and
/// every endpoint service.
pub(crate) type SharedEngineSettings = Arc<ArcSwap<EngineSettings>>;

/// What every endpoint service shares, for the gateway's whole life.
#[derive(Clone)]
pub(crate) struct EngineParts {
    pub(crate) settings: SharedEngineSettings,
    pub(crate) grid: Grid,
    pub(crate) outliers: Arc<Outliers>,
}

/// Builds a cluster's service from its [`Cluster`]: what [`Balancers`] calls for a
/// cluster it has no service for yet, or whose endpoints changed.
pub(crate) type ClusterFactory = Box<dyn Fn(&Cluster) -> ClusterService + Send + Sync>;

/// Every cluster's balancer, built on first use and kept across reloads: `Select` drops
/// a cluster's service only when the cluster leaves the grid or its endpoints change, so a
/// reload that leaves a cluster's endpoints alone keeps its balancer and the requests
/// pending on each endpoint (what p2c weighs).
pub(crate) type Balancers = Select<ClusterService, ClusterFactory>;

/// The gateway's balancers over `parts`, one per cluster as requests reach them.
pub(crate) fn balancers(parts: EngineParts) -> Balancers {
    let grid = parts.grid.clone();
    let factory: ClusterFactory =
        Box::new(move |cluster: &Cluster| cluster_service(&parts, cluster));
    Select::new(grid, factory)
}

/// Builds `cluster`'s service: p2c (by requests pending) over one [`Endpoint`] each.
fn cluster_service(parts: &EngineParts, cluster: &Cluster) -> ClusterService {
    let endpoints: Vec<Balanced> = cluster
        .endpoints()
        .iter()
        .map(|url| {
            let endpoint = Endpoint {
                settings: Arc::clone(&parts.settings),
                base: Arc::new(BaseUrl::new(url)),
                watch: Arc::new(EndpointWatch {
                    grid: parts.grid.clone(),
                    cluster: cluster.id().clone(),
                    url: Arc::clone(url),
                    outliers: Arc::clone(&parts.outliers),
                }),
                recheck: None,
            };
            PendingRequests::new(endpoint, CompleteOnResponse::default())
        })
        .collect();
    Buffer::new(
        Balance::new(ServiceList::new(endpoints)),
        CLUSTER_QUEUE_CAPACITY,
    )
}

/// An endpoint's base URL, split for joining request paths onto it.
struct BaseUrl {
    /// As configured: how the grid names the endpoint.
    url: Arc<str>,
    /// `http://host:port`.
    origin: String,
    /// The path prefix without a trailing `/` (often empty).
    prefix: String,
    /// The `host` header to send.
    host: Option<HeaderValue>,
}

impl BaseUrl {
    fn new(url: &Arc<str>) -> Self {
        // Config validation parsed every endpoint URL already; a URL that would not parse
        // here leaves an empty origin and every request fails with a clear error.
        let parsed = url.parse::<Uri>().ok();
        let authority = parsed.as_ref().and_then(|uri| uri.authority().cloned());
        let origin = authority
            .as_ref()
            .map(|a| format!("http://{a}"))
            .unwrap_or_default();
        let prefix = parsed
            .as_ref()
            .map(|uri| uri.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let host = authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        Self {
            url: Arc::clone(url),
            origin,
            prefix,
            host,
        }
    }

    /// The engine URI for a request to `uri` (its path and query, under the prefix).
    fn join(&self, uri: &Uri) -> Result<Uri, BoxError> {
        let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let joined = format!("{}{}{}", self.origin, self.prefix, path_and_query);
        joined
            .parse()
            .map_err(|error| format!("bad engine URL {joined:?}: {error}").into())
    }
}

/// Sends requests to one engine endpoint. See the [module docs](self).
pub(crate) struct Endpoint {
    settings: SharedEngineSettings,
    base: Arc<BaseUrl>,
    watch: Arc<EndpointWatch>,
    recheck: Option<Pin<Box<Sleep>>>,
}

/// Where an endpoint's failures are reported: its outlier record, its health in the
/// grid, the log and the ejection counter.
struct EndpointWatch {
    grid: Grid,
    cluster: ClusterId,
    url: Arc<str>,
    outliers: Arc<Outliers>,
}

impl EndpointWatch {
    /// Records `event`; an ejection or a 429's hold marks the endpoint unhealthy, and an
    /// ejection is counted and logged.
    fn report(&self, event: Event) {
        let change = self
            .outliers
            .record(&self.cluster, &self.url, event, Instant::now());
        self.act_on(change);
    }

    fn act_on(&self, change: Change) {
        match change {
            Change::None => return,
            Change::Ejected { length, nth } | Change::Stalled { length, nth } => {
                metrics::counter!(
                    EJECTIONS_TOTAL,
                    SITE_LABEL => Arc::clone(self.cluster.site().as_arc()),
                    CLUSTER_LABEL => Arc::clone(self.cluster.name_arc())
                )
                .increment(1);
                let why = if matches!(change, Change::Stalled { .. }) {
                    "wedged: a request has waited far longer for its answer than the grid's \
                     answers take; out until it answers"
                } else {
                    "failures in a row"
                };
                tracing::warn!(
                    site = %self.cluster.site(),
                    cluster = self.cluster.name(),
                    endpoint = %self.url,
                    secs = length.as_secs(),
                    nth,
                    why,
                    "endpoint ejected"
                );
            }
            Change::HeldOut(length) => {
                tracing::info!(
                    site = %self.cluster.site(),
                    cluster = self.cluster.name(),
                    endpoint = %self.url,
                    secs = length.as_secs(),
                    "endpoint answered 429; held out for its Retry-After"
                );
            }
        }
        if let Some(cluster) = self.grid.view().cluster(&self.cluster) {
            cluster.load().set_endpoint_healthy(&self.url, false);
        }
    }

    /// Whether the endpoint's own queue gauge read a waiting request in the queue window:
    /// then a request waiting for its head is queued there, not lost.
    fn queue_explains_wait(&self) -> bool {
        self.grid
            .view()
            .cluster(&self.cluster)
            .is_some_and(|cluster| {
                cluster
                    .load()
                    .endpoint_queue_depth(&self.url, Instant::now())
                    .is_some_and(|waiting| waiting >= 1.0)
            })
    }

    /// Reports what an answer's head says about the endpoint: it answered (which ends a
    /// stall), 5xx a failure, 429 with a `Retry-After` a hold; anything else waits for the
    /// body's end. `took` is the time from sending the request, when it counts among the
    /// grid's heads.
    fn report_head(&self, status: StatusCode, headers: &HeaderMap, took: Option<Duration>) {
        self.report(Event::Answered);
        if status.is_server_error() {
            self.report(Event::Failure);
            return;
        }
        if let Some(took) = took.filter(|_| !status.is_client_error()) {
            self.outliers.head_took(took);
        }
        if status == StatusCode::TOO_MANY_REQUESTS
            && let Some(wait) = headers
                .get(header::RETRY_AFTER)
                .and_then(|v| retry_after(v, SystemTime::now()))
        {
            self.report(Event::Throttled(wait));
        }
    }
}

/// A `Retry-After` value: delay seconds (digits; too many to hold are taken as the
/// longest wait, which the outlier record bounds) or an HTTP date, as RFC 9110 §10.2.3
/// allows; a date in the past is no wait. `None` when it is neither.
fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            text.parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A request that stalled, until it ends however it ends (answered, failed, or dropped
/// with a client that gave up): while it waits, its endpoint stays out.
struct StallGuard {
    watch: Arc<EndpointWatch>,
    epoch: u64,
}

impl StallGuard {
    fn report(watch: &Arc<EndpointWatch>, waited: Duration) -> Self {
        let (change, epoch) =
            watch
                .outliers
                .record_stall(&watch.cluster, &watch.url, Instant::now());
        if change != Change::None {
            tracing::debug!(
                endpoint = %watch.url,
                waited_secs = waited.as_secs(),
                "request stalled"
            );
        }
        watch.act_on(change);
        Self {
            watch: Arc::clone(watch),
            epoch,
        }
    }
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.watch.report(Event::StallEnded { epoch: self.epoch });
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.base.url)
            .field("cluster", &self.watch.cluster)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Whether this endpoint should take requests: it is healthy, or no endpoint of its
    /// cluster is (a request that chose the cluster then tries rather than waits). An
    /// endpoint whose cluster left the grid takes requests: its service is being dropped.
    fn takes_requests(&self) -> bool {
        let view = self.watch.grid.view();
        let Some(cluster) = view.cluster(&self.watch.cluster) else {
            return true;
        };
        let load = cluster.load();
        load.endpoint_healthy(&self.base.url).unwrap_or(true) || !load.any_healthy()
    }
}

impl Service<Request<Body>> for Endpoint {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            if self.takes_requests() {
                self.recheck = None;
                return Poll::Ready(Ok(()));
            }
            let every = self.settings.load().recheck_every;
            let sleep = self
                .recheck
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
            ready!(sleep.as_mut().poll(cx));
            self.recheck = None;
        }
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (client, timeouts) = {
            let settings = self.settings.load();
            (settings.client.clone(), settings.timeouts)
        };
        let base = Arc::clone(&self.base);
        let watch = Arc::clone(&self.watch);
        Box::pin(async move {
            // Only a request whose body is held whole can be judged by its head's delay: a
            // streamed body may be a slow upload.
            let buffered = request.extensions().get::<BufferedBody>().is_some();
            let request = to_engine(request, &base)?;
            let first_byte = timeouts.upstream_first_byte;
            let stall_after = watch.outliers.stall_after(first_byte).filter(|_| buffered);
            let sent_at = Instant::now();
            let send = send_through_closing_connections(&client, request, &base.url);
            // Past `stall_after` without a head, and with no queue at the engine to explain
            // it, the endpoint counts as wedged; the request waits on (until its own
            // timeout), holding the endpoint out until it ends.
            let mut stalled = None;
            let watched = async {
                tokio::pin!(send);
                loop {
                    let Some(after) = stall_after.filter(|_| stalled.is_none()) else {
                        break (&mut send).await;
                    };
                    tokio::select! {
                        result = &mut send => break result,
                        () = tokio::time::sleep(after) => {
                            // Any head from the endpoint in the last `after` (all of this
                            // request's wait, at the first check) says it still answers.
                            let since = Instant::now().checked_sub(after).unwrap_or(sent_at);
                            let answering =
                                watch.outliers.answered_since(&watch.cluster, &watch.url, since);
                            if !answering && !watch.queue_explains_wait() {
                                stalled = Some(StallGuard::report(&watch, sent_at.elapsed()));
                            }
                        }
                    }
                }
            };
            let outcome = tokio::time::timeout(first_byte, watched).await;
            let was_stalled = stalled.is_some();
            drop(stalled);
            match outcome {
                Ok(Ok(response)) => {
                    let status = response.status();
                    // A stalled request's head says how long a wedge lasted, not how long
                    // answers take: it is not one of the grid's heads.
                    let took = (!was_stalled).then(|| sent_at.elapsed());
                    watch.report_head(status, response.headers(), took);
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    let body = WatchedBody {
                        body: IdleTimeoutBody::new(timeouts.upstream_idle, body),
                        // A 5xx was counted at its head; a 4xx says nothing either way.
                        success_counts: !status.is_client_error() && !status.is_server_error(),
                        watch: Some(watch),
                    };
                    Ok(Response::from_parts(parts, Body::new(body)))
                }
                Ok(Err(error)) if error.is_connect() => {
                    watch.report(Event::Failure);
                    if let Some(cluster) = watch.grid.view().cluster(&watch.cluster) {
                        cluster.load().set_endpoint_healthy(&base.url, false);
                        tracing::warn!(
                            cluster = %cluster.id(),
                            endpoint = %base.url,
                            %error,
                            "endpoint unreachable; marked unhealthy until its metrics read again"
                        );
                    }
                    Err(Box::new(ConnectFailed(error)) as BoxError)
                }
                Ok(Err(error)) => Err(error.into()),
                Err(_elapsed) => {
                    watch.report(Event::Failure);
                    tracing::warn!(
                        site = %watch.cluster.site(),
                        cluster = watch.cluster.name(),
                        endpoint = %watch.url,
                        secs = first_byte.as_secs(),
                        "engine sent no response head in time"
                    );
                    Err(Box::new(UpstreamTimeout { after: first_byte }) as BoxError)
                }
            }
        })
    }
}

pin_project! {
    /// An engine's answer on its way to the client: a failure mid-stream (the engine died
    /// or went quiet) is logged with the site and cluster and counted against the
    /// endpoint; a clean end of a 2xx (or 1xx, 3xx) answer counts for it.
    struct WatchedBody<B> {
        #[pin]
        body: B,
        success_counts: bool,
        // Taken at the first outcome, so each answer reports once.
        watch: Option<Arc<EndpointWatch>>,
    }
}

impl<B> HttpBody for WatchedBody<B>
where
    B: HttpBody<Error = BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut body = this.body;
        let frame = ready!(body.as_mut().poll_frame(cx));
        // hyper stops polling a body of known length after its last byte, so the end is
        // also seen through `is_end_stream`, not only as a `None`.
        let ended = match &frame {
            None => true,
            Some(Ok(_)) => body.is_end_stream(),
            Some(Err(_)) => false,
        };
        if ended {
            if let Some(watch) = this.watch.take()
                && *this.success_counts
            {
                watch.report(Event::Success);
            }
        } else if let Some(Err(error)) = &frame
            && let Some(watch) = this.watch.take()
        {
            tracing::warn!(
                site = %watch.cluster.site(),
                cluster = watch.cluster.name(),
                endpoint = %watch.url,
                %error,
                "engine answer failed mid-stream; the client's stream is cut"
            );
            watch.report(Event::Failure);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Connecting to the endpoint failed (refused, unreachable, or over
/// `timeouts.upstream_connect_ms`): nothing of the request reached an engine, so it may
/// be retried elsewhere.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect: {0}")]
pub(crate) struct ConnectFailed(#[source] hyper_util::client::legacy::Error);

/// The engine sent no response head within `timeouts.upstream_first_byte_secs`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no response head within {} s", after.as_secs())]
pub(crate) struct UpstreamTimeout {
    after: Duration,
}

/// How many times a request is sent in all when the engine keeps closing the pooled
/// connection it went out on before answering (see [`send_through_closing_connections`]).
const CLOSED_CONNECTION_ATTEMPTS: usize = 3;

/// Sends `request`, and sends it again on another connection when the engine closed the
/// pooled one before answering, if the body is held whole ([`BufferedBody`]: every keyed
/// request) — at most [`CLOSED_CONNECTION_ATTEMPTS`] times in all.
///
/// Why: llama.cpp's `llama-server` closes the connection after every streamed answer
/// while its headers promise keep-alive (`Keep-Alive: timeout=5, max=100`, no
/// `Connection: close`). A request the pool puts on that connection before it has seen the
/// close is written into a socket the engine will never read: the engine closes (or
/// resets) it without an answer. hyper-util resends a request only when the connection was
/// seen closed before writing, so this catches the rest. The engine read none of it, so
/// sending it again is safe; a streamed body cannot be sent again and gets the 502.
async fn send_through_closing_connections(
    client: &HttpClient,
    request: Request<Body>,
    url: &str,
) -> Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
    let (parts, body) = request.into_parts();
    let again = (parts.extensions.get::<BufferedBody>())
        .map(|buffered| (parts.clone(), buffered.bytes().clone()));
    let mut result = client.request(Request::from_parts(parts, body)).await;
    let Some((parts, bytes)) = again else {
        return result;
    };
    for attempt in 2..=CLOSED_CONNECTION_ATTEMPTS {
        match &result {
            Err(error) if closed_before_answering(error) => {
                tracing::info!(
                    endpoint = url,
                    attempt,
                    %error,
                    "engine closed the connection before answering; sending the request again"
                );
            }
            _ => return result,
        }
        let request = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        result = client.request(request).await;
    }
    result
}

/// Whether `error` says the connection closed (or was reset) after the request went out
/// and before any of the answer came back, rather than a failure to connect.
fn closed_before_answering(error: &hyper_util::client::legacy::Error) -> bool {
    if error.is_connect() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>()
            && (hyper.is_incomplete_message() || hyper.is_canceled())
        {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The request as the engine gets it: its URI, HTTP/1.1, hop-by-hop headers dropped and
/// `host` set to the endpoint; body untouched.
fn to_engine(request: Request<Body>, base: &BaseUrl) -> Result<Request<Body>, BoxError> {
    let (mut parts, body) = request.into_parts();
    parts.uri = base.join(&parts.uri)?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    match &base.host {
        Some(host) => {
            parts.headers.insert(header::HOST, host.clone());
        }
        None => {
            parts.headers.remove(header::HOST);
        }
    }
    Ok(Request::from_parts(parts, body))
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_refuses_the_rest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let read = |text: &str| retry_after(&HeaderValue::from_str(text).unwrap(), now);
        assert_eq!(read("120"), Some(Duration::from_secs(120)));
        assert_eq!(read(" 7 "), Some(Duration::from_secs(7)));
        // More digits than a u64 holds: the longest wait, which the outlier record bounds.
        assert_eq!(read("99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(
            read(&u64::MAX.to_string()),
            Some(Duration::from_secs(u64::MAX))
        );
        // 2015-10-21 07:28:00 GMT is `now`; a date 90 s later is a 90 s wait.
        assert_eq!(
            read("Wed, 21 Oct 2015 07:29:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(read("Wed, 21 Oct 2015 07:00:00 GMT"), Some(Duration::ZERO));
        for bad in [
            "",
            "-5",
            "1.5",
            "soon",
            "0x10",
            "Wed, 99 Oct 2015 07:29:30 GMT",
        ] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }

    /// An engine whose server closes a keep-alive connection idle for `keep_alive` when its
    /// next request arrives, without answering it: the moment a real server's idle close
    /// crosses the client's reuse. Answers every other request with a small 200.
    async fn closing_engine(keep_alive: Duration) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut answered: Option<std::time::Instant> = None;
                    let mut buffer = [0_u8; 4096];
                    // Each test request is one small GET: a read holds it whole.
                    while socket.read(&mut buffer).await.is_ok_and(|n| n > 0) {
                        if answered.is_some_and(|at| at.elapsed() >= keep_alive) {
                            return;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        answered = Some(std::time::Instant::now());
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn an_idle_connection_is_not_reused_once_an_engine_may_be_closing_it() {
        let engine = closing_engine(Duration::from_secs(5)).await;
        let client = http_client(CONNECT_TIMEOUT);
        let get = || {
            let request = http::Request::get(format!("{engine}/health"))
                .body(Body::empty())
                .unwrap();
            client.request(request)
        };
        assert_eq!(get().await.unwrap().status(), http::StatusCode::OK);
        // Idle past the engine's keep-alive: reusing the pooled connection would be
        // refused mid-request; a fresh one is answered.
        tokio::time::sleep(Duration::from_millis(5_200)).await;
        let answer = get().await;
        assert!(
            answer
                .as_ref()
                .is_ok_and(|a| a.status() == http::StatusCode::OK),
            "{:?}",
            answer.err()
        );
    }

    #[test]
    fn request_paths_join_under_the_endpoints_prefix() {
        let join = |base: &str, path: &str| {
            BaseUrl::new(&Arc::from(base))
                .join(&path.parse().unwrap())
                .unwrap()
                .to_string()
        };
        assert_eq!(
            join("http://10.0.0.1:8000", "/v1/chat/completions?x=1"),
            "http://10.0.0.1:8000/v1/chat/completions?x=1"
        );
        assert_eq!(
            join("http://10.0.0.1:8000/", "/v1/models"),
            "http://10.0.0.1:8000/v1/models"
        );
        assert_eq!(
            join("http://engine:8000/pool-a/", "/v1/models"),
            "http://engine:8000/pool-a/v1/models"
        );
    }

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-private, close"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }

    #[test]
    fn the_engine_request_names_the_endpoint_as_host() {
        let base = BaseUrl::new(&Arc::from("http://10.0.0.1:8000/pool"));
        let request = Request::builder()
            .uri("/v1/completions")
            .version(Version::HTTP_10)
            .header(header::HOST, "gateway.example")
            .header(header::CONNECTION, "keep-alive")
            .body(Body::empty())
            .unwrap();
        let request = to_engine(request, &base).unwrap();
        assert_eq!(request.uri(), "http://10.0.0.1:8000/pool/v1/completions");
        assert_eq!(request.headers()[header::HOST], "10.0.0.1:8000");
        assert_eq!(request.version(), Version::HTTP_11);
        assert!(request.headers().get(header::CONNECTION).is_none());
    }
}
