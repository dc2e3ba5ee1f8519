//! The bodies `KeyingLayer` hands on: the request body (buffered or streamed) and the
//! response body (the inner service's, or the layer's own error answer).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use crate::route::BoxError;

pin_project! {
    /// A request body after `KeyingLayer`: either buffered whole (and then forwarded as
    /// those exact bytes), or streamed on untouched — with the bytes already read, when the
    /// layer had started to buffer a body that turned out to be over the limit.
    ///
    /// Layers that rewrite a buffered body build the new one with `From<Bytes>`.
    pub struct KeyedBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Buffered {
            data: Option<Bytes>,
            trailers: Option<HeaderMap>,
        },
        Streamed {
            prefix: Option<Bytes>,
            #[pin]
            rest: B,
        },
    }
}

impl<B> KeyedBody<B> {
    /// A buffered body of `bytes`.
    pub fn buffered(bytes: Bytes) -> Self {
        Self::buffered_with_trailers(bytes, None)
    }

    pub(crate) fn buffered_with_trailers(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Buffered {
                data: Some(bytes),
                trailers,
            },
        }
    }

    /// `rest` streamed on untouched.
    pub fn streamed(rest: B) -> Self {
        Self {
            kind: Kind::Streamed { prefix: None, rest },
        }
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: B) -> Self {
        Self {
            kind: Kind::Streamed {
                prefix: Some(prefix).filter(|p| !p.is_empty()),
                rest,
            },
        }
    }

    /// Whether the body is held whole in memory.
    pub fn is_buffered(&self) -> bool {
        matches!(self.kind, Kind::Buffered { .. })
    }
}

impl<B> From<Bytes> for KeyedBody<B> {
    fn from(bytes: Bytes) -> Self {
        Self::buffered(bytes)
    }
}

impl<B> Body for KeyedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Buffered { data, trailers } => {
                if let Some(data) = data.take().filter(|d| !d.is_empty()) {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            KindProj::Streamed { prefix, rest } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                rest.poll_frame(cx).map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Buffered { data, trailers } => {
                data.as_ref().is_none_or(Bytes::is_empty) && trailers.is_none()
            }
            Kind::Streamed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Streamed { prefix, rest } => {
                let before = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower() + before);
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper + before);
                }
                sum
            }
        }
    }
}

pin_project! {
    /// A response from behind `KeyingLayer`: the inner service's body, or the layer's own
    /// OpenAI-style error answer.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Answered<B>,
    }
}

pin_project! {
    #[project = AnsweredProj]
    enum Answered<B> {
        Inner {
            #[pin]
            body: B,
        },
        Answer {
            #[pin]
            body: Full<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Answered::Inner { body },
        }
    }

    pub(crate) fn answer(body: Full<Bytes>) -> Self {
        Self {
            kind: Answered::Answer { body },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            AnsweredProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            AnsweredProj::Answer { body } => body.poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Answered::Inner { body } => body.is_end_stream(),
            Answered::Answer { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Answered::Inner { body } => body.size_hint(),
            Answered::Answer { body } => body.size_hint(),
        }
    }
}
