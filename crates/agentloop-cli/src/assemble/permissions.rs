//! The permission gate of an agent file: its rules (the `[permissions]` table's and the built-in
//! tools' defaults), the store of remembered answers and the files it must not let a tool swap,
//! who answers an `ask` ([`Approval`]), and the `ask_user` tool's gate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::{
    Gate,
    ask::{Answerer, AskGate},
    permissions::{
        Answer, ApprovalPrompter, ArgumentMatch, FixedAnswer, Permission, PermissionGate,
        PermissionRule, PermissionStore, fold_path,
    },
};
use agentloop_tools::Builtin;

use crate::agent_file::{AgentFile, ToolFileSpec};

use crate::error::CliError;

use super::builtin_options;

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
    for rule in with_server_names_resolved(file, permission_rules(file)) {
        store.configure(rule);
    }
    for rule in builtin_permission_rules(file) {
        store.tool_default(rule.tool, rule.permission);
    }
    Ok(store)
}

/// `rules`, and beside each that names an MCP tool by the server's own name for it (before a
/// `rename`, or with characters a tool name may not hold: `fs__list_directory` for the tool
/// renamed `ls`) the same rule for the name the model calls that tool by. The load check takes
/// any name under a server's prefix, as its tools are known only once it runs; without this an
/// `ask` or `deny` so written would hold for no tool, and the call would run unasked.
fn with_server_names_resolved(file: &AgentFile, rules: Vec<PermissionRule>) -> Vec<PermissionRule> {
    // Only how each server names its tools is read here, not how it is started.
    let servers: Vec<_> = file
        .mcp()
        .iter()
        .map(|m| m.server_config(&file.dir, file.sandbox()))
        .collect();
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        for named in servers
            .iter()
            .filter_map(|s| s.tool_named_by_server_name(&rule.tool))
        {
            out.push(PermissionRule {
                tool: named,
                ..rule.clone()
            });
        }
        out.push(rule);
    }
    out
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
        if !roots.iter().any(|r| lies_under(&place, r)) {
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
pub(super) fn tree_files(file: &AgentFile) -> Vec<&AgentFile> {
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
    let roots = confined_roots(&files, roots);
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

/// Refuses an agent's own file that its processes are kept from
/// ([`AgentFile::kept_from_processes`]) when it lies in a folder a process of the tree may write
/// (`roots`, as for [`refuse_swappable_agent_files`]) on a file system that ignores case there
/// ([`ignores_case`]: FAT or exFAT in FUSE, a folder a container shares from macOS, a Linux
/// case-folding folder). What keeps such a file from a process is a read-only bind of its name,
/// and another spelling of the name (`AGENT.TOML`) reaches the same file by a path of its own
/// where the kernel does not fold case itself (FUSE): a process writes through it, or renames
/// a file of its own over it. Refused wherever case is ignored, as which kernels fold case
/// cannot be seen from here. Linux only: elsewhere no bind is made (the sandbox says so).
pub(crate) fn refuse_case_folded_own_files(
    file: &AgentFile,
    roots: fn(&AgentFile) -> Vec<PathBuf>,
) -> Result<(), CliError> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let files = tree_files(file);
    let roots = confined_roots(&files, roots);
    if roots.is_empty() {
        return Ok(());
    }
    for kept in files.iter().flat_map(|f| f.kept_from_processes()) {
        let Some(place) = canonical_place(&kept) else {
            continue;
        };
        let Some(root) = roots.iter().find(|r| lies_under(&place, r)) else {
            continue;
        };
        let Some(other) = ignores_case(&place, root) else {
            continue;
        };
        return Err(CliError::Setup {
            message: format!(
                "the agent's own file {} lies in {}, a folder the agent's processes may write, on \
                 a file system that ignores case ({} is found under the name {}): there the \
                 sandbox cannot keep the file read-only under every spelling of its name. Give \
                 the processes a root that holds none of the agent's files (`root = \"work\"`), \
                 or keep the agent on a file system that tells case apart",
                crate::terminal::shown_path(&kept),
                crate::terminal::shown_path(root),
                crate::terminal::shown_path(&other.0),
                other.1,
            ),
        });
    }
    Ok(())
}

/// The folders `roots` says the processes of `files` may write, but `/`: a process with the
/// sandbox `off` writes the agent's files themselves, whatever their names.
fn confined_roots(files: &[&AgentFile], roots: fn(&AgentFile) -> Vec<PathBuf>) -> Vec<PathBuf> {
    files
        .iter()
        .flat_map(|f| roots(f))
        .filter(|r| r.parent().is_some())
        .collect()
}

/// When the file system ignores case at `path` (canonical, under `root`): the first existing
/// part of it, from `path` up to `root`, that the file system finds under another spelling its
/// folder does not list ([`agentloop_sandbox::case_ignored_at`]), and that spelling. `None`
/// when it tells case apart there, or no name there can tell.
fn ignores_case(path: &Path, root: &Path) -> Option<(PathBuf, String)> {
    path.ancestors()
        .take_while(|p| lies_under(p, root))
        .find_map(|p| {
            let other = agentloop_sandbox::case_ignored_at(p)?;
            Some((p.to_path_buf(), other.to_string_lossy().into_owned()))
        })
}

/// True when `path` is `folder` or lies under it, whatever the case of their names
/// ([`fold_path`]): on a file system that ignores case, `Work/agent.toml` lies in `work`, and
/// a path (canonical on Linux) keeps the case it was given in. Over-matching only refuses, or
/// prepares, more.
pub(crate) fn lies_under(path: &Path, folder: &Path) -> bool {
    path.starts_with(folder) || fold_path(path).starts_with(fold_path(folder))
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
        if let Some(root) = roots.iter().find(|r| lies_under(&folder, r)) {
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
        // Joining nothing would add a trailing `/`, which a look-up reads as a folder.
        (!climbs).then(|| rest.iter().fold(found, |p, part| p.join(part)))
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
