//! Helpers shared by the unit tests: small grids, real prompt keys, a metrics recorder.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use crate::grid::{ClusterSpec, GridSpec, SiteSpec};
use crate::keying::{Api, KeySeed, key_body};
use crate::route::Prompt;

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

/// `bytes` of ASCII text that differs by `topic`.
pub(crate) fn text(topic: &str, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut i = 0u64;
    while text.len() < bytes {
        write!(text, "{topic} rule {i}: answer precisely. ").unwrap();
        i += 1;
    }
    text.truncate(bytes);
    text
}

/// A Chat Completions body for [`MODEL`] with these `(role, content)` messages.
pub(crate) fn chat(messages: &[(&str, &str)]) -> Vec<u8> {
    let messages: Vec<_> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"model": MODEL, "messages": messages})).unwrap()
}

/// Polls `future` once with a waker that does nothing: tests drive mock services by hand.
pub(crate) fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Keys `body` as Chat Completions under `seed`.
pub(crate) fn prompt_of(seed: &KeySeed, body: &[u8]) -> Prompt {
    key_body(seed, Api::ChatCompletions, body).unwrap()
}

/// The test recorder: metrics-util's [`DebuggingRecorder`], read back by name and sorted
/// labels, with each metric's kind and help text. Install it with
/// `metrics::with_local_recorder`.
#[derive(Default)]
pub(crate) struct TestRecorder {
    recorder: DebuggingRecorder,
}

/// One recorded metric as a test reads it.
struct Recorded {
    kind: MetricKind,
    /// `name{label=value,...}`, labels sorted.
    series: String,
    name: String,
    unit: Option<Unit>,
    help: Option<String>,
    value: DebugValue,
}

impl TestRecorder {
    /// Every registered metric, now. A debugging snapshot drains what it reads (counters
    /// and gauges to zero, histograms empty), so the values are written back: a test may
    /// read as often as it likes and always sees totals since the recorder was made.
    fn read(&self) -> Vec<Recorded> {
        let metadata = Metadata::new(module_path!(), Level::TRACE, None);
        let snapshot = self.recorder.snapshotter().snapshot().into_vec();
        snapshot
            .into_iter()
            .map(|(key, unit, help, value)| {
                let (kind, key) = key.into_parts();
                match &value {
                    DebugValue::Counter(n) => {
                        self.recorder
                            .register_counter(&key, &metadata)
                            .increment(*n);
                    }
                    DebugValue::Gauge(v) => self.recorder.register_gauge(&key, &metadata).set(v.0),
                    DebugValue::Histogram(values) => {
                        let histogram = self.recorder.register_histogram(&key, &metadata);
                        for v in values {
                            histogram.record(v.0);
                        }
                    }
                }
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                Recorded {
                    kind,
                    series: format!("{}{{{}}}", key.name(), labels.join(",")),
                    name: key.name().to_owned(),
                    unit,
                    help: help.map(SharedString::into_owned),
                    value,
                }
            })
            .collect()
    }

    /// The counter `name` with `labels` (`"outcome=sticky"`, sorted, comma-separated); 0
    /// when never counted.
    pub(crate) fn counter(&self, name: &str, labels: &str) -> u64 {
        let series = format!("{name}{{{labels}}}");
        self.read()
            .iter()
            .find_map(|m| match m.value {
                DebugValue::Counter(n) if m.series == series => Some(n),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The sum of every series of the counter `name`.
    pub(crate) fn total(&self, name: &str) -> u64 {
        self.read()
            .iter()
            .filter_map(|m| match m.value {
                DebugValue::Counter(n) if m.name == name => Some(n),
                _ => None,
            })
            .sum()
    }

    /// The gauge `name` with `labels`.
    pub(crate) fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        let series = format!("{name}{{{labels}}}");
        self.read().iter().find_map(|m| match &m.value {
            DebugValue::Gauge(v) if m.series == series => Some(v.0),
            _ => None,
        })
    }

    /// How the metric `name` was registered and described: its kind, unit and help text
    /// (`None` when it was never registered).
    pub(crate) fn described(
        &self,
        name: &str,
    ) -> Option<(MetricKind, Option<Unit>, Option<String>)> {
        self.read()
            .into_iter()
            .find(|m| m.name == name)
            .map(|m| (m.kind, m.unit, m.help))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_counter(key, unit, help);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_gauge(key, unit, help);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_histogram(key, unit, help);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.recorder.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.recorder.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.recorder.register_histogram(key, metadata)
    }
}
