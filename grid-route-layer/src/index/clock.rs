//! Deadlines as whole seconds since the index was built.

use std::time::{Duration, Instant};

/// Turns injected [`Instant`]s into 4-byte deadlines.
///
/// A deadline is stored as whole seconds since `base` (the index's creation), not as a
/// 16-byte `Instant`: it keeps an LRU entry at 32 bytes, and `u32` seconds last 136 years of
/// uptime where `u32` milliseconds would wrap after 49 days. Deadlines are rounded *up* to
/// the second and `now` *down*, so an entry counts for at least its TTL and less than one
/// second longer. Both saturate at `u32::MAX` seconds instead of wrapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeadlineClock {
    base: Instant,
}

/// Seconds since the clock's base, the unit of stored deadlines.
pub(crate) type Secs = u32;

impl DeadlineClock {
    pub(crate) fn starting_at(base: Instant) -> Self {
        Self { base }
    }

    fn since_base(self, now: Instant) -> Duration {
        // An instant before the base (a caller's clock read taken just before the index
        // was built) counts as the base itself.
        now.saturating_duration_since(self.base)
    }

    /// `now`, rounded down to the second.
    pub(crate) fn now(self, now: Instant) -> Secs {
        saturate(self.since_base(now).as_secs())
    }

    /// The deadline of a key confirmed at `now` that counts for `ttl`.
    pub(crate) fn deadline(self, now: Instant, ttl: Duration) -> Secs {
        let until = self.since_base(now).saturating_add(ttl);
        let round_up = u64::from(until.subsec_nanos() > 0);
        saturate(until.as_secs().saturating_add(round_up))
    }

    /// Whether an entry with `deadline` still counts at `now` (from [`Self::now`]).
    pub(crate) fn is_live(now: Secs, deadline: Secs) -> bool {
        now < deadline
    }
}

fn saturate(secs: u64) -> Secs {
    Secs::try_from(secs).unwrap_or(Secs::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_counts_for_at_least_its_ttl_and_under_a_second_more() {
        let base = Instant::now();
        let clock = DeadlineClock::starting_at(base);
        let ttl = Duration::from_secs(10);
        let confirmed = base + Duration::from_millis(2_500);
        let deadline = clock.deadline(confirmed, ttl);
        let at = |ms| clock.now(confirmed + Duration::from_millis(ms));
        assert!(DeadlineClock::is_live(at(0), deadline));
        assert!(DeadlineClock::is_live(at(9_999), deadline));
        assert!(DeadlineClock::is_live(at(10_499), deadline));
        assert!(!DeadlineClock::is_live(at(10_500), deadline));
    }

    #[test]
    fn huge_ttls_saturate_instead_of_wrapping() {
        let base = Instant::now();
        let clock = DeadlineClock::starting_at(base);
        let deadline = clock.deadline(base, Duration::from_secs(u64::from(u32::MAX) * 4));
        assert_eq!(deadline, Secs::MAX);
        assert!(DeadlineClock::is_live(clock.now(base), deadline));
    }

    #[test]
    fn instants_before_the_base_count_as_the_base() {
        let earlier = Instant::now();
        let clock = DeadlineClock::starting_at(earlier + Duration::from_secs(5));
        let before_base = earlier + Duration::from_secs(2);
        assert_eq!(clock.now(before_base), 0);
        assert_eq!(clock.deadline(before_base, Duration::from_secs(7)), 7);
    }
}
