//! What the engine "prefills": a plain rendering of a request's prompt, and its short reply.
//!
//! The rendering stands in for a chat template: tool definitions and other prompt-shaping
//! fields first, then each message as its role followed by its text, tool calls and tool
//! results. It only needs to be deterministic and to grow by appending as a conversation
//! grows, so that a follow-up turn shares the earlier turns' cached blocks. Media parts are
//! rendered as their url, data or file id; reasoning is left out, as chat templates do.

use serde_json::{Map, Value};

use super::error::ApiError;

/// Words of the last user message the reply echoes.
const ECHO_WORDS: usize = 6;

/// A rendered prompt.
#[derive(Debug, Default)]
pub(crate) struct PromptText {
    pub(crate) bytes: Vec<u8>,
    /// The text of the last user message, which the reply echoes.
    pub(crate) last_user_text: String,
}

impl PromptText {
    fn turn(&mut self, role: &str) {
        self.bytes.extend_from_slice(b"<|");
        self.bytes.extend_from_slice(role.as_bytes());
        self.bytes.extend_from_slice(b"|>\n");
    }

    fn end_turn(&mut self) {
        self.bytes.push(b'\n');
    }

    fn text(&mut self, text: &str) {
        self.bytes.extend_from_slice(text.as_bytes());
    }

    fn json(&mut self, value: &Value) {
        // serde_json writes a `Value` without any fallible I/O into a Vec.
        self.bytes.extend_from_slice(value.to_string().as_bytes());
    }

    /// A prompt-shaping field (tools, template, documents) as its own section.
    fn section(&mut self, name: &str, value: &Value) {
        self.turn(name);
        self.json(value);
        self.end_turn();
    }

    fn tool_call(&mut self, name: &str, arguments: &Value) {
        self.text("<tool_call>");
        self.text(name);
        self.text("(");
        match arguments {
            Value::String(text) => self.text(text),
            other => self.json(other),
        }
        self.text(")");
    }

    /// A content value: a string, or an array of parts (OpenAI parts, Anthropic blocks or
    /// Responses content items). Returns the text it held.
    fn content(&mut self, content: &Value) -> String {
        let mut text = String::new();
        match content {
            Value::Null => {}
            Value::String(s) => text.push_str(s),
            Value::Array(parts) => {
                for part in parts {
                    self.part(part, &mut text);
                }
                return text;
            }
            other => self.json(other),
        }
        self.text(&text);
        text
    }

    fn part(&mut self, part: &Value, text: &mut String) {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
        match kind {
            "thinking" | "redacted_thinking" | "reasoning" => {}
            "tool_use" => {
                let name = part.get("name").and_then(Value::as_str).unwrap_or("");
                self.tool_call(name, part.get("input").unwrap_or(&Value::Null));
            }
            "tool_result" => {
                self.text("<tool_result>");
                let inner = self.content(part.get("content").unwrap_or(&Value::Null));
                text.push_str(&inner);
            }
            _ => {
                if let Some(s) = part.get("text").and_then(Value::as_str) {
                    self.text(s);
                    text.push_str(s);
                } else {
                    // Media and unknown parts: their reference (url, data, file id) as JSON.
                    self.json(part);
                }
            }
        }
    }
}

fn messages<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a [Value], ApiError> {
    body.get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| ApiError::bad_request(format!("`{field}` must be an array")).param(field))
}

fn role(message: &Value) -> Result<&str, ApiError> {
    message
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("each message needs a string `role`"))
}

/// Renders a Chat Completions request.
pub(crate) fn render_chat(body: &Map<String, Value>) -> Result<PromptText, ApiError> {
    let messages = messages(body, "messages")?;
    let mut prompt = PromptText::default();
    for field in [
        "tools",
        "chat_template",
        "chat_template_kwargs",
        "documents",
    ] {
        if let Some(value) = body.get(field) {
            prompt.section(field, value);
        }
    }
    for message in messages {
        let role = role(message)?;
        prompt.turn(role);
        let text = prompt.content(message.get("content").unwrap_or(&Value::Null));
        if role == "user" {
            prompt.last_user_text = text;
        }
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = function.get("name").and_then(Value::as_str).unwrap_or("");
            prompt.tool_call(name, function.get("arguments").unwrap_or(&Value::Null));
        }
        prompt.end_turn();
    }
    Ok(prompt)
}

/// Renders an Anthropic Messages request.
pub(crate) fn render_messages(body: &Map<String, Value>) -> Result<PromptText, ApiError> {
    let messages = messages(body, "messages")?;
    let mut prompt = PromptText::default();
    if let Some(tools) = body.get("tools") {
        prompt.section("tools", tools);
    }
    if let Some(system) = body.get("system") {
        prompt.turn("system");
        prompt.content(system);
        prompt.end_turn();
    }
    for message in messages {
        let role = role(message)?;
        prompt.turn(role);
        let text = prompt.content(message.get("content").unwrap_or(&Value::Null));
        if role == "user" {
            prompt.last_user_text = text;
        }
        prompt.end_turn();
    }
    Ok(prompt)
}

/// Renders a Responses request's instructions and tools, then its items (the stored context
/// followed by the new input).
pub(crate) fn render_responses<'a>(
    body: &Map<String, Value>,
    items: impl IntoIterator<Item = &'a Value>,
) -> PromptText {
    let mut prompt = PromptText::default();
    if let Some(tools) = body.get("tools") {
        prompt.section("tools", tools);
    }
    if let Some(instructions) = body.get("instructions").filter(|v| !v.is_null()) {
        prompt.turn("system");
        prompt.content(instructions);
        prompt.end_turn();
    }
    for item in items {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                prompt.turn(role);
                let text = prompt.content(item.get("content").unwrap_or(&Value::Null));
                if role == "user" {
                    prompt.last_user_text = text;
                }
            }
            "function_call" => {
                prompt.turn("assistant");
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                prompt.tool_call(name, item.get("arguments").unwrap_or(&Value::Null));
            }
            "function_call_output" => {
                prompt.turn("tool");
                prompt.content(item.get("output").unwrap_or(&Value::Null));
            }
            "reasoning" => continue,
            _ => {
                prompt.turn(kind);
                prompt.json(item);
            }
        }
        prompt.end_turn();
    }
    prompt
}

/// Renders a Completions `prompt`: a string, an array of strings (joined), or token ids
/// (each id as 4 bytes, so a token-id prompt costs one token per id).
pub(crate) fn render_completion(body: &Map<String, Value>) -> Result<PromptText, ApiError> {
    let bad = || {
        ApiError::bad_request("`prompt` must be a string, an array of strings or token ids")
            .param("prompt")
    };
    let mut prompt = PromptText::default();
    match body.get("prompt").ok_or_else(bad)? {
        Value::String(text) => prompt.text(text),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(text) => prompt.text(text),
                    Value::Number(_) => push_token_id(&mut prompt, item).ok_or_else(bad)?,
                    Value::Array(ids) => {
                        for id in ids {
                            push_token_id(&mut prompt, id).ok_or_else(bad)?;
                        }
                    }
                    _ => return Err(bad()),
                }
            }
        }
        _ => return Err(bad()),
    }
    prompt.last_user_text = String::from_utf8_lossy(&prompt.bytes).into_owned();
    Ok(prompt)
}

fn push_token_id(prompt: &mut PromptText, id: &Value) -> Option<()> {
    let id = u32::try_from(id.as_u64()?).ok()?;
    prompt.bytes.extend_from_slice(&id.to_le_bytes());
    Some(())
}

/// The reply's tokens: `[NAME]` then the first words of the last user message, each word one
/// token, cut to `max_tokens`. Returns the tokens and whether they were cut.
pub(crate) fn reply_tokens(
    engine_name: &str,
    last_user_text: &str,
    max_tokens: Option<u64>,
) -> (Vec<String>, bool) {
    let mut tokens = vec![format!("[{engine_name}]")];
    tokens.extend(
        last_user_text
            .split_whitespace()
            .take(ECHO_WORDS)
            .map(|word| format!(" {word}")),
    );
    let limit = max_tokens.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let cut = tokens.len() > limit;
    tokens.truncate(limit);
    (tokens, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!("test bodies are objects"),
        }
    }

    #[test]
    fn a_follow_up_turn_extends_the_rendering_of_the_earlier_turns() {
        let first = json!({"messages": [{"role": "user", "content": "hello there"}]});
        let second = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ]});
        let first = render_chat(&object(first)).unwrap();
        let second = render_chat(&object(second)).unwrap();
        assert!(
            second
                .bytes
                .starts_with(&first.bytes[..first.bytes.len() - 1])
        );
        assert_eq!(second.last_user_text, "more");
    }

    #[test]
    fn token_id_prompts_cost_four_bytes_an_id() {
        let prompt = render_completion(&object(json!({"prompt": [1, 2, 3]}))).unwrap();
        assert_eq!(prompt.bytes.len(), 12);
        assert!(render_completion(&object(json!({"prompt": [-1]}))).is_err());
        assert!(render_completion(&object(json!({"prompt": {"a": 1}}))).is_err());
    }

    #[test]
    fn the_reply_names_the_engine_and_honours_max_tokens() {
        let (tokens, cut) = reply_tokens("east-a", "one two", None);
        assert_eq!(tokens.concat(), "[east-a] one two");
        assert!(!cut);
        let (tokens, cut) = reply_tokens("east-a", "one two", Some(1));
        assert_eq!(tokens, vec!["[east-a]".to_owned()]);
        assert!(cut);
    }
}
