//! The judge: another agent (a model with instructions and a rubric, and an output schema) reads
//! the case's input and the run's output and returns a structured verdict. Its run's cost is
//! the check's own, reported apart from the case's.

use agentloop::{Agent, RunOutcome};
use futures::future::BoxFuture;
use serde_json::Value;

use crate::dataset::Case;
use crate::score::{Check, Score};
use crate::spec::{CheckSpec, JudgeSpec};

/// The verdict a judge's output schema asks for: `{"pass": bool, "score": 0..1, "reason": "..."}`
/// (`score` optional; `pass` optional, for a judge decided by its score: a verdict's `pass`, when
/// given, decides; else its score against `min_score`, 0.5 by default).
pub const VERDICT_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "pass": {"type": "boolean"},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "reason": {"type": "string"}
  },
  "required": ["reason"],
  "additionalProperties": false
}"#;

/// The lowest score that passes a verdict with a score and no `pass`, when the check gives no
/// `min_score`.
pub const DEFAULT_MIN_SCORE: f64 = 0.5;

/// A judge check.
pub struct Judge {
    agent: Agent,
    spec: JudgeSpec,
}

impl Judge {
    /// A judge that runs `agent`.
    pub fn new(agent: Agent, spec: JudgeSpec) -> Judge {
        Judge { agent, spec }
    }

    fn prompt(&self, case: &Case, run: &RunOutcome) -> String {
        format!(
            "Judge an answer against a rubric. Give your verdict as the output schema asks.\n\n\
             Rubric:\n{}\n\nThe task:\n{}\n\nThe answer:\n{}\n",
            self.spec.rubric,
            case.input_text(),
            run.output.as_deref().unwrap_or("(no answer)")
        )
    }
}

impl Check for Judge {
    fn label(&self) -> String {
        format!("judge {}", self.spec.agent)
    }

    fn key(&self) -> String {
        CheckSpec::Judge(self.spec.clone()).key()
    }

    fn score<'a>(&'a self, case: &'a Case, run: &'a RunOutcome) -> BoxFuture<'a, Score> {
        Box::pin(async move {
            let judged = self.agent.run(self.prompt(case, run)).await;
            let mut score = verdict(&judged, self.spec.min_score);
            score.cost_usd = judged.cost_usd;
            score.tokens = judged.usage.total_tokens();
            score
        })
    }
}

/// Reads a judge's run as a verdict.
fn verdict(judged: &RunOutcome, min_score: Option<f64>) -> Score {
    let value = judged.structured_output.clone().or_else(|| {
        judged
            .output
            .as_deref()
            .and_then(|t| serde_json::from_str::<Value>(t.trim()).ok())
    });
    let Some(Value::Object(v)) = value else {
        return Score::fail(format!(
            "the judge gave no verdict (its run stopped: {}{})",
            judged.stop_reason,
            judged
                .error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    };
    let reason = v
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("(no reason given)")
        .to_owned();
    let score = v.get("score").and_then(Value::as_f64);
    // The judge's own `pass` wins: a verdict that says it fails (`{"pass": false, "score":
    // 0.7, "reason": "wrong city"}`) is not passed by a threshold it never saw.
    let passed = match (v.get("pass").and_then(Value::as_bool), score) {
        (Some(p), _) => p,
        (None, Some(s)) => s >= min_score.unwrap_or(DEFAULT_MIN_SCORE),
        (None, None) => false,
    };
    Score {
        passed,
        score: score.unwrap_or(if passed { 1.0 } else { 0.0 }),
        reason: format!("the judge: {reason}"),
        cost_usd: 0.0,
        tokens: 0,
    }
}
