//! The default inner balancer: the least loaded candidate, through its cluster's service.
//!
//! Affinity decides *which clusters* may take a request ([`Candidates`]); something still
//! has to pick one and send the request there. [`Select`] picks the candidate with the
//! lowest routing load (the windowed worst queue depth, plus this replica's requests in
//! flight when the grid's `count_in_flight` is on, a stream at
//! [`STREAM_WEIGHT`](crate::grid::STREAM_WEIGHT), or whole while a slot engine's slots are
//! full: [`ClusterLoad::routing_load`](crate::grid::ClusterLoad::routing_load)), then the
//! fewest requests in flight from this replica, then the next in turn ([`least_loaded`]),
//! and dispatches to that cluster's service, which the gateway supplies through a factory
//! — typically a `tower::balance` p2c over the cluster's endpoints, since p2c balances
//! *inside* a cluster. It sets
//! [`Served`] on the answer for confirmation and pinning, counts
//! `grid_route_decisions_total{site,cluster}`, and turns any error of the cluster's
//! service into a [`DispatchError`] naming the cluster.
//!
//! - Candidates: the [`Candidates`] extension when set (ids that left the grid or stopped
//!   admitting since are skipped); else the [`Pinned`] cluster; else every admitted
//!   cluster serving the [`Prompt`]'s model (every admitted cluster without one).
//! - No candidate left: a [`NoCandidate`] error, which a gateway answers with a 404 when no
//!   cluster of the grid serves the request's model, else with a 503.
//! - A request carrying a [`SlotHold`](crate::route::SlotHold) for the chosen cluster (a
//!   new conversation where a slot just went idle) is sent once the hold ends, counted
//!   in flight meanwhile, and counted in `grid_route_slot_holds_total{site,cluster}`.
//! - On a cluster of engines with slots, a request that comes right behind another still
//!   waiting for its first token there is sent up to
//!   [`SLOT_PASS_SPACING`](crate::grid::SLOT_PASS_SPACING) after the one sent before it,
//!   and never later than that after it came
//!   ([`ClusterLoad::spaced_send`](crate::grid::ClusterLoad::spaced_send)), so that the
//!   engine prefills the two in separate passes; counted in
//!   `grid_route_pass_spacings_total{site,cluster}`.
//! - Both waits run on Tokio's timer: the runtime needs it enabled, as any hyper or axum
//!   server's has.
//! - `poll_ready` is always ready; the response future waits for the chosen cluster's
//!   service. The request counts in flight until its answer's body ends, as a stream
//!   from its first output ([`InFlightBody`]): engines send a stream's head, and a
//!   Responses stream's opening events, before they prefill it.
//!
//! # Example: p2c over each cluster's endpoints
//!
//! ```
//! use std::convert::Infallible;
//!
//! use grid_route_layer::grid::{Cluster, ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//! use grid_route_layer::route::Served;
//! use grid_route_layer::select::Select;
//! use http::{Request, Response};
//! use tower::balance::p2c::Balance;
//! use tower::buffer::Buffer;
//! use tower::discover::ServiceList;
//! use tower::load::{CompleteOnResponse, PendingRequests};
//! use tower::{ServiceExt, service_fn};
//!
//! let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
//!     .with_models(["demo-model"])
//!     .with_endpoints(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])])]);
//! let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//!
//! // One service per cluster: p2c over its endpoints (here stand-ins for an HTTP client),
//! // behind a Buffer so that it is Clone.
//! let cluster_service = |cluster: &Cluster| {
//!     let endpoints = cluster.endpoints().iter().map(|url| {
//!         let url = url.clone();
//!         let endpoint = service_fn(move |_req: Request<String>| {
//!             let url = url.clone();
//!             async move { Ok::<_, Infallible>(Response::new(format!("from {url}"))) }
//!         });
//!         PendingRequests::new(endpoint, CompleteOnResponse::default())
//!     });
//!     Buffer::new(Balance::new(ServiceList::new(endpoints.collect::<Vec<_>>())), 1024)
//! };
//! let select = Select::new(grid, cluster_service);
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let response = select.oneshot(Request::new(String::from("{}"))).await.unwrap();
//! assert_eq!(response.extensions().get::<Served>().unwrap().cluster().name(), "east-a");
//! assert!(response.into_body().into_inner().starts_with("from http://10.0.0."));
//! # });
//! ```
//!
//! # Example: your own balancer
//!
//! Any balancer plugs in under [`AffinityLayer`](crate::affinity::AffinityLayer) by
//! reading [`Candidates`] and setting [`Served`] (and returning a [`DispatchError`] when a
//! cluster cannot be reached), here one that always takes the first candidate:
//!
//! ```
//! use std::convert::Infallible;
//!
//! use grid_route_layer::route::{Candidates, Served};
//! use http::{Request, Response};
//! use tower::service_fn;
//!
//! let first_candidate = service_fn(|req: Request<String>| async move {
//!     let cluster = req
//!         .extensions()
//!         .get::<Candidates>()
//!         .and_then(|c| c.as_slice().first().cloned());
//!     let mut response = Response::new(String::new());
//!     if let Some(cluster) = cluster {
//!         // ... send `req` to `cluster` ...
//!         response.extensions_mut().insert(Served::new(cluster));
//!     }
//!     Ok::<_, Infallible>(response)
//! });
//! # let _ = first_candidate;
//! ```
//!
//! [`Candidates`]: crate::route::Candidates
//! [`Served`]: crate::route::Served
//! [`Pinned`]: crate::route::Pinned
//! [`Prompt`]: crate::route::Prompt
//! [`DispatchError`]: crate::route::DispatchError
//! [`NoCandidate`]: crate::route::NoCandidate

mod body;
mod future;
mod output;
mod pick;
mod service;

pub use body::InFlightBody;
pub use future::ResponseFuture;
pub(crate) use output::{OutputScan, is_event_stream};
pub(crate) use pick::load_rank;
pub use pick::{count_in_flight, least_loaded, prefill_bytes};
pub use service::Select;

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests;
