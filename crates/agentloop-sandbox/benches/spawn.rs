//! What the sandbox adds to starting a process: `/bin/true` spawned and waited for, bare, with
//! `off` (capabilities dropped only) and with `workspace-write` (a private temporary folder, a
//! Landlock ruleset and a seccomp program prepared, then applied in the child), and each of those
//! two dying with this process (a tool call's: the supervisor's second fork and its look at
//! `/proc` for leftovers when the program exits).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use agentloop_sandbox::{Sandbox, SandboxMode, SandboxPolicy, Support};
use criterion::{Criterion, criterion_group, criterion_main};

fn run(sandbox: Option<&Sandbox>) {
    start(sandbox, false);
}

fn start(sandbox: Option<&Sandbox>, supervised: bool) {
    let mut command = Command::new("/bin/true");
    command.stdin(Stdio::null()).stdout(Stdio::null());
    let confinement = sandbox.map(|s| {
        let mut c = s.prepare().expect("the sandbox is supported here");
        if supervised {
            command.process_group(0);
            c = c.dying_with_parent();
        }
        c.install(&mut command);
        c
    });
    let status = command.status().expect("/bin/true starts");
    assert!(status.success());
    drop(confinement);
}

fn spawn(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let off = Sandbox::new(SandboxPolicy::new(SandboxMode::Off));
    let write = Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).writable(dir.path());
    let mut group = c.benchmark_group("spawn_true");
    group.bench_function("bare", |b| b.iter(|| run(None)));
    group.bench_function("off", |b| b.iter(|| run(Some(&off))));
    group.bench_function("off_supervised", |b| b.iter(|| start(Some(&off), true)));
    if Support::missing(write.policy()).is_empty() {
        group.bench_function("workspace_write", |b| b.iter(|| run(Some(&write))));
        group.bench_function("workspace_write_supervised", |b| {
            b.iter(|| start(Some(&write), true))
        });
        group.bench_function("workspace_write_prepare_only", |b| {
            b.iter(|| write.prepare().unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, spawn);
criterion_main!(benches);
