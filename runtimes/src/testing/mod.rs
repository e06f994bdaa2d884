//! `FakeRuntime`: an in-memory `Runtime` for fast unit tests of the daemon, told by the test to
//! fail, stall, stop or lose machines at any step. Never a stand-in for a real back end.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::stream::{BoxStream, StreamExt};
use narya_oci::Digest;
use tokio::sync::broadcast;

use crate::{
    Change, ErrorKind, ImageSource, MachineInfo, MachineSpec, MachineState, PinnedImage,
    ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError, ThrowawayInfo, ThrowawaySpec,
};

mod process;
mod stall;
#[cfg(test)]
mod tests;

pub use process::{FakeOutcome, FakeProcess};
pub use stall::Stall;

use process::ProcessScript;
use stall::Gate;

/// One operation of the [`Runtime`] trait, to aim faults and stalls at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Version,
    EnsureImage,
    CreateMachine,
    Claim,
    Run,
    RunThrowaway,
    Inspect,
    InitPid,
    List,
    Changes,
    Start,
    Remove,
    Commit,
    RemoveCommitted,
}

/// An injected failure waiting for its call.
#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: ErrorKind,
    /// The call takes effect first, as if the runtime did it and the answer was lost.
    after_effect: bool,
}

#[derive(Debug, Default)]
struct Faults {
    next: VecDeque<Fault>,
    always: Option<ErrorKind>,
}

#[derive(Debug)]
struct Machine {
    info: MachineInfo,
    /// What `create_machine` was given; `None` for a machine given to `add_machine`.
    spec: Option<MachineSpec>,
}

struct State {
    down: bool,
    image_digest: Digest,
    machines: BTreeMap<String, Machine>,
    faults: HashMap<Op, Faults>,
    stalls: HashMap<Op, Arc<Gate>>,
    calls: HashMap<Op, usize>,
    processes: Vec<FakeProcess>,
    script: Option<Arc<ProcessScript>>,
    /// Layers kept by `commit`, by name: the machine each was committed from.
    committed: BTreeMap<String, String>,
    /// Replaced when the runtime goes down: dropping the old sender ends every change stream.
    changes: broadcast::Sender<Change>,
}

impl State {
    /// Reports that machine `id` changed.
    fn changed(&self, id: &str) {
        // No subscriber is not an error: nobody is watching.
        let _ = self.changes.send(Change::Machine(id.to_owned()));
    }
}

/// An in-memory container runtime that keeps the `Runtime` contract: machines live in a map,
/// processes end as the test scripts them (default: exit 0, no output) without running anything.
///
/// Each call counts itself, waits at its operation's [`Stall`] if there is one, then fails if
/// the runtime is down or a fault is aimed at it, and only then takes effect.
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl Default for FakeRuntime {
    fn default() -> FakeRuntime {
        FakeRuntime::new()
    }
}

impl FakeRuntime {
    /// A runtime that is up, has no machines, and resolves unpinned images to a fixed digest.
    pub fn new() -> FakeRuntime {
        FakeRuntime {
            state: Mutex::new(State {
                down: false,
                image_digest: Digest::of(b"narya fake runtime image"),
                machines: BTreeMap::new(),
                faults: HashMap::new(),
                stalls: HashMap::new(),
                calls: HashMap::new(),
                processes: Vec::new(),
                script: None,
                committed: BTreeMap::new(),
                changes: broadcast::channel(64).0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; its state still reads.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What an unpinned `ensure_image` resolves to from now on.
    pub fn set_image_digest(&self, digest: Digest) {
        self.lock().image_digest = digest;
    }

    /// The next call of `op` fails with `kind` and has no effect. Repeated, it queues: each
    /// fails one more call.
    pub fn fail_next(&self, op: Op, kind: ErrorKind) {
        self.queue_fault(op, kind, false);
    }

    /// The next call of `op` takes effect, then fails with `kind`: the runtime did it but the
    /// answer was lost (a machine made, a process run, a machine removed all the same).
    pub fn fail_next_after_effect(&self, op: Op, kind: ErrorKind) {
        self.queue_fault(op, kind, true);
    }

    fn queue_fault(&self, op: Op, kind: ErrorKind, after_effect: bool) {
        self.lock()
            .faults
            .entry(op)
            .or_default()
            .next
            .push_back(Fault { kind, after_effect });
    }

    /// Every call of `op` fails with `kind`, without effect, until [`FakeRuntime::heal`].
    pub fn fail_always(&self, op: Op, kind: ErrorKind) {
        self.lock().faults.entry(op).or_default().always = Some(kind);
    }

    /// Forgets every fault aimed at `op`, queued or lasting.
    pub fn heal(&self, op: Op) {
        self.lock().faults.remove(&op);
    }

    /// Down: every call fails `Unavailable` and every change stream ends; machines survive and
    /// are there again once it is up.
    pub fn set_down(&self, down: bool) {
        let mut state = self.lock();
        state.down = down;
        if down {
            state.changes = broadcast::channel(64).0;
        }
    }

    /// Calls of `op` from now on wait until the returned [`Stall`] is released or dropped.
    /// A second stall of the same `op` holds the calls after it; those the first holds wait
    /// for the first.
    pub fn stall(&self, op: Op) -> Stall {
        let (stall, gate) = Stall::new();
        self.lock().stalls.insert(op, gate);
        stall
    }

    /// Machine `id`'s init exits, as after an OOM kill: it is `Stopped` until started again.
    pub fn stop_machine(&self, id: &str) {
        let mut state = self.lock();
        if let Some(machine) = state.machines.get_mut(id) {
            if machine.info.state == MachineState::Running {
                machine.info.state = MachineState::Stopped;
                state.changed(id);
            }
        }
    }

    /// The runtime can no longer tell machine `id`'s state (a busy shim): `Unknown` until
    /// [`FakeRuntime::tell_state`]; processes still run in it, and `start` refuses it.
    pub fn hide_state(&self, id: &str) {
        self.set_state(id, MachineState::Unknown);
    }

    /// The runtime tells machine `id`'s state again: `Running`.
    pub fn tell_state(&self, id: &str) {
        self.set_state(id, MachineState::Running);
    }

    fn set_state(&self, id: &str, to: MachineState) {
        let mut state = self.lock();
        if let Some(machine) = state.machines.get_mut(id) {
            machine.info.state = to;
        }
    }

    /// Machine `id` is removed behind the daemon's back: `Missing` from now on.
    pub fn lose_machine(&self, id: &str) {
        let mut state = self.lock();
        if state.machines.remove(id).is_some() {
            state.changed(id);
        }
    }

    /// A Narya machine someone else made (an orphan, or one a crashed daemon left). One given
    /// as `Missing` is absent instead.
    pub fn add_machine(&self, info: MachineInfo) {
        let mut state = self.lock();
        let id = info.id.clone();
        if info.state == MachineState::Missing {
            state.machines.remove(&info.id);
        } else {
            state
                .machines
                .insert(info.id.clone(), Machine { info, spec: None });
        }
        state.changed(&id);
    }

    /// Every machine, sorted by id, whether the runtime is up or not.
    pub fn machines(&self) -> Vec<MachineInfo> {
        self.lock()
            .machines
            .values()
            .map(|m| m.info.clone())
            .collect()
    }

    /// What `create_machine` was given for machine `id`, while it exists.
    pub fn machine_spec(&self, id: &str) -> Option<MachineSpec> {
        self.lock().machines.get(id).and_then(|m| m.spec.clone())
    }

    /// How many calls of `op` were made, failed and stalled ones included.
    pub fn calls(&self, op: Op) -> usize {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Every process started by `run` and `run_throwaway`, in order.
    pub fn processes(&self) -> Vec<FakeProcess> {
        self.lock().processes.clone()
    }

    /// How every process from now on ends, decided from what it was asked to run.
    pub fn on_process(&self, script: impl Fn(&FakeProcess) -> FakeOutcome + Send + Sync + 'static) {
        self.lock().script = Some(Arc::new(script));
    }

    /// The opening of every call: counted, held at a stall, then failed if down or told to.
    /// Answers the fault to report once the call has taken effect, if one is aimed at it.
    async fn enter(&self, op: Op) -> Result<Option<ErrorKind>> {
        let gate = {
            let mut state = self.lock();
            *state.calls.entry(op).or_default() += 1;
            state
                .stalls
                .get(&op)
                .filter(|gate| !gate.is_released())
                .cloned()
        };
        if let Some(gate) = gate {
            gate.pass().await;
        }
        let mut state = self.lock();
        if state.down {
            return Err(RuntimeError::plain(
                ErrorKind::Unavailable,
                format!("the fake runtime is down ({op:?})"),
            ));
        }
        let Some(faults) = state.faults.get_mut(&op) else {
            return Ok(None);
        };
        match faults.next.pop_front() {
            Some(Fault {
                kind,
                after_effect: true,
            }) => Ok(Some(kind)),
            Some(Fault { kind, .. }) => Err(injected(op, kind)),
            None => match faults.always {
                Some(kind) => Err(injected(op, kind)),
                None => Ok(None),
            },
        }
    }

    /// Records `process` as started and answers how it ends.
    fn start_process(&self, process: FakeProcess) -> FakeOutcome {
        let script = {
            let mut state = self.lock();
            state.processes.push(process.clone());
            state.script.clone()
        };
        // Outside the lock: a script may itself stop or lose machines.
        script.map(|script| script(&process)).unwrap_or_default()
    }
}

fn injected(op: Op, kind: ErrorKind) -> RuntimeError {
    RuntimeError::plain(kind, format!("injected {kind:?} failure of {op:?}"))
}

/// The answer of a call that took effect: the fault aimed at it after its effect, if any.
fn answer<T>(after_effect: Option<ErrorKind>, op: Op, value: Result<T>) -> Result<T> {
    match after_effect {
        Some(kind) => Err(injected(op, kind)),
        None => value,
    }
}

fn not_running(id: &str) -> RuntimeError {
    RuntimeError::plain(ErrorKind::NotFound, format!("no running machine {id}"))
}

#[async_trait::async_trait]
impl Runtime for FakeRuntime {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn version(&self) -> Result<String> {
        let after = self.enter(Op::Version).await?;
        answer(after, Op::Version, Ok("fake".to_owned()))
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        let after = self.enter(Op::EnsureImage).await?;
        let digest = match &source.pinned {
            Some(digest) => digest.clone(),
            None => self.lock().image_digest.clone(),
        };
        let pinned = PinnedImage {
            reference: source.reference.clone(),
            digest,
        };
        answer(after, Op::EnsureImage, Ok(pinned))
    }

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        let after = self.enter(Op::CreateMachine).await?;
        let mut state = self.lock();
        if state.machines.contains_key(&spec.id) {
            let taken = RuntimeError::plain(
                ErrorKind::AlreadyExists,
                format!("machine {} exists", spec.id),
            );
            return answer(after, Op::CreateMachine, Err(taken));
        }
        if let Some(layer) = spec
            .layer
            .as_ref()
            .filter(|l| !state.committed.contains_key(*l))
        {
            let missing = RuntimeError::plain(ErrorKind::NotFound, format!("no layer {layer}"));
            return answer(after, Op::CreateMachine, Err(missing));
        }
        let info = crate::labels::running_machine(spec);
        let machine = Machine {
            info: info.clone(),
            spec: Some(spec.clone()),
        };
        state.machines.insert(spec.id.clone(), machine);
        state.changed(&spec.id);
        answer(after, Op::CreateMachine, Ok(info))
    }

    /// Relabels, as containerd does.
    async fn claim(&self, id: &str, environment: &str, organisation: &str) -> Result<bool> {
        let after = self.enter(Op::Claim).await?;
        let mut state = self.lock();
        let Some(machine) = state.machines.get_mut(id) else {
            let missing = RuntimeError::plain(ErrorKind::NotFound, format!("no machine {id}"));
            return answer(after, Op::Claim, Err(missing));
        };
        machine.info.environment = Some(environment.to_owned());
        machine.info.organisation = Some(organisation.to_owned());
        machine.info.pool = None;
        answer(after, Op::Claim, Ok(true))
    }

    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        let after = self.enter(Op::Run).await?;
        let workspace = {
            let state = self.lock();
            match state.machines.get(id) {
                Some(m)
                    if matches!(m.info.state, MachineState::Running | MachineState::Unknown) =>
                {
                    m.spec.as_ref().map(|s| s.workspace.clone())
                }
                _ => return answer(after, Op::Run, Err(not_running(id))),
            }
        };
        let planned = self.start_process(FakeProcess {
            machine: id.to_owned(),
            throwaway: false,
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            cwd: spec.cwd.clone(),
            stdin: spec.stdin.clone(),
            workspace,
        });
        let outcome = process::play(planned, spec).await;
        answer(after, Op::Run, Ok(outcome))
    }

    /// A throwaway is never a machine here: nothing lists or inspects it, during or after.
    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        let after = self.enter(Op::RunThrowaway).await?;
        let process = &spec.process;
        let planned = self.start_process(FakeProcess {
            machine: spec.name.clone(),
            throwaway: true,
            argv: process.argv.clone(),
            env: process.env.clone(),
            cwd: process.cwd.clone(),
            stdin: process.stdin.clone(),
            workspace: Some(spec.workspace.clone()),
        });
        let outcome = process::play(planned, process).await;
        answer(after, Op::RunThrowaway, Ok(outcome))
    }

    /// None outlives its `run_throwaway` here.
    async fn list_throwaways(&self) -> Result<Vec<ThrowawayInfo>> {
        Ok(Vec::new())
    }

    async fn remove_throwaway(&self, _name: &str) -> Result<()> {
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        let after = self.enter(Op::Inspect).await?;
        let state = self
            .lock()
            .machines
            .get(id)
            .map_or(MachineState::Missing, |m| m.info.state);
        answer(after, Op::Inspect, Ok(state))
    }

    /// No machine of the fake has host processes.
    async fn init_pid(&self, _id: &str) -> Result<Option<u32>> {
        let after = self.enter(Op::InitPid).await?;
        answer(after, Op::InitPid, Ok(None))
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        let after = self.enter(Op::List).await?;
        answer(after, Op::List, Ok(self.machines()))
    }

    async fn changes(&self) -> Result<BoxStream<'static, Change>> {
        let after = self.enter(Op::Changes).await?;
        let receiver = self.lock().changes.subscribe();
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            match receiver.recv().await {
                Ok(change) => Some((change, receiver)),
                // Missed changes: look at everything.
                Err(broadcast::error::RecvError::Lagged(_)) => Some((Change::Unknown, receiver)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        answer(after, Op::Changes, Ok(stream.boxed()))
    }

    async fn commit(&self, id: &str, name: &str) -> Result<crate::Committed> {
        let after = self.enter(Op::Commit).await?;
        let mut state = self.lock();
        if !state.machines.contains_key(id) {
            let missing = RuntimeError::plain(ErrorKind::NotFound, format!("no machine {id}"));
            return answer(after, Op::Commit, Err(missing));
        }
        state.committed.insert(name.to_owned(), id.to_owned());
        let committed = crate::Committed {
            name: name.to_owned(),
            bytes: 0,
        };
        answer(after, Op::Commit, Ok(committed))
    }

    async fn remove_committed(&self, name: &str) -> Result<()> {
        let after = self.enter(Op::RemoveCommitted).await?;
        self.lock().committed.remove(name);
        answer(after, Op::RemoveCommitted, Ok(()))
    }

    async fn start(&self, id: &str) -> Result<()> {
        let after = self.enter(Op::Start).await?;
        let mut state = self.lock();
        let Some(machine) = state.machines.get_mut(id) else {
            let missing = RuntimeError::plain(ErrorKind::NotFound, format!("no machine {id}"));
            return answer(after, Op::Start, Err(missing));
        };
        match machine.info.state {
            MachineState::Running => {}
            MachineState::Unknown => {
                let untold = RuntimeError::plain(
                    ErrorKind::Unavailable,
                    format!("the state of machine {id} cannot be told; not restarting it"),
                );
                return answer(after, Op::Start, Err(untold));
            }
            MachineState::Stopped | MachineState::Missing => {
                machine.info.state = MachineState::Running;
                state.changed(id);
            }
        }
        answer(after, Op::Start, Ok(()))
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let after = self.enter(Op::Remove).await?;
        let mut state = self.lock();
        if state.machines.remove(id).is_some() {
            state.changed(id);
        }
        answer(after, Op::Remove, Ok(()))
    }
}
