//! The client side: one plain hyper client, an answer read whole with its frames' times,
//! and requests that fail the test when they take longer than [`REQUEST_DEADLINE`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_mock_engine::sse::read_events;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// The longest any one request of the tests may take, its answer included.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// A plain HTTP/1.1 client.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A fresh client (its own connection pool).
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A whole answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, whole.
    pub body: Bytes,
    /// When each body frame arrived, from sending the request.
    pub frame_times: Vec<Duration>,
}

impl Answer {
    /// The body as JSON; fails the test, showing the body, when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }

    /// The mock engine that answered (its `x-mock-engine` header), if one did.
    pub fn engine(&self) -> Option<&str> {
        self.headers
            .get("x-mock-engine")
            .map(|name| name.to_str().unwrap())
    }

    /// The mock engine that answered; fails the test when none did.
    pub fn engine_name(&self) -> String {
        self.engine()
            .unwrap_or_else(|| panic!("no engine answered: {} {}", self.status, self.text()))
            .to_owned()
    }

    /// An OpenAI-style error's `code`.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap().to_owned()
    }

    /// The `content-type`, or empty.
    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The `data:` of each server-sent event, in order.
    pub fn event_data(&self) -> Vec<String> {
        read_events(&self.body)
            .unwrap_or_else(|e| panic!("not an event stream ({e}): {}", self.text()))
            .into_iter()
            .filter_map(|event| event.data)
            .collect()
    }
}

/// Sends a request with exactly `headers` and reads its whole answer; `None` when the
/// connection fails (nothing listens yet, or any more) or the exchange takes longer than
/// `patience`.
pub async fn try_send_with(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    patience: Duration,
) -> Option<Answer> {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(body.into())).unwrap();
    let started = Instant::now();
    let exchange = async {
        let response = client().request(request).await.ok()?;
        let (parts, mut body) = response.into_parts();
        let mut bytes = Vec::new();
        let mut frame_times = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.ok()?.into_data() {
                frame_times.push(started.elapsed());
                bytes.extend_from_slice(&data);
            }
        }
        Some(Answer {
            status: parts.status,
            headers: parts.headers,
            body: bytes.into(),
            frame_times,
        })
    };
    tokio::time::timeout(patience, exchange)
        .await
        .ok()
        .flatten()
}

/// Sends a request with exactly `headers` and reads its whole answer; fails the test,
/// naming the request, when the connection fails or that takes longer than
/// [`REQUEST_DEADLINE`].
pub async fn send_with(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let what = format!("{method} {url}");
    try_send_with(method, url, headers, body, REQUEST_DEADLINE)
        .await
        .unwrap_or_else(|| panic!("no whole answer to {what} within {REQUEST_DEADLINE:?}"))
}

/// [`try_send_with`] a JSON body (`content-type: application/json`) within
/// [`REQUEST_DEADLINE`]: for a process that may not be listening yet, or any more.
pub async fn try_send(method: Method, url: &str, body: impl Into<Bytes>) -> Option<Answer> {
    let json = [("content-type", "application/json")];
    try_send_with(method, url, &json, body, REQUEST_DEADLINE).await
}

/// [`send_with`] a JSON body (`content-type: application/json`).
pub async fn send(method: Method, url: &str, body: impl Into<Bytes>) -> Answer {
    send_with(method, url, &[("content-type", "application/json")], body).await
}

/// A port free on 127.0.0.1 a moment ago, for a process that must be told its port.
///
/// It is taken under the kernel's ephemeral range (Linux's `ip_local_port_range`,
/// 32768–60999 by default), from which every `bind` to port 0 and every outgoing
/// connection of the tests draw theirs: a port handed out from inside that range can be
/// taken by one of them before the process told to use it binds it, and that process then
/// fails to start. Each test process walks the range from its own offset and never hands
/// out a port twice, so parallel test binaries rarely meet, and a port one of them has
/// bound fails the other's check. On a machine whose ephemeral range leaves no room under
/// it, the port comes from the range as before.
pub fn free_port() -> u16 {
    /// The lowest port handed out: above the well-known and most registered services.
    const FIRST: u16 = 10_000;
    static HANDED_OUT: AtomicUsize = AtomicUsize::new(0);
    static OFFSET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let below = ephemeral_range_start().min(32_768);
    if below <= FIRST + 1_000 {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
    }
    let span = usize::from(below - FIRST);
    let offset = *OFFSET.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos() as usize);
        (std::process::id() as usize)
            .wrapping_mul(7_919)
            .wrapping_add(nanos)
    }) % span;
    (0..span)
        .map(|_| HANDED_OUT.fetch_add(1, Ordering::Relaxed))
        .map(|n| FIRST + ((offset + n) % span) as u16)
        .find(|&port| free(port))
        .expect("a free port under the ephemeral range")
}

/// The first port of Linux's ephemeral range; 32768 where it cannot be read.
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The workspace root, where the README's commands and the scripts run.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A fresh directory named after `name` (`grid-route-NAME-…`), removed when the guard
/// drops.
pub fn scratch_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("grid-route-{name}-"))
        .tempdir()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_under_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        let below = ephemeral_range_start().min(32_768);
        for port in ports {
            if below > 11_000 {
                assert!((10_000..below).contains(&port), "{port}");
            }
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
