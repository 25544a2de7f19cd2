//! The turn's model call: steering and the tool source first, the request, the before-model
//! hooks' changes, and what the call is counted as.

use super::{Phase, RunMachine};
use crate::event::EventKind;
use crate::message::Message;
use crate::model::ModelRequest;

impl RunMachine {
    /// The request of the model call the machine asks for. It borrows the transcript.
    pub(super) fn request(&self) -> ModelRequest<'_> {
        ModelRequest {
            instructions: self
                .changes
                .as_ref()
                .and_then(|c| c.instructions.as_deref())
                .or(self.cfg.instructions.as_deref()),
            messages: &self.kept.transcript,
            tools: self.tools.specs(),
            output_schema: self.cfg.output_schema.as_ref().map(|s| s.value()),
            settings: self.settings(),
        }
    }

    /// The next step needs the model: steering first, where the run takes it.
    pub(super) fn need_model(&mut self) {
        if self.seams.steering {
            self.phase = Phase::Steering;
        } else {
            self.begin_model_call();
        }
    }

    pub(super) fn begin_model_call(&mut self) {
        if let Some(hit) = self.check_before_model_call() {
            self.stop_on_limit(hit);
            return;
        }
        if !self.retry.retrying_output {
            self.counters.turn += 1;
            self.emit(|| EventKind::TurnStarted);
            if self.seams.dynamic_tools {
                // The tools a turn sees are settled at its start, never in the middle of it.
                self.phase = Phase::ListTools;
                return;
            }
        }
        self.ask_model();
    }

    /// The turn's model call, after a compaction when the conversation needs one.
    pub(super) fn ask_model(&mut self) {
        if !self.compact() {
            self.count_model_call();
        }
    }

    /// A model call is counted and asked for: the before-model hooks first, when there are any.
    pub(super) fn count_model_call(&mut self) {
        self.counters.model_calls += 1;
        self.called_at = self.now;
        if self.seams.hooks {
            self.phase = Phase::Prepare;
        } else {
            self.enter_call_model();
        }
    }

    /// The model call itself: the machine's own changes to this call's settings go on top of the
    /// hooks' (tools off for a last answer, a raised output limit after a cut answer, a forced
    /// tool choice released once the model has called a tool).
    pub(super) fn enter_call_model(&mut self) {
        use crate::model::ToolChoice;
        let raise = self.retry.raise_output.take();
        // A choice that forces a call holds until the model has made one: held for the whole
        // run it would leave the model no turn to answer in, and the run would end at its turn
        // limit every time (the OpenAI Agents SDK resets it the same way).
        let release = self.counters.tool_calls_used > 0
            && matches!(
                self.settings().tool_choice,
                Some(ToolChoice::Required | ToolChoice::Tool(_))
            );
        if self.wrap_up.is_some() || raise.is_some() || release {
            let mut settings = self
                .changes
                .as_mut()
                .and_then(|c| c.settings.take())
                .unwrap_or_else(|| self.cfg.settings.clone());
            if release {
                settings.tool_choice = Some(ToolChoice::Auto);
            }
            if self.wrap_up.is_some() {
                settings.tool_choice = Some(ToolChoice::None);
            }
            if let Some(n) = raise {
                settings.max_tokens = Some(n);
            }
            self.changes.get_or_insert_default().settings = Some(settings);
        }
        self.phase = Phase::CallModel;
    }

    /// The text of the last assistant message, when it has any.
    pub(super) fn last_assistant_text(&self) -> Option<String> {
        self.kept.transcript.iter().rev().find_map(|m| match m {
            Message::Assistant(a) if !a.text.trim().is_empty() => Some(a.text.clone()),
            Message::Assistant(_) => None,
            _ => None,
        })
    }

    /// Takes back what the before-model hooks added for this call only.
    pub(super) fn end_model_call(&mut self) {
        if self.extra_messages > 0 {
            let keep = self
                .kept
                .transcript
                .len()
                .saturating_sub(self.extra_messages);
            self.kept.transcript.truncate(keep);
            self.extra_messages = 0;
        }
        self.changes = None;
    }
}
