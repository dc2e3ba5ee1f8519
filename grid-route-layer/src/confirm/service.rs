//! [`ConfirmService`]: takes the request's keys, then judges the answer.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::future::{Pending, ResponseFuture};
use crate::affinity::Affinity;
use crate::route::{BoxError, Prompt};

/// The service [`ConfirmLayer`](super::ConfirmLayer) builds.
#[derive(Debug, Clone)]
pub struct ConfirmService<S> {
    inner: S,
    affinity: Affinity,
}

impl<S> ConfirmService<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, affinity: Affinity) -> Self {
        Self { inner, affinity }
    }

    crate::define_inner_service_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for ConfirmService<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The keys are taken now: inner layers may rewrite or drop the extension, but the
        // prompt that was sent is the one to confirm. With affinity disabled no prompt is
        // read at all.
        let pending = if self.affinity.settings().enabled() {
            req.extensions()
                .get::<Prompt>()
                .and_then(|prompt| prompt.keys().ok())
                .map(|keys| Pending::new(keys.clone(), Arc::clone(self.affinity.index())))
        } else {
            None
        };
        ResponseFuture::new(self.inner.call(req), pending)
    }
}
