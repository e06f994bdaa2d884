//! Values written as TOML strings: durations, sizes, `uid:gid` users, networks, parsed
//! references.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use narya_runtimes::{Network, User};
use serde::{Deserialize, Deserializer};

/// A duration written as a string such as `"90s"` or `"15m"`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl fmt::Debug for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses `"90s"`, `"15m"`, `"1h 30m"`; a bare number or an unknown unit is an error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "invalid duration {text:?} ({e}); write a number with a unit, e.g. \"90s\" or \"15m\""
        )
    })
}

/// Whether `url` is plain `http://` to a host other than loopback (127.0.0.0/8, ::1,
/// localhost): over such a link the network could forge keys or the issuer's answers.
pub fn is_plain_http_off_loopback(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        // Not a URL at all: only an `http://` prefix makes it plain HTTP.
        return url
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("http://"));
    };
    if parsed.scheme() != "http" {
        return false;
    }
    let Some(host) = parsed.host_str() else {
        return true;
    };
    // An IPv6 host comes back in brackets.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => !host.eq_ignore_ascii_case("localhost"),
    }
}

pub(super) fn from_str<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// Parses `"UID:GID"`.
pub fn parse_user(text: &str) -> Result<User, String> {
    let err = || format!("invalid user {text:?}; write numeric \"uid:gid\", e.g. \"1000:1000\"");
    let (uid, gid) = text.split_once(':').ok_or_else(err)?;
    Ok(User {
        uid: uid.parse().map_err(|_| err())?,
        gid: gid.parse().map_err(|_| err())?,
    })
}

pub(super) fn user<'de, D: Deserializer<'de>>(deserializer: D) -> Result<User, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_user(&text).map_err(serde::de::Error::custom)
}

pub(super) fn network<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Network, D::Error> {
    match String::deserialize(deserializer)?.as_str() {
        "host" => Ok(Network::Host),
        "none" => Ok(Network::None),
        "isolated" => Ok(Network::Isolated),
        other => Err(serde::de::Error::custom(format!(
            "invalid network {other:?}; expected \"isolated\", \"none\" or \"host\""
        ))),
    }
}

/// Parses a size: `"4GiB"`, `"512MiB"`, `"64KiB"`, `"1TiB"`, `"1000B"` (binary units only, so
/// that `"4GB"` cannot silently mean either).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "invalid size {text:?}; write a whole number with a unit of B, KiB, MiB, GiB or TiB, \
             e.g. \"4GiB\""
        )
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(err)?;
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| err())?;
    let shift = match unit.trim() {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return Err(err()),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

pub(super) fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_bytes(&text).map_err(serde::de::Error::custom)
}

/// `[limits] disk`: a size, or no bound at all (only when the file says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskLimit {
    Bytes(u64),
    Unbounded,
}

impl DiskLimit {
    /// The bound in bytes; `None`: unbounded.
    pub fn bytes(self) -> Option<u64> {
        match self {
            DiskLimit::Bytes(bytes) => Some(bytes),
            DiskLimit::Unbounded => None,
        }
    }
}

impl<'de> Deserialize<'de> for DiskLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim() == "unbounded" {
            return Ok(DiskLimit::Unbounded);
        }
        parse_bytes(&text)
            .map(DiskLimit::Bytes)
            .map_err(|e| serde::de::Error::custom(format!("{e}, or \"unbounded\"")))
    }
}
