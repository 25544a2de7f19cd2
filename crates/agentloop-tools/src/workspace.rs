//! The folder the file and shell tools are confined to, and the one function that turns a path a
//! model gave into a path inside it ([`Workspace::resolve`]). Every tool that touches a path goes
//! through it, so that there is one place where escapes are refused and one set of tests for it.
//!
//! The rules, in order:
//! - the root is canonicalized once, when the workspace is made;
//! - a path is refused lexically when it is absolute or holds a `..` component (`.` is dropped);
//! - the deepest part of the path that exists (a dangling link counts as existing) is
//!   canonicalized, which follows every link in it, and must still be under the root: a link
//!   inside that points out is refused whether it is the file itself or a folder on the way,
//!   and whether the file exists yet or not;
//! - the parts that do not exist yet are plain names appended to that canonical folder.
//!
//! Canonical forms are compared, so on a case-insensitive file system a path spelled in another
//! case resolves to the same canonical root and is accepted, and nothing else is. Protected
//! paths are compared ignoring case and Unicode normalization ([`fold_path`]), so that no
//! spelling of one of the agent's own files is written, on any file system.
//!
//! A folder swapped for a link between the check and the use (by the model's own shell, in a
//! sibling call) is caught where the file tools open, replace, list and walk: they open the
//! resolved path from the root one folder at a time, refusing links (`beneath.rs`).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use agentloop::permissions::{
    CommandRules, FileText, PathRules, PermissionStore, READ_LIMIT, fold_path,
};

/// The most characters of a path or a pattern that a message echoes whole ([`Echoed`]).
pub(crate) const MAX_ECHOED_CHARS: usize = 200;

/// A path, or a pattern of `glob` or `grep`, as a message echoes it, to the model and to the
/// operator alike: whole up to [`MAX_ECHOED_CHARS`] characters, and past that its first ones,
/// `…` and how many it has. A model can give a path or a pattern of any length (a megabyte of
/// `a/`): echoed whole in each answer or error, it would fill the context it is read in, the
/// trace and the terminal, for nothing a reader needs, and carry back whatever text it holds.
/// Every message of the file tools that names a path or a pattern names it through this.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Echoed<'a>(pub(crate) &'a str);

impl<'a> Echoed<'a> {
    /// The first characters and the whole count, when the text is too long to echo whole.
    fn cut(&self) -> Option<(&'a str, usize)> {
        let (end, _) = self.0.char_indices().nth(MAX_ECHOED_CHARS)?;
        let head = self.0.get(..end)?;
        Some((head, self.0.chars().count()))
    }

    /// Whether the text is short enough to be echoed whole.
    pub(crate) fn is_whole(&self) -> bool {
        self.cut().is_none()
    }

    /// In double quotes, escaped as `{:?}` writes a string (a NUL byte as `\0`), the count
    /// after the quotes.
    pub(crate) fn quoted(&self) -> String {
        match self.cut() {
            None => format!("{:?}", self.0),
            Some((head, count)) => format!("{:?} ({count} characters)", format!("{head}…")),
        }
    }
}

impl std::fmt::Display for Echoed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cut() {
            None => f.write_str(self.0),
            Some((head, count)) => write!(f, "{head}… ({count} characters)"),
        }
    }
}

/// Why a path was refused. The message is what the model reads: it names the path as the model
/// gave it (its first 200 characters, `…` and its length, when it is longer), never the
/// absolute root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// An absolute path (or a Windows prefix).
    #[error(
        "{shown} is an absolute path: give a path relative to the workspace root (such as \"src/main.rs\")",
        shown = Echoed(.path).quoted()
    )]
    Absolute {
        /// The path as given.
        path: String,
    },
    /// A `..` component.
    #[error("{shown} contains `..`: paths may not climb out of the workspace", shown = Echoed(.path).quoted())]
    ParentDir {
        /// The path as given.
        path: String,
    },
    /// The path leads out of the root through a symbolic link.
    #[error("{shown} leads outside the workspace (through a symbolic link)", shown = Echoed(.path).quoted())]
    Outside {
        /// The path as given.
        path: String,
    },
    /// A link on the path points at nothing, so where it leads cannot be checked.
    #[error("{shown} goes through a symbolic link whose target does not exist", shown = Echoed(.path).quoted())]
    DanglingLink {
        /// The path as given.
        path: String,
    },
    /// The path is one of the agent's own files (its agent file, scripts, instructions, stores)
    /// or lies in a folder of its scripts: tools may read it but never write it, so the model
    /// cannot rewrite the program it runs in, nor add a module that program would load.
    #[error(
        "{shown} is one of the agent's own files (its definition, scripts or stores), or in the folder of one of its scripts: it can be read but not written",
        shown = Echoed(.path).quoted()
    )]
    Protected {
        /// The path as given.
        path: String,
    },
    /// A `deny` path rule of the tool matches the path now, though the call was allowed: the
    /// gate judged it before its batch ran, and another call of the batch (a shell's `ln -s`)
    /// has since made the path lead to a file the rule denies.
    #[error(
        "{shown} now leads to a file the permission rules deny to this tool (it changed after the call was allowed)",
        shown = Echoed(.path).quoted()
    )]
    Denied {
        /// The path as given.
        path: String,
    },
    /// An `ask` path rule of the tool matches the path now, though the call was allowed without
    /// asking anyone: the gate judged it before its batch ran, and another call of the batch
    /// (a shell's `ln -s`) has since made the path lead to a file the rule asks about. Calling
    /// again gets the call judged with the link in place, and so asked about.
    #[error(
        "{shown} now leads to a file the permission rules ask about for this tool, and nobody approved this call (it changed after the call was allowed): call again to be asked",
        shown = Echoed(.path).quoted()
    )]
    Unapproved {
        /// The path as given.
        path: String,
    },
    /// A NUL byte in the path: no file name can hold one, so the path names no file.
    #[error(
        "{shown} contains a NUL byte (\\0), which no file or folder name can hold: give the path without it",
        shown = Echoed(.path).quoted()
    )]
    Nul {
        /// The path as given.
        path: String,
    },
    /// The file system could not answer.
    #[error("{shown}: {message}", shown = Echoed(.path).quoted())]
    Io {
        /// The path as given.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl PathError {
    /// The stable code, also the code of the tool error the model reads.
    pub fn code(&self) -> &'static str {
        match self {
            PathError::Absolute { .. } => "path_absolute",
            PathError::ParentDir { .. } => "path_parent_dir",
            PathError::Outside { .. } => "path_outside_root",
            PathError::DanglingLink { .. } => "path_dangling_link",
            PathError::Protected { .. } => "workspace.protected",
            PathError::Denied { .. } => "path_denied",
            PathError::Unapproved { .. } => "path_not_approved",
            PathError::Nul { .. } => "path_nul",
            PathError::Io { .. } => "path_io",
        }
    }
}

impl From<PathError> for agentloop::ToolError {
    fn from(e: PathError) -> Self {
        // No retry turns a refused path into an accepted one.
        agentloop::ToolError::new(e.code(), e.to_string()).permanent()
    }
}

/// Why a workspace could not be opened (an operator's error, at setup).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workspace root {root}: {message}")]
pub struct WorkspaceError {
    /// The root as given.
    pub root: String,
    /// What went wrong.
    pub message: String,
}

impl WorkspaceError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        "workspace.root"
    }
}

/// A folder the tools may not leave, the files in it they may not write, and the permission rules
/// whose denied paths the tools that walk folders leave out. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    /// Canonical paths (links followed as far as they exist) that writes refuse, with everything
    /// below them.
    protected: std::sync::Arc<[PathBuf]>,
    /// The protected paths as a file system that ignores case and normalization compares them
    /// ([`fold_path`]).
    protected_folded: std::sync::Arc<[PathBuf]>,
    /// The rules whose `deny` and `ask` path rules `list_dir`, `glob` and `grep` apply to each
    /// entry they meet ([`Workspace::withhold`]).
    withheld: Option<std::sync::Arc<PermissionStore>>,
}

impl PartialEq for Workspace {
    fn eq(&self, other: &Self) -> bool {
        // A store has no equality of its own: the same rules are the same store.
        let same_rules = match (&self.withheld, &other.withheld) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        };
        self.root == other.root && self.protected == other.protected && same_rules
    }
}

impl Eq for Workspace {}

impl Workspace {
    /// Opens the folder `root` (which must exist), canonicalized once.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, WorkspaceError> {
        let given = root.as_ref();
        let error = |message: String| WorkspaceError {
            root: given.display().to_string(),
            message,
        };
        let root = std::fs::canonicalize(given).map_err(|e| error(e.to_string()))?;
        if !root.is_dir() {
            return Err(error("not a folder".to_owned()));
        }
        Ok(Workspace {
            root,
            protected: std::sync::Arc::from(Vec::new()),
            protected_folded: std::sync::Arc::from(Vec::new()),
            withheld: None,
        })
    }

    /// The same workspace, refusing writes to `paths` (files or folders, which need not exist
    /// yet, nor be inside the root): the agent's own files. Each is resolved as [`Self::resolve`]
    /// resolves, links followed as far as the path exists, so another spelling of the same file
    /// (through a link, with `./`) is refused too; and compared in any case and Unicode
    /// normalization ([`fold_path`]), so `AGENT.TOML` is refused beside `agent.toml`.
    pub fn protect(mut self, paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Self {
        let mut all: Vec<PathBuf> = self.protected.to_vec();
        all.extend(paths.into_iter().map(|p| follow_links(p.as_ref())));
        all.sort();
        all.dedup();
        let mut folded: Vec<PathBuf> = all.iter().map(|p| fold_path(p)).collect();
        folded.sort();
        folded.dedup();
        self.protected = std::sync::Arc::from(all);
        self.protected_folded = std::sync::Arc::from(folded);
        self
    }

    /// The same workspace, whose tools that walk folders (`list_dir`, `glob`, `grep`) leave out
    /// every entry a `deny` or `ask` path rule of `rules` matches for them, and whose file tools
    /// all refuse the path they are given when a `deny` rule matches it as they run
    /// ([`PathError::Denied`]: the gate judged the call before its batch ran, and another call
    /// of the batch may have made a link since), or an `ask` rule does and no person approved
    /// the call ([`PathError::Unapproved`]): a rule for the tool's
    /// name or `*`, on its `path` argument, matched as [`PermissionStore::decide`] matches a call
    /// whose `path` is the entry's path relative to the root (with the store's root and the
    /// resolver it has for the tool, so a link to a denied file is left out too). A walk cannot
    /// stop to ask about each file, so a file a rule would ask about is left out as a denied one
    /// is; a folder left out is not entered. The listing ends with a note of how many entries
    /// were left out, never their names. Without this, or with no such rule, nothing is left out.
    ///
    /// The store is taken as it is now: rules added to it later are not seen. A hard link to a
    /// denied file is another name of the same file, which no rule names: it is not left out
    /// (finding every name of a file would take a search of the whole file system).
    pub fn withhold(mut self, rules: &PermissionStore) -> Self {
        self.withheld = Some(std::sync::Arc::new(rules.clone()));
        self
    }

    /// The `deny` and `ask` path rules of the tool `tool` on its argument `field`, compiled: what
    /// its walks leave out ([`Self::withhold`]); `None` when none apply.
    pub fn withheld(&self, tool: &str, field: &str) -> Option<PathRules> {
        self.withheld
            .as_ref()
            .map(|store| store.path_rules(tool, field))
            .filter(|rules| !rules.is_empty())
    }

    /// The `deny` and `ask` command prefix rules of the tool `tool` on its argument `field`: what
    /// the shell judges its command by again as it runs ([`Self::withhold`]); `None` when none
    /// apply.
    pub fn withheld_commands(&self, tool: &str, field: &str) -> Option<CommandRules> {
        self.withheld
            .as_ref()
            .map(|store| store.command_rules(tool, field))
            .filter(|rules| !rules.is_empty())
    }

    /// The protected paths, canonical.
    pub fn protected(&self) -> &[PathBuf] {
        &self.protected
    }

    /// As [`Self::resolve`], for a path about to be written: also refused when it is, or lies
    /// below, a protected path ([`PathError::Protected`]), by its name in any case and Unicode
    /// normalization, or by what it is: the file, or a folder on its way, being a protected
    /// file or folder under another name.
    ///
    /// The name is compared folded because what a file is cannot be told on every file system
    /// that ignores case: a FUSE one (FAT, exFAT) may give `AGENT.TOML` an inode number of its
    /// own, and a protected file not made yet (a store) has none, while writing `JOURNAL.DB`
    /// there makes the file the store opens later. On a file system that tells them apart, a
    /// file named as a protected one but in another case is refused too: refusing more.
    pub fn resolve_for_write(&self, path: &str) -> Result<PathBuf, PathError> {
        let resolved = self.resolve(path)?;
        let folded = fold_path(&resolved);
        if self.protected.iter().any(|p| resolved.starts_with(p))
            || self.protected_folded.iter().any(|p| folded.starts_with(p))
            || self.is_protected_as(&resolved)
        {
            return Err(PathError::Protected {
                path: path.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// True when `resolved`, or a folder on its way down from the root, is a protected file or
    /// folder under another name: on a file system that ignores case (a Windows drive under
    /// WSL, FAT, SMB, a case-folding ext4 folder) `AGENT.TOML` is `agent.toml`, and
    /// `TOOLS/json.py` lies in `tools/`, though no name matches; a hard link is such another
    /// name too (whose replacing would be harmless, but is refused alike). Judged by the
    /// identity (device and inode) of what exists now.
    fn is_protected_as(&self, resolved: &Path) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let identity = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let protected: Vec<(u64, u64)> =
            self.protected.iter().filter_map(|p| identity(p)).collect();
        if protected.is_empty() {
            return false;
        }
        resolved
            .ancestors()
            .take_while(|a| a.starts_with(&self.root))
            .filter_map(identity)
            .any(|id| protected.contains(&id))
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path `path` (relative to the root; `""` and `"."` are the root) names inside the
    /// workspace, with every link resolved, or why it is refused. The file need not exist.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, PathError> {
        let given = || path.to_owned();
        // Before any lookup: the system would refuse it only when the file is opened, as an
        // error of the file system the model could not tell from a missing disk.
        if path.contains('\0') {
            return Err(PathError::Nul { path: given() });
        }
        let mut names: Vec<OsString> = Vec::new();
        for component in Path::new(path).components() {
            match component {
                Component::Prefix(_) | Component::RootDir => {
                    return Err(PathError::Absolute { path: given() });
                }
                Component::ParentDir => return Err(PathError::ParentDir { path: given() }),
                Component::CurDir => {}
                Component::Normal(name) => names.push(name.to_owned()),
            }
        }
        // The deepest existing ancestor, links and all; the rest are names still to be created.
        let mut existing = names.len();
        let mut candidate = self.root.join(names.iter().collect::<PathBuf>());
        while existing > 0 && std::fs::symlink_metadata(&candidate).is_err() {
            existing -= 1;
            candidate.pop();
        }
        let canonical = match std::fs::canonicalize(&candidate) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PathError::DanglingLink { path: given() });
            }
            Err(e) => {
                return Err(PathError::Io {
                    path: given(),
                    message: e.to_string(),
                });
            }
        };
        if !canonical.starts_with(&self.root) {
            return Err(PathError::Outside { path: given() });
        }
        let rest = names.get(existing..).unwrap_or_default();
        Ok(rest.iter().fold(canonical, |p, name| p.join(name)))
    }

    /// [`Self::display`] as a message echoes it: cut short when it is long ([`Echoed`]).
    pub(crate) fn shown(&self, resolved: &Path) -> String {
        Echoed(&self.display(resolved)).to_string()
    }

    /// A resolved path as the model should read it: relative to the root, `/`-separated, `.` for
    /// the root itself.
    pub fn display(&self, resolved: &Path) -> String {
        match resolved.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/"),
            Err(_) => resolved.display().to_string(),
        }
    }
}

/// `path` made absolute, with the links of its existing part followed one component at a time
/// (a `..` after a link leaves the link's target, as the operating system does), and the part
/// that does not exist appended as names: the file the system would open, whether it exists yet
/// or not. Used for the protected paths here and for the permission rules' paths.
pub fn follow_links(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    let mut exists = true;
    for component in absolute.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if exists {
                    match std::fs::canonicalize(&out) {
                        Ok(real) => out = real,
                        // Not there yet (or a dangling link): the rest is only names.
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    out
}

/// The files a command's first word may run in a process started in `folder`, every link
/// followed: a word with a `/` from `folder` (or as it is, when absolute); a bare name in each
/// folder of agentloop's `PATH` (which a process of the agent is given), and in `folder`
/// itself, as a command that puts `.` on its `PATH` would find it. Unlike a path argument, a
/// program is followed out of the root: where it leads is what runs. A copy of a program is
/// another file under another name, which no look-up can tell (the sandbox is the boundary).
pub fn program_files(folder: &Path, word: &str) -> Vec<PathBuf> {
    let found = |candidate: PathBuf| {
        std::fs::canonicalize(candidate)
            .ok()
            .filter(|file| file.is_file())
    };
    if word.contains('/') {
        return found(folder.join(word)).into_iter().collect();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(PathBuf::new()))
        .filter_map(|dir| found(folder.join(dir).join(word)))
        .collect()
}

/// This process's home folder (`HOME`), read once: where the commands a tool starts find git's
/// global configuration, since their environment is picked from this process's
/// ([`ResolvePaths::home`]). `None` when unset or empty.
///
/// [`ResolvePaths::home`]: agentloop::permissions::ResolvePaths::home
pub fn process_home() -> Option<&'static Path> {
    static HOME: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    HOME.get_or_init(|| folder_from_env("HOME")).as_deref()
}

/// This process's `XDG_CONFIG_HOME`, read once ([`ResolvePaths::config_home`]): read by the
/// rules even when a tool does not pass it on, as more reading only matches more.
///
/// [`ResolvePaths::config_home`]: agentloop::permissions::ResolvePaths::config_home
pub fn process_config_home() -> Option<&'static Path> {
    static CONFIG: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| folder_from_env("XDG_CONFIG_HOME"))
        .as_deref()
}

/// The folder the variable `name` holds, when it holds one.
fn folder_from_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// The text of `file` as a deny or ask command prefix reads it ([`ResolvePaths::read_text`]):
/// at most [`READ_LIMIT`] bytes of UTF-8; a longer file, a folder, a file not text or one that
/// cannot be opened is [`FileText::Unreadable`], so that the rule judges it as one whose
/// commands cannot be seen.
///
/// [`ResolvePaths::read_text`]: agentloop::permissions::ResolvePaths::read_text
pub fn read_text_bounded(file: &Path) -> FileText {
    use std::io::Read;
    // A FIFO (or a device) would hold the gate until something writes to it: only a regular
    // file is read, and it is opened without waiting, should it be swapped for a FIFO between.
    match std::fs::metadata(file) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return FileText::Unreadable,
        Err(e) => return not_read(&e),
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let opened = match options.open(file) {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => f,
        Ok(_) => return FileText::Unreadable,
        Err(e) => return not_read(&e),
    };
    let mut bytes = Vec::new();
    // One byte past the limit tells a file of exactly the limit from a longer one.
    let limit = u64::try_from(READ_LIMIT)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    match opened.take(limit).read_to_end(&mut bytes) {
        Ok(n) if n <= READ_LIMIT => String::from_utf8(bytes)
            .map(FileText::Text)
            .unwrap_or(FileText::Unreadable),
        _ => FileText::Unreadable,
    }
}

/// What a file that could not be opened is to [`read_text_bounded`]: missing when nothing is
/// there, else unreadable.
fn not_read(e: &std::io::Error) -> FileText {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => FileText::Missing,
        _ => FileText::Unreadable,
    }
}

// outside-paths: off (the tests below try hostile paths on purpose)
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    /// A workspace `root/` beside an `outside/` folder holding `secret.txt`.
    fn setup() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root/src")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("outside/secret.txt"), "secret").unwrap();
        std::fs::write(dir.path().join("root/src/main.rs"), "fn main() {}").unwrap();
        let ws = Workspace::new(dir.path().join("root")).unwrap();
        (dir, ws)
    }

    #[test]
    fn protected_files_resolve_but_refuse_writes_under_any_spelling() {
        let (dir, ws) = setup();
        let root = dir.path().join("root");
        std::fs::write(root.join("agent.toml"), "name = 'x'").unwrap();
        std::fs::create_dir_all(root.join("tools")).unwrap();
        symlink(root.join("agent.toml"), root.join("alias.toml")).unwrap();
        let ws = ws.protect([
            root.join("agent.toml"),
            root.join("tools"),
            root.join("journal.db"),
        ]);
        for path in [
            "agent.toml",
            "./agent.toml",
            "alias.toml",
            "tools/x.py",
            "journal.db",
        ] {
            assert!(ws.resolve(path).is_ok(), "{path} resolves for reading");
            let e = ws.resolve_for_write(path).unwrap_err();
            assert_eq!(e.code(), "workspace.protected", "{path}");
        }
        assert!(ws.resolve_for_write("src/main.rs").is_ok());
        assert!(ws.resolve_for_write("agent.toml.bak").is_ok());
        assert!(ws.resolve_for_write("journal.db2").is_ok());
    }

    #[test]
    fn a_protected_file_or_folder_under_another_name_is_refused_for_writing() {
        // Another name of the same file: what a file system that ignores case makes of
        // `AGENT.TOML` (none can be made here without privileges, so a hard link stands for
        // it: the refusal is by what the file is, not by its name; a folder such as `TOOLS/`
        // is judged the same way, as each folder on the way is).
        let (dir, ws) = setup();
        let root = dir.path().join("root");
        std::fs::write(root.join("agent.toml"), "name = 'x'").unwrap();
        std::fs::create_dir_all(root.join("tools")).unwrap();
        std::fs::hard_link(root.join("agent.toml"), root.join("AGENT.TOML")).unwrap();
        let ws = ws.protect([root.join("agent.toml"), root.join("tools")]);
        let e = ws.resolve_for_write("AGENT.TOML").unwrap_err();
        assert_eq!(e.code(), "workspace.protected");
        assert!(ws.resolve_for_write("notes.txt").is_ok());
        assert!(ws.resolve_for_write("src/new.rs").is_ok());
    }

    #[test]
    fn case_and_normalization_variants_of_protected_paths_are_refused_for_writing() {
        // What a file system that ignores case and normalization (macOS's, Windows', FAT)
        // makes of these names is the protected file; the store `journal.db` does not exist
        // yet, so no identity can tell, and `Été.md` is written decomposed, as macOS does.
        let (dir, ws) = setup();
        let root = dir.path().join("root");
        std::fs::write(root.join("agent.toml"), "name = 'x'").unwrap();
        std::fs::create_dir_all(root.join("tools")).unwrap();
        std::fs::write(root.join("Été.md"), "notes").unwrap();
        let ws = ws.protect([
            root.join("agent.toml"),
            root.join("tools"),
            root.join("journal.db"),
            root.join("Été.md"),
        ]);
        for path in [
            "AGENT.TOML",
            "./Agent.Toml",
            "TOOLS/json.py",
            "Tools/json/__init__.py",
            "JOURNAL.DB",
            "Journal.db",
            "ÉTÉ.MD",
            "E\u{301}te\u{301}.md",
        ] {
            assert!(ws.resolve(path).is_ok(), "{path} resolves for reading");
            let e = ws.resolve_for_write(path).unwrap_err();
            assert_eq!(e.code(), "workspace.protected", "{path}");
        }
        assert!(ws.resolve_for_write("agent.toml.bak").is_ok());
        assert!(ws.resolve_for_write("TOOLS2/x.py").is_ok());
        assert!(ws.resolve_for_write("src/Agent.rs").is_ok());
    }

    #[test]
    fn paths_inside_resolve_whether_or_not_they_exist() {
        let (_d, ws) = setup();
        assert_eq!(ws.resolve("").unwrap(), ws.root());
        assert_eq!(ws.resolve(".").unwrap(), ws.root());
        assert_eq!(
            ws.resolve("./src//main.rs").unwrap(),
            ws.root().join("src/main.rs")
        );
        assert_eq!(
            ws.resolve("new/deeper/file.txt").unwrap(),
            ws.root().join("new/deeper/file.txt")
        );
        assert_eq!(
            ws.display(&ws.resolve("src/main.rs").unwrap()),
            "src/main.rs"
        );
        assert_eq!(ws.display(ws.root()), ".");
    }

    #[test]
    fn a_long_path_is_echoed_by_its_first_characters_and_its_length() {
        let short = "é".repeat(MAX_ECHOED_CHARS);
        assert_eq!(Echoed(&short).to_string(), short);
        assert_eq!(Echoed(&short).quoted(), format!("{short:?}"));
        let long = format!("{short}x\0y");
        let head = &short;
        assert_eq!(
            Echoed(&long).to_string(),
            format!("{head}… (203 characters)")
        );
        assert_eq!(
            Echoed(&long).quoted(),
            format!("\"{head}…\" (203 characters)")
        );
        let (_d, ws) = setup();
        let climbing = format!("{}/../x", "a".repeat(100_000));
        let message = ws.resolve(&climbing).unwrap_err().to_string();
        assert!(message.len() < 400, "{message}");
        assert!(
            message.starts_with(&format!(
                "\"{}…\" (100005 characters) contains `..`",
                &climbing[..200]
            )),
            "{message}"
        );
    }

    #[test]
    fn a_nul_byte_is_refused_as_written_with_its_own_code() {
        let (_d, ws) = setup();
        for path in ["src/main.rs\0", "\0", "src\0/main.rs", "new\0file.txt"] {
            let e = ws.resolve(path).unwrap_err();
            assert_eq!(e.code(), "path_nul", "{path:?}");
            assert!(e.to_string().contains("NUL byte"), "{e}");
        }
    }

    #[test]
    fn absolute_paths_and_parent_components_are_refused_before_any_lookup() {
        let (d, ws) = setup();
        let secret = d.path().join("outside/secret.txt");
        for (path, code) in [
            (secret.to_str().unwrap(), "path_absolute"),
            ("/etc/passwd", "path_absolute"),
            ("../outside/secret.txt", "path_parent_dir"),
            ("src/../../outside/secret.txt", "path_parent_dir"),
            // Even a `..` that would stay inside: lexical refusal is simpler to trust.
            ("src/../src/main.rs", "path_parent_dir"),
        ] {
            assert_eq!(ws.resolve(path).unwrap_err().code(), code, "{path}");
        }
    }

    #[test]
    fn links_out_of_the_root_are_refused_for_files_folders_and_files_to_be() {
        let (d, ws) = setup();
        let outside = d.path().join("outside");
        symlink(outside.join("secret.txt"), ws.root().join("file_link")).unwrap();
        symlink(&outside, ws.root().join("dir_link")).unwrap();
        symlink(outside.join("missing"), ws.root().join("dangling")).unwrap();
        for path in [
            "file_link",
            "dir_link",
            "dir_link/secret.txt",
            // Not yet existing, under a linked folder: a write would land outside.
            "dir_link/new.txt",
            "dir_link/new/deeper.txt",
        ] {
            assert_eq!(
                ws.resolve(path).unwrap_err().code(),
                "path_outside_root",
                "{path}"
            );
        }
        // A dangling link out could be followed by a write; where it leads is unknown: refused.
        assert_eq!(
            ws.resolve("dangling").unwrap_err().code(),
            "path_dangling_link"
        );
        assert_eq!(
            ws.resolve("dangling/x").unwrap_err().code(),
            "path_dangling_link"
        );
    }

    #[test]
    fn links_that_stay_inside_are_followed() {
        let (_d, ws) = setup();
        symlink(ws.root().join("src"), ws.root().join("code")).unwrap();
        symlink("src/main.rs", ws.root().join("main_link")).unwrap();
        assert_eq!(
            ws.resolve("code/main.rs").unwrap(),
            ws.root().join("src/main.rs")
        );
        assert_eq!(
            ws.resolve("main_link").unwrap(),
            ws.root().join("src/main.rs")
        );
        assert_eq!(
            ws.resolve("code/new.rs").unwrap(),
            ws.root().join("src/new.rs")
        );
    }

    #[test]
    fn a_root_given_through_a_link_is_canonicalized_once() {
        let (d, ws) = setup();
        symlink(ws.root(), d.path().join("alias")).unwrap();
        let via_alias = Workspace::new(d.path().join("alias")).unwrap();
        assert_eq!(via_alias.root(), ws.root());
        assert_eq!(
            via_alias.resolve("src/main.rs").unwrap(),
            ws.root().join("src/main.rs")
        );
    }

    #[test]
    fn a_missing_root_is_an_error() {
        let e = Workspace::new("/definitely/not/here").unwrap_err();
        assert_eq!(e.code(), "workspace.root");
    }
}
