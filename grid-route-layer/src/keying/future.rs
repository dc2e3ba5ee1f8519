use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::body::ResponseBody;
use crate::route::BoxError;

type Boxed<B> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, BoxError>> + Send>>;

/// Response future of [`KeyingService`](super::KeyingService): reads the body (when the
/// request is keyed), keys it, then waits for the inner service.
pub struct ResponseFuture<B> {
    inner: Boxed<B>,
}

impl<B> ResponseFuture<B> {
    pub(crate) fn new(
        inner: impl Future<Output = Result<Response<ResponseBody<B>>, BoxError>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<B> Future for ResponseFuture<B> {
    type Output = Result<Response<ResponseBody<B>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B> fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
