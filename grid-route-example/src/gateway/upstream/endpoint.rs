//! One engine endpoint's service: it waits while the endpoint is unhealthy, sends the
//! request through the client within the first-byte timeout, watches for a wedged
//! engine, and returns the answer with its body watched to the end.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::body::Body;
use grid_route_layer::grid::Cluster;
use grid_route_layer::route::{BoxError, BufferedBody, Prompt};
use http::{Request, Response};
use tokio::time::Sleep;
use tower::Service;

use super::super::idle_body::IdleTimeoutBody;
use super::super::outlier::{AnswerKind, Event};
use super::client::send_through_closing_connections;
use super::request::{BaseUrl, strip_hop_by_hop, to_engine};
use super::watch::{EndpointWatch, StallGuard, WatchedBody};
use super::{EngineParts, SharedEngineSettings};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Sends requests to one engine endpoint. See the [module docs](self).
pub(crate) struct Endpoint {
    settings: SharedEngineSettings,
    base: Arc<BaseUrl>,
    watch: Arc<EndpointWatch>,
    recheck: Option<Pin<Box<Sleep>>>,
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
    /// The service for endpoint `url` of `cluster`.
    pub(super) fn new(parts: &EngineParts, cluster: &Cluster, url: &Arc<str>) -> Self {
        Self {
            settings: Arc::clone(&parts.settings),
            base: Arc::new(BaseUrl::new(url)),
            watch: Arc::new(EndpointWatch {
                grid: parts.grid.clone(),
                cluster: cluster.id().clone(),
                url: Arc::clone(url),
                outliers: Arc::clone(&parts.outliers),
            }),
            recheck: None,
        }
    }

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
            let kind = if request
                .extensions()
                .get::<Prompt>()
                .is_some_and(Prompt::streamed)
            {
                AnswerKind::Stream
            } else {
                AnswerKind::Whole
            };
            let request = to_engine(request, &base)?;
            let first_byte = timeouts.upstream_first_byte;
            let stall_after = watch
                .outliers
                .stall_after(kind, first_byte)
                .filter(|_| buffered);
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
                    let took = (!was_stalled).then(|| (kind, sent_at.elapsed()));
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
