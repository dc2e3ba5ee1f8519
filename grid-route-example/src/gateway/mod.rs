//! The example gateway over real sockets: the grid-route layers in front of per-cluster
//! p2c balancers, an engine client, the queue poller, an admin listener, reloads and
//! graceful shutdown.
//!
//! [`Gateway::start`] runs one in this process (tests and the demo use it);
//! [`serve`] runs one from a config file until SIGTERM or ctrl-c, reloading it on SIGHUP
//! (`grid-route-example serve --config FILE.yaml`).
//!
//! ```no_run
//! use grid_route_example::config::GatewayConfig;
//! use grid_route_example::gateway::Gateway;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::from_yaml("
//! listen: 127.0.0.1:0
//! admin_listen: 127.0.0.1:0
//! sites:
//!   - name: east
//!     clusters:
//!       - { name: east-a, models: [demo-model], endpoints: [http://127.0.0.1:8001] }
//! ")?;
//! let gateway = Gateway::start(config).await?;
//! println!("serving on {}, admin on {}", gateway.addr(), gateway.admin_addr());
//! // ... later, with an edited config:
//! // gateway.reload(&new_config)?;
//! gateway.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What runs
//!
//! - **Front listener** (`listen`; `gateway/front.rs`, connections in
//!   `gateway/server.rs`): the request log (`gateway/access.rs`), the role's path gate
//!   (`forward_paths` for a consumer, `provider_allowed_paths` for a provider),
//!   `GET /v1/models` aggregated over admitted clusters, and every other forwarded request
//!   through the routing stack (`gateway/stack.rs`): keying → pinning → confirmation →
//!   affinity → retries → `Select` → the chosen cluster's p2c balancer over its endpoints
//!   (`gateway/upstream/`). Forwarded paths the layers do not key still go through it,
//!   routed by the model their body names. No cluster serves the model: 404
//!   `model_not_found`; every cluster that serves it drained: 503 with `Retry-After: 5`;
//!   the chosen cluster failed before answering: 502; no answer's head in time: 504. All
//!   OpenAI-style JSON (docs/operations.md lists every answer the gateway makes itself).
//! - **Admin listener** (`admin_listen`; `gateway/admin.rs`): `/metrics` and `/healthz`.
//! - **Queue poller** (`gateway/queue.rs`): each endpoint's `/metrics` every
//!   `queue.poll_interval_ms`, see [`queue_sample`].
//! - **Shared index** (`prefix_affinity.shared_index`; [`shared_index`]): a publisher of
//!   this replica's confirmations and drops and a follower of its peers', through a Redis
//!   Stream. A starting gateway replays the stream (up to
//!   [`shared_index::REPLAY_WAIT`]) before it serves.
//!
//! # Decisions the design leaves open
//!
//! - **Endpoint health.** A request that cannot *connect* marks its endpoint unhealthy
//!   until the poller next reads that endpoint's queue metric; other transport failures
//!   fail the one request (502) without judging the endpoint. Inside a cluster an
//!   unhealthy endpoint takes no request while a sibling is healthy; a cluster with no
//!   healthy endpoint is not admitted. A failed metrics read makes an endpoint unmeasured,
//!   never unhealthy. Outlier ejection (`outlier.*`, `gateway/outlier.rs`) and a 429's
//!   `Retry-After` keep an endpoint unhealthy for their time, whatever the poller reads.
//! - **Retries** (`retries.max_attempts`, `gateway/retry.rs`): only a failed connect, on
//!   another endpoint of the cluster and then the next admitted cluster; never once a
//!   byte of the request may have reached an engine.
//! - **TimeoutSettings.** Connecting times out after `timeouts.upstream_connect_ms`, the answer's
//!   head after `timeouts.upstream_first_byte_secs` (504), a gap between two chunks of
//!   the answer after `timeouts.upstream_idle_secs` (the client's stream is cut), a
//!   metrics read after [`POLL_TIMEOUT`]; requests have no overall timeout (an unstreamed
//!   completion answers only when generation ends). Engines get `host` set to their own
//!   authority and no hop-by-hop headers; everything else, bodies included, passes as
//!   sent.
//! - **The request log** measures latency to the answer's head (time to first byte for a
//!   stream) and logs at the head; its outcome is the affinity outcome, `pinned`, or `-`.
//! - **Metrics** go to one process-wide Prometheus recorder, installed by the first
//!   gateway; grid gauges are set at each scrape. `/healthz` is 200 while serving, even
//!   when no cluster admits (the gateway still answers, with 503s).
//!
//! # Reload
//!
//! [`Gateway::reload`] (SIGHUP under [`serve`]) validates the whole new configuration
//! first — grid, affinity settings, tag key file — and changes nothing if any of it is
//! refused (counted `grid_serving_config_reload_total{result="rejected"}`, logged with
//! the reason). Otherwise (`result="applied"`): the grid is reconfigured (clusters that
//! stay keep their queue samples, health and in-flight counts), the prefix index resized
//! to the new cluster list (clusters that left are dropped with their entries), the
//! affinity settings swapped, the tag keys replaced (ids signed with any key but the
//! current one and the `previous_tag_key_path` are refused from then on), and the
//! layers of the routing stack rebuilt for the next requests (with the new
//! `forward_paths`, `timeouts`, `retries` and `outlier` settings; a changed
//! `upstream_connect_ms` gets a new engine client and pool; endpoints that left lose their
//! outlier records; series of clusters that left leave `/metrics`). Each cluster's p2c
//! balancer is rebuilt only when its endpoints changed: a cluster whose endpoints stay
//! keeps its balancer, with the requests pending on each endpoint, and reads the new
//! timeouts from its next request on. With `shared_index` set, the keying seed is the
//! one derived from the tag key: a reload that brings another key re-derives it (prompts
//! key differently from then on, so the entries learned before stop matching and age out),
//! and a changed `shared_index` restarts sharing against the new Redis or prefix
//! (replaying in the background). Without `shared_index` the seed in force stays, so
//! turning sharing off keeps the index useful. Requests in flight finish on the stack they
//! started on. `listen` and `admin_listen` cannot change
//! without a restart: a reload that changes them applies the rest and logs a warning.
//!
//! # Shutdown
//!
//! [`Gateway::shutdown`] stops accepting connections, closes idle ones and those that
//! have not sent a whole request head at once (a half-open connection cannot hold the
//! drain), lets requests in flight (streams included) finish for up to
//! [`DRAIN_TIMEOUT`], then aborts what is left.
//!
//! # Connections
//!
//! Both ports speak HTTP/1.1 and HTTP/2 with prior knowledge (h2c), see
//! `gateway/server.rs`. A connection must complete its request head within
//! `timeouts.client_header_secs`; a request body that sends nothing for
//! `timeouts.client_body_idle_secs` gets 408. Dropping a
//! [`Gateway`] starts the same drain without waiting for it.

mod access;
mod admin;
mod front;
mod idle_body;
mod outlier;
mod queue;
mod retry;
mod serve;
mod server;
pub mod shared_index;
mod stack;
pub mod telemetry;
mod upstream;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use grid_route_layer::affinity::Affinity;
use grid_route_layer::grid::{ClusterId, Grid, GridView, SiteName};
use grid_route_layer::index::PrefixIndex;
use grid_route_layer::keying::{DEFAULT_SESSION_HEADERS, KeySeed};
use grid_route_layer::metrics::record_learned_prices;
use grid_route_layer::pin::PinKeys;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use access::{ACCESS_TARGET, REQUEST_ID, REQUEST_ID_MAX_BYTES, SENSITIVE_REQUEST_HEADERS};
pub use admin::METRICS_UPKEEP_INTERVAL;
pub use outlier::{HEAD_SAMPLES, MAX_EJECTION_FACTOR, MIN_HEAD_SAMPLES, STALL_FACTOR};
pub use queue::{
    MAX_METRICS_BYTES, MAX_PROPS_BYTES, POLL_TIMEOUT, SLOTS_REFRESH, known_queue_sample,
    queue_sample, total_slots,
};
pub use serve::serve;
pub use stack::RETRY_AFTER_SECS;
pub use telemetry::EJECTIONS_TOTAL;
pub use upstream::{CLUSTER_QUEUE_CAPACITY, CONNECT_TIMEOUT, POOL_IDLE_TIMEOUT};

use crate::config::{CheckedConfig, ConfigError, GatewayConfig};
use outlier::Outliers;
use server::serve_until;
use shared_index::SharedIndex;
use stack::{Routing, StackParts, routing_stack};
use telemetry::{CONFIG_RELOAD_TOTAL, RESULT_LABEL};
use upstream::{Balancers, EngineParts, EngineSettings, SharedEngineSettings};

/// How long [`Gateway::shutdown`] lets requests in flight finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A gateway running in this process. See the [module docs](self).
#[must_use = "dropping the handle shuts the gateway down"]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    live: Arc<Live>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<io::Result<()>>>,
}

/// What every part of a running gateway shares.
pub(crate) struct Live {
    grid: Grid,
    index: Arc<PrefixIndex>,
    affinity: Affinity,
    /// Random, or derived from the tag key while `shared_index` is set; replaced when a
    /// reload brings a different tag key (see [Reload](self#reload)).
    seed: ArcSwap<KeySeed>,
    shared_index: SharedIndex,
    tag_keys: PinKeys,
    /// The engine client and the timeouts the endpoints read for each request, swapped
    /// on reload (with a new client when `timeouts.upstream_connect_ms` changes).
    engine: SharedEngineSettings,
    /// Every cluster's p2c balancer, kept across reloads (see [Reload](self#reload)).
    balancers: Balancers,
    outliers: Arc<Outliers>,
    settings: ArcSwap<Settings>,
    routing: ArcSwap<Routing>,
    /// Serialises reloads.
    reloading: Mutex<()>,
    /// Clusters reloads removed (and no later reload added back): their series are left
    /// out of `/metrics`.
    removed: Mutex<Vec<ClusterId>>,
    /// Which queue gauge each endpoint was last found serving, for logging each change once.
    gauges: queue::FoundGauges,
    /// Unix seconds at start, the `created` of `/v1/models`.
    started_unix: u64,
}

/// The settings outside the grid and the layers, swapped whole on reload: the checked
/// config itself, and what is derived from it for each request.
pub(crate) struct Settings {
    /// As configured (its addresses may name port 0: compared on reload).
    config: CheckedConfig,
    /// `prefix_affinity.session_headers` and `x-session-id`: marked sensitive as a request
    /// arrives, so no log prints a session id.
    session_headers: Arc<[http::HeaderName]>,
}

impl Settings {
    fn of(checked: &CheckedConfig) -> Self {
        Self {
            config: checked.clone(),
            // The configured names, and the default one whatever the config says: clients
            // send it whether or not this gateway reads it.
            session_headers: checked
                .prefix_affinity
                .session_headers
                .iter()
                .cloned()
                .chain(DEFAULT_SESSION_HEADERS.map(http::HeaderName::from_static))
                .collect(),
        }
    }
}

impl Live {
    /// Clusters removed by reloads and not added back.
    fn removed_clusters(&self) -> Vec<ClusterId> {
        self.removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current `timeouts.client_header_secs`, read for each new connection.
    fn header_timeout(self: &Arc<Self>) -> impl Fn() -> Duration + Send + 'static {
        let live = Arc::clone(self);
        move || live.settings.load().config.timeouts.client_header
    }

    /// Starts sharing the index when `checked` asks for it. A replica that shares its
    /// index replays the last `ttl_secs` before it serves, so it is warm from its first
    /// request (bounded: an unreachable Redis delays start by `REPLAY_WAIT` at most, then
    /// routing starts on the local index).
    async fn start_sharing(&self, checked: &CheckedConfig, stopped: watch::Receiver<bool>) {
        // Other replicas write into a shared index: placement reads it differently.
        self.affinity
            .set_index_shared(checked.shared_index.is_some());
        let Some(mut warmed) = self
            .shared_index
            .configure(checked.shared_index.as_ref(), self.shared_peers(stopped))
        else {
            return;
        };
        let replayed =
            tokio::time::timeout(shared_index::REPLAY_WAIT, warmed.wait_for(|warm| *warm)).await;
        if !matches!(replayed, Ok(Ok(_))) {
            tracing::warn!("shared index: not replayed yet; serving on the local index");
        }
    }

    fn shared_peers(&self, stopped: watch::Receiver<bool>) -> shared_index::Peers {
        shared_index::Peers {
            index: Arc::clone(&self.index),
            grid: self.grid.clone(),
            stopped,
        }
    }

    fn routing_for(&self, checked: &CheckedConfig) -> Routing {
        routing(
            &self.grid,
            &self.affinity,
            &self.seed.load(),
            &self.tag_keys,
            &self.balancers,
            checked,
        )
    }

    /// The state `checked` asks for, built from nothing: what a gateway starts on. Every
    /// piece a reload can change is derived by the function [`Gateway::reload`] uses too
    /// ([`Settings::of`], [`EngineSettings::of`], [`routing`], [`seed_for`]).
    fn new(checked: &CheckedConfig) -> Result<Self, ConfigError> {
        let grid = Grid::new(&checked.grid_spec, checked.grid_settings.clone())
            .map_err(ConfigError::Grid)?;
        let shared_index = SharedIndex::new();
        let index = Arc::new(
            PrefixIndex::new(checked.prefix_affinity.index, grid.view().cluster_ids())
                .with_observer(shared_index.observer()),
        );
        let affinity = Affinity::new(Arc::clone(&index), checked.prefix_affinity.affinity);
        let seed = seed_for(checked, None).unwrap_or_else(KeySeed::random);
        shared_index.set_fingerprint(seed.fingerprint());
        let tag_keys = PinKeys::new(checked.tag_keys());
        let engine = Arc::new(ArcSwap::from_pointee(EngineSettings::of(checked, None)));
        let outliers = Arc::new(Outliers::new(checked.outlier));
        let balancers = upstream::balancers(EngineParts {
            settings: Arc::clone(&engine),
            grid: grid.clone(),
            outliers: Arc::clone(&outliers),
        });
        let routing = routing(&grid, &affinity, &seed, &tag_keys, &balancers, checked);
        Ok(Self {
            grid,
            index,
            affinity,
            seed: ArcSwap::from_pointee(seed),
            shared_index,
            tag_keys,
            engine,
            balancers,
            outliers,
            settings: ArcSwap::from_pointee(Settings::of(checked)),
            routing: ArcSwap::from_pointee(routing),
            reloading: Mutex::new(()),
            removed: Mutex::new(Vec::new()),
            gauges: queue::FoundGauges::default(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        })
    }
}

/// The routing stack over the gateway's shared parts, as `checked` configures it.
fn routing(
    grid: &Grid,
    affinity: &Affinity,
    seed: &KeySeed,
    tag_keys: &PinKeys,
    balancers: &Balancers,
    checked: &CheckedConfig,
) -> Routing {
    routing_stack(&StackParts {
        grid,
        affinity,
        seed,
        tag_keys,
        max_body_bytes: checked.max_body_bytes,
        session_headers: &checked.prefix_affinity.session_headers,
        balancers,
        max_attempts: checked.max_attempts,
    })
}

impl Gateway {
    /// Validates `config`, binds both listeners and starts serving, polling and
    /// answering the admin port, each on its own task.
    ///
    /// Installs the process's Prometheus recorder if no gateway did yet.
    pub async fn start(config: GatewayConfig) -> Result<Self, GatewayError> {
        let checked = config.validate()?;
        admin::prometheus();
        let live = Live::new(&checked)?;
        let front_listener = bind("listen", checked.listen).await?;
        let admin_listener = bind("admin_listen", checked.admin_listen).await?;
        let addr = front_listener.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;
        let live = Arc::new(live);
        let (stop, stopped) = watch::channel(false);
        live.start_sharing(&checked, stopped.clone()).await;
        let tasks = vec![
            tokio::spawn(serve_until(
                front_listener,
                front::router(Arc::clone(&live)),
                live.header_timeout(),
                stopped.clone(),
            )),
            tokio::spawn(serve_until(
                admin_listener,
                admin::router(Arc::clone(&live)),
                live.header_timeout(),
                stopped.clone(),
            )),
            tokio::spawn({
                let live = Arc::clone(&live);
                async move {
                    queue::poll_queues(live, stopped).await;
                    Ok(())
                }
            }),
        ];
        let view = live.grid.view();
        warn_if_the_local_site_is_empty(&view);
        tracing::info!(
            %addr,
            %admin_addr,
            clusters = view.clusters().len(),
            local_site = view.local_site().map(SiteName::as_str),
            "gateway started"
        );
        Ok(Self {
            addr,
            admin_addr,
            live,
            stop,
            tasks,
        })
    }

    /// The address the front listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the admin listener is bound to.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// `http://IP:PORT` of the front listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://IP:PORT` of the admin listener.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// The live grid: its clusters, their queue depths and health.
    pub fn grid(&self) -> &Grid {
        &self.live.grid
    }

    /// The prefix index: which cluster holds which prompt blocks (counts only).
    pub fn index(&self) -> &Arc<PrefixIndex> {
        &self.live.index
    }

    /// Affinity: its settings in force and the prefill speeds it learned.
    pub fn affinity(&self) -> &Affinity {
        &self.live.affinity
    }

    /// The tag keys the pin layer signs and checks ids with, rotated on reload.
    pub fn tag_keys(&self) -> &PinKeys {
        &self.live.tag_keys
    }

    /// Applies a new configuration, or refuses it whole and keeps the old one. See
    /// [Reload](self#reload).
    pub fn reload(&self, config: &GatewayConfig) -> Result<(), ConfigError> {
        let _reloading = self
            .live
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let checked = match config.validate() {
            Ok(checked) => checked,
            Err(error) => return Err(rejected(error)),
        };
        self.apply(&checked).map_err(rejected)?;
        metrics::counter!(CONFIG_RELOAD_TOTAL, RESULT_LABEL => "applied").increment(1);
        Ok(())
    }

    /// Reads the file at `path` and [reloads](Self::reload) it; an unreadable or
    /// malformed file is refused like an invalid one.
    pub fn reload_file(&self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        match GatewayConfig::from_file(path.as_ref()) {
            Ok(config) => self.reload(&config),
            Err(error) => Err(rejected(error)),
        }
    }

    fn apply(&self, checked: &CheckedConfig) -> Result<(), ConfigError> {
        let live = &self.live;
        let before: Vec<ClusterId> = live.grid.view().cluster_ids().collect();
        live.grid
            .reconfigure(&checked.grid_spec, checked.grid_settings.clone())
            .map_err(ConfigError::Grid)?;
        let view = live.grid.view();
        live.index
            .reconfigure(checked.prefix_affinity.index, view.cluster_ids());
        live.affinity.set_settings(checked.prefix_affinity.affinity);
        live.tag_keys.set(checked.tag_keys());
        live.outliers.reconfigure(checked.outlier, &view);
        if let Some(seed) = seed_for(checked, Some(&live.seed.load())) {
            live.shared_index.set_fingerprint(seed.fingerprint());
            live.seed.store(Arc::new(seed));
            tracing::info!(
                "keying seed derived from the tag key; prompts key differently from now on"
            );
        }
        // A changed URL or prefix restarts sharing; it replays in the background.
        let _ = live.shared_index.configure(
            checked.shared_index.as_ref(),
            live.shared_peers(self.stop.subscribe()),
        );
        live.affinity
            .set_index_shared(checked.shared_index.is_some());
        let old = live.settings.swap(Arc::new(Settings::of(checked)));
        let engine = EngineSettings::of(checked, Some(&live.engine.load()));
        live.engine.store(Arc::new(engine));
        live.routing.store(Arc::new(live.routing_for(checked)));
        for (field, was, now) in [
            ("listen", old.config.listen, checked.listen),
            (
                "admin_listen",
                old.config.admin_listen,
                checked.admin_listen,
            ),
        ] {
            if was != now {
                tracing::warn!(
                    field,
                    running = %was,
                    configured = %now,
                    "listen addresses cannot change on reload; restart to move it"
                );
            }
        }
        warn_if_the_local_site_is_empty(&view);
        let after: Vec<ClusterId> = view.cluster_ids().collect();
        let gone: Vec<ClusterId> = before
            .iter()
            .filter(|id| !after.contains(id))
            .cloned()
            .collect();
        let added: Vec<String> = after
            .iter()
            .filter(|id| !before.contains(id))
            .map(ToString::to_string)
            .collect();
        tracing::info!(
            generation = view.generation(),
            clusters = after.len(),
            ?added,
            removed = ?gone.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "config reload applied"
        );
        // What was learned about a cluster goes with it, like its index entries: one added
        // again starts from the priors and from nothing placed, and its price gauges say
        // so at once (a scrape leaves out a removed cluster's series, not a returning
        // one's stale values). The queue poller forgets the gauges its removed endpoints
        // served. Prices and placements follow the index, reconfigured above.
        live.affinity.forget_removed_clusters();
        let mut removed = live.removed.lock().unwrap_or_else(PoisonError::into_inner);
        let returning: Vec<&ClusterId> = after.iter().filter(|id| removed.contains(id)).collect();
        for id in returning {
            record_learned_prices(id, live.affinity.learned_prices(id));
        }
        removed.retain(|id| !after.contains(id));
        removed.extend(gone);
        Ok(())
    }

    /// Stops accepting connections and waits up to [`DRAIN_TIMEOUT`] for requests in
    /// flight to finish.
    pub async fn shutdown(self) -> Result<(), GatewayError> {
        self.shutdown_within(DRAIN_TIMEOUT).await
    }

    /// Stops accepting connections and waits up to `drain` for requests in flight to
    /// finish; what is left then is aborted and the result is
    /// [`GatewayError::DrainTimedOut`].
    pub async fn shutdown_within(mut self, drain: Duration) -> Result<(), GatewayError> {
        self.stop.send_replace(true);
        let tasks = std::mem::take(&mut self.tasks);
        let aborts: Vec<_> = tasks.iter().map(JoinHandle::abort_handle).collect();
        let joined = tokio::time::timeout(drain, async {
            let mut first_error = None;
            for task in tasks {
                let result = match task.await {
                    Ok(result) => result,
                    Err(error) => Err(io::Error::other(error)),
                };
                if let Err(error) = result {
                    first_error.get_or_insert(error);
                }
            }
            first_error
        })
        .await;
        match joined {
            Ok(None) => {
                tracing::info!("gateway stopped");
                Ok(())
            }
            Ok(Some(error)) => Err(GatewayError::Io(error)),
            Err(_) => {
                for abort in aborts {
                    abort.abort();
                }
                tracing::warn!(?drain, "requests still in flight after the drain; aborted");
                Err(GatewayError::DrainTimedOut(drain))
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway")
            .field("addr", &self.addr)
            .field("admin_addr", &self.admin_addr)
            .field("grid", &self.live.grid)
            .finish_non_exhaustive()
    }
}

/// A local site with no cluster is allowed (its engines were taken out); say what it means.
fn warn_if_the_local_site_is_empty(view: &GridView) {
    if let Some(local) = view.local_site()
        && !view.clusters().iter().any(|c| c.site() == local)
    {
        tracing::warn!(
            local_site = %local,
            "the local site has no cluster: new conversations go to the least loaded \
             admitted cluster of another site, and ids stored on clusters that left answer 404"
        );
    }
}

/// The seed `checked` calls for when it differs from `current`: with `shared_index` set,
/// the one derived from the tag key (validation guarantees a tag key then). Without
/// `shared_index` the seed in force stays (a fresh random one only at start), so turning
/// sharing off does not make the index stale.
fn seed_for(checked: &CheckedConfig, current: Option<&KeySeed>) -> Option<KeySeed> {
    checked.shared_index.as_ref()?;
    let derived = KeySeed::from_tag_key(checked.tag_key.as_ref()?);
    match current {
        Some(current) if current.fingerprint() == derived.fingerprint() => None,
        _ => Some(derived),
    }
}

/// Counts and logs a refused reload.
fn rejected(error: ConfigError) -> ConfigError {
    metrics::counter!(CONFIG_RELOAD_TOTAL, RESULT_LABEL => "rejected").increment(1);
    tracing::warn!(%error, "config reload rejected; the running config stays");
    error
}

async fn bind(field: &'static str, addr: SocketAddr) -> Result<TcpListener, GatewayError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Bind {
            field,
            addr,
            source,
        })
}

/// Why a gateway could not start, serve or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration was refused.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot bind {field} {addr}: {source}")]
    Bind {
        /// `listen` or `admin_listen`.
        field: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why binding failed.
        source: io::Error,
    },
    /// Requests were still in flight when the drain timed out.
    #[error("requests still in flight after draining for {0:?}")]
    DrainTimedOut(Duration),
    /// Serving or installing signal handlers failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The config file named on the command line could not be used.
    #[error("{}: {source}", path.display())]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: ConfigError,
    },
}
