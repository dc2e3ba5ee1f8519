//! `GET /metrics`: the engine's load in vLLM's Prometheus names.
//!
//! The gauges are per served model (`model_name` label, integer values): a gateway polls
//! `vllm:num_requests_waiting` as its queue signal. The token counters cover all models.

use std::fmt::Write;

use super::engine::Engine;

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the engine's metrics in the Prometheus text format.
pub(crate) fn render(engine: &Engine) -> String {
    let report = engine.load_report();
    let (cached_blocks, capacity_blocks) = engine.cache_occupancy();
    let mut out = String::new();
    // Writing into a String cannot fail.
    let mut gauge = |name: &str, help: &str, value: &dyn Fn(u64, u64) -> String| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for &(model, waiting, running) in &report {
            let model = label(model);
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{model}\"}} {}",
                value(waiting, running)
            );
        }
    };
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &|_, running| running.to_string(),
    );
    gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &|waiting, _| waiting.to_string(),
    );
    let usage = if capacity_blocks == 0 {
        0.0
    } else {
        cached_blocks as f64 / capacity_blocks as f64
    };
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &|_, _| usage.to_string(),
    );
    let (prompt, cached, generated) = engine.token_totals();
    for (name, help, value) in [
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            prompt,
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            generated,
        ),
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            prompt,
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            cached,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}_total {value}"
        );
    }
    out
}
