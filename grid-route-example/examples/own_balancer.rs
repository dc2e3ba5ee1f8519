//! The four grid-route layers over a balancer of your own, in an axum gateway.
//!
//! Your balancer reads the `Candidates` the layers leave on the request, picks one, forwards
//! the request and says which cluster `Served` it. Run it with
//! `cargo run -p grid-route-example --example own_balancer` and point it at an engine with
//! `GRID_ENGINE=http://127.0.0.1:8001` (a `mock-engine` will do).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::error_handling::HandleError;
use grid_route_layer::affinity::{Affinity, AffinityLayer};
use grid_route_layer::config::PrefixAffinityConfig;
use grid_route_layer::confirm::ConfirmLayer;
use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
use grid_route_layer::index::PrefixIndex;
use grid_route_layer::keying::{KeySeed, KeyedBody, KeyingLayer};
use grid_route_layer::pin::{PinKeys, PinLayer};
use grid_route_layer::route::{BoxError, Candidates, DispatchError, Served};
use http::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let engine = std::env::var("GRID_ENGINE").unwrap_or_else(|_| "http://127.0.0.1:8001".into());
    let grid = Grid::new(&one_site(&engine), GridSettings::default())?;
    let config = PrefixAffinityConfig::default().validate()?;
    let index = Arc::new(PrefixIndex::new(config.index, grid.view().cluster_ids()));
    let affinity = Affinity::new(index, config.affinity);
    let client = Client::builder(TokioExecutor::new()).build_http();

    // Your balancer: pick among the candidates, forward, and say who served.
    let view = grid.clone();
    let balancer = tower::service_fn(move |mut request: Request<KeyedBody<Body>>| {
        let (view, client) = (view.view(), client.clone());
        async move {
            let candidates = request.extensions().get::<Candidates>().cloned();
            let cluster = candidates
                .and_then(|c| c.as_slice().first().cloned())
                .ok_or("no cluster")?;
            let endpoint = view.cluster(&cluster).ok_or("cluster left")?.endpoints()[0].clone();
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            *request.uri_mut() = format!("{endpoint}{path}").parse()?;
            // A failed connection names its cluster: confirmation then drops the keys there.
            let response = client.request(request).await;
            let response = response.map_err(|error| DispatchError::new(cluster.clone(), error))?;
            let mut response = response.map(Body::new);
            response.extensions_mut().insert(Served::new(cluster));
            Ok::<_, BoxError>(response)
        }
    });

    let stack = ServiceBuilder::new()
        .layer(KeyingLayer::new(KeySeed::random()).with_affinity(affinity.clone()))
        .layer(PinLayer::new(grid.clone(), PinKeys::default()))
        .layer(ConfirmLayer::new(affinity.clone()))
        .layer(AffinityLayer::new(grid, affinity))
        .service(balancer);
    let answer_errors =
        |error: BoxError| async move { (StatusCode::BAD_GATEWAY, error.to_string()) };
    let app = Router::new().fallback_service(HandleError::new(stack, answer_errors));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// One site with one cluster serving `demo-model` at `engine`.
fn one_site(engine: &str) -> GridSpec {
    GridSpec::new([
        SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
            .with_models(["demo-model"])
            .with_endpoints([engine])]),
    ])
}
