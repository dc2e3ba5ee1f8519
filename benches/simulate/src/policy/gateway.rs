//! The gateway's side of routing shared by `grid-route` and `least-queue`: one
//! [`Grid`] per replica (sites are clusters, engines their endpoints) fed by the queue
//! poll, the library's [`least_loaded`] choice among candidate clusters, and p2c over the
//! chosen cluster's endpoints (what the example gateway's `tower::balance` does).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use grid_route_layer::grid::{
    Cluster, ClusterId, ClusterSpec, Grid, GridSettings, GridSpec, InFlight, SiteSpec,
};
use grid_route_layer::route::Placed;
use grid_route_layer::select::{count_in_flight, least_loaded};

use super::{Setup, instant};
use crate::engine::Engine;

/// The model every simulated engine serves.
pub(super) const MODEL: &str = "m";

/// A request between dispatch and the end of its answer.
struct Open {
    replica: usize,
    engine: usize,
    cluster: ClusterId,
    /// Whether its answer's head came back (p2c stops counting it then).
    headed: bool,
    /// Counts in the cluster's in-flight load until the answer ends, as a stream from its
    /// first token, as `Select`'s `InFlightBody` does.
    in_flight: InFlight,
}

struct Replica {
    grid: Grid,
    /// `Select`'s rotation through tied clusters.
    turn: usize,
    /// Requests this replica sent to each engine without an answer head yet (p2c's load).
    pending: Vec<usize>,
}

/// Every replica's gateway state.
pub(super) struct Gateways {
    replicas: Vec<Replica>,
    engines_per_site: usize,
    /// `--streams-count-whole`: an answer's first token is not told to its cluster's load.
    streams_count_whole: bool,
    /// Whether the poll tells each cluster its engines' slots, as the gateway reads them
    /// from llama.cpp's `/props` (`--slots-unknown` turns it off).
    slots_known: bool,
    site_of: HashMap<ClusterId, usize>,
    open: HashMap<usize, Open>,
    rng: fastrand::Rng,
    base: Instant,
}

impl Gateways {
    pub(super) fn new(setup: &Setup) -> Self {
        let spec = grid_spec(setup.sites, setup.engines_per_site);
        let settings = GridSettings::default()
            .with_queue_window(setup.queue_window)
            .with_count_in_flight(setup.count_in_flight);
        let replicas: Vec<Replica> = (0..setup.replicas)
            .map(|_| Replica {
                // The spec is built valid (DNS-label names, one cluster a site, endpoints
                // present), so this cannot fail.
                grid: Grid::new(&spec, settings.clone()).expect("a generated grid is valid"),
                turn: 0,
                pending: vec![0; setup.engines()],
            })
            .collect();
        let site_of = replicas[0]
            .grid
            .view()
            .cluster_ids()
            .enumerate()
            .map(|(site, id)| (id, site))
            .collect();
        Self {
            replicas,
            engines_per_site: setup.engines_per_site,
            streams_count_whole: setup.streams_count_whole,
            slots_known: !setup.slots_unknown,
            site_of,
            open: HashMap::new(),
            rng: fastrand::Rng::with_seed(setup.seed ^ 0x6761_7465_7761_7973),
            base: setup.base,
        }
    }

    /// The clusters of one replica's grid.
    pub(super) fn grid(&self, replica: usize) -> &Grid {
        &self.replicas[replica].grid
    }

    /// Sends request `id` to the least loaded of `clusters` (as `Select` does), then to an
    /// engine of that cluster by p2c on this replica's pending requests. Returns the engine
    /// and the cluster's routing load before the request counted in it (`Served::load`).
    /// `prefill` is the prompt bytes it counts as waiting to be prefilled until its first
    /// token ([`prefill_bytes`](grid_route_layer::select::prefill_bytes); 0 for a policy
    /// that reads no keys).
    pub(super) fn dispatch(
        &mut self,
        replica: usize,
        clusters: &[Arc<Cluster>],
        id: usize,
        now: f64,
        prefill: u64,
        placed: Option<&Placed>,
    ) -> (usize, f64) {
        let at = instant(self.base, now);
        let state = &mut self.replicas[replica];
        let turn = state.turn;
        state.turn = state.turn.wrapping_add(1);
        // Candidates are never empty: every site admits and serves the one model.
        let cluster = least_loaded(clusters, at, turn).expect("a candidate cluster");
        let site = self.site_of[cluster.id()];
        let first = site * self.engines_per_site;
        let engine = if self.engines_per_site == 1 {
            first
        } else {
            let a = self.rng.usize(..self.engines_per_site);
            let mut b = self.rng.usize(..self.engines_per_site - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (first + a, first + b);
            if state.pending[b] < state.pending[a] {
                b
            } else {
                a
            }
        };
        state.pending[engine] += 1;
        // As `Select`: a request affinity placed on a free slot counts in flight already.
        let (load, in_flight) = count_in_flight(cluster, placed, prefill, at);
        self.open.insert(
            id,
            Open {
                replica,
                engine,
                cluster: cluster.id().clone(),
                headed: false,
                in_flight,
            },
        );
        (engine, load)
    }

    /// Request `id`'s answer head came back: it stops counting for p2c (the example
    /// gateway's `PendingRequests` counts to the head) but still counts in its cluster's
    /// in-flight load, as a stream. Returns the replica and the cluster that served it, for
    /// confirmation.
    pub(super) fn head(&mut self, id: usize) -> Option<(usize, ClusterId)> {
        let open = self.open.get_mut(&id).filter(|open| !open.headed)?;
        open.headed = true;
        // The engine model sends an answer's head with its first token.
        if !self.streams_count_whole {
            open.in_flight.first_token();
        }
        self.replicas[open.replica].pending[open.engine] -= 1;
        Some((open.replica, open.cluster.clone()))
    }

    /// Request `id`'s answer ended: it stops counting in its cluster's in-flight load.
    pub(super) fn finished(&mut self, id: usize, now: f64) {
        if let Some(open) = self.open.remove(&id) {
            if !open.headed {
                self.replicas[open.replica].pending[open.engine] -= 1;
            }
            open.in_flight.end_at(instant(self.base, now));
        }
    }

    /// Every replica reads every engine's waiting queue at `now`.
    pub(super) fn poll(&self, now: f64, engines: &[Engine]) {
        let at = instant(self.base, now);
        for replica in &self.replicas {
            let view = replica.grid.view();
            for (site, cluster) in view.clusters().iter().enumerate() {
                for (j, url) in cluster.endpoints().iter().enumerate() {
                    let engine = &engines[site * self.engines_per_site + j];
                    cluster
                        .load()
                        .record_queue(url, Some(engine.waiting() as f64), at);
                    if self.slots_known {
                        cluster.load().record_slots(url, engine.slots());
                    }
                }
            }
        }
    }
}

/// One site per cluster, `engines` endpoints each: site `s` is `s{s}`, its cluster
/// `s{s}-a`, its endpoints `http://s{s}-e{j}`.
fn grid_spec(sites: usize, engines: usize) -> GridSpec {
    GridSpec::new((0..sites).map(|s| {
        SiteSpec::new(format!("s{s}")).with_clusters([ClusterSpec::new(format!("s{s}-a"))
            .with_models([MODEL])
            .with_endpoints((0..engines).map(|j| format!("http://s{s}-e{j}")))])
    }))
}

#[cfg(test)]
mod tests {
    use grid_route_layer::affinity::AffinitySettings;
    use grid_route_layer::index::IndexSettings;

    use super::*;
    use crate::engine::{EngineKind, EngineModel};

    fn setup(slots_unknown: bool) -> Setup {
        Setup {
            sites: 2,
            engines_per_site: 1,
            replicas: 1,
            shared_index: false,
            affinity: AffinitySettings::default(),
            index: IndexSettings::default(),
            queue_window: GridSettings::DEFAULT_QUEUE_WINDOW,
            count_in_flight: true,
            streams_count_whole: false,
            slots_unknown,
            seed: 1,
            base: Instant::now(),
        }
    }

    #[test]
    fn the_poll_tells_each_cluster_its_slot_engines_slots_unless_they_are_unknown() {
        let slot_engine = Engine::new(EngineModel {
            kind: EngineKind::Slots,
            slots: 3,
            ..EngineModel::default()
        });
        let batching = Engine::new(EngineModel::default());
        let engines = [slot_engine, batching];
        for (unknown, slots) in [(false, [Some(3), None]), (true, [None, None])] {
            let gateways = Gateways::new(&setup(unknown));
            gateways.poll(0.0, &engines);
            let view = gateways.grid(0).view();
            let read: Vec<_> = view.clusters().iter().map(|c| c.load().slots()).collect();
            assert_eq!(read, slots, "--slots-unknown {unknown}");
        }
    }
}
