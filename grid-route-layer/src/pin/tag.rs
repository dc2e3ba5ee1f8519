//! Tagged ids: the site and cluster that stored a response or conversation, written into
//! the id the client sees, and checked when the client sends it back.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::grid::{ClusterDigest, SiteName};

/// The fewest bytes a tag key may hold.
pub const MIN_TAG_KEY_BYTES: usize = 32;

/// The longest engine id (prefix included) that is tagged; longer ids pass untagged.
///
/// Engines write ids of a few dozen characters (`resp_` and 32 to 48 hex digits). The
/// bound keeps what the streaming rewriter holds back small.
pub const MAX_ENGINE_ID_BYTES: usize = 256;

/// Length of a mac in a tag: 16 lowercase hex digits, the first 8 bytes of HMAC-SHA256.
pub const MAC_HEX_LEN: usize = 16;

const MAC_BYTES: usize = MAC_HEX_LEN / 2;

/// Length of `resp_` and `conv_`.
pub(crate) const PREFIX_LEN: usize = 5;

/// The longest id part (engine id without its prefix) that is tagged.
pub(crate) const MAX_ID_PART_BYTES: usize = MAX_ENGINE_ID_BYTES - PREFIX_LEN;

/// Domain separation for the mac input; a fixed length, so the encoding stays unambiguous.
const MAC_DOMAIN: &[u8] = b"grid-route/pin-tag/v1\0";

/// Which stored object an id names; the kind fixes the id's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdKind {
    /// A stored response of the Responses API: ids start with `resp_`.
    Response,
    /// A conversation of the Conversations API: ids start with `conv_`.
    Conversation,
}

impl IdKind {
    /// The prefix every id of this kind starts with: `resp_` or `conv_`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Response => "resp_",
            Self::Conversation => "conv_",
        }
    }

    /// The kind whose prefix `id` starts with, if any.
    pub fn of_id(id: &str) -> Option<Self> {
        [Self::Response, Self::Conversation]
            .into_iter()
            .find(|kind| id.starts_with(kind.prefix()))
    }
}

/// A secret key that signs tags, at least [`MIN_TAG_KEY_BYTES`] long.
///
/// The key file is used whole, byte for byte: a trailing newline is part of the key, so
/// every replica must read the same file. `Debug` never shows the key.
#[derive(Clone)]
pub struct TagKey {
    /// HMAC state with the key already absorbed; cloned for each mac.
    hmac: Hmac<Sha256>,
}

/// A tag key that could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum TagKeyError {
    /// The key file could not be read.
    Unreadable {
        /// The path that was read.
        path: PathBuf,
        /// Why reading failed.
        source: io::Error,
    },
    /// The key holds fewer than [`MIN_TAG_KEY_BYTES`] bytes.
    TooShort {
        /// The file the key came from, when it came from a file.
        path: Option<PathBuf>,
        /// How many bytes it held.
        found: usize,
    },
}

impl fmt::Display for TagKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { path, source } => {
                write!(f, "cannot read tag key file {}: {source}", path.display())
            }
            Self::TooShort {
                path: Some(path),
                found,
            } => write!(
                f,
                "tag key file {} holds {found} bytes; a tag key needs at least {MIN_TAG_KEY_BYTES}",
                path.display()
            ),
            Self::TooShort { path: None, found } => write!(
                f,
                "tag key holds {found} bytes; a tag key needs at least {MIN_TAG_KEY_BYTES}"
            ),
        }
    }
}

impl std::error::Error for TagKeyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unreadable { source, .. } => Some(source),
            Self::TooShort { .. } => None,
        }
    }
}

impl TagKey {
    /// Reads the whole file at `path` as the key.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TagKeyError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TagKeyError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|err| match err {
            TagKeyError::TooShort { found, .. } => TagKeyError::TooShort {
                path: Some(path.to_owned()),
                found,
            },
            other => other,
        })
    }

    /// Uses `bytes` as the key.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TagKeyError> {
        if bytes.len() < MIN_TAG_KEY_BYTES {
            return Err(TagKeyError::TooShort {
                path: None,
                found: bytes.len(),
            });
        }
        let Ok(hmac) = Hmac::<Sha256>::new_from_slice(bytes) else {
            // HMAC takes keys of any length; this arm cannot run.
            return Err(TagKeyError::TooShort {
                path: None,
                found: bytes.len(),
            });
        };
        Ok(Self { hmac })
    }

    /// HMAC-SHA256 over the domain label, the length-prefixed site and the digest bytes.
    fn mac_state(&self, site: &SiteName, digest: ClusterDigest) -> Hmac<Sha256> {
        let mut mac = self.hmac.clone();
        mac.update(MAC_DOMAIN);
        // A site name is at most 63 bytes, so one length byte is enough.
        mac.update(&[site.as_str().len() as u8]);
        mac.update(site.as_str().as_bytes());
        mac.update(&digest.to_bytes());
        mac
    }

    fn mac_hex(&self, site: &SiteName, digest: ClusterDigest) -> String {
        let full = self.mac_state(site, digest).finalize().into_bytes();
        let mut hex = String::with_capacity(MAC_HEX_LEN);
        for b in &full[..MAC_BYTES] {
            hex.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
            hex.push(char::from(HEX_DIGITS[usize::from(b & 0xf)]));
        }
        hex
    }

    /// Constant-time check of a mac against this key.
    fn verifies(&self, site: &SiteName, digest: ClusterDigest, mac: [u8; MAC_BYTES]) -> bool {
        self.mac_state(site, digest)
            .verify_truncated_left(&mac)
            .is_ok()
    }

    /// HMAC-SHA256(key, `label`): a secret derived from this key for another use. Labels
    /// differ from [`MAC_DOMAIN`] in their first bytes, so a derived secret is never a tag
    /// mac.
    pub(crate) fn derive(&self, label: &[u8]) -> [u8; 32] {
        let mut mac = self.hmac.clone();
        mac.update(label);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for TagKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TagKey(..)")
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The keys that sign and check tags: the current key, if any, and the previous one while
/// the configuration names it.
///
/// - New tags are always signed with the current key (or carry an empty mac without one).
/// - Tags signed with the previous key verify only while it is set
///   ([`with_previous`](Self::with_previous)): an operator who rotates a key names the old
///   one for as long as clients may still hold its ids, and revokes it (a leaked key, say)
///   by naming it no longer. Nothing verifies by time alone.
/// - Without a current key every well-formed tag is accepted, whatever its mac, and no
///   previous key is kept (there is nothing to sign with).
#[derive(Clone, Default)]
pub struct TagKeys {
    current: Option<TagKey>,
    previous: Option<TagKey>,
}

impl fmt::Debug for TagKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagKeys")
            .field("keyed", &self.current.is_some())
            .field("previous", &self.previous.is_some())
            .finish()
    }
}

impl TagKeys {
    /// Keys with `current` as the signing key (`None`: tags carry an empty mac).
    pub fn new(current: Option<TagKey>) -> Self {
        Self {
            current,
            previous: None,
        }
    }

    /// These keys, with `previous` verifying tags too (not signing them). Ignored without
    /// a current key.
    #[must_use]
    pub fn with_previous(mut self, previous: Option<TagKey>) -> Self {
        self.previous = previous.filter(|_| self.current.is_some());
        self
    }

    /// Whether a key is set, so that tags are signed and checked.
    pub fn is_keyed(&self) -> bool {
        self.current.is_some()
    }

    /// The stamp that tags ids stored at `site` in the cluster with `digest`.
    ///
    /// A stamp holds the mac, so one HMAC is computed per stamp, not per id.
    pub fn stamp(&self, site: &SiteName, digest: ClusterDigest) -> TagStamp {
        let mac = self
            .current
            .as_ref()
            .map(|key| key.mac_hex(site, digest))
            .unwrap_or_default();
        TagStamp {
            text: format!("{site}.{digest}.{mac}.").into(),
        }
    }

    /// Tags `engine_id` as stored at `site` in the cluster with `digest`; see
    /// [`TagStamp::tag`] for when an id is not tagged.
    pub fn tag(
        &self,
        kind: IdKind,
        engine_id: &str,
        site: &SiteName,
        digest: ClusterDigest,
    ) -> Option<String> {
        self.stamp(site, digest).tag(kind, engine_id)
    }

    /// Parses and checks a tagged id of `kind`.
    ///
    /// The checks, in order: the prefix of `kind`, three dots, a site name, an 8-hex
    /// digest, a mac that is empty or 16 lowercase hex, a safe id part, and (with a key
    /// set) a mac that verifies, compared in constant time.
    pub fn untag(&self, kind: IdKind, tagged: &str) -> Result<UntaggedId, BadTag> {
        let rest = tagged
            .strip_prefix(kind.prefix())
            .ok_or(BadTag::WrongKind)?;
        let parts = parse_tag(rest)?;
        let site = parts.site;
        if let Some(current) = &self.current {
            let mac = parts.mac.ok_or(BadTag::BadMac)?;
            let verified = current.verifies(&site, parts.digest, mac)
                || self
                    .previous
                    .as_ref()
                    .is_some_and(|previous| previous.verifies(&site, parts.digest, mac));
            if !verified {
                return Err(BadTag::BadMac);
            }
        }
        let mut engine_id = String::with_capacity(PREFIX_LEN + parts.id_part.len());
        engine_id.push_str(kind.prefix());
        engine_id.push_str(parts.id_part);
        Ok(UntaggedId {
            kind,
            site,
            digest: parts.digest,
            engine_id,
        })
    }
}

/// The text that tags ids stored at one site and cluster: `<site>.<digest>.<mac>.`,
/// written between an engine id's prefix and the rest of it.
///
/// Made by [`TagKeys::stamp`]; the [`IdRewriter`](super::IdRewriter) writes it into
/// response bodies.
#[derive(Clone, PartialEq, Eq)]
pub struct TagStamp {
    text: std::sync::Arc<str>,
}

impl fmt::Debug for TagStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TagStamp({:?})", self.text)
    }
}

impl TagStamp {
    /// `engine_id` with this stamp written after its prefix, or `None` when the id is
    /// left as it is: it does not start with `kind`'s prefix, its id part is not one safe
    /// path segment (see [`BadTag::UnsafeId`]), it is longer than
    /// [`MAX_ENGINE_ID_BYTES`], or it is already a well-formed tag (ids are never tagged
    /// twice).
    ///
    /// Whatever is tagged untags to the same engine id.
    pub fn tag(&self, kind: IdKind, engine_id: &str) -> Option<String> {
        let part = engine_id.strip_prefix(kind.prefix())?;
        if !is_taggable_part(part.as_bytes()) {
            return None;
        }
        let mut tagged = String::with_capacity(engine_id.len() + self.text.len());
        tagged.push_str(kind.prefix());
        tagged.push_str(&self.text);
        tagged.push_str(part);
        Some(tagged)
    }

    /// The stamp text, `<site>.<digest>.<mac>.`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A tagged id that passed every check: where it is stored and the engine's own id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntaggedId {
    kind: IdKind,
    site: SiteName,
    digest: ClusterDigest,
    engine_id: String,
}

impl UntaggedId {
    /// Whether the id names a response or a conversation.
    pub fn kind(&self) -> IdKind {
        self.kind
    }

    /// The site that stored the object.
    pub fn site(&self) -> &SiteName {
        &self.site
    }

    /// The digest of the cluster that stored the object.
    pub fn digest(&self) -> ClusterDigest {
        self.digest
    }

    /// The id as the engine wrote it (prefix and id part): one safe path segment.
    pub fn engine_id(&self) -> &str {
        &self.engine_id
    }

    /// The engine id, by value.
    pub fn into_engine_id(self) -> String {
        self.engine_id
    }
}

/// Why a tagged id was refused. A gateway answers each with 404 and counts it as
/// `bad_tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BadTag {
    /// The id does not start with the expected kind's prefix (`resp_` or `conv_`).
    WrongKind,
    /// The id has the prefix and no dot: an engine id as the engine wrote it, never
    /// tagged by a gateway.
    Untagged,
    /// Fewer than the three dots that separate site, digest, mac and id.
    Malformed,
    /// The site part is not a DNS-1123 label.
    BadSite,
    /// The digest part is not 8 lowercase hex digits.
    BadDigest,
    /// The mac part is neither empty nor 16 lowercase hex digits.
    MalformedMac,
    /// A key is set and the mac is empty or does not verify.
    BadMac,
    /// The id part is not one plain path segment: it is empty, holds `..`, or holds a
    /// character outside RFC 3986's unreserved set (ASCII letters, digits, `-._~`), such
    /// as `/`, `\`, `%`, `?`, `#`, a space, a control character or non-ASCII.
    UnsafeId,
}

impl BadTag {
    /// A short snake_case name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WrongKind => "wrong_kind",
            Self::Untagged => "untagged",
            Self::Malformed => "malformed",
            Self::BadSite => "bad_site",
            Self::BadDigest => "bad_digest",
            Self::MalformedMac => "malformed_mac",
            Self::BadMac => "bad_mac",
            Self::UnsafeId => "unsafe_id",
        }
    }
}

impl fmt::Display for BadTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WrongKind => "the id does not start with the expected prefix",
            Self::Untagged => "the id carries no tag",
            Self::Malformed => "the tag does not have site, cluster, mac and id parts",
            Self::BadSite => "the tag's site is not a valid site name",
            Self::BadDigest => "the tag's cluster is not 8 lowercase hex digits",
            Self::MalformedMac => "the tag's mac is not 16 lowercase hex digits",
            Self::BadMac => "the tag's mac does not verify",
            Self::UnsafeId => "the id is not one plain path segment",
        })
    }
}

impl std::error::Error for BadTag {}

/// The parts of a tag after its kind prefix.
struct TagParts<'a> {
    site: SiteName,
    digest: ClusterDigest,
    /// `None` for an empty mac.
    mac: Option<[u8; MAC_BYTES]>,
    id_part: &'a str,
}

/// Splits `<site>.<digest>.<mac>.<id>` on its first three dots and checks each part (all
/// but the mac's value).
fn parse_tag(rest: &str) -> Result<TagParts<'_>, BadTag> {
    let mut parts = rest.splitn(4, '.');
    let (Some(site), Some(digest), Some(mac), Some(id_part)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(if rest.contains('.') {
            BadTag::Malformed
        } else {
            BadTag::Untagged
        });
    };
    let site = SiteName::new(site).map_err(|_| BadTag::BadSite)?;
    let digest = ClusterDigest::from_hex(digest).ok_or(BadTag::BadDigest)?;
    let mac = if mac.is_empty() {
        None
    } else {
        Some(decode_mac(mac.as_bytes()).ok_or(BadTag::MalformedMac)?)
    };
    if !is_safe_id_part(id_part.as_bytes()) {
        return Err(BadTag::UnsafeId);
    }
    Ok(TagParts {
        site,
        digest,
        mac,
        id_part,
    })
}

fn decode_mac(hex: &[u8]) -> Option<[u8; MAC_BYTES]> {
    if hex.len() != MAC_HEX_LEN {
        return None;
    }
    let mut out = [0u8; MAC_BYTES];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = (lower_hex_value(pair[0])? << 4) | lower_hex_value(pair[1])?;
    }
    Some(out)
}

fn lower_hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// RFC 3986 unreserved: the bytes a path segment holds without any escaping.
pub(crate) fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// One plain path segment: non-empty, unreserved bytes only, no `..` anywhere.
fn is_safe_id_part(part: &[u8]) -> bool {
    !part.is_empty()
        && part.iter().all(|&b| is_unreserved(b))
        && !part.windows(2).any(|pair| pair == b"..")
}

/// Whether an id part (the text after `resp_`/`conv_`) gets a tag: a safe segment, not
/// too long, and not already a well-formed tag.
///
/// One pass, as the rewriter calls it for every id it meets.
pub(crate) fn is_taggable_part(part: &[u8]) -> bool {
    if part.is_empty() || part.len() > MAX_ID_PART_BYTES {
        return false;
    }
    let mut dots = 0;
    let mut after_dot = false;
    for &b in part {
        let dot = b == b'.';
        if !is_unreserved(b) || (dot && after_dot) {
            return false;
        }
        dots += usize::from(dot);
        after_dot = dot;
    }
    // A tag holds at least three dots; only then can the id be one already.
    dots < 3 || !is_well_formed_tag(part)
}

/// [`is_taggable_part`] for a part already known to hold only unreserved bytes and to fit
/// the bound, as the rewriter's id parts do: most hold no dot, which settles it.
pub(crate) fn is_taggable_unreserved_part(part: &[u8]) -> bool {
    debug_assert!(part.len() <= MAX_ID_PART_BYTES && part.iter().all(|&b| is_unreserved(b)));
    if memchr::memchr(b'.', part).is_none() {
        return !part.is_empty();
    }
    is_taggable_part(part)
}

/// Whether an id part already has the shape of a tag (its mac is not checked).
fn is_well_formed_tag(part: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(part) else {
        return false;
    };
    parse_tag(text).is_ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const KEY_A: &[u8] = b"0123456789abcdef0123456789abcdef-key-a";
    const KEY_B: &[u8] = b"0123456789abcdef0123456789abcdef-key-b";

    fn east() -> SiteName {
        SiteName::new("east").unwrap()
    }

    fn east_a() -> ClusterDigest {
        ClusterDigest::of_name("east-a")
    }

    fn keyed(bytes: &[u8]) -> TagKeys {
        TagKeys::new(Some(TagKey::from_bytes(bytes).unwrap()))
    }

    /// Replaces the mac of a keyed tag, keeping everything else.
    fn with_mac(tagged: &str, mac: &str) -> String {
        let parts: Vec<&str> = tagged.splitn(4, '.').collect();
        format!("{}.{}.{mac}.{}", parts[0], parts[1], parts[3])
    }

    #[test]
    fn a_tag_round_trips_to_the_engine_id_site_and_cluster() {
        let keys = keyed(KEY_A);
        for (kind, engine_id) in [
            (IdKind::Response, "resp_68a3f0c2e1b04"),
            (IdKind::Conversation, "conv_9f8e7d"),
            (IdKind::Response, "resp_with.more.dots.in-it_~"),
        ] {
            let tagged = keys.tag(kind, engine_id, &east(), east_a()).unwrap();
            let untagged = keys.untag(kind, &tagged).unwrap();
            assert_eq!(untagged.engine_id(), engine_id);
            assert_eq!(untagged.site(), &east());
            assert_eq!(untagged.digest(), east_a());
            assert_eq!(untagged.kind(), kind);
        }
    }

    #[test]
    fn a_tag_reads_prefix_site_digest_mac_and_id() {
        let tagged = keyed(KEY_A)
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        let rest = tagged.strip_prefix("resp_east.1ef772aa.").unwrap();
        let (mac, id) = rest.split_once('.').unwrap();
        assert_eq!(id, "abc");
        assert_eq!(mac.len(), MAC_HEX_LEN);
        assert!(mac.bytes().all(|b| lower_hex_value(b).is_some()), "{mac}");
    }

    #[test]
    fn the_mac_is_hmac_sha256_of_the_encoded_site_and_digest() {
        // Computed independently of `mac_state`, from the documented encoding.
        let mut mac = Hmac::<Sha256>::new_from_slice(KEY_A).unwrap();
        mac.update(b"grid-route/pin-tag/v1\0");
        mac.update(&[4]);
        mac.update(b"east");
        mac.update(&[0x1e, 0xf7, 0x72, 0xaa]);
        let full = mac.finalize().into_bytes();
        let expected: String = full[..8]
            .iter()
            .flat_map(|b| [b >> 4, b & 0xf])
            .map(|nibble| char::from_digit(u32::from(nibble), 16).unwrap())
            .collect();
        let stamp = keyed(KEY_A).stamp(&east(), east_a());
        assert_eq!(stamp.as_str(), format!("east.1ef772aa.{expected}."));
    }

    #[test]
    fn without_a_key_the_mac_is_empty() {
        let tagged = TagKeys::default()
            .tag(IdKind::Conversation, "conv_1", &east(), east_a())
            .unwrap();
        assert_eq!(tagged, "conv_east.1ef772aa..1");
    }

    #[test]
    fn macs_differ_by_site_cluster_and_key() {
        let a = keyed(KEY_A);
        let west = SiteName::new("west").unwrap();
        let stamps = [
            a.stamp(&east(), east_a()),
            a.stamp(&west, east_a()),
            a.stamp(&east(), ClusterDigest::of_name("east-b")),
            keyed(KEY_B).stamp(&east(), east_a()),
        ];
        let macs: Vec<&str> = stamps
            .iter()
            .map(|s| s.as_str().split('.').nth(2).unwrap())
            .collect();
        for (i, x) in macs.iter().enumerate() {
            for y in &macs[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn ids_that_cannot_be_tagged_are_left_alone() {
        let stamp = keyed(KEY_A).stamp(&east(), east_a());
        let long = format!("resp_{}", "a".repeat(MAX_ENGINE_ID_BYTES - PREFIX_LEN + 1));
        let longest = format!("resp_{}", "a".repeat(MAX_ENGINE_ID_BYTES - PREFIX_LEN));
        for (kind, id) in [
            (IdKind::Response, "conv_abc"),
            (IdKind::Conversation, "resp_abc"),
            (IdKind::Response, "msg_abc"),
            (IdKind::Response, "resp_"),
            (IdKind::Response, "resp_a/b"),
            (IdKind::Response, "resp_a..b"),
            (IdKind::Response, "resp_east.1ef772aa..abc"),
            (IdKind::Response, long.as_str()),
        ] {
            assert_eq!(stamp.tag(kind, id), None, "{id}");
        }
        assert!(stamp.tag(IdKind::Response, &longest).is_some());
    }

    #[test]
    fn a_tag_is_never_tagged_twice() {
        let keys = keyed(KEY_A);
        let once = keys
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        assert_eq!(keys.tag(IdKind::Response, &once, &east(), east_a()), None);
    }

    #[test]
    fn a_bad_mac_is_refused() {
        let keys = keyed(KEY_A);
        let tagged = keys
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        let forged = with_mac(&tagged, "0000000000000000");
        assert_eq!(keys.untag(IdKind::Response, &forged), Err(BadTag::BadMac));
    }

    #[test]
    fn with_a_key_an_empty_mac_is_refused() {
        let tagged = "resp_east.1ef772aa..abc";
        assert_eq!(
            keyed(KEY_A).untag(IdKind::Response, tagged),
            Err(BadTag::BadMac)
        );
    }

    #[test]
    fn a_mac_for_another_site_or_cluster_is_refused() {
        let keys = keyed(KEY_A);
        let tagged = keys
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        let moved_site = tagged.replacen("resp_east.", "resp_west.", 1);
        let moved_cluster = tagged.replacen(".1ef772aa.", ".1ef772ab.", 1);
        for moved in [moved_site, moved_cluster] {
            assert_eq!(keys.untag(IdKind::Response, &moved), Err(BadTag::BadMac));
        }
    }

    #[test]
    fn without_a_key_any_well_formed_tag_is_accepted() {
        let keys = TagKeys::default();
        for tagged in [
            "resp_east.1ef772aa..abc",
            "resp_east.1ef772aa.0123456789abcdef.abc",
            "resp_west-2.00000000.ffffffffffffffff.a.b",
        ] {
            let untagged = keys.untag(IdKind::Response, tagged).unwrap();
            assert!(untagged.engine_id().starts_with("resp_a"), "{tagged}");
        }
        // Well-formed still means well-formed.
        assert_eq!(
            keys.untag(IdKind::Response, "resp_east.1ef772aa.123.abc"),
            Err(BadTag::MalformedMac)
        );
    }

    #[test]
    fn malformed_tags_are_refused_with_their_reason() {
        let keys = TagKeys::default();
        let cases = [
            ("conv_east.1ef772aa..abc", BadTag::WrongKind),
            ("msg_east.1ef772aa..abc", BadTag::WrongKind),
            ("RESP_east.1ef772aa..abc", BadTag::WrongKind),
            ("resp_abc", BadTag::Untagged),
            ("resp_", BadTag::Untagged),
            ("resp_east.1ef772aa", BadTag::Malformed),
            ("resp_east.1ef772aa.", BadTag::Malformed),
            ("resp_east.abc", BadTag::Malformed),
            ("resp_East.1ef772aa..abc", BadTag::BadSite),
            ("resp_-east.1ef772aa..abc", BadTag::BadSite),
            ("resp_.1ef772aa..abc", BadTag::BadSite),
            ("resp_e_st.1ef772aa..abc", BadTag::BadSite),
            ("resp_east.1EF772AA..abc", BadTag::BadDigest),
            ("resp_east.1ef772a..abc", BadTag::BadDigest),
            ("resp_east.1ef772aa0..abc", BadTag::BadDigest),
            ("resp_east.xyz772aa..abc", BadTag::BadDigest),
            ("resp_east.1ef772aa.0123.abc", BadTag::MalformedMac),
            (
                "resp_east.1ef772aa.0123456789ABCDEF.abc",
                BadTag::MalformedMac,
            ),
            (
                "resp_east.1ef772aa.0123456789abcdeg.abc",
                BadTag::MalformedMac,
            ),
            (
                "resp_east.1ef772aa.0123456789abcdef0.abc",
                BadTag::MalformedMac,
            ),
        ];
        for (tagged, reason) in cases {
            assert_eq!(
                keys.untag(IdKind::Response, tagged),
                Err(reason),
                "{tagged}"
            );
        }
    }

    #[test]
    fn ids_that_are_not_one_plain_path_segment_are_refused() {
        let unsafe_parts = [
            "",
            "a/b",
            "/abc",
            "a\\b",
            "..",
            "a..b",
            "abc..",
            "..abc",
            ".../x",
            "a%2Fb",
            "%2e%2e",
            "a?b=1",
            "a#frag",
            "a b",
            "a\tb",
            "a\nb",
            "a\0b",
            "a\u{7f}b",
            "caf\u{e9}",
            "a+b",
            "a:b",
            "a@b",
            "a;b",
            "a=b",
        ];
        for keys in [TagKeys::default(), keyed(KEY_A)] {
            let stamp = keys.stamp(&east(), east_a());
            for part in unsafe_parts {
                let tagged = format!("resp_{}{part}", stamp.as_str());
                assert_eq!(
                    keys.untag(IdKind::Response, &tagged),
                    Err(BadTag::UnsafeId),
                    "{tagged:?}"
                );
            }
        }
    }

    #[test]
    fn unreserved_ids_with_single_dots_are_accepted() {
        let keys = TagKeys::default();
        let tagged = "resp_east.1ef772aa..A-z.0_9~.x";
        let untagged = keys.untag(IdKind::Response, tagged);
        assert_eq!(untagged.unwrap().engine_id(), "resp_A-z.0_9~.x");
    }

    #[test]
    fn random_macs_are_never_accepted() {
        let keys = keyed(KEY_A);
        let tagged = keys
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        let genuine = tagged.split('.').nth(2).unwrap().to_owned();
        // Seeded: deterministic, and independent of the mac.
        let mut draws = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for _ in 0..100_000 {
            let mac = format!("{:016x}", draws.u64(..));
            if mac == genuine {
                continue;
            }
            if keys
                .untag(IdKind::Response, &with_mac(&tagged, &mac))
                .is_ok()
            {
                accepted += 1;
            }
        }
        assert_eq!(accepted, 0);
    }

    #[test]
    fn the_previous_key_verifies_only_while_it_is_named() {
        let old = keyed(KEY_A)
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        let rotated = TagKeys::new(Some(TagKey::from_bytes(KEY_B).unwrap()))
            .with_previous(Some(TagKey::from_bytes(KEY_A).unwrap()));
        assert!(rotated.untag(IdKind::Response, &old).is_ok());
        // New ids are signed with the new key only.
        let new = rotated
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        assert_ne!(new, old);
        assert_eq!(
            new,
            keyed(KEY_B)
                .tag(IdKind::Response, "resp_abc", &east(), east_a())
                .unwrap()
        );
        // Revoked: the old key is named no longer.
        let revoked = keyed(KEY_B);
        assert_eq!(revoked.untag(IdKind::Response, &old), Err(BadTag::BadMac));
        assert!(revoked.untag(IdKind::Response, &new).is_ok());
    }

    #[test]
    fn a_previous_key_without_a_current_one_is_ignored() {
        let keys = TagKeys::new(None).with_previous(Some(TagKey::from_bytes(KEY_A).unwrap()));
        assert!(!keys.is_keyed());
        assert_eq!(keys.stamp(&east(), east_a()).as_str(), "east.1ef772aa..");
    }

    #[test]
    fn setting_a_first_key_refuses_empty_macs() {
        let unsigned = TagKeys::default()
            .tag(IdKind::Response, "resp_abc", &east(), east_a())
            .unwrap();
        assert!(
            TagKeys::default()
                .untag(IdKind::Response, &unsigned)
                .is_ok()
        );
        assert_eq!(
            keyed(KEY_A).untag(IdKind::Response, &unsigned),
            Err(BadTag::BadMac)
        );
    }

    #[test]
    fn dropping_the_key_accepts_any_well_formed_tag() {
        let keys = TagKeys::default();
        assert!(!keys.is_keyed());
        for tagged in [
            "resp_east.1ef772aa..abc",
            "resp_east.1ef772aa.0000000000000000.abc",
        ] {
            assert!(keys.untag(IdKind::Response, tagged).is_ok(), "{tagged}");
        }
        assert_eq!(keys.stamp(&east(), east_a()).as_str(), "east.1ef772aa..");
    }

    #[test]
    fn a_short_key_file_is_refused_with_its_path_and_size() {
        let dir = std::env::temp_dir().join(format!("grid-route-tag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("short.key");
        std::fs::write(&path, b"only 12 byte").unwrap();
        let err = TagKey::from_file(&path).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("12 bytes"), "{message}");
        assert!(message.contains("32"), "{message}");

        let good = dir.join("good.key");
        std::fs::write(&good, KEY_A).unwrap();
        let from_file = TagKeys::new(Some(TagKey::from_file(&good).unwrap()));
        assert_eq!(
            from_file.stamp(&east(), east_a()),
            keyed(KEY_A).stamp(&east(), east_a())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unreadable_key_file_is_refused_with_its_path() {
        let path = std::env::temp_dir().join("grid-route-no-such-dir/tag.key");
        let err = TagKey::from_file(&path).unwrap_err();
        assert!(matches!(err, TagKeyError::Unreadable { .. }));
        let message = err.to_string();
        assert!(message.contains("cannot read tag key file"), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let secret = b"SECRET-SECRET-SECRET-SECRET-SECRET";
        let key = TagKey::from_bytes(secret).unwrap();
        let keys = TagKeys::new(Some(key.clone()));
        for shown in [format!("{key:?}"), format!("{keys:?}"), format!("{key:#?}")] {
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(!shown.contains("53454352"), "{shown}");
        }
    }

    #[test]
    fn unreserved_bytes_are_ascii_letters_digits_and_four_marks() {
        let unreserved: Vec<u8> = (0..=255u8).filter(|&b| is_unreserved(b)).collect();
        let expected: Vec<u8> =
            b"-.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~".to_vec();
        assert_eq!(unreserved, expected);
    }

    #[test]
    fn the_kind_of_an_id_follows_its_prefix() {
        assert_eq!(IdKind::of_id("resp_1"), Some(IdKind::Response));
        assert_eq!(IdKind::of_id("conv_1"), Some(IdKind::Conversation));
        assert_eq!(IdKind::of_id("msg_1"), None);
        assert_eq!(IdKind::of_id("resp"), None);
    }

    proptest! {
        #[test]
        fn tagging_then_untagging_gives_back_the_engine_id(
            part in "[A-Za-z0-9_~-]{1,40}(\\.[A-Za-z0-9_~-]{1,8}){0,3}",
            site in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
            cluster in ".{0,20}",
            keyed_stamp in any::<bool>(),
            conversation in any::<bool>(),
        ) {
            let keys = if keyed_stamp { keyed(KEY_A) } else { TagKeys::default() };
            let kind = if conversation { IdKind::Conversation } else { IdKind::Response };
            let engine_id = format!("{}{part}", kind.prefix());
            let site = SiteName::new(&site).unwrap();
            let digest = ClusterDigest::of_name(&cluster);
            // Parts shaped like a tag are left alone; everything else round-trips.
            let Some(tagged) = keys.tag(kind, &engine_id, &site, digest) else {
                prop_assert!(is_well_formed_tag(part.as_bytes()));
                return Ok(());
            };
            let untagged = keys.untag(kind, &tagged).unwrap();
            prop_assert_eq!(untagged.engine_id(), engine_id.as_str());
            prop_assert_eq!(untagged.site(), &site);
            prop_assert_eq!(untagged.digest(), digest);
        }
    }
}
