#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop` runs of real agent files against a fake provider on loopback that serves recorded
//! responses turn by turn and records each request.

mod support;

use serde_json::{Value, json};
use support::*;

/// The weather agent (`extra` at the end of its `[model]`) run with `flag` against a fake
/// provider that calls `get_weather` once and then answers.
async fn weather_run(extra: &str, flag: &str) -> (FakeProvider, AgentDir, std::process::Output) {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), extra));
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "Weather in Mexico City?",
        flag,
    ]))
    .await;
    (fake, dir, out)
}

#[tokio::test(flavor = "multi_thread")]
async fn json_run_against_openai_prints_one_object_with_the_documented_fields() {
    let (_fake, _dir, out) = weather_run("", "--json").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    for key in [
        "run_id",
        "stop_reason",
        "output",
        "turns",
        "usage",
        "cost_usd",
        "tool_calls",
        "error",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["stop_reason"], "finished");
    assert!(
        v["output"]
            .as_str()
            .unwrap()
            .starts_with("I'm unable to provide real-time weather")
    );
    assert_eq!(v["turns"], 2);
    assert_eq!(v["usage"]["input_tokens"], 423 + 14);
    assert_eq!(v["usage"]["output_tokens"], 15 + 30);
    assert!(v["cost_usd"].as_f64().unwrap() > 0.0, "gpt-4o is priced");
    assert_eq!(v["error"], Value::Null);
    let call = &v["tool_calls"][0];
    assert_eq!(call["id"], "call_LwxJUB9KppVyogRRLQsamRJv");
    assert_eq!(call["tool"], "get_weather");
    assert_eq!(call["input"], json!({"city": "Mexico City"}));
    assert_eq!(call["ok"], true);
    assert_eq!(call["output"], "18 degrees and sunny\n");
    assert_eq!(v["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_after_a_tool_call_carries_its_result_and_the_settings() {
    let (fake, _dir, out) = weather_run("", "--quiet").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let requests = fake.requests().await;
    assert_eq!(requests.len(), 2);
    for r in &requests {
        let auth = r.headers.get("authorization").unwrap().to_str().unwrap();
        assert_eq!(auth, format!("Bearer {TEST_KEY}"));
    }
    let bodies = fake.bodies().await;
    assert_eq!(bodies[0]["model"], "gpt-4o");
    assert_eq!(bodies[0]["temperature"], 0.0);
    assert_eq!(bodies[0]["seed"], 7);
    assert_eq!(bodies[0]["tools"][0]["function"]["name"], "get_weather");
    let messages = bodies[1]["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        assistant["tool_calls"][0]["id"],
        "call_LwxJUB9KppVyogRRLQsamRJv"
    );
    let tool = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool["tool_call_id"], "call_LwxJUB9KppVyogRRLQsamRJv");
    assert_eq!(tool["content"], "18 degrees and sunny\n");
    assert!(
        stdout(&out).starts_with("I'm unable to provide real-time weather"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_tool_gets_its_arguments_on_stdin_and_no_api_key() {
    let fake = one_call_then_text().await;
    // A command tool sees the shell's allow list and what its `env` names, never a secret.
    let toml = openai_agent(&fake.uri(), "").replace(
        r#"command = ["python3", "tool.py"]"#,
        r#"command = ["python3", "tool.py"]
env = ["VISIBLE_VAR"]"#,
    );
    let dir = AgentDir::new(&toml);
    let out = agentloop_env(
        args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "hi",
            "--quiet",
        ]),
        vec![
            ("AGENTLOOP_TEST_KEY", TEST_KEY),
            ("OPENAI_API_KEY", "sk-openai-other"),
            ("VISIBLE_VAR", "yes"),
            ("UNDECLARED_VAR", "no"),
            ("GITHUB_TOKEN", "ghp-secret-token"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer collector-secret",
            ),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Mexico City"})]);
    let env = dir.tool_env();
    assert!(env.contains("VISIBLE_VAR=yes"), "{env}");
    assert!(
        !env.contains(TEST_KEY),
        "the agent's key reached the tool: {env}"
    );
    assert!(!env.contains("AGENTLOOP_TEST_KEY"), "{env}");
    assert!(!env.contains("sk-openai-other"), "{env}");
    for hidden in ["UNDECLARED_VAR", "ghp-secret-token", "collector-secret"] {
        assert!(!env.contains(hidden), "{hidden} reached the tool: {env}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_command_tool_sends_its_status_stdout_and_stderr_back_to_the_model() {
    let fake = one_call_then_text().await;
    // The tool fails when its input has `fail`: make it fail by schema-free arguments from a script
    // is not possible with a recording, so point the tool at a failing program instead.
    let toml = openai_agent(&fake.uri(), "").replace(
        r#"command = ["python3", "tool.py"]"#,
        r#"command = ["sh", "-c", "cat > stdin.log; echo 'station: closed'; echo '  no weather for you  ' >&2; exit 4"]"#,
    );
    let dir = AgentDir::new(&toml);
    let out = run_agent_json(&dir.agent(), "hi").await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "the model recovers: stderr {}",
        stderr(&out)
    );
    let v = stdout_json(&out);
    let call = &v["tool_calls"][0];
    assert_eq!(call["ok"], false);
    assert_eq!(call["error"]["code"], "command_failed");
    let message =
        "exit status 4\n--- stdout ---\nstation: closed\n--- stderr ---\nno weather for you";
    assert_eq!(call["error"]["message"], message);
    let bodies = fake.bodies().await;
    let tool = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    assert!(
        tool["content"].as_str().unwrap().contains(message),
        "the model reads the status, stdout and stderr: {tool}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("stdin.log")).unwrap(),
        r#"{"city":"Mexico City"}"#
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_run_sends_tool_results_back_as_tool_result_blocks() {
    let fake = FakeProvider::start(
        "/v1/messages",
        vec![
            ok("anthropic/anth_s_tool_use.sse"),
            ok("anthropic/anth_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&anthropic_agent(&fake.uri(), "get_weather"));
    let out = run_agent_json(&dir.agent(), "Paris?").await;
    assert_eq!(out.status.code(), Some(0), "stdout: {}", stdout(&out));
    let v = stdout_json(&out);
    assert_eq!(v["output"], "Hello there!");
    assert_eq!(v["tool_calls"][0]["input"], json!({"location": "Paris"}));
    let requests = fake.requests().await;
    assert_eq!(
        requests[0]
            .headers
            .get("x-api-key")
            .unwrap()
            .to_str()
            .unwrap(),
        TEST_KEY
    );
    let bodies = fake.bodies().await;
    assert_eq!(bodies[0]["max_tokens"], 512);
    let last = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    assert_eq!(last["role"], "user");
    let block = &last["content"][0];
    assert_eq!(block["type"], "tool_result");
    assert_eq!(block["tool_use_id"], "toolu_01NRLabsLyVHZPKxbKvkfSMn");
    assert_eq!(dir.tool_inputs(), vec![json!({"location": "Paris"})]);
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_responses_run_sends_function_call_output() {
    let fake = FakeProvider::start(
        "/v1/responses",
        vec![
            ok("openai_responses/resp_s_function_call.sse"),
            ok("openai_responses/resp_s_text.sse"),
        ],
    )
    .await;
    let toml = format!(
        r#"name = "r"
[model]
provider = "openai-responses"
name = "gpt-4o"
base_url = "{}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
[[tools]]
name = "get_capital"
command = ["python3", "tool.py"]
"#,
        fake.uri()
    );
    let dir = AgentDir::new(&toml);
    let out = run_agent_json(&dir.agent(), "Capital of France?").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["output"], "The capital of France is Paris.");
    let bodies = fake.bodies().await;
    let items = bodies[1]["input"].as_array().unwrap();
    let output = items
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap();
    assert_eq!(output["call_id"], "call_kL0PCQV7M2WMoVX8V8OtYSAL");
    assert_eq!(dir.tool_inputs(), vec![json!({"country": "France"})]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_error_exits_with_the_model_code() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![status(400, "openai_chat/oai_chat_err_400.json")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let out = run_agent_json(&dir.agent(), "hi").await;
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "failed");
    assert_eq!(v["error"]["code"], "model.invalid_request");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Web search options not supported")
    );
    assert!(!stdout(&out).contains(TEST_KEY));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_api_key_names_the_variable_and_sends_nothing() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let out = agentloop_env(
        args(&["run", dir.agent().to_str().unwrap(), "--input", "hi"]),
        vec![],
    )
    .await;
    assert_eq!(out.status.code(), Some(4));
    assert!(
        stderr(&out).contains("AGENTLOOP_TEST_KEY"),
        "{}",
        stderr(&out)
    );
    assert!(fake.requests().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_limit_stops_the_run_with_the_limit_code() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), "[limits]\nmax_turns = 1\n"));
    let out = run_agent_json(&dir.agent(), "hi").await;
    assert_eq!(out.status.code(), Some(5), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "max_turns");
    assert_eq!(fake.requests().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_makes_no_request_and_redacts_the_key() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), "[limits]\nmax_turns = 4\n"));
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["model"]["provider"], "openai");
    assert_eq!(v["model"]["api_key_env"], "AGENTLOOP_TEST_KEY");
    assert_eq!(v["tools"][0]["name"], "get_weather");
    assert_eq!(
        v["tools"][0]["input_schema"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(v["limits"]["max_turns"], 4);
    assert_eq!(v["first_request"]["body"]["model"], "gpt-4o");
    assert_eq!(
        v["first_request"]["url"],
        format!("{}/v1/chat/completions", fake.uri())
    );
    assert!(
        v["first_request"]["headers"]["authorization"]
            .as_str()
            .unwrap()
            .contains("[redacted]")
    );
    assert!(!stdout(&out).contains(TEST_KEY));
    let text = agentloop(args(&["inspect", dir.agent().to_str().unwrap()])).await;
    assert_eq!(text.status.code(), Some(0));
    assert!(stdout(&text).contains("get_weather"));
    assert!(fake.requests().await.is_empty(), "plan sent a request");
    assert!(!dir.path("stdin.log").exists(), "plan ran a tool");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_needs_no_credentials() {
    let fake = FakeProvider::start("/v1/chat/completions", vec![]).await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let out = agentloop_env(args(&["plan", dir.agent().to_str().unwrap()]), vec![]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(fake.requests().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn live_dry_run_prints_the_first_request_and_sends_nothing() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "Weather in Oslo?",
        "--dry-run",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["method"], "POST");
    let messages = v["body"]["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], "Weather in Oslo?");
    assert!(!stdout(&out).contains(TEST_KEY));
    assert!(fake.requests().await.is_empty(), "a dry run sent a request");
    assert!(!dir.path("stdin.log").exists(), "a dry run ran a tool");
}

#[tokio::test(flavor = "multi_thread")]
async fn scripted_dry_run_skips_every_tool() {
    let dir = scripted_weather(
        "s",
        r#"[{"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}, {"id": "c2", "name": "get_weather", "arguments": {"city": "Rome"}}]}, {"text": "done"}]"#,
    );
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "x",
        "--dry-run",
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["output"], "done");
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c["status"] == "skipped" && c["ok"] == false),
        "{calls:?}"
    );
    assert!(!dir.path("stdin.log").exists(), "a dry run ran a tool");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lone_surrogate_in_a_calls_arguments_reaches_the_tool_as_the_replacement_character() {
    // The arguments' own JSON text (what the model wrote) holds a high half with no low half
    // after it, beside a whole pair.
    let dir = scripted_weather(
        "s",
        r#"[{"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\\ud83d\", \"icon\": \"\\ud83d\\ude00\"}"}]}, {"text": "done"}]"#,
    );
    let out = run_agent_json(&dir.agent(), "x").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    let call = &v["tool_calls"][0];
    assert_eq!(call["ok"], true, "{call}");
    let expected = json!({"city": "Oslo\u{fffd}", "icon": "\u{1F600}"});
    assert_eq!(call["input"], expected);
    assert_eq!(dir.tool_inputs(), vec![expected]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_file_is_reported_with_key_paths_and_lines() {
    let dir = AgentDir::new(
        r#"name = "bad"
[model]
provider = "openai"
script = "s.json"

[[tools]]
name = "ok"
command = ["echo"]

[[tools]]
name = "t"
comand = ["echo"]
"#,
    );
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "x",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains("agent.toml:12:1: tools[1].comand: unknown key `comand`"),
        "{err}"
    );
    assert!(
        err.contains("tools[1].command: missing required key `command`"),
        "{err}"
    );
    let json = run_agent_json(&dir.agent(), "x").await;
    assert_eq!(json.status.code(), Some(3));
    let v = stdout_json(&json);
    assert_eq!(v["error"]["code"], "agent_file.invalid");
    let problems = v["error"]["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["path"] == "tools[1].comand" && p["line"] == 12),
        "{problems:?}"
    );
}

/// A reader of `--json` finds the same keys whether the run happened or the command failed
/// before it (then each is empty: `null`, `0`, `[]`).
#[tokio::test(flavor = "multi_thread")]
async fn the_json_of_a_failure_before_the_run_has_every_key_of_a_runs() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/agent.toml"
    );
    let ran = agentloop_env(
        args(&["run", example, "--input", "Paris and Lisbon?", "--json"]),
        vec![],
    )
    .await;
    assert_eq!(ran.status.code(), Some(0), "stderr: {}", stderr(&ran));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-agent.toml");
    let failed = agentloop_env(
        args(&["run", missing.to_str().unwrap(), "--input", "x", "--json"]),
        vec![],
    )
    .await;
    assert_eq!(failed.status.code(), Some(3), "stderr: {}", stderr(&failed));
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let (ran, failed) = (stdout_json(&ran), stdout_json(&failed));
    assert_eq!(keys(&failed), keys(&ran));
    assert_eq!(keys(&failed["usage"]), keys(&ran["usage"]));
    assert_eq!(failed["model_calls"], 0);
    assert_eq!(failed["limit"], Value::Null);
    assert_eq!(failed["transcript"], json!([]));
    assert_eq!(failed["usage"]["reasoning_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn rule_problems_come_all_at_once() {
    let dir = AgentDir::new(
        r#"name = "bad"
[model]
provider = "openai"
script = "s.json"
[[tools]]
name = "no spaces"
command = ["./missing.sh"]
input_schema = { type = "array" }
"#,
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    for needle in [
        "4:10: model.script",
        "3:12: model.name",
        "6:8: tools[0].name",
        "7:11: tools[0].command",
        "8:16: tools[0].input_schema",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn input_can_come_from_stdin_or_a_file() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_text.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    dir.write("input.txt", "from a file");
    let agent = dir.agent();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["run", agent.to_str().unwrap(), "--quiet"])
            .env("AGENTLOOP_TEST_KEY", TEST_KEY)
            .write_stdin("from stdin")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let from_file = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input-file",
        dir.path("input.txt").to_str().unwrap(),
        "--quiet",
    ]))
    .await;
    assert_eq!(from_file.status.code(), Some(0));
    let bodies = fake.bodies().await;
    let last_user = |b: &Value| {
        b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .unwrap()["content"]
            .clone()
    };
    assert_eq!(last_user(&bodies[0]), "from stdin");
    assert_eq!(last_user(&bodies[1]), "from a file");
}

#[tokio::test(flavor = "multi_thread")]
async fn quickstart_example_runs_without_credentials() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/agent.toml"
    );
    let out = agentloop_env(
        args(&[
            "run",
            example,
            "--input",
            "Compare the weather in Paris and Lisbon, in Fahrenheit.",
            "--json",
        ]),
        vec![],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["turns"], 4);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 5);
    assert_eq!(
        calls[0]["output"],
        "{\"city\": \"Paris\", \"celsius\": 18, \"sky\": \"light rain\"}\n"
    );
    assert_eq!(
        calls[1]["output"],
        "{\"city\": \"Lisbon\", \"celsius\": 23, \"sky\": \"sunny\"}\n"
    );
    assert_eq!(calls[2]["ok"], false);
    assert!(
        calls[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown unit 'farenheit'")
    );
    assert_eq!(calls[3]["output"], "64.4\n");
    assert_eq!(calls[4]["output"], "73.4\n");
    assert!(v["output"].as_str().unwrap().contains("73.4 °F"));
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_output_shows_tool_calls_and_a_closing_line() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/agent.toml"
    );
    let out = agentloop_env(args(&["run", example, "--input", "x"]), vec![]).await;
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("→ get_weather {\"city\":\"Paris\"} [call_paris]"),
        "{err}"
    );
    assert!(err.contains("✗ convert_temperature error in"), "{err}");
    assert!(
        err.contains(
            "[call_conv1]: command_failed: unknown unit 'farenheit': use 'fahrenheit' or 'kelvin' … (exit status 2)\n"
        ),
        "a failed command's line shows its first and last lines: {err}"
    );
    assert!(
        err.contains("■ finished · 4 turns · 5 tool calls · 1183 in / 136 out tokens"),
        "{err}"
    );
    assert_eq!(
        stdout(&out).trim(),
        "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris."
    );
    let quiet = agentloop_env(args(&["run", example, "--input", "x", "--quiet"]), vec![]).await;
    assert!(stderr(&quiet).is_empty(), "{}", stderr(&quiet));
    assert_eq!(
        stdout(&quiet).trim(),
        "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris."
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn help_documents_the_exit_codes() {
    let out = agentloop(args(&["run", "--help"])).await;
    let text = stdout(&out);
    for line in [
        "0    the run finished",
        "3    invalid agent file",
        "4    model or provider error",
        "5    a limit",
        "6    a tool failed fatally",
        "130  cancelled",
    ] {
        assert!(text.contains(line), "missing {line:?}");
    }
    let bad = agentloop(args(&["run"])).await;
    assert_eq!(bad.status.code(), Some(2));
}

fn scripted_weather_agent() -> AgentDir {
    scripted_weather(
        "traced",
        r#"[{"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo-payload"}}], "usage": {"input_tokens": 10, "output_tokens": 5}}, {"text": "Answer-payload", "usage": {"input_tokens": 20, "output_tokens": 6}}]"#,
    )
}

async fn traced_run(dir: &AgentDir, trace: &str, payloads: bool) -> String {
    let agent = dir.agent();
    let trace_path = dir.path(trace);
    let mut a = vec![
        "run",
        agent.to_str().unwrap(),
        "--input",
        "x",
        "--json",
        "--trace",
        trace_path.to_str().unwrap(),
    ];
    if payloads {
        a.push("--trace-payloads");
    }
    let out = agentloop(args(&a)).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    stdout_json(&out)["run_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_append_runs_and_trace_list_and_show_read_them() {
    for trace in ["t.ndjson", "t.sqlite"] {
        let dir = scripted_weather_agent();
        let first = traced_run(&dir, trace, false).await;
        let second = traced_run(&dir, trace, false).await;
        let path = dir.path(trace);
        let list = agentloop(args(&["trace", "list", path.to_str().unwrap()])).await;
        assert_eq!(list.status.code(), Some(0), "stderr: {}", stderr(&list));
        let text = stdout(&list);
        assert!(
            text.contains(&first) && text.contains(&second),
            "{trace}: {text}"
        );
        let show = agentloop(args(&[
            "trace",
            "show",
            path.to_str().unwrap(),
            "--run",
            &first,
        ]))
        .await;
        assert_eq!(show.status.code(), Some(0), "stderr: {}", stderr(&show));
        let tree = stdout(&show);
        assert!(
            tree.contains(&first) && tree.contains("get_weather"),
            "{trace}: {tree}"
        );
        let json = agentloop(args(&[
            "trace",
            "show",
            path.to_str().unwrap(),
            "--run",
            &second,
            "--json",
        ]))
        .await;
        let v: Value = serde_json::from_str(&stdout(&json)).unwrap();
        assert!(v.to_string().contains(&second));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_hold_payloads_only_when_asked() {
    let dir = scripted_weather_agent();
    traced_run(&dir, "plain.ndjson", false).await;
    traced_run(&dir, "full.ndjson", true).await;
    let plain = std::fs::read_to_string(dir.path("plain.ndjson")).unwrap();
    let full = std::fs::read_to_string(dir.path("full.ndjson")).unwrap();
    assert!(
        !plain.contains("Oslo-payload") && !plain.contains("Answer-payload"),
        "{plain}"
    );
    assert!(
        full.contains("Oslo-payload") && full.contains("Answer-payload"),
        "{full}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_trace_never_holds_the_api_key() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let trace = dir.path("live.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "hi",
        "--quiet",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-payloads",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.contains("Mexico City"),
        "payloads were asked for: {text}"
    );
    assert!(!text.contains(TEST_KEY));
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_cancels_the_run_drains_the_tool_and_exits_130() {
    let dir = AgentDir::new(
        r#"name = "slow"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "slow"
command = ["sh", "-c", "echo $$ > started; sleep 30"]
"#,
    );
    dir.write(
        "script.json",
        r#"[{"tool_calls": [{"id": "c1", "name": "slow", "arguments": {}}]}, {"text": "never"}]"#,
    );
    let agent = dir.agent();
    let started = dir.path("started");
    let out = tokio::task::spawn_blocking(move || {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["run", agent.to_str().unwrap(), "--input", "x", "--json"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        for _ in 0..500 {
            if std::fs::read_to_string(&started).is_ok_and(|s| !s.trim().is_empty()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let began = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "cancellation took too long"
        );
        out
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(130), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "cancelled");
    assert_eq!(v["tool_calls"][0]["ok"], false);
    let pid: u32 = std::fs::read_to_string(dir.path("started"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    });
    assert!(!alive, "the tool process {pid} outlived the cancelled run");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_example_agent_file_is_valid_and_plans_without_a_key() {
    for example in ["quickstart", "openai", "anthropic", "openai-responses"] {
        let path = format!(
            "{}/../../examples/{example}/agent.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        let out = agentloop_env(args(&["plan", &path, "--json"]), vec![]).await;
        assert_eq!(out.status.code(), Some(0), "{example}: {}", stderr(&out));
        let v = stdout_json(&out);
        assert_eq!(v["tools"].as_array().unwrap().len(), 2, "{example}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_keeps_the_session_across_inputs() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_text.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let out = chat(
        dir.agent(),
        "first question\n\nsecond question\n/exit\nnever sent\n",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let bodies = fake.bodies().await;
    assert_eq!(bodies.len(), 2, "one request per input, none after /exit");
    let users: Vec<String> = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, ["first question", "second question"]);
    assert!(
        bodies[1]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "assistant")
    );
    assert_eq!(
        stdout(&out)
            .matches("I'm unable to provide real-time weather")
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_input_is_a_usage_error_and_instructions_can_come_from_a_file() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let toml = openai_agent(&fake.uri(), "").replace(
        r#"instructions = "You answer weather questions.""#,
        r#"instructions_file = "prompt.md""#,
    );
    let dir = AgentDir::new(&toml);
    dir.write("prompt.md", "Instructions from a file.");
    let empty = agentloop(args(&["run", dir.agent().to_str().unwrap()])).await;
    assert_eq!(empty.status.code(), Some(2), "stderr: {}", stderr(&empty));
    assert!(stderr(&empty).contains("no input"));
    assert!(fake.requests().await.is_empty());
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "hi",
        "--quiet",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let bodies = fake.bodies().await;
    assert_eq!(bodies[0]["messages"][0]["role"], "system");
    assert_eq!(
        bodies[0]["messages"][0]["content"],
        "Instructions from a file."
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_key_in_the_environment_never_reaches_another_server() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    // A compatible server at its own base URL, no api_key_env: nothing is sent as a key, and the
    // output limit goes as `max_tokens`, which such servers read.
    let toml = openai_agent(&fake.uri(), "max_tokens = 64")
        .replace("api_key_env = \"AGENTLOOP_TEST_KEY\"\n", "");
    let dir = AgentDir::new(&toml);
    let out = agentloop_env(
        args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "hi",
            "--quiet",
        ]),
        vec![("OPENAI_API_KEY", "sk-openai-secret")],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let requests = fake.requests().await;
    assert_eq!(requests.len(), 1);
    assert!(requests[0].headers.get("authorization").is_none());
    let body = String::from_utf8_lossy(&requests[0].body).to_string();
    assert!(!body.contains("sk-openai-secret"));
    let bodies = fake.bodies().await;
    assert_eq!(bodies[0]["max_tokens"], 64);
    assert!(bodies[0].get("max_completion_tokens").is_none());
}

/// A command tool with `retries = 1` that fails on its first run: the run retries it, the model
/// reads only the success, and `--json`, `plan` and both trace formats show the failed attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_tool_with_retries_is_run_again_and_the_model_reads_only_the_success() {
    for trace in ["t.ndjson", "t.sqlite"] {
        let dir = AgentDir::new(
            r#"name = "retrying"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "get_weather"
command = ["sh", "-c", "if [ -e failed-once ]; then printf '7 degrees'; else touch failed-once; echo 'station busy' >&2; exit 1; fi"]
retries = 1
"#,
        );
        dir.write(
            "script.json",
            r#"[{"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}]}, {"text": "It is 7 degrees."}]"#,
        );
        let agent = dir.agent();
        let plan = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
        assert_eq!(plan.status.code(), Some(0), "stderr: {}", stderr(&plan));
        let plan = stdout_json(&plan);
        assert_eq!(plan["tools"][0]["retries"], 1);
        assert_eq!(plan["first_request"]["tools"][0]["retries"], 1);

        let trace_path = dir.path(trace);
        let out = agentloop(args(&[
            "run",
            agent.to_str().unwrap(),
            "--input",
            "Weather in Oslo?",
            "--json",
            "--trace",
            trace_path.to_str().unwrap(),
            "--trace-payloads",
        ]))
        .await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let v = stdout_json(&out);
        assert_eq!(v["stop_reason"], "finished");
        let call = &v["tool_calls"][0];
        assert_eq!(call["ok"], true, "{v}");
        assert_eq!(call["retries"], 1, "{v}");
        assert_eq!(call["output"], "7 degrees", "{v}");
        assert!(dir.path("failed-once").exists());

        let show = agentloop(args(&["trace", "show", trace_path.to_str().unwrap()])).await;
        assert_eq!(show.status.code(), Some(0), "stderr: {}", stderr(&show));
        let tree = stdout(&show);
        assert!(
            tree.contains("attempt 1 failed, retried") && tree.contains("station busy"),
            "{trace}: {tree}"
        );
    }
}

/// `retries` on a command tool not marked `idempotent`: a failed run of it (a timeout, a
/// non-zero exit) may already have done its work (`git push` then times out). The file still
/// runs as written (`retries` is the author's to give), and every command that loads it says so
/// on stderr, naming the fix; marked idempotent, it says nothing.
#[tokio::test(flavor = "multi_thread")]
async fn retries_on_a_command_tool_not_marked_idempotent_are_warned_of_and_run_as_written() {
    let dir = AgentDir::new(
        r#"name = "pusher"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "push"
command = ["sh", "-c", "echo ran >> runs; exit 1"]
retries = 2
"#,
    );
    dir.write(
        "script.json",
        r#"[{"tool_calls": [{"id": "c1", "name": "push", "arguments": {}}]}, {"text": "Pushed."}]"#,
    );
    let agent = dir.agent();
    let command = |verb: &'static str| {
        let mut words = vec![verb, agent.to_str().unwrap()];
        if verb == "run" {
            words.extend(["--input", "Push it.", "--json"]);
        }
        agentloop(args(&words))
    };
    let warned = |out: &std::process::Output| {
        let err = stderr(out);
        err.contains("agentloop: warning:")
            && err.contains("tools[0].retries")
            && err.contains("add `idempotent = true`")
    };
    let plan = command("plan").await;
    assert_eq!(plan.status.code(), Some(0), "stderr: {}", stderr(&plan));
    assert!(warned(&plan), "stderr: {}", stderr(&plan));
    let out = command("run").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(warned(&out), "stderr: {}", stderr(&out));
    assert_eq!(stdout_json(&out)["tool_calls"][0]["retries"], 2);
    let runs = std::fs::read_to_string(dir.path("runs")).unwrap();
    assert_eq!(runs.lines().count(), 3, "{runs}");

    // Marked idempotent: nothing to say.
    let text = std::fs::read_to_string(&agent).unwrap();
    std::fs::write(
        &agent,
        text.replace("retries = 2", "retries = 2\nidempotent = true"),
    )
    .unwrap();
    let plan = command("plan").await;
    assert_eq!(plan.status.code(), Some(0), "stderr: {}", stderr(&plan));
    assert!(!warned(&plan), "stderr: {}", stderr(&plan));
}

#[test]
fn a_closed_stderr_loses_the_progress_lines_not_the_run() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/agent.toml"
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["run", example, "--input", "x"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the first line: every write to stderr then fails (EPIPE).
    drop(child.stderr.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("73.4 °F"),
        "{out:?}"
    );
}

/// `[model] tool_choice` names a tool: the first request forces it, and once the model has
/// called a tool the next request leaves the choice to the model (else it could never answer).
#[tokio::test(flavor = "multi_thread")]
async fn a_named_tool_choice_forces_the_first_call_and_then_lets_the_model_answer() {
    let (fake, dir, out) = weather_run(r#"tool_choice = "get_weather""#, "--json").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout_json(&out)["stop_reason"], "finished");
    let bodies = fake.bodies().await;
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[0]["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(bodies[1]["tool_choice"], "auto", "{}", bodies[1]);
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Mexico City"})]);
}

/// A `tool_choice` that names no tool of the agent is refused at load, with its line, and
/// nothing is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_choice_naming_no_tool_is_refused_at_load() {
    let fake = FakeProvider::start("/v1/chat/completions", vec![]).await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), r#"tool_choice = "get_wether""#));
    let out = run_agent_json(&dir.agent(), "x").await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "agent_file.invalid");
    let problems = v["error"]["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["path"] == "model.tool_choice" && p["line"] == 11),
        "{problems:?}"
    );
    assert!(fake.requests().await.is_empty());
}
