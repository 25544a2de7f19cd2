//! What holds of the permission gate's reading of any `shell` command, checked by the property
//! test (`tests/permission_props.rs`) and the cargo fuzz target (`fuzz/`, `shell_permission`)
//! alike: judging ends without a panic, one more deny rule never loosens what a call gets, and
//! a command the deny and ask rules' own judge ([`CommandRules::judge`], what the shell tool
//! checks again as it runs) refuses, the gate refuses too.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use agentloop::permissions::{
    CommandRules, FileText, Permission, PermissionRule, PermissionStore, ResolvePaths,
};
use serde_json::json;

/// A root at `/project` whose every file (a `.git/config`, a hook, a script) holds `text`.
#[derive(Debug)]
struct Project {
    text: Option<String>,
}

impl ResolvePaths for Project {
    fn root(&self) -> &Path {
        Path::new("/project")
    }
    fn resolve(&self, path: &str) -> Option<PathBuf> {
        Some(join(path))
    }
    fn programs(&self, word: &str) -> Vec<PathBuf> {
        if word.contains('/') {
            vec![join(word)]
        } else {
            vec![Path::new("/usr/bin").join(word)]
        }
    }
    fn read_text(&self, _path: &str) -> FileText {
        match &self.text {
            Some(text) => FileText::Text(text.clone()),
            None => FileText::Missing,
        }
    }
}

/// `path` against `/project`, `..` resolved lexically.
fn join(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in Path::new("/project").join(path).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            _ => {}
        }
    }
    out
}

fn prefix(prefix: &str, permission: Permission) -> PermissionRule {
    PermissionRule::command_prefix("shell", prefix, permission)
}

/// A shell asked about by default, with commands allowed, asked about and denied, as the CLI
/// builds it from a typical agent file.
fn store(resolver: Option<Arc<dyn ResolvePaths>>) -> PermissionStore {
    let mut store = PermissionStore::new(Permission::Deny);
    store
        .tool_default("shell", Permission::Ask)
        .configure(prefix("rm", Permission::Deny))
        .configure(prefix("python3 -c", Permission::Deny))
        .configure(prefix("git push", Permission::Ask))
        .configure(prefix("git status", Permission::Allow))
        .configure(prefix("ls", Permission::Allow));
    if let Some(resolver) = resolver {
        store.resolve_paths("shell", resolver);
    }
    store
}

fn rank(p: Permission) -> u8 {
    match p {
        Permission::Allow => 0,
        Permission::Ask => 1,
        Permission::Deny => 2,
    }
}

/// Judges `command` with no resolver, one that serves no file, and one whose every file holds
/// `files`; says what failed to hold, if anything did.
pub(crate) fn judge_every_way(command: &str, files: &str) -> Result<(), String> {
    let resolvers: [Option<Arc<dyn ResolvePaths>>; 3] = [
        None,
        Some(Arc::new(Project { text: None })),
        Some(Arc::new(Project {
            text: Some(files.to_owned()),
        })),
    ];
    let args = json!({ "command": command });
    for resolver in resolvers {
        let base = store(resolver.clone());
        let decided = base.decide("shell", &args);
        let rules: CommandRules = base.command_rules("shell", "command");
        let judged = rules.judge(command, resolver.as_deref());
        let agrees = match judged {
            Some(Permission::Deny) => decided == Permission::Deny,
            Some(Permission::Ask) => decided != Permission::Allow,
            _ => true,
        };
        if !agrees {
            return Err(format!(
                "{command:?}: the shell's own judge says {judged:?}, the gate {decided:?}"
            ));
        }
        let mut stricter = store(resolver);
        stricter.configure(prefix("curl", Permission::Deny));
        let now = stricter.decide("shell", &args);
        if rank(now) < rank(decided) {
            return Err(format!(
                "{command:?}: {decided:?}, and {now:?} with one more deny rule"
            ));
        }
    }
    Ok(())
}
