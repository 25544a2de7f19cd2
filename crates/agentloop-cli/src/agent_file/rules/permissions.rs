//! `[permissions]`: the lists and rules name tools the file declares (or `*`), argument matches
//! name arguments those tools take, globs compile, and the permission store file reads.

use std::path::Path;

use agentloop::permissions::Permission;
use agentloop_tools::Builtin;

use super::span_of;
use crate::agent_file::check::{Problems, join};
use crate::agent_file::spec::{PermissionRuleSpec, PermissionsSpec, ToolFileSpec};

/// The longest `path_glob` glob: far past any real one (`src/**/*.{rs,toml}`), and short enough to
/// compile promptly.
const MAX_GLOB_BYTES: usize = 4096;

/// The tools a file declares: its `[[tools]]` by name and `[[mcp]]` renames, and its MCP servers'
/// tools by prefix (which tools a server has is known only once it runs).
pub(super) struct Declared<'a> {
    pub(super) names: &'a [&'a str],
    pub(super) mcp_prefixes: &'a [String],
    /// The arguments of the `[[tools]]`, by name, where the file says what they are.
    pub(super) arguments: &'a [(&'a str, Option<Vec<String>>)],
}

impl Declared<'_> {
    /// The arguments of a declared tool, when they are known.
    fn arguments_of(&self, name: &str) -> Option<&[String]> {
        self.arguments
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, a)| a.as_deref())
    }

    /// True when every tool's arguments are known: no MCP tools, and every `[[tools]]` entry's.
    fn all_arguments_known(&self) -> bool {
        self.mcp_prefixes.is_empty() && self.names.iter().all(|n| self.arguments_of(n).is_some())
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains(&name)
            || self
                .mcp_prefixes
                .iter()
                .any(|p| !p.is_empty() && name.len() > p.len() && name.starts_with(p.as_str()))
            // A server whose tools keep their own names may have any tool.
            || self.mcp_prefixes.iter().any(String::is_empty)
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.names.is_empty() {
            parts.push(format!("declared: {}", self.names.join(", ")));
        }
        if !self.mcp_prefixes.is_empty() {
            let globs: Vec<String> = self.mcp_prefixes.iter().map(|p| format!("{p}*")).collect();
            parts.push(format!("MCP tools: {}", globs.join(", ")));
        }
        if parts.is_empty() {
            "the file declares no tools".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// The arguments a `[[tools]]` entry takes: the top-level `properties` of its input schema (a
/// built-in tool's own, a command tool's `input_schema`, an agent tool's `task` unless it gives
/// one). `None` when the schema does not list them (a command tool without `input_schema`).
pub(super) fn tool_arguments(tool: &ToolFileSpec) -> Option<Vec<String>> {
    let schema = match (&tool.builtin, &tool.input_schema) {
        (Some(b), _) => {
            // A built-in tool's schema does not depend on its root; any folder builds it.
            let options = agentloop_tools::BuiltinOptions::rooted(std::env::temp_dir());
            Builtin::from_name(b.get_ref())?
                .tool_named(tool.name(), &options)
                .ok()?
                .spec()
                .input_schema
                .clone()
        }
        (None, Some(schema)) => schema.get_ref().clone(),
        (None, None) if tool.agent.is_some() => return Some(vec!["task".to_owned()]),
        // A command tool without a schema lists no arguments and refuses none.
        (None, None) => return None,
    };
    let properties = schema.get("properties")?.as_object()?;
    Some(properties.keys().cloned().collect())
}

/// `[permissions]`: every listed tool is declared and listed once, rules name declared tools (or
/// `*`) with at most one argument match each, globs compile, and the store file, when it exists,
/// reads.
pub(super) fn check_permissions(
    permissions: &PermissionsSpec,
    tools: &Declared<'_>,
    dir: &Path,
    problems: &mut Problems,
) {
    let declared = tools.describe();
    check_permission_lists(permissions, tools, &declared, problems);
    let rules = permissions.rules.as_deref().unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("permissions.rules[{i}]");
        check_permission_rule(rule, &path, tools, &declared, problems);
    }
    if let Some(store) = &permissions.store {
        if store.get_ref().trim().is_empty() {
            problems.at(
                "permissions.store",
                span_of(store),
                "the store path is empty",
            );
        } else if let Err(e) =
            crate::permission_file::open(dir.join(store.get_ref()), Permission::Allow)
        {
            problems.at("permissions.store", span_of(store), e.to_string());
        }
    }
}

/// `allow`, `ask` and `deny`: each name a declared tool, and no tool in two places.
fn check_permission_lists(
    permissions: &PermissionsSpec,
    tools: &Declared<'_>,
    declared: &str,
    problems: &mut Problems,
) {
    let mut listed: Vec<(&str, &str)> = Vec::new();
    for (list, names) in [
        ("allow", &permissions.allow),
        ("ask", &permissions.ask),
        ("deny", &permissions.deny),
    ] {
        for (i, name) in names.as_deref().unwrap_or_default().iter().enumerate() {
            let path = format!("permissions.{list}[{i}]");
            let n = name.get_ref().as_str();
            if !tools.contains(n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("no tool named {n:?} ({declared})"),
                );
            } else if let Some((_, first)) = listed.iter().find(|(t, _)| *t == n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("the tool {n:?} is already listed in `{first}`"),
                );
            }
            listed.push((n, list));
        }
    }
}

/// One `[[permissions.rules]]` entry at `path`: a declared tool (or `*`), a prefix with words in
/// it, not both argument matches, a glob that compiles.
fn check_permission_rule(
    rule: &PermissionRuleSpec,
    path: &str,
    tools: &Declared<'_>,
    declared: &str,
    problems: &mut Problems,
) {
    let n = rule.tool.get_ref().as_str();
    if n != "*" && !tools.contains(n) {
        problems.at(
            &join(path, "tool"),
            span_of(&rule.tool),
            format!("no tool named {n:?} ({declared}; `*` means any tool)"),
        );
    }
    if let Some(prefix) = &rule.command_prefix
        && prefix.prefix.get_ref().trim().is_empty()
    {
        problems.at(
            &join(path, "command_prefix.prefix"),
            span_of(&prefix.prefix),
            "the prefix is empty",
        );
    }
    check_rule_field(rule, path, tools, problems);
    if let Some(glob) = &rule.path_glob {
        if rule.command_prefix.is_some() {
            problems.at(
                &join(path, "path_glob"),
                span_of(glob),
                "give `command_prefix` or `path_glob`, not both",
            );
        }
        let g = &glob.get_ref().glob;
        // Parsing a glob is not enough: its regex may still be too large to compile (a glob of
        // megabytes), which failed only when a call was matched, at run time. A glob is
        // compiled here the way it is matched, and bounded first so that checking it is prompt.
        let compiled = if g.get_ref().len() > MAX_GLOB_BYTES {
            Err(format!("it is longer than {MAX_GLOB_BYTES} bytes"))
        } else {
            globset::GlobBuilder::new(g.get_ref())
                .literal_separator(true)
                .build()
                .map_err(|e| e.kind().to_string())
                .and_then(|glob| {
                    globset::GlobSetBuilder::new()
                        .add(glob)
                        .build()
                        .map(drop)
                        .map_err(|_| "it compiles to a pattern too large to match".to_owned())
                })
        };
        if let Err(why) = compiled {
            problems.at(
                &join(path, "path_glob.glob"),
                span_of(g),
                format!("not a valid glob: {why}"),
            );
        }
    }
}

/// A rule's `field` is an argument of its tool's input schema (for `*`, of some declared tool):
/// a rule on an argument the tool does not take would never match, silently.
fn check_rule_field(
    rule: &PermissionRuleSpec,
    path: &str,
    tools: &Declared<'_>,
    problems: &mut Problems,
) {
    let (field, key) = match (&rule.command_prefix, &rule.path_glob) {
        (Some(c), _) => (&c.field, "command_prefix.field"),
        (None, Some(g)) => (&g.get_ref().field, "path_glob.field"),
        (None, None) => return,
    };
    let f = field.get_ref().as_str();
    let n = rule.tool.get_ref().as_str();
    if n == "*" {
        let taken = tools.names.iter().any(|t| {
            tools
                .arguments_of(t)
                .is_some_and(|a| a.iter().any(|x| x == f))
        });
        if !taken && tools.all_arguments_known() {
            problems.at(
                &join(path, key),
                span_of(field),
                format!("no declared tool has an argument {f:?}, so the rule would never match"),
            );
        }
    } else if let Some(arguments) = tools.arguments_of(n)
        && !arguments.iter().any(|a| a == f)
    {
        let has = if arguments.is_empty() {
            "it takes none".to_owned()
        } else {
            format!("its arguments: {}", arguments.join(", "))
        };
        problems.at(
            &join(path, key),
            span_of(field),
            format!("the tool {n:?} has no argument {f:?} ({has}), so the rule would never match"),
        );
    }
}
