//! Tools are values: a [`ToolSpec`] (name, description, input schema, mode, flags), an async
//! handler and the [`ToolPolicy`] its layers apply (timeout, retries, a task of its own). They come
//! from `#[tool]` functions, from [`Tool::builder`] over a typed argument, or from a JSON Schema
//! value ([`Tool::dynamic`]). A [`ToolSet`] checks names and compiles schemas once, at
//! registration, so that validating a call is a lookup and a schema walk.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::retry::RetryPolicy;

mod args;
mod bound;
mod context;
mod error;
mod handler;
mod layer;
mod set;
mod source;
mod spec;

pub use args::Arguments;
pub use bound::bounded_text;
pub use context::{ProgressSender, ToolContext};
pub use error::{ToolDefinitionError, ToolError};
use handler::TypedHandler;
pub use handler::{IntoToolOutput, ToolFuture, ToolHandler, ToolOutput};
pub(crate) use layer::Layered;
pub use layer::ToolPolicy;
pub(crate) use set::compile_schema;
pub(crate) use set::{Rejected, join_violations, validate_with};
pub use set::{SchemaViolation, ToolCatalog, ToolSet, check_schema, check_tool_name};
pub use source::{RefreshFuture, ToolSource};
pub use spec::{ExecutionMode, ToolSpec, schema_for};

/// A tool: its spec, its handler and its policy. Cheap to clone.
#[derive(Clone)]
pub struct Tool {
    spec: ToolSpec,
    handler: Arc<dyn ToolHandler>,
    policy: ToolPolicy,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("spec", &self.spec)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// A tool from a spec and a handler over JSON values, with the default policy.
    pub fn new(spec: ToolSpec, handler: impl ToolHandler) -> Self {
        Tool {
            spec,
            handler: Arc::new(handler),
            policy: ToolPolicy::default(),
        }
    }

    /// The same tool, found by the provider's native tool search before the model may call it
    /// ([`ToolSpec::deferred`]).
    #[must_use]
    pub fn deferred(mut self) -> Self {
        self.spec.deferred = true;
        self
    }

    /// The same tool under another policy.
    #[must_use]
    pub fn with_policy(mut self, policy: ToolPolicy) -> Self {
        self.policy = policy;
        self
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
                subagent: false,
                handoff: false,
                deferred: false,
            },
            policy: ToolPolicy::default(),
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

    /// The policy its layers apply.
    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// The handler.
    pub fn handler(&self) -> &Arc<dyn ToolHandler> {
        &self.handler
    }

    /// The handler under the layers its policy asks for (no schema is compiled: a source's
    /// tool is looked up by name, and the machine holds its compiled spec).
    pub(crate) fn layered(&self) -> layer::Layered {
        layer::compose(Arc::clone(&self.handler), &self.policy)
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
    policy: ToolPolicy,
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

    /// Marks the tool a subagent's ([`ToolSpec::subagent`]).
    pub(crate) fn subagent(mut self) -> Self {
        self.spec.subagent = true;
        self
    }

    /// Marks the tool a hand-off's ([`ToolSpec::handoff`]): a subagent's whose answer ends the run.
    pub(crate) fn handoff(mut self) -> Self {
        self.spec.subagent = true;
        self.spec.handoff = true;
        self
    }

    /// Marks the tool a poller ([`ToolSpec::poller`]).
    pub fn poller(mut self, yes: bool) -> Self {
        self.spec.poller = yes;
        self
    }

    /// Sets the timeout of each attempt ([`ToolPolicy::timeout`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = Some(timeout);
        self
    }

    /// Runs a failed call up to `retries` more times ([`ToolPolicy::retry`]), with the waits the
    /// retry policy already has. A timeout or an error does not say the call did nothing: give
    /// retries to a tool that is safe to repeat ([`ToolBuilder::idempotent`]), or have it mark the
    /// errors that must not be retried permanent. (The CLI warns of `retries` on a command tool
    /// not marked `idempotent`.)
    pub fn retries(mut self, retries: u32) -> Self {
        self.policy.retry.max_attempts = retries.saturating_add(1);
        self
    }

    /// Sets the whole retry policy: attempts and waits ([`ToolPolicy::retry`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.policy.retry = retry;
        self
    }

    /// Runs each attempt as a tokio task of its own ([`ToolPolicy::own_task`]).
    pub fn own_task(mut self, yes: bool) -> Self {
        self.policy.own_task = yes;
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
            handler: Arc::new(TypedHandler::new(f)),
            policy: self.policy,
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
            policy: self.policy,
        }
    }
}
