//! Server-sent events: a response body fed by a generating task.
//!
//! Headers leave at once (as vLLM's streaming responses do); each event is written as soon as
//! its token is decoded. When the client goes away the body is dropped, the task's next write
//! fails and the task ends, releasing its queue place or running slot.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

/// Events buffered between the generating task and the connection.
const BUFFERED_EVENTS: usize = 32;

/// A response body that yields the chunks a task sends.
struct ChannelBody {
    chunks: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// The client went away mid-stream.
#[derive(Debug)]
pub(crate) struct Gone;

/// Writes events into a streaming response.
pub(crate) struct SseSender {
    chunks: mpsc::Sender<Bytes>,
}

impl SseSender {
    async fn send(&self, chunk: String) -> Result<(), Gone> {
        self.chunks.send(Bytes::from(chunk)).await.map_err(|_| Gone)
    }

    /// A `data:` line holding `value` (the OpenAI framing).
    pub(crate) async fn data(&self, value: &Value) -> Result<(), Gone> {
        self.send(format!("data: {value}\n\n")).await
    }

    /// An `event:` line and a `data:` line (the Anthropic and Responses framing).
    pub(crate) async fn event(&self, name: &str, value: &Value) -> Result<(), Gone> {
        self.send(format!("event: {name}\ndata: {value}\n\n")).await
    }

    /// The OpenAI end-of-stream marker.
    pub(crate) async fn done(&self) -> Result<(), Gone> {
        self.send("data: [DONE]\n\n".to_owned()).await
    }

    /// Runs `work` unless the client goes away first (so a request that waits in the queue
    /// stops counting as waiting when its client leaves).
    pub(crate) async fn until_gone<F: Future>(&self, work: F) -> Result<F::Output, Gone> {
        tokio::select! {
            output = work => Ok(output),
            () = self.chunks.closed() => Err(Gone),
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
    let task = produce(SseSender { chunks: tx });
    tokio::spawn(async move {
        // A client that left is the normal end of an abandoned stream, not an error.
        let _ = task.await;
    });
    let mut response = Response::new(Body::new(ChannelBody { chunks: rx }));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
