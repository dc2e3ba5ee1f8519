//! The queue metric parser (`gateway::queue_sample`) on Prometheus text.
//!
//! Holds:
//! - exposition text written from samples (any label values, escaped as the format says,
//!   any value, with or without a timestamp, among `# HELP`/`# TYPE` lines and other
//!   series) reads back as the sum of the metric's values, exactly;
//! - on any text: no panic, and a comment line before it or another series after it
//!   changes nothing.
#![no_main]

use std::fmt::Write;

use arbitrary::Arbitrary;
use grid_route_example::config::{LLAMACPP_QUEUE_METRIC, SGLANG_QUEUE_METRIC, VLLM_QUEUE_METRIC};
use grid_route_example::gateway::queue_sample;
use libfuzzer_sys::fuzz_target;

const METRICS: [&str; 3] = [
    VLLM_QUEUE_METRIC,
    SGLANG_QUEUE_METRIC,
    LLAMACPP_QUEUE_METRIC,
];

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    metric: u8,
    samples: Vec<Sample<'a>>,
    /// Lines of other series, each written before the sample of the same index.
    others: Vec<&'a str>,
    raw: &'a str,
}

#[derive(Arbitrary, Debug)]
struct Sample<'a> {
    /// `None`: no braces; `Some(vec![])`: `{}`.
    labels: Option<Vec<&'a str>>,
    value: f64,
    timestamp: Option<i64>,
    crlf: bool,
}

fuzz_target!(|input: Input<'_>| {
    let metric = METRICS[usize::from(input.metric) % METRICS.len()];

    let mut text = format!("# HELP {metric} Waiting requests.\n# TYPE {metric} gauge\n");
    let mut expected: Option<f64> = None;
    for (i, sample) in input.samples.iter().enumerate() {
        if let Some(other) = input.others.get(i) {
            // A name no queue metric has (they do not start with `x`), on one line.
            let other = other.replace(['\n', '\r'], " ");
            let _ = writeln!(text, "x{other}");
        }
        text.push_str(metric);
        if let Some(labels) = &sample.labels {
            text.push('{');
            for (n, value) in labels.iter().enumerate() {
                let escaped = value
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(text, "{}l{n}=\"{escaped}\"", if n > 0 { "," } else { "" });
            }
            text.push('}');
        }
        let value = match sample.value {
            v if v.is_nan() => "NaN".to_owned(),
            v if v == f64::INFINITY => "+Inf".to_owned(),
            v if v == f64::NEG_INFINITY => "-Inf".to_owned(),
            v => format!("{v:?}"),
        };
        let _ = write!(text, " {value}");
        if let Some(ts) = sample.timestamp {
            let _ = write!(text, " {ts}");
        }
        text.push_str(if sample.crlf { "\r\n" } else { "\n" });
        expected = Some(expected.unwrap_or(0.0) + sample.value);
    }
    let read = queue_sample(&text, metric);
    assert!(same(read, expected), "read {read:?}, wrote {expected:?}");

    let raw = queue_sample(input.raw, metric);
    let commented = queue_sample(&format!("# TYPE {metric} gauge\n{}", input.raw), metric);
    let followed = queue_sample(&format!("{}\nxother_series 5\n", input.raw), metric);
    assert!(same(raw, commented) && same(raw, followed));
});

/// Equal, NaN included.
fn same(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
        (None, None) => true,
        _ => false,
    }
}
