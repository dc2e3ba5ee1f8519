//! Pieces of engines written on a raw socket, for what the mock engine cannot do on
//! purpose: close a connection at a chosen byte, or send an answer in pieces with pauses
//! between them.

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// A whole HTTP/1.1 response: `status`, the header lines `headers` (each ending `\r\n`),
/// a `content-length` and `body`.
pub fn whole_answer(status: u16, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} X\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// An empty vLLM queue as an engine's `/metrics` answers it: a whole HTTP/1.1 response,
/// which asks the client to close the connection after it when `close`.
pub fn empty_vllm_metrics(close: bool) -> String {
    let connection = if close { "connection: close\r\n" } else { "" };
    whole_answer(200, connection, "vllm:num_requests_waiting 0\n")
}

/// Reads one request's head from `socket`: `read` holds the bytes that came before and,
/// after, what came with the head. Returns where the head ends in `read`; `None` when the
/// connection ends first.
pub async fn read_head(socket: &mut TcpStream, read: &mut Vec<u8>) -> Option<usize> {
    let mut buffer = [0_u8; 4096];
    loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        match socket.read(&mut buffer).await {
            Ok(n @ 1..) => read.extend_from_slice(&buffer[..n]),
            _ => return None,
        }
    }
}

/// Reads one whole request from `socket`: its head, then as many body bytes as its
/// `content-length` says. `read` holds the bytes that came before and keeps those that
/// came after. Returns its head in lowercase; `None` when the connection ends first.
pub async fn read_request(socket: &mut TcpStream, read: &mut Vec<u8>) -> Option<String> {
    let head_end = read_head(socket, read).await?;
    let head = String::from_utf8_lossy(&read[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().unwrap());
    let mut buffer = [0_u8; 4096];
    while read.len() < head_end + length {
        match socket.read(&mut buffer).await {
            Ok(n @ 1..) => read.extend_from_slice(&buffer[..n]),
            _ => return None,
        }
    }
    read.drain(..head_end + length);
    Some(head)
}
