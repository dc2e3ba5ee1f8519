//! The gateway's metrics do not grow with traffic when nobody scrapes `/metrics`.
//!
//! The Prometheus exporter keeps each histogram sample until upkeep folds it into its
//! summary. `scripts/load-check` found the gateway's RSS growing by about 35 bytes a
//! request while upkeep ran only on scrapes; the gateway now runs it on a timer. This
//! binary holds one test so that no other test's allocations are counted.

use std::time::{Duration, Instant};

use grid_route_example::config::GatewayConfig;
use grid_route_example::gateway::{Gateway, METRICS_UPKEEP_INTERVAL};
use grid_route_layer::metrics::KEYING_SECONDS;
use grid_route_tests::counting_alloc::{CountingAllocator, live_bytes};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const SAMPLES: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histogram_samples_are_folded_without_scrapes() {
    let config = GatewayConfig::from_yaml(
        "
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
sites:
  - name: east
    clusters:
      - { name: east-a, models: [demo-model], endpoints: [http://127.0.0.1:9] }
",
    )
    .expect("a valid config");
    // Starting a gateway installs the process's recorder, which the samples go to.
    let gateway = Gateway::start(config).await.expect("the gateway starts");
    let histogram = metrics::histogram!(KEYING_SECONDS);

    let before = live_bytes();
    for i in 0..SAMPLES {
        histogram.record(i as f64 * 1e-9);
    }
    let grown = live_bytes().saturating_sub(before);
    assert!(grown > SAMPLES, "{SAMPLES} samples held {grown} bytes");

    // Freed blocks are reclaimed when the exporter's epoch advances, which later samples
    // (the traffic a real gateway keeps serving) drive.
    let deadline = Instant::now() + METRICS_UPKEEP_INTERVAL * 3;
    let mut held = grown;
    while Instant::now() < deadline {
        for _ in 0..100 {
            histogram.record(1e-6);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        held = live_bytes().saturating_sub(before);
        if held < grown / 4 {
            break;
        }
    }
    assert!(
        held < grown / 4,
        "{grown} bytes after {SAMPLES} samples, still {held} after {:?}",
        METRICS_UPKEEP_INTERVAL * 3
    );
    gateway.shutdown().await.expect("the gateway stops");
}
