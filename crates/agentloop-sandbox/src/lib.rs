//! The OS sandbox for the processes agentloop's tools start (the `shell` tool, command tools and
//! stdio MCP servers), and the guard that keeps the agentloop process's credentials out of their
//! reach.
//!
//! A [`Sandbox`] is a [`SandboxPolicy`] (a [`SandboxMode`] and whether the network is allowed)
//! plus the folders its processes may write. [`Sandbox::prepare`] builds, in the parent, all that
//! confining one child needs (a private temporary folder, the Landlock ruleset, the seccomp
//! program, all allocated here) as a [`Confinement`]; [`Confinement::install`] hooks it into a
//! [`std::process::Command`], and the child applies it between `fork` and `exec` with
//! async-signal-safe system calls only. What the child then can and cannot do, for each mode, is
//! in `docs/sandbox.md`; in short, under `workspace-write` a process and every child it starts
//! may read the system, write only under the writable roots, its private temporary folder and
//! `/dev/null`, open no network connection unless the policy allows it, cannot change a file
//! outside those (its mode, owner, times and extended attributes included) and cannot see, trace
//! or signal the agentloop process.
//!
//! Whatever the mode, even `off`, every child loses the capabilities that read another process's
//! memory (`CAP_SYS_PTRACE`, `CAP_SYS_RAWIO`, ...) before it runs its program, so that a tool
//! started by root still cannot read the agentloop process's environment or memory once the
//! process has called [`protect_process`] (the CLI does, first thing in `main`; an application
//! that embeds agentloop's tools should too). A confined child (every mode but `off`) loses
//! every capability but root's power over files (`CAP_CHOWN`, `CAP_DAC_OVERRIDE`,
//! `CAP_FOWNER`), so that a tool run as root cannot make devices, reboot, set the clock or raise
//! its resource limits back.
//!
//! On Linux the sandbox is Landlock (ABI 6, Linux 6.12, for the strict modes) plus a seccomp
//! filter, under a read-only view of the file system outside the writable roots (a mount
//! namespace of the process's own, where the system allows one: see [`ReadOnlyMounts`]; a strict
//! mode runs without it where it does not, and says so in [`Confinement::note`]). Elsewhere only [`SandboxMode::Off`] and [`SandboxMode::BestEffort`] run (the latter
//! unconfined, saying so): a strict mode refuses with [`SandboxError::Unsupported`].
#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
use other as platform;
mod spelling;
pub use spelling::case_ignored_at;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How much a tool's processes are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Read the system; write only under the writable roots, a private temporary folder and
    /// `/dev/null`-like devices; no network unless allowed; no sight of the agentloop process.
    /// A system that cannot enforce all of it refuses to start the process.
    #[default]
    WorkspaceWrite,
    /// As `workspace-write`, with no writable root: only the private temporary folder and
    /// `/dev/null`-like devices can be written.
    ReadOnly,
    /// No sandbox: the process can do whatever the user can. Its capabilities that read another
    /// process's memory are still dropped.
    Off,
    /// `workspace-write` as far as this system can enforce it; what it cannot is said in
    /// [`Confinement::note`] instead of refusing.
    BestEffort,
}

impl SandboxMode {
    /// Every mode, in the order the docs give them.
    pub const ALL: [SandboxMode; 4] = [
        SandboxMode::WorkspaceWrite,
        SandboxMode::ReadOnly,
        SandboxMode::Off,
        SandboxMode::BestEffort,
    ];

    /// Its name in agent files: `workspace-write`, `read-only`, `off`, `best-effort`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::Off => "off",
            SandboxMode::BestEffort => "best-effort",
        }
    }

    /// The mode of a name.
    pub fn from_name(name: &str) -> Option<SandboxMode> {
        SandboxMode::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// True for the modes that confine the process (all but `off`).
    pub fn confines(self) -> bool {
        self != SandboxMode::Off
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a tool's processes may do: the mode, whether they may open network connections or reach
/// the system's UNIX sockets, and the resources they may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SandboxPolicy {
    /// How much they are confined.
    pub mode: SandboxMode,
    /// They may open network connections (TCP, UDP, ...).
    pub network: bool,
    /// They may connect to pathname UNIX sockets outside their writable roots (a Docker daemon's,
    /// an SSH agent's, D-Bus, a database's). Without it a confined process reaches only sockets
    /// under its roots where the kernel can tell them apart (Landlock ABI 9), and none at all
    /// where it cannot (it may still make socket pairs). `off` does not confine.
    #[serde(default)]
    pub unix_sockets: bool,
    /// The most each process may use (memory, CPU time, processes, file size, open files), in
    /// every mode, `off` included.
    #[serde(default)]
    pub resources: Resources,
}

impl SandboxPolicy {
    /// A policy of this mode, without network, UNIX sockets or resource limits.
    pub fn new(mode: SandboxMode) -> Self {
        SandboxPolicy {
            mode,
            network: false,
            unix_sockets: false,
            resources: Resources::default(),
        }
    }

    /// The same policy, with or without network.
    #[must_use]
    pub fn network(mut self, allowed: bool) -> Self {
        self.network = allowed;
        self
    }

    /// The same policy, with or without the system's UNIX sockets.
    #[must_use]
    pub fn unix_sockets(mut self, allowed: bool) -> Self {
        self.unix_sockets = allowed;
        self
    }

    /// The same policy, with these resource limits.
    #[must_use]
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }
}

/// Resource limits of each process a tool starts (`setrlimit`: inherited by its children, each
/// of which gets the same allowance). `None` leaves the inherited limit. A limit above the one the
/// agentloop process itself has is lowered to it (no process may raise its own hard limit).
/// Core dumps are always off, in every mode: a dump of a tool that read a secret would write it
/// to the tool's folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Resources {
    /// Address space, in bytes (`RLIMIT_AS`): past it, allocations fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// CPU time, in seconds (`RLIMIT_CPU`): past it the process is killed (`SIGXCPU`, then
    /// `SIGKILL`). The call's timeout still bounds wall-clock time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_secs: Option<u64>,
    /// Processes and threads of the user (`RLIMIT_NPROC`): past it, `fork` fails. The kernel
    /// counts all of the user's processes, and does not apply it to root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// The size of a file it writes, in bytes (`RLIMIT_FSIZE`): past it, the write fails
    /// (`SIGXFSZ`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
}

impl Resources {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Resources::default()
    }
}

/// Why a process could not be confined as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The system lacks what the mode needs (an old kernel, Landlock disabled, another OS).
    #[error(
        "sandbox = \"{mode}\" cannot be enforced on this system: {missing}; use sandbox = \
         \"best-effort\" to run with what it has, or \"off\""
    )]
    Unsupported {
        /// The mode asked for.
        mode: SandboxMode,
        /// What is missing.
        missing: String,
    },
    /// Preparing the confinement failed (a writable root that cannot be opened, no temporary
    /// folder).
    #[error("cannot prepare the sandbox: {reason}")]
    Setup {
        /// Why.
        reason: String,
    },
}

impl SandboxError {
    /// The stable code: `sandbox.unsupported` or `sandbox.setup`.
    pub fn code(&self) -> &'static str {
        match self {
            SandboxError::Unsupported { .. } => "sandbox.unsupported",
            SandboxError::Setup { .. } => "sandbox.setup",
        }
    }
}

/// A policy and the folders its processes may write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    policy: SandboxPolicy,
    writable: Vec<PathBuf>,
    /// Roots resolved once by the caller, which must still resolve to themselves.
    resolved: Vec<PathBuf>,
    /// Paths under the writable roots kept read-only.
    read_only: Vec<PathBuf>,
}

impl Sandbox {
    /// A sandbox of `policy` with no writable root yet.
    pub fn new(policy: SandboxPolicy) -> Self {
        Sandbox {
            policy,
            writable: Vec::new(),
            resolved: Vec::new(),
            read_only: Vec::new(),
        }
    }

    /// Also lets its processes write under `root` (not under `read-only`).
    #[must_use]
    pub fn writable(mut self, root: impl Into<PathBuf>) -> Self {
        self.writable.push(root.into());
        self
    }

    /// Also lets its processes write under `root`, a canonical path the caller resolved once
    /// (when the agent was loaded): a process that could write where the root lies may put a
    /// link in its place between two calls, and the next process would then write wherever the
    /// link leads. [`Sandbox::prepare`] refuses a root that no longer resolves to itself, and
    /// opens it without following any link.
    #[must_use]
    pub fn writable_resolved(mut self, root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        self.resolved.push(root.clone());
        self.writable.push(root);
        self
    }

    /// Keeps `paths` read-only where they lie under a writable root (the agent's own files: its
    /// agent file, its tools' programs, its stores), so that its processes may write the rest of
    /// the root but never rewrite, replace or remove these. Each existing path is bound
    /// read-only over itself in the process's view of the file system (and each folder between
    /// the root and it over itself, so that it cannot be renamed away with the path inside); a
    /// path missing when the process starts is not kept. Where the system gives no view
    /// ([`Support::read_only_mounts`]) and such a path lies under a root, a strict mode refuses
    /// to start the process ([`SandboxError::Unsupported`]) and `best-effort` says so.
    #[must_use]
    pub fn read_only(mut self, paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.read_only.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Its policy.
    pub fn policy(&self) -> SandboxPolicy {
        self.policy
    }

    /// The folders its processes may write besides their private temporary folder (none under
    /// `read-only` and `off`: `off` does not confine).
    pub fn writable_roots(&self) -> &[PathBuf] {
        match self.policy.mode {
            SandboxMode::WorkspaceWrite | SandboxMode::BestEffort => &self.writable,
            SandboxMode::ReadOnly | SandboxMode::Off => &[],
        }
    }

    /// Builds the confinement of one process: its private temporary folder (removed when the
    /// confinement is dropped) and everything the child will apply. Fails with
    /// [`SandboxError::Unsupported`] when the system cannot enforce a strict mode.
    pub fn prepare(&self) -> Result<Confinement, SandboxError> {
        let mut missing = platform::missing_resources(self.policy.resources);
        if !self.policy.mode.confines() {
            if !missing.is_empty() {
                return Err(SandboxError::Unsupported {
                    mode: self.policy.mode,
                    missing: missing.join(", "),
                });
            }
            return Ok(Confinement {
                tmp: None,
                hook: Some(platform::ChildHook::unconfined(self.policy.resources)),
                note: None,
            });
        }
        missing.extend(platform::missing());
        if !missing.is_empty() && self.policy.mode != SandboxMode::BestEffort {
            return Err(SandboxError::Unsupported {
                mode: self.policy.mode,
                missing: missing.join(", "),
            });
        }
        let tmp = tempfile::Builder::new()
            .prefix("agentloop-tool-")
            .tempdir()
            .map_err(|e| SandboxError::Setup {
                reason: format!("cannot create a private temporary folder: {e}"),
            })?;
        let mut writable = Vec::with_capacity(self.writable_roots().len() + 1);
        for root in self.writable_roots() {
            let canonical = std::fs::canonicalize(root).map_err(|e| SandboxError::Setup {
                reason: format!("the writable root {}: {e}", root.display()),
            })?;
            if self.resolved.contains(root) && canonical != *root {
                return Err(SandboxError::Setup {
                    reason: format!(
                        "the writable root {} now leads to {} (a link was put in its place \
                         since it was resolved): refused",
                        root.display(),
                        canonical.display()
                    ),
                });
            }
            writable.push(canonical);
        }
        let kept = kept_read_only(&self.read_only, &writable);
        if !kept.is_empty() && platform::support().read_only_mounts.is_none() {
            missing.push(format!(
                "keeping the agent's own files under the writable root read-only ({}): it needs \
                 {}",
                kept.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                "the read-only view of the file system (CAP_SYS_ADMIN, or user namespaces for \
                 an ordinary user, and Linux 5.12)"
            ));
            if self.policy.mode != SandboxMode::BestEffort {
                return Err(SandboxError::Unsupported {
                    mode: self.policy.mode,
                    missing: missing.join(", "),
                });
            }
        }
        let folded = case_ignored_keeps(&kept, &writable);
        if !folded.is_empty() {
            missing.push(format!(
                "keeping the agent's own files under the writable root read-only under every \
                 spelling of their names ({folded}): the file system there ignores case, and a \
                 read-only bind covers the spelling it is made on; give the processes a root \
                 that holds none of the agent's files"
            ));
            if self.policy.mode != SandboxMode::BestEffort {
                return Err(SandboxError::Unsupported {
                    mode: self.policy.mode,
                    missing: missing.join(", "),
                });
            }
        }
        let kept = with_other_spellings(&mut writable, kept);
        writable.push(tmp.path().to_path_buf());
        let hook = platform::ChildHook::confined(self.policy, &writable, &kept)?;
        // What a strict mode runs without rather than refuse: said, as best-effort says all it
        // lacks.
        missing.extend(platform::partial(self.policy.mode));
        let note = (!missing.is_empty()).then(|| {
            format!(
                "sandbox {}: not enforced on this system: {}",
                self.policy.mode,
                missing.join(", ")
            )
        });
        Ok(Confinement {
            tmp: Some(tmp),
            hook: Some(hook),
            note,
        })
    }
}

/// True when `path` lies on a read-only mount of this process's own view of the file system, so
/// that no process started from here writes it, whatever its sandbox: such a path needs no
/// read-only view of its own. It is how an agentloop started inside another's sandbox (a stdio
/// MCP server `agentloop mcp serve`, a command tool running an agent), whose agent files that
/// sandbox already binds read-only and where a view of its own cannot be made, still runs its
/// process tools. A confined process cannot make such a mount writable again: it holds no
/// capability to remount, and a mount inherited into a user namespace is locked read-only.
///
/// ```
/// assert!(!agentloop_sandbox::on_read_only_mount(&std::env::temp_dir()));
/// ```
pub fn on_read_only_mount(path: &Path) -> bool {
    platform::on_read_only_mount(path)
}

/// The canonical paths of `read_only` that lie under one of the `roots` (canonical), or hold one
/// (then the root itself is kept read-only: all under it is the agent's), deduplicated; a path
/// already on a read-only mount ([`on_read_only_mount`]) is left out.
fn kept_read_only(read_only: &[PathBuf], roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut kept: Vec<PathBuf> = Vec::new();
    for path in read_only {
        let Ok(path) = std::fs::canonicalize(path) else {
            continue;
        };
        if on_read_only_mount(&path) {
            continue;
        }
        for root in roots {
            let inside = if path.starts_with(root) {
                Some(path.clone())
            } else if root.starts_with(&path) {
                Some(root.clone())
            } else {
                None
            };
            if let Some(p) = inside
                && !kept.contains(&p)
            {
                kept.push(p);
            }
        }
    }
    kept.sort();
    kept
}

/// The paths of `kept` (canonical) inside a root of `roots` on a file system that ignores case
/// there ([`case_ignored_at`], from the path up to its root), each with the spelling found,
/// joined for a message; empty where every such path's file system tells case apart. Such a
/// path is kept by a read-only bind of its name, and where the kernel does not fold case itself
/// (FUSE) another spelling (`AGENT.TOML`) is a path of its own to the same file: a process
/// writes through it, or renames a file of its own over it.
fn case_ignored_keeps(kept: &[PathBuf], roots: &[PathBuf]) -> String {
    let mut found = Vec::new();
    for path in kept {
        let Some(root) = roots.iter().find(|r| path.starts_with(r) && path != *r) else {
            continue;
        };
        let spelled = path
            .ancestors()
            .take_while(|p| p.starts_with(root))
            .find_map(|p| Some((p, case_ignored_at(p)?)));
        if let Some((part, other)) = spelled {
            found.push(format!(
                "{}, where {} is found as {}",
                path.display(),
                part.display(),
                other.to_string_lossy()
            ));
        }
    }
    found.join("; ")
}

/// Adds to `roots` (canonical) each root's other spellings on a file system that ignores case
/// through FUSE (`spelling`), where the view's copy and Landlock's rule cover one spelling each:
/// a process finds its root under the name its folder lists, which would otherwise be
/// read-only to it. Answers `kept` with each kept path under a root kept under every spelling
/// of that root too, so that no spelling opens what the root's own keeps read-only.
fn with_other_spellings(roots: &mut Vec<PathBuf>, mut kept: Vec<PathBuf>) -> Vec<PathBuf> {
    for root in roots.clone() {
        for other in spelling::other_spellings(&root) {
            if roots.contains(&other) {
                continue;
            }
            let under: Vec<PathBuf> = kept
                .iter()
                .filter_map(|path| path.strip_prefix(&root).ok())
                .map(|rest| {
                    if rest.as_os_str().is_empty() {
                        other.clone()
                    } else {
                        other.join(rest)
                    }
                })
                .collect();
            kept.extend(under);
            roots.push(other);
        }
    }
    kept
}

/// What confines one child process, prepared by [`Sandbox::prepare`]. Keep it alive until the
/// process has ended: dropping it removes the private temporary folder.
#[derive(Debug)]
pub struct Confinement {
    tmp: Option<tempfile::TempDir>,
    hook: Option<platform::ChildHook>,
    note: Option<String>,
}

impl Confinement {
    /// The private temporary folder (`TMPDIR` of the child), when the mode confines.
    pub fn tmp_dir(&self) -> Option<&Path> {
        self.tmp.as_ref().map(tempfile::TempDir::path)
    }

    /// What this system could not enforce: under `best-effort`, all it lacks; under a strict
    /// mode (which refuses to run without the rest), the read-only view of the file system
    /// outside the roots where the system cannot give one ([`Support::read_only_mounts`]).
    /// `None` when all of it holds.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Makes the child, and every process it starts, die with this process (elsewhere than
    /// Linux, nothing): for a child that its caller awaits to its end, such as a tool call's
    /// process, which must not go on acting after agentloop was killed and another process
    /// resumed its run, or a stdio MCP server's. On Linux the child becomes a small supervisor that runs the program as
    /// its own child (the pid the caller sees is the supervisor's, which exits as the program
    /// did) and, when this process dies, kills the child's process group and what came to it as
    /// an orphan; it works best on a command that leads its own process group
    /// (`process_group(0)`), which is all it kills when the program exits. A command left in
    /// this process's group (where a sandbox around this process refuses a new one) has, when
    /// the program exits, what came to the supervisor as an orphan killed instead, and a SIGTERM
    /// to the supervisor passed on to the program. What escapes it is in `docs/sandbox.md`. Call
    /// it before [`Confinement::install`].
    #[must_use]
    pub fn dying_with_parent(mut self) -> Self {
        if let Some(hook) = self.hook.as_mut() {
            hook.die_with_parent();
        }
        self
    }

    /// Makes `command` start its child confined: sets `TMPDIR` to the private temporary folder
    /// and adds the hook that the child runs before `exec`. A second call does nothing: one
    /// confinement serves one command.
    pub fn install(&mut self, command: &mut std::process::Command) {
        if let Some(tmp) = &self.tmp {
            command.env("TMPDIR", tmp.path());
        }
        if let Some(hook) = self.hook.take() {
            platform::install(hook, command);
        }
    }
}

/// Keeps this process out of its children's sight: on Linux it becomes non-dumpable
/// (`PR_SET_DUMPABLE` 0), so that `/proc/<pid>/environ`, `/proc/<pid>/mem` and `ptrace` are
/// refused to every process without `CAP_SYS_PTRACE`, root's included, and the children this
/// crate confines have that capability dropped. Call it first thing in `main`, before any
/// credential is read; it also disables core dumps of this process. Elsewhere it does nothing.
pub fn protect_process() -> std::io::Result<()> {
    platform::protect_process()
}

/// What this system supports, for `plan`-like reports and tests: on Linux the Landlock ABI
/// (0 when Landlock is missing or disabled), whether seccomp filters can be installed and how a
/// confined process's file system is made read-only outside its roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// The Landlock ABI of the running kernel (0: none).
    pub landlock_abi: i32,
    /// Seccomp filters are available.
    pub seccomp: bool,
    /// How a confined process gets a read-only view of the file system outside its writable
    /// roots (found once by trying it); `None` where it cannot, and the mode, owner, times and
    /// extended attributes of files outside the roots stay changeable.
    pub read_only_mounts: Option<ReadOnlyMounts>,
}

/// How a confined process's file system is made read-only outside its writable roots and its
/// private temporary folder, so that changing a file there (its mode, owner, times, extended
/// attributes, which Landlock has no right for) fails with `EROFS`: a mount namespace of its own
/// in which every mount is read-only but copies of the roots'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReadOnlyMounts {
    /// A mount namespace: this process has `CAP_SYS_ADMIN` (root has).
    MountNamespace,
    /// A user namespace, then a mount namespace in it: an ordinary user, where the kernel
    /// allows unprivileged user namespaces. The process is not mapped in it: it sees itself and
    /// every file's owner as the overflow user (`nobody`), while the kernel still checks its
    /// real user (`docs/sandbox.md` says why).
    UserNamespace,
}

impl Support {
    /// The running system's.
    pub fn current() -> Support {
        platform::support()
    }

    /// What a policy needs that this system lacks (empty when it can be enforced whole).
    pub fn missing(policy: SandboxPolicy) -> Vec<String> {
        if policy.mode.confines() {
            platform::missing()
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn modes_read_and_print_their_file_names() {
        for mode in SandboxMode::ALL {
            assert_eq!(SandboxMode::from_name(mode.as_str()), Some(mode));
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{mode}\""));
        }
        assert_eq!(SandboxMode::from_name("none"), None);
        assert_eq!(SandboxMode::default(), SandboxMode::WorkspaceWrite);
    }

    #[test]
    fn read_only_and_off_have_no_writable_root() {
        for (mode, roots) in [
            (SandboxMode::WorkspaceWrite, 1),
            (SandboxMode::BestEffort, 1),
            (SandboxMode::ReadOnly, 0),
            (SandboxMode::Off, 0),
        ] {
            let s = Sandbox::new(SandboxPolicy::new(mode)).writable("/tmp");
            assert_eq!(s.writable_roots().len(), roots, "{mode}");
        }
    }

    #[test]
    fn off_needs_no_temporary_folder_and_a_missing_root_is_a_setup_error() {
        let off = Sandbox::new(SandboxPolicy::new(SandboxMode::Off))
            .prepare()
            .unwrap();
        assert!(off.tmp_dir().is_none());
        let Err(e) = Sandbox::new(SandboxPolicy::new(SandboxMode::BestEffort))
            .writable("/no/such/folder/at/all")
            .prepare()
        else {
            panic!("a missing root was accepted");
        };
        assert_eq!(e.code(), "sandbox.setup");
    }

    #[test]
    fn the_temporary_folder_goes_with_the_confinement() {
        let c = Sandbox::new(SandboxPolicy::new(SandboxMode::BestEffort))
            .prepare()
            .unwrap();
        let tmp = c.tmp_dir().unwrap().to_path_buf();
        assert!(tmp.is_dir());
        drop(c);
        assert!(!tmp.exists());
    }
}
