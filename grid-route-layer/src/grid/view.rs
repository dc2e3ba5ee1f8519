//! The validated grid: an immutable view per configuration, swapped atomically.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use super::load::ClusterLoad;
use super::names::{ClusterDigest, ClusterId, SiteName};
use super::spec::{self, GridError, GridSettings, GridSpec};

/// The shared handle on the grid: clone it into every layer that routes.
///
/// [`view`](Self::view) is one atomic load; [`reconfigure`](Self::reconfigure) validates a
/// new configuration and swaps the view in one step, so a request sees either the old grid
/// or the new one, never a mix.
#[derive(Clone)]
pub struct Grid {
    shared: Arc<Shared>,
}

struct Shared {
    view: ArcSwap<GridView>,
    /// Serialises reconfigurations, so two reloads cannot both carry over from the same
    /// old view and lose each other's clusters.
    reconfiguring: Mutex<()>,
}

impl Grid {
    /// Validates `spec` and `settings` and builds the grid; every cluster starts
    /// unmeasured, every endpoint healthy.
    pub fn new(spec: &GridSpec, settings: GridSettings) -> Result<Self, GridError> {
        let view = GridView::build(spec, settings, None, 0)?;
        Ok(Self {
            shared: Arc::new(Shared {
                view: ArcSwap::from_pointee(view),
                reconfiguring: Mutex::new(()),
            }),
        })
    }

    /// The grid as it is now. Hold the returned view for the length of one decision, so
    /// every read in it sees one configuration.
    pub fn view(&self) -> Arc<GridView> {
        self.shared.view.load_full()
    }

    /// Replaces the configuration, or refuses it and keeps the old one.
    ///
    /// Clusters that stay (same site and name) keep their live load: queue samples and
    /// health of the endpoints that stay (matched by URL) and the count of requests in
    /// flight. New clusters and endpoints start unmeasured and healthy. Clusters that left
    /// are gone from the next view; requests already holding an older view finish with it.
    /// A new queue window applies at once to the samples still held (a longer window
    /// cannot bring back samples the shorter one already let go).
    pub fn reconfigure(&self, spec: &GridSpec, settings: GridSettings) -> Result<(), GridError> {
        let _reconfiguring = self
            .shared
            .reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.shared.view.load_full();
        let view = GridView::build(spec, settings, Some(&old), old.generation + 1)?;
        self.shared.view.store(Arc::new(view));
        Ok(())
    }
}

impl fmt::Debug for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Grid").field(&self.view()).finish()
    }
}

/// One configuration of the grid: its clusters in config order, with their live load.
pub struct GridView {
    clusters: Vec<Arc<Cluster>>,
    by_id: HashMap<ClusterId, usize>,
    by_digest: HashMap<ClusterDigest, Vec<usize>>,
    local_site: Option<SiteName>,
    settings: GridSettings,
    generation: u64,
}

impl GridView {
    fn build(
        spec: &GridSpec,
        settings: GridSettings,
        old: Option<&GridView>,
        generation: u64,
    ) -> Result<Self, GridError> {
        spec::validate(spec, &settings)?;
        let mut clusters = Vec::new();
        for site in &spec.sites {
            let site_name = SiteName::new(&site.name).map_err(|source| {
                // Unreachable after `validate`, but an error beats a panic.
                GridError::BadSiteName { site: 0, source }
            })?;
            for cluster in &site.clusters {
                let id = ClusterId::new(site_name.clone(), &cluster.name);
                let endpoints: Box<[Arc<str>]> = cluster
                    .endpoints
                    .iter()
                    .map(|e| e.as_str().into())
                    .collect();
                let load = match old.and_then(|old| old.cluster(&id)) {
                    Some(kept) => kept.load.carried_over(&endpoints, &settings),
                    None => ClusterLoad::new(&endpoints, &settings),
                };
                clusters.push(Arc::new(Cluster {
                    id,
                    models: cluster.models.iter().map(|m| m.as_str().into()).collect(),
                    admit: cluster.admit,
                    endpoints,
                    load,
                }));
            }
        }
        let by_id = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        let mut by_digest: HashMap<ClusterDigest, Vec<usize>> = HashMap::new();
        for (i, c) in clusters.iter().enumerate() {
            by_digest.entry(c.id.digest()).or_default().push(i);
        }
        let local_site = match &settings.local_site {
            Some(name) => {
                Some(SiteName::new(name).map_err(|source| GridError::BadLocalSite { source })?)
            }
            None => None,
        };
        Ok(Self {
            clusters,
            by_id,
            by_digest,
            local_site,
            settings,
            generation,
        })
    }

    /// Counts configurations: 0 for the grid's first, one more for each applied
    /// reconfiguration. A later view always has a larger generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every cluster, in config order (sites in order, then each site's clusters).
    pub fn clusters(&self) -> &[Arc<Cluster>] {
        &self.clusters
    }

    /// The ids of every cluster, in config order (e.g. for
    /// [`PrefixIndex::reconfigure`](crate::index::PrefixIndex::reconfigure)).
    pub fn cluster_ids(&self) -> impl Iterator<Item = ClusterId> + '_ {
        self.clusters.iter().map(|c| c.id.clone())
    }

    /// The cluster with this id, if it is in the grid.
    pub fn cluster(&self, id: &ClusterId) -> Option<&Arc<Cluster>> {
        self.by_id.get(id).map(|&i| &self.clusters[i])
    }

    /// The cluster a tagged id names: its site and its name's digest (pinning).
    pub fn by_tag(&self, site: &str, digest: ClusterDigest) -> Option<&Arc<Cluster>> {
        self.by_digest
            .get(&digest)?
            .iter()
            .map(|&i| &self.clusters[i])
            .find(|c| c.id.site().as_str() == site)
    }

    /// The clusters that may take a new request for `model`, in config order: admitted
    /// ([`Cluster::admits`]) and serving the model. With no model (a request that names
    /// none, or one the gateway could not read), every admitted cluster.
    pub fn candidates(&self, model: Option<&str>) -> Vec<Arc<Cluster>> {
        self.clusters
            .iter()
            .filter(|c| c.admits() && model.is_none_or(|m| c.serves(m)))
            .cloned()
            .collect()
    }

    /// The site this replica runs at, when configured.
    pub fn local_site(&self) -> Option<&SiteName> {
        self.local_site.as_ref()
    }

    /// The settings this view was built with.
    pub fn settings(&self) -> &GridSettings {
        &self.settings
    }
}

impl fmt::Debug for GridView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GridView")
            .field("clusters", &self.clusters)
            .field("local_site", &self.local_site)
            .field("queue_window", &self.settings.queue_window)
            .field("count_in_flight", &self.settings.count_in_flight)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// One backend cluster: where it is, what it serves, whether it takes requests, its load.
pub struct Cluster {
    id: ClusterId,
    models: Box<[Arc<str>]>,
    admit: bool,
    endpoints: Box<[Arc<str>]>,
    load: ClusterLoad,
}

impl Cluster {
    /// The cluster's site, name and digest.
    pub fn id(&self) -> &ClusterId {
        &self.id
    }

    /// The cluster's site.
    pub fn site(&self) -> &SiteName {
        self.id.site()
    }

    /// The models it serves, as configured.
    pub fn models(&self) -> &[Arc<str>] {
        &self.models
    }

    /// Whether it serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.models.iter().any(|m| &**m == model)
    }

    /// Whether it takes new requests now: not drained by config (`admit: true`) and at
    /// least one endpoint believed healthy.
    pub fn admits(&self) -> bool {
        self.admit && self.load.any_healthy()
    }

    /// Whether config admits it (`admit`), whatever its endpoints' health.
    pub fn admitted_by_config(&self) -> bool {
        self.admit
    }

    /// Its endpoints' base URLs, as configured.
    pub fn endpoints(&self) -> &[Arc<str>] {
        &self.endpoints
    }

    /// Its live load.
    pub fn load(&self) -> &ClusterLoad {
        &self.load
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field("models", &self.models)
            .field("admit", &self.admit)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}
