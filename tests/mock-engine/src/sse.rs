//! Server-sent events: the mock's streaming answers, and the one event reader the demo and
//! the tests use on every stream they receive.
//!
//! # Writing
//!
//! Headers leave at once (as vLLM's streaming responses do); each event is written as soon as
//! its token is decoded. The body is axum's [`Sse`](axum::response::Sse) over the receiving
//! end of a channel a generating task writes into. When the client goes away the body is
//! dropped with the receiver, the task's next write fails and the task ends, releasing its
//! queue place or running slot.
//!
//! # Reading
//!
//! [`read_events`] reads a whole stream and [`SseStream`] reads one as it arrives, both with
//! the [`sse-stream`](https://docs.rs/sse-stream) crate's decoder. It follows the WHATWG
//! event-stream grammar: lines end in LF, CRLF or a lone CR (also when the CR and LF fall in
//! different chunks), `:` lines are comments, several `data:` lines join with LF, and a last
//! event that no blank line ends is not an event (a stream cut mid-event loses it, which is
//! what a test should see). One maintained decoder instead of the three hand-split readers
//! the suites had, which each knew only `\n\n`.
//!
//! ```
//! use grid_route_mock_engine::sse::read_events;
//!
//! let events = read_events(b"event: delta\r\ndata: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n").unwrap();
//! assert_eq!(events[0].event.as_deref(), Some("delta"));
//! assert_eq!(events[0].data.as_deref(), Some("{\"a\":1}"));
//! assert_eq!(events[1].data.as_deref(), Some("[DONE]"));
//! ```

use std::convert::Infallible;
use std::fmt::Display;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response, Sse as SseResponse};
use bytes::Bytes;
use futures_util::{FutureExt as _, TryStreamExt as _};
use http_body_util::Full;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub use sse_stream::{Error as SseError, Sse, SseStream};

/// Events buffered between the generating task and the connection.
const BUFFERED_EVENTS: usize = 32;

/// The events of a whole event-stream body, in order (comments and blocks with no field
/// left out by the decoder; a trailing event without its blank line dropped).
pub fn read_events(body: &[u8]) -> Result<Vec<Sse>, SseError> {
    let events = SseStream::new(Full::new(Bytes::copy_from_slice(body))).try_collect::<Vec<_>>();
    // A `Full` body yields its one frame without waiting and the decoder holds no timer, so
    // the collection is complete on its first poll.
    events
        .now_or_never()
        .unwrap_or_else(|| unreachable!("a full body is read in one poll"))
}

/// The client went away mid-stream.
#[derive(Debug)]
pub(crate) struct Gone;

/// Writes events into a streaming response.
pub(crate) struct SseSender {
    events: mpsc::Sender<Result<Event, Infallible>>,
}

impl SseSender {
    async fn send(&self, event: Event) -> Result<(), Gone> {
        self.events.send(Ok(event)).await.map_err(|_| Gone)
    }

    /// A `data:` line holding `value`, JSON text (the OpenAI framing).
    pub(crate) async fn data(&self, value: &impl Display) -> Result<(), Gone> {
        self.send(Event::default().data(value.to_string())).await
    }

    /// An `event:` line and a `data:` line (the Anthropic and Responses framing).
    pub(crate) async fn event(&self, name: &str, value: &impl Display) -> Result<(), Gone> {
        self.send(Event::default().event(name).data(value.to_string()))
            .await
    }

    /// The OpenAI end-of-stream marker.
    pub(crate) async fn done(&self) -> Result<(), Gone> {
        self.send(Event::default().data("[DONE]")).await
    }

    /// Runs `work` unless the client goes away first (so a request that waits in the queue
    /// stops counting as waiting when its client leaves).
    pub(crate) async fn until_gone<F: Future>(&self, work: F) -> Result<F::Output, Gone> {
        tokio::select! {
            output = work => Ok(output),
            () = self.events.closed() => Err(Gone),
        }
    }
}

/// Starts an event-stream response whose events `produce` writes from a spawned task.
pub(crate) fn sse_response<F, Fut>(produce: F) -> Response
where
    F: FnOnce(SseSender) -> Fut,
    Fut: Future<Output = Result<(), Gone>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(BUFFERED_EVENTS);
    let task = produce(SseSender { events: tx });
    tokio::spawn(async move {
        // A client that left is the normal end of an abandoned stream, not an error.
        let _ = task.await;
    });
    // `Sse` sets `content-type: text/event-stream` and `cache-control: no-cache`.
    SseResponse::new(ReceiverStream::new(rx)).into_response()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures_util::stream;

    use super::*;

    /// The events of a stream that arrives in these chunks.
    async fn events_of_chunks(chunks: &[&[u8]]) -> Vec<Sse> {
        let chunks: Vec<_> = chunks
            .iter()
            .map(|chunk| Ok::<_, Infallible>(Bytes::copy_from_slice(chunk)))
            .collect();
        SseStream::from_bytes_stream(stream::iter(chunks))
            .try_collect()
            .await
            .unwrap()
    }

    fn data(events: &[Sse]) -> Vec<&str> {
        events.iter().filter_map(|e| e.data.as_deref()).collect()
    }

    #[test]
    fn lf_crlf_and_cr_line_ends_read_alike() {
        for body in [
            &b"event: a\ndata: 1\n\ndata: 2\n\n"[..],
            b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n",
            b"event: a\rdata: 1\r\rdata: 2\r\r",
        ] {
            let events = read_events(body).unwrap();
            assert_eq!(data(&events), ["1", "2"], "{body:?}");
            assert_eq!(events[0].event.as_deref(), Some("a"));
            assert_eq!(events[1].event, None);
        }
    }

    #[tokio::test]
    async fn events_split_anywhere_across_chunks_read_whole() {
        let whole: &[u8] = b"event: a\r\ndata: {\"x\":1}\r\n\r\ndata: [DONE]\r\n\r\n";
        for cut in 1..whole.len() {
            let (head, tail) = whole.split_at(cut);
            let events = events_of_chunks(&[head, tail]).await;
            assert_eq!(data(&events), ["{\"x\":1}", "[DONE]"], "cut at {cut}");
            assert_eq!(events[0].event.as_deref(), Some("a"), "cut at {cut}");
        }
    }

    #[tokio::test]
    async fn a_crlf_split_between_chunks_ends_one_line_not_two() {
        let events = events_of_chunks(&[b"data: 1\r", b"\ndata: 2\r", b"\n\r", b"\n"]).await;
        assert_eq!(data(&events), ["1\n2"]);
    }

    #[test]
    fn comments_are_skipped() {
        let events = read_events(b": keep-alive\n\ndata: 1\n: between\n\n").unwrap();
        assert_eq!(events, [Sse::default().data("1")]);
    }

    #[test]
    fn several_data_lines_join_with_line_feeds() {
        let events = read_events(b"data: first\ndata:second\r\ndata\n\n").unwrap();
        assert_eq!(data(&events), ["first\nsecond\n"]);
    }

    #[test]
    fn a_last_event_without_its_blank_line_is_not_an_event() {
        let events = read_events(b"data: 1\n\ndata: cut off\n").unwrap();
        assert_eq!(data(&events), ["1"]);
    }

    #[tokio::test]
    async fn written_events_read_back_as_sent() {
        let response = sse_response(|events| async move {
            events.data(&serde_json::json!({"n": 1})).await?;
            events.event("delta", &serde_json::json!("x")).await?;
            events.done().await
        });
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers()["cache-control"], "no-cache");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(
            &body[..],
            b"data: {\"n\":1}\n\nevent: delta\ndata: \"x\"\n\ndata: [DONE]\n\n"
        );
        let events = read_events(&body).unwrap();
        assert_eq!(data(&events), ["{\"n\":1}", "\"x\"", "[DONE]"]);
    }
}
