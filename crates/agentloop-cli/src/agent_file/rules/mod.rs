//! The rules of the agent file that no type can say: a tool name, a schema, a script file, what
//! belongs to which provider, which tools `[permissions]` may name. They run on the typed file,
//! still with spans; when some sections have shape problems, the rules still run on every section
//! whose shape is right.
//!
//! Each section's checker has a file: `model`, `limits`, `tools`, `mcp` and `permissions`. This
//! one runs them on a whole file ([`check_rules`]) or on the sections whose shape is right
//! ([`check_clean_sections`]).

mod limits;
mod mcp;
mod model;
mod permissions;
mod tools;

use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::HostTool;
use super::check::{self, Problems};
use super::spec::{AgentFileSpec, LimitsSpec, ModelSpec, PermissionsSpec, ToolFileSpec};
use limits::{check_budget_priced, check_limits};
use mcp::{check_mcp, check_mcp_collisions};
use model::check_model;
use permissions::{Declared, check_permissions, tool_arguments};
use tools::check_tools;

fn span_of<T>(s: &Spanned<T>) -> Option<Range<usize>> {
    Some(s.span())
}

/// The rules no type says. Returns the instructions text when it could be read.
pub(super) fn check_rules(
    spec: &AgentFileSpec,
    dir: &Path,
    host: &[HostTool],
    problems: &mut Problems,
) -> Option<String> {
    let name = &spec.name;
    if name.get_ref().trim().is_empty() {
        problems.at("name", span_of(name), "the agent's name is empty");
    }
    let instructions = match (&spec.instructions, &spec.instructions_file) {
        (Some(_), Some(file)) => {
            problems.at(
                "instructions_file",
                span_of(file),
                "give `instructions` or `instructions_file`, not both",
            );
            None
        }
        (Some(text), None) => Some(text.get_ref().clone()),
        (None, Some(file)) => match crate::text_file::read_text(
            &dir.join(file.get_ref()),
            crate::text_file::MAX_AGENT_TEXT_BYTES,
        ) {
            Ok(text) => Some(text),
            Err(e) => {
                problems.at(
                    "instructions_file",
                    span_of(file),
                    format!(
                        "cannot read {}: {e}",
                        crate::terminal::shown_path(&dir.join(file.get_ref()))
                    ),
                );
                None
            }
        },
        (None, None) => None,
    };
    if let Some(schema) = &spec.output_schema
        && let Err(e) = agentloop::tool::check_schema(schema.get_ref())
    {
        problems.at(
            "output_schema",
            span_of(schema),
            format!("not a valid JSON Schema: {e}"),
        );
    }
    check_model(spec.model.get_ref(), dir, problems);
    if let Some(limits) = &spec.limits {
        check_limits(limits, problems);
        check_budget_priced(limits, spec.model.get_ref(), problems);
    }
    let tools: Vec<(String, &ToolFileSpec)> = spec
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("tools[{i}]"), t))
        .collect();
    check_tools(&tools, dir, problems);
    let servers = spec.mcp.as_deref().unwrap_or_default();
    check_mcp(servers, dir, problems);
    let mut names: Vec<&str> = tools.iter().map(|(_, t)| t.name()).collect();
    names.extend(servers.iter().flat_map(|s| {
        s.rename
            .iter()
            .flat_map(|r| r.get_ref().values().map(String::as_str))
    }));
    names.extend(host.iter().map(|t| t.name.as_str()));
    let own: Vec<&str> = tools
        .iter()
        .map(|(_, t)| t.name())
        .chain(host.iter().map(|t| t.name.as_str()))
        .collect();
    check_mcp_collisions(servers, &own, problems);
    let prefixes: Vec<String> = servers
        .iter()
        .map(|s| s.config(dir).tool_name(""))
        .collect();
    // A file with no tools at all is a `[model]` table for tools given elsewhere (the Python
    // package's `Provider`): the agent's builder checks the name against them.
    if let Some(choice) = &spec.model.get_ref().tool_choice
        && !(tools.is_empty() && servers.is_empty() && host.is_empty())
    {
        check_tool_choice(choice, &names, &prefixes, problems);
    }
    if let Some(permissions) = &spec.permissions {
        let arguments: Vec<(&str, Option<Vec<String>>)> = tools
            .iter()
            .map(|(_, t)| (t.name(), tool_arguments(t)))
            .chain(host.iter().map(|t| (t.name.as_str(), t.arguments.clone())))
            .collect();
        let declared = Declared {
            names: &names,
            mcp_prefixes: &prefixes,
            arguments: &arguments,
        };
        check_permissions(permissions, &declared, dir, problems);
    }
    instructions
}

/// `[model] tool_choice`: a mode, or the name of one of the agent's tools (an MCP server's tools
/// are known only when it starts, so any name under a declared server's prefix passes here).
fn check_tool_choice(
    choice: &Spanned<String>,
    names: &[&str],
    prefixes: &[String],
    problems: &mut Problems,
) {
    let name = choice.get_ref().as_str();
    if matches!(name, "auto" | "required" | "none")
        || names.contains(&name)
        || prefixes
            .iter()
            .any(|p| !p.is_empty() && name.starts_with(p.as_str()))
    {
        return;
    }
    problems.at(
        "model.tool_choice",
        span_of(choice),
        format!(
            "tool_choice is \"auto\", \"required\", \"none\" or the name of one of the agent's \
             tools, and the agent has no tool named `{name}`"
        ),
    );
}

/// The tool names of a file whose shape may be wrong: every `[[tools]]` entry's `name` that is a
/// string.
fn raw_tool_names(root: &DeTable<'_>) -> Vec<String> {
    fn named<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t DeValue<'i>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.get_ref())
    }
    let Some(DeValue::Array(items)) = named(root, "tools") else {
        return Vec::new();
    };
    // A built-in tool is called by its own name unless it is given one.
    items
        .iter()
        .filter_map(|item| item.get_ref().as_table())
        .filter_map(|t| named(t, "name").or_else(|| named(t, "builtin")))
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

/// The tool-name prefixes of the `[[mcp]]` entries of a file whose shape may be wrong.
fn raw_mcp_prefixes(root: &DeTable<'_>) -> Vec<String> {
    let Some(DeValue::Array(items)) = root
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == "mcp")
        .map(|(_, v)| v.get_ref())
    else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| item.get_ref().as_table())
        .filter_map(|t| {
            let get = |key: &str| {
                t.iter()
                    .find(|(k, _)| k.get_ref().as_ref() == key)
                    .and_then(|(_, v)| v.get_ref().as_str().map(str::to_owned))
            };
            get("prefix").or_else(|| get("name").map(|n| format!("{n}__")))
        })
        .collect()
}

/// When the file's shape has problems, the rules still run on every section whose shape is
/// right, so that one pass reports all it can.
pub(super) fn check_clean_sections(
    root: &DeTable<'_>,
    dir: &Path,
    host: &[HostTool],
    problems: &mut Problems,
) {
    let dirty = |problems: &Problems, prefix: &str| {
        problems.list().iter().any(|p| {
            p.path == prefix
                || p.path.starts_with(&format!("{prefix}."))
                || p.path.starts_with(&format!("{prefix}["))
        })
    };
    let get = |key: &str| {
        root.iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.clone())
    };
    if let Some(v) = get("model")
        && !dirty(problems, "model")
        && let Ok(model) = ModelSpec::deserialize(ValueDeserializer::from(v))
    {
        check_model(&model, dir, problems);
    }
    if let Some(v) = get("limits")
        && !dirty(problems, "limits")
        && let Ok(limits) = LimitsSpec::deserialize(ValueDeserializer::from(v))
    {
        check_limits(&limits, problems);
    }
    if let Some(v) = get("permissions")
        && !dirty(problems, "permissions")
        && let Ok(permissions) = PermissionsSpec::deserialize(ValueDeserializer::from(v))
    {
        let names = raw_tool_names(root);
        let names: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .chain(host.iter().map(|t| t.name.as_str()))
            .collect();
        let prefixes = raw_mcp_prefixes(root);
        // Only the tools whose shape is right say what their arguments are.
        let items = get("tools");
        let clean: Vec<ToolFileSpec> = items
            .as_ref()
            .and_then(|items| items.get_ref().as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(i, _)| !dirty(problems, &format!("tools[{i}]")))
            .filter_map(|(_, item)| {
                ToolFileSpec::deserialize(ValueDeserializer::from(item.clone())).ok()
            })
            .collect();
        let arguments: Vec<(&str, Option<Vec<String>>)> = clean
            .iter()
            .map(|t| (t.name(), tool_arguments(t)))
            .chain(host.iter().map(|t| (t.name.as_str(), t.arguments.clone())))
            .collect();
        let declared = Declared {
            names: &names,
            mcp_prefixes: &prefixes,
            arguments: &arguments,
        };
        check_permissions(&permissions, &declared, dir, problems);
    }
    let Some(items) = get("tools") else { return };
    let Some(items) = items.get_ref().as_array() else {
        return;
    };
    let parsed: Vec<(String, ToolFileSpec)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| (format!("tools[{i}]"), item))
        .filter(|(path, _)| !dirty(problems, path))
        .filter_map(|(path, item)| {
            ToolFileSpec::deserialize(ValueDeserializer::from(item.clone()))
                .ok()
                .map(|t| (path, t))
        })
        .collect();
    let tools: Vec<(String, &ToolFileSpec)> = parsed.iter().map(|(p, t)| (p.clone(), t)).collect();
    check_tools(&tools, dir, problems);
}

/// The longest timeout an agent file may set: a year, in seconds.
pub(crate) const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// A timeout an agent file may set: positive and at most [`MAX_TIMEOUT_SECS`].
fn valid_seconds(secs: f64) -> bool {
    secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS
}

/// A key of seconds (`path.key`: a timeout, a time to live) that is not [`valid_seconds`].
fn check_seconds(path: &str, key: &str, secs: Option<&Spanned<f64>>, problems: &mut Problems) {
    if let Some(t) = secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            &check::join(path, key),
            span_of(t),
            format!("{key} must be a positive number of seconds, at most a year"),
        );
    }
}

/// The most retries an agent file may give a tool: beyond that a failing tool would only keep a
/// run waiting.
pub(crate) const MAX_TOOL_RETRIES: u32 = 10;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::super::tests::{TWO_TOOLS, load_beside_script, located, problems};
    use super::super::{AgentFile, HostTool};
    use std::path::Path;

    #[test]
    fn builtin_tools_take_their_own_name_and_only_the_keys_they_read() {
        let text = r#"name = "x"
[model]
provider = "openai"
name = "m"
[[tools]]
builtin = "read_file"
[[tools]]
builtin = "rm_rf"
[[tools]]
builtin = "shell"
env = ["OPENAI_API_KEY", "bad name", "CARGO_HOME"]
allow_private = ["127.0.0.1"]
[[tools]]
builtin = "web_fetch"
allow_private = ["http://x", "10.0.0.0/8"]
root = "."
network = true
[[tools]]
builtin = "read_file"
[[tools]]
name = "cmd"
command = ["true"]
root = "."
sandbox = "read-only"
[[tools]]
name = "grep2"
builtin = "grep"
root = "no/such/folder"
description = "mine"
max_results = 0
[[tools]]
builtin = "write_file"
max_bytes = 10
[permissions]
allow = ["read_file", "grep2"]
"#;
        let mut got: Vec<String> = located(text).into_iter().map(|(p, _)| p).collect();
        got.sort();
        assert_eq!(
            got,
            [
                "tools[1].builtin",
                "tools[2].allow_private",
                "tools[2].env[0]",
                "tools[2].env[1]",
                "tools[3].allow_private[0]",
                "tools[3].network",
                "tools[3].root",
                "tools[4].name",
                "tools[6].description",
                "tools[6].max_results",
                "tools[6].root",
                "tools[7].max_bytes",
            ]
        );
    }

    #[test]
    fn a_tool_needs_a_name_unless_it_is_builtin_and_one_kind_only() {
        let text = "name = \"x\"\n[model]\nprovider = \"openai\"\nname = \"m\"\n[[tools]]\ncommand = [\"true\"]\n[[tools]]\nbuiltin = \"glob\"\ncommand = [\"true\"]\n";
        let got = problems(text);
        assert!(got.iter().any(|p| p.path == "tools[0].name"), "{got:?}");
        assert!(
            got.iter().any(|p| p.path == "tools[1].builtin"
                && p.message.contains("not both `command` and `builtin`")),
            "{got:?}"
        );
    }

    #[test]
    fn a_timeout_too_large_for_a_duration_is_a_problem_not_a_panic() {
        for (key, line) in [("limits", 5), ("tools", 8)] {
            let text = if key == "limits" {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n[limits]\ntimeout_secs = 1e300\n".to_owned()
            } else {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\ntimeout_secs = 1e300\n".to_owned()
            };
            let found = problems(&text);
            let p = found
                .iter()
                .find(|p| p.path.ends_with("timeout_secs"))
                .expect("a timeout_secs problem");
            assert_eq!(p.line, line, "{key}");
            assert!(p.message.contains("at most a year"), "{}", p.message);
        }
    }

    #[test]
    fn a_tool_may_have_up_to_ten_retries() {
        let file = |n: u32| {
            format!(
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\nidempotent = true\nretries = {n}\n"
            )
        };
        let found = located(&file(11));
        assert!(
            found.contains(&("tools[0].retries".to_owned(), 9)),
            "{found:?}"
        );
        let too_many = problems(&file(11));
        let retries = too_many
            .iter()
            .find(|p| p.path == "tools[0].retries")
            .unwrap();
        assert!(
            retries.message.contains("at most 10"),
            "{}",
            retries.message
        );
        // Ten is fine (the file's other problems aside).
        assert!(
            problems(&file(10))
                .iter()
                .all(|p| !p.path.ends_with("retries"))
        );
    }

    #[test]
    fn retries_on_a_command_tool_not_marked_idempotent_are_warned_of_not_refused() {
        let text = |more: &str| {
            format!(
                "name = \"p\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"push\"\ncommand = [\"true\"]\n{more}"
            )
        };
        for more in ["retries = 2\n", "retries = 2\nidempotent = false\n"] {
            assert!(
                problems(&text(more))
                    .iter()
                    .all(|p| !p.path.ends_with("retries")),
                "{more:?}"
            );
            let file = load_beside_script(&text(more)).unwrap();
            let warnings = file.warnings();
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(
                warnings[0].starts_with("tools[0].retries: ")
                    && warnings[0].contains("idempotent = true"),
                "{warnings:?}"
            );
        }
        for fine in ["retries = 0\n", "retries = 2\nidempotent = true\n", ""] {
            let file = load_beside_script(&text(fine)).unwrap();
            assert!(file.warnings().is_empty(), "{fine:?}");
        }
    }

    #[test]
    fn rule_problems_are_all_reported_after_the_shape_is_right() {
        let text = r#"name = "x"
[model]
provider = "openai"
script = "s.json"

[[tools]]
name = "bad name"
command = []

[[tools]]
name = "t2"
command = ["echo"]
input_schema = { type = "string" }
"#;
        let got = located(text);
        assert!(got.contains(&("model.name".into(), 3)), "{got:?}");
        assert!(got.contains(&("model.script".into(), 4)), "{got:?}");
        assert!(got.contains(&("tools[0].name".into(), 7)), "{got:?}");
        assert!(got.contains(&("tools[0].command".into(), 8)), "{got:?}");
        assert!(
            got.contains(&("tools[1].input_schema".into(), 13)),
            "{got:?}"
        );
    }

    #[test]
    fn rules_run_on_sections_whose_shape_is_right_even_when_others_are_wrong() {
        let text = r#"name = "x"
colour = "blue"
[model]
provider = "openai"
[[tools]]
name = "bad name"
command = ["echo"]
[[tools]]
name = "t"
command = 5
"#;
        let got = located(text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 2),
                ("model.name".to_owned(), 4),
                ("tools[0].name".to_owned(), 6),
                ("tools[1].command".to_owned(), 10)
            ]
        );
    }

    #[test]
    fn a_scripted_agent_needs_an_existing_script() {
        let got = problems(
            "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"nope.json\"\nbase_url = \"http://x\"\n",
        );
        let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["model.script", "model.base_url"]);
    }

    #[test]
    fn permission_lists_and_rules_name_declared_tools_once() {
        let text = format!(
            r#"{TWO_TOOLS}
[permissions]
default = "ask"
allow = ["shell", "nope"]
deny = ["write", "shell"]
store = ""

[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = {{ field = "path", glob = "**/.env" }}

[[permissions.rules]]
tool = "wirte"
permission = "allow"
command_prefix = {{ field = "command", prefix = " " }}
path_glob = {{ field = "path", glob = "src/[" }}
"#
        );
        let got: Vec<(String, usize, String)> = problems(&text)
            .into_iter()
            .map(|p| (p.path, p.line, p.message))
            .collect();
        let paths: Vec<(&str, usize)> = got.iter().map(|(p, l, _)| (p.as_str(), *l)).collect();
        assert_eq!(
            paths,
            [
                ("permissions.allow[1]", 14),
                ("permissions.deny[1]", 15),
                ("permissions.store", 16),
                ("permissions.rules[1].tool", 24),
                ("permissions.rules[1].command_prefix.prefix", 26),
                ("permissions.rules[1].path_glob", 27),
                ("permissions.rules[1].path_glob.glob", 27),
            ]
        );
        assert!(
            got[0]
                .2
                .contains("no tool named \"nope\" (declared: shell, write)"),
            "{got:?}"
        );
        assert!(got[1].2.contains("already listed in `allow`"), "{got:?}");
    }

    #[test]
    fn permissions_may_name_the_tools_a_program_adds_beside_the_files() {
        // A file of no tools whose permissions name the Python package's `tools=[...]`.
        let text = r#"name = "x"
[model]
provider = "openai"
name = "m"
tool_choice = "delete"
[permissions]
ask = ["delete"]
[[permissions.rules]]
tool = "delete"
permission = "deny"
path_glob = { field = "path", glob = "secrets/**" }
"#;
        let path = Path::new("agent.toml");
        let alone = AgentFile::parse(path, text).unwrap_err().list().to_vec();
        assert!(
            alone
                .iter()
                .any(|p| p.message.contains("no tool named \"delete\"")),
            "{alone:?}"
        );
        let host = |arguments: Option<Vec<String>>| {
            [HostTool {
                name: "delete".to_owned(),
                arguments,
            }]
        };
        let beside = AgentFile::parse_beside(path, text, &host(Some(vec!["path".to_owned()])));
        assert!(beside.is_ok(), "{:?}", beside.err());
        // A rule on an argument the added tool does not take is still refused; one whose
        // arguments are not known is taken.
        let wrong = AgentFile::parse_beside(path, text, &host(Some(vec!["file".to_owned()])))
            .unwrap_err()
            .list()
            .to_vec();
        assert!(
            wrong
                .iter()
                .any(|p| p.path == "permissions.rules[0].path_glob.field"),
            "{wrong:?}"
        );
        assert!(AgentFile::parse_beside(path, text, &host(None)).is_ok());
        // The same with another section wrong: the permissions are still judged with them.
        let dirty = format!("colour = 1\n{text}");
        let got = AgentFile::parse_beside(path, &dirty, &host(None))
            .unwrap_err()
            .list()
            .to_vec();
        assert_eq!(got.len(), 1, "{got:?}");
    }

    #[test]
    fn an_unknown_tool_in_a_list_is_reported_even_when_other_sections_are_wrong() {
        let text = format!("colour = 1\n{TWO_TOOLS}\n[permissions]\ndeny = [\"shel\"]\n");
        let got = located(&text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 1),
                ("permissions.deny[0]".to_owned(), 14)
            ]
        );
    }

    #[test]
    fn an_unreadable_permission_store_is_a_problem_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.json"), "{ not json").unwrap();
        let text = format!("{TWO_TOOLS}\n[permissions]\nstore = \"p.json\"\n");
        let got = AgentFile::parse(&dir.path().join("agent.toml"), &text)
            .unwrap_err()
            .list()
            .to_vec();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].path.as_str(), got[0].line),
            ("permissions.store", 13)
        );
        assert!(got[0].message.contains("permission store"), "{got:?}");
    }
}
