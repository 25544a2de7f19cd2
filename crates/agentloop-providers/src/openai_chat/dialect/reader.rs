//! Reads tool calls out of a model's streamed text. Text is released as soon as it cannot be the
//! start of a call; from a place where a call may begin (a `<tool_call>` tag, `[TOOL_CALLS]`,
//! `<|python_tag|>`, a fence, a `{` or `[` that starts a line) it is held until the block is
//! whole, then read as calls or released as the text it was. However the text is split into
//! pieces, the same text and calls come out, and nothing is lost or repeated.
//!
//! A block is calls only when every call in it names a tool the agent has, except in the shapes
//! that a named dialect owns (its own marker), which are read whatever they name as before: the
//! machine answers a call of an unknown tool with the names of the real ones.
//!
//! A block still open when the text ends is closed for the model (the stop token may have eaten
//! its closers), unless the output limit ended the text: then a call whose brackets had to be
//! closed is a cut call, as a native call with incomplete arguments is, and it never runs.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use agentloop::message::ToolCall;
use agentloop::model::ModelEvent;

use super::ToolDialect;
use super::shapes::{
    FENCE, MISTRAL_ARGS, PYTHON_TAG, Quotes, Scan, TOOL_CALL_CLOSE, TOOL_CALL_OPEN,
    TOOL_CALLS_MARKER, TextCall, calls_in, scan,
};

/// The markers a call may start with, anywhere in the text.
const MARKERS: [&str; 4] = [TOOL_CALL_OPEN, TOOL_CALLS_MARKER, PYTHON_TAG, FENCE];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain text, watching for the start of a call.
    Text,
    /// Inside a fence whose body is not a call (code): passed through until it closes, so that
    /// nothing in it starts a call.
    CodeFence,
}

/// What a held block turned out to be.
enum Block {
    /// Not whole yet: wait for more text.
    Open,
    /// Calls, taking this many bytes.
    Calls(Vec<TextCall>, usize),
    /// Text, this many bytes (maybe only the first character, after which reading goes on).
    Text(usize),
    /// A fence of code: its opening line (this many bytes) is text, and its body is passed
    /// through.
    CodeFence(usize),
}

/// Reads the calls out of a model's streamed text, for one response.
#[derive(Debug)]
pub(crate) struct DialectReader {
    dialect: ToolDialect,
    tools: HashSet<String>,
    mode: Mode,
    /// Text not released yet: it starts where a call may begin.
    buf: String,
    /// The next character starts a line (or the answer, or follows a call).
    line_start: bool,
    /// The answer so far is blanks and calls: a bare call here is the whole answer's start.
    only_calls_so_far: bool,
    calls: usize,
    /// The output limit ended the text: a call it cut is not repaired into one that runs.
    cut_by_the_limit: bool,
}

impl DialectReader {
    /// A reader for `dialect` in a request that offered these tools.
    pub(crate) fn new(dialect: ToolDialect, tools: impl IntoIterator<Item = String>) -> Self {
        DialectReader {
            dialect,
            tools: tools.into_iter().collect(),
            mode: Mode::Text,
            buf: String::new(),
            line_start: true,
            only_calls_so_far: true,
            calls: 0,
            cut_by_the_limit: false,
        }
    }

    /// How many calls were read.
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    /// Reads one piece of text.
    pub(crate) fn push(&mut self, text: &str, out: &mut VecDeque<ModelEvent>) {
        self.buf.push_str(text);
        self.advance(out, false);
    }

    /// The text ended (`cut_by_the_limit`: because the output limit was reached): what is still
    /// held is calls (repaired if it must be, or, cut by the limit, sent as cut calls) or text.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<ModelEvent>, cut_by_the_limit: bool) {
        self.cut_by_the_limit = cut_by_the_limit;
        self.advance(out, true);
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.release(&rest, out);
        }
        self.mode = Mode::Text;
    }

    fn advance(&mut self, out: &mut VecDeque<ModelEvent>, end: bool) {
        loop {
            if self.mode == Mode::CodeFence {
                match closing_fence(&self.buf, self.line_start) {
                    Some(at) => {
                        self.release_front(at + FENCE.len(), out);
                        self.mode = Mode::Text;
                        continue;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else if self.line_start && FENCE.starts_with(self.buf.as_str()) {
                            self.buf.len()
                        } else {
                            partial_suffix(&self.buf, CLOSING_FENCE)
                        };
                        self.release_front(self.buf.len() - keep, out);
                        return;
                    }
                }
            }
            let Some(start) = self.next_start(end) else {
                // Everything up to the held end is text.
                let keep = if end { 0 } else { self.held_suffix() };
                self.release_front(self.buf.len() - keep, out);
                return;
            };
            self.release_front(start, out);
            match self.block(end) {
                Block::Open => return,
                Block::Calls(calls, used) => {
                    self.buf.drain(..used);
                    for call in calls {
                        self.emit_call(call, out);
                    }
                    self.line_start = true;
                }
                Block::Text(used) => {
                    if self.owns(&self.buf)
                        && [TOOL_CALL_OPEN, TOOL_CALLS_MARKER, PYTHON_TAG]
                            .iter()
                            .any(|m| self.buf.starts_with(m))
                    {
                        out.push_back(ModelEvent::Warning(format!(
                            "a {} tool call that is not a JSON call was kept as text",
                            self.dialect.as_str()
                        )));
                    }
                    self.release_front(used, out);
                }
                Block::CodeFence(used) => {
                    self.release_front(used, out);
                    self.mode = Mode::CodeFence;
                }
            }
        }
    }

    /// Where in the held text the first block may start (a marker, a bracket that starts a
    /// line), or `None` when there is none yet.
    fn next_start(&self, end: bool) -> Option<usize> {
        let mut line_start = self.line_start;
        for (i, c) in self.buf.char_indices() {
            let rest = self.buf.get(i..).unwrap_or_default();
            if MARKERS.iter().any(|m| rest.starts_with(m)) || (line_start && matches!(c, '{' | '['))
            {
                return Some(i);
            }
            if !end
                && MARKERS
                    .iter()
                    .any(|m| m.len() > rest.len() && m.starts_with(rest))
            {
                return None;
            }
            if c == '\n' {
                line_start = true;
            } else if !c.is_whitespace() {
                line_start = false;
            }
        }
        None
    }

    /// How much of the end of the held text (with no block in it) may still become a marker.
    fn held_suffix(&self) -> usize {
        MARKERS
            .iter()
            .map(|m| partial_suffix(&self.buf, m))
            .max()
            .unwrap_or(0)
    }

    /// What the block at the start of the held text is.
    fn block(&self, end: bool) -> Block {
        let text = self.buf.as_str();
        if let Some(after) = text.strip_prefix(TOOL_CALL_OPEN) {
            let used = match after.find(TOOL_CALL_CLOSE) {
                Some(at) => TOOL_CALL_OPEN.len() + at + TOOL_CALL_CLOSE.len(),
                None if end => text.len(),
                None => return Block::Open,
            };
            return self.calls_or_text(used);
        }
        for marker in [TOOL_CALLS_MARKER, PYTHON_TAG] {
            if let Some(after) = text.strip_prefix(marker) {
                return self.after_marker(marker.len(), after, end);
            }
        }
        if let Some(after) = text.strip_prefix(FENCE) {
            return self.fence(after, end);
        }
        self.bracketed(0, end)
    }

    /// `[TOOL_CALLS]` or `<|python_tag|>` (`skip` bytes), then calls.
    fn after_marker(&self, skip: usize, after: &str, end: bool) -> Block {
        let body = after.trim_start();
        let at = skip + after.len() - body.len();
        match body.chars().next() {
            None if end => Block::Text(self.buf.len()),
            None => Block::Open,
            Some('{' | '[') => match self.bracketed(at, end) {
                Block::Text(_) => Block::Text(skip),
                other => other,
            },
            // Mistral's newer `[TOOL_CALLS]name[ARGS]{...}`: its end is the JSON's.
            Some(_) if skip == TOOL_CALLS_MARKER.len() => match body.find(MISTRAL_ARGS) {
                Some(args) => match self
                    .bracketed(after_blanks(&self.buf, at + args + MISTRAL_ARGS.len()), end)
                {
                    Block::Text(_) => Block::Text(skip),
                    other => other,
                },
                None if end => self.calls_or_text(self.buf.len()),
                None if body.contains(char::is_whitespace) => Block::Text(skip),
                None => Block::Open,
            },
            Some(_) => Block::Text(skip),
        }
    }

    /// A fence: its body is calls, or code passed through.
    fn fence(&self, after: &str, end: bool) -> Block {
        let Some(newline) = after.find('\n') else {
            // ```json {"name": ...}``` on one line.
            return match after.find(FENCE) {
                Some(close) => self.calls_or_text(FENCE.len() + close + FENCE.len()),
                None if end => self.calls_or_text(self.buf.len()),
                None => Block::Open,
            };
        };
        let info = after.get(..newline).unwrap_or_default();
        let body = after.get(newline + 1..).unwrap_or_default();
        let first = body.trim_start().chars().next();
        match first {
            None if !end => Block::Open,
            Some('{' | '[' | '<') | None => match closing_fence(body, true) {
                Some(close) => self.calls_or_text(FENCE.len() + newline + 1 + close + FENCE.len()),
                None if end => self.calls_or_text(self.buf.len()),
                None => Block::Open,
            },
            // Code, or a one-line fence that opened and closed around something else.
            Some(_) if info.contains(FENCE) => Block::Text(FENCE.len() + newline),
            Some(_) => Block::CodeFence(FENCE.len() + newline + 1),
        }
    }

    /// A `{...}` or `[...]` (JSON, or pythonic calls) at `at`; what is before it is a marker.
    fn bracketed(&self, at: usize, end: bool) -> Block {
        let text = self.buf.get(at..).unwrap_or_default();
        let quotes = match self.looks_like_calls(text) {
            Some(Some(quotes)) => quotes,
            Some(None) if end => Quotes::Json,
            Some(None) => return Block::Open,
            // Not a call: only its first character is text, and reading goes on after it.
            None => return Block::Text(first_char_len(&self.buf)),
        };
        match scan(text, quotes) {
            Scan::Complete(len) => self.calls_or_text(at + len),
            Scan::Open { .. } if end => self.calls_or_text(self.buf.len()),
            Scan::Open { .. } => Block::Open,
            Scan::Invalid => Block::Text(first_char_len(&self.buf)),
        }
    }

    /// Whether `text` (starting with a bracket) can be calls: `Some(Some(quotes))` when it may be,
    /// `Some(None)` when its start does not tell yet, `None` when it cannot.
    fn looks_like_calls(&self, text: &str) -> Option<Option<Quotes>> {
        let mut chars = text.chars();
        let Some(open) = chars.next() else {
            return Some(None);
        };
        let rest = chars.as_str().trim_start();
        let Some(next) = rest.chars().next() else {
            return Some(None);
        };
        match (open, next) {
            ('{', '"' | '}') | ('[', '{') => Some(Some(Quotes::Json)),
            // A Python dict (small models write their calls so).
            ('{', '\'') => Some(Some(Quotes::Python)),
            ('[', c) if c.is_alphabetic() || c == '_' => {
                let name_len = rest
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
                    .unwrap_or(rest.len());
                let after = rest.get(name_len..).unwrap_or_default().trim_start();
                match after.chars().next() {
                    Some('(') => Some(Some(Quotes::Python)),
                    None => Some(None),
                    Some(_) => None,
                }
            }
            _ => None,
        }
    }

    /// The first `used` bytes are calls (all of tools the agent has, or in the dialect's own
    /// shape), or text.
    fn calls_or_text(&self, used: usize) -> Block {
        let text = self.buf.get(..used).unwrap_or_default();
        let own = self.owns(text);
        let accept = |name: &str| own || self.tools.contains(name);
        match calls_in(text, &accept) {
            Some(calls) => Block::Calls(calls, used),
            None => Block::Text(used),
        }
    }

    /// Whether a block in this shape belongs to the dialect, which reads it whatever it names.
    fn owns(&self, block: &str) -> bool {
        match self.dialect {
            ToolDialect::Hermes => {
                block.starts_with(TOOL_CALL_OPEN)
                    || (self.only_calls_so_far && block.starts_with('{'))
            }
            ToolDialect::Mistral => block.starts_with(TOOL_CALLS_MARKER),
            ToolDialect::Llama3Json => {
                block.starts_with(PYTHON_TAG) || (self.only_calls_so_far && block.starts_with('{'))
            }
            ToolDialect::Auto => false,
        }
    }

    fn release_front(&mut self, upto: usize, out: &mut VecDeque<ModelEvent>) {
        let upto = floor_char_boundary(&self.buf, upto);
        if upto == 0 {
            return;
        }
        let text: String = self.buf.drain(..upto).collect();
        self.release(&text, out);
    }

    fn release(&mut self, text: &str, out: &mut VecDeque<ModelEvent>) {
        for c in text.chars() {
            if c == '\n' {
                self.line_start = true;
            } else if !c.is_whitespace() {
                self.line_start = false;
                self.only_calls_so_far = false;
            }
        }
        out.push_back(ModelEvent::TextDelta(text.to_owned()));
    }

    fn emit_call(&mut self, call: TextCall, out: &mut VecDeque<ModelEvent>) {
        // A call the limit cut goes out with the text it was cut from, which is not complete
        // JSON: the accumulator drops it as it drops a native call cut the same way.
        let arguments = match call.cut {
            Some(written) if self.cut_by_the_limit => written,
            _ => {
                self.calls += 1;
                call.arguments
            }
        };
        out.push_back(ModelEvent::ToolCall(ToolCall {
            // The machine gives calls without an id one of their own.
            call_id: call.id.map(Arc::from).unwrap_or_default(),
            tool: call.tool.into(),
            arguments,
        }));
    }
}

/// A fence closes at the start of a line (JSON strings hold no raw line break, so a call's fence
/// cannot close inside its JSON).
const CLOSING_FENCE: &str = "\n```";

/// Where the fence that closes a block begins in `body`, which starts a line when `line_start`.
fn closing_fence(body: &str, line_start: bool) -> Option<usize> {
    if line_start && body.starts_with(FENCE) {
        return Some(0);
    }
    body.find(CLOSING_FENCE).map(|at| at + 1)
}

/// Where the first character that is not blank is in `text` from `at` on.
fn after_blanks(text: &str, at: usize) -> usize {
    let rest = text.get(at..).unwrap_or_default();
    at + rest.len() - rest.trim_start().len()
}

fn first_char_len(text: &str) -> usize {
    text.chars().next().map_or(0, char::len_utf8)
}

/// The length of the longest end of `text` that is a beginning of `marker`: text that may yet
/// become the marker when the next piece comes.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && marker.starts_with(text.get(text.len() - n..).unwrap_or_default())
        })
        .unwrap_or(0)
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}
