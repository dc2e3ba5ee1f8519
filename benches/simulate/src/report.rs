//! What a simulation found: one row per policy, as a table, JSON or an SVG chart.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::policy::Policy;
use super::trace::TraceRequest;

/// The whole result (`--json` prints it as one object).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The trace file, as given.
    pub trace: String,
    /// Requests in the trace.
    pub requests: usize,
    /// Conversations they make: named by the trace, or derived from its blocks
    /// ([`continued_of`](crate::trace::continued_of)).
    pub conversations: usize,
    /// Sites.
    pub sites: usize,
    /// Engines at each site.
    pub engines_per_site: usize,
    /// Gateway replicas.
    pub replicas: usize,
    /// Whether grid-route's replicas shared one index.
    pub shared_index: bool,
    /// The seed of every random draw.
    pub seed: u64,
    /// One entry per policy, in the order asked for.
    pub results: Vec<PolicyResult>,
}

/// One policy's outcome over the trace.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// The policy's name.
    pub policy: &'static str,
    /// Requests answered (refused ones, with `--fail-share`, are left out of every figure
    /// but the load spread).
    pub requests: usize,
    /// Prompt tokens found in the serving engine's cache over all prompt tokens.
    pub hit_share: f64,
    /// Prompt tokens the engine holding the most of each prompt would have served from
    /// cache had the request started there when it arrived, over all prompt tokens. Against
    /// `hit_share` it splits what a policy misses: a request sent elsewhere than its best
    /// engine, or a prompt no engine held any more because of where earlier requests went.
    pub held_anywhere_share: f64,
    /// Median time to first token, seconds.
    pub ttft_p50_s: f64,
    /// 90th percentile time to first token, seconds.
    pub ttft_p90_s: f64,
    /// 99th percentile time to first token, seconds.
    pub ttft_p99_s: f64,
    /// Requests of the busiest engine over the mean per engine.
    pub max_over_mean_requests: f64,
    /// Decisions by outcome (the policy's own names; empty when it has none).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Every time to first token, sorted (for the chart).
    #[serde(skip)]
    pub sorted_ttft: Vec<f64>,
}

/// Rounds to `digits` decimals, so the JSON reads well; the same on every run.
fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What happened to each request of a run, indexed by its position in the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct PerRequest {
    /// Seconds from arrival to first token.
    pub ttft: Vec<f64>,
    /// Prompt tokens found in the engine's cache.
    pub cached: Vec<u64>,
    /// Prompt tokens the engine holding the most of it would have served from cache, had
    /// it started there when it arrived.
    pub held_anywhere: Vec<u64>,
    /// The engine it was sent to.
    pub served_by: Vec<usize>,
    /// Whether the engine refused it (`--fail-share`).
    pub failed: Vec<bool>,
}

impl PerRequest {
    /// Nothing measured yet, for `requests` requests.
    pub fn new(requests: usize) -> Self {
        Self {
            ttft: vec![0.0; requests],
            cached: vec![0; requests],
            held_anywhere: vec![0; requests],
            served_by: vec![0; requests],
            failed: vec![false; requests],
        }
    }
}

impl PolicyResult {
    /// The result of `policy` over `trace` on `engines` engines.
    pub fn new(
        policy: Policy,
        trace: &[TraceRequest],
        per_request: &PerRequest,
        engines: usize,
        outcomes: BTreeMap<&'static str, u64>,
    ) -> Self {
        let PerRequest {
            ttft,
            cached,
            held_anywhere,
            served_by,
            failed,
        } = per_request;
        let answered = |i: &usize| !failed[*i];
        let indexes = || (0..trace.len()).filter(answered);
        let prompt: u64 = indexes().map(|i| trace[i].input_tokens).sum();
        let hit: u64 = indexes().map(|i| cached[i]).sum();
        let held: u64 = indexes().map(|i| held_anywhere[i]).sum();
        let mut sorted_ttft: Vec<f64> = indexes().map(|i| ttft[i]).collect();
        sorted_ttft.sort_by(f64::total_cmp);
        let mut per_engine = vec![0usize; engines];
        for &engine in served_by {
            per_engine[engine] += 1;
        }
        let max = per_engine.iter().copied().max().unwrap_or(0);
        let mean = trace.len() as f64 / engines as f64;
        Self {
            policy: policy.name(),
            requests: sorted_ttft.len(),
            hit_share: round(hit as f64 / prompt.max(1) as f64, 4),
            held_anywhere_share: round(held as f64 / prompt.max(1) as f64, 4),
            ttft_p50_s: round(percentile(&sorted_ttft, 0.50), 4),
            ttft_p90_s: round(percentile(&sorted_ttft, 0.90), 4),
            ttft_p99_s: round(percentile(&sorted_ttft, 0.99), 4),
            max_over_mean_requests: round(max as f64 / mean, 3),
            outcomes,
            sorted_ttft,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} requests in {} conversations, {} sites x {} engines, {} replica(s){}, seed {}",
            self.trace,
            self.requests,
            self.conversations,
            self.sites,
            self.engines_per_site,
            self.replicas,
            if self.shared_index {
                " sharing one index"
            } else {
                ""
            },
            self.seed
        )?;
        writeln!(
            f,
            "{:<12} {:>6} {:>9} {:>9} {:>9} {:>9}  outcomes",
            "policy", "hit", "ttft p50", "ttft p90", "ttft p99", "max/mean"
        )?;
        for r in &self.results {
            let outcomes: Vec<String> = r
                .outcomes
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(name, n)| format!("{name}={n}"))
                .collect();
            writeln!(
                f,
                "{:<12} {:>5.1}% {:>8.3}s {:>8.3}s {:>8.3}s {:>9.2}  {}",
                r.policy,
                r.hit_share * 100.0,
                r.ttft_p50_s,
                r.ttft_p90_s,
                r.ttft_p99_s,
                r.max_over_mean_requests,
                outcomes.join(" ")
            )?;
        }
        Ok(())
    }
}

/// Points of a CDF drawn per policy.
const CDF_POINTS: usize = 400;

impl Report {
    /// Writes an SVG chart: each policy's TTFT CDF on a log scale, its hit share in the
    /// legend.
    pub fn write_svg(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let floor = 0.01;
        let ceiling = self
            .results
            .iter()
            .filter_map(|r| r.sorted_ttft.last().copied())
            .fold(1.0f64, f64::max)
            * 1.1;
        let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!(
            "TTFT CDF: {} requests, {} sites x {} engines, {} replica(s){}",
            self.requests,
            self.sites,
            self.engines_per_site,
            self.replicas,
            if self.shared_index {
                ", shared index"
            } else {
                ""
            }
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((floor..ceiling).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("time to first token (s, log scale)")
            .y_desc("share of requests")
            .draw()?;
        for (i, r) in self.results.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let n = r.sorted_ttft.len();
            let points = (1..=CDF_POINTS).map(|k| {
                let rank = (k * n).div_ceil(CDF_POINTS).clamp(1, n.max(1));
                let ttft = r.sorted_ttft.get(rank - 1).copied().unwrap_or(floor);
                (ttft.max(floor), rank as f64 / n.max(1) as f64)
            });
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(format!(
                    "{} (hit {:.1}%, p90 {:.2}s)",
                    r.policy,
                    r.hit_share * 100.0,
                    r.ttft_p90_s
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}
