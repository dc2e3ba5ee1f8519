//! The routing policies compared, each behind [`Router`].
//!
//! Engines are numbered site by site: engine `s * engines_per_site + j` is engine `j` of
//! site `s`. `grid-route` and `least-queue` see sites as clusters and engines as their
//! endpoints, as the gateway does; the others see a flat list of engines, as a router
//! without sites does. Each gateway replica keeps its own state (counters, trees, loads,
//! indexes); `--shared-index` shares grid-route's prefix index between them.

mod cache_aware;
mod chwbl;
mod gateway;
mod grid_route;
mod least_queue;
mod oracle;
mod round_robin;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use grid_route_layer::affinity::AffinitySettings;
use grid_route_layer::index::IndexSettings;
use grid_route_layer::keying::{PrefixKeys, SessionKey};

use super::engine::Engine;
use super::trace::TraceRequest;

pub use cache_aware::CacheAwareSettings;
pub use chwbl::{CHWBL_LOAD_FACTOR, CHWBL_PREFIX_BLOCKS};

/// A policy by name. The command line's names are [`Policy::name`]'s (a test checks that
/// they agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// The gateway's prefix affinity, through the library's own decision code.
    GridRoute,
    /// Each replica turns through the engines.
    RoundRobin,
    /// The gateway's `Select` without affinity: least windowed queue, then in flight.
    LeastQueue,
    /// SGLang model gateway's `cache_aware` policy.
    CacheAware,
    /// Consistent hashing with bounded loads on the prompt's first blocks.
    Chwbl,
    /// Knows every engine's cache and queue; least predicted time to first token.
    Oracle,
}

impl Policy {
    /// Every policy, in the default order.
    pub const ALL: [Policy; 6] = [
        Policy::GridRoute,
        Policy::RoundRobin,
        Policy::LeastQueue,
        Policy::CacheAware,
        Policy::Chwbl,
        Policy::Oracle,
    ];

    /// The name on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Policy::GridRoute => "grid-route",
            Policy::RoundRobin => "round-robin",
            Policy::LeastQueue => "least-queue",
            Policy::CacheAware => "cache-aware",
            Policy::Chwbl => "chwbl",
            Policy::Oracle => "oracle",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What every policy is built from.
#[derive(Debug, Clone)]
// Each bool is one command-line switch, independent of the others: no state machine.
#[allow(clippy::struct_excessive_bools)]
pub struct Setup {
    /// Sites.
    pub sites: usize,
    /// Engines at each site.
    pub engines_per_site: usize,
    /// Gateway replicas.
    pub replicas: usize,
    /// Whether grid-route's replicas share one prefix index.
    pub shared_index: bool,
    /// The affinity settings grid-route runs with.
    pub affinity: AffinitySettings,
    /// The prefix index settings grid-route runs with.
    pub index: IndexSettings,
    /// The queue window of the gateway's load signal.
    pub queue_window: std::time::Duration,
    /// Whether a cluster's load counts this replica's requests in flight
    /// (`queue.count_in_flight`).
    pub count_in_flight: bool,
    /// Whether a request in flight counts whole until its answer ends, its first token
    /// not told to its cluster's load (`--streams-count-whole`).
    pub streams_count_whole: bool,
    /// Whether the queue poll leaves slot engines' slots unknown (`--slots-unknown`).
    pub slots_unknown: bool,
    /// The seed of every random draw.
    pub seed: u64,
    /// Virtual time zero.
    pub base: Instant,
}

impl Setup {
    /// Every engine.
    pub fn engines(&self) -> usize {
        self.sites * self.engines_per_site
    }
}

/// One routing decision's input.
pub struct Route<'a> {
    /// The gateway replica the request reached.
    pub replica: usize,
    /// The request's position in the trace.
    pub id: usize,
    /// The request.
    pub request: &'a TraceRequest,
    /// Its prefix keys, as the gateway would compute them.
    pub keys: Option<&'a PrefixKeys>,
    /// Its session, when the run gives requests one (`--sessions`).
    pub session: Option<SessionKey>,
    /// Its thread (`Prompt::thread`), unless the run gives none (`--no-threads`).
    pub thread: Option<SessionKey>,
    /// Virtual time, seconds.
    pub now: f64,
    /// Every engine, as it is now (only the oracle looks).
    pub engines: &'a [Engine],
    /// The whole trace (the oracle prices a slot engine's waiting requests from it).
    pub trace: &'a [TraceRequest],
}

/// A routing policy driven in virtual time.
pub trait Router {
    /// The engine for a request.
    fn route(&mut self, route: &Route<'_>) -> usize;

    /// The request's answer head came back with `status`: 200 at its first token, or 503
    /// at once when the engine refused it (`--fail-share`).
    fn head(&mut self, _id: usize, _status: u16, _now: f64) {}

    /// The request's answer ended (its last token, or right after a refusal).
    fn finished(&mut self, _id: usize, _now: f64) {}

    /// The request's answer ended with a usage saying the engine served `cached_tokens` of
    /// its prompt from cache (called just before [`finished`](Self::finished), not for a
    /// refusal).
    fn ended(&mut self, _id: usize, _cached_tokens: u64, _now: f64) {}

    /// A poll of every engine's waiting queue at `now` (the gateway's queue signal).
    fn poll(&mut self, _now: f64, _engines: &[Engine]) {}

    /// How many decisions ended each way, by outcome name.
    fn outcomes(&self) -> BTreeMap<&'static str, u64> {
        BTreeMap::new()
    }
}

/// Builds `policy` for `setup`.
pub fn router(policy: Policy, setup: &Setup) -> Box<dyn Router> {
    match policy {
        Policy::GridRoute => Box::new(grid_route::GridRoute::new(setup)),
        Policy::RoundRobin => Box::new(round_robin::RoundRobin::new(setup)),
        Policy::LeastQueue => Box::new(least_queue::LeastQueue::new(setup)),
        Policy::CacheAware => Box::new(cache_aware::CacheAware::new(
            setup,
            CacheAwareSettings::default(),
        )),
        Policy::Chwbl => Box::new(chwbl::Chwbl::new(setup)),
        Policy::Oracle => Box::new(oracle::Oracle::new(setup)),
    }
}

/// Virtual seconds as an `Instant` for the library's cores.
fn instant(base: Instant, now: f64) -> Instant {
    base + std::time::Duration::from_secs_f64(now)
}
