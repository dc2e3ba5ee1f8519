//! [`FeedbackLayer`].

use tower::Layer;

use super::service::FeedbackService;
use crate::affinity::Affinity;

/// Wraps a service in [`FeedbackService`]. See the [module docs](super).
#[derive(Debug, Clone, Default)]
pub struct FeedbackLayer {
    teach: Option<Affinity>,
}

impl FeedbackLayer {
    /// The layer: it counts the engines' usage and changes no state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also feeds the engines' reports back into `affinity`'s index: when an engine
    /// reports far less of a sticky prompt cached than predicted
    /// ([`forget_from`](super::forget_from)), the index forgets, for that cluster alone,
    /// the keys past what it delivered — while `affinity`'s
    /// [`engine_feedback`](crate::affinity::AffinitySettings::engine_feedback) is on.
    ///
    /// With [`learns_prefill`](crate::affinity::AffinitySettings::learns_prefill) on, each
    /// answer also teaches `affinity` its cluster's prefill speed
    /// ([`Affinity::learn_prefill`]), exported as `grid_route_prefill_tokens_per_second`.
    ///
    /// The layer must sit inside [`ConfirmLayer`](crate::confirm::ConfirmLayer), as it
    /// does in the documented stack: confirmation then records the prompt at the response
    /// head, and the forget follows when the body ends.
    #[must_use]
    pub fn teach(mut self, affinity: Affinity) -> Self {
        self.teach = Some(affinity);
        self
    }
}

impl<S> Layer<S> for FeedbackLayer {
    type Service = FeedbackService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        match &self.teach {
            Some(affinity) => FeedbackService::teaching(inner, affinity.clone()),
            None => FeedbackService::new(inner),
        }
    }
}
