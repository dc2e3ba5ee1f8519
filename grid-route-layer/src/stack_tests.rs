//! The layers stacked as a gateway stacks them, over mock cluster services:
//! `ConfirmLayer` → `AffinityLayer` → `Select`.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Poll;
use std::thread;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};
use tower_test::mock;

use crate::affinity::{
    Affinity, AffinityLayer, AffinityService, AffinitySettings, Outcome, random_draw,
};
use crate::config::PrefixAffinityConfig;
use crate::confirm::{ConfirmLayer, ConfirmService, Verdict};
use crate::grid::{Cluster, ClusterId, Grid, GridSettings};
use crate::index::{IndexSettings, PrefixIndex};
use crate::keying::KeySeed;
use crate::metrics::{DECISIONS_TOTAL, PREFIX_AFFINITY_TOTAL};
use crate::route::{DispatchError, Prompt, Served};
use crate::select::Select;
use crate::test_support::{TestRecorder, chat, grid_spec, poll_once, prompt_of, text};

type Mock = mock::Mock<Request<String>, Response<String>>;
type Handle = mock::Handle<Request<String>, Response<String>>;
type Factory = Box<dyn Fn(&Cluster) -> Mock + Send + Sync>;
type Stack = ConfirmService<AffinityService<Select<Mock, Factory>>>;

struct Gateway {
    grid: Grid,
    index: Arc<PrefixIndex>,
    stack: Stack,
    handles: HashMap<String, Handle>,
    recorder: TestRecorder,
    seed: KeySeed,
}

#[derive(Clone, Copy)]
enum Answer {
    Status(StatusCode),
    ConnectionFailed,
}

fn gateway(sites: &[(&str, &[&str])]) -> Gateway {
    let grid = Grid::new(&grid_spec(sites), GridSettings::default()).unwrap();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        grid.view().cluster_ids(),
    ));
    let no_exploration = PrefixAffinityConfig::default().with_exploration(0.0);
    let affinity = Affinity::new(
        Arc::clone(&index),
        no_exploration.validate().unwrap().affinity,
    );
    let mut mocks = HashMap::new();
    let mut handles = HashMap::new();
    for cluster in grid.view().clusters() {
        let (mock, handle) = mock::pair();
        mocks.insert(cluster.id().name().to_owned(), mock);
        handles.insert(cluster.id().name().to_owned(), handle);
    }
    let factory: Factory = Box::new(move |c: &Cluster| mocks[c.id().name()].clone());
    let select = Select::new(grid.clone(), factory);
    let stack = ConfirmLayer::new(affinity.clone())
        .layer(AffinityLayer::new(grid.clone(), affinity).layer(select));
    Gateway {
        grid,
        index,
        stack,
        handles,
        recorder: TestRecorder::default(),
        seed: KeySeed::random(),
    }
}

impl Gateway {
    fn prompt(&self, system: &str, user: &str) -> Prompt {
        prompt_of(&self.seed, &chat(&[("system", system), ("user", user)]))
    }

    fn id(&self, name: &str) -> ClusterId {
        let view = self.grid.view();
        view.clusters()
            .iter()
            .find(|c| c.id().name() == name)
            .unwrap()
            .id()
            .clone()
    }

    fn set_queue(&self, name: &str, queue: f64) {
        let view = self.grid.view();
        let cluster = view.cluster(&self.id(name)).unwrap();
        cluster
            .load()
            .record_queue(&format!("http://{name}"), Some(queue), Instant::now());
    }

    fn depth(&self, name: &str, prompt: &Prompt) -> usize {
        self.index.depth(
            &self.id(name),
            prompt.keys().unwrap().as_slice(),
            Instant::now(),
        )
    }

    /// Sends a request with `prompt` through the stack; the cluster that gets it gives
    /// `answer`. Returns that cluster's name.
    fn send(&mut self, prompt: &Prompt, answer: Answer) -> String {
        let mut req = Request::new(String::new());
        req.extensions_mut().insert(prompt.clone());
        let stack = &mut self.stack;
        let mut future = metrics::with_local_recorder(&self.recorder, || {
            let ready = std::future::poll_fn(|cx| stack.poll_ready(cx));
            assert!(poll_once(&mut Box::pin(ready)).is_ready());
            let mut future = stack.call(req);
            assert!(poll_once(&mut future).is_pending());
            future
        });
        let (name, send) = self
            .handles
            .iter_mut()
            .find_map(|(name, handle)| match handle.poll_request() {
                Poll::Ready(Some((_, send))) => Some((name.clone(), send)),
                _ => None,
            })
            .expect("one cluster got the request");
        match answer {
            Answer::Status(status) => {
                let mut response = Response::new(String::new());
                *response.status_mut() = status;
                send.send_response(response);
                let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
                    panic!("answered");
                };
                assert_eq!(response.status(), status);
                assert_eq!(
                    response
                        .extensions()
                        .get::<Served>()
                        .unwrap()
                        .cluster()
                        .name(),
                    name
                );
            }
            Answer::ConnectionFailed => {
                send.send_error("connection refused");
                let Poll::Ready(Err(error)) = poll_once(&mut future) else {
                    panic!("failed");
                };
                let failed = DispatchError::find_in(&*error).unwrap();
                assert_eq!(failed.cluster().name(), name);
            }
        }
        name
    }

    fn outcomes(&self, outcome: Outcome) -> u64 {
        self.recorder
            .counter(PREFIX_AFFINITY_TOTAL, &format!("outcome={outcome}"))
    }
}

const OK: Answer = Answer::Status(StatusCode::OK);

#[test]
fn a_new_prompt_goes_by_load_then_its_follow_ups_stick_where_it_was_answered() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    g.set_queue("east-a", 1.0);
    g.set_queue("west-a", 0.0);
    let system = text("house", 60 * 256);
    let first = g.prompt(&system, "first question");
    // West is lighter: the new prompt goes there, and its 2xx confirms it there.
    assert_eq!(g.send(&first, OK), "west-a");
    assert_eq!(g.outcomes(Outcome::NoMatch), 1);
    assert_eq!(g.depth("west-a", &first), first.keys().unwrap().len());
    assert_eq!(g.depth("east-a", &first), 0);
    // Follow-ups share the 60-block system prompt: they stick to west even when its
    // queue grows past east's, up to what the match saves (0.19 of a queued request).
    g.set_queue("west-a", 1.1);
    for i in 0..5 {
        let next = g.prompt(&system, &format!("follow-up {i}"));
        assert_eq!(g.send(&next, OK), "west-a");
    }
    assert_eq!(g.outcomes(Outcome::Sticky), 5);
    assert_eq!(
        g.recorder
            .counter(DECISIONS_TOTAL, "cluster=west-a,site=west"),
        6
    );
}

#[test]
fn without_a_confirmed_answer_a_burst_spreads_by_load() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let system = text("house", 60 * 256);
    let prompt = g.prompt(&system, "the same question");
    // Every answer is a 404: nothing is confirmed, so the burst takes turns.
    let mut seen: Vec<_> = (0..4)
        .map(|_| g.send(&prompt, Answer::Status(StatusCode::NOT_FOUND)))
        .collect();
    seen.sort();
    assert_eq!(seen, ["east-a", "east-a", "west-a", "west-a"]);
    assert_eq!(g.outcomes(Outcome::NoMatch), 4);
}

#[test]
fn identical_short_prompts_spread_even_when_answered() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let prompt = g.prompt(&text("house", 600), "hi");
    assert!(prompt.keys().unwrap().len() < 4);
    let mut seen: Vec<_> = (0..4).map(|_| g.send(&prompt, OK)).collect();
    seen.sort();
    assert_eq!(seen, ["east-a", "east-a", "west-a", "west-a"]);
    assert_eq!(g.outcomes(Outcome::NoMatch), 4);
    assert_eq!(g.outcomes(Outcome::Sticky), 0);
}

#[test]
fn a_503_drops_the_match_and_the_next_request_spreads_again() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let system = text("house", 60 * 256);
    let first = g.prompt(&system, "first");
    let home = g.send(&first, OK);
    let next = g.prompt(&system, "second");
    assert_eq!(
        g.send(&next, Answer::Status(StatusCode::SERVICE_UNAVAILABLE)),
        home
    );
    assert_eq!(g.depth(&home, &first), 0);
    assert_eq!(g.depth(&home, &next), 0);
    let before = g.outcomes(Outcome::NoMatch);
    g.send(&next, Answer::Status(StatusCode::NOT_FOUND));
    assert_eq!(g.outcomes(Outcome::NoMatch), before + 1);
}

#[test]
fn a_429_drops_the_match() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let system = text("house", 60 * 256);
    let first = g.prompt(&system, "first");
    let home = g.send(&first, OK);
    let next = g.prompt(&system, "second");
    g.send(&next, Answer::Status(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(g.depth(&home, &next), 0);
}

#[test]
fn a_failed_connection_drops_the_match() {
    let mut g = gateway(&[("east", &["east-a"]), ("west", &["west-a"])]);
    let system = text("house", 60 * 256);
    let first = g.prompt(&system, "first");
    let home = g.send(&first, OK);
    let next = g.prompt(&system, "second");
    assert_eq!(g.send(&next, Answer::ConnectionFailed), home);
    assert_eq!(g.depth(&home, &first), 0);
    assert_eq!(g.depth(&home, &next), 0);
}

#[test]
fn a_drained_home_is_left_and_the_prompt_learned_elsewhere() {
    let spec = grid_spec(&[
        ("east", &["east-a"]),
        ("west", &["west-a"]),
        ("north", &["north-a"]),
    ]);
    let mut g = gateway(&[
        ("east", &["east-a"]),
        ("west", &["west-a"]),
        ("north", &["north-a"]),
    ]);
    let system = text("house", 60 * 256);
    let home = g.send(&g.prompt(&system, "first"), OK);
    let mut drained = spec.clone();
    for site in &mut drained.sites {
        if site.clusters[0].name == home {
            site.clusters[0].admit = false;
        }
    }
    g.grid
        .reconfigure(&drained, GridSettings::default())
        .unwrap();
    let next = g.prompt(&system, "second");
    let new_home = g.send(&next, OK);
    assert_ne!(new_home, home);
    let third = g.prompt(&system, "third");
    assert_eq!(g.send(&third, OK), new_home);
}

/// Threads confirming, dropping and deciding on one index at once, with reloads, through
/// the same core the layers call.
#[test]
fn concurrent_decisions_confirmations_and_drops_leave_consistent_depths() {
    let sites: &[(&str, &[&str])] = &[("east", &["east-a", "east-b"]), ("west", &["west-a"])];
    let grid = Grid::new(&grid_spec(sites), GridSettings::default()).unwrap();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::new(4_096, Duration::from_secs(600)).unwrap(),
        grid.view().cluster_ids(),
    ));
    let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    let seed = KeySeed::random();
    let system = text("house", 40 * 256);
    let prompts: Arc<Vec<Prompt>> = Arc::new(
        (0..16)
            .map(|i| {
                let user = text(&format!("user{i}"), (i % 4) * 3_000 + 10);
                prompt_of(&seed, &chat(&[("system", &system), ("user", &user)]))
            })
            .collect(),
    );
    let now = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (grid, affinity, prompts) = (grid.clone(), affinity.clone(), Arc::clone(&prompts));
            thread::spawn(move || {
                for i in 0..2_000usize {
                    let view = grid.view();
                    let prompt = &prompts[(i * 7 + w) % prompts.len()];
                    let keys = prompt.keys().unwrap();
                    let decision = affinity.decide(
                        view.candidates(prompt.model()),
                        Some(keys),
                        None,
                        now,
                        random_draw(),
                    );
                    assert!(decision.deepest() <= keys.len());
                    assert!(!decision.clusters().is_empty());
                    let Some(cluster) = decision.clusters().first() else {
                        continue;
                    };
                    let verdict = match (i + w) % 5 {
                        0 => Verdict::Drop,
                        4 => Verdict::Keep,
                        _ => Verdict::Confirm,
                    };
                    verdict.apply(affinity.index(), cluster.id(), keys.as_slice(), now);
                }
            })
        })
        .collect();
    let reloader = {
        let (grid, index) = (grid.clone(), Arc::clone(&index));
        thread::spawn(move || {
            for i in 0..200u64 {
                let capacity = if i % 2 == 0 { 512 } else { 4_096 };
                index.reconfigure(
                    IndexSettings::new(capacity, Duration::from_secs(600)).unwrap(),
                    grid.view().cluster_ids(),
                );
                grid.reconfigure(&grid_spec(sites), GridSettings::default())
                    .unwrap();
            }
        })
    };
    for worker in workers {
        worker.join().unwrap();
    }
    reloader.join().unwrap();

    let view = grid.view();
    for cluster in view.clusters() {
        assert!(index.entries(cluster.id()) <= 4_096);
        assert_eq!(cluster.load().in_flight(), 0);
    }
    // Whatever the threads left, the index still answers exactly.
    let east = view.clusters()[0].id();
    for prompt in prompts.iter() {
        let keys = prompt.keys().unwrap().as_slice();
        for cluster in view.clusters() {
            assert!(index.depth(cluster.id(), keys, now) <= keys.len());
        }
        Verdict::Confirm.apply(&index, east, keys, now);
        assert_eq!(index.depth(east, keys, now), keys.len());
        Verdict::Drop.apply(&index, east, keys, now);
        assert_eq!(index.depth(east, keys, now), 0);
    }
}
