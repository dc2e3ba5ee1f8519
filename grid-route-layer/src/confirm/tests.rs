use std::fmt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use http::{Request, Response, StatusCode};
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

/// A response body that is never finished: a stream still being generated.
#[derive(Debug)]
struct Streaming;

type Mock = mock::Mock<Request<String>, Response<Streaming>>;
type Handle = mock::Handle<Request<String>, Response<Streaming>>;

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
    ) -> Result<Response<Streaming>, BoxError> {
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
                let mut response = Response::new(Streaming);
                *response.status_mut() = status;
                if let Some(cluster) = served {
                    response.extensions_mut().insert(Served::new(cluster));
                }
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
fn a_streamed_answer_confirms_at_its_head() {
    let mut f = fixture();
    let east = f.east.clone();
    // The body (`Streaming`) is never read: the head alone decides.
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
    let mut response = Response::new(Streaming);
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.extensions_mut().insert(Served::new(east.clone()));
    send.send_response(response);
    assert_eq!(f.depth(&east), f.keys().len());
}
