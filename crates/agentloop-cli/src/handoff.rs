//! The `[[handoffs]]` of an agent file as tools: each a hand-off
//! ([`agentloop::handoff::Handoff`]) whose target agent is built once per file of the tree and
//! shared by every hand-off to it, so that agents handing off to each other (a cycle) are built
//! one after the other instead of into each other.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use agentloop::Tool;
use agentloop::handoff::{Handoff, HandoffTarget};
use serde_json::{Value, json};

use crate::agent_file::{AgentFile, HandoffTo};

/// The targets of a tree's hand-offs, by their file's canonical path: one each, set once its
/// agent is built.
#[derive(Default)]
pub(crate) struct Targets(RefCell<Vec<(PathBuf, HandoffTarget)>>);

impl Targets {
    /// The target of the file `key`, made on first use.
    fn of(&self, key: &Path) -> HandoffTarget {
        let mut all = self.0.borrow_mut();
        if let Some((_, t)) = all.iter().find(|(k, _)| k == key) {
            return t.clone();
        }
        let t = HandoffTarget::new();
        all.push((key.to_path_buf(), t.clone()));
        t
    }

    /// A target whose agent is not built yet, with its file's key.
    pub(crate) fn unset(&self) -> Option<(PathBuf, HandoffTarget)> {
        self.0
            .borrow()
            .iter()
            .find(|(_, t)| !t.is_set())
            .map(|(k, t)| (k.clone(), t.clone()))
    }
}

/// The tools of the file's `[[handoffs]]`: on its tree's shared targets, or (`None`: for `plan`
/// and the fingerprint, which run nothing) on targets never set.
pub(crate) fn tools(file: &AgentFile, targets: Option<&Targets>) -> Vec<Tool> {
    file.handoffs.iter().map(|h| tool(h, targets)).collect()
}

fn tool(h: &HandoffTo, targets: Option<&Targets>) -> Tool {
    let target = targets.map_or_else(HandoffTarget::new, |t| t.of(&h.key));
    Handoff::later(&h.agent, &target)
        .name(h.tool.clone())
        .description(h.description.clone())
        .history(h.history)
        .into_tool()
}

/// What the hand-offs add to the agent's definition: each tool, its file as written and its
/// filter. Not the target's fingerprint (a cycle would hold itself): the target's own journal
/// records its definition, and a resume checks it there.
pub(crate) fn definition(file: &AgentFile) -> Option<Value> {
    let entries = file.spec.handoffs.as_deref().unwrap_or_default();
    if entries.is_empty() {
        return None;
    }
    Some(
        file.handoffs
            .iter()
            .zip(entries)
            .map(|(h, e)| {
                json!({
                    "tool": h.tool,
                    "agent": e.agent.get_ref(),
                    "history": h.history.as_str(),
                })
            })
            .collect(),
    )
}

/// The hand-offs as `plan` shows them (`--json` too): tool, agent, its file and the filter.
pub fn plan(file: &AgentFile) -> Value {
    file.handoffs
        .iter()
        .map(|h| {
            json!({
                "tool": h.tool,
                "agent": h.agent,
                "file": h.key.display().to_string(),
                "history": h.history.as_str(),
                "description": h.description,
            })
        })
        .collect()
}
