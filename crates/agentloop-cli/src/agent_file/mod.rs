//! The agent file: a TOML description of an agent (instructions, model, limits, tools),
//! and its validation. A file is checked whole before anything runs: every problem is collected
//! with its key path (`tools[1].command`) and line, then all are reported at once.
//!
//! The shape is the serde structs of [`spec`]; [`check`] walks the parsed document against them
//! with spans, so that every shape problem is found, not only the first; [`rules`] then checks
//! what no type can say.

mod check;
pub mod model;
mod rules;
mod spec;

use std::path::{Path, PathBuf};

use agentloop::permissions::fold_path;
use agentloop_tools::{SandboxMode, SandboxPolicy};
use toml::de::DeTable;

use check::check_keys;
use rules::{check_clean_sections, check_rules};

pub use check::Problems;
pub use spec::{
    AgentFileSpec, Bound, CompactionSpec, McpFileSpec, ModelSpec, PermissionsSpec, Provider,
    ToolFileSpec, ToolSearchSpec,
};

/// A tool the program adds beside an agent file's own (see [`AgentFile::load_beside`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTool {
    /// Its name, as the model calls it.
    pub name: String,
    /// The arguments it takes (the top-level `properties` of its input schema), when known:
    /// a permission rule's argument matches are checked against them.
    pub arguments: Option<Vec<String>>,
}

/// One `[[handoffs]]` entry, its target file read.
#[derive(Debug, Clone)]
pub struct HandoffTo {
    /// The tool the model calls.
    pub tool: String,
    /// The target file's canonical path: its key among [`AgentFile::handoff_files`].
    pub key: PathBuf,
    /// The target agent's name.
    pub agent: String,
    /// What the model reads of it.
    pub description: String,
    /// What the target sees of the conversation.
    pub history: agentloop::handoff::HandoffHistory,
}

/// The folder (canonical) a process under `policy` whose root is `root` may write: none for a
/// read-only one, `/` with the sandbox off.
fn writable_root(policy: SandboxPolicy, root: PathBuf) -> Option<PathBuf> {
    if policy.mode == SandboxMode::ReadOnly {
        return None;
    }
    let root = std::fs::canonicalize(root).ok()?;
    Some(if policy.mode == SandboxMode::Off {
        PathBuf::from("/")
    } else {
        root
    })
}

/// The most `[limits] max_depth` may be. Each level of subagents or hand-offs runs inside its
/// parent's call, on the same thread's stack: agents handing off to each other under
/// `max_depth = 1000` overflowed it (an abort, not an error) after about a hundred hand-offs in a
/// debug build. 32 levels run in a debug build with room to spare.
pub const MAX_DEPTH: u32 = 32;

/// How deep subagent files may name each other (a file naming a file naming a file ...). Far
/// past any real tree (`[limits] max_depth` is 3 by default), and shallow enough that walking a
/// tree by recursion (loading it, assembling it, planning it) never overflows the stack.
pub const MAX_AGENT_FILE_NESTING: usize = 32;

/// How many agents a tree of subagent files may hold, counted as the tree is run (a file that
/// two tools name counts twice). Each file is read once, but the tree is assembled, planned and
/// checked agent by agent: files that each name the same two subagent files, 20 levels deep,
/// are a million agents. Far past any real tree.
pub const MAX_AGENT_FILE_TREE: usize = 256;

/// A checked agent file, with the directory its paths are relative to.
#[derive(Debug, Clone)]
pub struct AgentFile {
    /// The file's path.
    pub path: PathBuf,
    /// The directory relative paths start from.
    pub dir: PathBuf,
    /// What the file says.
    pub spec: AgentFileSpec,
    /// The instructions, read from `instructions` or `instructions_file`.
    pub instructions: Option<String>,
    /// The agent files its `agent` tools run, by tool name (loaded by [`AgentFile::load`]).
    pub subagents: Vec<(String, AgentFile)>,
    /// Its `[[handoffs]]`, each with its target's name (loaded by [`AgentFile::load`]).
    pub handoffs: Vec<HandoffTo>,
    /// On the file [`AgentFile::load`] was given: every agent file a hand-off reaches anywhere in
    /// its tree, once each by its canonical path (the loaded file itself never among them).
    pub handoff_files: Vec<(PathBuf, AgentFile)>,
    /// The files its tools may read but never write: the own files of the whole tree this file
    /// belongs to ([`AgentFile::own_files`]) and the stores its runs write
    /// ([`AgentFile::protect`]). The built-in file tools refuse them wherever their root is.
    pub protected: Vec<PathBuf>,
}

impl AgentFile {
    /// Reads and checks an agent file, and the agent files its `agent` tools name, all the way
    /// down; files that name each other in a cycle are refused. Every problem of a file is
    /// reported, or none.
    pub fn load(path: &Path) -> Result<AgentFile, LoadError> {
        Self::load_beside(path, &[])
    }

    /// What the file asks for that it may not mean, said when it is loaded but never refused
    /// (a file that loaded before keeps loading): a command tool given `retries` without
    /// `idempotent = true`, which a timeout or a non-zero exit runs again though its effect may
    /// already have happened (`git push` timing out after it pushed). Its subagents' files
    /// are named with their tool's path.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.warnings_into("", &mut out);
        out
    }

    fn warnings_into(&self, prefix: &str, out: &mut Vec<String>) {
        for (i, tool) in self.tools().iter().enumerate() {
            let retries = tool.retries.as_ref().map_or(0, |r| *r.get_ref());
            if retries > 0 && tool.command.is_some() && tool.idempotent != Some(true) {
                out.push(format!(
                    "{prefix}tools[{i}].retries: the command tool {:?} runs again after a \
                     non-zero exit or a timeout, when its effect may already have happened; \
                     add `idempotent = true` if running it twice does no more harm than once, \
                     or remove `retries`",
                    tool.name()
                ));
            }
            if let Some(child) = self.subagent(tool.name()) {
                child.warnings_into(&format!("{prefix}tools[{i}] (agent): "), out);
            }
        }
    }

    /// [`AgentFile::load`] for an agent whose program adds `host` tools beside the file's own
    /// (the Python package's `Agent.from_file(tools=...)`): the file's `[permissions]` and
    /// `tool_choice` may name them as they name the tools it declares. Its subagents' and
    /// hand-offs' files do not get them.
    pub fn load_beside(path: &Path, host: &[HostTool]) -> Result<AgentFile, LoadError> {
        Self::load_counting(path, host, &mut Loading::default())
    }

    /// [`AgentFile::load_beside`] with the files already loaded, and a count of reads.
    fn load_counting(
        path: &Path,
        host: &[HostTool],
        loading: &mut Loading,
    ) -> Result<AgentFile, LoadError> {
        let mut file = Self::load_in(path, loading, host)?.file;
        // Hand-offs may name each other in a cycle (billing hands back to triage): each file is
        // loaded once, by its canonical path, so the walk ends.
        let root = canonical(path);
        let mut queue = file.handoff_keys();
        let mut loaded: Vec<(PathBuf, AgentFile)> = Vec::new();
        while let Some(key) = queue.pop() {
            if key == root || loaded.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let target = Self::load_tree(&key, loading)?;
            queue.extend(target.handoff_keys());
            loaded.push((key, target));
        }
        file.handoff_files = loaded;
        // A subagent's tools must not rewrite its parent either: the whole tree is one program.
        let tree = file.own_files();
        file.protect(&tree);
        Ok(file)
    }

    /// The agent's own files, for this file and every subagent file below it: the agent files,
    /// instruction files, scripts, the files its command tools and stdio MCP servers name in
    /// their commands (programs and scripts) and the folders of those that run, the permission
    /// store (its lock and recovery copy included) and the response cache (SQLite's side files
    /// included). What the model must never be able to rewrite or add to, since the next call or
    /// run would execute it.
    pub fn own_files(&self) -> Vec<PathBuf> {
        let mut out = vec![self.path.clone()];
        let spec = &self.spec;
        out.extend(
            spec.instructions_file
                .iter()
                .map(|f| self.resolve(f.get_ref())),
        );
        let m = self.model();
        out.extend(m.script.iter().map(|s| self.resolve(s.get_ref())));
        if let Some(store) = self.permissions().and_then(|p| p.store.as_ref()) {
            let store = self.resolve(store.get_ref());
            out.extend(crate::permission_file::side_files(&store));
            out.push(store);
        }
        if m.cache == Some(true) {
            let cache = std::env::var_os("AGENTLOOP_RESPONSE_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| self.resolve("responses.db"));
            out.extend(sqlite_files(&cache));
        }
        for command in self.commands() {
            // Any word of a command that names a file beside the agent is a program or a script
            // the tool runs (`python3 tools/x.py`, `./server.sh`); other words name nothing.
            for file in command
                .iter()
                .map(|word| self.resolve(word))
                .filter(|p| p.is_file())
            {
                // A script loads what lies beside it before anything it names: Python puts its
                // folder first on the import path, Node and shell scripts read their neighbours
                // by relative path. A `json.py` written next to `tools/count.py` would run as the
                // tool, so a script's whole folder is the agent's.
                if is_program(&file)
                    && let Some(folder) = file.parent()
                {
                    out.push(folder.to_path_buf());
                }
                out.push(file);
            }
        }
        let handed = self.handoff_files.iter().map(|(_, f)| f);
        for child in self.subagents.iter().map(|(_, f)| f).chain(handed) {
            out.extend(child.own_files());
        }
        out.sort();
        out.dedup();
        out
    }

    /// The files this file (not its tree) names that agentloop reads or its commands run, each
    /// with what it is: its instructions file, its model's script, and the scripts its command
    /// tools and stdio MCP servers name after their program (`python3 tools/count.py`). The
    /// program itself is left out: a virtual environment's `bin/python` is a link by design, and
    /// the folder it lies in is not kept from processes anyway (see
    /// [`AgentFile::kept_from_processes`]).
    pub fn named_files(&self) -> Vec<(PathBuf, &'static str)> {
        let mut out: Vec<(PathBuf, &'static str)> = Vec::new();
        let spec = &self.spec;
        out.extend(
            spec.instructions_file
                .iter()
                .map(|f| (self.resolve(f.get_ref()), "instructions file")),
        );
        out.extend(
            self.model()
                .script
                .iter()
                .map(|s| (self.resolve(s.get_ref()), "model script")),
        );
        for command in self.commands() {
            out.extend(
                command
                    .iter()
                    .skip(1)
                    .map(|word| self.resolve(word))
                    .filter(|p| p.is_file())
                    .map(|p| (p, "script")),
            );
        }
        out
    }

    /// What the processes its tools start (command tools, stdio MCP servers, the shell) may not
    /// write where their root holds it, bound read-only in their view of the file system:
    /// [`AgentFile::protected`] but the folders of the programs its commands name. A process
    /// keeps the rest of its root writable, and a program's folder is often where its tool
    /// writes (`sh tool.sh` writing `log.txt` beside it); what a program reads of its folder
    /// without naming it (a `json.py` beside a Python script) cannot be listed in general, and
    /// `docs/security.md` says so.
    pub fn kept_from_processes(&self) -> Vec<PathBuf> {
        let folders = self.program_folders();
        self.protected
            .iter()
            .filter(|p| !folders.contains(p))
            .cloned()
            .collect()
    }

    /// The folders of the programs the commands of this file and of its tree name (see
    /// [`AgentFile::own_files`]).
    fn program_folders(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for command in self.commands() {
            for file in command
                .iter()
                .map(|word| self.resolve(word))
                .filter(|p| p.is_file() && is_program(p))
            {
                out.extend(file.parent().map(Path::to_path_buf));
            }
        }
        let handed = self.handoff_files.iter().map(|(_, f)| f);
        for child in self.subagents.iter().map(|(_, f)| f).chain(handed) {
            out.extend(child.program_folders());
        }
        out
    }

    /// The commands of its command tools and stdio MCP servers.
    fn commands(&self) -> impl Iterator<Item = &Vec<String>> {
        self.tools()
            .iter()
            .filter_map(|t| t.command.as_ref().map(|c| c.get_ref()))
            .chain(
                self.mcp()
                    .iter()
                    .filter_map(|m| m.command.as_ref().map(|c| c.get_ref())),
            )
    }

    /// Adds `paths` (files the run writes: its journal, session store, trace) to what the tools
    /// of this file and of every subagent file below it may not write. A SQLite file's side files
    /// (`-wal`, `-shm`, `-journal`) and the stores' lock folders (`.owners`, `.locks`) are added
    /// with it.
    pub fn protect(&mut self, paths: &[PathBuf]) {
        for p in paths {
            for f in sqlite_files(p) {
                if !self.protected.contains(&f) {
                    self.protected.push(f);
                }
            }
        }
        let handed = self.handoff_files.iter_mut().map(|(_, f)| f);
        for child in self.subagents.iter_mut().map(|(_, f)| f).chain(handed) {
            child.protect(paths);
        }
    }

    /// A file of the tree (no host tools) with its subagents: loaded once per canonical path,
    /// then copied from [`Loading::done`] wherever another file names it.
    fn load_tree(key: &Path, loading: &mut Loading) -> Result<AgentFile, LoadError> {
        if let Some(done) = loading.done.get(key) {
            return Ok(done.file.clone());
        }
        let chain = std::mem::take(&mut loading.chain);
        let loaded = Self::load_in(key, loading, &[]);
        loading.chain = chain;
        let loaded = loaded?;
        let file = loaded.file.clone();
        loading.done.insert(key.to_path_buf(), loaded);
        Ok(file)
    }

    fn load_in(path: &Path, loading: &mut Loading, host: &[HostTool]) -> Result<Loaded, LoadError> {
        loading.reads += 1;
        let text = crate::text_file::read_text(path, crate::text_file::MAX_AGENT_TEXT_BYTES)
            .map_err(|e| LoadError::Read {
                path: crate::terminal::shown_path(path),
                message: e.to_string(),
            })?;
        let mut file = Self::parse_beside(path, &text, host).map_err(LoadError::Invalid)?;
        loading.chain.push(canonical(path));
        let agents: Vec<(usize, String, toml::Spanned<String>)> = file
            .tools()
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, t.name().to_owned(), t.agent.clone()?)))
            .collect();
        let mut agents_in_tree = 1usize;
        let mut nesting = 0usize;
        for (i, name, agent) in agents {
            let child_path = file.resolve(agent.get_ref());
            let child_key = canonical(&child_path);
            let chain = &loading.chain;
            let refuse = |message: String| {
                let mut problems = Problems::new(path, &text);
                problems.at(&format!("tools[{i}].agent"), Some(agent.span()), message);
                Err(LoadError::Invalid(problems.sorted()))
            };
            // A chain of files each naming the next (no cycle) is walked by recursion here, and
            // again wherever the tree is assembled: bounded, so that a long chain is a problem
            // at its line, never a stack overflow. A file loaded before (higher up another
            // branch) is judged by the depth its own subagents reach below it here.
            let below = loading.done.get(&child_key).map_or(0, |l| l.nesting);
            if chain.len() + below > MAX_AGENT_FILE_NESTING {
                return refuse(format!(
                    "subagent files nest more than {MAX_AGENT_FILE_NESTING} deep: this file's \
                     subagent would be at depth {} of the tree",
                    chain.len() + below
                ));
            }
            if let Some(at) = chain.iter().position(|p| *p == child_key) {
                let cycle: Vec<String> = chain
                    .get(at..)
                    .unwrap_or_default()
                    .iter()
                    .chain(std::iter::once(&child_key))
                    .map(|p| p.display().to_string())
                    .collect();
                return refuse(format!(
                    "agent files name each other in a cycle: {}",
                    cycle.join(" -> ")
                ));
            }
            // A file loaded before had no cycle through it, nor through any file below it: one
            // would have been refused then.
            let child = match loading.done.get(&child_key) {
                Some(done) => done.clone(),
                None => {
                    let child = Self::load_in(&child_path, loading, &[])?;
                    loading.done.insert(child_key, child.clone());
                    child
                }
            };
            agents_in_tree = agents_in_tree.saturating_add(child.agents_in_tree);
            nesting = nesting.max(child.nesting + 1);
            if agents_in_tree > MAX_AGENT_FILE_TREE {
                return refuse(format!(
                    "the tree of subagents grows past {MAX_AGENT_FILE_TREE} agents here (a file \
                     counts once for each tool that names it, so files that name the same \
                     subagent files level after level multiply)"
                ));
            }
            file.subagents.push((name, child.file));
        }
        loading.chain.pop();
        let mut problems = Problems::new(path, &text);
        file.read_handoffs(&mut problems);
        file.check_shell_roots(&mut problems);
        file.check_process_roots(&mut problems, view_here);
        if !problems.is_empty() {
            return Err(LoadError::Invalid(problems.sorted()));
        }
        Ok(Loaded {
            file,
            agents_in_tree,
            nesting,
        })
    }

    /// A shell whose sandbox lets it write its root must not have the agent's own files under
    /// that root: the model would rewrite the program that runs it (`agent.toml`, a tool's
    /// script, the permission store) with one command. The file tools refuse those files one by
    /// one; a process can only be kept out of a whole folder.
    fn check_shell_roots(&self, problems: &mut Problems) {
        use agentloop_tools::SandboxMode;
        let own: Vec<PathBuf> = self
            .own_files()
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| !agentloop_sandbox::on_read_only_mount(p))
            .collect();
        for (i, t) in self.tools().iter().enumerate() {
            let is_shell = t.builtin.as_ref().is_some_and(|b| b.get_ref() == "shell");
            let writes_root = matches!(
                t.sandbox(self.sandbox()).mode,
                SandboxMode::WorkspaceWrite | SandboxMode::BestEffort
            );
            if !is_shell || !writes_root {
                continue;
            }
            let given = t.root.as_ref().map_or(".", |r| r.get_ref().as_str());
            let Ok(root) = std::fs::canonicalize(self.resolve(given)) else {
                continue;
            };
            // In any case: where case is ignored, `Tools` is the folder `tools` (a canonical
            // path keeps the case it was given in); elsewhere this refuses more.
            let under =
                |f: &PathBuf| f.starts_with(&root) || fold_path(f).starts_with(fold_path(&root));
            let Some(inside) = own.iter().find(|f| under(f)) else {
                continue;
            };
            // The root itself is the agent's when a script lies in it (its whole folder is).
            let holds = if *inside == root {
                "is the folder of one of the agent's scripts, the agent's own".to_owned()
            } else {
                let shown = inside.strip_prefix(&root).unwrap_or(inside).display();
                format!("holds the agent's own file {shown}")
            };
            problems.at(
                &format!("tools[{i}].root"),
                t.root
                    .as_ref()
                    .map(toml::Spanned::span)
                    .or_else(|| t.name_span()),
                format!(
                    "the shell may write everything under its root {given:?}, which {holds}: \
                     give the shell a folder of its own (root = \"workspace\"), or \
                     sandbox = \"read-only\""
                ),
            );
        }
    }

    /// A command tool or stdio MCP server whose sandbox lets it write its root may keep its
    /// root where the agent's own files are: its process sees them read-only (bound over
    /// themselves in its view of the file system), and writes the rest. Where this system
    /// gives no such view (`can_keep` answers for a mode), nothing would keep the process from
    /// rewriting the agent for the next run, so the file is refused, naming the way out; a file
    /// already on a read-only mount here (an agentloop run inside another's sandbox, which binds
    /// it so) needs no view and is left out. A mode
    /// this system cannot run at all is left to refuse each start, as it does.
    fn check_process_roots(&self, problems: &mut Problems, can_keep: fn(SandboxPolicy) -> bool) {
        let folders = self.program_folders();
        let own: Vec<PathBuf> = self
            .own_files()
            .iter()
            .filter(|p| !folders.contains(p))
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| !agentloop_sandbox::on_read_only_mount(p))
            .collect();
        let inside = |root: &Path| -> Option<String> {
            let root = std::fs::canonicalize(root).ok()?;
            // In any case, as in `check_shell_roots`.
            let folded_root = fold_path(&root);
            let f = own.iter().find(|f| {
                let folded = fold_path(f);
                f.starts_with(&root)
                    || root.starts_with(f)
                    || folded.starts_with(&folded_root)
                    || folded_root.starts_with(&folded)
            })?;
            Some(f.strip_prefix(&root).unwrap_or(f).display().to_string())
        };
        let writes_root = |policy: SandboxPolicy| {
            matches!(
                policy.mode,
                SandboxMode::WorkspaceWrite | SandboxMode::BestEffort
            )
        };
        for (i, t) in self.tools().iter().enumerate() {
            let policy = t.sandbox(self.sandbox());
            if t.command.is_none() || !writes_root(policy) {
                continue;
            }
            let given = t.root.as_ref().map_or(".", |r| r.get_ref().as_str());
            let Some(shown) = inside(&self.resolve(given)) else {
                continue;
            };
            if can_keep(policy) {
                continue;
            }
            problems.at(
                &format!("tools[{i}].root"),
                t.root
                    .as_ref()
                    .map(toml::Spanned::span)
                    .or_else(|| t.name_span()),
                format!(
                    "the command tool may write everything under its root {given:?}, which holds \
                     the agent's own file {shown}, and this system cannot keep that file \
                     read-only for it ({}): give the tool a folder of its own (root = \
                     \"work\"), or sandbox = \"read-only\"",
                    no_view()
                ),
            );
        }
        for (i, m) in self.mcp().iter().enumerate() {
            let policy = m.sandbox(self.sandbox());
            let Some(command) = m.command.as_ref() else {
                continue;
            };
            if !writes_root(policy) {
                continue;
            }
            let Some(shown) = inside(&self.dir) else {
                continue;
            };
            if can_keep(policy) {
                continue;
            }
            problems.at(
                &format!("mcp[{i}].command"),
                Some(command.span()),
                format!(
                    "the MCP server may write everything in its folder (the agent file's), \
                     which holds the agent's own file {shown}, and this system cannot keep that \
                     file read-only for it ({}): give it sandbox = \"read-only\", or move the \
                     agent file and its files to a folder of their own, apart from what the \
                     server writes",
                    no_view()
                ),
            );
        }
    }

    /// The folders (canonical) its processes may write: the roots of its shell and command tools
    /// and the folders of its stdio MCP servers, under a sandbox that writes its root
    /// (`workspace-write`, `best-effort`) or none (`off`: everywhere, so every folder is one).
    pub fn process_roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = self
            .tools()
            .iter()
            .filter(|t| {
                t.command.is_some() || t.builtin.as_ref().is_some_and(|b| b.get_ref() == "shell")
            })
            .filter_map(|t| {
                let given = t.root.as_ref().map_or(".", |r| r.get_ref().as_str());
                writable_root(t.sandbox(self.sandbox()), self.resolve(given))
            })
            .collect();
        roots.extend(self.server_roots());
        roots
    }

    /// The folders (canonical) its stdio MCP servers may write: of [`AgentFile::process_roots`],
    /// those of the processes a dry run starts too.
    pub fn server_roots(&self) -> Vec<PathBuf> {
        self.mcp()
            .iter()
            .filter(|m| m.command.is_some())
            .filter_map(|m| writable_root(m.sandbox(self.sandbox()), self.dir.clone()))
            .collect()
    }

    /// Reads each `[[handoffs]]` target's name and description (the file checked, not its tree:
    /// [`AgentFile::load`] loads that once for all).
    fn read_handoffs(&mut self, problems: &mut Problems) {
        let entries = self.spec.handoffs.clone().unwrap_or_default();
        for (i, h) in entries.iter().enumerate() {
            let at = format!("handoffs[{i}].agent");
            let target = self.resolve(h.agent.get_ref());
            // A target that cannot be read and one that is invalid are the same problem at the
            // same key: only the message differs.
            let shown = || crate::terminal::shown_path(&target);
            let read = crate::text_file::read_text(&target, crate::text_file::MAX_AGENT_TEXT_BYTES)
                .map_err(|e| format!("cannot read the agent file {}: {e}", shown()))
                .and_then(|text| {
                    Self::parse(&target, &text)
                        .map_err(|p| format!("the agent file {} is invalid:\n{p}", shown()))
                });
            let parsed = match read {
                Ok(f) => f,
                Err(msg) => {
                    problems.at(&at, Some(h.agent.span()), msg);
                    continue;
                }
            };
            let agent = parsed.spec.name.get_ref().clone();
            let description = h.description.clone().unwrap_or_else(|| {
                let what = parsed
                    .spec
                    .description
                    .as_deref()
                    .map_or_else(String::new, |d| format!(" ({d})"));
                format!(
                    "Hands this conversation to the agent {agent}{what}, which answers the \
                     user from here on."
                )
            });
            let tool = h.name.as_ref().map_or_else(
                || agentloop::handoff::tool_name(&agent),
                |n| n.get_ref().clone(),
            );
            self.handoffs.push(HandoffTo {
                tool,
                key: canonical(&target),
                agent,
                description,
                history: h.history.unwrap_or_default(),
            });
        }
    }

    /// The canonical paths of every hand-off target of this file and of its subagents' files.
    fn handoff_keys(&self) -> Vec<PathBuf> {
        let mut keys: Vec<PathBuf> = self.handoffs.iter().map(|h| h.key.clone()).collect();
        for (_, child) in &self.subagents {
            keys.extend(child.handoff_keys());
        }
        keys
    }

    /// The file a hand-off's key names: this one, or one of its [`AgentFile::handoff_files`].
    pub fn handoff_file(&self, key: &Path) -> Option<&AgentFile> {
        if canonical(&self.path) == key {
            return Some(self);
        }
        self.handoff_files
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, f)| f)
    }

    /// The agent file a subagent tool runs.
    pub fn subagent(&self, tool: &str) -> Option<&AgentFile> {
        self.subagents
            .iter()
            .find(|(name, _)| name == tool)
            .map(|(_, f)| f)
    }

    /// Checks agent file text; `path` locates relative paths and names the file in messages.
    pub fn parse(path: &Path, text: &str) -> Result<AgentFile, Problems> {
        Self::parse_beside(path, text, &[])
    }

    /// [`AgentFile::parse`] with `host` tools beside the file's (see [`AgentFile::load_beside`]).
    pub fn parse_beside(path: &Path, text: &str, host: &[HostTool]) -> Result<AgentFile, Problems> {
        let mut problems = Problems::new(path, text);
        let (root, syntax) = DeTable::parse_recoverable(text);
        if !syntax.is_empty() {
            for e in syntax {
                problems.at("", e.span(), e.message().trim().to_owned());
            }
            return Err(problems.sorted());
        }
        check_keys::<AgentFileSpec>(root.get_ref(), root.span(), "", &mut problems);
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        if !problems.is_empty() {
            check_clean_sections(root.get_ref(), &dir, host, &mut problems);
            return Err(problems.sorted());
        }
        let spec: AgentFileSpec = match toml::from_str(text) {
            Ok(spec) => spec,
            Err(e) => {
                problems.at("", e.span(), e.message().trim().to_owned());
                return Err(problems.sorted());
            }
        };
        let instructions = check_rules(&spec, &dir, host, &mut problems);
        if !problems.is_empty() {
            return Err(problems.sorted());
        }
        Ok(AgentFile {
            path: path.to_path_buf(),
            dir,
            spec,
            instructions,
            subagents: Vec::new(),
            handoffs: Vec::new(),
            handoff_files: Vec::new(),
            protected: Vec::new(),
        })
    }

    /// The tools, or none.
    pub fn tools(&self) -> &[ToolFileSpec] {
        self.spec.tools.as_deref().unwrap_or_default()
    }

    /// The `[[mcp]]` servers, or none.
    pub fn mcp(&self) -> &[McpFileSpec] {
        self.spec.mcp.as_deref().unwrap_or_default()
    }

    /// The `[permissions]` table, when the file has one.
    pub fn permissions(&self) -> Option<&PermissionsSpec> {
        self.spec.permissions.as_ref()
    }

    /// The model section.
    pub fn model(&self) -> &ModelSpec {
        self.spec.model.get_ref()
    }

    /// The environment variable holding the API key, for a live provider.
    pub fn api_key_env(&self) -> Option<String> {
        let m = self.model();
        m.api_key_env
            .as_ref()
            .map(|s| s.get_ref().clone())
            .or_else(|| m.provider.get_ref().default_key_env().map(str::to_owned))
    }

    /// The file's default sandbox for its tools' processes (`workspace-write` unless it says).
    pub fn sandbox(&self) -> agentloop_tools::SandboxMode {
        self.spec.sandbox.unwrap_or_default()
    }

    /// A path named in the file, resolved against its directory.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
}

/// True when a process of this policy, started here, would see the agent's own files under its
/// root read-only: this system gives the read-only view a confined process needs. A strict mode
/// this system cannot run at all answers true: each start of it is refused anyway.
fn view_here(policy: SandboxPolicy) -> bool {
    let support = agentloop_sandbox::Support::current();
    if policy.mode == SandboxMode::WorkspaceWrite
        && !agentloop_sandbox::Support::missing(policy).is_empty()
    {
        return true;
    }
    support.read_only_mounts.is_some()
}

/// Why a system gives no read-only view, for problems.
fn no_view() -> &'static str {
    "no read-only view of the file system: it needs CAP_SYS_ADMIN, or user namespaces for an \
     ordinary user, and Linux 5.12"
}

/// The state of one [`AgentFile::load`]: the files being loaded, and those done.
#[derive(Default)]
struct Loading {
    /// The canonical paths of the files being loaded, each naming the next: a cycle's witness.
    chain: Vec<PathBuf>,
    /// The subagent files loaded, by canonical path: a file that several tools name, at one
    /// level or many, is read and checked once.
    done: std::collections::HashMap<PathBuf, Loaded>,
    /// How many times a file was read (what keeps a diamond of files linear, in tests).
    reads: usize,
}

/// A loaded file with the size and depth of its tree.
#[derive(Clone)]
struct Loaded {
    file: AgentFile,
    /// The agents its tree holds, itself included ([`MAX_AGENT_FILE_TREE`]).
    agents_in_tree: usize,
    /// How many levels of subagent files lie below it (0 for a file without `agent` tools).
    nesting: usize,
}

/// A file's canonical path, or the path as given when it cannot be resolved.
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// True for a file that runs: an executable, or a script by its extension (an interpreter's
/// argument such as `tools/x.py` is seldom executable). A data file a command names
/// (`notes.json`) is protected alone, its folder left writable.
fn is_program(path: &Path) -> bool {
    const SCRIPTS: &[&str] = &[
        "py", "pyw", "js", "mjs", "cjs", "ts", "mts", "cts", "rb", "pl", "pm", "sh", "bash", "zsh",
        "fish", "lua", "php", "r", "jl", "tcl", "ps1",
    ];
    let script = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SCRIPTS.iter().any(|s| s.eq_ignore_ascii_case(e)));
    script || is_executable(path)
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(_path: &Path) -> bool {
    false
}

/// A store's file and what lies beside it: SQLite's side files, and the folders of lock files
/// and step logs the journal (`.owners`) and the session store (`.locks`) keep next to it.
fn sqlite_files(path: &Path) -> [PathBuf; 6] {
    let with = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [
        path.to_path_buf(),
        with("-wal"),
        with("-shm"),
        with("-journal"),
        with(".owners"),
        with(".locks"),
    ]
}

/// Why an agent file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read agent file {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The file has problems.
    #[error("{0}")]
    Invalid(Problems),
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::check::Problem;
    use super::*;

    pub(super) fn problems(text: &str) -> Vec<Problem> {
        AgentFile::parse(Path::new("agent.toml"), text)
            .unwrap_err()
            .list()
            .to_vec()
    }

    /// Each problem's key path and line.
    pub(super) fn located(text: &str) -> Vec<(String, usize)> {
        problems(text)
            .into_iter()
            .map(|p| (p.path, p.line))
            .collect()
    }

    /// Loads `text` as `agent.toml` in a folder of its own, beside an empty script `s.json`.
    pub(super) fn load_beside_script(text: &str) -> Result<AgentFile, LoadError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::write(dir.path().join("s.json"), "[]").unwrap();
        AgentFile::load(&path)
    }

    /// An agent file with two tools, `shell` and `write`, and no permissions.
    pub(crate) const TWO_TOOLS: &str = r#"name = "x"
[model]
provider = "openai"
name = "m"
[[tools]]
name = "shell"
command = ["sh"]
[[tools]]
name = "write"
command = ["sh"]
"#;

    /// Writes `d0.toml` .. `d{levels}.toml`, each naming the next level's file from `width`
    /// tools (the last names none): a diamond of `width^levels` paths over `levels + 1` files.
    fn diamond(dir: &Path, levels: usize, width: usize) {
        std::fs::write(dir.join("s.json"), "[]").unwrap();
        for k in 0..=levels {
            let mut text =
                format!("name = \"d{k}\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n");
            for t in (0..width).filter(|_| k < levels) {
                text.push_str(&format!(
                    "[[tools]]\nname = \"t{t}\"\nagent = \"d{}.toml\"\n",
                    k + 1
                ));
            }
            std::fs::write(dir.join(format!("d{k}.toml")), text).unwrap();
        }
    }

    fn load_counted(path: &Path) -> (Result<AgentFile, LoadError>, usize) {
        let mut loading = Loading::default();
        let file = AgentFile::load_counting(path, &[], &mut loading);
        (file, loading.reads)
    }

    /// Files that each name the same two files 20 levels deep were loaded once per path (2^20
    /// loads, a hang): each is read once, and the tree of a million agents is refused at the
    /// line where it passes the bound.
    #[test]
    fn a_diamond_of_subagent_files_reads_each_file_once_and_a_huge_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        diamond(dir.path(), 4, 2);
        let (file, reads) = load_counted(&dir.path().join("d0.toml"));
        let file = file.unwrap();
        assert_eq!(reads, 5);
        let mut leaves = 0;
        let mut stack = vec![&file];
        while let Some(f) = stack.pop() {
            leaves += usize::from(f.subagents.is_empty());
            stack.extend(f.subagents.iter().map(|(_, c)| c));
        }
        assert_eq!(leaves, 16);

        let dir = tempfile::tempdir().unwrap();
        diamond(dir.path(), 20, 2);
        let (file, reads) = load_counted(&dir.path().join("d0.toml"));
        assert!(reads <= 21, "{reads} reads");
        let said = file.expect_err("a tree of 2^20 agents loaded").to_string();
        assert!(
            said.contains("tools[1].agent: the tree of subagents grows past 256 agents"),
            "{said}"
        );
    }

    /// A file loaded once near the top and named again at the bottom of a long chain is held to
    /// the nesting bound where it is named again, as if it were read there.
    #[test]
    fn a_file_loaded_before_is_held_to_the_nesting_bound_where_it_is_named_again() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let head = "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n";
        let agent =
            |name: &str, file: &str| format!("[[tools]]\nname = \"{name}\"\nagent = \"{file}\"\n");
        std::fs::write(d.join("s.json"), "[]").unwrap();
        std::fs::write(d.join("leaf.toml"), format!("name = \"leaf\"\n{head}")).unwrap();
        std::fs::write(
            d.join("c.toml"),
            format!("name = \"c\"\n{head}{}", agent("leaf", "leaf.toml")),
        )
        .unwrap();
        let chain = |links: usize| {
            for k in 1..=links {
                let next = if k == links {
                    "c.toml".to_owned()
                } else {
                    format!("l{}.toml", k + 1)
                };
                let text = format!("name = \"l{k}\"\n{head}{}", agent("next", &next));
                std::fs::write(d.join(format!("l{k}.toml")), text).unwrap();
            }
            let top = format!(
                "name = \"top\"\n{head}{}{}",
                agent("c", "c.toml"),
                agent("l", "l1.toml")
            );
            std::fs::write(d.join("top.toml"), top).unwrap();
            load_counted(&d.join("top.toml"))
        };
        // top, 30 links, c and leaf: 33 files, 32 levels below the top.
        let (file, reads) = chain(30);
        assert!(file.is_ok(), "{file:?}");
        assert_eq!(reads, 33);
        let (file, _) = chain(31);
        let said = file.expect_err("a tree 33 levels deep loaded").to_string();
        assert!(said.contains("nest more than 32 deep"), "{said}");
    }

    /// Where no read-only view keeps the agent's own files from a process that may write the
    /// folder holding them, the file is refused at the entry's line; with a view, or with the
    /// process's root elsewhere or read-only, it loads.
    #[test]
    fn a_process_that_could_rewrite_the_agent_is_refused_where_nothing_keeps_its_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        std::fs::write(dir.path().join("s.json"), "[]").unwrap();
        let path = dir.path().join("agent.toml");
        let text = |tool: &str, server: &str| {
            format!(
                "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\
                 [[tools]]\nname = \"t\"\ncommand = [\"true\"]\n{tool}\n\
                 [[mcp]]\nname = \"m\"\ncommand = [\"true\"]\n{server}\n"
            )
        };
        let found = |text: &str, can_keep: fn(SandboxPolicy) -> bool| {
            std::fs::write(&path, text).unwrap();
            let file = AgentFile::parse(&path, text).unwrap();
            let mut problems = Problems::new(&path, text);
            file.check_process_roots(&mut problems, can_keep);
            problems
                .list()
                .iter()
                .map(|p| (p.path.clone(), p.line, p.message.clone()))
                .collect::<Vec<_>>()
        };
        let got = found(&text("", ""), |_| false);
        let at: Vec<(&str, usize)> = got.iter().map(|(p, l, _)| (p.as_str(), *l)).collect();
        assert_eq!(
            at,
            [("tools[0].root", 6), ("mcp[0].command", 11)],
            "{got:?}"
        );
        assert!(
            got.iter()
                .all(|(_, _, m)| m.contains("agent.toml") && m.contains("read-only")),
            "{got:?}"
        );
        assert_eq!(found(&text("", ""), |_| true), []);
        let apart = text("root = \"work\"", "sandbox = \"read-only\"");
        assert_eq!(found(&apart, |_| false), []);
    }

    /// A root that names the agent's folder in another case is that folder where case is
    /// ignored (a canonical path on Linux keeps the case it was given in): refused there as the
    /// folder is; here, where `AGENT/` is another folder, refused all the same.
    #[test]
    fn a_process_root_naming_the_agents_folder_in_another_case_is_refused_where_nothing_keeps_its_files()
     {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("Agent")).unwrap();
        std::fs::create_dir(dir.path().join("AGENT")).unwrap();
        std::fs::write(dir.path().join("Agent/s.json"), "[]").unwrap();
        let path = dir.path().join("Agent/agent.toml");
        // outside-paths: off (a sibling folder of the test's own temporary one)
        let text = "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\
                    [[tools]]\nname = \"t\"\ncommand = [\"true\"]\nroot = \"../AGENT\"\n";
        // outside-paths: on
        std::fs::write(&path, text).unwrap();
        let file = AgentFile::parse(&path, text).unwrap();
        let mut problems = Problems::new(&path, text);
        file.check_process_roots(&mut problems, |_| false);
        let at: Vec<String> = problems.list().iter().map(|p| p.path.clone()).collect();
        assert_eq!(at, ["tools[0].root"]);
    }

    #[test]
    fn a_hand_off_target_that_is_missing_or_invalid_is_a_problem_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent.toml");
        std::fs::write(
            &agent,
            "name = \"a\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\
             [[handoffs]]\nagent = \"other.toml\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("s.json"), "[]").unwrap();
        let said = |what: &str| {
            let err = AgentFile::load(&agent).expect_err(what).to_string();
            assert!(err.contains("handoffs[0].agent"), "{what}: {err}");
            err
        };
        let missing = said("a missing target");
        assert!(missing.contains("cannot read the agent file"), "{missing}");
        std::fs::write(dir.path().join("other.toml"), "name = 5\n").unwrap();
        let invalid = said("an invalid target");
        assert!(invalid.contains("is invalid"), "{invalid}");
        assert!(invalid.contains("other.toml"), "{invalid}");
    }

    #[test]
    fn a_syntax_error_has_a_line() {
        let got = problems("name = \"x\"\n[model\nprovider = 1\n");
        assert_eq!(got.first().map(|p| p.line), Some(2));
    }

    #[test]
    fn a_good_file_loads() {
        let text = r#"name = "weather"
instructions = "Be brief."
[model]
provider = "openai"
name = "gpt-4.1-mini"
temperature = 0
seed = 7
[limits]
max_turns = 6
max_cost_usd = 1
[[tools]]
name = "get_weather"
command = ["python3", "-c", "print(1)"]
input_schema = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
mode = "sequential"
timeout_secs = 10
"#;
        let file = AgentFile::parse(Path::new("agent.toml"), text).unwrap();
        assert_eq!(file.tools().len(), 1);
        assert_eq!(
            file.model().temperature.as_ref().map(|t| *t.get_ref()),
            Some(0.0)
        );
        assert_eq!(file.api_key_env().as_deref(), Some("OPENAI_API_KEY"));
    }

    #[test]
    fn tool_choice_is_a_mode_or_one_of_the_agents_tools() {
        let file = |choice: &str, dialect: &str| {
            format!(
                "name = \"a\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n\
                 tool_choice = \"{choice}\"\n{dialect}\n[[tools]]\nname = \"get_weather\"\n\
                 command = [\"true\"]\n[[mcp]]\nname = \"docs\"\ncommand = [\"true\"]\n"
            )
        };
        for good in ["auto", "required", "none", "get_weather", "docs__search"] {
            let text = file(good, "");
            let loaded = AgentFile::parse(Path::new("agent.toml"), &text);
            assert!(loaded.is_ok(), "{good}: {:?}", loaded.err());
        }
        let got = problems(&file("get_wether", ""));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].path, "model.tool_choice");
        assert!(
            got[0].message.contains("no tool named `get_wether`"),
            "{got:?}"
        );
        let got = problems(&file("required", "tool_dialect = \"auto\""));
        assert!(
            got.iter()
                .any(|p| p.path == "model.tool_choice" && p.message.contains("tool_dialect")),
            "{got:?}"
        );
        assert!(
            AgentFile::parse(
                Path::new("agent.toml"),
                &file("auto", "tool_dialect = \"auto\"")
            )
            .is_ok()
        );
    }
}
