//! Hand-offs: the model passes the conversation to another agent, which goes on with its own
//! instructions, model, tools and permissions, and whose answer is the run's answer.
//!
//! The model sees each hand-off as a tool (`transfer_to_<agent>` by default). Calling it runs the
//! other agent on the conversation so far (filtered by [`HandoffHistory`]) as a child run of this
//! one, under what is left of this run's limits and budget (turns, model and tool calls, tokens,
//! dollars, the deadline): the two agents spend one budget. When it returns, this run ends as the
//! child's ended, with its answer, and [`crate::RunOutcome::answered_by`] names the agent that
//! answered (at the end of a chain of hand-offs). A journaled run journals the child with it, so
//! a resumed run goes on inside the agent that had the conversation.
//!
//! The rules, kept by the machine: a hand-off must be the only call of its turn (beside other
//! calls it is answered `handoff.not_alone` and the others run); each hand-off is one level of
//! [`crate::Limits::max_depth`], which bounds a chain (agents that hand back and forth).

use std::sync::{Arc, OnceLock};

use crate::agent::{Agent, AgentBuilder};
use crate::subagent::SubagentTool;
use crate::tool::Tool;

pub use super::handoff_history::HandoffHistory;

/// The default name of a hand-off to the agent `agent`: `transfer_to_<agent>`, other characters
/// than letters, digits, `_` and `-` as `_`.
pub fn tool_name(agent: &str) -> String {
    let agent: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("transfer_to_{agent}")
}

/// A hand-off to another agent, as a tool of the agent that hands off
/// ([`AgentBuilder::handoff`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct Handoff {
    target: Arc<OnceLock<Agent>>,
    agent_name: String,
    name: Option<String>,
    description: Option<String>,
    history: HandoffHistory,
}

/// The agent a [`Handoff::later`] passes the conversation to, set once it is built; every
/// hand-off made on one target shares it.
#[derive(Debug, Clone, Default)]
pub struct HandoffTarget(Arc<OnceLock<Agent>>);

impl HandoffTarget {
    /// A target with no agent yet.
    pub fn new() -> Self {
        HandoffTarget::default()
    }

    /// Sets the agent; false when it was set already (the first one stays).
    pub fn set(&self, agent: Agent) -> bool {
        self.0.set(agent).is_ok()
    }

    /// True once the agent is set.
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }
}

impl Handoff {
    /// A hand-off to `agent`, as the tool `transfer_to_<its name>`.
    pub fn to(agent: &Agent) -> Self {
        let target = Arc::new(OnceLock::from(agent.clone()));
        Handoff::over(target, agent.config().name())
    }

    /// A hand-off to the agent named `agent_name`, set on `target` once it is built: agents
    /// that hand off to each other (a cycle) are built one after the other. Called before its
    /// target is set, the hand-off is an error the model reads (`handoff.unset`).
    pub fn later(agent_name: impl Into<String>, target: &HandoffTarget) -> Self {
        Handoff::over(Arc::clone(&target.0), &agent_name.into())
    }

    fn over(target: Arc<OnceLock<Agent>>, agent_name: &str) -> Self {
        Handoff {
            target,
            agent_name: agent_name.to_owned(),
            name: None,
            description: None,
            history: HandoffHistory::All,
        }
    }

    /// The tool's name (by default `transfer_to_<agent>`, other characters than letters,
    /// digits, `_` and `-` as `_`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// What the model reads of when to hand off (by default it names the agent).
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// What the next agent sees of the conversation (default [`HandoffHistory::All`]).
    pub fn history(mut self, history: HandoffHistory) -> Self {
        self.history = history;
        self
    }

    /// The tool's name.
    pub fn tool_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| tool_name(&self.agent_name))
    }

    /// The tool the model calls to hand off.
    pub fn into_tool(self) -> Tool {
        let name = self.tool_name();
        let description = self.description.clone().unwrap_or_else(|| {
            format!(
                "Hands this conversation to the agent {}, which answers the user from here on.",
                self.agent_name
            )
        });
        let mut tool = SubagentTool::with_target(self.target, name, description);
        tool.handoff = Some(self.history);
        tool.into_tool()
    }
}

impl AgentBuilder {
    /// Adds a hand-off ([`Handoff`]): a tool that passes the conversation to another agent.
    pub fn handoff(self, handoff: Handoff) -> Self {
        self.tool(handoff.into_tool())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_a_valid_tool_name() {
        let h = Handoff::later("billing desk", &HandoffTarget::new());
        assert_eq!(h.tool_name(), "transfer_to_billing_desk");
    }
}
