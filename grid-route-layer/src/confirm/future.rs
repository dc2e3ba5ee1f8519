//! [`ResponseFuture`]: judges the answer at its head.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http::Response;
use pin_project_lite::pin_project;

use super::body::{ConfirmBody, Waiting};
use super::verdict::Verdict;
use crate::grid::ClusterId;
use crate::index::PrefixIndex;
use crate::keying::{PrefixKeys, SessionKey};
use crate::route::{BoxError, DispatchError, Served};
use crate::select::is_event_stream;

/// A request's keys and session waiting for its answer.
#[derive(Debug)]
pub(super) struct Pending {
    keys: Option<PrefixKeys>,
    session: Option<SessionKey>,
    thread: Option<SessionKey>,
    index: Arc<PrefixIndex>,
}

impl Pending {
    /// `None` when there is nothing to confirm: no keys, no session and no thread.
    pub(super) fn new(
        keys: Option<PrefixKeys>,
        session: Option<SessionKey>,
        thread: Option<SessionKey>,
        index: Arc<PrefixIndex>,
    ) -> Option<Self> {
        (keys.is_some() || session.is_some() || thread.is_some()).then_some(Self {
            keys,
            session,
            thread,
            index,
        })
    }

    pub(super) fn settle(self, verdict: Verdict, cluster: &ClusterId, status: Option<u16>) {
        verdict.apply_to_request(
            &self.index,
            cluster,
            self.keys.as_ref(),
            self.session.into_iter().chain(self.thread),
            Instant::now(),
        );
        tracing::debug!(
            verdict = verdict.as_str(),
            status,
            cluster = %cluster,
            keys = self.keys.as_ref().map_or(0, PrefixKeys::len),
            session = self.session.is_some(),
            thread = self.thread.is_some(),
            "prefix confirmation"
        );
    }
}

pin_project! {
    /// The future of [`ConfirmService`](super::ConfirmService): resolves with the inner
    /// service's answer, after applying its verdict to the index.
    ///
    /// The verdict is applied once, when the head arrives (or the request fails), except
    /// for a 2xx event stream, whose keys its [`ConfirmBody`] confirms at its first
    /// output. A future dropped before its head changes nothing.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn new(inner: F, pending: Option<Pending>) -> Self {
        Self { inner, pending }
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ConfirmBody<ResB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx)).map_err(Into::into);
        let pending = this.pending.take();
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                if let Some(pending) = pending
                    && let Some(failed) = DispatchError::find_in(&*error)
                {
                    pending.settle(Verdict::of_failed_connection(), failed.cluster(), None);
                }
                return Poll::Ready(Err(error));
            }
        };
        // No `Served`: the balancer did not say where the request went, so there is
        // nowhere to record it.
        let (Some(pending), Some(served)) = (pending, response.extensions().get::<Served>()) else {
            return Poll::Ready(Ok(response.map(ConfirmBody::settled)));
        };
        let status = response.status();
        if status.is_success() && is_event_stream(response.headers()) {
            let waiting = Waiting::new(pending, served.cluster().clone(), status.as_u16());
            return Poll::Ready(Ok(response.map(|body| ConfirmBody::waiting(body, waiting))));
        }
        pending.settle(
            Verdict::of_status(status.as_u16()),
            served.cluster(),
            Some(status.as_u16()),
        );
        Poll::Ready(Ok(response.map(ConfirmBody::settled)))
    }
}
