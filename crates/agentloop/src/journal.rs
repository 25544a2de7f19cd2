//! Durable runs. A run given a [`Journal`] (in [`crate::RunOptions::journal`]) writes how it
//! started and then each step's result before its machine moves on, so that a process that dies
//! loses nothing that was done: [`crate::Agent::resume`] feeds the journal to a fresh machine and
//! goes on. A finished tool call is never run again; a call that was running at the crash runs
//! again only when its tool is idempotent, and is answered
//! [`crate::CallOutcome::interrupted`] otherwise. A gate that must ask a human suspends a
//! journaled run instead of waiting ([`crate::gate::Approvals`]); the answers, recorded in the
//! journal from anywhere, let it go on.
//!
//! The core does no storage I/O: `agentloop-store` has the SQLite journal.
//!
//! | code | meaning |
//! |---|---|
//! | `journal.io` | the journal could not be read or written |
//! | `journal.foreign` | the file is not an agentloop journal (or one of a newer format) |
//! | `journal.damaged` | a row of the journal is damaged: the run and step are named |
//! | `journal.unknown_run` | no run has this id in the journal |
//! | `journal.changed` | the agent's definition changed since the run started (what changed is listed) |
//! | `journal.not_resumable` | the run cannot go on (it finished, or approvals are unanswered) |
//! | `journal.busy` | another live process drives the run (a journal that supports owners says so) |

use std::collections::BTreeMap;
use std::fmt::Write as _;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::limits::Limits;
use crate::machine::{Seams, Step};
use crate::message::Message;
use crate::outcome::RunOutcome;
use crate::permissions::{Answer, ApprovalRequest};

/// What an agent is, as far as a resumed run must find it unchanged: the model, instructions,
/// tools with their schemas, limits, and what the application adds (permissions, a version).
/// Its [`Definition::fingerprint`] is journaled with each run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Definition {
    parts: BTreeMap<String, Value>,
}

impl Definition {
    /// An empty definition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one part (replacing a part of the same name).
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.parts.insert(key.into(), value);
        self
    }

    /// One part.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.parts.get(key)
    }

    /// The parts, by name.
    pub fn parts(&self) -> &BTreeMap<String, Value> {
        &self.parts
    }

    /// `sha256:` and the hex digest of the definition's canonical JSON (keys sorted at every
    /// level), so the same definition has the same fingerprint whatever order it was built in.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (key, value) in &self.parts {
            canonical(&Value::String(key.clone()), &mut text);
            text.push(':');
            canonical(value, &mut text);
            text.push('\n');
        }
        sha256(&text)
    }

    /// What differs from `other`, as paths into the definition (`/tools/search/input_schema`,
    /// `/version`), at most `max` of them.
    pub fn changes(&self, other: &Definition, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&String> =
            self.parts.keys().chain(other.parts.keys()).collect();
        for key in keys {
            let path = format!("/{}", escape(key));
            diff(
                self.parts.get(key),
                other.parts.get(key),
                &path,
                &mut out,
                max,
            );
        }
        out
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn diff(a: Option<&Value>, b: Option<&Value>, path: &str, out: &mut Vec<String>, max: usize) {
    if out.len() >= max || a == b {
        return;
    }
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let sub = format!("{path}/{}", escape(key));
                diff(x.get(key), y.get(key), &sub, out, max);
            }
        }
        (None, Some(_)) => out.push(format!("{path} (added)")),
        (Some(_), None) => out.push(format!("{path} (removed)")),
        _ => out.push(path.to_owned()),
    }
}

/// `sha256:` and the hex digest of a value's canonical JSON (object keys sorted at every level):
/// equal for equal values, whatever order their keys were written in. An approval is matched to
/// a call by its arguments' fingerprint.
pub fn fingerprint(value: &Value) -> String {
    let mut text = String::new();
    canonical(value, &mut text);
    sha256(&text)
}

fn sha256(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::from("sha256:");
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// JSON with object keys sorted at every level.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(&Value::String(k.clone()), out);
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// How a journaled run started: everything a fresh machine needs besides its agent, and the
/// definition it must find unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalHeader {
    /// The run's id.
    pub run_id: String,
    /// The agent's name.
    pub agent: String,
    /// The agent's definition when the run started.
    pub definition: Definition,
    /// Its fingerprint.
    pub fingerprint: String,
    /// The steps the agent had around its machine.
    pub seams: Seams,
    /// The run's own limits, when they were not its agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The transcript the run continued.
    pub transcript: Vec<Message>,
    /// Its new message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Message>,
    /// Where the application finds the agent again to resume the run
    /// ([`crate::RunOptions::origin`]; the CLI keeps the agent file's path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// Where a journaled run stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and not over: running now, or its process died (resume it).
    Running,
    /// Waiting for approvals (answer them, then resume).
    Suspended,
    /// Over.
    Finished {
        /// Its stop reason's word.
        stop_reason: String,
    },
}

impl RunStatus {
    /// `running`, `suspended` or `finished`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Suspended => "suspended",
            RunStatus::Finished { .. } => "finished",
        }
    }
}

/// A call a suspended run waits on, with its answer once one is recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// What the gate asked about.
    pub request: ApprovalRequest,
    /// The answer, once recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
}

/// A run as its journal holds it: enough to resume it in any process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournaledRun {
    /// How it started.
    pub header: JournalHeader,
    /// Every step's result, in order.
    pub steps: Vec<Step>,
    /// Where it stands.
    pub status: RunStatus,
    /// The calls it waits on when suspended, and the answers recorded so far. Answers recorded
    /// for earlier batches stay here too: a gate that asks again about the same call (its id,
    /// tool and arguments) finds them, once.
    pub approvals: Vec<PendingApproval>,
}

impl JournaledRun {
    /// The calls still waiting for an answer.
    pub fn unanswered(&self) -> impl Iterator<Item = &ApprovalRequest> {
        self.approvals
            .iter()
            .filter(|a| a.answer.is_none())
            .map(|a| &a.request)
    }

    /// How many model calls have a journaled result: where a scripted model resumes its script.
    pub fn model_calls(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s.input,
                    crate::machine::Input::ModelResponded { .. }
                        | crate::machine::Input::ModelFailed { .. }
                )
            })
            .count()
    }
}

/// Why a journal could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journal could not be read or written.
    #[error("journal i/o: {message}")]
    Io {
        /// What went wrong.
        message: String,
    },
    /// The file is not an agentloop journal.
    #[error("{path} is not an agentloop journal: {reason}")]
    Foreign {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A row is damaged. The steps before it are intact.
    #[error("the journal of run {run_id} is damaged at {}: {reason}", step.map_or_else(|| "its header".to_owned(), |s| format!("step {s}")))]
    Damaged {
        /// The run.
        run_id: String,
        /// The damaged step (its sequence number), or `None` for the run's header.
        step: Option<u64>,
        /// What is wrong.
        reason: String,
    },
    /// No run has this id.
    #[error("no run {run_id} in the journal")]
    UnknownRun {
        /// The id asked for.
        run_id: String,
    },
    /// The agent changed since the run started.
    #[error("the agent's definition changed since run {run_id} started ({})", changes.join(", "))]
    Changed {
        /// The run.
        run_id: String,
        /// What changed, as paths into the definition.
        changes: Vec<String>,
    },
    /// Another live process drives the run: two drivers of one run would race for its steps.
    #[error("run {run_id} is being driven by another live process: wait for it to end, or stop it")]
    Busy {
        /// The run.
        run_id: String,
    },
    /// The run cannot go on.
    #[error("run {run_id} cannot be resumed: {reason}")]
    NotResumable {
        /// The run.
        run_id: String,
        /// Why.
        reason: String,
    },
}

impl JournalError {
    /// The stable code (see the module's table).
    pub fn code(&self) -> &'static str {
        match self {
            JournalError::Io { .. } => "journal.io",
            JournalError::Foreign { .. } => "journal.foreign",
            JournalError::Damaged { .. } => "journal.damaged",
            JournalError::UnknownRun { .. } => "journal.unknown_run",
            JournalError::Changed { .. } => "journal.changed",
            JournalError::NotResumable { .. } => "journal.not_resumable",
            JournalError::Busy { .. } => "journal.busy",
        }
    }
}

/// Where a durable run writes its history. Each method returns once what it was given is
/// durable: the run moves on only then. An implementation keeps its storage work off the async
/// workers (a blocking task, or a thread of its own).
pub trait Journal: Send + Sync {
    /// A run starts.
    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>>;

    /// Step `seq` (0 for the first) of run `run_id` ended.
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>>;

    /// The run suspended, waiting on these calls.
    fn suspend<'a>(
        &'a self,
        run_id: &'a str,
        pending: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<(), JournalError>>;

    /// The run is over.
    fn finish<'a>(
        &'a self,
        run_id: &'a str,
        outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_ignore_key_order_and_see_every_change() {
        let mut a = Definition::new();
        a.set("tools", json!({"t": {"a": 1, "b": [1, 2]}}))
            .set("version", json!("1"));
        let mut b = Definition::new();
        b.set("version", json!("1"))
            .set("tools", json!({"t": {"b": [1, 2], "a": 1}}));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert!(a.changes(&b, 10).is_empty());
        b.set("tools", json!({"t": {"b": [2, 1], "a": 1}, "u": {}}));
        b.set("limits", json!({}));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.changes(&b, 10),
            vec!["/limits (added)", "/tools/t/b", "/tools/u (added)"]
        );
        assert_eq!(a.changes(&b, 1).len(), 1);
    }
}
