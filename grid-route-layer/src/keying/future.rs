use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use pin_project_lite::pin_project;
use tracing::instrument::Instrumented;

use super::body::ResponseBody;
use crate::route::BoxError;

type Boxed<B> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, BoxError>> + Send>>;

pin_project! {
    /// Response future of [`KeyingService`](super::KeyingService).
    ///
    /// A request the layer does not read is the inner service's future, unboxed (the
    /// common case for paths nobody keys); one it answers itself is ready at once; only a
    /// request whose body it reads holds a boxed future (reading, keying, then the inner
    /// service).
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Passed {
            #[pin]
            future: Instrumented<F>,
        },
        Answered {
            answer: Option<Response<Full<Bytes>>>,
        },
        Read {
            future: Boxed<B>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn passed(future: Instrumented<F>) -> Self {
        Self {
            kind: Kind::Passed { future },
        }
    }

    pub(crate) fn answered(answer: Response<Full<Bytes>>) -> Self {
        Self {
            kind: Kind::Answered {
                answer: Some(answer),
            },
        }
    }

    pub(crate) fn read(
        future: impl Future<Output = Result<Response<ResponseBody<B>>, BoxError>> + Send + 'static,
    ) -> Self {
        Self {
            kind: Kind::Read {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passed { future } => {
                let response = ready!(future.poll(cx)).map_err(Into::into)?;
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
            KindProj::Answered { answer } => {
                // Polled again after it completed: a caller error; answer nothing twice.
                let answer = answer
                    .take()
                    .ok_or("keying future polled after completion")?;
                Poll::Ready(Ok(answer.map(ResponseBody::answer)))
            }
            KindProj::Read { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
