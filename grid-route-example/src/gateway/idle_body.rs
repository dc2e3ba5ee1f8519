//! A body that fails when its sender goes quiet: the client's request body
//! (`timeouts.client_body_idle_secs`, answered 408) and the engine's answer
//! (`timeouts.upstream_idle_secs`, the stream aborted).
//!
//! tower-http's `TimeoutBody` measures the same thing but does not pass the inner body's
//! `size_hint` and `is_end_stream` through; hyper reads those to frame what it sends, so
//! an empty GET body behind it would go out chunked. This wrapper passes them through and
//! says, through a shared flag, that it timed out, so the layer that answers the client
//! can tell a stalled client from a failed engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use grid_route_layer::route::BoxError;

pin_project! {
    /// `B`, failing with [`BodyStalled`] when a frame it was asked for takes longer than
    /// `idle` to come. The clock runs only while the reader waits: a reader that stops
    /// asking (back-pressure) is not a stall.
    pub(crate) struct IdleTimeoutBody<B> {
        idle: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
        stalled: Arc<AtomicBool>,
        #[pin]
        body: B,
    }
}

impl<B> IdleTimeoutBody<B> {
    pub(crate) fn new(idle: Duration, body: B) -> Self {
        Self {
            idle,
            sleep: None,
            stalled: Arc::new(AtomicBool::new(false)),
            body,
        }
    }

    /// Turns true when the body timed out.
    pub(crate) fn stall_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stalled)
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            *this.sleep = None;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let idle = *this.idle;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if sleep.as_mut().poll(cx).is_ready() {
            *this.sleep = None;
            this.stalled.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(BodyStalled { idle }))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A body sent nothing for longer than its idle timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no data for {idle:?}")]
pub(crate) struct BodyStalled {
    idle: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::channel::Channel;
    use http_body_util::{BodyExt, Empty, Full};

    #[tokio::test(start_paused = true)]
    async fn a_body_that_goes_quiet_fails_and_says_so() {
        let (mut sender, channel) = Channel::<Bytes, BoxError>::new(1);
        let mut body = IdleTimeoutBody::new(Duration::from_secs(5), channel);
        let stalled = body.stall_flag();
        sender.send_data(Bytes::from("a")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "a");
        // A frame within the timeout, after most of it: the clock restarts per frame.
        let sending = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            sender.send_data(Bytes::from("b")).await.unwrap();
            sender
        });
        assert!(body.frame().await.unwrap().is_ok());
        let sender = sending.await.unwrap();
        assert!(!stalled.load(Ordering::Relaxed));
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<BodyStalled>(), "{error}");
        assert!(stalled.load(Ordering::Relaxed));
        drop(sender);
    }

    #[test]
    fn size_and_end_pass_through() {
        let empty = IdleTimeoutBody::new(Duration::from_secs(1), Empty::<Bytes>::new());
        assert!(empty.is_end_stream());
        let full = IdleTimeoutBody::new(Duration::from_secs(1), Full::new(Bytes::from("abc")));
        assert_eq!(full.size_hint().exact(), Some(3));
    }
}
