//! Accepting connections: HTTP/1.1 and HTTP/2 (h2c with prior knowledge) on one port,
//! with a deadline for the request head and a graceful shutdown that a half-open
//! connection cannot hold up.
//!
//! `axum::serve` has no knob for header timeouts or HTTP/2 settings, so each listener
//! runs hyper-util's `auto` connection builder (it reads the first bytes to tell HTTP/1.1
//! from the HTTP/2 preface) under its `GracefulShutdown`, the shape of axum's
//! `serve-with-hyper` example.
//!
//! - **Request heads**: a connection whose first request head has not arrived within
//!   `client_header` is closed (this also covers a client that sends fewer bytes than
//!   it takes to tell the protocol, which hyper's own header timeout cannot see); later
//!   heads on a kept-alive HTTP/1.1 connection are bounded by hyper's
//!   `header_read_timeout` with the same value. Hyper starts that clock when it starts
//!   waiting for the next head, so it is also the idle timeout of kept-alive HTTP/1.1
//!   connections; an answer in progress, however long, is not affected.
//! - **Shutdown**: when `stopped` turns true the listener stops accepting; connections
//!   that have not sent a whole first request close at once, idle kept-alive ones close,
//!   and those with a request in flight finish it (streams included) and then close.
//!   Connections are tasks of a `JoinSet` owned by the serving task, so aborting it
//!   (the drain deadline of [`Gateway::shutdown_within`](super::Gateway::shutdown_within))
//!   aborts every connection too.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tower::Service;

/// Serves `router` on `listener` until `stopped` turns true, then drains; `header_timeout`
/// is read for each new connection, so a reload changes it for the next ones.
pub(crate) async fn serve_until(
    listener: TcpListener,
    router: Router,
    header_timeout: impl Fn() -> Duration + Send + 'static,
    mut stopped: watch::Receiver<bool>,
) -> io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let each_connection = stopped.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (socket, _peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Per-connection errors (a reset before accept, too many open
                        // files for a moment) must not stop the listener.
                        tracing::debug!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if let Err(error) = socket.set_nodelay(true) {
                    tracing::debug!(%error, "cannot set TCP_NODELAY");
                }
                connections.spawn(serve_connection(
                    socket,
                    router.clone(),
                    header_timeout(),
                    graceful.watcher(),
                    each_connection.clone(),
                ));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            // A dropped sender (the handle is gone) stops the server too.
            () = until_stopped(&mut stopped) => break,
        }
    }
    drop(listener);
    // Every connection hears the shutdown; wait for all of them to close.
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection(
    socket: tokio::net::TcpStream,
    router: Router,
    header_timeout: Duration,
    watcher: hyper_util::server::graceful::Watcher,
    mut stopped: watch::Receiver<bool>,
) {
    let first_request = Arc::new(Notify::new());
    let service = {
        let first_request = Arc::clone(&first_request);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            first_request.notify_one();
            router.clone().call(request)
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder.http2().timer(TokioTimer::new());
    let connection = builder
        .serve_connection(TokioIo::new(socket), service)
        .into_owned();
    let connection = watcher.watch(connection);
    tokio::pin!(connection);
    let head_deadline = tokio::time::sleep(header_timeout);
    tokio::pin!(head_deadline);
    tokio::select! {
        result = connection.as_mut() => return log_end(result),
        () = first_request.notified() => {}
        () = &mut head_deadline => {
            tracing::debug!(?header_timeout, "no request head in time; connection closed");
            return;
        }
        () = until_stopped(&mut stopped) => {
            tracing::debug!("shutting down before the first request; connection closed");
            return;
        }
    }
    log_end(connection.await);
}

/// Resolves when `stopped` turns true or its sender is dropped.
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: drop it here, not across an await.
    let _ = stopped.wait_for(|stopped| *stopped).await.map(drop);
}

fn log_end(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}
