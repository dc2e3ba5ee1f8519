//! [`ConfirmLayer`]: wraps a service in [`ConfirmService`].

use tower::Layer;

use super::service::ConfirmService;
use crate::affinity::Affinity;

/// Records each answer's verdict in the prefix index: 2xx confirms the request's keys at
/// the serving cluster, 429, 5xx and failed connections drop them. See the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct ConfirmLayer {
    affinity: Affinity,
}

impl ConfirmLayer {
    /// Confirms into `affinity`'s index, while its settings have affinity enabled.
    pub fn new(affinity: Affinity) -> Self {
        Self { affinity }
    }
}

impl<S> Layer<S> for ConfirmLayer {
    type Service = ConfirmService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConfirmService::new(inner, self.affinity.clone())
    }
}
