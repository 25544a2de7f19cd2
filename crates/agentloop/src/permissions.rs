//! The permission gate: once per turn, after validation and before any tool of the batch starts,
//! it sees the whole batch and answers each call: allow, deny (with a reason), or ask a human.
//!
//! Rules live in a [`PermissionStore`], by tool name and, where it helps, by the shape of the
//! arguments (a command prefix, a path glob), with a fallback. Deny rules win over ask rules, which
//! win over allow rules. "Always" answers are saved to the store, and through its [`SaveRules`] (a
//! file, in the CLI) across runs; the core does no file I/O. An [`ApprovalPrompter`] is asked about all the calls of a batch that need asking at
//! once, so a prompt never races a running tool.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RunError;
use crate::gate::{Gate, GateContext};
use crate::machine::{AdmittedCall, Verdict};

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

/// Permission rules with a fallback, optionally backed by a file where "always" answers are kept.
#[derive(Debug, Clone)]
pub struct PermissionStore {
    rules: Vec<PermissionRule>,
    /// Rules from configuration: decided on like the others, never written to the file.
    configured: Vec<PermissionRule>,
    fallback: Permission,
    saver: Option<Arc<dyn SaveRules>>,
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

/// Where a [`PermissionStore`] keeps what it learns, so that an "always" answer outlives the
/// run (the CLI saves to a file, atomically and safe under concurrent writers).
pub trait SaveRules: Send + Sync + std::fmt::Debug {
    /// Saves the store's learned rules whole.
    fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError>;
}

impl PermissionStore {
    /// An in-memory store with a fallback for calls no rule covers.
    pub fn new(fallback: Permission) -> Self {
        PermissionStore {
            rules: Vec::new(),
            configured: Vec::new(),
            fallback,
            saver: None,
        }
    }

    /// A store holding rules saved by an earlier run, which saves what it learns through
    /// `saver` (the CLI keeps a JSON file).
    pub fn with_saved(
        rules: Vec<PermissionRule>,
        fallback: Permission,
        saver: Arc<dyn SaveRules>,
    ) -> Self {
        PermissionStore {
            rules,
            configured: Vec::new(),
            fallback,
            saver: Some(saver),
        }
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
        match &self.saver {
            Some(saver) => saver.save(&self.rules),
            None => Ok(()),
        }
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

impl Gate for PermissionGate {
    fn name(&self) -> &str {
        "permissions"
    }

    fn check<'a>(
        &'a self,
        _cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        Box::pin(async move {
            let decisions: Vec<Permission> = {
                let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
                calls
                    .iter()
                    .map(|c| store.decide(&c.tool, &c.arguments))
                    .collect()
            };
            let mut answers: Vec<Verdict> = decisions
                .iter()
                .map(|d| match d {
                    Permission::Deny => Verdict::Deny("a permission rule denies this tool".into()),
                    _ => Verdict::Allow,
                })
                .collect();
            let asked: Vec<usize> = decisions
                .iter()
                .enumerate()
                .filter(|(_, d)| **d == Permission::Ask)
                .map(|(i, _)| i)
                .collect();
            if asked.is_empty() {
                return Ok(answers);
            }
            let Some(prompter) = &self.prompter else {
                for &i in &asked {
                    if let Some(a) = answers.get_mut(i) {
                        *a = Verdict::Deny(self.unattended_reason.clone());
                    }
                }
                return Ok(answers);
            };
            let requests: Vec<ApprovalRequest> = asked
                .iter()
                .filter_map(|&i| calls.get(i))
                .map(|c| ApprovalRequest {
                    call_id: c.call_id.to_string(),
                    tool: c.tool.to_string(),
                    arguments: Value::clone(&c.arguments),
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
                        if let Some(a) = answers.get_mut(i) {
                            *a = Verdict::Deny(reason.clone());
                        }
                    }
                    return Ok(answers);
                }
            };
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            for (&i, answer) in asked.iter().zip(replies) {
                let (Some(call), Some(verdict)) = (calls.get(i), answers.get_mut(i)) else {
                    continue;
                };
                let tool = &call.tool;
                match answer {
                    Answer::AllowOnce => {}
                    Answer::AllowAlways => {
                        store
                            .remember(tool, Permission::Allow)
                            .map_err(|e| RunError::Other {
                                message: e.to_string(),
                            })?
                    }
                    Answer::DenyOnce => {
                        *verdict = Verdict::Deny("the user denied this call".into())
                    }
                    Answer::DenyAlways => {
                        *verdict = Verdict::Deny("the user denied this tool".into());
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
