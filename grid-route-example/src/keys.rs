//! `grid-route-example keys --api API FILE...`: prints each body's prefix keys.
//!
//! One JSON line per file, all files keyed in one process (keys are only comparable under
//! one per-process seed):
//!
//! - `{"file":F,"keys":["<16 hex>",...],"blocks":N}`, `blocks` being the full 256-byte
//!   blocks of the canonical stream (past the 512th key too);
//! - `{"file":F,"keys":null,"reason":"..."}` when the body gets no keys, including a body a
//!   gateway would refuse with a 400 (a duplicated routing field) and a file that cannot
//!   be read. The command exits with status 1 when a file cannot be read or is not JSON
//!   (after printing every line).
//!
//! Keys are printed for inspection (comparing two bodies, checking a prefix); a gateway
//! never logs or exports them.

use std::io::Write;
use std::path::Path;

use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use grid_route_layer::keying::{Api, KeySeed, key_body};

/// The arguments of `grid-route-example keys`.
#[derive(Debug, PartialEq, Eq, clap::Args)]
pub struct KeysArgs {
    /// The request format of every file.
    // The names are the library's (`Api::name`): the library does not depend on clap, so
    // `Api` cannot derive `ValueEnum`; the possible values still show in help and errors.
    #[arg(
        long,
        value_name = "API",
        value_parser = PossibleValuesParser::new(Api::ALL.map(Api::name)).try_map(|name| name.parse::<Api>()),
    )]
    pub api: Api,
    /// The request bodies, keyed in this order under one seed.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<String>,
}

/// One output line. Fields serialise in declaration order, the documented
/// `file`, `keys`, then `blocks` or `reason`.
#[derive(Debug, serde::Serialize)]
pub struct Line {
    /// The file as named on the command line.
    pub file: String,
    /// The keys as 16 hex digits each, or `None` when the body gets none.
    pub keys: Option<Vec<String>>,
    /// Full blocks of the canonical stream, when keyed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
    /// Why the body gets no keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the file could be read as JSON at all (a missing or non-JSON file makes the
    /// command fail).
    #[serde(skip)]
    pub readable: bool,
}

impl Line {
    fn no_keys(file: &str, reason: String, readable: bool) -> Self {
        Self {
            file: file.to_owned(),
            keys: None,
            blocks: None,
            reason: Some(reason),
            readable,
        }
    }
}

/// The line for one body.
pub fn line_for_body(seed: &KeySeed, api: Api, file: &str, body: &[u8]) -> Line {
    match key_body(seed, api, body) {
        Ok(prompt) => match prompt.keys() {
            Ok(keys) => Line {
                file: file.to_owned(),
                keys: Some(
                    keys.as_slice()
                        .iter()
                        .map(|k| format!("{k:016x}"))
                        .collect(),
                ),
                blocks: Some(keys.blocks()),
                reason: None,
                readable: true,
            },
            Err(reason) => {
                // Keying stops at the first thing it cannot follow; whether the file is JSON
                // at all is a separate, full check (only for the CLI's exit status).
                let readable = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
                Line::no_keys(file, reason.to_string(), readable)
            }
        },
        Err(duplicate) => Line::no_keys(file, format!("{duplicate} (a gateway answers 400)"), true),
    }
}

/// Runs the command, writing lines to `out`. Returns whether every file could be read as JSON.
pub fn run(args: &KeysArgs, out: &mut impl Write) -> std::io::Result<bool> {
    let seed = KeySeed::random();
    let mut all_read = true;
    for file in &args.files {
        let line = match std::fs::read(Path::new(file)) {
            Ok(body) => line_for_body(&seed, args.api, file, &body),
            Err(error) => Line::no_keys(file, format!("cannot read the file: {error}"), false),
        };
        all_read &= line.readable;
        serde_json::to_writer(&mut *out, &line)?;
        writeln!(out)?;
    }
    Ok(all_read)
}
