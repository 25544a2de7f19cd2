//! The shapes of a tool call that models write as text, read out of a piece of text that is
//! nothing but calls: JSON objects (`name` with `arguments` or `parameters`, an object or its JSON
//! text; OpenAI's nested `function` shape), lists of them, the pythonic list
//! `[name(arg=value, ...)]`, each maybe inside a fence, a `<tool_call>` block, after
//! `[TOOL_CALLS]` or `<|python_tag|>`. The usual slips are repaired: a trailing comma, and
//! brackets left open at the end of the text (the model stopped, or the stop token ate them). A
//! call whose brackets had to be closed keeps the text it was cut from ([`TextCall::cut`]), so
//! that the reader can refuse to run it when the output limit, not the stop token, ended it.
//!
//! Nothing here decides which names are tools: the caller's `accept` does, so that text that
//! merely looks like a call stays text.

use serde_json::{Number, Value};

use crate::surrogates;

/// One call read out of text: its tool, its raw arguments (JSON text), and the id the model gave
/// it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TextCall {
    pub(super) tool: String,
    pub(super) arguments: String,
    pub(super) id: Option<String>,
    /// The text ended inside this call, and its brackets were closed for it: the call as the
    /// model wrote it, up to that end (never complete JSON).
    pub(super) cut: Option<String>,
    /// Written as its name alone (`<tool_call>name</tool_call>`): a call only where the name is
    /// one of the agent's tools, whatever the dialect, as nothing else says it is one.
    pub(super) name_only: bool,
}

pub(super) const TOOL_CALL_OPEN: &str = "<tool_call>";
pub(super) const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// A call written as the attributes of a tag: `<tool_call name="f" arguments={...} />`.
pub(super) const TOOL_CALL_TAG: &str = "<tool_call ";
/// The attributes such a tag may have, each with its `=`.
pub(super) const TAG_ATTRIBUTES: [&str; 3] = ["name=", "arguments=", "parameters="];
/// A tool's result as the Hermes format writes it. Small models write one of their own (a made-up
/// result, often holding the call they think was made): what is in it is never a call.
pub(super) const TOOL_RESPONSE_OPEN: &str = "<tool_response>";
pub(super) const TOOL_RESPONSE_CLOSE: &str = "</tool_response>";
pub(super) const TOOL_CALLS_MARKER: &str = "[TOOL_CALLS]";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
pub(super) const FENCE: &str = "```";
/// Newer Mistral models write `[TOOL_CALLS]name[ARGS]{...}`.
pub(super) const MISTRAL_ARGS: &str = "[ARGS]";

/// The calls that `text` is made of, every one named by a tool `accept`s; `None` when anything
/// else is there (prose, JSON that is not a call, a name that is not a tool).
pub(super) fn calls_in(text: &str, accept: &dyn Fn(&str) -> bool) -> Option<Vec<TextCall>> {
    let calls = calls_in_any(text.trim(), 0)?;
    (!calls.is_empty() && calls.iter().all(|c| accept(&c.tool))).then_some(calls)
}

/// How deep wrappers may nest (a fence in a `<tool_call>` in a fence...): bounded, so that no
/// text can make the reader recurse without end.
const MAX_WRAPPERS: usize = 4;

fn calls_in_any(text: &str, depth: usize) -> Option<Vec<TextCall>> {
    if depth > MAX_WRAPPERS {
        return None;
    }
    let text = text.trim();
    for marker in [PYTHON_TAG, TOOL_CALLS_MARKER] {
        if let Some(rest) = text.strip_prefix(marker) {
            if marker == TOOL_CALLS_MARKER
                && let Some(calls) = mistral_named_calls(rest)
            {
                return Some(calls);
            }
            return calls_in_any(rest, depth + 1);
        }
    }
    if text.starts_with(FENCE) {
        return calls_in_any(fence_body(text)?, depth + 1);
    }
    if text.starts_with(TOOL_CALL_TAG) {
        let mut calls = Vec::new();
        let mut rest = text;
        while rest.starts_with(TOOL_CALL_TAG) {
            let (call, used) = attribute_call(rest)?;
            calls.push(call);
            rest = rest.get(used..)?.trim_start();
        }
        return rest.is_empty().then_some(calls);
    }
    if text.starts_with(TOOL_CALL_OPEN) {
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(after) = rest.trim_start().strip_prefix(TOOL_CALL_OPEN) {
            let (body, next, closed) = match after.split_once(TOOL_CALL_CLOSE) {
                Some((body, next)) => (body, next, true),
                None => (after, "", false),
            };
            match calls_in_any(body, depth + 1) {
                Some(found) => calls.extend(found),
                // Only a closed tag is the whole name: an open one may have been cut.
                None if closed => calls.push(name_only_call(body)?),
                None => return None,
            }
            rest = next;
        }
        return rest.trim().is_empty().then_some(calls);
    }
    if text.starts_with('[')
        && let Some((calls, used)) = pythonic_calls(text)
        && text.get(used..).is_some_and(|r| r.trim().is_empty())
    {
        return Some(calls);
    }
    let Some(values) = json_values(text) else {
        return python_dict_call(text);
    };
    let mut calls = Vec::new();
    for (value, open) in values {
        match value {
            Value::Array(items) if !items.is_empty() => {
                let last = items.len() - 1;
                for (i, item) in items.iter().enumerate() {
                    let mut call = call_of(item)?;
                    // The list's own closer alone was missing: its last call is whole.
                    if i == last
                        && let Some(open) = &open
                        && open.depth > 1
                    {
                        call.cut = Some(open.last_item.trim().to_owned());
                    }
                    calls.push(call);
                }
            }
            other => {
                let mut call = call_of(&other)?;
                call.cut = open.map(|o| o.text.to_owned());
                calls.push(call);
            }
        }
    }
    Some(calls)
}

/// `<tool_call name="f" arguments={...} />` at the start of `text` (or closed by `>` and maybe
/// `</tool_call>`, by a stray `}`, or not at all where the text ends: the stop token may eat it),
/// as small models
/// write a call when asked for `<tool_call>` tags: the call and the bytes it took. A value is a
/// quoted string (the arguments' JSON text, or the name) or a JSON object.
fn attribute_call(text: &str) -> Option<(TextCall, usize)> {
    let mut rest = text.strip_prefix(TOOL_CALL_TAG)?;
    let mut attributes = serde_json::Map::new();
    let mut cut = None;
    loop {
        rest = rest.trim_start();
        // `}`: the model closed the tag as if it were the object `{"name": ..., "arguments":
        // {...}}` (recorded from the 1.5B model, twice in four tags).
        if let Some(after) = rest.strip_prefix("/>").or_else(|| rest.strip_prefix('}')) {
            rest = after;
            break;
        }
        if let Some(after) = rest.strip_prefix('>') {
            rest = after;
            let closed = rest.trim_start().strip_prefix(TOOL_CALL_CLOSE);
            rest = closed.unwrap_or(rest);
            break;
        }
        if rest.is_empty() {
            break;
        }
        let (key, value) = rest.split_once('=')?;
        let key = key.trim_end();
        if !TAG_ATTRIBUTES
            .iter()
            .any(|a| a.strip_suffix('=') == Some(key))
            || attributes.contains_key(key)
        {
            return None;
        }
        let value = value.trim_start();
        let (parsed, used) = match value.chars().next()? {
            q @ ('"' | '\'') => {
                let body = value.get(1..)?;
                let close = body.find(q)?;
                (Value::String(body.get(..close)?.to_owned()), close + 2)
            }
            '{' => {
                let (parsed, used, open) = first_json_value(value)?;
                if open.is_some() {
                    cut = Some(text.to_owned());
                }
                (parsed, used)
            }
            _ => return None,
        };
        attributes.insert(key.to_owned(), parsed);
        rest = value.get(used..)?;
    }
    let mut call = call_of(&Value::Object(attributes))?;
    call.cut = cut;
    Some((call, text.len() - rest.len()))
}

/// `<tool_call>name</tool_call>`, the name alone: small models write a call to a tool so when
/// they give it no arguments (or forget them), and the tool's schema answers the second case.
fn name_only_call(body: &str) -> Option<TextCall> {
    let tool = body.trim();
    is_tool_name(tool).then(|| TextCall {
        tool: tool.to_owned(),
        arguments: "{}".to_owned(),
        id: None,
        cut: None,
        name_only: true,
    })
}

/// The body of a fenced block (its info string, `json` or none, dropped); the closing fence may
/// be missing at the end of the text.
fn fence_body(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(FENCE)?;
    let rest = rest.trim_end();
    let rest = rest.strip_suffix(FENCE).unwrap_or(rest);
    match rest.split_once('\n') {
        Some((info, body)) if !info.trim_start().starts_with(['{', '[', '<']) => {
            // An info string is one word (`json`, `tool_call`), not text.
            (!info.trim().contains(char::is_whitespace)).then_some(body)
        }
        _ => Some(rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')),
    }
}

/// A call written as a Python dict, as small models write one: `{'name': 'f', 'arguments':
/// {'x': True}}` (or JSON with Python's `True`/`None`), read with Python's literals.
fn python_dict_call(text: &str) -> Option<Vec<TextCall>> {
    if !text.starts_with('{') {
        return None;
    }
    let mut p = Py { text, at: 0 };
    let value = p.value(0)?;
    p.blank();
    if p.at != text.len() {
        return None;
    }
    Some(vec![call_of(&value)?])
}

/// `name[ARGS]{...}` after `[TOOL_CALLS]`, one or more times.
fn mistral_named_calls(mut text: &str) -> Option<Vec<TextCall>> {
    let mut calls = Vec::new();
    loop {
        text = text.trim_start();
        if text.is_empty() {
            return (!calls.is_empty()).then_some(calls);
        }
        text = text.strip_prefix(TOOL_CALLS_MARKER).unwrap_or(text);
        let (name, rest) = text.split_once(MISTRAL_ARGS)?;
        if !is_tool_name(name) {
            return None;
        }
        let (value, used, open) = first_json_value(rest)?;
        if !value.is_object() {
            return None;
        }
        calls.push(TextCall {
            tool: name.to_owned(),
            arguments: value.to_string(),
            id: None,
            cut: open.map(|o| o.text.to_owned()),
            name_only: false,
        });
        text = rest.get(used..)?;
    }
}

fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// A call's name and raw arguments: `{"name", "arguments" | "parameters"}` (an object, its JSON
/// text, or none), with at most an `id` and a `type` beside; or OpenAI's
/// `{"type": "function", "function": {...}}`. Anything else is not a call.
fn call_of(v: &Value) -> Option<TextCall> {
    let map = v.as_object()?;
    let id = map.get("id").and_then(Value::as_str).map(str::to_owned);
    if let Some(function) = map.get("function")
        && function.is_object()
        && map
            .keys()
            .all(|k| matches!(k.as_str(), "function" | "type" | "id"))
    {
        let mut call = call_of(function)?;
        call.id = call.id.or(id);
        return Some(call);
    }
    if !map.keys().all(|k| {
        matches!(
            k.as_str(),
            "name" | "arguments" | "parameters" | "type" | "id"
        )
    }) {
        return None;
    }
    let tool = map.get("name")?.as_str()?;
    if !is_tool_name(tool) {
        return None;
    }
    let arguments = match map.get("arguments").or_else(|| map.get("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        // Arguments given as JSON text are kept as the model wrote them unless they are an
        // object, which is written the one way objects are.
        Some(Value::String(s)) => match surrogates::from_str::<Value>(s, &mut None) {
            Ok(object @ Value::Object(_)) => object.to_string(),
            _ => s.clone(),
        },
        Some(other @ Value::Object(_)) => other.to_string(),
        Some(_) => return None,
    };
    Some(TextCall {
        tool: tool.to_owned(),
        arguments,
        id,
        cut: None,
        name_only: false,
    })
}

/// The JSON values one after another in `text`, with blanks, `;` or `,` between them, each
/// repaired if it needs it (and then with where the text ended inside it); `None` when anything
/// else is there.
fn json_values(mut text: &str) -> Option<Vec<(Value, Option<OpenEnd<'_>>)>> {
    let mut values = Vec::new();
    loop {
        text = text.trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
        if text.is_empty() {
            return Some(values);
        }
        let (value, used, open) = first_json_value(text)?;
        values.push((value, open));
        text = text.get(used..)?;
    }
}

/// A value the text ended inside, whose brackets were closed for it.
struct OpenEnd<'a> {
    /// The value as it was written.
    text: &'a str,
    /// Its last item (of a list, or entry of an object) as it was written.
    last_item: &'a str,
    /// How many brackets were open at the end: 1 when only the value's own closer was missing.
    depth: usize,
}

/// The JSON value that `text` starts with and the bytes it took, repaired if it needs it: trailing
/// commas dropped, and brackets left open at the end of the text closed (then also where the text
/// ended inside it).
fn first_json_value(text: &str) -> Option<(Value, usize, Option<OpenEnd<'_>>)> {
    let offset = text.len() - text.trim_start().len();
    let text = text.trim_start();
    if let Some((value, used)) = whole_json_value(text) {
        return Some((value, offset + used, None));
    }
    if !text.starts_with(['{', '[']) {
        return None;
    }
    let mut scanner = Scanner::new(Quotes::Json);
    let (end, closers, open) = match scanner.scan(text) {
        Scan::Complete(end) => (end, String::new(), None),
        Scan::Open => {
            let closers = scanner.closers();
            let open = OpenEnd {
                text,
                last_item: text.get(scanner.last_item()..).unwrap_or_default(),
                depth: closers.chars().count(),
            };
            (text.len(), closers, Some(open))
        }
        Scan::Invalid(_) => return None,
    };
    // Only this value is repaired: the callers read a text value after value, and repairing all
    // that is left at each one would make a text of many values quadratic.
    let value_text = text.get(..end)?;
    // A lone half of a character in a string is U+FFFD, as in an API's JSON. The repair keeps
    // the text's length, so the value still ends where it did.
    let lone_repaired = surrogates::replace_lone_str(value_text);
    let value_text = lone_repaired.as_deref().unwrap_or(value_text);
    if lone_repaired.is_some()
        && closers.is_empty()
        && let Ok(value) = serde_json::from_str::<Value>(value_text)
    {
        return Some((value, offset + end, None));
    }
    let repaired = repaired_json(value_text) + &closers;
    let value = serde_json::from_str::<Value>(&repaired).ok()?;
    Some((value, offset + end, open.filter(|o| o.depth > 0)))
}

/// The JSON value that `text` starts with, as it is, and the bytes it took.
fn whole_json_value(text: &str) -> Option<(Value, usize)> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = stream.next()?.ok()?;
    Some((value, stream.byte_offset()))
}

/// Which quotes open a string while scanning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quotes {
    /// `"` only.
    Json,
    /// `"` and `'` (Python literals).
    Python,
}

/// Where the bracketed value at the start of a text ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// It ends at this byte (exclusive).
    Complete(usize),
    /// The text ends inside it ([`Scanner::closers`] would close it, [`Scanner::last_item`] is
    /// where its last item begins).
    Open,
    /// It is no value: a closer that does not match, or no bracket at the start, which ends
    /// at this byte (exclusive).
    Invalid(usize),
}

/// Reads the bracketed value at the start of a text that may grow between two reads, going on
/// from where the last read stopped: a value streamed in many pieces is read once, not once a
/// piece.
#[derive(Debug, Clone)]
pub(super) struct Scanner {
    quotes: Quotes,
    /// The closers of the brackets open, outermost first.
    stack: Vec<char>,
    string: InString,
    last_item: usize,
    /// How many bytes of the text have been read.
    read: usize,
    /// How the value ended, once it has.
    ended: Option<Scan>,
}

impl Scanner {
    /// A scanner at the start of a value whose strings open with these quotes.
    pub(super) fn new(quotes: Quotes) -> Self {
        Scanner {
            quotes,
            stack: Vec::new(),
            string: InString::default(),
            last_item: 0,
            read: 0,
            ended: None,
        }
    }

    /// Where the value ends in `text`, which holds at least the text read before.
    pub(super) fn scan(&mut self, text: &str) -> Scan {
        if let Some(ended) = self.ended {
            return ended;
        }
        let from = self.read;
        for (i, c) in text.get(from..).unwrap_or_default().char_indices() {
            if let Some(ended) = self.step(from + i, c) {
                return ended;
            }
        }
        if self.stack.is_empty() {
            return Scan::Invalid(self.read);
        }
        Scan::Open
    }

    /// Reads the character `c` at byte `at`: how the value ended, when it ends here.
    pub(super) fn step(&mut self, at: usize, c: char) -> Option<Scan> {
        if let Some(ended) = self.ended {
            return Some(ended);
        }
        self.read = at + c.len_utf8();
        let ended = self.next(at, c)?;
        self.ended = Some(ended);
        Some(ended)
    }

    fn next(&mut self, at: usize, c: char) -> Option<Scan> {
        let after = at + c.len_utf8();
        if self.string.inside(c) {
            return None;
        }
        let python = self.quotes == Quotes::Python;
        match c {
            '"' => self.string.open(c),
            '\'' if python => self.string.open(c),
            '{' | '[' | '(' if self.stack.is_empty() => {
                if c == '(' && !python {
                    return Some(Scan::Invalid(after));
                }
                self.stack.push(closer_of(c));
                self.last_item = after;
            }
            ',' if self.stack.len() == 1 => self.last_item = after,
            '{' => self.stack.push('}'),
            '[' => self.stack.push(']'),
            '(' if python => self.stack.push(')'),
            '}' | ']' | ')' => {
                if self.stack.pop() != Some(c) {
                    return Some(Scan::Invalid(after));
                }
                if self.stack.is_empty() {
                    return Some(Scan::Complete(after));
                }
            }
            _ if self.stack.is_empty() => return Some(Scan::Invalid(after)),
            _ => {}
        }
        None
    }

    /// Whether the text read so far ends inside a string.
    pub(super) fn in_string(&self) -> bool {
        self.ended.is_none() && self.string.quote.is_some()
    }

    /// The closers (innermost first) that would close the value where the text read so far
    /// ends; none inside a string, where nothing can be closed for the model.
    fn closers(&self) -> String {
        if self.string.quote.is_some() {
            return String::new();
        }
        self.stack.iter().rev().collect()
    }

    /// Where the last item (of the outermost bracket) begins.
    fn last_item(&self) -> usize {
        self.last_item
    }
}

/// Whether a scan is inside a string, and how it ends.
#[derive(Debug, Clone, Default)]
pub(super) struct InString {
    /// The quote of the string the text is in.
    pub(super) quote: Option<char>,
    escaped: bool,
}

impl InString {
    /// A string opens with the quote `c`.
    pub(super) fn open(&mut self, c: char) {
        self.quote = Some(c);
    }

    /// Reads `c` if it is inside a string (its closing quote included): whether it was.
    pub(super) fn inside(&mut self, c: char) -> bool {
        let Some(q) = self.quote else {
            return false;
        };
        if self.escaped {
            self.escaped = false;
        } else if c == '\\' {
            self.escaped = true;
        } else if c == q {
            self.quote = None;
        }
        true
    }
}

fn closer_of(open: char) -> char {
    match open {
        '{' => '}',
        '[' => ']',
        _ => ')',
    }
}

/// `text` without the commas that stand right before a `}` or `]` (outside strings), and with
/// the raw control characters inside its strings escaped: small models write a multi-line
/// `content` with its line breaks and tabs as they are, which JSON does not allow.
fn repaired_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            } else if u32::from(c) < 0x20 {
                match c {
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    '\r' => out.push_str("\\r"),
                    other => out.push_str(&format!("\\u{:04x}", u32::from(other))),
                }
                continue;
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ','
            && text
                .get(i + 1..)
                .is_some_and(|r| r.trim_start().starts_with(['}', ']']))
        {
            continue;
        }
        out.push(c);
    }
    out
}

/// `[name(arg=value, ...), ...]` at the start of `text`: the calls and the bytes they took.
fn pythonic_calls(text: &str) -> Option<(Vec<TextCall>, usize)> {
    let mut p = Py { text, at: 0 };
    p.eat('[')?;
    let calls = p.items(']', |p| {
        let tool = p.ident()?;
        p.blank();
        p.eat('(')?;
        let arguments = p.items(')', |p| {
            let key = p.ident()?;
            p.blank();
            p.eat('=')?;
            p.blank();
            Some((key.to_owned(), p.value(0)?))
        })?;
        Some(TextCall {
            tool: tool.to_owned(),
            arguments: Value::Object(arguments.into_iter().collect()).to_string(),
            id: None,
            cut: None,
            name_only: false,
        })
    })?;
    (!calls.is_empty()).then_some((calls, p.at))
}

/// A small reader of Python literals (strings, numbers, `True`/`False`/`None`, lists, dicts).
struct Py<'a> {
    text: &'a str,
    at: usize,
}

/// How deep literals may nest.
const MAX_NESTING: usize = 64;

impl<'a> Py<'a> {
    fn rest(&self) -> &'a str {
        self.text.get(self.at..).unwrap_or_default()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn blank(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> Option<()> {
        (self.peek()? == c).then(|| self.at += c.len_utf8())
    }

    /// Items separated by commas (a trailing one allowed) up to `close`, which is eaten; the
    /// opening bracket is already eaten.
    fn items<T>(
        &mut self,
        close: char,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut items = Vec::new();
        loop {
            self.blank();
            if self.eat(close).is_some() {
                return Some(items);
            }
            if !items.is_empty() {
                self.eat(',')?;
                self.blank();
                if self.eat(close).is_some() {
                    return Some(items);
                }
            }
            items.push(item(self)?);
        }
    }

    fn ident(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .unwrap_or(rest.len());
        let ident = rest.get(..len)?;
        if ident.is_empty() || ident.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.at += len;
        Some(ident)
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_NESTING {
            return None;
        }
        match self.peek()? {
            q @ ('"' | '\'') => self.string(q).map(Value::String),
            '[' => {
                self.at += 1;
                self.items(']', |p| p.value(depth + 1)).map(Value::Array)
            }
            '{' => {
                self.at += 1;
                let entries = self.items('}', |p| {
                    let key = match p.value(depth + 1)? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    p.blank();
                    p.eat(':')?;
                    p.blank();
                    Some((key, p.value(depth + 1)?))
                })?;
                Some(Value::Object(entries.into_iter().collect()))
            }
            _ => {
                let rest = self.rest();
                let len = rest
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+')))
                    .unwrap_or(rest.len());
                let word = rest.get(..len)?;
                let value = match word {
                    "True" | "true" => Value::Bool(true),
                    "False" | "false" => Value::Bool(false),
                    "None" | "null" => Value::Null,
                    _ => Value::Number(number(word)?),
                };
                self.at += len;
                Some(value)
            }
        }
    }

    fn string(&mut self, quote: char) -> Option<String> {
        self.at += quote.len_utf8();
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, e) = chars.next()?;
                    out.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        other => other,
                    });
                }
                c if c == quote => {
                    self.at += i + c.len_utf8();
                    return Some(out);
                }
                c => out.push(c),
            }
        }
        None
    }
}

fn number(word: &str) -> Option<Number> {
    if let Ok(n) = word.parse::<i64>() {
        return Some(n.into());
    }
    word.parse::<f64>().ok().and_then(Number::from_f64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
    use super::*;

    fn any(_: &str) -> bool {
        true
    }

    fn read(text: &str) -> Vec<(String, Value)> {
        calls_in(text, &any)
            .unwrap_or_else(|| panic!("no calls in {text:?}"))
            .into_iter()
            .map(|c| (c.tool, serde_json::from_str(&c.arguments).unwrap()))
            .collect()
    }

    #[test]
    fn every_wrapper_and_both_argument_keys_are_read() {
        let want = vec![("f".to_owned(), serde_json::json!({"x": 1}))];
        for text in [
            r#"{"name": "f", "arguments": {"x": 1}}"#,
            r#"{"name": "f", "parameters": {"x": 1}}"#,
            r#"{"name": "f", "arguments": "{\"x\": 1}"}"#,
            r#"{"type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}"#,
            "```json\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n```",
            "```\n[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]\n```",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": 1}}]",
            "[TOOL_CALLS]f[ARGS]{\"x\": 1}",
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
            "[f(x=1)]",
        ] {
            assert_eq!(read(text), want, "{text}");
        }
    }

    #[test]
    fn the_usual_slips_are_repaired() {
        assert_eq!(
            read(r#"{"name": "f", "arguments": {"x": 1,},}"#)[0].1,
            serde_json::json!({"x": 1})
        );
        assert_eq!(
            read(r#"{"name": "f", "arguments": {"x": "a}"}"#)[0].1,
            serde_json::json!({"x": "a}"})
        );
        assert_eq!(
            read(r#"{"name": "f", "arguments": {"x": [1, 2"#)[0].1,
            serde_json::json!({"x": [1, 2]})
        );
        // Raw line breaks and tabs in a string (a multi-line `content`), with a lone half.
        assert_eq!(
            read("{\"name\": \"f\", \"arguments\": {\"x\": \"a\n\tb\r\u{1}\\ud83d\",}}")[0].1,
            serde_json::json!({"x": "a\n\tb\r\u{1}\u{fffd}"})
        );
        // Inside a string nothing can be closed for the model.
        assert!(calls_in(r#"{"name": "f", "arguments": {"x": "a"#, &any).is_none());
    }

    #[test]
    fn a_lone_surrogate_escape_in_a_call_is_a_replacement_character() {
        // The model's own JSON holds half a character: in an arguments object, in arguments
        // given as JSON text, and before a second call (the repair keeps every offset).
        let lone = serde_json::json!({"x": "a\u{fffd}b\u{1F600}"});
        for text in [
            r#"{"name": "f", "arguments": {"x": "a\ud83db\ud83d\ude00"}}"#,
            r#"{"name": "f", "arguments": "{\"x\": \"a\\ud83db\\ud83d\\ude00\"}"}"#,
            r#"[TOOL_CALLS]f[ARGS]{"x": "a\ude00b\ud83d\ude00"}"#,
            r#"{"name": "f", "arguments": {"x": "a\ud83db\ud83d\ude00",}}"#,
        ] {
            assert_eq!(read(text), vec![("f".to_owned(), lone.clone())], "{text}");
        }
        let two =
            read(r#"[TOOL_CALLS]f[ARGS]{"x": "a\ud83db\ud83d\ude00"}[TOOL_CALLS]g[ARGS]{"y": 1}"#);
        assert_eq!(two[0], ("f".to_owned(), lone));
        assert_eq!(two[1], ("g".to_owned(), serde_json::json!({"y": 1})));
    }

    #[test]
    fn many_calls_with_lone_halves_are_each_repaired() {
        // Each value is repaired alone (the text after it is not copied at every value).
        let one = r#"{"name": "f", "arguments": {"x": "a\ud83d"}}"#;
        let text = format!("```json\n{}\n```", [one; 2_000].join("\n"));
        let calls = read(&text);
        assert_eq!(calls.len(), 2_000);
        let lone = serde_json::json!({"x": "a\u{fffd}"});
        assert!(calls.iter().all(|c| c == &("f".to_owned(), lone.clone())));
    }

    #[test]
    fn pythonic_calls_take_python_literals() {
        let calls = read(
            "[get_weather(city='Paris', days=3, metric=True), note(text=\"it's \\\"ok\\\"\", tags=['a', None], m={'k': 1.5})]",
        );
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(
            calls[0].1,
            serde_json::json!({"city": "Paris", "days": 3, "metric": true})
        );
        assert_eq!(
            calls[1].1,
            serde_json::json!({"text": "it's \"ok\"", "tags": ["a", null], "m": {"k": 1.5}})
        );
    }

    #[test]
    fn a_call_written_as_a_python_dict_is_read() {
        let want = vec![(
            "f".to_owned(),
            serde_json::json!({"city": "Paris", "metric": true, "days": null}),
        )];
        for text in [
            "{'name': 'f', 'arguments': {'city': 'Paris', 'metric': True, 'days': None}}",
            r#"{"name": "f", "arguments": {"city": "Paris", "metric": True, "days": None}}"#,
        ] {
            assert_eq!(read(text), want, "{text}");
        }
        assert!(calls_in("{'name': 'f', 'arguments': {}} and more", &any).is_none());
    }

    #[test]
    fn what_is_not_a_call_is_none() {
        for text in [
            "",
            "hello",
            r#"{"name": "Ada", "age": 36}"#,
            r#"{"name": "f", "arguments": 3}"#,
            r#"{"result": 5}"#,
            "[1, 2, 3]",
            "[]",
            "[see here](http://x)",
            "```python\nprint(1)\n```",
            r#"{"name": "f"} and more"#,
        ] {
            assert!(calls_in(text, &any).is_none(), "{text}");
        }
        assert!(calls_in(r#"{"name": "f"}"#, &|n| n == "g").is_none());
    }
}
