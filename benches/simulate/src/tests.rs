//! Each policy on tiny traces whose hits and times were worked out by hand.
//!
//! The engine model here: 1000 prompt tokens a second, 0.1 s overhead, 1000 output tokens a
//! second, memory for 1000 blocks. A cold 1024-token prompt thus takes 1.124 s to its
//! first token, a fully cached one 0.1 s; a 10-token answer lasts 0.01 s more.

use grid_route_layer::config::Price;
use std::time::Duration;

use super::*;

fn request(arrival_ms: u64, blocks: &[u64]) -> TraceRequest {
    TraceRequest {
        arrival_ms,
        input_tokens: 512 * blocks.len() as u64,
        output_tokens: 10,
        blocks: blocks.to_vec(),
        block_tokens: crate::trace::TRACE_BLOCK_TOKENS,
        extends: None,
        conversation: None,
    }
}

fn args(sites: usize, policy: Policy) -> SimulateArgs {
    let mut args = SimulateArgs::new("hand-made");
    args.sites = sites;
    args.policies = vec![policy];
    args.engine = EngineArgs::from(EngineModel {
        kv_tokens: 512 * 1000,
        max_running: 16,
        prefill_tps: 1000.0,
        prefill_overhead_s: 0.1,
        decode_tps: 1000.0,
        ..EngineModel::default()
    });
    // No random exploration: the decisions below are the rule's alone.
    args.gateway.exploration = 0.0;
    args
}

fn run(args: &SimulateArgs, trace: &[TraceRequest]) -> PolicyResult {
    let report = simulate(args, trace, false).unwrap();
    assert_eq!(report.results.len(), 1);
    report.results.into_iter().next().unwrap()
}

fn ttfts(result: &PolicyResult) -> Vec<f64> {
    result
        .sorted_ttft
        .iter()
        .map(|t| (t * 1e6).round() / 1e6)
        .collect()
}

/// One conversation: turns at 0 s, 10 s and 20 s with the same two blocks.
fn three_turns() -> Vec<TraceRequest> {
    vec![
        request(0, &[1, 2]),
        request(10_000, &[1, 2]),
        request(20_000, &[1, 2]),
    ]
}

fn outcomes(result: &PolicyResult) -> Vec<(&'static str, u64)> {
    result
        .outcomes
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (*k, *n))
        .collect()
}

#[test]
fn round_robin_sends_the_second_turn_to_a_cold_engine() {
    let result = run(&args(2, Policy::RoundRobin), &three_turns());
    // Engine 0, engine 1 (cold), engine 0 (warm).
    assert_eq!(ttfts(&result), [0.1, 1.124, 1.124]);
    assert_eq!(result.hit_share, 0.3333);
    // The second turn's prompt was held whole at engine 0, where it did not go.
    assert_eq!(result.held_anywhere_share, 0.6667);
    assert_eq!(result.ttft_p50_s, 1.124);
    assert_eq!(result.max_over_mean_requests, 1.333);
    assert!(outcomes(&result).is_empty());
}

#[test]
fn least_queue_turns_through_idle_sites() {
    // Every queue reads 0 and nothing is in flight at each arrival: Select's rotation.
    let result = run(&args(2, Policy::LeastQueue), &three_turns());
    assert_eq!(ttfts(&result), [0.1, 1.124, 1.124]);
    assert_eq!(result.hit_share, 0.3333);
}

#[test]
fn grid_route_keeps_the_conversation_where_it_was_confirmed() {
    let result = run(&args(2, Policy::GridRoute), &three_turns());
    // The first turn has no match; the next two stick to its site and hit whole.
    assert_eq!(ttfts(&result), [0.1, 0.1, 1.124]);
    assert_eq!(result.hit_share, 0.6667);
    assert_eq!(result.held_anywhere_share, 0.6667);
    assert_eq!(result.max_over_mean_requests, 2.0);
    assert_eq!(outcomes(&result), [("no_match", 1), ("sticky", 2)]);
}

#[test]
fn grid_route_replicas_that_share_an_index_stick_like_one() {
    // Four replicas: wherever the turns land, the shared index knows the first one's site.
    let mut shared = args(2, Policy::GridRoute);
    shared.replicas = 4;
    shared.shared_index = true;
    let result = run(&shared, &three_turns());
    assert_eq!(result.hit_share, 0.6667);
    assert_eq!(outcomes(&result), [("no_match", 1), ("sticky", 2)]);
    // Own indexes: a turn sticks only when it reaches a replica that saw an earlier turn.
    // The L4 balancer's draws are the seed's.
    let mut balancer = fastrand::Rng::with_seed(shared.seed);
    let replicas: Vec<usize> = (0..3).map(|_| balancer.usize(..4)).collect();
    let sticky = (1..3)
        .filter(|&i| replicas[..i].contains(&replicas[i]))
        .count() as u64;
    shared.shared_index = false;
    let result = run(&shared, &three_turns());
    let expected: Vec<_> = [("no_match", 3 - sticky), ("sticky", sticky)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(outcomes(&result), expected, "replicas {replicas:?}");
}

#[test]
fn grid_route_forgets_a_prefix_where_an_engine_refused_it() {
    // The first seed whose draws refuse only the second turn.
    let share = 0.5;
    let seed = (1..10_000)
        .find(|&seed| {
            let mut failures = fastrand::Rng::with_seed(seed ^ run::FAILURE_SEED_SALT);
            let refused: Vec<bool> = (0..3).map(|_| failures.f64() < share).collect();
            refused == [false, true, false]
        })
        .unwrap();
    let mut failing = args(2, Policy::GridRoute);
    failing.seed = seed;
    failing.fail_share = share;
    let result = run(&failing, &three_turns());
    // Turn 1 is confirmed at site 0; turn 2 sticks there and gets a 503, which drops the
    // keys; turn 3 finds no match. The engine still holds the blocks: Select's rotation
    // (turn 2 of 3) brings it back to site 0, warm.
    assert_eq!(result.requests, 2);
    assert_eq!(outcomes(&result), [("no_match", 2), ("sticky", 1)]);
    assert_eq!(ttfts(&result), [0.1, 1.124]);
    assert_eq!(result.hit_share, 0.5);
}

#[test]
fn grid_route_forgets_what_an_engine_evicted_before_a_prompt_it_reported_missing() {
    // Engines with room for 4 blocks. Idle sites take no-match requests in turn, so the
    // conversations O, A, C and D land on site 0 and fillers on site 1. Site 0's engine
    // then holds C and D only; its index still believes O and A.
    let trace = [
        request(0, &[7, 8]),
        request(2_000, &[20, 21]),
        request(4_000, &[1, 2]),
        request(6_000, &[22, 23]),
        request(8_000, &[9, 10]),
        request(10_000, &[24, 25]),
        request(12_000, &[11, 12]),
        // A's next turn sticks to site 0, which reports none of it cached; then O's.
        request(20_000, &[1, 2]),
        request(22_000, &[7, 8]),
    ];
    let mut small = args(2, Policy::GridRoute);
    small.engine.kv_tokens = 512 * 4;
    let taught = run(&small, &trace);
    // The miss on A made the index forget what it recorded at site 0 before A: O's next
    // turn finds no match and goes by load.
    assert_eq!(outcomes(&taught), [("no_match", 8), ("sticky", 1)]);
    small.gateway.engine_feedback = false;
    let untaught = run(&small, &trace);
    // Without engine feedback O's turn sticks to a cache that no longer holds it.
    assert_eq!(outcomes(&untaught), [("no_match", 7), ("sticky", 2)]);
    assert_eq!(taught.hit_share, 0.0);
    assert_eq!(untaught.hit_share, 0.0);
}

/// A request of `tokens` prompt tokens over `blocks` (the last one partial when fewer).
fn request_of(arrival_ms: u64, blocks: &[u64], tokens: u64) -> TraceRequest {
    TraceRequest {
        input_tokens: tokens,
        ..request(arrival_ms, blocks)
    }
}

#[test]
fn grid_route_learns_from_a_first_turn_that_found_its_head_to_join_a_busier_holder() {
    // Two sites of one 2-slot engine with a host cache, a queued request priced at 1 s.
    // Every conversation opens with the three-block head 1, 2, 3 and 300 tokens of its
    // own: the head covers 24 of its 28 keys (over 80%, under 32 blocks), a short shared
    // head, worth 1.5 queued requests.
    let trace = [
        // O goes past the head, so no later request ending at it continues another.
        request(0, &[1, 2, 3, 4]),
        // B: its holder is no busier than the other site, so it sticks and asks; the
        // engine finds the head in O's idle slot.
        request_of(5_000, &[1, 2, 3, 5], 1836),
        // O's next turn holds one of the holder's slots from 9 s to 11.15 s...
        request(9_000, &[1, 2, 3, 4, 6, 7, 8, 9]),
        // ...when C opens: the holder is busier, with a free slot.
        request_of(10_000, &[1, 2, 3, 10], 1836),
    ];
    let mut slots = args(2, Policy::GridRoute);
    slots.engine.engine = EngineKind::Slots;
    slots.engine.slots = 2;
    slots.engine.host_cache_tokens = 512 * 100;
    slots.gateway.prefill_price = Price::Fixed(1000.0);
    slots.gateway.queued_request_seconds = Price::Fixed(1.0);
    let taught = run(&slots, &trace);
    // B's answer taught that the holder keeps shared heads: C joins it.
    assert_eq!(outcomes(&taught), [("no_match", 1), ("sticky", 3)]);
    // Without engine feedback nothing is learned: C goes by load, as the first-turn rule
    // without the tally says.
    slots.gateway.engine_feedback = false;
    let untaught = run(&slots, &trace);
    assert_eq!(
        outcomes(&untaught),
        [("load_override", 1), ("no_match", 1), ("sticky", 2)]
    );
}

#[test]
fn cache_aware_follows_its_tree_then_fills_the_smallest_tenant() {
    let mut trace = three_turns();
    trace.push(request(30_000, &[7, 8]));
    let result = run(&args(2, Policy::CacheAware), &trace);
    // Turn 1: empty tree, smallest tenant engine 0. Turns 2, 3: match rate 1 > 0.3,
    // engine 0, warm. The new conversation matches nothing: engine 1, the smaller tree.
    assert_eq!(ttfts(&result), [0.1, 0.1, 1.124, 1.124]);
    assert_eq!(result.hit_share, 0.5);
    assert_eq!(result.max_over_mean_requests, 1.5);
    assert_eq!(outcomes(&result), [("cache_hit", 2), ("cache_miss", 2)]);
}

#[test]
fn chwbl_overflows_past_the_load_bound() {
    // Three turns of one prefix at once on two engines: the home engine takes two
    // (bounds ceil(1.25 * 1 / 2) = 1, then ceil(1.25 * 2 / 2) = 2) and the third,
    // at bound ceil(1.25 * 3 / 2) = 2, overflows. The home engine's second request
    // starts after the first's prefill and finds its blocks: 1.124 + 0.1.
    let trace = vec![
        request(0, &[1, 2]),
        request(0, &[1, 2]),
        request(0, &[1, 2]),
    ];
    let result = run(&args(2, Policy::Chwbl), &trace);
    assert_eq!(ttfts(&result), [1.124, 1.124, 1.224]);
    assert_eq!(result.hit_share, 0.3333);
    assert_eq!(outcomes(&result), [("home", 2), ("overflow", 1)]);
}

#[test]
fn oracle_picks_the_least_predicted_time_to_first_token() {
    // A at 0 s on engine 0 (a tie, the first); B, unrelated, at 0.5 s: engine 0 would
    // make it wait 0.624 s more, so engine 1; A's next turn at 10 s: engine 0, warm.
    let trace = vec![
        request(0, &[1, 2]),
        request(500, &[3, 4]),
        request(10_000, &[1, 2]),
    ];
    let result = run(&args(2, Policy::Oracle), &trace);
    assert_eq!(ttfts(&result), [0.1, 1.124, 1.124]);
    assert_eq!(result.hit_share, 0.3333);
}

#[test]
fn a_queue_delays_the_first_token_behind_earlier_prefills() {
    // One engine, three cold prompts at once: first tokens at 1.124, 2.248, 3.372 s.
    let trace = vec![
        request(0, &[1, 2]),
        request(0, &[3, 4]),
        request(0, &[5, 6]),
    ];
    let result = run(&args(1, Policy::RoundRobin), &trace);
    assert_eq!(ttfts(&result), [1.124, 2.248, 3.372]);
    assert_eq!(result.hit_share, 0.0);
    assert_eq!(result.ttft_p99_s, 3.372);
}

#[test]
fn a_request_larger_than_the_kv_cache_is_refused() {
    let mut small = args(1, Policy::RoundRobin);
    small.engine.kv_tokens = 1024;
    let error = simulate(&small, &[request(0, &[1, 2, 3])], false).unwrap_err();
    assert_eq!(
        error.to_string(),
        "request 1 of the trace needs 2048 KV tokens, more than --kv-tokens 1024"
    );
}

/// `simulate`'s flags as a command of their own.
#[derive(Debug, clap::Parser)]
struct Command {
    #[command(flatten)]
    args: SimulateArgs,
}

fn parse_line(line: &str) -> Result<SimulateArgs, String> {
    use clap::Parser as _;
    Command::try_parse_from(std::iter::once("simulate").chain(line.split_whitespace()))
        .map(|command| command.args)
        .map_err(|error| error.to_string())
}

#[test]
fn the_command_line_parses_every_flag_and_refuses_bad_values() {
    let parsed = parse_line(
        "--trace t.jsonl --sites 8 --engines-per-site 2 --replicas 4 --shared-index \
         --policies grid-route,oracle --seed 7 --json --plot c.svg --kv-tokens 1000 \
         --max-running 8 --prefill-tps 5000 --prefill-overhead-ms 30 --decode-tps 50 \
         --poll-interval-ms 250 --queue-window-secs=3 --threshold 0.6 --exploration 0.1 \
         --prefill-price 20000 --queued-request-seconds 6 --count-in-flight true \
         --engine-feedback false --capacity 64 --ttl-secs 30 --fail-share 0.25 --slots-unknown",
    )
    .unwrap();
    assert!(parsed.gateway.slots_unknown);
    assert_eq!(parsed.sites, 8);
    assert_eq!(parsed.engines_per_site, 2);
    assert_eq!(parsed.replicas, 4);
    assert!(parsed.shared_index && parsed.json);
    assert_eq!(parsed.policies, [Policy::GridRoute, Policy::Oracle]);
    assert_eq!(parsed.seed, 7);
    assert_eq!(parsed.engine.model().kv_tokens, 1000);
    assert_eq!(parsed.engine.model().prefill_overhead_s, 0.03);
    assert_eq!(parsed.gateway.poll_interval(), Duration::from_millis(250));
    assert_eq!(parsed.gateway.queue_window(), Duration::from_secs(3));
    let affinity = parsed.gateway.prefix_affinity();
    assert_eq!(affinity.threshold, 0.6);
    assert_eq!(affinity.exploration, 0.1);
    assert_eq!(affinity.prefill_tokens_per_second, Price::Fixed(20_000.0));
    assert_eq!(affinity.queued_request_seconds, Price::Fixed(6.0));
    assert!(parsed.gateway.count_in_flight);
    assert!(!affinity.engine_feedback);
    assert_eq!((affinity.capacity, affinity.ttl_secs), (64, 30));
    assert_eq!(parsed.fail_share, 0.25);
    for (bad, error) in [
        ("--sites 4", "--trace <FILE>"),
        ("--trace t --sites 0", "0 is not in 1.."),
        (
            "--trace t --policies fastest",
            "invalid value 'fastest' for '--policies <LIST>'",
        ),
        (
            "--trace t --threshold 1.5",
            "prefix_affinity.threshold must be in (0, 1], got 1.5",
        ),
        (
            "--trace t --prefill-tps -3",
            "must be a number above 0, got \"-3\"",
        ),
        (
            "--trace t --prefill-overhead-ms x",
            "expected a number, got \"x\"",
        ),
        ("--trace t --bogus 1", "unexpected argument '--bogus'"),
        ("--trace t --fail-share 1", "must be in [0, 1)"),
        (
            "--trace t --queued-request-seconds 0",
            "prefix_affinity.queued_request_seconds must be a finite number greater",
        ),
        (
            "--trace t --capacity 0",
            "prefix_affinity.capacity must be at least 1, got 0",
        ),
        (
            "--trace t --ttl-secs 0",
            "prefix_affinity.ttl_secs must be at least 1, got 0",
        ),
        (
            "--trace t --capacity x",
            "expected a whole number, got \"x\"",
        ),
        (
            "--trace t --count-in-flight yes",
            "invalid value 'yes' for '--count-in-flight <BOOL>'",
        ),
        ("--trace", "a value is required for '--trace <FILE>'"),
    ] {
        let got = parse_line(bad).unwrap_err();
        assert!(got.contains(error), "{bad}: {got}");
    }
}

#[test]
fn no_flags_but_the_trace_give_the_documented_defaults() {
    let parsed = parse_line("--trace t.jsonl").unwrap();
    assert_eq!(parsed, SimulateArgs::new("t.jsonl"));
    assert_eq!(parsed.engine.model(), EngineModel::default());
    assert_eq!(
        parsed.gateway.prefix_affinity(),
        grid_route_layer::config::PrefixAffinityConfig::default()
    );
}

#[test]
fn policies_are_named_on_the_command_line_as_in_the_output() {
    use clap::ValueEnum as _;
    for policy in Policy::ALL {
        let value = policy.to_possible_value().unwrap();
        assert_eq!(value.get_name(), policy.name());
    }
    assert_eq!(Policy::value_variants(), Policy::ALL);
}

/// Conversation a's two turns and b's one, sent 1 ms apart, naming their conversations
/// (`conversation`) when `named`.
fn two_conversations(named: bool) -> Vec<TraceRequest> {
    let of = |conversation: u64, request: TraceRequest| TraceRequest {
        conversation: named.then_some(conversation),
        ..request
    };
    vec![
        of(0, request(0, &[1, 2])),
        of(0, request(1, &[1, 2, 3])),
        of(1, request(2, &[7, 8])),
    ]
}

#[test]
fn closed_loop_clients_send_a_turn_when_the_answer_before_it_has_ended() {
    // One client: a's first turn at 0 s (cold, first token at 1.124 s, answer ended at
    // 1.134 s); a's second turn then, finding the first's 1024 tokens (0.1 s + 512 tokens
    // = 0.612 s, ended at 1.756 s); then b's first turn, cold again.
    let mut closed = args(1, Policy::RoundRobin);
    closed.clients.closed_loop = Some(1);
    for named in [true, false] {
        let result = run(&closed, &two_conversations(named));
        assert_eq!(ttfts(&result), [0.612, 1.124, 1.124], "named {named}");
        assert_eq!(result.hit_share, 0.2857);
    }
    // Two clients: b's first turn is sent at its trace time, 2 ms, and prefills after a's
    // (first token at 2.248 s); a's second turn, sent at 1.134 s, prefills after that
    // (first token at 2.860 s).
    closed.clients.closed_loop = Some(2);
    let result = run(&closed, &two_conversations(true));
    assert_eq!(ttfts(&result), [1.124, 1.726, 2.246]);
    // Open-loop, a's second turn is sent at 1 ms, b's at 2 ms: each waits behind the
    // prefills before it.
    let result = run(&args(1, Policy::RoundRobin), &two_conversations(true));
    assert_eq!(ttfts(&result), [1.124, 1.735, 2.858]);
    assert_eq!(result.hit_share, 0.2857);
}
