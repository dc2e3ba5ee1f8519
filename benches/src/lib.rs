//! Inputs shared by the grid-route benchmarks: realistic request bodies, built
//! deterministically so every run measures the same bytes.

use serde_json::{Value, json};

/// Deterministic filler text: words from a small vocabulary picked by a generator seeded with
/// `seed`, with the punctuation, quotes and newlines real prompts carry.
pub fn prose(seed: u64, bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the",
        "model",
        "cache",
        "prefix",
        "request",
        "gateway",
        "site",
        "cluster",
        "engine",
        "queue",
        "token",
        "prompt",
        "latency",
        "block",
        "key",
        "route",
        "answer",
        "with",
        "\"quoted\"",
        "café",
        "and",
        "of",
        "is",
        "a",
    ];
    let mut words = fastrand::Rng::with_seed(seed);
    let mut out = String::with_capacity(bytes + 16);
    let mut words_in_line = 0;
    while out.len() < bytes {
        out.push_str(WORDS[words.usize(..WORDS.len())]);
        words_in_line += 1;
        if words_in_line == 14 {
            out.push_str(".\n");
            words_in_line = 0;
        } else {
            out.push(' ');
        }
    }
    out
}

/// A JSON object with its fields in the order given, as the OpenAI and Anthropic Python
/// SDKs send the dicts users write (`role` before `content`). serde_json's `Value` would
/// sort the keys; [`chat_100k_sorted`] measures that order.
fn obj(fields: &[(&str, String)]) -> String {
    let fields: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", str_json(k)))
        .collect();
    format!("{{{}}}", fields.join(","))
}

fn arr(items: &[String]) -> String {
    format!("[{}]", items.join(","))
}

fn str_json(text: &str) -> String {
    serde_json::to_string(text).expect("serialising a str")
}

fn chat_tools() -> String {
    let tool = |name: &str| {
        let params = json!({"type":"object","properties":{"city":{"type":"string","description":"A city"},
            "days":{"type":"integer","minimum":1,"maximum":14},"units":{"type":"string","enum":["c","f"]}},
            "required":["city"]});
        obj(&[
            ("type", str_json("function")),
            (
                "function",
                obj(&[
                    ("name", str_json(name)),
                    ("description", str_json(&prose(name.len() as u64, 200))),
                    ("parameters", params.to_string()),
                ]),
            ),
        ])
    };
    arr(&[
        "get_weather",
        "search_web",
        "read_file",
        "run_query",
        "send_mail",
    ]
    .map(tool))
}

fn chat_messages() -> Vec<String> {
    let msg = |role: &str, content: String| obj(&[("role", str_json(role)), ("content", content)]);
    let mut messages = vec![msg("system", str_json(&prose(1, 4000)))];
    for turn in 0..24u64 {
        messages.push(msg("user", str_json(&prose(100 + turn, 1800))));
        if turn % 3 == 0 {
            let call = obj(&[
                ("id", str_json(&format!("call_{turn}"))),
                ("type", str_json("function")),
                (
                    "function",
                    obj(&[
                        ("name", str_json("get_weather")),
                        ("arguments", str_json(r#"{"city":"Paris","days":3}"#)),
                    ]),
                ),
            ]);
            messages.push(obj(&[
                ("role", str_json("assistant")),
                ("content", "null".into()),
                ("tool_calls", arr(&[call])),
            ]));
            messages.push(obj(&[
                ("role", str_json("tool")),
                ("tool_call_id", str_json(&format!("call_{turn}"))),
                ("content", str_json(&prose(200 + turn, 600))),
            ]));
        }
        messages.push(msg("assistant", str_json(&prose(300 + turn, 1500))));
    }
    messages
}

/// About 100 KiB of multi-turn Chat Completions with tool calls and tool results, in the
/// order the OpenAI Python SDK sends it: `messages` first, `model` and `tools` after, each
/// message's `role` before its `content`.
pub fn chat_100k() -> Vec<u8> {
    obj(&[
        ("messages", arr(&chat_messages())),
        ("model", str_json("demo-model")),
        ("stream", "true".into()),
        ("temperature", "0.7".into()),
        ("tool_choice", str_json("auto")),
        ("tools", chat_tools()),
    ])
    .into_bytes()
}

/// [`chat_100k`] with every object's keys sorted, as serde_json's `Value` and Go maps
/// write them: each message's `content` comes before its `role`.
pub fn chat_100k_sorted() -> Vec<u8> {
    let value: Value = serde_json::from_slice(&chat_100k()).expect("chat_100k is JSON");
    serde_json::to_vec(&value).expect("serialising a Value")
}

/// Anthropic Messages, tool-heavy: ten tool definitions and turns of `tool_use` and
/// `tool_result` blocks, about 100 KiB, in the order the Anthropic Python SDK sends what
/// users write (`role` before `content`, `type` first in each block).
pub fn messages_tools() -> Vec<u8> {
    let tools: Vec<String> = (0..10u64)
        .map(|i| {
            obj(&[
                ("name", str_json(&format!("tool_{i}"))),
                ("description", str_json(&prose(i, 300))),
                (
                    "input_schema",
                    r#"{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"},"flags":{"type":"array","items":{"type":"string"}}},"required":["path"]}"#.into(),
                ),
                ("cache_control", r#"{"type":"ephemeral"}"#.into()),
            ])
        })
        .collect();
    let block = |kind: &str, field: &str, text: String| {
        obj(&[("type", str_json(kind)), (field, str_json(&text))])
    };
    let msg =
        |role: &str, blocks: &[String]| obj(&[("role", str_json(role)), ("content", arr(blocks))]);
    let mut messages = Vec::new();
    for turn in 0..20u64 {
        messages.push(msg(
            "user",
            &[block("text", "text", prose(10 + turn, 1200))],
        ));
        let thinking = obj(&[
            ("type", str_json("thinking")),
            ("thinking", str_json(&prose(20 + turn, 300))),
            ("signature", str_json("sig")),
        ]);
        let tool_use = obj(&[
            ("type", str_json("tool_use")),
            ("id", str_json(&format!("toolu_{turn}"))),
            ("name", str_json(&format!("tool_{}", turn % 10))),
            (
                "input",
                format!(r#"{{"path":"/src/file_{turn}.rs","limit":100,"flags":["a","b"]}}"#),
            ),
        ]);
        messages.push(msg(
            "assistant",
            &[
                thinking,
                block("text", "text", prose(30 + turn, 400)),
                tool_use,
            ],
        ));
        let result = obj(&[
            ("type", str_json("tool_result")),
            ("tool_use_id", str_json(&format!("toolu_{turn}"))),
            (
                "content",
                arr(&[block("text", "text", prose(40 + turn, 2000))]),
            ),
        ]);
        messages.push(msg("user", &[result]));
    }
    obj(&[
        ("model", str_json("claude-demo")),
        ("max_tokens", "1024".into()),
        ("system", str_json(&prose(2, 3000))),
        ("messages", arr(&messages)),
        ("tools", arr(&tools)),
    ])
    .into_bytes()
}

/// OpenAI Responses with an `input` array of messages, function calls, their outputs and
/// reasoning items, about 100 KiB, `type` first in each item as the OpenAI SDK's typed
/// params are usually written.
pub fn responses_items() -> Vec<u8> {
    let text_part =
        |kind: &str, text: String| obj(&[("type", str_json(kind)), ("text", str_json(&text))]);
    let mut input = Vec::new();
    for turn in 0..22u64 {
        input.push(obj(&[
            ("type", str_json("message")),
            ("role", str_json("user")),
            (
                "content",
                arr(&[text_part("input_text", prose(50 + turn, 1500))]),
            ),
        ]));
        input.push(obj(&[
            ("type", str_json("reasoning")),
            ("id", str_json(&format!("rs_{turn}"))),
            (
                "summary",
                arr(&[text_part("summary_text", prose(60 + turn, 200))]),
            ),
        ]));
        input.push(obj(&[
            ("type", str_json("function_call")),
            ("id", str_json(&format!("fc_{turn}"))),
            ("call_id", str_json(&format!("call_{turn}"))),
            ("name", str_json("search_web")),
            ("arguments", str_json(r#"{"query":"kv cache","top_k":5}"#)),
        ]));
        input.push(obj(&[
            ("type", str_json("function_call_output")),
            ("call_id", str_json(&format!("call_{turn}"))),
            ("output", str_json(&prose(70 + turn, 1200))),
        ]));
        input.push(obj(&[
            ("type", str_json("message")),
            ("role", str_json("assistant")),
            (
                "content",
                arr(&[obj(&[
                    ("type", str_json("output_text")),
                    ("text", str_json(&prose(80 + turn, 1000))),
                    ("annotations", "[]".into()),
                ])]),
            ),
        ]));
    }
    let tools: Vec<String> = (0..4u64)
        .map(|i| {
            obj(&[
                ("type", str_json("function")),
                ("name", str_json(&format!("fn_{i}"))),
                ("description", str_json(&prose(i, 200))),
                (
                    "parameters",
                    r#"{"type":"object","properties":{"q":{"type":"string"}}}"#.into(),
                ),
            ])
        })
        .collect();
    obj(&[
        ("model", str_json("demo-model")),
        ("input", arr(&input)),
        ("instructions", str_json(&prose(3, 2000))),
        ("tools", arr(&tools)),
        ("store", "true".into()),
    ])
    .into_bytes()
}

/// A chat turn carrying a 4 MiB base64 image inline.
pub fn chat_image_4m() -> Vec<u8> {
    let data = format!(
        "data:image/png;base64,{}",
        "iVBORw0KGgoAAAANSUhEUgAA".repeat((4 << 20) / 24)
    );
    serde_json::to_vec(&json!({"model":"demo-model","messages":[
        {"role":"system","content":prose(4, 2000)},
        {"role":"user","content":[{"type":"image_url","image_url":{"url":data}},{"type":"text","text":prose(5, 1000)}]}]}))
    .expect("serialising a Value")
}

/// A chat turn whose prompt is 20 MiB of text.
pub fn chat_20m() -> Vec<u8> {
    serde_json::to_vec(
        &json!({"model":"demo-model","messages":[{"role":"user","content":prose(6, 20 << 20)}]}),
    )
    .expect("serialising a Value")
}

/// A chain of `len` unrelated synthetic keys, seeded by `seed`: uniformly spread 64-bit
/// values, like the keyed hashes the index gets as keys.
pub fn synthetic_keys(seed: u64, len: usize) -> Vec<u64> {
    let mut keys = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| keys.u64(..)).collect()
}
