use std::time::Duration;

use grid_route_layer::config::{PrefixAffinityConfig, Price};
use grid_route_layer::grid::ClusterSpec;
use grid_route_layer::keying::DEFAULT_BODY_LIMIT_BYTES;

use super::checked::is_metric_name;
use super::*;
use crate::forward_paths::ForwardPathConfig;

const MINIMAL: &str = "
sites:
  - name: east
    clusters:
      - name: east-a
        models: [demo-model]
        endpoints: [http://127.0.0.1:8001]
";

fn refused(yaml: &str) -> String {
    match GatewayConfig::from_yaml(yaml).and_then(|c| c.validate()) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn every_field_but_sites_has_the_designs_default() {
    let config = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.listen, "127.0.0.1:8080");
    assert_eq!(config.admin_listen, "127.0.0.1:9090");
    assert_eq!(config.role, Role::Consumer);
    assert_eq!(
        config.provider_allowed_paths,
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/v1/embeddings"
        ]
    );
    assert_eq!(config.max_body_bytes, 10_485_760);
    assert_eq!(config.forward_paths, ForwardPathConfig::defaults());
    assert_eq!(config.timeouts.client_header_secs, 10);
    assert_eq!(config.timeouts.client_body_idle_secs, 30);
    assert_eq!(config.timeouts.upstream_connect_ms, 2000);
    assert_eq!(config.timeouts.upstream_first_byte_secs, 600);
    assert_eq!(config.timeouts.upstream_idle_secs, 120);
    assert_eq!(config.retries.max_attempts, 3);
    assert_eq!(config.outlier.consecutive_failures, 5);
    assert_eq!(config.outlier.ejection_secs, 30);
    assert_eq!(config.outlier.stall_min_secs, 5);
    // Each endpoint's own gauge, a 1 s window, in-flight requests counted.
    assert_eq!(config.queue.metric, None);
    assert_eq!(config.queue.poll_interval_ms, 500);
    assert_eq!(config.queue.window_secs, 1);
    assert!(config.queue.count_in_flight);
    assert!(config.sites[0].clusters[0].admit);
    let p = &config.grid_site_route.prefix_affinity.settings;
    assert!(p.enabled);
    assert_eq!(p.threshold, 0.8);
    assert_eq!(p.exploration, 0.02);
    // Both prices learned per cluster, from the contract's figures.
    assert_eq!(p.prefill_tokens_per_second, Price::Auto);
    assert_eq!(p.prefill_prior_tokens_per_second, 10_000.0);
    assert!(checked_affinity(&config).learns_prefill());
    assert_eq!(p.queued_request_seconds, Price::Auto);
    assert_eq!(p.queued_request_prior_seconds, 2.0);
    assert!(checked_affinity(&config).learns_queued());
    assert_eq!(p.capacity, 16_384);
    assert_eq!(p.ttl_secs, 600);
    assert_eq!(p.tag_key_path, None);
    let checked = config.validate().unwrap();
    assert_eq!(checked.grid_settings.local_site.as_deref(), Some("east"));
    assert_eq!(checked.poll_interval, Duration::from_millis(500));
    assert!(checked.tag_key.is_none());
    assert!(checked.grid_settings.count_in_flight);
    assert_eq!(checked.queue_metric, None);
}

#[test]
fn an_empty_section_gives_the_library_defaults() {
    let empty = GatewayConfig::from_yaml(&format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{}} }}\n"
    ))
    .unwrap();
    let absent = GatewayConfig::from_yaml(MINIMAL).unwrap();
    for config in [&empty, &absent] {
        let section = &config.grid_site_route.prefix_affinity;
        assert_eq!(section.settings, PrefixAffinityConfig::default());
        assert_eq!(section.shared_index, None);
    }
    // A cluster that leaves out `admit` is the library's default cluster.
    assert_eq!(
        empty.sites[0].clusters[0],
        ClusterSpec::new("east-a")
            .with_models(["demo-model"])
            .with_endpoints(["http://127.0.0.1:8001"])
    );
    assert_eq!(empty.max_body_bytes, DEFAULT_BODY_LIMIT_BYTES);
}

#[test]
fn prefill_auto_learns_from_the_prior_and_a_bad_price_is_refused() {
    let auto = GatewayConfig::from_yaml(&format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: \
             {{ prefill_tokens_per_second: auto, prefill_prior_tokens_per_second: 150 }} }}\n"
    ))
    .unwrap();
    let settings = checked_affinity(&auto);
    assert!(settings.learns_prefill());
    assert_eq!(settings.prefill_tokens_per_second(), 150.0);
    let bad = GatewayConfig::from_yaml(&format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ prefill_tokens_per_second: fast }} }}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(bad.contains("prefill_tokens_per_second"), "{bad}");
    assert!(bad.contains("or `auto`"), "{bad}");
}

fn checked_affinity(config: &GatewayConfig) -> grid_route_layer::affinity::AffinitySettings {
    config.validate().unwrap().prefix_affinity.affinity
}

#[test]
fn count_in_flight_reaches_the_grid_settings() {
    let config =
        GatewayConfig::from_yaml(&format!("{MINIMAL}queue: {{ count_in_flight: true }}\n"))
            .unwrap();
    assert!(config.queue.count_in_flight);
    assert!(config.validate().unwrap().grid_settings.count_in_flight);
}

#[test]
fn the_designs_example_parses_as_written() {
    let yaml = r#"
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
local_site: east
role: consumer              # consumer | provider
provider_allowed_paths: [/v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings]
max_body_bytes: 10485760
queue: { metric: "vllm:num_requests_waiting", poll_interval_ms: 500, window_secs: 10 }
sites:
  - name: east
    clusters:
      - name: east-a
        models: [demo-model]
        admit: true         # false: drained
        endpoints: [http://127.0.0.1:8001]
grid_site_route:
  prefix_affinity:
    enabled: true
    threshold: 0.8
    exploration: 0.02
    prefill_tokens_per_second: 10000
    queued_request_seconds: 2
    engine_feedback: true
    capacity: 16384
    ttl_secs: 600
"#;
    let config = GatewayConfig::from_yaml(yaml).unwrap();
    // Every value it writes is the default, and the default local site is the first,
    // except where the defaults now learn: the design fixes vLLM's gauge, a 10 s window
    // and both prices (its numbers restore the fixed rule).
    let mut defaults = GatewayConfig::from_yaml(MINIMAL).unwrap();
    defaults.local_site = Some("east".to_owned());
    defaults.queue.metric = Some(VLLM_QUEUE_METRIC.to_owned());
    defaults.queue.window_secs = 10;
    let p = &mut defaults.grid_site_route.prefix_affinity.settings;
    p.prefill_tokens_per_second = Price::Fixed(10_000.0);
    p.queued_request_seconds = Price::Fixed(2.0);
    assert_eq!(config, defaults);
    config.validate().unwrap();
}

#[test]
fn an_unknown_field_is_refused_naming_it() {
    let message = refused(&format!("{MINIMAL}lisen: 127.0.0.1:1\n"));
    assert!(message.contains("unknown field `lisen`"), "{message}");
    let message = refused(&MINIMAL.replace("models:", "modles: [x]\n        models:"));
    assert!(message.contains("unknown field `modles`"), "{message}");
    assert!(message.contains("sites[0].clusters[0]"), "{message}");
    let message = refused(&format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ treshold: 0.5 }} }}\n"
    ));
    assert!(message.contains("unknown field `treshold`"), "{message}");
    let message = refused(&format!("{MINIMAL}queue: {{ metrc: x }}\n"));
    assert!(message.contains("unknown field `metrc`"), "{message}");
    let message = refused(&format!("{MINIMAL}timeouts: {{ client_header: 1 }}\n"));
    assert!(
        message.contains("unknown field `client_header`"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}outlier: {{ ejection: 1 }}\n"));
    assert!(message.contains("unknown field `ejection`"), "{message}");
}

#[test]
fn sites_is_required() {
    let message = refused("listen: 127.0.0.1:8080\n");
    assert!(message.contains("missing field `sites`"), "{message}");
}

#[test]
fn a_value_of_the_wrong_type_names_the_field() {
    let message = refused(&format!("{MINIMAL}max_body_bytes: lots\n"));
    assert!(message.contains("max_body_bytes"), "{message}");
    // The library's fields are read flattened, so their type errors name the section.
    let message = refused(&format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ capacity: lots }} }}\n"
    ));
    assert!(
        message.contains("grid_site_route.prefix_affinity") && message.contains("lots"),
        "{message}"
    );
    let message = refused(&format!("{MINIMAL}role: broker\n"));
    assert!(
        message.contains("role") && message.contains("broker"),
        "{message}"
    );
}

#[test]
fn validation_errors_name_the_field_and_the_value() {
    let cases = [
            (
                format!("{MINIMAL}listen: localhost:80\n"),
                r#"listen must be IP:PORT, got "localhost:80""#.to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 5 }}\n"),
                "queue.poll_interval_ms must be at least 10, got 5".to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 18446744073709551615 }}\n"),
                "queue.poll_interval_ms must be at most 86400000 (a day), got 18446744073709551615"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ window_secs: 86401 }}\n"),
                "queue.window_secs must be at most 86400 (a day), got 86401".to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 1000 }}\n"),
                "queue.window_secs must cover two polls of queue.poll_interval_ms (1000 ms): \
                 at least 2, got 1"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ metric: \"vllm num\" }}\n"),
                r#"queue.metric must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), got "vllm num""#.to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ window_secs: 0 }}\n"),
                "queue.window_secs must be greater than 0, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}local_site: North\n"),
                r#"local_site "North" is not a DNS-1123 label: it may hold only lowercase letters, digits and '-'"#.to_owned(),
            ),
            (
                MINIMAL.replace("name: east\n", "name: East\n"),
                r#"sites[0].name "East" is not a DNS-1123 label: it may hold only lowercase letters, digits and '-'"#.to_owned(),
            ),
            (
                MINIMAL.replace("http://127.0.0.1:8001", "https://engine:8001"),
                r#"sites[0].clusters[0].endpoints[0] must be an http:// base URL (http://HOST:PORT[/prefix], no query), got "https://engine:8001""#.to_owned(),
            ),
            (
                format!("{MINIMAL}grid_site_route: {{ prefix_affinity: {{ threshold: 1.5 }} }}\n"),
                "grid_site_route.prefix_affinity.threshold must be in (0, 1], got 1.5".to_owned(),
            ),
            (
                format!("{MINIMAL}provider_allowed_paths: [v1/models]\n"),
                r#"provider_allowed_paths[0] must be an exact path starting with '/' (no query or fragment), got "v1/models""#.to_owned(),
            ),
            (
                format!("{MINIMAL}max_body_bytes: 0\n"),
                "max_body_bytes must be at least 1, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}forward_paths: [{{ path: v1/x, methods: [GET] }}]\n"),
                r#"forward_paths[0].path must be a path starting with '/' whose segments are text or a whole {name} placeholder (no query, fragment, empty or dot segment), got "v1/x""#.to_owned(),
            ),
            (
                format!("{MINIMAL}forward_paths: [{{ path: /v1/x, methods: [get] }}]\n"),
                r#"forward_paths[0].methods[0] must be an HTTP method in upper case (GET, POST, DELETE, ...), got "get""#.to_owned(),
            ),
            (
                format!("{MINIMAL}timeouts: {{ upstream_idle_secs: 0 }}\n"),
                "timeouts.upstream_idle_secs must be from 1 to 86400, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}retries: {{ max_attempts: 0 }}\n"),
                "retries.max_attempts must be from 1 to 100, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ consecutive_failures: 0 }}\n"),
                "outlier.consecutive_failures must be from 1 to 10000, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ ejection_secs: 18446744073709551615 }}\n"),
                "outlier.ejection_secs must be from 1 to 86400, got 18446744073709551615"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ stall_min_secs: 0 }}\n"),
                "outlier.stall_min_secs must be from 1 to 86400, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}timeouts: {{ upstream_first_byte_secs: 86401 }}\n"),
                "timeouts.upstream_first_byte_secs must be from 1 to 86400, got 86401"
                    .to_owned(),
            ),
        ];
    for (yaml, message) in cases {
        assert_eq!(refused(&yaml), message);
    }
}

#[test]
fn a_tag_key_file_that_is_missing_or_short_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let short = dir.join("short.key");
    std::fs::write(&short, b"too short").unwrap();
    let yaml = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {} }} }}\n",
        short.display()
    );
    let message = refused(&yaml);
    assert!(
        message.starts_with("grid_site_route.prefix_affinity.tag_key_path: tag key file"),
        "{message}"
    );
    let good = dir.join("good.key");
    std::fs::write(&good, [7u8; 32]).unwrap();
    let yaml = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {} }} }}\n",
        good.display()
    );
    let checked = GatewayConfig::from_yaml(&yaml).unwrap().validate().unwrap();
    assert!(checked.tag_key.is_some());
}

#[test]
fn a_previous_tag_key_needs_a_current_one_and_a_readable_file() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let good = dir.join("good.key");
    std::fs::write(&good, [7u8; 32]).unwrap();
    let short = dir.join("short.key");
    std::fs::write(&short, b"too short").unwrap();
    let alone = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ previous_tag_key_path: {} }} }}\n",
        good.display()
    );
    assert!(
        refused(&alone).starts_with(
            "grid_site_route.prefix_affinity.previous_tag_key_path needs tag_key_path"
        ),
        "{}",
        refused(&alone)
    );
    let bad = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, previous_tag_key_path: {} }} }}\n",
        good.display(),
        short.display()
    );
    assert!(
        refused(&bad)
            .starts_with("grid_site_route.prefix_affinity.previous_tag_key_path: tag key file"),
        "{}",
        refused(&bad)
    );
    let both = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, previous_tag_key_path: {} }} }}\n",
        good.display(),
        good.display()
    );
    let checked = GatewayConfig::from_yaml(&both).unwrap().validate().unwrap();
    assert!(checked.previous_tag_key.is_some());
}

#[test]
fn a_shared_index_without_a_tag_key_is_refused_naming_both_fields() {
    let yaml = format!(
        "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ shared_index: {{ redis_url: \"redis://127.0.0.1:6379/0\" }} }} }}\n"
    );
    assert_eq!(
        refused(&yaml),
        "grid_site_route.prefix_affinity.tag_key_path must be set when \
             grid_site_route.prefix_affinity.shared_index is (replicas derive the keying seed \
             they share from the tag key), got none"
    );
}

#[test]
fn a_shared_index_defaults_its_key_prefix_and_checks_its_url() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let key = dir.join("tag.key");
    std::fs::write(&key, [9u8; 32]).unwrap();
    let with = |shared: &str| {
        format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, shared_index: {shared} }} }}\n",
            key.display()
        )
    };
    let checked = GatewayConfig::from_yaml(&with("{ redis_url: \"redis://127.0.0.1:6379/0\" }"))
        .unwrap()
        .validate()
        .unwrap();
    let shared = checked.shared_index.unwrap();
    assert_eq!(shared.redis_url, "redis://127.0.0.1:6379/0");
    assert_eq!(shared.key_prefix, "grid-route");
    let message = refused(&with("{ redis_url: \"http://secret@host\" }"));
    assert_eq!(
        message,
        r#"grid_site_route.prefix_affinity.shared_index.redis_url must be a Redis URL (redis://HOST:PORT/DB), got "http:...""#
    );
    let message = refused(&with("{ redis_url: \"redis://h\", key_prefix: \"\" }"));
    assert!(
        message.contains("key_prefix must not be empty"),
        "{message}"
    );
    let message = refused(&with("{ redis_uri: \"redis://h\" }"));
    assert!(message.contains("unknown field `redis_uri`"), "{message}");
}

#[test]
fn metric_names_follow_the_prometheus_syntax() {
    for good in [
        VLLM_QUEUE_METRIC,
        SGLANG_QUEUE_METRIC,
        LLAMACPP_QUEUE_METRIC,
        "_x1",
    ] {
        assert!(is_metric_name(good), "{good}");
    }
    for bad in ["", "1abc", "a-b", "a b", "é"] {
        assert!(!is_metric_name(bad), "{bad}");
    }
}

#[test]
fn the_engines_api_key_is_read_from_its_file_and_never_shown() {
    let scratch = tempfile::tempdir().unwrap();
    let with_key = |contents: &[u8]| {
        let path = scratch.path().join("engine.key");
        std::fs::write(&path, contents).unwrap();
        format!("{MINIMAL}queue: {{ api_key_path: {} }}\n", path.display())
    };
    // The line break an editor leaves, and spaces around the key, are not the key.
    let checked = GatewayConfig::from_yaml(&with_key(b"  sk-engine-secret-1\n"))
        .unwrap()
        .validate()
        .unwrap();
    let credential = checked.poll_credential.as_ref().unwrap();
    assert_eq!(credential.header_value(), "Bearer sk-engine-secret-1");
    assert!(credential.header_value().is_sensitive());
    let shown = format!("{checked:?}");
    assert!(!shown.contains("sk-engine-secret-1"), "{shown}");
    assert!(shown.contains("PollCredential(..)"), "{shown}");
    // None by default.
    let plain = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(plain.queue.api_key_path, None);
    assert!(plain.validate().unwrap().poll_credential.is_none());

    // Refused, naming the field and the file, never the key.
    for (contents, why) in [
        (&b"\n \n"[..], "the file is empty"),
        (b"sk-QZXJ words", "holds a space"),
        (b"sk-QZXJ\nsk-second\n", "holds a space, a line break"),
        (b"sk-\x7f-QZXJ", "outside visible ASCII"),
    ] {
        let message = refused(&with_key(contents));
        assert!(
            message.starts_with("queue.api_key_path must name a file"),
            "{message}"
        );
        assert!(message.contains("engine.key"), "{message}");
        assert!(message.contains(why), "{message}");
        assert!(!message.contains("QZXJ"), "{message}");
    }
    let missing = scratch.path().join("missing.key");
    let message = refused(&format!(
        "{MINIMAL}queue: {{ api_key_path: {} }}\n",
        missing.display()
    ));
    assert!(message.contains("missing.key"), "{message}");
    assert!(message.contains("No such file"), "{message}");
}
