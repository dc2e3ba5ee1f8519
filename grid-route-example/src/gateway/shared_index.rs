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
//! [`EVENT_FIELD`] holding the event in the library's wire format
//! ([`grid_route_layer::index::wire`]: about `40 + 8 × keys` bytes, keyed hashes and
//! cluster digests only, so no prompt text, model name or tenant ever reaches Redis).
//!
//! # Rules
//!
//! - **Replicas key alike.** With `shared_index` set, the keying seed is derived from the
//!   tag key (`KeySeed::from_tag_key`), so replicas holding the same key file key a
//!   prompt alike; [`wire::apply`] takes only events under this replica's seed
//!   fingerprint, from other replicas, for clusters its grid has, before their deadline.
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
use std::time::{Duration, Instant, SystemTime};

use super::telemetry::{DIRECTION_LABEL, SHARED_INDEX_ERRORS_TOTAL, SHARED_INDEX_EVENTS_TOTAL};
use arc_swap::ArcSwapOption;
use grid_route_layer::grid::Grid;
use grid_route_layer::index::wire::{self, Identity, WireEvent, unix_ms};
use grid_route_layer::index::{IndexEvent, IndexObserver, PrefixIndex};
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::SharedIndexConfig;

/// The stream entry's one field, holding the encoded event.
pub const EVENT_FIELD: &str = "e";
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
        let wire = WireEvent::encode_observed(event, self.identity(), SystemTime::now());
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
    settings: SharedIndexConfig,
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
        settings: Option<&SharedIndexConfig>,
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
        match WireEvent::decode(bytes) {
            Ok(event) => {
                let applied = wire::apply(
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
}
