//! The docs name only what exists: every metric they mention is one the library or the
//! gateway declares, every config field they mention is one the config file takes, every
//! command they show names a script, a crate, a subcommand or a test target that is there;
//! and the other way round, the config reference lists every field and the operations
//! page every metric. A section another file points to by name (`BENCHMARKS.md
//! ("Arena")`) is there. BENCHMARKS.md describes exactly the routers `scripts/arena` takes
//! and runs each bench with the flags `scripts/bench-results` uses. The README stays short
//! and the request-path diagram has one home.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeSet;

use grid_route_example::config::GatewayConfig;
use grid_route_tests::workspace_root;

/// Every Markdown page a user reads.
const PAGES: [&str; 8] = [
    "README.md",
    "BENCHMARKS.md",
    "RELIABILITY.md",
    "docs/architecture.md",
    "docs/configuration.md",
    "docs/operations.md",
    "docs/routing.md",
    "docs/traces/README.md",
];

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text between backticks in `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The metric names a source file declares: `pub const NAME: &str = "grid_…";`.
fn declared_metrics(path: &str) -> BTreeSet<String> {
    read(path)
        .lines()
        .filter_map(|line| {
            let value = line
                .trim()
                .strip_prefix("pub const ")?
                .split_once("&str = \"")?
                .1;
            let name = value.strip_suffix("\";")?;
            name.starts_with("grid_").then(|| name.to_owned())
        })
        .collect()
}

fn known_metrics() -> BTreeSet<String> {
    let mut known = declared_metrics("grid-route-layer/src/metrics.rs");
    known.extend(declared_metrics(
        "grid-route-example/src/gateway/telemetry.rs",
    ));
    assert!(known.len() > 15, "{known:?}");
    known
}

/// Metric-shaped words of `text`: `grid_route_…` and `grid_serving_…`.
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for prefix in ["grid_route_", "grid_serving_"] {
        for (at, _) in text.match_indices(prefix) {
            if text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue; // part of a longer word (a crate path, `grid_route_layer`)
            }
            let word: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            words.insert(word);
        }
    }
    words
}

#[test]
fn every_metric_the_docs_name_exists_and_the_operations_page_lists_them_all() {
    let known = known_metrics();
    // Crate and module names share the prefix; they are not metrics.
    let not_metrics = ["grid_route_layer", "grid_route_example", "grid_route_tests"];
    for page in PAGES {
        for word in metric_words(&read(page)) {
            if not_metrics.iter().any(|n| word.starts_with(n)) {
                continue;
            }
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .filter(|base| known.contains(*base))
                .unwrap_or(&word);
            assert!(
                known.contains(base),
                "{page} names a metric that does not exist: {word}"
            );
        }
    }
    let operations = read("docs/operations.md");
    for metric in &known {
        assert!(
            operations.contains(&format!("| `{metric}` |")),
            "docs/operations.md's metrics table has no row for {metric}"
        );
    }
}

/// The `pub` fields of `struct NAME` in the source file at `path`, in order.
fn struct_fields(path: &str, name: &str) -> Vec<String> {
    let text = read(path);
    let start = text
        .find(&format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name} in {path}"));
    let body = &text[start..text[start..].find("\n}\n").unwrap() + start];
    body.lines()
        .filter_map(|line| {
            let field = line.trim().strip_prefix("pub ")?.split_once(':')?.0;
            (!field.contains(' ')).then(|| field.to_owned())
        })
        .collect()
}

/// Every field the config file takes, as the reference writes it (`queue.metric`,
/// `sites[].clusters[].models`, `grid_site_route.prefix_affinity.threshold`), from the
/// config types themselves.
fn config_fields() -> Vec<String> {
    let file = "grid-route-example/src/config/file.rs";
    let mut fields = Vec::new();
    let sections = [
        ("timeouts", "TimeoutsConfig"),
        ("retries", "RetriesConfig"),
        ("outlier", "OutlierConfig"),
        ("queue", "QueueConfig"),
    ];
    for field in struct_fields(file, "GatewayConfig") {
        match sections.iter().find(|(section, _)| *section == field) {
            Some((section, ty)) => {
                for inner in struct_fields(file, ty) {
                    fields.push(format!("{section}.{inner}"));
                }
            }
            None if field == "sites" || field == "grid_site_route" => {}
            None => fields.push(field),
        }
    }
    let spec = "grid-route-layer/src/grid/spec.rs";
    for field in struct_fields(spec, "SiteSpec") {
        if field != "clusters" {
            fields.push(format!("sites[].{field}"));
        }
    }
    for field in struct_fields(spec, "ClusterSpec") {
        fields.push(format!("sites[].clusters[].{field}"));
    }
    let affinity = "grid_site_route.prefix_affinity";
    for field in struct_fields("grid-route-layer/src/config.rs", "PrefixAffinityConfig") {
        fields.push(format!("{affinity}.{field}"));
    }
    for field in struct_fields(file, "SharedIndexConfig") {
        fields.push(format!("{affinity}.shared_index.{field}"));
    }
    assert!(fields.len() > 35, "{fields:?}");
    fields
}

/// The fields the config reference's table lists, with `….` written out.
fn documented_fields() -> Vec<String> {
    read("docs/configuration.md")
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once("` |").map(|(f, _)| f))
        .map(|field| match field.strip_prefix("….") {
            Some(rest) => format!("grid_site_route.prefix_affinity.{rest}"),
            None => field.to_owned(),
        })
        .collect()
}

/// Fails naming the first item one side has and the other lacks: `missing(item)` words an
/// item of `truth` that `written` lacks, `extra(item)` one of `written` that `truth` lacks.
fn assert_same_items(
    truth: &BTreeSet<String>,
    written: &BTreeSet<String>,
    missing: impl Fn(&str) -> String,
    extra: impl Fn(&str) -> String,
) {
    if let Some(item) = truth.difference(written).next() {
        panic!("{}", missing(item));
    }
    if let Some(item) = written.difference(truth).next() {
        panic!("{}", extra(item));
    }
}

#[test]
fn the_config_reference_lists_every_field_the_config_takes_and_no_other() {
    assert_same_items(
        &config_fields().into_iter().collect(),
        &documented_fields().into_iter().collect(),
        |field| format!("docs/configuration.md does not list {field}"),
        |field| format!("docs/configuration.md lists {field}, which the config does not take"),
    );
}

/// A config holding `field` (a dotted path) set to a string: refused for its type maybe,
/// never as an unknown field when the field exists.
fn probe(field: &str) -> Result<GatewayConfig, String> {
    let sites = "sites: [{ name: east, clusters: [{ name: east-a, models: [m], \
                 endpoints: [\"http://127.0.0.1:1\"] }] }]\n";
    if field.starts_with("sites") {
        return GatewayConfig::from_yaml(sites).map_err(|e| e.to_string());
    }
    let mut yaml = String::from("\"probe\"");
    for part in field.rsplit('.') {
        yaml = format!("{{ {part}: {yaml} }}");
    }
    let top = yaml.strip_prefix("{ ").unwrap().strip_suffix(" }").unwrap();
    GatewayConfig::from_yaml(&format!("{sites}{top}\n")).map_err(|e| e.to_string())
}

#[test]
fn every_config_field_the_docs_name_exists() {
    let tops = [
        "listen",
        "admin_listen",
        "local_site",
        "role",
        "forward_paths",
        "provider_allowed_paths",
        "max_body_bytes",
        "timeouts.",
        "retries.",
        "outlier.",
        "queue.",
        "grid_site_route.",
        "prefix_affinity.",
    ];
    for page in PAGES {
        for span in code_spans(&read(page)) {
            // A field path, perhaps with a value after it (`queue.count_in_flight: false`).
            let path = span.split([':', ' ', '=']).next().unwrap_or_default();
            let is_field = tops
                .iter()
                .any(|top| path == top.trim_end_matches('.') || path.starts_with(top))
                && path.contains('.')
                && path
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
            if !is_field {
                continue;
            }
            let path = if path.starts_with("prefix_affinity.") {
                format!("grid_site_route.{path}")
            } else {
                path.to_owned()
            };
            if let Err(error) = probe(&path) {
                assert!(
                    !error.contains("unknown field"),
                    "{page} names `{path}`, which the config does not take: {error}"
                );
            }
        }
    }
}

/// The workspace's packages.
fn packages() -> BTreeSet<String> {
    let root = read("Cargo.toml");
    let members = root
        .split_once("members = [")
        .unwrap()
        .1
        .split_once(']')
        .unwrap()
        .0;
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|member| {
            let manifest = read(&format!("{member}/Cargo.toml"));
            let name = manifest.split_once("name = \"").unwrap().1;
            name.split_once('"').unwrap().0.to_owned()
        })
        .collect()
}

#[test]
fn every_command_the_docs_show_names_what_is_there() {
    let packages = packages();
    let subcommands = ["demo", "serve", "keys", "mock-engine"];
    for page in PAGES {
        let text = read(page);
        for line in text.lines() {
            let line = line.trim_start_matches(['$', ' ']);
            for word in line.split_whitespace() {
                let word = word.trim_matches(|c: char| "`(),.;:*\"'".contains(c));
                if let Some(script) = word.strip_prefix("scripts/")
                    && !script.is_empty()
                {
                    let script = script.split(['#', ':']).next().unwrap();
                    assert!(
                        workspace_root().join("scripts").join(script).exists(),
                        "{page} names scripts/{script}, which does not exist"
                    );
                }
                if ["tests/fuzz/run", "tests/sdk/setup", "tests/llama/setup"]
                    .iter()
                    .any(|known| word.starts_with(known))
                {
                    assert!(workspace_root().join(word).exists(), "{page}: {word}");
                }
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                if *w == "-p"
                    && let Some(package) = words.get(i + 1)
                    && words.first() == Some(&"cargo")
                {
                    let package = package.trim_matches('`');
                    assert!(
                        packages.contains(package),
                        "{page} runs package {package}, which is not in the workspace: {line}"
                    );
                }
                if *w == "--test"
                    && let Some(target) = words.get(i + 1)
                    && words.first() == Some(&"cargo")
                {
                    let target = target.trim_matches('`');
                    let found = ["tests/tests", "grid-route-example/tests"]
                        .iter()
                        .any(|dir| {
                            workspace_root()
                                .join(dir)
                                .join(format!("{target}.rs"))
                                .exists()
                        });
                    assert!(
                        found,
                        "{page} runs test target {target}, which does not exist"
                    );
                }
            }
            if let Some(rest) = line.split("-p grid-route-example -- ").nth(1) {
                let sub = rest.split_whitespace().next().unwrap_or_default();
                assert!(
                    subcommands.contains(&sub) || sub.starts_with("--"),
                    "{page} runs `grid-route-example {sub}`, which is not a subcommand"
                );
            }
        }
    }
}

#[test]
fn the_readme_is_short_and_the_request_path_is_drawn_once() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 150, "README.md has {lines} lines");
    // The diagram's first line: drawn in docs/architecture.md and nowhere else.
    let marker = "client ──►";
    let mut drawn = Vec::new();
    for page in PAGES {
        if read(page).contains(marker) {
            drawn.push(page);
        }
    }
    for source in [
        "grid-route-layer/src/lib.rs",
        "grid-route-example/src/gateway/stack.rs",
    ] {
        if read(source).contains(marker) {
            drawn.push(source);
        }
    }
    assert_eq!(drawn, ["docs/architecture.md"]);
}

/// Every file a reader or a maintainer reads section names in: the pages, the scripts and
/// the crates' sources.
fn referring_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = PAGES.iter().map(|p| (p.to_string(), read(p))).collect();
    let mut dirs = vec![
        workspace_root().join("scripts"),
        workspace_root().join("grid-route-layer/src"),
        workspace_root().join("grid-route-example/src"),
        workspace_root().join("benches"),
        workspace_root().join("tests/src"),
        workspace_root().join("tests/tests"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("__pycache__") {
                    dirs.push(path);
                }
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                let name = path.strip_prefix(workspace_root()).unwrap();
                files.push((name.display().to_string(), text));
            }
        }
    }
    files
}

/// The section names `text` points to on another page, as `(page, title)`: a page's file
/// name followed by a quoted title, as in `BENCHMARKS.md ("Arena")` or
/// `[routing.md](routing.md), "The queue window"`.
fn section_references(text: &str) -> Vec<(String, String)> {
    let separator = |c: char| "(), ]".contains(c);
    let mut found = Vec::new();
    for (at, _) in text.match_indices(".md") {
        let before = &text[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "_-/".contains(c)))
            .map_or(0, |i| i + 1);
        let page = format!("{}.md", &before[start..]);
        let rest = &text[at + 3..];
        let after = rest.trim_start_matches(separator);
        // The link's target, when the name was a link's text: `[a.md](a.md), "…"`.
        let after = after
            .strip_prefix(file_name(&page))
            .or_else(|| after.strip_prefix(page.as_str()))
            .map_or(after, |target| target.trim_start_matches(separator));
        // A title follows a space or an opening parenthesis (a quote right after the name
        // closes a string the name was in) and stays on one line.
        let gap = &rest[..rest.len() - after.len()];
        if let Some(quoted) = after.strip_prefix('"')
            && let Some(end) = quoted.find('"')
            && gap.len() <= 16
            && gap.ends_with([' ', '('])
            && !quoted[..end].contains('\n')
        {
            found.push((page, quoted[..end].to_string()));
        }
    }
    found
}

/// The last component of `path`.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[test]
fn every_section_a_file_points_to_is_there() {
    let mut checked = 0;
    for (file, text) in referring_files() {
        for (page, title) in section_references(&text) {
            let Some(target) = PAGES.iter().find(|p| file_name(p) == file_name(&page)) else {
                continue;
            };
            let headings: Vec<String> = read(target)
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| l.trim_start_matches('#').trim().to_string())
                .collect();
            let there = headings.iter().any(|h| {
                h == &title
                    || h.strip_prefix(title.as_str())
                        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with(" ("))
            });
            assert!(
                there,
                "{file} points to \"{title}\" in {target}, which has no such section"
            );
            checked += 1;
        }
    }
    // The references this test was written against; fewer means the scan broke.
    assert!(checked >= 4, "only {checked} section references found");
}

/// The routers `scripts/arena` takes: the keys of its `router_configs`.
fn arena_routers() -> BTreeSet<String> {
    read("scripts/arena.py")
        .lines()
        .filter_map(|line| {
            let name = line
                .trim()
                .strip_prefix('"')?
                .split_once("\": RouterConfig(")?
                .0;
            Some(name.to_string())
        })
        .collect()
}

#[test]
fn the_benchmarks_page_names_the_arenas_routers_and_the_benches_flags_as_the_scripts_have_them() {
    let page = read("BENCHMARKS.md");
    let routers = arena_routers();
    assert!(routers.len() > 5, "{routers:?}");
    let named: BTreeSet<String> = code_spans(&page)
        .into_iter()
        .filter(|span| {
            ["grid-", "vllm-", "sglang-"]
                .iter()
                .any(|p| span.starts_with(p))
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && !span.starts_with("grid-route")
        })
        .map(str::to_string)
        .collect();
    assert_same_items(
        &routers,
        &named,
        |router| format!("scripts/arena takes {router}, which BENCHMARKS.md does not describe"),
        |name| format!("BENCHMARKS.md names router {name}, which scripts/arena does not take"),
    );
    // Each bench's flags, as scripts/bench-results runs it and as the page shows it.
    let script = read("scripts/bench-results");
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("cargo bench -p grid-route-benches --bench ") else {
            continue;
        };
        let (bench, flags) = rest.split_once(" -- ").unwrap();
        if bench == "index" {
            continue; // Not one of the tables bench-results prints.
        }
        let wanted = format!("{bench}) args=({flags}) ;;");
        assert!(
            script.contains(&wanted),
            "BENCHMARKS.md runs the {bench} bench with `{flags}`, scripts/bench-results otherwise"
        );
    }
}
