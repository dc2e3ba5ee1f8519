//! The demo's HTTP client: JSON requests to the gateway, and streamed chat requests timed
//! to their first token.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use grid_route_mock_engine::sse::{SseError, SseStream};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// The header the mock engines name themselves in.
const ENGINE_HEADER: &str = "x-mock-engine";

/// The longest a request may take, streamed body included, before it counts as failed:
/// the demo must end even if something hangs.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Prompt tokens of one answer, as the engine reported them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PromptUsage {
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
}

/// A whole (unstreamed) answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    /// The engine that answered, when one did.
    pub(crate) engine: Option<String>,
    pub(crate) json: Option<Value>,
}

impl Answer {
    pub(crate) fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// `usage` of a Responses answer: `input_tokens` and their cached share.
    pub(crate) fn responses_usage(&self) -> Option<PromptUsage> {
        let usage = self.json.as_ref()?.get("usage")?;
        Some(PromptUsage {
            prompt_tokens: usage.get("input_tokens")?.as_u64()?,
            cached_tokens: usage
                .pointer("/input_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }

    /// The answer's `id`.
    pub(crate) fn id(&self) -> Option<String> {
        Some(self.json.as_ref()?.get("id")?.as_str()?.to_owned())
    }

    /// Why the answer is not a success, for the failure list.
    pub(crate) fn failure(&self) -> String {
        let message = self
            .json
            .as_ref()
            .and_then(|json| json.pointer("/error/message"))
            .and_then(Value::as_str)
            .unwrap_or("");
        format!("{} {message}", self.status)
    }
}

/// A streamed chat answer.
#[derive(Debug)]
pub(crate) struct ChatAnswer {
    pub(crate) status: StatusCode,
    pub(crate) engine: Option<String>,
    /// From sending the request to the first content token.
    pub(crate) time_to_first_token: Option<Duration>,
    /// The reply's text, put back into the conversation.
    pub(crate) reply: String,
    /// The usage of the stream's last chunk (`stream_options.include_usage`).
    pub(crate) usage: Option<PromptUsage>,
    /// An error event inside the stream, or a non-2xx answer's body.
    pub(crate) error: Option<String>,
    /// Whether the stream ended with `data: [DONE]`.
    pub(crate) done: bool,
}

impl ChatAnswer {
    /// A complete answer: 2xx, ended, no error event, usage reported.
    pub(crate) fn ok(&self) -> bool {
        self.status.is_success() && self.done && self.error.is_none() && self.usage.is_some()
    }

    pub(crate) fn failure(&self) -> String {
        match &self.error {
            Some(error) => format!("{} {error}", self.status),
            None if !self.done => format!("{} stream ended early", self.status),
            None => format!("{} no usage in the stream", self.status),
        }
    }
}

/// Why a request got no answer at all.
pub(crate) type RequestError = String;

/// A client for one gateway.
#[derive(Clone)]
pub(crate) struct DemoClient {
    http: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl DemoClient {
    /// A client sending to `base` (`http://IP:PORT`).
    pub(crate) fn new(base: String) -> Self {
        Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
            base,
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<http::Response<hyper::body::Incoming>, RequestError> {
        let url = format!("{}{path}", self.base);
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|error| format!("cannot build a request to {url}: {error}"))?;
        self.http
            .request(request)
            .await
            .map_err(|error| format!("{path}: {error}"))
    }

    /// GETs `path` and returns its body as text.
    pub(crate) async fn get_text(&self, path: &str) -> Result<String, RequestError> {
        let response = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = self.send(Method::GET, path, Bytes::new()).await?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|error| format!("{path}: {error}"))?
                .to_bytes();
            if status.is_success() {
                Ok(String::from_utf8_lossy(&body).into_owned())
            } else {
                Err(format!("{path}: {status}"))
            }
        })
        .await;
        response.unwrap_or_else(|_| Err(format!("{path}: timed out")))
    }

    /// POSTs a JSON body and reads the whole answer.
    pub(crate) async fn post_json(&self, path: &str, body: &Value) -> Result<Answer, RequestError> {
        let body = Bytes::from(body.to_string());
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = self.send(Method::POST, path, body).await?;
            let status = response.status();
            let engine = engine_name(response.headers());
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|error| format!("{path}: {error}"))?
                .to_bytes();
            Ok(Answer {
                status,
                engine,
                json: serde_json::from_slice(&body).ok(),
            })
        })
        .await;
        answer.unwrap_or_else(|_| Err(format!("{path}: timed out")))
    }

    /// POSTs a streaming chat request (`body` must ask for `stream` with
    /// `stream_options.include_usage`) and reads its events as they arrive.
    pub(crate) async fn stream_chat(&self, body: &Value) -> Result<ChatAnswer, RequestError> {
        let path = "/v1/chat/completions";
        let body = Bytes::from(body.to_string());
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let sent = Instant::now();
            let response = self.send(Method::POST, path, body).await?;
            let status = response.status();
            let mut answer = ChatAnswer {
                status,
                engine: engine_name(response.headers()),
                time_to_first_token: None,
                reply: String::new(),
                usage: None,
                error: None,
                done: false,
            };
            let body = response.into_body();
            if status.is_success() {
                read_stream(body, sent, &mut answer)
                    .await
                    .map_err(|error| format!("{path}: {error}"))?;
            } else {
                let body = body
                    .collect()
                    .await
                    .map_err(|error| format!("{path}: {error}"))?
                    .to_bytes();
                let json: Option<Value> = serde_json::from_slice(&body).ok();
                let message = json
                    .as_ref()
                    .and_then(|json| json.pointer("/error/message"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                answer.error = Some(message.to_owned());
            }
            Ok(answer)
        })
        .await;
        answer.unwrap_or_else(|_| Err(format!("{path}: timed out")))
    }
}

fn engine_name(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(ENGINE_HEADER)
        .and_then(|name| name.to_str().ok())
        .map(str::to_owned)
}

/// Reads an OpenAI chat event stream into `answer` as its events arrive (chunk boundaries
/// fall anywhere; the shared reader finds the events).
async fn read_stream<B>(body: B, sent: Instant, answer: &mut ChatAnswer) -> Result<(), SseError>
where
    B: http_body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut events = std::pin::pin!(SseStream::new(body));
    while let Some(event) = events.next().await {
        if let Some(data) = event?.data {
            read_data(&data, sent, answer);
        }
    }
    Ok(())
}

/// Reads the data of one event of an OpenAI chat stream into `answer`.
fn read_data(data: &str, sent: Instant, answer: &mut ChatAnswer) {
    let data = data.trim();
    if data == "[DONE]" {
        answer.done = true;
        return;
    }
    let Ok(chunk) = serde_json::from_str::<Value>(data) else {
        answer.error = Some(format!("unreadable event {data:?}"));
        return;
    };
    if let Some(error) = chunk.get("error") {
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        answer.error = Some(message.to_owned());
        return;
    }
    if let Some(content) = chunk
        .pointer("/choices/0/delta/content")
        .and_then(Value::as_str)
        .filter(|content| !content.is_empty())
    {
        answer
            .time_to_first_token
            .get_or_insert_with(|| sent.elapsed());
        answer.reply.push_str(content);
    }
    if let Some(usage) = chunk.get("usage").filter(|usage| !usage.is_null()) {
        answer.usage = Some(PromptUsage {
            prompt_tokens: usage
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            cached_tokens: usage
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> ChatAnswer {
        ChatAnswer {
            status: StatusCode::OK,
            engine: None,
            time_to_first_token: None,
            reply: String::new(),
            usage: None,
            error: None,
            done: false,
        }
    }

    #[test]
    fn a_stream_gives_its_reply_usage_and_first_token_time() {
        let mut answer = empty();
        let sent = Instant::now();
        let events = [
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}"#,
            r#"{"choices":[{"delta":{"content":"[a]"}}],"usage":null}"#,
            r#"{"choices":[{"delta":{"content":" hi"}}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}"#,
            "[DONE]",
        ];
        for data in events {
            read_data(data, sent, &mut answer);
        }
        assert!(answer.ok());
        assert_eq!(answer.reply, "[a] hi");
        assert!(answer.time_to_first_token.is_some());
        let usage = answer.usage.unwrap_or_default();
        assert_eq!((usage.prompt_tokens, usage.cached_tokens), (100, 64));
    }

    #[test]
    fn an_error_event_fails_the_answer() {
        let mut answer = empty();
        let event = r#"{"error":{"message":"engine is stopping"}}"#;
        read_data(event, Instant::now(), &mut answer);
        read_data("[DONE]", Instant::now(), &mut answer);
        assert!(!answer.ok());
        assert!(answer.failure().contains("engine is stopping"));
    }

    #[tokio::test]
    async fn a_crlf_stream_reads_like_an_lf_one() {
        let lf = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"[a]\"}}]}\n\n",
            ": a comment\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\n\n",
            "data: [DONE]\n\n",
        );
        for body in [lf.to_owned(), lf.replace('\n', "\r\n")] {
            let mut answer = empty();
            read_stream(Full::new(Bytes::from(body)), Instant::now(), &mut answer)
                .await
                .unwrap();
            assert!(answer.ok(), "{}", answer.failure());
            assert_eq!(answer.reply, "[a] hi");
            assert_eq!(answer.usage.unwrap_or_default().prompt_tokens, 9);
        }
    }
}
