//! Tagging and untagging ids (`pin::TagStamp::tag`, `pin::TagKeys::untag`).
//!
//! Holds, for any engine id, site, cluster digest, keys and rotation:
//! - `untag(tag(x)) == x`: every id the stamp tags untags to the same engine id, site,
//!   digest and kind, and is refused as the other kind;
//! - after a rotation to another key, a tag of the old key verifies exactly while the old
//!   key is named as the previous one; with no key before, empty-mac tags are refused;
//! - whatever string is untagged (an edited tag, or any text): untagging never panics, an
//!   accepted id's engine id is the prefix and one plain path segment, and with a key set
//!   an accepted tag is exactly the text the stamp writes (tags are not malleable).
#![no_main]

use arbitrary::Arbitrary;
use grid_route_layer::grid::{ClusterDigest, SiteName};
use grid_route_layer::pin::{BadTag, IdKind, TagKey, TagKeys};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    conversation: bool,
    /// The engine id after its `resp_`/`conv_` prefix.
    id_part: &'a str,
    site: &'a str,
    digest: u32,
    key: Option<[u8; 32]>,
    next_key: Option<[u8; 32]>,
    /// Whether the rotated keys still name the old key as the previous one.
    keep_previous: bool,
    /// Byte edits made to the tag before it is untagged again: (position, new byte).
    edits: Vec<(u16, u8)>,
    /// Any text, untagged as both kinds.
    raw: &'a str,
}

fuzz_target!(|input: Input<'_>| {
    let kind = if input.conversation {
        IdKind::Conversation
    } else {
        IdKind::Response
    };
    let other_kind = if kind == IdKind::Response {
        IdKind::Conversation
    } else {
        IdKind::Response
    };
    let site = SiteName::new(input.site).unwrap_or_else(|_| SiteName::new("east").unwrap());
    let digest = ClusterDigest::from_hex(&format!("{:08x}", input.digest)).unwrap();
    let key = input.key.map(|bytes| TagKey::from_bytes(&bytes).unwrap());
    let keys = TagKeys::new(key.clone());
    let engine_id = format!("{}{}", kind.prefix(), input.id_part);

    for raw in [input.raw] {
        for k in [kind, other_kind] {
            check_accepted(&keys, &[&keys], k, raw);
        }
    }

    let Some(tagged) = keys.tag(kind, &engine_id, &site, digest) else {
        return;
    };
    let untagged = keys
        .untag(kind, &tagged)
        .unwrap_or_else(|e| panic!("a fresh tag is refused: {e}"));
    assert_eq!(untagged.engine_id(), engine_id);
    assert_eq!(untagged.site(), &site);
    assert_eq!(untagged.digest(), digest);
    assert_eq!(untagged.kind(), kind);
    assert_eq!(keys.untag(other_kind, &tagged), Err(BadTag::WrongKind));

    // Rotation: the old tag verifies exactly while the old key is named as previous.
    let next = input
        .next_key
        .map(|bytes| TagKey::from_bytes(&bytes).unwrap());
    let rotated =
        TagKeys::new(next.clone()).with_previous(key.clone().filter(|_| input.keep_previous));
    let verdict = rotated.untag(kind, &tagged);
    match (&input.key, &input.next_key) {
        (_, None) => assert!(verdict.is_ok(), "no key accepts any well-formed tag"),
        (None, Some(_)) => assert_eq!(verdict, Err(BadTag::BadMac)),
        (Some(old), Some(new)) if old == new => assert!(verdict.is_ok()),
        (Some(_), Some(_)) => assert_eq!(verdict.is_ok(), input.keep_previous, "{verdict:?}"),
    }

    // An edited tag: accepted only as what a stamp writes.
    let mut edited = tagged.clone().into_bytes();
    for &(at, byte) in &input.edits {
        if !edited.is_empty() {
            let at = usize::from(at) % edited.len();
            edited[at] = byte;
        }
    }
    if let Ok(edited) = String::from_utf8(edited) {
        check_accepted(&keys, &[&keys], kind, &edited);
        // After a rotation a tag may verify under the previous key, while it is named.
        check_accepted(&rotated, &[&rotated, &keys], kind, &edited);
    }
});

/// Untags `text` as `kind` with `keys`; an accepted id must be safe and, with a key,
/// exactly what one of `signers` (the keys that may have signed it) writes.
fn check_accepted(keys: &TagKeys, signers: &[&TagKeys], kind: IdKind, text: &str) {
    let Ok(untagged) = keys.untag(kind, text) else {
        return;
    };
    let engine_id = untagged.engine_id();
    let part = engine_id
        .strip_prefix(kind.prefix())
        .unwrap_or_else(|| panic!("an accepted id lost its prefix"));
    assert!(!part.is_empty(), "an accepted id is empty");
    assert!(
        part.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')),
        "an accepted id is not unreserved"
    );
    assert!(!part.contains(".."), "an accepted id holds '..'");
    if keys.is_keyed() {
        // Overlong ids and ids shaped like tags are not tagged again; any other accepted
        // tag must be exactly the stamp's text.
        let again: Vec<Option<String>> = signers
            .iter()
            .filter(|signer| signer.is_keyed())
            .map(|signer| signer.tag(kind, engine_id, untagged.site(), untagged.digest()))
            .collect();
        if again.iter().any(Option::is_some) {
            assert!(
                again.iter().any(|tag| tag.as_deref() == Some(text)),
                "an accepted tag differs from the stamp's text"
            );
        }
    }
}
