//! Files outside a sandbox's roots whose metadata a confined process tries to change, the shell
//! script that tries (with controls inside the root), and what must hold after: every attempt
//! refused with `EROFS`, nothing changed. Shared by `confine.rs` (as root) and `unprivileged.rs`
//! (as an ordinary user), and by the CLI's `sandbox.rs` (through the `agentloop` command).
// Each test binary that includes it uses a part.
#![allow(dead_code)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A plain file and a copy of a shell, outside the roots, owned by whoever runs the test (who
/// could change them all, unconfined).
pub(crate) struct Outside {
    pub file: PathBuf,
    pub shell: PathBuf,
    before: Vec<Snapshot>,
}

/// What a change of metadata changes: the status change time moves with any of them.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
    xattr: bool,
}

fn snapshot(path: &Path) -> Snapshot {
    let m = std::fs::metadata(path).unwrap();
    // By python, as the script sets it: no crate for extended attributes is needed.
    let xattr = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys; os.getxattr(sys.argv[1], 'user.agentloop')",
        ])
        .arg(path)
        .output()
        .unwrap()
        .status
        .success();
    Snapshot {
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        xattr,
    }
}

impl Outside {
    pub(crate) fn new(dir: &Path) -> Self {
        let file = dir.join("precious.txt");
        std::fs::write(&file, "precious\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let shell = dir.join("sh-copy");
        std::fs::copy("/bin/sh", &shell).unwrap();
        std::fs::set_permissions(&shell, std::fs::Permissions::from_mode(0o755)).unwrap();
        let before = vec![snapshot(&file), snapshot(&shell)];
        Outside {
            file,
            shell,
            before,
        }
    }

    /// Gives the folder and both files to `uid` (an ordinary user the test runs agentloop as),
    /// who could then change them all, unconfined.
    pub(crate) fn owned_by(mut self, uid: u32) -> Self {
        for path in [self.file.parent().unwrap(), &self.file, &self.shell] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
        self.before = vec![snapshot(&self.file), snapshot(&self.shell)];
        self
    }

    /// Nothing about either file changed.
    pub(crate) fn assert_unchanged(&self) {
        let after = vec![snapshot(&self.file), snapshot(&self.shell)];
        assert_eq!(after, self.before, "a file outside the roots changed");
    }
}

/// The attempts, each followed by `echo NAME $?`, then the controls inside the working folder (a
/// writable root). `chown_to`: a user to give the file to (root only; an ordinary user may
/// give a file away to nobody); `chown :` (a change to nothing, which an owner may make) is tried
/// whoever runs it.
pub(crate) fn script(files: &Outside, chown_to: Option<u32>) -> String {
    let file = files.file.display();
    let shell = files.shell.display();
    let chown = chown_to.map_or(String::new(), |uid| {
        format!("chown {uid} '{file}'; echo chown $?; ")
    });
    format!(
        "chmod 666 '{file}'; echo chmod $?; {chown}chown : '{file}'; echo chown-same $?; \
         touch '{file}'; echo touch $?; chmod 700 '{shell}'; echo chmod-program $?; \
         python3 -c 'import os, sys; os.setxattr(sys.argv[1], \"user.agentloop\", b\"1\")' \
         '{file}'; echo xattr $?; \
         echo in > made && chmod +x made && test -x made && mv made moved && touch moved && \
         rm moved && mkdir d && rmdir d && echo inside-ok; \
         echo x > /dev/null && echo devnull-ok"
    )
}

/// Every attempt failed, with `EROFS`; the files are as they were; the controls worked.
pub(crate) fn assert_refused_outside_and_done_inside(said: &str, files: &Outside, root: &Path) {
    // (A set-user-ID bit is refused everywhere, by seccomp: `confine.rs`.)
    let mut names = vec!["chmod", "chown-same", "touch", "chmod-program", "xattr"];
    if said.contains("\nchown ") || said.starts_with("chown ") {
        names.push("chown");
    }
    for name in names {
        assert!(!said.contains(&format!("{name} 0\n")), "{name}: {said}");
        assert!(said.contains(&format!("{name} 1\n")), "{name}: {said}");
    }
    assert_eq!(
        said.matches("Read-only file system").count(),
        said.matches(" 1\n").count(),
        "every refusal is EROFS: {said}"
    );
    assert!(said.contains("inside-ok"), "{said}");
    assert!(said.contains("devnull-ok"), "{said}");
    assert!(!root.join("made").exists() && !root.join("moved").exists());
    files.assert_unchanged();
}
