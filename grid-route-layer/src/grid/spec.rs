//! The grid as configured: plain data in, a validated grid or an error naming the field out.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::names::{ClusterDigest, InvalidName};

/// The sites and clusters of a gateway's configuration, as written (the `sites` list).
///
/// Plain data with public fields, so that any config format can fill it (with the `serde`
/// feature it deserializes straight from one); [`Grid::new`] validates it. It is
/// `#[non_exhaustive]`: build it with [`GridSpec::new`].
///
/// ```
/// use grid_route_layer::grid::{ClusterSpec, GridSpec, SiteSpec};
///
/// let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
///     .with_models(["demo-model"])
///     .with_endpoints(["http://10.0.0.1:8000"])])]);
/// assert!(spec.sites[0].clusters[0].admit);
/// ```
///
/// [`Grid::new`]: super::Grid::new
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct GridSpec {
    /// The sites, in the order the configuration lists them.
    pub sites: Vec<SiteSpec>,
}

impl GridSpec {
    /// A grid of these sites, in this order.
    pub fn new(sites: impl IntoIterator<Item = SiteSpec>) -> Self {
        Self {
            sites: sites.into_iter().collect(),
        }
    }
}

/// One site as configured. `#[non_exhaustive]`: build it with [`SiteSpec::new`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct SiteSpec {
    /// The site's name: a DNS-1123 label.
    pub name: String,
    /// The site's backend clusters.
    pub clusters: Vec<ClusterSpec>,
}

impl SiteSpec {
    /// A site named `name`, with no cluster yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            clusters: Vec::new(),
        }
    }

    /// Sets [`clusters`](Self::clusters).
    #[must_use]
    pub fn with_clusters(mut self, clusters: impl IntoIterator<Item = ClusterSpec>) -> Self {
        self.clusters = clusters.into_iter().collect();
        self
    }
}

/// One backend cluster as configured. `#[non_exhaustive]`: build it with
/// [`ClusterSpec::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct ClusterSpec {
    /// The cluster's name, unique within its site; its digest names it in tagged ids.
    pub name: String,
    /// The models its engines serve (the request's `model` must be one of them).
    pub models: Vec<String>,
    /// `false` drains the cluster: it takes no new request, pinned or not. Default `true`.
    #[cfg_attr(feature = "serde", serde(default = "admitted"))]
    pub admit: bool,
    /// The base URLs of its engines, e.g. `http://10.0.0.7:8000`.
    pub endpoints: Vec<String>,
}

/// A cluster takes requests unless configured otherwise.
fn admitted() -> bool {
    true
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            models: Vec::new(),
            admit: admitted(),
            endpoints: Vec::new(),
        }
    }
}

impl ClusterSpec {
    /// An admitted cluster named `name`, with no model and no endpoint yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Sets [`models`](Self::models).
    #[must_use]
    pub fn with_models(mut self, models: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`admit`](Self::admit).
    #[must_use]
    pub fn with_admit(mut self, admit: bool) -> Self {
        self.admit = admit;
        self
    }

    /// Sets [`endpoints`](Self::endpoints).
    #[must_use]
    pub fn with_endpoints(
        mut self,
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }
}

/// Grid settings outside the `sites` list. `#[non_exhaustive]`: build it from [`Default`]
/// with the `with_*` methods.
///
/// No `Deserialize`: a config file spreads these over other sections (the example's
/// `local_site` and `queue.window_secs`), so no one shape would fit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GridSettings {
    /// The site this gateway replica runs at (`local_site`), if any.
    pub local_site: Option<String>,
    /// How far back a cluster's queue depth looks (`queue.window_secs`, default 1 s): the
    /// depth is the worst sample seen in this window.
    pub queue_window: Duration,
    /// Whether a cluster's load also counts the requests this replica sent it whose answer
    /// has not ended (`queue.count_in_flight`, default `true`). See
    /// [`ClusterLoad::routing_load`](crate::grid::ClusterLoad::routing_load).
    pub count_in_flight: bool,
}

impl GridSettings {
    /// The queue window when not configured: two polls at the example gateway's 500 ms.
    /// A longer window keeps a burst's worst sample after the burst has drained, and every
    /// replica then avoids the same cluster at once (in `simulate`, a 10 s window herds at
    /// 4 and 8 sites; docs/routing.md).
    pub const DEFAULT_QUEUE_WINDOW: Duration = Duration::from_secs(1);
    /// Whether requests in flight count in a cluster's load when not configured: they grow
    /// the load the moment a request is sent, where a queue gauge shows it at the next
    /// poll, and they tell an engine busy with two streams from an idle one.
    pub const DEFAULT_COUNT_IN_FLIGHT: bool = true;

    /// Sets [`local_site`](Self::local_site).
    #[must_use]
    pub fn with_local_site(mut self, site: impl Into<String>) -> Self {
        self.local_site = Some(site.into());
        self
    }

    /// Sets [`queue_window`](Self::queue_window).
    #[must_use]
    pub fn with_queue_window(mut self, window: Duration) -> Self {
        self.queue_window = window;
        self
    }

    /// Sets [`count_in_flight`](Self::count_in_flight).
    #[must_use]
    pub fn with_count_in_flight(mut self, count_in_flight: bool) -> Self {
        self.count_in_flight = count_in_flight;
        self
    }
}

impl Default for GridSettings {
    fn default() -> Self {
        Self {
            local_site: None,
            queue_window: Self::DEFAULT_QUEUE_WINDOW,
            count_in_flight: Self::DEFAULT_COUNT_IN_FLIGHT,
        }
    }
}

/// A grid configuration that was refused; the message names the field and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GridError {
    /// `sites` is empty: a gateway with nowhere to send requests.
    NoSites,
    /// `sites[site].name` is not a DNS-1123 label.
    BadSiteName {
        /// Position of the site in `sites`.
        site: usize,
        /// Why the name was refused.
        source: InvalidName,
    },
    /// Two sites share a name.
    DuplicateSite {
        /// The repeated name.
        name: String,
        /// Position of its first appearance.
        first: usize,
        /// Position of the repeat.
        second: usize,
    },
    /// A cluster's name is empty.
    EmptyClusterName {
        /// Position of the site.
        site: usize,
        /// Position of the cluster in the site's `clusters`.
        cluster: usize,
    },
    /// Two clusters of one site share a name.
    DuplicateCluster {
        /// Position of the site.
        site: usize,
        /// The repeated name.
        name: String,
        /// Position of its first appearance.
        first: usize,
        /// Position of the repeat.
        second: usize,
    },
    /// Two clusters of one site have names whose digests collide, so a tagged id could not
    /// tell them apart.
    DigestCollision {
        /// Position of the site.
        site: usize,
        /// The first cluster's name.
        first: String,
        /// The second cluster's name.
        second: String,
        /// The shared digest.
        digest: ClusterDigest,
    },
    /// A cluster serves no model.
    NoModels {
        /// Position of the site.
        site: usize,
        /// Position of the cluster.
        cluster: usize,
        /// The cluster's name.
        name: String,
    },
    /// A cluster lists no endpoint.
    NoEndpoints {
        /// Position of the site.
        site: usize,
        /// Position of the cluster.
        cluster: usize,
        /// The cluster's name.
        name: String,
    },
    /// An endpoint URL is empty or listed twice in one cluster (endpoints are told apart by
    /// URL, so their load signals would mix).
    BadEndpoint {
        /// Position of the site.
        site: usize,
        /// Position of the cluster.
        cluster: usize,
        /// Position of the endpoint.
        endpoint: usize,
        /// The URL.
        url: String,
        /// Position of its first appearance, when it repeats one.
        repeats: Option<usize>,
    },
    /// `local_site` is not a DNS-1123 label. (A valid name that no configured site has,
    /// or a site with no cluster, is accepted: an operator may take a site's engines out.)
    BadLocalSite {
        /// Why the name was refused.
        source: InvalidName,
    },
    /// `queue.window_secs` is zero.
    ZeroQueueWindow,
}

impl fmt::Display for GridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSites => f.write_str("sites is empty; configure at least one site"),
            Self::BadSiteName { site, source } => write!(
                f,
                "sites[{site}].name {:?} is not a DNS-1123 label: it {}",
                source.name(),
                source.reason()
            ),
            Self::DuplicateSite {
                name,
                first,
                second,
            } => write!(
                f,
                "sites[{second}].name {name:?} repeats sites[{first}].name"
            ),
            Self::EmptyClusterName { site, cluster } => {
                write!(f, "sites[{site}].clusters[{cluster}].name is empty")
            }
            Self::DuplicateCluster {
                site,
                name,
                first,
                second,
            } => write!(
                f,
                "sites[{site}].clusters[{second}].name {name:?} repeats \
                 sites[{site}].clusters[{first}].name"
            ),
            Self::DigestCollision {
                site,
                first,
                second,
                digest,
            } => write!(
                f,
                "sites[{site}] clusters {first:?} and {second:?} have the same digest \
                 {digest}, so tagged ids could not tell them apart; rename one"
            ),
            Self::NoModels {
                site,
                cluster,
                name,
            } => write!(
                f,
                "sites[{site}].clusters[{cluster}].models is empty for cluster {name:?}"
            ),
            Self::NoEndpoints {
                site,
                cluster,
                name,
            } => write!(
                f,
                "sites[{site}].clusters[{cluster}].endpoints is empty for cluster {name:?}"
            ),
            Self::BadEndpoint {
                site,
                cluster,
                endpoint,
                url,
                repeats,
            } => {
                write!(
                    f,
                    "sites[{site}].clusters[{cluster}].endpoints[{endpoint}] {url:?} "
                )?;
                match repeats {
                    Some(first) => write!(
                        f,
                        "repeats sites[{site}].clusters[{cluster}].endpoints[{first}]"
                    ),
                    None => f.write_str("is empty"),
                }
            }
            Self::BadLocalSite { source } => write!(
                f,
                "local_site {:?} is not a DNS-1123 label: it {}",
                source.name(),
                source.reason()
            ),
            Self::ZeroQueueWindow => f.write_str("queue.window_secs must be greater than 0, got 0"),
        }
    }
}

impl std::error::Error for GridError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::BadSiteName { source, .. } | Self::BadLocalSite { source } => Some(source),
            _ => None,
        }
    }
}

/// Checks everything about a spec that does not depend on live state; on success every
/// site name is a valid label, cluster names and digests are unique per site and every
/// cluster has models and distinct, non-empty endpoints.
pub(super) fn validate(spec: &GridSpec, settings: &GridSettings) -> Result<(), GridError> {
    if spec.sites.is_empty() {
        return Err(GridError::NoSites);
    }
    if settings.queue_window.is_zero() {
        return Err(GridError::ZeroQueueWindow);
    }
    let mut sites: HashMap<&str, usize> = HashMap::new();
    for (s, site) in spec.sites.iter().enumerate() {
        super::SiteName::new(&site.name)
            .map_err(|source| GridError::BadSiteName { site: s, source })?;
        if let Some(&first) = sites.get(site.name.as_str()) {
            return Err(GridError::DuplicateSite {
                name: site.name.clone(),
                first,
                second: s,
            });
        }
        sites.insert(&site.name, s);
        validate_clusters(s, site)?;
    }
    if let Some(local) = &settings.local_site {
        super::SiteName::new(local).map_err(|source| GridError::BadLocalSite { source })?;
    }
    Ok(())
}

/// A site may list no cluster: its engines are out, and its stored ids answer 404.
fn validate_clusters(s: usize, site: &SiteSpec) -> Result<(), GridError> {
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut digests: HashMap<ClusterDigest, usize> = HashMap::new();
    for (c, cluster) in site.clusters.iter().enumerate() {
        if cluster.name.is_empty() {
            return Err(GridError::EmptyClusterName {
                site: s,
                cluster: c,
            });
        }
        if let Some(&first) = names.get(cluster.name.as_str()) {
            return Err(GridError::DuplicateCluster {
                site: s,
                name: cluster.name.clone(),
                first,
                second: c,
            });
        }
        names.insert(&cluster.name, c);
        let digest = ClusterDigest::of_name(&cluster.name);
        if let Some(&first) = digests.get(&digest) {
            return Err(GridError::DigestCollision {
                site: s,
                first: site.clusters[first].name.clone(),
                second: cluster.name.clone(),
                digest,
            });
        }
        digests.insert(digest, c);
        if cluster.models.is_empty() {
            return Err(GridError::NoModels {
                site: s,
                cluster: c,
                name: cluster.name.clone(),
            });
        }
        if cluster.endpoints.is_empty() {
            return Err(GridError::NoEndpoints {
                site: s,
                cluster: c,
                name: cluster.name.clone(),
            });
        }
        let mut urls: HashMap<&str, usize> = HashMap::new();
        for (e, url) in cluster.endpoints.iter().enumerate() {
            let repeats = urls.get(url.as_str()).copied();
            if url.is_empty() || repeats.is_some() {
                return Err(GridError::BadEndpoint {
                    site: s,
                    cluster: c,
                    endpoint: e,
                    url: url.clone(),
                    repeats,
                });
            }
            urls.insert(url, e);
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn a_deserialized_cluster_is_admitted_unless_it_says_otherwise() {
        let spec: GridSpec = serde_json::from_str(
            r#"{"sites": [{"name": "east", "clusters": [
                {"name": "east-a", "models": ["m"], "endpoints": ["http://a"]},
                {"name": "east-b", "models": ["m"], "endpoints": ["http://b"], "admit": false}
            ]}]}"#,
        )
        .unwrap();
        let cluster = |name: &str, url: &str| {
            ClusterSpec::new(name)
                .with_models(["m"])
                .with_endpoints([url])
        };
        assert_eq!(
            spec,
            GridSpec::new([SiteSpec::new("east").with_clusters([
                cluster("east-a", "http://a"),
                cluster("east-b", "http://b").with_admit(false),
            ])])
        );
    }

    #[test]
    fn a_deserialized_spec_refuses_unknown_and_missing_fields() {
        let unknown =
            serde_json::from_str::<SiteSpec>(r#"{"name": "east", "clusters": [], "zone": 1}"#)
                .unwrap_err()
                .to_string();
        assert!(unknown.contains("unknown field `zone`"), "{unknown}");
        let missing = serde_json::from_str::<ClusterSpec>(r#"{"name": "east-a", "models": ["m"]}"#)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("missing field `endpoints`"), "{missing}");
    }
}
