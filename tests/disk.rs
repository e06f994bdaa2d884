//! The host's disk against one environment, end to end through a real daemon: past
//! `[limits] disk` a write fails inside (in the workspace and in the machine's own layer alike)
//! while the environment stays ready and the host keeps the rest; a machine's own output never
//! grows the engine's log; and below `[host] reserve_disk` creates are refused with nothing
//! made and nothing recorded lost.

mod support;

use std::path::Path;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;
use support::e2e::{body, create, delete, exec, get, settled, unique_id, Backend, Host};

/// The bound the tests give: large enough for the image's layer metadata, small enough to
/// fill in seconds.
const BOUND: u64 = 256 << 20;

/// The measured sections take turns: three engines' tests filling the same filesystem at once
/// would each see the others' bytes.
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn free_bytes(path: &Path) -> u64 {
    nix::unistd::sync();
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    stat.blocks_available() * stat.fragment_size()
}

/// Runs `script` with `sh -c` in environment `id` as its user; answers its exit code and output.
async fn sh(host: &Host, id: &str, script: &str) -> (i64, String) {
    let answer = exec(&host.acme(), id, &["/bin/sh", "-c", script]).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", body(&answer));
    let ran = body(&answer);
    (
        ran["exit_code"].as_i64().unwrap_or(-1),
        ran["output"].as_str().unwrap_or_default().to_owned(),
    )
}

fn says_full(output: &str) -> bool {
    output.contains("Disk quota exceeded") || output.contains("No space left on device")
}

async fn writes_past_the_bound_fail_inside_and_the_host_keeps_the_rest(backend: Backend) {
    if support::state_root().is_none() {
        let message = "no quota filesystem (NARYA_TEST_STATE_ROOT): run contrib/test.sh as root";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{message} (CI=true: not skipping)"
        );
        eprintln!("skipped: {message}");
        return;
    }
    let Some(host) = Host::start_on(
        backend,
        &format!(
            "[limits]\ndisk = \"{}MiB\"\n[pool]\nsize = 0\n",
            BOUND >> 20
        ),
    )
    .await
    else {
        return;
    };
    let id = unique_id("full");
    let _removal = host.removal(&id);
    let made = create(&host.acme(), json!({ "id": id })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", body(&made));
    let workspace = host.workspace(&id);

    let turn = MEASURING.lock().await;
    let before = free_bytes(&workspace);
    // Half the bound in the workspace fits.
    let (code, output) = sh(
        &host,
        &id,
        "dd if=/dev/zero of=/workspace/half bs=1M count=128 2>&1 && sync",
    )
    .await;
    assert_eq!(code, 0, "half the bound fits in the workspace: {output}");
    // The machine's own layer (/var/tmp) shares the bound: it stops at the other half.
    let (code, output) = sh(
        &host,
        &id,
        "dd if=/dev/zero of=/var/tmp/more bs=1M count=512 2>&1; sync",
    )
    .await;
    assert!(
        says_full(&output),
        "/var/tmp went past the bound: {code} {output}"
    );
    // And the workspace is full now too.
    let (code, output) = sh(
        &host,
        &id,
        "dd if=/dev/zero of=/workspace/more bs=1M count=512 2>&1",
    )
    .await;
    assert!(
        code != 0 && says_full(&output),
        "the workspace went past the bound: {output}"
    );
    let after = free_bytes(&workspace);
    drop(turn);
    let taken = before.saturating_sub(after);
    eprintln!("bound {BOUND} B; the host's free space dropped by {taken} B");
    assert!(
        taken <= BOUND + BOUND / 100,
        "the host lost {taken} B to one environment bounded to {BOUND} B"
    );

    // Full is not broken: the environment still answers and reads ready.
    let (code, output) = sh(&host, &id, "rm /var/tmp/more && echo freed").await;
    assert_eq!((code, output.as_str()), (0, "freed\n"));
    let status = body(&get(&host.acme(), &id).await);
    assert_eq!(status["status"], "ready", "{status}");
    let deleted = delete(&host.acme(), &id).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

on_every_engine!(writes_past_the_bound_fail_inside_and_the_host_keeps_the_rest);

/// What a machine writes to its init's output for a minute never reaches the engine's log
/// (Docker and Podman keep one per container unless told otherwise).
async fn a_machines_own_output_leaves_the_engines_log_bounded(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[pool]\nsize = 0\n").await else {
        return;
    };
    let id = unique_id("chatty");
    let _removal = host.removal(&id);
    let made = create(&host.acme(), json!({ "id": id })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", body(&made));
    let (code, output) = sh(
        &host,
        &id,
        "timeout 60 cat /dev/zero > /proc/1/fd/1; echo wrote",
    )
    .await;
    assert_eq!(code, 0, "{output}");
    assert!(output.ends_with("wrote\n"), "{output}");
    let name = host.machine(&id).await.name;
    let inspected = std::process::Command::new("docker")
        .args(["-H", &format!("unix://{}", host.socket)])
        .args([
            "inspect",
            "-f",
            "{{.HostConfig.LogConfig.Type}} {{.LogPath}}",
            &name,
        ])
        .output()
        .unwrap();
    let inspected = String::from_utf8_lossy(&inspected.stdout).trim().to_owned();
    let (driver, log_path) = inspected.split_once(' ').unwrap_or((&inspected, ""));
    assert_eq!(driver, "none", "{inspected}");
    let logged = std::fs::metadata(log_path).map_or(0, |m| m.len());
    assert!(
        logged < 1 << 20,
        "the engine's log of {name} holds {logged} B"
    );
}

mod engine_logs {
    use super::support::e2e::Backend;

    #[tokio::test(flavor = "multi_thread")]
    async fn docker() {
        super::a_machines_own_output_leaves_the_engines_log_bounded(Backend::Docker).await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn podman() {
        super::a_machines_own_output_leaves_the_engines_log_bounded(Backend::Podman).await
    }
}

/// A small filesystem of the test's own holding the state directory (a tmpfs, mounted and
/// unmounted here).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("narya-small")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mount of a tmpfs");
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem until `left` bytes are free.
    fn fill_to(&self, left: u64) {
        let filler = std::fs::File::create(self.path().join("filler")).unwrap();
        let free = free_bytes(self.path());
        let take = free.saturating_sub(left);
        nix::fcntl::fallocate(&filler, nix::fcntl::FallocateFlags::empty(), 0, take as i64)
            .unwrap();
    }

    fn empty(&self) {
        let _ = std::fs::remove_file(self.path().join("filler"));
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Below `[host] reserve_disk` a create answers 503 NRY-0062 before anything is made; the
/// store, written on a full disk, opens clean afterwards with every record intact.
#[tokio::test(flavor = "multi_thread")]
async fn below_the_reserve_creates_are_refused_and_nothing_recorded_is_lost() {
    if support::e2e::requirements().is_none() {
        return;
    }
    let small = SmallDisk::mount(128 << 20);
    let state = small.path().join("state");
    let extra = format!(
        "state_dir = {:?}\n[limits]\ndisk = \"unbounded\"\n[host]\nreserve_disk = \"32MiB\"\n[pool]\nsize = 0\n",
        state.display().to_string()
    );
    let Some(mut host) = Host::start_on(Backend::Containerd, &extra).await else {
        return;
    };
    let kept = unique_id("kept");
    let _kept_removal = host.removal(&kept);
    let made = create(&host.acme(), json!({ "id": kept })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", body(&made));
    let recorded = body(&get(&host.acme(), &kept).await);
    let victim = unique_id("victim");
    let _victim_removal = host.removal(&victim);
    let made = create(&host.acme(), json!({ "id": victim })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", body(&made));

    small.fill_to(16 << 20);
    let refused_id = unique_id("refused");
    let _refused_removal = host.removal(&refused_id);
    let refused = create(&host.acme(), json!({ "id": refused_id })).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        body(&refused)
    );
    let error = body(&refused);
    assert_eq!(error["code"], "NRY-0062", "{error}");
    assert_eq!(
        host.machines_labelled(&refused_id).await,
        0,
        "nothing was made"
    );
    assert_eq!(
        get(&host.acme(), &refused_id).await.status,
        StatusCode::NOT_FOUND
    );

    // Nothing left at all: a delete must write the store, which fails. That is an answer (an
    // NRY code), never a crash, and reads go on.
    small.fill_to(0);
    let deleted = delete(&host.acme(), &victim).await;
    eprintln!(
        "delete on a full disk answered {} {}",
        deleted.status,
        String::from_utf8_lossy(&deleted.body)
    );
    if deleted.status != StatusCode::NO_CONTENT {
        assert!(deleted.status.is_server_error(), "{:?}", body(&deleted));
        assert!(
            body(&deleted)["code"]
                .as_str()
                .is_some_and(|c| c.starts_with("NRY-")),
            "{:?}",
            body(&deleted)
        );
    }
    let listed = get(&host.acme(), &kept).await;
    assert_eq!(
        listed.status,
        StatusCode::OK,
        "reads still answer on a full disk"
    );

    // Killed as a crash would, on the full disk; then room again, and a new start.
    host.daemon.kill();
    small.empty();
    tokio::task::block_in_place(|| host.daemon.restart());
    let reopened = settled(&host.acme(), &kept, Duration::from_secs(60)).await;
    assert_eq!(reopened["id"], recorded["id"]);
    assert_eq!(reopened["created_at"], recorded["created_at"]);
    assert_eq!(reopened["image_digest"], recorded["image_digest"]);
    assert_eq!(reopened["status"], "ready", "{reopened}");
    // The victim's record opens too, as whatever its delete managed to write.
    let victim_now = settled(&host.acme(), &victim, Duration::from_secs(60)).await;
    assert!(
        matches!(
            victim_now["status"].as_str(),
            Some("gone" | "ready" | "degraded")
        ),
        "{victim_now}"
    );
    for id in [&kept, &victim] {
        let deleted = delete(&host.acme(), id).await;
        assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    }
}
