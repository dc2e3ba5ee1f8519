//! Helpers shared by the unit tests: small grids.

use crate::grid::{ClusterSpec, GridSpec, SiteSpec};

/// The model every test cluster serves.
pub(crate) const MODEL: &str = "m";

/// A cluster serving [`MODEL`] through one endpoint, `http://<name>`.
pub(crate) fn cluster_spec(name: &str) -> ClusterSpec {
    ClusterSpec {
        name: name.into(),
        models: vec![MODEL.into()],
        admit: true,
        endpoints: vec![format!("http://{name}")],
    }
}

/// Sites with their clusters, built by [`cluster_spec`].
pub(crate) fn grid_spec(sites: &[(&str, &[&str])]) -> GridSpec {
    GridSpec {
        sites: sites
            .iter()
            .map(|(site, clusters)| SiteSpec {
                name: (*site).into(),
                clusters: clusters.iter().map(|c| cluster_spec(c)).collect(),
            })
            .collect(),
    }
}
