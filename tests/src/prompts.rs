//! What the tests ask: filler text that differs by topic, and multi-turn conversations.

use std::fmt::Write as _;

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::engines::MODEL;
use super::http::{Answer, send};

/// `bytes` of text that differs by `topic`.
pub fn text(topic: &str, bytes: usize) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < bytes {
        let _ = write!(text, "{topic} rule {i}: answer precisely. ");
        i += 1;
    }
    text.truncate(bytes);
    text
}

/// A multi-turn Chat conversation for [`MODEL`] with a long system prompt.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The messages so far: the system prompt, then each answered turn.
    pub messages: Vec<Value>,
}

impl Conversation {
    /// A conversation whose system prompt is `system_bytes` of text about `topic`.
    pub fn new(topic: &str, system_bytes: usize) -> Self {
        Self {
            messages: vec![json!({"role": "system", "content": text(topic, system_bytes)})],
        }
    }

    /// The body of the next turn, asking `question` (which joins the conversation).
    pub fn ask(&mut self, question: &str) -> Vec<u8> {
        self.messages
            .push(json!({"role": "user", "content": question}));
        serde_json::to_vec(&json!({"model": MODEL, "messages": self.messages})).unwrap()
    }

    /// Sends the next turn to the gateway at `front` (`http://IP:PORT`); a 200 answer
    /// joins the conversation, a failed turn is asked again next time.
    pub async fn turn(&mut self, front: &str, question: &str) -> Answer {
        let body = self.ask(question);
        let answer = send(Method::POST, &format!("{front}/v1/chat/completions"), body).await;
        if answer.status == StatusCode::OK {
            let reply = answer.json()["choices"][0]["message"]["content"].clone();
            self.messages
                .push(json!({"role": "assistant", "content": reply}));
        } else {
            self.messages.pop();
        }
        answer
    }
}
