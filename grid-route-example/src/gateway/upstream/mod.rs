//! Sending requests to the engines: one pooled HTTP client ([`client`]), one service per
//! endpoint ([`endpoint`], reporting to outlier detection through [`watch`], with requests
//! rewritten for the engine by [`request`]), and `tower::balance` p2c over each cluster's
//! endpoints (here).
//!
//! - **The client** is hyper-util's pooled HTTP/1.1 client, shared by every endpoint and
//!   the queue poller. Connecting times out after `timeouts.upstream_connect_ms`.
//! - **TimeoutSettings**: the response head must come within `timeouts.upstream_first_byte_secs`
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

mod client;
mod endpoint;
mod request;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Body;
use grid_route_layer::grid::{Cluster, Grid};
use grid_route_layer::select::Select;
use http::Request;
use tower::Service;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequests};

pub use client::{CONNECT_TIMEOUT, POOL_IDLE_TIMEOUT};
pub(crate) use client::{HttpClient, http_client, send};
pub(crate) use endpoint::{ConnectFailed, Endpoint, UpstreamTimeout};

use super::outlier::Outliers;
use crate::config::{CheckedConfig, TimeoutSettings};

/// Requests a cluster's balancer queues while it picks endpoints.
pub const CLUSTER_QUEUE_CAPACITY: usize = 1024;

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
    pub(crate) timeouts: TimeoutSettings,
    /// How often an unhealthy endpoint re-checks whether it may take requests.
    pub(crate) recheck_every: Duration,
}

impl EngineSettings {
    /// What `checked` asks of the endpoints. The connect timeout belongs to the client:
    /// the `previous` settings' client (and its pooled connections) is kept unless that
    /// timeout changed, which needs a new client with a new pool.
    pub(crate) fn of(checked: &CheckedConfig, previous: Option<&Self>) -> Self {
        let connect = checked.timeouts.upstream_connect;
        let client = match previous {
            Some(previous) if previous.timeouts.upstream_connect == connect => {
                previous.client.clone()
            }
            _ => http_client(connect),
        };
        Self {
            client,
            timeouts: checked.timeouts,
            recheck_every: checked.poll_interval,
        }
    }
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
            let endpoint = Endpoint::new(parts, cluster, url);
            PendingRequests::new(endpoint, CompleteOnResponse::default())
        })
        .collect();
    Buffer::new(
        Balance::new(ServiceList::new(endpoints)),
        CLUSTER_QUEUE_CAPACITY,
    )
}
