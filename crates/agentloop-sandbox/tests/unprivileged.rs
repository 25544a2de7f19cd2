#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Without `CAP_SYS_ADMIN` (an ordinary user), a confined process's read-only view of the file
//! system comes from a user namespace: files outside the roots keep their mode, times and
//! extended attributes, and a set-user-ID bit cannot be set, while the process works inside its
//! root as before, its files the user's. A test binary of its own: it changes the whole process
//! (its user, its dumpable flag). Run as root (as here and on CI), it first becomes an ordinary
//! user with no capability, then protects itself as the agentloop process does (non-dumpable:
//! the case where the child cannot write its own uid map).
#![cfg(target_os = "linux")]

mod metadata;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use agentloop_sandbox::{
    ReadOnlyMounts, Sandbox, SandboxMode, SandboxPolicy, Support, protect_process,
};

/// The ordinary user this test becomes when run as root (no account needed).
const USER: u32 = 4242;

#[allow(unsafe_code)]
fn become_an_ordinary_user() {
    // SAFETY: plain system calls with integer arguments (and a null list for setgroups), made
    // before this test starts any thread of its own.
    unsafe {
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setresgid(USER, USER, USER), 0);
            assert_eq!(libc::setresuid(USER, USER, USER), 0);
        }
    }
}

/// Whether this kernel lets an ordinary user make a user namespace and have its capabilities
/// there: Debian's switch, the namespaces' count, AppArmor's restriction (Ubuntu).
fn user_namespaces_allowed() -> bool {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    read("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|v| v != "0")
        && read("/proc/sys/user/max_user_namespaces").is_some_and(|v| v != "0")
        && read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").is_none_or(|v| v != "1")
}

#[test]
fn as_an_ordinary_user_files_outside_the_roots_keep_their_metadata() {
    become_an_ordinary_user();
    protect_process().unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    if !Support::missing(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).is_empty() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let sandbox =
        Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).writable(root.path());
    let mut confinement = sandbox.prepare().unwrap().dying_with_parent();
    match Support::current().read_only_mounts {
        Some(how) => {
            assert_eq!(how, ReadOnlyMounts::UserNamespace);
            assert_eq!(confinement.note(), None);
        }
        None => {
            assert!(
                !user_namespaces_allowed(),
                "user namespaces are there, unused"
            );
            // The strict mode runs without the view, and says so.
            let note = confinement.note().unwrap_or_default();
            assert!(
                note.starts_with(
                    "sandbox workspace-write: not enforced on this system: read-only mounts"
                ),
                "{note}"
            );
            return;
        }
    }
    let files = metadata::Outside::new(outside.path());
    // As a tool call runs: in a group of its own, under the supervisor.
    let script = format!(
        "{}; echo mine > mine.txt; grep CapEff /proc/self/status; id -u",
        metadata::script(&files, None)
    );
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(&script)
        .current_dir(root.path())
        .process_group(0);
    confinement.install(&mut command);
    let out = command.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    metadata::assert_refused_outside_and_done_inside(&said, &files, root.path());
    // Whatever it holds in its namespace, its program has no capability.
    assert!(said.contains("CapEff:\t0000000000000000\n"), "{said}");
    // Unmapped in its namespace, the process sees itself as the overflow user, but what it
    // makes is the user's.
    assert!(
        String::from_utf8_lossy(&out.stdout).ends_with("65534\n"),
        "{said}"
    );
    // SAFETY: geteuid takes nothing.
    #[allow(unsafe_code)]
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        std::fs::metadata(root.path().join("mine.txt"))
            .unwrap()
            .uid(),
        me
    );
}
