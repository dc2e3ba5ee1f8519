use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use http::{Request, Response};
use tower::{Layer, Service};
use tower_test::mock;

use super::draw::random_draw;
use super::*;
use crate::config::{PrefixAffinityConfig, Price};
use crate::grid::{
    Cluster, ClusterId, Grid, GridSettings, InFlight, SLOT_RECLAIM_HOLD, SLOT_RECLAIM_WINDOW,
};
use crate::index::{IndexSettings, PrefixIndex};
use crate::keying::{Api, KeySeed, NoKeys, PrefixKeys, SessionKey, key_body};
use crate::metrics::PREFIX_AFFINITY_TOTAL;
use crate::route::{Candidates, Pinned, Prompt};
use crate::test_support::{MODEL, TestRecorder, chat, grid_spec, poll_once, prompt_of, text};

/// A draw that never explores, whatever the share.
const NO_EXPLORATION: f64 = 0.999;

struct Fixture {
    grid: Grid,
    index: Arc<PrefixIndex>,
    affinity: Affinity,
    seed: KeySeed,
    now: Instant,
}

fn settings(config: &PrefixAffinityConfig) -> AffinitySettings {
    config.validate().unwrap().affinity
}

fn fixture(sites: &[(&str, &[&str])]) -> Fixture {
    fixture_with(sites, GridSettings::default())
}

fn fixture_with(sites: &[(&str, &[&str])], settings: GridSettings) -> Fixture {
    let grid = Grid::new(&grid_spec(sites), settings).unwrap();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        grid.view().cluster_ids(),
    ));
    let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    Fixture {
        grid,
        index,
        affinity,
        seed: KeySeed::random(),
        now: Instant::now(),
    }
}

/// Three sites, one cluster each: east-a, west-a, north-a.
fn three_sites() -> Fixture {
    fixture(&[
        ("east", &["east-a"]),
        ("west", &["west-a"]),
        ("north", &["north-a"]),
    ])
}

fn two_sites() -> Fixture {
    fixture(&[("east", &["east-a"]), ("west", &["west-a"])])
}

impl Fixture {
    fn cluster(&self, name: &str) -> Arc<Cluster> {
        let view = self.grid.view();
        view.clusters()
            .iter()
            .find(|c| c.id().name() == name)
            .unwrap()
            .clone()
    }

    fn id(&self, name: &str) -> ClusterId {
        self.cluster(name).id().clone()
    }

    /// Records `queue` (None: unreadable) for the one endpoint of cluster `name`.
    fn set_queue(&self, name: &str, queue: Option<f64>) {
        let cluster = self.cluster(name);
        let url = cluster.endpoints()[0].clone();
        assert!(cluster.load().record_queue(&url, queue, self.now));
    }

    /// `n` requests of this replica in flight at cluster `name`, until dropped.
    fn running(&self, name: &str, n: usize) -> Vec<InFlight> {
        let cluster = self.cluster(name);
        (0..n).map(|_| cluster.load().start_request()).collect()
    }

    /// Records that cluster `name`'s one endpoint has `slots` (llama.cpp's `--parallel`).
    fn set_slots(&self, name: &str, slots: Option<usize>) {
        let cluster = self.cluster(name);
        let url = cluster.endpoints()[0].clone();
        assert!(cluster.load().record_slots(&url, slots));
    }

    fn prompt(&self, messages: &[(&str, &str)]) -> Prompt {
        prompt_of(&self.seed, &chat(messages))
    }

    fn confirm(&self, name: &str, prompt: &Prompt) {
        self.index
            .confirm(&self.id(name), prompt.keys().unwrap().as_slice(), self.now);
    }

    fn decide(&self, prompt: &Prompt) -> Decision {
        self.decide_drawing(prompt, NO_EXPLORATION)
    }

    /// [`decide`](Self::decide) with `draw` for the exploration share.
    fn decide_drawing(&self, prompt: &Prompt, draw: f64) -> Decision {
        let view = self.grid.view();
        self.affinity.decide(
            view.candidates(prompt.model()),
            prompt.keys().ok(),
            prompt.session(),
            self.now,
            draw,
        )
    }
}

fn names(decision: &Decision) -> Vec<&str> {
    decision.clusters().iter().map(|c| c.id().name()).collect()
}

fn blocks(bytes: u64) -> f64 {
    bytes as f64 / 256.0
}

/// A conversation whose system prompt is `system_bytes` long, and the next turn of it.
fn turn_and_follow_up(f: &Fixture, system_bytes: usize) -> (Prompt, Prompt) {
    let system = text("house", system_bytes);
    let first = f.prompt(&[("system", &system), ("user", "first question")]);
    let next = f.prompt(&[("system", &system), ("user", "a different question")]);
    (first, next)
}

/// The contract's figures given as numbers: 10,000 tokens a second, 2 s a queued request.
fn contract_prices() -> AffinitySettings {
    settings(
        &PrefixAffinityConfig::default()
            .with_prefill_tokens_per_second(Price::Fixed(10_000.0))
            .with_queued_request_seconds(Price::Fixed(2.0)),
    )
}

#[test]
fn the_design_prices_40_blocks_at_a_tenth_and_400_at_more_than_one_queued_request() {
    let s = contract_prices();
    let worth_40 = s.match_worth(40 * 256);
    assert!((worth_40 - 0.128).abs() < 1e-9, "{worth_40}");
    assert!((s.saved_seconds(40 * 256) - 0.256).abs() < 1e-9);
    let worth_400 = s.match_worth(400 * 256);
    assert!((worth_400 - 1.28).abs() < 1e-9, "{worth_400}");
}

#[test]
fn a_learned_queued_price_counts_the_saved_prefill_for_the_request_and_for_those_after_it() {
    // The defaults learn both prices; at their priors (the contract's figures) a match is
    // worth MOVED_PREFILL_PAYERS (eight) times what the numbers make it.
    let learned = AffinitySettings::default();
    assert!(learned.learns_queued());
    for blocks in [40_u64, 400] {
        let fixed = contract_prices().match_worth(blocks * 256);
        let worth = learned.match_worth(blocks * 256);
        assert!(
            (worth - MOVED_PREFILL_PAYERS * fixed).abs() < 1e-9,
            "{worth}"
        );
    }
    // A learned prefill speed with a fixed queued price keeps the contract's rule.
    let prefill_only =
        settings(&PrefixAffinityConfig::default().with_queued_request_seconds(Price::Fixed(2.0)));
    assert!(prefill_only.learns_prefill());
    assert!((prefill_only.match_worth(400 * 256) - 1.28).abs() < 1e-9);
    // Through the gate: at the priors, a 400-block match (worth 8 x 1.28 = 10.24 queued
    // requests) stays put ten queued requests heavier, which the numbers would not allow;
    // eleven is more than it saves.
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 400 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(10.0));
    f.set_queue("west-a", Some(0.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::Sticky));
    f.set_queue("east-a", Some(11.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
    f.affinity.set_settings(contract_prices());
    f.set_queue("east-a", Some(2.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
}

#[test]
fn a_40_block_match_gives_way_to_a_site_one_queued_request_lighter() {
    // At the contract's figures (numbers for both prices) the match is worth 0.128 of a
    // queued request.
    let f = two_sites();
    f.affinity.set_settings(contract_prices());
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(1.0));
    f.set_queue("west-a", Some(0.0));
    let decision = f.decide(&next);
    assert!((39.0..=41.0).contains(&blocks(decision.covered_bytes())));
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
    // With equal queues the same match sticks.
    let f = two_sites();
    f.affinity.set_settings(contract_prices());
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(1.0));
    f.set_queue("west-a", Some(1.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
    // At the defaults' learned prices, still at their priors, it is worth eight times
    // that (1.024): it stays one queued request heavier and gives way two heavier.
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(1.0));
    f.set_queue("west-a", Some(0.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::Sticky));
    f.set_queue("east-a", Some(2.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
}

#[test]
fn a_400_block_match_keeps_its_site_one_queued_request_heavier() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 400 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(1.0));
    f.set_queue("west-a", Some(0.0));
    f.affinity.set_settings(contract_prices());
    let decision = f.decide(&next);
    assert!((390.0..=401.0).contains(&blocks(decision.covered_bytes())));
    assert!(contract_prices().match_worth(decision.covered_bytes()) > 1.0);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
    // Two queued requests heavier is more than it saves.
    f.set_queue("east-a", Some(2.0));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
}

#[test]
fn counting_in_flight_the_holders_unanswered_requests_outweigh_a_match() {
    let counting = GridSettings::default();
    assert!(counting.count_in_flight, "the default");
    let queue_only = GridSettings {
        count_in_flight: false,
        ..GridSettings::default()
    };
    for (settings, sent, outcome) in [
        // The engines' queues alone do not see what was sent since the last poll.
        (queue_only, 2, Outcome::Sticky),
        // A 40-block match is worth about one queued request at the defaults' priors
        // (1.024): two in flight at the holder outweigh it, one does not.
        (counting.clone(), 2, Outcome::LoadOverride),
        (counting, 1, Outcome::Sticky),
    ] {
        let f = fixture_with(&[("east", &["east-a"]), ("west", &["west-a"])], settings);
        let (first, next) = turn_and_follow_up(&f, 40 * 256);
        f.confirm("east-a", &first);
        f.set_queue("east-a", Some(0.0));
        f.set_queue("west-a", Some(0.0));
        let _in_flight = f.running("east-a", sent);
        assert_eq!(f.decide(&next).outcome(), Some(outcome), "{sent} in flight");
    }
}

#[test]
fn an_unmeasured_holder_gives_way_to_a_measured_site() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 400 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", None);
    // However loaded the measured site is.
    f.set_queue("west-a", Some(50.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
}

#[test]
fn a_measured_holder_keeps_the_match_against_an_unmeasured_site() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(50.0));
    f.set_queue("west-a", None);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn two_unmeasured_sites_keep_the_match() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn the_load_gate_compares_the_least_loaded_holder_with_the_least_loaded_other() {
    let decide = |west_b: f64| {
        let f = fixture(&[
            ("east", &["east-a", "east-b"]),
            ("west", &["west-a", "west-b"]),
        ]);
        let (first, next) = turn_and_follow_up(&f, 40 * 256);
        f.confirm("east-a", &first);
        f.confirm("east-b", &first);
        f.set_queue("east-a", Some(9.0));
        f.set_queue("east-b", Some(3.0));
        f.set_queue("west-a", Some(3.0));
        f.set_queue("west-b", Some(west_b));
        let decision = f.decide(&next);
        (decision.outcome(), names(&decision).join(","))
    };
    assert_eq!(decide(8.0), (Some(Outcome::Sticky), "east-a,east-b".into()));
    // Two queued requests under the least loaded holder's: more than the 40-block match
    // is worth at the priors (1.024).
    assert_eq!(
        decide(1.0),
        (
            Some(Outcome::LoadOverride),
            "east-a,east-b,west-a,west-b".into()
        )
    );
}

#[test]
fn the_deepest_holder_beats_a_site_holding_only_a_shared_head() {
    let f = three_sites();
    let system = text("house", 4 * 1024);
    let question = text("question", 8 * 1024);
    let east_turn = f.prompt(&[("system", &system), ("user", &question)]);
    let west_turn = f.prompt(&[("system", &system), ("user", "something else entirely")]);
    f.confirm("east-a", &east_turn);
    f.confirm("west-a", &west_turn);
    let next = f.prompt(&[
        ("system", &system),
        ("user", &question),
        ("assistant", "an answer"),
        ("user", "a follow-up"),
    ]);
    let decision = f.decide(&next);
    let depths = f.index.depths(
        [&f.id("east-a"), &f.id("west-a")],
        next.keys().unwrap().as_slice(),
        f.now,
    );
    assert!(
        depths[0] >= 47 && depths[1] >= 15 && depths[1] < depths[0],
        "{depths:?}"
    );
    assert_eq!(decision.deepest(), depths[0]);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn equal_holders_both_stay() {
    let f = three_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.confirm("north-a", &first);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a", "north-a"]);
}

#[test]
fn every_candidate_holding_the_match_is_sticky_without_a_gate() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.confirm("west-a", &first);
    f.set_queue("east-a", Some(100.0));
    f.set_queue("west-a", Some(0.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
}

#[test]
fn identical_short_prompts_never_stick() {
    let f = two_sites();
    let short = f.prompt(&[("system", &text("house", 700)), ("user", "hi")]);
    let keys = short.keys().unwrap();
    assert!(keys.len() < MIN_STICKY_DEPTH, "{keys:?}");
    f.confirm("east-a", &short);
    let decision = f.decide(&short);
    // The whole prompt is held, far above the threshold, but under the floor.
    assert_eq!(decision.deepest(), keys.len());
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    // Matching nothing, it goes where the index holds least.
    assert_eq!(names(&decision), ["west-a"]);
}

#[test]
fn a_request_matching_nothing_goes_to_the_roomiest_of_the_least_loaded() {
    let f = three_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    let other = f.prompt(&[
        ("system", &text("another conversation", 40 * 256)),
        ("user", "hi"),
    ]);
    // east-a holds two conversations, west-a one, north-a none; all idle.
    f.confirm("east-a", &first);
    f.confirm("east-a", &other);
    f.confirm("west-a", &other);
    for name in ["east-a", "west-a", "north-a"] {
        f.set_queue(name, Some(0.0));
    }
    let stranger = f.prompt(&[("system", &text("a stranger", 40 * 256)), ("user", "hi")]);
    let decision = f.decide(&stranger);
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["north-a"]);
    // Equal room: every least-loaded one stays, for Select to take turns among.
    f.confirm("north-a", &other);
    assert_eq!(names(&f.decide(&stranger)), ["west-a", "north-a"]);
    // Load comes first: with north-a busier, the roomiest of the other two.
    f.set_queue("north-a", Some(3.0));
    assert_eq!(names(&f.decide(&stranger)), ["west-a"]);
    // A request that matches still sticks to the full one.
    assert_eq!(names(&f.decide(&next)), ["east-a"]);
}

/// Three sites of one engine with two slots each, idle: nothing in flight, queues read 0.
fn three_slot_sites() -> Fixture {
    let f = three_sites();
    for name in ["east-a", "west-a", "north-a"] {
        f.set_slots(name, Some(2));
        f.set_queue(name, Some(0.0));
    }
    f
}

/// [`three_slot_sites`] behind an index other replicas write into too.
fn three_shared_slot_sites() -> Fixture {
    let f = three_slot_sites();
    f.affinity.set_index_shared(true);
    f
}

/// A new conversation whose system prompt is `blocks` keying blocks long.
fn stranger(f: &Fixture, name: &str, blocks: usize) -> Prompt {
    f.prompt(&[("system", &text(name, blocks * 256)), ("user", "hi")])
}

#[test]
fn on_slot_engines_a_new_conversation_takes_a_free_slot_where_the_index_holds_least() {
    let f = three_slot_sites();
    assert!(!f.affinity.index_shared());
    // What each engine was given and still holds, as the index has it.
    f.confirm("east-a", &stranger(&f, "east's", 40));
    f.confirm("west-a", &stranger(&f, "west's", 8));
    f.confirm("north-a", &stranger(&f, "north's", 20));
    let place = |name: &str| {
        let decision = f.decide(&stranger(&f, name, 4));
        assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
        names(&decision).join(",")
    };
    assert_eq!(place("first"), "west-a");
    // Busier than the idle two, west-a still has a slot free and holds least.
    let running = f.running("west-a", 1);
    assert_eq!(place("second"), "west-a");
    // A conversation that grew where it stuck fills west-a's cache, though no new
    // conversation went there: north-a holds least now.
    let grown = f.prompt(&[
        ("system", &text("west's", 8 * 256)),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", &text("a long question", 40 * 256)),
    ]);
    f.confirm("west-a", &grown);
    assert_eq!(place("third"), "north-a");
    // Both of north-a's slots busy: the free one holding least, east-a (40 blocks) to
    // west-a's 49 or so.
    let _north = f.running("north-a", 2);
    drop(running);
    assert_eq!(place("fourth"), "east-a");
}

#[test]
fn on_slot_engines_new_conversations_placed_before_any_is_sent_take_distinct_free_slots() {
    // An opening burst: six new conversations decided before the balancer sent any, on
    // three two-slot engines holding nothing.
    let f = three_slot_sites();
    let in_flight = |name: &str| f.cluster(name).load().in_flight();
    let burst: Vec<Decision> = (0..6)
        .map(|i| f.decide(&stranger(&f, &format!("burst {i}"), 20)))
        .collect();
    let mut placed: Vec<&str> = burst.iter().flat_map(names).collect();
    placed.sort_unstable();
    assert_eq!(
        placed,
        ["east-a", "east-a", "north-a", "north-a", "west-a", "west-a"]
    );
    for (decision, name) in burst.iter().zip(burst.iter().flat_map(names)) {
        assert_eq!(decision.placed().unwrap().cluster().name(), name);
    }
    // Each already counts where it was placed, until the balancer takes the count over.
    assert_eq!(
        (
            in_flight("east-a"),
            in_flight("west-a"),
            in_flight("north-a")
        ),
        (2, 2, 2)
    );
    // No slot free: the seventh goes by load (all three tie) and counts nowhere yet.
    let seventh = f.decide(&stranger(&f, "seventh", 20));
    assert_eq!(names(&seventh), ["east-a", "west-a", "north-a"]);
    assert!(seventh.placed().is_none());
    // Decisions dropped unsent count nowhere.
    drop(burst);
    assert_eq!(
        (
            in_flight("east-a"),
            in_flight("west-a"),
            in_flight("north-a")
        ),
        (0, 0, 0)
    );
}

/// Each of `prompts` decided on a thread of its own, all released at once: a burst that
/// reaches the rule within microseconds.
fn decided_at_once(f: &Fixture, prompts: &[Prompt]) -> Vec<Decision> {
    let start = std::sync::Barrier::new(prompts.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    f.decide(prompt)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn on_slot_engines_new_conversations_placed_at_once_from_many_threads_never_overfill_an_engine() {
    let f = three_slot_sites();
    for _ in 0..50 {
        let prompts: Vec<Prompt> = (0..6)
            .map(|i| stranger(&f, &format!("burst {i}"), 20))
            .collect();
        let burst = decided_at_once(&f, &prompts);
        for name in ["east-a", "west-a", "north-a"] {
            let got = burst.iter().filter(|d| names(d) == [name]).count();
            assert_eq!(got, 2, "{name}");
        }
    }
}

#[test]
fn on_slot_engines_what_the_index_let_expire_is_room() {
    let f = three_slot_sites();
    f.confirm("east-a", &stranger(&f, "east's", 40));
    let later = Fixture {
        now: f.now + Duration::from_secs(300),
        ..f
    };
    later.confirm("west-a", &stranger(&later, "west's", 8));
    later.confirm("north-a", &stranger(&later, "north's", 20));
    // Ten minutes after east-a's last answer its entries no longer count, though no
    // confirmation there has swept them yet: it holds least.
    let expired = Fixture {
        now: later.now + Duration::from_secs(301),
        ..later
    };
    for name in ["east-a", "west-a", "north-a"] {
        expired.set_queue(name, Some(0.0));
    }
    let stored = |name: &str| expired.index.entries(&expired.id(name));
    assert!(stored("east-a") > stored("north-a"));
    assert_eq!(
        names(&expired.decide(&stranger(&expired, "new", 4))),
        ["east-a"]
    );
}

#[test]
fn behind_a_shared_index_on_slot_engines_a_new_conversation_takes_a_free_slot_where_least_new_prompt_went_lately()
 {
    let f = three_shared_slot_sites();
    let place = |name: &str, blocks: usize| {
        let decision = f.decide(&stranger(&f, name, blocks));
        assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
        names(&decision).join(",")
    };
    // Nothing placed anywhere: the least loaded, then the first. Each placement counts.
    assert_eq!(place("first", 40), "east-a");
    assert_eq!(place("second", 8), "west-a");
    assert_eq!(place("third", 20), "north-a");
    // west-a was given least: it takes the next one though it runs a request and the
    // others run none, as long as a slot is free there.
    let running = f.running("west-a", 1);
    assert_eq!(place("fourth", 4), "west-a");
    // By load first, as before, the idle one with the fewest index entries (none has any).
    f.affinity
        .set_settings(AffinitySettings::default().with_free_slot_placement(false));
    assert_eq!(
        names(&f.decide(&stranger(&f, "fifth", 4))),
        ["east-a", "north-a"]
    );
    f.affinity.set_settings(AffinitySettings::default());
    // Both of west-a's slots busy: the free one given least, north-a (20 blocks to 40).
    let second = f.running("west-a", 1);
    assert_eq!(place("sixth", 4), "north-a");
    // One slot free again, but the engine reports a request waiting: not free either.
    drop(second);
    f.set_queue("west-a", Some(1.0));
    assert_eq!(place("seventh", 4), "north-a");
    drop(running);
}

#[test]
fn on_slot_engines_a_free_slot_behind_too_much_prefill_is_not_taken_for_its_room() {
    let f = three_slot_sites();
    // Room: north-a holds least, then west-a, then east-a.
    f.confirm("east-a", &stranger(&f, "east's", 40));
    f.confirm("west-a", &stranger(&f, "west's", 20));
    f.confirm("north-a", &stranger(&f, "north's", 8));
    let newcomer = stranger(&f, "newcomer", 4);
    let own = newcomer.keys().unwrap().total_covered_bytes();
    let limit = (FREE_SLOT_WAIT_FACTOR * own as f64) as u64;
    let prefilling =
        |name: &str, bytes: u64| f.cluster(name).load().start_request_prefilling(bytes);
    let place = || {
        let decision = f.decide(&newcomer);
        assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
        names(&decision).join(",")
    };
    // north-a prefills a prompt that would hold the newcomer back six times its own
    // prefill: still the roomiest free slot.
    let at_limit = prefilling("north-a", limit);
    assert_eq!(place(), "north-a");
    drop(at_limit);
    // A byte more, and the next roomiest free slot, which starts it at once.
    let past_limit = prefilling("north-a", limit + 1);
    assert_eq!(place(), "west-a");
    // The wait counts beyond the free slot that starts it soonest: with every engine
    // prefilling something, north-a is back within the limit.
    let east = prefilling("east-a", 2);
    let west = prefilling("west-a", 1);
    assert_eq!(place(), "north-a");
    drop(west);
    assert_eq!(place(), "west-a");
    // A slot that is not free does not set the soonest: with west-a's two slots busy
    // (nothing of theirs waiting to prefill), east-a's is the soonest free one, and
    // north-a is within the limit beyond it.
    let west = f.running("west-a", 2);
    assert_eq!(place(), "north-a");
    drop((east, west));
    // The rule before, which the simulator measures against: room alone.
    f.affinity
        .set_settings(AffinitySettings::default().with_free_slot_wait_factor(f64::INFINITY));
    assert_eq!(place(), "north-a");
    drop(past_limit);
}

#[test]
fn on_slot_engines_with_none_free_a_new_conversation_goes_by_load_first() {
    let f = three_slot_sites();
    let _east = f.running("east-a", 2);
    let _west = f.running("west-a", 2);
    let _north = f.running("north-a", 3);
    // Every slot busy: the least loaded (east-a and west-a tie, so both stay).
    let decision = f.decide(&stranger(&f, "first", 40));
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
}

#[test]
fn on_slot_engines_a_head_too_short_to_stick_does_not_pull_a_new_conversation_to_its_holder() {
    let f = three_slot_sites();
    // A 10-block system prompt, then a new conversation behind it whose question adds
    // more than a fifth to it.
    let house = text("house", 10 * 256);
    let first = f.prompt(&[("system", &house), ("user", "first")]);
    let next = f.prompt(&[
        ("system", &house),
        ("user", &text("a long question", 6 * 256)),
    ]);
    assert_eq!(names(&f.decide(&first)), ["east-a"]);
    f.confirm("east-a", &first);
    // east-a holds 10 blocks of it and has a slot free, but the conversation it holds
    // there would lose its slot to the newcomer: the free slot where the index holds
    // least, west-a (idle, like north-a, and first).
    let decision = f.decide(&next);
    assert!(
        decision.deepest() >= MIN_STICKY_DEPTH,
        "{}",
        decision.deepest()
    );
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["west-a"]);
    // The rule before, which the simulator measures against: the holder first.
    f.affinity
        .set_settings(AffinitySettings::default().with_free_slots_by_depth(true));
    assert_eq!(names(&f.decide(&next)), ["east-a"]);
    f.affinity.set_settings(AffinitySettings::default());
    // Every other slot busy: east-a's free one it is.
    let _west = f.running("west-a", 2);
    let _north = f.running("north-a", 2);
    assert_eq!(names(&f.decide(&next)), ["east-a"]);
}

#[test]
fn on_a_grid_where_one_engines_slots_are_unknown_load_comes_first() {
    // Shared, so that placements alone (not confirmed) tell the clusters apart.
    let f = three_shared_slot_sites();
    assert_eq!(names(&f.decide(&stranger(&f, "first", 8))), ["east-a"]);
    assert_eq!(names(&f.decide(&stranger(&f, "second", 8))), ["west-a"]);
    // north-a's page did not say how many slots it has (or it batches): the whole grid
    // goes by load first, as on batching engines. Busier with a free slot each, east-a
    // and west-a lose to north-a.
    f.set_slots("north-a", None);
    let east = f.running("east-a", 1);
    let west = f.running("west-a", 1);
    assert_eq!(names(&f.decide(&stranger(&f, "third", 40))), ["north-a"]);
    // Idle alike, with room alike: all stay.
    drop((east, west));
    assert_eq!(
        names(&f.decide(&stranger(&f, "fourth", 4))),
        ["east-a", "west-a", "north-a"]
    );
    // Its slots known again, north-a was sent nothing by the slot rule: the third went by
    // load, and is not counted. It takes the next new conversation.
    f.set_slots("north-a", Some(2));
    assert_eq!(names(&f.decide(&stranger(&f, "fifth", 4))), ["north-a"]);
}

#[test]
fn on_slot_engines_a_session_its_cluster_is_too_busy_for_goes_by_load() {
    let f = two_sites();
    for name in ["east-a", "west-a"] {
        f.set_slots(name, Some(2));
        f.set_queue(name, Some(0.0));
    }
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    // One request at west-a outweighs the ten blocks it holds, though a slot is free.
    let _running = f.running("west-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn a_cluster_removed_and_added_again_starts_from_nothing_placed() {
    let f = three_shared_slot_sites();
    assert_eq!(names(&f.decide(&stranger(&f, "first", 40))), ["east-a"]);
    assert_eq!(names(&f.decide(&stranger(&f, "second", 4))), ["west-a"]);
    let all = [f.id("east-a"), f.id("west-a"), f.id("north-a")];
    f.index
        .reconfigure(IndexSettings::default(), [f.id("west-a"), f.id("north-a")]);
    f.affinity.forget_removed_clusters();
    f.index.reconfigure(IndexSettings::default(), all);
    // east-a's 40 blocks are forgotten: it and north-a tie at nothing, and it comes first.
    assert_eq!(names(&f.decide(&stranger(&f, "third", 4))), ["east-a"]);
}

#[test]
fn a_match_too_short_to_stick_still_wins_a_tie_on_load() {
    let f = three_sites();
    // A 10-block system prompt, then a turn that adds more than a fifth to it.
    let house = text("house", 10 * 256);
    let first = f.prompt(&[("system", &house), ("user", "first")]);
    let next = f.prompt(&[
        ("system", &house),
        ("user", &text("a long question", 6 * 256)),
    ]);
    f.confirm("west-a", &first);
    f.confirm(
        "east-a",
        &f.prompt(&[("system", &text("other", 40 * 256)), ("user", "x")]),
    );
    for name in ["east-a", "west-a", "north-a"] {
        f.set_queue(name, Some(0.0));
    }
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    // Loads tie: west-a holds most of it (north-a has more room, and loses).
    assert_eq!(names(&decision), ["west-a"]);
    // Load comes first: one request more at west-a and the roomiest idle one takes it.
    f.set_queue("west-a", Some(1.0));
    assert_eq!(names(&f.decide(&next)), ["north-a"]);
}

#[test]
fn a_match_under_8_kib_sticks_only_when_it_covers_the_threshold() {
    let f = two_sites();
    let prompt = f.prompt(&[("system", &text("house", 10 * 256)), ("user", "hi")]);
    let keys = prompt.keys().unwrap().as_slice();
    assert_eq!(keys.len(), 10);
    let east = f.id("east-a");
    f.index.confirm(&east, &keys[..7], f.now);
    let decision = f.decide(&prompt);
    assert_eq!(
        (decision.deepest(), decision.outcome()),
        (7, Some(Outcome::NoMatch))
    );
    f.index.confirm(&east, &keys[..8], f.now);
    let decision = f.decide(&prompt);
    assert_eq!(
        (decision.deepest(), decision.outcome()),
        (8, Some(Outcome::Sticky))
    );
    // A lower threshold lets the shorter match stick too.
    f.index.drop_keys(&east, &keys[7..]);
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_threshold(0.7),
    ));
    assert_eq!(f.decide(&prompt).outcome(), Some(Outcome::Sticky));
}

#[test]
fn a_match_of_8_kib_sticks_whatever_share_of_the_prompt_it_covers() {
    let f = two_sites();
    let prompt = f.prompt(&[("system", &text("house", 200 * 256)), ("user", "hi")]);
    let keys = prompt.keys().unwrap().as_slice();
    let east = f.id("east-a");
    f.index.confirm(&east, &keys[..31], f.now);
    assert_eq!(f.decide(&prompt).outcome(), Some(Outcome::NoMatch));
    f.index.confirm(&east, &keys[..32], f.now);
    assert_eq!(f.decide(&prompt).outcome(), Some(Outcome::Sticky));
}

#[test]
fn a_drained_or_unhealthy_site_is_never_sticky() {
    let mut spec = grid_spec(&[
        ("east", &["east-a"]),
        ("west", &["west-a"]),
        ("north", &["north-a"]),
    ]);
    let f = three_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::Sticky));

    spec.sites[0].clusters[0].admit = false;
    f.grid.reconfigure(&spec, GridSettings::default()).unwrap();
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["west-a", "north-a"]);

    spec.sites[0].clusters[0].admit = true;
    f.grid.reconfigure(&spec, GridSettings::default()).unwrap();
    f.cluster("east-a")
        .load()
        .set_endpoint_healthy("http://east-a", false);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["west-a", "north-a"]);
}

#[test]
fn a_request_without_keys_is_not_applicable() {
    let f = two_sites();
    let view = f.grid.view();
    let decision = f
        .affinity
        .decide(view.candidates(Some(MODEL)), None, None, f.now, 0.0);
    assert_eq!(decision.outcome(), Some(Outcome::NotApplicable));
    assert_eq!(decision.clusters().len(), 2);
}

#[test]
fn one_candidate_or_none_is_not_a_decision() {
    let f = fixture(&[("east", &["east-a"])]);
    let (first, _) = turn_and_follow_up(&f, 40 * 256);
    let decision = f.decide(&first);
    assert_eq!(decision.outcome(), None);
    assert_eq!(names(&decision), ["east-a"]);
    let decision = f
        .affinity
        .decide(Vec::new(), first.keys().ok(), None, f.now, 0.5);
    assert_eq!(decision.outcome(), None);
    assert!(decision.clusters().is_empty());
}

#[test]
fn disabled_affinity_decides_nothing() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_enabled(false),
    ));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), None);
    assert_eq!(names(&decision), ["east-a", "west-a"]);
}

#[test]
fn exploration_lands_within_a_fifth_of_its_share() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let view = f.grid.view();
    let candidates = view.candidates(Some(MODEL));
    let keys = next.keys().ok();
    let decisions = 100_000;
    let explored = (0..decisions)
        .filter(|_| {
            let d = f
                .affinity
                .decide(candidates.clone(), keys, None, f.now, random_draw());
            d.outcome() == Some(Outcome::Exploration)
        })
        .count();
    let share = explored as f64 / f64::from(decisions);
    assert!(
        (share - 0.02).abs() <= 0.2 * 0.02,
        "explored {explored} of {decisions}"
    );
}

#[test]
fn exploration_keeps_every_candidate() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let decision = f.decide_drawing(&next, 0.0199);
    assert_eq!(decision.outcome(), Some(Outcome::Exploration));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
}

#[test]
fn a_later_turn_of_a_conversation_is_never_explored() {
    let f = two_sites();
    let system = text("house", 40 * 256);
    let first = f.prompt(&[("system", &system), ("user", "first question")]);
    let second = f.prompt(&[
        ("system", &system),
        ("user", "first question"),
        ("assistant", "an answer"),
        ("user", "and then?"),
    ]);
    f.confirm("east-a", &first);
    let decide = |prompt: &Prompt| f.decide_drawing(prompt, 0.0);
    // A draw inside the share explores a prompt that opens a conversation, and a
    // Completions prompt, which cannot tell.
    assert_eq!(decide(&first).outcome(), Some(Outcome::Exploration));
    let completion = key_body(
        &f.seed,
        Api::Completions,
        serde_json::json!({"model": MODEL, "prompt": system})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(decide(&completion).outcome(), Some(Outcome::Exploration));
    // The same draw leaves the next turn to the rule: its history is at east-a alone.
    let decision = decide(&second);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn eviction_takes_a_prompts_tail_before_its_head() {
    let f = two_sites();
    f.index.reconfigure(
        IndexSettings::new(64, Duration::from_secs(600)).unwrap(),
        f.grid.view().cluster_ids(),
    );
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let other = f.prompt(&[("system", &text("other", 40 * 256)), ("user", "x")]);
    f.confirm("east-a", &other);
    // 64 entries: the other prompt's 40 keys and this prompt's 24 head keys.
    let decision = f.decide(&next);
    assert_eq!(decision.deepest(), 24);
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
}

#[test]
fn a_ttl_change_leaves_existing_deadlines() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.index.reconfigure(
        IndexSettings::new(IndexSettings::DEFAULT_CAPACITY, Duration::from_secs(1)).unwrap(),
        f.grid.view().cluster_ids(),
    );
    let view = f.grid.view();
    let at = |now| {
        let decision = f.affinity.decide(
            view.candidates(Some(MODEL)),
            next.keys().ok(),
            None,
            now,
            NO_EXPLORATION,
        );
        assert_eq!(decision.outcome(), Some(Outcome::Sticky));
        names(&decision).join(",")
    };
    // Confirmed under the 600 s TTL: still held a minute later.
    let later = f.now + Duration::from_secs(60);
    assert_eq!(at(later), "east-a");
    // Confirmed under the new 1 s TTL: gone two seconds later.
    f.index
        .confirm(&f.id("west-a"), first.keys().unwrap().as_slice(), later);
    assert_eq!(at(later), "east-a,west-a");
    assert_eq!(at(later + Duration::from_secs(2)), "east-a");
}

#[test]
fn narrow_is_plain_arithmetic_on_depths_and_queues() {
    let f = two_sites();
    let prompt = f.prompt(&[("system", &text("house", 100 * 256)), ("user", "hi")]);
    let keys: &PrefixKeys = prompt.keys().unwrap();
    let s = AffinitySettings::default();
    let sticky = narrow(&s, keys, &[50, 10], |i| [0.0, 0.0][i]);
    assert_eq!((sticky.outcome(), sticky.deepest()), (Outcome::Sticky, 50));
    assert!(sticky.keeps(50) && !sticky.keeps(10));
    // 50 blocks at the priors: 8 x 3,200 tokens / 10,000 a second / 2 s = 1.28 requests.
    let level = narrow(&s, keys, &[50, 10], |i| [1.0, 0.0][i]);
    assert_eq!(level.outcome(), Outcome::Sticky);
    let over = narrow(&s, keys, &[50, 10], |i| [2.0, 0.0][i]);
    assert_eq!(over.outcome(), Outcome::LoadOverride);
    assert!(over.keeps(10));
    let none = narrow(&s, keys, &[3, 0], |_| {
        unreachable!("no gate without a match")
    });
    assert_eq!(none.outcome(), Outcome::NoMatch);
}

// ---- The layer ----

type Mock = mock::Mock<Request<String>, Response<String>>;
type Handle = mock::Handle<Request<String>, Response<String>>;

fn layer_over(f: &Fixture) -> (AffinityService<Mock>, Handle) {
    let (inner, handle) = mock::pair();
    let service = AffinityLayer::new(f.grid.clone(), f.affinity.clone()).layer(inner);
    (service, handle)
}

/// Sends `req` through `service` under `recorder`, returns the candidates the inner
/// service saw.
fn candidates_seen(
    service: &mut AffinityService<Mock>,
    handle: &mut Handle,
    recorder: &TestRecorder,
    req: Request<String>,
) -> Vec<String> {
    let ready = std::future::poll_fn(|cx| service.poll_ready(cx));
    assert!(matches!(
        poll_once(&mut Box::pin(ready)),
        Poll::Ready(Ok(()))
    ));
    let _pending = metrics::with_local_recorder(recorder, || service.call(req));
    let Poll::Ready(Some((req, _send))) = handle.poll_request() else {
        panic!("the inner service got no request");
    };
    req.extensions()
        .get::<Candidates>()
        .unwrap()
        .as_slice()
        .iter()
        .map(|id| id.name().to_owned())
        .collect()
}

fn request_with(prompt: Option<&Prompt>) -> Request<String> {
    let mut req = Request::new(String::new());
    if let Some(prompt) = prompt {
        req.extensions_mut().insert(prompt.clone());
    }
    req
}

fn outcome_count(recorder: &TestRecorder, outcome: Outcome) -> u64 {
    recorder.counter(PREFIX_AFFINITY_TOTAL, &format!("outcome={outcome}"))
}

#[test]
fn the_layer_writes_the_sticky_candidates_and_counts_the_outcome() {
    let f = two_sites();
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_exploration(0.0),
    ));
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();

    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&first)),
    );
    assert_eq!(seen, ["east-a", "west-a"]);
    assert_eq!(outcome_count(&recorder, Outcome::NoMatch), 1);

    f.confirm("west-a", &first);
    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&next)),
    );
    assert_eq!(seen, ["west-a"]);
    assert_eq!(outcome_count(&recorder, Outcome::Sticky), 1);
    assert_eq!(recorder.total(PREFIX_AFFINITY_TOTAL), 2);
}

/// Sends `req` through `service`; returns the outcome the inner service saw, if any.
fn outcome_seen(
    service: &mut AffinityService<Mock>,
    handle: &mut Handle,
    req: Request<String>,
) -> Option<Outcome> {
    let ready = std::future::poll_fn(|cx| service.poll_ready(cx));
    assert!(matches!(
        poll_once(&mut Box::pin(ready)),
        Poll::Ready(Ok(()))
    ));
    let _pending = service.call(req);
    let Poll::Ready(Some((req, _send))) = handle.poll_request() else {
        panic!("the inner service got no request");
    };
    req.extensions().get::<Outcome>().copied()
}

#[test]
fn the_layer_leaves_the_counted_outcome_on_the_request_and_none_otherwise() {
    let f = two_sites();
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_exploration(0.0),
    ));
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    let (mut service, mut handle) = layer_over(&f);
    let seen = outcome_seen(&mut service, &mut handle, request_with(Some(&first)));
    assert_eq!(seen, Some(Outcome::NoMatch));
    f.confirm("east-a", &first);
    let seen = outcome_seen(&mut service, &mut handle, request_with(Some(&next)));
    assert_eq!(seen, Some(Outcome::Sticky));
    // Not a decision: an unread request, and a pinned one.
    assert_eq!(
        outcome_seen(&mut service, &mut handle, request_with(None)),
        None
    );
    let mut pinned = request_with(Some(&next));
    pinned.extensions_mut().insert(Pinned::new(f.id("west-a")));
    assert_eq!(outcome_seen(&mut service, &mut handle, pinned), None);
}

#[test]
fn the_layer_counts_a_prompt_without_keys_as_not_applicable() {
    let f = two_sites();
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();
    let unkeyed = Prompt::new(Some(MODEL.into()), Err(NoKeys::TokenIds));
    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&unkeyed)),
    );
    assert_eq!(seen, ["east-a", "west-a"]);
    assert_eq!(outcome_count(&recorder, Outcome::NotApplicable), 1);
}

#[test]
fn an_unread_request_routes_on_every_admitted_cluster_and_counts_nothing() {
    let mut spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    spec.sites[1].clusters[0].models = vec!["other".into()];
    let f = two_sites();
    f.grid.reconfigure(&spec, GridSettings::default()).unwrap();
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();
    let seen = candidates_seen(&mut service, &mut handle, &recorder, request_with(None));
    assert_eq!(seen, ["east-a", "west-a"]);
    assert_eq!(recorder.total(PREFIX_AFFINITY_TOTAL), 0);
}

#[test]
fn the_layer_offers_only_clusters_serving_the_model() {
    let mut spec = grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]);
    spec.sites[1].clusters[0].models = vec!["other".into()];
    let f = two_sites();
    f.grid.reconfigure(&spec, GridSettings::default()).unwrap();
    let (first, _) = turn_and_follow_up(&f, 40 * 256);
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();
    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&first)),
    );
    // One admitted candidate: nothing to decide, nothing counted.
    assert_eq!(seen, ["east-a"]);
    assert_eq!(recorder.total(PREFIX_AFFINITY_TOTAL), 0);
}

#[test]
fn a_pinned_request_gets_its_cluster_alone_and_counts_nothing() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();
    let mut req = request_with(Some(&next));
    req.extensions_mut().insert(Pinned::new(f.id("west-a")));
    let seen = candidates_seen(&mut service, &mut handle, &recorder, req);
    assert_eq!(seen, ["west-a"]);
    assert_eq!(recorder.total(PREFIX_AFFINITY_TOTAL), 0);
}

#[test]
fn disabling_affinity_at_runtime_stops_narrowing_and_counting() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let (mut service, mut handle) = layer_over(&f);
    let recorder = TestRecorder::default();
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_enabled(false),
    ));
    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&next)),
    );
    assert_eq!(seen, ["east-a", "west-a"]);
    assert_eq!(recorder.total(PREFIX_AFFINITY_TOTAL), 0);
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_exploration(0.0),
    ));
    let seen = candidates_seen(
        &mut service,
        &mut handle,
        &recorder,
        request_with(Some(&next)),
    );
    assert_eq!(seen, ["east-a"]);
    assert_eq!(outcome_count(&recorder, Outcome::Sticky), 1);
}

#[test]
fn the_layer_never_prints_keys() {
    let f = two_sites();
    let (first, _) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    let decision = f.decide(&first);
    let printed = format!("{decision:?} {:?}", f.affinity);
    for key in first.keys().unwrap().as_slice() {
        assert!(!printed.contains(&key.to_string()));
        assert!(!printed.contains(&format!("{key:x}")));
    }
}

// ---- the prefill price learned per cluster ----------------------------------------------

#[test]
fn the_prefill_estimate_starts_at_its_prior_and_converges_to_the_engines_speed() {
    let mut estimate = PrefillEstimate::new(10_000.0);
    assert_eq!(estimate.tokens_per_second(), 10_000.0);
    // Virtual time: each answer prefilled 3,000 tokens in 0.15 s, 20,000 tokens a second.
    let mut seen = Vec::new();
    for _ in 0..30 {
        assert!(estimate.observe(3_000, Duration::from_millis(150)));
        seen.push(estimate.tokens_per_second());
    }
    // It moves a fifth of the way each answer, never past the engine's speed.
    assert!((seen[0] - 12_000.0).abs() < 1e-6, "{}", seen[0]);
    assert!(seen.windows(2).all(|w| w[0] < w[1] && w[1] <= 20_000.0));
    assert!((seen[29] - 20_000.0).abs() < 20.0, "{}", seen[29]);
}

#[test]
fn a_short_or_instant_answer_teaches_nothing() {
    let mut estimate = PrefillEstimate::new(10_000.0);
    assert!(!estimate.observe(MIN_SAMPLE_TOKENS - 1, Duration::from_secs(1)));
    assert!(!estimate.observe(5_000, Duration::ZERO));
    assert_eq!(estimate.tokens_per_second(), 10_000.0);
}

#[test]
fn the_prefill_estimate_stays_within_its_bounds() {
    let mut slow = PrefillEstimate::new(0.0);
    assert_eq!(slow.tokens_per_second(), MIN_PREFILL_TOKENS_PER_SECOND);
    for _ in 0..100 {
        slow.observe(64, Duration::from_secs(3_600));
    }
    assert!(slow.tokens_per_second() >= MIN_PREFILL_TOKENS_PER_SECOND);
    let mut fast = PrefillEstimate::new(f64::INFINITY);
    assert_eq!(fast.tokens_per_second(), MAX_PREFILL_TOKENS_PER_SECOND);
    for _ in 0..100 {
        fast.observe(u64::MAX, Duration::from_nanos(1));
    }
    assert!(fast.tokens_per_second() <= MAX_PREFILL_TOKENS_PER_SECOND);
}

/// Prefill learned, a queued request fixed at 2 s: the prefill estimate reads the whole
/// time to first token.
fn learning(f: &Fixture) {
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default().with_queued_request_seconds(Price::Fixed(2.0)),
    ));
}

/// An answer that prefilled `uncached` tokens, sent at `load`, started after `secs`.
fn answer(uncached: u64, load: f64, secs: f64) -> AnswerTiming {
    AnswerTiming {
        uncached_tokens: uncached,
        load,
        started: Duration::from_secs_f64(secs),
        first_token: true,
    }
}

#[test]
fn fixed_prices_learn_nothing() {
    let f = two_sites();
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default()
            .with_prefill_tokens_per_second(Price::Fixed(10_000.0))
            .with_queued_request_seconds(Price::Fixed(2.0)),
    ));
    assert_eq!(
        f.affinity.learn(&f.id("east-a"), answer(1_000, 3.0, 10.0)),
        Learned::default()
    );
    assert_eq!(f.affinity.prefill_rate(&f.id("east-a")), 10_000.0);
    assert_eq!(f.affinity.queued_request_seconds(&f.id("east-a")), 2.0);
}

#[test]
fn a_cluster_the_index_no_longer_knows_learns_nothing() {
    let f = two_sites();
    let east = f.id("east-a");
    // A reload removed east: the index dropped it, and so did the prices.
    f.index
        .reconfigure(IndexSettings::default(), [f.id("west-a")]);
    f.affinity.forget_removed_clusters();
    assert!(!f.index.knows(&east));
    assert_eq!(
        f.affinity.learn(&east, answer(1_000, 3.0, 10.0)),
        Learned::default()
    );
    // Added back, it starts from the priors.
    f.index
        .reconfigure(IndexSettings::default(), [east.clone(), f.id("west-a")]);
    assert!(f.index.knows(&east));
    assert_eq!(f.affinity.prefill_rate(&east), 10_000.0);
    assert_eq!(f.affinity.queued_request_seconds(&east), 2.0);
    // A known cluster still learns.
    assert_ne!(
        f.affinity.learn(&east, answer(1_000, 3.0, 10.0)),
        Learned::default()
    );
}

#[test]
fn at_the_defaults_both_prices_are_learned_from_time_to_first_token_against_load() {
    let f = two_sites();
    let east = f.id("east-a");
    assert_eq!(f.affinity.prefill_rate(&east), 10_000.0);
    assert_eq!(f.affinity.queued_request_seconds(&east), 2.0);
    // A CPU engine with two slots: 1,000 tokens prefill in 10 s, and each request of load
    // ahead of a new one makes it wait 7 s more. Answers arrive at loads 0 to 3.
    let mut learned = Learned::default();
    for k in 0..200 {
        let load = f64::from(k % 4);
        learned = f
            .affinity
            .learn(&east, answer(1_000, load, 10.0 + 7.0 * load));
    }
    let rate = f.affinity.prefill_rate(&east);
    let queued = f.affinity.queued_request_seconds(&east);
    assert!((rate - 100.0).abs() < 5.0, "{rate}");
    assert!((queued - 7.0).abs() < 0.5, "{queued}");
    assert!(learned.queued_request_seconds.is_some());
    // West learned nothing.
    assert_eq!(f.affinity.prefill_rate(&f.id("west-a")), 10_000.0);
    assert_eq!(f.affinity.queued_request_seconds(&f.id("west-a")), 2.0);
}

#[test]
fn a_batching_engine_whose_load_costs_nothing_learns_a_cheap_queued_request() {
    let f = two_sites();
    let east = f.id("east-a");
    // 20,000 tokens a second whatever the load: requests in flight decode side by side.
    for k in 0..200 {
        let load = f64::from(k % 30);
        f.affinity.learn(&east, answer(4_000, load, 0.2));
    }
    let queued = f.affinity.queued_request_seconds(&east);
    assert!(queued < 0.05, "{queued}");
    assert!(queued >= MIN_QUEUED_REQUEST_SECONDS);
    let rate = f.affinity.prefill_rate(&east);
    assert!((rate - 20_000.0).abs() < 2_000.0, "{rate}");
}

#[test]
fn an_idle_or_unmeasured_cluster_teaches_no_queued_price() {
    let f = two_sites();
    let east = f.id("east-a");
    for _ in 0..50 {
        let learned = f.affinity.learn(&east, answer(1_000, f64::INFINITY, 10.0));
        assert_eq!(learned, Learned::default());
        f.affinity.learn(&east, answer(1_000, 0.0, 10.0));
    }
    // Idle answers teach the prefill speed alone.
    assert_eq!(f.affinity.queued_request_seconds(&east), 2.0);
    assert!((f.affinity.prefill_rate(&east) - 100.0).abs() < 1.0);
}

#[test]
fn the_fitted_prices_stay_within_their_bounds() {
    let f = two_sites();
    let east = f.id("east-a");
    for _ in 0..100 {
        f.affinity.learn(&east, answer(1_000, 1_000.0, 0.0));
    }
    let queued = f.affinity.queued_request_seconds(&east);
    assert!(
        (MIN_QUEUED_REQUEST_SECONDS..0.01).contains(&queued),
        "{queued}"
    );
    for _ in 0..100 {
        f.affinity.learn(&east, answer(64, 1.0, 1e9));
    }
    assert!(f.affinity.queued_request_seconds(&east) <= MAX_QUEUED_REQUEST_SECONDS);
    let rate = f.affinity.prefill_rate(&east);
    assert!((MIN_PREFILL_TOKENS_PER_SECOND..=MAX_PREFILL_TOKENS_PER_SECOND).contains(&rate));
}

#[test]
fn one_answer_under_load_moves_both_prices_towards_it_and_neither_to_a_bound() {
    let f = two_sites();
    let east = f.id("east-a");
    // Far quicker than the priors say (2 s + 0.25 s): the fit cannot tell which price was
    // wrong, and moves both, in proportion, rather than calling the engine infinitely fast.
    f.affinity.learn(&east, answer(2_500, 1.0, 0.1));
    let rate = f.affinity.prefill_rate(&east);
    let queued = f.affinity.queued_request_seconds(&east);
    assert!((10_000.0..100_000.0).contains(&rate), "{rate}");
    assert!(queued < 0.1, "{queued}");
    // Loads in proportion to the tokens: undecidable too, and no bound either.
    let f = two_sites();
    for k in 1..40 {
        let load = f64::from(k % 3 + 1);
        f.affinity
            .learn(&east, answer(1_000 * (k % 3 + 1) as u64, load, 0.3 * load));
    }
    let rate = f.affinity.prefill_rate(&east);
    assert!(rate < MAX_PREFILL_TOKENS_PER_SECOND / 10.0, "{rate}");
    assert!(f.affinity.queued_request_seconds(&east) > MIN_QUEUED_REQUEST_SECONDS);
}

#[test]
fn a_whole_answers_time_teaches_the_fit_nothing() {
    let f = two_sites();
    let east = f.id("east-a");
    // A JSON answer: its head comes once every token is generated.
    let whole = AnswerTiming {
        first_token: false,
        ..answer(2_000, 1.0, 9.0)
    };
    for _ in 0..20 {
        assert_eq!(f.affinity.learn(&east, whole), Learned::default());
    }
    assert_eq!(f.affinity.prefill_rate(&east), 10_000.0);
    assert_eq!(f.affinity.queued_request_seconds(&east), 2.0);
}

#[test]
fn a_cheap_learned_queue_keeps_a_match_its_fixed_price_would_give_up() {
    let f = two_sites();
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(3.0));
    f.set_queue("west-a", Some(0.0));
    // At the priors, 40 blocks save 0.26 s, a tenth of a 2 s queued request.
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
    // East's answers show its load costs a new request 20 ms each, at 10,000 tokens a
    // second: 0.26 s is worth 13 requests and holds against three.
    for k in 0..60 {
        let load = f64::from(k % 5);
        f.affinity
            .learn(&f.id("east-a"), answer(1_000, load, 0.1 + 0.02 * load));
    }
    let queued = f.affinity.queued_request_seconds(&f.id("east-a"));
    assert!(queued < 0.05, "{queued}");
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn each_cluster_learns_its_own_prefill_speed_from_its_prior() {
    let f = two_sites();
    learning(&f);
    assert_eq!(f.affinity.prefill_rate(&f.id("east-a")), 10_000.0);
    for _ in 0..60 {
        f.affinity.learn(&f.id("east-a"), answer(1_000, 0.0, 10.0));
    }
    assert!((f.affinity.prefill_rate(&f.id("east-a")) - 100.0).abs() < 1.0);
    assert_eq!(f.affinity.prefill_rate(&f.id("west-a")), 10_000.0);
}

#[test]
fn a_match_at_a_slow_learned_prefill_keeps_its_site_three_queued_requests_heavier() {
    let f = two_sites();
    learning(&f);
    let (first, next) = turn_and_follow_up(&f, 40 * 256);
    f.confirm("east-a", &first);
    f.set_queue("east-a", Some(3.0));
    f.set_queue("west-a", Some(0.0));
    // At the prior, 40 blocks (~2,600 tokens) save 0.26 s: a tenth of a queued request.
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::LoadOverride));
    // East turns out to prefill 100 tokens a second: the same match saves 26 s, 13 queued
    // requests, and holds against three.
    for _ in 0..40 {
        f.affinity.learn(&f.id("east-a"), answer(1_000, 0.0, 10.0));
    }
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

/// A Chat body of these messages in session `key` (`prompt_cache_key`), with `salt`.
fn session_body(messages: &[(&str, &str)], key: &str, salt: Option<&str>) -> Vec<u8> {
    let mut body: serde_json::Value = serde_json::from_slice(&chat(messages)).unwrap();
    body["prompt_cache_key"] = key.into();
    if let Some(salt) = salt {
        body["cache_salt"] = salt.into();
    }
    serde_json::to_vec(&body).unwrap()
}

/// The first two turns of a conversation without a system prompt: the second adds more
/// than a fifth to the first, so its prefix match (about a third) cannot stick.
fn short_conversation(f: &Fixture, key: &str, salt: Option<&str>) -> (Prompt, Prompt) {
    let question = text("question", 10 * 256);
    let answer = text("answer", 20 * 256);
    let first = prompt_of(&f.seed, &session_body(&[("user", &question)], key, salt));
    let next = prompt_of(
        &f.seed,
        &session_body(
            &[
                ("user", &question),
                ("assistant", &answer),
                ("user", "and?"),
            ],
            key,
            salt,
        ),
    );
    (first, next)
}

impl Fixture {
    /// What `ConfirmLayer` does with a 2xx from `name`: the keys, then the session and the
    /// thread.
    fn answered(&self, name: &str, prompt: &Prompt) {
        crate::confirm::Verdict::Confirm.apply_to_request(
            &self.index,
            &self.id(name),
            prompt.keys().ok(),
            prompt.session().into_iter().chain(prompt.thread()),
            self.now,
        );
    }
}

#[test]
fn a_turn_too_long_to_stick_by_prefix_goes_back_to_its_sessions_cluster() {
    let f = two_sites();
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    // Without the session (and without the thread, which would find west too: see
    // `a_later_turn_goes_back_where_its_thread_was_answered_though_its_keys_tie_at_a_shared_head`)
    // the prefix match is too short: no match, both stay.
    let anonymous = without_thread(&next).with_session(None);
    assert_eq!(f.decide(&anonymous).outcome(), Some(Outcome::NoMatch));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(names(&decision), ["west-a"]);
    // Priced at the first turn's prompt, which the second one starts with.
    let held = first.keys().unwrap().total_covered_bytes();
    assert_eq!(decision.covered_bytes(), held);
    // Engine feedback weighs it at the session cluster's depth, as it weighs a sticky one.
    let predicted = predicted_match(&decision).unwrap();
    assert_eq!(predicted.depth(), first.keys().unwrap().len());
    assert_eq!(predicted.covered_bytes(), held);
    assert_eq!(predicted_match(&f.decide(&anonymous)), None);
    // Off, the session is not read.
    f.affinity
        .set_settings(AffinitySettings::default().with_session_affinity(false));
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::NoMatch));
}

/// `prompt` as if keying had not told which prompt it continues.
fn without_thread(prompt: &Prompt) -> Prompt {
    let keys = prompt.keys().unwrap().clone().following(None);
    Prompt::new(prompt.model_arc().cloned(), Ok(keys)).with_session(prompt.session())
}

/// Two conversations behind one system prompt of 15 blocks, each opening with a question
/// shorter than a block, and each one's second turn: `[a, b]` and `[a_next, b_next]`.
/// The answers are long enough that the second turns' match of the head cannot stick.
fn two_behind_one_head(f: &Fixture) -> ([Prompt; 2], [Prompt; 2]) {
    two_behind_one_head_answering(f, 5 * 256)
}

/// [`two_behind_one_head`] with answers of `answer_bytes`.
fn two_behind_one_head_answering(f: &Fixture, answer_bytes: usize) -> ([Prompt; 2], [Prompt; 2]) {
    let system = text("house", 15 * 256);
    let turns = |question: &str| {
        let first = f.prompt(&[("system", &system), ("user", question)]);
        let next = f.prompt(&[
            ("system", &system),
            ("user", question),
            ("assistant", &text("answer", answer_bytes)),
            ("user", "and then?"),
        ]);
        (first, next)
    };
    let (a, a_next) = turns("why is the sky blue?");
    let (b, b_next) = turns("why is the sea salty?");
    ([a, b], [a_next, b_next])
}

/// `a` answered at east and `b` at west, both sites' queues empty.
fn answered_apart(f: &Fixture, a: &Prompt, b: &Prompt) {
    f.answered("east-a", a);
    f.answered("west-a", b);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
}

#[test]
fn a_later_turn_goes_back_where_its_thread_was_answered_though_its_keys_tie_at_a_shared_head() {
    let f = two_sites();
    let ([a, b], [a_next, b_next]) = two_behind_one_head(&f);
    // The questions end inside the head's last block: both first turns have the head's
    // keys and nothing more, so their second turns match both sites alike.
    assert_eq!(a.keys(), b.keys());
    answered_apart(&f, &a, &b);
    for (next, home) in [(&a_next, "east-a"), (&b_next, "west-a")] {
        let tied = f.decide(&without_thread(next));
        assert_eq!(tied.outcome(), Some(Outcome::NoMatch));
        let decision = f.decide(next);
        assert_eq!(decision.outcome(), Some(Outcome::Session), "{home}");
        assert_eq!(names(&decision), [home]);
        // Priced at what its own first turn left there: the head.
        assert_eq!(
            decision.covered_bytes(),
            a.keys().unwrap().total_covered_bytes()
        );
    }
    // The load gate still weighs it: the head's 15 blocks are worth less than a queued
    // request at the priors.
    f.set_queue("east-a", Some(1.0));
    let decision = f.decide(&a_next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["west-a"]);
    // Threads are read with sessions: off, neither is.
    f.set_queue("east-a", Some(0.0));
    f.affinity
        .set_settings(AffinitySettings::default().with_session_affinity(false));
    assert_eq!(f.decide(&a_next).outcome(), Some(Outcome::NoMatch));
}

#[test]
fn among_holders_tied_at_a_shared_head_a_sticky_turn_goes_to_its_threads() {
    let f = two_sites();
    // Short answers: the second turns' match of the head (15 of 18 blocks) sticks.
    let ([a, b], [a_next, b_next]) = two_behind_one_head_answering(&f, 2 * 256);
    answered_apart(&f, &a, &b);
    for (next, home) in [(&a_next, "east-a"), (&b_next, "west-a")] {
        let tied = f.decide(&without_thread(next));
        assert_eq!(tied.outcome(), Some(Outcome::Sticky));
        assert_eq!(tied.clusters().len(), 2);
        let decision = f.decide(next);
        assert_eq!(decision.outcome(), Some(Outcome::Sticky), "{home}");
        assert_eq!(names(&decision), [home]);
    }
    // Its holder a queued request busier than the other: the head it holds beyond the
    // other's is not worth the wait, and both holders stay, by load.
    f.set_queue("east-a", Some(1.0));
    let decision = f.decide(&a_next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(decision.clusters().len(), 2);
}

#[test]
fn a_thread_outranks_a_session_that_spans_conversations() {
    let mut f = two_sites();
    let ([a, b], [a_next, _]) = two_behind_one_head(&f);
    // One client id for all of a user's chats: the session was last answered at west,
    // for conversation b; a's own thread is at east.
    let user = |p: &Prompt| p.clone().with_session(Some(SessionKey::from_digest(7)));
    f.answered("east-a", &user(&a));
    f.now += Duration::from_secs(1);
    f.answered("west-a", &user(&b));
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    let decision = f.decide(&user(&a_next));
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(names(&decision), ["east-a"]);
    // Without its thread it follows the session.
    assert_eq!(
        names(&f.decide(&without_thread(&user(&a_next)))),
        ["west-a"]
    );
}

#[test]
fn a_first_turn_shorter_than_a_block_leaves_a_thread_its_next_turn_follows() {
    let f = two_sites();
    let first = f.prompt(&[("user", "hi")]);
    assert!(first.keys().is_err());
    assert!(first.thread().is_some());
    f.answered("west-a", &first);
    let next = f.prompt(&[
        ("user", "hi"),
        ("assistant", &text("answer", 4 * 256)),
        ("user", "tell me more"),
    ]);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(names(&decision), ["west-a"]);
    // Nothing of it was keyed there: nothing to price.
    assert_eq!(decision.covered_bytes(), 0);
    // A failure there drops the thread with the keys.
    crate::confirm::Verdict::Drop.apply_to_request(
        &f.index,
        &f.id("west-a"),
        None,
        first.thread(),
        f.now,
    );
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::NoMatch));
}

#[test]
fn a_session_whose_cluster_is_busier_than_its_prompt_is_worth_goes_elsewhere() {
    let f = two_sites();
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    // Ten blocks at the priors save 0.064 s, 0.032 of a queued request: one more queued
    // request at west outweighs them.
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(1.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["east-a"]);
}

/// Conversation a answered at a slow east under a shared system prompt, and what comes
/// next under the same prompt.
struct SharedHead {
    f: Fixture,
    /// a's second turn: it holds a's answer. With a's session, and without one.
    a_next: [Prompt; 2],
    /// First turns: b names a session no one has answered; the other names none, and
    /// holds no earlier answer.
    first_turns: [Prompt; 2],
}

/// Two sites; east prefills 100 tokens a second (a queued request costs 2 s), and has
/// answered conversation `conv-a`'s first turn under a system prompt of `system_blocks`
/// blocks. Both sites report empty queues.
fn shared_head_at_slow_east(system_blocks: usize) -> SharedHead {
    let f = two_sites();
    learning(&f);
    let east = f.id("east-a");
    for _ in 0..40 {
        f.affinity.learn(&east, answer(1_000, 0.0, 10.0));
    }
    let house = text("house", system_blocks * 256);
    let first_of_a = [("system", house.as_str()), ("user", "first question of a")];
    let next_of_a = [
        first_of_a[0],
        first_of_a[1],
        ("assistant", "an answer"),
        ("user", "and then?"),
    ];
    let in_session =
        |messages: &[(&str, &str)], key| prompt_of(&f.seed, &session_body(messages, key, None));
    f.answered("east-a", &in_session(&first_of_a, "conv-a"));
    let a_next = [in_session(&next_of_a, "conv-a"), f.prompt(&next_of_a)];
    let first_turns = [
        in_session(
            &[("system", &house), ("user", "first question of b")],
            "conv-b",
        ),
        f.prompt(&[("system", &house), ("user", "someone asks")]),
    ];
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    SharedHead {
        f,
        a_next,
        first_turns,
    }
}

#[test]
fn a_new_conversation_matching_a_short_shared_head_is_not_crowded_in_beside_others() {
    // A 16-block system prompt saves 10 s at east, 5 queued requests: the load gate alone
    // would keep it through a load one heavier.
    let SharedHead {
        f,
        a_next,
        first_turns,
    } = shared_head_at_slow_east(16);
    let anonymous = &first_turns[1];
    assert!(anonymous.session().is_none() && anonymous.keys().unwrap().opens_conversation());
    // With the loads equal there is no one to crowd: they stick to the head.
    for first in &first_turns {
        assert_eq!(f.decide(first).outcome(), Some(Outcome::Sticky));
    }
    // One request in flight at east: they would only share a's system prompt, so they go by
    // load.
    let _in_flight = f.running("east-a", 1);
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
        assert_eq!(names(&decision), ["east-a", "west-a"]);
    }
    // a's own next turn holds a's answer: with its session or without, it sticks through
    // the same load.
    for next in &a_next {
        assert!(!next.keys().unwrap().opens_conversation());
        assert_eq!(f.decide(next).outcome(), Some(Outcome::Sticky));
    }
}

#[test]
fn a_new_conversation_joins_a_busier_holder_with_a_free_slot_once_its_engines_keep_shared_heads() {
    let SharedHead { f, first_turns, .. } = shared_head_at_slow_east(16);
    for name in ["east-a", "west-a"] {
        f.set_slots(name, Some(2));
    }
    let east = f.id("east-a");
    // With the loads equal they stick, and their answers will say whether east kept the
    // head.
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::Sticky));
        assert!(decision.asks_shared_head());
        assert!(!decision.joins_busier_holder());
    }
    let _in_flight = f.running("east-a", 1);
    // East is busier and nothing is learned yet: they are not crowded in beside a.
    assert!(!f.affinity.keeps_shared_heads(&east));
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
        assert!(!decision.asks_shared_head());
        assert!(!decision.joins_busier_holder());
    }
    // An answer found the head at east: its engines keep shared heads (a host prompt
    // cache), so a new conversation joins east, takes its free slot and finds the head
    // there. Sent to a busier holder, it would find the head either way: it asks nothing.
    let verdict = f.affinity.count_shared_head(&east, true).unwrap();
    assert!(verdict.kept && !verdict.kept_before);
    let in_flight = || f.cluster("east-a").load().in_flight();
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::Sticky));
        assert_eq!(names(&decision), ["east-a"]);
        assert!(!decision.asks_shared_head());
        assert!(decision.joins_busier_holder());
        let predicted = predicted_match(&decision).unwrap();
        assert!(!predicted.asks_shared_head());
        assert!(predicted.joins_busier_holder());
        // It counts in flight at east from the decision on, as a free-slot placement
        // does: another newcomer decided before it is sent finds east's slots full.
        assert_eq!(decision.placed().unwrap().cluster(), &east);
        assert_eq!(in_flight(), 2);
        for other in &first_turns {
            let next = f.decide(other);
            assert_eq!(next.outcome(), Some(Outcome::LoadOverride));
            assert!(!next.joins_busier_holder() && next.placed().is_none());
        }
        // Dropped unsent, it stops counting.
        drop(decision);
        assert_eq!(in_flight(), 1);
    }
    // East's slots full: by load again.
    let full = f.running("east-a", 1);
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
        assert!(!decision.joins_busier_holder());
    }
    drop(full);
    // Engines whose slots are not known (batching) are never joined this way.
    f.set_slots("east-a", None);
    for first in &first_turns {
        assert_eq!(f.decide(first).outcome(), Some(Outcome::LoadOverride));
    }
    // A miss after the find outweighs it (the find decayed): not kept any more.
    f.set_slots("east-a", Some(2));
    let verdict = f.affinity.count_shared_head(&east, false).unwrap();
    assert!(!verdict.kept && verdict.kept_before);
    for first in &first_turns {
        assert_eq!(f.decide(first).outcome(), Some(Outcome::LoadOverride));
    }
}

#[test]
fn new_conversations_deciding_at_once_from_many_threads_join_a_holder_only_while_it_has_a_free_slot()
 {
    let SharedHead { f, first_turns, .. } = shared_head_at_slow_east(16);
    for name in ["east-a", "west-a"] {
        f.set_slots(name, Some(2));
    }
    let east = f.id("east-a");
    f.affinity.count_shared_head(&east, true).unwrap();
    // One of east's two slots busy: room for one newcomer beside it.
    let _in_flight = f.running("east-a", 1);
    let newcomer = &first_turns[1];
    let newcomers = vec![newcomer.clone(); 6];
    for _ in 0..50 {
        let burst = decided_at_once(&f, &newcomers);
        let joined = burst.iter().filter(|d| d.joins_busier_holder()).count();
        assert_eq!(joined, 1);
        assert_eq!(f.cluster("east-a").load().in_flight(), 2);
        let by_load = burst
            .iter()
            .filter(|d| d.outcome() == Some(Outcome::LoadOverride))
            .count();
        assert_eq!(by_load, 5);
    }
}

/// An answer ended at cluster `name` at the fixture's time: one of its slots just went idle.
fn answered_now(f: &Fixture, name: &str) {
    let mut answer = f.cluster(name).load().start_request();
    answer.first_token();
    answer.end_at(f.now);
}

#[test]
fn on_slot_engines_a_new_conversation_leaves_a_slot_that_just_went_idle_unless_heads_are_kept() {
    let SharedHead { f, first_turns, .. } = shared_head_at_slow_east(16);
    for name in ["east-a", "west-a"] {
        f.set_slots(name, Some(2));
    }
    let east = f.id("east-a");
    // An answer just ended at east: the conversation it answered, behind the same head,
    // may be about to come back. West's slots went idle long ago.
    answered_now(&f, "east-a");
    // Nothing learned about heads: a newcomer behind the head would take the slot holding
    // it, likely that live conversation's. It takes west's free slot instead, placed as a
    // prompt matching nothing, and its answer asks nothing.
    assert!(!f.affinity.keeps_shared_heads(&east));
    let passed_over = |decision: &Decision| -> Vec<ClusterId> {
        decision
            .passed_over()
            .iter()
            .map(|c| c.id().clone())
            .collect()
    };
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
        assert_eq!(names(&decision), ["west-a"]);
        assert_eq!(decision.placed().unwrap().cluster(), &f.id("west-a"));
        assert!(!decision.asks_shared_head());
        assert_eq!(passed_over(&decision), std::slice::from_ref(&east));
    }
    // So does a request too short to key, which goes by load: which idle slot the engine
    // gives it is not known.
    let short = f.prompt(&[("user", "hi")]);
    assert!(short.keys().is_err());
    let decision = f.decide(&short);
    assert_eq!(decision.outcome(), Some(Outcome::NotApplicable));
    assert_eq!(names(&decision), ["west-a"]);
    assert_eq!(passed_over(&decision), std::slice::from_ref(&east));
    // One drawn to explore still goes by load to any.
    let decision = f.decide_drawing(&first_turns[1], 0.0);
    assert_eq!(decision.outcome(), Some(Outcome::Exploration));
    assert_eq!(names(&decision), ["east-a", "west-a"]);
    assert!(decision.passed_over().is_empty());
    // Once the window has passed, east's slots are fair game again.
    let later = Fixture {
        now: f.now + SLOT_RECLAIM_WINDOW,
        ..f
    };
    assert_eq!(
        later.decide(&first_turns[1]).outcome(),
        Some(Outcome::Sticky)
    );
    assert_eq!(names(&later.decide(&short)), ["east-a", "west-a"]);
    let f = Fixture {
        now: later.now.checked_sub(SLOT_RECLAIM_WINDOW).unwrap(),
        ..later
    };
    // West with no free slot: nowhere better to go, east it is.
    let west_full = f.running("west-a", 2);
    let decision = f.decide(&first_turns[1]);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert!(decision.passed_over().is_empty());
    assert_eq!(names(&f.decide(&short)), ["east-a", "west-a"]);
    drop(west_full);
    // A slot just went idle at west too: neither is better, the head is taken.
    answered_now(&f, "west-a");
    assert_eq!(f.decide(&first_turns[1]).outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&f.decide(&short)), ["east-a", "west-a"]);
    let f = Fixture {
        now: f.now + SLOT_RECLAIM_WINDOW,
        ..f
    };
    answered_now(&f, "east-a");
    assert_eq!(names(&f.decide(&short)), ["west-a"]);
    // East's engines found a head: they keep what is pushed out of a slot (a host cache),
    // and the slot is worth taking.
    assert!(f.affinity.count_shared_head(&east, true).unwrap().kept);
    assert_eq!(f.decide(&first_turns[1]).outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&f.decide(&short)), ["east-a", "west-a"]);
    // A miss outweighs it: passed over again.
    assert!(!f.affinity.count_shared_head(&east, false).unwrap().kept);
    assert_eq!(names(&f.decide(&short)), ["west-a"]);
    // Engines whose slots are not known are never passed over this way.
    f.set_slots("east-a", None);
    assert_eq!(names(&f.decide(&short)), ["east-a", "west-a"]);
}

#[test]
fn on_slot_engines_a_new_conversation_leaves_a_holder_whose_slot_just_went_idle_for_another() {
    // Two holders of a system prompt, east and north: a conversation each behind it.
    let f = three_slot_sites();
    let house = text("house", 16 * 256);
    for (name, question) in [("east-a", "first of a"), ("north-a", "first of b")] {
        f.answered(name, &f.prompt(&[("system", &house), ("user", question)]));
    }
    let first = f.prompt(&[("system", &house), ("user", "someone asks")]);
    let ids = |clusters: &[Arc<Cluster>]| -> Vec<ClusterId> {
        clusters.iter().map(|c| c.id().clone()).collect()
    };
    assert_eq!(names(&f.decide(&first)), ["east-a", "north-a"]);
    // An answer just ended at east: its idle slot likely holds that conversation, north's
    // does not. The newcomer finds the head at north.
    answered_now(&f, "east-a");
    let decision = f.decide(&first);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["north-a"]);
    assert_eq!(ids(decision.passed_over()), [f.id("east-a")]);
    assert!(decision.asks_shared_head() && decision.placed().is_none());
    // North's slots full: no holder has a slot that did not just go idle. The newcomer
    // takes west's, placed as a prompt matching nothing.
    let north_full = f.running("north-a", 2);
    let decision = f.decide(&first);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["west-a"]);
    assert_eq!(decision.placed().unwrap().cluster(), &f.id("west-a"));
    assert_eq!(ids(decision.passed_over()), [f.id("east-a")]);
    drop(decision);
    drop(north_full);
    // A slot just went idle at north too: both holders are passed over.
    answered_now(&f, "north-a");
    let decision = f.decide(&first);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["west-a"]);
    assert_eq!(
        ids(decision.passed_over()),
        [f.id("east-a"), f.id("north-a")]
    );
    drop(decision);
    // West full as well: nowhere better, the holders it is.
    let _west_full = f.running("west-a", 2);
    let decision = f.decide(&first);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a", "north-a"]);
    assert!(decision.passed_over().is_empty());
}

#[test]
fn on_slot_engines_a_new_conversation_holds_where_a_slot_just_went_idle_and_a_later_turn_never_does()
 {
    let SharedHead {
        f,
        a_next,
        first_turns,
    } = shared_head_at_slow_east(16);
    for name in ["east-a", "west-a"] {
        f.set_slots(name, Some(2));
    }
    let east = f.id("east-a");
    answered_now(&f, "east-a");
    // West's slots full: nowhere better than east for a newcomer, which holds there until
    // shortly after the answer's end.
    let west_full = f.running("west-a", 2);
    let until = f.now + SLOT_RECLAIM_HOLD;
    let short = f.prompt(&[("user", "hi")]);
    let mut newcomers: Vec<&Prompt> = first_turns.iter().collect();
    newcomers.push(&short);
    for newcomer in &newcomers {
        let decision = f.decide(newcomer);
        assert!(names(&decision).contains(&"east-a"));
        assert_eq!(decision.holds(), [(east.clone(), until)]);
        // Explored, it still does.
        let explored = f.decide_drawing(newcomer, 0.0);
        assert_eq!(explored.holds(), [(east.clone(), until)]);
    }
    // A later turn of the conversation answered there never waits: its slot is the one.
    for next in &a_next {
        let decision = f.decide(next);
        assert_eq!(names(&decision), ["east-a"]);
        assert!(decision.holds().is_empty());
    }
    // After the hold, or where the engines keep shared heads, nothing waits.
    let later = Fixture { now: until, ..f };
    assert!(later.decide(&short).holds().is_empty());
    let f = Fixture {
        now: until.checked_sub(SLOT_RECLAIM_HOLD).unwrap(),
        ..later
    };
    assert!(f.affinity.count_shared_head(&east, true).unwrap().kept);
    for newcomer in &newcomers {
        assert!(f.decide(newcomer).holds().is_empty());
    }
    drop(west_full);
}

/// `n` answers streaming at cluster `name` (their first token sent).
fn streaming(f: &Fixture, name: &str, n: usize) -> Vec<InFlight> {
    let mut running = f.running(name, n);
    for answer in &mut running {
        answer.first_token();
    }
    running
}

#[test]
fn on_slot_engines_a_later_turn_moved_off_its_cluster_never_takes_the_one_slot_that_just_went_idle()
{
    // A conversation whose first turn was too short to key, answered at east: its second
    // turn goes back there by its thread, priced at nothing east holds that was keyed, so
    // any excess load at east moves it (the arena's case: a 46-token question).
    let f = three_slot_sites();
    let first = f.prompt(&[("user", "hi")]);
    assert!(first.keys().is_err());
    f.answered("east-a", &first);
    let next = f.prompt(&[
        ("user", "hi"),
        ("assistant", &text("answer", 4 * 256)),
        ("user", "tell me more"),
    ]);
    let ids = |clusters: &[Arc<Cluster>]| -> Vec<ClusterId> {
        clusters.iter().map(|c| c.id().clone()).collect()
    };
    // One of east's slots busy, waiting for its first token; one of west's streaming (half
    // the load); its other slot free, as is east's.
    let east_busy = f.running("east-a", 1);
    let west_busy = streaming(&f, "west-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["north-a"]);
    assert!(decision.passed_over().is_empty());
    // An answer just ended in west's other slot, its one free: the move would take that
    // live conversation's slot. West is left out.
    answered_now(&f, "west-a");
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert_eq!(names(&decision), ["north-a"]);
    assert_eq!(ids(decision.passed_over()), [f.id("west-a")]);
    // North full too, busier than east: the only lighter place is west's freed slot, which
    // the gate does not weigh while east has a slot free. The turn stays with its
    // conversation, west passed over (the gate would have moved it there).
    let north_full = f.running("north-a", 2);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(names(&decision), ["east-a"]);
    assert_eq!(ids(decision.passed_over()), [f.id("west-a")]);
    // With east's slots full too, staying means waiting for one there, and whichever frees
    // first is likely a live conversation's: the move goes where the load is least.
    let east_full = f.running("east-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert!(names(&decision).contains(&"west-a"));
    drop((decision, east_full));
    // With both of west's slots idle the engine gives the mover the other, least recently
    // used: the move goes there.
    drop(west_busy);
    assert!(f.cluster("west-a").load().slot_just_freed(f.now));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert!(names(&decision).contains(&"west-a"));
    let west_busy = streaming(&f, "west-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(ids(decision.passed_over()), [f.id("west-a")]);
    // Where west's engines keep what is pushed out of a slot (a host cache), the slot is
    // fair game.
    let west = f.id("west-a");
    assert!(f.affinity.count_shared_head(&west, true).unwrap().kept);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert!(names(&decision).contains(&"west-a"));
    assert!(!f.affinity.count_shared_head(&west, false).unwrap().kept);
    // With east's request streaming, as light as west: the gate keeps the turn there with
    // west weighed or not, so nothing is passed over.
    drop((decision, east_busy));
    let east_busy = streaming(&f, "east-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert!(decision.passed_over().is_empty());
    drop((decision, north_full, east_busy, west_busy));
}

#[test]
fn on_slot_engines_a_sticky_later_turn_the_gate_moves_never_takes_the_one_slot_that_just_went_idle()
{
    // A conversation's own history held at east, long enough to stick by prefix: sixteen
    // blocks, worth 0.4 of a queued request at the priors.
    let f = three_slot_sites();
    let history = [
        ("user", text("question", 8 * 256)),
        ("assistant", text("answer", 8 * 256)),
    ];
    let next = f.prompt(&[
        ("user", &history[0].1),
        ("assistant", &history[1].1),
        ("user", "and?"),
    ]);
    f.confirm("east-a", &next);
    assert!(next.keys().unwrap().continues_conversation());
    assert_eq!(f.decide(&next).outcome(), Some(Outcome::Sticky));
    // One request waiting at east, one streaming at west and at north: east is busier by
    // half a request, more than the match is worth. The gate moves the turn.
    let east_busy = f.running("east-a", 1);
    let west_busy = streaming(&f, "west-a", 1);
    let north_busy = streaming(&f, "north-a", 1);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert!(names(&decision).contains(&"west-a"));
    // An answer just ended at west and at north, in each one's one free slot: the only
    // lighter places, which the gate does not weigh while east has a slot free. It sticks,
    // both passed over.
    answered_now(&f, "west-a");
    answered_now(&f, "north-a");
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
    let mut passed: Vec<_> = decision
        .passed_over()
        .iter()
        .map(|c| c.id().clone())
        .collect();
    passed.sort_by_key(|id| id.name().to_owned());
    assert_eq!(passed, [f.id("north-a"), f.id("west-a")]);
    // Later, only west's slot just went idle: the move goes to north, past west.
    let f = Fixture {
        now: f.now + SLOT_RECLAIM_WINDOW,
        ..f
    };
    answered_now(&f, "west-a");
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
    assert!(!names(&decision).contains(&"west-a"));
    assert!(names(&decision).contains(&"north-a"));
    // Counted once: left out of where it moves (the gate's leaving it out changed nothing).
    let passed: Vec<_> = decision
        .passed_over()
        .iter()
        .map(|c| c.id().clone())
        .collect();
    assert_eq!(passed, [f.id("west-a")]);
    drop((decision, north_busy, west_busy, east_busy));
}

#[test]
fn on_slot_engines_a_placed_conversation_takes_a_free_slot_by_room_where_one_just_went_idle() {
    // A placement is not passed over a slot that just went idle: on the simulator's slot
    // engines, which keep a host cache, passing over for placements cost the bar
    // (docs/architecture.md, "Affinity", step 2).
    let f = three_slot_sites();
    assert_eq!(names(&f.decide(&stranger(&f, "first", 20))), ["east-a"]);
    answered_now(&f, "east-a");
    assert!(f.cluster("east-a").load().slot_just_freed(f.now));
    let next = f.decide(&stranger(&f, "second", 20));
    assert_eq!(next.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&next), ["east-a"]);
}

#[test]
fn without_engine_feedback_a_first_turn_asks_nothing_and_nothing_is_learned_elsewhere() {
    let SharedHead { f, first_turns, .. } = shared_head_at_slow_east(16);
    f.affinity.set_settings(settings(
        &PrefixAffinityConfig::default()
            .with_queued_request_seconds(Price::Fixed(2.0))
            .with_engine_feedback(false),
    ));
    for first in &first_turns {
        let decision = f.decide(first);
        assert_eq!(decision.outcome(), Some(Outcome::Sticky));
        assert!(!decision.asks_shared_head());
    }
    // A cluster the index does not know counts nothing.
    let gone = ClusterId::new(crate::grid::SiteName::new("gone").unwrap(), "gone-a");
    assert_eq!(f.affinity.count_shared_head(&gone, true), None);
    assert!(!f.affinity.keeps_shared_heads(&f.id("east-a")));
}

#[test]
fn a_new_conversation_matching_a_shared_head_of_8_kib_is_the_load_gates_to_weigh() {
    // 40 blocks stick on their length alone and save 25.6 s at east, 12.8 queued requests.
    let SharedHead { f, first_turns, .. } = shared_head_at_slow_east(40);
    let _in_flight = f.running("east-a", 1);
    for first in &first_turns {
        assert_eq!(f.decide(first).outcome(), Some(Outcome::Sticky));
    }
    // Past what the head is worth the gate gives it up.
    f.set_queue("east-a", Some(13.0));
    for first in &first_turns {
        assert_eq!(f.decide(first).outcome(), Some(Outcome::LoadOverride));
    }
}

#[test]
fn a_session_whose_cluster_is_drained_goes_elsewhere() {
    let f = three_sites();
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    // West admits no new request, so it is no candidate.
    let candidates = vec![f.cluster("east-a"), f.cluster("north-a")];
    let decision = f.affinity.decide(
        candidates,
        next.keys().ok(),
        next.session(),
        f.now,
        NO_EXPLORATION,
    );
    assert_eq!(decision.outcome(), Some(Outcome::NoMatch));
    assert_eq!(names(&decision), ["east-a", "north-a"]);
}

#[test]
fn a_sticky_prefix_match_wins_over_the_session() {
    let f = two_sites();
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    // East was sent the whole of the next turn's prompt by another request.
    f.confirm("east-a", &next);
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(names(&decision), ["east-a"]);
}

#[test]
fn the_same_session_id_under_another_salt_or_model_is_another_session() {
    let f = two_sites();
    let (first, _) = short_conversation(&f, "conv-1", Some("tenant-a"));
    let (_, other_tenant) = short_conversation(&f, "conv-1", Some("tenant-b"));
    let (_, same_tenant) = short_conversation(&f, "conv-1", Some("tenant-a"));
    f.answered("west-a", &first);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    assert_eq!(f.decide(&same_tenant).outcome(), Some(Outcome::Session));
    assert_ne!(other_tenant.session(), first.session());
    assert_eq!(f.decide(&other_tenant).outcome(), Some(Outcome::NoMatch));
    // Another model: the same id and salt are another session.
    let mut body: serde_json::Value = serde_json::from_slice(&session_body(
        &[("user", "and?")],
        "conv-1",
        Some("tenant-a"),
    ))
    .unwrap();
    body["model"] = "other-model".into();
    let other_model = prompt_of(&f.seed, &serde_json::to_vec(&body).unwrap());
    assert!(other_model.session().is_some());
    assert_ne!(other_model.session(), first.session());
}

#[test]
fn a_session_without_prompt_keys_sticks_to_where_it_was_answered() {
    let f = two_sites();
    let (first, _) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    // A later turn whose prompt cannot be keyed (token ids) but names the session.
    let body = br#"{"model":"m","prompt_cache_key":"conv-1","prompt":[1,2,3]}"#;
    let tokens = key_body(&f.seed, Api::Completions, body).unwrap();
    assert!(tokens.keys().is_err());
    // Completions and Chat name the same session alike.
    assert_eq!(tokens.session(), first.session());
    let decision = f.decide(&tokens);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert_eq!(names(&decision), ["west-a"]);
    // No keys, no depth: nothing for engine feedback to weigh.
    assert_eq!(predicted_match(&decision), None);
    // A failure there drops the session too.
    crate::confirm::Verdict::Drop.apply_to_request(
        &f.index,
        &f.id("west-a"),
        tokens.keys().ok(),
        tokens.session(),
        f.now,
    );
    assert_eq!(f.decide(&tokens).outcome(), Some(Outcome::NotApplicable));
}

#[test]
fn a_session_that_moved_follows_its_latest_answer() {
    let f = two_sites();
    let (first, next) = short_conversation(&f, "conv-1", None);
    f.answered("west-a", &first);
    let later = Fixture {
        now: f.now + Duration::from_secs(5),
        ..f
    };
    later.answered("east-a", &first);
    later.set_queue("east-a", Some(0.0));
    later.set_queue("west-a", Some(0.0));
    assert_eq!(names(&later.decide(&next)), ["east-a"]);
}

#[test]
fn a_session_shallower_than_a_sticky_match_is_not_weighed_against_the_engine() {
    let f = two_sites();
    let short = text("hello", 2 * 256);
    let first = prompt_of(&f.seed, &session_body(&[("user", &short)], "conv-2", None));
    let next = prompt_of(
        &f.seed,
        &session_body(
            &[
                ("user", &short),
                ("assistant", "hi"),
                ("user", &text("more", 4096)),
            ],
            "conv-2",
            None,
        ),
    );
    f.answered("west-a", &first);
    f.set_queue("east-a", Some(0.0));
    f.set_queue("west-a", Some(0.0));
    let decision = f.decide(&next);
    assert_eq!(decision.outcome(), Some(Outcome::Session));
    assert!(decision.deepest() > 0 && decision.deepest() < MIN_STICKY_DEPTH);
    assert_eq!(predicted_match(&decision), None);
}
