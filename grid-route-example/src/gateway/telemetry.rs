//! The series only this gateway emits, beside the library's (`grid_route_layer::metrics`):
//! their names, labels and help text, in one place.
//!
//! | metric | kind | labels | counted by |
//! |---|---|---|---|
//! | `grid_route_ejections_total` | counter | `site`, `cluster` | an endpoint's outlier detection |
//! | `grid_serving_config_reload_total` | counter | `result` | a reload (`applied`, `rejected`) |
//! | `grid_route_shared_index_events_total` | counter | `direction` | the shared index |
//! | `grid_route_shared_index_errors_total` | counter | | the shared index |

use metrics::Unit;

/// Ejections of endpoints, by `site` and `cluster`.
pub const EJECTIONS_TOTAL: &str = "grid_route_ejections_total";
/// Config reloads by result (`applied`, `rejected`).
pub const CONFIG_RELOAD_TOTAL: &str = "grid_serving_config_reload_total";
/// Shared-index events by direction: `published` (sent to Redis), `applied` (a peer's
/// event changed this replica's index), `dropped` (the publish queue was full).
pub const SHARED_INDEX_EVENTS_TOTAL: &str = "grid_route_shared_index_events_total";
/// Failed operations against the shared index's Redis (connect, publish, read).
pub const SHARED_INDEX_ERRORS_TOTAL: &str = "grid_route_shared_index_errors_total";
/// The label naming a reload's result.
pub const RESULT_LABEL: &str = "result";
/// The label naming which way a shared-index event went.
pub const DIRECTION_LABEL: &str = "direction";

/// Gives each of this gateway's own series its help text (the library's
/// `describe_metrics` does its own), and registers every label value at zero so that a
/// dashboard sees the series before the first event.
pub(crate) fn describe_gateway_metrics() {
    metrics::describe_counter!(
        EJECTIONS_TOTAL,
        Unit::Count,
        "Endpoints ejected after failures in a row (5xx, failed connects, timeouts) or as \
         wedged (a request waiting far longer than the grid's answers take), by site and \
         cluster."
    );
    metrics::describe_counter!(
        CONFIG_RELOAD_TOTAL,
        Unit::Count,
        "Config reloads by result: applied, or rejected (the old config stays)."
    );
    metrics::describe_counter!(
        SHARED_INDEX_EVENTS_TOTAL,
        Unit::Count,
        "Shared-index events by direction: published (sent to Redis), applied (a peer's \
         confirmation or drop changed this replica's index), dropped (the publish queue was \
         full)."
    );
    metrics::describe_counter!(
        SHARED_INDEX_ERRORS_TOTAL,
        Unit::Count,
        "Failed operations against the shared index's Redis (connect, publish, read); \
         routing goes on with the local index."
    );
    for result in ["applied", "rejected"] {
        metrics::counter!(CONFIG_RELOAD_TOTAL, RESULT_LABEL => result).increment(0);
    }
    for direction in ["published", "applied", "dropped"] {
        metrics::counter!(SHARED_INDEX_EVENTS_TOTAL, DIRECTION_LABEL => direction).increment(0);
    }
    metrics::counter!(SHARED_INDEX_ERRORS_TOTAL).increment(0);
}
