//! [`AffinityService`]: decides the candidates, then calls the balancer.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::Request;
use tower::Service;

use super::decide::{Affinity, Decision, Outcome};
use super::draw::random_draw;
use super::settings::MIN_STICKY_DEPTH;
use crate::grid::{Cluster, Grid};
use crate::metrics::{
    OUTCOME_LABEL, PREFIX_AFFINITY_TOTAL, SLOT_PASSED_OVER_TOTAL, cluster_counter,
};
use crate::route::{
    Candidates, Pinned, Placed, PredictedMatch, Prompt, RequestModel, SlotHold, record_on_span,
};

/// The service [`AffinityLayer`](super::AffinityLayer) builds: sets
/// [`Candidates`] on each request (and the [`Outcome`] when it counted a decision), then
/// calls `inner`.
#[derive(Debug, Clone)]
pub struct AffinityService<S> {
    inner: S,
    grid: Grid,
    affinity: Affinity,
}

impl<S> AffinityService<S> {
    /// Wraps `inner`, narrowing each request's candidates among `grid`'s clusters with
    /// `affinity`: the service `AffinityLayer::new(grid, affinity)` builds.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::sync::Arc;
    ///
    /// use grid_route_layer::affinity::{Affinity, AffinityService, AffinitySettings};
    /// use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
    /// use grid_route_layer::index::{IndexSettings, PrefixIndex};
    /// use grid_route_layer::route::Candidates;
    /// use http::{Request, Response};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// let site = |name: &str| {
    ///     SiteSpec::new(name).with_clusters([ClusterSpec::new(format!("{name}-a"))
    ///         .with_models(["m"])
    ///         .with_endpoints([format!("http://{name}")])])
    /// };
    /// let grid = Grid::new(&GridSpec::new([site("east"), site("west")]), GridSettings::default()).unwrap();
    /// let index = Arc::new(PrefixIndex::new(IndexSettings::default(), grid.view().cluster_ids()));
    /// let inner = service_fn(|req: Request<()>| async move {
    ///     Ok::<_, Infallible>(Response::new(req.extensions().get::<Candidates>().unwrap().len()))
    /// });
    /// let service = AffinityService::new(inner, grid, Affinity::new(index, AffinitySettings::default()));
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // A request without a prompt keeps every cluster as a candidate.
    /// let response = service.oneshot(Request::new(())).await.unwrap();
    /// assert_eq!(*response.body(), 2);
    /// # });
    /// ```
    pub fn new(inner: S, grid: Grid, affinity: Affinity) -> Self {
        Self {
            inner,
            grid,
            affinity,
        }
    }

    crate::define_inner_service_accessors!();

    /// The candidates, the outcome when the request was a counted decision, the
    /// predicted match when it is sticky or a session's ([`predicted_match`]), and the
    /// count in flight of a new conversation placed on a free slot ([`Placed`]: by the
    /// free-slot rule or joining a busier holder), and where a new conversation waits
    /// ([`SlotHold`]).
    fn candidates<B>(&self, req: &Request<B>) -> Decided {
        if let Some(pinned) = req.extensions().get::<Pinned>() {
            // Stored state lives on one cluster: no choice to make, nothing to count.
            // Whether it still admits is checked by the balancer.
            return Decided::only(Candidates::new(vec![pinned.cluster().clone()]));
        }
        let view = self.grid.view();
        let prompt = req.extensions().get::<Prompt>();
        let candidates = view.candidates(RequestModel::of(req.extensions()));
        let decision = match prompt {
            Some(prompt) => self.affinity.decide(
                candidates,
                prompt.keys().ok(),
                prompt.session(),
                Instant::now(),
                random_draw(),
            ),
            // Not a request keying could read (another path, not JSON, too large, ...):
            // not a prompt decision, so it routes on load and counts nothing.
            None => return Decided::only(ids(&candidates)),
        };
        record(&decision);
        Decided {
            candidates: ids(decision.clusters()),
            outcome: decision.outcome(),
            predicted: predicted_match(&decision),
            placed: decision.placed().cloned(),
            hold: (!decision.holds().is_empty()).then(|| SlotHold::new(decision.holds())),
        }
    }
}

/// What [`AffinityService`] sets on a request.
struct Decided {
    candidates: Candidates,
    outcome: Option<Outcome>,
    predicted: Option<PredictedMatch>,
    placed: Option<Placed>,
    hold: Option<SlotHold>,
}

impl Decided {
    /// `candidates` and nothing else: no decision counted.
    fn only(candidates: Candidates) -> Self {
        Self {
            candidates,
            outcome: None,
            predicted: None,
            placed: None,
            hold: None,
        }
    }
}

/// What the serving cluster is predicted to hold of the prompt, for engine feedback: for a
/// sticky request, the deepest match (every candidate left holds it); for a session
/// request, the session's cluster (the only candidate) at its depth, priced at the bytes it
/// is believed to hold, when that depth is at least [`MIN_STICKY_DEPTH`] as a sticky
/// match's is (a shorter prefix is too small to weigh an engine's report against: engines
/// cache in blocks, and one shared short key would make the index forget most of the
/// cluster). `None` for any other outcome. A conversation's first turn that asks whether
/// its holder kept a shared head ([`Decision::asks_shared_head`]) says so
/// ([`PredictedMatch::asking_shared_head`]), and one that joins a busier holder of it
/// ([`Decision::joins_busier_holder`]) says that ([`PredictedMatch::joining_busier_holder`]).
pub fn predicted_match(decision: &Decision) -> Option<PredictedMatch> {
    let weighed = matches!(decision.outcome(), Some(Outcome::Sticky | Outcome::Session));
    (weighed && decision.deepest() >= MIN_STICKY_DEPTH).then(|| {
        let mut predicted = PredictedMatch::new(decision.deepest(), decision.covered_bytes());
        if decision.asks_shared_head() {
            predicted = predicted.asking_shared_head();
        }
        if decision.joins_busier_holder() {
            predicted = predicted.joining_busier_holder();
        }
        predicted
    })
}

fn ids(clusters: &[Arc<Cluster>]) -> Candidates {
    Candidates::new(
        clusters
            .iter()
            .map(|c| c.id().clone())
            .collect::<Arc<[_]>>(),
    )
}

/// Counts the outcome and traces it with the candidate count and depth; never keys or
/// text.
fn record(decision: &Decision) {
    let Some(outcome) = decision.outcome() else {
        return;
    };
    metrics::counter!(PREFIX_AFFINITY_TOTAL, OUTCOME_LABEL => outcome.as_str()).increment(1);
    for passed in decision.passed_over() {
        let id = passed.id();
        cluster_counter(SLOT_PASSED_OVER_TOTAL, id).increment(1);
    }
    record_on_span("outcome", outcome.as_str());
    record_on_span("depth", decision.deepest());
    tracing::debug!(
        outcome = outcome.as_str(),
        clusters = decision.clusters().len(),
        depth = decision.deepest(),
        joins_busier_holder = decision.joins_busier_holder(),
        passed_over = decision.passed_over().len(),
        covered_bytes = decision.covered_bytes(),
        "prefix affinity"
    );
}

impl<S, B> Service<Request<B>> for AffinityService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let decided = self.candidates(&req);
        let ext = req.extensions_mut();
        ext.insert(decided.candidates);
        if let Some(placed) = decided.placed {
            ext.insert(placed);
        }
        if let Some(outcome) = decided.outcome {
            ext.insert(outcome);
        }
        if let Some(predicted) = decided.predicted {
            ext.insert(predicted);
        }
        if let Some(hold) = decided.hold {
            ext.insert(hold);
        }
        self.inner.call(req)
    }
}
