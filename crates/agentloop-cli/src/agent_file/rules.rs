//! The rules of the agent file that no type can say: a tool name, a schema, a script file, what
//! belongs to which provider, which tools `[permissions]` may name. They run on the typed file,
//! still with spans; when some sections have shape problems, the rules still run on every section
//! whose shape is right.

use std::ops::Range;
use std::path::Path;

use agentloop::permissions::Permission;
use agentloop_tools::Builtin;
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::check::{Problems, join};
use super::spec::{
    AgentFileSpec, LimitsSpec, McpFileSpec, ModelSpec, PermissionRuleSpec, PermissionsSpec,
    PriceSpec, Provider, ToolFileSpec,
};

fn span_of<T>(s: &Spanned<T>) -> Option<Range<usize>> {
    Some(s.span())
}

/// The rules no type says. Returns the instructions text when it could be read.
pub(super) fn check_rules(
    spec: &AgentFileSpec,
    dir: &Path,
    problems: &mut Problems,
) -> Option<String> {
    let name = &spec.name;
    if name.get_ref().trim().is_empty() {
        problems.at("name", span_of(name), "the agent's name is empty");
    }
    let instructions = match (&spec.instructions, &spec.instructions_file) {
        (Some(_), Some(file)) => {
            problems.at(
                "instructions_file",
                span_of(file),
                "give `instructions` or `instructions_file`, not both",
            );
            None
        }
        (Some(text), None) => Some(text.get_ref().clone()),
        (None, Some(file)) => match std::fs::read_to_string(dir.join(file.get_ref())) {
            Ok(text) => Some(text),
            Err(e) => {
                problems.at(
                    "instructions_file",
                    span_of(file),
                    format!("cannot read {}: {e}", dir.join(file.get_ref()).display()),
                );
                None
            }
        },
        (None, None) => None,
    };
    if let Some(schema) = &spec.output_schema
        && let Err(e) = agentloop::tool::check_schema(schema.get_ref())
    {
        problems.at(
            "output_schema",
            span_of(schema),
            format!("not a valid JSON Schema: {e}"),
        );
    }
    check_model(spec.model.get_ref(), dir, problems);
    if let Some(limits) = &spec.limits {
        check_limits(limits, problems);
        check_budget_priced(limits, spec.model.get_ref(), problems);
    }
    let tools: Vec<(String, &ToolFileSpec)> = spec
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("tools[{i}]"), t))
        .collect();
    check_tools(&tools, dir, problems);
    let servers = spec.mcp.as_deref().unwrap_or_default();
    check_mcp(servers, dir, problems);
    if let Some(permissions) = &spec.permissions {
        let mut names: Vec<&str> = tools.iter().map(|(_, t)| t.name()).collect();
        names.extend(servers.iter().flat_map(|s| {
            s.rename
                .iter()
                .flat_map(|r| r.get_ref().values().map(String::as_str))
        }));
        let prefixes: Vec<String> = servers
            .iter()
            .map(|s| s.config(dir).tool_name(""))
            .collect();
        let arguments: Vec<(&str, Option<Vec<String>>)> = tools
            .iter()
            .map(|(_, t)| (t.name(), tool_arguments(t)))
            .collect();
        let declared = Declared {
            names: &names,
            mcp_prefixes: &prefixes,
            arguments: &arguments,
        };
        check_permissions(permissions, &declared, dir, problems);
    }
    instructions
}

/// The tools a file declares: its `[[tools]]` by name and `[[mcp]]` renames, and its MCP servers'
/// tools by prefix (which tools a server has is known only once it runs).
struct Declared<'a> {
    names: &'a [&'a str],
    mcp_prefixes: &'a [String],
    /// The arguments of the `[[tools]]`, by name, where the file says what they are.
    arguments: &'a [(&'a str, Option<Vec<String>>)],
}

impl Declared<'_> {
    /// The arguments of a declared tool, when they are known.
    fn arguments_of(&self, name: &str) -> Option<&[String]> {
        self.arguments
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, a)| a.as_deref())
    }

    /// True when every tool's arguments are known: no MCP tools, and every `[[tools]]` entry's.
    fn all_arguments_known(&self) -> bool {
        self.mcp_prefixes.is_empty() && self.names.iter().all(|n| self.arguments_of(n).is_some())
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains(&name)
            || self
                .mcp_prefixes
                .iter()
                .any(|p| !p.is_empty() && name.len() > p.len() && name.starts_with(p.as_str()))
            // A server whose tools keep their own names may have any tool.
            || self.mcp_prefixes.iter().any(String::is_empty)
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.names.is_empty() {
            parts.push(format!("declared: {}", self.names.join(", ")));
        }
        if !self.mcp_prefixes.is_empty() {
            let globs: Vec<String> = self.mcp_prefixes.iter().map(|p| format!("{p}*")).collect();
            parts.push(format!("MCP tools: {}", globs.join(", ")));
        }
        if parts.is_empty() {
            "the file declares no tools".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// `[[mcp]]`: a name a tool name may start with, used once; a command or a URL, not both, with
/// only the keys its kind takes; a timeout, a prefix and renames that make valid names; templates
/// that expand.
fn check_mcp(servers: &[McpFileSpec], dir: &Path, problems: &mut Problems) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let path = format!("mcp[{i}]");
        let name = server.name.get_ref().as_str();
        if let Err(reason) = agentloop::tool::check_tool_name(name) {
            problems.at(
                &join(&path, "name"),
                span_of(&server.name),
                format!("invalid MCP server name {name:?}: {reason}"),
            );
        } else if seen.contains(&name) {
            problems.at(
                &join(&path, "name"),
                span_of(&server.name),
                format!("the MCP server name {name:?} is used twice"),
            );
        }
        seen.push(name);
        match (&server.command, &server.url) {
            (Some(command), None) => check_command(command, &path, dir, problems),
            (None, Some(url)) => {
                let u = url.get_ref();
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    problems.at(
                        &join(&path, "url"),
                        span_of(url),
                        format!("the url {u:?} is not http:// or https://"),
                    );
                }
            }
            (Some(_), Some(url)) => problems.at(
                &join(&path, "url"),
                span_of(url),
                "give `command` (a stdio server) or `url` (a streamable HTTP server), not both",
            ),
            (None, None) => problems.at(
                &path,
                span_of(&server.name),
                "give `command` (a stdio server) or `url` (a streamable HTTP server)",
            ),
        }
        if let (Some(env), None) = (&server.env, &server.command) {
            problems.at(
                &join(&path, "env"),
                span_of(env),
                "`env` is for a stdio server (`command`)",
            );
        }
        if server.url.is_some() {
            for (key, given) in [
                ("sandbox", server.sandbox.is_some()),
                ("network", server.network.is_some()),
            ] {
                if given {
                    problems.at(
                        &join(&path, key),
                        span_of(&server.name),
                        format!(
                            "`{key}` is for a stdio server (`command`): it sandboxes its process"
                        ),
                    );
                }
            }
        }
        check_network(server.sandbox, server.network.as_ref(), &path, problems);
        if let (Some(headers), None) = (&server.headers, &server.url) {
            problems.at(
                &join(&path, "headers"),
                span_of(headers),
                "`headers` is for an HTTP server (`url`)",
            );
        }
        for (key, map) in [("env", &server.env), ("headers", &server.headers)] {
            let Some(map) = map else { continue };
            for (k, template) in map.get_ref() {
                // Only the shape is checked here: the variables are read when the server starts.
                if let Err(e) =
                    agentloop_mcp::expand_template(name, k, template, |_| Some(String::new()))
                {
                    problems.at(&join(&path, key), span_of(map), e.to_string());
                }
            }
        }
        if let Some(secs) = &server.timeout_secs
            && !valid_seconds(*secs.get_ref())
        {
            problems.at(
                &join(&path, "timeout_secs"),
                span_of(secs),
                format!("the timeout must be more than 0 and at most {MAX_TIMEOUT_SECS} seconds"),
            );
        }
        if let Some(prefix) = &server.prefix
            && !prefix.get_ref().is_empty()
            && let Err(reason) = agentloop::tool::check_tool_name(&format!("{}x", prefix.get_ref()))
        {
            problems.at(
                &join(&path, "prefix"),
                span_of(prefix),
                format!("the prefix cannot start a tool name: {reason}"),
            );
        }
        if let Some(rename) = &server.rename {
            for (from, to) in rename.get_ref() {
                if let Err(reason) = agentloop::tool::check_tool_name(to) {
                    problems.at(
                        &join(&path, "rename"),
                        span_of(rename),
                        format!("the new name of {from:?} is not a valid tool name: {reason}"),
                    );
                }
            }
        }
    }
}

/// The arguments a `[[tools]]` entry takes: the top-level `properties` of its input schema (a
/// built-in tool's own, a command tool's `input_schema`, an agent tool's `task` unless it gives
/// one). `None` when the schema does not list them (a command tool without `input_schema`).
fn tool_arguments(tool: &ToolFileSpec) -> Option<Vec<String>> {
    let schema = match (&tool.builtin, &tool.input_schema) {
        (Some(b), _) => {
            // A built-in tool's schema does not depend on its root; any folder builds it.
            let options = agentloop_tools::BuiltinOptions::rooted(std::env::temp_dir());
            Builtin::from_name(b.get_ref())?
                .tool_named(tool.name(), &options)
                .ok()?
                .spec()
                .input_schema
                .clone()
        }
        (None, Some(schema)) => schema.get_ref().clone(),
        (None, None) if tool.agent.is_some() => return Some(vec!["task".to_owned()]),
        // A command tool without a schema lists no arguments and refuses none.
        (None, None) => return None,
    };
    let properties = schema.get("properties")?.as_object()?;
    Some(properties.keys().cloned().collect())
}

/// The tool names of a file whose shape may be wrong: every `[[tools]]` entry's `name` that is a
/// string.
fn raw_tool_names(root: &DeTable<'_>) -> Vec<String> {
    fn named<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t DeValue<'i>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.get_ref())
    }
    let Some(DeValue::Array(items)) = named(root, "tools") else {
        return Vec::new();
    };
    // A built-in tool is called by its own name unless it is given one.
    items
        .iter()
        .filter_map(|item| item.get_ref().as_table())
        .filter_map(|t| named(t, "name").or_else(|| named(t, "builtin")))
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

/// The tool-name prefixes of the `[[mcp]]` entries of a file whose shape may be wrong.
fn raw_mcp_prefixes(root: &DeTable<'_>) -> Vec<String> {
    let Some(DeValue::Array(items)) = root
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == "mcp")
        .map(|(_, v)| v.get_ref())
    else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| item.get_ref().as_table())
        .filter_map(|t| {
            let get = |key: &str| {
                t.iter()
                    .find(|(k, _)| k.get_ref().as_ref() == key)
                    .and_then(|(_, v)| v.get_ref().as_str().map(str::to_owned))
            };
            get("prefix").or_else(|| get("name").map(|n| format!("{n}__")))
        })
        .collect()
}

/// `[permissions]`: every listed tool is declared and listed once, rules name declared tools (or
/// `*`) with at most one argument match each, globs compile, and the store file, when it exists,
/// reads.
fn check_permissions(
    permissions: &PermissionsSpec,
    tools: &Declared<'_>,
    dir: &Path,
    problems: &mut Problems,
) {
    let declared = tools.describe();
    check_permission_lists(permissions, tools, &declared, problems);
    let rules = permissions.rules.as_deref().unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("permissions.rules[{i}]");
        check_permission_rule(rule, &path, tools, &declared, problems);
    }
    if let Some(store) = &permissions.store {
        if store.get_ref().trim().is_empty() {
            problems.at(
                "permissions.store",
                span_of(store),
                "the store path is empty",
            );
        } else if let Err(e) =
            crate::permission_file::open(dir.join(store.get_ref()), Permission::Allow)
        {
            problems.at("permissions.store", span_of(store), e.to_string());
        }
    }
}

/// `allow`, `ask` and `deny`: each name a declared tool, and no tool in two places.
fn check_permission_lists(
    permissions: &PermissionsSpec,
    tools: &Declared<'_>,
    declared: &str,
    problems: &mut Problems,
) {
    let mut listed: Vec<(&str, &str)> = Vec::new();
    for (list, names) in [
        ("allow", &permissions.allow),
        ("ask", &permissions.ask),
        ("deny", &permissions.deny),
    ] {
        for (i, name) in names.as_deref().unwrap_or_default().iter().enumerate() {
            let path = format!("permissions.{list}[{i}]");
            let n = name.get_ref().as_str();
            if !tools.contains(n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("no tool named {n:?} ({declared})"),
                );
            } else if let Some((_, first)) = listed.iter().find(|(t, _)| *t == n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("the tool {n:?} is already listed in `{first}`"),
                );
            }
            listed.push((n, list));
        }
    }
}

/// One `[[permissions.rules]]` entry at `path`: a declared tool (or `*`), a prefix with words in
/// it, not both argument matches, a glob that compiles.
fn check_permission_rule(
    rule: &PermissionRuleSpec,
    path: &str,
    tools: &Declared<'_>,
    declared: &str,
    problems: &mut Problems,
) {
    let n = rule.tool.get_ref().as_str();
    if n != "*" && !tools.contains(n) {
        problems.at(
            &join(path, "tool"),
            span_of(&rule.tool),
            format!("no tool named {n:?} ({declared}; `*` means any tool)"),
        );
    }
    if let Some(prefix) = &rule.command_prefix
        && prefix.prefix.get_ref().trim().is_empty()
    {
        problems.at(
            &join(path, "command_prefix.prefix"),
            span_of(&prefix.prefix),
            "the prefix is empty",
        );
    }
    check_rule_field(rule, path, tools, problems);
    if let Some(glob) = &rule.path_glob {
        if rule.command_prefix.is_some() {
            problems.at(
                &join(path, "path_glob"),
                span_of(glob),
                "give `command_prefix` or `path_glob`, not both",
            );
        }
        let g = &glob.get_ref().glob;
        if let Err(e) = globset::GlobBuilder::new(g.get_ref())
            .literal_separator(true)
            .build()
        {
            problems.at(
                &join(path, "path_glob.glob"),
                span_of(g),
                format!("not a valid glob: {}", e.kind()),
            );
        }
    }
}

/// A rule's `field` is an argument of its tool's input schema (for `*`, of some declared tool):
/// a rule on an argument the tool does not take would never match, silently.
fn check_rule_field(
    rule: &PermissionRuleSpec,
    path: &str,
    tools: &Declared<'_>,
    problems: &mut Problems,
) {
    let (field, key) = match (&rule.command_prefix, &rule.path_glob) {
        (Some(c), _) => (&c.field, "command_prefix.field"),
        (None, Some(g)) => (&g.get_ref().field, "path_glob.field"),
        (None, None) => return,
    };
    let f = field.get_ref().as_str();
    let n = rule.tool.get_ref().as_str();
    if n == "*" {
        let taken = tools.names.iter().any(|t| {
            tools
                .arguments_of(t)
                .is_some_and(|a| a.iter().any(|x| x == f))
        });
        if !taken && tools.all_arguments_known() {
            problems.at(
                &join(path, key),
                span_of(field),
                format!("no declared tool has an argument {f:?}, so the rule would never match"),
            );
        }
    } else if let Some(arguments) = tools.arguments_of(n)
        && !arguments.iter().any(|a| a == f)
    {
        let has = if arguments.is_empty() {
            "it takes none".to_owned()
        } else {
            format!("its arguments: {}", arguments.join(", "))
        };
        problems.at(
            &join(path, key),
            span_of(field),
            format!("the tool {n:?} has no argument {f:?} ({has}), so the rule would never match"),
        );
    }
}

fn check_command(command: &Spanned<Vec<String>>, path: &str, dir: &Path, problems: &mut Problems) {
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
                dir.join(program).display()
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
            format!("the agent file {} does not exist", file.display()),
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
                && matches!(kind, Builtin::WriteFile | Builtin::EditFile | Builtin::Todo),
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
                dir.join(root.get_ref()).display()
            ),
        );
    }
}

/// A command tool's own keys: its `root` an existing folder, its `env` names.
fn check_command_tool(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    check_root(tool, path, dir, problems);
    check_env_names(tool, path, problems);
}

/// `network` under an entry's own `sandbox = "off"`: nothing is confined, so it says nothing.
fn check_network(
    sandbox: Option<agentloop_tools::SandboxMode>,
    network: Option<&Spanned<bool>>,
    path: &str,
    problems: &mut Problems,
) {
    if let (Some(agentloop_tools::SandboxMode::Off), Some(n)) = (sandbox, network) {
        problems.at(
            &join(path, "network"),
            span_of(n),
            "`network` has no effect with sandbox = \"off\": nothing is confined",
        );
    }
}

/// Tool names (valid, unique) and each tool's own rules; `tools` pairs each with its key path.
fn check_tools(tools: &[(String, &ToolFileSpec)], dir: &Path, problems: &mut Problems) {
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

/// When the file's shape has problems, the rules still run on every section whose shape is
/// right, so that one pass reports all it can.
pub(super) fn check_clean_sections(root: &DeTable<'_>, dir: &Path, problems: &mut Problems) {
    let dirty = |problems: &Problems, prefix: &str| {
        problems.list().iter().any(|p| {
            p.path == prefix
                || p.path.starts_with(&format!("{prefix}."))
                || p.path.starts_with(&format!("{prefix}["))
        })
    };
    let get = |key: &str| {
        root.iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.clone())
    };
    if let Some(v) = get("model")
        && !dirty(problems, "model")
        && let Ok(model) = ModelSpec::deserialize(ValueDeserializer::from(v))
    {
        check_model(&model, dir, problems);
    }
    if let Some(v) = get("limits")
        && !dirty(problems, "limits")
        && let Ok(limits) = LimitsSpec::deserialize(ValueDeserializer::from(v))
    {
        check_limits(&limits, problems);
    }
    if let Some(v) = get("permissions")
        && !dirty(problems, "permissions")
        && let Ok(permissions) = PermissionsSpec::deserialize(ValueDeserializer::from(v))
    {
        let names = raw_tool_names(root);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let prefixes = raw_mcp_prefixes(root);
        // Only the tools whose shape is right say what their arguments are.
        let items = get("tools");
        let clean: Vec<ToolFileSpec> = items
            .as_ref()
            .and_then(|items| items.get_ref().as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(i, _)| !dirty(problems, &format!("tools[{i}]")))
            .filter_map(|(_, item)| {
                ToolFileSpec::deserialize(ValueDeserializer::from(item.clone())).ok()
            })
            .collect();
        let arguments: Vec<(&str, Option<Vec<String>>)> = clean
            .iter()
            .map(|t| (t.name(), tool_arguments(t)))
            .collect();
        let declared = Declared {
            names: &names,
            mcp_prefixes: &prefixes,
            arguments: &arguments,
        };
        check_permissions(&permissions, &declared, dir, problems);
    }
    let Some(items) = get("tools") else { return };
    let Some(items) = items.get_ref().as_array() else {
        return;
    };
    let parsed: Vec<(String, ToolFileSpec)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| (format!("tools[{i}]"), item))
        .filter(|(path, _)| !dirty(problems, path))
        .filter_map(|(path, item)| {
            ToolFileSpec::deserialize(ValueDeserializer::from(item.clone()))
                .ok()
                .map(|t| (path, t))
        })
        .collect();
    let tools: Vec<(String, &ToolFileSpec)> = parsed.iter().map(|(p, t)| (p.clone(), t)).collect();
    check_tools(&tools, dir, problems);
}

/// `[model]`: what its provider needs and allows, then the sampling settings and the price.
fn check_model(model: &ModelSpec, dir: &Path, problems: &mut Problems) {
    if let Some(t) = &model.context_tokens {
        let reserve = model
            .max_tokens
            .as_ref()
            .map_or(0, |m| u64::from(*m.get_ref()));
        if *t.get_ref() < 256 || *t.get_ref() <= reserve {
            problems.at(
                "model.context_tokens",
                span_of(t),
                "context_tokens must be at least 256 and more than max_tokens (the room kept \
                 for the answer)",
            );
        }
    }
    if let Some(k) = &model.compaction_keep_turns
        && *k.get_ref() == 0
    {
        problems.at(
            "model.compaction_keep_turns",
            span_of(k),
            "compaction_keep_turns must be at least 1: the latest turn always stays whole",
        );
    }
    if let Some(t) = &model.cache_ttl_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            "model.cache_ttl_secs",
            span_of(t),
            "cache_ttl_secs must be a positive number of seconds, at most a year",
        );
    }
    if let Some(t) = &model.idle_timeout_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            "model.idle_timeout_secs",
            span_of(t),
            "idle_timeout_secs must be a positive number of seconds, at most a year",
        );
    }
    check_provider_keys(model, problems);
    if *model.provider.get_ref() == Provider::Scripted {
        check_scripted_model(model, dir, problems);
    } else {
        check_live_model(model, problems);
    }
    if let Some(t) = &model.temperature
        && !(0.0..=2.0).contains(t.get_ref())
    {
        problems.at(
            "model.temperature",
            span_of(t),
            "the temperature must be between 0 and 2",
        );
    }
    if let Some(price) = &model.price {
        check_price(price.get_ref(), problems);
    }
    if let Some(m) = &model.max_tokens
        && *m.get_ref() == 0
    {
        problems.at(
            "model.max_tokens",
            span_of(m),
            "max_tokens must be at least 1",
        );
    }
}

/// The `[model]` keys of one provider's options, used with another provider.
fn check_provider_keys(model: &ModelSpec, problems: &mut Problems) {
    let provider = *model.provider.get_ref();
    let keys = [
        (
            "reasoning_content",
            Provider::OpenAi,
            model.reasoning_content.as_ref().map(span_of),
        ),
        (
            "tool_call_extra",
            Provider::OpenAi,
            model.tool_call_extra.as_ref().map(span_of),
        ),
        (
            "prompt_cache_key",
            Provider::OpenAi,
            model.prompt_cache_key.as_ref().map(span_of),
        ),
        (
            "prompt_caching",
            Provider::Anthropic,
            model.prompt_caching.as_ref().map(span_of),
        ),
        (
            "tool_dialect",
            Provider::OpenAi,
            model.tool_dialect.as_ref().map(span_of),
        ),
    ];
    for (key, owner, span) in keys {
        if let Some(span) = span
            && provider != owner
        {
            problems.at(
                &join("model", key),
                span,
                format!(
                    "`{key}` applies to the {} provider only, not {}",
                    owner.as_str(),
                    provider.as_str()
                ),
            );
        }
    }
    if let Some(d) = &model.tool_dialect
        && agentloop_providers::openai_chat::ToolDialect::from_name(d.get_ref()).is_none()
    {
        problems.at(
            "model.tool_dialect",
            span_of(d),
            format!(
                "unknown tool_dialect {:?}: one of {}",
                d.get_ref(),
                agentloop_providers::openai_chat::ToolDialect::NAMES
                    .map(|n| format!("{n:?}"))
                    .join(", ")
            ),
        );
    }
    if let Some(key) = &model.prompt_cache_key
        && key.get_ref().trim().is_empty()
    {
        problems.at(
            "model.prompt_cache_key",
            span_of(key),
            "prompt_cache_key is empty: give \"auto\", \"off\" or a key",
        );
    }
}

/// A scripted model: a script that reads, and none of a live provider's keys.
fn check_scripted_model(model: &ModelSpec, dir: &Path, problems: &mut Problems) {
    let live_only = |problems: &mut Problems, key: &str, span: Option<Range<usize>>| {
        problems.at(
            &join("model", key),
            span,
            format!("`{key}` does not apply to the scripted provider"),
        );
    };
    match &model.script {
        None => problems.at(
            "model.script",
            span_of(&model.provider),
            "the scripted provider needs `script`: a JSON file of responses, in order",
        ),
        Some(script) => {
            let path = dir.join(script.get_ref());
            if let Err(e) = crate::assemble::read_script(&path) {
                problems.at("model.script", span_of(script), e.to_string());
            }
        }
    }
    if let Some(v) = &model.base_url {
        live_only(problems, "base_url", span_of(v));
    }
    if let Some(v) = &model.api_key_env {
        live_only(problems, "api_key_env", span_of(v));
    }
    if let Some(v) = &model.idle_timeout_secs {
        live_only(problems, "idle_timeout_secs", span_of(v));
    }
}

/// A live model: a name, an http(s) URL, an environment variable name, and no script.
fn check_live_model(model: &ModelSpec, problems: &mut Problems) {
    let provider = *model.provider.get_ref();
    if let Some(script) = &model.script {
        problems.at(
            "model.script",
            span_of(script),
            format!(
                "`script` is for the scripted provider only, not {}",
                provider.as_str()
            ),
        );
    }
    match &model.name {
        None => problems.at(
            "model.name",
            span_of(&model.provider),
            format!("the {} provider needs a model `name`", provider.as_str()),
        ),
        Some(n) if n.get_ref().trim().is_empty() => {
            problems.at("model.name", span_of(n), "the model name is empty")
        }
        Some(_) => {}
    }
    if let Some(url) = &model.base_url {
        let u = url.get_ref();
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            problems.at(
                "model.base_url",
                span_of(url),
                format!("{u:?} is not an http:// or https:// URL"),
            );
        }
    }
    if let Some(env) = &model.api_key_env {
        let e = env.get_ref();
        if e.is_empty() || !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            problems.at(
                "model.api_key_env",
                span_of(env),
                format!("{e:?} is not an environment variable name"),
            );
        }
    }
}

/// `[model] price`: every part a number of USD per million tokens, zero or more.
fn check_price(p: &PriceSpec, problems: &mut Problems) {
    let parts = [
        ("input", Some(&p.input)),
        ("output", Some(&p.output)),
        ("cached_input", p.cached_input.as_ref()),
        ("cache_write", p.cache_write.as_ref()),
    ];
    for (key, value) in parts {
        if let Some(v) = value
            && !(v.get_ref().is_finite() && *v.get_ref() >= 0.0)
        {
            problems.at(
                &format!("model.price.{key}"),
                span_of(v),
                "a price must be a number of USD per million tokens, zero or more",
            );
        }
    }
}

fn check_limits(limits: &LimitsSpec, problems: &mut Problems) {
    if let Some(c) = &limits.max_concurrency
        && *c.get_ref() == 0
    {
        problems.at(
            "limits.max_concurrency",
            span_of(c),
            "max_concurrency must be at least 1",
        );
    }
    if let Some(t) = &limits.stuck_loop_threshold
        && *t.get_ref() == 1
    {
        problems.at(
            "limits.stuck_loop_threshold",
            span_of(t),
            "stuck_loop_threshold must be at least 2 (or 0 to turn the rule off): at 1 every call would be a loop",
        );
    }
    if let Some(t) = &limits.timeout_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            "limits.timeout_secs",
            span_of(t),
            "timeout_secs must be a positive number of seconds, at most a year",
        );
    }
    if let Some(c) = &limits.max_cost_usd
        && !(c.get_ref().is_finite() && *c.get_ref() >= 0.0)
    {
        problems.at(
            "limits.max_cost_usd",
            span_of(c),
            "max_cost_usd must be zero or more",
        );
    }
}

/// A cost budget needs a price for the model, or it could never hold: the file's
/// `[model] price`, or the built-in table's for a live model it knows.
fn check_budget_priced(limits: &LimitsSpec, model: &ModelSpec, problems: &mut Problems) {
    let Some(budget) = &limits.max_cost_usd else {
        return;
    };
    if crate::assemble::price(model).is_some() {
        return;
    }
    let which = match (model.provider.get_ref(), &model.name) {
        (Provider::Scripted, _) => "the scripted model has no price".to_owned(),
        (_, Some(name)) => format!(
            "the model {:?} is not in the built-in price table",
            name.get_ref()
        ),
        (_, None) => "the model has no price".to_owned(),
    };
    problems.at(
        "limits.max_cost_usd",
        span_of(budget),
        format!(
            "max_cost_usd needs a price for the model, and {which}: give it in [model] as \
             `price = {{ input = 0.40, output = 1.60 }}` (USD per million tokens; optional \
             `cached_input`, `cache_write`)"
        ),
    );
}

fn check_tool(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    match (&tool.command, &tool.agent, &tool.builtin) {
        (Some(command), None, None) => {
            check_command(command, path, dir, problems);
            check_command_tool(tool, path, dir, problems);
        }
        (None, Some(agent), None) => check_agent_tool(tool, agent, path, dir, problems),
        (None, None, Some(builtin)) => check_builtin_tool(tool, builtin, path, dir, problems),
        // Reported with the file's shape (`check_keys`).
        (None, None, None) => {}
        (_, _, _) => {
            let (key, span) = match (&tool.builtin, &tool.agent) {
                (Some(b), _) => ("builtin", span_of(b)),
                (None, a) => ("agent", a.as_ref().and_then(span_of)),
            };
            let given: Vec<String> = [
                ("command", tool.command.is_some()),
                ("agent", tool.agent.is_some()),
                ("builtin", tool.builtin.is_some()),
            ]
            .into_iter()
            .filter(|(_, given)| *given)
            .map(|(k, _)| format!("`{k}`"))
            .collect();
            problems.at(
                &join(path, key),
                span,
                format!(
                    "give one of `command` (a command tool), `agent` (another agent file) or \
                     `builtin` (a built-in tool), not both {}",
                    given.join(" and ")
                ),
            );
        }
    }
    if tool.builtin.is_none() {
        // A command tool takes a `root` and an `env` too.
        let not_command = tool.command.is_none();
        let builtin_only = [
            ("root", tool.root.is_some() && not_command),
            ("max_bytes", tool.max_bytes.is_some()),
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
        ];
        misplaced(
            &process_only,
            tool,
            path,
            "is for the shell and command tools: the processes they start run in it",
            problems,
        );
    }
    check_network(tool.sandbox, tool.network.as_ref(), path, problems);
    if let Some(schema) = &tool.input_schema {
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
    if let Some(t) = &tool.timeout_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            &join(path, "timeout_secs"),
            span_of(t),
            "timeout_secs must be a positive number of seconds, at most a year",
        );
    }
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

/// The longest timeout an agent file may set: a year, in seconds.
pub const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// A timeout an agent file may set: positive and at most [`MAX_TIMEOUT_SECS`].
fn valid_seconds(secs: f64) -> bool {
    secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS
}

/// The most retries an agent file may give a tool: beyond that a failing tool would only keep a
/// run waiting.
pub const MAX_TOOL_RETRIES: u32 = 10;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::super::AgentFile;
    use super::super::tests::{TWO_TOOLS, located, problems};

    #[test]
    fn builtin_tools_take_their_own_name_and_only_the_keys_they_read() {
        let text = r#"name = "x"
[model]
provider = "openai"
name = "m"
[[tools]]
builtin = "read_file"
[[tools]]
builtin = "rm_rf"
[[tools]]
builtin = "shell"
env = ["OPENAI_API_KEY", "bad name", "CARGO_HOME"]
allow_private = ["127.0.0.1"]
[[tools]]
builtin = "web_fetch"
allow_private = ["http://x", "10.0.0.0/8"]
root = "."
network = true
[[tools]]
builtin = "read_file"
[[tools]]
name = "cmd"
command = ["true"]
root = "."
sandbox = "read-only"
[[tools]]
name = "grep2"
builtin = "grep"
root = "no/such/folder"
description = "mine"
max_results = 0
[[tools]]
builtin = "write_file"
max_bytes = 10
[permissions]
allow = ["read_file", "grep2"]
"#;
        let mut got: Vec<String> = located(text).into_iter().map(|(p, _)| p).collect();
        got.sort();
        assert_eq!(
            got,
            [
                "tools[1].builtin",
                "tools[2].allow_private",
                "tools[2].env[0]",
                "tools[2].env[1]",
                "tools[3].allow_private[0]",
                "tools[3].network",
                "tools[3].root",
                "tools[4].name",
                "tools[6].description",
                "tools[6].max_results",
                "tools[6].root",
                "tools[7].max_bytes",
            ]
        );
    }

    #[test]
    fn a_tool_needs_a_name_unless_it_is_builtin_and_one_kind_only() {
        let text = "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\ncommand = [\"true\"]\n[[tools]]\nbuiltin = \"glob\"\ncommand = [\"true\"]\n";
        let got = problems(text);
        assert!(got.iter().any(|p| p.path == "tools[0].name"), "{got:?}");
        assert!(
            got.iter().any(|p| p.path == "tools[1].builtin"
                && p.message.contains("not both `command` and `builtin`")),
            "{got:?}"
        );
    }

    #[test]
    fn a_timeout_too_large_for_a_duration_is_a_problem_not_a_panic() {
        for (key, line) in [("limits", 5), ("tools", 8)] {
            let text = if key == "limits" {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n[limits]\ntimeout_secs = 1e300\n".to_owned()
            } else {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\ntimeout_secs = 1e300\n".to_owned()
            };
            let found = problems(&text);
            let p = found
                .iter()
                .find(|p| p.path.ends_with("timeout_secs"))
                .expect("a timeout_secs problem");
            assert_eq!(p.line, line, "{key}");
            assert!(p.message.contains("at most a year"), "{}", p.message);
        }
    }

    #[test]
    fn a_tool_may_have_up_to_ten_retries() {
        let file = |n: u32| {
            format!(
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\nretries = {n}\n"
            )
        };
        let found = located(&file(11));
        assert!(
            found.contains(&("tools[0].retries".to_owned(), 8)),
            "{found:?}"
        );
        let too_many = problems(&file(11));
        let retries = too_many
            .iter()
            .find(|p| p.path == "tools[0].retries")
            .unwrap();
        assert!(
            retries.message.contains("at most 10"),
            "{}",
            retries.message
        );
        // Ten is fine (the file's other problems aside).
        assert!(
            problems(&file(10))
                .iter()
                .all(|p| !p.path.ends_with("retries"))
        );
    }

    #[test]
    fn rule_problems_are_all_reported_after_the_shape_is_right() {
        let text = r#"name = "x"
[model]
provider = "openai"
script = "s.json"

[[tools]]
name = "bad name"
command = []

[[tools]]
name = "t2"
command = ["echo"]
input_schema = { type = "string" }
"#;
        let got = located(text);
        assert!(got.contains(&("model.name".into(), 3)), "{got:?}");
        assert!(got.contains(&("model.script".into(), 4)), "{got:?}");
        assert!(got.contains(&("tools[0].name".into(), 7)), "{got:?}");
        assert!(got.contains(&("tools[0].command".into(), 8)), "{got:?}");
        assert!(
            got.contains(&("tools[1].input_schema".into(), 13)),
            "{got:?}"
        );
    }

    #[test]
    fn rules_run_on_sections_whose_shape_is_right_even_when_others_are_wrong() {
        let text = r#"name = "x"
colour = "blue"
[model]
provider = "openai"
[[tools]]
name = "bad name"
command = ["echo"]
[[tools]]
name = "t"
command = 5
"#;
        let got = located(text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 2),
                ("model.name".to_owned(), 4),
                ("tools[0].name".to_owned(), 6),
                ("tools[1].command".to_owned(), 10)
            ]
        );
    }

    #[test]
    fn a_scripted_agent_needs_an_existing_script() {
        let got = problems(
            "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"nope.json\"\nbase_url = \"http://x\"\n",
        );
        let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["model.script", "model.base_url"]);
    }

    #[test]
    fn permission_lists_and_rules_name_declared_tools_once() {
        let text = format!(
            r#"{TWO_TOOLS}
[permissions]
default = "ask"
allow = ["shell", "nope"]
deny = ["write", "shell"]
store = ""

[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = {{ field = "path", glob = "**/.env" }}

[[permissions.rules]]
tool = "wirte"
permission = "allow"
command_prefix = {{ field = "command", prefix = " " }}
path_glob = {{ field = "path", glob = "src/[" }}
"#
        );
        let got: Vec<(String, usize, String)> = problems(&text)
            .into_iter()
            .map(|p| (p.path, p.line, p.message))
            .collect();
        let paths: Vec<(&str, usize)> = got.iter().map(|(p, l, _)| (p.as_str(), *l)).collect();
        assert_eq!(
            paths,
            [
                ("permissions.allow[1]", 14),
                ("permissions.deny[1]", 15),
                ("permissions.store", 16),
                ("permissions.rules[1].tool", 24),
                ("permissions.rules[1].command_prefix.prefix", 26),
                ("permissions.rules[1].path_glob", 27),
                ("permissions.rules[1].path_glob.glob", 27),
            ]
        );
        assert!(
            got[0]
                .2
                .contains("no tool named \"nope\" (declared: shell, write)"),
            "{got:?}"
        );
        assert!(got[1].2.contains("already listed in `allow`"), "{got:?}");
    }

    #[test]
    fn an_unknown_tool_in_a_list_is_reported_even_when_other_sections_are_wrong() {
        let text = format!("colour = 1\n{TWO_TOOLS}\n[permissions]\ndeny = [\"shel\"]\n");
        let got = located(&text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 1),
                ("permissions.deny[0]".to_owned(), 14)
            ]
        );
    }

    #[test]
    fn an_unreadable_permission_store_is_a_problem_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.json"), "{ not json").unwrap();
        let text = format!("{TWO_TOOLS}\n[permissions]\nstore = \"p.json\"\n");
        let got = AgentFile::parse(&dir.path().join("agent.toml"), &text)
            .unwrap_err()
            .list()
            .to_vec();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].path.as_str(), got[0].line),
            ("permissions.store", 13)
        );
        assert!(got[0].message.contains("permission store"), "{got:?}");
    }
}
