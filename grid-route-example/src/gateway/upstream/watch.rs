//! Where an endpoint's outcomes go: its outlier record (failures, stalls, 429 holds), its
//! health in the grid, the log and the ejection counter; and the answer's body, watched to
//! its end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant, SystemTime};

use grid_route_layer::grid::{ClusterId, Grid};
use grid_route_layer::metrics::cluster_counter;
use grid_route_layer::route::BoxError;
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::super::outlier::{AnswerKind, Change, Event, Outliers};
use super::super::telemetry::EJECTIONS_TOTAL;

/// Where an endpoint's failures are reported: its outlier record, its health in the
/// grid, the log and the ejection counter.
pub(super) struct EndpointWatch {
    pub(super) grid: Grid,
    pub(super) cluster: ClusterId,
    pub(super) url: Arc<str>,
    pub(super) outliers: Arc<Outliers>,
}

impl EndpointWatch {
    /// Records `event`; an ejection or a 429's hold marks the endpoint unhealthy, and an
    /// ejection is counted and logged.
    pub(super) fn report(&self, event: Event) {
        let change = self
            .outliers
            .record(&self.cluster, &self.url, event, Instant::now());
        self.act_on(change);
    }

    fn act_on(&self, change: Change) {
        match change {
            Change::None => return,
            Change::Ejected { length, nth } | Change::Stalled { length, nth } => {
                cluster_counter(EJECTIONS_TOTAL, &self.cluster).increment(1);
                let why = if matches!(change, Change::Stalled { .. }) {
                    "wedged: a request has waited far longer for its answer than the grid's \
                     answers take; out until it answers"
                } else {
                    "failures in a row"
                };
                tracing::warn!(
                    site = %self.cluster.site(),
                    cluster = self.cluster.name(),
                    endpoint = %self.url,
                    secs = length.as_secs(),
                    nth,
                    why,
                    "endpoint ejected"
                );
            }
            Change::HeldOut(length) => {
                tracing::info!(
                    site = %self.cluster.site(),
                    cluster = self.cluster.name(),
                    endpoint = %self.url,
                    secs = length.as_secs(),
                    "endpoint answered 429; held out for its Retry-After"
                );
            }
        }
        if let Some(cluster) = self.grid.view().cluster(&self.cluster) {
            cluster.load().set_endpoint_healthy(&self.url, false);
        }
    }

    /// Whether the endpoint's own queue gauge read a waiting request in the queue window:
    /// then a request waiting for its head is queued there, not lost.
    pub(super) fn queue_explains_wait(&self) -> bool {
        self.grid
            .view()
            .cluster(&self.cluster)
            .is_some_and(|cluster| {
                cluster
                    .load()
                    .endpoint_queue_depth(&self.url, Instant::now())
                    .is_some_and(|waiting| waiting >= 1.0)
            })
    }

    /// Reports what an answer's head says about the endpoint: it answered (which ends a
    /// stall), 5xx a failure, 429 with a `Retry-After` a hold; anything else waits for the
    /// body's end. `took` is the answer's kind and the time from sending the request, when
    /// it counts among the grid's heads.
    pub(super) fn report_head(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        took: Option<(AnswerKind, Duration)>,
    ) {
        self.report(Event::Answered);
        if status.is_server_error() {
            self.report(Event::Failure);
            return;
        }
        if let Some((kind, took)) = took.filter(|_| !status.is_client_error()) {
            self.outliers.head_took(kind, took);
        }
        if status == StatusCode::TOO_MANY_REQUESTS
            && let Some(wait) = headers
                .get(header::RETRY_AFTER)
                .and_then(|v| retry_after(v, SystemTime::now()))
        {
            self.report(Event::Throttled(wait));
        }
    }
}

/// A `Retry-After` value: delay seconds (digits; too many to hold are taken as the
/// longest wait, which the outlier record bounds) or an HTTP date, as RFC 9110 §10.2.3
/// allows; a date in the past is no wait. `None` when it is neither.
fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            text.parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A request that stalled, until it ends however it ends (answered, failed, or dropped
/// with a client that gave up): while it waits, its endpoint stays out.
pub(super) struct StallGuard {
    watch: Arc<EndpointWatch>,
    epoch: u64,
}

impl StallGuard {
    pub(super) fn report(watch: &Arc<EndpointWatch>, waited: Duration) -> Self {
        let (change, epoch) =
            watch
                .outliers
                .record_stall(&watch.cluster, &watch.url, Instant::now());
        if change != Change::None {
            tracing::debug!(
                endpoint = %watch.url,
                waited_secs = waited.as_secs(),
                "request stalled"
            );
        }
        watch.act_on(change);
        Self {
            watch: Arc::clone(watch),
            epoch,
        }
    }
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.watch.report(Event::StallEnded { epoch: self.epoch });
    }
}

pin_project! {
    /// An engine's answer on its way to the client: a failure mid-stream (the engine died
    /// or went quiet) is logged with the site and cluster and counted against the
    /// endpoint; a clean end of a 2xx (or 1xx, 3xx) answer counts for it.
    pub(super) struct WatchedBody<B> {
        #[pin]
        pub(super) body: B,
        pub(super) success_counts: bool,
        // Taken at the first outcome, so each answer reports once.
        pub(super) watch: Option<Arc<EndpointWatch>>,
    }
}

impl<B> HttpBody for WatchedBody<B>
where
    B: HttpBody<Error = BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut body = this.body;
        let frame = ready!(body.as_mut().poll_frame(cx));
        // hyper stops polling a body of known length after its last byte, so the end is
        // also seen through `is_end_stream`, not only as a `None`.
        let ended = match &frame {
            None => true,
            Some(Ok(_)) => body.is_end_stream(),
            Some(Err(_)) => false,
        };
        if ended {
            if let Some(watch) = this.watch.take()
                && *this.success_counts
            {
                watch.report(Event::Success);
            }
        } else if let Some(Err(error)) = &frame
            && let Some(watch) = this.watch.take()
        {
            tracing::warn!(
                site = %watch.cluster.site(),
                cluster = watch.cluster.name(),
                endpoint = %watch.url,
                %error,
                "engine answer failed mid-stream; the client's stream is cut"
            );
            watch.report(Event::Failure);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_refuses_the_rest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let read = |text: &str| retry_after(&HeaderValue::from_str(text).unwrap(), now);
        assert_eq!(read("120"), Some(Duration::from_secs(120)));
        assert_eq!(read(" 7 "), Some(Duration::from_secs(7)));
        // More digits than a u64 holds: the longest wait, which the outlier record bounds.
        assert_eq!(read("99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(
            read(&u64::MAX.to_string()),
            Some(Duration::from_secs(u64::MAX))
        );
        // 2015-10-21 07:28:00 GMT is `now`; a date 90 s later is a 90 s wait.
        assert_eq!(
            read("Wed, 21 Oct 2015 07:29:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(read("Wed, 21 Oct 2015 07:00:00 GMT"), Some(Duration::ZERO));
        for bad in [
            "",
            "-5",
            "1.5",
            "soon",
            "0x10",
            "Wed, 99 Oct 2015 07:29:30 GMT",
        ] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }
}
