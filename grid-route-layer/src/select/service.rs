//! [`Select`]: chooses a cluster and dispatches to its service.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::Service;
use tower::util::Oneshot;

use super::InFlightBody;
use super::future::{ResponseFuture, Wait};
use super::pick::{count_in_flight, least_loaded, prefill_bytes};
use crate::grid::{Cluster, Grid, GridView};
use crate::metrics::{
    DECISIONS_TOTAL, PASS_SPACINGS_TOTAL, SHARED_HEAD_JOINS_TOTAL, SLOT_HOLDS_TOTAL,
    cluster_counter,
};
use crate::route::{
    BoxError, Candidates, NoCandidate, Pinned, Placed, PredictedMatch, Prompt, RequestModel,
    SlotHold, record_on_span,
};

/// The default inner balancer: sends each request to the least loaded of its candidates,
/// through that cluster's own service. See the [module docs](super).
///
/// Clones share the cluster services and the tie-breaking counter.
pub struct Select<S, F> {
    grid: Grid,
    shared: Arc<Shared<S, F>>,
}

struct Shared<S, F> {
    factory: F,
    services: Mutex<Services<S>>,
    /// Turns through tied clusters so that equal loads share requests evenly.
    rotation: AtomicUsize,
}

/// The cluster services built so far, for the grid configuration `generation`.
struct Services<S> {
    generation: u64,
    by_cluster: HashMap<crate::grid::ClusterId, CachedService<S>>,
}

struct CachedService<S> {
    /// The endpoints the service was built for; a reconfiguration that changes them
    /// rebuilds it.
    endpoints: Box<[Arc<str>]>,
    service: S,
}

impl<S, F> Select<S, F>
where
    F: Fn(&Cluster) -> S,
{
    /// A balancer over `grid` that reaches each cluster through `factory(cluster)`.
    ///
    /// The factory is called once per cluster, when a request first goes there, and
    /// again after a reconfiguration that changes the cluster's endpoints; services of
    /// clusters that left the grid are dropped at the first request after the change.
    /// Its service is cloned for each request, so make it cheap to clone and sharing its
    /// state (a `tower::buffer::Buffer` around a `tower::balance` p2c over the
    /// cluster's endpoints, for instance).
    pub fn new(grid: Grid, factory: F) -> Self {
        Self {
            grid,
            shared: Arc::new(Shared {
                factory,
                services: Mutex::new(Services {
                    generation: 0,
                    by_cluster: HashMap::new(),
                }),
                rotation: AtomicUsize::new(0),
            }),
        }
    }
}

impl<S, F> Select<S, F> {
    /// The clusters a request may go to: its [`Candidates`] when set, else the cluster
    /// it is [`Pinned`] to, else every admitted cluster serving its [`RequestModel`]
    /// (any model when it is not known). Candidates that left the grid or stopped admitting
    /// since they were chosen are skipped.
    fn allowed<'v, B>(view: &'v GridView, req: &Request<B>) -> Vec<&'v Arc<Cluster>> {
        let ext = req.extensions();
        if let Some(candidates) = ext.get::<Candidates>() {
            return candidates
                .as_slice()
                .iter()
                .filter_map(|id| view.cluster(id))
                .filter(|c| c.admits())
                .collect();
        }
        if let Some(pinned) = ext.get::<Pinned>() {
            return view
                .cluster(pinned.cluster())
                .filter(|c| c.admits())
                .into_iter()
                .collect();
        }
        let model = RequestModel::of(ext);
        view.clusters()
            .iter()
            .filter(|c| c.admits() && model.is_none_or(|m| c.serves(m)))
            .collect()
    }
}

impl<S: Clone, F: Fn(&Cluster) -> S> Select<S, F> {
    /// `cluster`'s service, built by the factory on first use.
    fn service_for(&self, view: &GridView, cluster: &Cluster) -> S {
        let mut services = self
            .shared
            .services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if view.generation() > services.generation {
            services.by_cluster.retain(|id, cached| {
                view.cluster(id)
                    .is_some_and(|c| *c.endpoints() == *cached.endpoints)
            });
            services.generation = view.generation();
        }
        let fresh = services.generation == view.generation();
        match services.by_cluster.entry(cluster.id().clone()) {
            Entry::Occupied(cached) if *cached.get().endpoints == *cluster.endpoints() => {
                cached.get().service.clone()
            }
            // A request still holding an older view than the cache's: serve it without
            // caching a service the newer grid may no longer want.
            _ if !fresh => (self.shared.factory)(cluster),
            Entry::Occupied(mut stale) => {
                let service = (self.shared.factory)(cluster);
                stale.insert(CachedService {
                    endpoints: cluster.endpoints().into(),
                    service: service.clone(),
                });
                service
            }
            Entry::Vacant(slot) => {
                let service = (self.shared.factory)(cluster);
                slot.insert(CachedService {
                    endpoints: cluster.endpoints().into(),
                    service: service.clone(),
                });
                service
            }
        }
    }
}

impl<S, F> Clone for Select<S, F> {
    fn clone(&self) -> Self {
        Self {
            grid: self.grid.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, F> fmt::Debug for Select<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select")
            .field("grid", &self.grid)
            .finish_non_exhaustive()
    }
}

impl<S, F, B, ResB> Service<Request<B>> for Select<S, F>
where
    F: Fn(&Cluster) -> S,
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<InFlightBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, Request<B>>;

    /// Always ready: the cluster is chosen in `call`, and the returned future waits for
    /// that cluster's service to be ready.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let view = self.grid.view();
        let allowed = Self::allowed(&view, &req);
        let turn = self.shared.rotation.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let Some(cluster) = least_loaded(allowed.iter().copied(), now, turn) else {
            let model: Option<Arc<str>> = RequestModel::of(req.extensions()).map(Arc::from);
            let none = match model {
                Some(model) if !view.clusters().iter().any(|c| c.serves(&model)) => {
                    NoCandidate::unknown_model(model)
                }
                model => NoCandidate::new(model),
            };
            return ResponseFuture::no_candidate(none);
        };
        let id = cluster.id();
        record_on_span("site", id.site().as_str());
        record_on_span("cluster", id.name());
        cluster_counter(DECISIONS_TOTAL, id).increment(1);
        let ext = req.extensions();
        let predicted = ext.get::<PredictedMatch>();
        if predicted.is_some_and(PredictedMatch::joins_busier_holder) {
            cluster_counter(SHARED_HEAD_JOINS_TOTAL, id).increment(1);
        }
        tracing::debug!(
            cluster = %id,
            candidates = allowed.len(),
            in_flight = cluster.load().in_flight(),
            "selected"
        );
        let keys = ext.get::<Prompt>().and_then(|prompt| prompt.keys().ok());
        let prefill = prefill_bytes(keys, predicted);
        // Counted already when affinity placed it here on a free slot; a request placed
        // elsewhere stops counting there.
        let (load, in_flight) = count_in_flight(cluster, ext.get::<Placed>(), prefill, now);
        // A new conversation waits for the live one to reach the slot that just went idle.
        let hold = ext
            .get::<SlotHold>()
            .and_then(|hold| hold.until(id))
            .filter(|&until| until > now);
        if let Some(until) = hold {
            cluster_counter(SLOT_HOLDS_TOTAL, id).increment(1);
            tracing::debug!(
                cluster = %id,
                hold_ms = until.duration_since(now).as_millis() as u64,
                "held for a slot that just went idle"
            );
        }
        // On an engine with slots a prompt right behind another waits for it to start its
        // prefill pass, so that the two do not share one. A held one goes when its hold
        // ends (spaced, a live turn sent meanwhile would wait behind it).
        let sent = hold.unwrap_or_else(|| cluster.load().spaced_send(now));
        if hold.is_none() && sent > now {
            cluster_counter(PASS_SPACINGS_TOTAL, id).increment(1);
            tracing::debug!(
                cluster = %id,
                wait_ms = sent.duration_since(now).as_millis() as u64,
                "spaced from the prompt sent before it"
            );
        }
        let wait = match hold {
            Some(_) => Wait::SlotHold,
            None if sent > now => Wait::Spaced,
            None => Wait::None,
        };
        let service = self.service_for(&view, cluster);
        ResponseFuture::dispatched(
            Oneshot::new(service, req),
            id.clone(),
            load,
            sent,
            in_flight,
            wait,
        )
    }
}
