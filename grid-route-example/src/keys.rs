//! `grid-route-example keys --api API FILE...`: prints each body's prefix keys.
//!
//! One JSON line per file, all files keyed in one process (keys are only comparable under
//! one per-process seed):
//!
//! - `{"file":F,"keys":["<16 hex>",...],"blocks":N}`, `blocks` being the full 256-byte
//!   blocks of the canonical stream (past the 512th key too);
//! - `{"file":F,"keys":null,"reason":"..."}` when the body gets no keys, including a body a
//!   gateway would refuse with a 400 (a duplicated routing field) and a file that cannot
//!   be read. The command then exits with status 1 only for unreadable files.
//!
//! Keys are printed for inspection (comparing two bodies, checking a prefix); a gateway
//! never logs or exports them.

use std::io::Write;
use std::path::Path;

use grid_route_layer::keying::{Api, KeySeed, key_body};
use serde_json::{Value, json};

/// Usage of the `keys` command.
pub const USAGE: &str =
    "usage: grid-route-example keys --api chat|completions|messages|responses FILE...

Prints one JSON line per file: {\"file\":F,\"keys\":[\"<16 hex>\",...],\"blocks\":N}, or
{\"file\":F,\"keys\":null,\"reason\":\"...\"} when the body gets no keys.
";

/// The parsed command line of `keys`.
#[derive(Debug, PartialEq, Eq)]
pub struct KeysArgs {
    /// The request format of every file.
    pub api: Api,
    /// The files, in order.
    pub files: Vec<String>,
}

/// Parses `--api API FILE...` (also `--api=API`).
pub fn parse_args(args: &[String]) -> Result<KeysArgs, String> {
    let mut api = None;
    let mut files = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if let Some(value) = arg.strip_prefix("--api=") {
            api = Some(value.parse::<Api>()?);
        } else if arg == "--api" {
            let value = args.next().ok_or("--api needs a value")?;
            api = Some(value.parse::<Api>()?);
        } else if arg.starts_with("--") {
            return Err(format!("unknown option {arg:?}"));
        } else {
            files.push(arg.clone());
        }
    }
    let api = api.ok_or("--api is required")?;
    if files.is_empty() {
        return Err("at least one FILE is required".into());
    }
    Ok(KeysArgs { api, files })
}

/// The JSON line for one body.
pub fn line_for_body(seed: &KeySeed, api: Api, file: &str, body: &[u8]) -> Value {
    match key_body(seed, api, body) {
        Ok(prompt) => match prompt.keys() {
            Ok(keys) => json!({
                "file": file,
                "keys": keys.as_slice().iter().map(|k| format!("{k:016x}")).collect::<Vec<_>>(),
                "blocks": keys.blocks(),
            }),
            Err(reason) => json!({"file": file, "keys": null, "reason": reason.to_string()}),
        },
        Err(duplicate) => json!({
            "file": file,
            "keys": null,
            "reason": format!("{duplicate} (a gateway answers 400)"),
        }),
    }
}

/// Runs the command, writing lines to `out`. Returns whether every file could be read.
pub fn run(args: &KeysArgs, out: &mut impl Write) -> std::io::Result<bool> {
    let seed = KeySeed::random();
    let mut all_read = true;
    for file in &args.files {
        let line = match std::fs::read(Path::new(file)) {
            Ok(body) => line_for_body(&seed, args.api, file, &body),
            Err(error) => {
                all_read = false;
                json!({"file": file, "keys": null, "reason": format!("cannot read the file: {error}")})
            }
        };
        writeln!(out, "{line}")?;
    }
    Ok(all_read)
}
