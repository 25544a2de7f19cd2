//! What declares a server ([`ServerConfig`]): how to reach it, how its tools are named, how long
//! a call may take and whether it is started again after it dies. Values that may be secrets
//! (environment values, header values) are templates over this process's environment
//! (`"Bearer ${TOKEN}"`), expanded only when the server is started, so that a config can be shown
//! and logged without them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::McpError;

/// The default time a call (and the server's start) may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The default bound of what one call's result hands the model, in bytes (64 KiB): the command
/// tool's stdout bound, since a server's output is as untrusted as a program's.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = agentloop_tools::DEFAULT_MAX_OUTPUT_BYTES;

/// The least bound on one message a server sends, in bytes (16 MiB, rmcp's own default for a
/// stdio line and an HTTP answer): see [`ServerConfig::max_message_bytes`].
pub const MIN_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How many times a server that died is started again before its tools give up (counted
/// afresh after a connection that ran healthy for 10 minutes).
pub const MAX_RESTARTS: u32 = 5;

/// The MCP versions a server's `protocol_version` may name, oldest first: those before
/// 2026-07-28 open with the `initialize` handshake, 2026-07-28 is stateless (`server/discover`,
/// then each request carries its own `_meta`).
pub const PROTOCOL_VERSIONS: &[&str] = &[
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// How to reach a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// Variables set for it, as templates (`"${GITHUB_TOKEN}"`). Beside them it sees only
        /// the shell tool's allow list (`PATH`, `HOME`, ...), never an API key.
        env: BTreeMap<String, String>,
        /// Its working folder (this process's otherwise), which is also the folder it may
        /// write under `workspace-write`.
        cwd: Option<PathBuf>,
        /// Its sandbox (default `workspace-write`, no network).
        sandbox: agentloop_sandbox::SandboxPolicy,
        /// Paths under its working folder it may not write, replace or remove (the agent's own
        /// files: `agentloop_sandbox::Sandbox::read_only`); it may write the rest.
        read_only: Vec<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint's URL.
        url: String,
        /// Headers sent with every request, as templates (`"Bearer ${TOKEN}"`).
        headers: BTreeMap<String, String>,
    },
}

/// Whether a server that died is started again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Restart {
    /// Never: its tools answer with an error from then on.
    #[default]
    Never,
    /// On the next call after it died, up to [`MAX_RESTARTS`] times.
    OnFailure,
}

/// One declared server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name: in its tools' names, errors and logs.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Whether it is started again after it dies.
    pub restart: Restart,
    /// How long one call, and the server's start, may take.
    pub timeout: Duration,
    /// Put before each tool's name (`"{name}__"` when `None`; `""` keeps the server's names).
    pub prefix: Option<String>,
    /// Names for some of its tools, by the server's name: used as they are, without the prefix.
    pub rename: BTreeMap<String, String>,
    /// Whether the server's word about its tools is believed: only then does a tool it calls
    /// read-only (`readOnlyHint`) or idempotent (`idempotentHint`) run again after a crash, or
    /// count as not mutating. Default false: a server is another program, and a wrong hint would
    /// repeat a side effect.
    pub trust_hints: bool,
    /// The most bytes a call's result hands the model, the run's record and its journal
    /// (default [`DEFAULT_MAX_OUTPUT_BYTES`]; 0 is refused): longer text (an error's too) keeps
    /// its head and tail with a note of what was cut, structured content beyond it is handed as
    /// its JSON text, so cut. Images have a bound of their own (5 MiB of base64 together, or this
    /// one when larger), and one past it is named instead of sent. A server is another program, and 500 MB of answer would otherwise be kept and sent
    /// whole.
    pub max_output_bytes: usize,
    /// The MCP version spoken with it, one of [`PROTOCOL_VERSIONS`]. `None` (the default)
    /// negotiates: 2026-07-28 is offered with `server/discover`, and a server that answers it
    /// with an error (or not within 10 s) is spoken to with the `initialize` handshake at
    /// 2025-11-25 or the older version it answers. A version before 2026-07-28 skips the probe
    /// and offers that version to `initialize` (the server may answer an older one); 2026-07-28
    /// speaks only that, and a server without it fails to start. For a server that stalls or
    /// dies on a request it does not know before `initialize`, or whose newer wire misbehaves.
    pub protocol_version: Option<String>,
}

impl ServerConfig {
    /// A stdio server with the defaults: tools named `name__tool`, no restart, a minute a call.
    pub fn stdio(name: impl Into<String>, command: Vec<String>) -> Self {
        Self::with_transport(
            name,
            Transport::Stdio {
                command,
                env: BTreeMap::new(),
                cwd: None,
                sandbox: agentloop_sandbox::SandboxPolicy::default(),
                read_only: Vec::new(),
            },
        )
    }

    /// A streamable HTTP server with the defaults.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::with_transport(
            name,
            Transport::Http {
                url: url.into(),
                headers: BTreeMap::new(),
            },
        )
    }

    fn with_transport(name: impl Into<String>, transport: Transport) -> Self {
        ServerConfig {
            name: name.into(),
            transport,
            restart: Restart::Never,
            timeout: DEFAULT_TIMEOUT,
            prefix: None,
            rename: BTreeMap::new(),
            trust_hints: false,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            protocol_version: None,
        }
    }

    /// The most bytes one message from the server may take (a line over stdio; an HTTP answer,
    /// or one event of its stream): [`MIN_MESSAGE_BYTES`], or four times `max_output_bytes` when
    /// that is more (a result's text escaped as JSON, beside its structured content). A message
    /// is read into memory whole before `max_output_bytes` cuts it, so a server that answers
    /// without end would otherwise hold this process's memory: past the bound the call fails
    /// `mcp.message_too_large` (over stdio the connection ends too, as its framing is lost; an
    /// event of an HTTP stream ends that stream, which rmcp tells the call only as a failed
    /// request, `mcp.request`).
    pub fn max_message_bytes(&self) -> usize {
        MIN_MESSAGE_BYTES.max(self.max_output_bytes.saturating_mul(4))
    }

    /// The name the model calls a server's tool by: its rename, or the prefix and the server's
    /// name with any character a tool name may not hold replaced by `_`.
    pub fn tool_name(&self, remote: &str) -> String {
        if let Some(name) = self.rename.get(remote) {
            return name.clone();
        }
        let mut out = self.tool_prefix();
        out.extend(remote.chars().map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        }));
        out
    }
}

impl ServerConfig {
    /// What goes before the server's name of a tool: `prefix`, else `NAME__`.
    fn tool_prefix(&self) -> String {
        match &self.prefix {
            Some(p) => p.clone(),
            None => format!("{}__", self.name),
        }
    }

    /// The name the model calls a tool by that `name` gives as the server's own name under the
    /// prefix (`fs__list_directory` for a tool renamed `ls`, `fs__get.user` for `fs__get_user`),
    /// when that differs from `name`: a permission written so is meant for that tool.
    pub fn tool_named_by_server_name(&self, name: &str) -> Option<String> {
        let remote = name.strip_prefix(self.tool_prefix().as_str())?;
        let ours = (!remote.is_empty()).then(|| self.tool_name(remote))?;
        (ours != name).then_some(ours)
    }
}

/// Two MCP tools that would have one name in a run: the later listed is left out, so that the
/// spec the model and the permission gates see and the handler a call runs are always one
/// tool's. Within a server, its naming gave two of its tools one name (`get.user` and
/// `get_user` are both `srv__get_user`; two renames to one name); across servers, two servers'
/// tools have one name (empty or equal prefixes, renames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameCollision {
    /// The name both would have.
    pub name: String,
    /// The server of the tool kept: the first listed (servers in declaration order).
    pub kept_server: String,
    /// That server's own name of the tool kept.
    pub kept_tool: String,
    /// The server of the tool left out.
    pub dropped_server: String,
    /// That server's own name of the tool left out.
    pub dropped_tool: String,
}

impl std::fmt::Display for NameCollision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let NameCollision {
            name,
            kept_server,
            kept_tool,
            dropped_server,
            dropped_tool,
        } = self;
        write!(
            f,
            "the MCP tools {dropped_tool:?} of {dropped_server} and {kept_tool:?} of \
             {kept_server} would both be named {name}: {dropped_tool:?} is left out, as it is \
             listed later"
        )
    }
}

impl ServerConfig {
    /// The names of a listing's tools, in the server's order ([`ServerConfig::tool_name`]):
    /// `None` for a tool whose name an earlier tool of the listing has, which is left out, with
    /// the collision that says so.
    pub fn tool_names<'a>(
        &self,
        remotes: impl IntoIterator<Item = &'a str>,
    ) -> (Vec<Option<String>>, Vec<NameCollision>) {
        let mut names = Vec::new();
        let mut collisions = Vec::new();
        let mut first: BTreeMap<String, &'a str> = BTreeMap::new();
        for remote in remotes {
            let name = self.tool_name(remote);
            match first.get(&name) {
                Some(kept) => {
                    collisions.push(NameCollision {
                        name,
                        kept_server: self.name.clone(),
                        kept_tool: (*kept).to_owned(),
                        dropped_server: self.name.clone(),
                        dropped_tool: remote.to_owned(),
                    });
                    names.push(None);
                }
                None => {
                    first.insert(name.clone(), remote);
                    names.push(Some(name));
                }
            }
        }
        (names, collisions)
    }
}

/// Expands `${VAR}` in a template from the environment `lookup` reads. A variable that is not
/// set is an error naming it (never a value); `$$` is a `$`.
pub fn expand_template(
    server: &str,
    key: &str,
    template: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, McpError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(rest.get(..at).unwrap_or_default());
        let after = rest.get(at + 1..).unwrap_or_default();
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                return Err(McpError::Template {
                    server: server.to_owned(),
                    key: key.to_owned(),
                    reason: "a `${` without its `}`".into(),
                });
            };
            let var = inner.get(..end).unwrap_or_default();
            let value = lookup(var).ok_or_else(|| McpError::MissingEnv {
                server: server.to_owned(),
                key: key.to_owned(),
                var: var.to_owned(),
            })?;
            out.push_str(&value);
            rest = inner.get(end + 1..).unwrap_or_default();
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The variables a template reads, for those who show a config without its values.
pub fn template_vars(template: &str) -> Vec<String> {
    let mut vars = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        let inner = rest.get(at + 2..).unwrap_or_default();
        let Some(end) = inner.find('}') else { break };
        vars.push(inner.get(..end).unwrap_or_default().to_owned());
        rest = inner.get(end + 1..).unwrap_or_default();
    }
    vars
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(var: &str) -> Option<String> {
        (var == "TOKEN").then(|| "s3cret".to_owned())
    }

    #[test]
    fn templates_expand_variables_and_a_missing_one_is_named_without_values() {
        assert_eq!(
            expand_template("s", "Authorization", "Bearer ${TOKEN}", env).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand_template("s", "k", "a$$b $x", env).unwrap(), "a$b $x");
        let err = expand_template("s", "X-Key", "${NOPE}", env).unwrap_err();
        assert_eq!(err.code(), "mcp.missing_env");
        assert!(err.to_string().contains("NOPE"));
        assert_eq!(template_vars("Bearer ${TOKEN} ${B}"), ["TOKEN", "B"]);
    }

    #[test]
    fn tool_names_take_the_prefix_or_a_rename_and_lose_characters_a_name_may_not_hold() {
        let mut c = ServerConfig::stdio("fs", vec!["x".into()]);
        assert_eq!(c.tool_name("read_file"), "fs__read_file");
        assert_eq!(c.tool_name("a.b/c"), "fs__a_b_c");
        c.prefix = Some(String::new());
        assert_eq!(c.tool_name("read_file"), "read_file");
        c.rename.insert("read_file".into(), "read".into());
        assert_eq!(c.tool_name("read_file"), "read");
    }

    #[test]
    fn a_tool_named_by_the_server_s_name_is_found_under_the_model_s_name() {
        let mut c = ServerConfig::stdio("fs", vec!["x".into()]);
        c.rename.insert("list_directory".into(), "ls".into());
        let named = |n: &str| c.tool_named_by_server_name(n);
        assert_eq!(named("fs__list_directory").as_deref(), Some("ls"));
        assert_eq!(named("fs__get.user").as_deref(), Some("fs__get_user"));
        assert_eq!(named("fs__read_file"), None, "already the model's name");
        assert_eq!(named("fs__"), None);
        assert_eq!(named("shell"), None, "not under the prefix");
    }

    #[test]
    fn collide_two_tools_of_a_server_named_alike_keep_the_first_listed() {
        let mut c = ServerConfig::stdio("srv", vec!["x".into()]);
        c.rename.insert("fetch".into(), "srv__get_user".into());
        let (names, collisions) = c.tool_names(["get.user", "list", "get_user", "fetch"]);
        assert_eq!(
            names,
            [
                Some("srv__get_user".to_owned()),
                Some("srv__list".into()),
                None,
                None
            ]
        );
        assert_eq!(collisions.len(), 2);
        assert_eq!(
            collisions[0].to_string(),
            "the MCP tools \"get_user\" of srv and \"get.user\" of srv would both be named \
             srv__get_user: \"get_user\" is left out, as it is listed later"
        );
        assert_eq!(collisions[1].dropped_tool, "fetch");
    }
}
