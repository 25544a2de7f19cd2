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

use agentloop::permissions::Permission;
use serde_json::{Value, json};
use support::*;

const NO_TERMINAL: &str = "approval required but no terminal to ask (use --yes)";

/// `agentloop run AGENT --input hi --json` and `extra`, whatever its exit code.
async fn run_any(dir: &AgentDir, extra: &[&str]) -> std::process::Output {
    run_agent_json_with(&dir.agent(), "hi", extra).await
}

async fn run_json(dir: &AgentDir, extra: &[&str]) -> (std::process::Output, Value) {
    let out = run_any(dir, extra).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    (out, v)
}

/// Each call's status in a `--json` outcome, in order.
fn call_statuses(v: &Value) -> Vec<String> {
    v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap().to_owned())
        .collect()
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
path_glob = { field = "city", glob = "**/.env" }
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
        json!([{"tool": "*", "permission": "deny", "arguments": {"kind": "path_glob", "field": "city", "glob": "**/.env"}}])
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
        text.contains("        rule: * deny when city matches \"**/.env\"\n"),
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
    assert_eq!(call_statuses(&v), ["denied", "skipped", "denied"], "{v}");
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

/// A scripted agent with one tool, `shell`, whose `[permissions]` are `permissions`; its model
/// makes the calls of `args` (each `{"command"|"path": ...}`) in one batch, then answers.
fn scripted_shell(permissions: &str, calls: &[Value]) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "shell"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "shell"
command = ["python3", "tool.py"]
input_schema = {{ type = "object", properties = {{ command = {{ type = "string" }}, path = {{ type = "string" }} }} }}
{permissions}"#
    ));
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, a)| json!({"id": format!("c{i}"), "name": "shell", "arguments": a}))
        .collect();
    let script = json!([{ "tool_calls": calls }, { "text": "done" }]);
    dir.write("script.json", &script.to_string());
    dir
}

/// Each call's status, in order, and what the tool was given (the calls that ran).
async fn statuses(dir: &AgentDir) -> (Vec<String>, Vec<Value>) {
    let (_, v) = run_json(dir, &[]).await;
    (call_statuses(&v), dir.tool_inputs())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_always_never_settles_an_ask_rule_on_the_arguments() {
    let dir = scripted_shell(
        r#"[permissions]
ask = ["shell"]
store = "permissions.json"
[[permissions.rules]]
tool = "shell"
permission = "ask"
command_prefix = { field = "command", prefix = "rm" }
"#,
        &[json!({"command": "ls"}), json!({"command": "rm -rf notes"})],
    );
    dir.write(
        "permissions.json",
        r#"{"rules": [{"tool": "shell", "permission": "allow"}]}"#,
    );
    let (statuses, ran) = statuses(&dir).await;
    assert_eq!(statuses, ["ok", "denied"]);
    assert_eq!(ran, [json!({"command": "ls"})], "the rm never ran");
}

/// `[permissions]` under which the shell runs anything but `rm`, however it is spelled.
const DENY_RM_ALLOW_THE_REST: &str = r#"[permissions]
default = "allow"
[[permissions.rules]]
tool = "shell"
permission = "deny"
command_prefix = { field = "command", prefix = "rm" }
[[permissions.rules]]
tool = "shell"
permission = "allow"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_deny_prefix_is_not_walked_around_by_quotes_paths_or_launchers() {
    let hidden = [
        "\\rm -rf notes",
        "'rm' -rf notes",
        "/bin/rm -rf notes",
        "command rm -rf notes",
        "env X=1 rm -rf notes",
        "sh -c 'rm -rf notes'",
        "ls | xargs rm",
    ];
    let mut calls: Vec<Value> = hidden.iter().map(|c| json!({ "command": c })).collect();
    calls.push(json!({"command": "ls"}));
    let dir = scripted_shell(DENY_RM_ALLOW_THE_REST, &calls);
    let (statuses, ran) = statuses(&dir).await;
    let mut want = vec!["denied"; hidden.len()];
    want.push("ok");
    assert_eq!(statuses, want);
    assert_eq!(ran, [json!({"command": "ls"})], "no rm ran in any disguise");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_always_never_bypasses_a_deny_for_the_tool() {
    let dir = scripted_shell(
        "[permissions]\ndeny = [\"shell\"]\nstore = \"permissions.json\"\n",
        &[json!({"command": "ls"})],
    );
    dir.write(
        "permissions.json",
        r#"{"rules": [{"tool": "shell", "permission": "allow"}]}"#,
    );
    let (statuses, ran) = statuses(&dir).await;
    assert_eq!(statuses, ["denied"]);
    assert!(ran.is_empty());
}

// outside-paths: off (the tests below try hostile paths on purpose)
#[tokio::test(flavor = "multi_thread")]
async fn a_path_outside_the_agent_folder_is_never_allowed_by_a_path_rule() {
    let dir = scripted_shell(
        r#"[permissions]
default = "deny"
[[permissions.rules]]
tool = "shell"
permission = "allow"
path_glob = { field = "path", glob = "**" }
"#,
        &[],
    );
    // An absolute path inside the agent's folder counts as inside; the script needs the folder.
    let inside = dir.path("notes/x.txt").display().to_string();
    let script = json!([
        {"tool_calls": [
            {"id": "c0", "name": "shell", "arguments": {"path": "notes/./today.txt"}},
            {"id": "c1", "name": "shell", "arguments": {"path": "notes/../../secret.txt"}},
            {"id": "c2", "name": "shell", "arguments": {"path": "/etc/passwd"}},
            {"id": "c3", "name": "shell", "arguments": {"path": inside}}]},
        {"text": "done"}
    ]);
    dir.write("script.json", &script.to_string());
    let (statuses, ran) = statuses(&dir).await;
    assert_eq!(statuses, ["ok", "denied", "denied", "ok"]);
    assert_eq!(ran.len(), 2, "{ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_path_rules_cover_paths_outside_the_folder_and_win() {
    let dir = scripted_shell(
        r#"[permissions]
[[permissions.rules]]
tool = "shell"
permission = "allow"
path_glob = { field = "path", glob = "**" }
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "**/.env" }
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "/etc/**" }
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "../**" }
"#,
        &[
            json!({"path": "notes//.env"}),
            json!({"path": "notes/a/../.env"}),
            json!({"path": "/tmp/../etc/passwd"}),
            json!({"path": "notes/../../secret.txt"}),
            json!({"path": "notes/a.txt"}),
        ],
    );
    let (statuses, ran) = statuses(&dir).await;
    assert_eq!(statuses, ["denied", "denied", "denied", "denied", "ok"]);
    assert_eq!(ran, [json!({"path": "notes/a.txt"})]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chained_command_under_an_allow_prefix_falls_through_to_ask() {
    let rules = |chaining: &str| {
        format!(
            r#"[permissions]
default = "ask"
[[permissions.rules]]
tool = "shell"
permission = "allow"
command_prefix = {{ field = "command", prefix = "git status"{chaining} }}
"#
        )
    };
    let calls = [
        json!({"command": "git status -s"}),
        json!({"command": "git status; rm -rf ."}),
        json!({"command": "git status && rm -rf ."}),
        json!({"command": "git status | sh"}),
        json!({"command": "git status $(rm -rf .)"}),
        json!({"command": "git status\nrm -rf ."}),
        json!({"command": "git statusx"}),
    ];
    let dir = scripted_shell(&rules(""), &calls);
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        [
            "ok", "denied", "denied", "denied", "denied", "denied", "denied"
        ]
    );
    assert!(
        v["tool_calls"][1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains(NO_TERMINAL),
        "asked, not allowed: {v}"
    );
    assert_eq!(dir.tool_inputs(), [json!({"command": "git status -s"})]);

    let dir = scripted_shell(&rules(", allow_chaining = true"), &calls[..3]);
    let (statuses, _) = statuses(&dir).await;
    assert_eq!(statuses, ["ok", "ok", "ok"], "the rule says so");
    let agent = dir.agent();
    let out = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    assert_eq!(
        stdout_json(&out)["permissions"]["rules"][0]["arguments"]["allow_chaining"],
        true
    );
    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    assert!(
        stdout(&out).contains(
            "rule: shell allow when command starts with \"git status\" (chained commands too)"
        ),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_program_cannot_hide_a_second_command_nor_a_denied_subcommand_behind_options() {
    let dir = scripted_shell(
        r#"[permissions]
default = "ask"
[[permissions.rules]]
tool = "shell"
permission = "deny"
command_prefix = { field = "command", prefix = "git push" }
[[permissions.rules]]
tool = "shell"
permission = "allow"
command_prefix = { field = "command", prefix = "ls" }
[[permissions.rules]]
tool = "shell"
permission = "allow"
command_prefix = { field = "command", prefix = "git" }
"#,
        &[
            // Where `sh` is bash, `@P` runs the `$(rm -rf .)` spelled in `x`'s value.
            json!({"command": r"ls ${x:=$'\x24\x28rm\x20-rf\x20.\x29'} ${x@P}"}),
            json!({"command": "ls $((a[x]))"}),
            json!({"command": "git -C . push --force"}),
            json!({"command": "git --no-pager push"}),
            json!({"command": "ls ${HOME}"}),
            json!({"command": "git -C . status"}),
        ],
    );
    let (statuses, mut ran) = statuses(&dir).await;
    assert_eq!(
        statuses,
        ["denied", "denied", "denied", "denied", "ok", "ok"]
    );
    // The batch's calls run in parallel: the tool saw them in any order.
    ran.sort_by_key(|v| v["command"].as_str().map(str::to_owned));
    assert_eq!(
        ran,
        [
            json!({"command": "git -C . status"}),
            json!({"command": "ls ${HOME}"})
        ]
    );
}

/// A scripted agent with the built-in `shell` and `read_file`, both rooted in `work/`, whose `[permissions]` are `permissions`; its model makes `calls` (each
/// `[tool, arguments]`) in one batch, then answers.
fn scripted_builtins(permissions: &str, calls: &[(&str, Value)]) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "builtins"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "shell"
root = "work"
[[tools]]
builtin = "read_file"
root = "work"
{permissions}"#
    ));
    std::fs::create_dir_all(dir.path("work")).unwrap();
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (tool, a))| json!({"id": format!("c{i}"), "name": tool, "arguments": a}))
        .collect();
    let script = json!([{ "tool_calls": calls }, { "text": "done" }]);
    dir.write("script.json", &script.to_string());
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allow_prefix_on_the_shell_never_lets_its_other_commands_run_unasked() {
    let dir = scripted_builtins(
        r#"[[permissions.rules]]
tool = "shell"
permission = "allow"
command_prefix = { field = "command", prefix = "echo" }
"#,
        &[
            ("shell", json!({"command": "echo hello"})),
            ("shell", json!({"command": "touch pwned"})),
            ("shell", json!({"command": "echo hi; touch chained"})),
        ],
    );
    let (_, v) = run_json(&dir, &[]).await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(call_statuses(&v), ["ok", "denied", "denied"], "{v}");
    for asked in &calls[1..] {
        let message = asked["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(NO_TERMINAL),
            "asked, not allowed: {message}"
        );
    }
    assert!(
        !dir.path("work/pwned").exists(),
        "an unmatched command ran unasked"
    );
    assert!(
        !dir.path("work/chained").exists(),
        "a chained command ran unasked"
    );

    // `plan` says what an unmatched call of each tool gets.
    let agent = dir.agent();
    let out = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    let p = &stdout_json(&out)["permissions"];
    assert_eq!(
        p["unmatched"],
        json!({"shell": "ask", "read_file": "allow"}),
        "{p}"
    );
    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    let text = stdout(&out);
    let unmatched = text
        .lines()
        .find(|l| l.trim_start().starts_with("unmatched calls: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        unmatched.contains("shell ask") && unmatched.contains("read_file allow"),
        "{text}"
    );

    // A rule naming the whole tool is what lets the other commands run; a saved "always" too.
    let dir = scripted_builtins(
        "[permissions]\nallow = [\"shell\"]\n",
        &[("shell", json!({"command": "touch listed"}))],
    );
    let (statuses, _) = statuses(&dir).await;
    assert_eq!(statuses, ["ok"]);
    assert!(dir.path("work/listed").exists());
}

/// Runs `commands` through the shell under [`DENY_RM_ALLOW_THE_REST`], each of which would
/// remove `keep.txt` but the last, which makes `made`: all but the last are denied, `keep.txt`
/// stays (`why` says how an `rm` would have got past), and the last runs.
async fn assert_every_rm_denied_and_the_last_runs(commands: &[&str], why: &str) {
    let calls: Vec<(&str, Value)> = commands
        .iter()
        .map(|c| ("shell", json!({ "command": c })))
        .collect();
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    let mut want = vec!["denied"; commands.len() - 1];
    want.push("ok");
    assert_eq!(call_statuses(&v), want, "{v}");
    assert!(dir.path("work/keep.txt").exists(), "{why}");
    assert!(dir.path("work/made").exists(), "the last command runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rm_after_a_redirection_or_a_quoted_operator_is_denied() {
    // Each runs `rm` as its program, though a redirection's file, or the quoted tail of an
    // assignment or a file name, comes first in the text. The last: a command that starts with
    // a redirection and runs no `rm` runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            ">/dev/null rm -f keep.txt",
            "2>/dev/null rm -f keep.txt",
            "</dev/null rm -f keep.txt",
            ">|out rm -f keep.txt",
            "<<EOF rm -f keep.txt\nx\nEOF",
            ">'a;b' rm -f keep.txt",
            ">\"a b\" rm -f keep.txt",
            "x='a;b' rm -f keep.txt",
            "x=1 >out env rm -f keep.txt",
            ">made echo rm",
        ],
        "an rm behind a redirection or a quoted operator ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirection_before_the_program_in_a_quoted_substitution_or_a_piped_shell_is_read_past() {
    // In double quotes, a substitution's operators are quoted to a reading that follows
    // quotes; a shell fed by a pipe may have its redirection first. The last runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "echo \"$(2>/dev/null rm -f keep.txt)\"",
            "echo 'rm -f keep.txt' | >/dev/null sh",
            "printf 'r\\155 -f keep.txt' | >/dev/null sh",
            "echo 'touch made' | >/dev/null sh",
        ],
        "an rm behind a redirection ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cd_behind_a_launcher_an_assignment_or_a_redirection_moves_the_look_up() {
    // `sub/x.sh` removes `keep.txt`, the root's `x.sh` does not: the script the rule reads is
    // the one in the folder the `cd` moves to, wherever the `cd` stands. The last runs.
    let commands = [
        "command cd sub && sh x.sh",
        "X=1 cd sub && sh x.sh",
        "2>/dev/null cd sub && sh x.sh",
        "command cd sub && sh ok.sh",
    ];
    let calls: Vec<(&str, Value)> = commands
        .iter()
        .map(|c| ("shell", json!({ "command": c })))
        .collect();
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    std::fs::create_dir(dir.path("work/sub")).unwrap();
    std::fs::write(dir.path("work/x.sh"), "echo fine\n").unwrap();
    std::fs::write(dir.path("work/sub/x.sh"), "rm -f ../keep.txt\n").unwrap();
    std::fs::write(dir.path("work/sub/ok.sh"), "touch ../made\n").unwrap();
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        ["denied", "denied", "denied", "ok"],
        "{v}"
    );
    assert!(dir.path("work/keep.txt").exists(), "sub/x.sh's rm ran");
    assert!(dir.path("work/made").exists(), "the last runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_script_s_line_after_a_quote_or_a_continued_line_is_read_though_it_starts_with_a_hash() {
    // Scripts an earlier call could have written: in each, a line that starts with `#` is no
    // comment to the shell (it is inside a quoted string, or joined to the line before by a
    // backslash, where the `#` comments out the rest of that line only), and `rm` runs after
    // it. The last mentions `rm` in real comments only, and runs.
    let scripts = [
        ("a.sh", "echo hi \\\n# x\nrm -f keep.txt\n"),
        ("b.sh", "x='\n# '; rm -f keep.txt\n"),
        ("c.sh", "x=\"\n# \"; rm -f keep.txt\n"),
        ("d.sh", "x=\"$(echo \"\n# \")\"; rm -f keep.txt\n"),
        (
            "e.sh",
            "# rm; rm -rf / is what not to do\necho 'a' \\\n  \"b\"\n  # rm; then\ntouch made\n",
        ),
    ];
    let calls: Vec<(&str, Value)> = scripts
        .iter()
        .map(|(name, _)| ("shell", json!({ "command": format!("sh {name}") })))
        .collect();
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    for (name, text) in scripts {
        std::fs::write(dir.path(&format!("work/{name}")), text).unwrap();
    }
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        ["denied", "denied", "denied", "denied", "ok"],
        "{v}"
    );
    assert!(
        dir.path("work/keep.txt").exists(),
        "an rm after a line read as a comment ran"
    );
    assert!(dir.path("work/made").exists(), "the last script runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backslash_before_a_carriage_return_joins_no_lines() {
    // The shell joins lines at a backslash before a line feed only: before a carriage return
    // the backslash keeps it in `echo`'s words, and the next line is a command of its own. The
    // second is a script with such line ends; the last runs.
    let dir = scripted_builtins(
        DENY_RM_ALLOW_THE_REST,
        &[
            ("shell", json!({"command": "echo a \\\r\nrm -f keep.txt"})),
            ("shell", json!({"command": "sh crlf.sh"})),
            ("shell", json!({"command": "echo a \\\ntouch made"})),
        ],
    );
    std::fs::write(dir.path("work/crlf.sh"), "echo a \\\r\nrm -f keep.txt;\r\n").unwrap();
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(call_statuses(&v), ["denied", "denied", "ok"], "{v}");
    assert!(dir.path("work/keep.txt").exists(), "an rm after \\<CR> ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backtick_substitution_in_the_program_s_place_is_denied_and_one_in_an_argument_runs() {
    // The last: a substitution in an argument is not a program.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "`echo rm` -f keep.txt",
            "r`printf m` -f keep.txt",
            "\"`echo rm`\" -f keep.txt",
            "echo '`' ; `echo rm` -f keep.txt",
            "touch `echo made`",
        ],
        "an rm behind backticks ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_of_commands_the_shell_reads_with_dot_or_source_is_denied_as_one_piped_to_sh() {
    // Each writes the `rm` into a file, or hands it over on a descriptor, and has the shell
    // itself run it: no part of the chain starts with `rm`. The last: a file of commands no
    // rule matches runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "echo 'rm -f keep.txt' > f; . ./f",
            "echo 'rm -f keep.txt' > g && source ./g",
            ". /dev/stdin <<< 'rm -f keep.txt'",
            "echo 'touch made' > h; . ./h",
        ],
        "an rm the shell read from a file ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_a_program_builds_and_feeds_a_shell_is_denied_as_one_that_cannot_be_read() {
    // Each has a program build `rm -f keep.txt` (printf's octal escapes, `rev`, `base64 -d`,
    // xargs's replace-string) and a shell run it; no word of the chain is `rm`. The last: a
    // command written out as it is, piped to a shell, is read by its words and runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "printf 'r\\155 -f keep.txt' | sh",
            "echo 'txt.peek f- mr' | rev | sh",
            "echo cm0gLWYga2VlcC50eHQ= | base64 -d | sh",
            "printf 'r\\155' | xargs -I@ sh -c '@ -f keep.txt'",
            "printf 'r\\155 -f keep.txt' > t.sh; sh t.sh",
            "sh -c \"printf 'r\\\\155 -f keep.txt' | sh\"",
            "echo 'touch made' | sh",
        ],
        "an rm a program built ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn git_s_push_plumbing_and_its_own_programs_are_asked_about_as_git_push() {
    // `git send-pack` and git's `git-push` program, by its path, push as `git push` does:
    // asked about (no terminal: denied), nothing reaches the bare remote (inside the shell's
    // root, where its sandbox lets a push write). The last runs.
    let exec_path = std::process::Command::new("git")
        .arg("--exec-path")
        .output()
        .unwrap();
    let exec_path = String::from_utf8(exec_path.stdout).unwrap();
    let calls = shell_calls(vec![
        json!({"command": "git send-pack remote.git main"}),
        json!({"command": format!("{}/git-push origin main", exec_path.trim())}),
        json!({"command": "git -c alias.sp=send-pack sp remote.git main"}),
        json!({"command": "git log --oneline > made"}),
    ]);
    let dir = scripted_builtins(DENY_RM_ASK_PUSH, &calls);
    let work = dir.path("work");
    let remote = work.join("remote.git");
    repository_pushing_to(&work, &remote);
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        ["denied", "denied", "denied", "ok"],
        "{v}"
    );
    assert_nothing_pushed(&remote);
    assert!(work.join("made").exists(), "the last command runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_with_argument_rules_asks_about_the_calls_none_matches() {
    let dir = scripted_shell(
        r#"[permissions]
default = "allow"
[[permissions.rules]]
tool = "shell"
permission = "deny"
command_prefix = { field = "command", prefix = "rm" }
"#,
        &[
            json!({"command": "rm -rf notes"}),
            json!({"command": "curl -o page.html x"}),
        ],
    );
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(v["tool_calls"][0]["status"], "denied");
    assert_eq!(v["tool_calls"][1]["status"], "denied", "{v}");
    assert!(
        v["tool_calls"][1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains(NO_TERMINAL),
        "asked, not given the default: {v}"
    );
    assert!(dir.tool_inputs().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_on_an_argument_the_tool_does_not_take_is_an_error_at_its_line() {
    let dir = scripted_builtins(
        r#"[[permissions.rules]]
tool = "read_file"
permission = "deny"
path_glob = { field = "file", glob = "**/.env" }
[[permissions.rules]]
tool = "*"
permission = "deny"
command_prefix = { field = "cmd", prefix = "rm" }
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "**/.env" }
"#,
        &[("read_file", json!({"path": ".env"}))],
    );
    let out = run_any(&dir, &[]).await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let problems = stdout_json(&out)["error"]["problems"].clone();
    let got: Vec<(String, u64, u64)> = problems
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_owned(),
                p["line"].as_u64().unwrap(),
                p["column"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("permissions.rules[0].path_glob.field".to_owned(), 14, 23),
            (
                "permissions.rules[1].command_prefix.field".to_owned(),
                18,
                28
            ),
        ],
        "{problems}"
    );
    let message = problems[0]["message"].as_str().unwrap();
    assert!(message.contains("no argument \"file\""), "{message}");
    assert!(
        message.contains("path"),
        "names the arguments it has: {message}"
    );
    assert!(!dir.path("stdin.log").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_inside_the_workspace_cannot_walk_around_a_deny_glob() {
    let dir = scripted_builtins(
        r#"[[permissions.rules]]
tool = "read_file"
permission = "deny"
path_glob = { field = "path", glob = "secrets/**" }
[[permissions.rules]]
tool = "read_file"
permission = "allow"
path_glob = { field = "path", glob = "ok/**" }
"#,
        &[
            ("read_file", json!({"path": "link/key.txt"})),
            ("read_file", json!({"path": "ok/today.txt"})),
            ("read_file", json!({"path": "ok/other/x.txt"})),
        ],
    );
    for folder in ["work/secrets", "work/ok", "work/private"] {
        std::fs::create_dir_all(dir.path(folder)).unwrap();
    }
    dir.write("work/secrets/key.txt", "the secret");
    dir.write("work/ok/today.txt", "today's notes");
    dir.write("work/private/x.txt", "private");
    std::os::unix::fs::symlink("secrets", dir.path("work/link")).unwrap();
    std::os::unix::fs::symlink("../private", dir.path("work/ok/other")).unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(call_statuses(&v), ["denied", "ok", "denied"], "{v}");
    let message = |i: usize| calls[i]["error"]["message"].as_str().unwrap().to_owned();
    assert!(message(0).contains("a permission rule denies"), "{v}");
    assert!(
        message(2).contains(NO_TERMINAL),
        "an allow glob judges where a link leads: {v}"
    );
    assert!(
        calls[1]["output"]
            .as_str()
            .unwrap()
            .contains("today's notes")
    );
    assert!(!v.to_string().contains("the secret"), "{v}");
}

/// One batch: the shell (allowed) makes `notes.txt` a link to `secrets/key.txt`, and then
/// `read_file notes.txt` reads it. The gate judges both calls before either runs, while
/// `notes.txt` is not yet a link; the shell makes the batch run in order, so the read comes
/// after the link. `read_file` has a `secrets_rule` (`deny` or `ask`) on `secrets/**`, is asked
/// about `notes.txt` itself when `ask_notes`, and is allowed every other path.
fn link_then_read(secrets_rule: &str, ask_notes: bool) -> AgentDir {
    let notes = if ask_notes {
        "[[permissions.rules]]\ntool = \"read_file\"\npermission = \"ask\"\npath_glob = { field = \"path\", glob = \"notes.txt\" }\n"
    } else {
        ""
    };
    let dir = scripted_builtins(
        &format!(
            r#"[[permissions.rules]]
tool = "shell"
permission = "allow"
[[permissions.rules]]
tool = "read_file"
permission = "{secrets_rule}"
path_glob = {{ field = "path", glob = "secrets/**" }}
{notes}[[permissions.rules]]
tool = "read_file"
permission = "allow"
path_glob = {{ field = "path", glob = "**" }}
"#
        ),
        &[
            (
                "shell",
                json!({"command": "ln -s secrets/key.txt notes.txt"}),
            ),
            ("read_file", json!({"path": "notes.txt"})),
        ],
    );
    std::fs::create_dir_all(dir.path("work/secrets")).unwrap();
    dir.write("work/secrets/key.txt", "the secret");
    dir
}

/// Runs [`link_then_read`]'s batch with `extra`: the link was made, and the read was refused
/// with `code` without showing the secret. The run's `--json` outcome.
async fn assert_read_through_the_new_link_refused(
    dir: &AgentDir,
    extra: &[&str],
    code: &str,
) -> Value {
    let (_, v) = run_json(dir, extra).await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["status"], "ok", "the link was made: {v}");
    assert!(
        std::fs::symlink_metadata(dir.path("work/notes.txt"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(calls[1]["error"]["code"], code, "{v}");
    assert!(!v.to_string().contains("the secret"), "{v}");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_made_by_another_call_of_the_batch_cannot_walk_around_a_deny_glob() {
    let dir = link_then_read("deny", false);
    assert_read_through_the_new_link_refused(&dir, &[], "path_denied").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_made_by_another_call_of_the_batch_cannot_walk_around_an_ask_glob_unasked() {
    // The gate let `read_file notes.txt` run without asking (no link yet, and `**` allows it);
    // when it runs, the path leads to a file an `ask` rule covers, and nobody approved it.
    let dir = link_then_read("ask", false);
    let v = assert_read_through_the_new_link_refused(&dir, &[], "path_not_approved").await;
    let message = v["tool_calls"][1]["error"]["message"].as_str().unwrap();
    assert!(message.contains("call again to be asked"), "{v}");
    // Called again, the call is judged with the link in place: asked about (and, with nobody
    // to ask, denied).
    let v = run_json(&dir, &[]).await.1;
    assert_eq!(v["tool_calls"][1]["status"], "denied", "{v}");
    assert!(!v.to_string().contains("the secret"), "{v}");
    // `--yes` approves the calls the gate asks about; this one it was not asked about.
    let dir = link_then_read("ask", false);
    assert_read_through_the_new_link_refused(&dir, &["--yes"], "path_not_approved").await;
}

/// One batch: the shell (allowed) makes `notes.txt` a link to `secrets/key.txt` and `notes` a
/// link to `secrets`, then `grep` searches the file and `list_dir` and `glob` the folder by those
/// names. The gate judges every call before any runs, when neither name is a link yet. `grep`
/// has a `deny` rule on `secrets/**`; `list_dir` and `glob` one on the folder `secrets` itself,
/// which a walk from the root honours by not entering it, but which the folder's entries
/// (`secrets/key.txt`) do not match.
#[tokio::test(flavor = "multi_thread")]
async fn a_link_made_by_another_call_of_the_batch_cannot_walk_a_search_or_listing_around_a_deny_glob()
 {
    let mut rules =
        String::from("[[permissions.rules]]\ntool = \"shell\"\npermission = \"allow\"\n");
    for (tool, glob) in [
        ("grep", "secrets/**"),
        ("list_dir", "secrets"),
        ("glob", "secrets"),
    ] {
        rules.push_str(&format!(
            "[[permissions.rules]]\ntool = \"{tool}\"\npermission = \"deny\"\npath_glob = {{ field = \"path\", glob = \"{glob}\" }}\n[[permissions.rules]]\ntool = \"{tool}\"\npermission = \"allow\"\n"
        ));
    }
    let dir = scripted_builtins(
        &format!(
            "[[tools]]\nbuiltin = \"grep\"\nroot = \"work\"\n[[tools]]\nbuiltin = \"list_dir\"\nroot = \"work\"\n[[tools]]\nbuiltin = \"glob\"\nroot = \"work\"\n{rules}"
        ),
        &[
            (
                "shell",
                json!({"command": "ln -s secrets/key.txt notes.txt && ln -s secrets notes"}),
            ),
            ("grep", json!({"pattern": ".", "path": "notes.txt"})),
            ("list_dir", json!({"path": "notes"})),
            ("glob", json!({"pattern": "**", "path": "notes"})),
        ],
    );
    std::fs::create_dir_all(dir.path("work/secrets")).unwrap();
    dir.write("work/secrets/key.txt", "the secret");
    dir.write("work/secrets/passwords.txt", "");
    let (_, v) = run_json(&dir, &[]).await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["status"], "ok", "the links were made: {v}");
    for (i, call) in calls.iter().enumerate().skip(1) {
        assert_eq!(call["error"]["code"], "path_denied", "call {i}: {v}");
    }
    assert!(!v.to_string().contains("the secret"), "{v}");
    assert!(!v.to_string().contains("passwords"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_a_person_approved_reads_what_its_path_leads_to_when_it_runs() {
    // `read_file notes.txt` is asked about: approved with `--yes`, it reads the file its path
    // leads to once the shell made it a link.
    let read_the_secret = |v: &Value| {
        assert_eq!(call_statuses(v), ["ok", "ok"], "{v}");
        let read = v["tool_calls"][1]["output"].as_str().unwrap();
        assert!(read.contains("the secret"), "{v}");
    };
    read_the_secret(&run_json(&link_then_read("ask", true), &["--yes"]).await.1);

    // A durable run suspends on it; the answer recorded with `approve` is the approval of
    // this very call when the run resumes.
    let dir = link_then_read("ask", true);
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let suspended = run_until_suspended(&dir, j).await;
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        suspended["pending_approvals"][0]["call_id"], "c1",
        "{suspended}"
    );
    assert!(
        !dir.path("work/notes.txt").exists(),
        "nothing of the batch ran before the answer"
    );
    let out = allow_and_resume(&id, "c1", j).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    read_the_secret(&stdout_json(&out));
}

/// `agentloop run --journal j --json`, which must suspend: its `--json` outcome.
async fn run_until_suspended(dir: &AgentDir, j: &str) -> Value {
    let out = run_any(dir, &["--journal", j]).await;
    assert_eq!(out.status.code(), Some(8), "suspended: {}", stderr(&out));
    stdout_json(&out)
}

/// `agentloop approve RUN --call CALL --allow` on journal `j` (which must succeed), then
/// `agentloop resume RUN --json`: the resumed run's output.
async fn allow_and_resume(run_id: &str, call: &str, j: &str) -> std::process::Output {
    let ok = agentloop(args(&[
        "approve",
        run_id,
        "--call",
        call,
        "--allow",
        "--journal",
        j,
    ]))
    .await;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    agentloop(args(&["resume", run_id, "--journal", j, "--json"])).await
}

#[tokio::test(flavor = "multi_thread")]
async fn grep_glob_and_list_dir_on_the_root_never_reveal_a_denied_file() {
    let dir = AgentDir::new(
        r#"name = "walks"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "grep"
root = "work"
[[tools]]
builtin = "glob"
root = "work"
[[tools]]
builtin = "list_dir"
root = "work"
[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = { field = "path", glob = "**/.env" }
[[permissions.rules]]
tool = "*"
permission = "ask"
path_glob = { field = "path", glob = "drafts/**" }
"#,
    );
    for folder in ["work/sub", "work/drafts"] {
        std::fs::create_dir_all(dir.path(folder)).unwrap();
    }
    dir.write("work/.env", "KEY=root-hidden\n");
    dir.write("work/sub/.env", "KEY=sub-hidden\n");
    dir.write("work/drafts/plan.md", "KEY=draft-hidden\n");
    dir.write("work/notes.md", "KEY=notes-found\n");
    dir.write("work/sub/app.toml", "KEY=app-found\n");
    // Another name of a denied file, inside the workspace: the rule sees where it leads.
    std::os::unix::fs::symlink(".env", dir.path("work/alias")).unwrap();
    let calls = [
        ("grep", json!({"pattern": "KEY", "path": "."})),
        ("glob", json!({"pattern": "**/*", "path": "."})),
        ("list_dir", json!({"path": "."})),
        ("list_dir", json!({"path": "sub"})),
    ];
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (tool, a))| json!({"id": format!("c{i}"), "name": tool, "arguments": a}))
        .collect();
    dir.write(
        "script.json",
        &json!([{ "tool_calls": calls }, { "text": "done" }]).to_string(),
    );
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(call_statuses(&v), ["ok", "ok", "ok", "ok"], "{v}");
    let output = |i: usize| v["tool_calls"][i]["output"].as_str().unwrap().to_owned();
    assert_eq!(
        output(0),
        "notes.md:1: KEY=notes-found\nsub/app.toml:1: KEY=app-found\n\
         [4 entries left out by the permission rules]"
    );
    assert_eq!(
        output(1),
        "notes.md\nsub/app.toml\n[4 entries left out by the permission rules]"
    );
    assert_eq!(
        output(2),
        "drafts/\nnotes.md (16 bytes)\nsub/\n[2 entries left out by the permission rules]"
    );
    assert_eq!(
        output(3),
        "app.toml (14 bytes)\n[1 entry left out by the permission rules]"
    );
    let all = v.to_string();
    for hidden in ["hidden", ".env", "plan.md", "alias"] {
        assert!(!all.contains(hidden), "{hidden} shown: {v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_answers_only_its_own_call_never_a_later_one_reusing_its_id() {
    // The provider sends the id `c0` in both turns: the first call is approved, once; the second,
    // another command under the same id, must be asked about again, not run on the old answer.
    let dir = scripted_shell("[permissions]\nask = [\"shell\"]\n", &[]);
    let script = json!([
        {"tool_calls": [{"id": "c0", "name": "shell", "arguments": {"command": "echo one"}}]},
        {"tool_calls": [{"id": "c0", "name": "shell", "arguments": {"command": "rm -rf ~"}}]},
        {"text": "done"}
    ]);
    dir.write("script.json", &script.to_string());
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let suspended = run_until_suspended(&dir, j).await;
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    assert_eq!(suspended["pending_approvals"][0]["call_id"], "c0");

    let out = allow_and_resume(&id, "c0", j).await;
    assert_eq!(
        out.status.code(),
        Some(8),
        "the second call waits for its own answer: {}",
        stdout(&out)
    );
    let resumed = stdout_json(&out);
    let pending = &resumed["pending_approvals"];
    assert_eq!(pending.as_array().unwrap().len(), 1, "{resumed}");
    assert_eq!(pending[0]["call_id"], "c0_2", "a repeated id is renamed");
    assert_eq!(pending[0]["arguments"], json!({"command": "rm -rf ~"}));
    assert_eq!(dir.tool_inputs(), [json!({"command": "echo one"})]);

    let listed = agentloop(args(&["approvals", "list", "--journal", j, "--json"])).await;
    let listed = stdout_json(&listed);
    let waiting: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["answer"].is_null())
        .collect();
    assert_eq!(waiting.len(), 1, "{listed}");
    assert_eq!(waiting[0]["call_id"], "c0_2");
}

/// A command that looks like `ls` on a line cut at 160 characters: the rest comes after spaces,
/// behind a bidi override.
fn hidden_command() -> String {
    format!("ls{}; touch pwned #\u{202e}txt.sl", " ".repeat(200))
}

#[test]
fn the_prompt_on_a_terminal_shows_the_whole_call_with_invisible_characters_escaped() {
    // `script` gives the command a terminal (stdin and stderr), as a person's would be; the
    // answer `n` comes through it.
    let dir = scripted_builtins("", &[("shell", json!({"command": hidden_command()}))]);
    let command = format!(
        "{} run {} --input hi",
        env!("CARGO_BIN_EXE_agentloop"),
        dir.agent().display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path("."))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("util-linux `script` gives the test a terminal");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"n\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert!(screen.contains("need"), "the prompt was shown: {screen}");
    assert!(
        screen.contains("; touch pwned #\\u{202e}txt.sl"),
        "the whole command, its bidi override escaped: {screen}"
    );
    assert!(!screen.contains('\u{202e}'), "{screen}");
    assert!(!dir.path("work/pwned").exists(), "answered no");
}

#[tokio::test(flavor = "multi_thread")]
async fn streamed_model_text_reaches_the_terminal_without_escape_sequences() {
    let dir = scripted_builtins("", &[]);
    let script = json!([{
        "text": "hello \u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[1mworld\u{1b}[0m \u{9b}31m!"
    }]);
    dir.write("script.json", &script.to_string());
    let agent = dir.agent();
    let out = agentloop(args(&["run", agent.to_str().unwrap(), "--input", "hi"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let shown = stderr(&out);
    assert!(shown.contains("hello world !"), "{shown}");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{9b}'),
        "{shown:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_program_runs_by_its_own_means_is_denied_as_the_program_would_be() {
    // Each would remove `keep.txt` (tried by hand with git 2.39, GNU tar 1.34, less 590,
    // coreutils' env, zip 3.0 and glibc's loader): the command is in git's configuration,
    // tar's checkpoint action, the input filter less runs, a string env splits, git's ext
    // transport, zip's test command, the program the dynamic loader is given, git's
    // configuration in its environment, the pager `git grep -O` opens the matches in. The last:
    // git's other configuration runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "git -c alias.x='!rm -f keep.txt' x",
            "git init -q . && git -c core.fsmonitor='rm -f keep.txt' status",
            "tar --checkpoint=1 --checkpoint-action=exec='rm -f keep.txt' -cf /dev/null keep.txt",
            "LESSOPEN='rm -f keep.txt %s' less keep.txt",
            "env -S'rm -f keep.txt'",
            "git -c protocol.ext.allow=always clone 'ext::rm -f keep.txt' x",
            "zip -T -TT 'rm -f keep.txt' a.zip keep.txt",
            "/lib64/ld-linux-x86-64.so.2 /bin/rm -f keep.txt",
            "GIT_CONFIG_PARAMETERS=\"'alias.x=!rm -f keep.txt'\" git x",
            "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.x GIT_CONFIG_VALUE_0='!rm -f keep.txt' git x",
            "git grep -O'rm -f' kept",
            "git -c user.name=me -c alias.x='!touch made' x",
        ],
        "an rm run by a program's own means ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_whose_own_language_runs_a_command_is_denied_under_a_deny_on_any_program() {
    // An awk program, a sed script, a vim command line, inline python, a make rule given on
    // the command line, gdb's commands and sqlite3's dot-commands: no prefix reads them, so a
    // deny on `rm` matches each call that may run a command through one (each would remove
    // `keep.txt`: mawk 1.3.4, GNU sed 4.9, vim 9.0, GNU make 4.3, gdb 13, sqlite3 3.40). The
    // last: an awk program that runs nothing is not judged so.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "awk 'BEGIN { system(\"r\" \"m -f keep.txt\") }'",
            "awk 'BEGIN { print \"rm -f keep.txt\" | \"sh\" }'",
            "sed -n '1e rm -f keep.txt' keep.txt",
            "sed 's/.*/rm -f keep.txt/e' keep.txt",
            "vim -es -c '!rm -f keep.txt' -c q",
            "python3 -c 'import os; os.system(\"r\" + \"m -f keep.txt\")'",
            "make --eval='x: ; rm -f keep.txt' x",
            "gdb -batch -ex '!rm -f keep.txt'",
            "sqlite3 :memory: '.shell rm -f keep.txt'",
            "awk '{ print $1 }' keep.txt > made",
        ],
        "an rm run by an awk, sed, vim, python or make program ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_to_a_denied_program_is_judged_as_that_program_before_and_as_the_command_runs() {
    // `tidy` is a link to `rm` (made before the run): the gate sees it lead to `rm`. `sweep` is
    // one in `sub`, where its call runs (`cwd`): the gate looked in the root and let it
    // through, the shell, looking where it runs, refuses it; a `cd sub` in the command is
    // followed by the gate. `wipe` is made by a call of the same batch in a way no prefix
    // reads (perl's `symlink`), after the gate judged `./wipe`: refused as it runs. `ln`
    // making another name for `rm` is itself denied. The last: a link to a program no rule
    // denies runs.
    let calls: Vec<(&str, Value)> = [
        json!({"command": "./tidy -f keep.txt"}),
        json!({"command": "./sweep -f ../keep.txt", "cwd": "sub"}),
        json!({"command": "cd sub && ./sweep -f ../keep.txt"}),
        json!({"command": "perl -e 'symlink \"/bin/rm\", \"wipe\"'"}),
        json!({"command": "./wipe -f keep.txt"}),
        json!({"command": "ln -s /bin/rm t && ./t -f keep.txt"}),
        json!({"command": "ln -s /usr/bin/touch make-it && ./make-it made"}),
    ]
    .into_iter()
    .map(|a| ("shell", a))
    .collect();
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    std::fs::create_dir_all(dir.path("work/sub")).unwrap();
    std::os::unix::fs::symlink("/bin/rm", dir.path("work/tidy")).unwrap();
    std::os::unix::fs::symlink("/bin/rm", dir.path("work/sub/sweep")).unwrap();
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(
        call_statuses(&v),
        ["denied", "error", "denied", "ok", "error", "denied", "ok"],
        "{v}"
    );
    for refused in [1, 4] {
        assert_eq!(calls[refused]["error"]["code"], "command_denied", "{v}");
    }
    assert!(dir.path("work/wipe").is_symlink(), "the link was made: {v}");
    assert!(
        dir.path("work/keep.txt").exists(),
        "an rm behind a link ran"
    );
    assert!(dir.path("work/made").exists(), "the last command runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rm_after_an_assignment_or_option_whose_value_holds_a_slash_is_denied() {
    // The reader took `D=a/b` and `--chdir=../work` for programs (their file names `b`, `work`) and
    // looked no further. The last runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "D=a/b rm -f keep.txt",
            "D=a/b; E=/c rm -f keep.txt",
            "P=./bin env rm -f keep.txt",
            "env --chdir=../work rm -f keep.txt",
            "D=a/b touch made",
        ],
        "an rm behind an assignment of a path ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_to_a_denied_program_in_a_folder_the_command_moves_to_unnamed_is_denied() {
    // `sub/inner/tidy` is a link to `rm`. Each command enters `sub/inner` in a way its words
    // do not name as a folder (the folder `CDPATH` finds, `~+` for the working folder, the
    // last folder of `cd -`, a variable; two moves taken together), where `./tidy` runs `rm`:
    // the gate does not follow those, so a deny on `rm` matches (`~+` is bash's: `sh` is dash
    // here). The last moves as unnamed and runs a program by its bare name, which the move
    // does not change: it runs.
    let tidy = "./tidy -f ../../keep.txt";
    let commands = [
        format!("CDPATH=sub cd inner >/dev/null && {tidy}"),
        format!("bash -c 'cd ~+/sub/inner && {tidy}'"),
        format!("OLDPWD=sub/inner cd - >/dev/null && {tidy}"),
        format!("D=sub/inner; cd \"$D\" && {tidy}"),
        format!("cd sub; cd inner && {tidy}"),
        "cd - 2>/dev/null; touch made".to_owned(),
    ];
    let calls: Vec<(&str, Value)> = commands
        .iter()
        .map(|c| ("shell", json!({ "command": c })))
        .collect();
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    std::fs::create_dir_all(dir.path("work/sub/inner")).unwrap();
    std::os::unix::fs::symlink("/bin/rm", dir.path("work/sub/inner/tidy")).unwrap();
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    let mut want = vec!["denied"; commands.len() - 1];
    want.push("ok");
    assert_eq!(call_statuses(&v), want, "{v}");
    assert!(
        dir.path("work/keep.txt").exists(),
        "an rm behind a link in a folder entered unnamed ran"
    );
    assert!(dir.path("work/made").exists(), "the last command runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_to_the_home_folder_is_followed_by_a_deny_prefix() {
    // The home folder (`HOME` of agentloop, so of its shell) holds a repository `repo` with a
    // link `tidy` to `rm`. `cd ~/repo` enters it: `git status` there runs (its repository has
    // nothing that runs `rm`), `./tidy` there is `rm` and is denied; a home folder the command
    // sets is another folder, not followed.
    let calls = shell_calls(vec![
        json!({"command": "cd ~/repo && git status && touch ../../made"}),
        json!({"command": "cd ~/repo && ./tidy -f ../../keep.txt"}),
        json!({"command": "HOME=/tmp; cd ~/repo && git status"}),
    ]);
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    let repo = dir.path("work/home/repo");
    std::fs::create_dir_all(&repo).unwrap();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    std::os::unix::fs::symlink("/bin/rm", repo.join("tidy")).unwrap();
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    let home: &'static str = Box::leak(
        dir.path("work/home")
            .to_str()
            .unwrap()
            .to_owned()
            .into_boxed_str(),
    );
    let agent = dir.agent();
    let out = agentloop_env(
        args(&["run", agent.to_str().unwrap(), "--input", "hi", "--json"]),
        vec![
            ("AGENTLOOP_TEST_KEY", TEST_KEY),
            ("OPENAI_API_KEY", TEST_KEY),
            ("HOME", home),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(call_statuses(&v), ["ok", "denied", "denied"], "{v}");
    assert!(dir.path("work/made").exists(), "git status ran: {v}");
    assert!(dir.path("work/keep.txt").exists(), "an rm in ~/repo ran");
}

/// Each of `args` as a call of the shell.
fn shell_calls(args: Vec<Value>) -> Vec<(&'static str, Value)> {
    args.into_iter().map(|a| ("shell", a)).collect()
}

/// Writes `text` to `path`, as a program anyone may run.
fn write_program(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_run_in_a_container_or_pod_is_judged_as_that_command() {
    // docker's and kubectl's own clients (no daemon, no cluster here: what counts is that the
    // gate never lets them start the `rm`). Their subcommands that run nothing of the
    // caller's are not judged so: the last runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "docker exec -it ctr rm -f keep.txt",
            "docker run --rm -v .:/w -w /w alpine rm -f keep.txt",
            "docker compose exec web rm -f keep.txt",
            "podman run --rm alpine sh -c 'rm -f keep.txt'",
            "kubectl exec -it pod -c app -- rm -f keep.txt",
            "docker rm ctr 2>/dev/null; touch made",
        ],
        "an rm run through a container launcher ran",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_script_the_shell_reads_is_judged_by_its_commands_before_and_as_it_runs() {
    // `clean.sh` (there before the run) removes `keep.txt`: every way of having a shell run
    // it is denied by the gate. `later.sh` is written by a call of the same batch, after the
    // gate judged `sh later.sh` (then missing): the shell, reading it as it runs, refuses it.
    // The last: a script that runs nothing denied runs.
    let calls = shell_calls(vec![
        json!({"command": "sh clean.sh"}),
        json!({"command": ". ./clean.sh"}),
        json!({"command": "./clean.sh"}),
        json!({"command": "BASH_ENV=clean.sh bash -c true"}),
        json!({"command": "bash --rcfile clean.sh -c true"}),
        json!({"command": "printf 'rm -f keep.txt\\n' > later.sh"}),
        json!({"command": "sh later.sh"}),
        json!({"command": "sh ok.sh"}),
    ]);
    let dir = scripted_builtins(DENY_RM_ALLOW_THE_REST, &calls);
    std::fs::write(dir.path("work/keep.txt"), "kept").unwrap();
    write_program(&dir.path("work/clean.sh"), "#!/bin/sh\nrm -f keep.txt\n");
    std::fs::write(dir.path("work/ok.sh"), "#!/bin/sh\ntouch made\n").unwrap();
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        [
            "denied", "denied", "denied", "denied", "denied", "ok", "error", "ok"
        ],
        "{v}"
    );
    assert_eq!(v["tool_calls"][6]["error"]["code"], "command_denied", "{v}");
    assert!(
        dir.path("work/later.sh").exists(),
        "the script was written: {v}"
    );
    assert!(
        dir.path("work/keep.txt").exists(),
        "an rm in a script a shell read ran"
    );
    assert!(dir.path("work/made").exists(), "the last command runs: {v}");
}

/// `[permissions]` under which the shell runs anything but `rm`, and asks about `git push`.
const DENY_RM_ASK_PUSH: &str = r#"[permissions]
default = "allow"
[[permissions.rules]]
tool = "shell"
permission = "deny"
command_prefix = { field = "command", prefix = "rm" }
[[permissions.rules]]
tool = "shell"
permission = "ask"
command_prefix = { field = "command", prefix = "git push" }
[[permissions.rules]]
tool = "shell"
permission = "allow"
"#;

/// Runs git with `args` in `folder`, asserting that it succeeds.
/// A repository in `work`, with one commit, whose `origin` is a new bare one at `remote`.
fn repository_pushing_to(work: &std::path::Path, remote: &std::path::Path) {
    std::fs::create_dir_all(remote).unwrap();
    git(remote, &["init", "--bare", "-q"]);
    git(work, &["init", "-q"]);
    git(work, &["commit", "-q", "--allow-empty", "-m", "first"]);
    git(work, &["remote", "add", "origin", remote.to_str().unwrap()]);
}

/// Asserts that the bare repository `remote` holds no reference: nothing was pushed to it.
fn assert_nothing_pushed(remote: &std::path::Path) {
    let pushed = std::process::Command::new("git")
        .args(["for-each-ref"])
        .current_dir(remote)
        .output()
        .unwrap();
    assert!(pushed.stdout.is_empty(), "nothing was pushed: {pushed:?}");
}

/// Commits a file `keep.txt` in the repository at `work`, which a denied `rm` must leave.
fn commit_keep(work: &std::path::Path) {
    std::fs::write(work.join("keep.txt"), "kept").unwrap();
    git(work, &["add", "keep.txt"]);
    git(work, &["commit", "-q", "-m", "keep"]);
}

fn git(folder: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(folder)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repository_s_git_configuration_and_hooks_are_judged_as_the_commands_they_run() {
    // The repository in the agent's folder pushes to a bare one beside it. Its configuration
    // (made before the run) has `p` run `git push` and `nuke` run `rm`; its `pre-commit` hook
    // runs `rm`. A command that writes an alias into `.git/config` and runs it is asked about
    // (no terminal: denied). Nothing is pushed and `keep.txt` stays; the last, which runs no
    // hook nor alias, runs.
    let calls = shell_calls(vec![
        json!({"command": "git p origin main"}),
        json!({"command": "git nuke"}),
        json!({"command": "git commit --allow-empty -m x"}),
        json!({"command": "printf '[alias]\\n\\tq = push\\n' >> .git/config && git q origin main"}),
        json!({"command": "git log --oneline > made"}),
    ]);
    let dir = scripted_builtins(DENY_RM_ASK_PUSH, &calls);
    let work = dir.path("work");
    let remote = dir.path("remote.git");
    repository_pushing_to(&work, &remote);
    git(&work, &["config", "alias.p", "push"]);
    git(&work, &["config", "alias.nuke", "!rm -f keep.txt"]);
    commit_keep(&work);
    write_program(
        &work.join(".git/hooks/pre-commit"),
        "#!/bin/sh\nrm -f keep.txt\n",
    );
    let (_, v) = run_json(&dir, &[]).await;
    assert_eq!(
        call_statuses(&v),
        ["denied", "denied", "denied", "denied", "ok"],
        "{v}"
    );
    assert!(work.join("keep.txt").exists(), "an rm git ran got past");
    assert_nothing_pushed(&remote);
    assert!(work.join("made").exists(), "the last command runs: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn git_s_global_configuration_and_a_home_a_command_chooses_are_judged_as_what_git_runs() {
    // agentloop runs with a home folder of its own, whose `.gitconfig` (made before the run)
    // has `st` run `rm` and `lg` run `git log`. A command that writes an alias into the global
    // configuration and runs it is asked about (no terminal: denied), and so is a `git` under a
    // home the command chooses, whose configuration nobody read. `keep.txt` stays; the last,
    // a global alias that runs only `git log`, runs.
    let calls = shell_calls(vec![
        json!({"command": "git st"}),
        json!({"command": "printf '[alias]\\n\\tx = !rm -f keep.txt\\n' >> ~/.gitconfig && git x"}),
        json!({"command": "HOME=/tmp git log"}),
        json!({"command": "git lg > made"}),
    ]);
    let dir = scripted_builtins(DENY_RM_ASK_PUSH, &calls);
    let work = dir.path("work");
    git(&work, &["init", "-q"]);
    commit_keep(&work);
    let home = dir.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let global = "[alias]\n\tst = !rm -f keep.txt\n\tlg = log --oneline\n";
    std::fs::write(home.join(".gitconfig"), global).unwrap();
    let home: &'static str = Box::leak(home.to_str().unwrap().to_owned().into_boxed_str());
    let agent = dir.agent();
    let out = agentloop_env(
        args(&["run", agent.to_str().unwrap(), "--input", "hi", "--json"]),
        vec![("HOME", home)],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(
        call_statuses(&v),
        ["denied", "denied", "denied", "ok"],
        "{v}"
    );
    assert!(work.join("keep.txt").exists(), "an rm git ran got past");
    assert_eq!(
        std::fs::read_to_string(dir.path("home/.gitconfig")).unwrap(),
        global,
        "nothing was written into the global configuration"
    );
    let made = std::fs::read_to_string(work.join("made")).unwrap_or_default();
    assert!(
        made.contains("keep"),
        "the last command runs `git log`: {v}"
    );
}

/// An agent whose one call (`shell`, asked about by default) would leave `work/ran`, then a
/// final answer; and the screen of `agentloop ARGS` in a terminal where the person types
/// `before`, presses Ctrl-C (the terminal's interrupt character) at the approval prompt, then
/// types `after` (each a pair of what to wait for and the line to type).
fn ctrl_c_at_the_prompt(
    args: &[&str],
    before: &[&str],
    after: &[&str],
) -> (AgentDir, std::process::Output) {
    let dir = scripted_builtins("", &[("shell", json!({"command": "touch ran"}))]);
    let agent = dir.agent();
    let mut full = vec![args[0], agent.to_str().unwrap()];
    full.extend_from_slice(&args[1..]);
    let mut steps = before.to_vec();
    steps.extend_from_slice(&["run it?", "\u{3}"]);
    steps.extend_from_slice(after);
    let began = std::time::Instant::now();
    let out = in_terminal(&dir, &steps, &full);
    assert!(
        began.elapsed() < std::time::Duration::from_secs(30),
        "the prompt outlived Ctrl-C"
    );
    (dir, out)
}

#[test]
fn ctrl_c_at_an_approval_prompt_of_run_cancels_the_run_runs_nothing_and_exits_130() {
    let (dir, out) = ctrl_c_at_the_prompt(&["run", "--input", "hi"], &[], &[]);
    let screen = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert_eq!(out.status.code(), Some(130), "{screen}");
    assert!(screen.contains("agentloop: cancelling"), "{screen}");
    assert!(screen.contains("■ cancelled"), "{screen}");
    assert!(!dir.path("work/ran").exists(), "the asked call never ran");
}

#[test]
fn ctrl_c_at_an_approval_prompt_of_chat_cancels_that_turn_and_the_chat_goes_on() {
    let (dir, out) = ctrl_c_at_the_prompt(
        &["chat"],
        &["one input per line", "hi"],
        &["■ cancelled", "and now?", "■ finished", "/exit"],
    );
    let screen = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(screen.contains("cancelling this turn"), "{screen}");
    assert!(
        screen.contains("done"),
        "the next input was answered: {screen}"
    );
    assert!(!dir.path("work/ran").exists(), "the asked call never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rm_behind_a_container_recorder_session_lock_or_project_runner_is_denied() {
    // Most of these are not installed here: what counts is that the gate never lets them start
    // the `rm`. A harmless command through one of them is not judged so: the last runs.
    assert_every_rm_denied_and_the_last_runs(
        &[
            "bwrap --ro-bind / / --dev /dev --bind . . rm -f keep.txt",
            "bwrap --bind / / --setenv A b rm -f keep.txt",
            "apptainer exec --bind /x:/y img.sif rm -f keep.txt",
            "singularity exec img.sif rm -f keep.txt",
            "rr record rm -f keep.txt",
            "dtach -c /tmp/s rm -f keep.txt",
            "abduco -c s rm -f keep.txt",
            "start-stop-daemon --start --exec /bin/rm -- -f keep.txt",
            "lckdo -w lock rm -f keep.txt",
            "with-lock-ex lock rm -f keep.txt",
            "fakechroot rm -f keep.txt",
            "box64 rm -f keep.txt",
            "pipx run rm -f keep.txt",
            "pdm run rm -f keep.txt",
            "hatch -e test run rm -f keep.txt",
            "stack exec -- rm -f keep.txt",
            "cabal exec rm -f keep.txt",
            "opam exec -- rm -f keep.txt",
            "devbox run rm -f keep.txt",
            "hatch run test 2>/dev/null; touch made",
        ],
        "an rm run through a launcher ran",
    )
    .await;
}

/// A lead whose `shell` runs its command (`sh -c`) and is asked about, with a worker (another
/// agent file) that has a harmless tool of the same name, also asked about. The worker's model
/// calls its `shell` once; the lead's model then calls its own to delete `victim.txt`.
fn lead_and_worker_sharing_a_tool_name() -> AgentDir {
    let dir = AgentDir::new(
        r#"name = "lead"
[model]
provider = "scripted"
script = "lead.json"
[[tools]]
name = "shell"
command = ["python3", "run.py"]
input_schema = { type = "object", properties = { command = { type = "string" } } }
[[tools]]
name = "worker"
agent = "worker.toml"
description = "The worker."
[permissions]
ask = ["shell"]
"#,
    );
    dir.write(
        "worker.toml",
        r#"name = "worker"
[model]
provider = "scripted"
script = "worker.json"
[[tools]]
name = "shell"
command = ["python3", "tool.py"]
input_schema = { type = "object", properties = { command = { type = "string" } } }
[permissions]
ask = ["shell"]
"#,
    );
    dir.write(
        "lead.json",
        &json!([
            {"tool_calls": [{"id": "p1", "name": "worker", "arguments": {"task": "look"}}]},
            {"tool_calls": [{"id": "p2", "name": "shell", "arguments": {"command": "rm victim.txt"}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    dir.write(
        "worker.json",
        &json!([
            {"tool_calls": [{"id": "a1", "name": "shell", "arguments": {"command": "echo hi"}}]},
            {"text": "looked"}
        ])
        .to_string(),
    );
    dir.write(
        "run.py",
        "import json, subprocess, sys\n\
         sys.exit(subprocess.call([\"sh\", \"-c\", json.load(sys.stdin)[\"command\"]]))\n",
    );
    dir.write("victim.txt", "keep me\n");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_s_always_never_answers_its_parent_s_tool_of_the_same_name() {
    let dir = lead_and_worker_sharing_a_tool_name();
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let suspended = run_until_suspended(&dir, j).await;
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    assert_eq!(suspended["pending_approvals"][0]["call_id"], "p1/a1");
    let ok = agentloop(args(&[
        "approve",
        &id,
        "--call",
        "p1/a1",
        "--allow",
        "--always",
        "--journal",
        j,
    ]))
    .await;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let out = agentloop(args(&["resume", &id, "--journal", j, "--json"])).await;
    assert_eq!(
        dir.tool_inputs(),
        [json!({"command": "echo hi"})],
        "the worker's call ran"
    );
    assert!(
        dir.path("victim.txt").exists(),
        "the lead's shell ran unasked on the worker's answer: {}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(8), "{}", stdout(&out));
    let resumed = stdout_json(&out);
    assert_eq!(
        resumed["pending_approvals"][0]["call_id"], "p2",
        "{resumed}"
    );
}

/// An agent whose only tool is the `write` of a small MCP server (`scripts/mcp/write_server.py`),
/// renamed `save`, under `permissions`; its model overwrites `victim.txt` with it.
fn renamed_mcp_writer(permissions: &str) -> AgentDir {
    let server =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/write_server.py");
    let dir = AgentDir::new(&format!(
        r#"name = "writer"
[model]
provider = "scripted"
script = "script.json"
[[mcp]]
name = "w"
command = ["python3", "{}"]
rename = {{ write = "save" }}
{permissions}"#,
        server.display()
    ));
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "c0", "name": "save", "arguments": {"path": "victim.txt", "content": "gone"}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    dir.write("victim.txt", "keep me\n");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_on_an_mcp_tool_s_server_name_holds_for_its_renamed_tool() {
    for permissions in [
        "[permissions]\nask = [\"w__write\"]\n",
        "[[permissions.rules]]\ntool = \"w__write\"\npermission = \"ask\"\n",
    ] {
        let dir = renamed_mcp_writer(permissions);
        let (_, v) = run_json(&dir, &[]).await;
        assert_eq!(
            std::fs::read_to_string(dir.path("victim.txt")).unwrap(),
            "keep me\n",
            "the renamed tool ran unasked under {permissions}: {v}"
        );
        assert_eq!(call_statuses(&v), ["denied"], "{v}");
    }
}
