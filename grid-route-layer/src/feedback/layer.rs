//! [`FeedbackLayer`].

use tower::Layer;

use super::service::FeedbackService;

/// Wraps a service in [`FeedbackService`]. See the [module docs](super).
#[derive(Debug, Clone, Copy, Default)]
pub struct FeedbackLayer;

impl FeedbackLayer {
    /// The layer; it has no settings.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for FeedbackLayer {
    type Service = FeedbackService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FeedbackService::new(inner)
    }
}
