//! The run's journal as Restate entries. The local driver writes its journal through
//! [`agentloop::journal::Journal`]; here that trait hands each write to the handler's own
//! future (which alone may touch the Restate context), which makes it one `ctx.run` entry and
//! answers once Restate holds it.

use agentloop::RunOutcome;
use agentloop::journal::{Journal, JournalError, JournalHeader};
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
    },
    /// The run is over.
    Finish,
    /// Nothing: written during a long step, so that Restate sees the invocation active (it
    /// cuts an attempt that stays silent past its inactivity and abort timeouts) and so that
    /// its cancel reaches the run (it surfaces at the handler's next entry).
    Heartbeat,
}

/// A write the journal asks of the handler.
pub(crate) type Write = (Entry, oneshot::Sender<Result<(), JournalError>>);

/// The journal a run writes through: each write goes to the handler, which answers it.
pub(crate) struct ChannelJournal {
    tx: mpsc::UnboundedSender<Write>,
}

impl ChannelJournal {
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Write>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ChannelJournal { tx }, rx)
    }

    fn write(&self, entry: Entry) -> BoxFuture<'static, Result<(), JournalError>> {
        let (done, written) = oneshot::channel();
        let sent = self.tx.send((entry, done));
        Box::pin(async move {
            let gone = || JournalError::Io {
                message: "the Restate handler is gone".into(),
            };
            sent.map_err(|_| gone())?;
            written.await.map_err(|_| gone())?
        })
    }
}

impl Journal for ChannelJournal {
    fn begin<'a>(&'a self, header: &'a JournalHeader) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Begin {
            header: Box::new(header.clone()),
            started_ms: None,
        })
    }

    fn append<'a>(
        &'a self,
        _run_id: &'a str,
        seq: u64,
        step: &'a Step,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Step {
            seq,
            step: Box::new(step.clone()),
        })
    }

    fn suspend<'a>(
        &'a self,
        _run_id: &'a str,
        pending: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Suspend {
            pending: pending.to_vec(),
            at_ms: None,
            until_ms: None,
        })
    }

    fn finish<'a>(
        &'a self,
        _run_id: &'a str,
        _outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        self.write(Entry::Finish)
    }
}
