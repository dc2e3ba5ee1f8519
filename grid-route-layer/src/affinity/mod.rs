//! Prefix affinity: send a request where its prompt prefix is already cached, while that
//! site's queue allows.
//!
//! An engine that served a prompt keeps its prefix in KV cache; sending the next turn of
//! the conversation there skips paying that prefill again. The [`PrefixIndex`] knows how
//! deep into a request's keys each cluster holds it; affinity turns those depths and the
//! clusters' queues into a narrower candidate list for the balancer.
//!
//! # The rule
//!
//! With at least two admitted candidates for the request's model ([`Affinity::decide`];
//! with fewer there is nothing to choose, and nothing is counted):
//!
//! 1. No keys and no session → [`Outcome::NotApplicable`]. A random share `exploration`
//!    (default 0.02) → [`Outcome::Exploration`], so that a second site learns a shared
//!    prompt; never a prompt that continues a conversation
//!    ([`PrefixKeys::continues_conversation`](crate::keying::PrefixKeys::continues_conversation)),
//!    whose match beyond a shared head is its own history.
//! 2. `deepest` is the largest depth. It sticks when it covers at least
//!    [`STICKY_MATCH_BYTES`] (32 blocks, 8 KiB) or at least `threshold` (default 0.8) of
//!    the bytes the prompt's keys cover; never when `deepest <` [`MIN_STICKY_DEPTH`] (4),
//!    so identical short prompts spread by load. Otherwise → [`Outcome::NoMatch`]: the
//!    least loaded candidates stay (as [`least_loaded`](crate::select::least_loaded)
//!    ranks them), among those the ones holding the most of the prompt (a match of at
//!    least [`MIN_STICKY_DEPTH`] keys too short to stick still saves prefill where load
//!    ties), and among those the ones whose index holds the fewest live entries, the most
//!    room. Between its turns a conversation weighs on no cluster's load, so by load
//!    alone a new one lands as often on an engine whose cache is full of others (which it
//!    then evicts) as on one with room; SGLang's and vLLM's cache-aware routers send such
//!    a request to the worker with the smallest tree for the same reason. On engines with
//!    slots (every candidate's known, llama.cpp's `--parallel N`) a request starts at once
//!    wherever a slot is free, so when one is, load does not rank them, and neither does
//!    a match too short to stick: that is a head other conversations share (a system
//!    prompt), and its holders' idle slots hold those conversations, one of which
//!    llama.cpp hands the newcomer (it takes the idle slot with the longest common
//!    prefix). The cluster with a free slot whose index holds the fewest live entries
//!    ([`PrefixIndex::live_entries`](crate::index::PrefixIndex::live_entries)) goes
//!    first, then the least loaded, then the one with the fewest prompt bytes still
//!    waiting for their first token
//!    ([`ClusterLoad::prefill_waiting_bytes`](crate::grid::ClusterLoad::prefill_waiting_bytes)):
//!    llama.cpp prefills a prompt in one pass, and a request that arrives during it waits
//!    for the pass to end, free slot or not. So before room, a free slot whose waiting
//!    prompts would hold the request back more than [`FREE_SLOT_WAIT_FACTOR`] times
//!    its own prefill beyond the free slot that starts it soonest (both at the cluster's
//!    prefill speed) goes behind the others. Behind an index other replicas share
//!    ([`Affinity::set_index_shared`]) every replica reads the same entries and would send
//!    its new conversations to the same cluster until their answers confirm them, so
//!    there the room is the bytes of new prompt this replica sent each cluster lately in
//!    requests that matched nothing (halved every [`PLACED_HALF_LIFE`]), which differ from
//!    one replica to the next. On such a grid the one cluster a request that matches
//!    nothing is narrowed to, by either order, is recorded as sent the prompt's bytes
//!    beyond its depth there.
//!
//!    A cluster where a slot [just went
//!    idle](crate::grid::ClusterLoad::slot_just_freed) (an answer ended there in the
//!    last [`SLOT_RECLAIM_WINDOW`](crate::grid::SLOT_RECLAIM_WINDOW), a slot free) may be
//!    about to get that conversation's next turn, and a newcomer that takes the slot
//!    first pushes the live conversation's prompt out: llama.cpp gives a request the idle
//!    slot sharing the longest prefix with it (a system prompt, or a chat template's
//!    default one), else the least recently used, and which one that is the gateway
//!    cannot tell. Unless the engines are learned to keep shared heads (step 3's verdict:
//!    a host cache gives such a prompt back), and while another candidate has a free slot
//!    that did not just go idle, a request too short to key ([`Outcome::NotApplicable`])
//!    leaves such a cluster out of its candidates, and a first turn behind a short head
//!    leaves such holders out: it stays with another holder that has a free slot that
//!    did not just go idle, else it is placed among the other candidates as a prompt
//!    matching nothing, counted [`Outcome::LoadOverride`] (step 3). A conversation's
//!    later turn the load gate would move off its cluster (steps 3 and 5) while a slot
//!    is free there neither weighs nor goes to a cluster whose one free slot just went
//!    idle (on such engines): with no other lighter place it stays. A new conversation
//!    or a prompt too short to key that still may go to such a cluster, by any outcome,
//!    waits there until [`SLOT_RECLAIM_HOLD`](crate::grid::SLOT_RECLAIM_HOLD) after the
//!    answer's end, longer when another answer ends there meanwhile ([`Decision::holds`],
//!    [`SlotHold`](crate::route::SlotHold)): the live conversation's next turn, if it
//!    comes at once, reaches its slot first.
//! 3. The load gate prices the match by the prefill it saves: covered bytes / 4 bytes a
//!    token / `prefill_tokens_per_second` seconds, worth that many seconds /
//!    `queued_request_seconds` requests of load. If the least load among the deepest
//!    holders exceeds the least among the other candidates by more →
//!    [`Outcome::LoadOverride`]. At the contract's figures (10,000 tokens a second, 2 s:
//!    the priors, and what numbers in the config fix) 40 blocks ≈ 2,560 tokens ≈ 0.26 s ≈
//!    0.13 of a queued request; 400 blocks ≈ 1.3. By default both prices are learned per
//!    cluster from its answers ([`Affinity::learn`], [`ClusterPrices`]); a match is priced
//!    at the slowest prefill and the dearest queued request of its deepest holders, and at
//!    a learned queued-request price its saved prefill counts [`MOVED_PREFILL_PAYERS`]
//!    times. An unmeasured holder gives way to a measured other; two unmeasured keep the
//!    match.
//!
//!    A request whose prompt holds no earlier answer
//!    ([`PrefixKeys::opens_conversation`](crate::keying::PrefixKeys::opens_conversation)),
//!    or that names a session no candidate has answered, opens a conversation: whatever
//!    it matches is a head other conversations share (a system prompt), not its own
//!    history. When that match is shorter than [`STICKY_MATCH_BYTES`] (it sticks by
//!    covering `threshold` of a short prompt) and its least loaded holder is busier than
//!    the least loaded other candidate, it is [`Outcome::LoadOverride`] even where the
//!    gate would let it stick. It would save that head's prefill once and then share the
//!    holder with the conversations already there for as long as it lasts; on an engine
//!    with a few slots (llama.cpp's `--parallel 2`) one of them loses its prompt at every
//!    turn. A longer head is the gate's to weigh: its prefill is worth saving wherever it
//!    lives. Except where a busier holder has a free slot (its engines' slots known) and
//!    its engines keep shared heads ([`Affinity::keeps_shared_heads`]: a host prompt
//!    cache, learned from answers): the request stays [`Outcome::Sticky`] with the least
//!    loaded of those holders alone, counted in flight there at once as a placement on a
//!    free slot is (step 2), and finds the head there. A live conversation whose idle slot it
//!    takes loses nothing if it does not share the head (llama.cpp saves its prompt to the
//!    cache first and restores it at its next turn) and its history past the head if it
//!    does (docs/architecture.md, step 3). A first turn stuck to a holder no busier than
//!    the others asks whether the head was kept ([`Decision::asks_shared_head`]); engine
//!    feedback counts the answer ([`Affinity::count_shared_head`],
//!    [`SHARED_HEAD_MEMORY`], [`OWN_SHARED_HEAD_ANSWERS`]).
//! 4. Else → [`Outcome::Sticky`]: only the deepest holders stay; the balancer picks
//!    among them by queue.
//! 5. **Sessions.** A request that did not stick at step 2 or 3 but names a session
//!    ([`Prompt::session`](crate::route::Prompt::session): `prompt_cache_key`, Anthropic
//!    `metadata.user_id`, a session header) that a candidate last answered goes back there
//!    → [`Outcome::Session`], through the same load gate, priced at the prompt that
//!    cluster is believed to hold for it: the session's last confirmed prompt, capped by
//!    the request's own and by the index's depth for its keys there. Failing the gate is
//!    [`Outcome::LoadOverride`]. A session without prompt keys (token ids, an unknown part
//!    type) takes this step alone. Off with
//!    [`session_affinity`](AffinitySettings::session_affinity) `false`.
//!
//! A drained or unhealthy cluster is never a candidate, so it is never sticky.
//!
//! # The layer
//!
//! [`AffinityLayer`] reads the request's [`Prompt`] (model and keys) and writes the
//! [`Candidates`] extension for the balancer inside (and the [`Outcome`] itself, for the
//! gateway's request log, when it counted one, and for a sticky or session request the
//! [`PredictedMatch`] that [`FeedbackLayer`](crate::feedback::FeedbackLayer) weighs
//! against the engine's report), counting
//! `grid_route_prefix_affinity_total{outcome}` and emitting a `debug` event with the
//! outcome, candidate count and depth (never keys or text). Decisions the design leaves
//! open, made here:
//!
//! - A request without a [`Prompt`] was not keyed (another path, not JSON, compressed,
//!   too large): its candidates are the admitted clusters serving its
//!   [`RequestModel`](crate::route::RequestModel) (every admitted cluster when the model
//!   is not known), and it counts nothing — it is not a prompt decision. A [`Prompt`]
//!   without keys counts `not_applicable`.
//! - A [`Pinned`] request's candidates are its cluster alone, whatever its model; it
//!   counts nothing. The balancer still checks that the cluster admits.
//! - `enabled: false` reads no keys: candidates are the admitted clusters for the model,
//!   nothing is counted, and [`ConfirmLayer`](crate::confirm::ConfirmLayer) confirms
//!   nothing.
//! - Candidates keep the grid's config order; the order carries no preference.
//! - Settings reload at runtime through [`Affinity::set_settings`], shared by every
//!   clone of the [`Affinity`] handle; the index's own settings through
//!   [`PrefixIndex::reconfigure`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//!
//! use grid_route_layer::affinity::{Affinity, AffinitySettings, Outcome};
//! use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//! use grid_route_layer::index::{IndexSettings, PrefixIndex};
//! use grid_route_layer::keying::{Api, KeySeed, key_body};
//!
//! let site = |name: &str| {
//!     SiteSpec::new(name).with_clusters([ClusterSpec::new(format!("{name}-a"))
//!         .with_models(["m"])
//!         .with_endpoints([format!("http://{name}")])])
//! };
//! let spec = GridSpec::new([site("east"), site("west")]);
//! let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//! let view = grid.view();
//! let index = Arc::new(PrefixIndex::new(IndexSettings::default(), view.cluster_ids()));
//! let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
//!
//! // A 20 KiB system prompt that east has already answered.
//! let body = format!(
//!     r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"hi"}}]}}"#,
//!     "Follow the house style. ".repeat(900)
//! );
//! let prompt = key_body(&KeySeed::random(), Api::ChatCompletions, body.as_bytes()).unwrap();
//! let keys = prompt.keys().unwrap();
//! let now = Instant::now();
//! let east = &view.clusters()[0];
//! index.confirm(east.id(), keys.as_slice(), now);
//!
//! // Both sites unmeasured: the match holds and only east stays.
//! let no_exploration = 0.5;
//! let decision = affinity.decide(view.candidates(prompt.model()), Some(keys), None, now, no_exploration);
//! assert_eq!(decision.outcome(), Some(Outcome::Sticky));
//! assert_eq!(decision.clusters().len(), 1);
//! assert_eq!(decision.clusters()[0].id(), east.id());
//!
//! // East's queue is 10 deeper than west's: 20 KiB saves ~0.5 s, worth 0.25 of a queued
//! // request, so load wins.
//! east.load().record_queue("http://east", Some(10.0), now);
//! view.clusters()[1].load().record_queue("http://west", Some(0.0), now);
//! let decision = affinity.decide(view.candidates(prompt.model()), Some(keys), None, now, no_exploration);
//! assert_eq!(decision.outcome(), Some(Outcome::LoadOverride));
//! assert_eq!(decision.clusters().len(), 2);
//! ```
//!
//! In a gateway the same decision runs in [`AffinityLayer`], between keying and the
//! balancer:
//!
//! ```
//! # use std::sync::Arc;
//! # use grid_route_layer::affinity::{Affinity, AffinityLayer, AffinitySettings};
//! # use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//! # use grid_route_layer::index::{IndexSettings, PrefixIndex};
//! use grid_route_layer::route::Candidates;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! # let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
//! #     .with_models(["m"]).with_endpoints(["http://east"])])]);
//! # let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//! # let index = Arc::new(PrefixIndex::new(IndexSettings::default(), grid.view().cluster_ids()));
//! let affinity = Affinity::new(index, AffinitySettings::default());
//! let service = ServiceBuilder::new()
//!     .layer(AffinityLayer::new(grid, affinity))
//!     .service(service_fn(|req: Request<String>| async move {
//!         let candidates = req.extensions().get::<Candidates>().unwrap().len();
//!         Ok::<_, std::convert::Infallible>(Response::new(candidates))
//!     }));
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let response = service.oneshot(Request::new(String::new())).await.unwrap();
//! assert_eq!(*response.body(), 1);
//! # });
//! ```
//!
//! [`PrefixIndex`]: crate::index::PrefixIndex
//! [`PrefixIndex::reconfigure`]: crate::index::PrefixIndex::reconfigure
//! [`Prompt`]: crate::route::Prompt
//! [`Pinned`]: crate::route::Pinned
//! [`Candidates`]: crate::route::Candidates
//! [`PredictedMatch`]: crate::route::PredictedMatch

mod decide;
mod draw;
mod heads;
mod layer;
mod prices;
mod room;
mod service;
mod settings;

pub use decide::{Affinity, Decision, Narrowing, Outcome, narrow};
#[cfg(test)]
pub(crate) use draw::random_draw;
pub use heads::{HeadVerdict, OWN_SHARED_HEAD_ANSWERS, SHARED_HEAD_MEMORY};
pub use layer::AffinityLayer;
pub use prices::{
    AnswerTiming, ClusterPrices, FIT_COLLINEAR, FIT_DECAY, FIT_RIDGE, GatePrices, Learned,
    LearnedPrices, MAX_PREFILL_TOKENS_PER_SECOND, MAX_QUEUED_REQUEST_SECONDS,
    MIN_PREFILL_TOKENS_PER_SECOND, MIN_QUEUED_REQUEST_SECONDS, MIN_SAMPLE_TOKENS,
    PREFILL_SMOOTHING, PrefillEstimate, PricePriors,
};
pub use room::PLACED_HALF_LIFE;
pub use service::{AffinityService, predicted_match};
pub use settings::{
    AffinitySettings, BYTES_PER_TOKEN, FREE_SLOT_WAIT_FACTOR, MIN_STICKY_DEPTH,
    MOVED_PREFILL_PAYERS, STICKY_MATCH_BYTES,
};

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests;
