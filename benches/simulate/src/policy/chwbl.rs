//! `chwbl`: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
//! "Consistent Hashing with Bounded Loads", SODA 2018) on the prompt's first blocks, as
//! KubeAI's `PrefixHash` strategy (substratusai/kubeai) and the SGLang model gateway's
//! `prefix_hash` policy (`--prefix-token-count` 256, `--prefix-hash-load-factor` 1.25) do.
//!
//! Each engine owns [`VIRTUAL_NODES`] points on a hash ring. A request hashes its first
//! [`CHWBL_PREFIX_BLOCKS`] block ids onto the ring and walks clockwise to the first engine
//! whose load (requests this replica sent it that have not finished) is under the bound
//! `ceil(CHWBL_LOAD_FACTOR * (total + 1) / engines)`.
//!
//! Those routers hash the first characters or tokens of the prompt (the SGLang gateway
//! 256 tokens); in the bundled trace every prompt's first 512-token block is the same
//! (id 0), so that would send the whole trace to one ring point and leave only the load
//! bound to spread it. Two blocks (1024 tokens) tell the conversations apart.

use std::collections::{BTreeMap, HashMap};

use super::{Route, Router, Setup};
use crate::trace::mix64;

/// How far above the mean load an engine may go: the SGLang gateway's default.
pub const CHWBL_LOAD_FACTOR: f64 = 1.25;

/// Prompt blocks (512 tokens each) hashed onto the ring.
pub const CHWBL_PREFIX_BLOCKS: usize = 2;

/// Ring points per engine.
const VIRTUAL_NODES: u64 = 128;

pub(super) struct Chwbl {
    /// (point, engine), sorted by point.
    ring: Vec<(u64, usize)>,
    /// Per replica, per engine: requests sent and not finished.
    loads: Vec<Vec<usize>>,
    open: HashMap<usize, (usize, usize)>,
    outcomes: BTreeMap<&'static str, u64>,
}

impl Chwbl {
    pub(super) fn new(setup: &Setup) -> Self {
        let mut ring: Vec<(u64, usize)> = (0..setup.engines())
            .flat_map(|engine| {
                (0..VIRTUAL_NODES).map(move |v| (mix64(mix64(engine as u64) ^ v), engine))
            })
            .collect();
        ring.sort_unstable();
        Self {
            ring,
            loads: vec![vec![0; setup.engines()]; setup.replicas],
            open: HashMap::new(),
            outcomes: [("home", 0), ("overflow", 0)].into_iter().collect(),
        }
    }
}

impl Router for Chwbl {
    fn route(&mut self, route: &Route<'_>) -> usize {
        let key = route
            .request
            .blocks
            .iter()
            .take(CHWBL_PREFIX_BLOCKS)
            .fold(0x6368_7762_6c00_0000_u64, |h, &id| mix64(h ^ id));
        let loads = &mut self.loads[route.replica];
        let total: usize = loads.iter().sum();
        let bound = (CHWBL_LOAD_FACTOR * (total + 1) as f64 / loads.len() as f64).ceil() as usize;
        let start = self.ring.partition_point(|&(point, _)| point < key);
        // The bound is at least the mean load plus one, so some engine is under it and
        // the walk ends within one turn of the ring.
        let (step, engine) = (0..self.ring.len())
            .map(|step| (step, self.ring[(start + step) % self.ring.len()].1))
            .find(|&(_, engine)| loads[engine] < bound)
            .unwrap_or((0, self.ring[start % self.ring.len()].1));
        let home = self.ring[start % self.ring.len()].1;
        let outcome = if step == 0 || engine == home {
            "home"
        } else {
            "overflow"
        };
        *self.outcomes.entry(outcome).or_default() += 1;
        loads[engine] += 1;
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
