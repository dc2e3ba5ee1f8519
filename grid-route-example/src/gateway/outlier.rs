//! Outlier ejection: an endpoint that keeps failing is taken out of new selections for a
//! while, and one that answers 429 with `Retry-After` for as long as it asks.
//!
//! - **Failures** are 5xx answers, failed connects, timeouts (no head in time, a stream
//!   gone quiet) and answers that die mid-stream. A clean answer to its end resets the
//!   count; other 4xx say nothing about the endpoint.
//! - **Ejection**: `outlier.consecutive_failures` failures in a row eject the endpoint for
//!   `outlier.ejection_secs`; each repeat ejection doubles that, up to
//!   [`MAX_EJECTION_FACTOR`] times. An endpoint that stays in for
//!   [`MAX_EJECTION_FACTOR`] × `ejection_secs` after an ejection ends starts over at one.
//! - **429 + `Retry-After: N`** (seconds) holds the endpoint out for N seconds; it is not
//!   an ejection and not a failure.
//!
//! Held out, the endpoint is marked unhealthy in its cluster's load (the queue poller
//! marks it healthy again at its first good read after the time is up), so the cluster's
//! p2c balancer avoids it while a sibling is healthy, and a cluster whose every endpoint
//! is out is not admitted. [`Record`] is the decision as plain code, driven by `now`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use grid_route_layer::grid::{ClusterId, GridView};

use crate::config::OutlierSettings;

/// The longest ejection, in multiples of `outlier.ejection_secs`.
pub const MAX_EJECTION_FACTOR: u32 = 10;

/// What an endpoint just did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// An answer that ended cleanly.
    Success,
    /// A 5xx, a failed connect, a timeout or an answer that died mid-stream.
    Failure,
    /// A 429 asking to come back after this long.
    Throttled(Duration),
}

/// What recording an event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing to act on.
    None,
    /// The endpoint is ejected for this long (the `nth` ejection in a row).
    Ejected { length: Duration, nth: u32 },
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
    /// When a 429's hold ends.
    held_until: Option<Instant>,
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
            Event::Throttled(length) => {
                let until = now + length;
                self.held_until = Some(self.held_until.map_or(until, |held| held.max(until)));
                Change::HeldOut(length)
            }
            Event::Failure => {
                self.failures_in_a_row += 1;
                if self.failures_in_a_row < settings.consecutive_failures {
                    return Change::None;
                }
                self.failures_in_a_row = 0;
                let calm = settings.ejection * MAX_EJECTION_FACTOR;
                if self.ejected_until.is_some_and(|ended| now >= ended + calm) {
                    self.ejections = 0;
                }
                self.ejections = self.ejections.saturating_add(1);
                let factor = 2u32
                    .saturating_pow(self.ejections - 1)
                    .min(MAX_EJECTION_FACTOR);
                let length = settings.ejection * factor;
                self.ejected_until = Some(now + length);
                Change::Ejected {
                    length,
                    nth: self.ejections,
                }
            }
        }
    }

    /// Whether the endpoint must stay out of new selections at `now`.
    pub(crate) fn is_out(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|until| now < until)
            || self.held_until.is_some_and(|until| now < until)
    }
}

/// Every endpoint's [`Record`], shared by the engine client and the queue poller.
#[derive(Debug)]
pub(crate) struct Outliers {
    settings: Mutex<OutlierSettings>,
    records: Mutex<HashMap<(ClusterId, Arc<str>), Record>>,
}

impl Outliers {
    pub(crate) fn new(settings: OutlierSettings) -> Self {
        Self {
            settings: Mutex::new(settings),
            records: Mutex::new(HashMap::new()),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            consecutive_failures: 3,
            ejection: Duration::from_secs(30),
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
}
