use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use serde_json::{Value, json};
use tower::{Layer, Service};

use super::*;
use crate::grid::{ClusterId, SiteName};
use crate::metrics::{CACHED_PROMPT_TOKENS_TOTAL, PROMPT_TOKENS_TOTAL};
use crate::route::Served;
use crate::test_support::{TestRecorder, poll_once};

#[allow(clippy::unnecessary_wraps)] // Compared with what the readers return.
fn usage(prompt_tokens: u64, cached_tokens: u64) -> Option<PromptUsage> {
    Some(PromptUsage::new(prompt_tokens, cached_tokens))
}

/// `bytes` read in chunks of `size`.
fn read(event_stream: bool, bytes: &[u8], size: usize) -> Option<PromptUsage> {
    let mut reader = UsageReader::new(event_stream);
    for chunk in bytes.chunks(size) {
        reader.feed(chunk);
    }
    reader.finish()
}

/// A server-sent event stream of `events` (JSON payloads, or `[DONE]` as a string).
fn event_stream(events: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for event in events {
        match event {
            Value::String(done) => {
                let _ = write!(out, "data: {done}\n\n");
            }
            event => {
                if let Some(kind) = event["type"].as_str() {
                    let _ = writeln!(out, "event: {kind}");
                }
                let _ = write!(out, "data: {event}\n\n");
            }
        }
    }
    out.into_bytes()
}

#[test]
fn each_apis_usage_fields_give_the_prompt_and_its_cached_part() {
    let chat = json!({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 96}}});
    let responses = json!({"output": [], "usage": {"input_tokens": 80, "output_tokens": 3,
        "input_tokens_details": {"cached_tokens": 64}}});
    let anthropic = json!({"content": [], "usage": {"input_tokens": 16,
        "cache_read_input_tokens": 64, "cache_creation_input_tokens": 8, "output_tokens": 3}});
    // No cached count (vLLM and SGLang at their defaults): unknown, not 0.
    let no_details = json!({"usage": {"prompt_tokens": 7, "completion_tokens": 1}});
    let no_details_responses = json!({"usage": {"input_tokens": 7, "output_tokens": 1}});
    let null_details = json!({"usage": {"prompt_tokens": 7, "prompt_tokens_details": null}});
    assert_eq!(PromptUsage::of(&chat), usage(120, 96));
    assert_eq!(PromptUsage::of(&responses), usage(80, 64));
    assert_eq!(PromptUsage::of(&anthropic), usage(88, 64));
    for unsaid in [no_details, no_details_responses, null_details] {
        assert_eq!(
            PromptUsage::of(&unsaid),
            Some(PromptUsage::without_cached(7))
        );
    }
    // An output-only usage (Anthropic's message_delta) or none at all says nothing.
    assert_eq!(
        PromptUsage::of(&json!({"usage": {"output_tokens": 3}})),
        None
    );
    assert_eq!(PromptUsage::of(&json!({"data": []})), None);
    // A cached count above the prompt is capped at it.
    let odd = json!({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}});
    assert_eq!(PromptUsage::of(&odd), usage(5, 5));
}

#[test]
fn a_json_answer_is_read_whole_in_any_chunking() {
    let answer = json!({"id": "x", "choices": [{"message": {"content": "a\nb"}}],
        "usage": {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}}})
    .to_string();
    for size in [1, 2, 7, answer.len()] {
        assert_eq!(
            read(false, answer.as_bytes(), size),
            usage(50, 32),
            "{size}"
        );
    }
    assert_eq!(read(false, b"{\"usage\": {\"prompt", 4), None);
}

#[test]
fn an_engines_absurd_token_counts_are_capped() {
    let answer = json!({"usage": {"prompt_tokens": u64::MAX,
        "prompt_tokens_details": {"cached_tokens": u64::MAX}}})
    .to_string();
    assert_eq!(
        read(false, answer.as_bytes(), 64),
        usage(MAX_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
    );
    let anthropic = json!({"message": {"usage": {"input_tokens": u64::MAX,
        "cache_read_input_tokens": u64::MAX, "cache_creation_input_tokens": 1}}})
    .to_string();
    assert_eq!(
        read(false, anthropic.as_bytes(), 64),
        usage(MAX_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
    );
}

#[test]
fn a_json_answer_over_the_limit_is_not_read() {
    let answer =
        json!({"padding": "x".repeat(MAX_JSON_BYTES), "usage": {"prompt_tokens": 5}}).to_string();
    assert_eq!(read(false, answer.as_bytes(), 4096), None);
}

#[test]
fn a_streams_last_usage_counts_in_any_chunking() {
    let chat = event_stream(&[
        json!({"choices": [{"delta": {"content": "hi"}}], "usage": null}),
        json!({"choices": [], "usage": {"prompt_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 30}}}),
        json!("[DONE]"),
    ]);
    let responses = event_stream(&[
        json!({"type": "response.created", "response": {"usage": null}}),
        json!({"type": "response.output_text.delta", "delta": "\"usage\""}),
        json!({"type": "response.completed", "response": {"usage": {"input_tokens": 70,
            "input_tokens_details": {"cached_tokens": 60}}}}),
    ]);
    let anthropic = event_stream(&[
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 4,
            "cache_read_input_tokens": 20}}}),
        json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}),
        json!({"type": "message_delta", "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ]);
    for (stream, expected) in [
        (&chat, usage(40, 30)),
        (&responses, usage(70, 60)),
        (&anthropic, usage(24, 20)),
    ] {
        for size in [1, 3, 16, stream.len()] {
            assert_eq!(read(true, stream, size), expected, "{size}");
        }
    }
}

#[test]
fn a_stream_without_usage_or_with_an_endless_line_counts_nothing() {
    let plain = event_stream(&[
        json!({"choices": [{"delta": {"content": "hi"}}]}),
        json!("[DONE]"),
    ]);
    assert_eq!(read(true, &plain, 5), None);
    let mut long = b"data: {\"usage\": {\"prompt_tokens\": 3}, \"pad\": \"".to_vec();
    long.extend(std::iter::repeat_n(b'x', MAX_EVENT_LINE_BYTES));
    long.extend_from_slice(b"\"}\n\n");
    assert_eq!(read(true, &long, 65536), None);
    // The line after the skipped one is read again.
    long.extend_from_slice(b"data: {\"usage\": {\"prompt_tokens\": 3}}\n\n");
    assert_eq!(
        read(true, &long, 65536),
        Some(PromptUsage::without_cached(3))
    );
}

/// A body that yields its chunks one frame at a time.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// A `POST /v1/chat/completions` without a body: a request whose answer counts.
fn chat_request() -> Request<()> {
    Request::post("/v1/chat/completions").body(()).unwrap()
}

/// Sends a chat request through `FeedbackLayer` to a service answering `status` with
/// `body` in chunks of 5 bytes, from east-a when `served`; reads the body to its end and
/// returns what it carried and whether it was read.
fn through_the_layer(
    status: StatusCode,
    body: &[u8],
    event_stream: bool,
    served: bool,
) -> (Vec<u8>, bool) {
    through_the_layer_as(chat_request(), status, body, event_stream, served)
}

/// [`through_the_layer`] with `request`.
fn through_the_layer_as(
    request: Request<()>,
    status: StatusCode,
    body: &[u8],
    event_stream: bool,
    served: bool,
) -> (Vec<u8>, bool) {
    let chunks: VecDeque<Bytes> = body.chunks(5).map(Bytes::copy_from_slice).collect();
    let mut service = FeedbackLayer::new().layer(tower::service_fn(move |_: Request<()>| {
        let mut response = Response::new(Chunks(chunks.clone()));
        *response.status_mut() = status;
        if event_stream {
            response
                .headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
        }
        if served {
            let site = SiteName::new("east").unwrap();
            response
                .extensions_mut()
                .insert(Served::new(ClusterId::new(site, "east-a")));
        }
        std::future::ready(Ok::<_, Infallible>(response))
    }));
    let mut future = service.call(request);
    let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
        panic!("answered at once");
    };
    let mut body = response.into_body();
    let is_read = body.is_read();
    let mut out = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
        out.extend_from_slice(frame.unwrap().data_ref().unwrap());
    }
    drop(body);
    (out, is_read)
}

#[test]
fn the_layer_forwards_every_byte_and_counts_the_usage_per_cluster() {
    let stream = event_stream(&[
        json!({"choices": [{"delta": {"content": "hi"}}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 30}}}),
        json!("[DONE]"),
    ]);
    let answer =
        json!({"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 8}}})
            .to_string();
    let recorder = TestRecorder::default();
    metrics::with_local_recorder(&recorder, || {
        assert_eq!(
            through_the_layer(StatusCode::OK, &stream, true, true),
            (stream.clone(), true)
        );
        assert_eq!(
            through_the_layer(StatusCode::OK, answer.as_bytes(), false, true),
            (answer.clone().into_bytes(), true)
        );
        // Not from a cluster, or not a success: passed through, unread.
        assert_eq!(
            through_the_layer(StatusCode::OK, answer.as_bytes(), false, false),
            (answer.clone().into_bytes(), false)
        );
        assert_eq!(
            through_the_layer(
                StatusCode::TOO_MANY_REQUESTS,
                answer.as_bytes(),
                false,
                true
            ),
            (answer.clone().into_bytes(), false)
        );
    });
    let labels = "cluster=east-a,site=east";
    assert_eq!(recorder.counter(PROMPT_TOKENS_TOTAL, labels), 50);
    assert_eq!(recorder.counter(CACHED_PROMPT_TOKENS_TOTAL, labels), 38);
    assert_eq!(recorder.total(PROMPT_TOKENS_TOTAL), 50);
}

#[test]
fn a_stored_response_read_back_or_cancelled_is_not_counted_again() {
    let answer = json!({"id": "resp_1", "object": "response", "usage": {"input_tokens": 70,
        "input_tokens_details": {"cached_tokens": 60}, "output_tokens": 5}})
    .to_string();
    let stored = [
        Request::get("/v1/responses/resp_1").body(()).unwrap(),
        Request::get("/v1/responses/resp_1?stream=true")
            .body(())
            .unwrap(),
        Request::post("/v1/responses/resp_1/cancel")
            .body(())
            .unwrap(),
        Request::get("/v1/chat/completions/chatcmpl_1")
            .body(())
            .unwrap(),
    ];
    let recorder = TestRecorder::default();
    metrics::with_local_recorder(&recorder, || {
        for request in stored {
            assert_eq!(
                through_the_layer_as(request, StatusCode::OK, answer.as_bytes(), false, true),
                (answer.clone().into_bytes(), false)
            );
        }
        // The answer that made it counts.
        let made = Request::post("/v1/responses").body(()).unwrap();
        assert_eq!(
            through_the_layer_as(made, StatusCode::OK, answer.as_bytes(), false, true),
            (answer.clone().into_bytes(), true)
        );
    });
    assert_eq!(recorder.total(PROMPT_TOKENS_TOTAL), 70);
    assert_eq!(recorder.total(CACHED_PROMPT_TOKENS_TOTAL), 60);
}

/// The prefill speed east-a learns from one JSON answer (4,000 tokens, none cached) that
/// the service below the layer gives only after `failed_attempt`, stamped `sent` at the
/// answering attempt or not at all. The queued-request price is fixed, so the answer's
/// whole start counts as prefill.
fn prefill_learned_after(failed_attempt: std::time::Duration, stamped: bool) -> f64 {
    use crate::affinity::Affinity;
    use crate::config::{PrefixAffinityConfig, Price};
    use crate::index::{IndexSettings, PrefixIndex};

    let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    let index = std::sync::Arc::new(PrefixIndex::new(IndexSettings::default(), [east.clone()]));
    let settings = PrefixAffinityConfig::default()
        .with_queued_request_seconds(Price::Fixed(2.0))
        .validate()
        .unwrap()
        .affinity;
    let affinity = Affinity::new(index, settings);
    let prior = affinity.prices(&east).prefill_tokens_per_second;
    assert!((prior - 10_000.0).abs() < 1e-6, "the prior: {prior}");
    let answer = json!({"usage": {"prompt_tokens": 4000,
        "prompt_tokens_details": {"cached_tokens": 0}}})
    .to_string();
    let served = east.clone();
    let mut service =
        FeedbackLayer::new()
            .with_affinity(affinity.clone())
            .layer(tower::service_fn(move |_: Request<()>| {
                // An attempt that failed (a connect timeout, say), then the one that answers
                // at once.
                std::thread::sleep(failed_attempt);
                let mut sent = Served::new(served.clone()).with_load(0.0);
                if stamped {
                    sent = sent.sent_at(std::time::Instant::now());
                }
                let mut response =
                    Response::new(Chunks(VecDeque::from([Bytes::from(answer.clone())])));
                response.extensions_mut().insert(sent);
                std::future::ready(Ok::<_, Infallible>(response))
            }));
    let mut future = service.call(chat_request());
    let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
        panic!("answered at once");
    };
    let mut body = response.into_body();
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(_)) = Pin::new(&mut body).poll_frame(&mut cx) {}
    drop(body);
    affinity.prices(&east).prefill_tokens_per_second
}

#[test]
fn a_price_is_learned_from_the_attempt_that_answered_not_the_failed_ones_before_it() {
    let wasted = std::time::Duration::from_millis(300);
    // Timed from the answering attempt: 4,000 tokens in about no time, faster than the
    // 10,000 tok/s prior, so one sample pulls the estimate above it. Over 12,000 holds
    // while the head comes within 0.2 s of the stamp, however slow the machine.
    let answering = prefill_learned_after(wasted, true);
    assert!(answering > 12_000.0, "{answering}");
    // An answer that does not say when it was sent is timed from the layer: the 300 ms
    // count, 4,000 tokens in 0.3 s or more is at most 13,333 tok/s.
    let from_the_layer = prefill_learned_after(wasted, false);
    assert!(from_the_layer < 11_000.0, "{from_the_layer}");
}

// ---- engine feedback into the index ---------------------------------------------------

/// Keys of a prompt of `blocks` 256-byte blocks.
fn keys_of(blocks: u64) -> crate::keying::PrefixKeys {
    crate::keying::PrefixKeys::from_block_digests(&(0..blocks).collect::<Vec<_>>()).unwrap()
}

#[test]
fn an_engine_delivering_at_least_half_the_prediction_did_not_fall_short() {
    let keys = keys_of(40);
    // 40 blocks, 10 KiB: 2560 predicted tokens.
    let predicted = crate::route::PredictedMatch::new(40, keys.covered_bytes(40));
    assert_eq!(predicted_tokens(predicted.covered_bytes()), 2560);
    for delivered in [1280, 2000, 2560, 9000] {
        assert!(!fell_short(predicted, delivered), "{delivered}");
    }
    for delivered in [0, 63, 256, 1279] {
        assert!(fell_short(predicted, delivered), "{delivered}");
    }
}

#[test]
fn a_prediction_of_nothing_never_falls_short() {
    let nothing = crate::route::PredictedMatch::new(0, 0);
    assert!(!fell_short(nothing, 0));
}

/// Only answers the index predicted to hit count towards taking a counting cluster's
/// engines for stopped: a cluster whose prompts share nothing answers without a count (a
/// vLLM count of 0 left out) as long as it likes.
#[test]
fn answers_without_a_count_and_without_a_prediction_never_make_a_counting_cluster_unknown() {
    use super::SILENT_PREDICTED_ANSWERS;
    use super::body::CachedCounts;
    let counts = CachedCounts::default();
    let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    let silent = PromptUsage::without_cached(4000);
    assert_eq!(
        counts.cached_tokens(&east, silent, false),
        None,
        "never counted"
    );
    assert_eq!(
        counts.cached_tokens(&east, PromptUsage::new(4000, 12), false),
        Some(12)
    );
    for _ in 0..10 * SILENT_PREDICTED_ANSWERS {
        assert_eq!(counts.cached_tokens(&east, silent, false), Some(0));
    }
    for _ in 1..SILENT_PREDICTED_ANSWERS {
        assert_eq!(counts.cached_tokens(&east, silent, true), Some(0));
    }
    // A count between them starts the run again.
    assert_eq!(
        counts.cached_tokens(&east, PromptUsage::new(4000, 0), true),
        Some(0)
    );
    for _ in 1..SILENT_PREDICTED_ANSWERS {
        assert_eq!(counts.cached_tokens(&east, silent, true), Some(0));
    }
    assert_eq!(counts.cached_tokens(&east, silent, true), None, "stopped");
    assert_eq!(counts.cached_tokens(&east, silent, false), None);
}

mod teaching {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::affinity::{Affinity, AffinityLayer};
    use crate::config::PrefixAffinityConfig;
    use crate::confirm::ConfirmLayer;
    use crate::grid::{Grid, GridSettings};
    use crate::index::{IndexSettings, PrefixIndex};
    use crate::keying::KeySeed;
    use crate::metrics::{
        DELIVERED_CACHED_TOKENS_TOTAL, INDEX_FORGOTTEN_TOTAL, PREDICTED_CACHED_TOKENS_TOTAL,
    };
    use crate::route::{Candidates, Prompt};
    use crate::test_support::{chat, grid_spec, prompt_of, text};

    struct Fixture {
        grid: Grid,
        index: Arc<PrefixIndex>,
        affinity: Affinity,
        prompt: Prompt,
        /// Another conversation's prompt.
        other: Prompt,
        seed: KeySeed,
    }

    fn fixture(engine_feedback: bool) -> Fixture {
        let grid = Grid::new(
            &grid_spec(&[("east", &["east-a"]), ("west", &["west-a"])]),
            GridSettings::default(),
        )
        .unwrap();
        // The index's clock starts 100 s ago, so that entries can be confirmed at whole
        // seconds before the request (deadlines are kept to the second).
        let base = Instant::now()
            .checked_sub(Duration::from_secs(100))
            .unwrap();
        let index = Arc::new(PrefixIndex::starting_at(
            IndexSettings::default(),
            grid.view().cluster_ids(),
            base,
        ));
        let settings = PrefixAffinityConfig::default()
            .with_exploration(0.0)
            .with_engine_feedback(engine_feedback);
        let affinity = Affinity::new(Arc::clone(&index), settings.validate().unwrap().affinity);
        let seed = KeySeed::random();
        let body = chat(&[("system", &text("feedback", 12 * 1024)), ("user", "hi")]);
        let prompt = prompt_of(&seed, &body);
        let other = chat(&[("system", &text("another", 12 * 1024)), ("user", "hi")]);
        let other = prompt_of(&seed, &other);
        Fixture {
            grid,
            index,
            affinity,
            prompt,
            other,
            seed,
        }
    }

    /// The cluster `name` of the site its name starts with.
    fn id(name: &str) -> ClusterId {
        ClusterId::new(
            SiteName::new(name.split('-').next().unwrap()).unwrap(),
            name,
        )
    }

    impl Fixture {
        fn depth(&self, name: &str) -> usize {
            self.depth_of(&self.prompt, name)
        }

        fn depth_of(&self, prompt: &Prompt, name: &str) -> usize {
            let keys = prompt.keys().unwrap().as_slice();
            self.index.depth(&id(name), keys, Instant::now())
        }

        /// Confirms `prompt` at `name`, `ago` seconds before now.
        fn confirm_ago(&self, prompt: &Prompt, name: &str, ago: u64) {
            let at = Instant::now()
                .checked_sub(Duration::from_secs(ago))
                .unwrap();
            let keys = prompt.keys().unwrap().as_slice();
            self.index.confirm(&id(name), keys, at);
        }

        /// A third conversation's prompt.
        fn third(&self) -> Prompt {
            let body = chat(&[("system", &text("a third", 12 * 1024)), ("user", "hi")]);
            prompt_of(&self.seed, &body)
        }

        /// Sends the prompt through Confirm → Affinity → Feedback (teaching) to the first
        /// candidate, whose engine reports `cached_tokens` of it cached. Returns the depth
        /// at east-a once the head passed, and once the body was read and dropped.
        fn send(&self, cached_tokens: u64) -> (usize, usize) {
            self.send_through(
                &FeedbackLayer::new().with_affinity(self.affinity.clone()),
                cached_tokens,
            )
        }

        /// [`send`](Self::send) through `feedback`.
        fn send_through(&self, feedback: &FeedbackLayer, cached_tokens: u64) -> (usize, usize) {
            let usage = json!({"prompt_tokens": 4000,
                "prompt_tokens_details": {"cached_tokens": cached_tokens}});
            self.send_usage(feedback, &usage)
        }

        /// [`send_through`](Self::send_through) with the answer's `usage` as given.
        fn send_usage(&self, feedback: &FeedbackLayer, usage: &Value) -> (usize, usize) {
            let answer = json!({ "usage": usage }).to_string();
            let engine = tower::service_fn(move |req: Request<()>| {
                let cluster = req.extensions().get::<Candidates>().unwrap().as_slice()[0].clone();
                let mut response =
                    Response::new(Chunks(VecDeque::from([Bytes::from(answer.clone())])));
                response.extensions_mut().insert(Served::new(cluster));
                std::future::ready(Ok::<_, Infallible>(response))
            });
            let mut stack = ConfirmLayer::new(self.affinity.clone()).layer(
                AffinityLayer::new(self.grid.clone(), self.affinity.clone())
                    .layer(feedback.layer(engine)),
            );
            let mut request = chat_request();
            request.extensions_mut().insert(self.prompt.clone());
            let mut future = stack.call(request);
            let Poll::Ready(Ok(response)) = poll_once(&mut future) else {
                panic!("answered at once");
            };
            assert_eq!(
                response.extensions().get::<Served>().unwrap().cluster(),
                &id("east-a")
            );
            let at_head = self.depth("east-a");
            let mut body = response.into_body();
            let mut cx = Context::from_waker(Waker::noop());
            while let Poll::Ready(Some(_)) = Pin::new(&mut body).poll_frame(&mut cx) {}
            drop(body);
            (at_head, self.depth("east-a"))
        }
    }

    /// vLLM and SGLang at their defaults count no cached tokens. Such an answer is not
    /// taken for an eviction while the cluster's engines have never counted; once they
    /// have (vLLM with `--enable-prompt-tokens-details`, which leaves a count of 0 out),
    /// a missing count is 0 and the index forgets as for a reported 0.
    #[test]
    fn a_missing_cached_count_is_an_eviction_only_where_the_engines_count() {
        let f = fixture(true);
        f.confirm_ago(&f.other, "east-a", 60);
        f.confirm_ago(&f.prompt, "east-a", 40);
        let other = f.other.keys().unwrap().len();
        let feedback = FeedbackLayer::new().with_affinity(f.affinity.clone());
        let unsaid = json!({"prompt_tokens": 4000, "completion_tokens": 5});
        let recorder = TestRecorder::default();
        let labels = "cluster=east-a,site=east";
        metrics::with_local_recorder(&recorder, || {
            for _ in 0..3 {
                f.send_usage(&feedback, &unsaid);
            }
        });
        assert_eq!(f.depth_of(&f.other, "east-a"), other, "nothing forgotten");
        assert_eq!(recorder.counter(PROMPT_TOKENS_TOTAL, labels), 12_000);
        assert_eq!(recorder.counter(CACHED_PROMPT_TOKENS_TOTAL, labels), 0);
        assert_eq!(
            recorder.counter(DELIVERED_CACHED_TOKENS_TOTAL, labels),
            0,
            "nothing delivered counted"
        );
        // The engines count (the whole prompt cached), then leave a count of 0 out.
        f.send_through(&feedback, 4000);
        assert_eq!(f.depth_of(&f.other, "east-a"), other);
        f.send_usage(&feedback, &unsaid);
        assert_eq!(f.depth_of(&f.other, "east-a"), 0, "forgotten as for a 0");
        // Another layer (another gateway) has not seen east-a count: it forgets nothing.
        f.confirm_ago(&f.other, "east-a", 60);
        f.send_usage(
            &FeedbackLayer::new().with_affinity(f.affinity.clone()),
            &json!({"prompt_tokens": 4000}),
        );
        assert_eq!(f.depth_of(&f.other, "east-a"), other);
    }

    /// An engine that stopped counting (restarted without the flag, say): its silent
    /// answers read as 0 until `SILENT_PREDICTED_ANSWERS` predicted ones in a row, then
    /// teach nothing until an answer counts again.
    #[test]
    fn engines_that_stop_counting_stop_teaching_until_they_count_again() {
        use crate::feedback::SILENT_PREDICTED_ANSWERS;
        let f = fixture(true);
        let feedback = FeedbackLayer::new().with_affinity(f.affinity.clone());
        let unsaid = json!({"prompt_tokens": 4000, "completion_tokens": 5});
        let other = f.other.keys().unwrap().len();
        f.confirm_ago(&f.prompt, "east-a", 40);
        f.send_through(&feedback, 4000);
        // Up to the limit each silent answer reads as 0: the engine evicted what came
        // before the prompt.
        for _ in 1..SILENT_PREDICTED_ANSWERS {
            f.confirm_ago(&f.other, "east-a", 60);
            f.send_usage(&feedback, &unsaid);
            assert_eq!(f.depth_of(&f.other, "east-a"), 0, "forgotten as for a 0");
        }
        // At the limit the count is unknown again: nothing is forgotten, then or after.
        for _ in 0..3 {
            f.confirm_ago(&f.other, "east-a", 60);
            f.send_usage(&feedback, &unsaid);
            assert_eq!(f.depth_of(&f.other, "east-a"), other, "nothing forgotten");
        }
        // The engines count again: a silent answer is a 0 once more.
        f.send_through(&feedback, 4000);
        f.confirm_ago(&f.other, "east-a", 60);
        f.send_usage(&feedback, &unsaid);
        assert_eq!(f.depth_of(&f.other, "east-a"), 0);
    }

    #[test]
    fn the_old_name_of_the_builder_teaches_the_index_too() {
        let f = fixture(true);
        f.confirm_ago(&f.other, "east-a", 60);
        f.confirm_ago(&f.prompt, "east-a", 40);
        #[allow(deprecated)]
        let feedback = FeedbackLayer::new().teach(f.affinity.clone());
        f.send_through(&feedback, 0);
        assert_eq!(
            f.depth_of(&f.other, "east-a"),
            0,
            "forgotten, as with_affinity does"
        );
    }

    #[test]
    fn an_engine_that_evicted_a_sticky_prompt_makes_its_cluster_forget_what_came_before_it() {
        let f = fixture(true);
        let third = f.third();
        // east-a was sent another conversation 60 s ago, this one 40 s ago and a third
        // 20 s ago; west-a holds the other conversation too.
        f.confirm_ago(&f.other, "east-a", 60);
        f.confirm_ago(&f.other, "west-a", 60);
        f.confirm_ago(&f.prompt, "east-a", 40);
        f.confirm_ago(&third, "east-a", 20);
        let full = f.prompt.keys().unwrap().len();
        let recorder = TestRecorder::default();
        // east-a's engine reports none of this prompt cached: it evicted it, and with it
        // what it held from before.
        let (at_head, after) = metrics::with_local_recorder(&recorder, || f.send(0));
        assert_eq!(
            (at_head, after),
            (full, full),
            "the engine has just prefilled the prompt: it stays"
        );
        assert_eq!(
            f.depth_of(&f.other, "east-a"),
            0,
            "older than the evicted prompt"
        );
        assert_eq!(
            f.depth_of(&third, "east-a"),
            third.keys().unwrap().len(),
            "confirmed after it"
        );
        assert_eq!(
            f.depth_of(&f.other, "west-a"),
            f.other.keys().unwrap().len(),
            "another cluster's entries stay"
        );
        let labels = "cluster=east-a,site=east";
        assert_eq!(
            recorder.counter(INDEX_FORGOTTEN_TOTAL, labels),
            f.other.keys().unwrap().len() as u64
        );
        let predicted = predicted_tokens(f.prompt.keys().unwrap().total_covered_bytes());
        assert_eq!(
            recorder.counter(PREDICTED_CACHED_TOKENS_TOTAL, labels),
            predicted
        );
        assert_eq!(recorder.counter(DELIVERED_CACHED_TOKENS_TOTAL, labels), 0);
    }

    #[test]
    fn an_engine_delivering_what_was_predicted_changes_nothing() {
        let f = fixture(true);
        let keys = f.prompt.keys().unwrap().as_slice();
        f.confirm_ago(&f.other, "east-a", 60);
        f.confirm_ago(&f.prompt, "east-a", 40);
        let recorder = TestRecorder::default();
        let predicted = predicted_tokens(f.prompt.keys().unwrap().total_covered_bytes());
        let (_, after) = metrics::with_local_recorder(&recorder, || f.send(predicted));
        assert_eq!(after, keys.len());
        assert_eq!(
            f.depth_of(&f.other, "east-a"),
            f.other.keys().unwrap().len()
        );
        let labels = "cluster=east-a,site=east";
        assert_eq!(recorder.counter(INDEX_FORGOTTEN_TOTAL, labels), 0);
        assert_eq!(
            recorder.counter(DELIVERED_CACHED_TOKENS_TOTAL, labels),
            predicted
        );
    }

    #[test]
    fn with_engine_feedback_off_the_index_is_not_taught_but_still_counted() {
        let f = fixture(false);
        let keys = f.prompt.keys().unwrap().as_slice();
        f.confirm_ago(&f.other, "east-a", 60);
        f.confirm_ago(&f.prompt, "east-a", 40);
        let recorder = TestRecorder::default();
        let (_, after) = metrics::with_local_recorder(&recorder, || f.send(0));
        assert_eq!(after, keys.len());
        assert_eq!(
            f.depth_of(&f.other, "east-a"),
            f.other.keys().unwrap().len()
        );
        let labels = "cluster=east-a,site=east";
        assert!(recorder.counter(PREDICTED_CACHED_TOKENS_TOTAL, labels) > 0);
    }

    #[test]
    fn a_request_affinity_did_not_make_sticky_predicts_nothing() {
        // Nothing confirmed anywhere: no match, so no prediction to weigh or count.
        let f = fixture(true);
        let recorder = TestRecorder::default();
        let (at_head, after) = metrics::with_local_recorder(&recorder, || f.send(0));
        // The confirmation at the head stands: the engine was never expected to hold it.
        assert_eq!(
            (at_head, after),
            (
                f.prompt.keys().unwrap().len(),
                f.prompt.keys().unwrap().len()
            )
        );
        assert_eq!(recorder.total(PREDICTED_CACHED_TOKENS_TOTAL), 0);
        assert_eq!(recorder.total(DELIVERED_CACHED_TOKENS_TOTAL), 0);
    }
}

#[test]
fn the_service_lends_and_returns_the_service_it_wraps() {
    #[derive(Debug, PartialEq)]
    struct Inner(&'static str);
    let mut service = FeedbackLayer::new().layer(Inner("engines"));
    assert_eq!(service.get_ref(), &Inner("engines"));
    service.get_mut().0 = "other engines";
    assert_eq!(service.into_inner(), Inner("other engines"));
}
