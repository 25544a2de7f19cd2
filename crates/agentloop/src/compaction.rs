//! Compaction: keeping a long conversation inside the model's context window.
//!
//! Before each model call the machine estimates the request's size (see [`estimate`]). When the
//! estimate plus the room kept for the answer would pass the context budget
//! ([`Compaction::context_tokens`]), older messages are compacted, by one of two policies:
//!
//! - [`CompactionPolicy::Summarize`] (the default): the model writes a summary of the older part,
//!   which replaces it as one user message. The instructions are never part of it (they are sent
//!   apart), and the latest turns stay whole ([`Compaction::keep_turns`]).
//! - [`CompactionPolicy::DropToolResults`]: the bodies of the oldest tool results are replaced by
//!   a short note, oldest first, until the request fits (or only the latest turns' are left).
//!
//! Either way a tool call is never split from its result: the older part ends where no call is
//! waiting for its result, and a dropped result keeps its call id. The compaction is an event
//! ([`crate::event::EventKind::Compacted`]) and a record in the outcome
//! ([`crate::RunOutcome::compactions`]) holding the messages it replaced, so the full history is
//! never lost: a session store keeps it ([`crate::session::StoredSession::history`]).
//!
//! A summary that fails (the model call fails, writes nothing, or writes something no shorter
//! than what it would replace) falls back to dropping tool results; a run never fails because
//! compaction did. A record's `tokens_before` is the size the rule judged (the provider's count
//! where it had one); its `tokens_after` is the estimate of the compacted request.
//!
//! ## The estimate and its error
//!
//! The budget is judged on the provider's own count where there is one: the input and output
//! tokens the last response reported cover everything up to and including that response, and only
//! what was added since (tool results, new messages) is estimated. With no reported count (the
//! first call, after a compaction, a provider that reports none) the whole request is estimated.
//!
//! The estimate is the text's UTF-8 length divided by 3 (`BYTES_PER_TOKEN`), plus 8
//! (`MESSAGE_OVERHEAD_TOKENS`) per message, per tool call and per tool, plus 100
//! (`TOOLS_OVERHEAD_TOKENS`) for a request that offers tools (the preamble a chat template or
//! provider wraps the tool list in). Measured against the local model's tokenizer (Qwen2.5, a
//! byte-level BPE like OpenAI's; `bench/estimate_error.py`), the text estimate is 1.35 times the
//! real count for English prose, 1.43 for Rust code, 0.96 for JSON and 1.56 for Chinese; a whole
//! request of the local example agent (five tools) came out at 1.02 to 1.05 times the prompt
//! tokens the server reported. A tokenizer that splits CJK text more finely than one token a
//! character (older OpenAI ones take up to 1.5) is under-counted by up to a third: keep
//! `context_tokens` below the model's real window when a conversation is mostly such text. The
//! estimate errs high on purpose: a compaction a little early costs a summary; one too late costs
//! the call (the provider refuses an over-long request).

use serde::{Deserialize, Serialize};

use crate::message::{Message, ToolContent, ToolResult};
use crate::model::{ModelRequest, ModelSettings, ToolChoice, Usage};

/// The bytes of text counted as one token by the estimate.
pub(crate) const BYTES_PER_TOKEN: usize = 3;

/// The tokens counted for each message and tool call beyond its text (roles, separators, ids).
pub(crate) const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// The tokens counted once for a request that offers tools, beyond the tools themselves.
pub(crate) const TOOLS_OVERHEAD_TOKENS: u64 = 100;

/// How many of the latest turns stay whole by default.
pub const DEFAULT_KEEP_TURNS: u32 = 2;

/// The first line of a summary message; the machine knows a summary by it.
pub(crate) const SUMMARY_HEADING: &str =
    "[Summary of the earlier conversation, written to save context]";

/// What a dropped tool result reads.
pub const DROPPED_RESULT: &str =
    "[This tool result was removed to save context; call the tool again if it is still needed.]";

/// The instructions of the summary call.
pub const SUMMARY_INSTRUCTIONS: &str = "You compact conversations. The conversation below \
between a user and an AI assistant with tools is too long to keep. Write a summary that lets the \
assistant carry on as if it had read all of it: the user's goals and requests, what was decided \
and why, facts learned from tool results (exact names, paths, numbers, identifiers and errors), \
what was done, and what is still open. Write plain prose and lists; no preamble, no tool calls.";

/// What to do when a request would pass the context budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionPolicy {
    /// The model summarizes the older part, which the summary replaces (the default).
    #[default]
    Summarize,
    /// The bodies of the oldest tool results are dropped.
    DropToolResults,
}

impl CompactionPolicy {
    /// The policy's name, as agent files and traces spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionPolicy::Summarize => "summarize",
            CompactionPolicy::DropToolResults => "drop_tool_results",
        }
    }
}

/// When and how an agent's conversations are compacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// The model's context window in tokens: a request and the room kept for its answer must fit.
    pub context_tokens: u64,
    /// The room kept for the answer: the settings' `max_tokens`, else an eighth of the window (at
    /// most 8192 tokens) when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_tokens: Option<u64>,
    /// How to compact.
    #[serde(default)]
    pub policy: CompactionPolicy,
    /// How many of the latest model turns (each with its tool results, and the user messages just
    /// before it) stay whole.
    #[serde(default = "default_keep_turns")]
    pub keep_turns: u32,
}

fn default_keep_turns() -> u32 {
    DEFAULT_KEEP_TURNS
}

impl Compaction {
    /// Compaction by summary for a window of `context_tokens`.
    pub fn new(context_tokens: u64) -> Self {
        Compaction {
            context_tokens,
            reserve_tokens: None,
            policy: CompactionPolicy::default(),
            keep_turns: DEFAULT_KEEP_TURNS,
        }
    }

    /// Sets the policy.
    pub fn policy(mut self, policy: CompactionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets how many of the latest turns stay whole (at least one always does).
    pub fn keep_turns(mut self, turns: u32) -> Self {
        self.keep_turns = turns;
        self
    }

    /// Sets the room kept for the answer.
    pub fn reserve_tokens(mut self, tokens: u64) -> Self {
        self.reserve_tokens = Some(tokens);
        self
    }

    /// The most tokens a request may take: the window less the room for the answer.
    pub fn budget(&self, settings: &ModelSettings) -> u64 {
        let reserve = self
            .reserve_tokens
            .or(settings.max_tokens.map(u64::from))
            .unwrap_or((self.context_tokens / 8).min(8192));
        self.context_tokens.saturating_sub(reserve)
    }
}

/// The context window of a common model, by its id (a provider prefix such as `openai/` and a
/// date suffix are allowed): the default of [`Compaction::context_tokens`] when none is set.
/// `None` for a model it does not know, whose conversations are then not compacted unless a
/// window is set.
pub fn known_context_tokens(model: &str) -> Option<u64> {
    let id = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    const TABLE: &[(&str, u64)] = &[
        ("gpt-4.1", 1_047_576),
        ("gpt-5", 400_000),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("o1-mini", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4-mini", 200_000),
        ("claude-", 200_000),
        ("gemini-1.5", 1_048_576),
        ("gemini-2", 1_048_576),
        ("deepseek-", 128_000),
        ("mistral-large", 128_000),
        ("llama-3.1", 128_000),
        ("llama-3.3", 128_000),
        ("qwen2.5", 32_768),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| id.starts_with(prefix))
        .map(|(_, n)| *n)
}

/// The estimated tokens of some text.
pub(crate) fn estimate_text(text: &str) -> u64 {
    text.len().div_ceil(BYTES_PER_TOKEN) as u64
}

/// The estimated tokens of one message.
pub(crate) fn estimate_message(message: &Message) -> u64 {
    let body = match message {
        Message::User { .. } => estimate_text(&message.text()),
        Message::Assistant(a) => {
            let reasoning: u64 = a.reasoning.iter().map(|r| estimate_text(&r.text)).sum();
            let calls: u64 = a
                .tool_calls
                .iter()
                .map(|c| {
                    MESSAGE_OVERHEAD_TOKENS
                        + estimate_text(&c.tool)
                        + estimate_text(&c.arguments)
                        + estimate_text(&c.call_id)
                })
                .sum();
            estimate_text(&a.text) + reasoning + calls
        }
        Message::Tool(r) => estimate_text(&r.content.to_text()) + estimate_text(&r.call_id),
    };
    MESSAGE_OVERHEAD_TOKENS + body
}

/// The estimated tokens of a whole request: instructions, tool schemas, output schema and
/// messages.
pub fn estimate(request: &ModelRequest<'_>) -> u64 {
    let messages: u64 = request.messages.iter().map(estimate_message).sum();
    estimate_fixed(request) + messages
}

/// The estimated tokens of a request's parts that a run does not change from call to call: its
/// instructions, tool schemas and output schema.
pub(crate) fn estimate_fixed(request: &ModelRequest<'_>) -> u64 {
    let instructions = request.instructions.map_or(0, estimate_text);
    let preamble = if request.tools.is_empty() {
        0
    } else {
        TOOLS_OVERHEAD_TOKENS
    };
    let tools: u64 = request
        .tools
        .iter()
        .map(|t| {
            MESSAGE_OVERHEAD_TOKENS
                + estimate_text(&t.name)
                + estimate_text(&t.description)
                + estimate_text(&t.input_schema.to_string())
        })
        .sum();
    let schema = request
        .output_schema
        .map_or(0, |s| estimate_text(&s.to_string()));
    instructions + preamble + tools + schema
}

/// True when a message is a summary written by a compaction.
pub fn is_summary(message: &Message) -> bool {
    match message {
        Message::User { content } => matches!(
            content.first(),
            Some(crate::message::ContentPart::Text { text }) if text.starts_with(SUMMARY_HEADING)
        ),
        _ => false,
    }
}

/// Where the older part of `messages` ends when the latest `keep_turns` model turns stay whole:
/// the start of the earliest kept turn (taking the user messages just before it along), never
/// between a call and its result. `None` when there is nothing older to compact besides an
/// earlier summary.
pub(crate) fn split_point(messages: &[Message], keep_turns: u32) -> Option<usize> {
    let cut = kept_from(messages, keep_turns);
    // Nothing to gain when only an earlier summary (or nothing) lies before the cut.
    let older = messages.get(..cut)?;
    if older.iter().all(is_summary) {
        return None;
    }
    Some(cut)
}

/// Where the latest `keep_turns` model turns start (with the user messages just before them); 0
/// when the transcript holds no more turns than that.
pub(crate) fn kept_from(messages: &[Message], keep_turns: u32) -> usize {
    let keep = keep_turns.max(1) as usize;
    // Model turns that start where no call waits for its result.
    let mut starts = Vec::new();
    let mut open = 0usize;
    for (i, m) in messages.iter().enumerate() {
        match m {
            Message::Assistant(a) => {
                if open == 0 {
                    starts.push(i);
                }
                open += a.tool_calls.len();
            }
            Message::Tool(_) => open = open.saturating_sub(1),
            Message::User { .. } => {}
        }
    }
    let Some(&first_kept) = starts.len().checked_sub(keep).and_then(|k| starts.get(k)) else {
        return 0;
    };
    let mut cut = first_kept;
    while cut > 0 && matches!(messages.get(cut - 1), Some(Message::User { .. })) {
        cut -= 1;
    }
    cut
}

/// The text a summary call reads: the older part as a plain conversation, each tool result cut
/// to its head and tail so that one huge result does not crowd out the rest.
pub(crate) fn render_for_summary(messages: &[Message]) -> String {
    const MAX_RESULT: usize = 4000;
    let mut out = String::from("The conversation so far:\n");
    for m in messages {
        match m {
            Message::User { .. } => {
                out.push_str("\nUser: ");
                out.push_str(&m.text());
            }
            Message::Assistant(a) => {
                if !a.text.is_empty() {
                    out.push_str("\nAssistant: ");
                    out.push_str(&a.text);
                }
                for c in &a.tool_calls {
                    out.push_str(&format!(
                        "\nAssistant called tool {} ({}) with {}",
                        c.tool, c.call_id, c.arguments
                    ));
                }
            }
            Message::Tool(r) => {
                let text = r.content.to_text();
                let kind = if r.is_error { "error" } else { "result" };
                out.push_str(&format!("\nTool {} ({}) {kind}: ", r.tool, r.call_id));
                out.push_str(&head_and_tail(&text, MAX_RESULT));
            }
        }
    }
    out.push_str("\n\nWrite the summary now.");
    out
}

fn head_and_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let head_end = floor_char(text, max / 2);
    let tail_start = ceil_char(text, text.len() - max / 2);
    format!(
        "{} [... {} bytes cut ...] {}",
        text.get(..head_end).unwrap_or_default(),
        tail_start - head_end,
        text.get(tail_start..).unwrap_or_default()
    )
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// The settings of a summary call: the agent's, with no tools to choose and an answer of at most
/// a quarter of the window (and at most 4096 tokens).
pub(crate) fn summary_settings(c: &Compaction, settings: &ModelSettings) -> ModelSettings {
    let cap = (c.context_tokens / 4).clamp(256, 4096);
    let cap = u32::try_from(cap).unwrap_or(4096);
    ModelSettings {
        max_tokens: Some(settings.max_tokens.map_or(cap, |m| m.min(cap))),
        tool_choice: Some(ToolChoice::None),
        parallel_tool_calls: None,
        ..settings.clone()
    }
}

/// The summary message that replaces the older part.
pub(crate) fn summary_message(summary: &str) -> Message {
    Message::user(format!("{SUMMARY_HEADING}\n{}", summary.trim()))
}

/// Replaces the bodies of the oldest tool results before `keep_from` until `fits` says the
/// estimate fits. Returns the replaced results with their indices.
pub(crate) fn drop_tool_results(
    messages: &mut [Message],
    keep_from: usize,
    mut over_by: u64,
) -> Vec<(usize, Message)> {
    let mut dropped = Vec::new();
    let dropped_cost = estimate_text(DROPPED_RESULT);
    for (i, m) in messages.iter_mut().enumerate().take(keep_from) {
        if over_by == 0 {
            break;
        }
        let Message::Tool(r) = m else { continue };
        if matches!(&r.content, ToolContent::Text(t) if &**t == DROPPED_RESULT) {
            continue;
        }
        let before = estimate_text(&r.content.to_text());
        if before <= dropped_cost {
            continue;
        }
        let replacement = Message::Tool(ToolResult {
            call_id: r.call_id.clone(),
            tool: r.tool.clone(),
            content: ToolContent::Text(DROPPED_RESULT.into()),
            is_error: r.is_error,
        });
        dropped.push((i, std::mem::replace(m, replacement)));
        over_by = over_by.saturating_sub(before - dropped_cost);
    }
    dropped
}

/// One compaction of a run, as its outcome keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// The turn it happened before.
    pub turn: u32,
    /// How it was done (a failed summary falls back to dropping tool results).
    pub policy: CompactionPolicy,
    /// The estimated tokens of the request before and after.
    pub tokens_before: u64,
    /// The estimate after.
    pub tokens_after: u64,
    /// The messages replaced, each with its index in the transcript as it was before this
    /// compaction. A summary replaces a run of messages from index 0; dropped results are
    /// replaced one by one where they were.
    pub replaced: Vec<(usize, Message)>,
    /// The summary, for [`CompactionPolicy::Summarize`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// What the summary call spent (counted in the run's usage and cost).
    #[serde(default)]
    pub usage: Usage,
    /// Its cost, when priced.
    #[serde(default)]
    pub cost_usd: f64,
    /// Why a summary was not used, when it fell back to dropping tool results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// How long it took (the summary call's time).
    #[serde(default, with = "crate::serde_duration")]
    pub duration: std::time::Duration,
}

/// Undoes a run's compactions on its transcript, latest first: the conversation as it would be
/// had none happened.
pub fn expand(transcript: &[Message], compactions: &[CompactionRecord]) -> Vec<Message> {
    let mut out = transcript.to_vec();
    for c in compactions.iter().rev() {
        match (c.policy, c.summary.is_some()) {
            (CompactionPolicy::Summarize, true) => {
                let replaced: Vec<Message> = c.replaced.iter().map(|(_, m)| m.clone()).collect();
                if !out.is_empty() {
                    out.splice(0..1, replaced);
                }
            }
            _ => {
                for (i, m) in &c.replaced {
                    if let Some(slot) = out.get_mut(*i) {
                        *slot = m.clone();
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::call_of_tool_t as call;
    use crate::message::{AssistantMessage, ToolCall};

    fn result(id: &str, body: &str) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            tool: "t".into(),
            content: ToolContent::Text(body.into()),
            is_error: false,
        })
    }

    fn answer(text: &str) -> Message {
        Message::Assistant(AssistantMessage {
            text: text.into(),
            ..Default::default()
        })
    }

    #[test]
    fn the_split_keeps_the_latest_turns_and_never_parts_a_call_from_its_result() {
        let m = vec![
            Message::user("q1"),
            call("a"),
            result("a", "x"),
            answer("a1"),
            Message::user("q2"),
            call("b"),
            result("b", "y"),
            answer("a2"),
        ];
        // The last two turns: `answer("a2")` and the call `b` with the user message before it.
        assert_eq!(split_point(&m, 2), Some(4));
        assert_eq!(split_point(&m, 1), Some(7));
        assert_eq!(split_point(&m, 4), None);
        let parallel = vec![
            Message::user("q"),
            Message::Assistant(AssistantMessage {
                tool_calls: vec![
                    ToolCall {
                        call_id: "1".into(),
                        tool: "t".into(),
                        arguments: "{}".into(),
                    },
                    ToolCall {
                        call_id: "2".into(),
                        tool: "t".into(),
                        arguments: "{}".into(),
                    },
                ],
                ..Default::default()
            }),
            result("1", "x"),
            result("2", "y"),
            answer("done"),
        ];
        assert_eq!(split_point(&parallel, 1), Some(4));
        // Only an earlier summary before the cut: nothing to compact.
        let summarized = vec![summary_message("s"), answer("x"), answer("y")];
        assert_eq!(split_point(&summarized, 2), None);
        assert_eq!(split_point(&summarized, 1), Some(2));
    }

    #[test]
    fn expand_undoes_each_compaction() {
        let original = vec![
            Message::user("q1"),
            call("a"),
            result("a", &"long body ".repeat(40)),
            answer("a1"),
            Message::user("q2"),
        ];
        let mut t = original.clone();
        let dropped = drop_tool_results(&mut t, 3, 1000);
        assert_eq!(dropped.len(), 1);
        let first = CompactionRecord {
            turn: 2,
            policy: CompactionPolicy::DropToolResults,
            tokens_before: 0,
            tokens_after: 0,
            replaced: dropped,
            summary: None,
            usage: Usage::default(),
            cost_usd: 0.0,
            fallback: None,
            duration: std::time::Duration::ZERO,
        };
        let replaced: Vec<(usize, Message)> = t.drain(..4).enumerate().collect();
        t.insert(0, summary_message("s"));
        let second = CompactionRecord {
            policy: CompactionPolicy::Summarize,
            replaced,
            summary: Some("s".into()),
            ..first.clone()
        };
        assert_eq!(expand(&t, &[first, second]), original);
    }

    #[test]
    fn known_windows_allow_prefixes_and_dates() {
        assert_eq!(
            known_context_tokens("gpt-4o-mini-2024-07-18"),
            Some(128_000)
        );
        assert_eq!(known_context_tokens("openai/gpt-4.1"), Some(1_047_576));
        assert_eq!(known_context_tokens("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known_context_tokens("local"), None);
    }
}
