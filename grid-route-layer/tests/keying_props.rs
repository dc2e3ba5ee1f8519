//! Property tests: keys do not depend on field order, nor on how the text is split into
//! runs by escapes (and so where runs meet block boundaries).

use std::fmt::Write as _;
use std::sync::LazyLock;

use grid_route_layer::keying::{Api, KeySeed, key_body};
use proptest::prelude::*;

static SEED: LazyLock<KeySeed> = LazyLock::new(KeySeed::random);

fn prop_keys(api: Api, body: &str) -> Vec<u64> {
    let prompt = key_body(&SEED, api, body.as_bytes()).expect("no duplicates");
    prompt.keys().expect("keys").as_slice().to_vec()
}

/// A JSON string literal for `text`, escaping each character either minimally or, where
/// `escape_all[i]` says so, as `\uXXXX` (surrogate pairs above the BMP).
fn literal(text: &str, escape: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in text.chars().enumerate() {
        let forced = escape.get(i).copied().unwrap_or(false);
        match c {
            '"' if !forced => out.push_str("\\\""),
            '\\' if !forced => out.push_str("\\\\"),
            '/' if !forced => out.push_str("\\/"),
            c if forced || (c as u32) < 0x20 => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Mostly ASCII words, with quotes, backslashes, control characters and multi-byte text.
    proptest::collection::vec(
        prop_oneof![
            8 => "[a-z ]{1,12}",
            1 => Just("\"".to_string()),
            1 => Just("\\".to_string()),
            1 => Just("\n\t\u{1}".to_string()),
            1 => Just("é😀中".to_string()),
        ],
        100..300,
    )
    .prop_map(|parts| format!("{}{}", "p".repeat(256), parts.concat()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn escaping_and_run_boundaries_do_not_change_the_keys(
        text in text_strategy(),
        escape in proptest::collection::vec(any::<bool>(), 0..2000),
    ) {
        let plain = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{}}}]}}"#, literal(&text, &[]));
        let escaped = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{}}}]}}"#, literal(&text, &escape));
        prop_assert_eq!(prop_keys(Api::ChatCompletions, &plain), prop_keys(Api::ChatCompletions, &escaped));
    }

    #[test]
    fn field_order_does_not_change_the_keys(
        text in text_strategy(),
        top in Just((0..5).collect::<Vec<usize>>()).prop_shuffle(),
        inner in Just((0..3).collect::<Vec<usize>>()).prop_shuffle(),
    ) {
        let content = literal(&text, &[]);
        let message = |order: &[usize]| {
            let fields = [
                r#""role":"user""#.to_string(),
                format!(r#""content":{content}"#),
                r#""name":"ann""#.to_string(),
            ];
            let picked: Vec<&str> = order.iter().map(|&i| fields[i].as_str()).collect();
            format!("{{{}}}", picked.join(","))
        };
        let body = |top: &[usize], inner: &[usize]| {
            let fields = [
                r#""model":"m""#.to_string(),
                format!(r#""messages":[{},{}]"#, message(inner), message(&[0, 1, 2])),
                r#""tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]"#.to_string(),
                r#""temperature":0.5"#.to_string(),
                r#""cache_salt":"s""#.to_string(),
            ];
            let picked: Vec<&str> = top.iter().map(|&i| fields[i].as_str()).collect();
            format!("{{{}}}", picked.join(","))
        };
        prop_assert_eq!(
            prop_keys(Api::ChatCompletions, &body(&[0, 1, 2, 3, 4], &[0, 1, 2])),
            prop_keys(Api::ChatCompletions, &body(&top, &inner))
        );
    }
}
