//! The queue signal: each endpoint's Prometheus `/metrics`, polled for its waiting-requests
//! gauge.
//!
//! Every `queue.poll_interval_ms` the poller reads `GET {endpoint}/metrics` of every
//! endpoint in the grid, at once, and records the gauge's value summed over its label sets
//! (vLLM reports one series per model, data-parallel engines one per engine) with
//! [`ClusterLoad::record_queue`]; the grid keeps the windowed worst. Which gauge: the one
//! `queue.metric` names, or by default the first of these the page serves, found anew on
//! every read, so one grid can mix engines and an engine replaced by another kind is read
//! right at the next poll:
//!
//! | engine | gauge |
//! |---|---|
//! | vLLM | `vllm:num_requests_waiting` |
//! | SGLang | `sglang:num_queue_reqs` |
//! | llama.cpp (`--metrics`) | `llamacpp:requests_deferred` |
//!
//! The gauge an endpoint is found serving is logged at `info` when it is first found,
//! changes, or is found again after the page was refused; an endpoint whose page serves
//! none of them is logged once at `warn` (until it serves one). An endpoint a reload
//! removed and a later one added back is new again.
//!
//! An endpoint whose page is llama.cpp's (it serves `llamacpp:requests_deferred`, found or
//! named) runs a few requests at once, one a slot. The poller reads how many from the
//! engine's `GET /props` (`total_slots`, its `--parallel`) when it first finds the page,
//! then every [`SLOTS_REFRESH`], and tells the cluster with
//! [`ClusterLoad::record_slots`]: while a cluster's slots are full its streams count whole
//! in its routing load, since a request sent there waits for one of them to end. What it
//! finds is logged at `info` when new or changed; a `/props` page that cannot be read or
//! does not say is logged at `warn` on the first read and when the slots it said before
//! are lost, and the endpoint counts as having no slots until a later read says (its
//! streams count at half, as on an engine that batches). An endpoint whose page stops
//! being llama.cpp's has no slots from that read on.
//!
//! Every read carries `Authorization: Bearer KEY` when `queue.api_key_path` names the
//! engines' API key: llama.cpp's server started with `--api-key` answers `/metrics` and
//! `/props` 401 without it.
//!
//! An endpoint whose metrics cannot be read — connection refused, over [`POLL_TIMEOUT`],
//! not 2xx, not UTF-8, over [`MAX_METRICS_BYTES`], or without the gauge — is recorded as
//! unmeasured (`None`), which makes its cluster's depth `+inf` once the window holds no
//! readable sample. An engine that answers the `/metrics` read with a status that is not
//! 2xx (401 for a missing or wrong API key, llama.cpp's 501 without `--metrics`, 503
//! while it loads) is logged at `warn` with the status, whether the key was sent, and
//! what to do: once, and again when it answers another status, after a read that finds a
//! sample (or a page without a known gauge), and after a reload. The other failures are
//! logged at `debug`, read after read. A successful read also marks
//! the endpoint healthy again (a failed connection marks it unhealthy, see
//! [`upstream`](super::upstream)); a failed read does not mark it unhealthy — unmeasured
//! is not down.
//!
//! [`ClusterLoad::record_queue`]: grid_route_layer::grid::ClusterLoad::record_queue
//! [`ClusterLoad::record_slots`]: grid_route_layer::grid::ClusterLoad::record_slots

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use grid_route_layer::grid::{Cluster, ClusterId, GridView};
use http::header::{ACCEPT, AUTHORIZATION};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Live;
use super::upstream::{HttpClient, send};
use crate::config::{KNOWN_QUEUE_METRICS, LLAMACPP_QUEUE_METRIC, PollCredential};

/// How long one read of an endpoint's metrics may take.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest metrics page read (vLLM's is some hundreds of KiB with histograms).
pub const MAX_METRICS_BYTES: usize = 8 * 1024 * 1024;
/// How often a llama.cpp endpoint's `/props` is read again for its slots (an engine
/// restarted with another `--parallel` is seen within this), and how long after a read
/// that failed the next one waits.
pub const SLOTS_REFRESH: Duration = Duration::from_secs(60);
/// The largest `/props` page read (llama.cpp's holds the chat template: some KiB).
pub const MAX_PROPS_BYTES: usize = 1024 * 1024;
/// How long the poller remembers that a reload removed an endpoint: longer than any read
/// of it that began before (its `/metrics`, then its `/props`, each within
/// [`POLL_TIMEOUT`]) can last.
const REMOVED_MEMORY: Duration = Duration::from_secs(4 * POLL_TIMEOUT.as_secs());

/// Polls every endpoint until `stop` turns true (or its sender is dropped).
///
/// Each endpoint's read runs on its own: every `queue.poll_interval_ms` a read starts for
/// each endpoint of the current grid whose previous read has ended, and each is recorded
/// when it ends. An endpoint whose page is slow (up to [`POLL_TIMEOUT`]) thus delays only
/// its own samples, never the other endpoints', whose windows would otherwise empty.
pub(crate) async fn poll_queues(live: Arc<Live>, mut stop: watch::Receiver<bool>) {
    let mut reads = JoinSet::new();
    // The endpoints being read, by cluster and URL.
    let mut reading: HashSet<(ClusterId, Arc<str>)> = HashSet::new();
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                let settings = live.settings.load_full();
                let page = PageRead {
                    metric: settings.config.queue_metric.clone(),
                    credential: settings.config.poll_credential.clone(),
                };
                start_reads(&live, &page, &mut reads, &mut reading);
                next = tokio::time::Instant::now() + settings.config.poll_interval;
            }
            Some(read) = reads.join_next() => {
                // A read task cannot panic short of a bug; its endpoint goes unrecorded
                // (and is read again once its entry is gone: see `start_reads`).
                if let Ok((cluster, url, read)) = read {
                    reading.remove(&(cluster.id().clone(), Arc::clone(&url)));
                    record_read(&live, &cluster, &url, read);
                }
            }
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// What every read of a poll asks for: the metric named, if any, and the credential.
#[derive(Clone)]
struct PageRead {
    metric: Option<Arc<str>>,
    credential: Option<PollCredential>,
}

/// Starts a read of every endpoint of the current grid that is not being read.
fn start_reads(
    live: &Live,
    page: &PageRead,
    reads: &mut JoinSet<(Arc<Cluster>, Arc<str>, EndpointRead)>,
    reading: &mut HashSet<(ClusterId, Arc<str>)>,
) {
    // A read whose task failed never removed its entry: none is running when the set is
    // empty, so forget them all then.
    if reads.is_empty() {
        reading.clear();
    }
    let view = live.grid.view();
    live.gauges.keep_endpoints_of(&view);
    let generation = view.generation();
    for cluster in view.clusters() {
        for url in cluster.endpoints() {
            if !reading.insert((cluster.id().clone(), Arc::clone(url))) {
                continue;
            }
            let client = live.engine.load().client.clone();
            let cluster: Arc<Cluster> = Arc::clone(cluster);
            let url = Arc::clone(url);
            let page = page.clone();
            let slots_due = live.gauges.slots_due(&url, Instant::now());
            reads.spawn(async move {
                let credential = page.credential.as_ref();
                let metric = page.metric.as_deref();
                let queue = read_queue(&client, &url, metric, credential).await;
                let slots = match queue.is_llama(metric) {
                    Some(true) if slots_due => {
                        SlotsRead::Read(read_slots(&client, &url, credential).await)
                    }
                    Some(false) => SlotsRead::NoSlots,
                    Some(true) | None => SlotsRead::NotDue,
                };
                let read = EndpointRead {
                    queue,
                    slots,
                    generation,
                };
                (cluster, url, read)
            });
        }
    }
}

/// What the last read of an endpoint's page found, by endpoint URL.
#[derive(Debug, Default)]
pub(crate) struct FoundGauges {
    found: Mutex<FoundByUrl>,
}

#[derive(Debug, Default)]
struct FoundByUrl {
    /// The generation of the grid whose endpoints `by_url` was last pruned to.
    pruned_to: Option<u64>,
    /// That grid's endpoints.
    configured: HashSet<Arc<str>>,
    /// Endpoints a reload removed, lately: the generation that removed each, and when it
    /// was pruned to (see [`FoundGauges::is_current`]).
    removed: HashMap<Arc<str>, (u64, Instant)>,
    by_url: HashMap<Arc<str>, Found>,
    /// Of llama.cpp endpoints: when `/props` was last read for their slots (what it said
    /// is the cluster's: `ClusterLoad::endpoint_slots`).
    slots_read: HashMap<Arc<str>, Instant>,
}

/// What one read of a page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// This known gauge.
    Gauge(&'static str),
    /// A page that serves none of the known gauges.
    None,
    /// A page the engine refused with this HTTP status, asked with the configured API key
    /// (`true`) or without one.
    Refused(StatusCode, bool),
}

impl FoundGauges {
    /// Records what a read of `url`'s page found, and logs it when it is new. Returns
    /// whether it was.
    fn record(&self, cluster: &Cluster, url: &Arc<str>, found: Found) -> bool {
        let previous = self
            .found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_url
            .insert(Arc::clone(url), found);
        if previous == Some(found) {
            return false;
        }
        match found {
            Found::Gauge(gauge) => {
                tracing::info!(cluster = %cluster.id(), endpoint = %url, gauge, "queue gauge found");
            }
            Found::None => tracing::warn!(
                cluster = %cluster.id(),
                endpoint = %url,
                looked_for = ?KNOWN_QUEUE_METRICS,
                "metrics page serves no known queue gauge; unmeasured (set queue.metric to name one)"
            ),
            Found::Refused(status, keyed) => tracing::warn!(
                cluster = %cluster.id(),
                endpoint = %url,
                status = status.as_u16(),
                keyed,
                hint = refusal_hint(status, keyed),
                "metrics page refused; unmeasured"
            ),
        }
        true
    }

    /// Whether a read of `url` that started under the grid of `generation` may write to
    /// the log's memory and log: no reload after that generation removed `url` (as
    /// [`keep_endpoints_of`](Self::keep_endpoints_of) found). A reload that kept the
    /// endpoint does not stop its read, however often reloads come.
    fn is_current(&self, url: &str, generation: u64) -> bool {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found
            .removed
            .get(url)
            .is_none_or(|&(removed_at, _)| generation >= removed_at)
    }

    /// Forgets that `url` refused its last logged read, if it did.
    fn forget_refusal(&self, url: &str) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(found.by_url.get(url), Some(Found::Refused(..))) {
            found.by_url.remove(url);
        }
    }

    /// Forgets the endpoints `view` no longer has (a reload removed them), so that one
    /// added again is logged again when its gauge is found. Does nothing for a grid
    /// generation it has already pruned to: the endpoints change only on a reload.
    fn keep_endpoints_of(&self, view: &GridView) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        if found.pruned_to == Some(view.generation()) {
            return;
        }
        let current: HashSet<Arc<str>> = view
            .clusters()
            .iter()
            .flat_map(|c| c.endpoints().iter().cloned())
            .collect();
        let now = Instant::now();
        let generation = view.generation();
        let gone: Vec<Arc<str>> = found.configured.difference(&current).cloned().collect();
        for url in gone {
            found.removed.insert(url, (generation, now));
        }
        // No read lasts longer than its two pages' timeouts: a mark older than that has
        // no read left to stop.
        found
            .removed
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < REMOVED_MEMORY);
        // A refusal is logged again after a reload: it may have brought the key (or a
        // new one) that the next read is refused with, which the old line's hint would
        // not say.
        found
            .by_url
            .retain(|url, found| current.contains(url) && !matches!(found, Found::Refused(..)));
        found.slots_read.retain(|url, _| current.contains(url));
        found.configured = current;
        found.pruned_to = Some(generation);
    }

    /// Whether a read of `url`'s page at `now` should also read its slots, if the page is
    /// llama.cpp's: never read, or last read [`SLOTS_REFRESH`] ago or more.
    fn slots_due(&self, url: &str, now: Instant) -> bool {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found
            .slots_read
            .get(url)
            .is_none_or(|at| now.saturating_duration_since(*at) >= SLOTS_REFRESH)
    }

    /// Whether `url`'s slots were never read since its page became llama.cpp's.
    fn never_read_slots(&self, url: &str) -> bool {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        !found.slots_read.contains_key(url)
    }

    /// Notes that `url`'s slots were read at `now`, or with `None` forgets when: its page
    /// is not llama.cpp's (any longer), so they are due as soon as it is again.
    fn slots_read(&self, url: &Arc<str>, now: Option<Instant>) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        match now {
            Some(now) => {
                found.slots_read.insert(Arc::clone(url), now);
            }
            None => {
                found.slots_read.remove(url);
            }
        }
    }
}

/// What an operator can do about an engine refusing its `/metrics` with `status`, asked
/// with the configured API key (`keyed`) or without one.
fn refusal_hint(status: StatusCode, keyed: bool) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN if keyed => {
            "the engine refused the key queue.api_key_path holds: is it one of its --api-key keys?"
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            "the engine wants its API key: name a file holding it as queue.api_key_path"
        }
        StatusCode::NOT_IMPLEMENTED => {
            "llama.cpp's server serves /metrics only when started with --metrics"
        }
        StatusCode::NOT_FOUND => {
            "no /metrics at this URL: check the endpoint's base URL (without /v1) and the \
             engine's metrics flag (SGLang: --enable-metrics)"
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            "the engine is loading its model or overloaded; it is read again every poll"
        }
        _ => "the engine's own log says why",
    }
}

/// Tells `cluster` what a read of `url`'s `/props` said of its slots, and logs it when it
/// differs from what the cluster had, or when the `first` read since the page became
/// llama.cpp's finds none. Returns whether it logged.
fn record_slots(cluster: &Cluster, url: &Arc<str>, slots: Option<usize>, first: bool) -> bool {
    let previous = cluster.load().endpoint_slots(url);
    cluster.load().record_slots(url, slots);
    if previous == slots && !(first && slots.is_none()) {
        return false;
    }
    if let Some(slots) = slots {
        tracing::info!(
            cluster = %cluster.id(),
            endpoint = %url,
            slots,
            "engine slots found: its streams count whole while they fill them"
        );
    } else {
        tracing::warn!(
            cluster = %cluster.id(),
            endpoint = %url,
            read_again_secs = SLOTS_REFRESH.as_secs(),
            "engine slots unknown: llama.cpp's /props unreadable or without total_slots; \
             its streams count at half, as on an engine that batches"
        );
    }
    true
}

/// Records what a read of `cluster`'s endpoint at `url` gave.
///
/// A read that began before a reload removed its endpoint ([`FoundGauges::is_current`])
/// gives its sample and slots to its cluster's load as usual (unused: the new grid does
/// not have the endpoint), but neither logs nor writes what it found to the log's
/// memory, where it would outlive the endpoint and keep the same endpoint, added again
/// by a later reload, from being logged.
fn record_read(live: &Live, cluster: &Cluster, url: &Arc<str>, read: EndpointRead) {
    let current = live.gauges.is_current(url, read.generation);
    match read.slots {
        SlotsRead::NotDue => {}
        SlotsRead::NoSlots => {
            if current {
                live.gauges.slots_read(url, None);
            }
            cluster.load().record_slots(url, None);
        }
        SlotsRead::Read(slots) if current => {
            let first = live.gauges.never_read_slots(url);
            live.gauges.slots_read(url, Some(Instant::now()));
            record_slots(cluster, url, slots, first);
        }
        // Unlogged: the endpoint is gone.
        SlotsRead::Read(slots) => {
            cluster.load().record_slots(url, slots);
        }
    }
    let (found, waiting) = match read.queue {
        Read::Unreadable => (None, None),
        Read::Sample(waiting) => (None, Some(waiting)),
        Read::Found(gauge, waiting) => (Some(Found::Gauge(gauge)), Some(waiting)),
        Read::NoKnownGauge => (Some(Found::None), None),
        Read::Refused(status, keyed) => (Some(Found::Refused(status, keyed)), None),
    };
    if current {
        match found {
            Some(found) => {
                live.gauges.record(cluster, url, found);
            }
            // A sample of the named metric has no gauge to log, but ends a refusal: the
            // next one is logged again.
            None if waiting.is_some() => live.gauges.forget_refusal(url),
            None => {}
        }
    }
    // Samples of endpoints that stay across a reload are shared with the new grid, so
    // recording on the view the read started from is recording on the live one.
    cluster.load().record_queue(url, waiting, Instant::now());
    if current
        && waiting.is_some()
        && cluster.load().endpoint_healthy(url) == Some(false)
        && !live.outliers.is_out(cluster.id(), url, Instant::now())
    {
        cluster.load().set_endpoint_healthy(url, true);
        tracing::info!(cluster = %cluster.id(), endpoint = %url, "endpoint metrics read again; healthy");
    }
}

/// What one poll of an endpoint read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointRead {
    queue: Read,
    slots: SlotsRead,
    /// The generation of the grid the read started under.
    generation: u64,
}

/// What one poll of an endpoint learnt of its slots.
#[derive(Debug, Clone, Copy)]
enum SlotsRead {
    /// Nothing: the page could not be read, or its slots were read lately.
    NotDue,
    /// The page is not llama.cpp's: no slots.
    NoSlots,
    /// What its `/props` said: `None` when it could not be read or did not say.
    Read(Option<usize>),
}

/// What one read of an endpoint's page gave.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// The page could not be read (no answer in time, too large, not UTF-8), or lacks
    /// the configured metric.
    Unreadable,
    /// The engine answered the read with this status, not a 2xx, asked with the
    /// configured API key (`true`) or without one.
    Refused(StatusCode, bool),
    /// The configured metric's value.
    Sample(f64),
    /// With no metric configured: the first known gauge the page serves, and its value.
    Found(&'static str, f64),
    /// With no metric configured: a page that serves none of the known gauges.
    NoKnownGauge,
}

impl Read {
    /// Whether the page read is llama.cpp's: it served [`LLAMACPP_QUEUE_METRIC`], found or named as
    /// `queue.metric`. `None` when the read says nothing of it (the page could not be
    /// read, or a metric of its own was named).
    fn is_llama(self, metric: Option<&str>) -> Option<bool> {
        match (self, metric) {
            (Self::Found(gauge, _), _) => Some(gauge == LLAMACPP_QUEUE_METRIC),
            (Self::NoKnownGauge, _) => Some(false),
            (Self::Sample(_), Some(LLAMACPP_QUEUE_METRIC)) => Some(true),
            (Self::Sample(_) | Self::Unreadable | Self::Refused(..), _) => None,
        }
    }
}

/// Reads `GET {base}/props` for llama.cpp's `total_slots`: `None` when the page cannot be
/// read (over [`POLL_TIMEOUT`], not 2xx, over [`MAX_PROPS_BYTES`], not JSON) or does not
/// hold a whole number from 1 to 65,536 there.
async fn read_slots(
    client: &HttpClient,
    base: &str,
    credential: Option<&PollCredential>,
) -> Option<usize> {
    let body = get_page(client, base, PROPS_PAGE, credential).await.ok()?;
    total_slots(&body)
}

/// One page the poller reads.
#[derive(Debug, Clone, Copy)]
struct Page {
    path: &'static str,
    accept: &'static str,
    max_bytes: usize,
}

/// The queue gauge's page.
const METRICS_PAGE: Page = Page {
    path: "/metrics",
    accept: "text/plain",
    max_bytes: MAX_METRICS_BYTES,
};

/// llama.cpp's page of its settings, slots among them.
const PROPS_PAGE: Page = Page {
    path: "/props",
    accept: "application/json",
    max_bytes: MAX_PROPS_BYTES,
};

/// The body of `GET {base}{path}`, whole, asked with `credential` when there is one.
/// `Err(Some(status))` when the engine answered with a status that is not 2xx;
/// `Err(None)` when no answer came within [`POLL_TIMEOUT`] or its body is over
/// `max_bytes`.
async fn get_page(
    client: &HttpClient,
    base: &str,
    page: Page,
    credential: Option<&PollCredential>,
) -> Result<bytes::Bytes, Option<StatusCode>> {
    let url = format!("{}{}", base.trim_end_matches('/'), page.path);
    let mut request = Request::get(url).header(ACCEPT, page.accept);
    if let Some(credential) = credential {
        request = request.header(AUTHORIZATION, credential.header_value().clone());
    }
    let request = request.body(Body::empty()).map_err(|_| None)?;
    let read = async {
        let response = send(client, request).await.map_err(|_| None)?;
        if !response.status().is_success() {
            return Err(Some(response.status()));
        }
        Ok(Limited::new(response.into_body(), page.max_bytes)
            .collect()
            .await
            .map_err(|_| None)?
            .to_bytes())
    };
    tokio::time::timeout(POLL_TIMEOUT, read)
        .await
        .unwrap_or(Err(None))
}

/// The `total_slots` of a llama.cpp `/props` page: a whole number from 1 to 65,536 (an
/// engine with more would not be one with a few slots); `None` otherwise.
///
/// ```
/// use grid_route_example::gateway::total_slots;
///
/// assert_eq!(total_slots(br#"{"total_slots": 4, "model_alias": "m"}"#), Some(4));
/// assert_eq!(total_slots(br#"{"total_slots": 0}"#), None);
/// assert_eq!(total_slots(br#"{"total_slots": "4"}"#), None);
/// assert_eq!(total_slots(b"not json"), None);
/// ```
pub fn total_slots(props: &[u8]) -> Option<usize> {
    #[derive(serde::Deserialize)]
    struct Props {
        total_slots: u64,
    }
    let props: Props = serde_json::from_slice(props).ok()?;
    (1..=65_536)
        .contains(&props.total_slots)
        .then(|| usize::try_from(props.total_slots).ok())
        .flatten()
}

/// Reads the endpoint's page for `metric`, or with `None` for the first of
/// [`KNOWN_QUEUE_METRICS`] it serves.
async fn read_queue(
    client: &HttpClient,
    base: &str,
    metric: Option<&str>,
    credential: Option<&PollCredential>,
) -> Read {
    let body = match get_page(client, base, METRICS_PAGE, credential).await {
        Ok(body) => Some(body),
        Err(Some(status)) => return Read::Refused(status, credential.is_some()),
        Err(None) => None,
    };
    let text = body
        .as_deref()
        .and_then(|body| std::str::from_utf8(body).ok());
    let read = match (text, metric) {
        (None, _) => Read::Unreadable,
        (Some(text), Some(metric)) => {
            queue_sample(text, metric).map_or(Read::Unreadable, Read::Sample)
        }
        (Some(text), None) => match known_queue_sample(text) {
            Some((gauge, waiting)) => Read::Found(gauge, waiting),
            None => Read::NoKnownGauge,
        },
    };
    if matches!(read, Read::Unreadable | Read::NoKnownGauge) {
        tracing::debug!(
            endpoint = base,
            metric = metric.unwrap_or("any known"),
            "queue metric unreadable; unmeasured"
        );
    }
    read
}

/// The first of [`KNOWN_QUEUE_METRICS`] that `text` serves with readable samples, and its
/// sum ([`queue_sample`]); `None` when it serves none of them.
///
/// ```
/// use grid_route_example::gateway::known_queue_sample;
///
/// let llama = "# TYPE llamacpp:requests_processing gauge\n\
///              llamacpp:requests_processing 2\n\
///              llamacpp:requests_deferred 3\n";
/// assert_eq!(known_queue_sample(llama), Some(("llamacpp:requests_deferred", 3.0)));
/// assert_eq!(known_queue_sample("sglang:num_queue_reqs{dp=\"0\"} 1\n"), Some(("sglang:num_queue_reqs", 1.0)));
/// assert_eq!(known_queue_sample("process_cpu_seconds_total 9\n"), None);
/// ```
pub fn known_queue_sample(text: &str) -> Option<(&'static str, f64)> {
    KNOWN_QUEUE_METRICS
        .into_iter()
        .find_map(|gauge| queue_sample(text, gauge).map(|waiting| (gauge, waiting)))
}

/// The sum of `metric`'s samples over all its label sets in a Prometheus text exposition
/// (format 0.0.4 or OpenMetrics); `None` when it has no sample or a sample of it cannot be
/// read.
///
/// Only series named exactly `metric` count (not `metric_bucket` or a longer name).
/// Label values may hold any character, escaped quotes and braces included. A sample's
/// optional timestamp is ignored.
///
/// ```
/// use grid_route_example::gateway::queue_sample;
///
/// let text = "# HELP vllm:num_requests_waiting Waiting.\n\
///             # TYPE vllm:num_requests_waiting gauge\n\
///             vllm:num_requests_waiting{model_name=\"a\"} 3.0\n\
///             vllm:num_requests_waiting{model_name=\"b\"} 4\n";
/// assert_eq!(queue_sample(text, "vllm:num_requests_waiting"), Some(7.0));
/// assert_eq!(queue_sample(text, "sglang:num_queue_reqs"), None);
/// ```
pub fn queue_sample(text: &str, metric: &str) -> Option<f64> {
    crate::prometheus::sum(text, metric, &[])
}

#[cfg(test)]
// Tests compare sums of small integers: exactly representable.
#[allow(clippy::float_cmp)]
mod tests {
    use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};

    use super::*;

    /// One site, `west`, of one cluster, `west-a`, serving `m` at `endpoints`.
    fn west_spec(endpoints: &[&str]) -> GridSpec {
        GridSpec::new([
            SiteSpec::new("west").with_clusters([ClusterSpec::new("west-a")
                .with_models(["m"])
                .with_endpoints(endpoints.iter().copied())]),
        ])
    }

    fn west_grid(endpoints: &[&str]) -> Grid {
        Grid::new(&west_spec(endpoints), GridSettings::default()).unwrap()
    }

    const VLLM: &str = "vllm:num_requests_waiting";

    #[test]
    fn samples_are_summed_over_label_sets() {
        let text = "\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 5.0
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 9.0
";
        assert_eq!(queue_sample(text, VLLM), Some(7.0));
    }

    #[test]
    fn a_series_without_labels_and_with_a_timestamp_is_read() {
        assert_eq!(
            queue_sample(
                "llamacpp:requests_deferred 3 1712345678000\n",
                "llamacpp:requests_deferred"
            ),
            Some(3.0)
        );
        assert_eq!(
            queue_sample("sglang:num_queue_reqs{} 1e1\n", "sglang:num_queue_reqs"),
            Some(10.0)
        );
    }

    #[test]
    fn only_the_exact_name_counts() {
        let text = "\
vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 40
vllm:num_requests_waiting_bucket{le=\"1\"} 50
xvllm:num_requests_waiting 60
vllm:num_requests_waiting 1
";
        assert_eq!(queue_sample(text, VLLM), Some(1.0));
    }

    #[test]
    fn label_values_may_hold_braces_quotes_and_spaces() {
        let text = r#"vllm:num_requests_waiting{model_name="a} \"b\" {c",x="\\"} 4"#;
        assert_eq!(queue_sample(text, VLLM), Some(4.0));
    }

    #[test]
    fn a_missing_metric_or_an_unreadable_sample_is_unmeasured() {
        assert_eq!(queue_sample("", VLLM), None);
        assert_eq!(
            queue_sample("# TYPE vllm:num_requests_waiting gauge\n", VLLM),
            None
        );
        assert_eq!(
            queue_sample("vllm:num_requests_waiting{a=\"1\" 3\n", VLLM),
            None
        );
        assert_eq!(queue_sample("vllm:num_requests_waiting lots\n", VLLM), None);
        assert_eq!(queue_sample("vllm:num_requests_waiting\n", VLLM), None);
        let mixed = "vllm:num_requests_waiting{m=\"a\"} 1\nvllm:num_requests_waiting{m=\"b\"} x\n";
        assert_eq!(queue_sample(mixed, VLLM), None);
    }

    #[test]
    fn prometheus_special_values_parse_and_leave_the_judgement_to_the_grid() {
        assert!(queue_sample("vllm:num_requests_waiting NaN\n", VLLM).is_some_and(f64::is_nan));
        assert_eq!(
            queue_sample("vllm:num_requests_waiting +Inf\n", VLLM),
            Some(f64::INFINITY)
        );
    }

    #[test]
    fn an_endpoint_removed_and_added_again_has_its_gauge_logged_again() {
        let both = west_grid(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let view = both.view();
        let cluster = &view.clusters()[0];
        let [one, two] = [0, 1].map(|i| Arc::clone(&cluster.endpoints()[i]));
        let gauges = FoundGauges::default();
        let llama = Found::Gauge("llamacpp:requests_deferred");
        assert!(gauges.record(cluster, &one, llama), "new: logged");
        assert!(gauges.record(cluster, &two, llama), "new: logged");
        assert!(
            !gauges.record(cluster, &one, llama),
            "the same again: quiet"
        );
        assert!(
            gauges.record(cluster, &one, Found::None),
            "a change: logged"
        );
        // A reload leaves only the second endpoint; the first comes back later.
        let reloaded = west_grid(&["http://127.0.0.1:2"]);
        reloaded
            .reconfigure(&west_spec(&["http://127.0.0.1:2"]), GridSettings::default())
            .unwrap();
        gauges.keep_endpoints_of(&view);
        assert!(
            gauges.is_current(&one, view.generation()),
            "nothing removed yet"
        );
        gauges.keep_endpoints_of(&reloaded.view());
        // A read of the first endpoint that began before the reload ends after it: it is
        // not written back (record_read asks is_current first). The second endpoint was
        // kept: its read counts.
        assert!(
            !gauges.is_current(&one, view.generation()),
            "removed since it began"
        );
        assert!(gauges.is_current(&two, view.generation()), "kept");
        assert!(gauges.is_current(&one, reloaded.view().generation()));
        assert!(!gauges.record(cluster, &two, llama), "kept: quiet");
        assert!(
            gauges.record(cluster, &one, llama),
            "forgotten: logged anew"
        );
    }

    #[test]
    fn a_refusal_is_logged_once_and_again_after_a_success_a_change_or_a_reload() {
        let grid = west_grid(&["http://127.0.0.1:1"]);
        let view = grid.view();
        let cluster = &view.clusters()[0];
        let url = Arc::clone(&cluster.endpoints()[0]);
        let gauges = FoundGauges::default();
        let unkeyed = Found::Refused(StatusCode::UNAUTHORIZED, false);
        let keyed = Found::Refused(StatusCode::UNAUTHORIZED, true);
        gauges.keep_endpoints_of(&view);
        assert!(gauges.record(cluster, &url, unkeyed), "new: logged");
        assert!(
            !gauges.record(cluster, &url, unkeyed),
            "the same again: quiet"
        );
        assert!(
            gauges.record(
                cluster,
                &url,
                Found::Refused(StatusCode::SERVICE_UNAVAILABLE, false)
            ),
            "another status: logged"
        );
        assert!(gauges.record(cluster, &url, unkeyed), "back: logged");
        // Read with a key now, refused all the same: a different line (its hint differs).
        assert!(
            gauges.record(cluster, &url, keyed),
            "refused with the key: logged"
        );
        // A read that finds the gauge ends the refusal; the next one is logged.
        let llama = Found::Gauge("llamacpp:requests_deferred");
        assert!(gauges.record(cluster, &url, llama), "found: logged");
        assert!(gauges.record(cluster, &url, keyed), "refused again: logged");
        // So does a sample of a named metric, which logs nothing itself.
        gauges.forget_refusal(&url);
        assert!(
            gauges.record(cluster, &url, keyed),
            "after a sample: logged"
        );
        // The same view again is no reload: still quiet.
        gauges.keep_endpoints_of(&view);
        assert!(!gauges.record(cluster, &url, keyed), "no reload: quiet");
        // A reload (a new generation, the endpoint kept) forgets the refusal, not a gauge.
        grid.reconfigure(&west_spec(&["http://127.0.0.1:1"]), GridSettings::default())
            .unwrap();
        gauges.keep_endpoints_of(&grid.view());
        assert!(
            gauges.record(cluster, &url, keyed),
            "after a reload: logged"
        );
        assert!(gauges.record(cluster, &url, llama), "found: logged");
        gauges.keep_endpoints_of(&grid.view());
        assert!(
            !gauges.record(cluster, &url, llama),
            "a gauge stays found: quiet"
        );
        // The hints say what to do in each case.
        assert!(refusal_hint(StatusCode::UNAUTHORIZED, false).contains("queue.api_key_path"));
        assert!(refusal_hint(StatusCode::FORBIDDEN, true).contains("refused the key"));
        assert!(refusal_hint(StatusCode::NOT_IMPLEMENTED, false).contains("--metrics"));
        assert!(refusal_hint(StatusCode::NOT_FOUND, false).contains("base URL"));
    }

    #[test]
    fn slots_are_logged_when_they_change_and_a_page_not_llamas_reads_them_at_once_again() {
        let grid = west_grid(&["http://127.0.0.1:1"]);
        let view = grid.view();
        let cluster = &view.clusters()[0];
        let url = Arc::clone(&cluster.endpoints()[0]);
        assert!(record_slots(cluster, &url, Some(2), true), "new: logged");
        assert_eq!(cluster.load().endpoint_slots(&url), Some(2));
        assert!(
            !record_slots(cluster, &url, Some(2), false),
            "the same again: quiet"
        );
        assert!(record_slots(cluster, &url, None, false), "lost: logged");
        assert_eq!(cluster.load().slots(), None);
        assert!(
            !record_slots(cluster, &url, None, false),
            "still unknown: quiet"
        );
        let other_grid = west_grid(&["http://127.0.0.1:2"]);
        let other_view = other_grid.view();
        let other = &other_view.clusters()[0];
        let other_url = Arc::clone(&other.endpoints()[0]);
        assert!(
            record_slots(other, &other_url, None, true),
            "unknown at the first read: logged"
        );

        let gauges = FoundGauges::default();
        let t0 = Instant::now();
        assert!(gauges.slots_due(&url, t0), "never read");
        assert!(gauges.never_read_slots(&url));
        gauges.slots_read(&url, Some(t0));
        assert!(!gauges.never_read_slots(&url));
        assert!(!gauges.slots_due(&url, t0 + SLOTS_REFRESH / 2));
        assert!(gauges.slots_due(&url, t0 + SLOTS_REFRESH));
        gauges.slots_read(&url, None);
        assert!(gauges.slots_due(&url, t0), "forgotten: due at once");
    }
}
