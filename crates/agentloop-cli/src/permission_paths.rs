//! How path rules learn which file a call touches: the way the tool itself resolves its path
//! argument. A built-in file tool or the shell resolves inside its own `root` through
//! [`Workspace::resolve`] (links followed, escapes refused); any other tool (a command tool, an
//! agent, an MCP tool) runs in the agent file's folder, where a path is what the operating
//! system would open: the part that exists canonicalized (links followed), the rest appended
//! as written. So a link inside the workspace cannot walk around a `deny` glob.

use std::path::{Path, PathBuf};

use agentloop::permissions::ResolvePaths;
use agentloop_tools::workspace::{Workspace, follow_links};

/// Paths as a built-in tool resolves them: inside its workspace; a path it refuses is `None`.
#[derive(Debug)]
pub struct WorkspacePaths(pub Workspace);

impl ResolvePaths for WorkspacePaths {
    fn root(&self) -> &Path {
        self.0.root()
    }

    fn resolve(&self, path: &str) -> Option<PathBuf> {
        self.0.resolve(path).ok()
    }
}

/// Paths as a process started in `root` opens them.
#[derive(Debug)]
pub struct FolderPaths {
    root: PathBuf,
}

impl FolderPaths {
    /// Paths relative to `root` (canonicalized when it exists).
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root)
            .or_else(|_| std::path::absolute(root))
            .unwrap_or_else(|_| root.to_path_buf());
        FolderPaths { root }
    }
}

impl ResolvePaths for FolderPaths {
    fn root(&self) -> &Path {
        &self.root
    }

    fn resolve(&self, path: &str) -> Option<PathBuf> {
        Some(follow_links(&self.root.join(path)))
    }
}

// outside-paths: off (the tests below follow links out of a folder on purpose)
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn links_are_followed_and_what_does_not_exist_is_appended() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(base.join("work/secrets")).unwrap();
        std::fs::create_dir_all(base.join("elsewhere/deep")).unwrap();
        symlink(base.join("work/secrets"), base.join("work/link")).unwrap();
        symlink(base.join("elsewhere/deep"), base.join("work/out")).unwrap();
        let paths = FolderPaths::new(&base.join("work"));
        assert_eq!(paths.root(), base.join("work"));
        assert_eq!(
            paths.resolve("link/key.pem").unwrap(),
            base.join("work/secrets/key.pem")
        );
        assert_eq!(
            paths.resolve("out/../x").unwrap(),
            base.join("elsewhere/x"),
            "`..` leaves the link's target"
        );
        assert_eq!(
            paths.resolve("new/./a/../b").unwrap(),
            base.join("work/new/b")
        );
        assert_eq!(
            paths
                .resolve(base.join("work/link").to_str().unwrap())
                .unwrap(),
            base.join("work/secrets"),
            "an absolute path is resolved as it is"
        );
        let ws = WorkspacePaths(Workspace::new(base.join("work")).unwrap());
        assert_eq!(
            ws.resolve("link/key.pem").unwrap(),
            base.join("work/secrets/key.pem")
        );
        assert_eq!(ws.resolve("out/x"), None, "the tool refuses a link out");
        assert_eq!(ws.resolve("../x"), None);
    }
}
