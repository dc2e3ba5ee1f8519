//! `KeyingLayer` contract tests over `tower_test::mock`: what it forwards, what it attaches,
//! what passes through untouched, and the 400.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use grid_route_layer::keying::{KeySeed, KeyedBody, KeyingLayer, NoKeys};
use grid_route_layer::route::{BufferedBody, Prompt, RequestModel};
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_test::mock;

/// A request body delivered in the given chunks.
struct Chunks(VecDeque<Bytes>);

impl Chunks {
    fn of(body: &[u8], chunk: usize) -> Self {
        Self(
            body.chunks(chunk.max(1))
                .map(Bytes::copy_from_slice)
                .collect(),
        )
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

type Mocked = mock::Mock<Request<KeyedBody<Chunks>>, Response<Full<Bytes>>>;
type MockHandle = mock::Handle<Request<KeyedBody<Chunks>>, Response<Full<Bytes>>>;

type Stack = tower::util::BoxCloneService<
    Request<Chunks>,
    Response<grid_route_layer::keying::ResponseBody<Full<Bytes>>>,
    grid_route_layer::route::BoxError,
>;

fn stack(limit: usize) -> (Stack, MockHandle) {
    let (service, handle): (Mocked, MockHandle) = mock::pair();
    let layered = KeyingLayer::new(KeySeed::random())
        .body_limit(limit)
        .layer(service);
    (tower::util::BoxCloneService::new(layered), handle)
}

fn long_chat_body() -> Vec<u8> {
    let text = "A long enough prompt to fill several blocks of the stream. ".repeat(40);
    serde_json::json!({"model":"demo","messages":[{"role":"user","content":text}],"stream":true})
        .to_string()
        .into_bytes()
}

fn chunked_post(path: &str, body: &[u8], chunk: usize) -> Request<Chunks> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Chunks::of(body, chunk))
        .unwrap()
}

/// Sends `request` through the stack, answers it at the mock with 200, and returns what
/// the mock received (its extensions and body bytes).
async fn forwarded(limit: usize, request: Request<Chunks>) -> (http::Extensions, Vec<u8>) {
    let layer = KeyingLayer::new(KeySeed::random()).body_limit(limit);
    forwarded_through(layer, request).await
}

/// How long a test waits for the layer to forward a request or to answer.
const DEADLINE: Duration = Duration::from_secs(10);

/// The next request `handle` receives, failing the test after [`DEADLINE`].
async fn next_forwarded(
    handle: &mut MockHandle,
) -> (
    Request<KeyedBody<Chunks>>,
    mock::SendResponse<Response<Full<Bytes>>>,
) {
    tokio::time::timeout(DEADLINE, handle.next_request())
        .await
        .expect("forwarded in time")
        .expect("forwarded")
}

/// What `answer` (a call through the layer, or the task running one) comes to, failing
/// the test after [`DEADLINE`].
async fn in_time<F: std::future::Future>(answer: F) -> F::Output {
    tokio::time::timeout(DEADLINE, answer)
        .await
        .expect("answered in time")
}

/// [`forwarded`] through `layer`.
async fn forwarded_through(
    layer: KeyingLayer,
    request: Request<Chunks>,
) -> (http::Extensions, Vec<u8>) {
    let (service, mut handle): (Mocked, MockHandle) = mock::pair();
    let call = tokio::spawn(layer.layer(service).oneshot(request));
    let (received, respond) = next_forwarded(&mut handle).await;
    respond.send_response(Response::new(Full::new(Bytes::from_static(b"ok"))));
    let (parts, body) = received.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes().to_vec();
    let response = in_time(call).await.expect("task").expect("response");
    assert_eq!(response.status(), 200);
    (parts.extensions, bytes)
}

#[tokio::test]
async fn the_body_is_forwarded_byte_for_byte_with_the_prompt_attached() {
    let body = long_chat_body();
    for chunk in [1, 7, 1000, body.len()] {
        let (extensions, bytes) =
            forwarded(1 << 20, chunked_post("/v1/chat/completions", &body, chunk)).await;
        assert_eq!(bytes, body, "chunks of {chunk}");
        let prompt = extensions.get::<Prompt>().expect("prompt attached");
        assert_eq!(prompt.model(), Some("demo"));
        assert!(prompt.keys().expect("keys").len() > 4);
        assert_eq!(
            extensions
                .get::<BufferedBody>()
                .expect("buffered")
                .bytes()
                .as_ref(),
            &body[..]
        );
    }
}

#[tokio::test]
async fn keys_do_not_depend_on_how_the_body_was_chunked() {
    let body = long_chat_body();
    let seed = KeySeed::random();
    let mut keys_by_chunking = Vec::new();
    for chunk in [1, 13, 4096] {
        let (service, mut handle) = {
            let (service, handle): (Mocked, MockHandle) = mock::pair();
            (KeyingLayer::new(seed.clone()).layer(service), handle)
        };
        let call =
            tokio::spawn(service.oneshot(chunked_post("/v1/chat/completions", &body, chunk)));
        let (received, respond) = next_forwarded(&mut handle).await;
        respond.send_response(Response::new(Full::new(Bytes::new())));
        in_time(call).await.unwrap().unwrap();
        let prompt = received.extensions().get::<Prompt>().unwrap();
        keys_by_chunking.push(prompt.keys().unwrap().as_slice().to_vec());
    }
    assert!(keys_by_chunking.windows(2).all(|w| w[0] == w[1]));
}

#[tokio::test]
async fn every_api_path_is_keyed() {
    let text = "words ".repeat(200);
    let bodies = [
        (
            "/v1/chat/completions",
            serde_json::json!({"model":"m","messages":[{"role":"user","content":text}]}),
        ),
        (
            "/v1/completions",
            serde_json::json!({"model":"m","prompt":text}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model":"m","max_tokens":9,"messages":[{"role":"user","content":text}]}),
        ),
        (
            "/v1/responses",
            serde_json::json!({"model":"m","input":text}),
        ),
    ];
    for (path, body) in bodies {
        let (extensions, _) =
            forwarded(1 << 20, chunked_post(path, body.to_string().as_bytes(), 64)).await;
        assert!(extensions.get::<Prompt>().unwrap().keys().is_ok(), "{path}");
    }
}

/// Sends a request that must pass through unread, and checks it arrives whole, unkeyed.
async fn passes_through(limit: usize, request: Request<Chunks>, body: &[u8]) {
    let (extensions, bytes) = forwarded(limit, request).await;
    assert_eq!(bytes, body);
    assert!(extensions.get::<Prompt>().is_none());
    assert!(extensions.get::<BufferedBody>().is_none());
}

#[tokio::test]
async fn bodiless_methods_and_other_non_json_bodies_pass_through_unread() {
    let body = long_chat_body();
    let get = Request::get("/v1/responses/resp_1")
        .body(Chunks::of(b"", 1))
        .unwrap();
    passes_through(1 << 20, get, b"").await;
    let delete = Request::delete("/v1/conversations/conv_1")
        .body(Chunks::of(b"", 1))
        .unwrap();
    passes_through(1 << 20, delete, b"").await;
    let mut form = chunked_post("/v1/audio/transcriptions", &body, 100);
    form.headers_mut().insert(
        "content-type",
        "multipart/form-data; boundary=x".parse().unwrap(),
    );
    passes_through(1 << 20, form, &body).await;
    let mut text = chunked_post("/v1/embeddings", &body, 100);
    text.headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    passes_through(1 << 20, text, &body).await;
}

#[tokio::test]
async fn other_json_bodies_are_read_for_their_model_only() {
    let body = br#"{"input":["one","two"],"model":"embedder","dimensions":8}"#;
    for (method, path) in [
        (http::Method::POST, "/v1/embeddings"),
        (http::Method::POST, "/v1/chat/completions/"),
        (http::Method::PUT, "/v1/chat/completions"),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Chunks::of(body, 7))
            .unwrap();
        let (extensions, bytes) = forwarded(1 << 20, request).await;
        assert_eq!(bytes, body, "{path}");
        assert!(extensions.get::<Prompt>().is_none(), "{path}: not keyed");
        assert_eq!(
            extensions.get::<RequestModel>().map(RequestModel::as_str),
            Some("embedder"),
            "{path}"
        );
        assert_eq!(extensions.get::<BufferedBody>().unwrap().bytes(), &body[..]);
    }
}

#[tokio::test]
async fn a_compressed_body_passes_through_unread_on_a_keyed_path() {
    let body = long_chat_body();
    let mut gzip = chunked_post("/v1/chat/completions", &body, 100);
    gzip.headers_mut()
        .insert("content-encoding", "gzip".parse().unwrap());
    passes_through(1 << 20, gzip, &body).await;
}

#[tokio::test]
async fn a_keyed_body_is_read_as_json_whatever_its_content_type() {
    let body = long_chat_body();
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let mut request = chunked_post("/v1/chat/completions", &body, 100);
        request
            .headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        let (extensions, bytes) = forwarded(1 << 20, request).await;
        assert_eq!(bytes, body, "{content_type}: forwarded as sent");
        assert!(
            extensions.get::<Prompt>().unwrap().keys().is_ok(),
            "{content_type}"
        );
    }
}

/// Sends a request the layer must answer itself, and checks its status and error code
/// and that nothing was forwarded.
async fn answered(limit: usize, request: Request<Chunks>, status: u16, code: &str) {
    let (service, mut handle) = stack(limit);
    let response = in_time(service.oneshot(request)).await.unwrap();
    assert_eq!(response.status(), status);
    let json: serde_json::Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["error"]["code"], code);
    let nothing = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(
        nothing.is_err() || nothing.unwrap().is_none(),
        "nothing forwarded"
    );
}

#[tokio::test]
async fn a_stored_state_body_over_the_limit_is_a_413_and_nothing_is_forwarded() {
    let body = format!(
        r#"{{"model":"m","previous_response_id":"resp_east.1ef772aa..abc","input":{:?}}}"#,
        "x".repeat(5000)
    );
    for path in ["/v1/responses", "/v1/conversations/conv_1/items"] {
        // Chunked, growing past the limit.
        answered(
            1000,
            chunked_post(path, body.as_bytes(), 300),
            413,
            "request_too_large",
        )
        .await;
        // Declared over the limit: refused before reading.
        let mut declared = chunked_post(path, body.as_bytes(), 300);
        declared
            .headers_mut()
            .insert("content-length", body.len().into());
        answered(1000, declared, 413, "request_too_large").await;
    }
}

#[tokio::test]
async fn a_stored_state_body_in_an_encoding_not_decoded_is_a_415() {
    let body = br#"{"model":"m","previous_response_id":"resp_east.1ef772aa..abc","input":"hi"}"#;
    for encoding in ["gzip", "compress"] {
        let mut request = chunked_post("/v1/responses", body, 100);
        request
            .headers_mut()
            .insert("content-encoding", encoding.parse().unwrap());
        answered(1 << 20, request, 415, "unsupported_content_encoding").await;
    }
}

#[tokio::test]
async fn a_keyed_body_over_the_limit_is_routed_by_the_model_in_its_first_bytes() {
    let body = long_chat_body();
    let model_first = format!(
        r#"{{"model":"early","messages":[{{"role":"user","content":{:?}}}]}}"#,
        "x".repeat(5000)
    );
    let (extensions, bytes) = forwarded(
        1000,
        chunked_post("/v1/chat/completions", model_first.as_bytes(), 64),
    )
    .await;
    assert_eq!(bytes, model_first.as_bytes());
    assert!(extensions.get::<Prompt>().is_none());
    assert!(extensions.get::<BufferedBody>().is_none());
    assert_eq!(
        extensions.get::<RequestModel>().map(RequestModel::as_str),
        Some("early")
    );
    // The model past the first bytes: not known, and the body still arrives whole.
    let (extensions, bytes) =
        forwarded(1000, chunked_post("/v1/chat/completions", &body, 64)).await;
    assert_eq!(bytes, body);
    assert!(extensions.get::<RequestModel>().is_none());
}

#[tokio::test]
async fn a_body_declared_over_the_limit_streams_through_unread() {
    let body = long_chat_body();
    let mut request = chunked_post("/v1/chat/completions", &body, 100);
    request
        .headers_mut()
        .insert("content-length", body.len().into());
    passes_through(body.len() - 1, request, &body).await;
}

#[tokio::test]
async fn a_chunked_body_that_grows_over_the_limit_streams_through_whole() {
    let body = long_chat_body();
    // No Content-Length: the layer starts buffering, goes over, and forwards what it read
    // followed by the rest.
    for chunk in [1, 100, 999] {
        passes_through(
            1000,
            chunked_post("/v1/chat/completions", &body, chunk),
            &body,
        )
        .await;
    }
}

#[tokio::test]
async fn a_body_without_a_content_type_is_keyed() {
    let body = long_chat_body();
    let request = Request::post("/v1/chat/completions")
        .body(Chunks::of(&body, 50))
        .unwrap();
    let (extensions, bytes) = forwarded(1 << 20, request).await;
    assert_eq!(bytes, body);
    assert!(extensions.get::<Prompt>().unwrap().keys().is_ok());
}

#[tokio::test]
async fn unreadable_json_is_forwarded_unkeyed_not_refused() {
    let body = b"{\"model\":\"m\",\"messages\":[{\"role\":".to_vec();
    let (extensions, bytes) =
        forwarded(1 << 20, chunked_post("/v1/chat/completions", &body, 5)).await;
    assert_eq!(bytes, body);
    let prompt = extensions.get::<Prompt>().unwrap();
    assert!(matches!(prompt.keys(), Err(NoKeys::Unreadable { .. })));
}

#[tokio::test]
async fn a_large_body_is_keyed_like_a_small_one() {
    // Over the blocking threshold: keyed on the blocking pool, same keys as inline keying
    // of the same body under the same seed.
    let text = "x".repeat(400 * 1024);
    let body = serde_json::json!({"model":"m","prompt":text})
        .to_string()
        .into_bytes();
    let seed = KeySeed::random();
    let expected = grid_route_layer::keying::key_body(
        &seed,
        grid_route_layer::keying::Api::Completions,
        &body,
    )
    .unwrap();
    let (service, handle): (Mocked, MockHandle) = mock::pair();
    let mut handle = handle;
    let service = KeyingLayer::new(seed).layer(service);
    let call = tokio::spawn(service.oneshot(chunked_post("/v1/completions", &body, 64 * 1024)));
    let (received, respond) = next_forwarded(&mut handle).await;
    respond.send_response(Response::new(Full::new(Bytes::new())));
    in_time(call).await.unwrap().unwrap();
    let prompt = received.extensions().get::<Prompt>().unwrap();
    assert_eq!(
        prompt.keys().unwrap().as_slice(),
        expected.keys().unwrap().as_slice()
    );
}

#[tokio::test]
async fn a_duplicated_routing_field_is_a_400_and_nothing_is_forwarded() {
    let body = br#"{"model":"a","messages":[],"model":"b"}"#;
    let (service, mut handle) = stack(1 << 20);
    let response = in_time(service.oneshot(chunked_post("/v1/chat/completions", body, 3)))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.headers()["content-type"], "application/json");
    let json: serde_json::Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["error"]["code"], "duplicate_field");
    assert_eq!(json["error"]["param"], "model");
    assert_eq!(json["error"]["type"], "invalid_request_error");
    let nothing = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(
        nothing.is_err() || nothing.unwrap().is_none(),
        "nothing forwarded"
    );
}

/// An `Affinity` over an empty index, switched on or off.
fn affinity(enabled: bool) -> grid_route_layer::affinity::Affinity {
    let mut config = grid_route_layer::config::PrefixAffinityConfig::default();
    config.enabled = enabled;
    let settings = config.validate().unwrap();
    let index = grid_route_layer::index::PrefixIndex::new(settings.index, []);
    grid_route_layer::affinity::Affinity::new(std::sync::Arc::new(index), settings.affinity)
}

/// The prompt `layer` attaches to the long chat body.
async fn prompt_through(layer: KeyingLayer) -> Prompt {
    let request = chunked_post("/v1/chat/completions", &long_chat_body(), 4096);
    let (extensions, _) = forwarded_through(layer, request).await;
    extensions.get::<Prompt>().expect("prompt").clone()
}

#[tokio::test]
async fn with_affinity_switched_off_only_the_model_is_read_under_either_name_of_the_builder() {
    let seed = KeySeed::random();
    let on = prompt_through(KeyingLayer::new(seed.clone()).with_affinity(affinity(true))).await;
    assert!(on.keys().is_ok(), "affinity on: the prompt is keyed");
    let off = prompt_through(KeyingLayer::new(seed.clone()).with_affinity(affinity(false))).await;
    assert_eq!(off.model(), Some("demo"), "the model is still read");
    assert!(off.keys().is_err(), "affinity off: no keys");
    // The name the builder had keeps working, with the same effect.
    #[allow(deprecated)]
    let old = KeyingLayer::new(seed).follow(affinity(false));
    let old = prompt_through(old).await;
    assert_eq!(old.model(), Some("demo"));
    assert!(old.keys().is_err());
}
