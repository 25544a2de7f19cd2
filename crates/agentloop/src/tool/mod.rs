//! Tools are values: a [`ToolSpec`] (name, description, input schema, mode, flags) and an async
//! handler. They come from `#[tool]` functions, from [`Tool::builder`] over a typed argument, or from
//! a JSON Schema value ([`Tool::dynamic`]). A [`ToolSet`] checks names and compiles schemas once, at
//! registration, so that validating a call is a lookup and a schema walk.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

mod layer;

pub(crate) use layer::{Layered, panic_message};

use crate::event::{Event, EventKind, EventSink};
use crate::message::ToolContent;

/// How a tool runs beside the other calls of its batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// May run at the same time as other calls (the default).
    #[default]
    Parallel,
    /// Forces its whole batch to run one call at a time.
    Sequential,
}

/// What a model and an operator know of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema (2020-12) its arguments must match.
    pub input_schema: Value,
    /// The JSON Schema of its output, when it declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Parallel or sequential.
    #[serde(default)]
    pub mode: ExecutionMode,
    /// It changes the world (files, services): permission gates may treat it with care.
    #[serde(default)]
    pub mutating: bool,
    /// Running it twice with the same arguments does no more harm than once: a call in flight at a
    /// crash may be re-run on resume.
    #[serde(default)]
    pub idempotent: bool,
    /// It polls something that changes on its own (a job's status, a CI run): the stuck-loop
    /// rule judges its repeated calls by their results alone, whatever their arguments.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poller: bool,
    /// Per-attempt timeout: a slower attempt becomes a tool error (code `timeout`), retried under
    /// `retries`, then read by the model.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::serde_duration::option"
    )]
    pub timeout: Option<Duration>,
    /// How many times a failed call is run again before the model sees the failure: a recoverable
    /// error or a timeout (not one marked [`ToolError::permanent`], as unreadable arguments are;
    /// not a fatal error or a panic). The model reads
    /// only the last attempt's result. For tools whose failures are transient and which are safe
    /// to run again with the same arguments: a timed-out attempt may have done part of its work.
    /// Hooks and the permission gate see one call, whatever its attempts; the attempts count as
    /// one call for `max_tool_calls`. No retry starts once the run is interrupted or its batch
    /// stops on a fatal failure.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// Each call runs as a tokio task of its own instead of inside the run's task: on a
    /// multi-thread runtime another worker can run it, so a CPU-heavy or blocking handler runs in
    /// parallel with the run (its deadline, its timeouts) and its siblings, as far as there are
    /// workers; on a current-thread runtime it changes nothing. A blocking handler cannot be
    /// stopped: when its call is abandoned it runs on until it returns. Costs one task per call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_task: bool,
}

/// For serde: a zero count is left out.
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The wait before retry number `retry` (1-based) of a failed tool call: 100 ms, doubling, at most
/// 2 s.
pub fn tool_retry_delay(retry: u32) -> Duration {
    let factor = 1u32 << retry.saturating_sub(1).min(5);
    Duration::from_millis(100)
        .saturating_mul(factor)
        .min(Duration::from_secs(2))
}

/// What a successful tool call hands back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// What the model reads.
    pub content: ToolContent,
    /// Data for the caller and events, never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// Asks the run to end after this batch (it does when every call of the batch asks).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
}

impl ToolOutput {
    /// A text result.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput {
            content: ToolContent::Text(text.into()),
            details: None,
            terminate: false,
        }
    }

    /// A JSON result.
    pub fn json(value: Value) -> Self {
        ToolOutput {
            content: ToolContent::Json(value),
            details: None,
            terminate: false,
        }
    }

    /// Attaches details for the caller (never the model).
    #[must_use]
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Asks the run to end after this batch.
    #[must_use]
    pub fn terminate(mut self) -> Self {
        self.terminate = true;
        self
    }
}

/// Turns a handler's return value into a [`ToolOutput`].
pub trait IntoToolOutput {
    /// The conversion.
    fn into_tool_output(self) -> ToolOutput;
}

impl IntoToolOutput for ToolOutput {
    fn into_tool_output(self) -> ToolOutput {
        self
    }
}
impl IntoToolOutput for String {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}
impl IntoToolOutput for &'static str {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}
impl IntoToolOutput for Value {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::json(self)
    }
}
impl IntoToolOutput for ToolContent {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput {
            content: self,
            details: None,
            terminate: false,
        }
    }
}
impl IntoToolOutput for () {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text("ok")
    }
}
macro_rules! display_output {
    ($($t:ty),*) => {$(
        impl IntoToolOutput for $t {
            fn into_tool_output(self) -> ToolOutput { ToolOutput::text(self.to_string()) }
        }
    )*};
}
display_output!(
    i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, f32, f64, bool
);

/// How a tool call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolError {
    /// An expected failure: the model reads `message` and may recover.
    #[error("{code}: {message}")]
    Recoverable {
        /// A short machine-readable code (`not_found`, `timeout`).
        code: String,
        /// What the model reads.
        message: String,
        /// Another attempt with the same arguments would fail the same way: the tool's `retries`
        /// do not apply ([`ToolError::permanent`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        permanent: bool,
    },
    /// The run cannot go on: it fails, running siblings drain, nothing more is dispatched.
    #[error("fatal: {message}")]
    Fatal {
        /// The operator's diagnostic (never shown to the model as a recoverable result).
        message: String,
    },
}

impl ToolError {
    /// A recoverable error the model reads.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::Recoverable {
            code: code.into(),
            message: message.into(),
            permanent: false,
        }
    }

    /// Marks a recoverable error as one that another attempt with the same arguments cannot
    /// cure (a city that does not exist, a program that is not installed): the tool's `retries`
    /// are not spent on it. A fatal error is left as it is.
    #[must_use]
    pub fn permanent(mut self) -> Self {
        if let ToolError::Recoverable { permanent, .. } = &mut self {
            *permanent = true;
        }
        self
    }

    /// A fatal failure that ends the run.
    pub fn fatal(message: impl Into<String>) -> Self {
        ToolError::Fatal {
            message: message.into(),
        }
    }

    /// True for a fatal failure.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ToolError::Fatal { .. })
    }
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        ToolError::new("tool_error", message)
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        ToolError::new("tool_error", message)
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError::new("io_error", e.to_string())
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        ToolError::new("invalid_arguments", e.to_string()).permanent()
    }
}

/// Sends progress updates of a running call; each becomes a `ToolProgress` event.
#[derive(Clone, Default)]
pub struct ProgressSender {
    target: Option<Arc<ProgressTarget>>,
}

struct ProgressTarget {
    /// Set once the call is over: progress after its `ToolFinished` is dropped.
    closed: std::sync::atomic::AtomicBool,
    sink: Arc<dyn EventSink>,
    run_id: Arc<str>,
    turn: u32,
    call_id: Arc<str>,
    tool: Arc<str>,
}

impl fmt::Debug for ProgressSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressSender")
            .field("connected", &self.target.is_some())
            .finish()
    }
}

impl ProgressSender {
    pub(crate) fn new(
        sink: Arc<dyn EventSink>,
        run_id: Arc<str>,
        turn: u32,
        call_id: Arc<str>,
        tool: Arc<str>,
    ) -> Self {
        ProgressSender {
            target: Some(Arc::new(ProgressTarget {
                closed: std::sync::atomic::AtomicBool::new(false),
                sink,
                run_id,
                turn,
                call_id,
                tool,
            })),
        }
    }

    /// Ends the call's progress: later sends are dropped (a handler still running after its call
    /// was abandoned, or work it left behind, cannot report on a finished call).
    pub(crate) fn close(&self) {
        if let Some(t) = &self.target {
            t.closed.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Announces that a failed attempt will be run again after `delay`.
    pub(crate) fn retrying(&self, retry: u32, code: &str, message: &str, delay: Duration) {
        if let Some(t) = &self.target
            && !t.closed.load(std::sync::atomic::Ordering::Acquire)
        {
            t.sink.emit(&Event {
                run_id: t.run_id.clone(),
                turn: t.turn,
                kind: EventKind::ToolRetrying {
                    call_id: t.call_id.to_string(),
                    tool: t.tool.to_string(),
                    retry,
                    code: code.to_owned(),
                    message: message.to_owned(),
                    delay,
                },
            });
        }
    }

    /// Reports progress (a message, a fraction, any JSON). A no-op when nobody listens or once
    /// the call is over.
    pub fn send(&self, progress: impl Into<Value>) {
        if let Some(t) = &self.target
            && !t.closed.load(std::sync::atomic::Ordering::Acquire)
        {
            t.sink.emit(&Event {
                run_id: t.run_id.clone(),
                turn: t.turn,
                kind: EventKind::ToolProgress {
                    call_id: t.call_id.to_string(),
                    tool: t.tool.to_string(),
                    progress: progress.into(),
                },
            });
        }
    }
}

/// What a handler knows of the call it serves. Never part of a tool's input schema.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call id.
    pub call_id: Arc<str>,
    /// The tool's name.
    pub tool: Arc<str>,
    /// The run's id.
    pub run_id: Arc<str>,
    /// The turn the call belongs to (1-based).
    pub turn: u32,
    /// Cancelled when the run is cancelled or its deadline passes: a long handler should watch it.
    pub cancel: CancellationToken,
    /// Progress updates.
    pub progress: ProgressSender,
    /// Fires when no new attempt may start (a sibling failed fatally, the run was interrupted):
    /// the retry layer stops there.
    pub(crate) stop_retries: CancellationToken,
}

impl ToolContext {
    /// A context for calling a handler outside a run (tests, direct use).
    pub fn detached(call_id: impl Into<Arc<str>>, tool: impl Into<Arc<str>>) -> Self {
        ToolContext {
            call_id: call_id.into(),
            tool: tool.into(),
            run_id: Arc::from("detached"),
            turn: 0,
            cancel: CancellationToken::new(),
            progress: ProgressSender::default(),
            stop_retries: CancellationToken::new(),
        }
    }
}

/// The future a handler returns.
pub type ToolFuture = BoxFuture<'static, Result<ToolOutput, ToolError>>;

/// A tool's handler, over validated JSON arguments.
///
/// The arguments are borrowed: the run keeps them for its records and hooks, and a typed handler
/// reads what it needs from them without a copy of the whole value.
///
/// The calls of one batch run concurrently on the run's own task, so a handler must not block the
/// thread: blocking or CPU-heavy work belongs in `tokio::task::spawn_blocking`, or the tool is
/// marked [`ToolBuilder::own_task`].
pub trait ToolHandler: Send + Sync + 'static {
    /// Runs one call. `args` already matched the input schema.
    fn call(&self, args: &Value, ctx: ToolContext) -> ToolFuture;
}

impl<F, Fut> ToolHandler for F
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
{
    fn call(&self, args: &Value, ctx: ToolContext) -> ToolFuture {
        Box::pin((self)(args.clone(), ctx))
    }
}

/// A handler over a typed argument `A`, deserialized from the borrowed JSON.
struct TypedHandler<A, F> {
    f: Arc<F>,
    args: PhantomData<fn() -> A>,
}

impl<A, F, Fut, R, E> ToolHandler for TypedHandler<A, F>
where
    A: DeserializeOwned + Send + 'static,
    F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: IntoToolOutput,
    E: Into<ToolError>,
{
    fn call(&self, args: &Value, ctx: ToolContext) -> ToolFuture {
        match A::deserialize(args) {
            Ok(typed) => {
                // Called inside the future, so that a handler that panics before its first await
                // panics where the driver catches a call's panics.
                let f = self.f.clone();
                Box::pin(async move {
                    f(typed, ctx)
                        .await
                        .map(IntoToolOutput::into_tool_output)
                        .map_err(Into::into)
                })
            }
            Err(e) => {
                let error = ToolError::new("invalid_arguments", e.to_string()).permanent();
                Box::pin(std::future::ready(Err(error)))
            }
        }
    }
}

/// A tool: its spec and its handler. Cheap to clone.
#[derive(Clone)]
pub struct Tool {
    spec: ToolSpec,
    handler: Arc<dyn ToolHandler>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// A tool from a spec and a handler over JSON values.
    pub fn new(spec: ToolSpec, handler: impl ToolHandler) -> Self {
        Tool {
            spec,
            handler: Arc::new(handler),
        }
    }

    /// A dynamic tool from a JSON Schema value and a closure over the JSON arguments. Command and
    /// MCP tools are built this way. The schema is checked when the tool is registered.
    pub fn dynamic<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        f: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        Tool::builder(name)
            .description(description)
            .dynamic(input_schema, f)
    }

    /// Starts a builder.
    pub fn builder(name: impl Into<String>) -> ToolBuilder {
        ToolBuilder {
            spec: ToolSpec {
                name: name.into(),
                description: String::new(),
                input_schema: Value::Null,
                output_schema: None,
                mode: ExecutionMode::Parallel,
                mutating: false,
                idempotent: false,
                poller: false,
                timeout: None,
                retries: 0,
                own_task: false,
            },
        }
    }

    /// The spec.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The handler.
    pub fn handler(&self) -> &Arc<dyn ToolHandler> {
        &self.handler
    }

    /// Runs the handler directly (no validation): for tests.
    pub fn call(&self, args: Value, ctx: ToolContext) -> ToolFuture {
        self.handler.call(&args, ctx)
    }
}

/// Builds a [`Tool`]. Setters never fail; the spec is checked at registration.
#[must_use]
#[derive(Debug, Clone)]
pub struct ToolBuilder {
    spec: ToolSpec,
}

impl ToolBuilder {
    /// Sets the description the model reads.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.spec.description = description.into();
        self
    }

    /// Sets the execution mode.
    pub fn mode(mut self, mode: ExecutionMode) -> Self {
        self.spec.mode = mode;
        self
    }

    /// Marks the tool sequential.
    pub fn sequential(self) -> Self {
        self.mode(ExecutionMode::Sequential)
    }

    /// Declares an output schema.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.spec.output_schema = Some(schema);
        self
    }

    /// Marks the tool as changing the world.
    pub fn mutating(mut self, yes: bool) -> Self {
        self.spec.mutating = yes;
        self
    }

    /// Marks the tool safe to re-run with the same arguments.
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.spec.idempotent = yes;
        self
    }

    /// Marks the tool a poller ([`ToolSpec::poller`]).
    pub fn poller(mut self, yes: bool) -> Self {
        self.spec.poller = yes;
        self
    }

    /// Sets a per-call timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = Some(timeout);
        self
    }

    /// Runs a call that fails recoverably (or times out) up to `retries` more times, waiting
    /// [`tool_retry_delay`] between attempts, before the model sees the failure.
    pub fn retries(mut self, retries: u32) -> Self {
        self.spec.retries = retries;
        self
    }

    /// Runs each call as a tokio task of its own ([`ToolSpec::own_task`]): for CPU-heavy or
    /// blocking handlers.
    pub fn own_task(mut self, yes: bool) -> Self {
        self.spec.own_task = yes;
        self
    }

    /// Finishes with a handler over a typed argument; the input schema comes from `A`.
    pub fn handler<A, F, Fut, R, E>(mut self, f: F) -> Tool
    where
        A: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoToolOutput,
        E: Into<ToolError>,
    {
        self.spec.input_schema = schema_for::<A>();
        Tool {
            spec: self.spec,
            handler: Arc::new(TypedHandler {
                f: Arc::new(f),
                args: PhantomData,
            }),
        }
    }

    /// Finishes with a JSON Schema value and a handler over JSON arguments.
    pub fn dynamic<F, Fut>(mut self, input_schema: Value, f: F) -> Tool
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        self.spec.input_schema = input_schema;
        Tool {
            spec: self.spec,
            handler: Arc::new(f),
        }
    }
}

/// The JSON Schema (2020-12) of a type, as tools use it: no `$schema` or `title` at the top.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("title");
        if !map.contains_key("properties")
            && map.get("type").and_then(Value::as_str) == Some("object")
        {
            map.insert("properties".into(), Value::Object(Default::default()));
        }
    }
    value
}

/// Why a tool could not be registered. The message says what is wrong and lists what is
/// registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolDefinitionError {
    /// The name breaks the naming rule.
    #[error(
        "invalid tool name {name:?}: {reason} (registered: {})",
        list(registered)
    )]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
    /// The name is taken.
    #[error("duplicate tool name {name:?} (registered: {})", list(registered))]
    Duplicate {
        /// The name.
        name: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
    /// The input or output schema is not a valid JSON Schema for a tool.
    #[error(
        "invalid schema for tool {name:?}: {reason} (registered: {})",
        list(registered)
    )]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
}

impl ToolDefinitionError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ToolDefinitionError::InvalidName { .. } => "tool.invalid_name",
            ToolDefinitionError::Duplicate { .. } => "tool.duplicate",
            ToolDefinitionError::InvalidSchema { .. } => "tool.invalid_schema",
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Checks the naming rule: a letter first, then letters, digits, `_` or `-`; 1 to 128 characters.
pub fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > 128 {
        return Err(format!(
            "the name is {} characters long; at most 128 are allowed",
            name.chars().count()
        ));
    }
    let mut chars = name.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic()) {
        return Err("the name must start with a letter".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "the name holds {bad:?}; only letters, digits, '_' and '-' are allowed"
        ));
    }
    Ok(())
}

#[derive(Clone)]
pub(crate) struct RegisteredTool {
    /// The name, shared by every call of the tool, its results and its records.
    pub(crate) name: Arc<str>,
    /// The handler under its layers (panic isolation, its own task, timeout, retries), composed
    /// once here.
    pub(crate) call: Layered,
    pub(crate) validator: Arc<jsonschema::Validator>,
    /// The declared output schema, compiled.
    pub(crate) output: Option<Arc<jsonschema::Validator>>,
}

/// The tools of an agent, checked and compiled. Specs sit in one slice so a model request borrows
/// them without copying.
#[derive(Default, Clone)]
pub struct ToolSet {
    specs: Vec<ToolSpec>,
    entries: Vec<RegisteredTool>,
    by_name: HashMap<String, usize>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.specs.iter().map(|s| &s.name))
            .finish()
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool: checks its name, its uniqueness and its schemas, and compiles the input
    /// schema.
    pub fn register(&mut self, tool: Tool) -> Result<(), ToolDefinitionError> {
        let Tool { mut spec, handler } = tool;
        let registered = || -> Vec<String> { self.specs.iter().map(|s| s.name.clone()).collect() };
        if let Err(reason) = check_tool_name(&spec.name) {
            return Err(ToolDefinitionError::InvalidName {
                name: spec.name,
                reason,
                registered: registered(),
            });
        }
        if self.by_name.contains_key(&spec.name) {
            return Err(ToolDefinitionError::Duplicate {
                name: spec.name,
                registered: registered(),
            });
        }
        let schema_err = |spec: &ToolSpec, reason: String| ToolDefinitionError::InvalidSchema {
            name: spec.name.clone(),
            reason,
            registered: registered(),
        };
        if spec.input_schema.is_null() {
            spec.input_schema = serde_json::json!({"type": "object", "properties": {}});
        }
        match &spec.input_schema {
            Value::Object(map) => match map.get("type") {
                None => {}
                Some(Value::String(t)) if t == "object" => {}
                Some(other) => {
                    return Err(schema_err(
                        &spec,
                        format!("the input schema must describe an object, not {other}"),
                    ));
                }
            },
            other => {
                return Err(schema_err(
                    &spec,
                    format!("the input schema must be a JSON object, not {other}"),
                ));
            }
        }
        let validator = compile_schema(&spec.input_schema).map_err(|e| schema_err(&spec, e))?;
        let output = match &spec.output_schema {
            Some(output) => {
                Some(Arc::new(compile_schema(output).map_err(|e| {
                    schema_err(&spec, format!("output schema: {e}"))
                })?))
            }
            None => None,
        };
        self.by_name.insert(spec.name.clone(), self.specs.len());
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let call = layer::compose(handler, &spec);
        self.specs.push(spec);
        self.entries.push(RegisteredTool {
            name,
            call,
            validator: Arc::new(validator),
            output,
        });
        Ok(())
    }

    /// The specs, in registration order.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The index of a tool by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The spec at an index.
    pub fn spec(&self, index: usize) -> Option<&ToolSpec> {
        self.specs.get(index)
    }

    /// The shared name of the tool at an index.
    pub(crate) fn shared_name(&self, index: usize) -> Option<&Arc<str>> {
        self.entries.get(index).map(|e| &e.name)
    }

    pub(crate) fn entry(&self, index: usize) -> Option<&RegisteredTool> {
        self.entries.get(index)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// True when there are no tools.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().map(|s| s.name.as_str())
    }

    /// Validates arguments against a tool's compiled schema: every failing path with its reason.
    pub fn validate(&self, index: usize, args: &Value) -> Result<(), Vec<SchemaViolation>> {
        let Some(entry) = self.entries.get(index) else {
            return Err(vec![SchemaViolation {
                path: String::new(),
                reason: "no such tool".into(),
            }]);
        };
        validate_with(&entry.validator, args)
    }

    /// Checks a successful output against the tool's declared output schema, if it has one: a
    /// JSON output as it is, a text output parsed as JSON.
    pub(crate) fn check_output(&self, index: usize, content: &ToolContent) -> Result<(), String> {
        let Some(validator) = self.entries.get(index).and_then(|e| e.output.as_ref()) else {
            return Ok(());
        };
        let parsed;
        let value = match content {
            ToolContent::Json(v) => v,
            ToolContent::Text(t) => {
                parsed = serde_json::from_str::<Value>(t)
                    .map_err(|e| format!("the output is not JSON ({e})"))?;
                &parsed
            }
            ToolContent::Parts(_) => {
                return Err("the output is not JSON (it has several parts)".into());
            }
        };
        validate_with(validator, value).map_err(|v| join_violations(&v))
    }
}

/// One way a value failed its schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaViolation {
    /// The JSON Pointer of the failing value (empty for the root).
    pub path: String,
    /// Why it failed.
    pub reason: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.reason)
    }
}

/// Compiles a JSON Schema (2020-12 unless it says otherwise). External references are refused:
/// a schema never makes the program fetch anything.
pub fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Violations joined for the model to read.
pub(crate) fn join_violations(v: &[SchemaViolation]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

pub(crate) fn validate_with(
    validator: &jsonschema::Validator,
    value: &Value,
) -> Result<(), Vec<SchemaViolation>> {
    if validator.is_valid(value) {
        return Ok(());
    }
    let violations: Vec<SchemaViolation> = validator
        .iter_errors(value)
        .map(|e| SchemaViolation {
            path: e.instance_path().to_string(),
            reason: e.to_string(),
        })
        .collect();
    if violations.is_empty() {
        return Err(vec![SchemaViolation {
            path: String::new(),
            reason: "does not match the schema".into(),
        }]);
    }
    Err(violations)
}
