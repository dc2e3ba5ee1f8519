//! [`ConfirmBody`]: the response body after `ConfirmLayer`.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::future::Pending;
use super::verdict::Verdict;
use crate::grid::ClusterId;
use crate::select::OutputScan;

pin_project! {
    /// The inner service's body, frame for frame and unchanged. For a 2xx event stream it
    /// also holds the request's keys until the stream's first output ([`OutputScan`]: its
    /// first token, past a Responses stream's opening events), and confirms them then.
    ///
    /// Why not at the head: vLLM, SGLang and llama.cpp send a stream's head before they
    /// prefill (in the arena of BENCHMARKS.md a ~1,000-token first turn's head came at
    /// once and its first token 14 s later). Confirmed at the head, a prompt that is still
    /// waiting for its prefill counts as held, and a burst behind it follows it to an
    /// engine that holds nothing yet, where the requests wait for each other's prefill.
    ///
    /// A stream that ends without output (its last frame, or trailers) confirms then: the
    /// engine answered 2xx and took the prompt. One that fails or is dropped (a client that
    /// left) before its first output confirms nothing: nothing says the engine prefilled.
    pub struct ConfirmBody<B> {
        #[pin]
        body: B,
        waiting: Option<Waiting>,
    }
}

/// A 2xx stream's keys, confirmed at its first output.
pub(super) struct Waiting {
    pending: Pending,
    cluster: ClusterId,
    status: u16,
    output: OutputScan,
}

impl Waiting {
    pub(super) fn new(pending: Pending, cluster: ClusterId, status: u16) -> Self {
        Self {
            pending,
            cluster,
            status,
            output: OutputScan::default(),
        }
    }

    fn settle(self) {
        self.pending.settle(
            Verdict::of_status(self.status),
            &self.cluster,
            Some(self.status),
        );
    }
}

impl<B> ConfirmBody<B> {
    /// `body`, whose answer's verdict was applied at its head (or needs none).
    pub(super) fn settled(body: B) -> Self {
        Self {
            body,
            waiting: None,
        }
    }

    /// `body`, which confirms `waiting` at its first output.
    pub(super) fn waiting(body: B, waiting: Waiting) -> Self {
        Self {
            body,
            waiting: Some(waiting),
        }
    }

    /// Whether the body still holds keys to confirm at its first output.
    pub fn awaits_output(&self) -> bool {
        self.waiting.is_some()
    }

    /// The inner body, by reference.
    pub fn get_ref(&self) -> &B {
        &self.body
    }
}

impl<B> Body for ConfirmBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        let confirm = match (&frame, this.waiting.as_mut()) {
            (_, None) => false,
            // A body that says it has ended may not be polled again: its last frame
            // confirms whatever it carries.
            (Some(Ok(frame)), Some(waiting)) => match frame.data_ref() {
                Some(data) => waiting.output.feed(data) || this.body.is_end_stream(),
                // Trailers: the stream has ended.
                None => true,
            },
            (None, Some(_)) => true,
            (Some(Err(_)), Some(_)) => {
                // The stream broke before any output: nothing says the engine prefilled.
                this.waiting.take();
                false
            }
        };
        if confirm && let Some(waiting) = this.waiting.take() {
            waiting.settle();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for ConfirmBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfirmBody")
            .field("body", &self.body)
            .field("awaits_output", &self.awaits_output())
            .finish_non_exhaustive()
    }
}
