//! Error answers in the formats clients of each API expect.
//!
//! OpenAI endpoints answer `{"error":{"message","type","param","code"}}`, the shape of the
//! library's own [`ErrorAnswer`], which builds it here too; the Anthropic Messages endpoint
//! answers `{"type":"error","error":{"type","message"}}`, as Anthropic and vLLM's Anthropic
//! front end do (the library has no Anthropic shape: its layers answer OpenAI-style). Every
//! error carries a JSON body: a gateway in front of the engine should be able to tell an
//! engine's answer from a broken connection.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use grid_route_layer::answer::ErrorAnswer;
use serde_json::json;

/// An HTTP error answer: OpenAI-style unless turned [`anthropic`](Self::anthropic).
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// Boxed: every handler returns `Result<_, ApiError>`, and the answer is five fields.
    answer: Box<ErrorAnswer>,
    /// Seconds for a `Retry-After` header, kept for the Anthropic shape as well.
    retry_after_secs: Option<u64>,
    anthropic: bool,
}

impl ApiError {
    fn new(answer: ErrorAnswer) -> Self {
        Self {
            answer: Box::new(answer),
            retry_after_secs: None,
            anthropic: false,
        }
    }

    /// A 400 for a request the engine cannot read.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorAnswer::new(StatusCode::BAD_REQUEST, message))
    }

    /// A 404 for an id or path the engine does not know.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorAnswer::new(StatusCode::NOT_FOUND, message))
    }

    /// An answer with any status, typed by its class (used by the failure knob).
    pub(crate) fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        let answer = ErrorAnswer::new(status, message);
        let answer = match status.as_u16() {
            429 => answer.kind("rate_limit_error").code("rate_limit_exceeded"),
            503 => answer.code("service_unavailable"),
            500..=599 => answer.code("server_error"),
            404 => answer.code("not_found"),
            _ => answer.code("invalid_request"),
        };
        Self::new(answer)
    }

    fn map(mut self, change: impl FnOnce(ErrorAnswer) -> ErrorAnswer) -> Self {
        self.answer = Box::new(change(*self.answer));
        self
    }

    pub(crate) fn param(self, param: &'static str) -> Self {
        self.map(|answer| answer.param(param))
    }

    pub(crate) fn code(self, code: &'static str) -> Self {
        self.map(|answer| answer.code(code))
    }

    pub(crate) fn retry_after(mut self, secs: Option<u64>) -> Self {
        self.retry_after_secs = secs;
        match secs {
            Some(secs) => self.map(|answer| answer.retry_after(secs)),
            None => self,
        }
    }

    /// Answer in the Anthropic error format instead.
    pub(crate) fn anthropic(mut self) -> Self {
        self.anthropic = true;
        self
    }

    /// The human-readable message.
    pub(crate) fn message(&self) -> &str {
        self.answer.message()
    }

    /// The JSON body, as text.
    pub(crate) fn body(&self) -> String {
        if self.anthropic {
            let kind = match self.answer.status().as_u16() {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                400..=499 => "invalid_request_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": self.message()}}).to_string()
        } else {
            String::from_utf8_lossy(&self.answer.body()).into_owned()
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if !self.anthropic {
            return (*self.answer).into_http_response::<Body>();
        }
        let mut response = (
            self.answer.status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn json_of(error: ApiError) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
        let response = error.into_response();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (
            parts.status,
            parts.headers,
            serde_json::from_slice(&bytes).unwrap(),
        )
    }

    #[tokio::test]
    async fn an_openai_error_is_the_library_error_answer() {
        let error = ApiError::not_found("no such model")
            .param("model")
            .code("model_not_found");
        let expected = ErrorAnswer::new(StatusCode::NOT_FOUND, "no such model")
            .param("model")
            .code("model_not_found")
            .body();
        let (status, headers, body) = json_of(error).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(
            body,
            serde_json::from_slice::<serde_json::Value>(&expected).unwrap()
        );
    }

    #[tokio::test]
    async fn an_injected_rate_limit_is_typed_and_says_when_to_retry_in_both_shapes() {
        let error =
            ApiError::with_status(StatusCode::TOO_MANY_REQUESTS, "slow down").retry_after(Some(2));
        let (status, headers, body) = json_of(error.clone()).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        let (status, headers, body) = json_of(error.anthropic()).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
    }
}
