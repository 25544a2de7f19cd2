//! The run's closing steps: hook failures, steering and follow-ups, the stop conditions'
//! trips, and the finish hooks.

use super::{Closing, HookFailure, HookStage, Phase, RunMachine, Trip};
use crate::error::RunError;
use crate::event::EventKind;
use crate::hooks::HookRole;
use crate::message::Message;
use crate::outcome::StopReason;

impl RunMachine {
    /// A pricing function that failed is reported; the call counts as unpriced.
    pub(super) fn observe_failures(&mut self, failures: Vec<HookFailure>) {
        let _ = self.hook_failures(
            failures
                .into_iter()
                .map(|f| HookFailure {
                    role: HookRole::Observer,
                    ..f
                })
                .collect(),
        );
    }

    /// Hook failures: observers' are reported; the first required one's is returned, for the
    /// caller to fail the run with.
    pub(super) fn hook_failures(&mut self, failures: Vec<HookFailure>) -> Option<RunError> {
        let mut first = None;
        for f in failures {
            match f.role {
                HookRole::Required => {
                    first.get_or_insert(if f.stage == HookStage::Gate {
                        RunError::Other { message: f.message }
                    } else {
                        RunError::Hook {
                            hook: f.hook,
                            message: format!("{}: {}", f.stage, f.message),
                        }
                    });
                }
                HookRole::Observer => self.emit(|| EventKind::HookFailed {
                    hook: f.hook,
                    stage: f.stage.as_str().to_owned(),
                    message: f.message,
                }),
            }
        }
        first
    }

    pub(super) fn deliver(&mut self, messages: Vec<Message>, follow_up: bool) {
        if messages.is_empty() {
            return;
        }
        // A new user message starts the stuck-loop count again.
        self.recent_turns.clear();
        let count = messages.len();
        self.kept.transcript.extend(messages);
        self.emit(|| EventKind::MessagesDelivered { count, follow_up });
    }

    /// Messages that arrived: read by the input guardrails first, when the agent has any.
    /// `reopens` as [`super::Arriving::reopens`].
    pub(super) fn arrived(&mut self, messages: Vec<Message>, reopens: Option<bool>) {
        if self.seams.input_guardrails && !messages.is_empty() {
            let text = messages
                .iter()
                .map(Message::text)
                .collect::<Vec<_>>()
                .join("\n");
            self.phase = Phase::CheckMessages(Box::new(super::Arriving {
                messages,
                text,
                reopens,
            }));
        } else {
            self.take_arrived(super::Arriving {
                messages,
                text: String::new(),
                reopens,
            });
        }
    }

    /// Arrived messages that passed: they steer the run, or reopen it.
    pub(super) fn take_arrived(&mut self, arriving: super::Arriving) {
        match arriving.reopens {
            None => {
                self.deliver(arriving.messages, false);
                self.begin_model_call();
            }
            Some(follow_up) => self.reopen(arriving.messages, follow_up),
        }
    }

    /// Waiting messages continue a run that would otherwise finish; the limits still apply.
    pub(super) fn reopen(&mut self, messages: Vec<Message>, follow_up: bool) {
        self.deliver(messages, follow_up);
        self.ending.stop = None;
        self.ending.output = None;
        self.ending.structured = None;
        self.begin_model_call();
    }

    pub(super) fn after_follow_ups(&mut self) {
        if self.seams.output_guardrails {
            self.phase = Phase::Closing(Closing::CheckOutput);
        } else {
            self.conclude_hooks();
        }
    }

    pub(super) fn conclude_hooks(&mut self) {
        self.phase = if self.seams.hooks {
            Phase::Closing(Closing::Finalize)
        } else {
            Phase::Done
        };
    }

    pub(super) fn trip(&mut self, trip: Trip) {
        let Trip { name, message } = trip;
        // What a guardrail stopped is withheld from the outcome a caller shows: the text stays in
        // the transcript, for a caller that looks for it on purpose.
        self.ending.output = None;
        self.ending.structured = None;
        self.ending.error = Some(Box::new(RunError::Guardrail {
            name: name.clone(),
            message: message.clone(),
        }));
        self.finish(StopReason::Guardrail { name, message });
    }

    /// The stop conditions were checked: one that holds ends the run as terminated.
    pub(super) fn on_stop_checked(&mut self, stop: Option<String>, failures: Vec<HookFailure>) {
        if let Some(e) = self.hook_failures(failures) {
            self.fail(e);
            return;
        }
        match stop {
            Some(by) => {
                self.emit(|| EventKind::StopConditionMet { by });
                self.ending.output = self.last_assistant_text();
                self.finish(StopReason::Terminated);
            }
            None => self.need_model(),
        }
    }

    /// The finish hooks ran: a required one's failure fails the run, observers' are reported.
    pub(super) fn on_finalized(&mut self, failures: Vec<HookFailure>) {
        let mut first = None;
        for f in failures {
            if f.role == HookRole::Required {
                first.get_or_insert(RunError::Hook {
                    hook: f.hook,
                    message: format!("{}: {}", f.stage, f.message),
                });
            } else {
                self.emit(|| EventKind::HookFailed {
                    hook: f.hook,
                    stage: f.stage.as_str().to_owned(),
                    message: f.message,
                });
            }
        }
        if let Some(e) = first {
            self.ending.stop = Some(StopReason::Failed);
            self.ending.error = Some(Box::new(e));
        }
        self.phase = Phase::Done;
    }
}
