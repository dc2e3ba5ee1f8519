//! The shared index's wire format, and the rule for applying a peer's event: sans-IO, so
//! that any gateway can share an index with its peers over the carrier it has (the example
//! gateway uses a Redis Stream; a message bus, a gossip protocol or a file would do).
//!
//! A replica's [`PrefixIndex`] tells its [`IndexObserver`](super::IndexObserver) of each
//! local change; [`WireEvent::encode_observed`] turns that change into bytes to send.
//! A peer reads them back with [`WireEvent::decode`] and hands the event to [`apply`],
//! which checks it is meant for this replica and applies it through
//! [`PrefixIndex::apply`].
//!
//! # The format (version 1)
//!
//! One event, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version, [`WIRE_VERSION`] |
//! | 1 | kind: 1 confirmed, 2 dropped, 3 session confirmed |
//! | 8 | the sender's keying seed fingerprint ([`KeySeed::fingerprint`](crate::keying::KeySeed::fingerprint)) |
//! | 8 | the sender's replica id (random per process) |
//! | 8 | deadline, unix milliseconds (0 for a drop) |
//! | 4 | cluster digest ([`ClusterDigest`](crate::grid::ClusterDigest), as in tagged ids) |
//! | 1 + n | site name: its length, then its bytes |
//! | 2 + 8k | key count, then the 64-bit prefix keys in prompt order (a session: its one key) |
//! | 8 | a session confirmation only: the bytes of prompt it held |
//!
//! A cluster is named by its site and name digest, as tagged ids name it: fixed-size, and
//! a replica finds it in its own grid without the name travelling. The deadline is
//! wall-clock time because monotonic clocks do not agree between hosts; [`apply`] turns it
//! back into the time left, so clock skew between hosts shifts a deadline by the skew and
//! no more. An event is about `40 + 8 × keys` bytes (a 32 KiB prompt: 128 keys, about
//! 1 KiB). Keys are keyed hashes of the prompt under a secret seed: no prompt text, model
//! name or tenant is in an event.
//!
//! # Who applies what
//!
//! [`apply`] takes an event only from another replica ([`Identity::replica`]) that keys
//! alike ([`Identity::fingerprint`]: replicas must derive their seeds from one secret,
//! [`KeySeed::from_tag_key`](crate::keying::KeySeed::from_tag_key)), for a cluster this
//! replica's grid has, and a confirmation only while its deadline has not passed. Anything
//! else is [`Skipped`] and changes nothing.
//!
//! ```
//! use std::time::{Instant, SystemTime};
//!
//! use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//! use grid_route_layer::index::wire::{self, Identity, WireEvent};
//! use grid_route_layer::index::{IndexEvent, IndexSettings, PrefixIndex};
//!
//! let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
//!     .with_models(["m"])
//!     .with_endpoints(["http://10.0.0.1:8000"])])]);
//! let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//! let east = grid.view().cluster_ids().next().unwrap();
//! let peer = PrefixIndex::new(IndexSettings::default(), grid.view().cluster_ids());
//! let (sender, me) = (Identity { replica: 1, fingerprint: 7 }, Identity { replica: 2, fingerprint: 7 });
//!
//! // What the sender's observer saw: east answered a prompt with 2xx.
//! let keys = [11, 12, 13];
//! let observed = IndexEvent::Confirmed { cluster: &east, keys: &keys, lifetime: std::time::Duration::from_secs(600) };
//! let bytes = WireEvent::encode_observed(&observed, sender, SystemTime::now());
//!
//! // The peer reads it back and applies it.
//! let event = WireEvent::decode(&bytes).unwrap();
//! let now = Instant::now();
//! assert_eq!(wire::apply(&event, me, &peer, &grid, now, SystemTime::now()), Ok(()));
//! assert_eq!(peer.depth(&east, &keys, now), 3);
//! // Its own events come back to the sender too (one stream), and are skipped.
//! assert_eq!(wire::apply(&event, sender, &peer, &grid, now, SystemTime::now()), Err(wire::Skipped::Own));
//! ```

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{IndexEvent, PrefixIndex};
use crate::grid::{ClusterId, Grid, SiteName};
use crate::keying::MAX_KEYS;

/// The format version this module writes and reads.
pub const WIRE_VERSION: u8 = 1;

/// What happened to a cluster's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireKind {
    /// The cluster answered 2xx; the keys count there until the deadline.
    Confirmed,
    /// The cluster failed; the keys no longer count there.
    Dropped,
    /// The cluster answered a request of a session (the one key) with 2xx.
    SessionConfirmed,
}

/// One event, as read back with [`decode`](Self::decode). `Debug` shows the key count,
/// never the keys.
#[derive(Clone, PartialEq, Eq)]
pub struct WireEvent {
    /// Confirmed, dropped or session confirmed.
    pub kind: WireKind,
    /// The sender's keying seed fingerprint.
    pub fingerprint: u64,
    /// The sender's replica id.
    pub replica: u64,
    /// When a confirmation stops counting, unix milliseconds (0 for a drop).
    pub deadline_unix_ms: u64,
    /// The cluster's site.
    pub site: SiteName,
    /// The cluster's name digest.
    pub digest: [u8; 4],
    /// The prefix keys, in prompt order, or the session's one key.
    pub keys: Vec<u64>,
    /// A session confirmation's bytes of prompt held (0 for other kinds).
    pub held_bytes: u64,
}

impl fmt::Debug for WireEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireEvent")
            .field("kind", &self.kind)
            .field("replica", &format_args!("{:016x}", self.replica))
            .field("deadline_unix_ms", &self.deadline_unix_ms)
            .field("site", &self.site.as_str())
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

/// Why bytes could not be read as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// They end before the event's fields do, or have bytes after them.
    Length,
    /// Another format version.
    Version(u8),
    /// An unknown kind byte.
    Kind(u8),
    /// The site is not a valid site name.
    Site,
    /// More keys than a request can have ([`MAX_KEYS`]).
    TooManyKeys(usize),
    /// A session confirmation without exactly one key.
    SessionKeys(usize),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length => f.write_str("truncated or overlong event"),
            Self::Version(v) => write!(f, "event format version {v}, expected {WIRE_VERSION}"),
            Self::Kind(k) => write!(f, "unknown event kind {k}"),
            Self::Site => f.write_str("the event's site is not a valid site name"),
            Self::TooManyKeys(n) => write!(f, "{n} keys, more than {MAX_KEYS}"),
            Self::SessionKeys(n) => write!(f, "a session confirmation with {n} keys, not one"),
        }
    }
}

impl std::error::Error for WireError {}

const HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 8 + 4;

/// The fields of an event that are the same whatever the keys.
struct Header<'a> {
    kind: WireKind,
    fingerprint: u64,
    replica: u64,
    deadline_unix_ms: u64,
    site: &'a str,
    digest: [u8; 4],
    /// A session confirmation's bytes held.
    held_bytes: u64,
}

fn encode(header: &Header<'_>, keys: &[u64]) -> Vec<u8> {
    let keys = &keys[..keys.len().min(MAX_KEYS)];
    let site = header.site.as_bytes();
    let mut out = Vec::with_capacity(HEADER_BYTES + 1 + site.len() + 2 + 8 * keys.len());
    out.push(WIRE_VERSION);
    out.push(match header.kind {
        WireKind::Confirmed => 1,
        WireKind::Dropped => 2,
        WireKind::SessionConfirmed => 3,
    });
    out.extend_from_slice(&header.fingerprint.to_le_bytes());
    out.extend_from_slice(&header.replica.to_le_bytes());
    out.extend_from_slice(&header.deadline_unix_ms.to_le_bytes());
    out.extend_from_slice(&header.digest);
    // A site name is a DNS-1123 label, at most 63 bytes: one length byte holds it.
    out.push(site.len() as u8);
    out.extend_from_slice(site);
    // At most MAX_KEYS (512) keys: two bytes hold the count.
    out.extend_from_slice(&(keys.len() as u16).to_le_bytes());
    for key in keys {
        out.extend_from_slice(&key.to_le_bytes());
    }
    if header.kind == WireKind::SessionConfirmed {
        out.extend_from_slice(&header.held_bytes.to_le_bytes());
    }
    out
}

impl WireEvent {
    /// `event`, a change this replica's index made on its own (as its observer is told),
    /// in wire form, from `sender` at `wall_now`: a confirmation's lifetime becomes a
    /// wall-clock deadline. At most [`MAX_KEYS`] keys are written.
    pub fn encode_observed(
        event: &IndexEvent<'_>,
        sender: Identity,
        wall_now: SystemTime,
    ) -> Vec<u8> {
        let (kind, deadline_unix_ms, held_bytes) = match event {
            IndexEvent::Confirmed { lifetime, .. } => {
                (WireKind::Confirmed, unix_ms(wall_now + *lifetime), 0)
            }
            IndexEvent::SessionConfirmed {
                lifetime,
                held_bytes,
                ..
            } => (
                WireKind::SessionConfirmed,
                unix_ms(wall_now + *lifetime),
                *held_bytes,
            ),
            IndexEvent::Dropped { .. } => (WireKind::Dropped, 0, 0),
        };
        let cluster: &ClusterId = event.cluster();
        encode(
            &Header {
                kind,
                fingerprint: sender.fingerprint,
                replica: sender.replica,
                deadline_unix_ms,
                site: cluster.site().as_str(),
                digest: cluster.digest().to_bytes(),
                held_bytes,
            },
            event.keys(),
        )
    }

    /// The event in wire form (see the [module docs](self)). At most [`MAX_KEYS`] keys
    /// are written.
    pub fn encode(&self) -> Vec<u8> {
        encode(
            &Header {
                kind: self.kind,
                fingerprint: self.fingerprint,
                replica: self.replica,
                deadline_unix_ms: self.deadline_unix_ms,
                site: self.site.as_str(),
                digest: self.digest,
                held_bytes: self.held_bytes,
            },
            &self.keys,
        )
    }

    /// Reads an event from its wire form.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let kind = match r.u8()? {
            1 => WireKind::Confirmed,
            2 => WireKind::Dropped,
            3 => WireKind::SessionConfirmed,
            other => return Err(WireError::Kind(other)),
        };
        let fingerprint = r.u64()?;
        let replica = r.u64()?;
        let deadline_unix_ms = r.u64()?;
        let digest = r.array::<4>()?;
        let site_len = usize::from(r.u8()?);
        let site = std::str::from_utf8(r.take(site_len)?).map_err(|_| WireError::Site)?;
        let site = SiteName::new(site).map_err(|_| WireError::Site)?;
        let count = usize::from(u16::from_le_bytes(r.array::<2>()?));
        if count > MAX_KEYS {
            return Err(WireError::TooManyKeys(count));
        }
        let keys = (0..count).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        let held_bytes = if kind == WireKind::SessionConfirmed {
            if count != 1 {
                return Err(WireError::SessionKeys(count));
            }
            r.u64()?
        } else {
            0
        };
        if !r.0.is_empty() {
            return Err(WireError::Length);
        }
        Ok(Self {
            kind,
            fingerprint,
            replica,
            deadline_unix_ms,
            site,
            digest,
            keys,
            held_bytes,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Length);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array::<8>()?))
    }
}

/// `at` in unix milliseconds (0 before the epoch).
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why [`apply`] changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skipped {
    /// This replica sent it.
    Own,
    /// The sender keys under another seed (another tag key).
    OtherSeed,
    /// The grid has no such cluster.
    UnknownCluster,
    /// The confirmation's deadline has passed.
    Expired,
}

/// A replica, as its events name it: for telling its events from others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The replica's id, random per process.
    pub replica: u64,
    /// Its keying seed's fingerprint.
    pub fingerprint: u64,
}

/// Applies a peer's `event` to `index` if the rules of the [module docs](self) allow it,
/// at `now` (monotonic, for the index) and `wall_now` (for the deadline); `me` is this
/// replica, `grid` its clusters.
pub fn apply(
    event: &WireEvent,
    me: Identity,
    index: &PrefixIndex,
    grid: &Grid,
    now: Instant,
    wall_now: SystemTime,
) -> Result<(), Skipped> {
    if event.replica == me.replica {
        return Err(Skipped::Own);
    }
    if event.fingerprint != me.fingerprint {
        return Err(Skipped::OtherSeed);
    }
    let view = grid.view();
    let cluster = view
        .cluster_ids()
        .find(|id| *id.site() == event.site && id.digest().to_bytes() == event.digest)
        .ok_or(Skipped::UnknownCluster)?;
    let applied = match event.kind {
        WireKind::Confirmed => {
            let left = event.deadline_unix_ms.saturating_sub(unix_ms(wall_now));
            index.apply(
                &IndexEvent::Confirmed {
                    cluster: &cluster,
                    keys: &event.keys,
                    lifetime: Duration::from_millis(left),
                },
                now,
            )
        }
        WireKind::SessionConfirmed => {
            let left = event.deadline_unix_ms.saturating_sub(unix_ms(wall_now));
            // Decoding checked there is one key.
            let Some(&key) = event.keys.first() else {
                return Err(Skipped::Expired);
            };
            index.apply(
                &IndexEvent::SessionConfirmed {
                    cluster: &cluster,
                    key,
                    held_bytes: event.held_bytes,
                    lifetime: Duration::from_millis(left),
                },
                now,
            )
        }
        WireKind::Dropped => index.apply(
            &IndexEvent::Dropped {
                cluster: &cluster,
                keys: &event.keys,
            },
            now,
        ),
    };
    if applied {
        Ok(())
    } else {
        // The cluster exists, so only a spent lifetime makes `apply` refuse.
        Err(Skipped::Expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::{ClusterSpec, GridSettings, GridSpec, SiteSpec};
    use crate::index::IndexSettings;

    fn event() -> WireEvent {
        WireEvent {
            kind: WireKind::Confirmed,
            fingerprint: 0x0123_4567_89ab_cdef,
            replica: 42,
            deadline_unix_ms: 1_700_000_000_000,
            site: SiteName::new("east").unwrap(),
            digest: ClusterId::new(SiteName::new("east").unwrap(), "east-a")
                .digest()
                .to_bytes(),
            keys: vec![1, u64::MAX, 0x9e37_79b9_7f4a_7c15],
            held_bytes: 0,
        }
    }

    #[test]
    fn an_event_reads_back_as_written() {
        let event = event();
        let bytes = event.encode();
        assert_eq!(bytes.len(), HEADER_BYTES + 1 + 4 + 2 + 3 * 8);
        assert_eq!(WireEvent::decode(&bytes), Ok(event.clone()));
        let dropped = WireEvent {
            kind: WireKind::Dropped,
            deadline_unix_ms: 0,
            keys: vec![],
            ..event
        };
        assert_eq!(WireEvent::decode(&dropped.encode()), Ok(dropped));
    }

    #[test]
    fn a_session_confirmation_carries_its_one_key_and_the_prompt_it_held() {
        let session = WireEvent {
            kind: WireKind::SessionConfirmed,
            keys: vec![0x5e55_1011],
            held_bytes: 40 * 256,
            ..event()
        };
        let bytes = session.encode();
        assert_eq!(bytes[1], 3);
        assert_eq!(bytes.len(), HEADER_BYTES + 1 + 4 + 2 + 8 + 8);
        assert_eq!(bytes[bytes.len() - 8..], (40_u64 * 256).to_le_bytes());
        assert_eq!(WireEvent::decode(&bytes), Ok(session.clone()));
        for cut in 0..bytes.len() {
            assert!(WireEvent::decode(&bytes[..cut]).is_err(), "{cut}");
        }
        let two = WireEvent {
            keys: vec![1, 2],
            ..session
        };
        assert_eq!(
            WireEvent::decode(&two.encode()),
            Err(WireError::SessionKeys(2))
        );
    }

    #[test]
    fn the_encoding_is_the_documented_layout() {
        let bytes = event().encode();
        assert_eq!(bytes[0], WIRE_VERSION);
        assert_eq!(bytes[1], 1);
        assert_eq!(bytes[2..10], 0x0123_4567_89ab_cdef_u64.to_le_bytes());
        assert_eq!(bytes[10..18], 42_u64.to_le_bytes());
        assert_eq!(bytes[18..26], 1_700_000_000_000_u64.to_le_bytes());
        assert_eq!(bytes[30], 4);
        assert_eq!(&bytes[31..35], b"east");
        assert_eq!(bytes[35..37], 3_u16.to_le_bytes());
        assert_eq!(bytes[37..45], 1_u64.to_le_bytes());
    }

    #[test]
    fn damaged_or_foreign_entries_are_refused() {
        let bytes = event().encode();
        for cut in 0..bytes.len() {
            assert_eq!(
                WireEvent::decode(&bytes[..cut]),
                Err(WireError::Length),
                "{cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(WireEvent::decode(&longer), Err(WireError::Length));
        let mut version = bytes.clone();
        version[0] = 2;
        assert_eq!(WireEvent::decode(&version), Err(WireError::Version(2)));
        let mut kind = bytes.clone();
        kind[1] = 9;
        assert_eq!(WireEvent::decode(&kind), Err(WireError::Kind(9)));
        let mut site = bytes.clone();
        site[31] = b'E';
        assert_eq!(WireEvent::decode(&site), Err(WireError::Site));
        let mut many = bytes;
        many[35..37].copy_from_slice(&600_u16.to_le_bytes());
        assert_eq!(WireEvent::decode(&many), Err(WireError::TooManyKeys(600)));
    }

    #[test]
    fn an_observed_change_encodes_as_the_event_it_was() {
        let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
        let sender = Identity {
            replica: 42,
            fingerprint: 0x0123_4567_89ab_cdef,
        };
        let wall = UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let keys = [1, u64::MAX, 0x9e37_79b9_7f4a_7c15];
        let confirmed = IndexEvent::Confirmed {
            cluster: &east,
            keys: &keys,
            lifetime: Duration::from_secs(600),
        };
        let bytes = WireEvent::encode_observed(&confirmed, sender, wall);
        let expected = WireEvent {
            deadline_unix_ms: 1_700_000_600_000,
            ..event()
        };
        assert_eq!(WireEvent::decode(&bytes), Ok(expected));
        let dropped = IndexEvent::Dropped {
            cluster: &east,
            keys: &keys,
        };
        let bytes = WireEvent::encode_observed(&dropped, sender, wall);
        let read = WireEvent::decode(&bytes).unwrap();
        assert_eq!((read.kind, read.deadline_unix_ms), (WireKind::Dropped, 0));
        // Keys past a request's maximum are not written.
        let many: Vec<u64> = (0..MAX_KEYS as u64 + 5).collect();
        let long = IndexEvent::Confirmed {
            cluster: &east,
            keys: &many,
            lifetime: Duration::from_secs(1),
        };
        let bytes = WireEvent::encode_observed(&long, sender, wall);
        assert_eq!(WireEvent::decode(&bytes).unwrap().keys.len(), MAX_KEYS);
    }

    fn grid_and_index() -> (Grid, PrefixIndex, ClusterId) {
        let spec =
            GridSpec::new([
                SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
                    .with_models(["m"])
                    .with_endpoints(["http://127.0.0.1:1"])]),
            ]);
        let grid = Grid::new(&spec, GridSettings::default()).unwrap();
        let index = PrefixIndex::new(IndexSettings::default(), grid.view().cluster_ids());
        let id = grid.view().cluster_ids().next().unwrap();
        (grid, index, id)
    }

    #[test]
    fn a_peers_confirmation_applies_for_the_time_it_has_left() {
        let (grid, index, east) = grid_and_index();
        let me = Identity {
            replica: 7,
            fingerprint: event().fingerprint,
        };
        let wall =
            UNIX_EPOCH + Duration::from_millis(event().deadline_unix_ms) - Duration::from_secs(30);
        let now = Instant::now();
        assert_eq!(apply(&event(), me, &index, &grid, now, wall), Ok(()));
        assert_eq!(index.depth(&east, &event().keys, now), 3);
        assert_eq!(
            index.depth(&east, &event().keys, now + Duration::from_secs(31)),
            0
        );
    }

    #[test]
    fn a_peers_session_confirmation_applies_with_the_prompt_it_held() {
        let (grid, index, east) = grid_and_index();
        let me = Identity {
            replica: 7,
            fingerprint: event().fingerprint,
        };
        let session = WireEvent {
            kind: WireKind::SessionConfirmed,
            keys: vec![0x5e55_1011],
            held_bytes: 40 * 256,
            ..event()
        };
        let wall =
            UNIX_EPOCH + Duration::from_millis(event().deadline_unix_ms) - Duration::from_secs(30);
        let now = Instant::now();
        assert_eq!(apply(&session, me, &index, &grid, now, wall), Ok(()));
        let key = crate::keying::SessionKey::from_digest(0x5e55_1011);
        assert_eq!(
            index.session(&east, key, now).unwrap().held_bytes(),
            40 * 256
        );
        assert!(
            index
                .session(&east, key, now + Duration::from_secs(31))
                .is_none()
        );
    }

    #[test]
    fn events_under_another_seed_fingerprint_are_not_applied() {
        let (grid, index, east) = grid_and_index();
        let me = Identity {
            replica: 7,
            fingerprint: event().fingerprint ^ 1,
        };
        let wall = UNIX_EPOCH + Duration::from_millis(event().deadline_unix_ms - 1_000);
        let now = Instant::now();
        assert_eq!(
            apply(&event(), me, &index, &grid, now, wall),
            Err(Skipped::OtherSeed)
        );
        assert_eq!(index.entries(&east), 0);
    }

    #[test]
    fn own_expired_and_unknown_cluster_events_are_skipped() {
        let (grid, index, east) = grid_and_index();
        let fingerprint = event().fingerprint;
        let wall = UNIX_EPOCH + Duration::from_millis(event().deadline_unix_ms - 1_000);
        let now = Instant::now();
        let own = Identity {
            replica: event().replica,
            fingerprint,
        };
        assert_eq!(
            apply(&event(), own, &index, &grid, now, wall),
            Err(Skipped::Own)
        );
        let me = Identity {
            replica: 7,
            fingerprint,
        };
        let late = wall + Duration::from_secs(2);
        assert_eq!(
            apply(&event(), me, &index, &grid, now, late),
            Err(Skipped::Expired)
        );
        let elsewhere = WireEvent {
            site: SiteName::new("west").unwrap(),
            ..event()
        };
        assert_eq!(
            apply(&elsewhere, me, &index, &grid, now, wall),
            Err(Skipped::UnknownCluster)
        );
        assert_eq!(index.entries(&east), 0);
    }

    proptest::proptest! {
        /// Bytes from a peer are untrusted: any of them decode or are refused, never panic,
        /// and what decodes writes back as the same bytes (no two encodings of one event).
        #[test]
        fn any_bytes_decode_or_are_refused_and_what_decodes_is_canonical(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            if let Ok(event) = WireEvent::decode(&bytes) {
                proptest::prop_assert_eq!(event.encode(), bytes);
            }
        }

        /// Whatever the event, it reads back as written.
        #[test]
        fn every_event_reads_back_as_written(
            kind in 0..3_u8,
            fingerprint: u64,
            replica: u64,
            deadline_unix_ms: u64,
            digest: [u8; 4],
            keys in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..40),
            held_bytes: u64,
        ) {
            let kind = [WireKind::Confirmed, WireKind::Dropped, WireKind::SessionConfirmed][usize::from(kind)];
            let session = kind == WireKind::SessionConfirmed;
            let event = WireEvent {
                kind,
                fingerprint,
                replica,
                deadline_unix_ms,
                site: SiteName::new("east-2").unwrap(),
                digest,
                keys: if session { vec![keys.first().copied().unwrap_or(7)] } else { keys },
                held_bytes: if session { held_bytes } else { 0 },
            };
            proptest::prop_assert_eq!(WireEvent::decode(&event.encode()), Ok(event));
        }
    }
}
