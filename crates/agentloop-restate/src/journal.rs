//! The run's journal as Restate entries. The local driver writes its journal through
//! [`agentloop::journal::Journal`]; here that trait hands each write to the handler's own
//! future (which alone may touch the Restate context), which makes it one `ctx.run` entry and
//! answers once Restate holds it.
//!
//! A subagent's run is part of its parent's invocation: its entries are the invocation's too,
//! each naming the child's run (`run`), and a resumed parent's call finds its child by reading
//! them back ([`Journal::load`], answered by the handler from what it read). Part of the
//! parent's invocation rather than an invocation of its own: the child runs inside its parent's
//! call, which awaits it anyway; one invocation keeps one owner for the whole tree (a session's
//! runs go one at a time), a worker that dies takes the tree to the next attempt whole, and a
//! child's question suspends its parent's invocation on the parent's awakeables, as the local
//! journal suspends the top run.

use agentloop::RunOutcome;
use agentloop::journal::{Journal, JournalError, JournalHeader, JournaledRun};
use agentloop::machine::Step;
use agentloop::permissions::ApprovalRequest;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// One entry of a run's Restate journal. Every entry is the result of a `ctx.run`, so reading
/// them back is a sequence of the same call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
pub(crate) enum Entry {
    /// A worker read the journal to its end here and went on: written by the read itself.
    Live,
    /// How the run started.
    Begin {
        /// The header.
        header: Box<JournalHeader>,
        /// When (Unix time, ms): the deadline is wall-clock time across workers and waits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_ms: Option<u64>,
    },
    /// A step's result.
    Step {
        /// Its sequence number.
        seq: u64,
        /// The step.
        step: Box<Step>,
        /// A subagent's run (none: the invocation's own run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
    },
    /// The run suspended on these calls: the awakeables that answer them come next.
    Suspend {
        /// The calls.
        pending: Vec<ApprovalRequest>,
        /// When (Unix time, ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ms: Option<u64>,
        /// When the wait for answers ends (Unix time, ms): the run's deadline, if it has one.
        /// Journaled, so that every attempt waits on the same timer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until_ms: Option<u64>,
        /// A subagent's run (none: the invocation's own run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
    },
    /// The run is over.
    Finish {
        /// A subagent's run (none: the invocation's own run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
    },
    /// Nothing: written during a long step, so that Restate sees the invocation active (it
    /// cuts an attempt that stays silent past its inactivity and abort timeouts) and so that
    /// its cancel reaches the run (it surfaces at the handler's next entry).
    Heartbeat,
}

impl Entry {
    /// The subagent's run the entry belongs to (none: the invocation's own run).
    pub(crate) fn child(&self) -> Option<&str> {
        match self {
            Entry::Begin { header, .. } => header.parent.as_ref().map(|_| header.run_id.as_str()),
            Entry::Step { run, .. } | Entry::Suspend { run, .. } | Entry::Finish { run } => {
                run.as_deref()
            }
            Entry::Live | Entry::Heartbeat => None,
        }
    }
}

/// What the journal asks of the handler: a write, or a subagent's run read back.
pub(crate) enum Request {
    /// An entry to journal.
    Write(Entry, oneshot::Sender<Result<(), JournalError>>),
    /// The subagent's run of this id, as the invocation's entries hold it.
    Load(String, oneshot::Sender<Option<JournaledRun>>),
}

/// The journal a run writes through: each write goes to the handler, which answers it.
pub(crate) struct ChannelJournal {
    tx: mpsc::UnboundedSender<Request>,
    /// The invocation's own run, once known: the other runs writing here are its subagents'.
    top: std::sync::Mutex<Option<String>>,
}

fn gone() -> JournalError {
    JournalError::Io {
        message: "the Restate handler is gone".into(),
    }
}

impl ChannelJournal {
    /// The journal of an invocation whose own run is `top`, when it is known (a resumed run's).
    pub(crate) fn new(top: Option<String>) -> (Self, mpsc::UnboundedReceiver<Request>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let top = std::sync::Mutex::new(top);
        (ChannelJournal { tx, top }, rx)
    }

    fn write(&self, entry: Entry) -> BoxFuture<'static, Result<(), JournalError>> {
        let (done, written) = oneshot::channel();
        let sent = self.tx.send(Request::Write(entry, done));
        Box::pin(async move {
            sent.map_err(|_| gone())?;
            written.await.map_err(|_| gone())?
        })
    }

    /// `run_id` when it is a subagent's run: the entries of the invocation's own run name none.
    fn child(&self, run_id: &str) -> Option<String> {
        let top = self.top.lock().unwrap_or_else(|p| p.into_inner());
        (top.as_deref() != Some(run_id)).then(|| run_id.to_owned())
    }
}

impl Journal for ChannelJournal {
    fn holds_children(&self) -> bool {
        true
    }

    fn load<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JournaledRun>, JournalError>> {
        let (done, read) = oneshot::channel();
        let sent = self.tx.send(Request::Load(run_id.to_owned(), done));
        Box::pin(async move {
            sent.map_err(|_| gone())?;
            read.await.map_err(|_| gone())
        })
    }

    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>> {
        if header.parent.is_none() {
            *self.top.lock().unwrap_or_else(|p| p.into_inner()) = Some(header.run_id.clone());
        }
        self.write(Entry::Begin {
            header: Box::new(header.clone()),
            started_ms: None,
        })
    }

    fn append<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Step {
            seq,
            step: Box::new(step.clone()),
            run: self.child(run_id),
        })
    }

    fn suspend<'a>(
        &'a self,
        run_id: &'a str,
        pending: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Suspend {
            pending: pending.to_vec(),
            at_ms: None,
            until_ms: None,
            run: self.child(run_id),
        })
    }

    fn finish<'a>(
        &'a self,
        run_id: &'a str,
        _outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Finish {
            run: self.child(run_id),
        })
    }
}
