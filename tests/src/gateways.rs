//! Gateways in this process, from YAML: listeners on port 0, queues polled every 20 ms
//! over a 1 s window, and their admin page read back.

use std::fmt::Write as _;
use std::time::Instant;

use grid_route_example::config::GatewayConfig;
use grid_route_example::gateway::Gateway;
use grid_route_layer::grid::ClusterId;
use grid_route_mock_engine::MockEngine;
use hyper::Method;

use super::engines::MODEL;
use super::http::try_send;
use super::process::PROCESS_WAIT;
use super::wait::{eventually, eventually_within};

/// One cluster of a test config: its name, models, whether it admits, and its endpoints.
#[derive(Debug, Clone)]
pub struct ClusterYaml {
    /// Its name.
    pub name: String,
    /// The models it serves ([`MODEL`] by default).
    pub models: Vec<String>,
    /// `admit` (true by default).
    pub admit: bool,
    /// Its endpoints' URLs.
    pub endpoints: Vec<String>,
}

/// Cluster `name`, serving [`MODEL`] from `engines`.
pub fn cluster(name: &str, engines: &[&MockEngine]) -> ClusterYaml {
    ClusterYaml {
        name: name.to_owned(),
        models: vec![MODEL.to_owned()],
        admit: true,
        endpoints: engines.iter().map(|e| e.url()).collect(),
    }
}

impl ClusterYaml {
    /// The same cluster serving `models`.
    #[must_use]
    pub fn serving(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }

    /// The same cluster with `admit: false` (drained).
    #[must_use]
    pub fn drained(mut self) -> Self {
        self.admit = false;
        self
    }

    /// The same cluster at these endpoints instead.
    #[must_use]
    pub fn at(mut self, endpoints: Vec<String>) -> Self {
        self.endpoints = endpoints;
        self
    }
}

/// A gateway config: both listeners on port 0, queues polled every 20 ms over a 1 s
/// window, then `extra` top-level YAML, then `sites` with their clusters.
pub fn config_yaml(sites: &[(&str, Vec<ClusterYaml>)], extra: &str) -> String {
    let mut yaml = String::from(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n\
         queue: { poll_interval_ms: 20, window_secs: 1 }\n",
    );
    yaml.push_str(extra);
    yaml.push_str("sites:\n");
    for (site, clusters) in sites {
        let _ = write!(yaml, "  - name: {site}\n    clusters:\n");
        for c in clusters {
            let _ = writeln!(
                yaml,
                "      - {{ name: {}, models: [{}], admit: {}, endpoints: [{}] }}",
                c.name,
                c.models.join(", "),
                c.admit,
                c.endpoints.join(", ")
            );
        }
    }
    yaml
}

/// `yaml` read as a gateway config; fails the test when it is refused.
pub fn parse(yaml: &str) -> GatewayConfig {
    GatewayConfig::from_yaml(yaml).unwrap()
}

/// Starts a gateway from `yaml`.
pub async fn gateway(yaml: &str) -> Gateway {
    Gateway::start(parse(yaml)).await.unwrap()
}

/// Starts a gateway from `yaml` and waits until it has read every cluster's queue.
pub async fn measured_gateway(yaml: &str) -> Gateway {
    let gateway = gateway(yaml).await;
    wait_measured(&gateway).await;
    gateway
}

/// Waits until `gateway` has read every cluster's queue.
pub async fn wait_measured(gateway: &Gateway) {
    eventually("every cluster measured", || async {
        let view = gateway.grid().view();
        let now = Instant::now();
        view.clusters()
            .iter()
            .all(|c| c.load().queue_depth(now).is_finite())
    })
    .await;
}

/// The id of `gateway`'s cluster named `name`.
pub fn cluster_id(gateway: &Gateway, name: &str) -> ClusterId {
    let view = gateway.grid().view();
    view.clusters()
        .iter()
        .find(|c| c.id().name() == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
        .id()
        .clone()
}

/// The value of `series` (summed over its other labels) on the admin page at
/// `admin_url`; `None` when the page has no such sample or nothing answers (a gateway
/// process starting or gone).
pub async fn metric(admin_url: &str, series: &str) -> Option<f64> {
    let page = try_send(Method::GET, &format!("{admin_url}/metrics"), "").await?;
    grid_route_example::prometheus::series(&page.text(), series)
}

/// The config generation the admin `/healthz` at `admin_url` reports; `None` while
/// nothing answers.
pub async fn generation(admin_url: &str) -> Option<u64> {
    let health = try_send(Method::GET, &format!("{admin_url}/healthz"), "").await?;
    serde_json::from_slice::<serde_json::Value>(&health.body).ok()?["generation"].as_u64()
}

/// Waits until the admin `/healthz` at `admin_url` reports `generation`, failing after
/// [`PROCESS_WAIT`].
pub async fn wait_generation(admin_url: &str, generation_wanted: u64) {
    let what = format!("generation {generation_wanted} at {admin_url}");
    eventually_within(&what, PROCESS_WAIT, || async {
        generation(admin_url).await == Some(generation_wanted)
    })
    .await;
}
