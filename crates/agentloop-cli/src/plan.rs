//! `agentloop plan`: what an agent is and what it would send, without credentials, requests or
//! tool runs. The first request of a live agent is the provider's own encoded body, its key
//! redacted; a scripted agent shows the provider-neutral request and its script.

use std::fmt::Write as _;

use agentloop::{Message, Tool, model::ModelRequest, tool::ToolSet};
use serde::Serialize;
use serde_json::{Value, json};

use crate::agent_file::{AgentFile, Provider};
use crate::assemble;
use crate::error::CliError;

/// The placeholder input `plan` shows in the first request.
pub(crate) const INPUT_PLACEHOLDER: &str = "<input>";

/// What `plan` shows.
#[derive(Debug, Serialize)]
pub(crate) struct Plan {
    /// The agent's name.
    pub agent: String,
    /// Its description.
    pub description: Option<String>,
    /// The agent file.
    pub file: String,
    /// The model and how it is reached.
    pub model: Value,
    /// The system instructions.
    pub instructions: Option<String>,
    /// The tools, with their schemas.
    pub tools: Vec<Value>,
    /// The limits in force (the file's, over the defaults).
    pub limits: Value,
    /// The permissions: the default, the lists, the rules, the store file and what it holds.
    pub permissions: Value,
    /// The schema of the final answer.
    pub output_schema: Option<Value>,
    /// The first request it would send, for the input `<input>`.
    pub first_request: Value,
    /// The agent's version (the file's `version`).
    pub version: Option<String>,
    /// The definition's fingerprint, as a journaled run records it: resuming a run whose
    /// fingerprint differs is refused unless `--force`. It holds the `[[mcp]]` declarations, not
    /// the servers' tools: those may change at any turn, and a run's journal keeps them as each
    /// turn listed them; so `plan` starts no server and still prints the run's fingerprint.
    pub fingerprint: String,
    /// The tree of subagents its `agent` tools run: each with its file, model, tools and
    /// limits, and its own subagents.
    pub subagents: Vec<Value>,
    /// The `[[mcp]]` servers: how each is reached and how its tools are named (not started:
    /// `agentloop mcp list` shows their tools), with the variables templates read, never values.
    pub mcp: Value,
    /// The agents its `[[handoffs]]` pass the conversation to: each tool, agent, file and what
    /// the agent sees of the conversation.
    pub handoffs: Value,
}

/// The subagents of a file's `agent` tools, as a tree.
fn subagent_tree(file: &AgentFile) -> Vec<Value> {
    file.subagents
        .iter()
        .map(|(tool, child)| {
            let m = child.model();
            json!({
                "tool": tool,
                "agent": child.spec.name.get_ref(),
                "file": child.path.display().to_string(),
                "model": {
                    "provider": m.provider.get_ref().as_str(),
                    "name": m.name.as_ref().map(|n| n.get_ref()),
                },
                "tools": child.tools().iter().map(|t| t.name().to_owned()).collect::<Vec<_>>(),
                "mcp": child.mcp().iter().map(|m| m.name.get_ref().clone()).collect::<Vec<_>>(),
                "limits": serde_json::to_value(assemble::limits(child)).unwrap_or(Value::Null),
                "permissions": assemble::has_gate(child),
                "subagents": subagent_tree(child),
            })
        })
        .collect()
}

fn render_tree(out: &mut String, nodes: &[Value], depth: usize) {
    let pad = "  ".repeat(depth + 1);
    for n in nodes {
        let field = |key: &str| {
            n.get("model")
                .and_then(|m| m.get(key))
                .unwrap_or(&Value::Null)
        };
        let model = match field("name") {
            Value::Null => show(field("provider")),
            name => format!("{} {}", show(field("provider")), show(name)),
        };
        let _ = writeln!(
            out,
            "{pad}{} -> {} ({}), {model}",
            show(&n["tool"]),
            show(&n["agent"]),
            show(&n["file"]),
        );
        let tools: Vec<String> = n["tools"]
            .as_array()
            .map(|a| a.iter().map(show).collect())
            .unwrap_or_default();
        let _ = writeln!(out, "{pad}  tools: {}", tools.join(", "));
        let servers: Vec<String> = n["mcp"]
            .as_array()
            .map(|a| a.iter().map(show).collect())
            .unwrap_or_default();
        if !servers.is_empty() {
            let _ = writeln!(out, "{pad}  mcp servers: {}", servers.join(", "));
        }
        if let Some(children) = n["subagents"].as_array() {
            render_tree(out, children, depth + 1);
        }
    }
}

/// The tools of a request: of two of one name (a server's tool named as another's, or as the
/// agent's own), the first, as a run keeps it ([`crate::assemble::StartedMcp::collision_warnings`]
/// names the others).
fn tool_set(tools: Vec<Tool>) -> Result<ToolSet, CliError> {
    let mut set = ToolSet::new();
    for tool in tools {
        match set.register(tool) {
            Ok(()) | Err(agentloop::tool::ToolDefinitionError::Duplicate { .. }) => {}
            Err(e) => {
                return Err(CliError::Setup {
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(set)
}

/// The first request the agent would send for `input` after `history` (a session's transcript,
/// for a dry run of one): a live provider's real body (key redacted), or the neutral request of
/// a scripted agent. `mcp` is the tools of its started `[[mcp]]` servers (`run --dry-run` starts
/// them; `plan` starts nothing, so its request shows the file's own tools).
pub(crate) fn first_request_view(
    file: &AgentFile,
    history: Vec<Message>,
    input: &str,
    mcp: Vec<Tool>,
) -> Result<Value, CliError> {
    let own = crate::assemble::tools(file)?;
    let tools = tool_set(crate::deferred::request_tools(file, own, mcp))?;
    let settings = assemble::settings(file);
    let mut messages = history;
    messages.push(Message::user(input));
    let output_schema = file
        .spec
        .output_schema
        .as_ref()
        .map(|s| s.get_ref().clone());
    let request = ModelRequest {
        instructions: file.instructions.as_deref(),
        messages: &messages,
        tools: tools.specs(),
        output_schema: output_schema.as_ref(),
        settings: &settings,
    };
    match *file.model().provider.get_ref() {
        Provider::Scripted => Ok(json!({
            "provider": "scripted",
            "note": "a scripted model sends nothing; this is the request it receives",
            "instructions": request.instructions,
            "messages": messages,
            "tools": scripted_tools_view(&tools),
            "output_schema": request.output_schema,
            "settings": settings,
        })),
        live => crate::live::first_request(file, live, &request),
    }
}

/// The tools as a scripted model's request shows them: each spec, then its timeout, retries and
/// own task as the spec once held them.
fn scripted_tools_view(tools: &ToolSet) -> Vec<Value> {
    tools
        .specs()
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let mut view = serde_json::to_value(spec).unwrap_or(Value::Null);
            if let (Value::Object(map), Some(policy)) = (&mut view, tools.policy(index)) {
                if let Some(timeout) = policy.timeout {
                    map.insert("timeout".into(), json!(timeout.as_secs_f64()));
                }
                if policy.retry.retries() > 0 {
                    map.insert("retries".into(), json!(policy.retry.retries()));
                }
                if policy.own_task {
                    map.insert("own_task".into(), json!(true));
                }
            }
            view
        })
        .collect()
}

/// The workspace folder of a built-in tool that has one, canonical when it exists.
fn builtin_root(file: &AgentFile, t: &crate::agent_file::ToolFileSpec) -> Option<String> {
    let kind = agentloop_tools::Builtin::from_name(t.builtin.as_ref()?.get_ref())?;
    if !kind.uses_root() {
        return None;
    }
    let root = assemble::builtin_options(file, t).root;
    Some(
        std::fs::canonicalize(&root)
            .unwrap_or(root)
            .display()
            .to_string(),
    )
}

/// The sandbox of a tool that starts processes (the shell, a command tool): its mode, network
/// and the folders it may write; `null` for the others.
fn tool_sandbox(file: &AgentFile, t: &crate::agent_file::ToolFileSpec) -> Value {
    let root = match (&t.command, &t.builtin) {
        (Some(_), _) => assemble::command_root(file, t),
        (None, Some(b)) if b.get_ref() == agentloop_tools::Builtin::Shell.name() => {
            assemble::builtin_options(file, t).root
        }
        _ => return Value::Null,
    };
    let policy = t.sandbox(file.sandbox());
    let sandbox = agentloop_tools::Sandbox::new(policy)
        .writable(std::fs::canonicalize(&root).unwrap_or(root));
    json!({
        "mode": policy.mode,
        "network": policy.network,
        "unix_sockets": policy.unix_sockets,
        "resources": policy.resources,
        "writable": sandbox.writable_roots(),
    })
}

/// The plan of an agent file.
pub(crate) fn plan(file: &AgentFile) -> Result<Plan, CliError> {
    let m = file.model();
    let provider = *m.provider.get_ref();
    let tools = tool_set(assemble::tools(file)?)?;
    let tools_view = tools
        .specs()
        .iter()
        .enumerate()
        .zip(file.tools())
        .map(|((index, spec), t)| {
            let policy = tools.policy(index);
            json!({
                "name": spec.name,
                "description": spec.description,
                "command": t.command.as_ref().map(|c| c.get_ref()),
                "agent": t.agent.as_ref().map(|a| a.get_ref()),
                "builtin": t.builtin.as_ref().map(|b| b.get_ref()),
                "a2a": t.a2a.as_ref().map(|u| agentloop::url_secrets::shown(u.get_ref())),
                "root": builtin_root(file, t),
                "sandbox": tool_sandbox(file, t),
                "fatal": t.fatal.unwrap_or(false),
                "working_dir": file.dir.display().to_string(),
                "mode": spec.mode,
                "timeout_secs": policy.and_then(|p| p.timeout).map(|d| d.as_secs_f64()),
                "retries": policy.map_or(0, |p| p.retry.retries()),
                "input_schema": spec.input_schema,
                "deferred": t.defer.unwrap_or(false),
            })
        })
        .collect();
    let key_env = if provider == Provider::Scripted {
        None
    } else {
        file.api_key_env()
    };
    let script_steps = match provider {
        Provider::Scripted => assemble::scripted_model(file).ok().map(|s| s.len()),
        _ => None,
    };
    let model = json!({
        "provider": provider.as_str(),
        "name": m.name.as_ref().map(|n| n.get_ref()),
        // A key in the URL (`?key=`, `user:pass@`) is not shown: only which server it is.
        "base_url": m.base_url.as_ref().map(|u| agentloop::url_secrets::shown(u.get_ref())),
        "api_key_env": key_env,
        "api_key_set": key_env.as_deref().map(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty())),
        "stream": m.stream.unwrap_or(true),
        "tool_dialect": m.tool_dialect.as_ref().map(|d| d.get_ref().clone()),
        // How deferred tools are found: `native` (the provider's own search) or `local`
        // (`search_tools`); null when nothing is deferred.
        "tool_search": crate::deferred::defers(file)
            .then(|| if crate::deferred::native(file) { "native" } else { "local" }),
        "tool_calls": tool_calls_words(file),
        "script": m.script.as_ref().map(|s| file.resolve(s.get_ref()).display().to_string()),
        "script_steps": script_steps,
        "settings": assemble::settings(file),
        "compaction": assemble::compaction(file).map(|c| json!({
            "context_tokens": c.context_tokens,
            "budget": c.budget(&assemble::settings(file)),
            "policy": c.policy.as_str(),
            "keep_turns": c.keep_turns,
        })),
        "retry": if provider == Provider::Scripted { Value::Null } else { json!("providers' default retry policy") },
        "price": crate::agent_file::model::price(m).map(|(p, source)| json!({
            "input": p.input,
            "output": p.output,
            "cached_input": p.cached_input,
            "cache_write": p.cache_write,
            "source": source,
        })),
    });
    let limits = serde_json::to_value(assemble::limits(file)).unwrap_or(Value::Null);
    let permissions = permissions_view(file)?;
    Ok(Plan {
        agent: file.spec.name.get_ref().clone(),
        description: file.spec.description.clone(),
        file: file.path.display().to_string(),
        model,
        instructions: file.instructions.clone(),
        tools: tools_view,
        limits,
        permissions,
        output_schema: file
            .spec
            .output_schema
            .as_ref()
            .map(|s| s.get_ref().clone()),
        first_request: first_request_view(file, Vec::new(), INPUT_PLACEHOLDER, Vec::new())?,
        version: file.spec.version.clone(),
        fingerprint: assemble::fingerprint(file)?,
        subagents: subagent_tree(file),
        mcp: assemble::mcp_declarations(file),
        handoffs: agentloop_cli::handoff::plan(file),
    })
}

/// The permissions in force: the default, the file's lists and argument rules, the store file
/// and the answers saved in it.
fn permissions_view(file: &AgentFile) -> Result<Value, CliError> {
    let p = file.permissions();
    let names = |list: Option<&Vec<toml::Spanned<String>>>| -> Vec<String> {
        list.map(|l| l.iter().map(|n| n.get_ref().clone()).collect())
            .unwrap_or_default()
    };
    let store = assemble::permission_store(file)?;
    let store_file = p
        .and_then(|p| p.store.as_ref())
        .map(|s| file.resolve(s.get_ref()));
    let argument_rules: Vec<_> = assemble::permission_rules(file)
        .into_iter()
        .filter(|r| r.arguments.is_some())
        .collect();
    // What a call of each declared tool gets when no argument rule matches it (saved answers
    // included): where a rule about some calls leaves the others.
    let unmatched: serde_json::Map<String, Value> = file
        .tools()
        .iter()
        .map(|t| (t.name().to_owned(), json!(store.unmatched(t.name()))))
        .collect();
    Ok(json!({
        "gate": assemble::has_gate(file),
        "builtin_defaults": assemble::builtin_permission_rules(file),
        "default": store.fallback(),
        "allow": names(p.and_then(|p| p.allow.as_ref())),
        "ask": names(p.and_then(|p| p.ask.as_ref())),
        "deny": names(p.and_then(|p| p.deny.as_ref())),
        "rules": argument_rules,
        "store": store_file.as_ref().map(|f| f.display().to_string()),
        "store_exists": store_file.as_ref().map(|f| f.exists()),
        "saved": store.rules(),
        "unmatched": unmatched,
    }))
}

/// `workspace-write, no network, writes /srv/app`.
fn sandbox_words(sandbox: &serde_json::Map<String, Value>) -> String {
    let field = |key: &str| sandbox.get(key).unwrap_or(&Value::Null);
    let mut words = show(field("mode"));
    if field("mode") != "off" {
        words.push_str(if field("network") == &Value::Bool(true) {
            ", network"
        } else {
            ", no network"
        });
        let writable: Vec<String> = sandbox
            .get("writable")
            .and_then(Value::as_array)
            .map(|w| w.iter().map(show).collect())
            .unwrap_or_default();
        if !writable.is_empty() {
            words.push_str(&format!(", writes {}", writable.join(", ")));
        }
        if field("unix_sockets") == &Value::Bool(true) {
            words.push_str(", the system's UNIX sockets");
        }
    }
    // Limits hold in every mode, `off` included.
    if let Some(limits) = sandbox.get("resources").and_then(Value::as_object) {
        let set: Vec<String> = limits
            .iter()
            .filter_map(|(key, v)| {
                let n = v.as_u64()?;
                let mib = n / (1024 * 1024);
                Some(match key.as_str() {
                    "memory_bytes" => format!("{mib} MiB of memory"),
                    "cpu_secs" => format!("{n} s of CPU"),
                    "processes" => format!("{n} processes"),
                    "file_size_bytes" => format!("files of {mib} MiB"),
                    "open_files" => format!("{n} open files"),
                    other => format!("{other} {n}"),
                })
            })
            .collect();
        if !set.is_empty() {
            words.push_str(&format!(", at most {}", set.join(", ")));
        }
    }
    words
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn words(v: &Value) -> String {
    v.as_array()
        .map(|items| items.iter().map(show).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

/// One rule in words: `shell allow when command starts with "git status"`.
fn rule_words(r: &Value) -> String {
    let a = &r["arguments"];
    let when = match a["kind"].as_str() {
        Some("command_prefix") => format!(
            " when {} starts with {}{}",
            show(&a["field"]),
            a["prefix"],
            if a["allow_chaining"] == true {
                " (chained commands too)"
            } else {
                ""
            }
        ),
        Some("path_glob") => format!(" when {} matches {}", show(&a["field"]), a["glob"]),
        _ => String::new(),
    };
    format!("{} {}{when}", show(&r["tool"]), show(&r["permission"]))
}

/// A price in words: `$0.4 in, $1.6 out per million tokens (cached input $0.1; built-in table)`.
fn price_words(p: &Value) -> String {
    if p.is_null() {
        return "none (the run's cost is not counted; max_cost_usd needs [model] price)".into();
    }
    let mut extra: Vec<String> = [
        ("cached_input", "cached input"),
        ("cache_write", "cache write"),
    ]
    .into_iter()
    .filter(|(key, _)| !p[*key].is_null())
    .map(|(key, words)| format!("{words} ${}", p[key]))
    .collect();
    extra.push(
        match p["source"].as_str() {
            Some("agent_file") => "[model] price",
            _ => "built-in table",
        }
        .to_owned(),
    );
    format!(
        "${} in, ${} out per million tokens ({})",
        p["input"],
        p["output"],
        extra.join("; ")
    )
}

fn render_permissions(out: &mut String, p: &Value) {
    let _ = writeln!(
        out,
        "permissions  default {}{}",
        show(&p["default"]),
        if p["gate"] == true {
            ""
        } else {
            " (no [permissions] table: every call runs)"
        }
    );
    for r in p["builtin_defaults"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "        {} (the built-in tool's default; list it to change that)",
            rule_words(r)
        );
    }
    for list in ["allow", "ask", "deny"] {
        if p[list].as_array().is_some_and(|l| !l.is_empty()) {
            let _ = writeln!(out, "        {list}: {}", words(&p[list]));
        }
    }
    for r in p["rules"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "        rule: {}", rule_words(r));
    }
    if let Some(tools) = p["unmatched"].as_object().filter(|t| !t.is_empty())
        && p["gate"] == true
    {
        let each: Vec<String> = tools
            .iter()
            .map(|(tool, permission)| format!("{tool} {}", show(permission)))
            .collect();
        let _ = writeln!(out, "        unmatched calls: {}", each.join(", "));
    }
    if !p["store"].is_null() {
        let saved: Vec<String> = p["saved"]
            .as_array()
            .into_iter()
            .flatten()
            .map(rule_words)
            .collect();
        let held = match (p["store_exists"] == true, saved.is_empty()) {
            (false, _) => "not written yet".to_owned(),
            (true, true) => "no saved answers".to_owned(),
            (true, false) => format!("saved: {}", saved.join(", ")),
        };
        let _ = writeln!(out, "        store: {} ({held})", show(&p["store"]));
    }
}

/// How the model's tool calls are read, and for a local server read by its own parser, the
/// setting to try when the model writes its calls as text (small models do: a fenced call, a
/// bare one), which no server parser reads.
fn tool_calls_words(file: &AgentFile) -> Option<String> {
    let m = file.model();
    if *m.provider.get_ref() != Provider::OpenAi || file.tools().is_empty() {
        return None;
    }
    if let Some(d) = &m.tool_dialect {
        return Some(format!(
            "written as text in the model's answer and read by agentloop (tool_dialect {:?})",
            d.get_ref()
        ));
    }
    let local = m.base_url.as_ref().is_some_and(|u| {
        let host = u.get_ref().split("://").nth(1).unwrap_or_default();
        ["127.", "localhost", "[::1]", "0.0.0.0"]
            .iter()
            .any(|h| host.starts_with(h))
    });
    local.then(|| {
        "parsed by the server; if a small model's calls come back as text or the server \
         fails to parse them, set [model] tool_dialect = \"auto\""
            .to_owned()
    })
}

/// The plan for a terminal.
pub(crate) fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "agent   {}  ({})", plan.agent, plan.file);
    if let Some(d) = &plan.description {
        let _ = writeln!(out, "        {d}");
    }
    if let Some(v) = &plan.version {
        let _ = writeln!(out, "        version {v}");
    }
    let _ = writeln!(out, "        fingerprint {}", plan.fingerprint);
    render_model(&mut out, &plan.model);
    if let Some(i) = &plan.instructions {
        let _ = writeln!(out, "instructions");
        for line in i.lines() {
            let _ = writeln!(out, "        {line}");
        }
    }
    let deferred = if plan.model.get("tool_search").and_then(Value::as_str) == Some("native") {
        DEFERRED_NATIVE
    } else {
        DEFERRED
    };
    render_tools(&mut out, &plan.tools, deferred);
    render_mcp(&mut out, &plan.mcp, deferred);
    if !plan.subagents.is_empty() {
        let _ = writeln!(out, "subagents");
        render_tree(&mut out, &plan.subagents, 0);
    }
    if let Some(handoffs) = plan.handoffs.as_array().filter(|h| !h.is_empty()) {
        let _ = writeln!(out, "handoffs");
        for h in handoffs {
            let word = |k: &str| h[k].as_str().unwrap_or_default().to_owned();
            let _ = writeln!(
                out,
                "        {} -> {} ({}, sees: {})",
                word("tool"),
                word("agent"),
                word("file"),
                word("history")
            );
        }
    }
    let _ = writeln!(out, "limits");
    if let Some(l) = plan.limits.as_object() {
        for (k, v) in l {
            // A bound left out, or lifted with 0 or "unlimited", is no bound.
            let shown = match v {
                Value::Null if k.starts_with("max_") => "unlimited".to_owned(),
                Value::Null if k == "timeout" => "none".to_owned(),
                v => show(v),
            };
            let _ = writeln!(out, "        {k}: {shown}");
        }
    }
    render_permissions(&mut out, &plan.permissions);
    if let Some(s) = &plan.output_schema {
        let _ = writeln!(out, "output  {s}");
    }
    let _ = writeln!(
        out,
        "first request (for the input {INPUT_PLACEHOLDER:?}; nothing is sent)"
    );
    let pretty = serde_json::to_string_pretty(&plan.first_request).unwrap_or_default();
    for line in pretty.lines() {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// The plan's `model` lines: provider and name, connection, price, compaction, settings.
fn render_model(out: &mut String, m: &Value) {
    let _ = writeln!(out, "model   {} {}", show(&m["provider"]), show(&m["name"]));
    for key in [
        "base_url",
        "api_key_env",
        "api_key_set",
        "stream",
        "tool_dialect",
        "tool_calls",
        "tool_search",
        "script",
        "script_steps",
        "retry",
    ] {
        if !m[key].is_null() {
            let _ = writeln!(out, "        {key}: {}", show(&m[key]));
        }
    }
    let _ = writeln!(out, "        price: {}", price_words(&m["price"]));
    let compaction = &m["compaction"];
    if compaction.is_null() {
        let _ = writeln!(
            out,
            "        compaction: off (set [model] context_tokens to compact long conversations)"
        );
    } else {
        let _ = writeln!(
            out,
            "        compaction: {} past {} tokens of a {}-token window (the latest {} turns kept whole)",
            compaction["policy"].as_str().unwrap_or_default(),
            compaction["budget"],
            compaction["context_tokens"],
            compaction["keep_turns"]
        );
    }
    if m["settings"].as_object().is_some_and(|s| !s.is_empty()) {
        let _ = writeln!(out, "        settings: {}", m["settings"]);
    }
}

/// What `plan` says of a deferred tool or server.
const DEFERRED: &str = "deferred: out of the request until the model finds it with search_tools";
/// The same, where the provider searches the tools itself.
const DEFERRED_NATIVE: &str =
    "deferred: out of the model's context until the provider's own tool search finds it";

/// The plan's `tools` lines: each tool's mode, timeout, retries, kind, sandbox and schema.
fn render_tools(out: &mut String, tools: &[Value], deferred: &str) {
    let _ = writeln!(out, "tools   {}", tools.len());
    for t in tools {
        let _ = writeln!(
            out,
            "  {} ({}{}{})",
            show(&t["name"]),
            show(&t["mode"]),
            match &t["timeout_secs"] {
                Value::Null => String::new(),
                secs => format!(", timeout {} s", show(secs)),
            },
            match t["retries"].as_u64() {
                None | Some(0) => String::new(),
                Some(n) => format!(", {n} retr{}", if n == 1 { "y" } else { "ies" }),
            }
        );
        if t["description"].as_str().is_some_and(|d| !d.is_empty()) {
            let _ = writeln!(out, "        {}", show(&t["description"]));
        }
        if t["deferred"] == true {
            let _ = writeln!(out, "        {deferred}");
        }
        if !t["builtin"].is_null() {
            let root = match &t["root"] {
                Value::Null => String::new(),
                root => format!(" (root {})", show(root)),
            };
            let _ = writeln!(out, "        builtin: {}{root}", show(&t["builtin"]));
        } else if !t["a2a"].is_null() {
            // Its card is read when a run starts: `plan` reaches nothing.
            let _ = writeln!(out, "        a2a:     {}", show(&t["a2a"]));
        } else if t["agent"].is_null() {
            let _ = writeln!(out, "        command: {}", show(&t["command"]));
        } else {
            let _ = writeln!(out, "        agent:   {}", show(&t["agent"]));
        }
        if let Some(sandbox) = t["sandbox"].as_object() {
            let _ = writeln!(out, "        sandbox: {}", sandbox_words(sandbox));
        }
        let _ = writeln!(out, "        input:   {}", t["input_schema"]);
    }
}

/// The plan's `mcp` lines: each server's transport, restart, timeout, names, output bound (when
/// not the default), sandbox and the variables it reads.
fn render_mcp(out: &mut String, mcp: &Value, deferred: &str) {
    let servers = mcp.as_array().map(Vec::as_slice).unwrap_or_default();
    if !servers.is_empty() {
        let _ = writeln!(
            out,
            "mcp     {} server{} (their tools: `agentloop mcp list FILE`)",
            servers.len(),
            if servers.len() == 1 { "" } else { "s" }
        );
        for s in servers {
            let t = &s["transport"];
            let how = match (&t["command"], &t["url"]) {
                (Value::Null, url) => format!("url {}", show(url)),
                (command, _) => format!("command {}", show(command)),
            };
            let _ = writeln!(
                out,
                "  {} ({how}; restart {}, timeout {} s)",
                show(&s["name"]),
                show(&s["restart"]),
                show(&s["timeout_secs"]),
            );
            let _ = writeln!(out, "        tools named {}", show(&s["tools_named"]));
            if s["deferred"] == true {
                let _ = writeln!(out, "        {deferred}");
            }
            if let Some(max) = s["max_output_bytes"].as_u64() {
                let _ = writeln!(out, "        results cut to {max} bytes");
            }
            if let Some(version) = s["protocol_version"].as_str() {
                let _ = writeln!(out, "        speaks MCP {version} only");
            }
            if let Some(sandbox) = t["sandbox"].as_object() {
                let _ = writeln!(out, "        sandbox: {}", sandbox_words(sandbox));
            }
            for key in ["env_reads", "headers_read"] {
                if let Some(map) = t[key].as_object().filter(|m| !m.is_empty()) {
                    let keys: Vec<String> = map
                        .iter()
                        .map(|(k, vars)| format!("{k} (from {})", show(vars)))
                        .collect();
                    let label = if key == "env_reads" { "env" } else { "headers" };
                    let _ = writeln!(out, "        {label}: {}", keys.join(", "));
                }
            }
        }
    }
}
