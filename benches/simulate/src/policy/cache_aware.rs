//! `cache-aware`: the SGLang model gateway's `cache_aware` policy
//! (sgl-project/sglang, `sgl-router/src/policies/cache_aware.rs`), at trace-block
//! granularity.
//!
//! Modelled:
//! - an approximate radix tree per replica, shared by every engine ("tenant"): a request's
//!   text is inserted under the engine it was sent to, with a last-access time; the match
//!   is the deepest prefix any tenant holds, and its tenant the most recently used holder
//!   of the deepest block;
//! - the load of an engine is the requests this replica sent it that have not finished;
//!   the system is imbalanced when `max - min > balance_abs_threshold` and
//!   `max > min * balance_rel_threshold`, and then the least loaded engine takes the
//!   request (its text still goes into the tree);
//! - otherwise a match rate (matched / prompt) above `cache_threshold` goes to the
//!   matched tenant, else to the tenant whose tree holds the fewest characters;
//! - every `eviction_interval_secs` each tenant over `max_tree_size` characters loses its
//!   least recently used nodes, deepest first on ties (leaves go before their parents).
//!
//! Left out: the tree is of trace blocks (2 KiB of text each, 4 characters a token), not
//! characters, so matches end at block boundaries; health checks, circuit breakers and
//! retries (no engine fails here); per-model trees (one model).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use super::{Route, Router, Setup};
use crate::trace::TraceRequest;

/// Characters of request text per token, for tree sizes (the library's
/// `BYTES_PER_TOKEN`).
const CHARS_PER_TOKEN: u64 = grid_route_layer::affinity::BYTES_PER_TOKEN as u64;

/// The policy's parameters, defaulting to the router's command-line defaults
/// (`sgl-router/py_src/sglang_router/router_args.py`, `RouterArgs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAwareSettings {
    /// Match rate above which the matched tenant takes the request.
    pub cache_threshold: f64,
    /// Absolute load gap for imbalance.
    pub balance_abs_threshold: usize,
    /// Relative load ratio for imbalance.
    pub balance_rel_threshold: f64,
    /// Seconds between tree evictions.
    pub eviction_interval_s: f64,
    /// Characters a tenant's tree may hold after an eviction.
    pub max_tree_chars: u64,
}

impl Default for CacheAwareSettings {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_s: 120.0,
            max_tree_chars: 67_108_864,
        }
    }
}

#[derive(Clone, Copy)]
struct Holder {
    engine: usize,
    last_access: f64,
    depth: usize,
    chars: u64,
}

/// One replica's approximate tree: who holds each block, and each tenant's size.
struct Tree {
    holders: HashMap<u64, Vec<Holder>>,
    chars: Vec<u64>,
}

impl Tree {
    fn new(engines: usize) -> Self {
        Self {
            holders: HashMap::new(),
            chars: vec![0; engines],
        }
    }

    /// Tokens of the deepest prefix any tenant holds, and that tenant.
    fn prefix_match(&self, request: &TraceRequest) -> (u64, Option<usize>) {
        let mut matched = (0, None);
        for (i, block) in request.blocks.iter().enumerate() {
            let Some(holders) = self.holders.get(block).filter(|h| !h.is_empty()) else {
                break;
            };
            let recent = holders
                .iter()
                .max_by(|a, b| a.last_access.total_cmp(&b.last_access))
                .map(|h| h.engine);
            matched = (request.prefix_tokens(i + 1), recent);
        }
        matched
    }

    fn insert(&mut self, request: &TraceRequest, engine: usize, now: f64) {
        for (depth, &block) in request.blocks.iter().enumerate() {
            let holders = self.holders.entry(block).or_default();
            if let Some(held) = holders.iter_mut().find(|h| h.engine == engine) {
                held.last_access = now;
            } else {
                let chars = request.block_tokens(depth) * CHARS_PER_TOKEN;
                holders.push(Holder {
                    engine,
                    last_access: now,
                    depth,
                    chars,
                });
                self.chars[engine] += chars;
            }
        }
    }

    /// The tenant holding the fewest characters (the first on ties).
    fn smallest_tenant(&self) -> usize {
        let mut best = 0;
        for (engine, &chars) in self.chars.iter().enumerate() {
            if chars < self.chars[best] {
                best = engine;
            }
        }
        best
    }

    /// Shrinks every tenant over `max_chars`, least recently used blocks first.
    fn evict(&mut self, max_chars: u64) {
        let over: Vec<bool> = self.chars.iter().map(|&c| c > max_chars).collect();
        if !over.contains(&true) {
            return;
        }
        // (last access, deeper first, block id): a total order, so the map's iteration
        // order cannot change the result.
        let mut candidates: Vec<(f64, Reverse<usize>, u64, usize)> = Vec::new();
        for (&block, holders) in &self.holders {
            for h in holders.iter().filter(|h| over[h.engine]) {
                candidates.push((h.last_access, Reverse(h.depth), block, h.engine));
            }
        }
        candidates.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.3.cmp(&b.3))
        });
        for (_, _, block, engine) in candidates {
            if self.chars[engine] <= max_chars {
                continue;
            }
            if let Some(holders) = self.holders.get_mut(&block) {
                if let Some(at) = holders.iter().position(|h| h.engine == engine) {
                    self.chars[engine] -= holders.swap_remove(at).chars;
                }
                if holders.is_empty() {
                    self.holders.remove(&block);
                }
            }
        }
    }
}

pub(super) struct CacheAware {
    settings: CacheAwareSettings,
    trees: Vec<Tree>,
    /// Per replica, per engine: requests sent and not finished.
    loads: Vec<Vec<usize>>,
    open: HashMap<usize, (usize, usize)>,
    next_eviction: f64,
    outcomes: BTreeMap<&'static str, u64>,
}

impl CacheAware {
    pub(super) fn new(setup: &Setup, settings: CacheAwareSettings) -> Self {
        Self {
            settings,
            trees: (0..setup.replicas)
                .map(|_| Tree::new(setup.engines()))
                .collect(),
            loads: vec![vec![0; setup.engines()]; setup.replicas],
            open: HashMap::new(),
            next_eviction: settings.eviction_interval_s,
            outcomes: ["cache_hit", "cache_miss", "load_balance"]
                .into_iter()
                .map(|o| (o, 0))
                .collect(),
        }
    }

    fn choose(&self, replica: usize, request: &TraceRequest) -> (usize, &'static str) {
        let loads = &self.loads[replica];
        let max = loads.iter().copied().max().unwrap_or(0);
        let min = loads.iter().copied().min().unwrap_or(0);
        let imbalanced = max.saturating_sub(min) > self.settings.balance_abs_threshold
            && max as f64 > min as f64 * self.settings.balance_rel_threshold;
        if imbalanced {
            let least = loads.iter().position(|&l| l == min).unwrap_or(0);
            return (least, "load_balance");
        }
        let tree = &self.trees[replica];
        let (matched, tenant) = tree.prefix_match(request);
        let rate = matched as f64 / request.input_tokens as f64;
        match tenant {
            Some(engine) if rate > self.settings.cache_threshold => (engine, "cache_hit"),
            _ => (tree.smallest_tenant(), "cache_miss"),
        }
    }
}

impl Router for CacheAware {
    fn route(&mut self, route: &Route<'_>) -> usize {
        while route.now >= self.next_eviction {
            for tree in &mut self.trees {
                tree.evict(self.settings.max_tree_chars);
            }
            self.next_eviction += self.settings.eviction_interval_s;
        }
        let (engine, outcome) = self.choose(route.replica, route.request);
        *self.outcomes.entry(outcome).or_default() += 1;
        self.trees[route.replica].insert(route.request, engine, route.now);
        self.loads[route.replica][engine] += 1;
        self.open.insert(route.id, (route.replica, engine));
        engine
    }

    fn finished(&mut self, id: usize, _now: f64) {
        if let Some((replica, engine)) = self.open.remove(&id) {
            self.loads[replica][engine] -= 1;
        }
    }

    fn outcomes(&self) -> BTreeMap<&'static str, u64> {
        self.outcomes.clone()
    }
}
