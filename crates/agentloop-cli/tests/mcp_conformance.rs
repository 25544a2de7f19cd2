#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! agentloop judged by the official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! pinned in `scripts/mcp/` and installed by `scripts/mcp/install.sh`), on loopback, no key.
//!
//! The server: `agentloop mcp serve --tools --http 127.0.0.1:0` serves an agent file's tools named
//! as the suite's scenarios call them (command tools, and two tools of an `[[mcp]]` server,
//! `scripts/mcp/conformance_tools.py`, so that an image and progress cross agentloop's MCP client
//! and server both). The suite's server scenarios run in one invocation per wire: 2025-11-25
//! (the `initialize` handshake and sessions) and 2026-07-28 (stateless, per-request `_meta`).
//! The client: `scripts/mcp/conformance_client.py` drives agentloop's own MCP client through the
//! `agentloop` command (`mcp list`, and a `run` of a scripted agent that makes the scenario's
//! calls), in one invocation per wire: the client negotiates (no `protocol_version` pinned), so
//! at 2025-11-25 the suite's servers, which know nothing of `server/discover`, are reached by its
//! fallback to `initialize`, and at 2026-07-28 by discovery (the script fails a scenario whose
//! negotiated version is not the suite's).
//!
//! Every scenario the suite runs is named below: applicable (each of its checks passes, but the
//! few waived with their reason) or skipped with why. A scenario a newer suite adds fails the
//! test until it is sorted into one or the other.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::*;

/// Server scenarios about what agentloop's server does not offer, and why.
const SERVER_SKIPPED: &[(&str, &str)] = &[
    (
        "logging-set-level",
        "no `logging` capability: runs report progress, not logs",
    ),
    ("tools-call-with-logging", "no `logging` capability"),
    (
        "completion-complete",
        "no prompts or resource templates, so nothing to complete",
    ),
    ("resources-", "no resources"),
    ("sep-2164-resource-not-found", "no resources"),
    ("prompts-", "no prompts"),
    (
        "tools-call-audio",
        "agentloop's tool results hold text, JSON and images (what models read): its MCP \
         client turns audio into a line of text, so a served tool has no audio to answer",
    ),
    (
        "tools-call-embedded-resource",
        "as audio: an embedded resource is text at agentloop's client",
    ),
    (
        "tools-call-mixed-content",
        "its embedded resource, as above (its text and image pass)",
    ),
    (
        "tools-call-sampling",
        "the server never asks its client's model (no sampling)",
    ),
    (
        "tools-call-elicitation",
        "the server elicits only an approval of a call its permissions ask about (one boolean, \
         tested in mcp_serve.rs), not the scenario's form",
    ),
    ("elicitation-sep1034-defaults", "as tools-call-elicitation"),
    ("elicitation-sep1330-enums", "as tools-call-elicitation"),
    (
        "input-required-result-",
        "tools that ask their client for input in rounds (2026-07-28): agentloop's asks nothing \
         but approvals",
    ),
    (
        "http-custom-header-server-validation",
        "tools with `x-mcp-header` parameters: agentloop's served tools declare none",
    ),
];

/// Server scenarios that apply to a server of tools, by wire.
const SERVER_APPLICABLE: &[(&str, &[&str])] = &[
    (
        "2025-11-25",
        &[
            "server-initialize",
            "server-session-lifecycle",
            "ping",
            "tools-list",
            "tools-call-simple-text",
            "tools-call-image",
            "tools-call-error",
            "tools-call-with-progress",
            "json-schema-2020-12",
            "server-sse-polling",
            "server-sse-multiple-streams",
            "dns-rebinding-protection",
        ],
    ),
    (
        "2026-07-28",
        &[
            "server-stateless",
            "tools-list",
            "tools-call-simple-text",
            "tools-call-image",
            "tools-call-error",
            "tools-call-with-progress",
            "json-schema-2020-12",
            "server-sse-multiple-streams",
            "dns-rebinding-protection",
            "caching",
            "http-header-validation",
        ],
    ),
];

/// Checks of applicable scenarios that are about what the server does not offer, and why.
const SERVER_WAIVED: &[(&str, &str, &str)] = &[
    (
        "server-sse-polling",
        "server-sse-disconnect-resume",
        "needs the fixture's `test_reconnection`, a tool that closes its own stream mid-call (the \
         priming event and `retry` checks pass)",
    ),
    (
        "server-stateless",
        "sep-2575-server-rejects-undeclared-capability",
        "its `test_missing_capability` needs sampling, which the server never uses",
    ),
    (
        "server-stateless",
        "sep-2575-missing-capability-http-400",
        "as above",
    ),
    (
        "server-stateless",
        "sep-2575-http-server-no-independent-requests-on-stream",
        "its `test_streaming_elicitation` asks the fixture's form",
    ),
    (
        "server-stateless",
        "sep-2575-server-no-log-without-loglevel",
        "its `test_logging_tool` logs: no logging here",
    ),
    (
        "caching",
        "sep-2549-prompts-list-caching-hints",
        "no prompts",
    ),
    (
        "caching",
        "sep-2549-resources-list-caching-hints",
        "no resources",
    ),
    (
        "caching",
        "sep-2549-resources-templates-list-caching-hints",
        "no resources",
    ),
];

/// Client scenarios about what agentloop's client does not do, and why.
const CLIENT_SKIPPED: &[(&str, &str)] = &[
    (
        "elicitation-sep1034-client-defaults",
        "agentloop's client declares no elicitation: an agent's run has nobody to fill in a \
         server's form",
    ),
    (
        "sep-2322-client-request-state",
        "a tool that asks its client for input in rounds (an elicitation, 2026-07-28): as \
         above, agentloop's client has nobody to answer, and such a call is an \
         `mcp.input_required` error result",
    ),
    (
        "auth/",
        "agentloop's client sends the agent file's headers (a token from the environment), no \
         OAuth flow",
    ),
];

/// Client scenarios that apply to a client of tools, by wire.
const CLIENT_APPLICABLE: &[(&str, &[&str])] = &[
    (
        "2025-11-25",
        &[
            "initialize",
            "tools_call",
            "sse-retry",
            "json-schema-2020-12-preservation",
        ],
    ),
    (
        "2026-07-28",
        &[
            "tools_call",
            "request-metadata",
            "http-standard-headers",
            "http-custom-headers",
            "http-invalid-tool-headers",
            "json-schema-ref-no-deref",
            "json-schema-2020-12-preservation",
        ],
    ),
];

/// A check whose WARNING the suite itself does not count as a failure: the reconnection came a
/// little past `retry`, which a busy machine can make so.
const CLIENT_WAIVED: &[(&str, &str, &str)] = &[(
    "sse-retry",
    "client-sse-retry-timing",
    "late by a busy machine's scheduling",
)];

/// The agent file whose tools the server scenarios call.
fn tools_agent() -> AgentDir {
    let fixture = repo().join("scripts/mcp/conformance_tools.py");
    let dir = AgentDir::new(&format!(
        r##"name = "conformance"
description = "The tools of the MCP conformance suite's server scenarios."

[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "test_simple_text"
description = "Answers a simple text."
command = ["python3", "-c", "print('This is a simple text response for testing.')"]
input_schema = {{ type = "object", properties = {{}} }}

[[tools]]
name = "test_error_handling"
description = "Always fails."
command = ["python3", "-c", "import sys; sys.exit('This tool intentionally returns an error for testing')"]
input_schema = {{ type = "object", properties = {{}} }}

[[tools]]
name = "json_schema_2020_12_tool"
description = "Tool with JSON Schema 2020-12 features"
command = ["python3", "-c", "import sys; print(sys.stdin.read())"]

[tools.input_schema]
"$schema" = "https://json-schema.org/draft/2020-12/schema"
type = "object"
"$defs" = {{ address = {{ "$anchor" = "addressDef", type = "object", properties = {{ street = {{ type = "string" }}, city = {{ type = "string" }} }} }} }}
properties = {{ name = {{ type = "string" }}, address = {{ "$ref" = "#/$defs/address" }}, contactMethod = {{ type = "string", enum = ["phone", "email"] }}, phone = {{ type = "string" }}, email = {{ type = "string" }} }}
allOf = [{{ anyOf = [{{ required = ["phone"] }}, {{ required = ["email"] }}] }}]
if = {{ properties = {{ contactMethod = {{ const = "phone" }} }}, required = ["contactMethod"] }}
then = {{ required = ["phone"] }}
else = {{ required = ["email"] }}
additionalProperties = false

[[mcp]]
name = "fixture"
command = ["python3", "{}"]
prefix = ""
"##,
        fixture.display()
    ));
    dir.write("script.json", "[]");
    dir
}

/// Runs the suite's `conformance` command with `args`, its results saved under `out`; returns
/// what it printed (its exit status counts the skipped scenarios' failures too, so it is not
/// what is judged).
async fn conformance(args: Vec<String>) -> String {
    let installed = mcp_installed();
    let node = installed.join("venv/bin/node");
    let cli = installed.join("node_modules/.bin/conformance");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(node).arg(cli).args(args).output().unwrap()
    })
    .await
    .unwrap();
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every scenario's checks under `out` (`[server-]NAME-TIMESTAMP/checks.json`), by name.
fn results(out: &Path) -> BTreeMap<String, Vec<Value>> {
    fn walk(dir: &Path, out: &Path, found: &mut BTreeMap<String, Vec<Value>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out, found);
            } else if path.file_name().is_some_and(|n| n == "checks.json") {
                let folder = path.parent().unwrap().strip_prefix(out).unwrap();
                let folder = folder.to_str().unwrap();
                // `-2026-12-05T10-25-48-987Z`: the run's time, 25 characters.
                let (name, time) = folder.split_at(folder.len() - 25);
                assert!(time.ends_with('Z'), "{folder}");
                let name = name.strip_prefix("server-").unwrap_or(name);
                let checks = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                found.insert(name.to_owned(), checks);
            }
        }
    }
    let mut found = BTreeMap::new();
    walk(out, out, &mut found);
    found
}

/// Whether `name` is covered by one of `entries` (a name, or a prefix ending in `-` or `/`).
fn listed<'a>(entries: impl IntoIterator<Item = &'a str>, name: &str) -> bool {
    entries
        .into_iter()
        .any(|e| e == name || ((e.ends_with('-') || e.ends_with('/')) && name.starts_with(e)))
}

/// What is wrong with the suite's results at one wire: an unsorted scenario, an applicable one
/// that did not run or had no passing check, a check that failed or warned and is not waived.
fn problems(
    wire: &str,
    results: &BTreeMap<String, Vec<Value>>,
    applicable: &[&str],
    skipped: &[(&str, &str)],
    waived: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for name in applicable {
        if !results.contains_key(*name) {
            problems.push(format!("{wire}: {name} did not run"));
        }
    }
    for (name, checks) in results {
        if listed(skipped.iter().map(|s| s.0), name) {
            continue;
        }
        if !applicable.contains(&name.as_str()) {
            problems.push(format!(
                "{wire}: {name} is neither applicable nor skipped: sort it (a newer suite?)"
            ));
            continue;
        }
        let mut passed = 0;
        for check in checks {
            let status = check["status"].as_str().unwrap_or_default();
            let id = check["id"].as_str().unwrap_or_default();
            match status {
                "SUCCESS" => passed += 1,
                // The suite's own word that a check does not apply (no subscriptions offered, say).
                "INFO" | "SKIPPED" => {}
                _ if waived.iter().any(|w| w.0 == name.as_str() && w.1 == id) => {}
                _ => problems.push(format!(
                    "{wire}: {name}: {id} {status}: {}",
                    check["errorMessage"].as_str().unwrap_or_default()
                )),
            }
        }
        if passed == 0 {
            problems.push(format!("{wire}: {name}: no check passed"));
        }
    }
    problems
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentloop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suites_server_scenarios_pass_against_mcp_serve() {
    let dir = tools_agent();
    let agent = dir.agent();
    let server = HttpServer::start("mcp", &["--tools", agent.to_str().unwrap()]);
    let mut all = Vec::new();
    for (wire, applicable) in SERVER_APPLICABLE {
        let out = scratch(&format!("conformance-server-{wire}"));
        let printed = conformance(
            [
                "server",
                "--url",
                &server.url,
                "--suite",
                "all",
                "--spec-version",
                wire,
                "-o",
                out.to_str().unwrap(),
            ]
            .map(String::from)
            .to_vec(),
        )
        .await;
        let found = results(&out);
        assert!(!found.is_empty(), "the suite saved no results:\n{printed}");
        all.extend(problems(
            wire,
            &found,
            applicable,
            SERVER_SKIPPED,
            SERVER_WAIVED,
        ));
        let _ = std::fs::remove_dir_all(&out);
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suites_client_scenarios_pass_with_agentloops_mcp_client() {
    let client = repo().join("scripts/mcp/conformance_client.py");
    // The suite splits the command at spaces and appends the URL.
    let command = format!("python3 {} {}", client.display(), bin());
    let mut all = Vec::new();
    for (wire, applicable) in CLIENT_APPLICABLE {
        let out = scratch(&format!("conformance-client-{wire}"));
        let printed = conformance(
            [
                "client",
                "--command",
                &command,
                "--suite",
                "all",
                "--spec-version",
                wire,
                "-o",
                out.to_str().unwrap(),
            ]
            .map(String::from)
            .to_vec(),
        )
        .await;
        let found = results(&out);
        assert!(!found.is_empty(), "the suite saved no results:\n{printed}");
        all.extend(problems(
            wire,
            &found,
            applicable,
            CLIENT_SKIPPED,
            CLIENT_WAIVED,
        ));
        let _ = std::fs::remove_dir_all(&out);
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}
