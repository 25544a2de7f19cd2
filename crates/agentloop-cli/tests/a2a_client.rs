#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The A2A client: an `a2a = "http://..."` tool entry makes a remote agent a tool, on loopback.
//! The other side is an agent written with the official A2A SDK (`a2a-sdk` from PyPI, its
//! Starlette server; `scripts/a2a/server.py`, which puts a text in capitals, fails on `fail`, and
//! works until cancelled on `slow`), streaming or not, or our own `agentloop a2a serve`. A
//! scripted model calls the tool; what it read comes back in `run --json`'s transcript.

mod support;

use std::io::BufRead as _;

use serde_json::{Value, json};
use support::*;

/// `scripts/a2a/server.py` on a free loopback port, its files in `dir`; stopped when dropped.
struct SdkAgent {
    child: std::process::Child,
    url: String,
}

impl SdkAgent {
    fn start(dir: &AgentDir, streaming: bool) -> SdkAgent {
        SdkAgent::start_with(dir, streaming, &[])
    }

    /// With more of `server.py`'s flags (`--key`, `--cut-stream`, `--flaky-get`).
    fn start_with(dir: &AgentDir, streaming: bool, flags: &[&str]) -> SdkAgent {
        let mut cmd = std::process::Command::new(a2a_installed().join("venv/bin/python"));
        cmd.arg(repo().join("scripts/a2a/server.py"))
            .arg(dir.path(""))
            .args(flags)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped());
        if !streaming {
            cmd.arg("--no-streaming");
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let url = lines
            .next()
            .expect("the SDK's server ended before it printed its URL")
            .unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        std::thread::spawn(move || lines.for_each(drop));
        SdkAgent { child, url }
    }
}

impl Drop for SdkAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent whose scripted model makes `steps` (each a call of `shout` with its task) and then
/// answers "done"; `extra` is more of the file.
fn caller(url: &str, tasks: &[&str], extra: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "caller"
description = "Hands texts to a remote agent."

[model]
provider = "scripted"
script = "script.json"

[[tools]]
name = "shout"
a2a = "{url}"
{extra}"#
    ));
    let mut script: Vec<Value> = tasks
        .iter()
        .enumerate()
        .map(|(i, task)| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "shout",
                                   "arguments": {"task": task}}]})
        })
        .collect();
    script.push(json!({"text": "done"}));
    dir.write("script.json", &serde_json::to_string(&script).unwrap());
    dir
}

/// The tool results of a run's transcript, in order: (is it an error, the text the model read).
fn results(run: &Value) -> Vec<(bool, String)> {
    run["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let text = match &m["content"]["value"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (m["is_error"].as_bool().unwrap_or(false), text)
        })
        .collect()
}

/// The status words of a task of our own server whose agent hands `task` to the agent at
/// `remote`, as the SDK's client streams them.
async fn relayed(remote: &str, task: &str) -> Vec<String> {
    let middle = caller(remote, &[task], "");
    let served = HttpServer::start("a2a", &[middle.agent().to_str().unwrap()]);
    let seen = python_client_steps(
        a2a_installed().join("venv/bin/python"),
        "scripts/a2a/client.py",
        vec![
            served.url.clone(),
            json!([{"do": "send", "text": "go", "streaming": true}]).to_string(),
        ],
    )
    .await;
    seen[0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.get("statusUpdate"))
        .filter_map(|u| u["status"]["message"]["parts"][0]["text"].as_str())
        .map(str::to_owned)
        .collect()
}

async fn results_reach_the_model(streaming: bool) {
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start(&remote_dir, streaming);
    let dir = caller(&remote.url, &["hello there", "fail now"], "");
    let (_, v) = run_finished(&dir.agent(), "go").await;
    let seen = results(&v);
    assert_eq!(seen.len(), 2, "{v}");
    assert_eq!(seen[0], (false, "HELLO THERE".to_owned()), "{seen:?}");
    // A failed remote task is an error result the model reads, with the agent's own words.
    assert!(seen[1].0, "{seen:?}");
    assert!(
        seen[1].1.contains("TASK_STATE_FAILED")
            && seen[1].1.contains("the remote agent cannot do that"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_sdk_agent_answers_and_fails_as_a_tool() {
    results_reach_the_model(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sdk_agent_without_streaming_is_sent_whole_messages() {
    results_reach_the_model(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_card_is_read_at_start_and_plan_shows_the_entry() {
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start(&remote_dir, true);
    let dir = caller(&remote.url, &[], "");
    // `plan` reaches nothing: the entry as written.
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let plan = stdout_json(&out);
    let tool = &plan["tools"][0];
    assert_eq!(tool["name"], "shout");
    assert_eq!(tool["a2a"], remote.url.as_str());
    assert_eq!(tool["input_schema"]["required"], json!(["task"]));
    // A remote agent that works for ever would hold the run for ever: a call has ten minutes
    // unless the entry says otherwise.
    assert_eq!(tool["timeout_secs"], 600.0, "{tool}");
    // A run reads the card when it starts: its words are the tool's description the model gets.
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let model = AgentDir::new(&format!(
        r#"name = "caller"
[model]
provider = "openai"
name = "gpt-4o"
base_url = "{}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
[[tools]]
name = "shout"
a2a = "{}"
"#,
        fake.uri(),
        remote.url
    ));
    let out = agentloop(args(&[
        "run",
        model.agent().to_str().unwrap(),
        "--input",
        "go",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sent = &fake.bodies().await[0]["tools"][0]["function"];
    assert_eq!(sent["name"], "shout");
    assert_eq!(
        sent["description"],
        "Answers with the text it is given in capitals.\nSkills:\n- shout: Puts a text in capitals."
    );
    // A URL where no agent answers stops the run before it starts, naming the tool.
    drop(remote);
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("tool shout: a2a.card"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deadline_of_our_run_cancels_the_remote_task() {
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start(&remote_dir, true);
    let dir = caller(
        &remote.url,
        &["slow down"],
        "\n[limits]\ntimeout_secs = 3\n",
    );
    let out = run_agent_json(&dir.agent(), "go").await;
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "deadline", "{v}");
    assert_eq!(v["tool_calls"][0]["error"]["code"], "a2a.cancelled", "{v}");
    let started = std::fs::read_to_string(remote_dir.path("started")).unwrap();
    // The SDK's server saw the CancelTask of the very task the call started.
    let cancelled = std::fs::read_to_string(remote_dir.path("cancelled"))
        .expect("the remote task was not cancelled");
    assert_eq!(cancelled, started);
}

#[tokio::test(flavor = "multi_thread")]
async fn our_client_calls_our_own_server_and_its_progress_reaches_an_sdk_client() {
    // Our own server, an agent of it that calls the SDK's agent: the SDK's client streams a
    // task of ours, and reads the remote agent's status among our task's.
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start(&remote_dir, true);
    let said = relayed(&remote.url, "relay me").await;
    let said: Vec<&str> = said.iter().map(String::as_str).collect();
    assert!(said.contains(&"shout: uppercasing"), "{said:?}");
    assert!(said.contains(&"shout: ok"), "{said:?}");

    // And our client against our own server: the forecaster's answer is the call's result.
    let forecaster = forecaster("");
    let served = HttpServer::start("a2a", &[forecaster.agent().to_str().unwrap()]);
    let dir = caller(&served.url, &["The weather in Paris?"], "");
    let (_, v) = run_finished(&dir.agent(), "go").await;
    let seen = results(&v);
    assert_eq!(seen.len(), 1, "{v}");
    assert!(!seen[0].0, "{seen:?}");
    assert!(seen[0].1.contains("18 degrees and sunny"), "{seen:?}");
}

#[tokio::test]
async fn an_a2a_entry_is_checked_with_the_file() {
    let dir = AgentDir::new(
        r#"name = "caller"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "shout"
a2a = "ftp://x"
retries = 2
max_bytes = 0
[[tools]]
name = "two"
a2a = "http://127.0.0.1:9"
command = ["echo"]
"#,
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    for problem in [
        "tools[0].a2a: \"ftp://x\" is not an http:// or https:// URL",
        "tools[0].retries: `retries` does not apply to `a2a` tools",
        "tools[1].a2a: give one of",
        "tools[0].max_bytes: max_bytes must be at least 1",
    ] {
        assert!(said.contains(problem), "{problem} not in {said}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_remote_agents_answer_and_progress_are_bounded() {
    // The remote agent says 100,000 bytes of status, then appends 3 MiB to one artifact.
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start(&remote_dir, true);
    for (extra, max) in [("", 65_536), ("max_bytes = 4096\n", 4096)] {
        let dir = caller(&remote.url, &["flood it"], extra);
        let (_, v) = run_finished(&dir.agent(), "go").await;
        let seen = results(&v);
        let (failed, text) = &seen[0];
        assert!(!failed, "{text}");
        assert!(text.len() <= max, "{} bytes over {max}", text.len());
        // Its head and tail, with what was cut and what was never kept said.
        assert!(text.starts_with("aaaa"), "{}", &text[..40]);
        assert!(text.contains("bytes cut from the middle"), "{}", text.len());
        assert!(
            text.contains("more bytes of the remote agent's artifacts were not kept"),
            "{}",
            &text[text.len() - 200..]
        );
    }

    // Its status, passed on by our own server as one of its task's, is cut to 1 KiB.
    let said: Vec<String> = relayed(&remote.url, "flood it")
        .await
        .into_iter()
        .filter(|t| t.starts_with("shout: xxx"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].len() < 1100, "{}", said[0].len());
    assert!(said[0].contains("bytes cut from the middle"), "{}", said[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_url_with_its_key_in_the_query_or_as_a_password_is_called_with_it() {
    // The SDK's agent answers 401 to any request without the key, its card's included; its
    // card names its URL without the key.
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start_with(&remote_dir, true, &["--key", "s3cret"]);
    let host = remote.url.trim_start_matches("http://");
    for url in [
        format!("{}/?key=s3cret", remote.url),
        format!("http://me:s3cret@{host}"),
    ] {
        let dir = caller(&url, &["hello there"], "");
        let (_, v) = run_finished(&dir.agent(), "go").await;
        assert_eq!(
            results(&v),
            vec![(false, "HELLO THERE".to_owned())],
            "{url}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_stream_and_failed_polls_do_not_end_the_call_nor_cancel_the_remote_task() {
    // The stream is dropped after its first event, and the first two GetTask answers are a
    // proxy's 502s; the remote task (3 s of work) goes on all the while.
    let remote_dir = AgentDir::new("");
    let remote = SdkAgent::start_with(&remote_dir, true, &["--cut-stream", "--flaky-get", "2"]);
    let dir = caller(&remote.url, &["pause then"], "");
    let (_, v) = run_finished(&dir.agent(), "go").await;
    assert_eq!(results(&v), vec![(false, "PAUSE THEN".to_owned())], "{v}");
    assert!(
        !remote_dir.path("cancelled").exists(),
        "the remote task was cancelled"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_our_own_server_ends_at_its_stop_is_followed_by_polling_into_its_restart() {
    // Our server, journaled, is stopped (SIGTERM) while our client streams its task, whose
    // run is in its slow tool, and started again on the same address: the stream ends with
    // `a2a.stopped`, and the client asks for the task until the restarted server, which
    // found the run in its journal and went on with it, has its answer.
    let remote = forecaster("");
    slow_script(&remote);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (agent, journal) = (remote.agent(), remote.path("journal.db"));
    let args = [
        agent.to_str().unwrap(),
        "--journal",
        journal.to_str().unwrap(),
    ];
    let at = format!("127.0.0.1:{port}");
    let first = HttpServer::start_at("a2a", &at, &args);
    let dir = caller(&first.url, &["Weather?"], "");
    let call = tokio::spawn(async move {
        let out = run_agent_json(&dir.agent(), "go").await;
        (stdout_json(&out), stderr(&out))
    });
    first.terminate_once_exists(&remote.path("started"));
    let second = HttpServer::start_at("a2a", &at, &args);
    let (v, err) = call.await.unwrap();
    drop(second);
    assert_eq!(v["stop_reason"], "finished", "{v}\n{err}");
    let seen = results(&v);
    assert_eq!(seen.len(), 1, "{v}");
    assert!(!seen[0].0, "the call failed: {seen:?}");
    assert!(seen[0].1.contains("late"), "{seen:?}");
}
