//! The replay driver: a run's step log fed to a fresh machine. It does no I/O and holds no rule,
//! so what it produces is what the machine decides from the recorded results alone; a replay that
//! reproduces a run exactly shows that the run's driver decided nothing itself. It is the seed of
//! the durable journal: a journal is a step log written as the run goes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::AgentConfig;
use crate::ids::IdSource;
use crate::limits::Limits;
use crate::machine::{RunMachine, RunStart, Seams, Step};
use crate::message::Message;
use crate::outcome::RunOutcome;

/// A run's whole history: how it started, and every step's result in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLog {
    /// The run's id.
    pub run_id: String,
    /// The steps its agent had.
    pub seams: Seams,
    /// Its limits, when they were not its agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The transcript it continued.
    pub transcript: Vec<Message>,
    /// Its new message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Message>,
    /// Every step's result.
    pub steps: Vec<Step>,
}

/// Where a run leaves its [`RunLog`] for the caller: pass one in [`crate::RunOptions::log`], take
/// the log once the run is over.
#[derive(Debug, Clone, Default)]
pub struct StepLog(Arc<Mutex<Option<RunLog>>>);

impl StepLog {
    /// An empty handle.
    pub fn new() -> Self {
        Self::default()
    }

    /// The log of the run, once it is over.
    pub fn take(&self) -> Option<RunLog> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(crate) fn put(&self, log: RunLog) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(log);
    }
}

/// Ids for a replay: a replayed response carries the ids its run gave it, so none is drawn; one
/// that is drawn anyway is marked.
#[derive(Debug)]
struct NoIds;

impl IdSource for NoIds {
    fn run_id(&self) -> String {
        "replay".into()
    }
    fn call_id(&self) -> String {
        "call_replay".into()
    }
}

/// Replays `log` through a fresh machine of `cfg`: the outcome its steps lead to.
pub fn replay(cfg: Arc<AgentConfig>, log: &RunLog) -> RunOutcome {
    let mut m = RunMachine::new(
        cfg,
        RunStart {
            run_id: Arc::from(log.run_id.as_str()),
            ids: Arc::new(NoIds),
            seams: log.seams,
            limits: log.limits.clone(),
            transcript: log.transcript.clone(),
            input: log.input.clone(),
            observed: false,
        },
    );
    let mut at = Duration::ZERO;
    for step in &log.steps {
        at = step.at;
        m.feed(step.clone());
    }
    m.into_outcome(at)
}

/// Checks that a run's log replays to its outcome (the duration aside); a test-only check that
/// every run of a test suite makes when the `verify-replay` feature is on.
#[cfg(feature = "verify-replay")]
#[allow(clippy::panic)]
pub(crate) fn verify(cfg: &Arc<AgentConfig>, log: &RunLog, outcome: &RunOutcome) {
    let mut replayed = replay(Arc::clone(cfg), log);
    replayed.duration = outcome.duration;
    if replayed != *outcome {
        panic!(
            "the replay of run {} differs from the run\nrun:    {outcome:?}\nreplay: {replayed:?}",
            log.run_id
        );
    }
}
