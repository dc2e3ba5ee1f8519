//! [`ResponseFuture`]: the chosen cluster's answer, marked with where it came from.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::Service;
use tower::util::Oneshot;

use super::InFlightBody;
use crate::grid::{ClusterId, InFlight, SLOT_RECLAIM_HOLD};
use crate::route::{BoxError, DispatchError, NoCandidate, Served};

pin_project! {
    /// The future of [`Select`](super::Select): waits for the chosen cluster's service to
    /// be ready, calls it, and sets [`Served`] on its answer.
    ///
    /// The request counts as in flight at its cluster from dispatch until its answer's
    /// body ends ([`InFlightBody`]), or until the request fails or is dropped. An error of
    /// the cluster's service is returned as a [`DispatchError`] naming the cluster.
    pub struct ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        #[pin]
        state: State<S, R>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, R>
    where
        S: Service<R>,
    {
        NoCandidate {
            error: Option<NoCandidate>,
        },
        Dispatched {
            #[pin]
            call: Oneshot<S, R>,
            cluster: Option<ClusterId>,
            // The cluster's routing load at dispatch, for `Served::load`.
            load: f64,
            // When the request was sent here, for `Served::sent`: after its wait.
            sent: Instant,
            in_flight: Option<InFlight>,
            // The wait before it is sent (a `SlotHold`, or spacing behind the prompt sent
            // before it), started at the first poll, inside the runtime.
            hold: Option<Hold>,
            // For a `SlotHold`, the latest it may go on to (`InFlight::hold_extended`).
            hold_cap: Option<Instant>,
        },
    }
}

impl<S: Service<R>, R> ResponseFuture<S, R> {
    pub(super) fn no_candidate(error: NoCandidate) -> Self {
        Self {
            state: State::NoCandidate { error: Some(error) },
        }
    }

    /// `call` to `cluster`, counted by `in_flight`, sent at `sent`: at once, or once a
    /// [`SlotHold`](crate::route::SlotHold) or the spacing behind the request sent before
    /// ([`spaced_send`](crate::grid::ClusterLoad::spaced_send)) ends there (`wait`). A
    /// slot hold goes on while another answer ended there during it, up to its cap
    /// ([`InFlight::hold_extended`]).
    pub(super) fn dispatched(
        call: Oneshot<S, R>,
        cluster: ClusterId,
        load: f64,
        sent: Instant,
        in_flight: InFlight,
        wait: Wait,
    ) -> Self {
        let (hold, hold_cap) = match wait {
            Wait::None => (None, None),
            Wait::Spaced => (Some(Hold::Until(sent)), None),
            // At most one more hold in all, for another slot there going idle meanwhile.
            Wait::SlotHold => (Some(Hold::Until(sent)), Some(sent + SLOT_RECLAIM_HOLD)),
        };
        Self {
            state: State::Dispatched {
                call,
                load,
                sent,
                cluster: Some(cluster),
                in_flight: Some(in_flight),
                hold,
                hold_cap,
            },
        }
    }
}

impl<S, R, ResB> Future for ResponseFuture<S, R>
where
    S: Service<R, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<InFlightBody<ResB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::NoCandidate { error } => Poll::Ready(Err(match error.take() {
                Some(error) => error.into(),
                None => "select future polled after completion".into(),
            })),
            StateProj::Dispatched {
                call,
                cluster,
                load,
                sent,
                in_flight,
                hold,
                hold_cap,
            } => {
                while let Some(waiting) = hold {
                    ready!(waiting.poll(cx));
                    let later =
                        hold_cap.and_then(|cap| in_flight.as_ref()?.hold_extended(*sent, cap));
                    *hold = later.map(Hold::Until);
                    if let (Some(later), Some(cluster)) = (later, cluster.as_ref()) {
                        tracing::debug!(
                            %cluster,
                            hold_ms = later.duration_since(*sent).as_millis() as u64,
                            "held on: another slot there went idle during the hold"
                        );
                        *sent = later;
                    }
                }
                let result = ready!(call.poll(cx));
                // A failure ends the request here; an answer hands its count to its body.
                let (Some(cluster), Some(in_flight)) = (cluster.take(), in_flight.take()) else {
                    return Poll::Ready(Err("select future polled after completion".into()));
                };
                Poll::Ready(match result {
                    Ok(response) => {
                        let mut response = response.map(|body| InFlightBody::new(body, in_flight));
                        response
                            .extensions_mut()
                            .insert(Served::new(cluster).with_load(*load).sent_at(*sent));
                        Ok(response)
                    }
                    Err(error) => Err(DispatchError::new(cluster, error).into()),
                })
            }
        }
    }
}

/// What a request waits for before it is sent, at the send time given with it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Wait {
    /// Nothing: it goes at once.
    None,
    /// The prompt sent before it, to start its prefill pass.
    Spaced,
    /// A live conversation's next turn, for a slot that just went idle: held on while
    /// another answer ends there during the hold, one more hold at most.
    SlotHold,
}

/// A request's wait before it is sent: until an instant, then on the runtime's timer.
enum Hold {
    Until(Instant),
    Sleeping(Pin<Box<Sleep>>),
}

impl Hold {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Self::Until(until) = *self {
            let deadline = tokio::time::Instant::from_std(until);
            *self = Self::Sleeping(Box::pin(tokio::time::sleep_until(deadline)));
        }
        match self {
            Self::Sleeping(sleep) => sleep.as_mut().poll(cx),
            Self::Until(_) => Poll::Ready(()),
        }
    }
}
