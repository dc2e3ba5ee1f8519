//! Metric names, their help text, and the gauges a gateway publishes from the grid.
//!
//! The layers count through the [`metrics`] facade, so they cost nothing until the
//! gateway installs a recorder (the example gateway exports Prometheus text on its admin
//! port). Names are constants here so that dashboards, tests and the layers agree.
//!
//! | metric | kind | labels | counted by |
//! |---|---|---|---|
//! | `grid_route_prefix_affinity_total` | counter | `outcome` | `AffinityLayer` |
//! | `grid_route_pin_total` | counter | `outcome` | `PinLayer` |
//! | `grid_route_decisions_total` | counter | `site`, `cluster` | `Select` |
//! | `grid_route_shared_head_joins_total` | counter | `site`, `cluster` | `Select` |
//! | `grid_route_slot_passed_over_total` | counter | `site`, `cluster` | `AffinityLayer` |
//! | `grid_route_slot_holds_total` | counter | `site`, `cluster` | `Select` |
//! | `grid_route_pass_spacings_total` | counter | `site`, `cluster` | `Select` |
//! | `grid_route_prompt_tokens_total` | counter | `site`, `cluster` | `FeedbackLayer` |
//! | `grid_route_cached_prompt_tokens_total` | counter | `site`, `cluster` | `FeedbackLayer` |
//! | `grid_route_predicted_cached_tokens_total` | counter | `site`, `cluster` | `FeedbackLayer` |
//! | `grid_route_delivered_cached_tokens_total` | counter | `site`, `cluster` | `FeedbackLayer` |
//! | `grid_route_index_forgotten_total` | counter | `site`, `cluster` | `FeedbackLayer` (with `engine_feedback`) |
//! | `grid_route_prefill_tokens_per_second` | gauge | `site`, `cluster` | `FeedbackLayer` (with `auto`) |
//! | `grid_route_queued_request_seconds` | gauge | `site`, `cluster` | `FeedbackLayer` (with `auto`) |
//! | `grid_route_shared_head_found_share` | gauge | `site`, `cluster` | `FeedbackLayer` (with `engine_feedback`) |
//! | `grid_route_keying_seconds` | histogram | | `KeyingLayer` |
//! | `grid_route_keys_per_request` | histogram | | `KeyingLayer` |
//! | `grid_route_index_entries` | gauge | `site`, `cluster` | [`record_grid_gauges`] |
//! | `grid_route_queue_depth` | gauge | `site`, `cluster` | [`record_grid_gauges`] |
//!
//! Only what the library emits is here; a gateway names and describes its own series (the
//! example gateway's reloads, ejections and shared index are in its `gateway::telemetry`).
//!
//! ```
//! use grid_route_layer::metrics::{PREFIX_AFFINITY_TOTAL, describe_metrics};
//!
//! // Once at start, after installing a recorder: every metric gets its help text.
//! describe_metrics();
//! assert_eq!(PREFIX_AFFINITY_TOTAL, "grid_route_prefix_affinity_total");
//! ```

use std::sync::Arc;
use std::time::Instant;

use metrics::Unit;

use crate::affinity::Learned;
use crate::grid::{ClusterId, GridView};
use crate::index::PrefixIndex;

/// Affinity decisions by outcome (`sticky`, `no_match`, `load_override`, `exploration`,
/// `not_applicable`, `session`).
pub const PREFIX_AFFINITY_TOTAL: &str = "grid_route_prefix_affinity_total";
/// Pinning decisions by outcome (`pinned`, `gone`, `unavailable`, `bad_tag`,
/// `model_not_served`).
pub const PIN_TOTAL: &str = "grid_route_pin_total";
/// Requests dispatched, by site and cluster.
pub const DECISIONS_TOTAL: &str = "grid_route_decisions_total";
/// Prompt tokens of 2xx answers to a prompt (a `POST` of a keyed API), as the engines
/// counted them, by site and cluster.
pub const PROMPT_TOKENS_TOTAL: &str = "grid_route_prompt_tokens_total";
/// The part of [`PROMPT_TOKENS_TOTAL`] the engines served from their cache.
pub const CACHED_PROMPT_TOKENS_TOTAL: &str = "grid_route_cached_prompt_tokens_total";
/// Cached prompt tokens the index predicted for sticky and session requests (matched bytes
/// / 4).
pub const PREDICTED_CACHED_TOKENS_TOTAL: &str = "grid_route_predicted_cached_tokens_total";
/// Cached prompt tokens the engines reported for the same requests.
pub const DELIVERED_CACHED_TOKENS_TOTAL: &str = "grid_route_delivered_cached_tokens_total";
/// Index entries forgotten because an engine reported it had evicted a predicted prompt.
pub const INDEX_FORGOTTEN_TOTAL: &str = "grid_route_index_forgotten_total";
/// Each cluster's learned prefill speed, tokens a second (`prefill_tokens_per_second: auto`).
pub const PREFILL_TOKENS_PER_SECOND: &str = "grid_route_prefill_tokens_per_second";
/// Each cluster's learned price of one more request in its load, seconds
/// (`queued_request_seconds: auto`).
pub const QUEUED_REQUEST_SECONDS: &str = "grid_route_queued_request_seconds";
/// New conversations' first turns sent to a busier holder of their short shared head with a
/// free slot, whose engines keep shared heads (each counted `sticky` in
/// [`PREFIX_AFFINITY_TOTAL`] too).
pub const SHARED_HEAD_JOINS_TOTAL: &str = "grid_route_shared_head_joins_total";
/// Each cluster's share of new conversations' first turns that found the short shared head
/// they asked its engines for, weighed by recency (with `engine_feedback`).
pub const SHARED_HEAD_FOUND_SHARE: &str = "grid_route_shared_head_found_share";
/// Requests that left a cluster out because a slot there had just gone idle, which a live
/// conversation's next turn may be about to take back
/// ([`Decision::passed_over`](crate::affinity::Decision::passed_over)).
pub const SLOT_PASSED_OVER_TOTAL: &str = "grid_route_slot_passed_over_total";
/// Requests [`Select`](crate::select::Select) held before sending them to a cluster where a
/// slot had just gone idle, for the conversation answered there to reach it first
/// ([`SlotHold`](crate::route::SlotHold)).
pub const SLOT_HOLDS_TOTAL: &str = "grid_route_slot_holds_total";
/// Requests [`Select`](crate::select::Select) sent to a cluster of engines with slots a
/// moment after the one sent before them, still waiting for its first token, so that the
/// engine prefills the two in separate passes
/// ([`SLOT_PASS_SPACING`](crate::grid::SLOT_PASS_SPACING)).
pub const PASS_SPACINGS_TOTAL: &str = "grid_route_pass_spacings_total";
/// Time spent keying a request body, in seconds.
pub const KEYING_SECONDS: &str = "grid_route_keying_seconds";
/// Prefix keys per keyed request.
pub const KEYS_PER_REQUEST: &str = "grid_route_keys_per_request";
/// Bucket bounds of [`KEYING_SECONDS`], in seconds: 10 µs to 100 ms. A 1 KiB chat body keys
/// in tens of microseconds, a 10 MiB one in tens of milliseconds.
pub const KEYING_SECONDS_BUCKETS: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1,
];
/// Bucket bounds of [`KEYS_PER_REQUEST`]: 1 to 512, the most a request gets.
pub const KEYS_PER_REQUEST_BUCKETS: [f64; 10] =
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Prefix index entries per cluster.
pub const INDEX_ENTRIES: &str = "grid_route_index_entries";
/// Windowed worst queue depth per cluster (`+Inf` when unmeasured).
pub const QUEUE_DEPTH: &str = "grid_route_queue_depth";

/// The label naming an outcome.
pub const OUTCOME_LABEL: &str = "outcome";
/// The label naming a site.
pub const SITE_LABEL: &str = "site";
/// The label naming a cluster (its name; with `site` where both appear).
pub const CLUSTER_LABEL: &str = "cluster";

/// Registers the help text (and unit) of every metric with the installed recorder. Call
/// it once at start, after installing the recorder.
// One describe call per metric, in the order of the constants: splitting it would only
// scatter the list.
#[allow(clippy::too_many_lines)]
pub fn describe_metrics() {
    metrics::describe_counter!(
        PREFIX_AFFINITY_TOTAL,
        Unit::Count,
        "Prefix affinity decisions for requests with at least two admitted clusters, by \
         outcome: sticky, no_match, load_override, exploration, not_applicable, session."
    );
    metrics::describe_counter!(
        PIN_TOTAL,
        Unit::Count,
        "Requests naming a stored response or conversation, by outcome: pinned, gone \
         (cluster not in the grid), unavailable (cluster admits no new request), bad_tag, \
         model_not_served (the cluster does not serve the request's model)."
    );
    metrics::describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Requests dispatched to each backend cluster by this replica."
    );
    metrics::describe_counter!(
        PROMPT_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens of the 2xx answers of each backend cluster to a chat, completions, \
         messages or responses POST, as its engines reported them in the answers' usage."
    );
    metrics::describe_counter!(
        CACHED_PROMPT_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens of the same answers that the cluster's engines reported serving from \
         their prefix cache."
    );
    metrics::describe_counter!(
        PREDICTED_CACHED_TOKENS_TOTAL,
        Unit::Count,
        "Cached prompt tokens the prefix index predicted for the sticky and session requests \
         each backend cluster answered (matched bytes / 4 bytes a token)."
    );
    metrics::describe_counter!(
        DELIVERED_CACHED_TOKENS_TOTAL,
        Unit::Count,
        "Cached prompt tokens the engines of each backend cluster reported for the requests \
         counted in grid_route_predicted_cached_tokens_total."
    );
    metrics::describe_counter!(
        INDEX_FORGOTTEN_TOTAL,
        Unit::Count,
        "Prefix index entries of each backend cluster forgotten because one of its engines \
         reported far less of a predicted prompt cached than predicted (engine_feedback): the \
         entries recorded there before that prompt."
    );
    metrics::describe_gauge!(
        PREFILL_TOKENS_PER_SECOND,
        "Prefill speed learned for each backend cluster with prefill_tokens_per_second: auto, \
         tokens a second: with queued_request_seconds: auto, from the least-squares fit of \
         time to first token on load at dispatch and uncached prompt tokens; alone, a moving \
         average of uncached prompt tokens / seconds from dispatch to the answer's start."
    );
    metrics::describe_gauge!(
        QUEUED_REQUEST_SECONDS,
        Unit::Seconds,
        "What one more request in a backend cluster's load costs a new one, learned with \
         queued_request_seconds: auto: the least-squares fit of streamed answers' time to \
         first token on their load at dispatch and their uncached prompt tokens."
    );
    metrics::describe_counter!(
        SHARED_HEAD_JOINS_TOTAL,
        Unit::Count,
        "New conversations' first turns sent to a backend cluster busier than another \
         candidate because it holds their short system prompt, has a free slot, and keeps \
         shared heads (counted sticky in grid_route_prefix_affinity_total too)."
    );
    metrics::describe_counter!(
        SLOT_PASSED_OVER_TOTAL,
        Unit::Count,
        "Requests that left a backend cluster out because a slot there had just gone idle \
         (an answer ended within 500 ms) while another candidate had a free slot, on \
         engines not learned to keep shared heads: prompts too short to key, and new \
         conversations' first turns behind a short system prompt only it held."
    );
    metrics::describe_counter!(
        SLOT_HOLDS_TOTAL,
        Unit::Count,
        "New conversations and prompts too short to key held before they were sent to a \
         backend cluster where a slot had just gone idle (an answer ended under 100 ms \
         before), for the conversation answered there to reach its slot first."
    );
    metrics::describe_counter!(
        PASS_SPACINGS_TOTAL,
        Unit::Count,
        "Requests sent to a backend cluster of engines with slots up to 50 ms after the \
         one sent before them, still waiting for its first token, so that the engine \
         prefills the two in separate passes."
    );
    metrics::describe_gauge!(
        SHARED_HEAD_FOUND_SHARE,
        "Share of new conversations' first turns, sent to a backend cluster for a short \
         system prompt it held, whose answer found it cached, weighed by recency. Over one \
         half, new conversations may join a busier holder of their head with a free slot."
    );
    metrics::describe_histogram!(
        KEYING_SECONDS,
        Unit::Seconds,
        "Time to compute a request's prefix keys from its body."
    );
    metrics::describe_histogram!(
        KEYS_PER_REQUEST,
        Unit::Count,
        "Prefix keys computed per keyed request (at most 512)."
    );
    metrics::describe_gauge!(
        INDEX_ENTRIES,
        Unit::Count,
        "Confirmed prefix keys this replica remembers per backend cluster, expired ones \
         included until swept."
    );
    metrics::describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Each backend cluster's windowed worst queue depth (waiting requests); +Inf when \
         unmeasured."
    );
}

/// Sets `grid_route_queue_depth{site,cluster}` and `grid_route_index_entries{site,cluster}`
/// for every cluster of `view`, at `now`. Call it after each queue poll or before each
/// scrape.
pub fn record_grid_gauges(view: &GridView, index: &PrefixIndex, now: Instant) {
    for cluster in view.clusters() {
        let id = cluster.id();
        cluster_gauge(QUEUE_DEPTH, id).set(cluster.load().queue_depth(now));
        cluster_gauge(INDEX_ENTRIES, id).set(index.entries(id) as f64);
    }
}

/// The counter `name` of `cluster`, labelled `site` and `cluster` as every per-cluster
/// series is (the layers' and a gateway's own, such as the example's ejections).
pub fn cluster_counter(name: &'static str, cluster: &ClusterId) -> metrics::Counter {
    metrics::counter!(
        name,
        SITE_LABEL => Arc::clone(cluster.site().as_arc()),
        CLUSTER_LABEL => Arc::clone(cluster.name_arc())
    )
}

/// The gauge `name` of `cluster`, labelled as [`cluster_counter`] labels a counter.
pub fn cluster_gauge(name: &'static str, cluster: &ClusterId) -> metrics::Gauge {
    metrics::gauge!(
        name,
        SITE_LABEL => Arc::clone(cluster.site().as_arc()),
        CLUSTER_LABEL => Arc::clone(cluster.name_arc())
    )
}

/// Sets `grid_route_prefill_tokens_per_second{site,cluster}` and
/// `grid_route_queued_request_seconds{site,cluster}` of `cluster` to the prices `learned`
/// holds; a `None` leaves its gauge as it is.
pub fn record_learned_prices(cluster: &ClusterId, learned: Learned) {
    for (gauge, value) in [
        (PREFILL_TOKENS_PER_SECOND, learned.prefill_tokens_per_second),
        (QUEUED_REQUEST_SECONDS, learned.queued_request_seconds),
    ] {
        if let Some(value) = value {
            cluster_gauge(gauge, cluster).set(value);
        }
    }
}

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests {
    use metrics_util::MetricKind;

    use super::*;
    use crate::grid::{Grid, GridSettings};
    use crate::index::IndexSettings;
    use crate::test_support::{TestRecorder, grid_spec};

    #[test]
    fn grid_gauges_show_queue_depth_and_index_entries() {
        let grid = Grid::new(
            &grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]),
            GridSettings::default(),
        )
        .unwrap();
        let view = grid.view();
        let index = Arc::new(PrefixIndex::new(
            IndexSettings::default(),
            view.cluster_ids(),
        ));
        let now = Instant::now();
        let east = view.clusters()[0].id();
        index.confirm(east, &[1, 2, 3], now);
        view.clusters()[0]
            .load()
            .record_queue("http://east-a", Some(4.0), now);
        let recorder = TestRecorder::default();
        metrics::with_local_recorder(&recorder, || {
            describe_metrics();
            record_grid_gauges(&view, &index, now);
        });
        assert_eq!(
            recorder.gauge(QUEUE_DEPTH, "cluster=east-a,site=east"),
            Some(4.0)
        );
        assert_eq!(
            recorder.gauge(QUEUE_DEPTH, "cluster=west-a,site=west"),
            Some(f64::INFINITY)
        );
        assert_eq!(
            recorder.gauge(INDEX_ENTRIES, "cluster=east-a,site=east"),
            Some(3.0)
        );
        assert_eq!(
            recorder.gauge(INDEX_ENTRIES, "cluster=west-a,site=west"),
            Some(0.0)
        );
        let (kind, unit, help) = recorder.described(QUEUE_DEPTH).unwrap();
        assert_eq!((kind, unit), (MetricKind::Gauge, Some(Unit::Count)));
        assert!(help.unwrap().contains("worst queue depth"));
    }

    #[test]
    fn every_metric_is_described_as_the_kind_the_table_names() {
        // The module table, row by row: a counter described as a gauge would be exported
        // with the wrong TYPE line, and dashboards would rate() a gauge.
        let table = [
            (PREFIX_AFFINITY_TOTAL, MetricKind::Counter),
            (PIN_TOTAL, MetricKind::Counter),
            (DECISIONS_TOTAL, MetricKind::Counter),
            (PROMPT_TOKENS_TOTAL, MetricKind::Counter),
            (CACHED_PROMPT_TOKENS_TOTAL, MetricKind::Counter),
            (PREDICTED_CACHED_TOKENS_TOTAL, MetricKind::Counter),
            (DELIVERED_CACHED_TOKENS_TOTAL, MetricKind::Counter),
            (INDEX_FORGOTTEN_TOTAL, MetricKind::Counter),
            (PREFILL_TOKENS_PER_SECOND, MetricKind::Gauge),
            (QUEUED_REQUEST_SECONDS, MetricKind::Gauge),
            (SHARED_HEAD_JOINS_TOTAL, MetricKind::Counter),
            (SHARED_HEAD_FOUND_SHARE, MetricKind::Gauge),
            (SLOT_PASSED_OVER_TOTAL, MetricKind::Counter),
            (SLOT_HOLDS_TOTAL, MetricKind::Counter),
            (PASS_SPACINGS_TOTAL, MetricKind::Counter),
            (KEYING_SECONDS, MetricKind::Histogram),
            (KEYS_PER_REQUEST, MetricKind::Histogram),
            (INDEX_ENTRIES, MetricKind::Gauge),
            (QUEUE_DEPTH, MetricKind::Gauge),
        ];
        let recorder = TestRecorder::default();
        metrics::with_local_recorder(&recorder, || {
            describe_metrics();
            // A snapshot lists registered metrics only: register each as the table says.
            for (name, kind) in table {
                match kind {
                    MetricKind::Counter => metrics::counter!(name).increment(1),
                    MetricKind::Gauge => metrics::gauge!(name).set(1.0),
                    MetricKind::Histogram => metrics::histogram!(name).record(1.0),
                }
            }
        });
        for (name, kind) in table {
            let (described_as, _, help) = recorder.described(name).unwrap();
            assert_eq!(described_as, kind, "{name}");
            let help = help.unwrap_or_else(|| panic!("{name} is not described as a {kind:?}"));
            assert!(help.len() > 20, "{name}: {help:?}");
        }
        let (_, unit, _) = recorder.described(KEYING_SECONDS).unwrap();
        assert_eq!(unit, Some(Unit::Seconds));
    }
}
