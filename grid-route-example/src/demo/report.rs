//! What a run measured, and the table that compares the two runs.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use grid_route_layer::affinity::Outcome;
use grid_route_layer::metrics::PREFIX_AFFINITY_TOTAL;

/// What one run measured. See the [module docs](super#reading-the-table).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RunReport {
    /// Whether prefix affinity was on.
    pub affinity: bool,
    /// Requests sent to the gateway (every turn, and each `POST /v1/conversations`).
    pub requests: u64,
    /// Of those, answered 2xx (a stream only when it also ended and reported usage).
    pub requests_ok: u64,
    /// Prompt tokens the engines reported (`usage.prompt_tokens`, or `input_tokens` for
    /// Responses), summed over the answers.
    pub prompt_tokens: u64,
    /// Of those, read from the engines' prefix caches
    /// (`usage.prompt_tokens_details.cached_tokens`, `input_tokens_details.cached_tokens`).
    pub cached_tokens: u64,
    /// Time to first token of each streamed chat request that got one, ascending.
    pub ttft: Vec<Duration>,
    /// Requests answered per site, in the sites' order (every site listed).
    pub requests_per_site: Vec<(String, u64)>,
    /// `grid_route_prefix_affinity_total` counted during the run, per outcome, in
    /// [`Outcome::ALL`] order.
    pub affinity_outcomes: Vec<(String, u64)>,
    /// Requests that named a stored response (`previous_response_id`) or conversation
    /// (`conversation`): pinned to one cluster.
    pub pinned_follow_ups: u64,
    /// Of those, answered 2xx.
    pub pinned_follow_ups_ok: u64,
    /// How long the replay took.
    pub elapsed: Duration,
    /// The first few failures, for the error message.
    pub failures: Vec<String>,
}

impl RunReport {
    /// Cached prompt tokens over all prompt tokens (0 when nothing was answered).
    pub fn cache_hit_share(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_tokens as f64 / self.prompt_tokens as f64
        }
    }

    /// The median time to first token.
    pub fn ttft_p50(&self) -> Option<Duration> {
        percentile(&self.ttft, 0.50)
    }

    /// The 99th percentile time to first token.
    pub fn ttft_p99(&self) -> Option<Duration> {
        percentile(&self.ttft, 0.99)
    }

    /// Whether every request, pinned follow-ups included, was answered 2xx.
    pub fn all_ok(&self) -> bool {
        self.requests_ok == self.requests && self.pinned_follow_ups_ok == self.pinned_follow_ups
    }

    /// The count of affinity `outcome` during the run.
    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.affinity_outcomes
            .iter()
            .find(|(name, _)| name == outcome.as_str())
            .map_or(0, |(_, count)| *count)
    }
}

/// Nearest-rank percentile of ascending `sorted`.
fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// The two runs, printed as the demo's table by `Display`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DemoReport {
    /// The run with prefix affinity on.
    pub affinity_on: RunReport,
    /// The same workload with prefix affinity off (routing on queue depth alone).
    pub affinity_off: RunReport,
}

/// The row labels of the table, in order (the per-site and per-outcome rows carry the
/// site or outcome after the prefix).
pub const TABLE_ROWS: [&str; 8] = [
    "requests answered 2xx",
    "cache-hit share of prompt tokens",
    "TTFT p50",
    "TTFT p99",
    "requests to ",
    "affinity ",
    "pinned follow-ups answered 2xx",
    "replay time",
];

/// The line printed under the table.
pub const TABLE_LEGEND: &str = "Cache hits skip prefill, so a higher hit share gives a lower TTFT; affinity off routes on load alone.";

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = [&self.affinity_on, &self.affinity_off];
        let mut rows: Vec<(String, [String; 2])> = Vec::new();
        let mut row = |label: String, cell: &dyn Fn(&RunReport) -> String| {
            rows.push((label, runs.map(cell)));
        };
        row(TABLE_ROWS[0].to_owned(), &|r| {
            format!("{}/{}", r.requests_ok, r.requests)
        });
        row(TABLE_ROWS[1].to_owned(), &|r| {
            format!("{:.1}%", r.cache_hit_share() * 100.0)
        });
        row(TABLE_ROWS[2].to_owned(), &|r| millis(r.ttft_p50()));
        row(TABLE_ROWS[3].to_owned(), &|r| millis(r.ttft_p99()));
        for (site, _) in &self.affinity_on.requests_per_site {
            row(format!("{}{site}", TABLE_ROWS[4]), &|r| {
                let count = r
                    .requests_per_site
                    .iter()
                    .find(|(s, _)| s == site)
                    .map_or(0, |(_, n)| *n);
                count.to_string()
            });
        }
        for outcome in Outcome::ALL {
            row(format!("{}{}", TABLE_ROWS[5], outcome.as_str()), &|r| {
                r.outcome(outcome).to_string()
            });
        }
        row(TABLE_ROWS[6].to_owned(), &|r| {
            format!("{}/{}", r.pinned_follow_ups_ok, r.pinned_follow_ups)
        });
        row(TABLE_ROWS[7].to_owned(), &|r| {
            format!("{:.1} s", r.elapsed.as_secs_f64())
        });

        let headers = ["affinity on", "affinity off"];
        let label_width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
        let width = |i: usize| {
            rows.iter()
                .map(|(_, cells)| cells[i].len())
                .chain([headers[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths = [width(0), width(1)];
        writeln!(
            f,
            "{:label_width$}  {:>w0$}  {:>w1$}",
            "",
            headers[0],
            headers[1],
            w0 = widths[0],
            w1 = widths[1]
        )?;
        for (label, cells) in &rows {
            writeln!(
                f,
                "{label:label_width$}  {:>w0$}  {:>w1$}",
                cells[0],
                cells[1],
                w0 = widths[0],
                w1 = widths[1]
            )?;
        }
        writeln!(f)?;
        writeln!(f, "{TABLE_LEGEND}")
    }
}

fn millis(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()))
}

/// `grid_route_prefix_affinity_total` per outcome, read from Prometheus text.
pub(crate) fn affinity_counts(metrics_text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for sample in crate::prometheus::samples(metrics_text).flatten() {
        if sample.name == PREFIX_AFFINITY_TOTAL
            && let Some(outcome) = sample.label("outcome")
        {
            *counts.entry(outcome.to_owned()).or_default() += sample.value as u64;
        }
    }
    counts
}

/// Each outcome's count in `after` minus `before` (the recorder is process-wide, so a
/// run's own decisions are the difference of two scrapes).
pub(crate) fn outcome_difference(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    Outcome::ALL
        .iter()
        .map(|outcome| {
            let name = outcome.as_str();
            let count = |counts: &BTreeMap<String, u64>| counts.get(name).copied().unwrap_or(0);
            (name.to_owned(), count(after).saturating_sub(count(before)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms = |n| Duration::from_millis(n);
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 0.5), Some(ms(50)));
        assert_eq!(percentile(&sorted, 0.99), Some(ms(99)));
        assert_eq!(percentile(&[ms(7)], 0.99), Some(ms(7)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn affinity_counts_are_read_from_prometheus_text_and_diffed() {
        let before = affinity_counts(
            "# HELP grid_route_prefix_affinity_total x\n\
             grid_route_prefix_affinity_total{outcome=\"sticky\"} 3\n\
             grid_route_prefix_affinity_total{outcome=\"no_match\"} 1\n",
        );
        let after = affinity_counts(
            "grid_route_prefix_affinity_total{outcome=\"sticky\"} 10\n\
             grid_route_prefix_affinity_total{outcome=\"no_match\"} 1\n\
             grid_route_prefix_affinity_total{outcome=\"load_override\"} 2\n\
             grid_route_pin_total{outcome=\"pinned\"} 9\n",
        );
        let diff = outcome_difference(&before, &after);
        let get = |name: &str| diff.iter().find(|(n, _)| n == name).map(|(_, c)| *c);
        assert_eq!(get("sticky"), Some(7));
        assert_eq!(get("no_match"), Some(0));
        assert_eq!(get("load_override"), Some(2));
        assert_eq!(get("exploration"), Some(0));
        assert_eq!(diff.len(), Outcome::ALL.len());
    }

    #[test]
    fn the_table_has_a_row_for_every_measure_and_a_column_per_run() {
        let run = |affinity| RunReport {
            affinity,
            requests: 10,
            requests_ok: 10,
            prompt_tokens: 1000,
            cached_tokens: if affinity { 800 } else { 300 },
            ttft: vec![Duration::from_millis(40), Duration::from_millis(90)],
            requests_per_site: vec![("us-east".into(), 6), ("eu-west".into(), 4)],
            affinity_outcomes: outcome_difference(&BTreeMap::new(), &BTreeMap::new()),
            pinned_follow_ups: 2,
            pinned_follow_ups_ok: 2,
            elapsed: Duration::from_millis(1500),
            failures: Vec::new(),
        };
        let table = DemoReport {
            affinity_on: run(true),
            affinity_off: run(false),
        }
        .to_string();
        for label in TABLE_ROWS {
            assert!(table.contains(label), "{label:?} in\n{table}");
        }
        assert!(
            table.contains("80.0%") && table.contains("30.0%"),
            "{table}"
        );
        assert!(table.contains("requests to eu-west"), "{table}");
        assert!(table.contains("affinity load_override"), "{table}");
        assert!(
            table.contains("TTFT p99") && table.contains("90 ms"),
            "{table}"
        );
        let lines: Vec<&str> = table.lines().collect();
        let width = lines[0].len();
        assert!(
            lines[..lines.len() - 2].iter().all(|l| l.len() == width),
            "aligned:\n{table}"
        );
    }
}
