//! The seam through which a tool tells the permission rules what its arguments touch.

use std::path::{Path, PathBuf};

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
}
