use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tower_test::mock;

use super::*;
use crate::grid::{Cluster, ClusterId, Grid, GridSettings, GridSpec};
use crate::keying::NoKeys;
use crate::metrics::{DECISIONS_TOTAL, SHARED_HEAD_JOINS_TOTAL};
use crate::route::{
    BoxError, Candidates, DispatchError, NoCandidate, Pinned, Placed, PredictedMatch, Prompt,
    Served,
};
use crate::test_support::{MODEL, TestRecorder, grid_spec, poll_once};

type Mock = mock::Mock<Request<String>, Response<String>>;
type Handle = mock::Handle<Request<String>, Response<String>>;
type Factory = Box<dyn Fn(&Cluster) -> Mock + Send + Sync>;

struct Fixture {
    grid: Grid,
    select: Select<Mock, Factory>,
    handles: HashMap<String, Handle>,
    built: Arc<AtomicUsize>,
}

/// A `Select` over mock cluster services, one per cluster name in `spec`.
fn fixture(spec: &GridSpec) -> Fixture {
    fixture_with(spec, GridSettings::default())
}

fn fixture_with(spec: &GridSpec, settings: GridSettings) -> Fixture {
    let grid = Grid::new(spec, settings).unwrap();
    let mut mocks = HashMap::new();
    let mut handles = HashMap::new();
    for cluster in grid.view().clusters() {
        let (mock, handle) = mock::pair();
        mocks.insert(cluster.id().name().to_owned(), mock);
        handles.insert(cluster.id().name().to_owned(), handle);
    }
    let built = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&built);
    let factory: Factory = Box::new(move |cluster: &Cluster| {
        count.fetch_add(1, Ordering::Relaxed);
        mocks[cluster.id().name()].clone()
    });
    Fixture {
        select: Select::new(grid.clone(), factory),
        grid,
        handles,
        built,
    }
}

fn three_clusters() -> Fixture {
    fixture(&grid_spec(&[
        ("east", &["east-a", "east-b"]),
        ("west", &["west-a"]),
    ]))
}

type Pending = crate::select::ResponseFuture<Mock, Request<String>>;

impl Fixture {
    fn cluster(&self, name: &str) -> Arc<Cluster> {
        self.grid
            .view()
            .clusters()
            .iter()
            .find(|c| c.id().name() == name)
            .unwrap()
            .clone()
    }

    fn id(&self, name: &str) -> ClusterId {
        self.cluster(name).id().clone()
    }

    fn set_queue(&self, name: &str, queue: f64) {
        let cluster = self.cluster(name);
        let url = cluster.endpoints()[0].clone();
        cluster
            .load()
            .record_queue(&url, Some(queue), Instant::now());
    }

    /// Calls `Select` with `req`; returns the future and the cluster that got it.
    fn send(&mut self, req: Request<String>) -> (Pending, String) {
        let mut future = self.select.call(req);
        assert!(poll_once(&mut future).is_pending());
        let got: Vec<_> = self
            .handles
            .iter_mut()
            .filter_map(|(name, handle)| match handle.poll_request() {
                Poll::Ready(Some((_, send))) => Some((name.clone(), send)),
                _ => None,
            })
            .collect();
        assert_eq!(got.len(), 1, "exactly one cluster gets the request");
        let (name, send) = got.into_iter().next().unwrap();
        let mut response = Response::new(format!("from {name}"));
        *response.status_mut() = StatusCode::OK;
        // Answered at once; the caller polls when it wants the answer in.
        send.send_response(response);
        (future, name)
    }

    /// Sends `req` and returns the name of the cluster that answered.
    fn route(&mut self, req: Request<String>) -> String {
        let before = Instant::now();
        let (mut future, name) = self.send(req);
        let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
            panic!("answered");
        };
        let served = response.extensions().get::<Served>().unwrap();
        assert_eq!(served.cluster().name(), name);
        // Stamped when it was sent, for FeedbackLayer to time its answer from.
        let sent = served.sent().expect("stamped when sent");
        assert!(before <= sent && sent <= Instant::now());
        assert_eq!(*response.body().get_ref(), format!("from {name}"));
        name
    }
}

fn with_candidates(ids: &[ClusterId]) -> Request<String> {
    let mut req = Request::new(String::new());
    req.extensions_mut().insert(Candidates::new(ids.to_vec()));
    req
}

fn plain() -> Request<String> {
    Request::new(String::new())
}

/// East polled empty and west one request deep; then four requests before the next poll,
/// none answered yet. Returns how many each cluster got.
fn burst_between_polls(settings: GridSettings) -> HashMap<String, usize> {
    let spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let mut f = fixture_with(&spec, settings);
    f.set_queue("east-a", 0.0);
    f.set_queue("west-a", 1.0);
    let mut got = HashMap::new();
    let mut unanswered = Vec::new();
    for _ in 0..4 {
        let (future, name) = f.send(plain());
        *got.entry(name).or_default() += 1;
        unanswered.push(future);
    }
    got
}

#[test]
fn by_queue_alone_a_burst_between_polls_piles_onto_the_lightest_queue() {
    let got = burst_between_polls(GridSettings {
        count_in_flight: false,
        ..GridSettings::default()
    });
    assert_eq!(got, HashMap::from([("east-a".to_owned(), 4)]));
}

#[test]
fn by_default_in_flight_counts_and_spreads_a_burst_between_polls() {
    let got = burst_between_polls(GridSettings::default());
    // Loads 0|1, then 1|1 (tie: fewer in flight), 1|2, 2|2 (tie: fewer in flight).
    assert_eq!(
        got,
        HashMap::from([("east-a".to_owned(), 2), ("west-a".to_owned(), 2)])
    );
}

#[test]
fn the_least_queued_candidate_is_chosen() {
    let mut f = three_clusters();
    f.set_queue("east-a", 5.0);
    f.set_queue("east-b", 1.0);
    f.set_queue("west-a", 3.0);
    for _ in 0..3 {
        assert_eq!(f.route(plain()), "east-b");
    }
}

#[test]
fn an_unmeasured_cluster_loses_to_any_measured_one() {
    let mut f = three_clusters();
    f.set_queue("east-a", 50.0);
    for _ in 0..3 {
        assert_eq!(f.route(plain()), "east-a");
    }
}

#[test]
fn equal_queues_go_to_the_cluster_with_fewer_requests_in_flight() {
    let mut f = three_clusters();
    for name in ["east-a", "east-b", "west-a"] {
        f.set_queue(name, 2.0);
    }
    // Hold one answer unread: its cluster counts one request in flight until then.
    let (held, busy) = f.send(plain());
    assert_eq!(f.cluster(&busy).load().in_flight(), 1);
    for _ in 0..6 {
        assert_ne!(f.route(plain()), busy);
    }
    drop(held);
    let seen: std::collections::BTreeSet<_> = (0..6).map(|_| f.route(plain())).collect();
    assert!(seen.contains(&busy));
}

#[test]
fn equal_clusters_take_turns() {
    let mut f = three_clusters();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..30 {
        *counts.entry(f.route(plain())).or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|&n| n == 10), "{counts:?}");
}

#[test]
fn only_the_candidates_are_chosen_from() {
    let mut f = three_clusters();
    f.set_queue("east-a", 9.0);
    f.set_queue("east-b", 0.0);
    f.set_queue("west-a", 4.0);
    let only = [f.id("east-a"), f.id("west-a")];
    assert_eq!(f.route(with_candidates(&only)), "west-a");
}

#[test]
fn a_candidate_that_stopped_admitting_is_skipped() {
    let mut f = three_clusters();
    let only = [f.id("east-a"), f.id("west-a")];
    f.cluster("west-a")
        .load()
        .set_endpoint_healthy("http://west-a", false);
    for _ in 0..3 {
        assert_eq!(f.route(with_candidates(&only)), "east-a");
    }
}

#[test]
fn no_admitted_candidate_is_a_no_candidate_error() {
    let mut f = three_clusters();
    let gone = ClusterId::new(crate::grid::SiteName::new("north").unwrap(), "north-a");
    let mut req = with_candidates(&[gone]);
    req.extensions_mut()
        .insert(Prompt::new(Some(MODEL.into()), Err(NoKeys::TokenIds)));
    let mut future = f.select.call(req);
    let Poll::Ready(Err(error)) = poll_once(&mut future) else {
        panic!("fails at once");
    };
    let error = error.downcast::<NoCandidate>().unwrap();
    assert_eq!(error.model(), Some(MODEL));
    assert_eq!(
        error.to_string(),
        r#"no admitted backend cluster serves model "m""#
    );
    // Empty candidates too.
    let mut future = f.select.call(with_candidates(&[]));
    assert!(matches!(poll_once(&mut future), Poll::Ready(Err(e)) if e.is::<NoCandidate>()));
}

#[test]
fn without_candidates_every_admitted_cluster_serving_the_model_may_be_chosen() {
    let mut spec = grid_spec(&[("east", &["east-a", "east-b"]), ("west", &["west-a"])]);
    spec.sites[0].clusters[0].models = vec!["other".into()];
    spec.sites[0].clusters[1].admit = false;
    let mut f = fixture(&spec);
    let mut req = plain();
    req.extensions_mut()
        .insert(Prompt::new(Some(MODEL.into()), Err(NoKeys::TokenIds)));
    assert_eq!(f.route(req), "west-a");
    // No model known: any admitted cluster.
    let mut seen: Vec<_> = (0..4).map(|_| f.route(plain())).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["east-a", "west-a"]);
}

#[test]
fn a_pinned_request_without_candidates_goes_to_its_cluster() {
    let mut f = three_clusters();
    f.set_queue("east-a", 50.0);
    f.set_queue("west-a", 0.0);
    let mut req = plain();
    req.extensions_mut().insert(Pinned::new(f.id("east-a")));
    assert_eq!(f.route(req), "east-a");
}

#[test]
fn a_request_counts_in_flight_until_its_answers_body_ends() {
    let mut f = three_clusters();
    let (mut future, name) = f.send(plain());
    let in_flight = |f: &Fixture| f.cluster(&name).load().in_flight();
    assert_eq!(in_flight(&f), 1);
    let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
        panic!("answered");
    };
    // The head is in but not the body: engines send a stream's head before prefilling.
    assert_eq!(in_flight(&f), 1);
    let mut body = response.into_body();
    assert!(body.counts_in_flight());
    let Poll::Ready(Some(Ok(frame))) = poll_once(&mut body.frame()) else {
        panic!("the body's one frame");
    };
    assert_eq!(frame.into_data().unwrap(), format!("from {name}"));
    // That frame was its last: the request no longer counts.
    assert_eq!(in_flight(&f), 0);
    assert!(!body.counts_in_flight());

    // A body dropped before its end (a client that left) stops counting too.
    let (mut future, name) = f.send(plain());
    let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
        panic!("answered");
    };
    assert_eq!(f.cluster(&name).load().in_flight(), 1);
    drop(response);
    assert_eq!(f.cluster(&name).load().in_flight(), 0);

    // So does a request dropped before its head.
    let (future, name) = f.send(plain());
    drop(future);
    assert_eq!(f.cluster(&name).load().in_flight(), 0);
}

#[test]
fn a_request_affinity_placed_and_counted_is_not_counted_twice_and_one_sent_elsewhere_stops_counting_there()
 {
    let mut f = three_clusters();
    let (west, east) = (f.cluster("west-a"), f.cluster("east-a"));
    let placed = |cluster: &Cluster| {
        Placed::new(
            cluster.id().clone(),
            0.0,
            cluster.load().start_request_prefilling(2_048),
        )
    };
    let in_flight = |c: &Cluster| (c.load().in_flight(), c.load().prefill_waiting_bytes());
    // Placed on west-a and sent there: one request in flight, its prompt waiting once.
    let mut req = with_candidates(&[west.id().clone()]);
    req.extensions_mut().insert(placed(&west));
    let (future, name) = f.send(req);
    assert_eq!(name, "west-a");
    assert_eq!(in_flight(&west), (1, 2_048));
    drop(future);
    assert_eq!(in_flight(&west), (0, 0));
    // Placed on west-a, sent to east-a (say, west-a stopped admitting meanwhile).
    let mut req = with_candidates(&[east.id().clone()]);
    req.extensions_mut().insert(placed(&west));
    let (_future, name) = f.send(req);
    assert_eq!(name, "east-a");
    assert_eq!(in_flight(&west), (0, 0));
    assert_eq!(in_flight(&east).0, 1);
}

/// A body of `frames` data frames, then an error when `fails`.
struct Frames {
    frames: std::collections::VecDeque<&'static str>,
    fails: bool,
}

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        Poll::Ready(match self.frames.pop_front() {
            Some(data) => Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                data.as_bytes(),
            )))),
            None if self.fails => Some(Err("the engine went away".into())),
            None => None,
        })
    }
}

#[test]
fn a_stream_counts_in_flight_through_every_frame_until_its_end_or_error_and_as_a_stream_from_its_first()
 {
    for fails in [false, true] {
        let f = three_clusters();
        let cluster = f.cluster("east-a");
        let frames = Frames {
            frames: ["data: 1\n\n", "data: 2\n\n"].into(),
            fails,
        };
        let mut body = InFlightBody::new(frames, cluster.load().start_request());
        assert_eq!(cluster.load().streaming(), 0, "before its first token");
        for _ in 0..2 {
            assert!(matches!(
                poll_once(&mut body.frame()),
                Poll::Ready(Some(Ok(_)))
            ));
            assert_eq!(cluster.load().in_flight(), 1, "mid-stream (fails: {fails})");
            // From its first data on, it counts as a stream.
            assert_eq!(cluster.load().streaming(), 1, "mid-stream (fails: {fails})");
        }
        let last = poll_once(&mut body.frame());
        assert_eq!(matches!(last, Poll::Ready(Some(Err(_)))), fails);
        assert_eq!(
            (cluster.load().in_flight(), cluster.load().streaming()),
            (0, 0),
            "after the end (fails: {fails})"
        );
        assert!(!body.counts_in_flight());
    }
}

/// A Responses stream opens with `response.created` and `response.in_progress` as soon as
/// the engine takes the request: the request counts as a stream only from its first output.
#[test]
fn a_responses_stream_counts_as_a_stream_from_its_first_output_not_its_opening_events() {
    let f = three_clusters();
    let cluster = f.cluster("east-a");
    let frames = Frames {
        frames: [
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n",
            ": keep-alive\n\nevent: response.in_progress\ndata: {\"type\": \"response.in_progress\"}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n",
        ]
        .into(),
        fails: false,
    };
    let mut body = InFlightBody::new(frames, cluster.load().start_request());
    for streaming in [0, 0, 1] {
        assert!(matches!(
            poll_once(&mut body.frame()),
            Poll::Ready(Some(Ok(_)))
        ));
        assert_eq!(cluster.load().streaming(), streaming);
    }
}

#[test]
fn what_carries_output_and_what_only_opens_a_responses_stream() {
    let no_output = [
        &b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n"[..],
        b"data: {\"type\":\"response.queued\"}\n\nid: 3\nretry: 10\n",
        b": ping\n\n",
        b"",
        // vLLM's events may name their type last, after the response they echo.
        b"event: response.created\ndata: {\"response\":{\"id\":\"resp_1\"},\"type\":\"response.created\"}\r\n\r\n",
        // The event line names it; its data need not.
        b"event: response.in_progress\ndata: {\"response\":{}}\n\n",
        // A line not yet ended is not output yet.
        b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}",
        b"dat",
    ];
    let output = [
        &b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"[..],
        b"data: {\"type\":\"response.in_progress\"}\n\ndata: {\"type\":\"response.output_text.delta\"}\n\n",
        b"{\"id\":\"chatcmpl-1\",\"choices\":[]}",
        b"event: content_block_delta\ndata: {}\n\n",
        b"{",
    ];
    let bodies =
        (no_output.iter().map(|body| (body, false))).chain(output.iter().map(|body| (body, true)));
    for (body, carries) in bodies {
        assert_eq!(
            super::OutputScan::found_at([*body]).is_some(),
            carries,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

/// A Responses stream whose opening events are long (they echo the instructions), read
/// in chunks of every size from 1 byte up: the output is found in the chunk where the
/// first output event's `event:` line ends, never earlier, wherever the chunks split the
/// opening events' lines and names. The same for a Chat stream and a JSON answer.
#[test]
fn the_first_output_is_found_however_the_body_is_chunked() {
    let instructions = "You are a careful assistant. ".repeat(40);
    let responses = format!(
        "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"instructions\":\"{instructions}\"}}}}\n\n\
         : keep-alive\n\n\
         data: {{\"response\":{{\"instructions\":\"{instructions}\"}},\"type\":\"response.in_progress\"}}\r\n\r\n\
         event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}}\n\n"
    );
    let first_output_ends = |body: &str, line: &str| body.find(line).unwrap() + line.len();
    let cases = [
        (
            responses.as_str(),
            first_output_ends(&responses, "event: response.output_text.delta\n"),
        ),
        (
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
            first_output_ends(
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n",
                "\n",
            ),
        ),
        ("{\"id\":\"chatcmpl-1\",\"choices\":[]}", 1),
    ];
    for (body, found_by) in cases {
        for size in 1..=body.len() {
            let found_at = super::OutputScan::found_at(body.as_bytes().chunks(size));
            // Found in the chunk that holds byte `found_by`, counting from 1.
            let expected = found_by.div_ceil(size) * size;
            assert_eq!(
                found_at,
                Some(expected.min(body.len())),
                "chunks of {size}: {body:.60}"
            );
        }
    }
}

/// Where [`super::OutputScan`] finds the output when `body` comes cut at `cuts` (byte
/// offsets, taken modulo the body's length, in any order): the end of that chunk.
fn found_at(body: &[u8], cuts: &[usize]) -> Option<usize> {
    let mut from = 0;
    super::OutputScan::found_at(bounds(body, cuts).into_iter().map(|to| {
        let chunk = &body[from..to];
        from = to;
        chunk
    }))
}

/// The ends of the chunks `body` comes in when cut at `cuts` (see [`found_at`]).
fn bounds(body: &[u8], cuts: &[usize]) -> Vec<usize> {
    let mut bounds: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
    bounds.push(body.len());
    bounds.sort_unstable();
    bounds
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Bodies of SSE lines (opening events, comments, ids, output) and JSON, with `\n` or
    /// `\r\n` line ends, cut anywhere: the output is found in the chunk holding the byte
    /// that decides it when the body comes one byte at a time.
    #[test]
    fn chunk_boundaries_never_move_the_first_output(
        lines in proptest::collection::vec(proptest::sample::select(vec![
            "event: response.created",
            "event: response.in_progress",
            "event: response.output_text.delta",
            "data: {\"type\":\"response.queued\"}",
            "data: {\"response\":{\"instructions\":\"be brief\"},\"type\":\"response.created\"}",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}",
            "data: [DONE]",
            ": ping",
            "id: 7",
            "retry: 10",
            "",
            "{\"id\":\"chatcmpl-1\"}",
        ]), 0..12),
        crlf in proptest::bool::ANY,
        cuts in proptest::collection::vec(proptest::num::usize::ANY, 0..24),
    ) {
        let end = if crlf { "\r\n" } else { "\n" };
        let body = lines.iter().fold(String::new(), |body, line| body + line + end);
        let body = body.as_bytes();
        let byte = found_at(body, &(1..body.len()).collect::<Vec<_>>());
        let expected = byte.map(|byte| {
            bounds(body, &cuts).into_iter().find(|&end| end >= byte).unwrap()
        });
        proptest::prop_assert_eq!(found_at(body, &cuts), expected);
    }
}

#[test]
fn a_failed_connection_is_a_dispatch_error_naming_the_cluster() {
    let mut f = three_clusters();
    f.set_queue("west-a", 0.0);
    let mut future = f.select.call(plain());
    assert!(poll_once(&mut future).is_pending());
    let Poll::Ready(Some((_, send))) = f.handles.get_mut("west-a").unwrap().poll_request() else {
        panic!("west-a gets it");
    };
    send.send_error("connection refused");
    let Poll::Ready(Err(error)) = poll_once(&mut future) else {
        panic!("fails");
    };
    let failed = DispatchError::find_in(&*error).unwrap();
    assert_eq!(failed.cluster(), &f.id("west-a"));
    assert_eq!(
        error.to_string(),
        "request to cluster west/west-a failed: connection refused"
    );
}

#[test]
fn a_cluster_that_is_not_ready_fails_as_a_dispatch_error_too() {
    let mut f = three_clusters();
    f.set_queue("west-a", 0.0);
    f.handles
        .get_mut("west-a")
        .unwrap()
        .send_error("no endpoint reachable");
    let mut future = f.select.call(plain());
    let Poll::Ready(Err(error)) = poll_once(&mut future) else {
        panic!("fails");
    };
    assert_eq!(
        DispatchError::find_in(&*error).unwrap().cluster(),
        &f.id("west-a")
    );
}

#[test]
fn each_dispatch_counts_a_decision_for_its_site_and_cluster() {
    let mut f = three_clusters();
    f.set_queue("east-b", 0.0);
    let recorder = TestRecorder::default();
    metrics::with_local_recorder(&recorder, || {
        crate::metrics::describe_metrics();
        f.route(plain());
        f.route(plain());
    });
    assert_eq!(
        recorder.counter(DECISIONS_TOTAL, "cluster=east-b,site=east"),
        2
    );
    assert_eq!(recorder.total(DECISIONS_TOTAL), 2);
    let (kind, _, help) = recorder.described(DECISIONS_TOTAL).unwrap();
    assert_eq!(kind, metrics_util::MetricKind::Counter);
    assert!(help.unwrap().starts_with("Requests dispatched"));
}

#[test]
fn a_first_turn_joining_a_busier_holder_is_counted_where_it_is_sent() {
    let mut f = three_clusters();
    f.set_queue("east-b", 0.0);
    let with = |predicted: PredictedMatch| {
        let mut req = plain();
        req.extensions_mut().insert(predicted);
        req
    };
    let recorder = TestRecorder::default();
    metrics::with_local_recorder(&recorder, || {
        crate::metrics::describe_metrics();
        f.route(plain());
        f.route(with(PredictedMatch::new(8, 2_048)));
        f.route(with(PredictedMatch::new(8, 2_048).asking_shared_head()));
        f.route(with(PredictedMatch::new(8, 2_048).joining_busier_holder()));
    });
    assert_eq!(
        recorder.counter(SHARED_HEAD_JOINS_TOTAL, "cluster=east-b,site=east"),
        1
    );
    assert_eq!(recorder.total(SHARED_HEAD_JOINS_TOTAL), 1);
    assert_eq!(recorder.total(DECISIONS_TOTAL), 4);
    let (kind, _, help) = recorder.described(SHARED_HEAD_JOINS_TOTAL).unwrap();
    assert_eq!(kind, metrics_util::MetricKind::Counter);
    assert!(help.unwrap().starts_with("New conversations' first turns"));
}

#[test]
fn cluster_services_are_built_once_and_rebuilt_when_their_endpoints_change() {
    let spec = grid_spec(&[("east", &["east-a", "east-b"]), ("west", &["west-a"])]);
    let mut f = fixture(&spec);
    for _ in 0..6 {
        f.route(plain());
    }
    assert_eq!(f.built.load(Ordering::Relaxed), 3);
    // A clone shares the services.
    let mut clone = f.select.clone();
    let mut future = clone.call(plain());
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(f.built.load(Ordering::Relaxed), 3);
    for handle in f.handles.values_mut() {
        if let Poll::Ready(Some((_, send))) = handle.poll_request() {
            send.send_response(Response::new(String::new()));
        }
    }
    assert!(poll_once(&mut future).is_ready());

    // Same endpoints: kept. east-b's endpoints change: rebuilt on its next use.
    let mut next = spec.clone();
    next.sites[0].clusters[1].endpoints = vec!["http://east-b2".into()];
    f.grid.reconfigure(&next, GridSettings::default()).unwrap();
    for _ in 0..6 {
        f.route(plain());
    }
    assert_eq!(f.built.load(Ordering::Relaxed), 4);
}

/// A service that counts its live copies.
struct Counted(Arc<AtomicUsize>);
impl Clone for Counted {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::Relaxed);
        Counted(Arc::clone(&self.0))
    }
}
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
impl Service<Request<String>> for Counted {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(String::new())))
    }
}

#[test]
fn services_of_clusters_that_left_are_dropped() {
    let spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let alive = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&alive);
    let mut select = Select::new(grid.clone(), move |_: &Cluster| {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(Arc::clone(&count))
    });
    for _ in 0..4 {
        let mut future = select.call(plain());
        assert!(poll_once(&mut future).is_ready());
    }
    assert_eq!(alive.load(Ordering::Relaxed), 2);
    let fewer = grid_spec(&[("east", &["east-a"])]);
    grid.reconfigure(&fewer, GridSettings::default()).unwrap();
    let mut future = select.call(plain());
    assert!(poll_once(&mut future).is_ready());
    assert_eq!(alive.load(Ordering::Relaxed), 1);
}

#[test]
fn least_loaded_prefers_queue_then_in_flight_then_turns() {
    let f = three_clusters();
    let view = f.grid.view();
    let now = Instant::now();
    let pick = |turn| {
        least_loaded(view.clusters(), now, turn)
            .unwrap()
            .id()
            .name()
            .to_owned()
    };
    assert_eq!(
        (pick(0), pick(1), pick(2), pick(3)),
        (
            "east-a".into(),
            "east-b".into(),
            "west-a".into(),
            "east-a".into()
        )
    );
    let _busy = f.cluster("east-a").load().start_request();
    assert_eq!((pick(0), pick(1)), ("east-b".into(), "west-a".into()));
    assert!(least_loaded(std::iter::empty(), now, 0).is_none());
}

// ---- Balancers that plug in ----

#[tokio::test]
async fn a_cluster_service_can_be_p2c_over_its_endpoints() {
    use tower::balance::p2c::Balance;
    use tower::buffer::Buffer;
    use tower::discover::ServiceList;
    use tower::load::{CompleteOnResponse, PendingRequests};

    let mut spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    spec.sites[0].clusters[0].endpoints = (0..3).map(|i| format!("http://east-{i}")).collect();
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    grid.view().clusters()[0]
        .load()
        .record_queue("http://east-0", Some(0.0), Instant::now());
    for i in 1..3 {
        grid.view().clusters()[0].load().record_queue(
            &format!("http://east-{i}"),
            Some(0.0),
            Instant::now(),
        );
    }
    let select = Select::new(grid, |cluster: &Cluster| {
        let endpoints: Vec<_> = cluster
            .endpoints()
            .iter()
            .map(|url| {
                let url = url.clone();
                let endpoint = tower::service_fn(move |_req: Request<String>| {
                    let url = url.clone();
                    async move { Ok::<_, Infallible>(Response::new(url.to_string())) }
                });
                PendingRequests::new(endpoint, CompleteOnResponse::default())
            })
            .collect();
        Buffer::new(Balance::new(ServiceList::new(endpoints)), 64)
    });
    let mut endpoints_seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let response = select.clone().oneshot(plain()).await.unwrap();
        let served = response.extensions().get::<Served>().unwrap();
        assert_eq!(served.cluster().name(), "east-a");
        endpoints_seen.insert(response.into_body().into_inner());
    }
    assert_eq!(endpoints_seen.len(), 3, "{endpoints_seen:?}");
}

#[tokio::test]
async fn a_users_own_balancer_reads_candidates_and_sets_served() {
    use crate::affinity::{Affinity, AffinityLayer, AffinitySettings};
    use crate::confirm::ConfirmLayer;
    use crate::index::{IndexSettings, PrefixIndex};
    use crate::keying::KeySeed;
    use crate::test_support::{chat, prompt_of, text};
    use tower::ServiceBuilder;

    let spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        grid.view().cluster_ids(),
    ));
    let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    // Always the last candidate: not what `Select` would do.
    let last_candidate = tower::service_fn(|req: Request<String>| async move {
        let cluster = req
            .extensions()
            .get::<Candidates>()
            .and_then(|c| c.as_slice().last().cloned())
            .ok_or_else(|| BoxError::from(NoCandidate::new(None)))?;
        let mut response = Response::new(format!("from {cluster}"));
        response.extensions_mut().insert(Served::new(cluster));
        Ok::<_, BoxError>(response)
    });
    let service = ServiceBuilder::new()
        .layer(ConfirmLayer::new(affinity.clone()))
        .layer(AffinityLayer::new(grid.clone(), affinity))
        .service(last_candidate);
    let prompt = prompt_of(
        &KeySeed::random(),
        &chat(&[("system", &text("house", 50 * 256)), ("user", "hi")]),
    );
    let mut req = plain();
    req.extensions_mut().insert(prompt.clone());
    let response = service.oneshot(req).await.unwrap();
    assert_eq!(response.body().get_ref(), "from west/west-a");
    let west = grid.view().clusters()[1].id().clone();
    let keys = prompt.keys().unwrap().as_slice();
    assert_eq!(index.depth(&west, keys, Instant::now()), keys.len());
}
