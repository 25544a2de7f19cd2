#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `[[mcp]]` servers in agent files, end to end with the real filesystem server (installed at its
//! pinned version by `scripts/mcp/install.sh`): a scripted agent reads and edits a file through
//! it under permission rules that name its tools, `mcp list` prints its tools, and `plan` shows
//! the servers without a secret.

mod support;

use std::path::{Path, PathBuf};

use serde_json::json;
use support::*;

/// An agent whose only tools are the filesystem server's, rooted in `work/` beside it.
fn fs_agent(permissions: &str) -> AgentDir {
    let server = mcp_installed().join("node_modules/.bin/mcp-server-filesystem");
    let dir = AgentDir::new(&format!(
        r#"name = "mcp-editor"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "fs"
command = ["{}", "work"]
restart = "on-failure"
timeout_secs = 60
rename = {{ list_directory = "ls" }}
{permissions}"#,
        server.display()
    ));
    std::fs::create_dir(dir.path("work")).unwrap();
    dir.write("work/notes.txt", "status: draft\nowner: me\n");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_agent_reads_and_edits_a_file_through_the_filesystem_server() {
    let dir = fs_agent(
        r#"
[permissions]
deny = ["fs__write_file"]
"#,
    );
    let work = std::fs::canonicalize(dir.path("work")).unwrap();
    let notes = work.join("notes.txt");
    let (work, notes) = (work.to_str().unwrap(), notes.to_str().unwrap());
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                {"id": "r", "name": "fs__read_text_file", "arguments": {"path": notes}},
                {"id": "l", "name": "ls", "arguments": {"path": work}}
            ]},
            {"tool_calls": [
                {"id": "e", "name": "fs__edit_file", "arguments": {"path": notes, "edits": [{"oldText": "draft", "newText": "final"}]}},
                {"id": "w", "name": "fs__write_file", "arguments": {"path": notes, "content": "gone"}}
            ]},
            {"tool_calls": [
                {"id": "x", "name": "fs__read_text_file", "arguments": {"path": "/etc/hostname"}}
            ]},
            {"text": "The notes are final."}
        ])
        .to_string(),
    );
    let (out, v) = run_finished(&dir.agent(), "Finish the notes.").await;
    let calls = v["tool_calls"].as_array().unwrap();
    let call = |id: &str| calls.iter().find(|c| c["id"] == id).unwrap().clone();
    assert_eq!(call("r")["ok"], true, "{}", call("r"));
    assert_eq!(
        call("r")["output"],
        json!({"content": "status: draft\nowner: me\n"})
    );
    assert!(
        call("l")["output"].to_string().contains("notes.txt"),
        "{}",
        call("l")
    );
    assert_eq!(call("e")["ok"], true, "{}", call("e"));
    // The permission rule names the server's tool like any other.
    assert_eq!(call("w")["ok"], false, "{}", call("w"));
    // Outside the server's root: its isError result is an error result the model reads.
    assert_eq!(call("x")["ok"], false, "{}", call("x"));
    assert_eq!(
        std::fs::read_to_string(dir.path("work/notes.txt")).unwrap(),
        "status: final\nowner: me\n"
    );
    // The server's stderr never reaches the terminal.
    assert!(
        !stderr(&out).contains("Secure MCP Filesystem Server"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_list_prints_each_servers_tools_with_their_schemas() {
    let dir = fs_agent("");
    dir.write("script.json", "[]");
    let out = agentloop(args(&[
        "mcp",
        "list",
        dir.agent().to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["servers"][0]["name"], "fs");
    let tools = v["servers"][0]["tools"].as_array().unwrap();
    let read = tools
        .iter()
        .find(|t| t["name"] == "fs__read_text_file")
        .unwrap();
    assert_eq!(read["input_schema"]["type"], "object");
    assert!(
        tools.iter().any(|t| t["name"] == "ls"),
        "renamed: {tools:?}"
    );

    let out = agentloop(args(&["mcp", "list", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("fs — "), "{text}");
    assert!(text.contains("  fs__read_text_file"), "{text}");
    assert!(text.contains("input schema: {"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_the_servers_and_the_variables_they_read_never_a_value() {
    let dir = AgentDir::new(
        r#"name = "p"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "remote"
url = "http://127.0.0.1:9/mcp"
headers = { Authorization = "Bearer ${AGENTLOOP_TEST_KEY}" }
max_output_bytes = 4096

[permissions]
ask = ["remote__delete"]
"#,
    );
    dir.write("script.json", r#"[{"text": "hi"}]"#);
    let agent = dir.agent();
    for json in [true, false] {
        let mut a = vec!["plan", agent.to_str().unwrap()];
        if json {
            a.push("--json");
        }
        let out = agentloop(args(&a)).await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!all.contains(TEST_KEY), "a secret in plan: {all}");
        assert!(all.contains("AGENTLOOP_TEST_KEY"), "{all}");
        if json {
            let v = stdout_json(&out);
            assert_eq!(v["mcp"][0]["name"], "remote");
            assert_eq!(v["mcp"][0]["tools_named"], "remote__*");
            assert_eq!(v["mcp"][0]["max_output_bytes"], 4096);
        } else {
            assert!(all.contains("remote (url http://127.0.0.1:9/mcp"), "{all}");
            assert!(all.contains("results cut to 4096 bytes"), "{all}");
        }
    }
}

/// An agent file with two broken `[[mcp]]` entries, and `extra` in the second.
fn broken_mcp_agent(extra: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "bad"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "both"
command = ["x"]
url = "http://127.0.0.1:9/mcp"

[[mcp]]
name = "web"
url = "ftp://example"
env = {{ A = "${{B" }}
{extra}
[permissions]
deny = ["both__rm", "other__rm"]
"#
    ));
    dir.write("script.json", "[]");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_entry_is_checked_with_the_file_and_permissions_may_name_only_its_prefix() {
    // A key of the wrong shape is found first.
    let dir = broken_mcp_agent(r#"restart = "sometimes""#);
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("mcp[1].restart"), "{}", stderr(&out));

    // Then the rules, all of them at once.
    let dir = broken_mcp_agent("max_output_bytes = 0\nprotocol_version = \"2027-01-01\"");
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    for expected in [
        "mcp[0].url",
        "not both",
        "mcp[1].url",
        "mcp[1].env",
        "mcp[1].max_output_bytes",
        "max_output_bytes must be at least 1",
        "mcp[1].protocol_version",
        "unknown MCP protocol_version \"2027-01-01\"",
        "permissions.deny[1]",
        "other__rm",
    ] {
        assert!(err.contains(expected), "{expected} missing in: {err}");
    }
    assert!(!err.contains("permissions.deny[0]"), "{err}");
}

/// The project's own stdio MCP server whose tool list grows on cue
/// (`scripts/mcp/growing_server.py`): `add_tool` adds `new_tool` and announces
/// `notifications/tools/list_changed` before it answers; `new_tool` writes `new_tool.ran` in
/// its working directory (the agent file's).
fn growing_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/growing_server.py")
}

/// An agent on the growing server whose scripted model answers with `script`.
fn grower(script: serde_json::Value) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "grower"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "grow"
command = ["python3", "{}"]
"#,
        growing_server().display()
    ));
    dir.write("script.json", &script.to_string());
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_lists_a_servers_tools_again_at_the_turn_after_list_changed_and_later_inputs_call_them()
 {
    let dir = grower(json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"text": "added"},
            {"tool_calls": [{"id": "n", "name": "grow__new_tool", "arguments": {}}]},
            {"text": "ran"}
    ]));
    let out = chat(dir.agent(), "add a tool\nuse it\n").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    // The first input's run saw the change at its second turn, the one that answered "added".
    let err = stderr(&out);
    let changed = err.find("⟳ tools changed: +grow__new_tool");
    assert!(
        changed.is_some_and(|at| err.find("added").is_some_and(|added| at < added)),
        "stderr: {err}"
    );
    assert!(
        dir.path("new_tool.ran").exists(),
        "the second input could not call the new tool; stderr: {}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_a_server_adds_during_a_run_is_called_in_the_next_turn_of_that_run() {
    let dir = grower(json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"tool_calls": [{"id": "n", "name": "grow__new_tool", "arguments": {}}]},
            {"text": "ran"}
    ]));
    let trace = dir.path("t.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "add a tool and use it",
        "--trace",
        trace.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(
        dir.path("new_tool.ran").exists(),
        "the second turn could not call the new tool; stderr: {}",
        stderr(&out)
    );
    // The live view says what changed, at the turn it changed.
    assert!(
        stderr(&out).contains("⟳ tools changed: +grow__new_tool"),
        "{}",
        stderr(&out)
    );
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let turn2 = records
        .iter()
        .rfind(|r| r["kind"] == "turn" && r["turn"] == 2)
        .unwrap();
    assert_eq!(
        turn2["tools_changed"],
        json!({"added": ["grow__new_tool"]}),
        "{turn2:#}"
    );
    let call = records
        .iter()
        .rfind(|r| r["kind"] == "tool_call" && r["call_id"] == "n")
        .unwrap();
    assert_eq!(call["status"], "ok", "{call:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_prints_the_fingerprint_a_journaled_run_of_an_mcp_agent_records() {
    let dir = grower(json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"text": "added"}
    ]));
    let agent = dir.agent();
    let journal = dir.path("runs.db");
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--input",
        "add a tool",
        "--journal",
        journal.to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let id = stdout_json(&out)["run_id"].as_str().unwrap().to_owned();
    let show = agentloop(args(&[
        "journal",
        "show",
        &id,
        "--journal",
        journal.to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(show.status.code(), Some(0), "stderr: {}", stderr(&show));
    // The fingerprint holds the server's declaration, not the tools it lists (which changed
    // during the run): `plan` starts no server and prints the same.
    let plan = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    assert_eq!(
        stdout_json(&show)["fingerprint"],
        stdout_json(&plan)["fingerprint"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_dry_run_shows_the_servers_tools_in_the_request_and_sends_nothing() {
    let fake = FakeProvider::start("/v1/chat/completions", Vec::new()).await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        &format!(
            "\n[[mcp]]\nname = \"grow\"\ncommand = [\"python3\", \"{}\"]\n",
            growing_server().display()
        ),
    ));
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "hi",
        "--dry-run",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    let names: Vec<&str> = v["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "grow__add_tool"], "{v:#}");
    assert!(fake.requests().await.is_empty(), "a dry run sent a request");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_servers_stderr_goes_to_the_trace_not_the_terminal() {
    let dir = grower(json!([
            {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
            {"text": "added"}
    ]));
    let trace = dir.path("t.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "add a tool",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-payloads",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(!stderr(&out).contains("grow: adding"), "{}", stderr(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    let call = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|r| r["kind"] == "tool_call" && r["status"] == "ok")
        .unwrap();
    assert_eq!(
        call["details"]["stderr"],
        json!(["grow: adding new_tool"]),
        "{call:#}"
    );
    // What it wrote outside the call is the run's, kept with the payloads.
    let run = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|r| r["kind"] == "run")
        .unwrap();
    assert_eq!(
        run["tool_output"],
        json!(["grow: grow: started"]),
        "{run:#}"
    );
    assert!(!stderr(&out).contains("grow: started"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_example_reads_a_file_runs_a_command_and_keeps_a_note_under_approval() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mcp/agent.toml");
    let example = example.to_str().unwrap();
    let input = "Summarize the changelog in a note.";
    let out = agentloop(args(&["run", example, "--input", input, "--yes", "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["ok"] == true), "{calls:?}");
    let listed = calls.iter().find(|c| c["id"] == "call_list").unwrap();
    assert_eq!(
        listed["output"],
        json!({"notes": ["3 changes: files, shell and MCP tools; limits; traces."]})
    );

    // Without --yes and no terminal to ask at, the call the permissions ask about is denied.
    let out = agentloop(args(&["run", example, "--input", input, "--json"])).await;
    let v = stdout_json(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    let note = calls.iter().find(|c| c["id"] == "call_note").unwrap();
    assert_eq!(note["status"], "denied", "{note}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subagents_mcp_server_starts_with_the_top_agent_and_its_tools_are_the_subagents() {
    let notes =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mcp/tools/notes_server.py");
    let dir = AgentDir::new(
        r#"name = "lead"
[model]
provider = "scripted"
script = "lead.json"

[[tools]]
name = "scribe"
agent = "scribe.toml"
"#,
    );
    dir.write(
        "scribe.toml",
        &format!(
            r#"name = "scribe"
[model]
provider = "scripted"
script = "scribe.json"

[[mcp]]
name = "notes"
command = ["python3", "{}"]
"#,
            notes.display()
        ),
    );
    dir.write(
        "lead.json",
        &json!([
            {"tool_calls": [{"id": "s", "name": "scribe", "arguments": {"task": "note it"}}]},
            {"text": "noted"}
        ])
        .to_string(),
    );
    dir.write(
        "scribe.json",
        &json!([
            {"tool_calls": [{"id": "n", "name": "notes__add_note", "arguments": {"text": "hello"}}]},
            {"text": "1 note"}
        ])
        .to_string(),
    );
    let agent = dir.agent();
    let trace = dir.path("run.ndjson");
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--input",
        "go",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-payloads",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["subagents"][0]["tool_calls"], 1, "{v}");
    // The subagent's call reached the server: its structured answer is in the trace.
    let recorded = std::fs::read_to_string(&trace).unwrap();
    let call = recorded
        .lines()
        .find(|l| l.contains("notes__add_note") && l.contains("count"))
        .unwrap_or_else(|| panic!("no answer of notes__add_note in the trace: {recorded}"));
    assert!(!call.contains("\"error\""), "{call}");

    let out = agentloop(args(&["mcp", "list", agent.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("notes (of "), "{}", stdout(&out));
    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    assert!(
        stdout(&out).contains("mcp servers: notes"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_servers_read_only_and_idempotent_hints_count_only_where_the_entry_trusts_them() {
    let notes =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mcp/tools/notes_server.py");
    for trust in [false, true] {
        let dir = AgentDir::new(&format!(
            r#"name = "hints"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "notes"
command = ["python3", "{}"]
trust_hints = {trust}
"#,
            notes.display()
        ));
        dir.write("script.json", r#"[{"text": "hi"}]"#);
        let out = agentloop(args(&[
            "mcp",
            "list",
            dir.agent().to_str().unwrap(),
            "--json",
        ]))
        .await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let v = stdout_json(&out);
        let tools = v["servers"][0]["tools"].as_array().unwrap();
        let list = tools
            .iter()
            .find(|t| t["name"] == "notes__list_notes")
            .unwrap();
        // `list_notes` says it is read-only: believed only with `trust_hints`, so that a call of
        // it in flight at a crash runs again on resume only then.
        assert_eq!(list["idempotent"], trust, "{list}");
        assert_eq!(list["mutating"], !trust, "{list}");
        let add = tools
            .iter()
            .find(|t| t["name"] == "notes__add_note")
            .unwrap();
        assert_eq!(add["idempotent"], false, "{add}");
        let plan = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
        assert_eq!(stdout_json(&plan)["mcp"][0]["trust_hints"], trust);
    }
}

/// A stdio server's tree (`server.sh`, given the growing server's path): it logs its process
/// group, starts a background subshell that writes `marker` two seconds after the run's `wait`
/// tool started (its `side.log`) and, where the sandbox lets it (`off`), a `setsid` child out of
/// the group that writes `escaped` the same way, then becomes the growing server.
const SERVER_TREE: &str = r#"cut -d' ' -f5 /proc/$$/stat > group.id
(while [ ! -e side.log ]; do sleep 0.1; done; sleep 2; touch marker) </dev/null >/dev/null 2>&1 &
setsid sh -c 'echo $$ > escaped.pid; while [ ! -e side.log ]; do sleep 0.1; done; sleep 2; touch escaped' </dev/null >/dev/null 2>&1 &
exec python3 "$1"
"#;

#[test]
fn a_stdio_servers_tree_dies_with_a_killed_agentloop_in_and_out_of_the_sandbox() {
    for mode in sandbox_modes_here() {
        let dir = AgentDir::new(&format!(
            r#"name = "tree"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "wait"
command = ["sh", "-c", "echo start >> side.log; sleep 30"]
input_schema = {{ type = "object", properties = {{}} }}

[[mcp]]
name = "grow"
command = ["sh", "server.sh", "{}"]
sandbox = "{mode}"
"#,
            growing_server().display()
        ));
        dir.write("server.sh", SERVER_TREE);
        // The server answers a call first, then the run waits in its command tool.
        dir.write(
            "script.json",
            &json!([
                {"tool_calls": [{"id": "a", "name": "grow__add_tool", "arguments": {}}]},
                {"tool_calls": [{"id": "w", "name": "wait", "arguments": {}}]},
                {"text": "Over."}
            ])
            .to_string(),
        );
        let mut run = std::process::Command::new(bin())
            .args(["run", dir.agent().to_str().unwrap(), "--input", "go"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = (0..400).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            dir.path("side.log").exists()
        });
        assert!(started, "{mode}: the run did not reach its wait tool");
        run.kill().unwrap();
        run.wait().unwrap();
        let read = |name: &str| {
            std::fs::read_to_string(dir.path(name))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let group = read("group.id");
        let escaped = read("escaped.pid");
        assert!(!group.is_empty(), "{mode}: the server logged its group");
        // Only unconfined may a child leave the group (the control of the second half).
        assert_eq!(escaped.is_empty(), mode != "off", "{mode}: {escaped:?}");
        // Past the time the children would have taken.
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let mut groups = vec![group.as_str()];
        if !escaped.is_empty() {
            groups.push(escaped.as_str());
        }
        let live = live_in_groups(&groups);
        for pid in live.iter().filter_map(|p| p.split(' ').next()) {
            let _ = std::process::Command::new("kill")
                .args(["-9", pid])
                .status();
        }
        assert!(
            !dir.path("marker").exists(),
            "{mode}: the server's background child acted after agentloop died"
        );
        assert!(
            !dir.path("escaped").exists(),
            "{mode}: the server's child that left the group acted after agentloop died"
        );
        assert!(live.is_empty(), "{mode}: still alive: {live:?}");
    }
}

mod mcpfix {
    use super::*;

    /// The project's misbehaving MCP server (`scripts/mcp/hostile_server.py`) with `flags`.
    fn hostile(flags: &str) -> AgentDir {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/hostile_server.py");
        AgentDir::new(&format!(
            r#"name = "hostile"
description = "Plans \u001b]0;retitled\u0007 things."
[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "page"
description = "A page \u001b[2J of text."
command = ["true"]

[[mcp]]
name = "h"
command = ["python3", "{}"{flags}]
"#,
            script.display()
        ))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn mcp_list_and_plan_show_escape_sequences_of_descriptions_instead_of_sending_them() {
        // OSC 52 would write the clipboard, CSI 2J clear the screen.
        let dir = hostile(
            r#", "--description", "Echoes.\u001b]52;c;cm0gLXJmIH4=\u0007\u001b[2J\u009b1m done""#,
        );
        dir.write("script.json", "[]");
        let out = agentloop(args(&["mcp", "list", dir.agent().to_str().unwrap()])).await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{9b}'),
            "{text:?}"
        );
        assert!(
            text.contains(r"Echoes.\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{1b}[2J\u{9b}1m done"),
            "{text}"
        );
        // --json keeps the text, escaped as JSON.
        let out = agentloop(args(&[
            "mcp",
            "list",
            dir.agent().to_str().unwrap(),
            "--json",
        ]))
        .await;
        let v = stdout_json(&out);
        let echo = v["servers"][0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "h__echo")
            .unwrap()
            .clone();
        assert!(
            echo["description"]
                .as_str()
                .unwrap()
                .contains("\u{1b}]52;c;"),
            "{echo}"
        );

        let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains(r"A page \u{1b}[2J of text."), "{text}");
        assert!(
            text.contains(r"Plans \u{1b}]0;retitled\u{7} things."),
            "{text}"
        );
    }
}

/// The project's stdio MCP server whose tools are named on its command line
/// (`scripts/mcp/named_server.py TAG NAME... [--later NAME...]`): a call answers "TAG ran NAME"
/// and appends it to `ran.txt`; `add_tool` lists the later names.
fn named_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/named_server.py")
}

/// Two servers that keep their own tool names (`prefix = ""`): `trusted` with `first`'s
/// arguments, `other` with `second`'s; the scripted model answers with `script`.
fn two_servers(first: &str, second: &str, script: serde_json::Value) -> AgentDir {
    let server = named_server();
    let dir = AgentDir::new(&format!(
        r#"name = "two"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "trusted"
command = ["python3", "{s}", "trusted", {first}]
prefix = ""

[[mcp]]
name = "other"
command = ["python3", "{s}", "other", {second}]
prefix = ""
"#,
        s = server.display()
    ));
    dir.write("script.json", &script.to_string());
    dir
}

/// What the servers' tools ran, one "TAG ran NAME" a line.
fn ran(dir: &AgentDir) -> String {
    std::fs::read_to_string(dir.path("ran.txt")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn collide_a_tool_another_server_adds_under_a_taken_name_never_runs_in_its_place() {
    // `other` adds a `lookup` during the run: the model and the permissions have `trusted`'s
    // `lookup`, so a call of it runs `trusted`'s, and the run says the other was refused.
    let dir = two_servers(
        r#""lookup""#,
        r#""--later", "lookup""#,
        json!([
            {"tool_calls": [{"id": "a", "name": "add_tool", "arguments": {}}]},
            {"tool_calls": [{"id": "l", "name": "lookup", "arguments": {}}]},
            {"text": "done"}
        ]),
    );
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "look it up",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        ran(&dir),
        "trusted ran lookup\n",
        "stderr: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("⟳ tools changed: ; refused lookup: duplicate tool name"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn collide_two_servers_listing_one_name_at_start_run_the_first_and_warn() {
    let dir = two_servers(
        r#""lookup""#,
        r#""lookup", "other_only""#,
        json!([
            {"tool_calls": [{"id": "l", "name": "lookup", "arguments": {}}]},
            {"text": "done"}
        ]),
    );
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "look it up",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        ran(&dir),
        "trusted ran lookup\n",
        "stderr: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(
            "agentloop: warning: the MCP tools \"lookup\" of other and \"lookup\" of trusted would \
             both be named lookup: \"lookup\" is left out, as it is listed later"
        ),
        "{}",
        stderr(&out)
    );
    // `mcp list` says so too.
    let list = agentloop(args(&[
        "mcp",
        "list",
        dir.agent().to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(list.status.code(), Some(0), "stderr: {}", stderr(&list));
    let v = stdout_json(&list);
    let c = &v["collisions"];
    assert_eq!(c.as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(c[0]["name"], "lookup");
    assert_eq!(c[0]["kept"], json!({"server": "trusted", "tool": "lookup"}));
    assert_eq!(
        c[0]["dropped"],
        json!({"server": "other", "tool": "lookup"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn collide_two_tools_of_one_server_named_alike_keep_the_first_listed() {
    // `get.user` and `get_user` are both `srv__get_user`: the first listed is the tool.
    let server = named_server();
    let dir = AgentDir::new(&format!(
        r#"name = "one"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "srv"
command = ["python3", "{}", "srv", "get.user", "get_user"]
"#,
        server.display()
    ));
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [{"id": "g", "name": "srv__get_user", "arguments": {}}]},
            {"text": "done"}
        ])
        .to_string(),
    );
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "get the user",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(ran(&dir), "srv ran get.user\n", "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("the MCP tools \"get_user\" of srv and \"get.user\" of srv"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn collide_entries_whose_names_meet_as_the_file_says_are_refused_with_their_key_and_line() {
    let dir = AgentDir::new(
        r#"name = "clash"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "read"
builtin = "read_file"

[[mcp]]
name = "a"
command = ["x"]
prefix = "gh_"
rename = { list = "read", get = "fetch" }

[[mcp]]
name = "b"
command = ["x"]
prefix = "gh_"
rename = { pull = "fetch" }

[[mcp]]
name = "c"
command = ["x"]
prefix = "d__"

[[mcp]]
name = "d"
command = ["x"]

[[mcp]]
name = "e"
command = ["x"]
prefix = ""

[[mcp]]
name = "f"
command = ["x"]
prefix = ""
"#,
    );
    dir.write("script.json", "[]");
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    for expected in [
        "mcp[0].rename",
        "the new name \"read\" of \"list\" is taken by the agent's tool \"read\"",
        ":19:10: mcp[1].prefix: the tools of b would be named gh_TOOL, as those of a are",
        "mcp[1].rename",
        "the new name \"fetch\" of \"pull\" is taken by a's \"get\", renamed so too",
        "mcp[3].name: the tools of d would be named d__TOOL, as those of c are",
    ] {
        assert!(err.contains(expected), "{expected} missing in: {err}");
    }
    // Two servers that keep their own names meet only if they list one name: a run's matter.
    assert!(!err.contains("mcp[4]") && !err.contains("mcp[5]"), "{err}");
}
