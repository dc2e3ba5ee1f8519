//! Outlier ejection: an endpoint that keeps failing is taken out of new selections for a
//! while, one that answers 429 with `Retry-After` for as long as it asks (within bounds),
//! and one that takes requests and answers none until it answers again.
//!
//! - **Failures** are 5xx answers, failed connects, timeouts (no head in time, a stream
//!   gone quiet) and answers that die mid-stream. A clean answer to its end resets the
//!   count; other 4xx say nothing about the endpoint.
//! - **Ejection**: `outlier.consecutive_failures` failures in a row eject the endpoint for
//!   `outlier.ejection_secs`; each repeat ejection doubles that, up to
//!   [`MAX_EJECTION_FACTOR`] times. An endpoint that stays in for
//!   [`MAX_EJECTION_FACTOR`] × `ejection_secs` after an ejection ends starts over at one.
//! - **429 + `Retry-After`** (seconds, or an HTTP date) holds the endpoint out that long,
//!   at most the longest ejection ([`MAX_EJECTION_FACTOR`] × `ejection_secs`, 300 s by
//!   default); it is not an ejection and not a failure.
//! - **A wedged endpoint** (a live HTTP server in front of a hung worker: requests go in,
//!   nothing comes out, and its `/metrics` may still say the queue is empty): a request
//!   whose whole body was sent (a buffered one) and that has waited for its answer's head
//!   longer than [`Outliers::stall_after`] — 8× the slowest of the grid's last
//!   [`HEAD_SAMPLES`] answer heads of its kind, at least `outlier.stall_min_secs` (5 s),
//!   and only once the grid has seen [`MIN_HEAD_SAMPLES`] of them — ejects its endpoint at
//!   once, as a burst of failures would. Not when the endpoint sent any head since the
//!   request went out (it is slow with this one, not wedged), nor when its own queue gauge
//!   read a waiting request in the queue window (its queue explains the wait; the load
//!   gate deals with that). The endpoint is out for the ejection's length from the stall, and longer
//!   while that request still waits (until it is answered, fails, times out or is given
//!   up); the first head it sends ends the ejection early. A request given up on leaves the
//!   ejection to run out; the next request after it is the probe, which brings the endpoint
//!   back or, still wedged, ejects it for twice as long. The stalled request itself waits
//!   for its head until its own timeout: the engine may yet answer, and its head's time
//!   does not count among the grid's heads.
//!
//! Held out, the endpoint is marked unhealthy in its cluster's load (the queue poller
//! marks it healthy again at its first good read after the time is up), so the cluster's
//! p2c balancer avoids it while a sibling is healthy, and a cluster whose every endpoint
//! is out is not admitted. Inside a cluster, p2c already weighs each endpoint by its
//! requests sent and not yet answered (tower's `PendingRequests`, to the head).
//! [`Record`] is the decision as plain code, driven by `now`; every sum of an instant and
//! a duration here saturates rather than overflow.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use grid_route_layer::grid::{ClusterId, GridView};

use crate::config::OutlierSettings;

/// The longest ejection, in multiples of `outlier.ejection_secs`.
pub const MAX_EJECTION_FACTOR: u32 = 10;
/// How many of the grid's latest answer heads the stall threshold looks at.
pub const HEAD_SAMPLES: usize = 64;
/// How much longer than the slowest recent answer head a request must wait before its
/// endpoint counts as wedged.
pub const STALL_FACTOR: u32 = 8;
/// Answer heads the grid must have seen before any request counts as stalled: until then
/// nothing says how long answers take here (a CPU engine's first long prompt can take
/// many seconds).
pub const MIN_HEAD_SAMPLES: usize = 4;

/// What an endpoint just did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// An answer that ended cleanly.
    Success,
    /// A 5xx, a failed connect, a timeout or an answer that died mid-stream.
    Failure,
    /// A 429 asking to come back after this long (bounded when recorded).
    Throttled(Duration),
    /// A request has waited for its answer's head past the stall threshold.
    Stalled,
    /// A request that [stalled](Self::Stalled) ended (answered, failed or dropped);
    /// `epoch` is [`Record::stall_epoch`] when it stalled.
    StallEnded { epoch: u64 },
    /// The endpoint sent an answer's head.
    Answered,
}

/// What recording an event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing to act on.
    None,
    /// The endpoint is ejected for this long (the `nth` ejection in a row).
    Ejected { length: Duration, nth: u32 },
    /// The endpoint is ejected as wedged: out while the request waits and this long after.
    Stalled { length: Duration, nth: u32 },
    /// The endpoint is held out for this long (a 429).
    HeldOut(Duration),
}

/// One endpoint's failure record.
#[derive(Debug, Default, Clone)]
pub(crate) struct Record {
    failures_in_a_row: u32,
    /// Ejections since the count last started over.
    ejections: u32,
    /// When the current (or last) ejection ends.
    ejected_until: Option<Instant>,
    /// Whether that ejection was for a stall (an answer ends it).
    ejected_for_stall: bool,
    /// Requests that stalled and have not ended, counted in this epoch.
    stalled_waiting: u32,
    /// Bumped by every answer: stalls of an earlier epoch no longer hold the endpoint out.
    stall_epoch: u64,
    /// When a 429's hold ends.
    held_until: Option<Instant>,
    /// When the endpoint last sent an answer's head.
    last_head: Option<Instant>,
}

/// `now + length`, or the farthest instant it can say when that overflows.
fn later(now: Instant, length: Duration) -> Instant {
    now.checked_add(length)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

impl Record {
    pub(crate) fn record(
        &mut self,
        event: Event,
        now: Instant,
        settings: OutlierSettings,
    ) -> Change {
        match event {
            Event::Success => {
                self.failures_in_a_row = 0;
                Change::None
            }
            Event::Throttled(asked) => {
                let length = asked.min(longest_ejection(settings));
                let until = later(now, length);
                self.held_until = Some(self.held_until.map_or(until, |held| held.max(until)));
                Change::HeldOut(length)
            }
            Event::Failure => {
                self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                if self.failures_in_a_row < settings.consecutive_failures {
                    return Change::None;
                }
                let (length, nth) = self.eject(now, settings);
                self.ejected_for_stall = false;
                Change::Ejected { length, nth }
            }
            Event::Stalled => {
                self.stalled_waiting = self.stalled_waiting.saturating_add(1);
                if self.stalled_waiting > 1 || self.ejected_until.is_some_and(|u| now < u) {
                    // Already out: for the first of them, or ejected for failures (which
                    // an answer must not cut short).
                    return Change::None;
                }
                let (length, nth) = self.eject(now, settings);
                self.ejected_for_stall = true;
                Change::Stalled { length, nth }
            }
            Event::StallEnded { epoch } => {
                if epoch == self.stall_epoch {
                    self.stalled_waiting = self.stalled_waiting.saturating_sub(1);
                }
                Change::None
            }
            Event::Answered => {
                self.last_head = Some(self.last_head.map_or(now, |at| at.max(now)));
                self.stall_epoch = self.stall_epoch.wrapping_add(1);
                self.stalled_waiting = 0;
                if self.ejected_for_stall {
                    self.ejected_for_stall = false;
                    // Ended now, not forgotten: the calm spell that resets the doubling
                    // counts from here.
                    self.ejected_until = self.ejected_until.map(|until| until.min(now));
                }
                Change::None
            }
        }
    }

    /// Starts an ejection: the next length of the doubling series. Returns it and how
    /// many ejections in a row it makes.
    fn eject(&mut self, now: Instant, settings: OutlierSettings) -> (Duration, u32) {
        self.failures_in_a_row = 0;
        let calm = longest_ejection(settings);
        if self
            .ejected_until
            .is_some_and(|ended| now >= later(ended, calm))
        {
            self.ejections = 0;
        }
        self.ejections = self.ejections.saturating_add(1);
        let factor = 2u32
            .saturating_pow(self.ejections - 1)
            .min(MAX_EJECTION_FACTOR);
        let length = settings.ejection.saturating_mul(factor);
        self.ejected_until = Some(later(now, length));
        (length, self.ejections)
    }

    /// Whether the endpoint must stay out of new selections at `now`.
    pub(crate) fn is_out(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|until| now < until)
            || self.held_until.is_some_and(|until| now < until)
            || self.stalled_waiting > 0
    }

    /// Whether the endpoint sent any answer's head at or after `since`.
    pub(crate) fn answered_since(&self, since: Instant) -> bool {
        self.last_head.is_some_and(|at| at >= since)
    }

    /// The epoch a request that stalls now belongs to.
    fn stall_epoch(&self) -> u64 {
        self.stall_epoch
    }
}

/// The longest ejection: [`MAX_EJECTION_FACTOR`] × the first one.
fn longest_ejection(settings: OutlierSettings) -> Duration {
    settings.ejection.saturating_mul(MAX_EJECTION_FACTOR)
}

/// Which of two kinds an answer is, for how long its head takes: an event stream's head
/// comes before the engine prefills, a whole answer's once it has generated everything
/// (many times longer). Each kind's stall threshold is taken from its own heads, so a
/// whole answer on a grid of streams is not taken for a wedge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerKind {
    /// The request asked for an event stream (`"stream": true`).
    Stream,
    /// Anything else: its head comes with the whole answer.
    Whole,
}

/// Every endpoint's [`Record`], shared by the engine client and the queue poller, and the
/// grid's latest answer-head times of each [`AnswerKind`].
#[derive(Debug)]
pub(crate) struct Outliers {
    settings: Mutex<OutlierSettings>,
    records: Mutex<HashMap<(ClusterId, Arc<str>), Record>>,
    /// Stream heads, then whole-answer heads.
    heads: [Mutex<VecDeque<Duration>>; 2],
}

impl Outliers {
    pub(crate) fn new(settings: OutlierSettings) -> Self {
        Self {
            settings: Mutex::new(settings),
            records: Mutex::new(HashMap::new()),
            heads: [(); 2].map(|()| Mutex::new(VecDeque::with_capacity(HEAD_SAMPLES))),
        }
    }

    /// Applies reloaded settings and forgets the endpoints that left the grid.
    pub(crate) fn reconfigure(&self, settings: OutlierSettings, view: &GridView) {
        *self.settings.lock().unwrap_or_else(PoisonError::into_inner) = settings;
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(cluster, url), _| {
                view.cluster(cluster)
                    .is_some_and(|c| c.endpoints().iter().any(|e| e == url))
            });
    }

    pub(crate) fn record(
        &self,
        cluster: &ClusterId,
        url: &Arc<str>,
        event: Event,
        now: Instant,
    ) -> Change {
        let settings = *self.settings.lock().unwrap_or_else(PoisonError::into_inner);
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((cluster.clone(), Arc::clone(url)))
            .or_default()
            .record(event, now, settings)
    }

    pub(crate) fn is_out(&self, cluster: &ClusterId, url: &str, now: Instant) -> bool {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        // Endpoints are few; a scan avoids building an owned key for each lookup.
        records
            .iter()
            .any(|((c, u), record)| c == cluster && &**u == url && record.is_out(now))
    }

    /// Whether the endpoint sent any answer's head at or after `since`: then it is slow
    /// with this request, not wedged.
    pub(crate) fn answered_since(&self, cluster: &ClusterId, url: &str, since: Instant) -> bool {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .any(|((c, u), record)| c == cluster && &**u == url && record.answered_since(since))
    }

    /// Records that a request of this endpoint stalled; returns the change and the epoch
    /// its [`Event::StallEnded`] must name.
    pub(crate) fn record_stall(
        &self,
        cluster: &ClusterId,
        url: &Arc<str>,
        now: Instant,
    ) -> (Change, u64) {
        let settings = *self.settings.lock().unwrap_or_else(PoisonError::into_inner);
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let record = records
            .entry((cluster.clone(), Arc::clone(url)))
            .or_default();
        let epoch = record.stall_epoch();
        (record.record(Event::Stalled, now, settings), epoch)
    }

    /// Notes that an answer of `kind` had its head `took` after its request was sent.
    pub(crate) fn head_took(&self, kind: AnswerKind, took: Duration) {
        let mut heads = self.heads(kind);
        if heads.len() == HEAD_SAMPLES {
            heads.pop_front();
        }
        heads.push_back(took);
    }

    /// How long a request for an answer of `kind` may wait for its head before its
    /// endpoint counts as wedged: [`STALL_FACTOR`] × the slowest of the last
    /// [`HEAD_SAMPLES`] heads of that kind, at least `outlier.stall_min_secs`. `None` while
    /// the grid has seen fewer than [`MIN_HEAD_SAMPLES`] of them, or when that is not before
    /// `first_byte` (the request's own timeout then comes first).
    pub(crate) fn stall_after(&self, kind: AnswerKind, first_byte: Duration) -> Option<Duration> {
        let stall_min = self
            .settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stall_min;
        let heads = self.heads(kind);
        if heads.len() < MIN_HEAD_SAMPLES {
            return None;
        }
        let slowest = heads.iter().copied().max().unwrap_or_default();
        let after = slowest.saturating_mul(STALL_FACTOR).max(stall_min);
        (after < first_byte).then_some(after)
    }

    fn heads(&self, kind: AnswerKind) -> std::sync::MutexGuard<'_, VecDeque<Duration>> {
        self.heads[kind as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            consecutive_failures: 3,
            ejection: Duration::from_secs(30),
            stall_min: Duration::from_secs(10),
        }
    }

    fn fail_times(record: &mut Record, n: u32, now: Instant) -> Change {
        let mut last = Change::None;
        for _ in 0..n {
            last = record.record(Event::Failure, now, settings());
        }
        last
    }

    #[test]
    fn failures_in_a_row_eject_and_a_success_between_resets_the_count() {
        let now = Instant::now();
        let mut record = Record::default();
        assert_eq!(fail_times(&mut record, 2, now), Change::None);
        assert_eq!(record.record(Event::Success, now, settings()), Change::None);
        assert_eq!(fail_times(&mut record, 2, now), Change::None);
        assert!(!record.is_out(now));
        let change = record.record(Event::Failure, now, settings());
        assert_eq!(
            change,
            Change::Ejected {
                length: Duration::from_secs(30),
                nth: 1
            }
        );
        assert!(record.is_out(now + Duration::from_secs(29)));
        assert!(!record.is_out(now + Duration::from_secs(30)));
    }

    #[test]
    fn repeat_ejections_double_up_to_ten_times_then_start_over_after_a_calm_spell() {
        let mut now = Instant::now();
        let mut record = Record::default();
        let mut lengths = Vec::new();
        for _ in 0..6 {
            if let Change::Ejected { length, .. } = fail_times(&mut record, 3, now) {
                lengths.push(length.as_secs());
                now += length;
            }
        }
        assert_eq!(lengths, [30, 60, 120, 240, 300, 300]);
        // In for 10 × 30 s after the last ejection ended: the next one is short again.
        now += Duration::from_secs(300);
        let change = fail_times(&mut record, 3, now);
        assert_eq!(
            change,
            Change::Ejected {
                length: Duration::from_secs(30),
                nth: 1
            }
        );
    }

    #[test]
    fn a_429_holds_the_endpoint_out_without_counting_as_a_failure() {
        let now = Instant::now();
        let mut record = Record::default();
        fail_times(&mut record, 2, now);
        let change = record.record(Event::Throttled(Duration::from_secs(2)), now, settings());
        assert_eq!(change, Change::HeldOut(Duration::from_secs(2)));
        assert!(record.is_out(now + Duration::from_secs(1)));
        assert!(!record.is_out(now + Duration::from_secs(2)));
        // The two failures before still count: one more ejects.
        assert!(matches!(
            record.record(Event::Failure, now, settings()),
            Change::Ejected { .. }
        ));
    }

    #[test]
    fn a_retry_after_of_any_size_holds_at_most_the_longest_ejection_and_never_overflows() {
        let now = Instant::now();
        let mut record = Record::default();
        let change = record.record(Event::Throttled(Duration::MAX), now, settings());
        assert_eq!(change, Change::HeldOut(Duration::from_secs(300)));
        assert!(record.is_out(now + Duration::from_secs(299)));
        assert!(!record.is_out(now + Duration::from_secs(300)));
    }

    #[test]
    fn ejection_arithmetic_saturates_instead_of_overflowing() {
        let huge = OutlierSettings {
            consecutive_failures: 1,
            ejection: Duration::MAX,
            stall_min: Duration::MAX,
        };
        let now = Instant::now();
        let mut record = Record::default();
        for _ in 0..3 {
            assert!(matches!(
                record.record(Event::Failure, now, huge),
                Change::Ejected { .. }
            ));
            record.record(Event::Throttled(Duration::MAX), now, huge);
        }
        assert!(record.is_out(now + Duration::from_secs(86_400 * 365)));
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
    }

    #[test]
    fn a_stall_ejects_at_once_holds_while_the_request_waits_and_an_answer_ends_it() {
        let now = Instant::now();
        let mut record = Record::default();
        let epoch = record.stall_epoch();
        assert_eq!(
            record.record(Event::Stalled, now, settings()),
            Change::Stalled {
                length: Duration::from_secs(30),
                nth: 1
            }
        );
        // A second stalled request while out changes nothing more.
        assert_eq!(record.record(Event::Stalled, now, settings()), Change::None);
        // Past the ejection, still out while the stalled requests wait.
        let after = now + Duration::from_secs(31);
        assert!(record.is_out(after));
        record.record(Event::StallEnded { epoch }, after, settings());
        assert!(record.is_out(after), "one stalled request still waits");
        record.record(Event::StallEnded { epoch }, after, settings());
        assert!(!record.is_out(after));

        // A stall whose request the client gave up: out for the ejection, twice as long as
        // the first since it followed it closely.
        let again = after + Duration::from_secs(1);
        let epoch = record.stall_epoch();
        assert_eq!(
            record.record(Event::Stalled, again, settings()),
            Change::Stalled {
                length: Duration::from_secs(60),
                nth: 2
            }
        );
        record.record(Event::StallEnded { epoch }, again, settings());
        assert!(record.is_out(again + Duration::from_secs(59)));
        // Its first head ends the ejection at once.
        record.record(Event::Answered, again + Duration::from_secs(5), settings());
        assert!(!record.is_out(again + Duration::from_secs(5)));
    }

    #[test]
    fn an_answer_releases_stalls_of_its_epoch_and_their_late_ends_are_ignored() {
        let now = Instant::now();
        let mut record = Record::default();
        let old = record.stall_epoch();
        record.record(Event::Stalled, now, settings());
        record.record(Event::Answered, now, settings());
        assert!(!record.is_out(now));
        // A new stall, then the old request's end: the new one still holds the endpoint
        // out, past its ejection's end.
        let later_on = now + Duration::from_secs(1);
        record.record(Event::Stalled, later_on, settings());
        record.record(Event::StallEnded { epoch: old }, later_on, settings());
        assert!(record.is_out(later_on + Duration::from_secs(120)));
        record.record(Event::Answered, later_on, settings());
        assert!(
            !record.is_out(later_on),
            "an answer ends the stall ejection"
        );
    }

    #[test]
    fn a_failure_ejection_is_not_ended_by_an_answer() {
        let now = Instant::now();
        let mut record = Record::default();
        fail_times(&mut record, 3, now);
        record.record(Event::Answered, now, settings());
        assert!(record.is_out(now + Duration::from_secs(29)));
    }

    #[test]
    fn the_stall_threshold_is_eight_times_the_slowest_recent_head_within_its_bounds() {
        let outliers = Outliers::new(settings());
        let first_byte = Duration::from_secs(600);
        let stream = |took| outliers.head_took(AnswerKind::Stream, took);
        let after = || outliers.stall_after(AnswerKind::Stream, first_byte);
        // Nothing seen yet: no request can stall.
        for _ in 1..MIN_HEAD_SAMPLES {
            stream(Duration::from_millis(300));
            assert_eq!(after(), None);
        }
        stream(Duration::from_millis(300));
        assert_eq!(after(), Some(Duration::from_secs(10)));
        stream(Duration::from_secs(5));
        assert_eq!(after(), Some(Duration::from_secs(40)));
        // Not before the request's own timeout: that comes first.
        assert_eq!(
            outliers.stall_after(AnswerKind::Stream, Duration::from_secs(40)),
            None
        );
        // Only the last HEAD_SAMPLES count: the slow one ages out.
        for _ in 0..HEAD_SAMPLES {
            stream(Duration::from_secs(2));
        }
        assert_eq!(after(), Some(Duration::from_secs(16)));
    }

    #[test]
    fn a_whole_answer_is_held_to_whole_answers_heads_not_to_streams() {
        let outliers = Outliers::new(settings());
        let first_byte = Duration::from_secs(600);
        for _ in 0..HEAD_SAMPLES {
            outliers.head_took(AnswerKind::Stream, Duration::from_millis(50));
        }
        // Streams alone say nothing of how long a whole answer takes.
        assert_eq!(outliers.stall_after(AnswerKind::Whole, first_byte), None);
        for _ in 0..MIN_HEAD_SAMPLES {
            outliers.head_took(AnswerKind::Whole, Duration::from_secs(9));
        }
        assert_eq!(
            outliers.stall_after(AnswerKind::Whole, first_byte),
            Some(Duration::from_secs(72))
        );
        // The streams' own threshold is untouched by the whole answers: the floor.
        assert_eq!(
            outliers.stall_after(AnswerKind::Stream, first_byte),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn a_stall_while_ejected_for_failures_neither_replaces_nor_shortens_that_ejection() {
        let now = Instant::now();
        let mut record = Record::default();
        fail_times(&mut record, 3, now);
        assert_eq!(record.record(Event::Stalled, now, settings()), Change::None);
        record.record(Event::Answered, now, settings());
        assert!(record.is_out(now + Duration::from_secs(29)));
    }

    #[test]
    fn a_stall_ejection_an_answer_ended_still_lets_the_doubling_start_over() {
        let now = Instant::now();
        let mut record = Record::default();
        record.record(Event::Stalled, now, settings());
        record.record(Event::Answered, now, settings());
        assert_eq!(
            record.record(Event::StallEnded { epoch: 0 }, now, settings()),
            Change::None
        );
        // A calm spell of 10 × 30 s after the ended ejection: the next is short again.
        let calm = now + Duration::from_secs(301);
        assert!(record.answered_since(now));
        assert!(!record.answered_since(now + Duration::from_secs(1)));
        assert_eq!(
            fail_times(&mut record, 3, calm),
            Change::Ejected {
                length: Duration::from_secs(30),
                nth: 1
            }
        );
    }
}
