//! From a checked agent file to a runnable [`Agent`]: the model (scripted or a live provider
//! wrapped in retries), the command, subagent, built-in and `a2a` tools, the limits, the model
//! settings and the permission gate. The tools of the `[[mcp]]` servers of each file of the tree
//! join its agent once the servers are started, and the `a2a` tools' cards are read then too
//! ([`StartedMcp`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    Agent, Gate, Limits, Model, Tool,
    ask::{Answerer, AskGate},
    model::{ModelSettings, ToolChoice},
    permissions::{
        Answer, ApprovalPrompter, ArgumentMatch, FixedAnswer, Permission, PermissionGate,
        PermissionRule, PermissionStore,
    },
    subagent::SubagentTool,
    testing::ScriptedModel,
};
use agentloop_tools::{Builtin, BuiltinOptions, CommandTool};
use serde_json::json;

use crate::agent_file::{AgentFile, Bound, ModelSpec, Provider, ToolFileSpec};

use crate::error::CliError;

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

/// The model settings the file asks for.
pub fn settings(file: &AgentFile) -> ModelSettings {
    let m = file.model();
    ModelSettings {
        temperature: m.temperature.as_ref().map(|t| *t.get_ref()),
        seed: m.seed,
        max_tokens: m.max_tokens.as_ref().map(|t| *t.get_ref()),
        tool_choice: m.tool_choice.as_ref().map(|c| match c.get_ref().as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            name => ToolChoice::Tool(name.to_owned()),
        }),
        ..ModelSettings::default()
    }
}

/// How the file's conversations are compacted: at `context_tokens`, else at its model's known
/// window; `None` when `compaction = "off"` or the window is unknown.
pub fn compaction(file: &AgentFile) -> Option<agentloop::compaction::Compaction> {
    use crate::agent_file::CompactionSpec;
    use agentloop::compaction::{Compaction, CompactionPolicy, known_context_tokens};
    let m = file.model();
    let policy = match m.compaction {
        Some(CompactionSpec::Off) => return None,
        Some(CompactionSpec::DropToolResults) => CompactionPolicy::DropToolResults,
        Some(CompactionSpec::Summarize) | None => CompactionPolicy::Summarize,
    };
    let window = m
        .context_tokens
        .as_ref()
        .map(|t| *t.get_ref())
        .or_else(|| {
            m.name
                .as_ref()
                .and_then(|n| known_context_tokens(n.get_ref()))
        })?;
    let mut c = Compaction::new(window).policy(policy);
    if let Some(k) = &m.compaction_keep_turns {
        c = c.keep_turns(*k.get_ref());
    }
    Some(c)
}

/// The tools of a file, in its order, as `plan` shows them: its command tools, and its `agent`
/// tools over stand-in subagents (no credentials needed).
pub fn tools(file: &AgentFile) -> Result<Vec<Tool>, CliError> {
    all_tools(file, Kids::StandIn)
}

fn all_tools(file: &AgentFile, kids: Kids<'_>) -> Result<Vec<Tool>, CliError> {
    let mut out = Vec::new();
    for t in file.tools() {
        out.push(match (&t.command, &t.builtin, &t.a2a) {
            (Some(command), _, _) => command_tool(file, t, command)?,
            (None, Some(builtin), _) => builtin_tool(file, t, builtin.get_ref())?,
            (None, None, Some(url)) => a2a_tool(file, t, url.get_ref(), kids),
            (None, None, None) => subagent_tool(file, t, kids)?,
        });
    }
    Ok(out)
}

/// An `a2a` tool: the remote agent whose card was read at start, or (in a plan, where nothing
/// is reached) one that reads it at its first call. Its timeout (ten minutes unless given), mode
/// and output bound (`max_bytes`, 64 KiB unless given) are the entry's.
fn a2a_tool(file: &AgentFile, t: &ToolFileSpec, url: &str, kids: Kids<'_>) -> Tool {
    let timeout = t
        .timeout_secs
        .as_ref()
        .and_then(|v| Duration::try_from_secs_f64(*v.get_ref()).ok())
        .unwrap_or(agentloop_a2a::DEFAULT_CALL_TIMEOUT);
    let builder = Tool::builder(t.name())
        .mode(t.mode.unwrap_or_default())
        .timeout(timeout);
    let max = t
        .max_bytes
        .as_ref()
        .map_or(agentloop_a2a::DEFAULT_MAX_OUTPUT_BYTES, |b| *b.get_ref());
    let description = t.description.clone();
    match kids {
        Kids::Real(_, started, _) => match started.remote(file, t.name()) {
            Some(client) => client
                .clone()
                .with_max_output_bytes(max)
                .tool(builder, description),
            None => agentloop_a2a::A2aClient::tool_at(url, builder, description, max),
        },
        Kids::StandIn => agentloop_a2a::A2aClient::tool_at(url, builder, description, max),
    }
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

/// The folder a command tool's processes may write under `workspace-write`: its `root`, else the
/// agent file's folder (where it runs).
pub fn command_root(file: &AgentFile, t: &ToolFileSpec) -> PathBuf {
    t.root
        .as_ref()
        .map_or_else(|| file.dir.clone(), |r| file.resolve(r.get_ref()))
}

/// A built-in tool ([`Builtin`]).
fn builtin_tool(file: &AgentFile, t: &ToolFileSpec, builtin: &str) -> Result<Tool, CliError> {
    let kind = Builtin::from_name(builtin).ok_or_else(|| CliError::Setup {
        message: format!("no built-in tool {builtin:?}"),
    })?;
    let mut options = builtin_options(file, t);
    // A walk meets files no call named: it leaves out those the gate would deny or ask about.
    // A file tool judges its path again as it runs: a call of its batch may have made it a link
    // to a denied file after the gate allowed it; the shell judges its command again (a call
    // of its batch may have made `./tidy` a link to a denied program).
    if (kind.judges_paths() || kind.judges_commands()) && file.permissions().is_some() {
        options.withhold = Some(permission_store(file)?);
    }
    kind.tool_named(t.name(), &options)
        .map_err(|e| CliError::Setup {
            message: format!("tool {}: {}: {e}", t.name(), e.code()),
        })
}

/// The defaults the built-in tools bring ([`Builtin::default_permission`]): one for each
/// built-in tool whose default is not `allow` (`shell` asks) and that the `[permissions]` table
/// names in no rule for the whole tool (its lists, or a rule without an argument match). A
/// `default`, a `*` rule or a rule on some of the tool's arguments does not count: a rule about
/// some commands never turns the shell's ask off for the others.
pub fn builtin_permission_rules(file: &AgentFile) -> Vec<PermissionRule> {
    let named = permission_rules(file);
    file.tools()
        .iter()
        .filter_map(|t| {
            let kind = Builtin::from_name(t.builtin.as_ref()?.get_ref())?;
            let permission = kind.default_permission();
            let said = named
                .iter()
                .any(|r| r.tool == t.name() && r.arguments.is_none());
            (permission != Permission::Allow && !said).then(|| PermissionRule {
                tool: t.name().to_owned(),
                arguments: None,
                permission,
            })
        })
        .collect()
}

/// A command tool, in its sandbox. Its children see the shell's allow list of variables and those
/// its `env` names, never a secret nor the agent's API key variable.
fn command_tool(
    file: &AgentFile,
    t: &ToolFileSpec,
    command: &toml::Spanned<Vec<String>>,
) -> Result<Tool, CliError> {
    let mut tool = CommandTool::new(t.name(), command.get_ref().clone())
        .description(t.description.clone().unwrap_or_default())
        .input_schema(t.input_schema.as_ref().map_or_else(
            || json!({"type": "object", "properties": {}}),
            |s| s.get_ref().clone(),
        ))
        .mode(t.mode.unwrap_or_default())
        .poller(t.poller.unwrap_or(false))
        .idempotent(t.idempotent.unwrap_or(false))
        .retries(t.retries.as_ref().map_or(0, |r| *r.get_ref()))
        .working_dir(&file.dir)
        .root(command_root(file, t))
        .read_only(file.kept_from_processes())
        .sandbox(t.sandbox(file.sandbox()));
    for var in t.env.as_deref().unwrap_or_default() {
        tool = tool.allow_env(var.get_ref().clone());
    }
    if let Some(timeout) = t
        .timeout_secs
        .as_ref()
        .and_then(|secs| Duration::try_from_secs_f64(*secs.get_ref()).ok())
    {
        tool = tool.timeout(timeout);
    }
    if let Some(var) = file.api_key_env() {
        tool = tool.hide_env(var);
    }
    tool.into_tool().map_err(|e| CliError::Setup {
        message: e.to_string(),
    })
}

/// The scripted model of a scripted agent file.
pub fn scripted_model(file: &AgentFile) -> Result<ScriptedModel, CliError> {
    let m = file.model();
    let script = m
        .script
        .as_ref()
        .map(|s| file.resolve(s.get_ref()))
        .ok_or_else(|| CliError::Setup {
            message: "the scripted provider needs `script`".into(),
        })?;
    let model = crate::agent_file::model::read_script(&script)
        .map_err(|message| CliError::Setup { message })?;
    Ok(model.streaming(m.stream.unwrap_or(true)))
}

/// The model the file names. Live providers need their API key; their calls are retried.
pub fn model(file: &AgentFile) -> Result<Arc<dyn Model>, CliError> {
    let model: Arc<dyn Model> = match *file.model().provider.get_ref() {
        Provider::Scripted => Arc::new(scripted_model(file)?),
        live => crate::live::model(file, live)?,
    };
    cached(file, model)
}

/// The default time a cached answer is kept: a day.
const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The model behind a response cache, when the file asks for one (`[model] cache = true`).
fn cached(file: &AgentFile, model: Arc<dyn Model>) -> Result<Arc<dyn Model>, CliError> {
    let m = file.model();
    if m.cache != Some(true) {
        return Ok(model);
    }
    let path = std::env::var_os("AGENTLOOP_RESPONSE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| file.resolve("responses.db"));
    let store =
        agentloop_store::SqliteResponseCache::open(&path).map_err(|message| CliError::Setup {
            message: format!("the response cache: {message}"),
        })?;
    let ttl = m
        .cache_ttl_secs
        .as_ref()
        .and_then(|s| Duration::try_from_secs_f64(*s.get_ref()).ok())
        .unwrap_or(DEFAULT_CACHE_TTL);
    let mut cached = agentloop::model::cache::CachedModel::new(model, Arc::new(store), ttl);
    // Keyed by the server and the encoded body too: never another server's answer.
    if let Some(wire) = crate::live::wire_key(file, *m.provider.get_ref())? {
        cached = cached.keyed_by_wire(wire);
    }
    Ok(Arc::new(cached))
}

/// True when the agent's answers are priced at all (the file's price, or the built-in table a
/// live provider is priced with): then an answer the pricing does not know has an unknown
/// cost, not a cost that is simply not counted.
pub fn has_pricing(model: &ModelSpec) -> bool {
    model.price.is_some() || *model.provider.get_ref() != Provider::Scripted
}

/// The rules of the `[permissions]` table: the `deny`, `ask` and `allow` lists (each a rule for
/// every call of a tool), then the `[[permissions.rules]]`.
pub fn permission_rules(file: &AgentFile) -> Vec<PermissionRule> {
    let Some(p) = file.permissions() else {
        return Vec::new();
    };
    let lists = [
        (Permission::Deny, &p.deny),
        (Permission::Ask, &p.ask),
        (Permission::Allow, &p.allow),
    ];
    let listed = lists.into_iter().flat_map(|(permission, names)| {
        names
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(move |name| PermissionRule {
                tool: name.get_ref().clone(),
                arguments: None,
                permission,
            })
    });
    let rules = p.rules.as_deref().unwrap_or_default().iter().map(|r| {
        let arguments = match (&r.command_prefix, &r.path_glob) {
            (Some(c), _) => Some(ArgumentMatch::CommandPrefix {
                field: c.field.get_ref().clone(),
                prefix: c.prefix.get_ref().clone(),
                allow_chaining: c.allow_chaining.unwrap_or(false),
            }),
            (None, Some(g)) => Some(ArgumentMatch::PathGlob {
                field: g.get_ref().field.get_ref().clone(),
                glob: g.get_ref().glob.get_ref().clone(),
            }),
            (None, None) => None,
        };
        PermissionRule {
            tool: r.tool.get_ref().clone(),
            arguments,
            permission: r.permission,
        }
    });
    listed.chain(rules).collect()
}

/// The permission store the file describes: its `default` (allow when absent) as the fallback,
/// the answers saved in its `store` file, its lists and rules as configured rules (never
/// written back to the file), and the built-in tools' own defaults. Path rules resolve paths
/// against the agent file's folder. The core store decides which wins: a saved answer settles
/// the file's `ask` for its tool, never an `ask` or `deny` rule on the arguments, nor a `deny`
/// for the tool; a tool with argument rules asks about the calls none matches.
pub fn permission_store(file: &AgentFile) -> Result<PermissionStore, CliError> {
    let Some(p) = file.permissions() else {
        let mut store = PermissionStore::new(Permission::Allow);
        for rule in builtin_permission_rules(file) {
            store.tool_default(rule.tool, rule.permission);
        }
        return Ok(store);
    };
    let fallback = p.default.unwrap_or(Permission::Allow);
    let mut store = match &p.store {
        Some(path) => crate::permission_file::open(file.resolve(path.get_ref()), fallback)
            .map_err(|e| CliError::Setup {
                message: e.to_string(),
            })?,
        None => PermissionStore::new(fallback),
    };
    // Lexically absolute: the folder the rules were written in.
    let root = std::path::absolute(&file.dir).unwrap_or_else(|_| file.dir.clone());
    store.root(root);
    // Each tool's paths resolve as the tool resolves them: a built-in's within its own root,
    // any other tool's in the agent file's folder, where commands run; links followed.
    store.resolve_paths(
        "*",
        Arc::new(crate::permission_paths::FolderPaths::new(&file.dir)),
    );
    for t in file.tools() {
        let Some(kind) = t
            .builtin
            .as_ref()
            .and_then(|b| Builtin::from_name(b.get_ref()))
        else {
            continue;
        };
        if kind.uses_root()
            && let Ok(workspace) = agentloop_tools::Workspace::new(builtin_options(file, t).root)
        {
            store.resolve_paths(
                t.name(),
                Arc::new(crate::permission_paths::WorkspacePaths(workspace)),
            );
        }
    }
    for rule in permission_rules(file) {
        store.configure(rule);
    }
    for rule in builtin_permission_rules(file) {
        store.tool_default(rule.tool, rule.permission);
    }
    Ok(store)
}

/// Who answers a call that needs approval (the same for an agent and its subagents).
#[derive(Clone)]
pub enum Approval {
    /// `--yes`: every asked call runs, this once.
    Yes,
    /// A person, through this prompter.
    Prompter(Arc<dyn ApprovalPrompter>),
    /// A person who also answers the model's questions (`ask_user`): the terminal.
    Person(Arc<dyn ApprovalPrompter>, Arc<dyn Answerer>),
    /// Nobody: an asked call is denied with this reason.
    Nobody(&'static str),
}

/// Creates the permission store of each file of the tree that names one, with its lock, its
/// recovery copy and any folder missing on its way, when it lies where a process of the tree may
/// write (the [`AgentFile::process_roots`] of every file of it: a subagent's command tool writes
/// its parent's folder as well as its own): a process sees the store read-only only if it exists
/// when the process starts; missing, the model could have it (or the copy a broken store is read
/// from) created, its folder first, with an allow-all rule for the next run, or a FIFO or link
/// put where its lock goes.
pub fn create_exposed_stores(file: &AgentFile) -> Result<(), CliError> {
    let files = tree_files(file);
    let roots: Vec<PathBuf> = files.iter().flat_map(|f| f.process_roots()).collect();
    for f in &files {
        let Some(store) = f.permissions().and_then(|p| p.store.as_ref()) else {
            continue;
        };
        let store = f.resolve(store.get_ref());
        let Some(place) = canonical_place(&store) else {
            continue;
        };
        if !roots.iter().any(|r| place.starts_with(r)) {
            continue;
        }
        crate::permission_file::create_empty(&store).map_err(|e| CliError::Setup {
            message: format!(
                "cannot create the permission store {}: {e}",
                crate::terminal::shown_path(&store)
            ),
        })?;
    }
    Ok(())
}

/// The file and every file of its tree: its subagents' files, all the way down, and the files
/// its hand-offs reach. A file named twice is listed twice.
fn tree_files(file: &AgentFile) -> Vec<&AgentFile> {
    let mut files = vec![file];
    let mut at = 0;
    while let Some(f) = files.get(at).copied() {
        files.extend(f.subagents.iter().map(|(_, child)| child));
        files.extend(f.handoff_files.iter().map(|(_, target)| target));
        at += 1;
    }
    files
}

/// Refuses an agent file of the tree that is reached through a symbolic link (the file itself,
/// or a folder on its path) lying in a folder a process of the tree may write
/// (`roots`: [`AgentFile::process_roots`] for a run, [`AgentFile::server_roots`] for a dry run,
/// which starts no tool), and likewise a file an agent file names that agentloop reads or a
/// command runs ([`AgentFile::named_files`]: instructions, a model's script, a command's
/// script). What protects the agent's own files from its processes holds the file the link
/// leads to, read-only, not the link: a process could put another link, or a file of its own,
/// in the link's place, and the next run would load an agent (or instructions) the model wrote,
/// or the next call run its program under the command's sandbox. A root of `/` (the sandbox
/// `off`) is passed over: such a process writes the agent's files themselves, and a link adds
/// nothing to what it can do.
pub fn refuse_swappable_agent_files(
    file: &AgentFile,
    roots: fn(&AgentFile) -> Vec<PathBuf>,
) -> Result<(), CliError> {
    let files = tree_files(file);
    let roots: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| roots(f))
        .filter(|r| r.parent().is_some())
        .collect();
    if roots.is_empty() {
        return Ok(());
    }
    // The files as the agent files name them: a hand-off's target is loaded by its canonical
    // path, so the path its `[[handoffs]]` entry gives is the one a link may be on.
    let named = files.iter().flat_map(|f| {
        let handoffs = f.spec.handoffs.iter().flatten();
        std::iter::once(f.path.clone())
            .chain(handoffs.map(|h| f.resolve(h.agent.get_ref())))
            .map(|p| (p, "agent file"))
            .chain(f.named_files())
    });
    for (path, kind) in named {
        let Some((link, root)) = link_on_the_way(&path, &roots) else {
            continue;
        };
        let target = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        let instead = if path == file.path {
            "Run the file it leads to"
        } else {
            "Name the file it leads to"
        };
        return Err(CliError::Setup {
            message: format!(
                "the {kind} {} is reached through the symbolic link {}, which lies in {}, a \
                 folder the agent's processes may write: one could put another file in its place \
                 for the next run. {instead} ({}) instead, or keep the link outside the folders \
                 the agent's processes write",
                crate::terminal::shown_path(&path),
                crate::terminal::shown_path(&link),
                crate::terminal::shown_path(root),
                crate::terminal::shown_path(&target),
            ),
        });
    }
    Ok(())
}

/// The first symbolic link on the way to `path` (the file itself, or a folder of its path as
/// given) whose own entry lies under one of `roots` (canonical), with that root.
fn link_on_the_way<'r>(path: &Path, roots: &'r [PathBuf]) -> Option<(PathBuf, &'r PathBuf)> {
    let absolute = std::path::absolute(path).ok()?;
    let mut at = PathBuf::new();
    for part in absolute.components() {
        at.push(part);
        let is_link = std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            continue;
        }
        // The folder that holds the link's entry, as a process writing there reaches it.
        let Some(folder) = at.parent().and_then(|p| std::fs::canonicalize(p).ok()) else {
            continue;
        };
        if let Some(root) = roots.iter().find(|r| folder.starts_with(r)) {
            return Some((at, root));
        }
    }
    None
}

/// Where `path` is or would be made: its nearest existing folder canonical (links followed, as
/// a process writing there would follow them), the missing rest added as written. None when
/// the rest climbs (`..`) or nothing of it exists.
fn canonical_place(path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    let parts: Vec<std::path::Component<'_>> = absolute.components().collect();
    (0..=parts.len()).rev().find_map(|kept| {
        let (head, rest) = parts.split_at(kept);
        let found = std::fs::canonicalize(head.iter().collect::<PathBuf>()).ok()?;
        let climbs = rest
            .iter()
            .any(|c| !matches!(c, std::path::Component::Normal(_)));
        (!climbs).then(|| found.join(rest.iter().collect::<PathBuf>()))
    })
}

/// True when the file's calls go through a permission gate: it has a `[permissions]` table, or
/// a built-in tool that asks by default (`shell`).
pub fn has_gate(file: &AgentFile) -> bool {
    file.permissions().is_some() || !builtin_permission_rules(file).is_empty()
}

/// The permission gate of a file with a `[permissions]` table or a built-in tool that asks by
/// default (none otherwise: every call runs). The run races the gate against its cancellation,
/// so no call starts after a Ctrl-C at the prompt.
pub fn gate(file: &AgentFile, approval: &Approval) -> Result<Option<Arc<dyn Gate>>, CliError> {
    let permissions: Option<Arc<dyn Gate>> = if has_gate(file) {
        let gate = PermissionGate::new(permission_store(file)?);
        Some(Arc::new(match approval.clone() {
            Approval::Yes => gate.with_prompter(Arc::new(FixedAnswer(Answer::AllowOnce))),
            Approval::Prompter(p) | Approval::Person(p, _) => gate.with_prompter(p),
            Approval::Nobody(reason) => gate.unattended_reason(reason),
        }))
    } else {
        None
    };
    let Some(tool) = ask_tool(file) else {
        return Ok(permissions);
    };
    // The questions' gate wraps the permission gate: one batch's questions and approvals are
    // put (or suspend the run) together.
    let mut ask = AskGate::new().tool(tool);
    if let Some(p) = permissions {
        ask = ask.around(p);
    }
    if let Approval::Person(_, answerer) = approval {
        ask = ask.with_answerer(answerer.clone());
    }
    Ok(Some(Arc::new(ask)))
}

/// The name the file's `ask_user` built-in goes by, when it has one.
pub fn ask_tool(file: &AgentFile) -> Option<&str> {
    file.tools()
        .iter()
        .find(|t| {
            t.builtin
                .as_ref()
                .and_then(|b| Builtin::from_name(b.get_ref()))
                == Some(Builtin::AskUser)
        })
        .map(ToolFileSpec::name)
}

/// What the agent file adds to the agent's definition (its fingerprint): what the core cannot
/// see for itself, the tools' commands (and the built-in tools' options), the permissions and
/// the version.
pub fn definition_parts(file: &AgentFile) -> Vec<(&'static str, serde_json::Value)> {
    let commands: serde_json::Map<String, serde_json::Value> = file
        .tools()
        .iter()
        .map(|t| {
            let how = match (&t.command, &t.agent, &t.builtin) {
                (None, None, None) if t.a2a.is_some() => {
                    let mut how = serde_json::Map::new();
                    how.insert(
                        "a2a".into(),
                        json!(
                            t.a2a
                                .as_ref()
                                .map(|u| agentloop::url_secrets::shown(u.get_ref()))
                        ),
                    );
                    // Only where given: a file without it keeps the definition it had.
                    if let Some(max) = &t.max_bytes {
                        how.insert("max_bytes".into(), json!(max.get_ref()));
                    }
                    serde_json::Value::Object(how)
                }
                (Some(c), _, _) => json!(c.get_ref()),
                // A change in the subagent's file changes this agent's definition too.
                (None, Some(a), _) => json!({
                    "agent": a.get_ref(),
                    "fingerprint": file
                        .subagent(t.name())
                        .and_then(|child| fingerprint(child).ok()),
                }),
                (None, None, Some(b)) => {
                    let o = builtin_options(file, t);
                    json!({
                        "builtin": b.get_ref(),
                        "root": t.root.as_ref().map(|r| r.get_ref()),
                        "max_bytes": o.max_bytes,
                        "max_results": o.max_results,
                        "timeout_secs": o.timeout.map(|d| d.as_secs_f64()),
                        "allow_private": o.allow_private,
                        "env": o.env,
                    })
                }
                (None, None, None) => serde_json::Value::Null,
            };
            (t.name().to_owned(), how)
        })
        .collect();
    let permissions = file.permissions().map(|p| {
        json!({
            "default": p.default.unwrap_or(Permission::Allow),
            "rules": permission_rules(file),
        })
    });
    let m = file.model();
    let model = json!({
        "provider": m.provider.get_ref().as_str(),
        "name": m.name.as_ref().map(|n| n.get_ref()),
        // The journal keeps the definition whole: the server, not a credential in its URL (a
        // changed key is not a changed agent either).
        "base_url": m.base_url.as_ref().map(|u| agentloop::url_secrets::shown(u.get_ref())),
    });
    let mut parts = vec![
        ("model", model),
        ("commands", serde_json::Value::Object(commands)),
        ("permissions", json!(permissions)),
    ];
    if !file.mcp().is_empty() {
        let mut mcp = mcp_declarations(file);
        // A server's sandbox bounds what the host lets it do, not what the agent is (as for
        // tools): it stays out of the fingerprint.
        for server in mcp.as_array_mut().into_iter().flatten() {
            if let Some(transport) = server
                .get_mut("transport")
                .and_then(serde_json::Value::as_object_mut)
            {
                transport.remove("sandbox");
            }
        }
        parts.push(("mcp", mcp));
    }
    if let Some(v) = &file.spec.version {
        parts.push(("version", json!(v)));
    }
    if let Some(h) = crate::handoff::definition(file) {
        parts.push(("handoffs", h));
    }
    parts
}

/// What the `[[mcp]]` entries declare, as `plan` shows it and the fingerprint holds it: the
/// variables templates read, never their values.
pub fn mcp_declarations(file: &AgentFile) -> serde_json::Value {
    let vars = |map: &std::collections::BTreeMap<String, String>| -> serde_json::Value {
        map.iter()
            .map(|(k, v)| (k.clone(), json!(agentloop_mcp::template_vars(v))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let deferred: Vec<&str> = file
        .mcp()
        .iter()
        .filter(|m| m.defer == Some(true))
        .map(|m| m.name.get_ref().as_str())
        .collect();
    mcp_configs(file)
        .iter()
        .map(|c| {
            let how = match &c.transport {
                agentloop_mcp::Transport::Stdio {
                    command,
                    env,
                    sandbox,
                    ..
                } => {
                    json!({"command": command, "env_reads": vars(env), "sandbox": sandbox})
                }
                agentloop_mcp::Transport::Http { url, headers } => {
                    json!({"url": agentloop::url_secrets::shown(url), "headers_read": vars(headers)})
                }
            };
            let mut server = json!({
                "name": c.name,
                "transport": how,
                "restart": match c.restart {
                    agentloop_mcp::Restart::OnFailure => "on-failure",
                    _ => "never",
                },
                "timeout_secs": c.timeout.as_secs_f64(),
                "tools_named": format!("{}*", c.tool_name("")),
                "rename": c.rename,
                "trust_hints": c.trust_hints,
            });
            if deferred.contains(&c.name.as_str())
                && let Some(map) = server.as_object_mut()
            {
                // Only when set: the fingerprints of files without it stay as they were.
                map.insert("deferred".into(), json!(true));
            }
            if c.max_output_bytes != agentloop_mcp::DEFAULT_MAX_OUTPUT_BYTES
                && let Some(map) = server.as_object_mut()
            {
                // What the model reads of a result, so part of the definition; only when not the
                // default, so that the fingerprints of files without it stay as they were.
                map.insert("max_output_bytes".into(), json!(c.max_output_bytes));
            }
            if let Some(version) = &c.protocol_version
                && let Some(map) = server.as_object_mut()
            {
                // Only when pinned, as above.
                map.insert("protocol_version".into(), json!(version));
            }
            server
        })
        .collect::<Vec<_>>()
        .into()
}

/// How the agents of `agent` tools are built: for real (their own models and permission gates,
/// asking through the same approval), or as stand-ins that need no credentials (for `plan`).
#[derive(Clone, Copy)]
enum Kids<'a> {
    /// With the tree's hand-off targets, which the agents built set.
    Real(&'a Approval, &'a StartedMcp, &'a crate::handoff::Targets),
    StandIn,
}

/// The started `[[mcp]]` servers of an agent file and of its subagents' files, by file: each
/// agent of the tree gets the tools of its own file's servers. It also holds the remote agents of
/// their `a2a` tools, each card read once at start.
#[derive(Debug, Default)]
pub struct StartedMcp {
    by_file: Vec<(PathBuf, agentloop_mcp::McpServers)>,
    /// The remote agents of `a2a` tools, their cards read: by file and tool name.
    remote: Vec<(PathBuf, String, agentloop_a2a::A2aClient)>,
}

impl StartedMcp {
    /// Reads the cards of the `a2a` tools of `file` and of every subagent's file below it (a card
    /// that cannot be read stops the start), then starts their MCP servers (a file named twice in
    /// the tree starts its servers once). The first that fails stops those already started.
    /// Before that, it refuses an agent file of the tree reached through a link its processes
    /// could replace ([`refuse_swappable_agent_files`]) and creates the permission stores they
    /// could otherwise create ([`create_exposed_stores`]).
    pub async fn start(file: &AgentFile) -> Result<StartedMcp, CliError> {
        refuse_swappable_agent_files(file, AgentFile::process_roots)?;
        create_exposed_stores(file)?;
        Self::connect(file).await
    }

    /// [`StartedMcp::start`] without creating the stores: for a dry run, where no tool runs and
    /// nothing is written. Only its servers are processes, so only a link they could replace
    /// refuses it.
    pub async fn start_servers(file: &AgentFile) -> Result<StartedMcp, CliError> {
        refuse_swappable_agent_files(file, AgentFile::server_roots)?;
        Self::connect(file).await
    }

    /// Reads the cards and starts the servers of [`StartedMcp::start`], checks done.
    async fn connect(file: &AgentFile) -> Result<StartedMcp, CliError> {
        let files = tree_files(file);
        let mut started = StartedMcp::default();
        for f in &files {
            for t in f.tools() {
                let Some(url) = &t.a2a else { continue };
                match agentloop_a2a::A2aClient::connect(url.get_ref()).await {
                    Ok(client) => {
                        started
                            .remote
                            .push((f.path.clone(), t.name().to_owned(), client));
                    }
                    Err(e) => {
                        return Err(CliError::Setup {
                            message: format!("tool {}: {}: {e}", t.name(), e.code()),
                        });
                    }
                }
            }
        }
        for f in files {
            if f.mcp().is_empty() || started.by_file.iter().any(|(p, _)| *p == f.path) {
                continue;
            }
            match agentloop_mcp::McpServers::connect(mcp_configs(f)).await {
                Ok(servers) => started.by_file.push((f.path.clone(), servers)),
                Err(e) => {
                    started.shutdown().await;
                    let file = if f.path == file.path {
                        String::new()
                    } else {
                        format!("{}: ", crate::terminal::shown_path(&f.path))
                    };
                    return Err(CliError::Setup {
                        message: format!("{file}{}: {e}", e.code()),
                    });
                }
            }
        }
        Ok(started)
    }

    /// The remote agent of a file's `a2a` tool, its card read at start.
    pub fn remote(&self, file: &AgentFile, tool: &str) -> Option<&agentloop_a2a::A2aClient> {
        self.remote
            .iter()
            .find(|(p, name, _)| *p == file.path && name == tool)
            .map(|(_, _, c)| c)
    }

    /// A file's started servers, when it declares any: its agent's tool source.
    pub fn servers(&self, file: &AgentFile) -> Option<&agentloop_mcp::McpServers> {
        self.by_file
            .iter()
            .find(|(p, _)| *p == file.path)
            .map(|(_, s)| s)
    }

    /// The tools of the started servers that their agents' runs leave out, as the warnings
    /// that say which tool keeps each name; those of a subagent's file, not `top`, name it.
    pub fn collision_warnings(&self, top: &AgentFile) -> Vec<String> {
        self.by_file
            .iter()
            .flat_map(|(path, servers)| {
                let file = if *path == top.path {
                    String::new()
                } else {
                    format!("{}: ", crate::terminal::shown_path(path))
                };
                servers
                    .collisions()
                    .into_iter()
                    .map(move |c| format!("{file}{c}"))
            })
            .collect()
    }

    /// Each file with its started servers, in the order of the tree.
    pub fn files(&self) -> impl Iterator<Item = (&std::path::Path, &agentloop_mcp::McpServers)> {
        self.by_file.iter().map(|(p, s)| (p.as_path(), s))
    }

    /// Stops every server.
    pub async fn shutdown(&self) {
        for (_, servers) in &self.by_file {
            servers.shutdown().await;
        }
    }
}

/// The file's `[[mcp]]` servers' configs, in order.
pub fn mcp_configs(file: &AgentFile) -> Vec<agentloop_mcp::ServerConfig> {
    file.mcp()
        .iter()
        .map(|m| {
            let mut config = m.server_config(&file.dir, file.sandbox());
            // The server may write its folder, the agent's: never the agent's own files in it.
            if let agentloop_mcp::Transport::Stdio { read_only, .. } = &mut config.transport {
                *read_only = file.kept_from_processes();
            }
            config
        })
        .collect()
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

/// The agent's definition fingerprint, as a journaled run of it records it; needs no
/// credentials (the model's part of the definition is the file's `[model]`).
pub fn fingerprint(file: &AgentFile) -> Result<String, CliError> {
    // A file's definition holds each subagent's fingerprint, and building it builds each subagent
    // too, which computes its own subagents' fingerprints again: twice per level, so a chain of
    // 30 files took 2^30 builds (an endless hang). Each file's fingerprint is computed once per
    // outermost call instead.
    let memo = FingerprintMemo::enter();
    if let Some(hit) = memo.get(file) {
        return Ok(hit);
    }
    let stand_in = Arc::new(ScriptedModel::new([]));
    let print = builder(file, stand_in, None, Kids::StandIn)?
        .definition()
        .fingerprint();
    memo.put(file, &print);
    Ok(print)
}

thread_local! {
    /// The fingerprints computed during the outermost [`fingerprint`] call on this thread, by the
    /// address of their file; `None` outside one.
    static FINGERPRINTS: std::cell::RefCell<Option<Vec<(usize, String)>>> =
        const { std::cell::RefCell::new(None) };
}

/// A scope of [`FINGERPRINTS`]: the outermost one clears it when it ends (a panic included).
/// Addresses are sound keys within it: the outermost call borrows the whole tree of files, so
/// none can move, change or be freed (and another take its address) before the memo is cleared.
struct FingerprintMemo {
    outermost: bool,
}

impl FingerprintMemo {
    fn enter() -> FingerprintMemo {
        let outermost =
            FINGERPRINTS.with_borrow_mut(|m| m.is_none().then(|| *m = Some(Vec::new())).is_some());
        FingerprintMemo { outermost }
    }

    fn key(file: &AgentFile) -> usize {
        std::ptr::from_ref(file) as usize
    }

    fn get(&self, file: &AgentFile) -> Option<String> {
        let key = Self::key(file);
        FINGERPRINTS.with_borrow(|m| {
            m.as_ref()
                .and_then(|all| all.iter().find(|(k, _)| *k == key))
                .map(|(_, print)| print.clone())
        })
    }

    fn put(&self, file: &AgentFile, print: &str) {
        let key = Self::key(file);
        FINGERPRINTS.with_borrow_mut(|m| {
            if let Some(all) = m {
                all.push((key, print.to_owned()));
            }
        });
    }
}

impl Drop for FingerprintMemo {
    fn drop(&mut self) {
        if self.outermost {
            FINGERPRINTS.with_borrow_mut(|m| *m = None);
        }
    }
}

/// An `agent` tool: it runs the agent its file describes.
fn subagent_tool(file: &AgentFile, t: &ToolFileSpec, kids: Kids<'_>) -> Result<Tool, CliError> {
    let name = t.name();
    let Some(child) = file.subagent(name) else {
        return Err(CliError::Setup {
            message: format!("the agent file of tool {name} was not loaded"),
        });
    };
    let (model, gate): (Arc<dyn Model>, _) = match kids {
        Kids::Real(approval, _, _) => (model(child)?, gate(child, approval)?),
        Kids::StandIn => (Arc::new(ScriptedModel::new([])), None),
    };
    let mut sub = builder(child, model, gate, kids)?;
    if matches!(kids, Kids::StandIn) {
        // A stand-in runs nothing: its budget needs no price.
        sub = sub.limits(Limits {
            max_cost_usd: None,
            ..limits(child)
        });
    }
    let sub = sub.build().map_err(|e| CliError::Setup {
        message: format!(
            "{}: {}: {e}",
            crate::terminal::shown_path(&child.path),
            e.code()
        ),
    })?;
    let description =
        t.description.clone().unwrap_or_else(|| {
            child.spec.description.clone().unwrap_or_else(|| {
                format!("Hands a task to the agent {}.", child.spec.name.get_ref())
            })
        });
    Ok(SubagentTool::new(sub, name.to_owned(), description)
        .cap(t.cap())
        .fatal(t.fatal.unwrap_or(false))
        .into_tool())
}

/// What the file's `[model]` says of the run beside the model itself: its sampling settings and
/// tool choice, its compaction and its price. Every agent built from a `[model]` table goes
/// through here (the CLI's, and the Python package's `Provider`), so a key means the same in
/// each.
pub fn with_model_keys(
    mut builder: agentloop::AgentBuilder,
    file: &AgentFile,
) -> agentloop::AgentBuilder {
    builder = builder.settings(settings(file));
    builder = match compaction(file) {
        Some(c) => builder.compaction(c),
        None => builder.without_compaction(),
    };
    if let Some(price) = file.model().price.as_ref().map(|p| p.get_ref().price()) {
        // The file prices its own model, whatever name the server answers with.
        builder = builder.pricing(move |_: &str, _: &str, usage: &agentloop::model::Usage| {
            Some(price.cost(usage))
        });
    } else if let Some(pricing) = crate::live::pricing(*file.model().provider.get_ref()) {
        builder = builder.pricing(
            move |provider: &str, model: &str, usage: &agentloop::model::Usage| {
                pricing.cost(provider, model, usage)
            },
        );
    }
    builder
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
