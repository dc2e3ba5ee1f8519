//! [`ResponseFuture`]: the layer's own answer, or the inner service's with its ids tagged.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response};
use pin_project_lite::pin_project;

use super::body::PinBody;
use super::layer::PinKeys;
use super::rewrite::{Framing, IdRewriter};
use crate::answer::ErrorAnswer;
use crate::route::Served;

pin_project! {
    /// The future of [`PinService`](super::PinService): the layer's error answer, or the
    /// inner service's response, whose body is tagged when it is a 2xx JSON or SSE answer
    /// of the Responses or Conversations API that says which cluster served it.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Answer {
            answer: ErrorAnswer,
        },
        Forwarded {
            #[pin]
            future: F,
            // Set when the request was one whose answer gets its ids tagged.
            keys: Option<PinKeys>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn answer(answer: ErrorAnswer) -> Self {
        Self {
            kind: Kind::Answer { answer },
        }
    }

    pub(super) fn forwarded(future: F, keys: Option<PinKeys>) -> Self {
        Self {
            kind: Kind::Forwarded { future, keys },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<PinBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            // Built on each poll, so a future polled again after it finished answers the
            // same rather than panicking.
            KindProj::Answer { answer } => {
                Poll::Ready(Ok(answer.clone().into_http_response().map(PinBody::answer)))
            }
            KindProj::Forwarded { future, keys } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(match keys {
                    Some(keys) => tag_ids(response, keys),
                    None => response.map(PinBody::inner),
                }))
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Wraps the body of a 2xx JSON or SSE answer in the id rewriter, stamped with the
/// cluster that served it. Any other answer passes untouched: an error, another media
/// type, a content coding the rewriter cannot read, or no [`Served`] to say where the ids
/// live.
fn tag_ids<B>(response: Response<B>, keys: &PinKeys) -> Response<PinBody<B>> {
    let (mut parts, body) = response.into_parts();
    let framing = parts
        .status
        .is_success()
        .then(|| framing_of(&parts.headers))
        .flatten();
    let served = parts.extensions.get::<Served>();
    let (Some(framing), Some(served)) = (framing, served) else {
        return Response::from_parts(parts, PinBody::inner(body));
    };
    let stamp = keys.stamp(served.site(), served.cluster().digest());
    // The tags change the length; the body is sent as it is rewritten.
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(
        parts,
        PinBody::tagged(body, IdRewriter::new(stamp, framing)),
    )
}

/// The framing of an uncoded JSON or SSE body, from its headers.
fn framing_of(headers: &HeaderMap) -> Option<Framing> {
    let coded = headers.get_all(CONTENT_ENCODING).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|coding| !coding.trim_ascii().eq_ignore_ascii_case(b"identity"))
    });
    if coded {
        return None;
    }
    let content_type = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    Framing::from_content_type(content_type)
}
