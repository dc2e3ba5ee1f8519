use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;
use crate::test_support::{MODEL, cluster_spec, grid_spec};

fn err(spec: &GridSpec) -> String {
    Grid::new(spec, GridSettings::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn a_site_name_that_is_not_a_dns_label_is_refused_naming_it() {
    let mut spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    spec.sites[1].name = "West_1".into();
    assert_eq!(
        err(&spec),
        r#"sites[1].name "West_1" is not a DNS-1123 label: it may hold only lowercase letters, digits and '-'"#
    );
}

#[test]
fn a_repeated_site_is_refused() {
    let spec = grid_spec(&[("east", &["east-a"]), ("east", &["east-b"])]);
    assert_eq!(err(&spec), r#"sites[1].name "east" repeats sites[0].name"#);
}

#[test]
fn a_repeated_cluster_of_one_site_is_refused() {
    let spec = grid_spec(&[("east", &["east-a", "east-b", "east-a"])]);
    assert_eq!(
        err(&spec),
        r#"sites[0].clusters[2].name "east-a" repeats sites[0].clusters[0].name"#
    );
}

#[test]
fn one_cluster_name_at_two_sites_is_two_clusters() {
    let spec = grid_spec(&[("east", &["pool"]), ("west", &["pool"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    assert_eq!(grid.view().clusters().len(), 2);
}

/// Two distinct names with the same 32-bit digest, found by a birthday search (about 2^16
/// names before the first collision).
fn colliding_names() -> (String, String) {
    let mut seen: HashMap<ClusterDigest, String> = HashMap::new();
    for i in 0u64.. {
        let name = format!("pool-{i}");
        let digest = ClusterDigest::of_name(&name);
        if let Some(first) = seen.insert(digest, name.clone()) {
            return (first, name);
        }
    }
    unreachable!("the search ends by the pigeonhole principle")
}

#[test]
fn clusters_of_one_site_whose_digests_collide_are_refused_naming_both() {
    let (a, b) = colliding_names();
    assert_ne!(a, b);
    let digest = ClusterDigest::of_name(&a);
    let spec = grid_spec(&[("east", &[a.as_str(), b.as_str()])]);
    assert_eq!(
        err(&spec),
        format!(
            "sites[0] clusters {a:?} and {b:?} have the same digest {digest}, so tagged ids \
             could not tell them apart; rename one"
        )
    );
    // At two different sites the site tells them apart.
    let spec = grid_spec(&[("east", &[a.as_str()]), ("west", &[b.as_str()])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let view = grid.view();
    assert_eq!(view.by_tag("west", digest).unwrap().id().name(), b);
    assert_eq!(view.by_tag("east", digest).unwrap().id().name(), a);
}

#[test]
fn a_cluster_without_endpoints_or_models_is_refused() {
    let mut spec = grid_spec(&[("east", &["east-a"])]);
    spec.sites[0].clusters[0].endpoints.clear();
    assert_eq!(
        err(&spec),
        r#"sites[0].clusters[0].endpoints is empty for cluster "east-a""#
    );
    let mut spec = grid_spec(&[("east", &["east-a"])]);
    spec.sites[0].clusters[0].models.clear();
    assert_eq!(
        err(&spec),
        r#"sites[0].clusters[0].models is empty for cluster "east-a""#
    );
}

#[test]
fn a_repeated_or_empty_endpoint_is_refused() {
    let mut spec = grid_spec(&[("east", &["east-a"])]);
    spec.sites[0].clusters[0].endpoints = vec!["http://a".into(), "http://a".into()];
    assert_eq!(
        err(&spec),
        r#"sites[0].clusters[0].endpoints[1] "http://a" repeats sites[0].clusters[0].endpoints[0]"#
    );
    spec.sites[0].clusters[0].endpoints = vec![String::new()];
    assert_eq!(
        err(&spec),
        r#"sites[0].clusters[0].endpoints[0] "" is empty"#
    );
}

#[test]
fn empty_sites_clusters_and_names_are_refused() {
    assert_eq!(
        err(&GridSpec::default()),
        "sites is empty; configure at least one site"
    );
    let spec = grid_spec(&[("east", &[""])]);
    assert_eq!(err(&spec), "sites[0].clusters[0].name is empty");
}

#[test]
fn a_local_site_without_clusters_is_accepted() {
    // Its engines taken out: the site lists no cluster, or is not listed at all.
    for (spec, local) in [
        (grid_spec(&[("east", &[]), ("west", &["west-a"])]), "east"),
        (grid_spec(&[("west", &["west-a"])]), "north"),
    ] {
        let settings = GridSettings {
            local_site: Some(local.into()),
            ..GridSettings::default()
        };
        let grid = Grid::new(&spec, settings).unwrap();
        let view = grid.view();
        assert_eq!(view.local_site().unwrap().as_str(), local);
        assert!(view.clusters().iter().all(|c| c.site().as_str() == "west"));
    }
}

#[test]
fn a_malformed_local_site_and_a_zero_window_are_refused() {
    let spec = grid_spec(&[("east", &["east-a"])]);
    let settings = GridSettings {
        local_site: Some("North_Pole".into()),
        ..GridSettings::default()
    };
    assert!(
        Grid::new(&spec, settings)
            .unwrap_err()
            .to_string()
            .starts_with(r#"local_site "North_Pole" is not a DNS-1123 label"#)
    );
    let settings = GridSettings {
        queue_window: Duration::ZERO,
        ..GridSettings::default()
    };
    assert_eq!(
        Grid::new(&spec, settings).unwrap_err().to_string(),
        "queue.window_secs must be greater than 0, got 0"
    );
    let settings = GridSettings {
        local_site: Some("east".into()),
        ..GridSettings::default()
    };
    let grid = Grid::new(&spec, settings).unwrap();
    assert_eq!(grid.view().local_site().unwrap().as_str(), "east");
}

#[test]
fn candidates_are_admitted_clusters_serving_the_model() {
    let mut spec = grid_spec(&[("east", &["east-a", "east-b"]), ("west", &["west-a"])]);
    spec.sites[0].clusters[1].admit = false;
    spec.sites[1].clusters[0].models = vec!["other".into()];
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let view = grid.view();
    let names = |model| {
        view.candidates(model)
            .iter()
            .map(|c| c.id().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(Some(MODEL)), ["east/east-a"]);
    assert_eq!(names(Some("other")), ["west/west-a"]);
    assert_eq!(names(Some("unknown")), Vec::<String>::new());
    assert_eq!(names(None), ["east/east-a", "west/west-a"]);
}

#[test]
fn a_cluster_without_a_healthy_endpoint_is_not_admitted() {
    let mut spec = grid_spec(&[("east", &["east-a"])]);
    spec.sites[0].clusters[0].endpoints = vec!["http://a".into(), "http://b".into()];
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let view = grid.view();
    let cluster = &view.clusters()[0];
    cluster.load().set_endpoint_healthy("http://a", false);
    assert!(cluster.admits());
    cluster.load().set_endpoint_healthy("http://b", false);
    assert!(!cluster.admits());
    assert!(cluster.admitted_by_config());
    assert!(view.candidates(None).is_empty());
}

#[test]
fn reconfiguration_carries_live_load_over_for_clusters_that_stay() {
    let spec = grid_spec(&[("east", &["east-a", "east-b"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let now = Instant::now();
    let old = grid.view();
    let a = &old.clusters()[0];
    let b = &old.clusters()[1];
    a.load().record_queue("http://east-a", Some(5.0), now);
    b.load().set_endpoint_healthy("http://east-b", false);
    let in_flight = a.load().start_request();

    let mut next = grid_spec(&[("east", &["east-b", "east-c"]), ("west", &["east-a"])]);
    next.sites[0].clusters[0]
        .endpoints
        .push("http://east-b2".into());
    grid.reconfigure(&next, GridSettings::default()).unwrap();
    let view = grid.view();
    let ids: Vec<_> = view.clusters().iter().map(|c| c.id().to_string()).collect();
    assert_eq!(ids, ["east/east-b", "east/east-c", "west/east-a"]);
    // east-a left (west/east-a is another cluster); east-b kept its sick endpoint and got a
    // healthy one; east-c is new.
    assert!(view.cluster(a.id()).is_none());
    let kept = view.cluster(b.id()).unwrap();
    assert_eq!(kept.load().endpoint_healthy("http://east-b"), Some(false));
    assert_eq!(kept.load().endpoint_healthy("http://east-b2"), Some(true));
    assert!(kept.admits());
    assert_eq!(view.clusters()[2].load().queue_depth(now), f64::INFINITY);
    drop(in_flight);
    // The old view still works for requests that hold it.
    assert_eq!(old.clusters()[0].load().queue_depth(now), 5.0);
    assert_eq!(old.clusters()[0].load().in_flight(), 0);
}

#[test]
fn reconfiguration_keeps_queue_samples_and_in_flight_counts() {
    let spec = grid_spec(&[("east", &["east-a"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let now = Instant::now();
    let mut guard = grid.view().clusters()[0].load().start_request();
    grid.view().clusters()[0]
        .load()
        .record_queue("http://east-a", Some(2.0), now);
    let longer = GridSettings {
        queue_window: Duration::from_secs(30),
        ..GridSettings::default()
    };
    grid.reconfigure(&spec, longer).unwrap();
    let load_now = grid.view();
    let load = load_now.clusters()[0].load();
    assert_eq!(load.in_flight(), 1);
    assert_eq!(load.queue_depth(now + Duration::from_secs(20)), 2.0);
    // A stream's count carries over too.
    guard.first_token();
    assert_eq!(load.streaming(), 1);
    drop(guard);
    assert_eq!((load.in_flight(), load.streaming()), (0, 0));
}

#[test]
fn a_request_counts_whole_until_its_first_token_then_at_the_stream_weight_until_it_ends() {
    let spec = grid_spec(&[("east", &["east-a"])]);
    for count_in_flight in [true, false] {
        let settings = GridSettings {
            count_in_flight,
            ..GridSettings::default()
        };
        let grid = Grid::new(&spec, settings).unwrap();
        let view = grid.view();
        let load = view.clusters()[0].load();
        let now = Instant::now();
        load.record_queue("http://east-a", Some(1.0), now);
        let mut first = load.start_request();
        let second = load.start_request();
        let counted = |waiting: f64, streams: f64| {
            if count_in_flight {
                1.0 + waiting + STREAM_WEIGHT * streams
            } else {
                1.0
            }
        };
        assert_eq!(load.routing_load(now), counted(2.0, 0.0));
        first.first_token();
        assert_eq!((load.in_flight(), load.streaming()), (2, 1));
        assert_eq!(load.routing_load(now), counted(1.0, 1.0));
        // Once: a second first token changes nothing.
        first.first_token();
        assert_eq!(load.streaming(), 1);
        drop(first);
        assert_eq!((load.in_flight(), load.streaming()), (1, 0));
        assert_eq!(load.routing_load(now), counted(1.0, 0.0));
        // A request that ends before any token never counted as a stream.
        drop(second);
        assert_eq!((load.in_flight(), load.streaming()), (0, 0));
        assert_eq!(load.routing_load(now), 1.0);
    }
}

#[test]
fn a_refused_reconfiguration_keeps_the_old_grid() {
    let spec = grid_spec(&[("east", &["east-a"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let mut bad = spec.clone();
    bad.sites[0].clusters.push(cluster_spec("east-a"));
    assert!(grid.reconfigure(&bad, GridSettings::default()).is_err());
    assert_eq!(grid.view().clusters().len(), 1);
}

#[test]
fn by_tag_finds_a_cluster_by_site_and_digest() {
    let spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let view = grid.view();
    let digest = ClusterDigest::of_name("east-a");
    assert_eq!(view.by_tag("east", digest).unwrap().id().name(), "east-a");
    assert!(view.by_tag("west", digest).is_none());
    assert!(
        view.by_tag("east", ClusterDigest::of_name("nope"))
            .is_none()
    );
}
