//! The admin listener: `/metrics` (Prometheus text) and `/healthz`.
//!
//! The Prometheus recorder is process-wide (the `metrics` facade has one global recorder),
//! so it is installed once, by the first gateway started in the process; every gateway of
//! the process renders the same registry. Each scrape first sets the grid gauges
//! (`grid_route_queue_depth`, `grid_route_index_entries`) of the gateway scraped. Counters
//! whose label values are known in advance start at 0, so dashboards see every series
//! before its first event.
//!
//! The exporter cannot forget a series, so `/metrics` leaves out the series of clusters
//! that a reload removed (those labelled with their `site` and `cluster`): they leave
//! the page at the reload that removes them, and come
//! back (counters where they were) if a later reload adds the cluster again. The
//! exporter keeps their last values meanwhile, one set per cluster name ever configured.
//!
//! `grid_route_keying_seconds` and `grid_route_keys_per_request` are Prometheus histograms
//! with the library's bucket bounds (`KEYING_SECONDS_BUCKETS`, `KEYS_PER_REQUEST_BUCKETS`).
//! The exporter keeps every histogram sample until upkeep folds it into the buckets, so
//! a thread runs upkeep every [`METRICS_UPKEEP_INTERVAL`] (as the exporter's own
//! `install` would): without it, a gateway that nobody scrapes grows by the samples of
//! every request it serves.
//!
//! `/healthz` answers 200 while the gateway serves, with the grid's generation and how
//! many clusters are configured and admitted; it does not fail when none admits (the
//! gateway still answers, with 503s), so an orchestrator does not restart it for its
//! engines' sake.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use grid_route_layer::affinity::Outcome;
use grid_route_layer::answer::ErrorAnswer;
use grid_route_layer::grid::ClusterId;
use grid_route_layer::metrics::{
    CLUSTER_LABEL, KEYING_SECONDS, KEYING_SECONDS_BUCKETS, KEYS_PER_REQUEST,
    KEYS_PER_REQUEST_BUCKETS, OUTCOME_LABEL, PIN_TOTAL, PREFIX_AFFINITY_TOTAL, SITE_LABEL,
    describe_metrics, record_grid_gauges,
};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use super::Live;
use super::telemetry::describe_gateway_metrics;

/// The outcomes of `grid_route_pin_total`.
const PIN_OUTCOMES: [&str; 5] = [
    "pinned",
    "gone",
    "unavailable",
    "bad_tag",
    "model_not_served",
];

/// How often the process's histogram samples are folded into its summaries, scraped or
/// not (the exporter's own default).
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use; `None` when another
/// recorder was installed first (then `/metrics` answers 503).
pub(crate) fn prometheus() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let installed = histogram_buckets(PrometheusBuilder::new())
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    describe_metrics();
                    describe_gateway_metrics();
                    for outcome in Outcome::ALL {
                        metrics::counter!(PREFIX_AFFINITY_TOTAL, OUTCOME_LABEL => outcome.as_str())
                            .increment(0);
                    }
                    for outcome in PIN_OUTCOMES {
                        metrics::counter!(PIN_TOTAL, OUTCOME_LABEL => outcome).increment(0);
                    }
                    spawn_upkeep(handle.clone());
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot install the Prometheus recorder; /metrics will answer 503");
                    None
                }
            }
        })
        .as_ref()
}

/// The library's histograms are Prometheus histograms with its bucket bounds (the
/// exporter's default would be summaries, which cannot be aggregated across replicas).
fn histogram_buckets(builder: PrometheusBuilder) -> Result<PrometheusBuilder, BuildError> {
    builder
        .set_buckets_for_metric(
            Matcher::Full(KEYING_SECONDS.into()),
            &KEYING_SECONDS_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(KEYS_PER_REQUEST.into()),
            &KEYS_PER_REQUEST_BUCKETS,
        )
}

/// Runs the recorder's upkeep every [`METRICS_UPKEEP_INTERVAL`] for the rest of the
/// process, as the recorder lives that long. A thread, not a task: the recorder outlives
/// any one gateway and the runtime it was started on.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(METRICS_UPKEEP_INTERVAL);
                handle.run_upkeep();
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the metrics upkeep thread; histogram samples are folded only on scrapes");
    }
}

/// The admin listener's router.
pub(crate) fn router(live: Arc<Live>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(live)
}

async fn metrics(State(live): State<Arc<Live>>) -> Response {
    let Some(handle) = prometheus() else {
        return ErrorAnswer::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "another metrics recorder is installed in this process",
        )
        .into_http_response::<axum::body::Body>();
    };
    record_grid_gauges(&live.grid.view(), &live.index, Instant::now());
    handle.run_upkeep();
    let removed = live.removed_clusters();
    let text = handle.render();
    let text = if removed.is_empty() {
        text
    } else {
        without_clusters(&text, &removed)
    };
    let mut response = text.into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// `text` without the sample lines labelled with a cluster of `removed`.
fn without_clusters(text: &str, removed: &[ClusterId]) -> String {
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        let of_removed = !line.starts_with('#')
            && line
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .is_some_and(|(labels, _)| names_a_cluster_of(labels, removed));
        if !of_removed {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// Whether the Prometheus label set `labels` (`a="x",b="y"`) names a cluster of
/// `removed` by `site` and `cluster`. Site and cluster names are DNS-1123 labels, so a
/// value holds no quote or escape.
fn names_a_cluster_of(labels: &str, removed: &[ClusterId]) -> bool {
    let value = |name: &str| {
        labels.split(',').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches('"'))
        })
    };
    let (Some(site), Some(cluster)) = (value(SITE_LABEL), value(CLUSTER_LABEL)) else {
        return false;
    };
    removed
        .iter()
        .any(|id| id.site().as_str() == site && id.name() == cluster)
}

async fn healthz(State(live): State<Arc<Live>>) -> Response {
    let view = live.grid.view();
    let clusters = view.clusters().len();
    let admitted = view.clusters().iter().filter(|c| c.admits()).count();
    axum::Json(json!({
        "status": "ok",
        "generation": view.generation(),
        "clusters": clusters,
        "admitted": admitted,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_of_removed_clusters_are_left_out_and_the_rest_kept() {
        let view = grid_route_layer::grid::Grid::new(
            &grid_route_layer::grid::GridSpec::new([grid_route_layer::grid::SiteSpec::new("west")
                .with_clusters([grid_route_layer::grid::ClusterSpec::new("west-a")
                    .with_models(["m"])
                    .with_endpoints(["http://127.0.0.1:1"])])]),
            grid_route_layer::grid::GridSettings::default(),
        )
        .unwrap()
        .view();
        let removed: Vec<ClusterId> = view.cluster_ids().collect();
        let text = "# TYPE grid_route_queue_depth gauge\n\
                    grid_route_queue_depth{site=\"west\",cluster=\"west-a\"} 1\n\
                    grid_route_queue_depth{site=\"east\",cluster=\"west-a\"} 2\n\
                    grid_route_index_entries{site=\"west\",cluster=\"west-a\"} 3\n\
                    grid_route_index_entries{site=\"east\",cluster=\"east-a\"} 4\n\
                    grid_route_pin_total{outcome=\"pinned\"} 5\n";
        let kept = without_clusters(text, &removed);
        assert_eq!(
            kept,
            "# TYPE grid_route_queue_depth gauge\n\
             grid_route_queue_depth{site=\"east\",cluster=\"west-a\"} 2\n\
             grid_route_index_entries{site=\"east\",cluster=\"east-a\"} 4\n\
             grid_route_pin_total{outcome=\"pinned\"} 5\n"
        );
    }
}
