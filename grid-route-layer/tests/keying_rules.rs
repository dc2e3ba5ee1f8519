//! One test per keying rule ("Keying" in docs/architecture.md), for each API where it applies.

use std::sync::LazyLock;

use grid_route_layer::keying::{Api, BLOCK_BYTES, KeySeed, MAX_KEYS, NoKeys, PrefixKeys, key_body};
use serde_json::{Value, json};

static SEED: LazyLock<KeySeed> = LazyLock::new(KeySeed::random);

fn keyed(api: Api, body: &str) -> PrefixKeys {
    let prompt = key_body(&SEED, api, body.as_bytes()).expect("no duplicate fields");
    match prompt.keys() {
        Ok(keys) => keys.clone(),
        Err(reason) => panic!("{api:?}: expected keys, got no keys: {reason}"),
    }
}

fn keys(api: Api, body: &Value) -> Vec<u64> {
    keyed(api, &body.to_string()).as_slice().to_vec()
}

fn raw_keys(api: Api, body: &str) -> Vec<u64> {
    keyed(api, body).as_slice().to_vec()
}

fn no_keys(api: Api, body: &str) -> NoKeys {
    let prompt = key_body(&SEED, api, body.as_bytes()).expect("no duplicate fields");
    prompt
        .keys()
        .err()
        .cloned()
        .unwrap_or_else(|| panic!("{api:?}: expected no keys"))
}

/// Text long enough to fill several blocks.
fn long(tag: &str) -> String {
    format!(
        "{tag}: {}",
        "Keys must tell long prompts apart. ".repeat(30)
    )
}

fn shares_no_key(a: &[u64], b: &[u64]) -> bool {
    a.iter().all(|k| !b.contains(k))
}

// ---- field order ----------------------------------------------------------------------

#[test]
fn top_level_field_order_does_not_change_the_keys() {
    let sys = long("sys");
    let chat_a = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{sys}"}}],"tools":[{{"type":"function","function":{{"name":"f"}}}}],"cache_salt":"s"}}"#
    );
    let chat_b = format!(
        r#"{{"cache_salt":"s","tools":[{{"type":"function","function":{{"name":"f"}}}}],"messages":[{{"role":"user","content":"{sys}"}}],"model":"m"}}"#
    );
    assert_eq!(
        raw_keys(Api::ChatCompletions, &chat_a),
        raw_keys(Api::ChatCompletions, &chat_b)
    );

    let cmpl_a = format!(r#"{{"model":"m","prompt":"{sys}","max_tokens":5}}"#);
    let cmpl_b = format!(r#"{{"max_tokens":5,"prompt":"{sys}","model":"m"}}"#);
    assert_eq!(
        raw_keys(Api::Completions, &cmpl_a),
        raw_keys(Api::Completions, &cmpl_b)
    );

    let msg_a = format!(
        r#"{{"model":"m","system":"{sys}","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"name":"t","input_schema":{{}}}}]}}"#
    );
    let msg_b = format!(
        r#"{{"tools":[{{"name":"t","input_schema":{{}}}}],"messages":[{{"role":"user","content":"hi"}}],"system":"{sys}","model":"m"}}"#
    );
    assert_eq!(
        raw_keys(Api::Messages, &msg_a),
        raw_keys(Api::Messages, &msg_b)
    );

    let resp_a = format!(r#"{{"model":"m","instructions":"{sys}","input":"hello","tools":[]}}"#);
    let resp_b = format!(r#"{{"input":"hello","tools":[],"instructions":"{sys}","model":"m"}}"#);
    assert_eq!(
        raw_keys(Api::Responses, &resp_a),
        raw_keys(Api::Responses, &resp_b)
    );
}

#[test]
fn field_order_inside_messages_does_not_change_the_keys() {
    let text = long("t");
    let chat_a = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{text}"}}]}},{{"role":"assistant","content":"ok","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}]}}]}}"#
    );
    let chat_b = format!(
        r#"{{"model":"m","messages":[{{"content":[{{"text":"{text}","type":"text"}}],"role":"user"}},{{"tool_calls":[{{"function":{{"arguments":"{{}}","name":"f"}},"type":"function","id":"c1"}}],"content":"ok","role":"assistant"}}]}}"#
    );
    assert_eq!(
        raw_keys(Api::ChatCompletions, &chat_a),
        raw_keys(Api::ChatCompletions, &chat_b)
    );

    let msg_a = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{text}"}},{{"type":"tool_result","tool_use_id":"x","content":"r"}}]}}]}}"#
    );
    let msg_b = format!(
        r#"{{"model":"m","messages":[{{"content":[{{"text":"{text}","type":"text"}},{{"content":"r","tool_use_id":"x","type":"tool_result"}}],"role":"user"}}]}}"#
    );
    assert_eq!(
        raw_keys(Api::Messages, &msg_a),
        raw_keys(Api::Messages, &msg_b)
    );

    let resp_a = format!(
        r#"{{"model":"m","input":[{{"type":"message","role":"user","content":[{{"type":"input_text","text":"{text}"}}]}},{{"type":"function_call_output","call_id":"c","output":"42"}}]}}"#
    );
    let resp_b = format!(
        r#"{{"model":"m","input":[{{"content":[{{"text":"{text}","type":"input_text"}}],"role":"user","type":"message"}},{{"output":"42","call_id":"c","type":"function_call_output"}}]}}"#
    );
    assert_eq!(
        raw_keys(Api::Responses, &resp_a),
        raw_keys(Api::Responses, &resp_b)
    );
}

// ---- ignored fields -------------------------------------------------------------------

#[test]
fn generation_parameters_do_not_change_the_keys() {
    let text = long("g");
    let params = json!({"temperature":0.2,"top_p":0.9,"max_tokens":100,"max_completion_tokens":9,
        "stream":true,"stream_options":{"include_usage":true},"tool_choice":"auto","seed":7,
        "stop":["x"],"n":1,"logprobs":true,"user":"u","metadata":{"a":1},"unknown_field":[1,2]});
    let cases = [
        (
            Api::ChatCompletions,
            json!({"model":"m","messages":[{"role":"user","content":text}]}),
        ),
        (Api::Completions, json!({"model":"m","prompt":text})),
        (
            Api::Messages,
            json!({"model":"m","max_tokens":5,"messages":[{"role":"user","content":text}]}),
        ),
        (Api::Responses, json!({"model":"m","input":text})),
    ];
    for (api, base) in cases {
        let mut with = base.clone();
        for (k, v) in params.as_object().unwrap() {
            with[k] = v.clone();
        }
        assert_eq!(keys(api, &base), keys(api, &with), "{api:?}");
    }
}

#[test]
fn reasoning_does_not_change_the_keys() {
    let text = long("r");
    let chat = |extra: Value| {
        let mut assistant = json!({"role":"assistant","content":"answer"});
        for (k, v) in extra.as_object().unwrap() {
            assistant[k] = v.clone();
        }
        json!({"model":"m","messages":[{"role":"user","content":text},assistant,{"role":"user","content":"more"}]})
    };
    assert_eq!(
        keys(Api::ChatCompletions, &chat(json!({}))),
        keys(
            Api::ChatCompletions,
            &chat(json!({"reasoning_content":"hmm","reasoning":"hmm"}))
        )
    );

    let msgs = |blocks: Value| json!({"model":"m","messages":[{"role":"user","content":text},{"role":"assistant","content":blocks}]});
    assert_eq!(
        keys(
            Api::Messages,
            &msgs(json!([{"type":"text","text":"answer"}]))
        ),
        keys(
            Api::Messages,
            &msgs(
                json!([{"type":"thinking","thinking":"hmm","signature":"sig"},
                {"type":"redacted_thinking","data":"xyz"},{"type":"text","text":"answer"}])
            )
        )
    );

    let resp = |items: Vec<Value>| json!({"model":"m","input":items});
    let user = json!({"role":"user","content":text});
    let reasoning =
        json!({"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"hmm"}]});
    assert_eq!(
        keys(Api::Responses, &resp(vec![user.clone()])),
        keys(Api::Responses, &resp(vec![user, reasoning]))
    );
}

#[test]
fn escapes_do_not_change_the_keys() {
    let plain = format!("café / {}", long("e"));
    let escaped = plain.replace('é', "\\u00e9").replace('/', "\\/");
    for (api, template) in [
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"user","content":"TEXT"}]}"#,
        ),
        (Api::Completions, r#"{"model":"m","prompt":"TEXT"}"#),
        (
            Api::Messages,
            r#"{"model":"m","messages":[{"role":"user","content":"TEXT"}]}"#,
        ),
        (Api::Responses, r#"{"model":"m","input":"TEXT"}"#),
    ] {
        assert_eq!(
            raw_keys(api, &template.replace("TEXT", &plain)),
            raw_keys(api, &template.replace("TEXT", &escaped)),
            "{api:?}"
        );
    }
}

#[test]
fn string_content_keys_like_one_text_part() {
    let text = long("s");
    assert_eq!(
        keys(
            Api::ChatCompletions,
            &json!({"model":"m","messages":[{"role":"user","content":text}]})
        ),
        keys(
            Api::ChatCompletions,
            &json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":text}]}]})
        )
    );
    assert_eq!(
        keys(
            Api::Messages,
            &json!({"model":"m","messages":[{"role":"user","content":text}]})
        ),
        keys(
            Api::Messages,
            &json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":text,"cache_control":{"type":"ephemeral"}}]}]})
        )
    );
    assert_eq!(
        keys(
            Api::Messages,
            &json!({"model":"m","system":text,"messages":[{"role":"user","content":"q"}]})
        ),
        keys(
            Api::Messages,
            &json!({"model":"m","system":[{"type":"text","text":text}],"messages":[{"role":"user","content":"q"}]})
        )
    );
    let responses = [
        json!({"model":"m","input":text}),
        json!({"model":"m","input":[{"role":"user","content":text}]}),
        json!({"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":text}]}]}),
    ];
    let expected = keys(Api::Responses, &responses[0]);
    for body in &responses[1..] {
        assert_eq!(keys(Api::Responses, body), expected, "{body}");
    }
    // ...but two parts are not one.
    let half = text.len() / 2;
    assert_ne!(
        keys(
            Api::ChatCompletions,
            &json!({"model":"m","messages":[{"role":"user","content":text}]})
        ),
        keys(
            Api::ChatCompletions,
            &json!({"model":"m","messages":[{"role":"user","content":[
                {"type":"text","text":&text[..half]},{"type":"text","text":&text[half..]}]}]})
        )
    );
}

#[test]
fn tool_call_ids_are_ignored() {
    let text = long("i");
    let chat = |id: &str| {
        json!({"model":"m","messages":[{"role":"user","content":text},
            {"role":"assistant","tool_calls":[{"id":id,"type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":id,"content":"result"}]})
    };
    assert_eq!(
        keys(Api::ChatCompletions, &chat("call_1")),
        keys(Api::ChatCompletions, &chat("call_2"))
    );

    let msgs = |id: &str| {
        json!({"model":"m","messages":[{"role":"user","content":text},
            {"role":"assistant","content":[{"type":"tool_use","id":id,"name":"f","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":"result"}]}]})
    };
    assert_eq!(
        keys(Api::Messages, &msgs("toolu_1")),
        keys(Api::Messages, &msgs("toolu_2"))
    );

    let resp = |id: &str| {
        json!({"model":"m","input":[{"role":"user","content":text},
            {"type":"function_call","id":format!("fc_{id}"),"call_id":id,"name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":id,"output":"result"}]})
    };
    assert_eq!(
        keys(Api::Responses, &resp("call_1")),
        keys(Api::Responses, &resp("call_2"))
    );
}

// ---- tools and arguments --------------------------------------------------------------

#[test]
fn tool_key_order_does_not_change_the_keys() {
    let text = long("k");
    let a = r#"{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object","properties":{"x":{"type":"string"},"y":{"type":"number"}}}}}"#;
    let b = r#"{"function":{"parameters":{"properties":{"y":{"type":"number"},"x":{"type":"string"}},"type":"object"},"description":"d","name":"get"},"type":"function"}"#;
    let chat = |tool: &str| {
        format!(
            r#"{{"model":"m","tools":[{tool}],"messages":[{{"role":"user","content":"{text}"}}]}}"#
        )
    };
    assert_eq!(
        raw_keys(Api::ChatCompletions, &chat(a)),
        raw_keys(Api::ChatCompletions, &chat(b))
    );

    let a = r#"{"name":"get","description":"d","input_schema":{"type":"object","required":["x"]},"cache_control":{"type":"ephemeral"}}"#;
    let b = r#"{"input_schema":{"required":["x"],"type":"object"},"description":"d","name":"get"}"#;
    let msgs = |tool: &str| {
        format!(
            r#"{{"model":"m","tools":[{tool}],"messages":[{{"role":"user","content":"{text}"}}]}}"#
        )
    };
    assert_eq!(
        raw_keys(Api::Messages, &msgs(a)),
        raw_keys(Api::Messages, &msgs(b))
    );

    let a = r#"{"type":"function","name":"get","parameters":{"a":1,"b":2},"strict":true}"#;
    let b = r#"{"strict":true,"parameters":{"b":2,"a":1},"name":"get","type":"function"}"#;
    let resp = |tool: &str| format!(r#"{{"model":"m","tools":[{tool}],"input":"{text}"}}"#);
    assert_eq!(
        raw_keys(Api::Responses, &resp(a)),
        raw_keys(Api::Responses, &resp(b))
    );
}

#[test]
fn tools_change_the_keys_from_the_first_block() {
    let text = long("t");
    let with = |name: &str| {
        json!({"model":"m","tools":[{"type":"function","function":{"name":name}}],
            "messages":[{"role":"user","content":text}]})
    };
    let (a, b) = (
        keys(Api::ChatCompletions, &with("a")),
        keys(Api::ChatCompletions, &with("b")),
    );
    assert!(shares_no_key(&a, &b));
}

#[test]
fn tool_lists_over_16_kib_are_keyed_by_their_bytes_as_sent() {
    let text = long("b");
    let body = |pad: usize, sorted: bool| {
        let desc = "d".repeat(pad);
        let tool = if sorted {
            format!(r#"{{"description":"{desc}","name":"f"}}"#)
        } else {
            format!(r#"{{"name":"f","description":"{desc}"}}"#)
        };
        format!(r#"{{"model":"m","tools":[{tool}],"input":"{text}"}}"#)
    };
    // Under the limit key order is canonicalised; over it the bytes as sent count.
    assert_eq!(
        raw_keys(Api::Responses, &body(1000, true)),
        raw_keys(Api::Responses, &body(1000, false))
    );
    assert_ne!(
        raw_keys(Api::Responses, &body(17 * 1024, true)),
        raw_keys(Api::Responses, &body(17 * 1024, false))
    );
    // A digested list costs one short block, not 17 KiB of stream.
    assert!(keyed(Api::Responses, &body(17 * 1024, true)).blocks() < 10);
}

#[test]
fn tool_call_arguments_are_canonicalised() {
    let text = long("a");
    let chat = |args: &str| {
        json!({"model":"m","messages":[{"role":"user","content":text},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":args}}]},
            {"role":"user","content":long("after")}]})
    };
    assert_eq!(
        keys(Api::ChatCompletions, &chat(r#"{"a":1,"b":2}"#)),
        keys(Api::ChatCompletions, &chat(r#"{ "b": 2, "a": 1 }"#))
    );
    assert_ne!(
        keys(Api::ChatCompletions, &chat(r#"{"a":1,"b":2}"#)),
        keys(Api::ChatCompletions, &chat(r#"{"a":1,"b":3}"#))
    );
    // Arguments that are not JSON key as their text.
    assert_ne!(
        keys(Api::ChatCompletions, &chat("not json")),
        keys(Api::ChatCompletions, &chat("not json!"))
    );

    let resp = |args: &str| {
        json!({"model":"m","input":[{"role":"user","content":text},
            {"type":"function_call","call_id":"c","name":"f","arguments":args},
            {"role":"user","content":long("after")}]})
    };
    assert_eq!(
        keys(Api::Responses, &resp(r#"{"x":[1,{"q":true,"p":null}]}"#)),
        keys(Api::Responses, &resp(r#"{"x":[1,{"p":null,"q":true}]}"#))
    );

    let a = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}},{{"role":"assistant","content":[{{"type":"tool_use","id":"t","name":"f","input":{{"a":1,"b":{{"d":2,"c":3}}}}}}]}},{{"role":"user","content":"{text}"}}]}}"#
    );
    let b = a.replace(
        r#"{"a":1,"b":{"d":2,"c":3}}"#,
        r#"{"b":{"c":3,"d":2},"a":1}"#,
    );
    assert_ne!(a, b);
    assert_eq!(raw_keys(Api::Messages, &a), raw_keys(Api::Messages, &b));
}

#[test]
fn tool_call_arguments_over_16_kib_are_keyed_as_sent() {
    let text = long("a");
    let pad = "p".repeat(17 * 1024);
    let chat = |args: String| {
        json!({"model":"m","messages":[{"role":"user","content":text},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":args}}]},
            {"role":"user","content":long("after")}]})
    };
    assert_ne!(
        keys(
            Api::ChatCompletions,
            &chat(format!(r#"{{"a":"{pad}","b":2}}"#))
        ),
        keys(
            Api::ChatCompletions,
            &chat(format!(r#"{{"b":2,"a":"{pad}"}}"#))
        )
    );
}

// ---- namespaces and prefixes ----------------------------------------------------------

#[test]
fn model_and_salt_give_disjoint_keys() {
    let text = long("n");
    let cases = [
        (
            Api::ChatCompletions,
            json!({"messages":[{"role":"user","content":text}]}),
        ),
        (Api::Completions, json!({"prompt":text})),
        (
            Api::Messages,
            json!({"messages":[{"role":"user","content":text}]}),
        ),
        (Api::Responses, json!({"input":text})),
    ];
    for (api, base) in cases {
        let with = |model: &str, salt: Option<&str>| {
            let mut body = base.clone();
            body["model"] = json!(model);
            if let Some(salt) = salt {
                body["cache_salt"] = json!(salt);
            }
            keys(api, &body)
        };
        assert_eq!(with("a", None), with("a", None));
        assert!(
            shares_no_key(&with("a", None), &with("b", None)),
            "{api:?} model"
        );
        assert!(
            shares_no_key(&with("a", None), &with("a", Some("tenant-1"))),
            "{api:?} salt"
        );
        assert!(
            shares_no_key(&with("a", Some("tenant-1")), &with("a", Some("tenant-2"))),
            "{api:?}"
        );
        // The namespace is not a concatenation: model "ab" + no salt is not model "a" + salt "b".
        assert!(
            shares_no_key(&with("ab", None), &with("a", Some("b"))),
            "{api:?}"
        );
    }
}

#[test]
fn turn_n_keys_are_a_strict_prefix_of_turn_n_plus_1() {
    let turns: Vec<String> = (0..4).map(|i| long(&format!("turn {i}"))).collect();
    let chat = |n: usize| {
        let msgs: Vec<Value> = (0..n)
            .map(
                |i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": turns[i]}),
            )
            .collect();
        json!({"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":msgs})
    };
    let msgs = |n: usize| {
        let msgs: Vec<Value> = (0..n)
            .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": [{"type":"text","text":turns[i]}]}))
            .collect();
        json!({"model":"m","system":"be brief","messages":msgs})
    };
    let resp = |n: usize| {
        let items: Vec<Value> = (0..n)
            .map(
                |i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": turns[i]}),
            )
            .collect();
        json!({"model":"m","instructions":"be brief","input":items})
    };
    let cmpl = |n: usize| json!({"model":"m","prompt": turns[..n].concat()});
    let builders: [(Api, &dyn Fn(usize) -> Value); 4] = [
        (Api::ChatCompletions, &chat),
        (Api::Messages, &msgs),
        (Api::Responses, &resp),
        (Api::Completions, &cmpl),
    ];
    for (api, build) in builders {
        for n in 1..turns.len() {
            let (a, b) = (keys(api, &build(n)), keys(api, &build(n + 1)));
            assert!(b.len() > a.len(), "{api:?} turn {n}");
            assert_eq!(&b[..a.len()], &a[..], "{api:?} turn {n}");
        }
    }
}

// ---- threads ----------------------------------------------------------------------------

fn read_prompt(api: Api, body: &Value) -> grid_route_layer::route::Prompt {
    key_body(&SEED, api, body.to_string().as_bytes()).expect("no duplicate fields")
}

/// A builder of one API's body from its turns.
type Body<'a> = &'a dyn Fn(Vec<Value>) -> Value;

/// Each API's turns as a client sends them back: the earlier turns as they were, then the
/// model's answer, then what follows it.
#[test]
fn each_turn_follows_the_thread_of_the_prompt_its_last_answer_answered() {
    let system = long("system");
    let chat = |msgs: Vec<Value>| {
        let mut all = vec![json!({"role":"system","content":system})];
        all.extend(msgs);
        json!({"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":all})
    };
    let msgs = |msgs: Vec<Value>| json!({"model":"m","system":system,"messages":msgs});
    let resp = |items: Vec<Value>| json!({"model":"m","instructions":system,"input":items});
    let user = |text: &str| json!({"role":"user","content":text});
    let assistant = |text: &str| json!({"role":"assistant","content":text});
    let cases: [(Api, Body<'_>); 3] = [
        (Api::ChatCompletions, &chat),
        (Api::Messages, &msgs),
        (Api::Responses, &resp),
    ];
    for (api, build) in cases {
        let first = read_prompt(api, &build(vec![user("hi")]));
        let second = read_prompt(
            api,
            &build(vec![user("hi"), assistant("hello"), user("and?")]),
        );
        let third = read_prompt(
            api,
            &build(vec![
                user("hi"),
                assistant("hello"),
                user("and?"),
                assistant("that is all"),
                user("thanks"),
            ]),
        );
        assert!(first.thread().is_some(), "{api:?}");
        assert_eq!(first.keys().unwrap().follows(), None, "{api:?}");
        assert_eq!(second.keys().unwrap().follows(), first.thread(), "{api:?}");
        assert_eq!(third.keys().unwrap().follows(), second.thread(), "{api:?}");
        // Another first question behind the same head: same keys, another thread.
        let other = read_prompt(api, &build(vec![user("ho")]));
        assert_eq!(other.keys(), first.keys(), "{api:?}");
        assert_ne!(other.thread(), first.thread(), "{api:?}");
        // A history that differs anywhere follows another thread.
        let edited = read_prompt(
            api,
            &build(vec![user("hi!"), assistant("hello"), user("and?")]),
        );
        assert_ne!(edited.keys().unwrap().follows(), first.thread(), "{api:?}");
    }
}

#[test]
fn a_tool_round_follows_the_prompt_that_asked_for_the_call() {
    let system = long("system");
    // Chat: the assistant's tool call answers the prompt before it; the tool's result is
    // the client's.
    let chat = |msgs: Vec<Value>| {
        let mut all = vec![
            json!({"role":"system","content":system}),
            json!({"role":"user","content":"weather?"}),
        ];
        all.extend(msgs);
        read_prompt(Api::ChatCompletions, &json!({"model":"m","messages":all}))
    };
    let asked = chat(vec![]);
    let call = json!({"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{}"}}]});
    let result = json!({"role":"tool","tool_call_id":"c1","content":"sunny"});
    let with_result = chat(vec![call.clone(), result.clone()]);
    assert_eq!(with_result.keys().unwrap().follows(), asked.thread());
    let next = chat(vec![
        call,
        result,
        json!({"role":"assistant","content":"It is sunny."}),
        json!({"role":"user","content":"thanks"}),
    ]);
    assert_eq!(next.keys().unwrap().follows(), with_result.thread());
    // Responses: reasoning and the function call are one answer; its output is the
    // client's.
    let resp = |items: Vec<Value>| {
        let mut all = vec![json!({"role":"user","content":"weather?"})];
        all.extend(items);
        read_prompt(
            Api::Responses,
            &json!({"model":"m","instructions":system,"input":all}),
        )
    };
    let asked = resp(vec![]);
    let answered = resp(vec![
        json!({"type":"reasoning","summary":[]}),
        json!({"type":"function_call","call_id":"c1","name":"weather","arguments":"{}"}),
        json!({"type":"function_call_output","call_id":"c1","output":"sunny"}),
    ]);
    assert_eq!(answered.keys().unwrap().follows(), asked.thread());
}

#[test]
fn completions_and_unreadable_prompts_have_no_thread() {
    let text = long("c");
    let completion = read_prompt(Api::Completions, &json!({"model":"m","prompt":text}));
    assert!(completion.keys().is_ok());
    assert_eq!(completion.thread(), None);
    assert_eq!(completion.keys().unwrap().follows(), None);
    let tokens = read_prompt(
        Api::ChatCompletions,
        &json!({"model":"m","messages":[{"role":"user","content":[{"type":"mystery"}]}]}),
    );
    assert!(tokens.keys().is_err());
    assert_eq!(tokens.thread(), None);
    // A prompt shorter than a block has no keys but a thread its next turn can follow.
    let short = read_prompt(
        Api::ChatCompletions,
        &json!({"model":"m","messages":[{"role":"user","content":"hi"}]}),
    );
    assert!(matches!(
        short.keys(),
        Err(NoKeys::ShorterThanABlock { .. })
    ));
    assert!(short.thread().is_some());
}

#[test]
fn threads_are_namespaced_like_keys() {
    let body = |model: &str, salt: &str| json!({"model":model,"cache_salt":salt,"messages":[{"role":"user","content":"hi"}]});
    let thread = |model, salt| read_prompt(Api::ChatCompletions, &body(model, salt)).thread();
    assert_eq!(thread("m", "a"), thread("m", "a"));
    assert_ne!(thread("m", "a"), thread("m", "b"));
    assert_ne!(thread("m", "a"), thread("n", "a"));
}

#[test]
fn roles_matter() {
    let text = long("role");
    for api in [Api::ChatCompletions, Api::Messages, Api::Responses] {
        let (user, assistant) = (
            json!({"model":"m","messages":[{"role":"user","content":text}],"input":[{"role":"user","content":text}]}),
            json!({"model":"m","messages":[{"role":"assistant","content":text}],"input":[{"role":"assistant","content":text}]}),
        );
        assert!(
            shares_no_key(&keys(api, &user), &keys(api, &assistant)),
            "{api:?}"
        );
    }
}

// ---- framing --------------------------------------------------------------------------

#[test]
fn message_boundaries_cannot_be_forged_by_text() {
    // One message whose text spells another message's role and text, and the two messages.
    let (a, b) = ("x".repeat(300), "y".repeat(300));
    let two = json!({"model":"m","messages":[{"role":"user","content":a},{"role":"assistant","content":b}]});
    for joined in [
        format!("{a}assistant{b}"),
        format!("{a}\u{0}assistant\u{1}{b}"),
        format!("{a}\u{ff}\u{1}assistant\u{ff}\u{2}{b}"),
    ] {
        let one = json!({"model":"m","messages":[{"role":"user","content":joined}]});
        assert_ne!(
            keys(Api::ChatCompletions, &two)[1..],
            keys(Api::ChatCompletions, &one)[1..]
        );
    }
    // Moving text across a part boundary changes the keys.
    let (p, q) = ("p".repeat(200), "q".repeat(200));
    let parts = |first: &str, second: &str| json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":first},{"type":"text","text":second}]}]});
    assert_ne!(
        keys(Api::ChatCompletions, &parts(&p, &format!("{q}{q}"))),
        keys(Api::ChatCompletions, &parts(&format!("{p}{q}"), &q))
    );
}

#[test]
fn control_characters_cannot_forge_a_boundary() {
    // Every control character in text: each body keys differently from the same text split
    // into two messages at that spot.
    let head = "h".repeat(300);
    for c in (0u32..0x20).chain([0x7f, 0xff]) {
        let ch = char::from_u32(c).unwrap();
        let one = json!({"model":"m","messages":[{"role":"user","content":format!("{head}{ch}user{ch}{head}")}]});
        let two = json!({"model":"m","messages":[{"role":"user","content":head},{"role":"user","content":head}]});
        assert_ne!(
            keys(Api::ChatCompletions, &one)[1..],
            keys(Api::ChatCompletions, &two)[1..],
            "{c:#x}"
        );
    }
}

#[test]
fn a_raw_ff_byte_makes_the_body_unreadable() {
    let mut body = br#"{"model":"m","prompt":"abc"#.to_vec();
    body.push(0xFF);
    body.extend_from_slice(br#""}"#);
    let prompt = key_body(&SEED, Api::Completions, &body).unwrap();
    assert!(matches!(prompt.keys(), Err(NoKeys::Unreadable { .. })));
}

// ---- media ----------------------------------------------------------------------------

#[test]
fn media_parts_key_by_uuid_when_present() {
    let text = long("m");
    let chat = |url: &str, uuid: Option<&str>| {
        let mut part = json!({"type":"image_url","image_url":{"url":url}});
        if let Some(uuid) = uuid {
            part["uuid"] = json!(uuid);
        }
        keys(
            Api::ChatCompletions,
            &json!({"model":"m","messages":[{"role":"user","content":[part,{"type":"text","text":text}]}]}),
        )
    };
    assert_eq!(
        chat("https://a/1.png", Some("img-1")),
        chat("https://b/2.png", Some("img-1"))
    );
    assert_ne!(
        chat("https://a/1.png", Some("img-1")),
        chat("https://a/1.png", Some("img-2"))
    );
    assert_ne!(chat("https://a/1.png", None), chat("https://a/2.png", None));
    assert_ne!(
        chat("https://a/1.png", None),
        chat("https://a/1.png", Some("https://a/1.png"))
    );
}

#[test]
fn media_parts_key_by_uuid_in_responses_and_messages_too() {
    let text = long("m");
    let responses = |part: Value, uuid: Option<&str>| {
        let mut part = part;
        if let Some(uuid) = uuid {
            part["uuid"] = json!(uuid);
        }
        keys(
            Api::Responses,
            &json!({"model":"m","input":[{"role":"user","content":[part,{"type":"input_text","text":text}]}]}),
        )
    };
    let image = |url: &str| json!({"type":"input_image","image_url":url});
    let file = |id: &str| json!({"type":"input_file","file_id":id});
    let audio =
        |data: &str| json!({"type":"input_audio","input_audio":{"data":data,"format":"wav"}});
    for part in [image as fn(&str) -> Value, file, audio] {
        assert_eq!(
            responses(part("a"), Some("media-1")),
            responses(part("b"), Some("media-1"))
        );
        assert_ne!(
            responses(part("a"), Some("media-1")),
            responses(part("a"), Some("media-2"))
        );
        assert_ne!(responses(part("a"), None), responses(part("b"), None));
    }

    let messages = |part: Value, uuid: Option<&str>| {
        let mut part = part;
        if let Some(uuid) = uuid {
            part["uuid"] = json!(uuid);
        }
        keys(
            Api::Messages,
            &json!({"model":"m","messages":[{"role":"user","content":[part,{"type":"text","text":text}]}]}),
        )
    };
    let image = |url: &str| json!({"type":"image","source":{"type":"url","url":url}});
    let document = |url: &str| json!({"type":"document","source":{"type":"url","url":url}});
    for part in [image as fn(&str) -> Value, document] {
        assert_eq!(
            messages(part("https://a/1"), Some("media-1")),
            messages(part("https://b/2"), Some("media-1"))
        );
        assert_ne!(
            messages(part("https://a/1"), Some("media-1")),
            messages(part("https://a/1"), Some("media-2"))
        );
        assert_ne!(
            messages(part("https://a/1"), None),
            messages(part("https://b/2"), None)
        );
    }
}

#[test]
fn an_inline_4_mib_image_costs_the_same_blocks_as_a_url() {
    let text = long("img");
    let data = format!("data:image/png;base64,{}", "QUJD".repeat(1 << 20));
    assert!(data.len() > 4 << 20);
    let chat = |url: &str| {
        json!({"model":"m","messages":[{"role":"user","content":[
            {"type":"image_url","image_url":{"url":url,"detail":"high"}},{"type":"text","text":text}]}]})
    };
    let inline = keyed(Api::ChatCompletions, &chat(&data).to_string());
    let url = keyed(
        Api::ChatCompletions,
        &chat("https://example.com/cat.png").to_string(),
    );
    assert_eq!(inline.blocks(), url.blocks());
    assert_eq!(inline.len(), url.len());

    let msgs = |source: Value| json!({"model":"m","messages":[{"role":"user","content":[{"type":"image","source":source},{"type":"text","text":text}]}]});
    let inline = keyed(
        Api::Messages,
        &msgs(json!({"type":"base64","media_type":"image/png","data":data})).to_string(),
    );
    let url = keyed(
        Api::Messages,
        &msgs(json!({"type":"url","url":"https://example.com/cat.png"})).to_string(),
    );
    assert_eq!(inline.blocks(), url.blocks());

    let resp = |image: &str| json!({"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":image},{"type":"input_text","text":text}]}]});
    let inline = keyed(Api::Responses, &resp(&data).to_string());
    let url = keyed(
        Api::Responses,
        &resp("https://example.com/cat.png").to_string(),
    );
    assert_eq!(inline.blocks(), url.blocks());
}

// ---- no keys --------------------------------------------------------------------------

#[test]
fn unknown_part_block_and_item_types_get_no_keys() {
    let text = long("u");
    let chat = json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":text},{"type":"hologram","data":"x"}]}]});
    assert!(matches!(
        no_keys(Api::ChatCompletions, &chat.to_string()),
        NoKeys::UnknownType { .. }
    ));
    let msgs = json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":text},{"type":"hologram"}]}]});
    assert!(matches!(
        no_keys(Api::Messages, &msgs.to_string()),
        NoKeys::UnknownType { .. }
    ));
    let resp = json!({"model":"m","input":[{"role":"user","content":text},{"type":"hologram_call","id":"h"}]});
    assert!(matches!(
        no_keys(Api::Responses, &resp.to_string()),
        NoKeys::UnknownType { .. }
    ));
    let part = json!({"model":"m","input":[{"role":"user","content":[{"type":"input_hologram"}]}]});
    assert!(matches!(
        no_keys(Api::Responses, &part.to_string()),
        NoKeys::UnknownType { .. }
    ));
    let no_type = json!({"model":"m","messages":[{"role":"user","content":[{"text":text}]}]});
    assert!(matches!(
        no_keys(Api::ChatCompletions, &no_type.to_string()),
        NoKeys::UnknownType { .. }
    ));
}

#[test]
fn token_id_prompts_get_no_keys() {
    assert_eq!(
        no_keys(Api::Completions, r#"{"model":"m","prompt":[1,2,3]}"#),
        NoKeys::TokenIds
    );
    assert_eq!(
        no_keys(Api::Completions, r#"{"model":"m","prompt":[[1,2],[3]]}"#),
        NoKeys::TokenIds
    );
}

#[test]
fn prompt_batches_get_no_keys() {
    let text = long("b");
    let body = json!({"model":"m","prompt":[text, text]});
    assert_eq!(no_keys(Api::Completions, &body.to_string()), NoKeys::Batch);
}

#[test]
fn a_one_string_prompt_array_keys_like_the_string() {
    let text = long("one");
    assert_eq!(
        keys(Api::Completions, &json!({"model":"m","prompt":text})),
        keys(Api::Completions, &json!({"model":"m","prompt":[text]}))
    );
}

#[test]
fn truncated_json_gets_no_keys() {
    let text = long("t");
    for (api, body) in [
        (
            Api::ChatCompletions,
            json!({"model":"m","messages":[{"role":"user","content":text}]}),
        ),
        (Api::Completions, json!({"model":"m","prompt":text})),
        (
            Api::Messages,
            json!({"model":"m","messages":[{"role":"user","content":text}]}),
        ),
        (Api::Responses, json!({"model":"m","input":text})),
    ] {
        let body = body.to_string();
        for cut in [1, body.len() / 2, body.len() - 1] {
            assert!(
                matches!(no_keys(api, &body[..cut]), NoKeys::Unreadable { .. }),
                "{api:?} {cut}"
            );
        }
        assert!(matches!(
            no_keys(api, &format!("{body} trailing")),
            NoKeys::Unreadable { .. }
        ));
        assert!(matches!(no_keys(api, "[1,2]"), NoKeys::Unreadable { .. }));
    }
}

#[test]
fn a_body_cut_after_a_backslash_gets_no_keys() {
    // Found by fuzzing: skipping a string whose last byte is a backslash stepped past the
    // end of the body and panicked.
    for api in Api::ALL {
        for body in [
            r#"{"model":"m","temperature":"\"#,
            r#"{"model":"m","x":["a\"#,
        ] {
            assert!(
                matches!(no_keys(api, body), NoKeys::Unreadable { .. }),
                "{api:?} {body}"
            );
        }
    }
}

#[test]
fn continuing_stored_state_gets_no_keys() {
    let text = long("s");
    let body = json!({"model":"m","input":text,"previous_response_id":"resp_1"});
    assert_eq!(
        no_keys(Api::Responses, &body.to_string()),
        NoKeys::StoredState {
            field: "previous_response_id"
        }
    );
    let body = json!({"model":"m","input":text,"conversation":{"id":"conv_1"}});
    assert_eq!(
        no_keys(Api::Responses, &body.to_string()),
        NoKeys::StoredState {
            field: "conversation"
        }
    );
    let body = json!({"model":"m","input":[{"type":"item_reference","id":"msg_1"},{"role":"user","content":text}]});
    assert!(matches!(
        no_keys(Api::Responses, &body.to_string()),
        NoKeys::StoredState { .. }
    ));
    // Null means not given.
    let body = json!({"model":"m","input":text,"previous_response_id":null,"conversation":null});
    assert!(!keys(Api::Responses, &body).is_empty());
}

#[test]
fn prompts_shorter_than_a_block_get_no_keys() {
    assert!(matches!(
        no_keys(
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
        ),
        NoKeys::ShorterThanABlock { .. }
    ));
    assert_eq!(
        no_keys(Api::ChatCompletions, r#"{"model":"m"}"#),
        NoKeys::NoPrompt
    );
}

#[test]
fn duplicate_routing_fields_are_refused() {
    for field in [
        "model",
        "messages",
        "input",
        "prompt",
        "previous_response_id",
        "conversation",
    ] {
        let body = format!(r#"{{"{field}":"a","x":1,"{field}":"b"}}"#);
        for api in Api::ALL {
            let err = key_body(&SEED, api, body.as_bytes()).unwrap_err();
            assert_eq!(err.field, field);
        }
    }
    // Other duplicated fields are left to the engine.
    let body = r#"{"model":"m","temperature":1,"temperature":2,"prompt":"x"}"#;
    assert!(key_body(&SEED, Api::Completions, body.as_bytes()).is_ok());
}

// ---- long prompts ---------------------------------------------------------------------

#[test]
fn keys_stop_at_512() {
    let text = "z".repeat(6 << 20);
    let keys = keyed(
        Api::Completions,
        &json!({"model":"m","prompt":text}).to_string(),
    );
    assert_eq!(keys.len(), MAX_KEYS);
    assert!(keys.blocks() > 24_000, "blocks count the whole stream");
    assert!(keys.total_covered_bytes() > 4_000_000);
    assert!(keys.total_covered_bytes() < 6 << 20);
}

#[test]
fn prompts_that_differ_only_after_512_kib_get_different_keys() {
    let head = "h".repeat(600 * 1024);
    let a = keys(
        Api::Completions,
        &json!({"model":"m","prompt":format!("{head}{}", "a".repeat(64 * 1024))}),
    );
    let b = keys(
        Api::Completions,
        &json!({"model":"m","prompt":format!("{head}{}", "b".repeat(64 * 1024))}),
    );
    assert_eq!(a.len(), b.len());
    assert_ne!(a.last(), b.last());
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(
        shared > 256,
        "the shared 600 KiB head still matches: {shared}"
    );
}

#[test]
fn covered_bytes_grow_with_strides_past_the_dense_head() {
    let keys = keyed(
        Api::Completions,
        &json!({"model":"m","prompt":"w".repeat(1 << 20)}).to_string(),
    );
    assert_eq!(keys.covered_bytes(1), BLOCK_BYTES as u64);
    assert_eq!(keys.covered_bytes(256), 256 * BLOCK_BYTES as u64);
    assert_eq!(keys.covered_bytes(257), 258 * BLOCK_BYTES as u64);
    assert!(keys.covered_bytes(keys.len()) <= (1 << 20) + 256);
}

// ---- vLLM and Anthropic specifics -----------------------------------------------------

#[test]
fn vllm_template_fields_count_and_generation_flags_do_not() {
    let text = long("v");
    let base = json!({"model":"m","messages":[{"role":"user","content":text}]});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        keys(Api::ChatCompletions, &b)
    };
    let plain = keys(Api::ChatCompletions, &base);
    assert_ne!(with("chat_template", json!("{{ messages }}")), plain);
    assert_ne!(
        with("chat_template_kwargs", json!({"enable_thinking": false})),
        plain
    );
    assert_ne!(with("documents", json!([{"title":"t","text":"x"}])), plain);
    assert_eq!(with("add_generation_prompt", json!(false)), plain);
    assert_eq!(with("continue_final_message", json!(true)), plain);
    assert_eq!(
        with("tools", json!([])),
        plain,
        "an empty tool list is no tool list"
    );
}

#[test]
fn anthropic_tool_results_key_their_error_flag() {
    let text = long("e");
    let body = |is_error: bool| {
        json!({"model":"m","messages":[{"role":"user","content":text},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":text}],"is_error":is_error}]},
            {"role":"assistant","content":text}]})
    };
    assert_ne!(
        keys(Api::Messages, &body(true)),
        keys(Api::Messages, &body(false))
    );
}

#[test]
fn the_model_is_reported_even_without_keys() {
    let prompt = key_body(
        &SEED,
        Api::Completions,
        br#"{"model":"llama","prompt":[1,2]}"#,
    )
    .unwrap();
    assert_eq!(prompt.model(), Some("llama"));
    let debug = format!("{prompt:?}");
    assert!(debug.contains("TokenIds"), "{debug}");
}

#[test]
fn debug_prints_no_keys() {
    let text = long("d");
    let prompt = key_body(
        &SEED,
        Api::Completions,
        json!({"model":"m","prompt":text}).to_string().as_bytes(),
    )
    .unwrap();
    let debug = format!("{prompt:?}");
    let chat = prompt_of_turns();
    let chat_debug = format!("{chat:?}");
    let thread = chat.thread().unwrap().as_u64();
    assert!(
        !chat_debug.contains(&thread.to_string()) && !chat_debug.contains(&format!("{thread:x}"))
    );
    let follows = chat.keys().unwrap().follows().unwrap().as_u64();
    assert!(
        !chat_debug.contains(&follows.to_string()) && !chat_debug.contains(&format!("{follows:x}"))
    );
    for key in prompt.keys().unwrap().as_slice() {
        assert!(!debug.contains(&key.to_string()) && !debug.contains(&format!("{key:x}")));
    }
    assert!(!debug.contains("Keys must"));
}

/// A second turn, with a thread and one it follows.
fn prompt_of_turns() -> grid_route_layer::route::Prompt {
    let text = long("d");
    read_prompt(
        Api::ChatCompletions,
        &json!({"model":"m","messages":[{"role":"user","content":text},{"role":"assistant","content":"a"},{"role":"user","content":"b"}]}),
    )
}

#[test]
fn with_affinity_off_only_the_model_is_read_and_duplicates_are_still_refused() {
    let prompt = grid_route_layer::keying::read_model(
        br#"{"messages":[{"role":"user","content":"hi"}],"model":"m"}"#,
    )
    .unwrap();
    assert_eq!(prompt.model(), Some("m"));
    assert_eq!(prompt.keys().unwrap_err(), &NoKeys::Disabled);
    let duplicate =
        grid_route_layer::keying::read_model(br#"{"model":"a","model":"b"}"#).unwrap_err();
    assert_eq!(duplicate.field, "model");
}

#[test]
fn a_duplicate_before_an_unreadable_value_is_refused_with_affinity_on_or_off() {
    // Found by the `keying` fuzz target: `read_model` read the value before checking the
    // name, so with affinity off this body routed by its first model instead of a 400.
    let body = br#"{"model":"a","model":{"#;
    for api in Api::ALL {
        assert_eq!(key_body(&SEED, api, body).unwrap_err().field, "model");
    }
    let duplicate = grid_route_layer::keying::read_model(body).unwrap_err();
    assert_eq!(duplicate.field, "model");
}

/// The session of a body, keyed under the test seed.
fn session(api: Api, body: &Value) -> Option<grid_route_layer::keying::SessionKey> {
    key_body(&SEED, api, body.to_string().as_bytes())
        .expect("no duplicate fields")
        .session()
}

#[test]
fn the_session_is_prompt_cache_key_or_anthropic_metadata_user_id_and_not_part_of_the_prompt() {
    let sys = long("sys");
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": sys}]});
    let completions = json!({"model": "m", "prompt": sys});
    let responses = json!({"model": "m", "input": sys});
    let messages = json!({"model": "m", "messages": [{"role": "user", "content": sys}]});
    for (api, base) in [
        (Api::ChatCompletions, &chat),
        (Api::Completions, &completions),
        (Api::Responses, &responses),
    ] {
        let mut with = base.clone();
        with["prompt_cache_key"] = json!("conv-1");
        assert!(session(api, base).is_none(), "{api:?}");
        assert!(session(api, &with).is_some(), "{api:?}");
        // The three OpenAI APIs name one session alike.
        assert_eq!(
            session(api, &with),
            session(Api::ChatCompletions, &{
                let mut chat = chat.clone();
                chat["prompt_cache_key"] = json!("conv-1");
                chat
            })
        );
        // The key routes; it is not prompt.
        assert_eq!(keys(api, base), keys(api, &with), "{api:?}");
        // Not a string, or empty: no session.
        for none in [json!(""), json!(7), json!(null), json!({"id": "x"})] {
            with["prompt_cache_key"] = none;
            assert!(session(api, &with).is_none(), "{api:?}");
        }
        // In Anthropic's place, `metadata`, an OpenAI body names no session.
        let mut metadata = base.clone();
        metadata["metadata"] = json!({"user_id": "conv-1"});
        assert!(session(api, &metadata).is_none(), "{api:?}");
    }
    let mut with = messages.clone();
    with["metadata"] = json!({"user_id": "user_1_account_2_session_3"});
    let claude = session(Api::Messages, &with);
    assert!(claude.is_some());
    assert_eq!(keys(Api::Messages, &messages), keys(Api::Messages, &with));
    with["metadata"] = json!({"user_id": "user_1_account_2_session_4"});
    assert_ne!(session(Api::Messages, &with), claude);
    for none in [
        json!({}),
        json!({"user_id": 5}),
        json!("user_1"),
        json!([1]),
    ] {
        with["metadata"] = none;
        assert!(session(Api::Messages, &with).is_none());
        // A `metadata` the keying cannot use changes nothing else.
        assert_eq!(keys(Api::Messages, &messages), keys(Api::Messages, &with));
    }
}

#[test]
fn a_session_is_namespaced_by_model_and_cache_salt() {
    let with = |model: &str, salt: Option<&str>| {
        let mut body = json!({"model": model, "prompt": long("p"), "prompt_cache_key": "k"});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        session(Api::Completions, &body)
    };
    assert_eq!(with("a", None), with("a", None));
    assert_ne!(with("a", None), with("b", None));
    assert_ne!(with("a", None), with("a", Some("tenant-1")));
    assert_ne!(with("a", Some("tenant-1")), with("a", Some("tenant-2")));
    // Another seed keys the same id apart.
    let body = json!({"model": "a", "prompt": long("p"), "prompt_cache_key": "k"}).to_string();
    let other = key_body(&KeySeed::random(), Api::Completions, body.as_bytes()).unwrap();
    assert_ne!(other.session(), with("a", None));
}

#[test]
fn a_body_that_cannot_be_keyed_still_names_its_session() {
    for body in [
        json!({"model": "m", "prompt": [1, 2, 3], "prompt_cache_key": "k"}),
        json!({"model": "m", "prompt": "short", "prompt_cache_key": "k"}),
    ] {
        let prompt = key_body(&SEED, Api::Completions, body.to_string().as_bytes()).unwrap();
        assert!(prompt.keys().is_err());
        assert!(prompt.session().is_some());
    }
    // Debug prints neither the id nor its key.
    let body = json!({"model": "m", "prompt": "short", "prompt_cache_key": "secret-conv"});
    let prompt = key_body(&SEED, Api::Completions, body.to_string().as_bytes()).unwrap();
    let printed = format!("{prompt:?} {:?}", prompt.session().unwrap());
    assert!(!printed.contains("secret"), "{printed}");
    let key = prompt.session().unwrap().as_u64();
    assert!(!printed.contains(&key.to_string()) && !printed.contains(&format!("{key:x}")));
}

// ---- conversation openings ------------------------------------------------------------

#[test]
fn a_prompt_with_no_earlier_answer_opens_a_conversation_and_one_with_an_answer_continues_it() {
    let sys = long("sys");
    // Whether it opens one; for the prompts of a conversation API, continuing is the
    // opposite.
    let opens = |api: Api, body: Value| {
        let keys = keyed(api, &body.to_string());
        assert_ne!(
            keys.opens_conversation(),
            keys.continues_conversation(),
            "{body}"
        );
        keys.opens_conversation()
    };
    let chat = |messages: Value| json!({"model": "m", "messages": messages});
    assert!(opens(
        Api::ChatCompletions,
        chat(json!([{"role": "system", "content": sys}, {"role": "user", "content": "hi"}]))
    ));
    for answered in [
        json!({"role": "assistant", "content": "hello"}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "42"}),
        json!({"role": "function", "name": "f", "content": "42"}),
    ] {
        let body = chat(
            json!([{"role": "user", "content": sys}, answered, {"role": "user", "content": "and?"}]),
        );
        assert!(!opens(Api::ChatCompletions, body.clone()), "{body}");
    }
    let messages = |messages: Value| json!({"model": "m", "max_tokens": 8, "system": sys, "messages": messages});
    assert!(opens(
        Api::Messages,
        messages(json!([{"role": "user", "content": "hi"}]))
    ));
    assert!(!opens(
        Api::Messages,
        messages(json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and?"}
        ]))
    ));
    let responses = |input: Value| json!({"model": "m", "instructions": sys, "input": input});
    assert!(opens(Api::Responses, responses(json!("hi"))));
    assert!(opens(
        Api::Responses,
        responses(json!([{"role": "user", "content": "hi"}]))
    ));
    for answered in [
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}),
        json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "42"}),
    ] {
        let body = responses(json!([{"role": "user", "content": "hi"}, answered]));
        assert!(!opens(Api::Responses, body.clone()), "{body}");
    }
    // A Completions prompt is one text: whether it opens or continues a conversation
    // cannot be told, so it does neither.
    let completion = keyed(
        Api::Completions,
        &json!({"model": "m", "prompt": sys}).to_string(),
    );
    assert!(!completion.opens_conversation() && !completion.continues_conversation());
}
