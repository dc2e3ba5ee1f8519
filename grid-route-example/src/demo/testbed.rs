//! Three mock sites and a gateway in front of them, started fresh for each run.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::config::GatewayConfig;
use crate::gateway::Gateway;
use grid_route_mock_engine::{MockEngine, MockEngineConfig};

use super::DemoError;

/// The sites, one cluster (of one engine) each. The first is the gateway's local site,
/// where new conversations are created.
pub(crate) const SITES: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// The model every engine serves.
pub(crate) const MODEL: &str = "demo-model";

/// How each mock engine behaves: slow enough a prefill that a cache hit shows in TTFT, few
/// enough running slots that queues form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineProfile {
    /// Uncached prompt tokens prefilled a second.
    pub(crate) prefill_tokens_per_second: u64,
    /// Requests that run at once; the rest queue.
    pub(crate) max_running: usize,
    /// Time to decode one output token.
    pub(crate) decode_delay_per_token: Duration,
}

impl EngineProfile {
    /// What one queued request costs the requests behind it, for the gateway's load gate:
    /// one request's time in a slot shared over the slots. With affinity working, a
    /// request's prefill is mostly cached — its new question and the block the previous
    /// turn left partial, about [`FOLLOW_UP_UNCACHED_TOKENS`] — and its reply is short.
    fn queued_request_seconds(self) -> f64 {
        let seconds = FOLLOW_UP_UNCACHED_TOKENS / self.prefill_tokens_per_second as f64
            + REPLY_TOKENS * self.decode_delay_per_token.as_secs_f64();
        seconds / self.max_running as f64
    }
}

/// The uncached prompt tokens of a follow-up turn that went where its history is.
const FOLLOW_UP_UNCACHED_TOKENS: f64 = 200.0;
/// The mock engines' reply: the engine's name and six words.
const REPLY_TOKENS: f64 = 7.0;

/// How often the gateway reads each engine's queue, and how far back its windowed worst
/// depth looks: short, because the whole run lasts seconds.
const POLL_INTERVAL_MS: u64 = 50;
const QUEUE_WINDOW_SECS: u64 = 1;

/// How long to wait for the gateway's first reading of every queue.
const MEASURED_WITHIN: Duration = Duration::from_secs(5);

/// How long a shut-down gateway may drain.
const DRAIN: Duration = Duration::from_secs(5);

/// One run's engines and gateway.
pub(crate) struct Testbed {
    /// `(site, engine)`, in [`SITES`] order.
    pub(crate) engines: Vec<(&'static str, MockEngine)>,
    pub(crate) gateway: Gateway,
}

impl Testbed {
    /// Starts one engine per site and a gateway with prefix affinity `enabled` or not,
    /// and waits until the gateway has read every engine's queue.
    pub(crate) async fn start(profile: EngineProfile, enabled: bool) -> Result<Self, DemoError> {
        let mut engines = Vec::with_capacity(SITES.len());
        for site in SITES {
            let config = MockEngineConfig {
                models: vec![MODEL.to_owned()],
                max_running: profile.max_running,
                prefill_tokens_per_second: profile.prefill_tokens_per_second,
                decode_delay_per_token: profile.decode_delay_per_token,
                ..MockEngineConfig::named(cluster_name(site))
            };
            let engine = MockEngine::start("127.0.0.1:0", config)
                .await
                .map_err(DemoError::Engine)?;
            engines.push((site, engine));
        }
        let config = GatewayConfig::from_yaml(&gateway_yaml(profile, enabled, &engines))?;
        let gateway = Gateway::start(config).await?;
        let deadline = Instant::now() + MEASURED_WITHIN;
        // Unmeasured queues would make the first decisions on no load signal at all.
        while !all_measured(&gateway) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Self { engines, gateway })
    }

    /// The site of the engine named `engine`.
    pub(crate) fn site_of(&self, engine: &str) -> Option<&'static str> {
        self.engines
            .iter()
            .find(|(_, e)| e.name() == engine)
            .map(|(site, _)| *site)
    }

    /// Stops the gateway, then the engines.
    pub(crate) async fn shutdown(self) {
        // The replay has finished every request, so there is nothing left to drain; a
        // drain timeout would only mean a stuck connection, not lost work.
        let _ = self.gateway.shutdown_within(DRAIN).await;
        for (_, engine) in self.engines {
            let _ = engine.shutdown().await;
        }
    }
}

/// The cluster (and engine) name of `site`.
pub(crate) fn cluster_name(site: &str) -> String {
    format!("{site}-a")
}

fn all_measured(gateway: &Gateway) -> bool {
    let view = gateway.grid().view();
    let now = Instant::now();
    view.clusters()
        .iter()
        .all(|cluster| cluster.load().queue_depth(now).is_finite())
}

/// The gateway's configuration: the three sites, queues read often, and affinity priced
/// for the mock engines (their prefill speed; a queued request's cost) rather than the
/// defaults' production engines.
fn gateway_yaml(profile: EngineProfile, enabled: bool, engines: &[(&str, MockEngine)]) -> String {
    let mut yaml = format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         queue: {{ poll_interval_ms: {POLL_INTERVAL_MS}, window_secs: {QUEUE_WINDOW_SECS} }}\n\
         grid_site_route:\n  prefix_affinity:\n    enabled: {enabled}\n    \
         prefill_tokens_per_second: {}\n    queued_request_seconds: {}\n\
         sites:\n",
        profile.prefill_tokens_per_second,
        profile.queued_request_seconds(),
    );
    for (site, engine) in engines {
        let _ = write!(
            yaml,
            "  - name: {site}\n    clusters:\n      \
             - {{ name: {}, models: [{MODEL}], endpoints: [{}] }}\n",
            engine.name(),
            engine.url()
        );
    }
    yaml
}
