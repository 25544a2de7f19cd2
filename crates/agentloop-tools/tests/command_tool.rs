#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The rules of command tools, each against a real child process.

use std::path::Path;
use std::time::Duration;

use agentloop::{ToolContext, ToolError, ToolOutput};
use agentloop_tools::{CommandTool, is_secret_env};
use serde_json::{Value, json};

fn ctx() -> ToolContext {
    ToolContext::detached("call_1", "t")
}

async fn call(tool: CommandTool, args: Value) -> Result<ToolOutput, ToolError> {
    tool.into_tool().unwrap().call(args, ctx()).await
}

fn text(out: &ToolOutput) -> String {
    out.content.to_text()
}

fn recoverable(e: &ToolError) -> (&str, &str) {
    match e {
        ToolError::Recoverable { code, message, .. } => (code, message),
        other => panic!("expected a recoverable error, got {other:?}"),
    }
}

/// True once no live (non-zombie) process has this pid.
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pid: u32) -> bool {
    for _ in 0..100 {
        if process_gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn read_pid(path: &Path) -> u32 {
    for _ in 0..250 {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(pid) = s.trim().parse()
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the command never wrote its pid to {}", path.display());
}

#[tokio::test]
async fn arguments_arrive_as_one_json_document_on_stdin() {
    let tool = CommandTool::new(
        "echo",
        [
            "python3",
            "-c",
            "import sys, json; d = json.load(sys.stdin); print(d['city'].upper(), d['n'] + 1)",
        ],
    );
    let out = call(tool, json!({"city": "Paris", "n": 41})).await.unwrap();
    assert_eq!(text(&out).trim(), "PARIS 42");
}

#[tokio::test]
async fn stdout_is_the_result_untrimmed() {
    let tool = CommandTool::new("t", ["printf", "  a\nb  "]);
    let out = call(tool, json!({})).await.unwrap();
    assert_eq!(text(&out), "  a\nb  ");
}

#[tokio::test]
async fn non_zero_exit_keeps_stdout_and_stderr_with_the_exit_status() {
    let tool = CommandTool::new(
        "t",
        [
            "sh",
            "-c",
            "echo 'test parse ... FAILED'; echo '  left: 1'; echo '  no such city: Atlantis  ' >&2; exit 3",
        ],
    );
    let err = call(tool, json!({})).await.unwrap_err();
    let (code, message) = recoverable(&err);
    assert_eq!(code, "command_failed");
    assert_eq!(
        message,
        "exit status 3\n--- stdout ---\ntest parse ... FAILED\n  left: 1\n--- stderr ---\nno such city: Atlantis"
    );
}

#[tokio::test]
async fn non_zero_exit_shows_only_the_streams_that_said_something() {
    let only_stdout = CommandTool::new("t", ["sh", "-c", "printf '1c1\\n< a\\n> b\\n\\n'; exit 1"]);
    let err = call(only_stdout, json!({})).await.unwrap_err();
    assert_eq!(
        recoverable(&err).1,
        "exit status 1\n--- stdout ---\n1c1\n< a\n> b"
    );
    let only_stderr = CommandTool::new("t", ["sh", "-c", "echo nope >&2; exit 2"]);
    let err = call(only_stderr, json!({})).await.unwrap_err();
    assert_eq!(recoverable(&err).1, "nope\n(exit status 2)");
}

#[tokio::test]
async fn non_zero_exit_with_no_output_names_the_exit_status() {
    let tool = CommandTool::new("t", ["sh", "-c", "exit 7"]);
    let err = call(tool, json!({})).await.unwrap_err();
    let (_, message) = recoverable(&err);
    assert_eq!(message, "exit status 7 (nothing on stdout or stderr)");
    let killed = CommandTool::new("t", ["sh", "-c", "echo before; kill -9 $$"]);
    let err = call(killed, json!({})).await.unwrap_err();
    assert_eq!(
        recoverable(&err).1,
        "killed by signal 9\n--- stdout ---\nbefore"
    );
}

#[tokio::test]
async fn long_stderr_is_cut_and_says_so() {
    let tool = CommandTool::new(
        "t",
        [
            "sh",
            "-c",
            "head -c 10000 /dev/zero | tr '\\0' x >&2; exit 1",
        ],
    );
    let err = call(tool, json!({})).await.unwrap_err();
    let (_, message) = recoverable(&err);
    let stderr = message
        .strip_suffix("\n(exit status 1)")
        .unwrap_or_else(|| panic!("{}", &message[..40]));
    assert!(
        stderr.starts_with(&"x".repeat(2048)),
        "kept the first 2 KiB"
    );
    assert!(
        stderr.contains(&format!(
            "{}\n[... 5904 bytes cut from the middle (10000 bytes in all) ...]\n{}",
            "x".repeat(2048),
            "x".repeat(2048)
        )),
        "kept 2 KiB of each end: {}",
        &stderr[2040..2200]
    );
    assert_eq!(stderr.len(), 4096 + 63, "kept no more than 4 KiB");
}

#[tokio::test]
async fn a_failing_program_s_long_stdout_keeps_its_head_and_its_verdict_at_the_end() {
    // A test run: the command first, 100 kB of progress, the verdict last.
    let tool = CommandTool::new(
        "t",
        [
            "sh",
            "-c",
            "echo 'running 412 tests'; head -c 100000 /dev/zero | tr '\\0' y; \
             echo; echo 'test result: FAILED. 409 passed; 3 failed'; \
             echo 'error: 3 tests failed' >&2; exit 101",
        ],
    );
    let err = call(tool, json!({})).await.unwrap_err();
    let (_, message) = recoverable(&err);
    let stdout = message
        .strip_prefix("exit status 101\n--- stdout ---\nrunning 412 tests\n")
        .unwrap_or_else(|| panic!("{}", &message[..40]));
    assert!(stdout.starts_with(&"y".repeat(32 * 1024 - 20)), "the head");
    assert!(
        stdout.contains("bytes cut from the middle (100061 bytes in all)"),
        "the cut is counted"
    );
    assert!(
        stdout.ends_with(
            "y\ntest result: FAILED. 409 passed; 3 failed\n--- stderr ---\nerror: 3 tests failed"
        ),
        "{}",
        &stdout[stdout.len() - 200..]
    );
    assert!(message.len() < 64 * 1024 + 4 * 1024 + 200, "bounded");
}

#[tokio::test]
async fn long_stdout_is_cut_and_says_so() {
    let tool = CommandTool::new("t", ["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' y"])
        .max_output_bytes(1000);
    let out = call(tool, json!({})).await.unwrap();
    let t = text(&out);
    assert!(t.starts_with(&"y".repeat(1000)));
    assert!(
        t.ends_with("[output cut: showing the first 1000 of 5000 bytes]"),
        "{t}"
    );
}

#[tokio::test]
async fn provider_api_keys_never_reach_the_child() {
    let tool = CommandTool::new("t", ["sh", "-c", "env | sort"])
        .base_env([
            ("PATH", std::env::var("PATH").unwrap()),
            ("OPENAI_API_KEY", "sk-openai-secret".into()),
            ("ANTHROPIC_API_KEY", "sk-ant-secret".into()),
            ("GROQ_API_KEY", "gsk-secret".into()),
            ("MY_PROVIDER_TOKEN", "named-secret".into()),
            ("GITHUB_TOKEN", "ghp-secret".into()),
            ("AWS_SECRET_ACCESS_KEY", "aws-secret".into()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=otel-secret".into(),
            ),
            (
                "AGENTLOOP_RESTATE",
                "http://user:restate-secret@host".into(),
            ),
            ("HIDDEN_BY_NAME", "hidden-secret".into()),
            ("KEEP_ME", "visible".into()),
            ("NOT_LISTED", "unlisted-value".into()),
        ])
        // Allowing a secret by name does not pass it.
        .allow_env("KEEP_ME")
        .allow_env("GITHUB_TOKEN")
        .allow_env("HIDDEN_BY_NAME")
        .hide_env("HIDDEN_BY_NAME");
    let out = text(&call(tool, json!({})).await.unwrap());
    assert!(out.contains("KEEP_ME=visible"), "{out}");
    assert!(out.contains("PATH="), "{out}");
    for secret in [
        "sk-openai-secret",
        "sk-ant-secret",
        "gsk-secret",
        "named-secret",
        "ghp-secret",
        "aws-secret",
        "otel-secret",
        "restate-secret",
        "hidden-secret",
        "unlisted-value",
    ] {
        assert!(!out.contains(secret), "{secret} leaked: {out}");
    }
}

#[test]
fn secret_rule_covers_keys_tokens_secrets_and_collector_headers() {
    assert!(is_secret_env("OPENAI_API_KEY"));
    assert!(is_secret_env("anthropic_api_key"));
    assert!(is_secret_env("API_KEY"));
    for name in [
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "CLIENT_SECRET",
        "GITLAB_PAT",
        "DB_PASSWORD",
        "SSH_KEY",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "AGENTLOOP_RESTATE",
        "AGENTLOOP_RESTATE_ADMIN",
        "token",
        "PGPASSWORD",
        "MYSQL_PWD",
        "SMTP_PASSWD",
        "SERVICE_APIKEY",
        "AZURE_STORAGE_CONNECTION_STRING",
    ] {
        assert!(is_secret_env(name), "{name}");
    }
    assert!(!is_secret_env("API_KEYS_DIR"));
    assert!(!is_secret_env("HOME"));
    assert!(!is_secret_env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    assert!(!is_secret_env("KEYBOARD"));
    assert!(!is_secret_env("PWD"));
    assert!(!is_secret_env("OLDPWD"));
}

#[tokio::test]
async fn missing_executable_is_a_clear_tool_error() {
    let tool = CommandTool::new("t", ["definitely-not-a-program-4711"]);
    let err = call(tool, json!({})).await.unwrap_err();
    let (code, message) = recoverable(&err);
    assert_eq!(code, "command_not_found");
    assert!(
        message.contains("definitely-not-a-program-4711"),
        "{message}"
    );
    assert!(
        matches!(
            err,
            ToolError::Recoverable {
                permanent: true,
                ..
            }
        ),
        "a missing program is not worth a retry: {err:?}"
    );
}

#[tokio::test]
async fn runs_in_its_working_dir_and_resolves_relative_programs_there() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    let script = dir.path().join("tools/where.sh");
    std::fs::write(&script, "#!/bin/sh\npwd\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tool = CommandTool::new("t", ["tools/where.sh"]).working_dir(dir.path());
    let out = call(tool, json!({})).await.unwrap();
    let expected = dir.path().canonicalize().unwrap();
    assert_eq!(
        Path::new(text(&out).trim()).canonicalize().unwrap(),
        expected
    );
}

#[tokio::test]
async fn a_call_cancelled_before_it_starts_never_starts_its_program() {
    let dir = tempfile::tempdir().unwrap();
    let tool = CommandTool::new("t", ["sh", "-c", "touch started"])
        .working_dir(dir.path())
        .into_tool()
        .unwrap();
    let context = ctx();
    context.cancel.cancel();
    let err = tool.call(json!({}), context).await.unwrap_err();
    assert_eq!(recoverable(&err).0, "cancelled");
    assert!(!dir.path().join("started").exists(), "the program ran");
}

#[tokio::test]
async fn cancellation_kills_the_command_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let tool = CommandTool::new("t", ["sh", "-c", "sleep 30 & echo $! > pid; wait"])
        .working_dir(dir.path());
    let tool = tool.into_tool().unwrap();
    let context = ctx();
    let cancel = context.cancel.clone();
    let running = tokio::spawn(tool.call(json!({}), context));
    let grandchild = read_pid(&pidfile).await;
    cancel.cancel();
    let err = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(recoverable(&err).0, "cancelled");
    assert!(
        wait_gone(grandchild).await,
        "the background child {grandchild} survived cancellation"
    );
}

#[tokio::test]
async fn timeout_kills_the_command_and_answers_a_timeout_error() {
    let dir = tempfile::tempdir().unwrap();
    let tool = CommandTool::new("t", ["sh", "-c", "echo $$ > pid; sleep 30"])
        .working_dir(dir.path())
        .timeout(Duration::from_millis(400));
    let started = std::time::Instant::now();
    let err = call(tool, json!({})).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(recoverable(&err).0, "timeout");
    let pid = read_pid(&dir.path().join("pid")).await;
    assert!(wait_gone(pid).await, "the timed-out command {pid} survived");
}

#[tokio::test]
async fn dropping_the_call_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let tool =
        CommandTool::new("t", ["sh", "-c", "echo $$ > pid; sleep 30"]).working_dir(dir.path());
    let tool = tool.into_tool().unwrap();
    let fut = tool.call(json!({}), ctx());
    let _ = tokio::time::timeout(Duration::from_millis(300), fut).await;
    let pid = read_pid(&dir.path().join("pid")).await;
    assert!(wait_gone(pid).await, "the dropped command {pid} survived");
}

#[tokio::test]
async fn a_program_ignoring_stdin_still_answers() {
    let big = json!({"blob": "z".repeat(200_000)});
    let tool = CommandTool::new("t", ["echo", "done"]);
    let out = call(tool, big).await.unwrap();
    assert_eq!(text(&out).trim(), "done");
}

#[test]
fn an_empty_command_is_refused() {
    let err = CommandTool::new("t", Vec::<String>::new())
        .into_tool()
        .unwrap_err();
    assert_eq!(err.code(), "command.empty");
}

#[tokio::test]
async fn children_left_running_are_killed_when_the_program_exits() {
    let dir = tempfile::tempdir().unwrap();
    // The background sleep holds stdout open: without the group kill the call would hang 30 s.
    let tool = CommandTool::new("t", ["sh", "-c", "sleep 30 & echo $! > pid; echo done"])
        .working_dir(dir.path());
    let started = std::time::Instant::now();
    let out = call(tool, json!({})).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the call waited for the leftover child"
    );
    assert_eq!(text(&out).trim(), "done");
    let pid = read_pid(&dir.path().join("pid")).await;
    assert!(wait_gone(pid).await, "the leftover child {pid} survived");
}

#[tokio::test]
async fn it_writes_its_root_and_private_tmpdir_only_and_reads_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let script = "echo in > root/in.txt && echo tmp > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && \
                  head -c 3 /etc/passwd; echo; echo out > beside.txt || echo beside-refused";
    let tool = CommandTool::new("t", ["sh", "-c", script])
        .working_dir(dir.path())
        .root(&root);
    let out = text(&call(tool, json!({})).await.unwrap());
    assert!(out.starts_with("tmp\nroo\n"), "{out}");
    assert!(out.contains("beside-refused"), "{out}");
    assert!(root.join("in.txt").exists());
    assert!(!dir.path().join("beside.txt").exists());
    // Unsandboxed, the same command writes beside its root.
    let tool = CommandTool::new("t", ["sh", "-c", script])
        .working_dir(dir.path())
        .root(&root)
        .sandbox(agentloop_tools::SandboxPolicy::new(
            agentloop_tools::SandboxMode::Off,
        ));
    let out = text(&call(tool, json!({})).await.unwrap());
    assert!(!out.contains("beside-refused"), "{out}");
    assert!(dir.path().join("beside.txt").exists());
}
