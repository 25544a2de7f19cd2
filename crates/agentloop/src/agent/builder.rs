//! [`AgentBuilder`]: an agent's parts, checked once when it is built.

use std::sync::Arc;

use serde_json::Value;

use super::Agent;
use crate::config::{AgentConfig, DecisionPolicy, OutputSchema};
use crate::driver::Parts;
use crate::error::RunError;
use crate::event::{EventSink, Sinks};
use crate::gate::Gate;
use crate::guardrail::Guardrail;
use crate::hooks::{Hook, HookRole};
use crate::ids::{IdSource, UuidIds};
use crate::journal::Definition;
use crate::limits::{Limits, Pricing};
use crate::model::{Model, ModelSettings};
use crate::tool::{Tool, ToolSet, ToolSource};

/// Builds an [`Agent`]. Setters record the first error; [`AgentBuilder::build`] returns it.
#[must_use]
pub struct AgentBuilder {
    name: String,
    model: Option<Arc<dyn Model>>,
    instructions: Option<String>,
    tools: ToolSet,
    limits: Limits,
    policy: DecisionPolicy,
    output_schema: Option<Value>,
    settings: ModelSettings,
    /// `None` until set: the model's known window, if any.
    compaction: Option<Option<crate::compaction::Compaction>>,
    sinks: Vec<Arc<dyn EventSink>>,
    pricing: Option<Arc<dyn Pricing>>,
    ids: Arc<dyn IdSource>,
    gates: Vec<Arc<dyn Gate>>,
    hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    input_guardrails: Vec<Arc<dyn Guardrail>>,
    output_guardrails: Vec<Arc<dyn Guardrail>>,
    definition: Definition,
    source: Option<Arc<dyn ToolSource>>,
    error: Option<RunError>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts a builder.
    pub fn builder() -> AgentBuilder {
        AgentBuilder {
            name: "agent".into(),
            model: None,
            instructions: None,
            tools: ToolSet::new(),
            limits: Limits::default(),
            policy: DecisionPolicy::default(),
            output_schema: None,
            settings: ModelSettings::default(),
            compaction: None,
            sinks: Vec::new(),
            pricing: None,
            ids: Arc::new(UuidIds),
            gates: Vec::new(),
            hooks: Vec::new(),
            input_guardrails: Vec::new(),
            output_guardrails: Vec::new(),
            definition: Definition::new(),
            source: None,
            error: None,
        }
    }
}

impl AgentBuilder {
    /// Sets the agent's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the model (an `Arc<dyn Model>` is a model too).
    pub fn model(mut self, model: impl Model + 'static) -> Self {
        self.model = Some(Arc::new(model));
        self
    }

    /// Sets the system instructions.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Registers a tool (errors surface at `build`).
    pub fn tool(mut self, tool: Tool) -> Self {
        if self.error.is_none()
            && let Err(e) = self.tools.register(tool)
        {
            self.error = Some(e.into());
        }
        self
    }

    /// Registers several tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        for t in tools {
            self = self.tool(t);
        }
        self
    }

    /// Adds the tools of a source whose tools may change while the agent runs (an MCP server's):
    /// its tools as listed now join the agent's at `build`, and each turn of a run asks it again,
    /// so a change shows from the next turn on (see [`crate::machine::Action::ListTools`]). One
    /// source per agent; a later call replaces an earlier one.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// Sets the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets how invalid calls are treated.
    pub fn policy(mut self, policy: DecisionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Requires the final answer to be JSON matching this schema.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Requires the final answer to be JSON matching `T`'s schema.
    pub fn output_type<T: schemars::JsonSchema>(self) -> Self {
        self.output_schema(crate::tool::schema_for::<T>())
    }

    /// Sets the model settings.
    pub fn settings(mut self, settings: ModelSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Compacts conversations that would pass a context window (see [`crate::compaction`]). By
    /// default an agent whose model is a common one
    /// ([`crate::compaction::known_context_tokens`]) is compacted by summary at that model's
    /// window, and any other is not.
    pub fn compaction(mut self, compaction: crate::compaction::Compaction) -> Self {
        self.compaction = Some(Some(compaction));
        self
    }

    /// Never compacts: a conversation past the model's window fails as the provider refuses it.
    pub fn without_compaction(mut self) -> Self {
        self.compaction = Some(None);
        self
    }

    /// Adds an event sink (an `Arc<dyn EventSink>` is a sink too).
    pub fn sink(mut self, sink: impl EventSink + 'static) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// Sets the pricing (a [`crate::PriceTable`] or a cost function).
    pub fn pricing(mut self, pricing: impl Pricing + 'static) -> Self {
        self.pricing = Some(Arc::new(pricing));
        self
    }

    /// Sets where run and call ids come from.
    pub fn ids(mut self, ids: impl IdSource + 'static) -> Self {
        self.ids = Arc::new(ids);
        self
    }

    /// Adds an admission gate; gates see each batch in the order they were added, after the
    /// hooks' `before_tool_call`.
    pub fn gate(mut self, gate: impl Gate + 'static) -> Self {
        self.gates.push(Arc::new(gate));
        self
    }

    /// Adds a hook whose failure fails the run.
    pub fn hook(mut self, hook: impl Hook + 'static) -> Self {
        self.hooks.push((Arc::new(hook), HookRole::Required));
        self
    }

    /// Adds a stop condition: after each tool turn, `predicate` sees the run's state, and `true`
    /// ends the run with the stop reason `terminated` (the output is the last assistant text).
    /// A [`Hook`] can do the same with [`Hook::should_stop`].
    pub fn stop_when<F>(self, name: impl Into<String>, predicate: F) -> Self
    where
        F: Fn(&crate::hooks::RunState<'_>) -> bool + Send + Sync + 'static,
    {
        self.hook(crate::hooks::StopWhen::new(name, predicate))
    }

    /// Adds an observer hook: its failures are reported as events and the run goes on.
    pub fn observer(mut self, hook: impl Hook + 'static) -> Self {
        self.hooks.push((Arc::new(hook), HookRole::Observer));
        self
    }

    /// Adds a guardrail on the input, checked before the first model call.
    pub fn input_guardrail(mut self, g: impl Guardrail + 'static) -> Self {
        self.input_guardrails.push(Arc::new(g));
        self
    }

    /// Adds a guardrail on the final output.
    pub fn output_guardrail(mut self, g: impl Guardrail + 'static) -> Self {
        self.output_guardrails.push(Arc::new(g));
        self
    }

    /// The agent's version, as the application numbers it: part of its [`Agent::definition`],
    /// so that resuming a run started under another version is refused.
    pub fn version(self, version: impl Into<String>) -> Self {
        self.definition_part("version", Value::String(version.into()))
    }

    /// A part of the agent's [`Agent::definition`] that the agent cannot see for itself (its
    /// permission rules, how its tools are implemented).
    pub fn definition_part(mut self, key: impl Into<String>, value: Value) -> Self {
        self.definition.set(key, value);
        self
    }

    /// The definition the agent will have ([`Agent::definition`]): the parts the application
    /// set, and the agent's own for the rest (a part the application set is kept, so the
    /// application may say what the model is in its own terms).
    pub fn definition(&self) -> Definition {
        let mut definition = self.definition.clone();
        let mut own = |key: &str, value: Value| {
            if definition.get(key).is_none() {
                definition.set(key, value);
            }
        };
        own("agent", Value::String(self.name.clone()));
        own(
            "model",
            serde_json::json!(
                self.model
                    .as_ref()
                    .map(|m| { serde_json::json!({"provider": m.provider(), "id": m.id()}) })
            ),
        );
        own("instructions", serde_json::json!(self.instructions));
        // The agent's own tools only: a tool source's may change at any turn, and a run's step
        // log (its journal) holds them as they were listed, so a resume needs them unchanged no
        // more than a run does (the application names the source itself, with
        // [`AgentBuilder::definition_part`]).
        own(
            "tools",
            Value::Object(
                self.tools
                    .specs()
                    .iter()
                    .map(|s| (s.name.clone(), serde_json::to_value(s).unwrap_or_default()))
                    .collect(),
            ),
        );
        own(
            "limits",
            serde_json::to_value(&self.limits).unwrap_or_default(),
        );
        own(
            "policy",
            serde_json::to_value(self.policy).unwrap_or_default(),
        );
        own("output_schema", serde_json::json!(self.output_schema));
        own(
            "settings",
            serde_json::to_value(&self.settings).unwrap_or_default(),
        );
        if let Some(c) = &self.compaction {
            own("compaction", serde_json::to_value(c).unwrap_or_default());
        }
        definition
    }

    /// Builds the agent.
    pub fn build(mut self) -> Result<Agent, RunError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let definition = self.definition();
        let own_tools = self.tools.len();
        if let Some(source) = &self.source {
            for tool in source.tools() {
                // A source's tool whose name is taken is left out, as a run leaves it out of a
                // list that changed: its first turn lists the source's tools and says which
                // were refused. Two servers may each have a `search`; the agent still builds.
                match self.tools.register(tool) {
                    Ok(()) | Err(crate::tool::ToolDefinitionError::Duplicate { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // A source's tools can change during a run (found, listed anew): a choice naming one of
        // them is the server's to refuse.
        if let Some(crate::model::ToolChoice::Tool(name)) = &self.settings.tool_choice
            && self.source.is_none()
            && !self.tools.specs().iter().any(|s| s.name == *name)
        {
            return Err(RunError::Other {
                message: format!(
                    "tool_choice names the tool {name}, which the agent does not have"
                ),
            });
        }
        let has_subagents = self.tools.specs().iter().any(|s| s.subagent);
        let Some(model) = self.model else {
            return Err(RunError::Other {
                message: "the agent has no model".into(),
            });
        };
        self.limits.check().map_err(|message| RunError::Other {
            message: format!("invalid limits: {message}"),
        })?;
        check_priced(&self.limits, self.pricing.as_ref(), &model)?;
        let output_schema = match self.output_schema {
            Some(schema) => Some(OutputSchema::new(schema).map_err(|e| RunError::Other {
                message: format!("invalid output schema: {e}"),
            })?),
            None => None,
        };
        let compaction = self.compaction.unwrap_or_else(|| {
            crate::compaction::known_context_tokens(model.id())
                .map(crate::compaction::Compaction::new)
        });
        let cfg = AgentConfig {
            name: self.name,
            instructions: self.instructions,
            tools: self.tools,
            own_tools,
            limits: self.limits,
            policy: self.policy,
            output_schema,
            settings: self.settings,
            compaction,
        };
        Ok(Agent {
            inner: Arc::new(Parts {
                cfg: Arc::new(cfg),
                model,
                sinks: Sinks(self.sinks),
                pricing: self.pricing,
                ids: self.ids,
                gates: self.gates,
                hooks: self.hooks,
                input_guardrails: self.input_guardrails,
                output_guardrails: self.output_guardrails,
                definition,
                has_subagents,
                source: self.source,
            }),
        })
    }
}

/// Refuses a cost budget that could never hold: `max_cost_usd` with no pricing, or with a
/// pricing that has no price for the model (asked with empty usage; one that panics prices
/// nothing). The one check for the builder's limits and a run's own.
pub(super) fn check_priced(
    limits: &Limits,
    pricing: Option<&Arc<dyn Pricing>>,
    model: &Arc<dyn Model>,
) -> Result<(), RunError> {
    if limits.cost_bound().is_none() {
        return Ok(());
    }
    let priced = pricing.is_some_and(|p| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.cost(
                model.provider(),
                model.id(),
                &crate::model::Usage::default(),
            )
        }))
        .ok()
        .flatten()
        .is_some()
    });
    if priced {
        Ok(())
    } else {
        Err(RunError::UnpricedModel {
            model: model.id().to_owned(),
            provider: model.provider().to_owned(),
        })
    }
}
