//! Systems other than Linux: no sandbox. `off` and `best-effort` run their processes
//! unconfined (the latter saying so); the strict modes refuse.

use std::path::{Path, PathBuf};

use crate::{Resources, SandboxError, SandboxPolicy, Support};

pub(crate) fn support() -> Support {
    Support {
        landlock_abi: 0,
        seccomp: false,
        read_only_mounts: None,
    }
}

/// Not asked here: nothing keeps a path read-only for a process on this system.
pub(crate) fn on_read_only_mount(_path: &Path) -> bool {
    false
}

/// Nothing runs confined here: what is missing is all in [`missing`].
pub(crate) fn partial(_mode: crate::SandboxMode) -> Vec<String> {
    Vec::new()
}

pub(crate) fn missing() -> Vec<String> {
    vec![format!(
        "an OS sandbox ({} has none that agentloop drives yet)",
        std::env::consts::OS
    )]
}

/// Resource limits are applied on Linux only so far: asking for them elsewhere is refused
/// (or, under `best-effort`, said) rather than silently ignored.
pub(crate) fn missing_resources(resources: Resources) -> Vec<String> {
    if resources.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "resource limits (not applied on {} yet)",
            std::env::consts::OS
        )]
    }
}

/// Nothing to apply in the child.
#[derive(Debug)]
pub(crate) struct ChildHook;

impl ChildHook {
    pub(crate) fn unconfined(_resources: Resources) -> Self {
        ChildHook
    }

    pub(crate) fn confined(
        _policy: SandboxPolicy,
        _writable: &[PathBuf],
        _read_only: &[PathBuf],
    ) -> Result<Self, SandboxError> {
        Ok(ChildHook)
    }

    /// No parent-death signal here: a child may outlive a killed agentloop.
    pub(crate) fn die_with_parent(&mut self) {}
}

pub(crate) fn install(_hook: ChildHook, _command: &mut std::process::Command) {}

pub(crate) fn protect_process() -> std::io::Result<()> {
    Ok(())
}
