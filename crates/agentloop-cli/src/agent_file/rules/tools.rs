//! `[[tools]]`: each tool's kind (a command, another agent file, a built-in), the keys that kind
//! takes, its schema, timeouts and retries, and the sandbox and network of its processes.

use std::path::Path;

use agentloop_tools::Builtin;
use serde_json::Value;
use toml::Spanned;

use super::{MAX_TOOL_RETRIES, check_seconds, span_of};
use crate::agent_file::check::{Problems, join};
use crate::agent_file::spec::{ResourcesSpec, ToolFileSpec};

pub(super) fn check_command(
    command: &Spanned<Vec<String>>,
    path: &str,
    dir: &Path,
    problems: &mut Problems,
) {
    match command.get_ref().first() {
        None => problems.at(
            &join(path, "command"),
            span_of(command),
            "the command is empty: give the program, then its arguments",
        ),
        Some(program) if program.is_empty() => problems.at(
            &join(path, "command"),
            span_of(command),
            "the program (the command's first item) is empty",
        ),
        Some(program) if program.contains('/') && !dir.join(program).exists() => problems.at(
            &join(path, "command"),
            span_of(command),
            format!(
                "the program {program} does not exist (looked at {})",
                crate::terminal::shown_path(&dir.join(program))
            ),
        ),
        Some(_) => {}
    }
}

/// Reports each key given that this kind of tool does not take.
fn misplaced(
    keys: &[(&str, bool)],
    tool: &ToolFileSpec,
    path: &str,
    why: &str,
    problems: &mut Problems,
) {
    for (key, _) in keys.iter().filter(|(_, given)| *given) {
        problems.at(&join(path, key), tool.name_span(), format!("`{key}` {why}"));
    }
}

/// A subagent tool: its file exists, and the keys of command tools are not given.
fn check_agent_tool(
    tool: &ToolFileSpec,
    agent: &Spanned<String>,
    path: &str,
    dir: &Path,
    problems: &mut Problems,
) {
    let file = dir.join(agent.get_ref());
    if agent.get_ref().trim().is_empty() || !file.is_file() {
        problems.at(
            &join(path, "agent"),
            span_of(agent),
            format!(
                "the agent file {} does not exist",
                crate::terminal::shown_path(&file)
            ),
        );
    }
    let command_only = [
        ("input_schema", tool.input_schema.is_some()),
        ("retries", tool.retries.is_some()),
        ("poller", tool.poller.is_some()),
        ("idempotent", tool.idempotent.is_some()),
        ("mode", tool.mode.is_some()),
    ];
    misplaced(
        &command_only,
        tool,
        path,
        "is for command tools; a subagent's input is its `task`",
        problems,
    );
    if let Some(c) = &tool.max_cost_usd
        && !(c.get_ref().is_finite() && *c.get_ref() >= 0.0)
    {
        problems.at(
            &join(path, "max_cost_usd"),
            span_of(c),
            "max_cost_usd must be a number of at least 0",
        );
    }
}

/// A remote agent over A2A: an http(s) URL, and only the keys such a tool reads (its name,
/// description, timeout, mode and output bound).
fn check_a2a_tool(tool: &ToolFileSpec, url: &Spanned<String>, path: &str, problems: &mut Problems) {
    let u = url.get_ref();
    let scheme_ok = u.starts_with("http://") || u.starts_with("https://");
    if !scheme_ok
        || u.contains(char::is_whitespace)
        || u.split("://").nth(1).is_none_or(str::is_empty)
    {
        problems.at(
            &join(path, "a2a"),
            span_of(url),
            format!("{u:?} is not an http:// or https:// URL of an A2A agent"),
        );
    }
    let not_remote = [
        ("input_schema", tool.input_schema.is_some()),
        ("retries", tool.retries.is_some()),
        ("poller", tool.poller.is_some()),
        ("idempotent", tool.idempotent.is_some()),
    ];
    misplaced(
        &not_remote,
        tool,
        path,
        "does not apply to `a2a` tools: a remote agent's input is its `task`",
        problems,
    );
    if let Some(max) = &tool.max_bytes
        && *max.get_ref() == 0
    {
        problems.at(
            &join(path, "max_bytes"),
            span_of(max),
            "max_bytes must be at least 1: it is the most bytes of the remote agent's answer the \
             model reads",
        );
    }
}

/// A built-in tool: a known one, its root an existing folder, and only the keys it reads.
fn check_builtin_tool(
    tool: &ToolFileSpec,
    builtin: &Spanned<String>,
    path: &str,
    dir: &Path,
    problems: &mut Problems,
) {
    let Some(kind) = Builtin::from_name(builtin.get_ref()) else {
        let known: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
        problems.at(
            &join(path, "builtin"),
            span_of(builtin),
            format!(
                "no built-in tool {:?} (built-in tools: {})",
                builtin.get_ref(),
                known.join(", ")
            ),
        );
        return;
    };
    let not_builtin = [
        ("description", tool.description.is_some()),
        ("input_schema", tool.input_schema.is_some()),
        ("mode", tool.mode.is_some()),
        ("retries", tool.retries.is_some()),
        ("poller", tool.poller.is_some()),
        ("idempotent", tool.idempotent.is_some()),
    ];
    misplaced(
        &not_builtin,
        tool,
        path,
        "does not apply to built-in tools: they describe themselves",
        problems,
    );
    let searches = matches!(kind, Builtin::ListDir | Builtin::Glob | Builtin::Grep);
    let timed = matches!(kind, Builtin::Shell | Builtin::WebFetch);
    let others = [
        ("root", tool.root.is_some() && !kind.uses_root()),
        (
            "max_bytes",
            tool.max_bytes.is_some()
                && matches!(
                    kind,
                    Builtin::WriteFile | Builtin::EditFile | Builtin::Todo | Builtin::AskUser
                ),
        ),
        ("max_results", tool.max_results.is_some() && !searches),
        ("timeout_secs", tool.timeout_secs.is_some() && !timed),
        (
            "allow_private",
            tool.allow_private.is_some() && kind != Builtin::WebFetch,
        ),
        ("env", tool.env.is_some() && kind != Builtin::Shell),
        ("sandbox", tool.sandbox.is_some() && kind != Builtin::Shell),
        ("network", tool.network.is_some() && kind != Builtin::Shell),
        (
            "unix_sockets",
            tool.unix_sockets.is_some() && kind != Builtin::Shell,
        ),
        (
            "resources",
            tool.resources.is_some() && kind != Builtin::Shell,
        ),
    ];
    misplaced(
        &others,
        tool,
        path,
        &format!("does not apply to the built-in tool {kind}"),
        problems,
    );
    if kind.uses_root() {
        check_root(tool, path, dir, problems);
    }
    for (key, value) in [
        ("max_bytes", &tool.max_bytes),
        ("max_results", &tool.max_results),
    ] {
        if let Some(v) = value
            && *v.get_ref() == 0
        {
            problems.at(
                &join(path, key),
                span_of(v),
                format!("{key} must be at least 1"),
            );
        }
    }
    for (i, entry) in tool
        .allow_private
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if let Err(e) = agentloop_tools::WebFetchTool::new().allow(entry.get_ref()) {
            problems.at(
                &format!("{}[{i}]", join(path, "allow_private")),
                span_of(entry),
                e.to_string(),
            );
        }
    }
    check_env_names(tool, path, problems);
}

/// A shell's or command tool's `env`: variable names, none a secret (never passed whatever the
/// file says).
fn check_env_names(tool: &ToolFileSpec, path: &str, problems: &mut Problems) {
    for (i, var) in tool.env.as_deref().unwrap_or_default().iter().enumerate() {
        let v = var.get_ref();
        let message = if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            format!("{v:?} is not an environment variable name")
        } else if agentloop_tools::is_secret_env(v) {
            format!("{v} looks like a secret: a tool's process is never given it")
        } else {
            continue;
        };
        problems.at(
            &format!("{}[{i}]", join(path, "env")),
            span_of(var),
            message,
        );
    }
}

/// A tool's `root`, when given: an existing folder.
fn check_root(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    if let Some(root) = &tool.root
        && !dir.join(root.get_ref()).is_dir()
    {
        problems.at(
            &join(path, "root"),
            span_of(root),
            format!(
                "the root {} is not an existing folder",
                crate::terminal::shown_path(&dir.join(root.get_ref()))
            ),
        );
    }
}

/// A command tool's own keys: its `root` an existing folder, its `env` names.
fn check_command_tool(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    check_root(tool, path, dir, problems);
    check_env_names(tool, path, problems);
}

/// The sandbox keys of an entry whose processes may be sandboxed (a tool, an MCP server): its flags
/// under its own `sandbox = "off"`, and its resource limits.
pub(super) fn check_process_sandbox(
    sandbox: Option<agentloop_tools::SandboxMode>,
    network: Option<&Spanned<bool>>,
    unix_sockets: Option<&Spanned<bool>>,
    resources: Option<&Spanned<ResourcesSpec>>,
    path: &str,
    problems: &mut Problems,
) {
    check_network_key("network", sandbox, network, path, problems);
    check_network_key("unix_sockets", sandbox, unix_sockets, path, problems);
    check_resources(resources, path, problems);
}

/// A sandbox flag (`network`, `unix_sockets`) under an entry's own `sandbox = "off"`: nothing is
/// confined, so it says nothing.
fn check_network_key(
    key: &str,
    sandbox: Option<agentloop_tools::SandboxMode>,
    flag: Option<&Spanned<bool>>,
    path: &str,
    problems: &mut Problems,
) {
    if let (Some(agentloop_tools::SandboxMode::Off), Some(n)) = (sandbox, flag) {
        problems.at(
            &join(path, key),
            span_of(n),
            format!("`{key}` has no effect with sandbox = \"off\": nothing is confined"),
        );
    }
}

/// `resources`: a limit of 0 would keep the process from starting (or from opening its own
/// program), so each must be at least 1.
fn check_resources(
    resources: Option<&Spanned<ResourcesSpec>>,
    path: &str,
    problems: &mut Problems,
) {
    let Some(resources) = resources else { return };
    for (key, value) in resources.get_ref().given() {
        if *value.get_ref() == 0 {
            problems.at(
                &join(&join(path, "resources"), key),
                span_of(value),
                format!("`{key}` must be at least 1"),
            );
        }
    }
}

/// Tool names (valid, unique) and each tool's own rules; `tools` pairs each with its key path.
pub(super) fn check_tools(tools: &[(String, &ToolFileSpec)], dir: &Path, problems: &mut Problems) {
    let mut seen: Vec<&str> = Vec::new();
    for (path, tool) in tools {
        let name = tool.name();
        if let Err(reason) = agentloop::tool::check_tool_name(name) {
            problems.at(
                &join(path, "name"),
                tool.name_span(),
                format!("invalid tool name {name:?}: {reason}"),
            );
        } else if seen.contains(&name) {
            problems.at(
                &join(path, "name"),
                tool.name_span(),
                format!("the tool name {name:?} is used twice"),
            );
        }
        seen.push(name);
        check_tool(tool, path, dir, problems);
    }
}

/// One `[[tools]]` entry: its kind's own checks, then the keys that belong to other kinds, its
/// schema, timeout and retries.
fn check_tool(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    check_tool_kind(tool, path, dir, problems);
    if tool.builtin.is_none() {
        // A command tool takes a `root` and an `env` too.
        let not_command = tool.command.is_none();
        let builtin_only = [
            ("root", tool.root.is_some() && not_command),
            ("max_bytes", tool.max_bytes.is_some() && tool.a2a.is_none()),
            ("max_results", tool.max_results.is_some()),
            ("allow_private", tool.allow_private.is_some()),
            ("env", tool.env.is_some() && not_command),
        ];
        misplaced(
            &builtin_only,
            tool,
            path,
            "is for built-in tools (`builtin = ...`)",
            problems,
        );
        let process_only = [
            ("sandbox", tool.sandbox.is_some() && not_command),
            ("network", tool.network.is_some() && not_command),
            ("unix_sockets", tool.unix_sockets.is_some() && not_command),
            ("resources", tool.resources.is_some() && not_command),
        ];
        misplaced(
            &process_only,
            tool,
            path,
            "is for the shell and command tools: the processes they start run in it",
            problems,
        );
    }
    check_process_sandbox(
        tool.sandbox,
        tool.network.as_ref(),
        tool.unix_sockets.as_ref(),
        tool.resources.as_ref(),
        path,
        problems,
    );
    if let Some(schema) = &tool.input_schema {
        check_input_schema(schema, path, problems);
    }
    check_seconds(path, "timeout_secs", tool.timeout_secs.as_ref(), problems);
    if tool.agent.is_none() {
        let agent_only = [
            ("fatal", tool.fatal.is_some()),
            ("max_turns", tool.max_turns.is_some()),
            ("max_tool_calls", tool.max_tool_calls.is_some()),
            ("max_tokens", tool.max_tokens.is_some()),
            ("max_cost_usd", tool.max_cost_usd.is_some()),
        ];
        misplaced(
            &agent_only,
            tool,
            path,
            "is for `agent` tools (subagents)",
            problems,
        );
    }
    if let Some(r) = &tool.retries
        && *r.get_ref() > MAX_TOOL_RETRIES
    {
        problems.at(
            &join(path, "retries"),
            span_of(r),
            format!("retries is at most {MAX_TOOL_RETRIES}"),
        );
    }
}

/// Exactly one of `command`, `agent`, `builtin` and `a2a`, and that kind's own checks.
fn check_tool_kind(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    match (&tool.command, &tool.agent, &tool.builtin, &tool.a2a) {
        (Some(command), None, None, None) => {
            check_command(command, path, dir, problems);
            check_command_tool(tool, path, dir, problems);
        }
        (None, Some(agent), None, None) => check_agent_tool(tool, agent, path, dir, problems),
        (None, None, Some(builtin), None) => check_builtin_tool(tool, builtin, path, dir, problems),
        (None, None, None, Some(url)) => check_a2a_tool(tool, url, path, problems),
        // Reported with the file's shape (`check_keys`).
        (None, None, None, None) => {}
        (_, _, _, _) => {
            let (key, span) = match (&tool.builtin, &tool.agent, &tool.a2a) {
                (Some(b), _, _) => ("builtin", span_of(b)),
                (None, _, Some(u)) => ("a2a", span_of(u)),
                (None, a, None) => ("agent", a.as_ref().and_then(span_of)),
            };
            let given: Vec<String> = [
                ("command", tool.command.is_some()),
                ("agent", tool.agent.is_some()),
                ("builtin", tool.builtin.is_some()),
                ("a2a", tool.a2a.is_some()),
            ]
            .into_iter()
            .filter(|(_, given)| *given)
            .map(|(k, _)| format!("`{k}`"))
            .collect();
            problems.at(
                &join(path, key),
                span,
                format!(
                    "give one of `command` (a command tool), `agent` (another agent file), \
                     `builtin` (a built-in tool) or `a2a` (a remote agent), not both {}",
                    given.join(" and ")
                ),
            );
        }
    }
}

/// A tool's `input_schema`: a table that describes an object, and a valid JSON Schema.
fn check_input_schema(schema: &Spanned<Value>, path: &str, problems: &mut Problems) {
    let key = join(path, "input_schema");
    match schema.get_ref() {
        Value::Object(map) => {
            if map.get("type").is_some_and(|t| t != "object") {
                problems.at(
                    &key,
                    span_of(schema),
                    "the input schema must describe an object (`type = \"object\"`)",
                );
            } else if let Err(e) = agentloop::tool::check_schema(schema.get_ref()) {
                problems.at(
                    &key,
                    span_of(schema),
                    format!("not a valid JSON Schema: {e}"),
                );
            }
        }
        other => problems.at(
            &key,
            span_of(schema),
            format!("the input schema must be a table, not {other}"),
        ),
    }
}
