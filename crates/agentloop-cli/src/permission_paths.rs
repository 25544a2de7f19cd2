//! How path rules learn which file a call touches: the way the tool itself resolves its path
//! argument. A built-in file tool or the shell resolves inside its own `root` through
//! [`Workspace::resolve`] (links followed, escapes refused); any other tool (a command tool, an
//! agent, an MCP tool) runs in the agent file's folder, where a path is what the operating
//! system would open: the part that exists canonicalized (links followed), the rest appended
//! as written. So a link inside the workspace cannot walk around a `deny` glob. Likewise a
//! command's first word is looked up as the shell would run it (against the root, or on
//! `PATH`), so that a link `./tidy` to `/bin/rm` is judged as `rm` by a `deny` or `ask` prefix.
//! The home folder a tool's commands see is this process's (their environment is picked from
//! it), so git's global configuration is read there.

use std::path::{Path, PathBuf};

use agentloop::permissions::{FileText, ResolvePaths};
use agentloop_tools::workspace::{
    Workspace, follow_links, process_config_home, process_home, program_files, read_text_bounded,
};

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

    fn programs(&self, word: &str) -> Vec<PathBuf> {
        program_files(self.0.root(), word)
    }

    fn read_text(&self, path: &str) -> FileText {
        // The shell reads a script wherever it is, so a path the file tools refuse (out of the
        // root) is read as the process would open it.
        read_text_bounded(&self.0.root().join(path))
    }

    fn home(&self) -> Option<&Path> {
        process_home()
    }

    fn config_home(&self) -> Option<&Path> {
        process_config_home()
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

    fn programs(&self, word: &str) -> Vec<PathBuf> {
        program_files(&self.root, word)
    }

    fn read_text(&self, path: &str) -> FileText {
        read_text_bounded(&self.root.join(path))
    }

    fn home(&self) -> Option<&Path> {
        process_home()
    }

    fn config_home(&self) -> Option<&Path> {
        process_config_home()
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

    #[test]
    fn a_program_word_is_followed_to_the_file_it_runs_wherever_that_is() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(base.join("work/bin")).unwrap();
        std::fs::create_dir_all(base.join("elsewhere")).unwrap();
        std::fs::write(base.join("elsewhere/rm"), "").unwrap();
        symlink(base.join("elsewhere/rm"), base.join("work/tidy")).unwrap();
        symlink("../tidy", base.join("work/bin/sweep")).unwrap();
        let rm = vec![base.join("elsewhere/rm")];
        for paths in [
            Box::new(FolderPaths::new(&base.join("work"))) as Box<dyn ResolvePaths>,
            Box::new(WorkspacePaths(Workspace::new(base.join("work")).unwrap())),
        ] {
            assert_eq!(
                paths.programs("./tidy"),
                rm,
                "out of the root: it is what runs"
            );
            assert_eq!(paths.programs("bin/sweep"), rm, "a link to a link");
            assert_eq!(paths.programs("tidy"), rm, "a bare name found in the root");
            assert_eq!(paths.programs(base.join("work/tidy").to_str().unwrap()), rm);
            assert!(paths.programs("./missing").is_empty());
            assert!(paths.programs("bin").is_empty(), "a folder runs nothing");
        }
    }
}
