use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tower::{Layer, Service};
use tower_test::mock;

use super::*;
use crate::affinity::{Affinity, AffinitySettings};
use crate::config::PrefixAffinityConfig;
use crate::grid::{ClusterId, SiteName};
use crate::index::{IndexSettings, PrefixIndex};
use crate::keying::{KeySeed, NoKeys};
use crate::route::{BoxError, DispatchError, Prompt, Served};
use crate::test_support::{MODEL, chat, poll_once, prompt_of, text};

/// A response body that yields `frames`, then ends when `ends`, else stays pending (a
/// stream still being generated). It says it has ended (`is_end_stream`) with its last
/// frame when `announces_end`, as a body of known length does.
#[derive(Debug, Default)]
struct Scripted {
    frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
    ends: bool,
    announces_end: bool,
}

impl Scripted {
    /// Data frames, each `&str` one frame, still streaming after them.
    fn events(events: &[&str]) -> Self {
        Self {
            frames: events
                .iter()
                .map(|event| Ok(Frame::data(Bytes::copy_from_slice(event.as_bytes()))))
                .collect(),
            ..Self::default()
        }
    }
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(frame)),
            None if self.ends => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.announces_end && self.ends && self.frames.is_empty()
    }
}

/// A stream's comment line: no output.
const PING: &str = ": ping\n\n";
/// A stream's first token.
const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n";

type Mock = mock::Mock<Request<String>, Response<Scripted>>;
type Handle = mock::Handle<Request<String>, Response<Scripted>>;

struct Fixture {
    east: ClusterId,
    west: ClusterId,
    index: Arc<PrefixIndex>,
    affinity: Affinity,
    prompt: Prompt,
    service: ConfirmService<Mock>,
    handle: Handle,
}

fn fixture() -> Fixture {
    let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    let west = ClusterId::new(SiteName::new("west").unwrap(), "west-a");
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        [east.clone(), west.clone()],
    ));
    let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    let body = chat(&[("system", &text("house", 20 * 256)), ("user", "hi")]);
    let prompt = prompt_of(&KeySeed::random(), &body);
    let (inner, handle) = mock::pair();
    let service = ConfirmLayer::new(affinity.clone()).layer(inner);
    Fixture {
        east,
        west,
        index,
        affinity,
        prompt,
        service,
        handle,
    }
}

enum Answer {
    Status(StatusCode, Option<ClusterId>),
    /// An event stream's head from the cluster, and its body.
    Stream(StatusCode, ClusterId, Scripted),
    Error(BoxError),
}

impl Fixture {
    fn keys(&self) -> &[u64] {
        self.prompt.keys().unwrap().as_slice()
    }

    fn depth(&self, cluster: &ClusterId) -> usize {
        self.index.depth(cluster, self.keys(), Instant::now())
    }

    /// Sends a request with `prompt` and answers it with `answer`; returns the result.
    fn exchange(
        &mut self,
        prompt: Option<Prompt>,
        answer: Answer,
    ) -> Result<Response<ConfirmBody<Scripted>>, BoxError> {
        let ready = std::future::poll_fn(|cx| self.service.poll_ready(cx));
        assert!(matches!(
            poll_once(&mut Box::pin(ready)),
            Poll::Ready(Ok(()))
        ));
        let mut req = Request::new(String::new());
        if let Some(prompt) = prompt {
            req.extensions_mut().insert(prompt);
        }
        let mut future = self.service.call(req);
        assert!(poll_once(&mut future).is_pending());
        let Poll::Ready(Some((_, send))) = self.handle.poll_request() else {
            panic!("no request reached the inner service");
        };
        match answer {
            Answer::Status(status, served) => {
                let mut response = Response::new(Scripted::default());
                *response.status_mut() = status;
                if let Some(cluster) = served {
                    response.extensions_mut().insert(Served::new(cluster));
                }
                send.send_response(response);
            }
            Answer::Stream(status, served, body) => {
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "text/event-stream; charset=utf-8")
                    .extension(Served::new(served))
                    .body(body)
                    .unwrap();
                send.send_response(response);
            }
            Answer::Error(error) => send.send_error(error),
        }
        match poll_once(&mut future) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("the answer is in, the future must be ready"),
        }
    }

    fn answer(&mut self, status: StatusCode, served: &ClusterId) {
        let prompt = Some(self.prompt.clone());
        self.exchange(prompt, Answer::Status(status, Some(served.clone())))
            .unwrap();
    }

    /// Sends a request with the prompt and answers it with an event stream from `served`
    /// whose body is `body`; returns the body after the layer.
    fn stream(
        &mut self,
        status: StatusCode,
        served: &ClusterId,
        body: Scripted,
    ) -> ConfirmBody<Scripted> {
        let prompt = Some(self.prompt.clone());
        self.exchange(prompt, Answer::Stream(status, served.clone(), body))
            .unwrap()
            .into_body()
    }
}

/// Polls `body` for its next frame once.
fn next_frame(body: &mut ConfirmBody<Scripted>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    poll_once(&mut body.frame())
}

#[test]
fn a_2xx_confirms_the_keys_at_the_serving_cluster() {
    let mut f = fixture();
    let (east, west) = (f.east.clone(), f.west.clone());
    f.answer(StatusCode::OK, &east);
    assert_eq!(f.depth(&east), f.keys().len());
    assert_eq!(f.depth(&west), 0);
    f.answer(StatusCode::CREATED, &west);
    assert_eq!(f.depth(&west), f.keys().len());
}

#[test]
fn an_answer_that_is_not_an_event_stream_confirms_at_its_head() {
    let mut f = fixture();
    let east = f.east.clone();
    // A JSON answer's head comes once the answer is generated: its body is never read,
    // the head alone decides.
    let response = f
        .exchange(
            Some(f.prompt.clone()),
            Answer::Status(StatusCode::OK, Some(east.clone())),
        )
        .unwrap();
    assert_eq!(f.depth(&east), f.keys().len());
    assert_eq!(
        response.extensions().get::<Served>().unwrap().cluster(),
        &east
    );
}

#[test]
fn a_429_drops_the_keys_from_the_serving_cluster() {
    let mut f = fixture();
    let (east, west) = (f.east.clone(), f.west.clone());
    f.answer(StatusCode::OK, &east);
    f.answer(StatusCode::OK, &west);
    f.answer(StatusCode::TOO_MANY_REQUESTS, &east);
    assert_eq!(f.depth(&east), 0);
    assert_eq!(f.depth(&west), f.keys().len());
}

#[test]
fn a_5xx_drops_the_keys_from_the_serving_cluster() {
    for status in [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::BAD_GATEWAY,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::GATEWAY_TIMEOUT,
    ] {
        let mut f = fixture();
        let east = f.east.clone();
        f.answer(StatusCode::OK, &east);
        f.answer(status, &east);
        assert_eq!(f.depth(&east), 0, "{status}");
    }
}

#[test]
fn other_statuses_change_nothing() {
    for status in [
        StatusCode::BAD_REQUEST,
        StatusCode::NOT_FOUND,
        StatusCode::PAYLOAD_TOO_LARGE,
        StatusCode::MOVED_PERMANENTLY,
    ] {
        let mut f = fixture();
        let (east, west) = (f.east.clone(), f.west.clone());
        f.answer(StatusCode::OK, &east);
        f.answer(status, &east);
        f.answer(status, &west);
        assert_eq!(f.depth(&east), f.keys().len(), "{status}");
        assert_eq!(f.depth(&west), 0, "{status}");
    }
}

/// An outer layer's error wrapping the balancer's, as a timeout or retry layer would.
#[derive(Debug)]
struct Wrapped(BoxError);

impl fmt::Display for Wrapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wrapped: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[test]
fn a_failed_connection_drops_the_keys_from_its_cluster() {
    let mut f = fixture();
    let (east, west) = (f.east.clone(), f.west.clone());
    f.answer(StatusCode::OK, &east);
    f.answer(StatusCode::OK, &west);
    let refused = DispatchError::new(east.clone(), "connection refused");
    let error = f
        .exchange(
            Some(f.prompt.clone()),
            Answer::Error(Box::new(Wrapped(Box::new(refused)))),
        )
        .unwrap_err();
    assert!(DispatchError::find_in(&*error).is_some());
    assert_eq!(f.depth(&east), 0);
    assert_eq!(f.depth(&west), f.keys().len());
}

#[test]
fn an_error_that_names_no_cluster_changes_nothing() {
    let mut f = fixture();
    let east = f.east.clone();
    f.answer(StatusCode::OK, &east);
    let error = f
        .exchange(Some(f.prompt.clone()), Answer::Error("timed out".into()))
        .unwrap_err();
    assert_eq!(error.to_string(), "timed out");
    assert_eq!(f.depth(&east), f.keys().len());
}

#[test]
fn an_answer_without_served_changes_nothing() {
    let mut f = fixture();
    let east = f.east.clone();
    f.answer(StatusCode::OK, &east);
    let prompt = Some(f.prompt.clone());
    f.exchange(
        prompt,
        Answer::Status(StatusCode::SERVICE_UNAVAILABLE, None),
    )
    .unwrap();
    assert_eq!(f.depth(&east), f.keys().len());
}

#[test]
fn a_request_without_keys_changes_nothing() {
    let mut f = fixture();
    let east = f.east.clone();
    f.answer(StatusCode::OK, &east);
    for prompt in [
        None,
        Some(Prompt::new(Some(MODEL.into()), Err(NoKeys::TokenIds))),
    ] {
        f.exchange(
            prompt,
            Answer::Status(StatusCode::SERVICE_UNAVAILABLE, Some(east.clone())),
        )
        .unwrap();
    }
    assert_eq!(f.depth(&east), f.keys().len());
}

#[test]
fn disabled_affinity_confirms_nothing() {
    let mut f = fixture();
    let east = f.east.clone();
    let disabled = PrefixAffinityConfig::default().with_enabled(false);
    f.affinity
        .set_settings(disabled.validate().unwrap().affinity);
    f.answer(StatusCode::OK, &east);
    assert_eq!(f.depth(&east), 0);
}

#[test]
fn a_request_dropped_before_its_head_changes_nothing() {
    let mut f = fixture();
    let east = f.east.clone();
    f.answer(StatusCode::OK, &east);
    let ready = std::future::poll_fn(|cx| f.service.poll_ready(cx));
    assert!(poll_once(&mut Box::pin(ready)).is_ready());
    let mut req = Request::new(String::new());
    req.extensions_mut().insert(f.prompt.clone());
    let mut future = f.service.call(req);
    assert!(poll_once(&mut future).is_pending());
    drop(future);
    let Poll::Ready(Some((_, send))) = f.handle.poll_request() else {
        panic!("no request");
    };
    let mut response = Response::new(Scripted::default());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.extensions_mut().insert(Served::new(east.clone()));
    send.send_response(response);
    assert_eq!(f.depth(&east), f.keys().len());
}

#[test]
fn an_event_stream_confirms_at_its_first_output_not_its_head() {
    let mut f = fixture();
    let east = f.east.clone();
    let mut body = f.stream(StatusCode::OK, &east, Scripted::events(&[PING, TOKEN]));
    // vLLM, SGLang and llama.cpp send the head before they prefill: nothing yet.
    assert_eq!(f.depth(&east), 0);
    assert!(body.awaits_output());
    // A comment is not output.
    assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Ok(_)))));
    assert_eq!(f.depth(&east), 0);
    // The first token is: the engine has prefilled the prompt.
    let Poll::Ready(Some(Ok(frame))) = next_frame(&mut body) else {
        panic!("the token frame passes");
    };
    assert_eq!(frame.into_data().unwrap(), TOKEN.as_bytes(), "unchanged");
    assert_eq!(f.depth(&east), f.keys().len());
    assert!(!body.awaits_output());
    assert!(next_frame(&mut body).is_pending(), "still streaming");
}

#[test]
fn a_responses_stream_confirms_after_its_opening_events() {
    let mut f = fixture();
    let east = f.east.clone();
    let created = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n";
    let delta = "event: response.output_text.delta\ndata: {\"delta\":\"ok\"}\n\n";
    let mut body = f.stream(StatusCode::OK, &east, Scripted::events(&[created, delta]));
    assert!(next_frame(&mut body).is_ready());
    assert_eq!(
        f.depth(&east),
        0,
        "response.created comes before the prefill"
    );
    assert!(next_frame(&mut body).is_ready());
    assert_eq!(f.depth(&east), f.keys().len());
}

#[test]
fn an_event_stream_that_ends_without_output_confirms_at_its_end() {
    // The end read as no more frames, as trailers, or told by the last frame.
    let trailers = Scripted {
        frames: [
            Ok(Frame::data(Bytes::from(PING))),
            Ok(Frame::trailers(HeaderMap::new())),
        ]
        .into(),
        ..Scripted::default()
    };
    let said = Scripted {
        ends: true,
        announces_end: true,
        ..Scripted::events(&[PING])
    };
    let ended = Scripted {
        ends: true,
        ..Scripted::events(&[PING])
    };
    for (case, scripted, frames) in [
        ("trailers", trailers, 2),
        ("said", said, 1),
        ("ended", ended, 2),
    ] {
        let mut f = fixture();
        let east = f.east.clone();
        let mut body = f.stream(StatusCode::OK, &east, scripted);
        for _ in 0..frames {
            assert_eq!(f.depth(&east), 0, "{case}");
            assert!(next_frame(&mut body).is_ready(), "{case}");
        }
        assert_eq!(f.depth(&east), f.keys().len(), "{case}");
    }
}

#[test]
fn an_event_stream_that_fails_or_is_dropped_before_its_output_confirms_nothing() {
    let mut f = fixture();
    let (east, west) = (f.east.clone(), f.west.clone());
    f.answer(StatusCode::OK, &west);
    let broken = Scripted {
        frames: [
            Ok(Frame::data(Bytes::from(PING))),
            Err("connection reset".into()),
        ]
        .into(),
        ..Scripted::default()
    };
    let mut body = f.stream(StatusCode::OK, &east, broken);
    assert!(next_frame(&mut body).is_ready());
    assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Err(_)))));
    assert!(!body.awaits_output());
    // A client that leaves before the first token.
    let mut left = f.stream(StatusCode::OK, &east, Scripted::events(&[PING, TOKEN]));
    assert!(next_frame(&mut left).is_ready());
    drop(left);
    assert_eq!(f.depth(&east), 0);
    // Nor is what another cluster holds touched.
    assert_eq!(f.depth(&west), f.keys().len());
}

#[test]
fn an_event_stream_refused_with_429_or_5xx_drops_at_its_head() {
    for status in [
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        let mut f = fixture();
        let east = f.east.clone();
        f.answer(StatusCode::OK, &east);
        let body = f.stream(status, &east, Scripted::events(&[TOKEN]));
        assert_eq!(f.depth(&east), 0, "{status}");
        assert!(!body.awaits_output(), "{status}");
    }
}
