//! The built-in checks as data, as a dataset writes them (`{ contains = "Lisbon" }`,
//! `{ called = { tool = "get_weather", args = { city = "Paris" } } }`, ...), and their labels.

use std::fmt::Write as _;

use agentloop::CallStatus;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A check as a dataset writes it: `{ contains = "Lisbon" }`, `{ max_turns = 4 }`, ...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckSpec {
    /// The output equals this text (surrounding white space aside).
    Equals(String),
    /// The output contains this text.
    Contains(String),
    /// The output does not contain this text.
    NotContains(String),
    /// The output matches this regular expression.
    Regex(String),
    /// The output (the structured answer, or the text parsed as JSON) validates against this
    /// JSON Schema.
    JsonSchema(Value),
    /// The output (the structured answer, or the text parsed as JSON) equals this value.
    ParsesTo(Value),
    /// The run stopped for this reason (`finished`, `max_turns`, ...).
    StopReason(String),
    /// A tool was called, with arguments that match: a call that started (not one rejected,
    /// denied or refused), unless the match names a `status`.
    Called(ToolMatch),
    /// A tool was never called: not even a call that was rejected, denied or refused.
    NotCalled(String),
    /// The tools called (the calls that started), in order or as a set.
    Trajectory(Trajectory),
    /// At most this many turns.
    MaxTurns(u32),
    /// At most this many tool calls run (or started; calls refused or rejected do not count).
    MaxToolCalls(u32),
    /// At most this many tokens (input and output, subagents' included).
    MaxTokens(u64),
    /// At most this many dollars.
    MaxCostUsd(f64),
    /// At most this many seconds.
    MaxSeconds(f64),
    /// Another agent judges the output against a rubric and returns a verdict.
    Judge(JudgeSpec),
}

/// `called`: a tool and what its arguments must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolMatch {
    /// The tool's name.
    pub tool: String,
    /// Arguments that must have these values (others may be there too).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub args: Map<String, Value>,
    /// Arguments whose text (a string's value, or the JSON of any other) must match these regular
    /// expressions.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub args_match: Map<String, Value>,
    /// How the call ended (`ok`, `error`, `denied`, `rejected`, ...). Left out, only calls that
    /// started count (`ok`, `error`, `fatal`, `cancelled`); given, every call that ended so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CallStatus>,
    /// Text the call's result (what the model read) contains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_contains: Option<String>,
    /// At least this many matching calls (1 when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

/// `trajectory`: the tools the run called, counting the calls that started (a call rejected,
/// denied, refused or skipped is left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// The tools, by name.
    pub tools: Vec<String>,
    /// How they are compared.
    #[serde(default)]
    pub order: Order,
}

/// How a trajectory is compared with the calls made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The tools appear in this order, other calls between them allowed.
    #[default]
    InOrder,
    /// The calls are exactly these, in this order.
    Exact,
    /// The calls are these tools, in any order and any number of times, and no others.
    Set,
}

/// `judge`: which agent judges, and by what rubric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// The judge's agent: in a dataset file, its agent file (relative to the dataset).
    pub agent: String,
    /// What a good answer is.
    pub rubric: String,
    /// The lowest score that passes, when the verdict carries a score and no `pass` (a verdict's
    /// own `pass` always decides; to judge by score alone, give the judge an output schema
    /// without `pass`). Without it, a score alone passes from 0.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_score: Option<f64>,
}

impl CheckSpec {
    /// The check in full, as the dataset wrote it (its JSON): what a baseline matches it by,
    /// where two labels cut short may be the same.
    pub fn key(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| self.label())
    }

    /// The check's label in reports: its kind and what it looks for, short.
    pub fn label(&self) -> String {
        let short = |s: &str| {
            let cut: String = s.chars().take(40).collect();
            if cut.len() < s.len() {
                format!("{cut}…")
            } else {
                cut
            }
        };
        match self {
            CheckSpec::Equals(s) => format!("equals {:?}", short(s)),
            CheckSpec::Contains(s) => format!("contains {:?}", short(s)),
            CheckSpec::NotContains(s) => format!("not_contains {:?}", short(s)),
            CheckSpec::Regex(s) => format!("regex {:?}", short(s)),
            CheckSpec::JsonSchema(_) => "json_schema".into(),
            CheckSpec::ParsesTo(v) => format!("parses_to {}", short(&v.to_string())),
            CheckSpec::StopReason(s) => format!("stop_reason {s}"),
            CheckSpec::Called(m) => {
                let mut l = format!("called {}", m.tool);
                if !m.args.is_empty() {
                    let _ = write!(l, " {}", short(&Value::Object(m.args.clone()).to_string()));
                }
                if !m.args_match.is_empty() {
                    let _ = write!(
                        l,
                        " ~{}",
                        short(&Value::Object(m.args_match.clone()).to_string())
                    );
                }
                if let Some(s) = m.status {
                    let word = serde_json::to_value(s)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let _ = write!(l, " {word}");
                }
                if let Some(t) = &m.result_contains {
                    let _ = write!(l, " → {:?}", short(t));
                }
                if let Some(n) = m.times {
                    let _ = write!(l, " x{n}");
                }
                l
            }
            CheckSpec::NotCalled(t) => format!("not_called {t}"),
            CheckSpec::Trajectory(t) => {
                let order = match t.order {
                    Order::InOrder => "in_order",
                    Order::Exact => "exact",
                    Order::Set => "set",
                };
                format!("trajectory {order} [{}]", t.tools.join(", "))
            }
            CheckSpec::MaxTurns(n) => format!("max_turns {n}"),
            CheckSpec::MaxToolCalls(n) => format!("max_tool_calls {n}"),
            CheckSpec::MaxTokens(n) => format!("max_tokens {n}"),
            CheckSpec::MaxCostUsd(n) => format!("max_cost_usd {n}"),
            CheckSpec::MaxSeconds(n) => format!("max_seconds {n}"),
            CheckSpec::Judge(j) => format!("judge {}", j.agent),
        }
    }
}
