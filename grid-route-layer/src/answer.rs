//! Answers the layers give themselves: OpenAI-style JSON errors.
//!
//! Clients of an LLM gateway are OpenAI (or Anthropic) SDKs; they parse
//! `{"error":{"message","type","param","code"}}` and show the message. A layer that refuses a
//! request answers in that shape, never with an empty body.
//!
//! ```
//! use bytes::Bytes;
//! use grid_route_layer::answer::ErrorAnswer;
//! use http::StatusCode;
//! use http_body_util::Full;
//!
//! let answer = ErrorAnswer::new(StatusCode::BAD_REQUEST, "the top-level field 'model' is given more than once")
//!     .code("duplicate_field")
//!     .param("model");
//! let response = answer.into_http_response::<Full<Bytes>>();
//! assert_eq!(response.status(), 400);
//! assert_eq!(response.headers()["content-type"], "application/json");
//! ```

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

/// An OpenAI-style error answer.
#[derive(Debug, Clone)]
pub struct ErrorAnswer {
    status: StatusCode,
    message: String,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<String>,
    retry_after_secs: Option<u64>,
}

impl ErrorAnswer {
    /// An answer with `status` and a human-readable `message`. The error `type` is
    /// `invalid_request_error` for 4xx statuses and `server_error` otherwise.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        Self {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
            retry_after_secs: None,
        }
    }

    /// Sets the machine-readable `code`.
    #[must_use]
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Sets the `param` the error is about.
    #[must_use]
    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the error `type` where the status class does not name it (OpenAI answers a 429
    /// with `rate_limit_error`).
    #[must_use]
    pub fn kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Adds a `Retry-After` header of `secs` seconds.
    #[must_use]
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// The status of the answer.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        });
        Bytes::from(body.to_string())
    }

    /// The answer as an HTTP response with any body built from bytes: the layers' own
    /// `Full<Bytes>`, or a framework's body (`axum::body::Body`) with no second conversion.
    /// (Not `into_response`, which would shadow axum's `IntoResponse` method of that name.)
    pub fn into_http_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(self.body()));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
