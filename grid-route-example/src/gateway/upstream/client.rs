//! The pooled HTTP client that reaches every engine, and sending a buffered request again
//! when the engine closed the pooled connection before answering.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use grid_route_layer::route::BufferedBody;
use http::{Request, Response, Uri};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use pin_project_lite::pin_project;
use tokio::net::TcpStream;

/// How long connecting to an engine may take by default (`timeouts.upstream_connect_ms`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an idle pooled connection to an engine is kept for reuse.
///
/// Below the 5 s after which the engines' HTTP servers close an idle keep-alive connection
/// (uvicorn's `timeout_keep_alive`, which vLLM's and SGLang's servers run with, and
/// cpp-httplib's keep-alive timeout in llama.cpp's `llama-server`). A connection the server
/// is closing at the moment the gateway reuses it fails the request after its bytes were
/// written, so the gateway must not hold connections that long (this used to be 90 s).
/// `llama-server` also closes a connection right after each streamed answer, whatever
/// its headers say; the engine client sends a buffered request again in that case.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// The pooled HTTP client that reaches every engine. Send through [`send`], which marks
/// each connection that has answered.
pub(crate) type HttpClient = Client<EngineConnector, Body>;

/// Builds the gateway's engine client, connecting within `connect_timeout`.
pub(crate) fn http_client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(EngineConnector(connector))
}

/// Set on a connection once an answer's head came back on it. The pool reuses a
/// connection only after an answer on it ended, so a request that fails unanswered on a
/// marked connection went out on a reused one, and one on an unmarked connection went out
/// on the connection opened for it.
#[derive(Debug, Clone, Default)]
struct Answered(Arc<AtomicBool>);

/// hyper-util's TCP connector, with every connection it opens carrying an [`Answered`]
/// mark (through [`Connected::extra`], which hyper-util copies into each answer's
/// extensions and into the connect info of each error). Hand-written: hyper-util has no
/// way to tell a reused connection from a fresh one after a request on it failed.
#[derive(Debug, Clone)]
pub(crate) struct EngineConnector(HttpConnector);

impl tower::Service<Uri> for EngineConnector {
    type Response = MarkedIo;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<MarkedIo, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            Ok(MarkedIo {
                io: connecting.await?,
                answered: Answered::default(),
            })
        })
    }
}

pin_project! {
    /// A connection to an engine and its [`Answered`] mark; reads and writes pass through.
    pub(crate) struct MarkedIo {
        #[pin]
        io: TokioIo<TcpStream>,
        answered: Answered,
    }
}

impl Connection for MarkedIo {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.answered.clone())
    }
}

impl Read for MarkedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl Write for MarkedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }
}

/// Sends `request` through `client` and marks the connection that answered it
/// ([`Answered`]). Every request to an engine goes through here.
pub(crate) async fn send(
    client: &HttpClient,
    request: Request<Body>,
) -> Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
    let response = client.request(request).await?;
    if let Some(Answered(answered)) = response.extensions().get::<Answered>() {
        answered.store(true, Ordering::Relaxed);
    }
    Ok(response)
}

/// How many times a request is sent in all when the engine keeps closing the pooled
/// connection it went out on before answering (see [`send_through_closing_connections`]).
const CLOSED_CONNECTION_ATTEMPTS: usize = 3;

/// Sends `request`, and sends it again on another connection when the engine closed the
/// reused connection it went out on before answering, if the body is held whole
/// ([`BufferedBody`]: every keyed request) — at most [`CLOSED_CONNECTION_ATTEMPTS`] times
/// in all. A connection opened for the request and closed unanswered is not resent: the
/// engine may have read the request and died on it, and the contract retries only where no
/// byte reached an engine.
///
/// Why: llama.cpp's `llama-server` closes the connection after every streamed answer
/// while its headers promise keep-alive (`Keep-Alive: timeout=5, max=100`, no
/// `Connection: close`). A request the pool puts on that connection before it has seen the
/// close is written into a socket the engine will never read: the engine closes (or
/// resets) it without an answer. hyper-util resends a request only when the connection was
/// seen closed before writing, so this catches the rest. The engine read none of it, so
/// sending it again is safe; a streamed body cannot be sent again and gets the 502.
pub(super) async fn send_through_closing_connections(
    client: &HttpClient,
    request: Request<Body>,
    url: &str,
) -> Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
    let (parts, body) = request.into_parts();
    let again = (parts.extensions.get::<BufferedBody>())
        .map(|buffered| (parts.clone(), buffered.bytes().clone()));
    let mut result = send(client, Request::from_parts(parts, body)).await;
    let Some((parts, bytes)) = again else {
        return result;
    };
    for attempt in 2..=CLOSED_CONNECTION_ATTEMPTS {
        match &result {
            Err(error) if closed_before_answering(error) => {
                tracing::info!(
                    endpoint = url,
                    attempt,
                    %error,
                    "engine closed the connection before answering; sending the request again"
                );
            }
            _ => return result,
        }
        let request = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        result = send(client, request).await;
    }
    result
}

/// Whether `error` says a reused connection closed (or was reset) after the request went
/// out and before any of the answer came back: the engine closing a kept-alive
/// connection, not failing to connect, and not closing the connection opened for this
/// request (which it may have read the request from first: see [`Answered`]).
fn closed_before_answering(error: &hyper_util::client::legacy::Error) -> bool {
    if error.is_connect() || !went_out_on_reused_connection(error) {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>()
            && (hyper.is_incomplete_message() || hyper.is_canceled())
        {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Whether the connection `error` happened on had answered before ([`Answered`]).
fn went_out_on_reused_connection(error: &hyper_util::client::legacy::Error) -> bool {
    let Some(connected) = error.connect_info() else {
        return false;
    };
    let mut extras = http::Extensions::new();
    connected.get_extras(&mut extras);
    extras
        .get::<Answered>()
        .is_some_and(|Answered(answered)| answered.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine whose server closes a keep-alive connection idle for `keep_alive` when its
    /// next request arrives, without answering it: the moment a real server's idle close
    /// crosses the client's reuse. Answers every other request with a small 200.
    async fn closing_engine(keep_alive: Duration) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut answered: Option<std::time::Instant> = None;
                    let mut buffer = [0_u8; 4096];
                    // Each test request is one small GET: a read holds it whole.
                    while socket.read(&mut buffer).await.is_ok_and(|n| n > 0) {
                        if answered.is_some_and(|at| at.elapsed() >= keep_alive) {
                            return;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        answered = Some(std::time::Instant::now());
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn an_idle_connection_is_not_reused_once_an_engine_may_be_closing_it() {
        let engine = closing_engine(Duration::from_secs(5)).await;
        let client = http_client(CONNECT_TIMEOUT);
        let get = || {
            let request = http::Request::get(format!("{engine}/health"))
                .body(Body::empty())
                .unwrap();
            client.request(request)
        };
        assert_eq!(get().await.unwrap().status(), http::StatusCode::OK);
        // Idle past the engine's keep-alive: reusing the pooled connection would be
        // refused mid-request; a fresh one is answered.
        tokio::time::sleep(Duration::from_millis(5_200)).await;
        let answer = get().await;
        assert!(
            answer
                .as_ref()
                .is_ok_and(|a| a.status() == http::StatusCode::OK),
            "{:?}",
            answer.err()
        );
    }
}
