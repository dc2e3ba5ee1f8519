//! The seam through which replicas share what their indexes learned.
//!
//! The index stays sans-IO: it tells an [`IndexObserver`] about each change it makes on
//! its own (a confirmation or a drop), and takes a peer's change through
//! [`PrefixIndex::apply`](super::PrefixIndex::apply). Carrying events between replicas
//! (the example gateway uses a Redis Stream) is the caller's business.

use std::fmt;
use std::time::Duration;

use crate::grid::ClusterId;

/// A change to one cluster's entries, made here (seen by an [`IndexObserver`]) or by a
/// peer (given to [`PrefixIndex::apply`](super::PrefixIndex::apply)).
///
/// The keys stand for prompt text: carry them only between replicas that key alike (the
/// same [`KeySeed`](crate::keying::KeySeed) fingerprint), and never log them. `Debug`
/// prints the count only.
///
/// `#[non_exhaustive]`: the index may learn other kinds of change; a carrier that does not
/// know one leaves it local to its replica.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum IndexEvent<'a> {
    /// `cluster` answered a request with prompt `keys` with 2xx; the keys count there for
    /// `lifetime` from now.
    Confirmed {
        /// The cluster that answered.
        cluster: &'a ClusterId,
        /// The request's prefix keys, in prompt order.
        keys: &'a [u64],
        /// How long the confirmation counts from the moment of the event.
        lifetime: Duration,
    },
    /// `cluster` answered a request of session `key` with 2xx, holding `held_bytes` of its
    /// prompt; the session counts there for `lifetime` from now. A failure drops the
    /// session's key with [`Dropped`](Self::Dropped), like a prefix key.
    SessionConfirmed {
        /// The cluster that answered.
        cluster: &'a ClusterId,
        /// The session's key ([`SessionKey::as_u64`](crate::keying::SessionKey::as_u64)).
        key: u64,
        /// Bytes of canonical prompt the request covered (0 when its prompt had no keys).
        held_bytes: u64,
        /// How long the confirmation counts from the moment of the event.
        lifetime: Duration,
    },
    /// `cluster` failed a request with prompt `keys` (429, 5xx or no connection); the keys
    /// no longer count there.
    Dropped {
        /// The cluster that failed.
        cluster: &'a ClusterId,
        /// The request's prefix keys, in prompt order.
        keys: &'a [u64],
    },
}

impl IndexEvent<'_> {
    /// The cluster the event is about.
    pub fn cluster(&self) -> &ClusterId {
        match self {
            Self::Confirmed { cluster, .. }
            | Self::SessionConfirmed { cluster, .. }
            | Self::Dropped { cluster, .. } => cluster,
        }
    }

    /// The keys the event is about: the prefix keys, or the one session key.
    pub fn keys(&self) -> &[u64] {
        match self {
            Self::Confirmed { keys, .. } | Self::Dropped { keys, .. } => keys,
            Self::SessionConfirmed { key, .. } => std::slice::from_ref(key),
        }
    }
}

impl fmt::Debug for IndexEvent<'_> {
    // Counts only: keys stand for prompt text and never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Confirmed {
                cluster,
                keys,
                lifetime,
            } => f
                .debug_struct("Confirmed")
                .field("cluster", cluster)
                .field("keys", &keys.len())
                .field("lifetime", lifetime)
                .finish(),
            Self::SessionConfirmed {
                cluster,
                held_bytes,
                lifetime,
                ..
            } => f
                .debug_struct("SessionConfirmed")
                .field("cluster", cluster)
                .field("held_bytes", held_bytes)
                .field("lifetime", lifetime)
                .finish_non_exhaustive(),
            Self::Dropped { cluster, keys } => f
                .debug_struct("Dropped")
                .field("cluster", cluster)
                .field("keys", &keys.len())
                .finish(),
        }
    }
}

/// Told of every change the index makes on its own: each
/// [`confirm`](super::PrefixIndex::confirm) and [`drop_keys`](super::PrefixIndex::drop_keys)
/// for a cluster it knows. Changes made through [`apply`](super::PrefixIndex::apply) are
/// not told, so a peer's event is never sent back out.
///
/// `observe` runs on the request path, inside the confirmation of an answer: it must not
/// block or wait on I/O. Copy what is needed and hand it to another task (a bounded queue
/// that drops when full, say).
pub trait IndexObserver: Send + Sync {
    /// Called after the index applied `event`.
    fn observe(&self, event: &IndexEvent<'_>);
}
