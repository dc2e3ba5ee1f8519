//! [`FeedbackService`] and its response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::body::FeedbackBody;
use super::usage::UsageReader;
use crate::route::Served;

/// Reads the engine's usage from every successful answer. See the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct FeedbackService<S> {
    inner: S,
}

impl<S> FeedbackService<S> {
    /// Wraps `inner`, whose answers carry [`Served`].
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S, B, ResB> Service<Request<B>> for FeedbackService<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<FeedbackBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The future of [`FeedbackService`]: the inner answer with its body wrapped.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<FeedbackBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = ready!(self.project().inner.poll(cx))?;
        // Only a successful engine answer counts: errors carry no usage, and an answer
        // without `Served` did not come from a cluster.
        let cluster = response
            .extensions()
            .get::<Served>()
            .filter(|_| response.status().is_success())
            .map(|served| served.cluster().clone());
        let event_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        Poll::Ready(Ok(response.map(|body| match cluster {
            Some(cluster) => FeedbackBody::read(body, UsageReader::new(event_stream), cluster),
            None => FeedbackBody::unread(body),
        })))
    }
}
