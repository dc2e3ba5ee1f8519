//! [`InFlightBody`]: the answer's body, which keeps its request counted in flight.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::OutputScan;
use crate::grid::InFlight;

pin_project! {
    /// The chosen cluster's answer body, frame for frame and unchanged, which keeps the
    /// request counted in its cluster's
    /// [`in_flight`](crate::grid::ClusterLoad::in_flight) until the body ends: its last
    /// frame, an error, or the body being dropped (a client that left). From its first
    /// data frame that carries output (an event stream's first token, found by
    /// [`OutputScan`]) it counts as a stream ([`InFlight::first_token`]).
    ///
    /// Why the end and not the head: vLLM, SGLang and llama.cpp send a stream's head
    /// before they prefill, so a request that counted only until its head stopped
    /// counting while its engine was still working on it, and a cluster busy with long
    /// streams looked idle.
    pub struct InFlightBody<B> {
        #[pin]
        body: B,
        in_flight: Option<InFlight>,
        output: OutputScan,
    }
}

impl<B> InFlightBody<B> {
    pub(super) fn new(body: B, in_flight: InFlight) -> Self {
        Self {
            body,
            in_flight: Some(in_flight),
            output: OutputScan::default(),
        }
    }

    /// Whether the request still counts in flight (its body has not ended).
    pub fn counts_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The inner body, by reference.
    pub fn get_ref(&self) -> &B {
        &self.body
    }

    /// The inner body; the request stops counting in flight.
    pub fn into_inner(self) -> B {
        self.body
    }
}

impl<B> Body for InFlightBody<B>
where
    B: Body,
    B::Data: AsRef<[u8]>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        if let (Some(Ok(frame)), Some(in_flight)) = (&frame, this.in_flight.as_mut())
            && !in_flight.has_first_token()
            && let Some(data) = frame.data_ref()
            && this.output.feed(data.as_ref())
        {
            in_flight.first_token();
        }
        if !matches!(frame, Some(Ok(_))) || this.body.is_end_stream() {
            // The end, or an error the body will not recover from: the engine is done.
            this.in_flight.take();
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

impl<B: fmt::Debug> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBody")
            .field("body", &self.body)
            .field("in_flight", &self.in_flight)
            .field("output", &self.output)
            .finish()
    }
}
