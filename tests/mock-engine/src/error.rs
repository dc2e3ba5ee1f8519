//! Error answers in the formats clients of each API expect.
//!
//! OpenAI endpoints answer `{"error":{"message","type","param","code"}}`; the Anthropic
//! Messages endpoint answers `{"type":"error","error":{"type","message"}}`, as Anthropic and
//! vLLM's Anthropic front end do. Every error carries a JSON body: a gateway in front of the
//! engine should be able to tell an engine's answer from a broken connection.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An HTTP error answer with an OpenAI-style body.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<&'static str>,
    pub(crate) code: Option<&'static str>,
    /// Seconds for a `Retry-After` header, for injected 429/503 answers.
    pub(crate) retry_after_secs: Option<u64>,
    pub(crate) anthropic: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_secs: None,
            anthropic: false,
        }
    }

    /// A 400 for a request the engine cannot read.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 404 for an id or path the engine does not know.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// An answer with any status, typed by its class (used by the failure knob).
    pub(crate) fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        let (kind, code) = match status.as_u16() {
            429 => ("rate_limit_error", "rate_limit_exceeded"),
            503 => ("server_error", "service_unavailable"),
            500..=599 => ("server_error", "server_error"),
            404 => ("invalid_request_error", "not_found"),
            _ => ("invalid_request_error", "invalid_request"),
        };
        Self::new(status, kind, message).code(code)
    }

    pub(crate) fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub(crate) fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub(crate) fn retry_after(mut self, secs: Option<u64>) -> Self {
        self.retry_after_secs = secs;
        self
    }

    /// Answer in the Anthropic error format instead.
    pub(crate) fn anthropic(mut self) -> Self {
        self.anthropic = true;
        self
    }

    pub(crate) fn body(&self) -> Value {
        if self.anthropic {
            let kind = match self.status.as_u16() {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                400..=499 => "invalid_request_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": self.message}})
        } else {
            json!({"error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }})
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
