//! An agent file's part of its agent's definition, and the definition's fingerprint, computed
//! once per file however deep the tree of subagents goes.

use std::sync::Arc;

use agentloop::{permissions::Permission, testing::ScriptedModel};
use serde_json::json;

use crate::agent_file::AgentFile;

use crate::error::CliError;

use super::builtin_options;
use super::permissions::permission_rules;
use super::servers::mcp_configs;
use super::{Kids, builder};

/// What the agent file adds to the agent's definition (its fingerprint): what the core cannot
/// see for itself, the tools' commands (and the built-in tools' options), the permissions and
/// the version.
pub fn definition_parts(file: &AgentFile) -> Vec<(&'static str, serde_json::Value)> {
    let commands: serde_json::Map<String, serde_json::Value> = file
        .tools()
        .iter()
        .map(|t| {
            let how = match (&t.command, &t.agent, &t.builtin) {
                (None, None, None) if t.a2a.is_some() => {
                    let mut how = serde_json::Map::new();
                    how.insert(
                        "a2a".into(),
                        json!(
                            t.a2a
                                .as_ref()
                                .map(|u| agentloop::url_secrets::shown(u.get_ref()))
                        ),
                    );
                    // Only where given: a file without it keeps the definition it had.
                    if let Some(max) = &t.max_bytes {
                        how.insert("max_bytes".into(), json!(max.get_ref()));
                    }
                    serde_json::Value::Object(how)
                }
                (Some(c), _, _) => json!(c.get_ref()),
                // A change in the subagent's file changes this agent's definition too.
                (None, Some(a), _) => json!({
                    "agent": a.get_ref(),
                    "fingerprint": file
                        .subagent(t.name())
                        .and_then(|child| fingerprint(child).ok()),
                }),
                (None, None, Some(b)) => {
                    let o = builtin_options(file, t);
                    json!({
                        "builtin": b.get_ref(),
                        "root": t.root.as_ref().map(|r| r.get_ref()),
                        "max_bytes": o.max_bytes,
                        "max_results": o.max_results,
                        "timeout_secs": o.timeout.map(|d| d.as_secs_f64()),
                        "allow_private": o.allow_private,
                        "env": o.env,
                    })
                }
                (None, None, None) => serde_json::Value::Null,
            };
            (t.name().to_owned(), how)
        })
        .collect();
    let permissions = file.permissions().map(|p| {
        json!({
            "default": p.default.unwrap_or(Permission::Allow),
            "rules": permission_rules(file),
        })
    });
    let m = file.model();
    let model = json!({
        "provider": m.provider.get_ref().as_str(),
        "name": m.name.as_ref().map(|n| n.get_ref()),
        // The journal keeps the definition whole: the server, not a credential in its URL (a
        // changed key is not a changed agent either).
        "base_url": m.base_url.as_ref().map(|u| agentloop::url_secrets::shown(u.get_ref())),
    });
    let mut parts = vec![
        ("model", model),
        ("commands", serde_json::Value::Object(commands)),
        ("permissions", json!(permissions)),
    ];
    if !file.mcp().is_empty() {
        let mut mcp = mcp_declarations(file);
        // A server's sandbox bounds what the host lets it do, not what the agent is (as for
        // tools): it stays out of the fingerprint.
        for server in mcp.as_array_mut().into_iter().flatten() {
            if let Some(transport) = server
                .get_mut("transport")
                .and_then(serde_json::Value::as_object_mut)
            {
                transport.remove("sandbox");
            }
        }
        parts.push(("mcp", mcp));
    }
    if let Some(v) = &file.spec.version {
        parts.push(("version", json!(v)));
    }
    if let Some(h) = crate::handoff::definition(file) {
        parts.push(("handoffs", h));
    }
    parts
}

/// What the `[[mcp]]` entries declare, as `plan` shows it and the fingerprint holds it: the
/// variables templates read, never their values.
pub fn mcp_declarations(file: &AgentFile) -> serde_json::Value {
    let vars = |map: &std::collections::BTreeMap<String, String>| -> serde_json::Value {
        map.iter()
            .map(|(k, v)| (k.clone(), json!(agentloop_mcp::template_vars(v))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let deferred: Vec<&str> = file
        .mcp()
        .iter()
        .filter(|m| m.defer == Some(true))
        .map(|m| m.name.get_ref().as_str())
        .collect();
    mcp_configs(file)
        .iter()
        .map(|c| {
            let how = match &c.transport {
                agentloop_mcp::Transport::Stdio {
                    command,
                    env,
                    sandbox,
                    ..
                } => {
                    json!({"command": command, "env_reads": vars(env), "sandbox": sandbox})
                }
                agentloop_mcp::Transport::Http { url, headers } => {
                    json!({"url": agentloop::url_secrets::shown(url), "headers_read": vars(headers)})
                }
            };
            let mut server = json!({
                "name": c.name,
                "transport": how,
                "restart": match c.restart {
                    agentloop_mcp::Restart::OnFailure => "on-failure",
                    _ => "never",
                },
                "timeout_secs": c.timeout.as_secs_f64(),
                "tools_named": format!("{}*", c.tool_name("")),
                "rename": c.rename,
                "trust_hints": c.trust_hints,
            });
            if deferred.contains(&c.name.as_str())
                && let Some(map) = server.as_object_mut()
            {
                // Only when set: the fingerprints of files without it stay as they were.
                map.insert("deferred".into(), json!(true));
            }
            if c.max_output_bytes != agentloop_mcp::DEFAULT_MAX_OUTPUT_BYTES
                && let Some(map) = server.as_object_mut()
            {
                // What the model reads of a result, so part of the definition; only when not the
                // default, so that the fingerprints of files without it stay as they were.
                map.insert("max_output_bytes".into(), json!(c.max_output_bytes));
            }
            if let Some(version) = &c.protocol_version
                && let Some(map) = server.as_object_mut()
            {
                // Only when pinned, as above.
                map.insert("protocol_version".into(), json!(version));
            }
            server
        })
        .collect::<Vec<_>>()
        .into()
}

/// The agent's definition fingerprint, as a journaled run of it records it; needs no
/// credentials (the model's part of the definition is the file's `[model]`).
pub fn fingerprint(file: &AgentFile) -> Result<String, CliError> {
    // A file's definition holds each subagent's fingerprint, and building it builds each subagent
    // too, which computes its own subagents' fingerprints again: twice per level, so a chain of
    // 30 files took 2^30 builds (an endless hang). Each file's fingerprint is computed once per
    // outermost call instead.
    let memo = FingerprintMemo::enter();
    if let Some(hit) = memo.get(file) {
        return Ok(hit);
    }
    let stand_in = Arc::new(ScriptedModel::new([]));
    let print = builder(file, stand_in, None, Kids::StandIn)?
        .definition()
        .fingerprint();
    memo.put(file, &print);
    Ok(print)
}

thread_local! {
    /// The fingerprints computed during the outermost [`fingerprint`] call on this thread, by the
    /// address of their file; `None` outside one.
    static FINGERPRINTS: std::cell::RefCell<Option<Vec<(usize, String)>>> =
        const { std::cell::RefCell::new(None) };
}

/// A scope of [`FINGERPRINTS`]: the outermost one clears it when it ends (a panic included).
/// Addresses are sound keys within it: the outermost call borrows the whole tree of files, so
/// none can move, change or be freed (and another take its address) before the memo is cleared.
struct FingerprintMemo {
    outermost: bool,
}

impl FingerprintMemo {
    fn enter() -> FingerprintMemo {
        let outermost =
            FINGERPRINTS.with_borrow_mut(|m| m.is_none().then(|| *m = Some(Vec::new())).is_some());
        FingerprintMemo { outermost }
    }

    fn key(file: &AgentFile) -> usize {
        std::ptr::from_ref(file) as usize
    }

    fn get(&self, file: &AgentFile) -> Option<String> {
        let key = Self::key(file);
        FINGERPRINTS.with_borrow(|m| {
            m.as_ref()
                .and_then(|all| all.iter().find(|(k, _)| *k == key))
                .map(|(_, print)| print.clone())
        })
    }

    fn put(&self, file: &AgentFile, print: &str) {
        let key = Self::key(file);
        FINGERPRINTS.with_borrow_mut(|m| {
            if let Some(all) = m {
                all.push((key, print.to_owned()));
            }
        });
    }
}

impl Drop for FingerprintMemo {
    fn drop(&mut self) {
        if self.outermost {
            FINGERPRINTS.with_borrow_mut(|m| *m = None);
        }
    }
}
