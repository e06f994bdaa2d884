//! Content digests (`sha256:<64 hex>`), the only algorithm the official image uses.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A `sha256:` content digest in canonical form (lower-case hex).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("digest {0:?} does not start with \"sha256:\"; only sha256 digests are supported")]
    Algorithm(String),
    #[error("digest {0:?} must carry exactly 64 lower-case hex characters after \"sha256:\"")]
    Encoding(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest {
            hex: hex_lower(&Sha256::digest(bytes)),
        }
    }

    /// The 64 hex characters, without the algorithm.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The first 12 hex characters, for people reading tables.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }

    /// Whether `bytes` hash to this digest.
    pub fn verifies(&self, bytes: &[u8]) -> bool {
        Digest::of(bytes) == *self
    }
}

pub(crate) fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
    out
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| DigestError::Algorithm(s.to_owned()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Encoding(s.to_owned()));
        }
        Ok(Digest {
            hex: hex.to_owned(),
        })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest(sha256:{})", self.hex)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty_input_is_the_well_known_one() {
        assert_eq!(
            Digest::of(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parse_round_trips_and_verifies() {
        let d: Digest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            .parse()
            .unwrap();
        assert!(d.verifies(b""));
        assert!(!d.verifies(b"x"));
        assert_eq!(d.short(), "e3b0c44298fc");
    }

    #[test]
    fn parse_refuses_other_algorithms_and_bad_hex() {
        assert!(matches!(
            "sha512:00".parse::<Digest>(),
            Err(DigestError::Algorithm(_))
        ));
        assert!(matches!(
            "sha256:abc".parse::<Digest>(),
            Err(DigestError::Encoding(_))
        ));
        let upper = format!("sha256:{}", "A".repeat(64));
        assert!(matches!(
            upper.parse::<Digest>(),
            Err(DigestError::Encoding(_))
        ));
    }
}
