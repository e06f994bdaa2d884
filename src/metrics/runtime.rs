//! The runtime as the daemon uses it, every failed call counted by kind.

use std::sync::Arc;

use futures_util::stream::BoxStream;
use narya_runtimes::{
    Change, ImageSource, MachineInfo, MachineSpec, MachineState, PinnedImage, ProcessOutcome,
    ProcessSpec, Result, Runtime, ThrowawayInfo, ThrowawaySpec,
};

use super::Metrics;

/// A runtime whose failed calls are counted; otherwise the runtime it wraps.
pub struct Metered {
    inner: Arc<dyn Runtime>,
    metrics: Metrics,
}

impl Metered {
    pub fn new(inner: Arc<dyn Runtime>, metrics: Metrics) -> Metered {
        Metered { inner, metrics }
    }

    fn counted<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.metrics.runtime_failed(e.kind());
        }
        result
    }
}

#[async_trait::async_trait]
impl Runtime for Metered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn version(&self) -> Result<String> {
        self.counted(self.inner.version().await)
    }

    async fn layers_dir(&self) -> Result<Option<std::path::PathBuf>> {
        self.counted(self.inner.layers_dir().await)
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        self.counted(self.inner.ensure_image(source).await)
    }

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        self.counted(self.inner.create_machine(spec).await)
    }

    async fn claim(&self, id: &str, environment: &str, organisation: &str) -> Result<bool> {
        self.counted(self.inner.claim(id, environment, organisation).await)
    }

    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        self.counted(self.inner.run(id, spec).await)
    }

    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        self.counted(self.inner.run_throwaway(spec).await)
    }

    async fn list_throwaways(&self) -> Result<Vec<ThrowawayInfo>> {
        self.counted(self.inner.list_throwaways().await)
    }

    async fn remove_throwaway(&self, name: &str) -> Result<()> {
        self.counted(self.inner.remove_throwaway(name).await)
    }

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        self.counted(self.inner.inspect(id).await)
    }

    async fn init_pid(&self, id: &str) -> Result<Option<u32>> {
        self.counted(self.inner.init_pid(id).await)
    }

    async fn kill_marked(&self, id: &str, entry: &str) -> Result<usize> {
        self.counted(self.inner.kill_marked(id, entry).await)
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        self.counted(self.inner.list().await)
    }

    async fn machines_of(&self, environment: &str) -> Result<Vec<MachineInfo>> {
        self.counted(self.inner.machines_of(environment).await)
    }

    async fn changes(&self) -> Result<BoxStream<'static, Change>> {
        self.counted(self.inner.changes().await)
    }

    async fn commit(&self, id: &str, name: &str) -> Result<narya_runtimes::Committed> {
        self.counted(self.inner.commit(id, name).await)
    }

    async fn remove_committed(&self, name: &str) -> Result<()> {
        self.counted(self.inner.remove_committed(name).await)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.counted(self.inner.start(id).await)
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.counted(self.inner.remove(id).await)
    }

    fn isolation(&self) -> Option<&narya_runtimes::network::Isolation> {
        self.inner.isolation()
    }

    async fn shutdown(&self) -> Result<()> {
        self.counted(self.inner.shutdown().await)
    }
}
