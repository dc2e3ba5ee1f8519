//! [`ConfirmService`]: takes the request's keys, then judges the answer.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::ConfirmBody;
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
    /// Wraps `inner`, confirming and dropping prompts in `affinity`'s index: the service
    /// `ConfirmLayer::new(affinity)` builds.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::sync::Arc;
    /// use std::time::Instant;
    ///
    /// use grid_route_layer::affinity::{Affinity, AffinitySettings};
    /// use grid_route_layer::confirm::ConfirmService;
    /// use grid_route_layer::grid::{ClusterId, SiteName};
    /// use grid_route_layer::index::{IndexSettings, PrefixIndex};
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    /// use grid_route_layer::route::Served;
    /// use http::{Request, Response};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    /// let index = Arc::new(PrefixIndex::new(IndexSettings::default(), [east.clone()]));
    /// let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    /// let served_by = east.clone();
    /// let inner = service_fn(move |_: Request<()>| {
    ///     let mut response = Response::new(());
    ///     response.extensions_mut().insert(Served::new(served_by.clone()));
    ///     async move { Ok::<_, Infallible>(response) }
    /// });
    /// let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "hi ".repeat(400));
    /// let prompt = key_body(&KeySeed::random(), Api::Completions, body.as_bytes()).unwrap();
    /// let keys = prompt.keys().unwrap().clone();
    /// let mut request = Request::new(());
    /// request.extensions_mut().insert(prompt);
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// ConfirmService::new(inner, affinity).oneshot(request).await.unwrap();
    /// assert_eq!(index.depth(&east, keys.as_slice(), Instant::now()), keys.len());
    /// # });
    /// ```
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
    type Response = Response<ConfirmBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The keys are taken now: inner layers may rewrite or drop the extension, but the
        // prompt that was sent is the one to confirm. With affinity disabled no prompt is
        // read at all.
        let settings = self.affinity.settings();
        let pending = if settings.enabled() {
            req.extensions().get::<Prompt>().and_then(|prompt| {
                let conversations = |key: Option<_>| key.filter(|_| settings.session_affinity());
                Pending::new(
                    prompt.keys().ok().cloned(),
                    conversations(prompt.session()),
                    conversations(prompt.thread()),
                    Arc::clone(self.affinity.index()),
                )
            })
        } else {
            None
        };
        ResponseFuture::new(self.inner.call(req), pending)
    }
}
