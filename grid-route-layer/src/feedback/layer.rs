//! [`FeedbackLayer`].

use std::sync::Arc;

use tower::Layer;

use super::body::CachedCounts;
use super::service::FeedbackService;
use crate::affinity::Affinity;

/// Wraps a service in [`FeedbackService`]. See the [module docs](super).
#[derive(Debug, Clone, Default)]
pub struct FeedbackLayer {
    teach: Option<Affinity>,
    /// Which clusters' engines count cached tokens, shared by every service it wraps.
    counts: Arc<CachedCounts>,
}

impl FeedbackLayer {
    /// The layer: it counts the engines' usage and changes no state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also feeds the engines' reports back into `affinity`'s index, while `affinity`'s
    /// [`engine_feedback`](crate::affinity::AffinitySettings::engine_feedback) is on. When
    /// an engine reports far less of a sticky prompt cached than predicted
    /// ([`fell_short`](super::fell_short)), it evicted that prompt since the index recorded
    /// it, and an engine evicts least recently used first: the index forgets, for that
    /// cluster alone, every entry it recorded there before the prompt's deepest matched key
    /// ([`PrefixIndex::forget_older`](crate::index::PrefixIndex::forget_older)), counted in
    /// `grid_route_index_forgotten_total{site,cluster}`. The prompt itself stays: the
    /// engine has just prefilled it and holds it again.
    ///
    /// With [`learns_prices`](crate::affinity::AffinitySettings::learns_prices) on (the
    /// default), each answer it reads also teaches `affinity` its cluster's prices
    /// ([`Affinity::learn`]), exported as `grid_route_prefill_tokens_per_second` and
    /// `grid_route_queued_request_seconds`. The answer's time to first token is counted
    /// from when the balancer sent the attempt that answered
    /// ([`Served::sent`](crate::route::Served::sent), which `Select` stamps), so a failed
    /// connect retried below this layer is not taken for the cluster's queue; from this
    /// layer's call when the answer does not say.
    ///
    /// The layer must sit inside [`ConfirmLayer`](crate::confirm::ConfirmLayer), as it
    /// does in the documented stack: confirmation then refreshes the prompt at the response
    /// head (a stream's at its first output), before the engine's report at the end of the
    /// body can forget older entries.
    #[must_use]
    pub fn with_affinity(mut self, affinity: Affinity) -> Self {
        self.teach = Some(affinity);
        self
    }

    /// The name [`with_affinity`](Self::with_affinity) had.
    #[deprecated(note = "renamed `with_affinity`: the name says what it takes")]
    #[must_use]
    pub fn teach(self, affinity: Affinity) -> Self {
        self.with_affinity(affinity)
    }
}

impl<S> Layer<S> for FeedbackLayer {
    type Service = FeedbackService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let service = match &self.teach {
            Some(affinity) => FeedbackService::with_affinity(inner, affinity.clone()),
            None => FeedbackService::new(inner),
        };
        service.sharing(Arc::clone(&self.counts))
    }
}
