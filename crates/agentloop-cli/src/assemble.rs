//! From a checked agent file to a runnable [`Agent`]: the model (scripted or a live provider
//! wrapped in retries), the command, subagent, built-in and `a2a` tools, the limits, the model
//! settings and the permission gate. The tools of the `[[mcp]]` servers of each file of the tree
//! join its agent once the servers are started, and the `a2a` tools' cards are read then too
//! ([`StartedMcp`]).
//!
//! The module's files: this one builds the agent ([`agent`]) from the parts the others make, and
//! holds what several of them read (the limits, a built-in tool's options, how subagents are
//! built): `models` the model and the `[model]` keys beside it, `tools` the file's tools,
//! `permissions` the permission gate and who answers it, `servers` the started `[[mcp]]`
//! servers, and `fingerprint` the file's part of the agent's definition.

mod fingerprint;
mod models;
mod permissions;
mod servers;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use agentloop::{Agent, Gate, Limits, Model};
use agentloop_tools::BuiltinOptions;

use crate::agent_file::{AgentFile, Bound, ToolFileSpec};

use crate::error::CliError;

pub use fingerprint::{definition_parts, fingerprint, mcp_declarations};
pub use models::{compaction, has_pricing, model, scripted_model, settings, with_model_keys};
pub use permissions::{
    Approval, ask_tool, builtin_permission_rules, create_exposed_stores, gate, has_gate,
    permission_rules, permission_store, refuse_swappable_agent_files,
};
pub use servers::{StartedMcp, mcp_configs};
use tools::all_tools;
pub use tools::{command_root, tools};

/// The limits the file asks for, over the core's defaults.
pub fn limits(file: &AgentFile) -> Limits {
    let mut limits = Limits::default();
    let Some(l) = &file.spec.limits else {
        return limits;
    };
    // A bound the file leaves out keeps the core's default; 0 and "unlimited" lift it.
    if let Some(b) = &l.max_turns {
        limits.max_turns = b.get_ref().get();
    }
    if let Some(b) = l.max_tool_calls {
        limits.max_tool_calls = b.get();
    }
    if let Some(b) = l.max_model_calls {
        limits.max_model_calls = b.get();
    }
    limits.max_tokens = l.max_tokens.and_then(Bound::get);
    if let Some(on) = l.on_limit {
        limits.on_limit = on;
    }
    limits.max_cost_usd = l.cost_bound();
    limits.timeout = l.deadline();
    if let Some(c) = &l.max_concurrency {
        limits.max_concurrency = *c.get_ref();
    }
    if let Some(s) = &l.stuck_loop_threshold {
        limits.stuck_loop_threshold = *s.get_ref();
    }
    if let Some(d) = &l.max_depth {
        limits.max_depth = *d.get_ref();
    }
    limits
}

/// The options of a built-in tool: its root resolved against the agent file's folder. The
/// shell never passes the agent's API key variable, whatever `env` says.
pub fn builtin_options(file: &AgentFile, t: &ToolFileSpec) -> BuiltinOptions {
    let strings = |list: &Option<Vec<toml::Spanned<String>>>| -> Vec<String> {
        list.as_deref()
            .unwrap_or_default()
            .iter()
            .map(|s| s.get_ref().clone())
            .collect()
    };
    let key_env = file.api_key_env();
    BuiltinOptions {
        root: file.resolve(t.root.as_ref().map_or(".", |r| r.get_ref().as_str())),
        max_bytes: t.max_bytes.as_ref().map(|b| *b.get_ref()),
        max_results: t.max_results.as_ref().map(|r| *r.get_ref()),
        timeout: t
            .timeout_secs
            .as_ref()
            .and_then(|secs| Duration::try_from_secs_f64(*secs.get_ref()).ok()),
        allow_private: strings(&t.allow_private),
        env: strings(&t.env)
            .into_iter()
            .filter(|v| key_env.as_ref() != Some(v))
            .collect(),
        protected: file.protected.clone(),
        sandbox: t.sandbox(file.sandbox()),
        withhold: None,
    }
}

/// How the agents of `agent` tools are built: for real (their own models and permission gates,
/// asking through the same approval), or as stand-ins that need no credentials (for `plan`).
#[derive(Clone, Copy)]
enum Kids<'a> {
    /// With the tree's hand-off targets, which the agents built set.
    Real(&'a Approval, &'a StartedMcp, &'a crate::handoff::Targets),
    StandIn,
}

/// The agent, over a given model and the tools of its started MCP servers, with a permission
/// gate when the file has one; its `agent` tools run subagents built the same way from their own
/// files.
pub fn agent(
    file: &AgentFile,
    model: Arc<dyn Model>,
    approval: &Approval,
    mcp: &StartedMcp,
) -> Result<Agent, CliError> {
    agent_with(file, model, approval, mcp, Vec::new())
}

/// [`agent`], with an application's own `tools` beside the file's (the Python package's): the
/// file's permissions, limits and definition take them in as the file's own.
pub fn agent_with(
    file: &AgentFile,
    model: Arc<dyn Model>,
    approval: &Approval,
    mcp: &StartedMcp,
    tools: Vec<agentloop::Tool>,
) -> Result<Agent, CliError> {
    let gate = gate(file, approval)?;
    let targets = crate::handoff::Targets::default();
    let agent = builder(file, model, gate, Kids::Real(approval, mcp, &targets))?
        .tools(tools)
        .build()
        .map_err(|e| CliError::Setup {
            message: format!("{}: {e}", e.code()),
        })?;
    // Each agent a hand-off reaches is built once, its own hand-offs on the same targets.
    while let Some((key, target)) = targets.unset() {
        let Some(f) = file.handoff_file(&key) else {
            return Err(CliError::Setup {
                message: format!(
                    "the agent file {} was not loaded",
                    crate::terminal::shown_path(&key)
                ),
            });
        };
        let built = if std::ptr::eq(f, file) {
            agent.clone()
        } else {
            let kids = Kids::Real(approval, mcp, &targets);
            builder(f, self::model(f)?, self::gate(f, approval)?, kids)?
                .build()
                .map_err(|e| CliError::Setup {
                    message: format!(
                        "{}: {}: {e}",
                        crate::terminal::shown_path(&f.path),
                        e.code()
                    ),
                })?
        };
        target.set(built);
    }
    Ok(agent)
}

fn builder(
    file: &AgentFile,
    model: Arc<dyn Model>,
    gate: Option<Arc<dyn Gate>>,
    kids: Kids<'_>,
) -> Result<agentloop::AgentBuilder, CliError> {
    let servers = match kids {
        Kids::Real(_, mcp, _) => mcp.servers(file),
        Kids::StandIn => None,
    };
    let mut builder = Agent::builder()
        .name(file.spec.name.get_ref().clone())
        .model(model)
        .limits(limits(file));
    builder = crate::deferred::with_tools(builder, file, all_tools(file, kids)?, servers);
    let targets = match kids {
        Kids::Real(_, _, targets) => Some(targets),
        Kids::StandIn => None,
    };
    builder = builder.tools(crate::handoff::tools(file, targets));
    builder = with_model_keys(builder, file);
    if let Some(i) = &file.instructions {
        builder = builder.instructions(i.clone());
    }
    if let Some(schema) = &file.spec.output_schema {
        builder = builder.output_schema(schema.get_ref().clone());
    }
    if let Some(gate) = gate {
        builder = builder.gate(gate);
    }
    for (key, value) in definition_parts(file) {
        builder = builder.definition_part(key, value);
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use agentloop::permissions::Permission;

    use super::*;
    use crate::agent_file::tests::TWO_TOOLS;

    fn file_in(dir: &std::path::Path, permissions: &str) -> AgentFile {
        let text = format!("{TWO_TOOLS}{permissions}");
        AgentFile::parse(&dir.join("agent.toml"), &text).unwrap()
    }

    #[test]
    fn a_saved_answer_settles_ask_for_the_tool_but_never_an_argument_rule_or_a_deny() {
        let dir = tempfile::tempdir().unwrap();
        let mut saved =
            crate::permission_file::open(dir.path().join("p.json"), Permission::Ask).unwrap();
        saved.remember("shell", Permission::Allow).unwrap();
        saved.remember("write", Permission::Allow).unwrap();
        let file = file_in(
            dir.path(),
            r#"[permissions]
default = "deny"
ask = ["shell"]
deny = ["write"]
store = "p.json"
[[permissions.rules]]
tool = "shell"
permission = "ask"
command_prefix = { field = "command", prefix = "rm" }
"#,
        );
        let store = permission_store(&file).unwrap();
        assert_eq!(
            store.decide("shell", &json!({"command": "ls"})),
            Permission::Allow,
            "the saved answer settles `ask`"
        );
        assert_eq!(
            store.decide("shell", &json!({"command": "rm -rf x"})),
            Permission::Ask,
            "never the ask rule on the arguments"
        );
        assert_eq!(store.decide("write", &json!({})), Permission::Deny);
        assert_eq!(
            store.decide("other", &json!({})),
            Permission::Deny,
            "the default"
        );
    }

    #[test]
    fn the_shell_asks_unless_the_permissions_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let agent = |permissions: &str| {
            let text = format!(
                "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\nbuiltin = \"shell\"\n[[tools]]\nbuiltin = \"read_file\"\n{permissions}"
            );
            AgentFile::parse(&dir.path().join("agent.toml"), &text).unwrap()
        };
        let bare = agent("");
        assert!(gate(&bare, &Approval::Yes).unwrap().is_some());
        let store = permission_store(&bare).unwrap();
        assert_eq!(
            store.decide("shell", &json!({"command": "ls"})),
            Permission::Ask
        );
        assert_eq!(
            store.decide("read_file", &json!({"path": "a"})),
            Permission::Allow
        );
        // A default says nothing about the shell in particular; a list does.
        let lax = permission_store(&agent("[permissions]\ndefault = \"allow\"\n")).unwrap();
        assert_eq!(
            lax.decide("shell", &json!({"command": "ls"})),
            Permission::Ask
        );
        let allowed = permission_store(&agent("[permissions]\nallow = [\"shell\"]\n")).unwrap();
        assert_eq!(
            allowed.decide("shell", &json!({"command": "ls"})),
            Permission::Allow
        );
        let ruled = agent(
            "[permissions]\n[[permissions.rules]]\ntool = \"shell\"\npermission = \"allow\"\ncommand_prefix = { field = \"command\", prefix = \"git status\" }\n",
        );
        // A rule about some commands keeps the shell's ask for the others.
        assert_eq!(builtin_permission_rules(&ruled).len(), 1);
        let store = permission_store(&ruled).unwrap();
        for (command, permission) in [
            ("git status -s", Permission::Allow),
            ("git status; rm -rf ~", Permission::Ask),
            ("python3 -c 1", Permission::Ask),
        ] {
            assert_eq!(
                store.decide("shell", &json!({ "command": command })),
                permission,
                "{command}"
            );
        }
        assert_eq!(store.unmatched("shell"), Permission::Ask);
        // Only the read_file tool: no rule to add, no gate.
        let text = "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\nbuiltin = \"read_file\"\n";
        let reader = AgentFile::parse(&dir.path().join("agent.toml"), text).unwrap();
        assert!(gate(&reader, &Approval::Yes).unwrap().is_none());
    }

    #[test]
    fn builtin_options_change_the_definition_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        let print = |options: &str| {
            let text = format!(
                "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\nbuiltin = \"read_file\"\n{options}"
            );
            fingerprint(&AgentFile::parse(&dir.path().join("agent.toml"), &text).unwrap()).unwrap()
        };
        assert_eq!(print("root = \"a\""), print("root = \"a\""));
        assert_ne!(print("root = \"a\""), print("root = \"b\""));
        assert_ne!(print(""), print("max_bytes = 100"));
    }

    #[test]
    fn a_sandbox_changes_no_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let print = |sandbox: &str| {
            let text = format!(
                "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\nbuiltin = \"shell\"\n{sandbox}\n[[mcp]]\nname = \"s\"\ncommand = [\"srv\"]\n{sandbox}\n"
            );
            fingerprint(&AgentFile::parse(&dir.path().join("agent.toml"), &text).unwrap()).unwrap()
        };
        assert_eq!(print(""), print("sandbox = \"off\""));
        assert_eq!(print(""), print("network = true"));
    }

    #[test]
    fn lists_and_argument_rules_become_rules_and_no_table_means_no_gate() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_in(
            dir.path(),
            r#"[permissions]
default = "ask"
allow = ["write"]
[[permissions.rules]]
tool = "shell"
permission = "allow"
command_prefix = { field = "command", prefix = "git status" }
[[permissions.rules]]
tool = "write"
permission = "deny"
path_glob = { field = "path", glob = "**/.env" }
"#,
        );
        let store = permission_store(&file).unwrap();
        assert_eq!(
            store.decide("shell", &json!({"command": "git status -s"})),
            Permission::Allow
        );
        assert_eq!(
            store.decide("shell", &json!({"command": "git push"})),
            Permission::Ask
        );
        assert_eq!(
            store.decide("write", &json!({"path": "src/main.rs"})),
            Permission::Allow
        );
        assert_eq!(
            store.decide("write", &json!({"path": "app/.env"})),
            Permission::Deny
        );
        let bare = file_in(dir.path(), "");
        assert!(gate(&bare, &Approval::Yes).unwrap().is_none());
        assert!(gate(&file, &Approval::Yes).unwrap().is_some());
    }
}
