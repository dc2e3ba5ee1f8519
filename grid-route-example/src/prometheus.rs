//! Reading Prometheus text exposition (format 0.0.4, and the sample lines of OpenMetrics):
//! the one reader behind the gateway's queue poll ([`queue_sample`]), the demo's report
//! and the tests' scrapes of the admin port.
//!
//! It reads sample lines only: comments (`# HELP`, `# TYPE`) and blank lines are skipped,
//! and a sample's optional timestamp is ignored. Label values may hold any character,
//! escaped quotes and braces included; they are compared as written (escapes kept).
//! No crate on crates.io reads the exposition format without also owning a registry or
//! an HTTP client, so this is a small hand-written scanner.
//!
//! ```
//! use grid_route_example::prometheus::{samples, sum};
//!
//! let text = "# TYPE grid_route_pin_total counter\n\
//!             grid_route_pin_total{outcome=\"pinned\"} 3\n\
//!             grid_route_pin_total{outcome=\"gone\"} 1\n";
//! assert_eq!(sum(text, "grid_route_pin_total", &[]), Some(4.0));
//! assert_eq!(sum(text, "grid_route_pin_total", &[("outcome", "gone")]), Some(1.0));
//! let first = samples(text).next().unwrap().unwrap();
//! assert_eq!(first.label("outcome"), Some("pinned"));
//! ```
//!
//! [`queue_sample`]: crate::gateway::queue_sample

/// One sample line: its series name, its label set as written and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// The series name (a histogram's with its `_bucket`, `_sum` or `_count` suffix).
    pub name: &'a str,
    /// What stands between the braces, as written; `""` when the sample has no labels.
    pub labels: &'a str,
    /// The value (`NaN` and `±Inf` included).
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key` as written (escapes kept); `None` when the sample has no
    /// such label.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        label_pairs(self.labels)
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
    }

    /// Whether the sample carries every `(key, value)` pair of `labels`.
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(key, value)| self.label(key) == Some(*value))
    }
}

/// A line that is neither blank, nor a comment, nor a readable sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreadable<'a> {
    /// The series name the line starts with.
    pub name: &'a str,
}

/// The sample lines of `text`, in order.
pub fn samples(text: &str) -> impl Iterator<Item = Result<Sample<'_>, Unreadable<'_>>> {
    text.lines().filter_map(|line| {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_ascii_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        Some(sample(name, &line[name_end..]).ok_or(Unreadable { name }))
    })
}

/// The sum of the samples of series `name` that carry every pair of `labels`, over their
/// label sets; `None` when there is none, or when a line of `name` cannot be read (a
/// half-read exposition measures nothing).
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut total: Option<f64> = None;
    for line in samples(text) {
        match line {
            Ok(sample) if sample.name == name && sample.has_labels(labels) => {
                total = Some(total.unwrap_or(0.0) + sample.value);
            }
            Err(unreadable) if unreadable.name == name => return None,
            _ => {}
        }
    }
    total
}

/// The sum of the samples matching `series`, written as a sample line starts: a name
/// (`grid_route_errors_total`) or a name and labels
/// (`grid_route_pin_total{outcome="pinned"}`), which a sample must carry (and may carry
/// more); `None` as for [`sum`], or when `series` itself cannot be read.
///
/// ```
/// use grid_route_example::prometheus::series;
///
/// let text = "q{site=\"east\",cluster=\"east-a\"} 2\nq{site=\"west\",cluster=\"west-a\"} 5\n";
/// assert_eq!(series(text, r#"q{cluster="west-a"}"#), Some(5.0));
/// assert_eq!(series(text, "q"), Some(7.0));
/// ```
pub fn series(text: &str, series: &str) -> Option<f64> {
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => {
            let close = closing(rest, '}')?;
            (name, &rest[..close])
        }
        None => (series, ""),
    };
    let labels: Vec<(&str, &str)> = label_pairs(labels).collect();
    sum(text, name.trim(), &labels)
}

/// The sample whose name ended just before `rest` (which starts at `{` or a space).
fn sample<'a>(name: &'a str, rest: &'a str) -> Option<Sample<'a>> {
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inside) => {
            let close = closing(inside, '}')?;
            (&inside[..close], &inside[close + 1..])
        }
        None => ("", rest),
    };
    let value = rest.split_ascii_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The byte offset of the first `end` in `text` outside a quoted label value.
fn closing(text: &str, end: char) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == end && !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The `key="value"` pairs of a label set, values as written.
fn label_pairs(labels: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = labels;
    std::iter::from_fn(move || {
        let pair = rest.trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace());
        let (key, value) = pair.split_once('=')?;
        let value = value.trim_start().strip_prefix('"')?;
        // The value ends at the first quote that no backslash escapes.
        let mut escaped = false;
        let end = value.char_indices().find_map(|(i, c)| match c {
            _ if escaped => {
                escaped = false;
                None
            }
            '\\' => {
                escaped = true;
                None
            }
            '"' => Some(i),
            _ => None,
        })?;
        rest = &value[end + 1..];
        Some((key.trim(), &value[..end]))
    })
}

#[cfg(test)]
// Tests compare sums of small integers: exactly representable.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_read_whatever_their_values_hold() {
        let text = "m{a=\"x,y=\\\"z\\\"}\",b=\"2\"} 5\n";
        let sample = samples(text).next().unwrap().unwrap();
        assert_eq!(sample.label("a"), Some("x,y=\\\"z\\\"}"));
        assert_eq!(sample.label("b"), Some("2"));
        assert_eq!(sample.label("c"), None);
        assert!(sample.has_labels(&[("b", "2")]));
        assert!(!sample.has_labels(&[("b", "3")]));
    }

    #[test]
    fn a_label_filter_picks_the_matching_series_only() {
        let text = "t{site=\"a\",cluster=\"a-1\"} 2\nt{site=\"b\",cluster=\"b-1\"} 7\nt_count 1\n";
        assert_eq!(sum(text, "t", &[("site", "b")]), Some(7.0));
        assert_eq!(sum(text, "t", &[("site", "c")]), None);
        assert_eq!(sum(text, "t", &[]), Some(9.0));
    }

    #[test]
    fn an_unreadable_line_spoils_only_its_own_series() {
        let text = "a{x=\"1\" 3\nb 4\n";
        assert_eq!(sum(text, "a", &[]), None);
        assert_eq!(sum(text, "b", &[]), Some(4.0));
        assert_eq!(samples(text).next(), Some(Err(Unreadable { name: "a" })));
    }
}
