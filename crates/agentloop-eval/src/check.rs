//! The built-in checks at work: each [`CheckSpec`] built once (its regexes and schemas compiled,
//! its judge's agent found) into a [`Check`] that scores a run with its reason.

use std::collections::HashMap;
use std::fmt::Write as _;

use agentloop::{Agent, CallStatus, RunOutcome, ToolCallRecord};
use futures::future::BoxFuture;
use regex::Regex;
use serde_json::Value;

use crate::dataset::Case;
use crate::error::EvalError;
use crate::judge::Judge;
use crate::score::{Check, Score};
use crate::spec::{CheckSpec, Order, ToolMatch, Trajectory};

/// Builds a case's checks. A judge names its agent by the key `judges` holds it under (the CLI
/// uses the judge's agent file as written in the dataset).
pub fn build_checks(
    case: &Case,
    judges: &HashMap<String, Agent>,
) -> Result<Vec<Box<dyn Check>>, EvalError> {
    case.checks
        .iter()
        .map(|spec| build(case, spec, judges))
        .collect()
}

fn build(
    case: &Case,
    spec: &CheckSpec,
    judges: &HashMap<String, Agent>,
) -> Result<Box<dyn Check>, EvalError> {
    let label = spec.label();
    let invalid = |message: String| EvalError::Check {
        case: case.name.clone(),
        check: label.clone(),
        message,
    };
    let compiled = match spec {
        CheckSpec::Regex(r) => Compiled::Regex(Regex::new(r).map_err(|e| invalid(e.to_string()))?),
        CheckSpec::JsonSchema(schema) => Compiled::Schema(Box::new(
            jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(schema)
                .map_err(|e| invalid(e.to_string()))?,
        )),
        CheckSpec::Called(m) => {
            let mut patterns = Vec::new();
            for (key, pattern) in &m.args_match {
                let Some(p) = pattern.as_str() else {
                    return Err(invalid(format!("args_match.{key} is not a string")));
                };
                patterns.push((
                    key.clone(),
                    Regex::new(p).map_err(|e| invalid(e.to_string()))?,
                ));
            }
            Compiled::Args(patterns)
        }
        CheckSpec::StopReason(s) if !STOP_REASONS.contains(&s.as_str()) => {
            return Err(invalid(format!(
                "unknown stop reason {s:?}; one of {}",
                STOP_REASONS.join(", ")
            )));
        }
        CheckSpec::Judge(j) => {
            let Some(agent) = judges.get(&j.agent) else {
                return Err(invalid(format!("no judge agent {:?} was given", j.agent)));
            };
            return Ok(Box::new(Judge::new(agent.clone(), j.clone())));
        }
        _ => Compiled::Nothing,
    };
    Ok(Box::new(Builtin {
        spec: spec.clone(),
        label,
        compiled,
    }))
}

/// The stop reasons' stable words (`agentloop::StopReason::as_str`).
const STOP_REASONS: &[&str] = &[
    "finished",
    "terminated",
    "max_turns",
    "max_tool_calls",
    "max_model_calls",
    "deadline",
    "budget",
    "stuck_loop",
    "cancelled",
    "failed",
    "truncated",
    "refused",
    "content_filter",
    "suspended",
    "guardrail",
];

/// What a built-in check compiles once, before any run.
enum Compiled {
    Nothing,
    Regex(Regex),
    Schema(Box<jsonschema::Validator>),
    Args(Vec<(String, Regex)>),
}

struct Builtin {
    spec: CheckSpec,
    label: String,
    compiled: Compiled,
}

impl Check for Builtin {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn key(&self) -> String {
        self.spec.key()
    }

    fn score<'a>(&'a self, _case: &'a Case, run: &'a RunOutcome) -> BoxFuture<'a, Score> {
        Box::pin(futures::future::ready(self.judge(run)))
    }
}

/// The longest piece of output a reason quotes.
const QUOTED: usize = 120;

fn quote(text: &str) -> String {
    let mut cut: String = text.chars().take(QUOTED).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

impl Builtin {
    fn judge(&self, run: &RunOutcome) -> Score {
        let output = run.output.as_deref().unwrap_or_default();
        match (&self.spec, &self.compiled) {
            (CheckSpec::Equals(want), _) => Score::of(
                output.trim() == want.trim(),
                format!("the output is {}", quote(output)),
            ),
            (CheckSpec::Contains(want), _) => Score::of(
                output.contains(want.as_str()),
                format!("the output is {}", quote(output)),
            ),
            (CheckSpec::NotContains(unwanted), _) => Score::of(
                !output.contains(unwanted.as_str()),
                format!("the output is {}", quote(output)),
            ),
            (CheckSpec::Regex(_), Compiled::Regex(re)) => Score::of(
                re.is_match(output),
                format!("the output is {}", quote(output)),
            ),
            (CheckSpec::JsonSchema(_), Compiled::Schema(v)) => match structured(run) {
                Err(e) => Score::fail(e),
                Ok(value) => {
                    let errors: Vec<String> =
                        v.iter_errors(&value).map(|e| e.to_string()).collect();
                    if errors.is_empty() {
                        Score::pass("the output validates")
                    } else {
                        Score::fail(format!(
                            "the output does not validate: {}",
                            errors.join("; ")
                        ))
                    }
                }
            },
            (CheckSpec::ParsesTo(want), _) => match structured(run) {
                Err(e) => Score::fail(e),
                Ok(value) => Score::of(&value == want, format!("the output parses to {value}")),
            },
            (CheckSpec::StopReason(want), _) => Score::of(
                run.stop_reason.as_str() == want,
                format!("the run stopped: {}", run.stop_reason),
            ),
            (CheckSpec::Called(m), Compiled::Args(patterns)) => called(run, m, patterns),
            (CheckSpec::NotCalled(tool), _) => {
                let n = run.tool_calls.iter().filter(|c| &*c.tool == tool).count();
                Score::of(n == 0, format!("{tool} was called {n} times"))
            }
            (CheckSpec::Trajectory(t), _) => trajectory(run, t),
            (CheckSpec::MaxTurns(max), _) => {
                at_most(f64::from(run.turns), f64::from(*max), "turns")
            }
            (CheckSpec::MaxToolCalls(max), _) => {
                at_most(f64::from(run.tool_calls_run), f64::from(*max), "tool calls")
            }
            (CheckSpec::MaxTokens(max), _) => {
                at_most(run.usage.total_tokens() as f64, *max as f64, "tokens")
            }
            (CheckSpec::MaxCostUsd(max), _) => {
                if run.unpriced_model_calls > 0 {
                    Score::fail(format!(
                        "the cost is unknown: {} model answers had no price",
                        run.unpriced_model_calls
                    ))
                } else {
                    at_most(run.cost_usd, *max, "USD")
                }
            }
            (CheckSpec::MaxSeconds(max), _) => at_most(run.duration.as_secs_f64(), *max, "seconds"),
            // A judge is built as a `Judge`; the compiled parts always go with their spec.
            _ => Score::fail("the check was not built for this run"),
        }
    }
}

fn at_most(got: f64, max: f64, unit: &str) -> Score {
    Score::of(
        got <= max,
        format!("{} {unit}, at most {}", trim(got), trim(max)),
    )
}

fn trim(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The output as a value: the structured answer, or the text parsed as JSON.
fn structured(run: &RunOutcome) -> Result<Value, String> {
    if let Some(v) = &run.structured_output {
        return Ok(v.clone());
    }
    let text = run.output.as_deref().unwrap_or_default();
    serde_json::from_str(text.trim())
        .map_err(|e| format!("the output is not JSON ({e}): {}", quote(text)))
}

/// Whether a call's handler was started: it succeeded, failed, timed out, or was cut short
/// while it ran. A call that was rejected (unknown tool, invalid arguments), denied, refused by a
/// limit or skipped never ran.
fn started(c: &ToolCallRecord) -> bool {
    matches!(
        c.outcome.status,
        CallStatus::Ok | CallStatus::Error | CallStatus::Fatal | CallStatus::Cancelled
    )
}

/// The word of a call's status (`ok`, `denied`, ...).
fn status_word(c: &ToolCallRecord) -> String {
    serde_json::to_value(c.outcome.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `called` counts the calls that started, unless it names a `status`: then the calls that ended
/// so, started or not (`status = "denied"` looks for a refused call). A call that never ran
/// would otherwise pass a check that the tool was used.
fn called(run: &RunOutcome, m: &ToolMatch, patterns: &[(String, Regex)]) -> Score {
    let of_tool: Vec<_> = run
        .tool_calls
        .iter()
        .filter(|c| *c.tool == m.tool)
        .collect();
    let counted = |c: &&&ToolCallRecord| m.status.is_some() || started(c);
    let matching = of_tool
        .iter()
        .filter(counted)
        .filter(|c| matches(c, m, patterns))
        .count();
    let want = m.times.unwrap_or(1) as usize;
    let ran = of_tool.iter().filter(counted).count();
    let mut reason = format!("{} called {ran} times", m.tool);
    if ran < of_tool.len() {
        let _ = write!(
            reason,
            " ({} more never ran: {})",
            of_tool.len() - ran,
            of_tool
                .iter()
                .filter(|c| !counted(c))
                .map(|c| status_word(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let refined = !m.args.is_empty()
        || !patterns.is_empty()
        || m.status.is_some()
        || m.result_contains.is_some();
    if refined {
        let _ = write!(reason, ", {matching} matching");
        if matching < want {
            let seen: Vec<String> = of_tool
                .iter()
                .map(|c| {
                    format!(
                        "{} {} {}",
                        c.arguments,
                        status_word(c),
                        quote(&c.outcome.content.to_text())
                    )
                })
                .collect();
            if !seen.is_empty() {
                let _ = write!(reason, " (the calls: {})", seen.join("; "));
            }
        }
    }
    if want > 1 {
        let _ = write!(reason, "; wanted at least {want}");
    }
    Score::of(matching >= want, reason)
}

fn matches(c: &ToolCallRecord, m: &ToolMatch, patterns: &[(String, Regex)]) -> bool {
    let arguments = c.arguments.to_value();
    m.args.iter().all(|(k, v)| arguments.get(k) == Some(v))
        && patterns.iter().all(|(k, re)| match arguments.get(k) {
            Some(Value::String(s)) => re.is_match(s),
            Some(other) => re.is_match(&other.to_string()),
            None => false,
        })
        && m.status.is_none_or(|s| c.outcome.status == s)
        && m.result_contains
            .as_ref()
            .is_none_or(|t| c.outcome.content.to_text().contains(t.as_str()))
}

/// `trajectory` compares the calls that started: one rejected, denied or refused is not a step
/// the agent took (the reason names those left out, with how they ended).
fn trajectory(run: &RunOutcome, t: &Trajectory) -> Score {
    let calls: Vec<&str> = run
        .tool_calls
        .iter()
        .filter(|c| started(c))
        .map(|c| &*c.tool)
        .collect();
    let left_out: Vec<String> = run
        .tool_calls
        .iter()
        .filter(|c| !started(c))
        .map(|c| format!("{} {}", c.tool, status_word(c)))
        .collect();
    let passed = match t.order {
        Order::Exact => calls.iter().copied().eq(t.tools.iter().map(String::as_str)),
        Order::InOrder => {
            let mut rest = calls.iter();
            t.tools.iter().all(|want| rest.any(|c| c == want))
        }
        Order::Set => {
            t.tools.iter().all(|want| calls.contains(&want.as_str()))
                && calls.iter().all(|c| t.tools.iter().any(|w| w == c))
        }
    };
    let mut reason = format!("the calls were [{}]", calls.join(", "));
    if !left_out.is_empty() {
        let _ = write!(reason, " (never ran: {})", left_out.join(", "));
    }
    Score::of(passed, reason)
}
