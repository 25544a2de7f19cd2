//! The model's questions to the user: the `ask_user` tool ([`ask_user_tool`]), the seam an
//! application answers them through ([`Answerer`]: a terminal, a web page) and the gate that
//! puts them ([`AskGate`]).
//!
//! A question is a call like any other for the model (`ask_user` with a `question` and,
//! optionally, the JSON Schema its answer must match: a choice, a number, a form). The gate
//! answers it at admission with [`Verdict::Answer`], before any tool of the batch starts, so the
//! questions and approvals of one batch are put together. On a journaled run with no answerer
//! the run suspends on them, as on approvals: they are listed beside the approvals, answered
//! from any process ([`check_answer`] is the check an answer passes before it is recorded), and
//! found again, once each, when the run resumes ([`crate::gate::Approvals::take_reply`]). The
//! gate wraps the permission gate ([`AskGate::around`]) so that a batch suspends once, on both.
//!
//! | code | meaning |
//! |---|---|
//! | `answer.invalid` | the answer does not match the question's schema |
//! | `answer.bad_schema` | the question's schema is not a usable JSON Schema |
//! | `answer.not_a_question` | the call's arguments are not a question |

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::RunError;
use crate::gate::{Answer, ApprovalRequest, Gate, GateContext, Question};
use crate::machine::{AdmittedCall, Verdict};
use crate::tool::{Tool, ToolError, compile_schema, join_violations, validate_with};

/// The name the `ask_user` tool has unless an application renames it.
pub const TOOL_NAME: &str = "ask_user";

/// The reason a question is refused when nobody can answer it and the run cannot suspend.
pub const NOBODY_REASON: &str = "nobody can answer a question in this run";

/// The reason a question is refused when the user declined to answer it.
pub const REFUSED_REASON: &str = "the user declined to answer the question";

/// Why a question or an answer is refused (see the module's table of codes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// The answer does not match the question's schema.
    #[error("the answer does not match the question's schema: {violations}")]
    Invalid {
        /// What fails, joined.
        violations: String,
    },
    /// The question's schema cannot be compiled.
    #[error("the answer schema is not a valid JSON Schema: {reason}")]
    BadSchema {
        /// Why.
        reason: String,
    },
    /// The arguments are not a question.
    #[error("not a question: {reason}")]
    NotAQuestion {
        /// Why.
        reason: String,
    },
}

impl AnswerError {
    /// The stable code (see the module's table).
    pub fn code(&self) -> &'static str {
        match self {
            AnswerError::Invalid { .. } => "answer.invalid",
            AnswerError::BadSchema { .. } => "answer.bad_schema",
            AnswerError::NotAQuestion { .. } => "answer.not_a_question",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionArgs {
    question: String,
    #[serde(default)]
    schema: Option<Value>,
}

/// The question an `ask_user` call asks, its schema checked.
pub fn question_of(arguments: &Value) -> Result<Question, AnswerError> {
    let args: QuestionArgs =
        serde_json::from_value(arguments.clone()).map_err(|e| AnswerError::NotAQuestion {
            reason: e.to_string(),
        })?;
    if let Some(schema) = &args.schema {
        compile_schema(schema).map_err(|reason| AnswerError::BadSchema { reason })?;
    }
    Ok(Question {
        text: args.question,
        schema: args.schema,
    })
}

/// Checks an answer against its question's schema (any value answers a question without one).
pub fn check_answer(question: &Question, answer: &Value) -> Result<(), AnswerError> {
    let Some(schema) = &question.schema else {
        return Ok(());
    };
    let validator = compile_schema(schema).map_err(|reason| AnswerError::BadSchema { reason })?;
    validate_with(&validator, answer).map_err(|v| AnswerError::Invalid {
        violations: join_violations(&v),
    })
}

/// The `ask_user` tool, under `name`. Its calls are answered by an [`AskGate`] before they would
/// run; one that reaches the tool had nobody to answer it, and the model reads that.
pub fn ask_user_tool(name: &str) -> Tool {
    Tool::builder(name)
        .description(
            "Asks the user a question and answers with their reply. Use it when you need a \
             decision or a fact only the user has; ask several at once in one turn when you \
             need several. Give `schema` (a JSON Schema) to get a structured answer: \
             {\"enum\": [\"small\", \"large\"]} for a choice, {\"type\": \"number\"} for a \
             number, {\"type\": \"object\", \"properties\": {...}, \"required\": [...]} for a \
             form. Without it the answer is free text.",
        )
        .dynamic(
            json!({
                "type": "object",
                "properties": {
                    "question": {
                        "type": "string",
                        "description": "the question, as the user reads it"
                    },
                    "schema": {
                        "type": "object",
                        "description": "optional JSON Schema the answer must match"
                    }
                },
                "required": ["question"],
                "additionalProperties": false
            }),
            |_args: Value, _ctx| async {
                Err(ToolError::new(
                    "answer.nobody",
                    "nobody could answer the question: ask_user is answered by the program's \
                     answer gate, and this run has none",
                ))
            },
        )
}

/// Answers the model's questions: a person at a terminal, a web app's user. Asked about all the
/// open questions of a batch at once.
pub trait Answerer: Send + Sync {
    /// One answer per question, in order (each `request.question` is set); `Err` refuses them
    /// all with that reason, which the model reads. An answer that fails its question's schema
    /// is refused by the gate, so an answerer should check with [`check_answer`] and ask again.
    fn answer<'a>(
        &'a self,
        cx: GateContext<'a>,
        questions: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Value>, String>>;
}

/// The gate of questions: it answers the calls of its tool (through its [`Answerer`], from the
/// answers a resumed run recorded, or by suspending a journaled run) and hands every other call
/// to the gate it wraps, if any.
pub struct AskGate {
    tool: String,
    answerer: Option<Arc<dyn Answerer>>,
    inner: Option<Arc<dyn Gate>>,
    unattended_reason: String,
}

impl std::fmt::Debug for AskGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AskGate")
            .field("tool", &self.tool)
            .field("answerer", &self.answerer.is_some())
            .field("inner", &self.inner.as_ref().map(|g| g.name().to_owned()))
            .finish()
    }
}

impl Default for AskGate {
    fn default() -> Self {
        Self::new()
    }
}

impl AskGate {
    /// A gate for the calls of `ask_user`, with no answerer: a journaled run suspends on its
    /// questions, another refuses them ([`NOBODY_REASON`]).
    pub fn new() -> Self {
        AskGate {
            tool: TOOL_NAME.to_owned(),
            answerer: None,
            inner: None,
            unattended_reason: NOBODY_REASON.to_owned(),
        }
    }

    /// The name of the questions' tool, when it is not `ask_user`.
    #[must_use]
    pub fn tool(mut self, name: impl Into<String>) -> Self {
        self.tool = name.into();
        self
    }

    /// Who answers.
    #[must_use]
    pub fn with_answerer(mut self, answerer: Arc<dyn Answerer>) -> Self {
        self.answerer = Some(answerer);
        self
    }

    /// The gate the other calls go to (the permission gate): one batch's approvals and
    /// questions then suspend a run once, together.
    #[must_use]
    pub fn around(mut self, gate: Arc<dyn Gate>) -> Self {
        self.inner = Some(gate);
        self
    }

    /// The reason a question is refused when nobody can answer it and the run cannot suspend.
    #[must_use]
    pub fn unattended_reason(mut self, reason: impl Into<String>) -> Self {
        self.unattended_reason = reason.into();
        self
    }

    /// The questions' verdicts where they are settled already (a bad question is denied, a
    /// recorded answer answers), and the open ones with their positions.
    fn settle(
        &self,
        cx: &GateContext<'_>,
        calls: &[AdmittedCall],
        verdicts: &mut [Verdict],
    ) -> Vec<(usize, ApprovalRequest)> {
        let mut open = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            if *c.tool != *self.tool {
                continue;
            }
            let Some(verdict) = verdicts.get_mut(i) else {
                continue;
            };
            let question = match question_of(&c.arguments) {
                Ok(q) => q,
                Err(e) => {
                    *verdict = Verdict::Deny(e.to_string());
                    continue;
                }
            };
            let recorded = cx
                .approvals
                .take_reply(&c.call_id, &c.tool, &c.arguments)
                .filter(|reply| check_answer(&question, reply).is_ok());
            if let Some(reply) = recorded {
                *verdict = Verdict::Answer(reply);
                continue;
            }
            // A question refused where it waited (an awakeable rejected through Restate's API)
            // is recorded as a denial: the model reads that, rather than being asked again.
            if let Some(Answer::DenyOnce | Answer::DenyAlways) =
                cx.approvals.take(&c.call_id, &c.tool, &c.arguments)
            {
                *verdict = Verdict::Deny(REFUSED_REASON.to_owned());
                continue;
            }
            let mut request = ApprovalRequest::of_call(c, cx.agent);
            request.question = Some(question);
            open.push((i, request));
        }
        open
    }

    /// The wrapped gate's verdicts on the calls that are not questions, put in their places.
    async fn others(
        &self,
        cx: GateContext<'_>,
        calls: &[AdmittedCall],
        verdicts: &mut [Verdict],
    ) -> Result<(), RunError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let (at, others): (Vec<usize>, Vec<AdmittedCall>) = calls
            .iter()
            .enumerate()
            .filter(|(_, c)| *c.tool != *self.tool)
            .map(|(i, c)| (i, c.clone()))
            .unzip();
        if others.is_empty() {
            return Ok(());
        }
        let got = inner.check(cx, &others).await?;
        if got.len() != others.len() {
            return Err(RunError::Other {
                message: format!(
                    "the gate {} gave {} verdicts for {} calls",
                    inner.name(),
                    got.len(),
                    others.len()
                ),
            });
        }
        for (i, v) in at.into_iter().zip(got) {
            if let Some(slot) = verdicts.get_mut(i) {
                *slot = v;
            }
        }
        Ok(())
    }
}

impl Gate for AskGate {
    fn name(&self) -> &str {
        "ask_user"
    }

    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        Box::pin(async move {
            let mut verdicts = vec![Verdict::Allow; calls.len()];
            let open = self.settle(&cx, calls, &mut verdicts);
            // Held before the wrapped gate asks: if it suspends, it suspends on both.
            let suspend = !open.is_empty()
                && self.answerer.is_none()
                && cx
                    .approvals
                    .hold(open.iter().map(|(_, r)| r.clone()).collect());
            if let Err(e) = self.others(cx, calls, &mut verdicts).await {
                if suspend {
                    drop(cx.approvals.take_pending());
                }
                return Err(e);
            }
            if suspend {
                cx.approvals.suspend(Vec::new());
                // The driver stops the run here; the journal keeps the batch.
                return std::future::pending().await;
            }
            if open.is_empty() {
                return Ok(verdicts);
            }
            let requests: Vec<ApprovalRequest> = open.iter().map(|(_, r)| r.clone()).collect();
            let replies = match &self.answerer {
                Some(answerer) => answerer.answer(cx, &requests).await,
                None => Err(self.unattended_reason.clone()),
            };
            match replies {
                Ok(replies) if replies.len() == requests.len() => {
                    for ((i, request), reply) in open.into_iter().zip(replies) {
                        let checked = request
                            .question
                            .as_ref()
                            .map_or(Ok(()), |q| check_answer(q, &reply));
                        if let Some(v) = verdicts.get_mut(i) {
                            *v = match checked {
                                Ok(()) => Verdict::Answer(reply),
                                Err(e) => Verdict::Deny(format!("the user's answer: {e}")),
                            };
                        }
                    }
                }
                Ok(replies) => {
                    return Err(RunError::Other {
                        message: format!(
                            "the answerer gave {} answers for {} questions",
                            replies.len(),
                            requests.len()
                        ),
                    });
                }
                Err(reason) => {
                    for (i, _) in open {
                        if let Some(v) = verdicts.get_mut(i) {
                            *v = Verdict::Deny(reason.clone());
                        }
                    }
                }
            }
            Ok(verdicts)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn questions_and_answers_are_checked_against_the_schema() {
        let q = question_of(&json!({"question": "Size?", "schema": {"enum": ["s", "l"]}})).unwrap();
        assert_eq!(q.text, "Size?");
        assert!(check_answer(&q, &json!("s")).is_ok());
        let e = check_answer(&q, &json!("xl")).unwrap_err();
        assert_eq!(e.code(), "answer.invalid");
        let free = question_of(&json!({"question": "Why?"})).unwrap();
        assert!(check_answer(&free, &json!({"any": 1})).is_ok());
        let bad = question_of(&json!({"question": "n?", "schema": {"type": 7}})).unwrap_err();
        assert_eq!(bad.code(), "answer.bad_schema");
        let not = question_of(&json!({"ask": "n?"})).unwrap_err();
        assert_eq!(not.code(), "answer.not_a_question");
    }
}
