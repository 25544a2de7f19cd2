#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! What agentloop's crates log reaches the user of the `agentloop` binary: one line each on
//! stderr, stdout untouched, the level set by `AGENTLOOP_LOG`. The binary runs against a fake
//! provider on loopback that fails once with a retryable status, then answers.

mod support;

use support::*;

/// `agentloop run --json` of the weather agent at a provider whose first answer is a 500 (which
/// the retry layer retries) and whose second is a streamed text, with `env` set.
async fn run_retried(env: Vec<(&'static str, &'static str)>, json: bool) -> std::process::Output {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            status(500, "synthetic/oai_chat_err_500_server_error.json"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let mut env = env;
    env.push(("AGENTLOOP_TEST_KEY", TEST_KEY));
    let mut argv = args(&["run", dir.agent().to_str().unwrap(), "--input", "hi"]);
    if json {
        argv.push("--json".into());
    }
    let out = agentloop_env(argv, env).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(fake.requests().await.len(), 2, "one retry");
    out
}

/// The lines of stderr that are the log's retry warning.
fn retry_lines(out: &std::process::Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.contains("retrying"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_model_call_is_a_warning_on_stderr_and_json_stays_one_document() {
    let out = run_retried(Vec::new(), true).await;
    let lines = retry_lines(&out);
    assert_eq!(lines.len(), 1, "stderr: {}", stderr(&out));
    assert!(
        lines[0].starts_with(
            "agentloop: warning: model call failed; retrying (model=gpt-4o, attempt=1, \
             code=model.server_error, status=500, wait_ms="
        ),
        "{}",
        lines[0]
    );
    // stdout is the one JSON document, untouched by the log.
    let text = stdout(&out);
    assert_eq!(text.trim_end().lines().count(), 1, "{text}");
    assert!(!text.contains("agentloop:"), "{text}");
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert!(!stderr(&out).contains(TEST_KEY));
    // No colour when stderr is not a terminal.
    assert!(!stderr(&out).contains('\u{1b}'));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_json_stdout_holds_the_answer_alone_and_the_warning_goes_to_stderr() {
    let out = run_retried(Vec::new(), false).await;
    assert_eq!(retry_lines(&out).len(), 1, "stderr: {}", stderr(&out));
    assert!(!stdout(&out).contains("retrying"), "{}", stdout(&out));
    assert!(!stdout(&out).trim().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn agentloop_log_off_silences_the_warning() {
    let shown = run_retried(vec![("AGENTLOOP_LOG", "warn")], true).await;
    assert_eq!(retry_lines(&shown).len(), 1, "stderr: {}", stderr(&shown));
    let out = run_retried(vec![("AGENTLOOP_LOG", "off")], true).await;
    assert!(retry_lines(&out).is_empty(), "stderr: {}", stderr(&out));
    assert!(
        !stderr(&out).contains("agentloop: warning"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout_json(&out)["stop_reason"], "finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn agentloop_log_names_a_crate_and_a_level() {
    // Another crate's warnings only: the providers' retry is not shown.
    let out = run_retried(vec![("AGENTLOOP_LOG", "agentloop_mcp=warn")], true).await;
    assert!(retry_lines(&out).is_empty(), "stderr: {}", stderr(&out));
    // The providers' at debug: the retry is shown.
    let out = run_retried(vec![("AGENTLOOP_LOG", "agentloop_providers=debug")], true).await;
    assert_eq!(retry_lines(&out).len(), 1, "stderr: {}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_agentloop_log_is_said_and_the_default_used() {
    let out = run_retried(vec![("AGENTLOOP_LOG", "agentloop=loud")], true).await;
    let err = stderr(&out);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(
            "agentloop: warning: AGENTLOOP_LOG=\"agentloop=loud\" is not a valid filter"
        ),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("AGENTLOOP_LOG")).count(),
        1,
        "{err}"
    );
    assert_eq!(
        retry_lines(&out).len(),
        1,
        "the default still shows warnings: {err}"
    );
    assert_eq!(stdout_json(&out)["stop_reason"], "finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_help_names_the_log_variable_and_its_default() {
    let out = agentloop(args(&["--help"])).await;
    let help = stdout(&out);
    assert!(help.contains("AGENTLOOP_LOG sets what is shown"), "{help}");
    assert!(help.contains("`agentloop=warn`"), "{help}");
}

/// A scripted agent answering `script` whose one MCP server, `h`, is the project's misbehaving
/// server (`scripts/mcp/hostile_server.py`) with `flags`; `extra` ends its `[[mcp]]` table.
fn hostile_agent(flags: &str, extra: &str, script: &str) -> AgentDir {
    let server = support::repo().join("scripts/mcp/hostile_server.py");
    let dir = AgentDir::new(&format!(
        r#"name = "hostile"
[model]
provider = "scripted"
script = "script.json"
[[mcp]]
name = "h"
command = ["python3", "{}"{flags}]
{extra}
"#,
        server.display()
    ));
    dir.write("script.json", script);
    dir
}

/// What the hostile server says on stderr before its `crash` tool exits: two credentials and a
/// terminal escape sequence (TOML's escapes).
const CRASH_SAYS: &str = r"Authorization: Bearer hunter2-from-the-server\nretrying with OPENAI_API_KEY=sk-live-0123456789abcdef\n\u001b]0;pwned\u0007bye";

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_servers_exit_is_one_redacted_line_on_stderr() {
    let dir = hostile_agent(
        &format!(r#", "--crash-call", "{CRASH_SAYS}""#),
        "",
        r#"[{"tool_calls": [{"id": "c", "name": "h__crash", "arguments": {}}]}, {"text": "done"}]"#,
    );
    let (out, _) = run_finished(&dir.agent(), "go").await;
    let err = stderr(&out);
    let exited: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("agentloop: warning: the MCP server exited"))
        .collect();
    assert_eq!(exited.len(), 1, "{err}");
    // The server's stderr tail is on that one line, its credentials redacted, its escape
    // sequence shown as escapes.
    let line = exited[0];
    assert!(line.contains("server=h"), "{line}");
    assert!(line.contains("Authorization: [redacted]"), "{line}");
    assert!(line.contains("\\u{1b}]0;pwned\\u{7}bye"), "{line}");
    for secret in ["hunter2", "sk-live-0123456789abcdef"] {
        assert!(!err.contains(secret), "{secret} in {err}");
    }
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(
        !err.lines().any(|l| l.starts_with("Authorization")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_that_collides_when_a_servers_list_changes_mid_run_is_said_once() {
    // `echo` is renamed to the name `change` makes its new tool `added` take.
    let dir = hostile_agent(
        "",
        r#"rename = { echo = "h__added" }"#,
        r#"[{"tool_calls": [{"id": "c", "name": "h__change", "arguments": {}}]},
            {"tool_calls": [{"id": "w", "name": "h__whoami", "arguments": {}}]},
            {"tool_calls": [{"id": "x", "name": "h__whoami", "arguments": {}}]},
            {"text": "done"}]"#,
    );
    let (out, _) = run_finished(&dir.agent(), "go").await;
    let err = stderr(&out);
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("agentloop: warning: ") && l.contains("h__added"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("\"added\" is left out") && said[0].ends_with("(server=h)"),
        "{}",
        said[0]
    );
}
