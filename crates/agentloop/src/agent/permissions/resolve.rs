//! The seam through which a tool tells the permission rules what its arguments touch.

use std::path::{Path, PathBuf};

/// The most of a file a deny or ask rule reads to see what it has a program run (a script a
/// shell is given, a git configuration): a longer one is judged as one that cannot be read.
pub const READ_LIMIT: usize = 64 * 1024;

/// What [`ResolvePaths::read_text`] found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileText {
    /// Nothing is there (or a folder on the way is not one).
    Missing,
    /// The file's text, at most [`READ_LIMIT`] bytes.
    Text(String),
    /// Something is there that could not be read as text within [`READ_LIMIT`] bytes (a
    /// folder, a longer file, one not UTF-8, one the process may not read).
    Unreadable,
    /// This resolver reads no files (the default).
    NotRead,
}

/// How a tool turns a path argument into the file it touches, so that a path rule judges that
/// file: the CLI's built-in file tools resolve against their own root and follow links, and a
/// command runs in the agent file's folder. A link inside the root that points elsewhere then
/// cannot walk around a deny glob. The core does no file I/O; an application gives this.
pub trait ResolvePaths: Send + Sync + std::fmt::Debug {
    /// The folder the tool resolves relative paths against (absolute, canonical).
    fn root(&self) -> &Path;
    /// The file a path argument names for this tool: absolute, with every link that exists
    /// followed; `None` when the tool would refuse the path.
    fn resolve(&self, path: &str) -> Option<PathBuf>;

    /// The files a command's first word may run for this tool, every link followed: a word
    /// with a `/` resolved against [`root`](Self::root), a bare name looked up on the tool's
    /// `PATH` (and in the root, as a `PATH=.:…` in the command would). A deny or ask command
    /// prefix also matches a word whose file is named like its program (`./tidy`, a link to
    /// `/bin/rm`, under a deny on `rm`). None by default.
    fn programs(&self, word: &str) -> Vec<PathBuf> {
        let _ = word;
        Vec::new()
    }

    /// The text of the file a path (relative to [`root`](Self::root), or absolute) names, as
    /// the command would open it: what a deny or ask command prefix reads of a script a shell
    /// is given (`sh x.sh`, `. ./env`, `BASH_ENV=x`) and of a repository's git configuration
    /// and hooks. [`FileText::NotRead`] by default: a script is then judged as one that cannot
    /// be read (it matches every deny and ask rule), and no git configuration is read.
    fn read_text(&self, path: &str) -> FileText {
        let _ = path;
        FileText::NotRead
    }

    // outside-paths: off (git's global configuration is in the home folder: this names it)
    /// The home folder the tool's processes see (their `HOME`): where git finds its global
    /// configuration (`~/.gitconfig`, `~/.config/git/config`), which a deny or ask rule reads
    /// as it reads a repository's. `None` by default: no global configuration is read (the
    /// system's, `/etc/gitconfig`, still is).
    fn home(&self) -> Option<&Path> {
        // outside-paths: on
        None
    }

    /// The tool's processes' `XDG_CONFIG_HOME`, when they have one: git then reads
    /// `git/config` in it too. `None` by default.
    fn config_home(&self) -> Option<&Path> {
        None
    }
}
