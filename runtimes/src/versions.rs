//! The runtime versions the test suite runs on (the README's "Tested runtime versions"), and
//! whether a runtime's reported version is older than every one of them.

/// An engine and the versions the suite passes on, oldest first.
pub struct Tested {
    /// The engine's name, as [`engine_of`] tells it from a runtime's version text.
    pub engine: &'static str,
    pub versions: &'static [&'static str],
}

/// What `contrib/test.sh` runs on: bookworm's packages and the runtime matrix's newer ones.
pub const TESTED: &[Tested] = &[
    Tested {
        engine: "containerd",
        versions: &["1.6.20", "1.7.24", "2.1.9"],
    },
    Tested {
        engine: "Docker Engine",
        versions: &["20.10.24", "28.5.2"],
    },
    Tested {
        engine: "Podman",
        versions: &["4.3.1", "5.4.2"],
    },
];

/// The engine a runtime's version text (what `Runtime::version` answers) comes from: containerd
/// answers a bare version; a Docker-compatible engine names itself first ("Docker Engine 28.5.2
/// (API 1.51)", "Podman 5.4.2 (API 1.41)").
pub fn engine_of(runtime: &str, version_text: &str) -> &'static str {
    if runtime == "containerd" {
        "containerd"
    } else if version_text.starts_with("Podman") {
        "Podman"
    } else {
        "Docker Engine"
    }
}

/// The first dotted number in `text` ("v2.1.9+unknown" → [2, 1, 9], "20.10.24+dfsg1" →
/// [20, 10, 24]); missing parts are 0. None when `text` holds no number.
pub fn release(text: &str) -> Option<[u64; 3]> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let dotted: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = [0u64; 3];
    for (part, number) in parts.iter_mut().zip(dotted.split('.')) {
        *part = number.parse().ok()?;
    }
    Some(parts)
}

/// The oldest tested version of the engine behind `version_text`, when the runtime is older than
/// it (by major.minor.patch); None when it is as new or newer, or its version cannot be read.
pub fn older_than_tested(runtime: &str, version_text: &str) -> Option<&'static str> {
    let engine = engine_of(runtime, version_text);
    let oldest = TESTED
        .iter()
        .find(|t| t.engine == engine)?
        .versions
        .first()?;
    // Docker's text names the engine first: its version is the first number after the name.
    let version = release(version_text.strip_prefix(engine).unwrap_or(version_text))?;
    (version < release(oldest)?).then_some(*oldest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_each_engine_reports() {
        assert_eq!(release("2.1.9+unknown"), Some([2, 1, 9]));
        assert_eq!(release("v1.7.24"), Some([1, 7, 24]));
        assert_eq!(release("1.6.20~ds1"), Some([1, 6, 20]));
        assert_eq!(
            release("Docker Engine 20.10.24+dfsg1 (API 1.41)"),
            Some([20, 10, 24])
        );
        assert_eq!(release("28"), Some([28, 0, 0]));
        assert_eq!(release("unknown"), None);
    }

    #[test]
    fn only_a_runtime_older_than_the_oldest_tested_is_named() {
        assert_eq!(
            older_than_tested("containerd", "1.4.13~ds1"),
            Some("1.6.20")
        );
        assert_eq!(older_than_tested("containerd", "1.6.20~ds1"), None);
        assert_eq!(older_than_tested("containerd", "2.2.0"), None);
        assert_eq!(
            older_than_tested("docker", "Docker Engine 20.10.5+dfsg1 (API 1.41)"),
            Some("20.10.24")
        );
        assert_eq!(
            older_than_tested("docker", "Docker Engine 28.5.2+dfsg4 (API 1.51)"),
            None
        );
        assert_eq!(
            older_than_tested("docker", "Podman 3.0.1 (API 1.40)"),
            Some("4.3.1")
        );
        assert_eq!(older_than_tested("docker", "Podman 5.4.2 (API 1.41)"), None);
        // Under gVisor the text says more after the version; the version still decides.
        assert_eq!(
            older_than_tested(
                "docker",
                "Docker Engine 28.5.2 (API 1.51), machines under gVisor (engine runtime \"runsc\")"
            ),
            None
        );
        assert_eq!(older_than_tested("containerd", "unknown"), None);
    }

    #[test]
    fn every_engine_lists_its_tested_versions_oldest_first() {
        for tested in TESTED {
            let releases: Vec<_> = tested.versions.iter().map(|v| release(v)).collect();
            assert!(releases.iter().all(Option::is_some), "{}", tested.engine);
            assert!(
                releases.windows(2).all(|w| w[0] < w[1]),
                "{}",
                tested.engine
            );
        }
    }
}
