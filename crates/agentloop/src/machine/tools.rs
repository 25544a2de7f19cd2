//! The run's tools when its tool source changes them.

use std::collections::HashSet;
use std::sync::Arc;

use super::RunMachine;
use crate::event::EventKind;
use crate::tool::ToolCatalog;

impl RunMachine {
    /// The tool source's tools changed: from now on the run's tools are the agent's own and
    /// these. A spec that fails the checks of a registration (a bad name or schema, a name
    /// taken) is left out, and said so; calls of a tool that went away are unknown-tool errors
    /// the model reads.
    ///
    /// A name belongs to the first spec listed with it, even one refused: the driver runs the
    /// first listed tool of a name, so a later spec kept in its place would have another
    /// tool's handler run under it.
    #[cold]
    #[inline(never)]
    pub(super) fn switch_tools(&mut self, specs: Vec<crate::tool::ToolSpec>) {
        let mut tools = self.cfg.tools.prefix(self.cfg.own_tools);
        let mut refused = Vec::new();
        let mut listed: HashSet<String> = HashSet::with_capacity(specs.len());
        for spec in specs {
            let name = spec.name.clone();
            if !listed.insert(name.clone()) && tools.index_of(&name).is_none() {
                refused.push(format!(
                    "{name}: an earlier tool of this name was refused, and its name is not \
                     given to a later one"
                ));
                continue;
            }
            if let Err(e) = tools.add(spec) {
                refused.push(format!("{name}: {e}"));
            }
        }
        let before = &self.tools;
        let added: Vec<String> = tools
            .names()
            .filter(|n| before.index_of(n).is_none())
            .map(str::to_owned)
            .collect();
        let removed: Vec<String> = before
            .names()
            .filter(|n| tools.index_of(n).is_none())
            .map(str::to_owned)
            .collect();
        let updated: Vec<String> = tools
            .specs()
            .iter()
            .filter(|s| {
                before
                    .index_of(&s.name)
                    .and_then(|i| before.spec(i))
                    .is_some_and(|old| old != *s)
            })
            .map(|s| s.name.clone())
            .collect();
        if added.is_empty() && removed.is_empty() && updated.is_empty() && refused.is_empty() {
            return;
        }
        self.has_pollers = tools.specs().iter().any(|s| s.poller);
        self.tools = Arc::new(tools);
        // The instructions' and schemas' estimate is made again for the new schemas.
        self.context.fixed_estimate = std::sync::OnceLock::new();
        self.emit(|| EventKind::ToolsChanged {
            added,
            removed,
            updated,
            refused,
        });
    }

    /// The run's tools now: the agent's, or those its tool source last listed.
    pub fn tools(&self) -> &Arc<ToolCatalog> {
        &self.tools
    }
}
