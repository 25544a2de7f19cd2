//! Durable runs. A run given a [`Journal`] (in [`crate::RunOptions::journal`]) writes how it
//! started and then each step's result before anything acts on it, so that a process that dies
//! loses nothing that was done: [`crate::Agent::resume`] feeds the journal to a fresh machine and
//! goes on. (A model's response is fed to the machine before it is written when the next step
//! starts a call, or the run is over: it is then written with the starts, or with the run's end,
//! in one commit, before the call runs or the run returns.) A finished tool call is never run again; a call that was running at the crash runs
//! again only when its tool is idempotent, and is answered
//! [`crate::CallOutcome::interrupted`] otherwise. A gate that must ask a human suspends a
//! journaled run instead of waiting ([`crate::gate::Approvals`]); the answers, recorded in the
//! journal from anywhere, let it go on.
//!
//! A tree of agents is one durable unit. A subagent's run is journaled in its parent's journal
//! as a run of its own (a *child journal*), whose id the parent's call names
//! ([`child_run_id`]: the parent's run id and the call's id) and whose header names its parent
//! ([`JournalHeader::parent`]). A child of its own, rather than the child's steps inside the
//! parent's: the child's steps are fed to the child's machine, a run like any other, so its
//! journal is resumed by the same code as a top-level run's, its steps are written as it takes
//! them (what it spent is in the journal as it spends it), and the parent's step sequence stays
//! the parent's alone. Its header's limits are the share of the parent's budget it was granted:
//! a resumed child goes on within that grant, so the tree never spends a budget twice. When the
//! parent resumes, a subagent call that was running starts again and finds its child journal: an
//! unfinished child resumes from its last step, a finished one answers with its outcome. A
//! child's question to a human suspends the whole tree: its requests are the parent's, their call
//! ids prefixed with the parent's call ([`child_approval_id`]: `call_7/call_2`), so they are
//! answered on the top run. Only a journal that reads its runs back
//! ([`Journal::holds_children`]) keeps children; with another, subagents run unjournaled inside
//! their parent's call.
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

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use crate::fingerprint::{Definition, fingerprint};
use crate::gate::{Answer, ApprovalRequest};
use crate::limits::Limits;
use crate::machine::{Seams, Step};
use crate::message::Message;
use crate::outcome::RunOutcome;

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
    /// For a subagent's run (a child journal): the run and call that started it. Such a run is
    /// resumed by its parent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentCall>,
    /// The conversation the run is a turn of, when its application named one
    /// ([`crate::RunOptions::session`]: an A2A context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The service that started the run for its callers ([`crate::RunOptions::served_by`]:
    /// `a2a` for an A2A server's task); `None` for a run its application started itself. A
    /// service goes on only with runs it started: a caller who names another run's id finds no
    /// task there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
}

/// The call of a parent run that started a subagent's run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentCall {
    /// The parent's run.
    pub run_id: String,
    /// The parent's call.
    pub call_id: String,
    /// The subagent's path from the top of its tree (`coordinator/worker`).
    pub agent_path: String,
}

impl ParentCall {
    /// Why its child's run `run_id` is not resumed on its own: resuming the parent resumes it.
    pub fn not_resumable(&self, run_id: &str) -> JournalError {
        JournalError::NotResumable {
            run_id: run_id.to_owned(),
            reason: format!(
                "it is the run of subagent {} for call {} of run {}: resume that run",
                self.agent_path, self.call_id, self.run_id
            ),
        }
    }
}

/// The id of the child journal a subagent's call keeps in its parent's journal: one per call, so
/// that a resumed parent finds the child its call started. The call id's `.` and `%` are
/// percent-encoded (`%2E`, `%25`), so that a dotted call id at one level never names the child
/// of a call a level deeper (`R` + `x.y` and `R.x` + `y` were both `R.x.y`). An id without them
/// is as it always was.
pub fn child_run_id(parent_run_id: &str, call_id: &str) -> String {
    format!("{parent_run_id}.{}", percent_encode(call_id, &['.', '%']))
}

/// The id [`child_run_id`] gave before it encoded the call id: a parent's journal written then
/// names its children so, and they are still found (each checked against its header's parent).
pub fn legacy_child_run_id(parent_run_id: &str, call_id: &str) -> String {
    format!("{parent_run_id}.{call_id}")
}

/// The id under which a child's waiting call (`child_call_id`, its own id in the child's
/// journal) is asked on its parent's run: the parent's call id, its `/` and `%`
/// percent-encoded (`%2F`, `%25`) so that each level of the tree is one segment, then `/`, then
/// the child's id (`call_7/call_2`).
pub fn child_approval_id(call_id: &str, child_call_id: &str) -> String {
    format!("{}/{child_call_id}", percent_encode(call_id, &['/', '%']))
}

/// `text` with each of `special` as `%XX` (its byte in upper-case hex).
fn percent_encode(text: &str, special: &[char]) -> String {
    if !text.contains(special) {
        return text.to_owned();
    }
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len() + 6);
    for c in text.chars() {
        if special.contains(&c) {
            let _ = write!(out, "%{:02X}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
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
    /// The answer, once recorded. A question's answer is recorded as
    /// [`Answer::AllowOnce`] with its `reply`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// The answer to a question ([`ApprovalRequest::question`]), once recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<serde_json::Value>,
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
        crate::machine::model_calls(&self.steps)
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
    /// True when the journal reads its runs back ([`Journal::load`]): then a run's subagents are
    /// journaled in it as child journals, and resumed with their parent. False by default: the
    /// subagents of a run journaled here run unjournaled inside their parent's call.
    fn holds_children(&self) -> bool {
        false
    }

    /// The run `run_id` as the journal holds it, or `None` when it holds no such run (see
    /// [`Journal::holds_children`]; by default it holds none).
    fn load<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JournaledRun>, JournalError>> {
        let _ = run_id;
        Box::pin(async { Ok(None) })
    }

    /// A run starts.
    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>>;

    /// Step `seq` (0 for the first) of run `run_id` ended.
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>>;

    /// Steps `seq`, `seq + 1`, … of run `run_id` ended together (calls of a batch that
    /// finished at once): a journal that groups its writes commits them together. Each step is
    /// durable before it is fed, as with [`Journal::append`]. On a failure, how many of them
    /// were written before it, and the error. By default they are appended one after another.
    fn append_batch<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        steps: &'a [Step],
    ) -> BoxFuture<'a, Result<(), (usize, JournalError)>> {
        append_in_turn(self, run_id, seq, steps)
    }

    /// Step `seq` of run `run_id` ended, and with it the run: a journal that groups its writes
    /// commits both together (the driver holds a model's last answer for this when nothing
    /// runs after it). On a failure, the run is left unfinished with what was written, as after
    /// a failed [`Journal::finish`]. By default, [`Journal::append`] and then
    /// [`Journal::finish`].
    fn append_and_finish<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
        outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async move {
            self.append(run_id, seq, step).await?;
            self.finish(run_id, outcome).await
        })
    }

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

/// [`Journal::append_batch`] one step after another: what a journal that does not group its
/// writes does (the trait's default).
pub fn append_in_turn<'a, J: Journal + ?Sized>(
    journal: &'a J,
    run_id: &'a str,
    seq: u64,
    steps: &'a [Step],
) -> BoxFuture<'a, Result<(), (usize, JournalError)>> {
    Box::pin(async move {
        for (i, step) in steps.iter().enumerate() {
            journal
                .append(run_id, seq + i as u64, step)
                .await
                .map_err(|e| (i, e))?;
        }
        Ok(())
    })
}
