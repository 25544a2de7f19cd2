#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A child that dies with its parent (`Confinement::dying_with_parent`) runs under a supervisor:
//! what the caller sees is still the program's end (its exit code, its signal, an `exec` error),
//! what the program left in its group dies with it, the supervisor keeps the parent's memory
//! (which it holds, a copy that never ran another program) from the program, and the call does
//! not die when the thread that started it ends. In each mode this system can enforce. That it
//! all dies with a killed agentloop is checked through the command (the CLI's `durable.rs`).
#![cfg(target_os = "linux")]

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agentloop_sandbox::{Sandbox, SandboxMode, SandboxPolicy, Support};

fn modes() -> Vec<SandboxMode> {
    let mut modes = vec![SandboxMode::Off];
    if Support::missing(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).is_empty() {
        modes.push(SandboxMode::WorkspaceWrite);
    }
    modes
}

/// `program args...` in `dir`, in a group of its own, dying with this process.
fn command(mode: SandboxMode, dir: &Path, program: &str, args: &[&str]) -> Output {
    let mut confinement = Sandbox::new(SandboxPolicy::new(mode))
        .writable(dir)
        .prepare()
        .unwrap()
        .dying_with_parent();
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("CHILD_MARK", "1")
        .process_group(0);
    confinement.install(&mut command);
    match command.output() {
        Ok(out) => out,
        Err(e) => panic!("{mode}: {program}: {e}"),
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// True once no live process (a zombie is dead) has this id, within two seconds.
fn gone(pid: &str) -> bool {
    (0..100).any(|_| {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let dead = state
            .rfind(')')
            .is_none_or(|at| state[at + 1..].trim_start().starts_with('Z'));
        if !dead {
            std::thread::sleep(Duration::from_millis(20));
        }
        dead
    })
}

#[test]
fn the_program_s_exit_code_signal_and_exec_error_come_through() {
    let dir = tempfile::tempdir().unwrap();
    for mode in modes() {
        let out = command(
            mode,
            dir.path(),
            "sh",
            &["-c", "echo out; echo err >&2; exit 7"],
        );
        assert_eq!(out.status.code(), Some(7), "{mode}: {}", text(&out));
        assert_eq!(out.stdout, b"out\n", "{mode}");
        assert_eq!(out.stderr, b"err\n", "{mode}");
        for signal in [libc::SIGTERM, libc::SIGKILL, libc::SIGUSR1, libc::SIGSEGV] {
            let out = command(
                mode,
                dir.path(),
                "sh",
                &["-c", &format!("kill -{signal} $$")],
            );
            assert_eq!(out.status.signal(), Some(signal), "{mode}: {}", text(&out));
        }
        let mut confinement = Sandbox::new(SandboxPolicy::new(mode))
            .writable(dir.path())
            .prepare()
            .unwrap()
            .dying_with_parent();
        let mut missing = Command::new(dir.path().join("no-such-program"));
        missing.process_group(0);
        confinement.install(&mut missing);
        let err = missing.spawn().map(|_| ()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{mode}: {err}");
    }
}

#[test]
fn what_the_program_left_in_its_group_dies_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    for mode in modes() {
        // The background child keeps no pipe of the call's: nothing waits for it but the kill.
        let out = command(
            mode,
            dir.path(),
            "sh",
            &[
                "-c",
                "sleep 30 < /dev/null > /dev/null 2>&1 & echo $! > left.pid; exit 3",
            ],
        );
        assert_eq!(out.status.code(), Some(3), "{mode}: {}", text(&out));
        let left = std::fs::read_to_string(dir.path().join("left.pid")).unwrap();
        let left = left.trim();
        let dead = gone(left);
        if !dead {
            let _ = Command::new("kill").args(["-9", left]).status();
        }
        assert!(
            dead,
            "{mode}: the background child {left} outlived the program"
        );
    }
}

#[test]
fn the_supervisor_keeps_the_parent_s_memory_from_the_program() {
    // This process never calls `protect_process`: the supervisor, a copy of it, protects itself.
    let dir = tempfile::tempdir().unwrap();
    let probe = "cat /proc/$PPID/environ > /dev/null 2>&1 && echo environ-read || echo environ-refused; \
                 head -c 1 /proc/$PPID/mem > /dev/null 2>&1 && echo mem-read || echo mem-refused; \
                 tr '\\0' '\\n' < /proc/$$/environ | grep -c CHILD_MARK";
    for mode in modes() {
        let said = text(&command(mode, dir.path(), "sh", &["-c", probe]));
        assert!(said.contains("environ-refused"), "{mode}: {said}");
        assert!(said.contains("mem-refused"), "{mode}: {said}");
        // The program's own environment stays readable.
        assert!(said.ends_with("\n1\n"), "{mode}: {said}");
    }
}

#[test]
fn the_program_cannot_stop_its_supervisor_where_signals_are_scoped() {
    let dir = tempfile::tempdir().unwrap();
    // A stopped supervisor is resumed at once, so that no run of this test hangs on one.
    let probe = "if kill -STOP $PPID 2>/dev/null; then kill -CONT $PPID; echo stopped; \
                 else echo refused; fi; \
                 sleep 5 & kill $! && echo child-signalled";
    // The control: unconfined, the program stops its supervisor.
    let said = text(&command(SandboxMode::Off, dir.path(), "sh", &["-c", probe]));
    assert_eq!(said, "stopped\nchild-signalled\n");
    if !Support::missing(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).is_empty() {
        eprintln!("workspace-write cannot be enforced here: only the control ran");
        return;
    }
    let said = text(&command(
        SandboxMode::WorkspaceWrite,
        dir.path(),
        "sh",
        &["-c", probe],
    ));
    assert_eq!(said, "refused\nchild-signalled\n");
}

#[test]
fn a_call_outlives_the_thread_that_started_it() {
    let dir = tempfile::tempdir().unwrap();
    for mode in modes() {
        let root = dir.path().to_path_buf();
        // The thread starts the child and ends; the kernel sends the parent-death signal then.
        let (child, confinement) = std::thread::spawn(move || {
            let mut confinement = Sandbox::new(SandboxPolicy::new(mode))
                .writable(&root)
                .prepare()
                .unwrap()
                .dying_with_parent();
            let mut command = Command::new("sh");
            command
                .args(["-c", "sleep 0.5; echo lived; exit 4"])
                .stdout(Stdio::piped())
                .process_group(0);
            confinement.install(&mut command);
            (command.spawn().unwrap(), confinement)
        })
        .join()
        .unwrap();
        let out = child.wait_with_output().unwrap();
        drop(confinement);
        assert_eq!(out.status.code(), Some(4), "{mode}: {:?}", out.status);
        assert_eq!(out.stdout, b"lived\n", "{mode}");
    }
}

/// `sh -c script` in `dir`, dying with this process, in this process's group (as where a
/// sandbox around this process refuses a new one): the supervisor has no group to kill.
fn in_this_group(mode: SandboxMode, dir: &Path, script: &str) -> std::process::Child {
    let mut confinement = Sandbox::new(SandboxPolicy::new(mode))
        .writable(dir)
        .prepare()
        .unwrap()
        .dying_with_parent();
    let mut command = Command::new("sh");
    command
        .args(["-c", script])
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    confinement.install(&mut command);
    let child = command.spawn().unwrap();
    // The private temporary folder may go: the script uses none.
    drop(confinement);
    child
}

/// The child's end within five seconds, or `None` (and it is killed).
fn ended_within_5s(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    for _ in 0..250 {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn without_a_group_of_its_own_what_the_program_left_dies_when_it_exits() {
    // No group to kill: what the program left comes to the supervisor as an orphan (its
    // children, then theirs), and goes.
    let dir = tempfile::tempdir().unwrap();
    for mode in modes() {
        let _ = std::fs::remove_file(dir.path().join("left.pid"));
        let mut child = in_this_group(
            mode,
            dir.path(),
            "sh -c 'sleep 30 & echo $! > left.pid; wait' & while [ ! -s left.pid ]; do sleep 0.05; done; exit 3",
        );
        let status = ended_within_5s(&mut child);
        assert_eq!(status.and_then(|s| s.code()), Some(3), "{mode}: {status:?}");
        let left = std::fs::read_to_string(dir.path().join("left.pid")).unwrap();
        let left = left.trim();
        let dead = gone(left);
        if !dead {
            let _ = Command::new("kill").args(["-9", left]).status();
        }
        assert!(dead, "{mode}: the grandchild {left} outlived the program");
    }
}

#[test]
fn without_a_group_of_its_own_a_sigterm_to_the_supervisor_reaches_the_program() {
    // With a group, a SIGTERM to it reaches the program (an MCP server's polite stop); without
    // one, it goes to the supervisor's pid only, which passes it on.
    let dir = tempfile::tempdir().unwrap();
    for mode in modes() {
        let _ = std::fs::remove_file(dir.path().join("ready"));
        let _ = std::fs::remove_file(dir.path().join("termed"));
        let mut child = in_this_group(
            mode,
            dir.path(),
            "trap 'echo yes > termed; exit 0' TERM; touch ready; while :; do sleep 0.05; done",
        );
        let ready = (0..250).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            dir.path().join("ready").exists()
        });
        assert!(ready, "{mode}: the program did not start");
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = ended_within_5s(&mut child);
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{mode}: {status:?}");
        assert!(dir.path().join("termed").exists(), "{mode}");
    }
}

#[test]
fn the_sandbox_lets_the_supervisor_kill_through_a_pidfd() {
    // The supervisor runs under the program's seccomp filter: it must allow `pidfd_open` and
    // `pidfd_send_signal` (where they are missing the supervisor falls back to `kill`, which a
    // refusal would make it do silently). The program, under the same filter, tries both.
    let dir = tempfile::tempdir().unwrap();
    let probe = "import os, signal, subprocess\n\
                 p = subprocess.Popen(['sleep', '30'])\n\
                 try:\n    fd = os.pidfd_open(p.pid)\n\
                 except OSError as e:\n    p.kill(); p.wait(); print('open', e.errno); raise SystemExit(1)\n\
                 signal.pidfd_send_signal(fd, signal.SIGKILL)\n\
                 print(p.wait())\n";
    for mode in modes() {
        let out = command(mode, dir.path(), "python3", &["-c", probe]);
        let said = text(&out);
        if said.contains(&format!("open {}", libc::ENOSYS)) {
            eprintln!("skipped: no pidfd_open on this kernel");
            return;
        }
        assert_eq!(out.status.code(), Some(0), "{mode}: {said}");
        assert_eq!(said.trim(), "-9", "{mode}");
    }
}
