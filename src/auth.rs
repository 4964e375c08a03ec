//! Optional API keys: `Authorization: Bearer <key>` checked against a file of
//! keys (or their SHA-256), before any queueing.
//!
//! Keys are kept only as SHA-256 digests and compared in constant time: a
//! request's key is hashed and checked against every digest without an early
//! exit, so timing reveals neither a key nor how much of one matched.

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error("no keys in the file")]
    Empty,
}

#[derive(Clone)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print keys, not even their digests.
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

impl ApiKeys {
    /// Parse a keys file: one key per line, or its SHA-256 as 64 hex digits;
    /// blank lines and lines starting with `#` are ignored.
    pub fn parse(text: &str) -> Result<Self, KeysError> {
        let digests: Vec<[u8; 32]> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| hex_digest(l).unwrap_or_else(|| Sha256::digest(l.as_bytes()).into()))
            .collect();
        if digests.is_empty() {
            return Err(KeysError::Empty);
        }
        Ok(ApiKeys { digests })
    }

    /// Whether an `Authorization` header value carries a known key.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(key) = authorization.and_then(bearer) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(key).into();
        self.digests
            .iter()
            .fold(false, |found, d| found | constant_time_eq(d, &digest))
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token.trim_ascii())
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex_digest(line: &str) -> Option<[u8; 32]> {
    if line.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(line.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_hashed_keys() {
        let hashed = format!("{:x}", Sha256::digest(b"second-key"));
        let keys = ApiKeys::parse(&format!("# comment\n\nfirst-key\n  {hashed}  \n")).unwrap();
        assert!(keys.allows(Some(b"Bearer first-key")));
        assert!(keys.allows(Some(b"bearer second-key")));
        assert!(!keys.allows(Some(b"Bearer first-ke")));
        assert!(!keys.allows(Some(b"Bearer ")));
        assert!(!keys.allows(Some(b"Basic first-key")));
        assert!(!keys.allows(Some(b"first-key")));
        assert!(!keys.allows(Some(&[0xff, 0xfe])));
        assert!(!keys.allows(None));
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)");
    }

    #[test]
    fn an_empty_file_is_refused() {
        assert_eq!(
            ApiKeys::parse("# nothing\n\n").unwrap_err(),
            KeysError::Empty
        );
    }
}
