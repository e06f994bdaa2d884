//! Clean-up that also happens when a test fails: an environment's machines removed on drop.

use std::path::PathBuf;
use std::sync::Arc;

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::Runtime;

use super::e2e::{Backend, Host, NAMESPACE};

/// What `program args` printed on stdout, or nothing when it could not run: clean-up runs a
/// runtime's own client (`ctr`, `docker`) and carries on whatever it answers.
pub fn stdout_of(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

impl Host {
    /// A guard that removes every machine of environment `id` when dropped, also when the test
    /// fails before its own clean-up.
    pub fn cleanup(&self, id: &str) -> Cleanup {
        Cleanup {
            backend: self.backend,
            socket: self.socket.clone(),
            fifo_dir: self.daemon.dir.path().join("cleanup-fifo"),
            id: id.to_owned(),
        }
    }
}

/// Removes an environment's machines on drop, through a client of its own on a runtime of its
/// own (the test's may be unwinding).
pub struct Cleanup {
    backend: Backend,
    socket: String,
    fifo_dir: PathBuf,
    id: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (backend, socket, fifo_dir, id) = (
            self.backend,
            PathBuf::from(&self.socket),
            self.fifo_dir.clone(),
            self.id.clone(),
        );
        let removal = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            // The clients are made inside the runtime: they spawn their connections on it.
            rt.block_on(async {
                let runtime: Arc<dyn Runtime> = match backend {
                    Backend::Containerd => match Containerd::new(ContainerdConfig {
                        socket,
                        namespace: NAMESPACE.to_owned(),
                        snapshotter: "overlayfs".to_owned(),
                        insecure_registries: Vec::new(),
                        fifo_dir,
                        network: None,
                        sandbox: narya_runtimes::Sandbox::Container,
                    }) {
                        Ok(c) => Arc::new(c),
                        Err(_) => return,
                    },
                    Backend::Docker | Backend::Podman => match Docker::new(DockerConfig {
                        socket,
                        insecure_registries: Vec::new(),
                        network: None,
                        sandbox: narya_runtimes::Sandbox::Container,
                        // Only removals are made here: nothing is written to it.
                        profile_dir: std::env::temp_dir().join("narya-test-profiles"),
                    }) {
                        Ok(d) => Arc::new(d),
                        Err(_) => return,
                    },
                };
                for machine in runtime.machines_of(&id).await.unwrap_or_default() {
                    let _ = runtime.remove(&machine.id).await;
                }
            });
        });
        let _ = removal.join();
    }
}
