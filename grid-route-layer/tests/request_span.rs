//! Each request runs in one `grid_route` span whose fields tell an operator how it was
//! routed, with any tracing subscriber: the API, the outcome, the matched depth, and the
//! site and cluster chosen. Never prompt text.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use grid_route_layer::affinity::{Affinity, AffinityLayer};
use grid_route_layer::config::PrefixAffinityConfig;
use grid_route_layer::confirm::ConfirmLayer;
use grid_route_layer::grid::{Cluster, ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
use grid_route_layer::index::PrefixIndex;
use grid_route_layer::keying::{KeySeed, KeyedBody, KeyingLayer};
use grid_route_layer::pin::{PinKeys, PinLayer};
use grid_route_layer::route::REQUEST_SPAN;
use grid_route_layer::select::Select;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The fields of every closed request span, in the order they closed.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<HashMap<String, String>>>>);

struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != REQUEST_SPAN {
            return;
        }
        let mut fields = Fields(HashMap::new());
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(fields) = ctx.span(id).unwrap().extensions_mut().get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(fields) = ctx.span(&id).unwrap().extensions_mut().remove::<Fields>() {
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

fn grid() -> Grid {
    let site = |name: &str| {
        SiteSpec::new(name).with_clusters([ClusterSpec::new(format!("{name}-a"))
            .with_models(["m"])
            .with_endpoints([format!("http://{name}-a")])])
    };
    let spec = GridSpec::new([site("east"), site("west")]);
    Grid::new(&spec, GridSettings::default()).unwrap()
}

#[test]
fn each_request_runs_in_one_span_naming_its_outcome_depth_and_cluster() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let grid = grid();
    let index = Arc::new(PrefixIndex::new(
        grid_route_layer::index::IndexSettings::default(),
        grid.view().cluster_ids(),
    ));
    let settings = PrefixAffinityConfig::default().with_exploration(0.0);
    let affinity = Affinity::new(index, settings.validate().unwrap().affinity);
    let cluster = |_: &Cluster| {
        service_fn(|_: Request<KeyedBody<Full<Bytes>>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        })
    };
    let stack = ServiceBuilder::new()
        .layer(KeyingLayer::new(KeySeed::random()))
        .layer(PinLayer::new(grid.clone(), PinKeys::default()))
        .layer(ConfirmLayer::new(affinity.clone()))
        .layer(AffinityLayer::new(grid.clone(), affinity))
        .service(Select::new(grid, cluster));

    let secret = "the secret system prompt ".repeat(100);
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": secret}, {"role": "user", "content": "hi"}]})
    .to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for path in [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
    ] {
        let request = Request::post(path)
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let response = runtime.block_on(stack.clone().oneshot(request)).unwrap();
        runtime.block_on(response.into_body().collect()).unwrap();
    }

    let spans = spans.0.lock().unwrap().clone();
    assert_eq!(spans.len(), 3, "{spans:?}");
    let (first, second, other) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(first["api"], "chat");
    assert_eq!(first["outcome"], "no_match");
    assert_eq!(second["outcome"], "sticky");
    assert!(second["depth"].parse::<u64>().unwrap() >= 8, "{second:?}");
    assert_eq!(second["site"], first["site"]);
    assert_eq!(second["cluster"], first["cluster"]);
    assert!(["east-a", "west-a"].contains(&first["cluster"].as_str()));
    // Not a keyed API: no affinity decision, but the destination is known.
    assert_eq!(other["api"], "other");
    assert!(!other.contains_key("outcome"));
    assert!(other.contains_key("cluster"));
    for span in &spans {
        assert!(span.values().all(|v| !v.contains("secret")), "{span:?}");
    }
}
