#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The `[permissions]` table of an agent file, end to end: the agent runs against a fake provider
//! on loopback, and a tool that runs leaves a marker file (its logged stdin), so a denied call is
//! seen never to run. The tests run without a terminal: an asked call is denied unless `--yes` or
//! a saved answer allows it. (The prompt itself is tested over in-memory text in `approval.rs`.)

mod support;

use agentloop::Permission;
use serde_json::{Value, json};
use support::*;

const NO_TERMINAL: &str = "approval required but no terminal to ask (use --yes)";

/// One call of `get_weather`, then a final answer.
async fn one_call_then_text() -> FakeProvider {
    FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_single_tool_usage.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await
}

async fn run_json(dir: &AgentDir, extra: &[&str]) -> (std::process::Output, Value) {
    let agent = dir.agent();
    let mut a = vec!["run", agent.to_str().unwrap(), "--input", "hi", "--json"];
    a.extend_from_slice(extra);
    let out = agentloop(args(&a)).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    (out, v)
}

/// Asserts that the only call was denied with `reason`, never ran, and the model read why.
async fn assert_denied(dir: &AgentDir, fake: &FakeProvider, v: &Value, reason: &str) {
    assert_eq!(v["stop_reason"], "finished", "{v}");
    let call = &v["tool_calls"][0];
    assert_eq!(call["tool"], "get_weather");
    assert_eq!(call["status"], "denied", "{v}");
    assert_eq!(call["ok"], false);
    assert_eq!(call["error"]["code"], "denied");
    assert!(
        call["error"]["message"].as_str().unwrap().contains(reason),
        "{v}"
    );
    assert!(
        !dir.path("stdin.log").exists(),
        "the denied tool ran: {:?}",
        dir.tool_inputs()
    );
    let bodies = fake.bodies().await;
    let tool = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    let content = tool["content"].as_str().unwrap();
    assert!(
        content.starts_with("denied: ") && content.contains(reason),
        "{content}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_tool_never_runs_and_the_model_reads_why() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\ndeny = [\"get_weather\"]\n",
    ));
    let (_, v) = run_json(&dir, &[]).await;
    assert_denied(&dir, &fake, &v, "a permission rule denies this tool").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deny_wins_even_with_yes() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\ndefault = \"ask\"\ndeny = [\"get_weather\"]\n",
    ));
    let (_, v) = run_json(&dir, &["--yes"]).await;
    assert_denied(&dir, &fake, &v, "a permission rule denies this tool").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_without_a_terminal_and_without_yes_is_denied_with_that_reason() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\nask = [\"get_weather\"]\n",
    ));
    let (_, v) = run_json(&dir, &[]).await;
    assert_denied(&dir, &fake, &v, NO_TERMINAL).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_by_default_is_shown_denied_on_stderr_without_json() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\ndefault = \"ask\"\n",
    ));
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "hi",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "✗ get_weather rejected [call_LwxJUB9KppVyogRRLQsamRJv] denied: {NO_TERMINAL}"
        )),
        "{err}"
    );
    assert!(!err.contains("your approval"), "nobody is asked: {err}");
    assert!(!dir.path("stdin.log").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_with_yes_runs() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\nask = [\"get_weather\"]\n",
    ));
    let (_, v) = run_json(&dir, &["--yes"]).await;
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Mexico City"})]);
}

#[tokio::test(flavor = "multi_thread")]
async fn argument_rules_decide_by_the_call_s_arguments() {
    let rules = |prefix: &str| {
        format!(
            "[permissions]\ndefault = \"deny\"\n[[permissions.rules]]\ntool = \"get_weather\"\npermission = \"allow\"\ncommand_prefix = {{ field = \"city\", prefix = \"{prefix}\" }}\n"
        )
    };
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), &rules("Mexico")));
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");

    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), &rules("Lisbon")));
    let (_, v) = run_json(&dir, &[]).await;
    assert_denied(&dir, &fake, &v, "a permission rule denies this tool").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_batch_only_the_asked_call_is_denied_and_the_other_runs() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_parallel2_usage.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
    let toml = format!(
        r#"name = "two"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
[[tools]]
name = "get_country"
command = ["sh", "-c", "cat > country.ran; echo France"]
[[tools]]
name = "get_product_name"
command = ["sh", "-c", "cat > product.ran; echo Widget"]
[permissions]
ask = ["get_product_name"]
"#,
        fake.uri()
    );
    let dir = AgentDir::new(&toml);
    let (_, v) = run_json(&dir, &[]).await;
    let by_tool = |name: &str| {
        v["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tool"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_tool("get_country")["status"], "ok", "{v}");
    assert_eq!(by_tool("get_product_name")["status"], "denied", "{v}");
    assert!(dir.path("country.ran").exists());
    assert!(!dir.path("product.ran").exists());
}

/// A store file as an earlier run leaves it after an "always" answer for `get_weather`.
fn saved_store(dir: &AgentDir, permission: Permission) {
    let saved = json!({"rules": [{"tool": "get_weather", "permission": permission}]});
    std::fs::write(
        dir.path("permissions.json"),
        serde_json::to_string_pretty(&saved).unwrap(),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_yes_always_runs_an_asked_tool_without_yes_or_a_terminal() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\ndefault = \"ask\"\nask = [\"get_weather\"]\nstore = \"permissions.json\"\n",
    ));
    saved_store(&dir, Permission::Allow);
    let before = std::fs::read_to_string(dir.path("permissions.json")).unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");
    assert_eq!(dir.tool_inputs(), vec![json!({"city": "Mexico City"})]);
    assert_eq!(
        std::fs::read_to_string(dir.path("permissions.json")).unwrap(),
        before,
        "the agent file's own rules are never written to the store"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_no_always_denies_even_with_yes() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\nallow = [\"get_weather\"]\nstore = \"permissions.json\"\n",
    ));
    saved_store(&dir, Permission::Deny);
    let (_, v) = run_json(&dir, &["--yes"]).await;
    assert_denied(&dir, &fake, &v, "a permission rule denies this tool").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_tool_in_the_permissions_is_reported_with_its_key_path_and_line() {
    let text = openai_agent(
        "http://127.0.0.1:9",
        "[permissions]\nallow = [\"get_weather\"]\ndeny = [\"get_wether\"]\n",
    );
    let line = text.lines().position(|l| l.starts_with("deny")).unwrap() + 1;
    let dir = AgentDir::new(&text);
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "x",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "agent.toml:{line}:9: permissions.deny[0]: no tool named \"get_wether\" (declared: get_weather)"
        )),
        "{err}"
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(3));
    let problems = &stdout_json(&out)["error"]["problems"];
    assert_eq!(problems[0]["path"], "permissions.deny[0]", "{problems}");
    assert_eq!(problems[0]["line"], line);
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_the_permissions_and_the_saved_answers() {
    let dir = AgentDir::new(&openai_agent(
        "http://127.0.0.1:9",
        r#"[permissions]
default = "ask"
deny = ["get_weather"]
store = "permissions.json"
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "**/.env" }
"#,
    ));
    saved_store(&dir, Permission::Allow);
    let out = agentloop_env(
        args(&["plan", dir.agent().to_str().unwrap(), "--json"]),
        vec![],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let p = &stdout_json(&out)["permissions"];
    assert_eq!(p["default"], "ask");
    assert_eq!(p["deny"], json!(["get_weather"]));
    assert_eq!(p["allow"], json!([]));
    assert_eq!(
        p["rules"],
        json!([{"tool": "*", "permission": "deny", "arguments": {"kind": "path_glob", "field": "path", "glob": "**/.env"}}])
    );
    assert!(p["store"].as_str().unwrap().ends_with("permissions.json"));
    assert_eq!(
        p["saved"],
        json!([{"tool": "get_weather", "permission": "allow"}])
    );

    let out = agentloop_env(args(&["plan", dir.agent().to_str().unwrap()]), vec![]).await;
    let text = stdout(&out);
    assert!(text.contains("permissions  default ask\n"), "{text}");
    assert!(text.contains("        deny: get_weather\n"), "{text}");
    assert!(
        text.contains("        rule: * deny when path matches \"**/.env\"\n"),
        "{text}"
    );
    assert!(
        text.contains("permissions.json (saved: get_weather allow)"),
        "{text}"
    );

    let bare = AgentDir::new(&openai_agent("http://127.0.0.1:9", ""));
    let out = agentloop_env(args(&["plan", bare.agent().to_str().unwrap()]), vec![]).await;
    assert!(
        stdout(&out)
            .contains("permissions  default allow (no [permissions] table: every call runs)"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_uses_the_same_gate() {
    let fake = one_call_then_text().await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "[permissions]\nask = [\"get_weather\"]\n",
    ));
    let out = chat(dir.agent(), "weather?\n").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains(NO_TERMINAL), "{}", stderr(&out));
    assert!(!dir.path("stdin.log").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn help_documents_yes() {
    let out = agentloop(args(&["run", "--help"])).await;
    let help = stdout(&out);
    assert!(help.contains("--yes"), "{help}");
    assert!(help.contains("a `deny` still denies"), "{help}");
    assert!(!help.contains("reserved"), "{help}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_asks_nobody_and_saves_nothing() {
    let dir = AgentDir::new(
        r#"name = "dry"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "get_weather"
command = ["python3", "tool.py"]
[[tools]]
name = "get_time"
command = ["python3", "tool.py"]
[[tools]]
name = "delete_city"
command = ["python3", "tool.py"]
[permissions]
ask = ["get_weather"]
deny = ["delete_city"]
store = "permissions.json"
"#,
    );
    dir.write(
        "script.json",
        r#"[{"tool_calls": [
              {"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}},
              {"id": "c2", "name": "get_time", "arguments": {}},
              {"id": "c3", "name": "delete_city", "arguments": {}}]},
            {"text": "done"}]"#,
    );
    let (_, v) = run_json(&dir, &["--dry-run"]).await;
    let statuses: Vec<&str> = v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["denied", "skipped", "denied"], "{v}");
    assert!(
        v["tool_calls"][0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approval required (dry run: nobody is asked)"),
        "{v}"
    );
    assert!(!dir.path("stdin.log").exists());
    assert!(!dir.path("permissions.json").exists());
}
