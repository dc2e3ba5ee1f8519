//! The keying entry point: a request body in, its model and prefix keys out.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::canonical;
use super::scan::TextSink;
use super::scan::{Kind, OwnedText, Scanner, Span, Unreadable};
use super::stream::{BLOCK_BYTES, BlockChain, KEY_BLOCKS, KeySeed, Marker, Threads, join, marker};
use super::walk;
use super::{chat, completions, messages, responses};
use crate::route::Prompt;

/// The request formats that get prefix keys.
///
/// `#[non_exhaustive]`: more request formats may be keyed later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Api {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI (legacy) Completions, `POST /v1/completions`.
    Completions,
    /// Anthropic Messages, `POST /v1/messages`.
    Messages,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
}

impl Api {
    /// Every keyed API.
    pub const ALL: [Api; 4] = [
        Api::ChatCompletions,
        Api::Completions,
        Api::Messages,
        Api::Responses,
    ];

    /// The API served at `path` (exact match), if it is keyed.
    pub fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|api| api.path() == path)
    }

    /// The API a request asks a prompt of: a `POST` to its path. `method` is the
    /// request's method as `http::Method::as_str` spells it. Keying reads such a request's
    /// body for its prompt, and engine feedback reads only such a request's answer.
    ///
    /// ```
    /// use grid_route_layer::keying::Api;
    ///
    /// assert_eq!(Api::of_request("POST", "/v1/responses"), Some(Api::Responses));
    /// // Reading back a stored response prompts nothing.
    /// assert_eq!(Api::of_request("GET", "/v1/responses"), None);
    /// assert_eq!(Api::of_request("POST", "/v1/responses/resp_1/cancel"), None);
    /// ```
    pub fn of_request(method: &str, path: &str) -> Option<Self> {
        Self::from_path(path).filter(|_| method == "POST")
    }

    /// The request path of the API.
    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }

    /// The short name used on the command line: `chat`, `completions`, `messages`,
    /// `responses`.
    pub fn name(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }
}

impl FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|api| api.name() == s)
            .ok_or_else(|| {
                format!("unknown api {s:?}; expected chat, completions, messages or responses")
            })
    }
}

/// A request's prefix keys: key `i` stands for the canonical stream up to the end of the
/// block it was taken at, so a cluster that holds key `i` was sent that whole prefix.
///
/// `Debug` prints counts only.
#[derive(Clone, PartialEq, Eq)]
pub struct PrefixKeys {
    keys: Arc<[u64]>,
    blocks: u64,
    /// Whether the turns open a conversation; `None` when that cannot be told.
    opens: Option<bool>,
    /// The thread of the prompt the model's last answer in the turns answered.
    follows: Option<SessionKey>,
}

impl PrefixKeys {
    pub(crate) fn new(keys: Vec<u64>, blocks: u64) -> Self {
        Self {
            keys: keys.into(),
            blocks,
            opens: None,
            follows: None,
        }
    }

    /// These keys, continuing the prompt whose [`Prompt::thread`] is `follows` (see
    /// [`follows`](Self::follows)). The simulator gives a replayed conversation's later
    /// turn the thread of its turn before, as the gateway would key it.
    #[must_use]
    pub fn following(mut self, follows: Option<SessionKey>) -> Self {
        self.follows = follows;
        self
    }

    /// The [`Prompt::thread`] of the prompt this one continues: everything before the
    /// last run of the model's turns (its answer, tool calls, reasoning), which is the
    /// prompt that answer was given to when the client sends its history back as it was.
    /// `None` for a prompt that holds no answer of the model's, and for Completions.
    ///
    /// The index holds each answered prompt's thread where it was answered, so a later turn
    /// finds where its conversation was last served even when its own keys match a head
    /// other conversations share just as deep elsewhere: keys stop at whole 256-byte
    /// blocks, threads at the last byte.
    ///
    /// ```
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    ///
    /// let seed = KeySeed::random();
    /// let system = "You answer questions about the grid. ".repeat(20);
    /// let chat = |messages: &str| {
    ///     let body = format!(r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{messages}]}}"#);
    ///     key_body(&seed, Api::ChatCompletions, body.as_bytes()).unwrap()
    /// };
    /// let first = chat(r#"{"role":"user","content":"hi"}"#);
    /// let second = chat(r#"{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"and?"}"#);
    /// assert_eq!(second.keys().unwrap().follows(), first.thread());
    /// assert!(first.keys().unwrap().follows().is_none());
    /// // Another conversation behind the same system prompt: same keys, another thread.
    /// let other = chat(r#"{"role":"user","content":"ho"}"#);
    /// assert_eq!(other.keys(), first.keys());
    /// assert_ne!(other.thread(), first.thread());
    /// ```
    pub fn follows(&self) -> Option<SessionKey> {
        self.follows
    }

    /// These keys, marked as opening a conversation or continuing one (see
    /// [`opens_conversation`](Self::opens_conversation) and
    /// [`continues_conversation`](Self::continues_conversation)). Keys built by
    /// [`from_block_digests`](Self::from_block_digests) are neither, until marked.
    #[must_use]
    pub fn opening(mut self, opens: bool) -> Self {
        self.opens = Some(opens);
        self
    }

    /// Whether the prompt opens a conversation: it holds no earlier answer of the model (no
    /// `assistant` message, tool call, tool result or reasoning). Such a prompt can match
    /// other conversations' shared head (a system prompt), never its own history. A
    /// Completions prompt, one text, is never taken for one.
    ///
    /// ```
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    ///
    /// let seed = KeySeed::random();
    /// let system = "You answer questions about the grid. ".repeat(20);
    /// let opens = |messages: &str| {
    ///     let body = format!(r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{messages}]}}"#);
    ///     let prompt = key_body(&seed, Api::ChatCompletions, body.as_bytes()).unwrap();
    ///     prompt.keys().unwrap().opens_conversation()
    /// };
    /// assert!(opens(r#"{"role":"user","content":"hi"}"#));
    /// assert!(!opens(r#"{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"and?"}"#));
    /// ```
    pub fn opens_conversation(&self) -> bool {
        self.opens == Some(true)
    }

    /// Whether the prompt continues a conversation: it holds an earlier answer of the
    /// model. Its match beyond a shared head is its own history, which no other
    /// conversation will ask for. A Completions prompt, one text, is never taken for one
    /// either: neither is ever true of it.
    ///
    /// ```
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    ///
    /// let seed = KeySeed::random();
    /// let text = "You answer questions about the grid. ".repeat(20);
    /// let keys = |api, body: String| key_body(&seed, api, body.as_bytes()).unwrap().keys().unwrap().clone();
    /// let chat = |messages: &str| keys(Api::ChatCompletions, format!(r#"{{"model":"m","messages":[{{"role":"system","content":"{text}"}},{messages}]}}"#));
    /// assert!(chat(r#"{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"and?"}"#).continues_conversation());
    /// assert!(!chat(r#"{"role":"user","content":"hi"}"#).continues_conversation());
    /// let completion = keys(Api::Completions, format!(r#"{{"model":"m","prompt":"{text}"}}"#));
    /// assert!(!completion.continues_conversation() && !completion.opens_conversation());
    /// ```
    pub fn continues_conversation(&self) -> bool {
        self.opens == Some(false)
    }

    /// The keys of a prompt whose 256-byte blocks were hashed elsewhere — a trace's block
    /// ids, an engine's block hashes — picked with the same stride rule as [`key_body`]:
    /// `digests[i]` is the value of block `i` and must stand for the whole prompt up to the
    /// end of that block (chained), as a key does. `None` when there is no block.
    ///
    /// The simulator uses it to give a replayed trace the keys the gateway would compute, so
    /// the index and the affinity rule see a trace request as they see a live one: one key a
    /// block for the first 256 blocks, then strided, at most [`MAX_KEYS`](super::MAX_KEYS),
    /// priced by [`covered_bytes`](Self::covered_bytes).
    ///
    /// ```
    /// use grid_route_layer::keying::{BLOCK_BYTES, MAX_KEYS, PrefixKeys};
    ///
    /// // A 2 MiB prompt: 8192 blocks, each digest standing for its whole prefix.
    /// let digests: Vec<u64> = (0..8192).map(|block| 0x9e37_79b9 ^ block).collect();
    /// let keys = PrefixKeys::from_block_digests(&digests).unwrap();
    /// assert_eq!(keys.blocks(), 8192);
    /// assert_eq!(&keys.as_slice()[..3], &digests[..3]);
    /// assert!(keys.len() < MAX_KEYS);
    /// // A match of the first ten keys saves ten blocks of prefill.
    /// assert_eq!(keys.covered_bytes(10), 10 * BLOCK_BYTES as u64);
    ///
    /// assert!(PrefixKeys::from_block_digests(&[]).is_none());
    /// ```
    pub fn from_block_digests(digests: &[u64]) -> Option<Self> {
        if digests.is_empty() {
            return None;
        }
        let keys = KEY_BLOCKS
            .iter()
            .map(|&b| b as usize)
            .take_while(|&b| b < digests.len())
            .map(|b| digests[b])
            .collect();
        Some(Self::new(keys, digests.len() as u64))
    }

    /// The keys, head first.
    pub fn as_slice(&self) -> &[u64] {
        &self.keys
    }

    /// Number of keys (at most [`MAX_KEYS`](super::MAX_KEYS)).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no keys (never true for a keyed request).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Full blocks of the canonical stream, including those past the last key.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Bytes of the canonical stream that the first `depth` keys stand for. Past the dense
    /// head keys are strided, so this, not `depth`, measures how much prefill a match saves.
    pub fn covered_bytes(&self, depth: usize) -> u64 {
        match depth.min(self.keys.len()) {
            0 => 0,
            d => (u64::from(KEY_BLOCKS[d - 1]) + 1) * BLOCK_BYTES as u64,
        }
    }

    /// Bytes of the canonical stream that all the keys stand for.
    pub fn total_covered_bytes(&self) -> u64 {
        self.covered_bytes(self.keys.len())
    }
}

impl fmt::Debug for PrefixKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixKeys")
            .field("len", &self.keys.len())
            .field("blocks", &self.blocks)
            .field("covered_bytes", &self.total_covered_bytes())
            .field("opens", &self.opens)
            .field("follows", &self.follows.is_some())
            .finish()
    }
}

/// A request's session: the id a client gave to say which requests belong together
/// (`prompt_cache_key`, Anthropic `metadata.user_id`, or a session header), keyed under the
/// [`KeySeed`] and namespaced by `model` and `cache_salt` like the prefix keys, so two
/// tenants that pick the same id never share a session.
///
/// `Debug` prints nothing of the value: like a prefix key it stands for client data.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionKey(u64);

impl SessionKey {
    /// A session key hashed elsewhere (a trace's conversation id): the simulator gives
    /// replayed requests the session a gateway would have keyed.
    pub fn from_digest(digest: u64) -> Self {
        Self(digest)
    }

    /// The key as the index stores it.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// Why a request gets no keys and routes on load alone.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoKeys {
    /// The body is not JSON the keying can follow.
    Unreadable {
        /// Byte offset where reading stopped (0 when not known).
        offset: usize,
        /// What was expected there.
        expected: &'static str,
    },
    /// The body has no prompt (`messages`, `input` or `prompt`).
    NoPrompt,
    /// The prompt is given as token ids.
    TokenIds,
    /// The Completions `prompt` is a batch of several prompts.
    Batch,
    /// A content part, block or item of a type the keying does not know.
    UnknownType {
        /// Which kind of thing had the unknown type.
        place: &'static str,
        /// The type's name when it reads as one (at most 40 ASCII letters, digits and
        /// `_ - . /`), else its length: it is client text.
        name: Box<str>,
    },
    /// A Responses request that continues stored state the gateway cannot see.
    StoredState {
        /// The field that names the state.
        field: &'static str,
    },
    /// Prefix affinity is switched off, so the prompt was not read.
    Disabled,
    /// The canonical stream is shorter than one block.
    ShorterThanABlock {
        /// Bytes of canonical stream.
        bytes: u64,
    },
}

impl NoKeys {
    pub(crate) fn unreadable(expected: &'static str) -> Self {
        NoKeys::Unreadable {
            offset: 0,
            expected,
        }
    }
}

impl From<Unreadable> for NoKeys {
    fn from(u: Unreadable) -> Self {
        NoKeys::Unreadable {
            offset: u.offset,
            expected: u.expected,
        }
    }
}

impl fmt::Display for NoKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoKeys::Unreadable { offset, expected } => {
                write!(f, "unreadable JSON: expected {expected} at byte {offset}")
            }
            NoKeys::NoPrompt => f.write_str("no prompt in the body"),
            NoKeys::TokenIds => f.write_str("prompt given as token ids"),
            NoKeys::Batch => f.write_str("prompt is a batch of several prompts"),
            NoKeys::UnknownType { place, name } => write!(f, "unknown {place} type {name:?}"),
            NoKeys::StoredState { field } => {
                write!(f, "continues stored state named by {field}")
            }
            NoKeys::Disabled => f.write_str("prefix affinity is switched off"),
            NoKeys::ShorterThanABlock { bytes } => write!(
                f,
                "canonical prompt of {bytes} bytes is shorter than one {BLOCK_BYTES}-byte block"
            ),
        }
    }
}

/// A top-level field that routing depends on was given twice; the request is refused with
/// a 400 rather than guessing which copy the engine will read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DuplicateField {
    /// The field's name.
    pub field: &'static str,
}

impl fmt::Display for DuplicateField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the top-level field '{}' is given more than once",
            self.field
        )
    }
}

impl std::error::Error for DuplicateField {}

/// Top-level fields that routing depends on; giving one twice is a 400.
const ROUTING_FIELDS: [&str; 6] = [
    "model",
    "messages",
    "input",
    "prompt",
    "previous_response_id",
    "conversation",
];

/// The preamble's fields, in the order they enter the stream.
const PREAMBLE: [(Marker, Preamble); 7] = [
    (Marker::Tools, Preamble::Json),
    (Marker::ChatTemplate, Preamble::Text),
    (Marker::ChatTemplateKwargs, Preamble::Json),
    (Marker::Documents, Preamble::Json),
    (Marker::System, Preamble::System),
    (Marker::Instructions, Preamble::Text),
    (Marker::PromptTemplate, Preamble::Json),
];

#[derive(Clone, Copy)]
enum Preamble {
    /// Canonical JSON.
    Json,
    /// A string's text (any other value as canonical JSON).
    Text,
    /// Anthropic `system`: a string or text blocks.
    System,
}

/// What a top-level field is to one API.
enum Field {
    Model,
    /// `stream`: whether the answer comes as an event stream.
    Stream,
    CacheSalt,
    /// `prompt_cache_key`: the session id itself.
    Session,
    /// Anthropic `metadata`: an object whose `user_id` is the session id.
    Metadata,
    Turns,
    Preamble(usize),
    StoredState(&'static str),
    Other,
}

fn classify(api: Api, key: &[u8]) -> Field {
    let preamble = |m: Marker| {
        Field::Preamble(
            PREAMBLE
                .iter()
                .position(|(p, _)| *p == m)
                .unwrap_or_default(),
        )
    };
    match (api, key) {
        (_, b"model") => Field::Model,
        (_, b"stream") => Field::Stream,
        (_, b"cache_salt") => Field::CacheSalt,
        (Api::ChatCompletions | Api::Completions | Api::Responses, b"prompt_cache_key") => {
            Field::Session
        }
        (Api::Messages, b"metadata") => Field::Metadata,
        (Api::ChatCompletions | Api::Messages, b"messages")
        | (Api::Completions, b"prompt")
        | (Api::Responses, b"input") => Field::Turns,
        (Api::ChatCompletions | Api::Messages | Api::Responses, b"tools") => {
            preamble(Marker::Tools)
        }
        (Api::ChatCompletions, b"chat_template") => preamble(Marker::ChatTemplate),
        (Api::ChatCompletions, b"chat_template_kwargs") => preamble(Marker::ChatTemplateKwargs),
        (Api::ChatCompletions, b"documents") => preamble(Marker::Documents),
        (Api::Messages, b"system") => preamble(Marker::System),
        (Api::Responses, b"instructions") => preamble(Marker::Instructions),
        (Api::Responses, b"prompt") => preamble(Marker::PromptTemplate),
        (Api::Responses, b"previous_response_id") => Field::StoredState("previous_response_id"),
        (Api::Responses, b"conversation") => Field::StoredState("conversation"),
        _ => Field::Other,
    }
}

/// What the top-level pass found.
#[derive(Default)]
struct TopLevel {
    model: Option<Span>,
    /// The last `stream` value given.
    stream: Option<Span>,
    salt: Option<Span>,
    /// The session id's string value (the last given, as JSON parsers read duplicates).
    session: Option<Span>,
    /// Each preamble field, rendered into its stream bytes when met (or why it has none).
    preamble: [Option<Result<Vec<u8>, NoKeys>>; PREAMBLE.len()],
    /// The prompt's turns, read: whether they open a conversation (`None`: cannot be told),
    /// or why they give no keys.
    turns: Option<Result<Option<bool>, NoKeys>>,
    stored_state: Option<&'static str>,
}

/// Keys one request body.
///
/// Returns the request's [`Prompt`] (its model, keys or why it has none, and its session
/// when the body names one), or the duplicated routing field when the body must be
/// refused. The body is read in one pass (the preamble fields, usually small, a second
/// time), without building a JSON tree; extra memory is a few bytes per block plus the
/// largest canonicalised value.
///
/// The session is the string `prompt_cache_key` (Chat, Completions, Responses) or
/// Anthropic `metadata.user_id` (Messages), keyed in the request's namespace; an empty
/// string is none.
///
/// ```
/// use grid_route_layer::keying::{Api, KeySeed, key_body};
///
/// let seed = KeySeed::random();
/// let body = |salt: &str| format!(r#"{{"model":"m","cache_salt":"{salt}","prompt_cache_key":"conv-7","messages":[{{"role":"user","content":"hi"}}]}}"#);
/// let session = |salt| key_body(&seed, Api::ChatCompletions, body(salt).as_bytes()).unwrap().session();
/// assert!(session("a").is_some());
/// assert_eq!(session("a"), session("a"));
/// // Another tenant's salt: the same id is another session.
/// assert_ne!(session("a"), session("b"));
/// ```
pub fn key_body(seed: &KeySeed, api: Api, body: &[u8]) -> Result<Prompt, DuplicateField> {
    key_request(seed, api, body, None)
}

/// [`key_body`], with the session id a request's header gave (`None` without one): the
/// body's own session id wins over the header's.
pub(crate) fn key_request(
    seed: &KeySeed,
    api: Api,
    body: &[u8],
    header_session: Option<&[u8]>,
) -> Result<Prompt, DuplicateField> {
    // 0xFF never occurs in UTF-8 and starts the stream's markers; a body holding one is not
    // text, and refusing it here means no decoded text can forge a marker.
    if let Some(offset) = memchr::memchr(0xFF, body) {
        let reason = NoKeys::Unreadable {
            offset,
            expected: "UTF-8 text",
        };
        return Ok(Prompt::new(None, Err(reason)));
    }
    let mut top = TopLevel::default();
    let mut turns = BlockChain::turns_for(seed, body.len());
    let read = read_top_level(seed, api, body, &mut top, &mut turns);
    let model = top.model.and_then(|span| decode(body, span));
    let model_arc: Option<Arc<str>> = model
        .as_ref()
        .and_then(|m| std::str::from_utf8(m).ok())
        .map(Arc::from);
    let (keys, thread) = match read {
        Err(Stop::Duplicate(field)) => return Err(DuplicateField { field }),
        Err(Stop::NoKeys(reason)) => (Err(reason), None),
        Ok(()) => finish_keys(seed, body, &top, model.as_deref(), &turns),
    };
    let session = session_key(seed, body, &top, model.as_deref(), header_session);
    let streamed = top
        .stream
        .is_some_and(|span| &body[span.range()] == b"true");
    Ok(Prompt::new(model_arc, keys)
        .with_session(session)
        .with_thread(thread)
        .with_streamed(streamed))
}

/// The request's session key: the body's id if it gave a non-empty string, else the
/// header's, in the request's namespace.
fn session_key(
    seed: &KeySeed,
    body: &[u8],
    top: &TopLevel,
    model: Option<&[u8]>,
    header: Option<&[u8]>,
) -> Option<SessionKey> {
    let from_body = top
        .session
        .and_then(|span| decode(body, span))
        .filter(|id| !id.is_empty());
    let id = match (&from_body, header) {
        (Some(id), _) => id.as_slice(),
        (None, Some(id)) if !id.is_empty() => id,
        _ => return None,
    };
    let salt = top.salt.and_then(|span| decode(body, span));
    let namespace = seed.namespace(model, salt.as_deref());
    Some(SessionKey(seed.session(namespace, id)))
}

/// Reads only a request's `model` (and refuses duplicated routing fields), for when prefix
/// affinity is switched off: routing still needs the model, but no prompt is read. A
/// top-level `"stream": true` is recorded as [`Prompt::streamed`], as [`key_body`] does.
///
/// ```
/// use grid_route_layer::keying::read_model;
///
/// let prompt = read_model(br#"{"model":"m","stream":true,"messages":[]}"#).unwrap();
/// assert_eq!(prompt.model(), Some("m"));
/// assert!(prompt.streamed());
/// assert!(!read_model(br#"{"model":"m","stream":"true"}"#).unwrap().streamed());
/// ```
pub fn read_model(body: &[u8]) -> Result<Prompt, DuplicateField> {
    let top = top_level(body, &ROUTING_FIELDS)?;
    Ok(Prompt::new(top.model, Err(NoKeys::Disabled)).with_streamed(top.streamed))
}

/// Reads the top-level `model` of a JSON body that keying does not otherwise read
/// (embeddings, rerank, conversation items, or the first bytes of a body over the limit).
///
/// `body` may be a prefix of the whole body: reading stops at the first value that is cut
/// off or is not JSON, and the model counts only if it was met whole before that. A second
/// top-level `model` is a [`DuplicateField`] (the engine might read either copy); other
/// fields are not checked.
///
/// ```
/// use grid_route_layer::keying::scan_model;
///
/// let body = br#"{"input":["a","b"],"model":"bge-m3","encoding_format":"float"}"#;
/// assert_eq!(scan_model(body).unwrap().as_deref(), Some("bge-m3"));
/// // Cut off before the model: unknown, not an error.
/// assert_eq!(scan_model(&body[..12]).unwrap(), None);
/// assert!(scan_model(br#"{"model":"a","model":"b"}"#).is_err());
/// ```
pub fn scan_model(body: &[u8]) -> Result<Option<Arc<str>>, DuplicateField> {
    Ok(top_level(body, &["model"])?.model)
}

/// What [`top_level`] reads of a body.
struct ModelAndStream {
    /// The top-level `model`, when it is a string.
    model: Option<Arc<str>>,
    /// Whether the last top-level `stream` given is `true`.
    streamed: bool,
}

/// The top-level `model` as a string and whether `stream` is `true`, read until the first
/// value that is cut off or not JSON; any field of `checked` given twice is a
/// [`DuplicateField`]. A field's name is checked before its value is read, as `key_body`
/// does, so a duplicate followed by an unreadable value is refused too.
fn top_level(body: &[u8], checked: &[&'static str]) -> Result<ModelAndStream, DuplicateField> {
    let mut s = Scanner::new(body);
    let mut given = vec![false; checked.len()];
    let (mut model, mut stream) = (None, None);
    let read = (|| -> Result<(), Stop> {
        let mut fields = s.begin_object()?;
        while let Some(key) = s.next_key(&mut fields)? {
            if let Some(i) = checked.iter().position(|f| f.as_bytes() == &*key) {
                if given[i] {
                    return Err(Stop::Duplicate(checked[i]));
                }
                given[i] = true;
            }
            let span = s.skip_value()?;
            match &*key {
                b"model" => model = Some(span),
                b"stream" => stream = Some(span),
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(Stop::Duplicate(field)) = read {
        return Err(DuplicateField { field });
    }
    Ok(ModelAndStream {
        model: model
            .and_then(|span| decode(body, span))
            .and_then(|m| String::from_utf8(m).ok())
            .map(Arc::from),
        streamed: stream.is_some_and(|span| &body[span.range()] == b"true"),
    })
}

enum Stop {
    Duplicate(&'static str),
    NoKeys(NoKeys),
}

impl From<Unreadable> for Stop {
    fn from(u: Unreadable) -> Self {
        Stop::NoKeys(u.into())
    }
}

fn read_top_level(
    seed: &KeySeed,
    api: Api,
    body: &[u8],
    top: &mut TopLevel,
    turns: &mut BlockChain,
) -> Result<(), Stop> {
    let mut s = Scanner::new(body);
    let mut given = [false; ROUTING_FIELDS.len()];
    let mut fields = s.begin_object()?;
    while let Some(key) = s.next_key(&mut fields)? {
        if let Some(i) = ROUTING_FIELDS.iter().position(|f| f.as_bytes() == &*key) {
            if given[i] {
                return Err(Stop::Duplicate(ROUTING_FIELDS[i]));
            }
            given[i] = true;
        }
        match classify(api, &key) {
            Field::Model => top.model = Some(s.skip_value()?),
            Field::Stream => top.stream = Some(s.skip_value()?),
            Field::CacheSalt => top.salt = Some(s.skip_value()?),
            Field::Session => top.session = Some(s.skip_value()?),
            Field::Metadata => {
                let start = s.position();
                // The last `metadata` is the one a JSON parser keeps: its `user_id` or none.
                if let Ok(found) = user_id(&mut s) {
                    top.session = found;
                } else {
                    // Not an object of readable fields: no session, and the rest of the
                    // body is still read.
                    top.session = None;
                    s.seek(start);
                    s.skip_value()?;
                }
            }
            Field::Preamble(i) => {
                top.preamble[i] = if s.null()? {
                    None
                } else {
                    let start = s.position();
                    let rendered = render_preamble(seed, api, i, &mut s);
                    if rendered.is_err() {
                        s.seek(start);
                        s.skip_value()?;
                    }
                    Some(rendered)
                };
            }
            Field::StoredState(field) => {
                if !s.null()? {
                    s.skip_value()?;
                    top.stored_state = Some(field);
                }
            }
            Field::Turns => {
                let start = s.position();
                let outcome = walk_turns(seed, api, &mut s, turns);
                if outcome.is_err() {
                    // Keep reading the top level: a duplicate field later is still a 400.
                    s.seek(start);
                    s.skip_value()?;
                }
                top.turns = Some(outcome);
            }
            Field::Other => {
                s.skip_value()?;
            }
        }
    }
    s.finish()?;
    Ok(())
}

/// The span of `user_id` in an Anthropic `metadata` object (the last one given), or none
/// when the value is not an object or has no `user_id`.
fn user_id(s: &mut Scanner<'_>) -> Result<Option<Span>, Unreadable> {
    if s.peek_kind()? != Kind::Object {
        s.skip_value()?;
        return Ok(None);
    }
    let mut found = None;
    let mut fields = s.begin_object()?;
    while let Some(key) = s.next_key(&mut fields)? {
        let span = s.skip_value()?;
        if &*key == b"user_id" {
            found = Some(span);
        }
    }
    Ok(found)
}

fn walk_turns(
    seed: &KeySeed,
    api: Api,
    s: &mut Scanner<'_>,
    out: &mut BlockChain,
) -> Result<Option<bool>, NoKeys> {
    match api {
        Api::ChatCompletions => chat::messages(seed, s, out).map(Some),
        // One text: whether it continues a conversation cannot be told.
        Api::Completions => completions::prompt(s, out).map(|()| None),
        Api::Messages => messages::messages(seed, s, out).map(Some),
        Api::Responses => responses::input(seed, s, out).map(Some),
    }
}

/// The request's keys (or why it has none) and its thread ([`Prompt::thread`]), which a
/// prompt shorter than a block has too.
fn finish_keys(
    seed: &KeySeed,
    body: &[u8],
    top: &TopLevel,
    model: Option<&[u8]>,
    turns: &BlockChain,
) -> (Result<PrefixKeys, NoKeys>, Option<SessionKey>) {
    let keyed = (|| {
        if let Some(field) = top.stored_state {
            return Err(NoKeys::StoredState { field });
        }
        let opens = top.turns.clone().unwrap_or(Err(NoKeys::NoPrompt))?;
        let mut preamble = BlockChain::preamble(seed);
        for rendered in top.preamble.iter().flatten() {
            preamble.text(rendered.as_ref().map_err(Clone::clone)?);
        }
        let salt = top.salt.and_then(|span| decode(body, span));
        let namespace = seed.namespace(model, salt.as_deref());
        let stream_bytes = preamble.bytes() + turns.bytes();
        let (keys, threads) = join(seed, namespace, preamble, turns);
        Ok((keys, opens, threads, stream_bytes))
    })();
    let (keys, opens, threads, stream_bytes) = match keyed {
        Ok(keyed) => keyed,
        Err(reason) => return (Err(reason), None),
    };
    // Only turns that can hold the model's answers have threads: a Completions prompt
    // (one text) never follows another, so its own thread would never be asked for.
    let Some(opens) = opens else {
        return (keyed_or_short(keys, stream_bytes), None);
    };
    let Threads { own, follows } = threads;
    let keys = keyed_or_short(keys, stream_bytes)
        .map(|keys| keys.opening(opens).following(follows.map(SessionKey)));
    (keys, own.map(SessionKey))
}

/// `keys`, or why there are none: a stream of `stream_bytes` shorter than a block.
fn keyed_or_short(keys: PrefixKeys, stream_bytes: u64) -> Result<PrefixKeys, NoKeys> {
    if keys.is_empty() {
        return Err(NoKeys::ShorterThanABlock {
            bytes: stream_bytes,
        });
    }
    Ok(keys)
}

/// Renders preamble field `i`, read at the scanner, into its stream bytes.
fn render_preamble(
    seed: &KeySeed,
    api: Api,
    i: usize,
    s: &mut Scanner<'_>,
) -> Result<Vec<u8>, NoKeys> {
    let (field, kind) = PREAMBLE[i];
    let mut out = OwnedText(Vec::new());
    if field == Marker::Tools && s.empty_array()? {
        // An empty tool list renders like no tool list.
        return Ok(Vec::new());
    }
    marker(&mut out, field);
    let is_string = s.peek_kind()? == Kind::String;
    match kind {
        Preamble::Text | Preamble::System if is_string => walk::marked(s, Marker::Text, &mut out)?,
        Preamble::System => messages::system_blocks(seed, s, &mut out)?,
        Preamble::Json | Preamble::Text => {
            // Anthropic marks tools for its prompt cache; the marks are not prompt.
            let drop =
                (api == Api::Messages && field == Marker::Tools).then_some(&b"cache_control"[..]);
            canonical::json_value(seed, s, drop, &mut out)?;
        }
    }
    Ok(out.0)
}

/// A short string field's decoded bytes; `None` when it is not a string.
fn decode(body: &[u8], span: Span) -> Option<Vec<u8>> {
    let mut s = Scanner::at(body, span);
    if s.peek_kind().ok()? != Kind::String {
        return None;
    }
    let mut out = OwnedText(Vec::new());
    s.string(&mut out).ok()?;
    Some(out.0)
}
