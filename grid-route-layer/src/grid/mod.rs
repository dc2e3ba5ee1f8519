//! The grid: sites, their backend clusters, which of them take requests, and their load.
//!
//! Every routing decision starts from the same question: which clusters may take this
//! request, and how loaded are they? The grid answers it from the configuration (sites,
//! clusters, the models they serve, `admit`) and from live signals the gateway feeds in
//! (each endpoint's queue depth and health, and the requests this replica has in flight).
//!
//! - A *site* is a named place (a data centre, a region, a pool); its name is a DNS-1123
//!   label ([`SiteName`]), because it travels in tagged ids and metric labels.
//! - A *cluster* is a group of inference engines at one site. Its name is turned into an
//!   8-hex-digit [`ClusterDigest`] so that tagged ids can name it; two clusters of one site
//!   whose digests collide are refused at config load.
//! - A cluster is *admitted* when config does not drain it and at least one of its
//!   endpoints is believed healthy. [`GridView::candidates`] lists the admitted clusters
//!   serving a model.
//! - Its *queue depth* is the windowed worst of its engines' waiting-request counts,
//!   `f64::INFINITY` when unmeasured ([`ClusterLoad`]). Its *routing load*, what selection
//!   and the affinity load gate compare, is that depth, plus the requests this replica
//!   has in flight there when [`GridSettings::count_in_flight`] is on.
//!
//! The configuration is an immutable [`GridView`] behind the [`Grid`] handle, swapped
//! atomically by [`Grid::reconfigure`]; live load is carried over for clusters that stay.
//! Like the other cores this module does no I/O and reads no clock: the gateway polls the
//! engines and passes `now` in.
//!
//! # Example
//!
//! ```
//! use std::time::{Duration, Instant};
//!
//! use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//!
//! let cluster = |name: &str, url: &str| {
//!     ClusterSpec::new(name).with_models(["demo-model"]).with_endpoints([url])
//! };
//! let spec = GridSpec::new([
//!     SiteSpec::new("east").with_clusters([cluster("east-a", "http://10.0.0.1:8000")]),
//!     SiteSpec::new("west").with_clusters([cluster("west-a", "http://10.1.0.1:8000")]),
//! ]);
//! let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//!
//! // The gateway's poller records each endpoint's waiting requests.
//! let now = Instant::now();
//! let view = grid.view();
//! let east = &view.clusters()[0];
//! east.load().record_queue("http://10.0.0.1:8000", Some(3.0), now);
//! assert_eq!(east.load().queue_depth(now), 3.0);
//! // West has not been read yet: unmeasured.
//! assert_eq!(view.clusters()[1].load().queue_depth(now), f64::INFINITY);
//!
//! // Draining east leaves west as the only candidate; east's samples survive the reload.
//! let mut drained = spec.clone();
//! drained.sites[0].clusters[0].admit = false;
//! grid.reconfigure(&drained, GridSettings::default()).unwrap();
//! let view = grid.view();
//! let names: Vec<_> = view.candidates(Some("demo-model")).iter().map(|c| c.id().to_string()).collect();
//! assert_eq!(names, ["west/west-a"]);
//! assert_eq!(view.clusters()[0].load().queue_depth(now + Duration::from_millis(500)), 3.0);
//!
//! // A bad site name is refused, naming the field and the value.
//! let mut bad = spec.clone();
//! bad.sites[1].name = "West".into();
//! let err = grid.reconfigure(&bad, GridSettings::default()).unwrap_err();
//! assert!(err.to_string().starts_with(r#"sites[1].name "West" is not a DNS-1123 label"#));
//! ```

mod load;
mod names;
mod spec;
mod view;

pub use load::{
    ClusterLoad, InFlight, MAX_QUEUE_SAMPLE, SLOT_PASS_SPACING, SLOT_RECLAIM_HOLD,
    SLOT_RECLAIM_WINDOW, STREAM_WEIGHT,
};
pub use names::{ClusterDigest, ClusterId, InvalidName, SiteName};
pub use spec::{ClusterSpec, GridError, GridSettings, GridSpec, SiteSpec};
pub use view::{Cluster, Grid, GridView};

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests;
