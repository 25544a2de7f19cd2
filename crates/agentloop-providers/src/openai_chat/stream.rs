//! Reading Chat Completions answers: the borrowing wire types of a chunk (or a whole response,
//! the same shape with `message` for `delta`), and the pure [`ChatStreamParser`] that turns them
//! into [`ModelEvent`]s for the live stream, the in-memory path and whole bodies alike.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use agentloop::message::SmolStr;
use agentloop::{
    ModelError, ModelResponse,
    model::{FinishReason, ModelErrorKind, ModelEvent, Usage},
};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::dialect::{DialectReader, ToolDialect};
use super::open_json::OpenJson;
use super::strict::drop_strict_nulls;
use crate::decode::{StreamDecoder, accumulate_sse, accumulate_whole};
use crate::digest::Digest;
use crate::error::{
    decode_error, in_body_error, is_unparsed_tool_output, stream_cut, stream_error,
};
use crate::surrogates;
use crate::wire_text::{Channel, Pairs, WireText, wire_text_of};

/// A whole response or one stream chunk: the same shape, with `message` or `delta` in each choice.
#[derive(Deserialize)]
struct WireCompletion<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<WireChoice<'a>>>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    usage: Option<WireUsage>,
    /// Groq reports a stream's usage here, on its last chunk, rather than in `usage`.
    #[serde(default)]
    x_groq: Option<GroqExtra>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct GroqExtra {
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    delta: Option<WireDelta<'a>>,
    #[serde(default, borrow)]
    message: Option<WireDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<WireText<'a>>,
    /// OpenRouter and some servers name it `reasoning`.
    #[serde(default, borrow)]
    reasoning: Option<WireText<'a>>,
    #[serde(default, borrow)]
    refusal: Option<WireText<'a>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireToolCallIn<'a>>>,
    /// The pre-tools API's one call (`functions` in the request): servers and proxies that
    /// still speak it answer a `tools` request with it and `finish_reason: "function_call"`.
    #[serde(default, borrow)]
    function_call: Option<WireFunctionIn<'a>>,
    /// OpenRouter's structured reasoning (text with its signature, encrypted or summarized
    /// blocks), which must go back with the calls it led to (Claude's thinking with tools).
    #[serde(default)]
    reasoning_details: Option<Value>,
}

#[derive(Deserialize)]
struct WireToolCallIn<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, deserialize_with = "crate::decode::shared_id")]
    id: Option<Arc<str>>,
    #[serde(default, borrow)]
    function: Option<WireFunctionIn<'a>>,
    /// Provider data on the call that must go back with it (Gemini's thought signature, as
    /// `{"google": {"thought_signature": ...}}`).
    #[serde(default)]
    extra_content: Option<Value>,
}

/// A message's `content`: a string on OpenAI; a list of typed parts on some servers (Mistral's
/// Magistral sends `text` and `thinking` parts), read into its text and its reasoning.
#[derive(Default)]
struct Content<'a> {
    text: WireText<'a>,
    reasoning: String,
}

impl Content<'_> {
    fn of_parts(parts: &Value) -> Self {
        let mut text = String::new();
        let mut reasoning = String::new();
        add_part(parts, &mut text, &mut reasoning);
        Content {
            text: WireText::plain(text),
            reasoning,
        }
    }
}

fn add_part(part: &Value, text: &mut String, reasoning: &mut String) {
    match part {
        Value::String(s) => text.push_str(s),
        Value::Object(map) => {
            let kind = map.get("type").and_then(Value::as_str).unwrap_or("text");
            match kind {
                "thinking" | "reasoning" => {
                    if let Some(inner) = map.get("thinking").or_else(|| map.get("text")) {
                        collect_text(inner, reasoning);
                    }
                }
                _ => {
                    if let Some(Value::String(t)) = map.get("text") {
                        text.push_str(t);
                    }
                }
            }
        }
        Value::Array(parts) => parts.iter().for_each(|p| add_part(p, text, reasoning)),
        _ => {}
    }
}

/// The text of a string, a `{"text": ...}` part or a list of them.
fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => out.push_str(s),
        Value::Array(items) => items.iter().for_each(|i| collect_text(i, out)),
        Value::Object(map) => {
            if let Some(t) = map.get("text") {
                collect_text(t, out);
            }
        }
        _ => {}
    }
}

/// A string is read first as itself (its escapes may split a character with the next chunk's:
/// see [`WireText`]); a list or an object, as the parts it holds.
impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let raw = <&'a RawValue>::deserialize(deserializer)?;
        if raw.get().starts_with('"') {
            let text = wire_text_of(raw).map_err(D::Error::custom)?;
            return Ok(Content {
                text,
                reasoning: String::new(),
            });
        }
        match serde_json::from_str::<Value>(raw.get()).map_err(D::Error::custom)? {
            Value::Null => Ok(Content::default()),
            parts @ (Value::Array(_) | Value::Object(_)) => Ok(Content::of_parts(&parts)),
            _ => Err(D::Error::custom(
                "invalid content: expected a string or a list of content parts",
            )),
        }
    }
}

#[derive(Deserialize)]
struct WireFunctionIn<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
}

/// A tool call's arguments: a JSON string on OpenAI (borrowed when it has no escapes, its
/// escapes read as [`WireText`] reads them); some servers send an object, which is kept as its
/// JSON text.
struct Arguments<'a>(WireText<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for Arguments<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let raw = <&'a RawValue>::deserialize(deserializer)?;
        if raw.get().starts_with('"') {
            return wire_text_of(raw).map(Arguments).map_err(D::Error::custom);
        }
        match serde_json::from_str::<Value>(raw.get()).map_err(D::Error::custom)? {
            Value::Null => Ok(Arguments(WireText::default())),
            object @ Value::Object(_) => Ok(Arguments(WireText::plain(object.to_string()))),
            _ => Err(D::Error::custom(
                "invalid arguments: expected a JSON string or object",
            )),
        }
    }
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    prompt_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    completion_tokens: Option<u64>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default, deserialize_with = "crate::decode::lenient")]
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek's own count of cached prompt tokens.
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct PromptDetails {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct CompletionDetails {
    #[serde(default, deserialize_with = "crate::decode::lenient_count")]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// The finish reasons that end no answer but say the server cut it, and the transient failure
/// each is: asked again (under `Retry`) rather than taken, cut, for the whole answer. DeepSeek's
/// `insufficient_system_resource` (its servers ran out of resources); vLLM's and SGLang's
/// `abort` (the engine dropped the request: a shutdown, a scale-down, a pause), which vLLM sends
/// as a last chunk followed by `[DONE]`, as though the answer were whole (vllm-project/vllm#57082);
/// vLLM's `repetition` (its engine stopped an answer caught repeating itself, a loop a new sample
/// may not fall into), also one of the words its `FINISH_REASON_STRINGS` names.
fn interruption(reason: &str) -> Option<(ModelErrorKind, &'static str)> {
    if reason.eq_ignore_ascii_case("insufficient_system_resource") {
        Some((
            ModelErrorKind::Overloaded,
            "stopped the answer for want of resources",
        ))
    } else if reason.eq_ignore_ascii_case("abort") {
        Some((ModelErrorKind::Server, "aborted the answer"))
    } else if reason.eq_ignore_ascii_case("repetition") {
        Some((
            ModelErrorKind::Server,
            "stopped the answer as it repeated itself",
        ))
    } else {
        None
    }
}

/// Maps a Chat Completions `finish_reason` to a [`FinishReason`], whatever its case: gateways in
/// front of Gemini pass its own words through (`STOP`, `MAX_TOKENS`, `SAFETY`), and read as
/// unknown, an answer the limit cut would pass for a whole one (QwenLM/qwen-code#9882).
pub fn map_finish_reason(raw: &str) -> FinishReason {
    // Lowered only when it has capitals: the usual word costs no allocation.
    let lowered;
    let word = if raw.bytes().any(|b| b.is_ascii_uppercase()) {
        lowered = raw.to_ascii_lowercase();
        lowered.as_str()
    } else {
        raw
    };
    match word {
        // `eos`: Together; `eos_token`: TGI's end of sequence; `normal`: Baidu Qianfan's and
        // UCloud's whole answer; `complete`: Cohere's own word.
        "stop" | "end_turn" | "stop_sequence" | "eos" | "eos_token" | "normal" | "complete" => {
            FinishReason::Stop
        }
        // `tool_call`: mlx-lm's server before ml-explore/mlx-lm#782, and Cohere's own word.
        "tool_calls" | "tool_call" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        // `model_length`: Mistral's context window filled; `model_context_window_exceeded`: the
        // same from Z.ai (GLM) and Anthropic-shaped gateways.
        "length" | "max_tokens" | "model_length" | "model_context_window_exceeded" => {
            FinishReason::Length
        }
        // Gemini's words for the filters that stop it, and Bedrock's, which gateways pass on.
        "content_filter"
        | "safety"
        | "recitation"
        | "blocklist"
        | "prohibited_content"
        | "spii"
        | "image_safety"
        | "image_prohibited_content"
        | "image_recitation"
        | "model_armor"
        | "content_filtered"
        | "guardrail_intervened" => FinishReason::ContentFilter,
        "refusal" => FinishReason::Refusal,
        // Gemini's words for a turn whose tool call it could not make (gateways pass them on,
        // OpenRouter as `error` with its own in `native_finish_reason`): a failed answer.
        "error"
        | "malformed_function_call"
        | "unexpected_tool_call"
        | "too_many_tool_calls"
        | "malformed_response" => FinishReason::Error,
        // A word this client does not know: the run does not take its answer for a whole one.
        _ => FinishReason::Other,
    }
}

/// The pure parser of a Chat Completions event stream: it turns each event's data into
/// [`ModelEvent`]s. The live adapter, [`parse_stream_bytes`] and the tests share it.
///
/// Tool-call deltas are keyed by the call's id before its `index`: servers and gateways send
/// parallel calls all at `index` 0 with different ids (Ollama, SGLang, some gateways) or with no
/// index at all (Gemini's endpoint, older Ollama), and a client keyed by index alone merges them.
#[derive(Debug)]
pub struct ChatStreamParser {
    provider: String,
    started: bool,
    /// One slot per call, in the order the calls began; a slot's number is the event's index.
    slots: Vec<CallSlot>,
    /// The first slot of each call id: a server streaming many calls is not scanned for each
    /// of their fragments.
    by_id: HashMap<Arc<str>, usize>,
    /// The slots each wire `index` now continues (the newest is the last).
    by_wire: HashMap<u32, BTreeSet<usize>>,
    saw_tool_call: bool,
    /// A `refusal` came instead of content: the response ends as a refusal, though the wire
    /// says `stop`.
    saw_refusal: bool,
    /// Some text, reasoning, refusal or call came: a stream that ends without a finish reason
    /// is still an answer.
    saw_answer: bool,
    finish: Option<(FinishReason, String)>,
    done: bool,
    /// Reads tool calls out of the text, for a model that writes them in a plain-text dialect.
    dialect: Option<DialectReader>,
    /// OpenRouter's reasoning details so far, each streamed piece joined to its block.
    reasoning_details: Vec<Value>,
    /// Characters split between two chunks' escapes, half received.
    pairs: Pairs,
    /// The original schemas of a strict request, to read its answer back in their terms.
    strict: Option<StrictSchemas>,
    /// The slot of the legacy `function_call`: the old API has one call per answer, with no id
    /// or index, so every fragment of it continues that call (the run gives it an id).
    legacy_call: Option<usize>,
    /// Where the answer's text is in a `<think>` block it opened with.
    think: ThinkTags,
}

/// A `<think>` block at the start of the text: models whose server has no reasoning parser
/// (DeepSeek R1 and QwQ on Ollama before its `thinking` field, on llama.cpp with
/// `--reasoning-format none`, on cloud hosts that pass the text through) write their reasoning
/// there. Read as text, it would be the answer's opening, and the dialect reader would take a
/// call the model only thought about for one it made.
#[derive(Debug)]
enum ThinkTags {
    /// The text so far (blank, or the start of `<think>`) does not tell yet.
    Undecided(String),
    /// Inside the block: held, what may be the start of `</think>`.
    Inside(String),
    /// The block closed: the blank text right after it is dropped.
    Closed,
    /// The text is all text.
    Text,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// A strict request's original schemas, and what of the answer is held until it ends: strict
/// mode makes the model write `null` for each optional property it leaves out, which the run's
/// check against the original schema refuses, so a call's arguments (and a structured answer's
/// text) are read whole and those nulls taken out before they go on.
#[derive(Debug, Default)]
struct StrictSchemas {
    tools: HashMap<String, Value>,
    output: Option<Value>,
    /// Each call's arguments so far, by its event index.
    arguments: BTreeMap<u32, String>,
    /// The answer's text so far, when an output schema was made strict.
    text: Option<String>,
}

#[derive(Debug)]
struct CallSlot {
    /// The call's id, the one its events carry (empty until one comes).
    id: Arc<str>,
    /// The tool's name (empty until it comes).
    name: SmolStr,
    /// The wire `index` that last opened or continued this call.
    wire_index: Option<u32>,
    extra_content: Option<Value>,
    /// The id its first fragment carried is another call's: it has none of its own.
    reused_id: bool,
    /// The arguments passed on so far, as their length and digest (no copy of them): enough to
    /// know a fragment that begins with them.
    arguments: Digest,
    /// Whether the arguments passed on so far stop inside a string or a bracket: at a `[DONE]`
    /// without a `finish_reason`, the stream was cut there.
    open: OpenJson,
    /// A fragment held back because it is a whole JSON object that begins with the arguments
    /// so far: the server restated them (see [`ChatStreamParser::release_restated`]), unless a
    /// later fragment of the call shows it was only their next piece.
    restated: Option<String>,
}

/// Where the provider data of tool calls (Gemini's thought signatures) is kept on the
/// assistant message: a reasoning block whose `provider_data` holds this key.
pub(crate) const TOOL_CALL_EXTRA_KEY: &str = "openai_chat_tool_call_extra";

/// Where OpenRouter's `reasoning_details` are kept on the assistant message: a reasoning block
/// whose `provider_data` holds this key.
pub(crate) const REASONING_DETAILS_KEY: &str = "openai_chat_reasoning_details";

/// Adds one streamed piece of reasoning details to those so far: a piece with the `index` and
/// type of a block goes on from it (its text, summary or data joined, its other fields, such as
/// the signature that comes last, set), any other is a block of its own.
fn add_reasoning_detail(details: &mut Vec<Value>, piece: Value) {
    let Value::Object(piece) = piece else {
        return;
    };
    let same = |d: &&mut Value| {
        piece.get("index").is_some_and(|i| !i.is_null())
            && d.get("index") == piece.get("index")
            && d.get("type") == piece.get("type")
    };
    let Some(Value::Object(block)) = details.iter_mut().find(same) else {
        details.push(Value::Object(piece));
        return;
    };
    for (key, value) in piece {
        match (block.get_mut(&key), value) {
            (Some(Value::String(so_far)), Value::String(more))
                if matches!(key.as_str(), "text" | "summary" | "data") =>
            {
                so_far.push_str(&more);
            }
            (_, Value::Null) => {}
            (_, value) => {
                block.insert(key, value);
            }
        }
    }
}

impl ChatStreamParser {
    /// A parser for a stream from `provider` (named in errors).
    pub fn new(provider: &str) -> Self {
        ChatStreamParser {
            provider: provider.to_owned(),
            started: false,
            slots: Vec::new(),
            by_id: HashMap::new(),
            by_wire: HashMap::new(),
            saw_tool_call: false,
            saw_refusal: false,
            saw_answer: false,
            finish: None,
            done: false,
            dialect: None,
            reasoning_details: Vec::new(),
            pairs: Pairs::default(),
            strict: None,
            legacy_call: None,
            think: ThinkTags::Undecided(String::new()),
        }
    }

    /// Reads the answer to a request sent in strict mode with these original schemas (each
    /// tool's by its name, and the output's): the nulls strict mode made the model write for the
    /// optional properties it left out are taken out of the calls' arguments and the structured
    /// answer, which are then held until the response ends.
    pub fn with_strict_schemas(
        mut self,
        tools: impl IntoIterator<Item = (String, Value)>,
        output: Option<Value>,
    ) -> Self {
        let text = output.as_ref().map(|_| String::new());
        self.strict = Some(StrictSchemas {
            tools: tools.into_iter().collect(),
            output,
            arguments: BTreeMap::new(),
            text,
        });
        self
    }

    /// Reads the text's tool calls in this plain-text dialect (none: the text is all text),
    /// knowing no tool: only a dialect's own shapes are read
    /// ([`ChatStreamParser::with_dialect_tools`] names the request's tools).
    pub fn with_dialect(self, dialect: Option<ToolDialect>) -> Self {
        self.with_dialect_tools(dialect, std::iter::empty::<String>())
    }

    /// Reads the text's tool calls in this plain-text dialect, for a request that offered these
    /// tools: a shape that is not the dialect's own (all of them, for `auto`) is a call only
    /// when it names one of them.
    pub fn with_dialect_tools(
        mut self,
        dialect: Option<ToolDialect>,
        tools: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.dialect = dialect.map(|d| DialectReader::new(d, tools.into_iter().map(Into::into)));
        self
    }

    /// Holds a block of the dialect's text (a call not whole yet) for at most `bytes`: one that
    /// does not end within them is no call, and it and the rest of the answer are text, with a
    /// warning. The default is 16 MiB; set it after the dialect.
    pub fn with_dialect_max_block(mut self, bytes: usize) -> Self {
        self.dialect = self.dialect.map(|d| d.with_max_block(bytes));
        self
    }

    /// The text ended: a character whose second half never came is U+FFFD, the dialect reader
    /// gives up what it held (a call the output limit cut as a cut call), and a response whose
    /// calls were all in its text finishes as tool calls.
    fn close_dialect(&mut self, out: &mut VecDeque<ModelEvent>) {
        for event in self.pairs.flush_all() {
            self.emit(event, out);
        }
        self.release_strict(out);
        let cut_by_the_limit = matches!(self.finish, Some((FinishReason::Length, _)));
        let Some(reader) = &mut self.dialect else {
            return;
        };
        reader.finish(out, cut_by_the_limit);
        if reader.calls() > 0 {
            self.saw_tool_call = true;
            if let Some((reason, _)) = &mut self.finish
                && *reason == FinishReason::Stop
            {
                *reason = FinishReason::ToolCalls;
            }
        }
    }

    /// Emits a delta, the text through the dialect reader when there is one; held, of a strict
    /// request, when it may hold a null strict mode added.
    fn emit(&mut self, event: ModelEvent, out: &mut VecDeque<ModelEvent>) {
        let event = match (event, &mut self.strict) {
            (
                ModelEvent::TextDelta(text),
                Some(StrictSchemas {
                    text: Some(held), ..
                }),
            ) => {
                held.push_str(&text);
                return;
            }
            (ModelEvent::ToolCallDelta { index, arguments }, Some(strict)) => {
                strict
                    .arguments
                    .entry(index)
                    .or_default()
                    .push_str(&arguments);
                return;
            }
            (event, _) => event,
        };
        match (event, &mut self.dialect) {
            (ModelEvent::TextDelta(text), Some(reader)) => reader.push(&text, out),
            (event, _) => out.push_back(event),
        }
    }

    /// The answer of a strict request ended: what was held goes on, without the nulls strict mode
    /// added (as the model wrote it when it parses to nothing else).
    fn release_strict(&mut self, out: &mut VecDeque<ModelEvent>) {
        let Some(strict) = &mut self.strict else {
            return;
        };
        let arguments = std::mem::take(&mut strict.arguments);
        let text = strict.text.take();
        for (index, arguments) in arguments {
            let schema = usize::try_from(index)
                .ok()
                .and_then(|at| self.slots.get(at))
                .and_then(|slot| strict.tools.get(slot.name.as_str()));
            out.push_back(ModelEvent::ToolCallDelta {
                index,
                arguments: without_strict_nulls(arguments, schema),
            });
        }
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            let text = without_strict_nulls(text, strict.output.as_ref());
            self.emit(ModelEvent::TextDelta(text), out);
        }
    }

    /// Passes on a piece of the answer's text, what a `<think>` block it opened with holds as
    /// reasoning.
    fn content_text(&mut self, text: String, out: &mut VecDeque<ModelEvent>) {
        let mut text = match &mut self.think {
            ThinkTags::Text => return self.emit(ModelEvent::TextDelta(text), out),
            ThinkTags::Undecided(held) => {
                let joined = if held.is_empty() {
                    text
                } else {
                    held.push_str(&text);
                    std::mem::take(held)
                };
                let start = joined.trim_start();
                if let Some(rest) = start.strip_prefix(THINK_OPEN) {
                    let rest = rest.to_owned();
                    self.think = ThinkTags::Inside(String::new());
                    rest
                } else if THINK_OPEN.starts_with(start) {
                    self.think = ThinkTags::Undecided(joined);
                    return;
                } else {
                    self.think = ThinkTags::Text;
                    return self.emit(ModelEvent::TextDelta(joined), out);
                }
            }
            ThinkTags::Inside(_) => text,
            ThinkTags::Closed => {
                let rest = text.trim_start();
                if rest.is_empty() {
                    return;
                }
                self.think = ThinkTags::Text;
                return self.emit(ModelEvent::TextDelta(rest.to_owned()), out);
            }
        };
        let ThinkTags::Inside(held) = &mut self.think else {
            return;
        };
        held.push_str(&text);
        text = std::mem::take(held);
        if let Some(at) = text.find(THINK_CLOSE) {
            let after = text.split_off(at);
            if !text.is_empty() {
                out.push_back(ModelEvent::ReasoningDelta(text));
            }
            self.think = ThinkTags::Closed;
            let after = after
                .get(THINK_CLOSE.len()..)
                .unwrap_or_default()
                .to_owned();
            if !after.is_empty() {
                self.content_text(after, out);
            }
            return;
        }
        // What may be the start of the closing tag waits for the next piece.
        let keep = (1..THINK_CLOSE.len())
            .rev()
            .find(|&n| {
                text.len()
                    .checked_sub(n)
                    .and_then(|from| text.get(from..))
                    .is_some_and(|end| THINK_CLOSE.starts_with(end))
            })
            .unwrap_or(0);
        let tail = text.split_off(text.len().saturating_sub(keep));
        if !text.is_empty() {
            out.push_back(ModelEvent::ReasoningDelta(text));
        }
        *held = tail;
    }

    /// The text ended: what a `<think>` block left held goes on (the text that only began like
    /// the tag as text, a block never closed as reasoning).
    fn release_think(&mut self, out: &mut VecDeque<ModelEvent>) {
        match std::mem::replace(&mut self.think, ThinkTags::Text) {
            ThinkTags::Undecided(held) if !held.is_empty() => {
                self.emit(ModelEvent::TextDelta(held), out);
            }
            ThinkTags::Inside(held) if !held.is_empty() => {
                out.push_back(ModelEvent::ReasoningDelta(held));
            }
            _ => {}
        }
    }

    /// The slot a tool-call delta belongs to, opening one when it begins a call.
    fn slot(
        &mut self,
        wire: Option<u32>,
        id: Option<&Arc<str>>,
        named: bool,
        whole: bool,
    ) -> usize {
        let known_wire = wire
            .and_then(|w| self.by_wire.get(&w))
            .and_then(|at| at.last().copied());
        let found = if whole {
            None
        } else if let Some(id) = id {
            match self.by_id.get(&**id).copied() {
                // A named fragment at another index than the call its id names is another call
                // that reuses the id: DeepSeek and GLM give parallel calls one id.
                // Its later fragments go by their index where the id and the index disagree.
                Some(at) if self.at_another_index(at, wire) => {
                    if named {
                        None
                    } else {
                        known_wire.or(Some(at))
                    }
                }
                Some(at) => Some(at),
                // An id first seen on a fragment that names no tool continues a call, since a
                // new call would open with its name: at its index, the call there, whatever id
                // it has (Poolside and mlx-openai-server give the arguments an id of their
                // own); without one, the newest call, when it was opened without an id (its
                // id, arriving late).
                None if named => None,
                None => match wire {
                    Some(_) => known_wire,
                    None => self
                        .slots
                        .len()
                        .checked_sub(1)
                        .filter(|&at| self.slots.get(at).is_some_and(|s| s.id.is_empty())),
                },
            }
        } else if wire.is_some() {
            known_wire
        } else if named {
            None
        } else {
            self.slots.len().checked_sub(1)
        };
        // A new call with an id another call already has: results are paired with calls by
        // id, so it takes none of its own (the run gives it one), and the id's later fragments
        // continue it, the newest.
        let reused = found.is_none() && id.is_some_and(|id| self.by_id.contains_key(&**id));
        let at = match found {
            Some(at) => at,
            None => {
                // The id and the wire index are set below, with their maps.
                self.slots.push(CallSlot {
                    id: Arc::default(),
                    name: SmolStr::default(),
                    wire_index: None,
                    extra_content: None,
                    reused_id: reused,
                    arguments: Digest::default(),
                    open: OpenJson::default(),
                    restated: None,
                });
                self.slots.len().saturating_sub(1)
            }
        };
        if let Some(slot) = self.slots.get_mut(at) {
            // A reused index now continues the newest call opened at it.
            if let Some(w) = wire
                && slot.wire_index != wire
            {
                if let Some(old) = slot.wire_index
                    && let Some(slots) = self.by_wire.get_mut(&old)
                {
                    slots.remove(&at);
                }
                slot.wire_index = wire;
                self.by_wire.entry(w).or_default().insert(at);
            }
            // The call keeps its first id; a later one is another name for it, so that the
            // fragments that carry it land here too.
            if let Some(id) = id
                && slot.reused_id
            {
                self.by_id.insert(Arc::clone(id), at);
            } else if let Some(id) = id
                && (slot.id.is_empty() || slot.id != *id)
            {
                if slot.id.is_empty() {
                    slot.id = Arc::clone(id);
                }
                let first = self.by_id.entry(Arc::clone(id)).or_insert(at);
                *first = (*first).min(at);
            }
        }
        at
    }

    /// True when the call at `at` was opened or last continued at a wire index other than
    /// `wire` (both known).
    fn at_another_index(&self, at: usize, wire: Option<u32>) -> bool {
        let slot_wire = self.slots.get(at).and_then(|s| s.wire_index);
        wire.is_some() && slot_wire.is_some() && slot_wire != wire
    }

    /// The calls' provider data, as a reasoning block the next request sends back; OpenRouter's
    /// reasoning details before it, as one of their own.
    fn flush_extras(&mut self, out: &mut VecDeque<ModelEvent>) {
        if !self.reasoning_details.is_empty() {
            let details = std::mem::take(&mut self.reasoning_details);
            out.push_back(ModelEvent::Reasoning(agentloop::message::Reasoning {
                text: String::new(),
                signature: None,
                provider_data: Some(serde_json::json!({ REASONING_DETAILS_KEY: details })),
            }));
        }
        let extras: Vec<Value> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter_map(|(position, slot)| {
                slot.extra_content.take().map(|extra| {
                    serde_json::json!({"position": position, "id": &*slot.id, "extra_content": extra})
                })
            })
            .collect();
        if !extras.is_empty() {
            out.push_back(ModelEvent::Reasoning(agentloop::message::Reasoning {
                text: String::new(),
                signature: None,
                provider_data: Some(serde_json::json!({ TOOL_CALL_EXTRA_KEY: extras })),
            }));
        }
    }

    /// Applies one event's data.
    pub fn push(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if self.done {
            return Err(stream_error(&self.provider, "data after [DONE]"));
        }
        if data == "[DONE]" {
            self.done = true;
            return self.emit_finish(out);
        }
        // A keep-alive comment sent as data (`data: : keepalive`, Vertex's partner models): no
        // JSON chunk begins with a colon.
        if data.starts_with(':') {
            return Ok(());
        }
        // A lone half of a character in a field read whole (an id, a name, a list of content
        // parts) costs that character, not the chunk, nor a delta's half of a split one.
        let mut repaired = None;
        let chunk: WireCompletion<'_> = surrogates::event_from_str(data, &mut repaired, |t| {
            serde_json::from_str::<WireCompletion<'_>>(t).map(drop)
        })
        .map_err(|e| stream_error(&self.provider, format!("malformed stream chunk: {e}")))?;
        self.apply(chunk, out, false)
    }

    /// Applies a parsed chunk (or a whole response, whose choices carry `message`).
    fn apply(
        &mut self,
        chunk: WireCompletion<'_>,
        out: &mut VecDeque<ModelEvent>,
        whole: bool,
    ) -> Result<(), ModelError> {
        if let Some(error) = &chunk.error {
            let said = error
                .get("message")
                .and_then(Value::as_str)
                .filter(|m| is_unparsed_tool_output(m));
            // llama-server reads the model's calls as it writes them and streams each one it
            // read, then judges the whole output at its end: text the model wrote after its
            // calls (a closing code fence, a remark) fails that judgement, and the stream ends
            // in this error after calls it already gave. Those calls are what the model asked
            // for, and a retry cannot go back on what was streamed: they are the answer, as a
            // cut call is (the run checks each one's arguments as it would any other), and the
            // server's refusal is said, not hidden.
            if let Some(said) = said.filter(|_| self.saw_tool_call) {
                let said: String = said.chars().take(200).collect();
                out.push_back(ModelEvent::Warning(format!(
                    "the server refused the model's output after the tool calls it streamed \
                     ({said}): those calls are the answer"
                )));
                self.finish = Some((FinishReason::ToolCalls, "error".to_owned()));
                return Ok(());
            }
            return Err(in_body_error(&self.provider, error));
        }
        // Azure's content-filter chunks carry an empty id and model: they start nothing.
        let id = chunk.id.filter(|s| !s.is_empty());
        let model = chunk.model.filter(|s| !s.is_empty());
        if !self.started && (id.is_some() || model.is_some()) {
            self.started = true;
            out.push_back(ModelEvent::Start {
                id: id.map(Cow::into_owned),
                model: model.map(Cow::into_owned),
            });
        }
        for choice in chunk.choices.into_iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta.or(choice.message) {
                self.delta(delta, out, whole);
            }
            if let Some(reason) = choice.finish_reason
                && !reason.is_empty()
            {
                if let Some((kind, why)) = interruption(&reason) {
                    let mut error = ModelError::new(
                        kind,
                        format!("the server {why} (finish_reason {reason:?})"),
                    )
                    .with_provider(self.provider.as_str());
                    error.provider_code = Some(reason.into_owned());
                    return Err(error);
                }
                let mapped = match map_finish_reason(&reason) {
                    FinishReason::Stop if self.saw_refusal => FinishReason::Refusal,
                    // vLLM (a named tool_choice) and Ollama say `stop` after calling tools; the
                    // calls are what the answer is.
                    FinishReason::Stop if self.saw_tool_call => FinishReason::ToolCalls,
                    other => other,
                };
                self.finish = Some((mapped, reason.into_owned()));
            }
        }
        if let Some(usage) = chunk.usage.or_else(|| chunk.x_groq.and_then(|g| g.usage)) {
            out.push_back(ModelEvent::Usage(usage.to_usage()));
        }
        Ok(())
    }

    fn delta(&mut self, delta: WireDelta<'_>, out: &mut VecDeque<ModelEvent>, whole: bool) {
        let (content, part_reasoning) = match delta.content {
            Some(c) => (Some(c.text), Some(c.reasoning)),
            None => (None, None),
        };
        // A server may mirror one text into both fields (StepFun, relays): one of them is read.
        let wire_reasoning = match (delta.reasoning_content, delta.reasoning) {
            (Some(content), _) if !content.is_empty() => Some(content),
            (_, other) => other,
        };
        for reasoning in wire_reasoning
            .into_iter()
            .chain(part_reasoning.map(WireText::plain))
        {
            if !reasoning.is_empty() {
                self.saw_answer = true;
                let text = self.pairs.join(Channel::Reasoning, reasoning);
                if !text.is_empty() {
                    out.push_back(ModelEvent::ReasoningDelta(text));
                }
            }
        }
        if let Some(Value::Array(pieces)) = delta.reasoning_details {
            for piece in pieces {
                add_reasoning_detail(&mut self.reasoning_details, piece);
            }
        }
        if delta.refusal.as_ref().is_some_and(|r| !r.is_empty()) {
            self.saw_refusal = true;
            self.saw_answer = true;
        }
        if let Some(text) = content.filter(|t| !t.is_empty()) {
            self.saw_answer = true;
            let text = self.pairs.join(Channel::Text, text);
            if !text.is_empty() {
                self.content_text(text, out);
            }
        }
        if let Some(refusal) = delta.refusal.filter(|t| !t.is_empty()) {
            let text = self.pairs.join(Channel::Text, refusal);
            if !text.is_empty() {
                out.push_back(ModelEvent::TextDelta(text));
            }
        }
        let legacy = delta.function_call.map(|function| WireToolCallIn {
            index: None,
            id: None,
            function: Some(function),
            extra_content: None,
        });
        let calls = delta.tool_calls.into_iter().flatten().map(|c| (c, false));
        for (call, is_legacy) in calls.chain(legacy.map(|c| (c, true))) {
            self.saw_tool_call = true;
            self.saw_answer = true;
            let (name, arguments) = match call.function {
                Some(f) => (f.name, f.arguments.map(|a| a.0)),
                None => (None, None),
            };
            // The id comes whole in a fragment, read into the `Arc` its slot and call share.
            let id = call.id.filter(|s| !s.is_empty());
            let name = name.filter(|s| !s.is_empty());
            let opened = self.slots.len();
            let at = match (is_legacy, self.legacy_call) {
                (true, Some(at)) => at,
                // Its first fragment opens a call of its own, named yet or not.
                (true, None) => self.slot(None, None, true, whole),
                (false, _) => self.slot(call.index, id.as_ref(), name.is_some(), whole),
            };
            if is_legacy {
                self.legacy_call = Some(at);
            }
            let first = at >= opened;
            // A name that comes again goes on from the call's: the same text restated (MiniMax
            // through NVIDIA NIM sends it with every fragment) is the name, other text is the
            // rest of it (servers that split a name as they split the arguments).
            let name = match (name, self.slots.get_mut(at)) {
                (Some(piece), Some(slot)) => {
                    if slot.name.is_empty() || slot.name == *piece {
                        slot.name = SmolStr::new(&*piece);
                    } else {
                        slot.name = SmolStr::from(format!("{}{piece}", slot.name));
                    }
                    Some(slot.name.clone())
                }
                (name, _) => name.map(|n| SmolStr::new(&*n)),
            };
            if let Some(extra) = call.extra_content
                && let Some(slot) = self.slots.get_mut(at)
            {
                slot.extra_content = Some(extra);
            }
            let index = u32::try_from(at).unwrap_or(u32::MAX);
            // The call's own id, not another name it was given later.
            let id = id.and_then(|_| self.slots.get(at).map(|s| Arc::clone(&s.id)));
            if first || id.is_some() || name.is_some() {
                out.push_back(ModelEvent::ToolCallStart {
                    index,
                    id: id.unwrap_or_default(),
                    name: name.unwrap_or_default(),
                });
            }
            if let Some(arguments) = arguments
                && !arguments.is_empty()
            {
                let arguments = self.pairs.join(Channel::Arguments(index), arguments);
                if !arguments.is_empty() {
                    self.call_arguments(at, arguments, whole, out);
                }
            }
        }
    }

    /// Passes on a fragment of the arguments of the call at `at`, or holds it when it may
    /// restate them: vLLM's end-of-stream flush (GLM, xLAM parsers) and some gateways send the
    /// whole arguments again as the last fragment after streaming them, and read on, the call's
    /// arguments would be the object twice (`{..}{..}`), or a piece and then the object.
    fn call_arguments(
        &mut self,
        at: usize,
        arguments: String,
        whole: bool,
        out: &mut VecDeque<ModelEvent>,
    ) {
        let index = u32::try_from(at).unwrap_or(u32::MAX);
        let Some(slot) = self.slots.get_mut(at).filter(|_| !whole) else {
            self.emit(ModelEvent::ToolCallDelta { index, arguments }, out);
            return;
        };
        // A fragment came after the held one: that one was the arguments' next piece.
        let held = slot.restated.take();
        if let Some(held) = &held {
            slot.arguments.add(held.as_bytes());
            slot.open.add(held.as_bytes());
        }
        let restates = slot.arguments.len > 0
            && arguments
                .as_bytes()
                .get(..slot.arguments.len)
                .is_some_and(|head| Digest::of(head) == slot.arguments)
            && is_json_object(&arguments);
        let pass = if restates {
            slot.restated = Some(arguments);
            None
        } else {
            slot.arguments.add(arguments.as_bytes());
            slot.open.add(arguments.as_bytes());
            Some(arguments)
        };
        for arguments in held.into_iter().chain(pass) {
            self.emit(ModelEvent::ToolCallDelta { index, arguments }, out);
        }
    }

    /// The response ended: a held fragment that began with a call's arguments so far and is a
    /// whole object restated them when the two joined are no JSON (a stream whose joined
    /// arguments parse is passed on as it came): only the rest of it goes on, with a warning.
    fn release_restated(&mut self, out: &mut VecDeque<ModelEvent>) {
        let mut events = Vec::new();
        for (at, slot) in self.slots.iter_mut().enumerate() {
            let Some(held) = slot.restated.take() else {
                continue;
            };
            let index = u32::try_from(at).unwrap_or(u32::MAX);
            // The held fragment begins with the arguments so far: the two joined are its head
            // and then it.
            let head = held.get(..slot.arguments.len).unwrap_or_default();
            let joined = format!("{head}{held}");
            if serde_json::from_str::<serde::de::IgnoredAny>(&joined).is_ok() {
                slot.open.add(held.as_bytes());
                events.push(ModelEvent::ToolCallDelta {
                    index,
                    arguments: held,
                });
                continue;
            }
            let rest = held
                .get(slot.arguments.len..)
                .unwrap_or_default()
                .to_owned();
            events.push(ModelEvent::Warning(format!(
                "the server sent the arguments of tool call {index} ({}) again whole after \
                 streaming them: they are read once",
                slot.name
            )));
            if !rest.is_empty() {
                slot.open.add(rest.as_bytes());
                events.push(ModelEvent::ToolCallDelta {
                    index,
                    arguments: rest,
                });
            }
        }
        for event in events {
            self.emit(event, out);
        }
    }

    fn emit_finish(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.release_think(out);
        self.release_restated(out);
        self.close_dialect(out);
        self.flush_extras(out);
        match self.finish.take() {
            Some((reason, raw)) => out.push_back(ModelEvent::Finish {
                reason,
                raw: Some(raw),
            }),
            // Nothing but `[DONE]`: no answer came, whatever failed before it (an error the
            // server sent in a shape not read here, a relay that lost its upstream). Read as an
            // empty answer, it would finish a run with no output.
            None if !self.saw_answer => {
                return Err(stream_error(
                    &self.provider,
                    "the stream carried no answer: [DONE] came without text, a tool call or a finish_reason",
                ));
            }
            // No one said the answer was whole, and a call's JSON stops inside a value: the
            // stream was cut there (a relay that lost its upstream and ended the stream itself),
            // as one that ends there without `[DONE]` is, and is retried as that one is. Kept,
            // the call would fail its validation, and the model be told it wrote what it never
            // did. Closed JSON that does not parse is the model's own, and stays its call.
            None if self.slots.iter().any(|s| s.open.is_open()) => {
                let cut = self.slots.iter().position(|s| s.open.is_open());
                let name = cut
                    .and_then(|at| self.slots.get(at))
                    .map_or("", |s| s.name.as_str());
                return Err(stream_cut(
                    &self.provider,
                    format!(
                        "the stream ended with [DONE] but no finish_reason, inside the arguments \
                         of tool call {} ({name}): cut short",
                        cut.unwrap_or_default()
                    ),
                ));
            }
            None => {
                out.push_back(ModelEvent::Warning(
                    "the stream ended with [DONE] but no finish_reason".to_owned(),
                ));
                let reason = if self.saw_tool_call {
                    FinishReason::ToolCalls
                } else if self.saw_refusal {
                    FinishReason::Refusal
                } else {
                    FinishReason::Stop
                };
                out.push_back(ModelEvent::Finish { reason, raw: None });
            }
        }
        Ok(())
    }

    /// The byte stream ended: finishes the response if the stream said it was complete, else
    /// fails.
    pub fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        self.release_think(out);
        self.release_restated(out);
        self.close_dialect(out);
        self.flush_extras(out);
        match self.finish.take() {
            Some((reason, raw)) => {
                out.push_back(ModelEvent::Finish {
                    reason,
                    raw: Some(raw),
                });
                Ok(())
            }
            None => Err(stream_cut(
                &self.provider,
                "the stream ended before a finish_reason or [DONE]",
            )),
        }
    }
}

impl StreamDecoder for ChatStreamParser {
    fn event(&mut self, data: &str, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        self.push(data, out)
    }

    /// Chat has no error events of its own: one named so (llama.cpp's `error:` field) is a
    /// failure, its data the error object (bare or in an envelope) or, not JSON, its message.
    fn error_event(
        &mut self,
        data: &str,
        _out: &mut VecDeque<ModelEvent>,
    ) -> Result<(), ModelError> {
        let mut repaired = None;
        let error = match surrogates::from_str::<Value>(data, &mut repaired) {
            Ok(Value::Object(mut map)) => match map.remove("error") {
                Some(inner) if !inner.is_null() => inner,
                _ => Value::Object(map),
            },
            Ok(other) if !other.is_null() => serde_json::json!({ "message": other.to_string() }),
            _ => serde_json::json!({ "message": data.trim() }),
        };
        Err(in_body_error(&self.provider, &error))
    }

    fn end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        ChatStreamParser::end(self, out)
    }

    fn over(&self) -> bool {
        self.done
    }

    /// A `finish_reason` came: a server that sends no `[DONE]` after it (nor, with usage asked
    /// for, anything after the usage chunk) has said all it will.
    fn whole_before_last_event(&self) -> Option<&'static str> {
        (!self.done && self.finish.is_some()).then_some("[DONE]")
    }

    /// A whole response is one chunk whose choices carry `message`; without a `finish_reason` it
    /// ends as the calls it made say.
    fn whole(&mut self, body: &[u8], out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        // A lone half of a character anywhere in the body (text, arguments, reasoning, an id)
        // is U+FFFD: one damaged character does not cost the answer.
        let mut repaired = None;
        let completion: WireCompletion<'_> = surrogates::from_slice(body, &mut repaired)
            .map_err(|e| decode_error(&self.provider, "response body", &e))?;
        let has_choice = completion
            .choices
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.index.unwrap_or(0) == 0));
        if completion.error.is_none() && !has_choice {
            return Err(
                ModelError::new(ModelErrorKind::Decode, "the response holds no choice")
                    .with_provider(self.provider.as_str()),
            );
        }
        self.apply(completion, out, true)?;
        self.done = true;
        self.close_dialect(out);
        self.flush_extras(out);
        let (reason, raw) = match self.finish.take() {
            Some((reason, raw)) => (reason, Some(raw)),
            None if self.saw_tool_call => (FinishReason::ToolCalls, None),
            None if self.saw_refusal => (FinishReason::Refusal, None),
            None => (FinishReason::Stop, None),
        };
        out.push_back(ModelEvent::Finish { reason, raw });
        Ok(())
    }
}

/// Whether `text` is one whole JSON object.
fn is_json_object(text: &str) -> bool {
    text.trim_start().starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// `json` without the nulls strict mode added for what `schema` leaves optional; as it came when
/// there is no schema, it is not JSON (a call the output limit cut), or nothing was taken out.
fn without_strict_nulls(json: String, schema: Option<&Value>) -> String {
    let Some(schema) = schema else {
        return json;
    };
    match serde_json::from_str::<Value>(&json) {
        Ok(mut value) => {
            if drop_strict_nulls(&mut value, schema) {
                value.to_string()
            } else {
                json
            }
        }
        Err(_) => json,
    }
}

/// Parses a whole Chat Completions event-stream body (the raw `text/event-stream` bytes) into a
/// response, through the same SSE reader, parser and accumulator as a live stream, without a
/// runtime. Arbitrary bytes give a response or an error, never a panic.
pub fn parse_stream_bytes(bytes: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_sse(bytes, "openai", ChatStreamParser::new("openai"))
}

/// Parses a whole (non-streamed) Chat Completions response body, through the stream parser and
/// the accumulator: the same rules (an empty id gets a generated one, a call cut off by the
/// length limit is dropped).
pub fn parse_completion(body: &[u8]) -> Result<ModelResponse, ModelError> {
    accumulate_whole(body, ChatStreamParser::new("openai"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn finish_reasons_map_to_the_shared_enum() {
        assert_eq!(map_finish_reason("stop"), FinishReason::Stop);
        assert_eq!(map_finish_reason("tool_calls"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("function_call"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("tool_call"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("length"), FinishReason::Length);
        assert_eq!(
            map_finish_reason("content_filter"),
            FinishReason::ContentFilter
        );
        assert_eq!(map_finish_reason("weird"), FinishReason::Other);
        // Gemini's own words, passed through by gateways.
        assert_eq!(map_finish_reason("MAX_TOKENS"), FinishReason::Length);
        assert_eq!(map_finish_reason("STOP"), FinishReason::Stop);
        assert_eq!(map_finish_reason("SAFETY"), FinishReason::ContentFilter);
        assert_eq!(map_finish_reason("RECITATION"), FinishReason::ContentFilter);
    }

    #[test]
    fn the_words_other_servers_end_with_map_to_what_they_mean() {
        for whole in ["eos", "eos_token", "normal", "COMPLETE", "end_turn"] {
            assert_eq!(map_finish_reason(whole), FinishReason::Stop, "{whole}");
        }
        for cut in [
            "model_length",
            "model_context_window_exceeded",
            "MAX_TOKENS",
        ] {
            assert_eq!(map_finish_reason(cut), FinishReason::Length, "{cut}");
        }
        for filtered in [
            "MODEL_ARMOR",
            "IMAGE_PROHIBITED_CONTENT",
            "guardrail_intervened",
        ] {
            assert_eq!(
                map_finish_reason(filtered),
                FinishReason::ContentFilter,
                "{filtered}"
            );
        }
        for failed in ["error", "MALFORMED_FUNCTION_CALL", "TOO_MANY_TOOL_CALLS"] {
            assert_eq!(map_finish_reason(failed), FinishReason::Error, "{failed}");
        }
        for unknown in ["OTHER", "FINISH_REASON_UNSPECIFIED", "a_word_of_tomorrow"] {
            assert_eq!(map_finish_reason(unknown), FinishReason::Other, "{unknown}");
        }
    }

    fn run(chunks: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        let mut p = ChatStreamParser::new("openai");
        let mut out = VecDeque::new();
        for c in chunks {
            p.push(c, &mut out)?;
        }
        p.end(&mut out)?;
        Ok(out.into_iter().collect())
    }

    #[test]
    fn finish_is_held_until_the_trailing_usage_chunk_is_read() {
        let events = run(&[
            r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            "[DONE]",
        ])
        .unwrap();
        let kinds: Vec<_> = events.iter().map(std::mem::discriminant).collect();
        assert!(matches!(
            events.last(),
            Some(ModelEvent::Finish {
                reason: FinishReason::Stop,
                ..
            })
        ));
        let usage_at = events
            .iter()
            .position(|e| matches!(e, ModelEvent::Usage(_)))
            .unwrap();
        assert_eq!(usage_at, kinds.len() - 2);
    }

    #[test]
    fn an_id_arriving_after_its_calls_name_joins_that_call() {
        // The name first, the id on a later fragment of the same index (or, without an index, of
        // the newest call): one call, not a nameless second one.
        for index in [r#""index":0,"#, ""] {
            let chunk = |call: &str, finish: &str| {
                format!(
                    r#"{{"id":"c","choices":[{{"index":0,"delta":{{"tool_calls":[{{{index}{call}}}]}}{finish}}}]}}"#
                )
            };
            let body = [
                chunk(
                    r#""type":"function","function":{"name":"f","arguments":""}"#,
                    "",
                ),
                chunk(r#""id":"call_1","function":{"arguments":"{\"a\":"}"#, ""),
                chunk(
                    r#""function":{"arguments":"1}"}"#,
                    r#","finish_reason":"tool_calls""#,
                ),
            ]
            .map(|c| format!("data: {c}\n\n"))
            .concat();
            let r = parse_stream_bytes(body.as_bytes()).unwrap();
            assert_eq!(r.message.tool_calls.len(), 1, "{index}");
            let call = &r.message.tool_calls[0];
            assert_eq!(
                (&*call.call_id, call.tool.as_str(), call.arguments.as_str()),
                ("call_1", "f", r#"{"a":1}"#)
            );
        }
        // A named fragment with a new id is a new call, even at a reused index.
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        );
        let r = parse_stream_bytes(body.as_bytes()).unwrap();
        let names: Vec<&str> = r
            .message
            .tool_calls
            .iter()
            .map(|c| c.tool.as_str())
            .collect();
        assert_eq!(names, ["f", "g"]);
    }

    #[test]
    fn a_stream_without_finish_or_done_is_an_error() {
        let err =
            run(&[r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream);
    }

    #[test]
    fn an_error_object_in_a_chunk_becomes_a_classified_error() {
        let err = run(&[
            r#"{"error":{"message":"The server had an error","type":"server_error","code":null}}"#,
        ])
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Server);
        assert_eq!(err.message, "The server had an error");
        let err =
            run(&[r#"{"error":{"message":"Provider returned error","code":429}}"#]).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited);
        assert_eq!(err.status, None);
    }

    #[test]
    fn a_local_servers_refusal_after_the_calls_it_streamed_leaves_those_calls_as_the_answer() {
        let refused = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#;
        let call = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"add","arguments":"{\"a\": 1}"}}]}}]}"#;
        let fence = r#"{"choices":[{"index":0,"delta":{"content":"```json\n"}}]}"#;
        let events = run(&[fence, call, refused]).unwrap();
        assert!(
            events.iter().any(|e| matches!(e, ModelEvent::Warning(w)
                if w.contains("peg-native format") && w.contains("those calls are the answer"))),
            "{events:?}"
        );
        assert!(
            matches!(
                events.last(),
                Some(ModelEvent::Finish {
                    reason: FinishReason::ToolCalls,
                    ..
                })
            ),
            "{events:?}"
        );
        // Before any call, the refusal is the error it was (a sampled request retries it).
        let err = run(&[fence, refused]).unwrap_err();
        assert!(err.message.contains("peg-native format"), "{err:?}");
        // Another error after a call is no answer.
        let other = r#"{"error":{"code":500,"message":"out of memory","type":"server_error"}}"#;
        assert!(run(&[call, other]).is_err());
    }

    #[test]
    fn a_stream_with_no_answer_before_done_is_an_error_and_an_empty_answer_that_says_stop_is_one() {
        for chunks in [
            &["[DONE]"][..],
            &[
                r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
                "[DONE]",
            ],
        ] {
            let err = run(chunks).unwrap_err();
            assert_eq!(err.kind, ModelErrorKind::Stream, "{chunks:?}");
            assert!(err.message.contains("no answer"), "{err}");
        }
        // A legitimate empty answer: the server says it stopped.
        let events = run(&[
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert!(matches!(
            events.last(),
            Some(ModelEvent::Finish {
                reason: FinishReason::Stop,
                ..
            })
        ));
        // Text without a finish reason is still an answer, with a warning.
        let events = run(&[
            r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert!(events.iter().any(|e| matches!(e, ModelEvent::Warning(_))));
    }

    #[test]
    fn an_error_field_outside_the_data_is_a_classified_error_not_an_empty_answer() {
        // llama.cpp before ggml-org/llama.cpp#16109: `error:` in place of `data:`, then [DONE].
        let body = concat!(
            "error: {\"code\":400,\"message\":\"the request exceeds the available context size, try increasing it\",\"type\":\"exceed_context_size_error\"}\n\n",
            "data: [DONE]\n\n",
        );
        let err = parse_stream_bytes(body.as_bytes()).unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::ContextLength, "{err}");
        // In an envelope, or not JSON at all.
        let err = parse_stream_bytes(
            b"error: {\"error\":{\"message\":\"busy\",\"code\":503}}\n\ndata: [DONE]\n\n",
        )
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Server, "{err}");
        let err = parse_stream_bytes(b"error: model crashed\n\ndata: [DONE]\n\n").unwrap_err();
        assert!(err.message.contains("model crashed"), "{err}");
    }

    #[test]
    fn reasoning_mirrored_in_both_fields_is_read_once() {
        let events = run(&[
            r#"{"choices":[{"index":0,"delta":{"reasoning":"ab","reasoning_content":"ab"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"c","reasoning_content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        let reasoning: String = events
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ReasoningDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning, "abc");
    }

    #[test]
    fn a_legacy_function_call_is_one_call_however_its_fragments_come_and_cut_it_never_runs() {
        let chunk = |call: &str, finish: &str| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"function_call\":{call}}}{finish}}}]}}\n\n"
            )
        };
        // The name restated with every fragment, as some servers send it: one call.
        let body = [
            chunk(r#"{"name":"f","arguments":"{\"a\":"}"#, ""),
            chunk(r#"{"name":"f","arguments":"1}"}"#, ""),
            chunk("{}", r#","finish_reason":"function_call""#),
        ]
        .concat();
        let r = parse_stream_bytes(body.as_bytes()).unwrap();
        let calls: Vec<(&str, &str, &str)> = r
            .message
            .tool_calls
            .iter()
            .map(|c| (&*c.call_id, c.tool.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("", "f", r#"{"a":1}"#)]);
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        // Cut by the output limit: dropped, the response truncated.
        let body = [
            chunk(r#"{"name":"f","arguments":"{\"a\":"}"#, ""),
            chunk("{}", r#","finish_reason":"length""#),
        ]
        .concat();
        let r = parse_stream_bytes(body.as_bytes()).unwrap();
        assert!(r.message.tool_calls.is_empty());
        assert!(r.truncated);
    }

    #[test]
    fn a_fragment_that_begins_with_the_arguments_so_far_is_their_next_piece_when_more_follow() {
        // `{"k":` then `{"k":"x"}` (a whole object that begins with what came before) then `}`:
        // the arguments are the nested object, passed on as they came, with no warning.
        let call = |args: &str| {
            format!(
                r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}}}}]}}"#,
                serde_json::Value::String(args.to_owned())
            )
        };
        let first = r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"f","arguments":""}}]}}]}"#;
        let pieces = [call(r#"{"k":"#), call(r#"{"k":"x"}"#), call("}")];
        let end = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
        let mut body = format!("data: {first}\n\n");
        for piece in &pieces {
            body.push_str(&format!("data: {piece}\n\n"));
        }
        body.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
        let r = parse_stream_bytes(body.as_bytes()).unwrap();
        assert_eq!(r.message.tool_calls[0].arguments, r#"{"k":{"k":"x"}}"#);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn only_a_think_block_that_opens_the_text_is_reasoning() {
        let read = |pieces: &[&str], finish: &str| {
            let mut body = String::new();
            for piece in pieces {
                let chunk = serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {"content": piece}}]});
                body.push_str(&format!("data: {chunk}\n\n"));
            }
            let end = serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
            body.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
            let r = parse_stream_bytes(body.as_bytes()).unwrap();
            let reasoning: String = r
                .message
                .reasoning
                .iter()
                .map(|x| x.text.as_str())
                .collect();
            (r.message.text, reasoning)
        };
        // Text that begins like the tag, or names it later, is text.
        assert_eq!(
            read(&["<th", "ought>x"], "stop"),
            ("<thought>x".into(), String::new())
        );
        assert_eq!(
            read(&["Use <think>", " tags"], "stop"),
            ("Use <think> tags".into(), String::new())
        );
        assert_eq!(read(&[" ", "<t"], "stop"), (" <t".into(), String::new()));
        // A block cut by the output limit is all reasoning; one closed in the same piece as the
        // answer leaves the answer.
        assert_eq!(
            read(&["<think>a </", "thin"], "length"),
            (String::new(), "a </thin".into())
        );
        assert_eq!(
            read(&["\n<think>a</think> b"], "stop"),
            ("b".into(), "a".into())
        );
    }

    #[test]
    fn data_after_done_is_an_error() {
        assert!(run(&["[DONE]", r#"{"choices":[]}"#]).is_err());
    }

    #[test]
    fn a_whole_response_whose_calls_share_an_id_leaves_the_later_ones_to_the_run() {
        // DeepSeek and GLM give parallel calls one id: each call is kept, and only the first
        // keeps the id (two results under one id could not be told apart).
        let body = br#"{"id":"r","model":"deepseek-chat","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"call_0","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},
                          {"id":"call_0","type":"function","function":{"name":"g","arguments":"{\"b\":2}"}}]},"finish_reason":"tool_calls"}]}"#;
        let response = parse_completion(body).unwrap();
        let calls: Vec<(&str, &str, &str)> = response
            .message
            .tool_calls
            .iter()
            .map(|c| (&*c.call_id, c.tool.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [("call_0", "f", r#"{"a":1}"#), ("", "g", r#"{"b":2}"#)]
        );
    }

    #[test]
    fn whole_response_with_object_arguments_keeps_their_json_text_and_leaves_the_id_to_the_run() {
        let body = br#"{"id":"r","model":"llama3","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"tool_calls"}]}"#;
        let response = parse_completion(body).unwrap();
        let call = &response.message.tool_calls[0];
        assert_eq!(call.arguments, r#"{"a":1}"#);
        // A missing id is filled by the run from its injected id source (replays stay exact).
        assert_eq!(&*call.call_id, "");
        assert_eq!(response.model.as_deref(), Some("llama3"));
    }

    #[test]
    fn whole_response_cut_off_inside_a_call_drops_it_and_says_truncated() {
        let body = br#"{"choices":[{"index":0,"message":{"content":"x","tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\": [1,"}}]},"finish_reason":"length"}],
            "usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":3}}}"#;
        let response = parse_completion(body).unwrap();
        assert!(response.truncated);
        assert!(response.message.tool_calls.is_empty());
        assert_eq!(response.finish_reason, FinishReason::Length);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 5,
                output_tokens: 7,
                cached_input_tokens: 2,
                cache_write_tokens: 0,
                reasoning_tokens: 3
            }
        );
    }

    #[test]
    fn whole_response_without_choices_is_a_decode_error() {
        assert_eq!(
            parse_completion(br#"{"id":"x","choices":[]}"#)
                .unwrap_err()
                .kind,
            ModelErrorKind::Decode
        );
        assert_eq!(
            parse_completion(b"<html>").unwrap_err().kind,
            ModelErrorKind::Decode
        );
    }
}
