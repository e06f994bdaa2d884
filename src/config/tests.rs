//! The configuration's parsing, defaults and refusals.

use std::time::Duration;

use narya_runtimes::{Network, User};

use super::*;

const MINIMAL: &str = r#"
[identity]
issuer = "https://id.example.com"
audience = "narya"
"#;

#[test]
fn minimal_file_takes_the_contract_defaults() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.state_dir, PathBuf::from("/var/lib/narya"));
    assert_eq!(c.listen.socket, PathBuf::from("/run/narya/narya.sock"));
    assert_eq!(c.listen.tcp, None);
    assert_eq!(c.listen.metrics, None, "metrics are off by default");
    assert_eq!(c.shutdown_timeout.0, Duration::from_secs(30));
    assert_eq!(c.listen.header_timeout.0, Duration::from_secs(10));
    assert_eq!(c.listen.idle_timeout.0, Duration::from_secs(120));
    assert_eq!(c.listen.max_connections, 1024);
    assert_eq!(c.log.format, LogFormat::Text);
    assert_eq!(c.pool.size, 2, "two machines are kept started by default");
    assert_eq!(c.identity.person_claim, "sub");
    assert_eq!(c.identity.organisation_claim, "org");
    assert_eq!(
        c.identity.algorithms,
        vec![Algorithm::RS256, Algorithm::ES256]
    );
    assert_eq!(c.identity.leeway.0, Duration::from_secs(30));
    assert_eq!(c.runtime.backend, Backend::Containerd);
    assert_eq!(c.runtime.containerd_namespace, "narya");
    assert_eq!(c.runtime.snapshotter, "overlayfs");
    assert_eq!(
        c.image.reference.to_string(),
        "oci-layout:/var/lib/narya/images/official"
    );
    assert_eq!(
        c.environment.user,
        User {
            uid: 1000,
            gid: 1000
        }
    );
    assert_eq!(c.environment.workspace, "/workspace");
    assert_eq!(c.environment.network, Network::Isolated);
    assert_eq!(c.network.subnet.to_string(), "10.89.0.0/16");
    assert!(c.network.dns.is_empty());
    assert_eq!(
        c.network.cni_bin_dir[0],
        std::path::PathBuf::from("/usr/lib/cni")
    );
    assert_eq!(c.environment.setup_timeout.0, Duration::from_secs(900));
    assert_eq!(c.environment.clone_timeout.0, Duration::from_secs(600));
    assert_eq!(c.environment.output_limit, 65536);
    assert_eq!(c.environment.exec_timeout.0, Duration::from_secs(1800));
    assert_eq!(c.environment.gone_retention.0, Duration::from_secs(86400));
    assert!(c.github.is_none());
    assert_eq!(c.database_path(), PathBuf::from("/var/lib/narya/narya.db"));
    assert_eq!(c.host.reserve_disk, 2 << 30);
    assert_eq!(c.organisation.max_environments, 100);
    assert_eq!(c.organisation.max_event_streams, 8);
}

#[test]
fn fair_shares_and_the_hosts_reserve_are_read_and_checked() {
    let c = Config::parse(&format!(
        "{MINIMAL}\n[host]\nreserve_disk = \"512MiB\"\n[organisation]\nmax_environments = 3\nmax_event_streams = 1\n"
    ))
    .unwrap();
    assert_eq!(c.host.reserve_disk, 512 << 20);
    assert_eq!(c.organisation.max_environments, 3);
    assert_eq!(c.organisation.max_event_streams, 1);
    let zero = Config::parse(&format!(
        "{MINIMAL}\n[organisation]\nmax_environments = 0\n"
    ));
    assert!(zero.unwrap_err().contains("organisation.max_environments"));
    let bad = Config::parse(&format!("{MINIMAL}\n[host]\nreserve_disk = \"2GB\"\n"));
    assert!(bad.is_err());
}

#[test]
fn example_configuration_in_contrib_parses() {
    let text = include_str!("../../contrib/naryad.example.toml");
    let c = Config::parse(text).unwrap();
    assert_eq!(c.listen.tcp, Some("127.0.0.1:7070".parse().unwrap()));
    assert!(c.github.is_some());
    let defaults = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.shutdown_timeout, defaults.shutdown_timeout);
    assert_eq!(c.listen.header_timeout, defaults.listen.header_timeout);
    assert_eq!(c.listen.idle_timeout, defaults.listen.idle_timeout);
    assert_eq!(c.listen.max_connections, defaults.listen.max_connections);
    assert_eq!(c.log.format, defaults.log.format);
    assert_eq!(c.pool.size, defaults.pool.size);
}

#[test]
fn prebuilds_are_off_by_default_and_bounded_by_max_bytes() {
    let defaults = Config::parse(MINIMAL).unwrap();
    assert!(!defaults.prebuild.enabled, "off while new");
    assert_eq!(defaults.prebuild.max_bytes, 20 << 30);
    let on = Config::parse(&format!(
        "{MINIMAL}\n[prebuild]\nenabled = true\nmax_bytes = \"512MiB\"\n"
    ))
    .unwrap();
    assert!(on.prebuild.enabled);
    assert_eq!(on.prebuild.max_bytes, 512 << 20);
    let vague =
        Config::parse(&format!("{MINIMAL}\n[prebuild]\nmax_bytes = \"5GB\"\n")).unwrap_err();
    assert!(vague.contains("GiB"), "{vague}");
    let typo = Config::parse(&format!("{MINIMAL}\n[prebuild]\nenable = true\n")).unwrap_err();
    assert!(typo.contains("enable"), "{typo}");
}

#[test]
fn the_sandbox_is_runc_by_default_and_gvisor_names_runsc_per_back_end() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.runtime.sandbox, SandboxKind::Container);
    assert_eq!(c.runtime.sandbox(), narya_runtimes::Sandbox::Container);
    let c = Config::parse(&format!("{MINIMAL}\n[runtime]\nsandbox = \"gvisor\"\n")).unwrap();
    assert_eq!(
        c.runtime.sandbox(),
        narya_runtimes::Sandbox::Gvisor {
            runsc: "/usr/bin/runsc".to_owned()
        }
    );
    let docker = format!("{MINIMAL}\n[runtime]\nbackend = \"docker\"\nsandbox = \"gvisor\"\n");
    assert_eq!(
        Config::parse(&docker).unwrap().runtime.sandbox(),
        narya_runtimes::Sandbox::Gvisor {
            runsc: "runsc".to_owned()
        }
    );
    let relative = format!("{MINIMAL}\n[runtime]\nsandbox = \"gvisor\"\nrunsc = \"runsc\"\n");
    let e = Config::parse(&relative).unwrap_err();
    assert!(e.contains("runtime.runsc") && e.contains("absolute"), "{e}");
    let unknown = format!("{MINIMAL}\n[runtime]\nsandbox = \"kata\"\n");
    let e = Config::parse(&unknown).unwrap_err();
    assert!(e.contains("sandbox") && e.contains("gvisor"), "{e}");
}

#[test]
fn a_pool_can_be_sized_or_turned_off_but_not_made_huge() {
    let sized = Config::parse(&format!("{MINIMAL}\n[pool]\nsize = 8\n")).unwrap();
    assert_eq!(sized.pool.size, 8);
    let off = Config::parse(&format!("{MINIMAL}\n[pool]\nsize = 0\n")).unwrap();
    assert_eq!(off.pool.size, 0);
    let huge = Config::parse(&format!("{MINIMAL}\n[pool]\nsize = 100000\n")).unwrap_err();
    assert!(huge.contains("pool.size"), "{huge}");
    let typo = Config::parse(&format!("{MINIMAL}\n[pool]\nsise = 1\n")).unwrap_err();
    assert!(typo.contains("sise"), "{typo}");
}

#[test]
fn json_logs_and_transport_limits_are_read() {
    let text = format!(
        "shutdown_timeout = \"2s\"\n{MINIMAL}\n[listen]\nheader_timeout = \"3s\"\n\
         idle_timeout = \"4s\"\nmax_connections = 5\nmetrics = \"127.0.0.1:9464\"\n\n\
         [log]\nformat = \"json\"\n"
    );
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.shutdown_timeout.0, Duration::from_secs(2));
    assert_eq!(c.listen.header_timeout.0, Duration::from_secs(3));
    assert_eq!(c.listen.idle_timeout.0, Duration::from_secs(4));
    assert_eq!(c.listen.max_connections, 5);
    assert_eq!(c.listen.metrics, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(c.log.format, LogFormat::Json);
}

#[test]
fn transport_limits_that_would_serve_nothing_are_refused() {
    for (key, value) in [
        ("max_connections", "0"),
        ("max_connections", "100000000"),
        ("header_timeout", "\"0s\""),
        ("idle_timeout", "\"0s\""),
    ] {
        let text = format!("{MINIMAL}\n[listen]\n{key} = {value}\n");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
    let text = format!("{MINIMAL}\n[log]\nformat = \"xml\"\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("xml"), "{err}");
}

#[test]
fn unknown_key_is_refused_by_name() {
    let text = format!("{MINIMAL}\n[environment]\nsetup_timout = \"5m\"\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("setup_timout"), "{err}");
}

#[test]
fn unknown_top_level_key_is_refused_by_name() {
    let text = format!("statedir = \"/tmp\"\n{MINIMAL}");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("statedir"), "{err}");
}

#[test]
fn bad_duration_is_refused_naming_the_key() {
    let text = format!("{MINIMAL}\n[environment]\nsetup_timeout = \"15 parsecs\"\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("setup_timeout"), "{err}");
    assert!(err.contains("15 parsecs"), "{err}");
}

#[test]
fn bare_number_is_not_a_duration() {
    let text = format!("{MINIMAL}leeway = \"30\"\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("leeway"), "{err}");
}

#[test]
fn jwks_refresh_defaults_to_fifteen_minutes() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.identity.jwks_refresh.0, Duration::from_secs(15 * 60));
    let c = Config::parse(&format!("{MINIMAL}jwks_refresh = \"2s\"\n")).unwrap();
    assert_eq!(c.identity.jwks_refresh.0, Duration::from_secs(2));
    let err = Config::parse(&format!("{MINIMAL}jwks_refresh = \"0s\"\n")).unwrap_err();
    assert!(err.contains("identity.jwks_refresh"), "{err}");
}

#[test]
fn leeway_above_five_minutes_is_refused_naming_the_key() {
    assert!(Config::parse(&format!("{MINIMAL}leeway = \"5m\"\n")).is_ok());
    let err = Config::parse(&format!("{MINIMAL}leeway = \"5m 1s\"\n")).unwrap_err();
    assert!(err.contains("identity.leeway"), "{err}");
}

fn identity(issuer: &str, jwks_uri: Option<&str>) -> String {
    let jwks = jwks_uri
        .map(|u| format!("jwks_uri = {u:?}\n"))
        .unwrap_or_default();
    format!("[identity]\nissuer = {issuer:?}\naudience = \"narya\"\n{jwks}")
}

#[test]
fn plain_http_issuers_and_key_sets_are_accepted_only_on_loopback() {
    for url in [
        "http://127.0.0.1:8080",
        "http://127.1.2.3",
        "http://[::1]:9000/realm",
        "http://localhost:8080",
        "http://LOCALHOST",
    ] {
        Config::parse(&identity(url, None)).unwrap_or_else(|e| panic!("{url}: {e}"));
        let jwks = format!("{url}/jwks");
        Config::parse(&identity("https://id.example.com", Some(&jwks)))
            .unwrap_or_else(|e| panic!("{jwks}: {e}"));
    }
    for url in [
        "http://id.example.com",
        "HTTP://id.example.com",
        "http://10.0.0.1",
        "http://[fe80::1]",
        "http://localhost.example.com",
        "http://127.0.0.1.example.com",
    ] {
        let err = Config::parse(&identity(url, None)).unwrap_err();
        assert!(err.contains("identity.issuer"), "{url}: {err}");
        let jwks = format!("{url}/jwks");
        let err = Config::parse(&identity("https://id.example.com", Some(&jwks))).unwrap_err();
        assert!(err.contains("identity.jwks_uri"), "{jwks}: {err}");
    }
    // Issuers that are not http:// at all are compared as given, as before.
    Config::parse(&identity("narya-dev", Some("file:///etc/narya/jwks.json"))).unwrap();
}

#[test]
fn missing_identity_is_refused() {
    let err = Config::parse("state_dir = \"/tmp/x\"\n").unwrap_err();
    assert!(err.contains("identity"), "{err}");
}

#[test]
fn symmetric_algorithms_cannot_be_configured() {
    let text = format!("{MINIMAL}algorithms = [\"HS256\"]\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("HS256"), "{err}");
}

#[test]
fn bad_user_network_and_reference_are_refused() {
    for (key, value) in [
        ("user", "\"root\""),
        ("network", "\"bridge\""),
        ("workspace", "\"workspace\""),
    ] {
        let text = format!("{MINIMAL}\n[environment]\n{key} = {value}\n");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
    let text = format!("{MINIMAL}\n[image]\nreference = \"official:1\"\n");
    let err = Config::parse(&text).unwrap_err();
    assert!(err.contains("reference"), "{err}");
}

#[test]
fn the_network_section_is_read_and_checked() {
    let text = format!(
        "{MINIMAL}\n[environment]\nnetwork = \"host\"\n[network]\nsubnet = \"10.7.0.0/24\"\ndns = [\"192.0.2.53\"]\ncni_bin_dir = [\"/x\"]\n"
    );
    let c = Config::parse(&text).unwrap();
    assert_eq!(c.environment.network, Network::Host);
    assert_eq!(c.network.subnet.to_string(), "10.7.0.0/24");
    assert_eq!(c.network.dns[0].to_string(), "192.0.2.53");
    assert_eq!(c.network.cni_bin_dir, [std::path::PathBuf::from("/x")]);
    for (key, bad) in [("subnet", "\"10.7.0.1/24\""), ("dns", "[\"resolver\"]")] {
        let text = format!("{MINIMAL}\n[network]\n{key} = {bad}\n");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("naryad.toml");
    std::fs::write(&path, "[identity]\nissuer = \"x\"\n").unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("audience"), "{err}");
}
