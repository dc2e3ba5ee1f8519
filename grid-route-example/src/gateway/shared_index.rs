//! The shared index: replicas of a gateway tell each other what their prefix indexes
//! learned, through a Redis Stream, and a replica that starts replays the last `ttl_secs`
//! of it so that it comes back warm.
//!
//! Set by `grid_site_route.prefix_affinity.shared_index: { redis_url, key_prefix }`. The
//! library's index does no I/O: it tells an [`IndexObserver`] (here an `Outbox`) of each
//! local confirmation and drop, and takes a peer's through `PrefixIndex::apply`. This
//! module is the transport between the two.
//!
//! # What goes through Redis
//!
//! One stream, `KEY_PREFIX:index-events`, one entry per event with a single field
//! [`EVENT_FIELD`] holding the event in a compact binary form (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version, [`EVENT_VERSION`] |
//! | 1 | kind: 1 confirmed, 2 dropped, 3 session confirmed |
//! | 8 | the sender's keying seed fingerprint |
//! | 8 | the sender's replica id (random per process) |
//! | 8 | deadline, unix milliseconds (0 for a drop) |
//! | 4 | cluster digest (the 8-hex digest of the cluster's name, as in tagged ids) |
//! | 1 + n | site name: its length, then its bytes |
//! | 2 + 8k | key count, then the 64-bit prefix keys in prompt order (a session: its one key) |
//! | 8 | a session confirmation only: the bytes of prompt it held |
//!
//! A cluster is named by its site and name digest, as tagged ids name it: fixed-size,
//! and a replica finds it in its own grid without the name travelling. The deadline is
//! wall-clock time because monotonic clocks do not agree between hosts; a replica turns
//! it back into the time left when it applies the event, so clock skew between hosts
//! shifts a deadline by the skew and no more. An event is about `40 + 8 × keys` bytes
//! (a 32 KiB prompt: 128 keys, about 1 KiB). Keys are keyed hashes of the prompt under a
//! secret seed: no prompt text, model name or tenant ever reaches Redis.
//!
//! # Rules
//!
//! - **Replicas key alike.** With `shared_index` set, the keying seed is derived from the
//!   tag key (`KeySeed::from_tag_key`), so replicas holding the same key file key a
//!   prompt alike. Every event carries the sender's seed fingerprint; a replica applies
//!   only events whose fingerprint is its own, skips its own events (replica id) and
//!   events for clusters its grid does not have, and drops confirmations whose deadline
//!   has passed.
//! - **Never on the request path.** The observer encodes the event and `try_send`s it to
//!   a bounded queue ([`PUBLISH_QUEUE_CAPACITY`]); a full queue drops the event and counts
//!   it (`grid_route_shared_index_events_total{direction="dropped"}`). A publisher task
//!   sends what is queued in pipelined batches of up to [`PUBLISH_BATCH_MAX`] `XADD`s, each
//!   trimming the stream with `MINID ~` to the index TTL.
//! - **Replay.** A reader task starts at the stream id of `now − ttl_secs` and follows
//!   with `XREAD BLOCK`; on reconnect it resumes after the last id it read. A gateway
//!   waits up to [`REPLAY_WAIT`] for the first catch-up before it serves, so a restarted
//!   replica is warm from its first request when Redis is reachable.
//! - **Redis down.** Routing goes on with the local index. Every failed connect, publish
//!   or read counts `grid_route_shared_index_errors_total` and is logged at most once per
//!   [`ERROR_LOG_INTERVAL`] (with how many were not logged); both tasks reconnect with
//!   backoff from [`RECONNECT_BACKOFF_MIN`] to [`RECONNECT_BACKOFF_MAX`].
//!
//! The Redis client is the `redis` crate (redis-rs): the maintained, most used Rust
//! client, with tokio support, streams, and pipelines; only those features are enabled.
//! `fred` would do as well but brings its own connection pooling and reconnection policy,
//! which this module wants to own (it must count and rate-limit the errors, and resume
//! the stream read from its own last id).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use grid_route_layer::grid::{ClusterId, Grid, SiteName};
use grid_route_layer::index::{IndexEvent, IndexObserver, PrefixIndex};
use grid_route_layer::keying::MAX_KEYS;
use grid_route_layer::metrics::{
    DIRECTION_LABEL, SHARED_INDEX_ERRORS_TOTAL, SHARED_INDEX_EVENTS_TOTAL,
};
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::SharedIndexSettings;

/// The stream entry's one field, holding the encoded event.
pub const EVENT_FIELD: &str = "e";
/// The event encoding's version byte.
pub const EVENT_VERSION: u8 = 1;
/// Encoded events waiting to be published, at most; more are dropped and counted.
pub const PUBLISH_QUEUE_CAPACITY: usize = 4096;
/// `XADD`s sent in one pipeline, at most.
pub const PUBLISH_BATCH_MAX: usize = 256;
/// Entries read by one `XREAD`, at most.
pub const READ_COUNT: usize = 1024;
/// How long one `XREAD` waits for new entries.
pub const READ_BLOCK: Duration = Duration::from_secs(1);
/// How long a gateway waits for the first replay before it serves.
pub const REPLAY_WAIT: Duration = Duration::from_secs(2);
/// At most one log line about Redis errors per this interval.
pub const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The first wait before reconnecting.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between reconnects.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long connecting to Redis may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long any reply may take beyond a blocking read's own wait.
const RESPONSE_MARGIN: Duration = Duration::from_secs(2);

/// The Redis key of the event stream under `key_prefix`.
pub fn stream_key(key_prefix: &str) -> String {
    format!("{key_prefix}:index-events")
}

// ---- events on the wire ---------------------------------------------------------------

/// What happened to a cluster's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The cluster answered 2xx; the keys count there until the deadline.
    Confirmed,
    /// The cluster failed; the keys no longer count there.
    Dropped,
    /// The cluster answered a request of a session (the one key) with 2xx.
    SessionConfirmed,
}

/// One event as read from the stream. `Debug` shows the key count, never the keys.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedEvent {
    /// Confirmed or dropped.
    pub kind: EventKind,
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

impl std::fmt::Debug for SharedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEvent")
            .field("kind", &self.kind)
            .field("replica", &format_args!("{:016x}", self.replica))
            .field("deadline_unix_ms", &self.deadline_unix_ms)
            .field("site", &self.site.as_str())
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

/// Why a stream entry could not be read as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// It ends before its fields do, or has bytes after them.
    #[error("truncated or overlong event")]
    Length,
    /// Another format version.
    #[error("event format version {0}, expected {EVENT_VERSION}")]
    Version(u8),
    /// An unknown kind byte.
    #[error("unknown event kind {0}")]
    Kind(u8),
    /// The site is not a valid site name.
    #[error("the event's site is not a valid site name")]
    Site,
    /// More keys than a request can have.
    #[error("{0} keys, more than {MAX_KEYS}")]
    TooManyKeys(usize),
    /// A session confirmation without exactly one key.
    #[error("a session confirmation with {0} keys, not one")]
    SessionKeys(usize),
}

const HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 8 + 4;

/// The fields of an event that are the same whatever the keys.
struct Header<'a> {
    kind: EventKind,
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
    out.push(EVENT_VERSION);
    out.push(match header.kind {
        EventKind::Confirmed => 1,
        EventKind::Dropped => 2,
        EventKind::SessionConfirmed => 3,
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
    if header.kind == EventKind::SessionConfirmed {
        out.extend_from_slice(&header.held_bytes.to_le_bytes());
    }
    out
}

impl SharedEvent {
    /// The event in its wire form (see the [module docs](self)).
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
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != EVENT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind = match r.u8()? {
            1 => EventKind::Confirmed,
            2 => EventKind::Dropped,
            3 => EventKind::SessionConfirmed,
            other => return Err(DecodeError::Kind(other)),
        };
        let fingerprint = r.u64()?;
        let replica = r.u64()?;
        let deadline_unix_ms = r.u64()?;
        let digest = r.array::<4>()?;
        let site_len = usize::from(r.u8()?);
        let site = std::str::from_utf8(r.take(site_len)?).map_err(|_| DecodeError::Site)?;
        let site = SiteName::new(site).map_err(|_| DecodeError::Site)?;
        let count = usize::from(u16::from_le_bytes(r.array::<2>()?));
        if count > MAX_KEYS {
            return Err(DecodeError::TooManyKeys(count));
        }
        let keys = (0..count).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        let held_bytes = if kind == EventKind::SessionConfirmed {
            if count != 1 {
                return Err(DecodeError::SessionKeys(count));
            }
            r.u64()?
        } else {
            0
        };
        if !r.0.is_empty() {
            return Err(DecodeError::Length);
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
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Length);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array::<8>()?))
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// ---- applying a peer's event ----------------------------------------------------------

/// Why an event read from the stream changed nothing here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What this replica is, for telling its events from others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// This process's replica id.
    pub replica: u64,
    /// This replica's keying seed fingerprint.
    pub fingerprint: u64,
}

/// Applies a peer's `event` to `index` if the rules of the [module docs](self) allow it,
/// at `now` (monotonic, for the index) and `wall_now` (for the deadline).
pub fn apply_event(
    event: &SharedEvent,
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
        EventKind::Confirmed => {
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
        EventKind::SessionConfirmed => {
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
        EventKind::Dropped => index.apply(
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

// ---- the outbox: local events onto the queue ------------------------------------------

/// The index's observer: encodes each local change and queues it for the publisher,
/// without waiting. Idle (one atomic load per event) while sharing is off.
pub(crate) struct Outbox {
    replica: u64,
    fingerprint: AtomicU64,
    queue: ArcSwapOption<mpsc::Sender<Vec<u8>>>,
}

impl Outbox {
    fn new() -> Self {
        // A random replica id: `RandomState` is seeded from the OS per process.
        let replica = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::process::id(),
        );
        Self {
            replica,
            fingerprint: AtomicU64::new(0),
            queue: ArcSwapOption::empty(),
        }
    }

    fn identity(&self) -> Identity {
        Identity {
            replica: self.replica,
            fingerprint: self.fingerprint.load(Ordering::Relaxed),
        }
    }
}

impl IndexObserver for Outbox {
    fn observe(&self, event: &IndexEvent<'_>) {
        let queue = self.queue.load();
        let Some(queue) = queue.as_deref() else {
            return;
        };
        let (kind, deadline_unix_ms, held_bytes) = match event {
            IndexEvent::Confirmed { lifetime, .. } => (
                EventKind::Confirmed,
                unix_ms(SystemTime::now() + *lifetime),
                0,
            ),
            IndexEvent::SessionConfirmed {
                lifetime,
                held_bytes,
                ..
            } => (
                EventKind::SessionConfirmed,
                unix_ms(SystemTime::now() + *lifetime),
                *held_bytes,
            ),
            IndexEvent::Dropped { .. } => (EventKind::Dropped, 0, 0),
            // A kind of change the wire format cannot carry stays with this replica.
            _ => return,
        };
        let cluster: &ClusterId = event.cluster();
        let wire = encode(
            &Header {
                kind,
                fingerprint: self.fingerprint.load(Ordering::Relaxed),
                replica: self.replica,
                deadline_unix_ms,
                site: cluster.site().as_str(),
                digest: cluster.digest().to_bytes(),
                held_bytes,
            },
            event.keys(),
        );
        if let Err(mpsc::error::TrySendError::Full(_)) = queue.try_send(wire) {
            metrics::counter!(SHARED_INDEX_EVENTS_TOTAL, DIRECTION_LABEL => "dropped").increment(1);
        }
    }
}

// ---- the running transport ------------------------------------------------------------

/// Sharing for one gateway: the outbox the index tells, and the Redis tasks while
/// `shared_index` is configured.
pub(crate) struct SharedIndex {
    outbox: Arc<Outbox>,
    running: Mutex<Option<Running>>,
}

struct Running {
    settings: SharedIndexSettings,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What the tasks work on.
pub(crate) struct Peers {
    pub(crate) index: Arc<PrefixIndex>,
    pub(crate) grid: Grid,
    pub(crate) stopped: watch::Receiver<bool>,
}

impl SharedIndex {
    pub(crate) fn new() -> Self {
        Self {
            outbox: Arc::new(Outbox::new()),
            running: Mutex::new(None),
        }
    }

    /// The observer to install in the index.
    pub(crate) fn observer(&self) -> Arc<dyn IndexObserver> {
        Arc::clone(&self.outbox) as Arc<dyn IndexObserver>
    }

    /// Stamps later events with `fingerprint`, and applies only peers' events bearing it.
    pub(crate) fn set_fingerprint(&self, fingerprint: u64) {
        self.outbox
            .fingerprint
            .store(fingerprint, Ordering::Relaxed);
    }

    /// Starts, restarts (new URL or prefix) or stops sharing to match `settings`. Returns
    /// a receiver that turns true when a newly started reader has caught up with the
    /// stream; `None` when nothing was started.
    pub(crate) fn configure(
        &self,
        settings: Option<&SharedIndexSettings>,
        peers: Peers,
    ) -> Option<watch::Receiver<bool>> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().map(|r| &r.settings) == settings {
            return None;
        }
        // Stop the old tasks (if any) before the new ones start.
        self.outbox.queue.store(None);
        *running = None;
        let settings = settings?;
        // Checked at validation, so this cannot fail unless the URL changed meaning since.
        let client = match Client::open(settings.redis_url.as_str()) {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, "shared index: unusable redis_url; not sharing");
                return None;
            }
        };
        let key = stream_key(&settings.key_prefix);
        let (queue, outgoing) = mpsc::channel(PUBLISH_QUEUE_CAPACITY);
        self.outbox.queue.store(Some(Arc::new(queue)));
        let (warm, warmed) = watch::channel(false);
        let errors = Arc::new(ErrorLog::default());
        let publisher = Publisher {
            client: client.clone(),
            key: key.clone(),
            index: Arc::clone(&peers.index),
            errors: Arc::clone(&errors),
        };
        let follower = Follower {
            client,
            key: key.clone(),
            outbox: Arc::clone(&self.outbox),
            index: peers.index,
            grid: peers.grid,
            errors,
            warm,
        };
        let tasks = [
            tokio::spawn(until_stopped(
                peers.stopped.clone(),
                publisher.run(outgoing),
            )),
            tokio::spawn(until_stopped(peers.stopped, follower.run())),
        ];
        tracing::info!(stream = %key, "shared index: sharing through Redis");
        *running = Some(Running {
            settings: settings.clone(),
            tasks,
        });
        Some(warmed)
    }
}

async fn until_stopped(mut stopped: watch::Receiver<bool>, work: impl Future<Output = ()>) {
    tokio::select! {
        _ = stopped.wait_for(|stopped| *stopped) => {}
        () = work => {}
    }
}

async fn connect(client: &Client, errors: &ErrorLog) -> Result<MultiplexedConnection, ()> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(READ_BLOCK + RESPONSE_MARGIN));
    let connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|error| errors.record("connect", &error))?;
    errors.connected();
    Ok(connection)
}

/// Exponential backoff between reconnects.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(RECONNECT_BACKOFF_MIN)
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(RECONNECT_BACKOFF_MAX);
    }

    fn reset(&mut self) {
        self.0 = RECONNECT_BACKOFF_MIN;
    }
}

/// Counts every error; logs at most one line per [`ERROR_LOG_INTERVAL`], and one line when
/// Redis answers again after errors.
#[derive(Default)]
struct ErrorLog {
    last_logged: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
    failing: AtomicBool,
}

impl ErrorLog {
    fn record(&self, operation: &'static str, error: &RedisError) {
        self.failing.store(true, Ordering::Relaxed);
        metrics::counter!(SHARED_INDEX_ERRORS_TOTAL).increment(1);
        if let Some(unlogged) = self.due(Instant::now()) {
            tracing::warn!(
                operation,
                %error,
                not_logged_since_last = unlogged,
                "shared index: Redis unavailable; routing goes on with the local index"
            );
        }
    }

    /// A connection to Redis succeeded: says so once after errors.
    fn connected(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("shared index: Redis answers again; sharing resumes");
        }
    }

    /// Whether an error at `now` gets a log line; if so, how many errors since the last
    /// line did not.
    fn due(&self, now: Instant) -> Option<u64> {
        let mut last = self
            .last_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| now.saturating_duration_since(at) < ERROR_LOG_INTERVAL) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

/// Sends queued events to the stream in pipelined batches.
struct Publisher {
    client: Client,
    key: String,
    index: Arc<PrefixIndex>,
    errors: Arc<ErrorLog>,
}

impl Publisher {
    async fn run(self, mut outgoing: mpsc::Receiver<Vec<u8>>) {
        let mut backoff = Backoff::new();
        let mut batch = Vec::with_capacity(PUBLISH_BATCH_MAX);
        loop {
            let Ok(mut connection) = connect(&self.client, &self.errors).await else {
                backoff.wait().await;
                continue;
            };
            backoff.reset();
            loop {
                if outgoing.recv_many(&mut batch, PUBLISH_BATCH_MAX).await == 0 {
                    return; // The outbox let go of the queue: sharing stopped.
                }
                // Entries older than the TTL can no longer count anywhere.
                let min_id = oldest_live_ms(&self.index);
                let mut pipe = redis::pipe();
                for event in &batch {
                    pipe.cmd("XADD")
                        .arg(&self.key)
                        .arg("MINID")
                        .arg("~")
                        .arg(min_id)
                        .arg("*")
                        .arg(EVENT_FIELD)
                        .arg(event.as_slice())
                        .ignore();
                }
                let sent = batch.len();
                batch.clear();
                match pipe.query_async::<()>(&mut connection).await {
                    Ok(()) => {
                        metrics::counter!(SHARED_INDEX_EVENTS_TOTAL, DIRECTION_LABEL => "published")
                            .increment(sent as u64);
                    }
                    Err(error) => {
                        // The batch is lost: each lost event costs a miss, never a wrong pin.
                        self.errors.record("publish", &error);
                        break;
                    }
                }
            }
            backoff.wait().await;
        }
    }
}

/// The unix time in ms before which no event can still count: now − the index's TTL.
fn oldest_live_ms(index: &PrefixIndex) -> u64 {
    let ttl_ms = u64::try_from(index.settings().ttl().as_millis()).unwrap_or(u64::MAX);
    unix_ms(SystemTime::now()).saturating_sub(ttl_ms)
}

/// Follows the stream and applies peers' events.
struct Follower {
    client: Client,
    key: String,
    outbox: Arc<Outbox>,
    index: Arc<PrefixIndex>,
    grid: Grid,
    errors: Arc<ErrorLog>,
    warm: watch::Sender<bool>,
}

impl Follower {
    async fn run(self) {
        // Replay: everything that can still count, i.e. newer than now − TTL. Stream ids
        // are `MILLISECONDS-SEQUENCE` on the Redis server's clock.
        let mut last_id = format!("{}-0", oldest_live_ms(&self.index));
        let mut backoff = Backoff::new();
        loop {
            let Ok(mut connection) = connect(&self.client, &self.errors).await else {
                backoff.wait().await;
                continue;
            };
            backoff.reset();
            loop {
                let mut read = redis::cmd("XREAD");
                read.arg("COUNT").arg(READ_COUNT);
                // Until the replay has caught up, reads return at once (an empty or short
                // stream must not hold a starting gateway for a whole block); then they wait.
                if *self.warm.borrow() {
                    read.arg("BLOCK").arg(READ_BLOCK.as_millis() as u64);
                }
                let reply: Result<Option<StreamReadReply>, RedisError> = read
                    .arg("STREAMS")
                    .arg(&self.key)
                    .arg(&last_id)
                    .query_async(&mut connection)
                    .await;
                let entries = match reply {
                    Ok(reply) => reply.map(|r| r.keys).unwrap_or_default(),
                    Err(error) => {
                        self.errors.record("read", &error);
                        break;
                    }
                };
                let mut read = 0;
                for entry in entries.into_iter().flat_map(|stream| stream.ids) {
                    read += 1;
                    if let Some(redis::Value::BulkString(bytes)) = entry.map.get(EVENT_FIELD) {
                        self.apply(bytes);
                    }
                    last_id = entry.id;
                }
                if read < READ_COUNT {
                    self.warm.send_replace(true);
                }
            }
            backoff.wait().await;
        }
    }

    fn apply(&self, bytes: &[u8]) {
        match SharedEvent::decode(bytes) {
            Ok(event) => {
                let applied = apply_event(
                    &event,
                    self.outbox.identity(),
                    &self.index,
                    &self.grid,
                    Instant::now(),
                    SystemTime::now(),
                );
                if applied.is_ok() {
                    metrics::counter!(SHARED_INDEX_EVENTS_TOTAL, DIRECTION_LABEL => "applied")
                        .increment(1);
                }
            }
            // Another writer or a newer format on the same key: not ours to apply.
            Err(error) => tracing::debug!(%error, "shared index: skipped an unreadable entry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_route_layer::grid::{ClusterSpec, GridSettings, GridSpec, SiteSpec};
    use grid_route_layer::index::IndexSettings;

    fn event() -> SharedEvent {
        SharedEvent {
            kind: EventKind::Confirmed,
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
        assert_eq!(SharedEvent::decode(&bytes), Ok(event.clone()));
        let dropped = SharedEvent {
            kind: EventKind::Dropped,
            deadline_unix_ms: 0,
            keys: vec![],
            ..event
        };
        assert_eq!(SharedEvent::decode(&dropped.encode()), Ok(dropped));
    }

    #[test]
    fn a_session_confirmation_carries_its_one_key_and_the_prompt_it_held() {
        let session = SharedEvent {
            kind: EventKind::SessionConfirmed,
            keys: vec![0x5e55_1011],
            held_bytes: 40 * 256,
            ..event()
        };
        let bytes = session.encode();
        assert_eq!(bytes[1], 3);
        assert_eq!(bytes.len(), HEADER_BYTES + 1 + 4 + 2 + 8 + 8);
        assert_eq!(bytes[bytes.len() - 8..], (40_u64 * 256).to_le_bytes());
        assert_eq!(SharedEvent::decode(&bytes), Ok(session.clone()));
        for cut in 0..bytes.len() {
            assert!(SharedEvent::decode(&bytes[..cut]).is_err(), "{cut}");
        }
        let two = SharedEvent {
            keys: vec![1, 2],
            ..session
        };
        assert_eq!(
            SharedEvent::decode(&two.encode()),
            Err(DecodeError::SessionKeys(2))
        );
    }

    #[test]
    fn the_encoding_is_the_documented_layout() {
        let bytes = event().encode();
        assert_eq!(bytes[0], EVENT_VERSION);
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
                SharedEvent::decode(&bytes[..cut]),
                Err(DecodeError::Length),
                "{cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(SharedEvent::decode(&longer), Err(DecodeError::Length));
        let mut version = bytes.clone();
        version[0] = 2;
        assert_eq!(SharedEvent::decode(&version), Err(DecodeError::Version(2)));
        let mut kind = bytes.clone();
        kind[1] = 9;
        assert_eq!(SharedEvent::decode(&kind), Err(DecodeError::Kind(9)));
        let mut site = bytes.clone();
        site[31] = b'E';
        assert_eq!(SharedEvent::decode(&site), Err(DecodeError::Site));
        let mut many = bytes;
        many[35..37].copy_from_slice(&600_u16.to_le_bytes());
        assert_eq!(
            SharedEvent::decode(&many),
            Err(DecodeError::TooManyKeys(600))
        );
    }

    #[test]
    fn redis_errors_are_logged_at_most_once_per_interval() {
        let log = ErrorLog::default();
        let start = Instant::now();
        assert_eq!(log.due(start), Some(0));
        assert_eq!(log.due(start + Duration::from_secs(1)), None);
        assert_eq!(log.due(start + ERROR_LOG_INTERVAL / 2), None);
        // The next line says how many errors went unlogged since the last one.
        assert_eq!(log.due(start + ERROR_LOG_INTERVAL), Some(2));
        assert_eq!(log.due(start + ERROR_LOG_INTERVAL), None);
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
        assert_eq!(apply_event(&event(), me, &index, &grid, now, wall), Ok(()));
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
        let session = SharedEvent {
            kind: EventKind::SessionConfirmed,
            keys: vec![0x5e55_1011],
            held_bytes: 40 * 256,
            ..event()
        };
        let wall =
            UNIX_EPOCH + Duration::from_millis(event().deadline_unix_ms) - Duration::from_secs(30);
        let now = Instant::now();
        assert_eq!(apply_event(&session, me, &index, &grid, now, wall), Ok(()));
        let key = grid_route_layer::keying::SessionKey::from_digest(0x5e55_1011);
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
            apply_event(&event(), me, &index, &grid, now, wall),
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
            apply_event(&event(), own, &index, &grid, now, wall),
            Err(Skipped::Own)
        );
        let me = Identity {
            replica: 7,
            fingerprint,
        };
        let late = wall + Duration::from_secs(2);
        assert_eq!(
            apply_event(&event(), me, &index, &grid, now, late),
            Err(Skipped::Expired)
        );
        let elsewhere = SharedEvent {
            site: SiteName::new("west").unwrap(),
            ..event()
        };
        assert_eq!(
            apply_event(&elsewhere, me, &index, &grid, now, wall),
            Err(Skipped::UnknownCluster)
        );
        assert_eq!(index.entries(&east), 0);
    }
}
