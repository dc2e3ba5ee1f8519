//! What an answer means for the index, as plain code.

use std::time::Instant;

use crate::grid::ClusterId;
use crate::index::PrefixIndex;
use crate::keying::{PrefixKeys, SessionKey};

/// What the head of an answer does to the request's keys at the serving cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// 2xx: the cluster was sent the prompt and took it; its blocks now count there.
    Confirm,
    /// 429, 5xx or a failed connection: whatever the cluster held of the prompt may be
    /// gone or is not worth going back for, so its blocks are forgotten there.
    Drop,
    /// Any other status (1xx, 3xx, 4xx but 429): says nothing about the cluster's cache.
    Keep,
}

impl Verdict {
    /// The verdict of a response status code.
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => Verdict::Confirm,
            429 | 500..=599 => Verdict::Drop,
            _ => Verdict::Keep,
        }
    }

    /// The verdict of a request whose connection failed before any response head.
    pub fn of_failed_connection() -> Self {
        Verdict::Drop
    }

    /// Applies the verdict to `keys` at `cluster` in `index`, at `now`.
    pub fn apply(self, index: &PrefixIndex, cluster: &ClusterId, keys: &[u64], now: Instant) {
        match self {
            Verdict::Confirm => index.confirm(cluster, keys, now),
            Verdict::Drop => index.drop_keys(cluster, keys),
            Verdict::Keep => {}
        }
    }

    /// Applies the verdict to a request's `keys` (when it had any) and its `sessions` (the
    /// one its client named, its [`thread`](crate::route::Prompt::thread): an `Option` or
    /// any list) at `cluster`: the keys as [`apply`](Self::apply) does, then each session,
    /// confirmed as holding the keys' [`total_covered_bytes`] or dropped. A drop also drops
    /// the thread the keys [`follow`](PrefixKeys::follows): that prompt is the head of
    /// this one, whose blocks are forgotten there.
    ///
    /// [`total_covered_bytes`]: PrefixKeys::total_covered_bytes
    pub fn apply_to_request(
        self,
        index: &PrefixIndex,
        cluster: &ClusterId,
        keys: Option<&PrefixKeys>,
        sessions: impl IntoIterator<Item = SessionKey>,
        now: Instant,
    ) {
        if let Some(keys) = keys {
            self.apply(index, cluster, keys.as_slice(), now);
        }
        // Written after its prompt's keys: the sessions are the most recent entries.
        let held = keys.map_or(0, PrefixKeys::total_covered_bytes);
        let followed = keys
            .and_then(PrefixKeys::follows)
            .filter(|_| self == Verdict::Drop);
        for session in sessions.into_iter().chain(followed) {
            match self {
                Verdict::Confirm => index.confirm_session(cluster, session, held, now),
                Verdict::Drop => index.drop_keys(cluster, &[session.as_u64()]),
                Verdict::Keep => {}
            }
        }
    }

    /// A short name for logs: `confirm`, `drop`, `keep`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Confirm => "confirm",
            Verdict::Drop => "drop",
            Verdict::Keep => "keep",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_hundreds_confirm_429_and_5xx_drop_the_rest_keep() {
        for status in [200, 201, 204, 299] {
            assert_eq!(Verdict::of_status(status), Verdict::Confirm, "{status}");
        }
        for status in [429, 500, 502, 503, 504, 599] {
            assert_eq!(Verdict::of_status(status), Verdict::Drop, "{status}");
        }
        for status in [
            100, 101, 301, 304, 400, 401, 404, 408, 413, 422, 428, 430, 600,
        ] {
            assert_eq!(Verdict::of_status(status), Verdict::Keep, "{status}");
        }
        assert_eq!(Verdict::of_failed_connection(), Verdict::Drop);
    }
}
