//! `PinLayer` contract tests over `tower_test::mock`: what is pinned and forwarded with
//! the engine's ids, what is refused without forwarding anything, and how answers are
//! tagged.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin as StdPin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER,
};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_test::mock;

use super::*;
use crate::grid::{ClusterId, Grid, GridSettings, GridSpec};
use crate::keying::{KeySeed, KeyedBody, KeyingLayer};
use crate::metrics::PIN_TOTAL;
use crate::route::{BufferedBody, Pinned, Served};
use crate::test_support::{TestRecorder, grid_spec, poll_once};

const KEY: &[u8] = b"pin layer tests: a key of 32 bytes or more";
const NEXT_KEY: &[u8] = b"pin layer tests: the key after the reload";

/// A response body delivered in the given chunks, then the given trailers.
struct Chunks {
    data: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Chunks {
    fn of(body: &[u8], cuts: &[usize]) -> Self {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.extend([0, body.len()]);
        cuts.sort_unstable();
        Self {
            data: cuts
                .windows(2)
                .map(|w| Bytes::copy_from_slice(&body[w[0]..w[1]]))
                .collect(),
            trailers: None,
        }
    }

    fn whole(body: &str) -> Self {
        Self::of(body.as_bytes(), &[])
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: StdPin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// Reads a body that is ready at once: its data and its trailers.
fn collect_now<B>(body: B) -> (Bytes, Option<HeaderMap>)
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Debug,
{
    let Poll::Ready(collected) = poll_once(&mut Box::pin(body.collect())) else {
        panic!("the body is ready");
    };
    let collected = collected.unwrap();
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

type Req = Request<Full<Bytes>>;
type Mock = mock::Mock<Req, Response<Chunks>>;
type Handle = mock::Handle<Req, Response<Chunks>>;
type Answer = Response<PinBody<Chunks>>;

struct Fixture {
    spec: GridSpec,
    settings: GridSettings,
    grid: Grid,
    keys: PinKeys,
    service: PinService<Mock>,
    handle: Handle,
    recorder: TestRecorder,
}

/// Two sites of two clusters each; this replica runs at `east`.
fn fixture() -> Fixture {
    let spec = grid_spec(&[
        ("east", &["east-a", "east-b"]),
        ("west", &["west-a", "west-b"]),
    ]);
    let settings = GridSettings {
        local_site: Some("east".into()),
        ..GridSettings::default()
    };
    let grid = Grid::new(&spec, settings.clone()).unwrap();
    let keys = PinKeys::new(TagKeys::new(Some(TagKey::from_bytes(KEY).unwrap())));
    let (mock, handle) = mock::pair();
    let service = PinLayer::new(grid.clone(), keys.clone()).layer(mock);
    Fixture {
        spec,
        settings,
        grid,
        keys,
        service,
        handle,
        recorder: TestRecorder::default(),
    }
}

impl Fixture {
    fn id(&self, name: &str) -> ClusterId {
        self.grid
            .view()
            .clusters()
            .iter()
            .find(|c| c.id().name() == name)
            .unwrap()
            .id()
            .clone()
    }

    /// `engine_id` as this gateway tags it for cluster `name`.
    fn tag(&self, engine_id: &str, name: &str) -> String {
        let id = self.id(name);
        let kind = IdKind::of_id(engine_id).unwrap();
        self.keys
            .stamp(id.site(), id.digest())
            .tag(kind, engine_id)
            .unwrap()
    }

    fn reconfigure(&self, change: impl FnOnce(&mut GridSpec)) {
        let mut spec = self.spec.clone();
        change(&mut spec);
        self.grid.reconfigure(&spec, self.settings.clone()).unwrap();
    }

    fn drain(&self, names: &[&str]) {
        self.reconfigure(|spec| {
            for cluster in spec.sites.iter_mut().flat_map(|s| &mut s.clusters) {
                if names.contains(&cluster.name.as_str()) {
                    cluster.admit = false;
                }
            }
        });
    }

    fn set_queue(&self, name: &str, waiting: f64) {
        let view = self.grid.view();
        let cluster = view.cluster(&self.id(name)).unwrap();
        cluster
            .load()
            .record_queue(&format!("http://{name}"), Some(waiting), Instant::now());
    }

    fn pins(&self, outcome: &str) -> u64 {
        self.recorder
            .counter(PIN_TOTAL, &format!("outcome={outcome}"))
    }

    fn call(
        &mut self,
        request: Req,
    ) -> super::ResponseFuture<mock::future::ResponseFuture<Response<Chunks>>> {
        let service = &mut self.service;
        metrics::with_local_recorder(&self.recorder, || {
            let ready = std::future::poll_fn(|cx| service.poll_ready(cx));
            assert!(matches!(
                poll_once(&mut Box::pin(ready)),
                Poll::Ready(Ok(()))
            ));
            service.call(request)
        })
    }

    /// Sends `request`, expecting the layer to answer it itself; checks that nothing was
    /// forwarded and returns the status, headers and JSON body.
    fn refused(&mut self, request: Req) -> (StatusCode, HeaderMap, Value) {
        let mut future = self.call(request);
        let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
            panic!("the layer answers at once");
        };
        assert!(
            self.handle.poll_request().is_pending(),
            "a refused request must not be forwarded"
        );
        let (parts, body) = response.into_parts();
        let (bytes, _) = collect_now(body);
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        let message = json["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty());
        assert_eq!(parts.headers[CONTENT_TYPE], "application/json");
        (parts.status, parts.headers, json)
    }

    /// Sends `request` and returns what the inner service received, answering it with
    /// `answer`, and the answer as the client sees it.
    fn exchange(&mut self, request: Req, answer: Response<Chunks>) -> (Req, Answer) {
        let mut future = self.call(request);
        assert!(poll_once(&mut future).is_pending());
        let Poll::Ready(Some((forwarded, send))) = self.handle.poll_request() else {
            panic!("the request was forwarded");
        };
        send.send_response(answer);
        let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
            panic!("answered");
        };
        (forwarded, response)
    }

    /// Sends `request` and returns what the inner service received (answered with an
    /// empty 200).
    fn forwarded(&mut self, request: Req) -> Req {
        self.exchange(request, Response::new(Chunks::whole(""))).0
    }
}

fn get(path: &str) -> Req {
    Request::get(path).body(Full::default()).unwrap()
}

fn request(method: Method, path: &str) -> Req {
    Request::builder()
        .method(method)
        .uri(path)
        .body(Full::default())
        .unwrap()
}

/// A `POST /v1/responses` as `KeyingLayer` hands it on: body buffered, with its length.
fn post_responses(body: &str) -> Req {
    let bytes = Bytes::copy_from_slice(body.as_bytes());
    let mut request = Request::post("/v1/responses")
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_LENGTH, body.len())
        .body(Full::new(bytes.clone()))
        .unwrap();
    request.extensions_mut().insert(BufferedBody::new(bytes));
    request
}

fn pinned(request: &Req) -> Option<&str> {
    request
        .extensions()
        .get::<Pinned>()
        .map(|p| p.cluster().name())
}

/// The body, `Content-Length` and `BufferedBody` of a forwarded request.
fn forwarded_body(request: Req) -> (Bytes, Option<HeaderValue>, Option<Bytes>) {
    let (parts, body) = request.into_parts();
    let buffered = parts
        .extensions
        .get::<BufferedBody>()
        .map(|b| b.bytes().clone());
    (
        collect_now(body).0,
        parts.headers.get(CONTENT_LENGTH).cloned(),
        buffered,
    )
}

fn json_answer(status: StatusCode, served: Option<ClusterId>, body: Chunks) -> Response<Chunks> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(cluster) = served {
        response.extensions_mut().insert(Served::new(cluster));
    }
    response
}

// ---------------------------------------------------------------------------------------
// Paths

#[test]
fn a_tagged_response_path_reaches_its_cluster_with_the_engine_id() {
    let mut f = fixture();
    let tagged = f.tag("resp_68a3f0", "east-b");
    let forwarded = f.forwarded(get(&format!(
        "/v1/responses/{tagged}?include[]=usage&stream=true"
    )));
    assert_eq!(
        forwarded.uri(),
        "/v1/responses/resp_68a3f0?include[]=usage&stream=true"
    );
    assert_eq!(pinned(&forwarded), Some("east-b"));
    assert_eq!(forwarded.headers()[ACCEPT_ENCODING], "identity");
    assert_eq!(f.pins("pinned"), 1);
    assert_eq!(f.recorder.total(PIN_TOTAL), 1);
}

#[test]
fn an_absolute_form_uri_keeps_its_scheme_and_authority() {
    let mut f = fixture();
    let tagged = f.tag("resp_1", "west-a");
    let forwarded = f.forwarded(get(&format!("http://gateway:8080/v1/responses/{tagged}")));
    assert_eq!(forwarded.uri(), "http://gateway:8080/v1/responses/resp_1");
    assert_eq!(pinned(&forwarded), Some("west-a"));
}

#[test]
fn every_stored_state_path_is_untagged_and_pinned() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "west-b");
    let conv = f.tag("conv_c1", "west-b");
    let cases = [
        (
            Method::GET,
            format!("/v1/responses/{resp}"),
            "/v1/responses/resp_r1",
        ),
        (
            Method::DELETE,
            format!("/v1/responses/{resp}"),
            "/v1/responses/resp_r1",
        ),
        (
            Method::POST,
            format!("/v1/responses/{resp}/cancel"),
            "/v1/responses/resp_r1/cancel",
        ),
        (
            Method::GET,
            format!("/v1/responses/{resp}/input_items?limit=5&order=asc"),
            "/v1/responses/resp_r1/input_items?limit=5&order=asc",
        ),
        (
            Method::GET,
            format!("/v1/conversations/{conv}"),
            "/v1/conversations/conv_c1",
        ),
        (
            Method::POST,
            format!("/v1/conversations/{conv}"),
            "/v1/conversations/conv_c1",
        ),
        (
            Method::DELETE,
            format!("/v1/conversations/{conv}"),
            "/v1/conversations/conv_c1",
        ),
        (
            Method::GET,
            format!("/v1/conversations/{conv}/items?after=msg_1"),
            "/v1/conversations/conv_c1/items?after=msg_1",
        ),
        (
            Method::POST,
            format!("/v1/conversations/{conv}/items"),
            "/v1/conversations/conv_c1/items",
        ),
        (
            Method::GET,
            format!("/v1/conversations/{conv}/items/msg_abc"),
            "/v1/conversations/conv_c1/items/msg_abc",
        ),
        (
            Method::DELETE,
            format!("/v1/conversations/{conv}/items/msg_abc"),
            "/v1/conversations/conv_c1/items/msg_abc",
        ),
    ];
    for (method, path, engine_path) in &cases {
        let forwarded = f.forwarded(request(method.clone(), path));
        assert_eq!(forwarded.method(), method);
        assert_eq!(forwarded.uri(), *engine_path, "{method} {path}");
        assert_eq!(pinned(&forwarded), Some("west-b"), "{method} {path}");
    }
    assert_eq!(f.pins("pinned"), cases.len() as u64);
}

#[test]
fn bad_ids_in_paths_answer_404_json_and_forward_nothing() {
    let mut f = fixture();
    let resp = f.tag("resp_abc", "east-a");
    let conv = f.tag("conv_abc", "east-a");
    let mac = resp.split('.').nth(2).unwrap().to_owned();
    let paths = [
        // A mac that does not verify, or none with a key set.
        format!("/v1/responses/{}", resp.replace(&mac, "0123456789abcdef")),
        "/v1/responses/resp_east.1ef772aa..abc".to_owned(),
        // Malformed tags.
        "/v1/responses/resp_east.1ef772aa".to_owned(),
        "/v1/responses/resp_East.1ef772aa.0123456789abcdef.abc".to_owned(),
        // Untagged ids.
        "/v1/responses/resp_abc".to_owned(),
        "/v1/conversations/conv_abc/items".to_owned(),
        // The wrong kind for the place.
        format!("/v1/responses/{conv}"),
        format!("/v1/conversations/{resp}"),
        "/v1/responses/msg_abc".to_owned(),
        // Percent-encoding anywhere in the id segment or after it.
        format!("/v1/responses/{}", resp.replacen('.', "%2E", 1)),
        format!("/v1/responses/{}", resp.replacen("resp_", "resp%5F", 1)),
        format!("/v1/responses/{resp}%2F..%2Fadmin"),
        format!("/v1/conversations/{conv}/items/msg%2F..%2F..%2Fadmin"),
        format!("/v1/conversations/{conv}/items/%2e%2e"),
        // Segments after the id that are not plain.
        format!("/v1/responses/{resp}/../../admin"),
        format!("/v1/responses/{resp}/./cancel"),
        format!("/v1/responses/{resp}/"),
        format!("/v1/conversations/{conv}//items"),
        format!("/v1/conversations/{conv}/items/a..b"),
    ];
    for path in &paths {
        let (status, _, json) = f.refused(get(path));
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(json["error"]["type"], "invalid_request_error", "{path}");
        assert_eq!(json["error"]["code"], "invalid_id", "{path}");
    }
    assert_eq!(f.pins("bad_tag"), paths.len() as u64);
    assert_eq!(f.recorder.total(PIN_TOTAL), paths.len() as u64);
}

#[test]
fn a_drained_cluster_answers_503_with_retry_after_and_forwards_nothing() {
    let mut f = fixture();
    let resp = f.tag("resp_abc", "east-b");
    f.drain(&["east-b"]);
    let (status, headers, json) = f.refused(get(&format!("/v1/responses/{resp}")));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[RETRY_AFTER], "5");
    assert_eq!(RETRY_AFTER_SECS, 5);
    assert_eq!(json["error"]["type"], "server_error");
    assert_eq!(json["error"]["code"], "stored_state_unavailable");
    // A body that continues the stored response is refused alike.
    let body = format!(r#"{{"model":"m","previous_response_id":"{resp}","input":"hi"}}"#);
    let (status, headers, _) = f.refused(post_responses(&body));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[RETRY_AFTER], "5");
    assert_eq!(f.pins("unavailable"), 2);
}

#[test]
fn a_cluster_with_no_healthy_endpoint_answers_503() {
    let mut f = fixture();
    let resp = f.tag("resp_abc", "west-a");
    let view = f.grid.view();
    view.cluster(&f.id("west-a"))
        .unwrap()
        .load()
        .set_endpoint_healthy("http://west-a", false);
    let (status, headers, _) = f.refused(get(&format!("/v1/responses/{resp}")));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[RETRY_AFTER], "5");
    assert_eq!(f.pins("unavailable"), 1);
}

#[test]
fn a_cluster_removed_by_reconfigure_answers_404_gone() {
    let mut f = fixture();
    let resp = f.tag("resp_abc", "west-b");
    let conv = f.tag("conv_abc", "west-b");
    f.reconfigure(|spec| spec.sites[1].clusters.retain(|c| c.name != "west-b"));
    let (status, _, json) = f.refused(get(&format!("/v1/responses/{resp}")));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json["error"]["code"], "stored_state_gone");
    let body = format!(r#"{{"model":"m","conversation":"{conv}","input":"hi"}}"#);
    let (status, _, _) = f.refused(post_responses(&body));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(f.pins("gone"), 2);
    assert_eq!(f.recorder.total(PIN_TOTAL), 2);
}

#[test]
fn random_macs_are_never_forwarded() {
    let mut f = fixture();
    let tagged = f.tag("resp_abc", "east-a");
    let parts: Vec<&str> = tagged.splitn(4, '.').collect();
    // Seeded: deterministic, independent of the mac.
    let mut draws = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
    let tries = 3000;
    for _ in 0..tries {
        let mac = format!("{:016x}", draws.u64(..));
        if mac == parts[2] {
            continue;
        }
        let forged = format!("{}.{}.{mac}.{}", parts[0], parts[1], parts[3]);
        let (status, _, _) = f.refused(get(&format!("/v1/responses/{forged}")));
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    assert_eq!(f.pins("bad_tag"), tries);
}

// ---------------------------------------------------------------------------------------
// Bodies

/// Sends `template` with `{ID}` (and `{CONV}`) replaced by tags for `east-b`, and checks
/// that exactly the engine ids were spliced in: the body, its length and `BufferedBody`.
fn assert_spliced(f: &mut Fixture, template: &str) {
    let resp = f.tag("resp_r9", "east-b");
    let conv = f.tag("conv_c9", "east-b");
    let sent = template.replace("{ID}", &resp).replace("{CONV}", &conv);
    let expected = template
        .replace("{ID}", "resp_r9")
        .replace("{CONV}", "conv_c9");
    let forwarded = f.forwarded(post_responses(&sent));
    assert_eq!(pinned(&forwarded), Some("east-b"), "{template}");
    assert_eq!(forwarded.headers()[ACCEPT_ENCODING], "identity");
    let (body, length, buffered) = forwarded_body(forwarded);
    assert_eq!(std::str::from_utf8(&body).unwrap(), expected, "{template}");
    assert_eq!(length.unwrap(), expected.len().to_string().as_str());
    assert_eq!(buffered.unwrap(), body);
}

#[test]
fn previous_response_id_is_untagged_by_splicing_only_the_id() {
    let mut f = fixture();
    for template in [
        r#"{"model":"m","previous_response_id":"{ID}","input":"hi"}"#,
        r#"{"input":"hi","previous_response_id":"{ID}","model":"m"}"#,
        "{\n  \"previous_response_id\" :\t\"{ID}\" ,\n  \"model\": \"m\"\n}\n",
        r#"{"model":"m","input":[{"role":"user","content":"caf\u00e9 \"resp_east.x\" \\ é 日本 😀"}],"metadata":{"previous_response_id":"resp_keep"},"previous_response_id":"{ID}","temperature":0.2e1}"#,
        r#"{"previous\u005fresponse_id":"{ID}","instructions":"line\nbreak \ud83d\ude00"}"#,
    ] {
        assert_spliced(&mut f, template);
    }
}

#[test]
fn conversation_as_a_string_or_an_object_is_untagged_in_place() {
    let mut f = fixture();
    for template in [
        r#"{"model":"m","conversation":"{CONV}","input":"hi"}"#,
        r#"{"conversation":"{CONV}","model":"m"}"#,
        r#"{"model":"m","conversation":{"id":"{CONV}"},"input":"hi"}"#,
        r#"{"conversation":{"metadata":{"id":"x"},"id":"{CONV}","note":"é"},"input":[{"type":"message","content":"\u00e9 {\"id\":1}"}],"model":"m"}"#,
        // Both fields, stored on one cluster.
        r#"{"conversation":{"id":"{CONV}"},"previous_response_id":"{ID}","model":"m"}"#,
    ] {
        assert_spliced(&mut f, template);
    }
    assert_eq!(f.pins("pinned"), 5);
}

#[test]
fn a_tag_written_with_escapes_is_replaced_whole() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "west-a");
    let escaped = resp.replace('.', "\\u002e");
    let body = format!(r#"{{"previous_response_id":"{escaped}","model":"m"}}"#);
    let forwarded = f.forwarded(post_responses(&body));
    assert_eq!(pinned(&forwarded), Some("west-a"));
    let (body, _, _) = forwarded_body(forwarded);
    assert_eq!(body, r#"{"previous_response_id":"resp_r1","model":"m"}"#);
}

#[test]
fn a_request_without_content_length_gets_none_added() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "west-a");
    let mut request = post_responses(&format!(r#"{{"previous_response_id":"{resp}"}}"#));
    request.headers_mut().remove(CONTENT_LENGTH);
    let (body, length, _) = forwarded_body(f.forwarded(request));
    assert_eq!(body, r#"{"previous_response_id":"resp_r1"}"#);
    assert_eq!(length, None);
}

#[test]
fn duplicate_stored_state_fields_answer_400_and_forward_nothing() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "east-a");
    let conv = f.tag("conv_c1", "east-a");
    for (body, field) in [
        (
            format!(
                r#"{{"previous_response_id":"{resp}","model":"m","previous_response_id":"{resp}"}}"#
            ),
            "previous_response_id",
        ),
        (
            format!(r#"{{"conversation":"{conv}","conversation":null}}"#),
            "conversation",
        ),
        (
            format!(r#"{{"conversation":{{"id":"{conv}","id":"conv_x"}}}}"#),
            "conversation.id",
        ),
    ] {
        let (status, _, json) = f.refused(post_responses(&body));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(json["error"]["code"], "duplicate_field");
        assert_eq!(json["error"]["param"], field);
    }
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

#[test]
fn ids_of_two_clusters_in_one_body_answer_400() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "east-a");
    let conv = f.tag("conv_c1", "west-a");
    let body = format!(r#"{{"previous_response_id":"{resp}","conversation":"{conv}"}}"#);
    let (status, _, json) = f.refused(post_responses(&body));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json["error"]["code"], "conflicting_stored_state");
}

#[test]
fn bad_tags_in_the_body_answer_404_naming_the_field() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "east-a");
    let conv = f.tag("conv_c1", "east-a");
    let mac = resp.split('.').nth(2).unwrap().to_owned();
    for (body, field) in [
        (
            format!(
                r#"{{"previous_response_id":"{}"}}"#,
                resp.replace(&mac, "fedcba9876543210")
            ),
            "previous_response_id",
        ),
        (
            format!(r#"{{"previous_response_id":"{conv}"}}"#),
            "previous_response_id",
        ),
        (format!(r#"{{"conversation":"{resp}"}}"#), "conversation"),
        (
            r#"{"conversation":{"id":"conv_east.1ef772aa"}}"#.to_owned(),
            "conversation.id",
        ),
        (format!(r#"{{"conversation":"{conv}%2F"}}"#), "conversation"),
        // A lone surrogate is not text; no id holds it.
        (
            r#"{"previous_response_id":"resp_\ud800"}"#.to_owned(),
            "previous_response_id",
        ),
    ] {
        let (status, _, json) = f.refused(post_responses(&body));
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(json["error"]["param"], field, "{body}");
        assert_eq!(json["error"]["code"], "invalid_id");
    }
    assert_eq!(f.pins("bad_tag"), 6);
}

#[test]
fn a_body_naming_no_stored_state_is_forwarded_as_sent_and_counts_nothing() {
    let mut f = fixture();
    for body in [
        r#"{"model":"m","input":"resp_east.1ef772aa..abc"}"#,
        r#"{"model":"m","previous_response_id":null,"conversation":null}"#,
        r#"{"model":"m","conversation":{"id":null}}"#,
        r#"{"model":"m","input":"hi""#,
        "not json at all",
    ] {
        let forwarded = f.forwarded(post_responses(body));
        assert_eq!(pinned(&forwarded), None, "{body}");
        let (sent, length, buffered) = forwarded_body(forwarded);
        assert_eq!(sent, body);
        assert_eq!(length.unwrap(), body.len().to_string().as_str());
        assert_eq!(buffered.unwrap(), body);
    }
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

#[test]
fn a_body_cut_after_a_backslash_is_forwarded_as_sent() {
    // Found by the `reference` fuzz target: skipping a string whose last byte is a
    // backslash stepped past the end of the body and panicked.
    let mut f = fixture();
    for body in [
        r#"{"model":"m","metadata":"\"#,
        r#"{"model":"m","input":"hi\"#,
    ] {
        let forwarded = f.forwarded(post_responses(body));
        assert_eq!(pinned(&forwarded), None, "{body}");
        assert_eq!(forwarded_body(forwarded).0, body);
    }
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

#[test]
fn an_untagged_id_in_a_body_is_forwarded_untouched_and_unpinned() {
    let mut f = fixture();
    let body = r#"{"model":"m","previous_response_id":"resp_plain","conversation":"conv_plain"}"#;
    let forwarded = f.forwarded(post_responses(body));
    assert_eq!(pinned(&forwarded), None);
    assert_eq!(forwarded_body(forwarded).0, body);
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

#[test]
fn a_body_keying_did_not_buffer_passes_through_untouched() {
    let mut f = fixture();
    let resp = f.tag("resp_r1", "east-a");
    let body = format!(r#"{{"model":"m","previous_response_id":"{resp}"}}"#);
    let mut request = post_responses(&body);
    request.extensions_mut().remove::<BufferedBody>();
    let forwarded = f.forwarded(request);
    assert_eq!(pinned(&forwarded), None);
    let (sent, length, buffered) = forwarded_body(forwarded);
    assert_eq!(sent, body);
    assert_eq!(length.unwrap(), body.len().to_string().as_str());
    assert!(buffered.is_none());
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

// ---------------------------------------------------------------------------------------
// New conversations

#[test]
fn a_new_conversation_is_pinned_to_the_least_loaded_local_cluster() {
    let mut f = fixture();
    f.set_queue("east-a", 3.0);
    f.set_queue("east-b", 1.0);
    f.set_queue("west-a", 0.0);
    f.set_queue("west-b", 0.0);
    let forwarded = f.forwarded(request(Method::POST, "/v1/conversations"));
    assert_eq!(pinned(&forwarded), Some("east-b"));
    assert_eq!(forwarded.headers()[ACCEPT_ENCODING], "identity");
    assert_eq!(f.pins("pinned"), 1);
}

#[test]
fn a_new_conversation_goes_to_another_site_when_the_local_one_is_drained() {
    let mut f = fixture();
    f.drain(&["east-a", "east-b"]);
    f.set_queue("west-a", 4.0);
    f.set_queue("west-b", 2.0);
    let forwarded = f.forwarded(request(Method::POST, "/v1/conversations"));
    assert_eq!(pinned(&forwarded), Some("west-b"));
}

#[test]
fn unmeasured_local_clusters_share_new_conversations() {
    let mut f = fixture();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let forwarded = f.forwarded(request(Method::POST, "/v1/conversations"));
        seen.insert(pinned(&forwarded).unwrap().to_owned());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["east-a", "east-b"]);
}

#[test]
fn a_new_conversation_with_no_admitted_cluster_answers_503() {
    let mut f = fixture();
    f.drain(&["east-a", "east-b", "west-a", "west-b"]);
    let (status, headers, json) = f.refused(request(Method::POST, "/v1/conversations"));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[RETRY_AFTER], "5");
    assert_eq!(json["error"]["code"], "no_available_cluster");
    assert_eq!(f.pins("unavailable"), 1);
}

#[test]
fn other_requests_pass_untouched_and_count_nothing() {
    let mut f = fixture();
    let mut chat = Request::post("/v1/chat/completions")
        .header(ACCEPT_ENCODING, "gzip")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[]}"#,
        )))
        .unwrap();
    chat.extensions_mut()
        .insert(BufferedBody::new(Bytes::from_static(
            br#"{"model":"m","messages":[]}"#,
        )));
    for request in [
        chat,
        get("/v1/models"),
        get("/v1/responses"),
        request(Method::GET, "/v1/conversations"),
        get("/v1/responses/"),
    ] {
        let uri = request.uri().clone();
        let forwarded = f.forwarded(request);
        assert_eq!(forwarded.uri(), &uri);
        assert_eq!(pinned(&forwarded), None, "{uri}");
        if uri.path() == "/v1/chat/completions" {
            assert_eq!(forwarded.headers()[ACCEPT_ENCODING], "gzip");
        }
    }
    assert_eq!(f.recorder.total(PIN_TOTAL), 0);
}

// ---------------------------------------------------------------------------------------
// Answers

const RESPONSE_JSON: &str = r#"{"id":"resp_new1","object":"response","status":"completed","previous_response_id":"resp_old","conversation":{"id":"conv_c1"},"output":[{"id":"msg_1","type":"message","content":[{"type":"output_text","text":"{\"id\":\"resp_fake\"} é"}]}],"metadata":{"id":"resp_meta"}}"#;

const RESPONSE_SSE: &str = "event: response.created\n\
data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_new1\",\"conversation\":{\"id\":\"conv_c1\"},\"output\":[]}}\n\
\n\
event: response.output_text.delta\n\
data: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"\\\"resp_fake\\\"\"}\n\
\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_new1\",\"previous_response_id\":\"resp_old\"}}\n\
\n\
data: [DONE]\n\
\n";

/// `body` with the answer's own ids tagged for `name`.
fn tagged_answer(f: &Fixture, body: &str, name: &str) -> String {
    body.replace(
        "\"resp_new1\"",
        &format!("\"{}\"", f.tag("resp_new1", name)),
    )
    .replace("\"resp_old\"", &format!("\"{}\"", f.tag("resp_old", name)))
    .replace("\"conv_c1\"", &format!("\"{}\"", f.tag("conv_c1", name)))
}

/// Sends a request for `path` and answers it from `name` with `body` cut at `cuts`.
fn answer_through(
    f: &mut Fixture,
    path: &str,
    content_type: &'static str,
    body: &str,
    cuts: &[usize],
    name: &str,
) -> (Bytes, HeaderMap) {
    let mut answer = json_answer(
        StatusCode::OK,
        Some(f.id(name)),
        Chunks::of(body.as_bytes(), cuts),
    );
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    answer
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let (_, response) = f.exchange(request(Method::POST, path), answer);
    assert!(response.body().is_tagged());
    let (parts, body) = response.into_parts();
    (collect_now(body).0, parts.headers)
}

#[test]
fn json_answers_are_tagged_with_the_serving_cluster_whatever_the_chunks() {
    let mut f = fixture();
    let expected = tagged_answer(&f, RESPONSE_JSON, "west-a");
    assert_ne!(expected, RESPONSE_JSON);
    for size in 1..=RESPONSE_JSON.len() {
        let cuts: Vec<usize> = (size..RESPONSE_JSON.len()).step_by(size).collect();
        let (body, headers) = answer_through(
            &mut f,
            "/v1/responses",
            "application/json",
            RESPONSE_JSON,
            &cuts,
            "west-a",
        );
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            expected,
            "chunks of {size}"
        );
        assert!(headers.get(CONTENT_LENGTH).is_none());
    }
}

#[test]
fn sse_answers_are_tagged_with_lf_and_crlf_line_endings_whatever_the_chunks() {
    let mut f = fixture();
    let crlf = RESPONSE_SSE.replace('\n', "\r\n");
    for stream in [RESPONSE_SSE, crlf.as_str()] {
        let expected = tagged_answer(&f, stream, "east-a");
        assert_ne!(expected, stream);
        let mut cut_sets: Vec<Vec<usize>> = (1..=64)
            .map(|size| (size..stream.len()).step_by(size).collect())
            .collect();
        // Irregular cuts, around the ids and the line endings.
        let mut state = 7u64;
        for _ in 0..200 {
            let cuts = (0..6)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    (state >> 33) as usize
                })
                .collect();
            cut_sets.push(cuts);
        }
        for cuts in &cut_sets {
            let (body, headers) = answer_through(
                &mut f,
                "/v1/responses",
                "text/event-stream",
                stream,
                cuts,
                "east-a",
            );
            assert_eq!(
                std::str::from_utf8(&body).unwrap(),
                expected,
                "cuts {cuts:?}"
            );
            assert!(headers.get(CONTENT_LENGTH).is_none());
        }
    }
}

#[test]
fn conversation_answers_are_tagged_too() {
    let mut f = fixture();
    let body = r#"{"id":"conv_c1","object":"conversation","created_at":1,"metadata":{}}"#;
    let (tagged, _) = answer_through(
        &mut f,
        "/v1/conversations",
        "application/json",
        body,
        &[9, 17],
        "east-b",
    );
    assert_eq!(tagged, tagged_answer(&f, body, "east-b"));
}

#[test]
fn held_bytes_are_sent_before_the_trailers() {
    let mut f = fixture();
    let body = r#"{"id":"resp_new1"#;
    let mut chunks = Chunks::of(body.as_bytes(), &[10]);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-done", HeaderValue::from_static("1"));
    chunks.trailers = Some(trailers);
    let answer = json_answer(StatusCode::OK, Some(f.id("east-a")), chunks);
    let (_, response) = f.exchange(get("/v1/responses"), answer);
    let (bytes, trailers) = collect_now(response.into_body());
    // An unfinished document: the id that never closed is released untagged.
    assert_eq!(bytes, body);
    assert_eq!(trailers.unwrap()["x-done"], "1");
}

#[test]
fn answers_that_cannot_be_tagged_pass_untouched() {
    let mut f = fixture();
    let served = Some(f.id("east-a"));
    let gzip = {
        let mut answer = json_answer(StatusCode::OK, served.clone(), Chunks::whole(RESPONSE_JSON));
        answer
            .headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        answer
    };
    let plain_text = {
        let mut answer = json_answer(StatusCode::OK, served.clone(), Chunks::whole(RESPONSE_JSON));
        answer
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        answer
    };
    let cases = [
        (
            "/v1/responses",
            json_answer(
                StatusCode::NOT_FOUND,
                served.clone(),
                Chunks::whole(RESPONSE_JSON),
            ),
        ),
        (
            "/v1/responses",
            json_answer(
                StatusCode::TOO_MANY_REQUESTS,
                served.clone(),
                Chunks::whole(RESPONSE_JSON),
            ),
        ),
        (
            "/v1/responses",
            json_answer(StatusCode::OK, None, Chunks::whole(RESPONSE_JSON)),
        ),
        ("/v1/responses", gzip),
        ("/v1/responses", plain_text),
        (
            "/v1/chat/completions",
            json_answer(StatusCode::OK, served.clone(), Chunks::whole(RESPONSE_JSON)),
        ),
    ];
    for (path, mut answer) in cases {
        answer
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(RESPONSE_JSON.len()));
        let status = answer.status();
        let (_, response) = f.exchange(request(Method::POST, path), answer);
        assert!(!response.body().is_tagged());
        assert_eq!(response.status(), status);
        assert_eq!(
            response.headers()[CONTENT_LENGTH],
            RESPONSE_JSON.len().to_string().as_str()
        );
        assert_eq!(collect_now(response.into_body()).0, RESPONSE_JSON);
    }
}

// ---------------------------------------------------------------------------------------
// Key rotation

#[test]
fn setting_keys_through_the_handle_keeps_the_old_key_only_while_it_is_named() {
    let keys = PinKeys::new(TagKeys::new(Some(TagKey::from_bytes(KEY).unwrap())));
    let site = crate::grid::SiteName::new("east").unwrap();
    let digest = crate::grid::ClusterDigest::of_name("east-a");
    let old = keys
        .stamp(&site, digest)
        .tag(IdKind::Response, "resp_1")
        .unwrap();
    // The gateway keeps one clone; the layers hold others.
    let reloader = keys.clone();
    reloader.set(
        TagKeys::new(Some(TagKey::from_bytes(NEXT_KEY).unwrap()))
            .with_previous(Some(TagKey::from_bytes(KEY).unwrap())),
    );
    assert!(keys.untag(IdKind::Response, &old).is_ok());
    // New ids are signed with the new key.
    let new = keys
        .stamp(&site, digest)
        .tag(IdKind::Response, "resp_1")
        .unwrap();
    assert_ne!(new, old);
    reloader.set(TagKeys::new(Some(TagKey::from_bytes(NEXT_KEY).unwrap())));
    assert_eq!(keys.untag(IdKind::Response, &old), Err(BadTag::BadMac));
    assert!(keys.untag(IdKind::Response, &new).is_ok());
}

#[test]
fn a_rotated_key_accepts_an_id_of_the_named_previous_key_through_the_layer() {
    let mut f = fixture();
    let old = f.tag("resp_r1", "west-b");
    f.keys.set(
        TagKeys::new(Some(TagKey::from_bytes(NEXT_KEY).unwrap()))
            .with_previous(Some(TagKey::from_bytes(KEY).unwrap())),
    );
    let forwarded = f.forwarded(get(&format!("/v1/responses/{old}")));
    assert_eq!(forwarded.uri(), "/v1/responses/resp_r1");
    assert_eq!(pinned(&forwarded), Some("west-b"));
    // Answers are now tagged with the new key.
    let new = f.tag("resp_r1", "west-b");
    assert_ne!(new, old);
    let body = r#"{"id":"resp_r1"}"#;
    let (tagged, _) = answer_through(
        &mut f,
        "/v1/responses",
        "application/json",
        body,
        &[],
        "west-b",
    );
    assert_eq!(tagged, format!(r#"{{"id":"{new}"}}"#));
}

// ---------------------------------------------------------------------------------------
// Stacked as a gateway stacks it

/// A request at the fake balancer: the cluster and the `previous_response_id` it saw.
type Visit = (String, Option<String>);

/// Keying → Pin → a balancer that goes where the request is pinned (else to the next
/// cluster in turn) and answers a new response id from that cluster.
#[tokio::test]
async fn a_chain_of_follow_ups_stays_on_the_cluster_that_stored_the_first_answer() {
    let grid = Grid::new(
        &grid_spec(&[
            ("east", &["east-a", "east-b"]),
            ("west", &["west-a", "west-b"]),
        ]),
        GridSettings::default(),
    )
    .unwrap();
    let keys = PinKeys::new(TagKeys::new(Some(TagKey::from_bytes(KEY).unwrap())));
    let clusters: Vec<ClusterId> = grid.view().cluster_ids().collect();
    // Each request the balancer took: its cluster and the `previous_response_id` it saw.
    let visits: Arc<Mutex<Vec<Visit>>> = Arc::default();
    let balancer = {
        let visits = Arc::clone(&visits);
        let turn = Arc::new(Mutex::new(1usize));
        service_fn(move |request: Request<KeyedBody<Full<Bytes>>>| {
            let pinned = request
                .extensions()
                .get::<Pinned>()
                .map(|p| p.cluster().clone());
            let cluster = pinned.clone().unwrap_or_else(|| {
                let mut turn = turn.lock().unwrap();
                *turn += 1;
                clusters[*turn % clusters.len()].clone()
            });
            let visits = Arc::clone(&visits);
            async move {
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let json: Value = serde_json::from_slice(&body).unwrap();
                let previous = json["previous_response_id"].as_str().map(str::to_owned);
                let mut visits = visits.lock().unwrap();
                visits.push((cluster.name().to_owned(), previous.clone()));
                let id = format!("resp_{}", visits.len());
                let answer = serde_json::json!({"id": id, "object": "response", "previous_response_id": previous});
                let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response.extensions_mut().insert(Served::new(cluster));
                Ok::<_, Infallible>(response)
            }
        })
    };
    let gateway = KeyingLayer::new(KeySeed::random())
        .layer(PinLayer::new(grid.clone(), keys.clone()).layer(balancer));

    let mut previous: Option<String> = None;
    for turn in 0..=10 {
        let mut body =
            serde_json::json!({"model": "m", "input": format!("turn {turn}: é \"quoted\"")});
        if let Some(id) = &previous {
            body["previous_response_id"] = Value::from(id.as_str());
        }
        let request = Request::post("/v1/responses")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = gateway.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let answer = response.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        let id = answer["id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("resp_"), "{id}");
        assert_ne!(
            id,
            format!("resp_{}", turn + 1),
            "the answer's id is tagged"
        );
        previous = Some(id);
    }
    let visits = visits.lock().unwrap();
    assert_eq!(visits.len(), 11);
    let first = &visits[0].0;
    for (n, (cluster, previous)) in visits.iter().enumerate().skip(1) {
        assert_eq!(cluster, first, "follow-up {n} left the cluster");
        // The engine saw its own id, never a tag.
        assert_eq!(previous.as_deref(), Some(format!("resp_{n}").as_str()));
    }
    // Without pinning, the balancer would have moved on every request.
    assert_ne!(first, "east-a");
}

/// The whole request path of a gateway, Keying → Pin → Confirm → Affinity → Select, over
/// engines that answer with the id of a new stored response.
#[tokio::test]
async fn in_the_full_stack_a_follow_up_goes_to_its_cluster_however_loaded_the_others_are() {
    use crate::affinity::{Affinity, AffinityLayer};
    use crate::config::PrefixAffinityConfig;
    use crate::confirm::ConfirmLayer;
    use crate::grid::Cluster;
    use crate::index::{IndexSettings, PrefixIndex};
    use crate::select::Select;

    let grid = Grid::new(
        &grid_spec(&[("east", &["east-a", "east-b"]), ("west", &["west-a"])]),
        GridSettings::default(),
    )
    .unwrap();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        grid.view().cluster_ids(),
    ));
    let affinity = Affinity::new(
        Arc::clone(&index),
        PrefixAffinityConfig::default().validate().unwrap().affinity,
    );
    let keys = PinKeys::new(TagKeys::new(Some(TagKey::from_bytes(KEY).unwrap())));
    // What each engine saw: its cluster, the method and path, and the body.
    let seen: Arc<Mutex<Vec<(String, String, Bytes)>>> = Arc::default();
    let engines = {
        let seen = Arc::clone(&seen);
        move |cluster: &Cluster| {
            let name = cluster.id().name().to_owned();
            let seen = Arc::clone(&seen);
            service_fn(move |request: Request<KeyedBody<Full<Bytes>>>| {
                let name = name.clone();
                let seen = Arc::clone(&seen);
                async move {
                    let line = format!("{} {}", request.method(), request.uri());
                    let body = request.into_body().collect().await?.to_bytes();
                    let mut seen = seen.lock().unwrap();
                    seen.push((name, line, body));
                    let answer = format!(r#"{{"id":"resp_{}","object":"response"}}"#, seen.len());
                    let mut response = Response::new(Full::new(Bytes::from(answer)));
                    response
                        .headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    Ok::<_, crate::route::BoxError>(response)
                }
            })
        }
    };
    let gateway = KeyingLayer::new(KeySeed::random()).layer(
        PinLayer::new(grid.clone(), keys.clone()).layer(ConfirmLayer::new(affinity.clone()).layer(
            AffinityLayer::new(grid.clone(), affinity).layer(Select::new(grid.clone(), engines)),
        )),
    );
    let send = |request: Request<Full<Bytes>>| {
        let gateway = gateway.clone();
        async move {
            let response = gateway.oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let json: Value = serde_json::from_slice(&body).unwrap();
            json["id"].as_str().unwrap().to_owned()
        }
    };
    let post = |body: String| {
        Request::post("/v1/responses")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };

    let first = send(post(r#"{"model":"m","input":"hello"}"#.to_owned())).await;
    let stored_at = seen.lock().unwrap()[0].0.clone();
    // Every other cluster is now far lighter than the one holding the response.
    for cluster in grid.view().clusters() {
        let name = cluster.id().name();
        let waiting = if name == stored_at { 100.0 } else { 0.0 };
        cluster
            .load()
            .record_queue(&format!("http://{name}"), Some(waiting), Instant::now());
    }
    let follow_up = format!(r#"{{"model":"m","previous_response_id":"{first}","input":"again"}}"#);
    let second = send(post(follow_up)).await;
    send(get(&format!("/v1/responses/{second}"))).await;

    let seen = seen.lock().unwrap();
    let lines: Vec<(&str, &str)> = seen
        .iter()
        .map(|(c, l, _)| (c.as_str(), l.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            (stored_at.as_str(), "POST /v1/responses"),
            (stored_at.as_str(), "POST /v1/responses"),
            (stored_at.as_str(), "GET /v1/responses/resp_2"),
        ]
    );
    assert_eq!(
        seen[1].2,
        r#"{"model":"m","previous_response_id":"resp_1","input":"again"}"#
    );
}
