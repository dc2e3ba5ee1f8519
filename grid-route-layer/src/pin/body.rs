//! [`PinBody`]: the response body after `PinLayer`.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::rewrite::IdRewriter;

pin_project! {
    /// A response from behind `PinLayer`: the inner service's body untouched, the same
    /// body with its ids tagged as it streams, or the layer's own OpenAI-style error.
    ///
    /// A tagged body holds back at most one possibly-split id between frames and writes
    /// what it held when the inner body ends (before its trailers, if any). Its length
    /// is unknown until then.
    pub struct PinBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        Tagged {
            #[pin]
            body: B,
            rewriter: IdRewriter,
            // The inner body has ended (or sent its trailers): nothing more is read.
            ended: bool,
            // Trailers that arrived while held bytes were still to be sent.
            trailers: Option<HeaderMap>,
        },
        Answer {
            #[pin]
            body: Full<Bytes>,
        },
    }
}

impl<B> PinBody<B> {
    pub(super) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(super) fn tagged(body: B, rewriter: IdRewriter) -> Self {
        Self {
            kind: Kind::Tagged {
                body,
                rewriter,
                ended: false,
                trailers: None,
            },
        }
    }

    pub(super) fn answer(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Answer { body },
        }
    }

    /// Whether the body's ids are being tagged.
    pub fn is_tagged(&self) -> bool {
        matches!(self.kind, Kind::Tagged { .. })
    }
}

impl<B> Body for PinBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Answer { body } => body.poll_frame(cx).map_err(|never| match never {}),
            KindProj::Tagged {
                mut body,
                rewriter,
                ended,
                trailers,
            } => loop {
                if *ended {
                    return Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))));
                }
                let frame = match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => frame,
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    None => {
                        *ended = true;
                        let held = rewriter.finish();
                        if held.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(held))));
                    }
                };
                match frame.into_data() {
                    Ok(data) => {
                        let out = rewriter.push(data);
                        // A chunk that ends inside a possible id may yield nothing yet.
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => {
                        // Trailers end the data: send what is held first.
                        *ended = true;
                        *trailers = frame.into_trailers().ok();
                        let held = rewriter.finish();
                        if !held.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(held))));
                        }
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Answer { body } => body.is_end_stream(),
            // Held bytes may remain even when the inner body is done.
            Kind::Tagged {
                ended, trailers, ..
            } => *ended && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Answer { body } => body.size_hint(),
            Kind::Tagged { body, .. } => {
                // Tags only add bytes.
                let mut hint = SizeHint::new();
                hint.set_lower(body.size_hint().lower());
                hint
            }
        }
    }
}
