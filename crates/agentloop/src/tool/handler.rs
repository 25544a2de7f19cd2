//! A tool's handler ([`ToolHandler`]): a closure over JSON arguments or a typed handler over a
//! deserialized argument, and what it hands back ([`ToolOutput`], from any [`IntoToolOutput`]).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Arguments, ToolContext, ToolError};
use crate::message::{SmolStr, ToolContent};
use crate::outcome::{CallOutcome, CallStatus};

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
    pub fn text(text: impl Into<SmolStr>) -> Self {
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

// The call's vocabulary knows nothing of tools: a handler's result becomes an outcome here.
impl CallOutcome {
    /// A handler's result.
    pub fn from_result(result: Result<ToolOutput, ToolError>) -> Self {
        match result {
            Ok(out) => CallOutcome::ok(out),
            Err(ToolError::Recoverable {
                code,
                message,
                permanent,
            }) => CallOutcome {
                permanent,
                ..CallOutcome::decided(CallStatus::Error, &code, message)
            },
            Err(ToolError::Fatal { message }) => CallOutcome::fatal(message),
        }
    }

    /// A success.
    pub fn ok(output: ToolOutput) -> Self {
        CallOutcome {
            status: CallStatus::Ok,
            code: None,
            content: output.content,
            diagnostic: None,
            details: output.details.map(Box::new),
            terminate: output.terminate,
            duration: Duration::ZERO,
            retries: 0,
            permanent: false,
            subagent: None,
        }
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
        // Borrowed for good, never copied: a handler that answers `"ok"` allocates nothing.
        ToolOutput::text(SmolStr::new_static(self))
    }
}
impl IntoToolOutput for Arc<str> {
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

/// The future a handler returns.
pub type ToolFuture = BoxFuture<'static, Result<ToolOutput, ToolError>>;

/// A tool's handler, over validated JSON arguments.
///
/// The arguments are borrowed: the run keeps them for its records and hooks. The run calls
/// [`ToolHandler::call_arguments`], which a typed handler overrides to read its type from the
/// arguments' text, with no `Value` made for the call.
///
/// The calls of one batch run concurrently on the run's own task, so a handler must not block the
/// thread: blocking or CPU-heavy work belongs in `tokio::task::spawn_blocking`, or the tool is
/// marked [`ToolBuilder::own_task`](super::ToolBuilder::own_task).
pub trait ToolHandler: Send + Sync + 'static {
    /// Runs one call. `args` already matched the input schema.
    fn call(&self, args: &Value, ctx: ToolContext) -> ToolFuture;

    /// Runs one call from its [`Arguments`], as the run calls a handler. The default reads them
    /// as a `Value` (made from their text the first time, then kept) and calls
    /// [`ToolHandler::call`]; a handler that reads its own type from the text overrides it, so
    /// that no tree is made for the call.
    fn call_arguments(&self, args: &Arguments, ctx: ToolContext) -> ToolFuture {
        self.call(args.value(), ctx)
    }
}

impl<F, Fut> ToolHandler for F
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
{
    fn call(&self, args: &Value, ctx: ToolContext) -> ToolFuture {
        Box::pin((self)(args.clone(), ctx))
    }

    fn call_arguments(&self, args: &Arguments, ctx: ToolContext) -> ToolFuture {
        // The closure owns its `Value`: parsed for it, not parsed, kept and copied.
        Box::pin((self)(args.to_value(), ctx))
    }
}

/// A handler over a typed argument `A`, deserialized from the borrowed JSON.
pub(super) struct TypedHandler<A, F> {
    f: Arc<F>,
    args: PhantomData<fn() -> A>,
}

impl<A, F> TypedHandler<A, F> {
    pub(super) fn new(f: F) -> Self {
        TypedHandler {
            f: Arc::new(f),
            args: PhantomData,
        }
    }

    /// Runs the handler on the arguments read, or fails the call with why they could not be.
    fn run<Fut, R, E>(&self, read: Result<A, serde_json::Error>, ctx: ToolContext) -> ToolFuture
    where
        A: Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoToolOutput,
        E: Into<ToolError>,
    {
        match read {
            Ok(typed) => {
                // Called inside the future, so that a handler that panics before its first await
                // panics where the driver catches a call's panics. `lazy` then `flatten` rather
                // than an `async` block: the block would keep the arguments and the context
                // (120 bytes and more) beside the handler's future while it runs, dead.
                let f = self.f.clone();
                Box::pin(
                    futures::future::lazy(move |_| f(typed, ctx))
                        .flatten()
                        .map(|done| {
                            done.map(IntoToolOutput::into_tool_output)
                                .map_err(Into::into)
                        }),
                )
            }
            Err(e) => {
                let error = ToolError::new("invalid_arguments", e.to_string()).permanent();
                Box::pin(std::future::ready(Err(error)))
            }
        }
    }
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
        self.run(A::deserialize(args), ctx)
    }

    fn call_arguments(&self, args: &Arguments, ctx: ToolContext) -> ToolFuture {
        // Straight from the text; were it to fail where the tree would not (a type that reads
        // a `Value` otherwise than text), the tree decides, with its own error.
        match serde_json::from_str::<A>(args.as_str()) {
            Ok(typed) => self.run(Ok(typed), ctx),
            Err(_) => self.run(A::deserialize(args.value()), ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic)]
    use super::*;

    /// A handler's static answer is borrowed whatever its length, and a short owned one is held
    /// inline: neither allocates the text the transcript, the record and events share.
    #[test]
    fn static_and_short_answers_hold_no_heap_text() {
        let long: &'static str = "the file was written, and its old contents were kept aside";
        for output in [
            long.into_tool_output(),
            "ok".into_tool_output(),
            String::from("short answer").into_tool_output(),
        ] {
            let ToolContent::Text(text) = &output.content else {
                panic!("a text answer became {:?}", output.content);
            };
            assert!(!text.is_heap_allocated(), "{text:?} was copied to the heap");
        }
        let ToolContent::Text(text) = ToolOutput::text("x".repeat(100)).content else {
            panic!("not text");
        };
        assert!(text.is_heap_allocated());
        assert_eq!(&*text, "x".repeat(100));
    }
}
