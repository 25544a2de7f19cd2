//! What a handler knows of the call it serves ([`ToolContext`]) and how it reports progress
//! ([`ProgressSender`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::event::{Event, EventKind, EventSink};

/// Sends progress updates of a running call; each becomes a `ToolProgress` event.
#[derive(Clone, Default)]
pub struct ProgressSender {
    target: Option<Arc<ProgressTarget>>,
}

struct ProgressTarget {
    /// Set once the call is over: progress after its `ToolFinished` is dropped.
    closed: std::sync::atomic::AtomicBool,
    sink: Arc<dyn EventSink>,
    run_id: Arc<str>,
    turn: u32,
    call_id: Arc<str>,
    tool: Arc<str>,
}

impl fmt::Debug for ProgressSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressSender")
            .field("connected", &self.target.is_some())
            .finish()
    }
}

impl ProgressSender {
    pub(crate) fn new(
        sink: Arc<dyn EventSink>,
        run_id: Arc<str>,
        turn: u32,
        call_id: Arc<str>,
        tool: Arc<str>,
    ) -> Self {
        ProgressSender {
            target: Some(Arc::new(ProgressTarget {
                closed: std::sync::atomic::AtomicBool::new(false),
                sink,
                run_id,
                turn,
                call_id,
                tool,
            })),
        }
    }

    /// Ends the call's progress: later sends are dropped (a handler still running after its call
    /// was abandoned, or work it left behind, cannot report on a finished call).
    pub(crate) fn close(&self) {
        if let Some(t) = &self.target {
            t.closed.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Announces that a failed attempt will be run again after `delay`.
    pub(crate) fn retrying(&self, retry: u32, code: &str, message: &str, delay: Duration) {
        self.emit(|t| EventKind::ToolRetrying {
            call_id: t.call_id.to_string(),
            tool: t.tool.to_string(),
            retry,
            code: code.to_owned(),
            message: message.to_owned(),
            delay,
        });
    }

    /// Reports progress (a message, a fraction, any JSON). A no-op when nobody listens or once
    /// the call is over.
    pub fn send(&self, progress: impl Into<Value>) {
        self.emit(|t| EventKind::ToolProgress {
            call_id: t.call_id.to_string(),
            tool: t.tool.to_string(),
            progress: progress.into(),
        });
    }

    /// Emits the event `kind` makes, unless nobody listens or the call is over (then `kind` is
    /// not called).
    fn emit(&self, kind: impl FnOnce(&ProgressTarget) -> EventKind) {
        if let Some(t) = &self.target
            && !t.closed.load(std::sync::atomic::Ordering::Acquire)
        {
            t.sink.emit(&Event {
                run_id: t.run_id.clone(),
                turn: t.turn,
                kind: kind(t),
            });
        }
    }
}

/// What a handler knows of the call it serves. Never part of a tool's input schema.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call id.
    pub call_id: Arc<str>,
    /// The tool's name.
    pub tool: Arc<str>,
    /// The run's id.
    pub run_id: Arc<str>,
    /// The turn the call belongs to (1-based).
    pub turn: u32,
    /// Cancelled when the run is cancelled or its deadline passes: a long handler should watch it.
    /// It is shared by the run's calls (one token, not a child token per call, which cost about
    /// 3 % of a turn's instructions): watch it, never cancel it; a handler that wants to stop
    /// returns.
    pub cancel: CancellationToken,
    /// Progress updates.
    pub progress: ProgressSender,
    /// Fires when no new attempt may start (a sibling failed fatally, the run was interrupted):
    /// the retry layer stops there.
    pub(crate) stop_retries: CancellationToken,
    /// For a subagent's call: the run's budget and place in the tree.
    pub(crate) scope: Option<Arc<crate::budget::Scope>>,
    /// A person allowed this very call ([`ToolContext::approved`]).
    pub(crate) approved: bool,
}

impl ToolContext {
    /// A context for calling a handler outside a run (tests, direct use).
    pub fn detached(call_id: impl Into<Arc<str>>, tool: impl Into<Arc<str>>) -> Self {
        ToolContext {
            call_id: call_id.into(),
            tool: tool.into(),
            run_id: Arc::from("detached"),
            turn: 0,
            cancel: CancellationToken::new(),
            progress: ProgressSender::default(),
            stop_retries: CancellationToken::new(),
            scope: None,
            approved: false,
        }
    }

    /// True when a person allowed this very call at admission: asked about it then, or an
    /// answer recorded for it (a durable run's, replayed on resume); false when rules let it
    /// run without asking, and for a [`ToolContext::detached`] one. A handler that judges what
    /// the call touches again as it runs (the file tools, on a path a sibling call has since
    /// made a link) refuses what would have been asked about unless this holds. An "always"
    /// answer approves the call it was given for, not the later calls it lets run unasked; a
    /// subagent's calls carry their own run's approvals, never the parent call's.
    pub fn approved(&self) -> bool {
        self.approved
    }

    /// This context, marked as one of a call a person approved ([`ToolContext::approved`]):
    /// for calling a handler outside a run on behalf of a person who allowed the call, and for
    /// tests. Inside a run, the gates' verdicts decide it.
    #[must_use]
    pub fn approved_by_a_person(mut self) -> Self {
        self.approved = true;
        self
    }
}
