#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A protected process's environment and memory are out of its children's reach in every mode,
//! `off` included; the child's own stay readable. A test binary of its own: it changes the whole
//! process (its user, its dumpable flag).
//!
//! Run as root (as CI does), a child whose capabilities were dropped cannot read its root
//! parent anyway (the kernel refuses access to a process holding capabilities its reader lacks),
//! so the test first becomes `nobody`: there, parent and child hold the same (no) capabilities,
//! and only the parent's non-dumpable flag stands between them, which the control shows.
#![cfg(target_os = "linux")]

use std::process::Command;

use agentloop_sandbox::{Sandbox, SandboxMode, SandboxPolicy, Support, protect_process};

/// Becomes `nobody` when root, then dumpable again (a change of user clears the flag): the
/// unprotected state of an ordinary user's process.
#[allow(unsafe_code)]
fn become_an_ordinary_user() {
    // SAFETY: plain system calls with integer arguments (and a null list for setgroups), made
    // before this test starts any thread of its own.
    unsafe {
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setresgid(65534, 65534, 65534), 0);
            assert_eq!(libc::setresuid(65534, 65534, 65534), 0);
        }
        assert_eq!(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
    }
}

/// What a child confined by `mode` reads of its parent, this process.
fn probe(mode: SandboxMode) -> String {
    let parent = std::process::id();
    let script = format!(
        "tr '\\0' '\\n' < /proc/{parent}/environ | grep -c '^PATH=' || echo environ-refused; \
         head -c 1 /proc/{parent}/mem > /dev/null || echo mem-refused; \
         tr '\\0' '\\n' < /proc/$$/environ | grep -c CHILD_MARK"
    );
    let root = std::env::temp_dir();
    let mut confinement = Sandbox::new(SandboxPolicy::new(mode))
        .writable(root)
        .prepare()
        .unwrap();
    let mut command = Command::new("sh");
    command.arg("-c").arg(&script).env("CHILD_MARK", "1");
    confinement.install(&mut command);
    let out = command.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn children_cannot_read_the_protected_parent() {
    become_an_ordinary_user();
    // The control: an unprotected parent's environment is read by its unsandboxed child.
    let said = probe(SandboxMode::Off);
    assert!(said.starts_with("1\n"), "the control read nothing: {said}");

    protect_process().unwrap();
    let mut modes = vec![SandboxMode::Off];
    if Support::missing(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).is_empty() {
        modes.push(SandboxMode::WorkspaceWrite);
    }
    for mode in modes {
        let said = probe(mode);
        assert!(said.contains("environ-refused"), "{mode}: {said}");
        assert!(said.contains("mem-refused"), "{mode}: {said}");
        // The child's own environment stays readable.
        assert!(said.contains("\n1\n"), "{mode}: {said}");
    }
}
