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
use crate::test_support::{CountingRecorder, poll_once};

#[allow(clippy::unnecessary_wraps)] // Compared with what the readers return.
fn usage(prompt_tokens: u64, cached_tokens: u64) -> Option<PromptUsage> {
    Some(PromptUsage {
        prompt_tokens,
        cached_tokens,
    })
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
    let no_details = json!({"usage": {"prompt_tokens": 7, "completion_tokens": 1}});
    assert_eq!(PromptUsage::of(&chat), usage(120, 96));
    assert_eq!(PromptUsage::of(&responses), usage(80, 64));
    assert_eq!(PromptUsage::of(&anthropic), usage(88, 64));
    assert_eq!(PromptUsage::of(&no_details), usage(7, 0));
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
    assert_eq!(read(true, &long, 65536), usage(3, 0));
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

/// Sends a request through `FeedbackLayer` to a service answering `status` with `body`
/// in chunks of 5 bytes, from east-a when `served`; reads the body to its end and
/// returns what it carried and whether it was read.
fn through_the_layer(
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
    let mut future = service.call(Request::new(()));
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
    let recorder = CountingRecorder::default();
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
