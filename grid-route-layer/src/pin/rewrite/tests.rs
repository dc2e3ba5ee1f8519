use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Map, Value};

use super::{Framing, IdRewriter};
use crate::grid::{ClusterDigest, SiteName};
use crate::pin::{IdKind, MAX_ENGINE_ID_BYTES, TagKey, TagKeys, TagStamp};

const KEY: &[u8] = b"fixture key, at least thirty-two bytes long";

/// The stamp of `KEY` for site `east`, cluster `east-a`, computed outside Rust (Python's
/// `hmac` over the documented encoding).
const T: &str = "east.1ef772aa.0853555db18f0946.";

fn stamp() -> TagStamp {
    let keys = TagKeys::new(Some(TagKey::from_bytes(KEY).unwrap()));
    keys.stamp(
        &SiteName::new("east").unwrap(),
        ClusterDigest::of_name("east-a"),
    )
}

/// `text` with `{T}` replaced by the stamp.
fn expect(text: &str) -> String {
    text.replace("{T}", T)
}

fn whole(framing: Framing, body: &str) -> String {
    let out = IdRewriter::rewrite(stamp(), framing, Bytes::copy_from_slice(body.as_bytes()));
    String::from_utf8(out.to_vec()).unwrap()
}

/// Feeds `body` cut at `cuts` (sorted or not, any values) and returns all the output.
fn chunked(framing: Framing, body: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.push(0);
    cuts.push(body.len());
    cuts.sort_unstable();
    let body = Bytes::copy_from_slice(body);
    let mut rewriter = IdRewriter::new(stamp(), framing);
    let mut out = Vec::new();
    for pair in cuts.windows(2) {
        out.extend_from_slice(&rewriter.push(body.slice(pair[0]..pair[1])));
    }
    out.extend_from_slice(&rewriter.finish());
    out
}

fn one_byte_chunks(framing: Framing, body: &[u8]) -> Vec<u8> {
    let cuts: Vec<usize> = (0..body.len()).collect();
    chunked(framing, body, &cuts)
}

// ---------------------------------------------------------------------------------------
// Fixtures: shapes of OpenAI Responses and Conversations answers.

const RESPONSE_OBJECT: &str = r#"{
  "id": "resp_68af4030592c81938ec0a5fbab4a3e9f05438e46b5f69a3b",
  "object": "response",
  "created_at": 1756315696,
  "status": "completed",
  "background": false,
  "error": null,
  "incomplete_details": null,
  "instructions": "Answer briefly. Never repeat resp_ ids.",
  "max_output_tokens": null,
  "model": "gpt-4.1-2025-04-14",
  "output": [
    {
      "id": "msg_68af40337e58819392e935fb404414d005438e46b5f69a3b",
      "type": "message",
      "status": "completed",
      "content": [
        {
          "type": "output_text",
          "annotations": [],
          "logprobs": [],
          "text": "Your last answer was {\"id\":\"resp_fake\"}; see \"resp_fake\" or resp_fake."
        }
      ],
      "role": "assistant"
    },
    {
      "id": "fc_68af4034a1c48193",
      "type": "function_call",
      "status": "completed",
      "arguments": "{\"id\":\"resp_fake2\",\"conversation\":\"conv_fake2\"}",
      "call_id": "call_Xk2",
      "name": "lookup"
    }
  ],
  "parallel_tool_calls": true,
  "previous_response_id": "resp_68af402fe2f48193a9d4ae5e5a3b2c1e05438e46b5f69a3b",
  "conversation": {"id": "conv_68af402f8c1c8193b5e1a2d3c4f5e6a705438e46b5f69a3b"},
  "reasoning": {"effort": null, "summary": null},
  "service_tier": "default",
  "store": true,
  "temperature": 1.0,
  "text": {"format": {"type": "text"}, "verbosity": "medium"},
  "tool_choice": "auto",
  "tools": [
    {
      "type": "function",
      "name": "lookup",
      "description": "Looks up resp_ and conv_ ids",
      "parameters": {"type": "object", "properties": {"id": {"type": "string", "default": "resp_default"}}},
      "strict": true
    }
  ],
  "top_p": 1.0,
  "truncation": "disabled",
  "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 123},
  "user": null,
  "metadata": {"id": "resp_in_metadata", "conversation": "conv_in_metadata"}
}"#;

const RESPONSE_OBJECT_TAGGED: &str = r#"{
  "id": "resp_{T}68af4030592c81938ec0a5fbab4a3e9f05438e46b5f69a3b",
  "object": "response",
  "created_at": 1756315696,
  "status": "completed",
  "background": false,
  "error": null,
  "incomplete_details": null,
  "instructions": "Answer briefly. Never repeat resp_ ids.",
  "max_output_tokens": null,
  "model": "gpt-4.1-2025-04-14",
  "output": [
    {
      "id": "msg_68af40337e58819392e935fb404414d005438e46b5f69a3b",
      "type": "message",
      "status": "completed",
      "content": [
        {
          "type": "output_text",
          "annotations": [],
          "logprobs": [],
          "text": "Your last answer was {\"id\":\"resp_fake\"}; see \"resp_fake\" or resp_fake."
        }
      ],
      "role": "assistant"
    },
    {
      "id": "fc_68af4034a1c48193",
      "type": "function_call",
      "status": "completed",
      "arguments": "{\"id\":\"resp_fake2\",\"conversation\":\"conv_fake2\"}",
      "call_id": "call_Xk2",
      "name": "lookup"
    }
  ],
  "parallel_tool_calls": true,
  "previous_response_id": "resp_{T}68af402fe2f48193a9d4ae5e5a3b2c1e05438e46b5f69a3b",
  "conversation": {"id": "conv_{T}68af402f8c1c8193b5e1a2d3c4f5e6a705438e46b5f69a3b"},
  "reasoning": {"effort": null, "summary": null},
  "service_tier": "default",
  "store": true,
  "temperature": 1.0,
  "text": {"format": {"type": "text"}, "verbosity": "medium"},
  "tool_choice": "auto",
  "tools": [
    {
      "type": "function",
      "name": "lookup",
      "description": "Looks up resp_ and conv_ ids",
      "parameters": {"type": "object", "properties": {"id": {"type": "string", "default": "resp_default"}}},
      "strict": true
    }
  ],
  "top_p": 1.0,
  "truncation": "disabled",
  "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 123},
  "user": null,
  "metadata": {"id": "resp_in_metadata", "conversation": "conv_in_metadata"}
}"#;

const RESPONSE_STREAM: &str = concat!(
    "event: response.created\n",
    r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"instructions":"You are a helpful assistant.","model":"gpt-4.1-2025-04-14","output":[],"previous_response_id":"resp_67c9fdc0a1b28190aa11bb22cc33dd4407b8b0ad4e5eb654","conversation":{"id":"conv_67c9fdce1a2b8190a1b2c3d4e5f60718"},"metadata":{},"tools":[]}}"#,
    "\n\n",
    ": keep-alive\n\n",
    "event: response.in_progress\n",
    r#"data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","status":"in_progress","output":[],"conversation":{"id":"conv_67c9fdce1a2b8190a1b2c3d4e5f60718"}}}"#,
    "\n\n",
    "event: response.output_item.added\n",
    r#"data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
    "\n\n",
    "event: response.content_part.added\n",
    r#"data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    "id: resp_sse_event_id\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Your id is resp_fake"}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":", or {\"id\":\"resp_fake\"}"}"#,
    "\n\n",
    "event: response.output_text.done\n",
    r#"data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"text":"Your id is resp_fake, or {\"id\":\"resp_fake\"}"}"#,
    "\n\n",
    "event: response.completed\n",
    r#"data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","status":"completed","output":[{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Your id is resp_fake, or {\"id\":\"resp_fake\"}","annotations":[]}]}],"previous_response_id":"resp_67c9fdc0a1b28190aa11bb22cc33dd4407b8b0ad4e5eb654","conversation":{"id":"conv_67c9fdce1a2b8190a1b2c3d4e5f60718"},"usage":{"input_tokens":36,"output_tokens":9,"total_tokens":45},"metadata":{"id":"resp_in_metadata"}}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

const RESPONSE_STREAM_TAGGED: &str = concat!(
    "event: response.created\n",
    r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_{T}67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"instructions":"You are a helpful assistant.","model":"gpt-4.1-2025-04-14","output":[],"previous_response_id":"resp_{T}67c9fdc0a1b28190aa11bb22cc33dd4407b8b0ad4e5eb654","conversation":{"id":"conv_{T}67c9fdce1a2b8190a1b2c3d4e5f60718"},"metadata":{},"tools":[]}}"#,
    "\n\n",
    ": keep-alive\n\n",
    "event: response.in_progress\n",
    r#"data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_{T}67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","status":"in_progress","output":[],"conversation":{"id":"conv_{T}67c9fdce1a2b8190a1b2c3d4e5f60718"}}}"#,
    "\n\n",
    "event: response.output_item.added\n",
    r#"data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
    "\n\n",
    "event: response.content_part.added\n",
    r#"data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    "id: resp_sse_event_id\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Your id is resp_fake"}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":", or {\"id\":\"resp_fake\"}"}"#,
    "\n\n",
    "event: response.output_text.done\n",
    r#"data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"text":"Your id is resp_fake, or {\"id\":\"resp_fake\"}"}"#,
    "\n\n",
    "event: response.completed\n",
    r#"data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_{T}67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","status":"completed","output":[{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Your id is resp_fake, or {\"id\":\"resp_fake\"}","annotations":[]}]}],"previous_response_id":"resp_{T}67c9fdc0a1b28190aa11bb22cc33dd4407b8b0ad4e5eb654","conversation":{"id":"conv_{T}67c9fdce1a2b8190a1b2c3d4e5f60718"},"usage":{"input_tokens":36,"output_tokens":9,"total_tokens":45},"metadata":{"id":"resp_in_metadata"}}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

const CONVERSATION_OBJECT: &str = r#"{"id":"conv_68b1f2a3c4d58190a1b2c3d4e5f6a7b8","object":"conversation","created_at":1741900000,"metadata":{"topic":"demo","id":"conv_in_metadata"}}"#;

const CONVERSATION_ITEMS: &str = r#"{
  "object": "list",
  "data": [
    {"type": "message", "id": "msg_abc", "status": "completed", "role": "user", "content": [{"type": "input_text", "text": "Hello, what is resp_123?"}]},
    {"type": "message", "id": "msg_def", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "conv_456 is a conversation."}]},
    {"type": "function_call_output", "id": "resp_looks_like_an_id", "call_id": "call_1", "output": "{\"id\":\"resp_1\"}"}
  ],
  "first_id": "msg_abc",
  "last_id": "resp_looks_like_an_id",
  "has_more": false
}"#;

fn crlf(text: &str) -> String {
    text.replace('\n', "\r\n")
}

fn fixtures() -> Vec<(Framing, String)> {
    vec![
        (Framing::Json, RESPONSE_OBJECT.to_owned()),
        (Framing::Json, CONVERSATION_OBJECT.to_owned()),
        (Framing::Json, CONVERSATION_ITEMS.to_owned()),
        (Framing::EventStream, RESPONSE_STREAM.to_owned()),
        (Framing::EventStream, crlf(RESPONSE_STREAM)),
        (Framing::EventStream, RESPONSE_STREAM.replace('\n', "\r")),
        (Framing::EventStream, multi_line_stream()),
        (Framing::EventStream, crlf(&multi_line_stream())),
        (Framing::EventStream, mixed_line_ends()),
    ]
}

/// The same events with each data object spread over several `data:` lines.
fn multi_line_stream() -> String {
    RESPONSE_STREAM
        .replace(",\"", ",\ndata:\"")
        .replace("{\"", "{\ndata: \"")
}

/// LF, CRLF and CR endings in one stream, as a proxy that rewrites line ends might leave.
fn mixed_line_ends() -> String {
    let mut out = String::new();
    let mut previous = "";
    for (n, line) in multi_line_stream().split('\n').enumerate() {
        let mut end = ["\n", "\r\n", "\r"][n % 3];
        if previous == "\r" && line.is_empty() && end == "\n" {
            // CR then LF would be one line end, not a blank line.
            end = "\r\n";
        }
        out.push_str(line);
        out.push_str(end);
        previous = end;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Exact outputs.

#[test]
fn the_stamp_matches_an_independent_computation() {
    assert_eq!(stamp().as_str(), T);
}

#[test]
fn a_response_object_gets_its_own_ids_tagged_and_nothing_else() {
    assert_eq!(
        whole(Framing::Json, RESPONSE_OBJECT),
        expect(RESPONSE_OBJECT_TAGGED)
    );
}

#[test]
fn a_response_stream_gets_each_events_response_ids_tagged() {
    assert_eq!(
        whole(Framing::EventStream, RESPONSE_STREAM),
        expect(RESPONSE_STREAM_TAGGED)
    );
}

#[test]
fn crlf_and_cr_streams_are_tagged_like_lf_streams() {
    assert_eq!(
        whole(Framing::EventStream, &crlf(RESPONSE_STREAM)),
        crlf(&expect(RESPONSE_STREAM_TAGGED))
    );
    assert_eq!(
        whole(Framing::EventStream, &RESPONSE_STREAM.replace('\n', "\r")),
        expect(RESPONSE_STREAM_TAGGED).replace('\n', "\r")
    );
}

#[test]
fn a_conversation_object_gets_its_id_tagged() {
    assert_eq!(
        whole(Framing::Json, CONVERSATION_OBJECT),
        expect(
            r#"{"id":"conv_{T}68b1f2a3c4d58190a1b2c3d4e5f6a7b8","object":"conversation","created_at":1741900000,"metadata":{"topic":"demo","id":"conv_in_metadata"}}"#
        )
    );
}

#[test]
fn ids_inside_conversation_items_are_not_tagged() {
    assert_eq!(whole(Framing::Json, CONVERSATION_ITEMS), CONVERSATION_ITEMS);
}

#[test]
fn done_and_other_non_json_data_pass_through() {
    for body in [
        "data: [DONE]\n\n",
        "data: hello \"resp_1\"\n\n",
        "data: \"resp_1\"\n\n",
        "data: [{\"id\":\"resp_1\"}]\n\n",
    ] {
        assert_eq!(whole(Framing::EventStream, body), body);
    }
}

#[test]
fn a_second_document_in_one_event_is_not_read() {
    assert_eq!(
        whole(
            Framing::EventStream,
            "data: {\"id\":\"resp_1\"} trailing {\"id\":\"resp_2\"}\n\n"
        ),
        expect("data: {\"id\":\"resp_{T}1\"} trailing {\"id\":\"resp_2\"}\n\n")
    );
}

#[test]
fn ids_inside_output_items_are_not_tagged() {
    let body = r#"{"output":[{"id":"resp_1","response":{"id":"resp_2"}}],"item":{"id":"resp_3"}}"#;
    assert_eq!(whole(Framing::Json, body), body);
}

#[test]
fn ids_in_metadata_tools_input_and_text_are_not_tagged() {
    let body = r#"{"metadata":{"id":"resp_1"},"tools":[{"id":"resp_2"}],"input":[{"id":"resp_3"}],"text":"\"id\":\"resp_4\"","instructions":"resp_5"}"#;
    assert_eq!(whole(Framing::Json, body), body);
}

#[test]
fn every_id_key_of_a_tag_object_is_tagged() {
    let body = r#"{"id":"resp_1","previous_response_id":"resp_2","response_id":"resp_3","conversation_id":"conv_4","conversation":"conv_5","other_id":"resp_6"}"#;
    assert_eq!(
        whole(Framing::Json, body),
        expect(
            r#"{"id":"resp_{T}1","previous_response_id":"resp_{T}2","response_id":"resp_{T}3","conversation_id":"conv_{T}4","conversation":"conv_{T}5","other_id":"resp_6"}"#
        )
    );
}

#[test]
fn objects_reached_through_response_and_conversation_are_tag_objects() {
    let body = r#"{"response":{"id":"resp_1","conversation":{"id":"conv_2","response":{"id":"resp_3"}},"output":[{"id":"resp_4"}]},"conversation":{"id":"conv_5"},"x":{"response":{"id":"resp_6"}}}"#;
    assert_eq!(
        whole(Framing::Json, body),
        expect(
            r#"{"response":{"id":"resp_{T}1","conversation":{"id":"conv_{T}2","response":{"id":"resp_{T}3"}},"output":[{"id":"resp_4"}]},"conversation":{"id":"conv_{T}5"},"x":{"response":{"id":"resp_6"}}}"#
        )
    );
}

#[test]
fn only_resp_and_conv_values_are_tagged() {
    let body = r#"{"id":"msg_1","response_id":"fc_2","conversation":"Resp_3","previous_response_id":"respx","conversation_id":"conv","x":1}"#;
    assert_eq!(whole(Framing::Json, body), body);
}

#[test]
fn null_numbers_and_objects_in_id_keys_are_left_alone() {
    let body = r#"{"id":null,"previous_response_id":12,"response_id":true,"conversation":{"id":null},"conversation_id":["conv_1"]}"#;
    assert_eq!(whole(Framing::Json, body), body);
}

#[test]
fn a_value_that_is_already_a_tag_is_left_alone() {
    let body = expect(r#"{"id":"resp_{T}abc","conversation":"conv_west.00000000..x"}"#);
    assert_eq!(whole(Framing::Json, &body), body);
}

#[test]
fn ids_written_with_escapes_are_left_alone() {
    for body in [
        r#"{"id":"resp_a\u0062c"}"#,
        r#"{"id":"\u0072esp_abc"}"#,
        r#"{"id":"resp_a\/b"}"#,
        r#"{"id":"resp_abc\n"}"#,
    ] {
        assert_eq!(whole(Framing::Json, body), body);
    }
}

#[test]
fn escaped_keys_are_not_id_keys() {
    let body = r#"{"\u0069d":"resp_1","i\"d":"resp_2"}"#;
    assert_eq!(whole(Framing::Json, body), body);
}

#[test]
fn unsafe_or_overlong_engine_ids_are_left_alone() {
    let long = format!(r#"{{"id":"resp_{}"}}"#, "a".repeat(MAX_ENGINE_ID_BYTES));
    for body in [
        r#"{"id":"resp_a/b"}"#,
        r#"{"id":"resp_a..b"}"#,
        r#"{"id":"resp_"}"#,
        r#"{"id":"resp_a b"}"#,
        r#"{"id":"resp_é"}"#,
        r#"{"id":"resp_a%2Fb"}"#,
        long.as_str(),
    ] {
        assert_eq!(whole(Framing::Json, body), body);
    }
    let longest = format!(r#"{{"id":"resp_{}"}}"#, "a".repeat(MAX_ENGINE_ID_BYTES - 5));
    assert_eq!(
        whole(Framing::Json, &longest),
        longest.replacen("resp_", &format!("resp_{T}"), 1)
    );
}

#[test]
fn malformed_json_passes_the_rest_through_untouched() {
    let body = r#"{"id":"resp_1", oops "previous_response_id":"resp_2"}"#;
    assert_eq!(
        whole(Framing::Json, body),
        expect(r#"{"id":"resp_{T}1", oops "previous_response_id":"resp_2"}"#)
    );
    for body in [
        r#"{"a":]"id":"resp_1"}"#,
        r#"{"a":[}"id":"resp_1"}"#,
        r#"{"a" "id":"resp_1"}"#,
        r#"{"id" : "resp_1" "#,
        r#"]{"id":"resp_1"}"#,
        "\u{feff}{\"id\":\"resp_1\"}",
    ] {
        let out = whole(Framing::Json, body);
        if body.starts_with(r#"{"id" : "resp_1""#) {
            assert_eq!(out, expect(r#"{"id" : "resp_{T}1" "#));
        } else {
            assert_eq!(out, body);
        }
    }
}

#[test]
fn text_after_the_document_is_not_read() {
    let body = "{\"id\":\"resp_1\"}\n{\"id\":\"resp_2\"}";
    assert_eq!(
        whole(Framing::Json, body),
        expect("{\"id\":\"resp_{T}1\"}\n{\"id\":\"resp_2\"}")
    );
}

#[test]
fn a_broken_event_does_not_affect_the_next_event() {
    let body = "data: {\"a\":]\n\ndata: {\"id\":\"resp_1\"}\n\n";
    assert_eq!(
        whole(Framing::EventStream, body),
        expect("data: {\"a\":]\n\ndata: {\"id\":\"resp_{T}1\"}\n\n")
    );
}

#[test]
fn nesting_deeper_than_the_limit_passes_through() {
    let deep = format!(
        "{{\"x\":{}1{},\"id\":\"resp_1\"}}",
        "[".repeat(300),
        "]".repeat(300)
    );
    assert_eq!(whole(Framing::Json, &deep), deep);
    let shallow = format!(
        "{{\"x\":{}1{},\"id\":\"resp_1\"}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(
        whole(Framing::Json, &shallow),
        shallow.replace("resp_1", &format!("resp_{T}1"))
    );
}

#[test]
fn only_data_lines_are_rewritten() {
    let body = concat!(
        "id: resp_1\n",
        "event: resp_2\n",
        ": {\"id\":\"resp_3\"}\n",
        "retry: 10\n",
        "Data: {\"id\":\"resp_4\"}\n",
        "datas: {\"id\":\"resp_5\"}\n",
        "\n",
    );
    assert_eq!(whole(Framing::EventStream, body), body);
}

#[test]
fn data_lines_of_one_event_join_into_one_document() {
    let body = "data: {\"response\":\ndata:{\"id\":\ndata\ndata: \"resp_1\"}}\n\n";
    assert_eq!(
        whole(Framing::EventStream, body),
        expect("data: {\"response\":\ndata:{\"id\":\ndata\ndata: \"resp_{T}1\"}}\n\n")
    );
}

#[test]
fn an_id_split_across_data_lines_is_not_tagged() {
    let body = "data: {\"id\":\"resp_ab\ndata: cd\"}\n\n";
    assert_eq!(whole(Framing::EventStream, body), body);
}

#[test]
fn other_fields_between_data_lines_are_passed_through() {
    let body = "data: {\"id\":\nevent: x\ndata: \"resp_1\"}\n\n";
    assert_eq!(
        whole(Framing::EventStream, body),
        expect("data: {\"id\":\nevent: x\ndata: \"resp_{T}1\"}\n\n")
    );
}

#[test]
fn each_event_is_its_own_document() {
    let body = "data: {\"id\":\"resp_1\"}\n\ndata: {\"id\":\"resp_2\"}\r\n\r\ndata: {\"x\":{\"id\":\"resp_3\"}}\n\n";
    assert_eq!(
        whole(Framing::EventStream, body),
        expect(
            "data: {\"id\":\"resp_{T}1\"}\n\ndata: {\"id\":\"resp_{T}2\"}\r\n\r\ndata: {\"x\":{\"id\":\"resp_3\"}}\n\n"
        )
    );
}

#[test]
fn an_unterminated_last_event_is_still_tagged() {
    assert_eq!(
        whole(Framing::EventStream, "data: {\"id\":\"resp_1\"}"),
        expect("data: {\"id\":\"resp_{T}1\"}")
    );
}

#[test]
fn finish_releases_a_held_partial_id() {
    let mut rewriter = IdRewriter::new(stamp(), Framing::Json);
    let out = rewriter.push(Bytes::from_static(b"{\"id\":\"resp_abc"));
    assert_eq!(&out[..], b"{\"id\":\"resp_");
    assert_eq!(&rewriter.finish()[..], b"abc");
    // After `finish` a new body starts.
    let out = rewriter.push(Bytes::from_static(b"{\"id\":\"resp_1\"}"));
    assert_eq!(out, expect("{\"id\":\"resp_{T}1\"}"));
}

#[test]
fn hold_back_is_bounded_by_the_longest_id() {
    let value = "a".repeat(10_000);
    for framing in [Framing::Json, Framing::EventStream] {
        let body = format!("data: {{\"id\":\"resp_{value}\"}}\n\n");
        let body = if framing == Framing::Json {
            &body[6..body.len() - 2]
        } else {
            &body[..]
        };
        let mut rewriter = IdRewriter::new(stamp(), framing);
        let (mut fed, mut sent) = (0, 0);
        for b in body.as_bytes() {
            fed += 1;
            sent += rewriter.push(Bytes::copy_from_slice(&[*b])).len();
            assert!(fed - sent <= MAX_ENGINE_ID_BYTES - 5, "{fed} {sent}");
        }
        sent += rewriter.finish().len();
        assert_eq!(sent, fed);
    }
}

#[test]
fn a_long_event_is_tagged_whether_or_not_it_outgrows_the_unread_limit() {
    for text_len in [1_000, 60_000, 70_000, 200_000] {
        let body = format!(
            "data: {{\"text\":\"{}\",\"id\":\"resp_1\"}}\n\ndata: {{\"id\":\"resp_2\"}}\n\n",
            "a".repeat(text_len)
        );
        let expected = body.replace("resp_", &format!("resp_{T}"));
        for chunk in [1_000, 4_096, 16_384] {
            let cuts: Vec<usize> = (chunk..body.len()).step_by(chunk).collect();
            let out = chunked(Framing::EventStream, body.as_bytes(), &cuts);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                expected,
                "{text_len} {chunk}"
            );
        }
    }
}

#[test]
fn bytes_left_unread_are_still_sent_at_once() {
    let mut rewriter = IdRewriter::new(stamp(), Framing::EventStream);
    for chunk in [
        "event: response.output_text.delta\ndata: {\"item_id\":\"msg_1\",",
        "\"delta\":\"a long delta\"}\n\nevent: response.output_text.delta\ndata: {\"del",
        "ta\":\"b\"}\n\ndata: {\"id\":\"resp_1\"}\n\n",
    ] {
        let out = rewriter.push(Bytes::from(chunk));
        assert_eq!(out, chunk.replace("resp_1", &format!("resp_{T}1")));
    }
    assert!(rewriter.finish().is_empty());
}

#[test]
fn unchanged_chunks_are_passed_on_without_copying() {
    let chunk = Bytes::from_static(
        b"event: response.output_text.delta\ndata: {\"item_id\":\"msg_1\",\"delta\":\"hi\"}\n\n",
    );
    let mut rewriter = IdRewriter::new(stamp(), Framing::EventStream);
    let out = rewriter.push(chunk.clone());
    assert_eq!(out, chunk);
    assert_eq!(out.as_ptr(), chunk.as_ptr());
}

#[test]
fn every_fixture_is_the_same_in_one_byte_chunks() {
    for (framing, body) in fixtures() {
        let expected = whole(framing, &body);
        assert_eq!(
            String::from_utf8(one_byte_chunks(framing, body.as_bytes())).unwrap(),
            expected
        );
    }
}

#[test]
fn a_multi_line_stream_is_tagged_like_the_single_line_one() {
    let tag_all = |text: &str| {
        text.replace("\"resp_67c9fdce", &format!("\"resp_{T}67c9fdce"))
            .replace("\"resp_67c9fdc0", &format!("\"resp_{T}67c9fdc0"))
            .replace("\"conv_67c9", &format!("\"conv_{T}67c9"))
    };
    let lf = multi_line_stream();
    assert_eq!(whole(Framing::EventStream, &lf), tag_all(&lf));
    assert_eq!(whole(Framing::EventStream, &crlf(&lf)), tag_all(&crlf(&lf)));
    let mixed = mixed_line_ends();
    assert_eq!(whole(Framing::EventStream, &mixed), tag_all(&mixed));
}

#[test]
fn content_types_choose_the_framing() {
    assert_eq!(
        Framing::from_content_type("application/json"),
        Some(Framing::Json)
    );
    assert_eq!(
        Framing::from_content_type("text/event-stream; charset=utf-8"),
        Some(Framing::EventStream)
    );
    assert_eq!(Framing::from_content_type("application/jsonl"), None);
    assert_eq!(Framing::from_content_type(""), None);
}

// ---------------------------------------------------------------------------------------
// Properties.

/// Keys that matter and some that do not.
fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "id",
        "previous_response_id",
        "response_id",
        "conversation",
        "conversation_id",
        "response",
        "output",
        "metadata",
        "item",
        "text",
        "i\"d",
    ])
    .prop_map(str::to_owned)
}

/// Strings that are ids, almost ids, or not ids.
fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "(resp|conv)_[a-z0-9]{1,12}",
        1 => prop::sample::select(vec![
            "resp_",
            "conv_",
            "msg_abc",
            "resp_a/b",
            "resp_a..b",
            "resp_a.b",
            "conv_east.1ef772aa..x",
            "hello resp_x",
            "resp_\u{e9}",
            "resp_a\"b",
            "resp_a\\b",
            "resp_a\nb",
            "",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<i32>().prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        string_value().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), json_value(), 0..8)
        .prop_map(|map| Value::Object(map.into_iter().collect()))
}

const ID_KEYS: [&str; 5] = [
    "id",
    "previous_response_id",
    "response_id",
    "conversation",
    "conversation_id",
];

/// The tagging rule, written directly on a parsed value.
fn tag_value(value: &Value, stamp: &TagStamp) -> Value {
    let Value::Object(map) = value else {
        return value.clone();
    };
    let mut out = Map::new();
    for (key, member) in map {
        let tagged = match member {
            Value::String(text) if ID_KEYS.contains(&key.as_str()) => IdKind::of_id(text)
                .and_then(|kind| stamp.tag(kind, text))
                .map_or_else(|| member.clone(), Value::String),
            Value::Object(_) if key == "response" || key == "conversation" => {
                tag_value(member, stamp)
            }
            _ => member.clone(),
        };
        out.insert(key.clone(), tagged);
    }
    Value::Object(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn chunk_boundaries_never_change_the_output(
        fixture in 0..9usize,
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let (framing, body) = &fixtures()[fixture];
        let expected = whole(*framing, body);
        let out = chunked(*framing, body.as_bytes(), &cuts);
        prop_assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn damaged_bodies_never_panic_and_ignore_chunk_boundaries(
        fixture in 0..9usize,
        edits in prop::collection::vec((any::<usize>(), prop::sample::select(
            b"{}[]:,\"\\\n\r .daresp_conv_\0\xff".to_vec())), 1..8),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let (framing, body) = &fixtures()[fixture];
        let mut body = body.as_bytes().to_vec();
        for (at, byte) in edits {
            let at = at % (body.len() + 1);
            if at % 2 == 0 && at < body.len() {
                body[at] = byte;
            } else {
                body.insert(at, byte);
            }
        }
        let one_shot = IdRewriter::rewrite(stamp(), *framing, Bytes::copy_from_slice(&body));
        prop_assert_eq!(&chunked(*framing, &body, &cuts), &one_shot.to_vec());
        prop_assert_eq!(&one_byte_chunks(*framing, &body), &one_shot.to_vec());
    }

    #[test]
    fn json_bodies_are_tagged_exactly_where_the_rule_says(
        value in json_object(),
        pretty in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let stamp = stamp();
        let body = if pretty {
            serde_json::to_string_pretty(&value).unwrap()
        } else {
            serde_json::to_string(&value).unwrap()
        };
        let out = chunked(Framing::Json, body.as_bytes(), &cuts);
        let parsed: Value = serde_json::from_slice(&out).unwrap();
        prop_assert_eq!(parsed, tag_value(&value, &stamp));
    }

    #[test]
    fn event_streams_are_tagged_exactly_where_the_rule_says(
        values in prop::collection::vec(json_object(), 1..5),
        line_end in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let stamp = stamp();
        let mut body = String::new();
        for value in &values {
            body.push_str("event: message");
            body.push_str(line_end);
            body.push_str("data: ");
            body.push_str(&serde_json::to_string(value).unwrap());
            body.push_str(line_end);
            body.push_str(line_end);
        }
        body.push_str("data: [DONE]");
        body.push_str(line_end);
        body.push_str(line_end);
        let out = String::from_utf8(chunked(Framing::EventStream, body.as_bytes(), &cuts)).unwrap();
        let events: Vec<&str> = out.split(&format!("{line_end}{line_end}")).collect();
        prop_assert_eq!(events.len(), values.len() + 2);
        for (event, value) in events.iter().zip(&values) {
            let data = event.split_once("data: ").unwrap().1;
            let parsed: Value = serde_json::from_str(data).unwrap();
            prop_assert_eq!(parsed, tag_value(value, &stamp));
        }
        prop_assert_eq!(events[values.len()], "data: [DONE]");
    }
}
