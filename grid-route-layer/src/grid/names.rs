use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A site name: a DNS-1123 label (1–63 of `[a-z0-9-]`, starting and ending alphanumeric).
///
/// Site names travel inside tagged ids and metric labels, so anything else is refused.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteName(Arc<str>);

/// A name that is not a valid site name; the message says which name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName {
    name: String,
    why: &'static str,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site name {:?} {}", self.name, self.why)
    }
}

impl std::error::Error for InvalidName {}

impl InvalidName {
    /// The refused name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why it was refused, e.g. `may hold only lowercase letters, digits and '-'`.
    pub fn reason(&self) -> &'static str {
        self.why
    }
}

impl SiteName {
    /// Longest DNS-1123 label.
    pub const MAX_LEN: usize = 63;

    /// Validates `name` as a DNS-1123 label.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        let refuse = |why| {
            Err(InvalidName {
                name: name.to_owned(),
                why,
            })
        };
        if name.is_empty() {
            return refuse("is empty");
        }
        if name.len() > Self::MAX_LEN {
            return refuse("is longer than 63 characters");
        }
        let bytes = name.as_bytes();
        if !bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        {
            return refuse("may hold only lowercase letters, digits and '-'");
        }
        if bytes[0] == b'-' || bytes[bytes.len() - 1] == b'-' {
            return refuse("must start and end with a letter or digit");
        }
        Ok(Self(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a shared string (a cheap clone, e.g. for a metric label).
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

impl fmt::Display for SiteName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SiteName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl FromStr for SiteName {
    type Err = InvalidName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The first 4 bytes of SHA-256 of a cluster's name, written as 8 lowercase hex digits.
///
/// Tagged ids carry the digest rather than the name, so renaming a cluster retires its ids
/// and names with dots or slashes never reach an id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterDigest([u8; 4]);

impl ClusterDigest {
    /// Length of the digest in hex digits.
    pub const HEX_LEN: usize = 8;

    /// The digest of a cluster name.
    pub fn of_name(name: &str) -> Self {
        let full = Sha256::digest(name.as_bytes());
        Self([full[0], full[1], full[2], full[3]])
    }

    /// The four digest bytes.
    pub fn to_bytes(self) -> [u8; 4] {
        self.0
    }

    /// Parses exactly 8 lowercase hex digits; anything else is `None`.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let bytes = hex.as_bytes();
        if bytes.len() != Self::HEX_LEN {
            return None;
        }
        let mut out = [0u8; 4];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (lower_hex_value(pair[0])? << 4) | lower_hex_value(pair[1])?;
        }
        Some(Self(out))
    }
}

fn lower_hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for ClusterDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ClusterDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterDigest({self})")
    }
}

/// Identifies one backend cluster: its site and its name (with the name's digest).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId {
    site: SiteName,
    name: Arc<str>,
    digest: ClusterDigest,
}

impl ClusterId {
    /// The cluster `name` at `site`.
    pub fn new(site: SiteName, name: &str) -> Self {
        Self {
            digest: ClusterDigest::of_name(name),
            site,
            name: name.into(),
        }
    }

    /// The cluster's site.
    pub fn site(&self) -> &SiteName {
        &self.site
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster's name as a shared string (a cheap clone, e.g. for a metric label).
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// The digest of the cluster's name.
    pub fn digest(&self) -> ClusterDigest {
        self.digest
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.site, self.name)
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_names_follow_dns_1123_labels() {
        for ok in ["east", "a", "us-east-1", "0", &"a".repeat(63)] {
            assert!(SiteName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "East",
            "-east",
            "east-",
            "e.ast",
            "e_ast",
            "é",
            &"a".repeat(64),
        ] {
            let err = SiteName::new(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn a_digest_is_eight_lowercase_hex_of_sha256_of_the_name() {
        // `printf east-a | sha256sum` starts with 1ef772aa.
        let digest = ClusterDigest::of_name("east-a");
        let hex = digest.to_string();
        assert_eq!(hex, "1ef772aa");
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(ClusterDigest::from_hex(&hex), Some(digest));
        assert_eq!(ClusterDigest::from_hex(&hex.to_uppercase()), None);
        assert_eq!(ClusterDigest::from_hex("0123456"), None);
    }
}
