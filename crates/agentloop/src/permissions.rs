//! The permission gate: once per turn, after validation and before any tool of the batch starts,
//! it sees the whole batch and answers each call: allow, deny (with a reason), or ask a human.
//!
//! Rules live in a [`PermissionStore`], by tool name and, where it helps, by the shape of the
//! arguments (a command prefix, a path glob), with a fallback. Deny rules win over ask rules, which
//! win over allow rules. "Always" answers are saved to the store; a file-backed store keeps them
//! across runs. An [`ApprovalPrompter`] is asked about all the calls of a batch that need asking at
//! once, so a prompt never races a running tool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::BatchGate;
use crate::error::RunError;
use crate::machine::Batch;

/// What the rules say about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    /// Run it.
    Allow,
    /// Ask a human.
    Ask,
    /// Do not run it.
    Deny,
}

/// A match on the arguments of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ArgumentMatch {
    /// The argument `field` (a string, or an array of strings joined by spaces) starts with
    /// `prefix` (on a word boundary: `git` matches `git status`, not `gitk`).
    CommandPrefix {
        /// The argument holding the command.
        field: String,
        /// The prefix.
        prefix: String,
    },
    /// The argument `field` (a path) matches a glob (`*` within a segment, `**` across them).
    PathGlob {
        /// The argument holding the path.
        field: String,
        /// The glob.
        glob: String,
    },
}

impl ArgumentMatch {
    fn matches(&self, args: &Value) -> bool {
        match self {
            ArgumentMatch::CommandPrefix { field, prefix } => {
                let Some(command) = string_arg(args, field) else {
                    return false;
                };
                let command = command.trim_start();
                command == prefix.as_str()
                    || command
                        .strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.starts_with(char::is_whitespace))
            }
            ArgumentMatch::PathGlob { field, glob } => {
                let Some(path) = string_arg(args, field) else {
                    return false;
                };
                match globset::GlobBuilder::new(glob)
                    .literal_separator(true)
                    .build()
                {
                    Ok(g) => g.compile_matcher().is_match(path.as_str()),
                    Err(_) => false,
                }
            }
        }
    }
}

fn string_arg(args: &Value, field: &str) -> Option<String> {
    match args.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let parts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            parts.map(|p| p.join(" "))
        }
        _ => None,
    }
}

/// One rule: a tool name (`*` for any), an optional argument match, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRule {
    /// The tool, or `*`.
    pub tool: String,
    /// A match on the arguments; `None` matches every call of the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentMatch>,
    /// What to do.
    pub permission: Permission,
}

impl PermissionRule {
    fn applies(&self, tool: &str, args: &Value) -> bool {
        (self.tool == "*" || self.tool == tool)
            && self.arguments.as_ref().is_none_or(|m| m.matches(args))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedRules {
    rules: Vec<PermissionRule>,
}

/// Permission rules with a fallback, optionally backed by a file where "always" answers are kept.
#[derive(Debug, Clone)]
pub struct PermissionStore {
    rules: Vec<PermissionRule>,
    /// Rules from configuration: decided on like the others, never written to the file.
    configured: Vec<PermissionRule>,
    fallback: Permission,
    file: Option<PathBuf>,
}

/// A permission store could not be read or written.
#[derive(Debug, Clone, thiserror::Error)]
#[error("permission store {path}: {message}")]
pub struct PermissionStoreError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub message: String,
}

impl PermissionStore {
    /// An in-memory store with a fallback for calls no rule covers.
    pub fn new(fallback: Permission) -> Self {
        PermissionStore {
            rules: Vec::new(),
            configured: Vec::new(),
            fallback,
            file: None,
        }
    }

    /// A store backed by a JSON file: its saved rules are loaded now (a missing file is an empty
    /// store), and "always" answers are written back to it.
    pub fn open(
        path: impl AsRef<Path>,
        fallback: Permission,
    ) -> Result<Self, PermissionStoreError> {
        let path = path.as_ref().to_path_buf();
        let err = |message: String| PermissionStoreError {
            path: path.display().to_string(),
            message,
        };
        let rules = match std::fs::read_to_string(&path) {
            Ok(text) => {
                serde_json::from_str::<SavedRules>(&text)
                    .map_err(|e| err(e.to_string()))?
                    .rules
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(err(e.to_string())),
        };
        Ok(PermissionStore {
            rules,
            configured: Vec::new(),
            fallback,
            file: Some(path),
        })
    }

    /// Adds a rule.
    pub fn add(&mut self, rule: PermissionRule) -> &mut Self {
        self.rules.push(rule);
        self
    }

    /// Adds a rule for every call of a tool.
    pub fn set(&mut self, tool: impl Into<String>, permission: Permission) -> &mut Self {
        self.add(PermissionRule {
            tool: tool.into(),
            arguments: None,
            permission,
        })
    }

    /// Adds a rule from configuration (an application's settings, an agent file): it is decided
    /// on like any other rule but never written to the store's file, which keeps only the rules
    /// added with [`add`](Self::add) or [`set`](Self::set) and the answers remembered there.
    pub fn configure(&mut self, rule: PermissionRule) -> &mut Self {
        self.configured.push(rule);
        self
    }

    /// The rules (those a file-backed store saves; configured rules are apart).
    pub fn rules(&self) -> &[PermissionRule] {
        &self.rules
    }

    /// The rules from configuration.
    pub fn configured(&self) -> &[PermissionRule] {
        &self.configured
    }

    /// The fallback.
    pub fn fallback(&self) -> Permission {
        self.fallback
    }

    /// What the rules say about a call: deny rules first, then ask, then allow, then the fallback.
    pub fn decide(&self, tool: &str, args: &Value) -> Permission {
        for wanted in [Permission::Deny, Permission::Ask, Permission::Allow] {
            if self
                .rules
                .iter()
                .chain(&self.configured)
                .any(|r| r.permission == wanted && r.applies(tool, args))
            {
                return wanted;
            }
        }
        self.fallback
    }

    /// Records an "always" answer for a tool and saves the store when it has a file. An older
    /// rule for the whole tool, saved or configured, is replaced, and so is every configured
    /// `ask` rule of the tool (the answer settles what they would ask); deny rules on arguments
    /// stay.
    pub fn remember(
        &mut self,
        tool: &str,
        permission: Permission,
    ) -> Result<(), PermissionStoreError> {
        let whole = |r: &PermissionRule| r.tool == tool && r.arguments.is_none();
        self.rules.retain(|r| !whole(r));
        self.configured
            .retain(|r| !(whole(r) || (r.tool == tool && r.permission == Permission::Ask)));
        self.rules.push(PermissionRule {
            tool: tool.to_owned(),
            arguments: None,
            permission,
        });
        self.save()
    }

    fn save(&self) -> Result<(), PermissionStoreError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let err = |message: String| PermissionStoreError {
            path: path.display().to_string(),
            message,
        };
        let text = serde_json::to_string_pretty(&SavedRules {
            rules: self.rules.clone(),
        })
        .map_err(|e| err(e.to_string()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        }
        // Write then rename, so a crash never leaves a half-written store.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }
}

/// A human's answer about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Run it this once.
    AllowOnce,
    /// Run it, and every later call of this tool.
    AllowAlways,
    /// Do not run it.
    DenyOnce,
    /// Do not run it, nor any later call of this tool.
    DenyAlways,
}

/// A call a human is asked about.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRequest {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
}

/// Asks a human about calls, all of a batch at once.
pub trait ApprovalPrompter: Send + Sync {
    /// One answer per request, in order; `Err` denies them all with that reason.
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>>;
}

/// A prompter that answers the same for every request (`--yes`, tests).
#[derive(Debug, Clone, Copy)]
pub struct FixedAnswer(pub Answer);

impl ApprovalPrompter for FixedAnswer {
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        let answers = vec![self.0; requests.len()];
        Box::pin(async move { Ok(answers) })
    }
}

/// The gate: a store of rules and, for calls that need asking, a prompter.
pub struct PermissionGate {
    store: Mutex<PermissionStore>,
    prompter: Option<Arc<dyn ApprovalPrompter>>,
    unattended_reason: String,
}

impl std::fmt::Debug for PermissionGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermissionGate")
            .field("prompter", &self.prompter.is_some())
            .finish_non_exhaustive()
    }
}

impl PermissionGate {
    /// A gate over a store. Without a prompter, a call that needs asking is denied.
    pub fn new(store: PermissionStore) -> Self {
        PermissionGate {
            store: Mutex::new(store),
            prompter: None,
            unattended_reason: "approval is required and nobody can be asked".into(),
        }
    }

    /// Sets the prompter.
    #[must_use]
    pub fn with_prompter(mut self, prompter: Arc<dyn ApprovalPrompter>) -> Self {
        self.prompter = Some(prompter);
        self
    }

    /// The reason given when a call needs asking and there is no prompter.
    #[must_use]
    pub fn unattended_reason(mut self, reason: impl Into<String>) -> Self {
        self.unattended_reason = reason.into();
        self
    }

    /// A copy of the store as it is now.
    pub fn store(&self) -> PermissionStore {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl BatchGate for PermissionGate {
    fn check<'a>(
        &'a self,
        _run_id: &'a str,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<Vec<Option<String>>, RunError>> {
        Box::pin(async move {
            let decisions: Vec<Permission> = {
                let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
                batch
                    .calls
                    .iter()
                    .map(|c| store.decide(&c.name, &c.args))
                    .collect()
            };
            let mut answers: Vec<Option<String>> = decisions
                .iter()
                .map(|d| match d {
                    Permission::Deny => Some("a permission rule denies this tool".to_owned()),
                    _ => None,
                })
                .collect();
            let asked: Vec<usize> = (0..decisions.len())
                .filter(|&i| decisions[i] == Permission::Ask)
                .collect();
            if asked.is_empty() {
                return Ok(answers);
            }
            let Some(prompter) = &self.prompter else {
                for &i in &asked {
                    answers[i] = Some(self.unattended_reason.clone());
                }
                return Ok(answers);
            };
            let requests: Vec<ApprovalRequest> = asked
                .iter()
                .map(|&i| ApprovalRequest {
                    call_id: batch.calls[i].call_id.to_string(),
                    tool: batch.calls[i].name.to_string(),
                    arguments: Value::clone(&batch.calls[i].args),
                })
                .collect();
            let replies = match prompter.ask(&requests).await {
                Ok(r) if r.len() == requests.len() => r,
                Ok(r) => {
                    return Err(RunError::Other {
                        message: format!(
                            "the approval prompter gave {} answers for {} requests",
                            r.len(),
                            requests.len()
                        ),
                    });
                }
                Err(reason) => {
                    for &i in &asked {
                        answers[i] = Some(reason.clone());
                    }
                    return Ok(answers);
                }
            };
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            for (&i, answer) in asked.iter().zip(replies) {
                let tool = &batch.calls[i].name;
                match answer {
                    Answer::AllowOnce => {}
                    Answer::AllowAlways => {
                        store
                            .remember(tool, Permission::Allow)
                            .map_err(|e| RunError::Other {
                                message: e.to_string(),
                            })?
                    }
                    Answer::DenyOnce => answers[i] = Some("the user denied this call".into()),
                    Answer::DenyAlways => {
                        answers[i] = Some("the user denied this tool".into());
                        store
                            .remember(tool, Permission::Deny)
                            .map_err(|e| RunError::Other {
                                message: e.to_string(),
                            })?;
                    }
                }
            }
            Ok(answers)
        })
    }
}
