//! Helpers shared by the unit tests: small grids, a counting recorder.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

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
