#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The built-in tools of an agent file (`[[tools]] builtin = "..."`), end to end: a scripted
//! model reads, edits and lists files of a workspace folder and runs a shell command; a model
//! on a fake provider on loopback tries to leave the workspace and reads each refusal as an
//! error result of its call.

mod support;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use serde_json::{Value, json};
use support::*;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer};

/// An agent file whose tools are built-in ones, rooted in `work/` beside it.
const BUILTIN_AGENT: &str = r#"name = "editor"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "read_file"
root = "work"

[[tools]]
builtin = "edit_file"
root = "work"

[[tools]]
name = "ls"
builtin = "list_dir"
root = "work"

[[tools]]
builtin = "shell"
root = "work"
timeout_secs = 60

[permissions]
allow = ["shell"]
"#;

fn workspace(agent: &str) -> AgentDir {
    let dir = AgentDir::new(agent);
    std::fs::create_dir(dir.path("work")).unwrap();
    dir.write("work/notes.txt", "status: draft\nowner: me\n");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_agent_reads_edits_and_lists_its_workspace_and_runs_a_shell_command() {
    let dir = workspace(BUILTIN_AGENT);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                {"id": "r", "name": "read_file", "arguments": {"path": "notes.txt"}},
                {"id": "l", "name": "ls", "arguments": {}}
            ]},
            {"tool_calls": [
                {"id": "e", "name": "edit_file", "arguments": {"path": "notes.txt", "old_string": "draft", "new_string": "final"}}
            ]},
            {"tool_calls": [
                {"id": "s", "name": "shell", "arguments": {"command": "cat notes.txt; echo oops >&2; exit 4"}}
            ]},
            {"text": "The notes are final."}
        ])
        .to_string(),
    );
    let (_, v) = run_finished(&dir.agent(), "Finish the notes.").await;
    let calls = v["tool_calls"].as_array().unwrap();
    let output = |id: &str| -> String {
        let call = calls.iter().find(|c| c["id"] == id).unwrap();
        assert_eq!(call["ok"], true, "{call}");
        call["output"].as_str().unwrap().to_owned()
    };
    assert_eq!(output("r"), "     1\tstatus: draft\n     2\towner: me\n");
    assert_eq!(output("l"), "notes.txt (24 bytes)");
    assert_eq!(
        output("e"),
        "edited notes.txt: 1 replacement\n@@ -1,1 +1,1 @@\n-status: draft\n+status: final\n"
    );
    assert_eq!(
        output("s"),
        "exit status 4\n--- stdout ---\nstatus: final\nowner: me\n--- stderr ---\noops"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("work/notes.txt")).unwrap(),
        "status: final\nowner: me\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_the_builtin_tools_their_roots_and_the_shell_asking_by_default() {
    let dir = workspace(
        r#"name = "p"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "grep"
root = "work"
max_results = 50
[[tools]]
builtin = "shell"
root = "work"
[[tools]]
builtin = "web_fetch"
allow_private = ["127.0.0.1"]
"#,
    );
    dir.write("script.json", r#"[{"text": "hi"}]"#);
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    let tools = v["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["grep", "shell", "web_fetch"]);
    let work = std::fs::canonicalize(dir.path("work")).unwrap();
    assert_eq!(tools[0]["builtin"], "grep");
    assert_eq!(tools[0]["root"], work.display().to_string());
    assert_eq!(tools[2]["root"], Value::Null);
    assert!(
        tools[0]["description"]
            .as_str()
            .unwrap()
            .contains("at most 50 matches")
    );
    assert_eq!(v["permissions"]["gate"], true);
    assert_eq!(
        v["permissions"]["builtin_defaults"],
        json!([{"tool": "shell", "permission": "ask"}])
    );
    let text = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    let text = stdout(&text);
    assert!(text.contains("builtin: grep (root "), "{text}");
    assert!(
        text.contains("shell ask (the built-in tool's default"),
        "{text}"
    );
}

// outside-paths: off (the tests below try hostile paths on purpose)
#[tokio::test(flavor = "multi_thread")]
async fn an_escape_from_the_workspace_reaches_the_model_as_an_error_result() {
    let server = MockServer::start().await;
    let dir = workspace(&format!(
        r#"name = "escaper"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
stream = false

[[tools]]
builtin = "read_file"
root = "work"

[[tools]]
builtin = "write_file"
root = "work"

[[tools]]
builtin = "shell"
root = "work"
"#,
        server.uri()
    ));
    dir.write("secret.txt", "the secret\n");
    std::os::unix::fs::symlink(dir.dir.path(), dir.path("work/up")).unwrap();
    let absolute = dir.path("secret.txt").display().to_string();
    let calls = json!([
        chat_call("c1", "read_file", json!({"path": "../secret.txt"})),
        chat_call("c2", "read_file", json!({"path": absolute})),
        chat_call("c3", "read_file", json!({"path": "up/secret.txt"})),
        chat_call(
            "c4",
            "write_file",
            json!({"path": "up/planted.txt", "content": "x"})
        ),
        // No [permissions] names the shell: it asks, and with no terminal nobody approves.
        chat_call("c5", "shell", json!({"command": "cat ../secret.txt"})),
    ]);
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Replies {
            bodies: vec![
                completion(json!({"role": "assistant", "content": null, "tool_calls": calls})),
                completion(
                    json!({"role": "assistant", "content": "I cannot leave the workspace."}),
                ),
            ],
            next: Arc::new(AtomicUsize::new(0)),
        })
        .mount(&server)
        .await;
    let out = run_agent_json(&dir.agent(), "Read the secret.").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    let second: Value = serde_json::from_slice(&requests[1].body).unwrap();
    let results: Vec<(String, String)> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let wanted = [
        ("c1", "path_parent_dir", "contains `..`"),
        ("c2", "path_absolute", "is an absolute path"),
        ("c3", "path_outside_root", "leads outside the workspace"),
        ("c4", "path_outside_root", "leads outside the workspace"),
        ("c5", "denied", "denied: "),
    ];
    assert_eq!(results.len(), wanted.len(), "{results:?}");
    let records = v["tool_calls"].as_array().unwrap();
    for (((id, content), record), (want_id, code, words)) in results.iter().zip(records).zip(wanted)
    {
        assert_eq!(id, want_id);
        assert!(content.contains(words), "{id}: {content}");
        assert!(!content.contains("the secret"), "{id}: {content}");
        assert_eq!(record["id"], want_id);
        assert_eq!(record["ok"], false, "{record}");
        assert_eq!(record["error"]["code"], code, "{record}");
    }
    assert!(!dir.path("planted.txt").exists());
}
