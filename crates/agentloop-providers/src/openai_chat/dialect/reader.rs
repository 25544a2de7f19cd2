//! Reads tool calls out of a model's streamed text. Text is released as soon as it cannot be the
//! start of a call; from a place where a call may begin (a `<tool_call>` tag, `[TOOL_CALLS]`,
//! `<|python_tag|>`, a fence, a `{` or `[` that starts a line, a `{"name"` anywhere) it is held
//! until the block is whole, then read as calls or released as the text it was. However the text
//! is split into pieces, the same text and calls come out, and nothing is lost or repeated.
//!
//! A block is calls only when every call in it names a tool the agent has, except in the shapes
//! that a named dialect owns (its own marker), which are read whatever they name as before: the
//! machine answers a call of an unknown tool with the names of the real ones.
//!
//! A block still open when the text ends is closed for the model (the stop token may have eaten
//! its closers), unless the output limit ended the text: then a call whose brackets had to be
//! closed is a cut call, as a native call with incomplete arguments is, and it never runs.
//!
//! Reading keeps its place in a held block between pieces ([`Progress`]), so each byte is read a
//! bounded number of times however finely the text is split; and a block is held for at most
//! `max_block` bytes: one that does not end within them is no call, and it and the rest of the
//! answer are released as text, with a warning.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use agentloop::message::ToolCall;
use agentloop::model::ModelEvent;

use super::ToolDialect;
use super::shapes::{
    FENCE, InString, MISTRAL_ARGS, PYTHON_TAG, Quotes, Scan, Scanner, TAG_ATTRIBUTES,
    TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_TAG, TOOL_CALLS_MARKER, TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN, TextCall, calls_in,
};

/// The markers a call (or a made-up result, whose text is passed through) may start with,
/// anywhere in the text.
const MARKERS: [&str; 6] = [
    TOOL_CALL_OPEN,
    TOOL_CALL_TAG,
    TOOL_CALLS_MARKER,
    PYTHON_TAG,
    FENCE,
    TOOL_RESPONSE_OPEN,
];

/// How a bare call may start after other text on its line (`I'll check: {"name": ...}`).
const CALL_STARTS: [&str; 4] = ["{\"name\"", "{ \"name\"", "{'name'", "{ 'name'"];

/// The longest tool name (the bound `agentloop` puts on a tool's name): a longer word before a
/// `(` is no call, and reading a pythonic call's name stops there.
const MAX_NAME: usize = 128;

/// How long a block is held by default before it is released as text: the largest event the
/// providers read by default ([`crate::http::HttpConfig::max_event_bytes`]).
const DEFAULT_MAX_BLOCK: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain text, watching for the start of a call.
    Text,
    /// Inside a fence whose body is not a call (code): passed through until it closes, so that
    /// nothing in it starts a call.
    CodeFence,
    /// Inside a `<tool_response>` the model wrote itself: a result it made up, not a call, so
    /// passed through until it closes (a call-shaped object in it is what the model imagines it
    /// called, and running it would run what nobody asked for).
    MadeUpResult,
    /// A block ran past `max_block`: the rest of the answer is text.
    PassThrough,
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
    /// A `<tool_response>` tag (this many bytes) the model wrote: it and what follows up to its
    /// closing tag are text.
    MadeUpResult(usize),
    /// Not whole within `max_block` bytes.
    Overlong,
}

/// Reads the calls out of a model's streamed text, for one response.
#[derive(Debug)]
pub(crate) struct DialectReader {
    dialect: ToolDialect,
    tools: HashSet<String>,
    mode: Mode,
    /// Text read; what is before `held` in it is released (and dropped at the next piece), what
    /// is from `held` on is not released yet: it starts where a call may begin.
    buf: String,
    held: usize,
    /// What reading the block at `held` has found so far.
    progress: Progress,
    /// The most bytes a block is held.
    max_block: usize,
    /// The next character starts a line (or the answer, or follows a call).
    line_start: bool,
    /// The answer so far is blanks and calls: a bare call here is the whole answer's start.
    only_calls_so_far: bool,
    calls: usize,
    /// The output limit ended the text: a call it cut is not repaired into one that runs.
    cut_by_the_limit: bool,
    /// A made-up `<tool_response>` was met (and warned of).
    made_up_result: bool,
}

impl DialectReader {
    /// A reader for `dialect` in a request that offered these tools.
    pub(crate) fn new(dialect: ToolDialect, tools: impl IntoIterator<Item = String>) -> Self {
        DialectReader {
            dialect,
            tools: tools.into_iter().collect(),
            mode: Mode::Text,
            buf: String::new(),
            held: 0,
            progress: Progress::default(),
            max_block: DEFAULT_MAX_BLOCK,
            line_start: true,
            only_calls_so_far: true,
            calls: 0,
            cut_by_the_limit: false,
            made_up_result: false,
        }
    }

    /// Holds a block for at most `bytes` (at least one byte).
    pub(crate) fn with_max_block(mut self, bytes: usize) -> Self {
        self.max_block = bytes.max(1);
        self
    }

    /// How many calls were read.
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    /// Reads one piece of text.
    pub(crate) fn push(&mut self, text: &str, out: &mut VecDeque<ModelEvent>) {
        if self.held > 0 {
            // What is held moves to the front once, not at every release.
            self.buf.drain(..self.held);
            self.held = 0;
        }
        self.buf.push_str(text);
        self.advance(out, false);
    }

    /// The text ended (`cut_by_the_limit`: because the output limit was reached): what is still
    /// held is calls (repaired if it must be, or, cut by the limit, sent as cut calls) or text.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<ModelEvent>, cut_by_the_limit: bool) {
        self.cut_by_the_limit = cut_by_the_limit;
        self.advance(out, true);
        let rest = self.held().len();
        self.release_front(rest, out);
        self.mode = Mode::Text;
    }

    /// The text not released yet.
    fn held(&self) -> &str {
        self.buf.get(self.held..).unwrap_or_default()
    }

    fn advance(&mut self, out: &mut VecDeque<ModelEvent>, end: bool) {
        loop {
            match self.mode {
                Mode::PassThrough => {
                    let all = self.held().len();
                    self.release_front(all, out);
                    return;
                }
                Mode::CodeFence | Mode::MadeUpResult => {
                    if !self.pass_through_to_close(out, end) {
                        return;
                    }
                    self.mode = Mode::Text;
                    continue;
                }
                Mode::Text => {}
            }
            let Some(start) = self.next_start(end) else {
                // Everything up to the held end is text.
                let keep = if end { 0 } else { self.held_suffix() };
                self.release_front(self.held().len() - keep, out);
                return;
            };
            self.release_front(start, out);
            match self.block(end) {
                Block::Open => return,
                Block::Calls(calls, used) => {
                    self.take_front(used);
                    for call in calls {
                        self.emit_call(call, out);
                    }
                    self.line_start = true;
                }
                Block::Text(used) => {
                    let held = self.held();
                    if self.owns(held)
                        && [TOOL_CALL_OPEN, TOOL_CALLS_MARKER, PYTHON_TAG]
                            .iter()
                            .any(|m| held.starts_with(m))
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
                Block::MadeUpResult(used) => {
                    if !self.made_up_result {
                        // The answer around it may report what never ran: say so once.
                        self.made_up_result = true;
                        out.push_back(ModelEvent::Warning(
                            "the model wrote a <tool_response> of its own (a made-up result); \
                             no call in it was run, and the answer may report what never ran"
                                .to_owned(),
                        ));
                    }
                    self.release_front(used, out);
                    self.mode = Mode::MadeUpResult;
                }
                Block::Overlong => {
                    out.push_back(ModelEvent::Warning(format!(
                        "a {} tool call block that did not end within {} bytes was kept as \
                         text, with the rest of the answer",
                        self.dialect.as_str(),
                        self.max_block
                    )));
                    self.mode = Mode::PassThrough;
                }
            }
        }
    }

    /// Passes the held text of a code fence or a made-up result through, up to and with its
    /// closer: whether the closer came (otherwise all that cannot be the closer's start is
    /// released, and the rest waits for the next piece).
    fn pass_through_to_close(&mut self, out: &mut VecDeque<ModelEvent>, end: bool) -> bool {
        let held = self.held();
        let len = held.len();
        let keep = if self.mode == Mode::CodeFence {
            match closing_fence(held, self.line_start) {
                FenceEnd::At(at) => {
                    self.release_front(at + FENCE.len(), out);
                    return true;
                }
                // A fence's start (after blanks, at a line's start) waits for the next piece.
                FenceEnd::MaybeFrom(from) => len - from,
            }
        } else {
            if let Some(at) = held.find(TOOL_RESPONSE_CLOSE) {
                self.release_front(at + TOOL_RESPONSE_CLOSE.len(), out);
                return true;
            }
            partial_suffix(held, TOOL_RESPONSE_CLOSE)
        };
        self.release_front(if end { len } else { len - keep }, out);
        false
    }

    /// Where in the held text the first block may start (a marker, a bracket that starts a
    /// line, a bare call after text), or `None` when there is none yet.
    fn next_start(&self, end: bool) -> Option<usize> {
        let text = self.held();
        let mut line_start = self.line_start;
        for (i, c) in text.char_indices() {
            let rest = text.get(i..).unwrap_or_default();
            if MARKERS.iter().any(|m| rest.starts_with(m))
                || (line_start && matches!(c, '{' | '['))
                || (c == '{' && CALL_STARTS.iter().any(|s| rest.starts_with(s)))
            {
                return Some(i);
            }
            if !end
                && MARKERS
                    .iter()
                    .chain(&CALL_STARTS)
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
        let text = self.held();
        MARKERS
            .iter()
            .chain(&CALL_STARTS)
            .map(|m| partial_suffix(text, m))
            .max()
            .unwrap_or(0)
    }

    /// What the block at the start of the held text is, going on from what the last look at it
    /// found; one that does not end within `max_block` bytes is overlong.
    fn block(&mut self, end: bool) -> Block {
        let mut progress = std::mem::take(&mut self.progress);
        let held = self.held();
        // Judged on its first `max_block` bytes alone, so that the answer does not hang on how
        // the text was split.
        let overlong = held.len() > self.max_block
            && matches!(
                self.block_in(
                    &mut progress,
                    held.get(..floor_char_boundary(held, self.max_block))
                        .unwrap_or_default(),
                    false
                ),
                Block::Open
            );
        let block = if overlong {
            Block::Overlong
        } else {
            self.block_in(&mut progress, held, end)
        };
        self.progress = progress;
        block
    }

    /// What the block that `text` starts with is.
    fn block_in(&self, p: &mut Progress, text: &str, end: bool) -> Block {
        if text.starts_with(TOOL_RESPONSE_OPEN) {
            return Block::MadeUpResult(TOOL_RESPONSE_OPEN.len());
        }
        if text.starts_with(TOOL_CALL_OPEN) {
            let used = match p.find(text, TOOL_CALL_OPEN.len(), Target::Text(TOOL_CALL_CLOSE)) {
                Some(at) => at + TOOL_CALL_CLOSE.len(),
                None if end => text.len(),
                None => return Block::Open,
            };
            return self.calls_or_text(text, used);
        }
        if text.starts_with(TOOL_CALL_TAG) {
            return self.attribute_tag(p, text, end);
        }
        for marker in [TOOL_CALLS_MARKER, PYTHON_TAG] {
            if text.starts_with(marker) {
                return self.after_marker(p, text, marker.len(), end);
            }
        }
        if text.starts_with(FENCE) {
            return self.fence(p, text, end);
        }
        self.bracketed(p, text, 0, end)
    }

    /// `[TOOL_CALLS]` or `<|python_tag|>` (`skip` bytes), then calls.
    fn after_marker(&self, p: &mut Progress, text: &str, skip: usize, end: bool) -> Block {
        let Some(at) = p.find(text, skip, Target::NonBlank) else {
            return if end {
                Block::Text(text.len())
            } else {
                Block::Open
            };
        };
        match text.get(at..).and_then(|body| body.chars().next()) {
            Some('{' | '[') => match self.bracketed(p, text, at, end) {
                Block::Text(_) => Block::Text(skip),
                other => other,
            },
            // Mistral's newer `[TOOL_CALLS]name[ARGS]{...}`: its end is the JSON's.
            Some(_) if skip == TOOL_CALLS_MARKER.len() => {
                // `[ARGS]` ends the name, which holds no blank: looked for only before the
                // first blank, so that the block is the same however the text is split.
                let blank = p.find(text, at, Target::Blank);
                let args = match blank {
                    Some(blank) => text
                        .get(at..blank)
                        .and_then(|name| name.find(MISTRAL_ARGS))
                        .map(|args| at + args),
                    None => p.find(text, at, Target::Text(MISTRAL_ARGS)),
                };
                match args {
                    Some(args) => {
                        let value = args + MISTRAL_ARGS.len();
                        let block = match p.find(text, value, Target::NonBlank) {
                            Some(value) => self.bracketed(p, text, value, end),
                            None if end => Block::Text(skip),
                            None => Block::Open,
                        };
                        match block {
                            Block::Text(_) => Block::Text(skip),
                            other => other,
                        }
                    }
                    None if blank.is_some() => Block::Text(skip),
                    None if end => self.calls_or_text(text, text.len()),
                    None => Block::Open,
                }
            }
            _ => Block::Text(skip),
        }
    }

    /// `<tool_call name=... arguments=... />`: held until the tag ends (a `>` or a stray `}`
    /// outside its values' strings and brackets, and the `</tool_call>` after a `>` if one
    /// follows), then read.
    fn attribute_tag(&self, p: &mut Progress, text: &str, end: bool) -> Block {
        // Only a tag whose first attribute is a call's is held: `<tool_call ` in prose is text.
        let Some(at) = p.find(text, TOOL_CALL_TAG.len(), Target::NonBlank) else {
            return if end {
                Block::Text(TOOL_CALL_TAG.len())
            } else {
                Block::Open
            };
        };
        let first = text.get(at..).unwrap_or_default();
        if !TAG_ATTRIBUTES.iter().any(|a| first.starts_with(a)) {
            let may_be = !end && TAG_ATTRIBUTES.iter().any(|a| a.starts_with(first));
            return if may_be {
                Block::Open
            } else {
                Block::Text(TOOL_CALL_TAG.len())
            };
        }
        let tag = p.tag.get_or_insert_with(|| TagScan::new(at));
        let Some(close) = tag.find_end(text) else {
            return if end {
                self.calls_or_text(text, text.len())
            } else {
                Block::Open
            };
        };
        let after = close + 1;
        if text.get(close..).is_some_and(|t| t.starts_with('}'))
            || text.get(..close).is_some_and(|t| t.ends_with('/'))
        {
            return self.calls_or_text(text, after);
        }
        // `>`: a `</tool_call>` may follow, after blanks.
        let used = match p.find(text, after, Target::NonBlank) {
            Some(next) => {
                let rest = text.get(next..).unwrap_or_default();
                if rest.starts_with(TOOL_CALL_CLOSE) {
                    next + TOOL_CALL_CLOSE.len()
                } else if !end && TOOL_CALL_CLOSE.starts_with(rest) {
                    return Block::Open;
                } else {
                    after
                }
            }
            None if end => after,
            None => return Block::Open,
        };
        self.calls_or_text(text, used)
    }

    /// A fence: its body is calls, or code passed through.
    fn fence(&self, p: &mut Progress, text: &str, end: bool) -> Block {
        let newline = p.find(text, FENCE.len(), Target::Text("\n"));
        // ```json {"name": ...}``` on one line: closed before any line break (whether the line
        // break has come yet or not, so that the block is the same however the text is split).
        let one_line = p
            .find(text, FENCE.len(), Target::Text(FENCE))
            .filter(|close| newline.is_none_or(|newline| close < &newline));
        if let Some(close) = one_line {
            return self.calls_or_text(text, close + FENCE.len());
        }
        let Some(newline) = newline else {
            return if end {
                self.calls_or_text(text, text.len())
            } else {
                Block::Open
            };
        };
        let info = text.get(FENCE.len()..newline).unwrap_or_default();
        let body = newline + 1;
        let first_at = p.find(text, body, Target::NonBlank);
        let first = first_at.and_then(|at| text.get(at..)?.chars().next());
        match first {
            None if !end => Block::Open,
            Some('{' | '[' | '<') | None => match self.fence_close(p, text, body, first_at, end) {
                Some(close) => self.calls_or_text(text, close + FENCE.len()),
                None if end => self.calls_or_text(text, text.len()),
                None => Block::Open,
            },
            // Code, or a one-line fence that opened and closed around something else.
            Some(_) if info.contains(FENCE) => Block::Text(newline),
            Some(_) => Block::CodeFence(body),
        }
    }

    /// Where the fence that closes a fenced block of calls begins: at the start of a line that
    /// is not inside one of its value's strings (a `content` written with raw line breaks may
    /// hold a fence of its own), or right after its value on the value's last line
    /// (`{...}``` `). `None` when it has not come yet.
    fn fence_close(
        &self,
        p: &mut Progress,
        text: &str,
        body: usize,
        value: Option<usize>,
        end: bool,
    ) -> Option<usize> {
        if p.fence.is_none() {
            let scanner = match value {
                Some(at) if text.get(at..).is_some_and(|v| v.starts_with(['{', '['])) => {
                    match self.looks_like_calls(p, text, at) {
                        Some(Some(quotes)) => Some(Scanner::new(quotes)),
                        Some(None) if end => Some(Scanner::new(Quotes::Json)),
                        Some(None) => return None,
                        None => None,
                    }
                }
                _ => None,
            };
            p.fence = Some(FenceSearch {
                scanner,
                value: value.unwrap_or(body),
                at: body,
                line_start: true,
                after_value: false,
            });
        }
        let s = p.fence.as_mut()?;
        let from = s.at;
        for (i, c) in text.get(from..).unwrap_or_default().char_indices() {
            let i = from + i;
            let in_string = s.scanner.as_ref().is_some_and(Scanner::in_string);
            if (s.line_start && !in_string) || s.after_value {
                let here = text.get(i..).unwrap_or_default();
                if here.starts_with(FENCE) {
                    // Found again from here if the block is looked at again.
                    s.at = i;
                    return Some(i);
                }
                if !end && FENCE.starts_with(here) {
                    // Maybe a fence, when the next piece comes.
                    s.at = i;
                    return None;
                }
            }
            s.line_start = c == '\n';
            if s.after_value && !matches!(c, ' ' | '\t') {
                s.after_value = false;
            }
            if i >= s.value
                && let Some(scanner) = &mut s.scanner
                && let Some(ended) = scanner.step(i - s.value, c)
            {
                s.after_value = matches!(ended, Scan::Complete(_));
                s.scanner = None;
            }
        }
        s.at = text.len();
        None
    }

    /// A `{...}` or `[...]` (JSON, or pythonic calls) at `at`; what is before it is a marker.
    fn bracketed(&self, p: &mut Progress, text: &str, at: usize, end: bool) -> Block {
        let quotes = match self.looks_like_calls(p, text, at) {
            Some(Some(quotes)) => quotes,
            Some(None) if end => Quotes::Json,
            Some(None) => return Block::Open,
            // Not a call: only its first character is text, and reading goes on after it.
            None => return Block::Text(first_char_len(text)),
        };
        match p.scan(text, at, quotes) {
            Scan::Complete(len) => self.calls_or_text(text, at + len),
            Scan::Open if end => self.calls_or_text(text, text.len()),
            Scan::Open => Block::Open,
            // Text up to where it broke: a call inside broken JSON is no call, and reading each
            // bracket in it again would read the text once a bracket.
            Scan::Invalid(broke) => Block::Text((at + broke).max(first_char_len(text))),
        }
    }

    /// Whether the text at `at` (a bracket) can be calls: `Some(Some(quotes))` when it may be,
    /// `Some(None)` when its start does not tell yet, `None` when it cannot.
    fn looks_like_calls(&self, p: &mut Progress, text: &str, at: usize) -> Option<Option<Quotes>> {
        let Some(open) = text.get(at..).and_then(|t| t.chars().next()) else {
            return Some(None);
        };
        let Some(next_at) = p.find(text, at + open.len_utf8(), Target::NonBlank) else {
            return Some(None);
        };
        let rest = text.get(next_at..).unwrap_or_default();
        let next = rest.chars().next()?;
        match (open, next) {
            ('{', '"' | '}') | ('[', '{') => Some(Some(Quotes::Json)),
            // A Python dict (small models write their calls so).
            ('{', '\'') => Some(Some(Quotes::Python)),
            ('[', c) if c.is_alphabetic() || c == '_' => {
                let word = rest
                    .get(..floor_char_boundary(rest, MAX_NAME + 1))
                    .unwrap_or_default();
                let name_len = match word
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
                {
                    Some(len) => len,
                    None if word.len() > MAX_NAME => return None,
                    None => return Some(None),
                };
                let Some(after) = p.find(text, next_at + name_len, Target::NonBlank) else {
                    return Some(None);
                };
                match text.get(after..).and_then(|t| t.chars().next()) {
                    Some('(') => Some(Some(Quotes::Python)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The first `used` bytes of `text` are calls (all of tools the agent has, or in the
    /// dialect's own shape), or text.
    fn calls_or_text(&self, text: &str, used: usize) -> Block {
        let text = text.get(..used).unwrap_or_default();
        let own = self.owns(text);
        let accept = |name: &str| own || self.tools.contains(name);
        match calls_in(text, &accept) {
            Some(calls)
                if calls
                    .iter()
                    .all(|c| !c.name_only || self.tools.contains(&c.tool)) =>
            {
                Block::Calls(calls, used)
            }
            _ => Block::Text(used),
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

    /// Drops the first `upto` bytes of the held text (a block read, or text released), and
    /// gives them back.
    fn take_front(&mut self, upto: usize) -> String {
        let held = self.held();
        let upto = floor_char_boundary(held, upto);
        let taken = held.get(..upto).unwrap_or_default().to_owned();
        if upto > 0 {
            self.held += upto;
            // A new block starts here: nothing is known of it yet.
            self.progress = Progress::default();
        }
        taken
    }

    fn release_front(&mut self, upto: usize, out: &mut VecDeque<ModelEvent>) {
        let text = self.take_front(upto);
        if !text.is_empty() {
            self.release(&text, out);
        }
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

/// What reading the block at the start of the held text has found so far, so that the next
/// piece goes on from there rather than reading the block again from its start. Offsets are
/// from the block's start; all of it is dropped when the block is.
#[derive(Debug, Default)]
struct Progress {
    /// The searches made in the block, each with how far it got.
    searches: Vec<Search>,
    /// The scan of the block's bracketed value: where the value starts, and the scanner.
    scan: Option<(usize, Quotes, Scanner)>,
    /// The search for the fence that closes the block.
    fence: Option<FenceSearch>,
    /// The search for the end of a call written as a tag.
    tag: Option<TagScan>,
}

/// What a search in a block looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Text(&'static str),
    /// A character that is not blank.
    NonBlank,
    /// A blank.
    Blank,
}

#[derive(Debug)]
struct Search {
    target: Target,
    from: usize,
    /// Nothing is before this byte (from `from` on), except maybe the start of the target.
    searched: usize,
    found: Option<usize>,
}

/// How far the search for a fenced block's closing fence got.
#[derive(Debug)]
struct FenceSearch {
    /// Reads the body's value while it is open, to tell its strings (none: not a value, or
    /// past its end).
    scanner: Option<Scanner>,
    /// Where the value starts.
    value: usize,
    /// Searched up to here.
    at: usize,
    /// `at` starts a line.
    line_start: bool,
    /// Only spaces or tabs are between the value's end and `at`.
    after_value: bool,
}

/// How far the search for the `>` (or stray `}`) that ends a call written as a tag got: one
/// inside a value's string or brackets does not end it.
#[derive(Debug)]
struct TagScan {
    /// Searched up to here.
    at: usize,
    string: InString,
    /// How many brackets are open.
    depth: usize,
}

impl TagScan {
    fn new(at: usize) -> Self {
        TagScan {
            at,
            string: InString::default(),
            depth: 0,
        }
    }

    /// Where the `>` or stray `}` that ends the tag is in `text`, searching on from where the
    /// last search stopped.
    fn find_end(&mut self, text: &str) -> Option<usize> {
        let from = self.at;
        for (i, c) in text.get(from..).unwrap_or_default().char_indices() {
            self.at = from + i + c.len_utf8();
            if self.string.inside(c) {
                continue;
            }
            match c {
                '"' => self.string.open(c),
                // An attribute's quote; inside the JSON of the arguments, an apostrophe.
                '\'' if self.depth == 0 => self.string.open(c),
                '{' | '[' => self.depth += 1,
                // A `}` with no bracket open: the tag closed as if it were an object.
                '>' | '}' if self.depth == 0 => {
                    // Found again if the block is looked at again.
                    self.at = from + i;
                    return Some(from + i);
                }
                '}' | ']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        None
    }
}

impl Progress {
    /// Where `target` first is in `text` from `from` on, searching only the text the last
    /// search of it (with a shorter `text`) did not.
    fn find(&mut self, text: &str, from: usize, target: Target) -> Option<usize> {
        let at = match self
            .searches
            .iter()
            .position(|s| s.target == target && s.from == from)
        {
            Some(at) => at,
            None => {
                self.searches.push(Search {
                    target,
                    from,
                    searched: from,
                    found: None,
                });
                self.searches.len() - 1
            }
        };
        let search = self.searches.get_mut(at)?;
        if search.found.is_some() {
            return search.found;
        }
        let start = floor_char_boundary(text, search.searched);
        let rest = text.get(start..).unwrap_or_default();
        let found = match target {
            Target::Text(needle) => rest.find(needle),
            Target::NonBlank => rest.find(|c: char| !c.is_whitespace()),
            Target::Blank => rest.find(char::is_whitespace),
        }
        .map(|i| start + i);
        search.found = found;
        search.searched = match target {
            // The text's end may be the start of the needle.
            Target::Text(needle) => text.len().saturating_sub(needle.len() - 1).max(start),
            Target::NonBlank | Target::Blank => text.len().max(start),
        };
        found
    }

    /// Where the value at `at` of `text` ends, read on from where the last scan of it stopped.
    fn scan(&mut self, text: &str, at: usize, quotes: Quotes) -> Scan {
        let value = text.get(at..).unwrap_or_default();
        match &mut self.scan {
            Some((from, q, scanner)) if *from == at && *q == quotes => scanner.scan(value),
            _ => {
                let mut scanner = Scanner::new(quotes);
                let scan = scanner.scan(value);
                self.scan = Some((at, quotes, scanner));
                scan
            }
        }
    }
}

/// Where a fence of code closes in its body, or does not yet.
enum FenceEnd {
    /// The closing fence begins here.
    At(usize),
    /// Not closed; the text from here (the end, when none of it) may still become the closing
    /// fence when the next piece comes.
    MaybeFrom(usize),
}

/// Where the fence that closes a fence of code begins in `body`, which starts a line when
/// `line_start`: at the start of a line, after blanks if any (an indented fence, as in a list,
/// closes too). A line starts as [`DialectReader::release`] says it does, so that a fence reads
/// the same whether the blanks before it came in the same piece or in an earlier one.
fn closing_fence(body: &str, line_start: bool) -> FenceEnd {
    let mut at_line_start = line_start;
    for (i, c) in body.char_indices() {
        if at_line_start {
            let here = body.get(i..).unwrap_or_default();
            if here.starts_with(FENCE) {
                return FenceEnd::At(i);
            }
            if FENCE.starts_with(here) {
                return FenceEnd::MaybeFrom(i);
            }
        }
        if c == '\n' {
            at_line_start = true;
        } else if !c.is_whitespace() {
            at_line_start = false;
        }
    }
    FenceEnd::MaybeFrom(body.len())
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
