//! Helpers shared by the unit tests: small grids, real prompt keys, a counting recorder.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

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

/// A recorder that keeps every counter and gauge by name and sorted labels, so tests can
/// read what the layers counted. Install it with `metrics::with_local_recorder`.
#[derive(Clone, Default)]
pub(crate) struct CountingRecorder {
    values: Arc<Mutex<BTreeMap<String, Arc<AtomicU64>>>>,
}

impl CountingRecorder {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.values.lock().unwrap().entry(name).or_default())
    }

    /// The counter `name` with `labels` (`"outcome=sticky"`, sorted, comma-separated); 0
    /// when never counted.
    pub(crate) fn counter(&self, name: &str, labels: &str) -> u64 {
        self.values
            .lock()
            .unwrap()
            .get(&format!("{name}{{{labels}}}"))
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }

    /// The sum of every series of the counter `name`.
    pub(crate) fn total(&self, name: &str) -> u64 {
        self.values
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| v.load(Ordering::Relaxed))
            .sum()
    }

    /// The gauge `name` with `labels`.
    pub(crate) fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        self.values
            .lock()
            .unwrap()
            .get(&format!("{name}{{{labels}}}"))
            .map(|v| f64::from_bits(v.load(Ordering::Relaxed)))
    }
}

impl Recorder for CountingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
