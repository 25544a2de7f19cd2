//! `[[mcp]]`: each server's name, transport, keys, timeout, prefix, renames, templates and
//! output bound.

use std::path::Path;

use super::tools::{check_command, check_process_sandbox};
use super::{MAX_TIMEOUT_SECS, span_of, valid_seconds};
use crate::agent_file::check::{Problems, join};
use crate::agent_file::spec::McpFileSpec;

/// `[[mcp]]`: a name a tool name may start with, used once; a command or a URL, not both, with
/// only the keys its kind takes; a timeout, a prefix and renames that make valid names; templates
/// that expand; an output bound of at least 1 byte.
pub(super) fn check_mcp(servers: &[McpFileSpec], dir: &Path, problems: &mut Problems) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let path = format!("mcp[{i}]");
        let name = server.name.get_ref().as_str();
        if let Err(reason) = agentloop::tool::check_tool_name(name) {
            problems.at(
                &join(&path, "name"),
                span_of(&server.name),
                format!("invalid MCP server name {name:?}: {reason}"),
            );
        } else if seen.contains(&name) {
            problems.at(
                &join(&path, "name"),
                span_of(&server.name),
                format!("the MCP server name {name:?} is used twice"),
            );
        }
        seen.push(name);
        check_transport(server, &path, dir, problems);
        check_sandbox(server, &path, problems);
        check_templates(server, name, &path, problems);
        check_names_and_timeout(server, &path, problems);
        check_output_bound(server, &path, problems);
        check_protocol_version(server, &path, problems);
    }
}

/// Names that two tools would have, as far as the file says: a rename to the name of one of the
/// agent's own tools (`own`) or of another rename, and a prefix that another server's tools
/// have too (an explicit one, or a server's default `NAME__`). A run keeps the first tool of a
/// name and leaves the other out; found here, it is a problem of the file instead. Two servers
/// with `prefix = ""` are not: whether their tools' names meet is known when they list them.
pub(super) fn check_mcp_collisions(servers: &[McpFileSpec], own: &[&str], problems: &mut Problems) {
    let mut renamed: Vec<(&str, &str, &str)> = Vec::new();
    let mut prefixes: Vec<(String, &str)> = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let path = format!("mcp[{i}]");
        let name = server.name.get_ref().as_str();
        let default = format!("{name}__");
        let prefix = server
            .prefix
            .as_ref()
            .map_or(default.as_str(), |p| p.get_ref().as_str());
        if !prefix.is_empty() {
            if let Some((_, other)) = prefixes.iter().find(|(p, _)| p == prefix) {
                let (key, span) = match &server.prefix {
                    Some(p) => ("prefix", span_of(p)),
                    None => ("name", span_of(&server.name)),
                };
                problems.at(
                    &join(&path, key),
                    span,
                    format!(
                        "the tools of {name} would be named {prefix}TOOL, as those of {other} are: \
                         a tool of each with one name would collide; give one a `prefix` of its own"
                    ),
                );
            }
            prefixes.push((prefix.to_owned(), name));
        }
        let Some(rename) = &server.rename else {
            continue;
        };
        for (from, to) in rename.get_ref() {
            let taken = if own.contains(&to.as_str()) {
                Some(format!("the agent's tool {to:?}"))
            } else {
                renamed
                    .iter()
                    .find(|(_, _, t)| *t == to)
                    .map(|(s, f, _)| format!("{s}'s {f:?}, renamed so too"))
            };
            if let Some(taken) = taken {
                problems.at(
                    &join(&path, "rename"),
                    span_of(rename),
                    format!(
                        "the new name {to:?} of {from:?} is taken by {taken}: two tools would have \
                         one name"
                    ),
                );
            }
            renamed.push((name, from, to));
        }
    }
}

/// `protocol_version`: one of the versions the client speaks (the library refuses another too,
/// but only when the server starts).
fn check_protocol_version(server: &McpFileSpec, path: &str, problems: &mut Problems) {
    if let Some(version) = &server.protocol_version
        && !agentloop_mcp::PROTOCOL_VERSIONS.contains(&version.get_ref().as_str())
    {
        problems.at(
            &join(path, "protocol_version"),
            span_of(version),
            format!(
                "unknown MCP protocol_version {:?}: one of {}",
                version.get_ref(),
                agentloop_mcp::PROTOCOL_VERSIONS.join(", ")
            ),
        );
    }
}

/// `max_output_bytes`: 0 would leave the model nothing of any result (the library refuses it
/// too, but only when the server starts; here it is found with the file's other problems).
fn check_output_bound(server: &McpFileSpec, path: &str, problems: &mut Problems) {
    if let Some(max) = &server.max_output_bytes
        && *max.get_ref() == 0
    {
        problems.at(
            &join(path, "max_output_bytes"),
            span_of(max),
            "max_output_bytes must be at least 1: it is the most bytes of a result the model reads",
        );
    }
}

/// `command` or `url`, not both, and `env` only with a command.
fn check_transport(server: &McpFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    match (&server.command, &server.url) {
        (Some(command), None) => check_command(command, path, dir, problems),
        (None, Some(url)) => {
            let u = url.get_ref();
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                problems.at(
                    &join(path, "url"),
                    span_of(url),
                    format!("the url {u:?} is not http:// or https://"),
                );
            }
        }
        (Some(_), Some(url)) => problems.at(
            &join(path, "url"),
            span_of(url),
            "give `command` (a stdio server) or `url` (a streamable HTTP server), not both",
        ),
        (None, None) => problems.at(
            path,
            span_of(&server.name),
            "give `command` (a stdio server) or `url` (a streamable HTTP server)",
        ),
    }
    if let (Some(env), None) = (&server.env, &server.command) {
        problems.at(
            &join(path, "env"),
            span_of(env),
            "`env` is for a stdio server (`command`)",
        );
    }
}

/// The sandbox keys: for a stdio server only, as they sandbox its process.
fn check_sandbox(server: &McpFileSpec, path: &str, problems: &mut Problems) {
    if server.url.is_some() {
        for (key, given) in [
            ("sandbox", server.sandbox.is_some()),
            ("network", server.network.is_some()),
            ("unix_sockets", server.unix_sockets.is_some()),
            ("resources", server.resources.is_some()),
        ] {
            if given {
                problems.at(
                    &join(path, key),
                    span_of(&server.name),
                    format!("`{key}` is for a stdio server (`command`): it sandboxes its process"),
                );
            }
        }
    }
    check_process_sandbox(
        server.sandbox,
        server.network.as_ref(),
        server.unix_sockets.as_ref(),
        server.resources.as_ref(),
        path,
        problems,
    );
}

/// `headers` for an HTTP server only, and the shapes of the `env` and `headers` templates (their
/// variables are read when the server starts).
fn check_templates(server: &McpFileSpec, name: &str, path: &str, problems: &mut Problems) {
    if let (Some(headers), None) = (&server.headers, &server.url) {
        problems.at(
            &join(path, "headers"),
            span_of(headers),
            "`headers` is for an HTTP server (`url`)",
        );
    }
    for (key, map) in [("env", &server.env), ("headers", &server.headers)] {
        let Some(map) = map else { continue };
        for (k, template) in map.get_ref() {
            // Only the shape is checked here: the variables are read when the server starts.
            if let Err(e) =
                agentloop_mcp::expand_template(name, k, template, |_| Some(String::new()))
            {
                problems.at(&join(path, key), span_of(map), e.to_string());
            }
        }
    }
}

/// The timeout, and the prefix and renames that make the server's tool names.
fn check_names_and_timeout(server: &McpFileSpec, path: &str, problems: &mut Problems) {
    if let Some(secs) = &server.timeout_secs
        && !valid_seconds(*secs.get_ref())
    {
        problems.at(
            &join(path, "timeout_secs"),
            span_of(secs),
            format!("the timeout must be more than 0 and at most {MAX_TIMEOUT_SECS} seconds"),
        );
    }
    if let Some(prefix) = &server.prefix
        && !prefix.get_ref().is_empty()
        && let Err(reason) = agentloop::tool::check_tool_name(&format!("{}x", prefix.get_ref()))
    {
        problems.at(
            &join(path, "prefix"),
            span_of(prefix),
            format!("the prefix cannot start a tool name: {reason}"),
        );
    }
    if let Some(rename) = &server.rename {
        for (from, to) in rename.get_ref() {
            if let Err(reason) = agentloop::tool::check_tool_name(to) {
                problems.at(
                    &join(path, "rename"),
                    span_of(rename),
                    format!("the new name of {from:?} is not a valid tool name: {reason}"),
                );
            }
        }
    }
}
