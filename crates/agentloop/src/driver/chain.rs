//! The hook chain's policy, stated once. Every seam in `seams.rs` that asks the hooks walks them
//! through a [`HookChain`] and reports each failure to it; the chain says in which order the hooks
//! run, which failures are kept and when the chain stops, so no seam holds a copy of the rule.

use std::sync::Arc;

use crate::hooks::{Hook, HookRole};
use crate::machine::{HookFailure, HookStage};
use crate::outcome::CallOutcome;

/// The agent's hooks, in the order they were registered, each with its role.
pub(super) type Hooks = [(Arc<dyn Hook>, HookRole)];

/// One walk of the hooks at one stage, gathering their failures.
pub(super) struct HookChain<'h> {
    hooks: &'h Hooks,
    stage: HookStage,
    failures: Vec<HookFailure>,
    stopped: bool,
}

impl<'h> HookChain<'h> {
    /// A chain over `hooks` at `stage`, with no failure yet.
    pub(super) fn new(hooks: &'h Hooks, stage: HookStage) -> Self {
        HookChain {
            hooks,
            stage,
            failures: Vec::new(),
            stopped: false,
        }
    }

    /// The same hooks at a later stage of the same seam, keeping the failures so far.
    pub(super) fn then(self, stage: HookStage) -> Self {
        HookChain { stage, ..self }
    }

    /// The hooks in the stage's order. The hooks that look back at what happened (`after_*`, and
    /// the review of an answer) run in reverse, so that the first hook registered wraps the rest,
    /// as middleware does.
    pub(super) fn hooks(&self) -> impl Iterator<Item = &'h (Arc<dyn Hook>, HookRole)> + use<'h> {
        let reverse = matches!(
            self.stage,
            HookStage::AfterModelCall | HookStage::ReviewAnswer | HookStage::AfterToolCall
        );
        let hooks = self.hooks;
        let n = hooks.len();
        (0..n).filter_map(move |i| hooks.get(if reverse { n - 1 - i } else { i }))
    }

    /// Notes that `hook` failed with `message`; true when the chain stops here.
    ///
    /// A required hook's failure stops the chain (the machine fails the run on it), except at the
    /// run's end, where every hook still hears the outcome. An observer's failure in `on_error`
    /// is dropped: the run has failed already, and a report of the report would only be noise.
    pub(super) fn failed(&mut self, hook: &dyn Hook, role: HookRole, message: String) -> bool {
        let at_end = matches!(self.stage, HookStage::OnError | HookStage::OnFinish);
        if self.stage != HookStage::OnError || role == HookRole::Required {
            self.failures.push(HookFailure {
                hook: hook.name().to_owned(),
                role,
                stage: self.stage,
                message,
            });
        }
        self.stopped |= role == HookRole::Required && !at_end;
        self.stopped
    }

    /// Whether a required hook's failure stopped the chain, so the seam asks no more hooks.
    pub(super) fn stopped(&self) -> bool {
        self.stopped
    }

    /// The failures gathered, in the order they happened.
    pub(super) fn into_failures(self) -> Vec<HookFailure> {
        self.failures
    }
}

/// The outcome an after-tool hook put in place of `outcome`. The call's timing and retries stay:
/// only the driver measured them, and a hook cannot undo the time a call took.
pub(super) fn replaced(outcome: &CallOutcome, replacement: CallOutcome) -> CallOutcome {
    CallOutcome {
        duration: outcome.duration,
        retries: outcome.retries,
        ..replacement
    }
}
