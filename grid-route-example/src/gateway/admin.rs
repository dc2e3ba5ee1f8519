//! The admin listener: `/metrics` (Prometheus text) and `/healthz`.
//!
//! The Prometheus recorder is process-wide (the `metrics` facade has one global recorder),
//! so it is installed once, by the first gateway started in the process; every gateway of
//! the process renders the same registry. Each scrape first sets the grid gauges
//! (`grid_route_queue_depth`, `grid_route_index_entries`) of the gateway scraped. Counters
//! whose label values are known in advance start at 0, so dashboards see every series
//! before its first event. The exporter cannot forget a series: gauges of a cluster that
//! left the grid on reload keep their last value until the process restarts.
//!
//! The exporter keeps every histogram sample until upkeep folds it into the summaries, so
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
use grid_route_layer::metrics::{
    CONFIG_RELOAD_TOTAL, DIRECTION_LABEL, OUTCOME_LABEL, PIN_TOTAL, PREFIX_AFFINITY_TOTAL,
    RESULT_LABEL, SHARED_INDEX_ERRORS_TOTAL, SHARED_INDEX_EVENTS_TOTAL, describe_metrics,
    record_grid_gauges,
};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use super::Live;

/// The outcomes of `grid_route_pin_total`.
const PIN_OUTCOMES: [&str; 4] = ["pinned", "gone", "unavailable", "bad_tag"];

/// How often the process's histogram samples are folded into its summaries, scraped or
/// not (the exporter's own default).
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use; `None` when another
/// recorder was installed first (then `/metrics` answers 503).
pub(crate) fn prometheus() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let installed = PrometheusBuilder::new().install_recorder();
            match installed {
                Ok(handle) => {
                    describe_metrics();
                    for outcome in Outcome::ALL {
                        metrics::counter!(PREFIX_AFFINITY_TOTAL, OUTCOME_LABEL => outcome.as_str())
                            .increment(0);
                    }
                    for outcome in PIN_OUTCOMES {
                        metrics::counter!(PIN_TOTAL, OUTCOME_LABEL => outcome).increment(0);
                    }
                    for result in ["applied", "rejected"] {
                        metrics::counter!(CONFIG_RELOAD_TOTAL, RESULT_LABEL => result).increment(0);
                    }
                    for direction in ["published", "applied", "dropped"] {
                        metrics::counter!(SHARED_INDEX_EVENTS_TOTAL, DIRECTION_LABEL => direction)
                            .increment(0);
                    }
                    metrics::counter!(SHARED_INDEX_ERRORS_TOTAL).increment(0);
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
        .into_response()
        .into_response();
    };
    record_grid_gauges(&live.grid.view(), &live.index, Instant::now());
    handle.run_upkeep();
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
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
