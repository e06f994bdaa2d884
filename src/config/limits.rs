//! `[limits]` checked: against each other when the file is read, against the host at start-up.

use super::Config;

impl Config {
    pub(super) fn check_limits(&self) -> Result<(), String> {
        let limits = &self.limits;
        // Below these an environment could not run its own init, a shell and git.
        if limits.memory < 64 << 20 {
            return Err("key `limits.memory` must be at least \"64MiB\"".to_owned());
        }
        if !(limits.cpus.is_finite() && limits.cpus >= 0.01) {
            return Err("key `limits.cpus` must be a number of at least 0.01".to_owned());
        }
        if limits.pids < 16 {
            return Err("key `limits.pids` must be at least 16".to_owned());
        }
        if limits.tmp == 0 {
            return Err("key `limits.tmp` must be larger than zero".to_owned());
        }
        // /tmp is memory: as large as the whole allowance, filling it would leave nothing.
        if limits.tmp >= limits.memory {
            return Err(format!(
                "key `limits.tmp` ({} bytes) must be smaller than `limits.memory` ({} bytes): \
                 /tmp is held in the environment's memory",
                limits.tmp, limits.memory
            ));
        }
        // Below this the clone of a small repository and a shell's history would not fit.
        if limits.disk.bytes().is_some_and(|bytes| bytes < 16 << 20) {
            return Err(
                "key `limits.disk` must be at least \"16MiB\" (or \"unbounded\")".to_owned(),
            );
        }
        if limits.nofile.is_some_and(|n| n < 64) {
            return Err("key `limits.nofile` must be at least 64".to_owned());
        }
        Ok(())
    }

    /// Refuses limits this host cannot give: a `limits.nofile` above the hard `RLIMIT_NOFILE`
    /// the daemon itself has (the runtime, started like the daemon, cannot raise past it).
    /// `hard_nofile` is that limit (`None`: unknown, nothing refused).
    pub fn check_host(&self, hard_nofile: Option<u64>) -> Result<(), String> {
        match (self.limits.nofile, hard_nofile) {
            (Some(nofile), Some(hard)) if nofile > hard => Err(format!(
                "key `limits.nofile`: {nofile} is above this host's hard limit of open files \
                 ({hard}); set `[limits] nofile` to at most {hard}"
            )),
            _ => Ok(()),
        }
    }

    /// Lowers the default `limits.nofile` (the file did not give one) to the host's hard limit
    /// of open files when that is below it; answers the value it then takes, if lowered.
    pub fn fit_to_host(&mut self, hard_nofile: Option<u64>) -> Option<u64> {
        let hard = hard_nofile?;
        if self.limits.nofile.is_none() && self.limits.limits().nofile > hard {
            self.limits.nofile = Some(hard);
            return Some(hard);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_bytes;
    use super::*;

    const IDENTITY: &str =
        "[identity]\nissuer = \"https://id.example.com\"\naudience = \"narya\"\n";

    fn with(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{IDENTITY}\n{extra}"))
    }

    #[test]
    fn limits_default_to_the_contract() {
        let limits = with("").unwrap().limits.limits();
        assert_eq!(limits, narya_runtimes::Limits::default());
        assert_eq!(limits.memory, 4 << 30);
        assert_eq!(limits.tmp, 1 << 30);
        assert_eq!(limits.pids, 4096);
        assert_eq!(limits.nofile, 65536);
        assert_eq!(limits.cpus, 2.0);
        let c = with("").unwrap();
        assert_eq!(c.limits.disk, super::super::DiskLimit::Bytes(10 << 30));
    }

    #[test]
    fn the_disk_is_a_size_or_unbounded_only_when_written() {
        use super::super::DiskLimit;
        let c = with("[limits]\ndisk = \"64MiB\"\n").unwrap();
        assert_eq!(c.limits.disk, DiskLimit::Bytes(64 << 20));
        let c = with("[limits]\ndisk = \"unbounded\"\n").unwrap();
        assert_eq!(c.limits.disk, DiskLimit::Unbounded);
        for bad in ["\"10GB\"", "\"none\"", "\"1MiB\"", "0"] {
            let err = with(&format!("[limits]\ndisk = {bad}\n")).unwrap_err();
            assert!(err.contains("disk"), "{bad}: {err}");
        }
    }

    #[test]
    fn limits_are_read_with_binary_units() {
        let c = with("[limits]\nmemory = \"512MiB\"\ncpus = 0.5\npids = 100\ntmp = \"64MiB\"\nnofile = 1024\n")
            .unwrap();
        let limits = c.limits.limits();
        assert_eq!(limits.memory, 512 << 20);
        assert_eq!(limits.tmp, 64 << 20);
        assert_eq!(limits.cpu_quota_us(), 50_000);
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        assert_eq!(parse_bytes("4096B"), Ok(4096));
        for bad in ["4GB", "4", "GiB", "-1GiB", "1.5GiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_that_cannot_work_are_refused_naming_the_key() {
        for (extra, key) in [
            ("[limits]\ntmp = \"4GiB\"\n", "limits.tmp"),
            ("[limits]\nmemory = \"1MiB\"\n", "limits.memory"),
            ("[limits]\ncpus = 0.0\n", "limits.cpus"),
            ("[limits]\npids = 2\n", "limits.pids"),
            ("[limits]\nnofile = 3\n", "limits.nofile"),
            ("[limits]\ndisk = \"1MiB\"\n", "limits.disk"),
            ("[limits]\nmemory = \"4GB\"\n", "memory"),
            ("[limits]\nswap = \"1GiB\"\n", "swap"),
            ("[environment]\nuser = \"0:0\"\n", "environment.user"),
        ] {
            let err = with(extra).unwrap_err();
            assert!(err.contains(key), "{extra}: {err}");
        }
    }

    #[test]
    fn nofile_above_the_hosts_hard_limit_is_refused() {
        let c = with("[limits]\nnofile = 30000\n").unwrap();
        let err = c.check_host(Some(20000)).unwrap_err();
        assert!(
            err.contains("limits.nofile") && err.contains("20000"),
            "{err}"
        );
        assert!(c.check_host(Some(30000)).is_ok());
        assert!(c.check_host(None).is_ok());
    }

    #[test]
    fn the_default_nofile_fits_the_host_and_a_given_one_is_kept() {
        let mut c = with("").unwrap();
        assert!(
            c.check_host(Some(20000)).is_ok(),
            "the default is never refused"
        );
        assert_eq!(c.fit_to_host(Some(20000)), Some(20000));
        assert_eq!(c.limits.limits().nofile, 20000);
        let mut roomy = with("").unwrap();
        assert_eq!(roomy.fit_to_host(Some(1 << 20)), None);
        assert_eq!(roomy.limits.limits().nofile, 65536);
        let mut given = with("[limits]\nnofile = 1024\n").unwrap();
        assert_eq!(given.fit_to_host(Some(512)), None);
        assert_eq!(given.limits.limits().nofile, 1024);
    }
}
