//! Guardrails: input guardrails check the input before the first model call, and each steering
//! message or follow-up before the model reads it (the messages that arrived together are read
//! as one text; one that trips keeps them out of the transcript); output guardrails check the
//! final output, also when a tool or a stop condition ended the run with one (`terminated`).
//! One that trips stops the run with [`crate::StopReason::Guardrail`],
//! carrying its name and message. A tripped output guardrail withholds the output:
//! [`crate::RunOutcome::output`] and `structured_output` are `None`, and the model's text is only
//! in the transcript (a streamed run's text deltas were sent before the check).

use std::sync::Arc;

use futures::future::BoxFuture;

/// A check over a text (the run's input or its final output).
pub trait Guardrail: Send + Sync {
    /// The guardrail's name.
    fn name(&self) -> &str;
    /// `Err(message)` trips the guardrail.
    fn check<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<(), String>>;
}

type CheckFn = dyn Fn(&str) -> Result<(), String> + Send + Sync;

/// A guardrail from a plain function.
pub struct FnGuardrail {
    name: String,
    f: Arc<CheckFn>,
}

impl std::fmt::Debug for FnGuardrail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnGuardrail")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A guardrail named `name` that trips when `f` returns `Err(message)`.
pub fn guardrail_fn(
    name: impl Into<String>,
    f: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static,
) -> FnGuardrail {
    FnGuardrail {
        name: name.into(),
        f: Arc::new(f),
    }
}

impl Guardrail for FnGuardrail {
    fn name(&self) -> &str {
        &self.name
    }
    fn check<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<(), String>> {
        let r = (self.f)(text);
        Box::pin(async move { r })
    }
}
