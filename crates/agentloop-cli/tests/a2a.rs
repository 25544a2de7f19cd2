#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop a2a serve`, driven by the official A2A SDK's client (`a2a-sdk` from PyPI, installed
//! at its pinned version by `scripts/a2a/install.sh`; `scripts/a2a/client.py` is a thin script
//! over it) on loopback, a scripted agent answering: the SDK reads the agent card, sends a message
//! and reads the task's answer, streams a second message of the same context (its status at
//! each turn and tool call, then the answer's artifact), gets a task, and cancels one whose tool
//! is running (the run stops, and the tool's process with it); finds a journaled task after the
//! server was killed mid-run and restarted, and sees its run go on; answers a call the agent's
//! permissions ask about through `input-required` and a message on the task. And, in process, a
//! run the server claimed to resume and did not go on with, let go for another process.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// Runs the SDK's client through `steps` against the agent at `url`.
async fn sdk_client(url: &str, steps: Value) -> Vec<Value> {
    python_client_steps(
        a2a_installed().join("venv/bin/python"),
        "scripts/a2a/client.py",
        vec![url.to_owned(), steps.to_string()],
    )
    .await
}

fn text(message: &Value) -> &str {
    message["parts"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_reads_the_card_sends_and_streams_in_one_context() {
    let dir = forecaster("");
    let trace = dir.path("trace.ndjson");
    let agent = dir.agent();
    let server = HttpServer::start(
        "a2a",
        &[agent.to_str().unwrap(), "--trace", trace.to_str().unwrap()],
    );
    assert!(server.url.ends_with("/forecaster"), "{}", server.url);
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "card"},
            {"do": "send", "text": "The weather in Paris?", "context": "c"},
            {"do": "send", "text": "And again?", "context": "c", "streaming": true}
        ]),
    )
    .await;

    let card = &seen[0]["card"];
    assert_eq!(card["name"], "forecaster");
    assert_eq!(card["description"], "Forecasts the weather of a city.");
    assert_eq!(card["skills"][0]["id"], "forecaster");
    assert_eq!(card["capabilities"]["streaming"], true);
    let interface = &card["supportedInterfaces"][0];
    assert_eq!(interface["protocolBinding"], "JSONRPC");
    assert_eq!(interface["protocolVersion"], "1.0");
    assert_eq!(interface["url"], server.url.as_str());

    // Not streamed: one event, the finished task with its answer.
    let events = seen[1]["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let task = &events[0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let answer = &task["artifacts"][0];
    assert_eq!(answer["name"], "answer");
    assert_eq!(
        answer["parts"][1]["data"],
        json!({"forecast": "18 degrees and sunny"})
    );
    assert_eq!(text(&task["history"][0]), "The weather in Paris?");
    assert_eq!(task["history"][0]["role"], "ROLE_USER");
    assert_eq!(task["history"][1]["role"], "ROLE_AGENT");

    // Streamed: the task, its status through the run, the answer, the end.
    let events = seen[2]["events"].as_array().unwrap();
    let first = &events[0]["task"];
    assert_eq!(first["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(first["contextId"], task["contextId"], "the same context");
    let said: Vec<&str> = events
        .iter()
        .filter_map(|e| e.get("statusUpdate"))
        .filter_map(|u| u["status"].get("message"))
        .map(text)
        .collect();
    assert!(
        said.starts_with(&["turn 1", "calling forecast", "forecast: ok", "turn 2"]),
        "{said:?}"
    );
    let artifact = events
        .iter()
        .find_map(|e| e.get("artifactUpdate"))
        .expect("no artifact update");
    assert_eq!(
        artifact["artifact"]["parts"][1]["data"]["forecast"],
        "18 degrees and sunny"
    );
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_COMPLETED", "{events:?}");
    assert_eq!(dir.tool_inputs().len(), 2, "each message ran the agent");

    // The context is a conversation: the second run's first request held the first run's
    // messages (its user message, the call, its result, the answer) before its own.
    let model_calls: Vec<u64> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "model_call" && r.get("ended_at_ms").is_some())
        .map(|r| r["messages"].as_u64().unwrap())
        .collect();
    assert_eq!(model_calls.len(), 4, "{model_calls:?}");
    assert!(model_calls[2] > model_calls[1], "{model_calls:?}");
}

/// Two files of one agent name would be served at one path: the server does not start, and says
/// which two, with the same exit and wording as `mcp serve`'s two tools of one name.
#[tokio::test(flavor = "multi_thread")]
async fn two_files_of_one_agent_name_are_a_setup_error_naming_both() {
    let (one, two) = (forecaster(""), forecaster(""));
    let (one, two) = (one.agent(), two.agent());
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());
    let out = agentloop(args(&["a2a", "serve", one, two, "--addr", "127.0.0.1:0"])).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "a2a.duplicate_agent: two served agents are named \"forecaster\": the agent of {one} \
             and the agent of {two}"
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_by_another_name_or_not_of_json_is_refused_before_any_run() {
    // What a web page can send: a `text/plain` POST (no preflight), or any request once its own
    // name points at 127.0.0.1 (DNS rebinding), its `Host` then that name.
    let dir = forecaster("");
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap()]);
    let own = server
        .url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let port = own.rsplit(':').next().unwrap();
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": "m", "parts": [{"text": "The weather?"}]}}})
    .to_string();
    let json_type = Some("application/json");
    let rebound = format!("attacker.example:{port}");
    let card = format!("{}/.well-known/agent-card.json", server.url);
    assert_eq!(
        http_status(&server.url, "POST", &rebound, json_type, &send),
        403
    );
    assert_eq!(http_status(&card, "GET", &rebound, None, ""), 403);
    assert_eq!(
        http_status(&server.url, "POST", &own, Some("text/plain"), &send),
        415
    );
    assert_eq!(http_status(&server.url, "POST", &own, None, &send), 415);
    assert!(dir.tool_inputs().is_empty(), "nothing ran");
    // By its own name, with JSON, the same request is served.
    assert_eq!(
        http_status(&card, "GET", &format!("localhost:{port}"), None, ""),
        200
    );
    let (status, _) = http_request(&server.url, "POST", &own, &A2A_JSON, &send);
    assert_eq!(status, 200);
    assert_eq!(dir.tool_inputs().len(), 1);
}

/// The headers of a JSON-RPC request of A2A 1.0.
const A2A_JSON: [(&str, &str); 2] = [("Content-Type", "application/json"), ("A2A-Version", "1.0")];

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_gets_and_cancels_a_task_whose_tool_is_running() {
    let dir = forecaster("");
    slow_script(&dir);
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap()]);
    let started = Instant::now();
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "start", "text": "Take your time.", "task": "t"},
            {"do": "cancel", "task": "t", "when_exists": dir.path("started")},
            {"do": "get", "task": "t"},
            {"do": "cancel", "task": "t"}
        ]),
    )
    .await;
    let working = &seen[0]["events"][0]["task"];
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"]
            .contains(&working["status"]["state"].as_str().unwrap()),
        "{working}"
    );
    let cancelled = &seen[1]["task"];
    assert_eq!(
        cancelled["status"]["state"], "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    assert_eq!(seen[2]["task"]["status"]["state"], "TASK_STATE_CANCELED");
    // A task that ended cannot be cancelled again.
    assert_eq!(
        seen[3]["error"]["type"], "TaskNotCancelableError",
        "{}",
        seen[3]
    );
    // The tool's process went with its run.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    assert!(!dir.path("finished").exists(), "the slow tool ran on");
}

/// States a task settles in, for a client that waits on it.
const SETTLED: [&str; 4] = [
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
];

/// Waits (at most 60 s) until `path` exists.
async fn until_exists(path: &std::path::Path) {
    for _ in 0..600 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} never appeared", path.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_journaled_task_killed_mid_run_is_found_after_a_restart_and_goes_on() {
    let dir = forecaster("");
    slow_script(&dir);
    // Each start of the slow tool leaves a line, so a second start would show.
    dir.write(
        "slow.py",
        "import time\nopen('starts', 'a').write('start\\n')\nopen('started', 'w').close()\n\
         time.sleep(30)\n",
    );
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let args = [
        agent.to_str().unwrap(),
        "--journal",
        journal.to_str().unwrap(),
    ];
    let server = HttpServer::start("a2a", &args);
    let seen = sdk_client(
        &server.url,
        json!([{"do": "start", "text": "Take your time.", "task": "t", "context": "c"}]),
    )
    .await;
    let first = seen[0]["events"][0]["task"].clone();
    let (id, context) = (first["id"].as_str().unwrap(), &first["contextId"]);
    // The run is in its tool call when the server is killed (SIGKILL: nothing is cleaned up).
    until_exists(&dir.path("started")).await;
    drop(server);

    let server = HttpServer::start("a2a", &args);
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "get", "task": {"id": id}},
            {"do": "wait", "task": {"id": id}, "until": SETTLED}
        ]),
    )
    .await;
    let found = &seen[0]["task"];
    assert_eq!(found["id"], id, "{found}");
    assert_eq!(&found["contextId"], context, "the task keeps its context");
    // Found, and going on (it may already have ended: its run has one short step left).
    assert!(
        ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
            .contains(&found["status"]["state"].as_str().unwrap()),
        "{found}"
    );
    assert_eq!(text(&found["history"][0]), "Take your time.");
    let done = &seen[1]["task"];
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(done["artifacts"][0]["parts"][1]["data"]["forecast"], "late");
    // The slow call was running at the kill and is not idempotent: it was not run again (the
    // model read that it was interrupted).
    let starts = std::fs::read_to_string(dir.path("starts")).unwrap();
    assert_eq!(starts.lines().count(), 1, "{starts}");

    // Once over, the task is read from the journal: after another restart it is still there.
    drop(server);
    let server = HttpServer::start("a2a", &args);
    let seen = sdk_client(&server.url, json!([{"do": "get", "task": {"id": id}}])).await;
    let again = &seen[0]["task"];
    assert_eq!(again["status"]["state"], "TASK_STATE_COMPLETED", "{again}");
    assert_eq!(again["artifacts"], done["artifacts"]);
    assert_eq!(&again["contextId"], context);
    // A task that never was is not found.
    let seen = sdk_client(
        &server.url,
        json!([{"do": "get", "task": {"id": "0193a7c0-0000-7000-8000-000000000000"}}]),
    )
    .await;
    assert_eq!(seen[0]["error"]["type"], "TaskNotFoundError", "{}", seen[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_asked_call_waits_in_input_required_until_a_message_on_the_task_answers_it() {
    let dir = forecaster("[permissions]\nask = [\"forecast\"]\nstore = \"permissions.json\"\n");
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap()]);
    let seen = sdk_client(
        &server.url,
        json!([{"do": "send", "text": "The weather in Paris?", "context": "c"}]),
    )
    .await;
    let asked = &seen[0]["events"][0]["task"];
    assert_eq!(
        asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{asked}"
    );
    let question = &asked["status"]["message"];
    assert!(text(question).contains("forecast"), "{question}");
    assert_eq!(
        question["parts"][1]["data"]["approvals"][0]["arguments"],
        json!({"city": "Paris"})
    );
    assert!(dir.tool_inputs().is_empty(), "the asked call waits");

    // The answer is a message on the task; the run goes on and the call runs.
    let id = asked["id"].as_str().unwrap();
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "reply", "task": {"id": id}, "text": "no idea"},
            {"do": "reply", "task": {"id": id}, "text": "approve always", "streaming": true}
        ]),
    )
    .await;
    assert_eq!(
        seen[0]["error"]["type"], "InvalidParamsError",
        "{}",
        seen[0]
    );
    let events = seen[1]["events"].as_array().unwrap();
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_COMPLETED", "{events:?}");
    assert_eq!(dir.tool_inputs().len(), 1);

    // A remote caller's "always" answers the calls it was shown, no later ones: nothing is
    // written to the agent's permission store (created empty before the run, as a command tool
    // may write its folder), and the next task is asked about again.
    let store = std::fs::read_to_string(dir.path("permissions.json")).unwrap_or_default();
    assert!(!store.contains("\"tool\""), "{store}");
    // Denied, the call does not run and the model reads why; the task completes.
    let seen = sdk_client(
        &server.url,
        json!([{"do": "send", "text": "Again?", "context": "d"}]),
    )
    .await;
    let asked = &seen[0]["events"][0]["task"];
    assert_eq!(asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let id = asked["id"].as_str().unwrap();
    let seen = sdk_client(
        &server.url,
        json!([{"do": "reply", "task": {"id": id}, "text": "deny"}]),
    )
    .await;
    let task = &seen[0]["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(dir.tool_inputs().len(), 1, "the denied call did not run");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_suspended_for_its_own_approver_is_no_task_of_the_server() {
    // `agentloop run --journal` stopped at an asked call, waiting for `agentloop approve`; a
    // server on the same journal must not take it up, and hand its approval to a caller.
    let dir = forecaster("[permissions]\nask = [\"forecast\"]\n");
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--journal",
        journal.to_str().unwrap(),
        "--json",
        "--input",
        "The weather in Paris?",
    ]))
    .await;
    let suspended = stdout_json(&out);
    assert_eq!(suspended["stop_reason"], "suspended", "{suspended}");
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    let server = HttpServer::start(
        "a2a",
        &[
            agent.to_str().unwrap(),
            "--journal",
            journal.to_str().unwrap(),
        ],
    );
    let seen = sdk_client(&server.url, json!([{"do": "get", "task": {"id": id}}])).await;
    assert_eq!(seen[0]["error"]["type"], "TaskNotFoundError", "{}", seen[0]);
    assert!(dir.tool_inputs().is_empty(), "the asked call did not run");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_sessions_a_context_is_a_stored_session_that_goes_on_after_a_restart() {
    let dir = forecaster("");
    let (agent, sessions) = (dir.agent(), dir.path("sessions.db"));
    let serve_args = [
        agent.to_str().unwrap(),
        "--sessions",
        sessions.to_str().unwrap(),
    ];
    let server = HttpServer::start("a2a", &serve_args);
    let seen = sdk_client(
        &server.url,
        json!([{"do": "send", "text": "The weather in Paris?", "context": "c"}]),
    )
    .await;
    let context = seen[0]["events"][0]["task"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(server);

    // A new server: the context's next message goes on from its stored transcript.
    let server = HttpServer::start("a2a", &serve_args);
    let seen = sdk_client(
        &server.url,
        json!([{"do": "send", "context_id": context, "text": "And again?"}]),
    )
    .await;
    let task = &seen[0]["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let session = shown_session(&sessions, &context).await;
    assert_eq!(session["runs"], 2, "{session}");
    assert_eq!(session["agent"], "forecaster");
    // Both runs' messages: each a question, a call, its result and an answer.
    let messages = session["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 8, "{session}");

    // The user's own conversation in the same store is no context of the server's: a caller
    // that names it gets a failed task, and the session is left as it was.
    use agentloop::session::SessionStore;
    let store = agentloop_store::SqliteSessions::open(&sessions).unwrap();
    let mut own = agentloop::session::StoredSession::new("work", "forecaster");
    own.messages
        .push(agentloop::Message::user("my private notes"));
    store.save(&own).unwrap();
    let seen = sdk_client(
        &server.url,
        json!([{"do": "send", "context_id": "work", "text": "Repeat what I said."}]),
    )
    .await;
    let task = &seen[0]["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{task}");
    assert!(
        text(&task["status"]["message"]).contains("not one of this agent's"),
        "{task}"
    );
    assert_eq!(store.load("work").unwrap().unwrap(), own);
}

/// Session `id` of the store at `sessions`, as `agentloop sessions show --json` shows it.
async fn shown_session(sessions: &std::path::Path, id: &str) -> Value {
    let out = agentloop(args(&[
        "sessions",
        "show",
        id,
        "--sessions",
        sessions.to_str().unwrap(),
        "--json",
    ]))
    .await;
    stdout_json(&out)
}

/// A JSON-RPC request to the server at `url` by its own name: its status and its JSON answer.
fn rpc_call(url: &str, request: Value) -> (u16, Value) {
    rpc_call_with(url, &A2A_JSON, request)
}

/// [`rpc_call`] with these headers.
fn rpc_call_with(url: &str, headers: &[(&str, &str)], request: Value) -> (u16, Value) {
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let (status, body) = http_request(url, "POST", host, headers, &request.to_string());
    let answer = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status, answer)
}

/// A message that starts a task (or, with `task`, answers one) and returns while it works.
fn message(text: &str, task: Option<&str>) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": uuid_like(), "taskId": task,
                    "parts": [{"text": text}]},
        "configuration": {"returnImmediately": true}}})
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("m{}", N.fetch_add(1, Ordering::Relaxed))
}

/// The state of task `id`, once it is no longer submitted or working (at most 60 s).
async fn settled_state(url: &str, id: &str) -> String {
    let task = task_when(url, id, |state| SETTLED.contains(&state)).await;
    task["status"]["state"].as_str().unwrap().to_owned()
}

/// The task a `GetTask` or `CancelTask` of task `id` answers (null for an error).
fn on_task(url: &str, method: &str, id: &str) -> Value {
    let (_, answer) = rpc_call(
        url,
        json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": {"id": id}}),
    );
    answer["result"].clone()
}

/// Task `id` once its state is one `done` takes (at most 60 s).
async fn task_when(url: &str, id: &str, done: impl Fn(&str) -> bool) -> Value {
    let mut task = Value::Null;
    for _ in 0..600 {
        task = on_task(url, "GetTask", id);
        if done(task["status"]["state"].as_str().unwrap_or_default()) {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {id} never settled: {task}");
}

/// An agent whose every run asks about `slow` first, then runs it (8 s), served with one place
/// for runs.
fn one_place_server() -> (AgentDir, HttpServer) {
    let dir = forecaster("[permissions]\nask = [\"slow\"]\n");
    slow_script(&dir);
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap(), "--max-runs", "1"]);
    (dir, server)
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_most_runs_the_server_refuses_a_new_run_and_a_waiting_task_holds_no_place() {
    let (dir, server) = one_place_server();
    let url = &server.url;

    // Two tasks wait for their caller's answer at once: waiting costs nothing, so neither holds
    // the server's one place.
    let (status, first) = rpc_call(url, message("Take your time.", None));
    assert_eq!(status, 200, "{first}");
    let first = first["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        settled_state(url, &first).await,
        "TASK_STATE_INPUT_REQUIRED"
    );
    let (status, second) = rpc_call(url, message("And you too.", None));
    assert_eq!(status, 200, "{second}");
    let second = second["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        settled_state(url, &second).await,
        "TASK_STATE_INPUT_REQUIRED"
    );

    // Approved, the first works (its slow tool runs) and holds the place.
    let (status, answer) = rpc_call(url, message("approve", Some(&first)));
    assert_eq!(status, 200, "{answer}");
    until_exists(&dir.path("started")).await;

    // While it works, a new message is refused before any run starts, and so is the answer that
    // would set the second working again; the second still waits.
    let (status, busy) = rpc_call(url, message("One more.", None));
    assert_eq!(status, 429, "{busy}");
    assert_eq!(busy["error"]["data"]["code"], "a2a.busy", "{busy}");
    let (status, busy) = rpc_call(url, message("approve", Some(&second)));
    assert_eq!(status, 429, "{busy}");
    assert_eq!(busy["error"]["code"], -32000, "{busy}");
    assert_eq!(
        settled_state(url, &second).await,
        "TASK_STATE_INPUT_REQUIRED"
    );

    // Once the first ended, its place is free: the second's answer is taken.
    assert_eq!(settled_state(url, &first).await, "TASK_STATE_COMPLETED");
    let (status, answer) = rpc_call(url, message("approve", Some(&second)));
    assert_eq!(status, 200, "{answer}");
}

/// The runs of `journal`, as `agentloop journal list --json` shows them.
async fn journaled_runs(journal: &std::path::Path) -> Vec<Value> {
    let out = agentloop(args(&[
        "journal",
        "list",
        "--json",
        "--journal",
        journal.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout_json(&out).as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_the_user_started_on_the_shared_journal_is_no_task_of_the_server() {
    let dir = forecaster("");
    slow_script(&dir);
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let (agent, journal_arg) = (agent.to_str().unwrap(), journal.to_str().unwrap());
    // `agentloop run --journal`, killed in its slow tool call (a crash: the run is unfinished).
    let mut run = std::process::Command::new(bin())
        .args(["run", agent, "--journal", journal_arg, "--input", "Slowly."])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until_exists(&dir.path("started")).await;
    run.kill().unwrap();
    run.wait().unwrap();
    let runs = journaled_runs(&journal).await;
    let crashed = runs[0]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(runs[0]["status"], "running", "{runs:?}");
    // And a run of the same agent that finished.
    std::fs::remove_file(dir.path("started")).unwrap();
    dir.write("script.json", r#"[{"text": "{\"forecast\": \"my own\"}"}]"#);
    let out = agentloop(args(&[
        "run",
        agent,
        "--journal",
        journal_arg,
        "--json",
        "--input",
        "Mine.",
    ]))
    .await;
    let finished = stdout_json(&out)["run_id"].as_str().unwrap().to_owned();

    let server = HttpServer::start("a2a", &[agent, "--journal", journal_arg]);
    for id in [&crashed, &finished] {
        let (_, answer) = rpc_call(
            &server.url,
            json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
        );
        assert_eq!(answer["error"]["code"], -32001, "GetTask {id}: {answer}");
        let (_, answer) = rpc_call(&server.url, message("approve", Some(id)));
        assert_eq!(
            answer["error"]["code"], -32001,
            "SendMessage {id}: {answer}"
        );
    }
    // The crashed run was not driven on behind its user's back: it is as the kill left it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = journaled_runs(&journal).await;
    assert_eq!(after[0]["run_id"], crashed.as_str());
    assert_eq!(after[0]["status"], "running", "{after:?}");
    assert_eq!(after[0]["steps"], runs[0]["steps"], "{after:?}");
    assert!(
        !dir.path("started").exists(),
        "the slow tool did not start again"
    );

    // The server's own tasks are found there as before.
    let (_, answer) = rpc_call(&server.url, message("Mine too.", None));
    let id = answer["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        settled_state(&server.url, &id).await,
        "TASK_STATE_COMPLETED"
    );
    drop(server);
    let server = HttpServer::start("a2a", &[agent, "--journal", journal_arg]);
    let (_, answer) = rpc_call(
        &server.url,
        json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
    );
    assert_eq!(
        answer["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
}

/// A message of context `context` that starts a task and returns while it works.
fn message_in(text: &str, context: &str) -> Value {
    let mut m = message(text, None);
    m["params"]["message"]["contextId"] = json!(context);
    m
}

/// The id of the task a `SendMessage` answered.
fn task_id(answer: &Value) -> String {
    answer["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task in {answer}"))
        .to_owned()
}

/// Task `id` once its state is `state` (at most 60 s).
async fn until_state(url: &str, id: &str, state: &str) -> Value {
    task_when(url, id, |s| s == state).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_behind_a_waiting_task_of_its_context_holds_no_place_and_can_be_cancelled() {
    let (_dir, server) = one_place_server();
    let url = &server.url;
    let (status, first) = rpc_call(url, message_in("Take your time.", "c"));
    assert_eq!(status, 200, "{first}");
    let first = task_id(&first);
    until_state(url, &first, "TASK_STATE_INPUT_REQUIRED").await;

    // Two more messages of the context wait behind the first, which holds the context while it
    // waits for its answer: neither takes the server's one place.
    let (status, second) = rpc_call(url, message_in("Then this.", "c"));
    assert_eq!(status, 200, "{second}");
    let second = task_id(&second);
    let (status, third) = rpc_call(url, message_in("And this.", "c"));
    assert_eq!(status, 200, "{third}");
    let third = task_id(&third);
    let queued = on_task(url, "GetTask", &second);
    assert_eq!(
        queued["status"]["state"], "TASK_STATE_SUBMITTED",
        "{queued}"
    );

    // A waiting message is cancelled at once, never having run.
    let asked = Instant::now();
    let cancelled = on_task(url, "CancelTask", &third);
    assert_eq!(
        cancelled["status"]["state"], "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );

    // The first's answer finds the place free: its run goes on to its end, and the second runs
    // after it, on the context it left, asking in its turn.
    let (status, answer) = rpc_call(url, message("approve", Some(&first)));
    assert_eq!(status, 200, "{answer}");
    until_state(url, &first, "TASK_STATE_COMPLETED").await;
    until_state(url, &second, "TASK_STATE_INPUT_REQUIRED").await;
    let third = on_task(url, "GetTask", &third);
    assert_eq!(third["status"]["state"], "TASK_STATE_CANCELED");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_nobody_answers_ends_its_task_and_its_context_goes_on() {
    let dir = forecaster("[permissions]\nask = [\"forecast\"]\n");
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap(), "--approval-timeout", "2"]);
    let url = &server.url;
    let (_, first) = rpc_call(url, message_in("The weather in Paris?", "c"));
    let first = task_id(&first);
    until_state(url, &first, "TASK_STATE_INPUT_REQUIRED").await;
    let (_, second) = rpc_call(url, message_in("And again?", "c"));
    let second = task_id(&second);

    // Unanswered for 2 s, the first fails, saying why; its call never ran, and a late answer is
    // refused.
    let failed = until_state(url, &first, "TASK_STATE_FAILED").await;
    let why = failed["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        why.contains("nobody answered its approval within 2 s"),
        "{failed}"
    );
    let (_, late) = rpc_call(url, message("approve", Some(&first)));
    assert_eq!(late["error"]["code"], -32602, "{late}");
    assert!(dir.tool_inputs().is_empty(), "the asked call did not run");
    // The context is free again: the second message ran, and asks in its turn.
    until_state(url, &second, "TASK_STATE_INPUT_REQUIRED").await;

    // A context's id is kept as long as the context: one past 256 bytes is refused.
    let (_, long) = rpc_call(url, message_in("Hi", &"c".repeat(300)));
    assert_eq!(long["error"]["code"], -32602, "{long}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_of_another_a2a_version_is_told_which_one_is_served() {
    let dir = forecaster("");
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap()]);
    let url = &server.url;
    let json_only = [("Content-Type", "application/json")];
    let old = [("Content-Type", "application/json"), ("A2A-Version", "0.3")];
    // Without the header a request is one of 0.3: its method names are not 1.0's either.
    let v03 = json!({"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {
        "message": {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "Hi"}]}}});
    for (headers, request) in [
        (&json_only[..], message("The weather?", None)),
        (&old[..], message("The weather?", None)),
        (&json_only[..], v03),
    ] {
        let (status, answer) = rpc_call_with(url, headers, request);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["error"]["code"], -32009, "{answer}");
        assert_eq!(
            answer["error"]["data"]["code"], "a2a.version_not_supported",
            "{answer}"
        );
    }
    assert!(dir.tool_inputs().is_empty(), "nothing ran");
    let (_, answer) = rpc_call(url, message("The weather?", None));
    assert!(answer["result"]["task"]["id"].is_string(), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_resumed_after_a_restart_leaves_the_newer_turns_of_its_context_alone() {
    let dir = forecaster("");
    slow_script(&dir);
    // The slow tool's first start takes its time (the server is killed in it); later ones end
    // at once.
    dir.write(
        "slow.py",
        "import os, time\nfirst = not os.path.exists('started')\nopen('started', 'a').close()\n\
         if first:\n    time.sleep(30)\n",
    );
    let (agent, journal, sessions) = (dir.agent(), dir.path("journal.db"), dir.path("sessions.db"));
    let serve_args = [
        agent.to_str().unwrap(),
        "--journal",
        journal.to_str().unwrap(),
        "--sessions",
        sessions.to_str().unwrap(),
    ];
    let server = HttpServer::start("a2a", &serve_args);
    let (status, answer) = rpc_call(&server.url, message_in("Take your time.", "c"));
    assert_eq!(status, 200, "{answer}");
    let first = task_id(&answer);
    let context = answer["result"]["task"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    until_exists(&dir.path("started")).await;
    drop(server);

    // After the restart the context takes a turn before anyone asks about the first task.
    let server = HttpServer::start("a2a", &serve_args);
    let url = &server.url;
    let (status, answer) = rpc_call(url, message_in("Then this.", &context));
    assert_eq!(status, 200, "{answer}");
    let second = task_id(&answer);
    until_state(url, &second, "TASK_STATE_COMPLETED").await;

    // The first task is found and goes on to its end; its run began on the context as it was
    // before that turn, so it says it was not added rather than replacing the turn.
    let done = until_state(url, &first, "TASK_STATE_COMPLETED").await;
    assert!(
        text(&done["status"]["message"]).contains("not added to its context"),
        "{done}"
    );
    let session = shown_session(&sessions, &context).await;
    let messages = session["messages"].to_string();
    assert!(messages.contains("Then this."), "{session}");
    assert!(!messages.contains("Take your time."), "{session}");
    assert_eq!(session["runs"], 1, "{session}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_claimed_for_a_resume_that_does_not_go_on_is_let_go_for_another_process() {
    // A journaled task's run, found running after a restart, is claimed; read again, it no longer
    // goes on here (its previous owner suspended it for an approval in between, and let it go).
    // The server lets it go too: another process (the CLI's `resume`) can take it.
    use agentloop::journal::{Definition, Journal, JournalHeader};
    use agentloop::machine::Seams;
    use agentloop::permissions::ApprovalRequest;
    use agentloop_a2a::{A2aServer, ServedAgent};
    use agentloop_store::SqliteJournal;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let id = "0193a7c0-0000-7000-8000-0000000000c3";
    let header = JournalHeader {
        run_id: id.into(),
        agent: "forecaster".into(),
        definition: Definition::new(),
        fingerprint: Definition::new().fingerprint(),
        seams: Seams::default(),
        limits: None,
        transcript: Vec::new(),
        input: Some(agentloop::Message::user("go")),
        origin: None,
        parent: None,
        session: None,
        served_by: Some("a2a".into()),
    };
    // The process that ran it, still alive.
    let previous = Arc::new(SqliteJournal::open(&path).unwrap());
    previous.begin(&header).await.unwrap();
    let served = Arc::new(SqliteJournal::open(&path).unwrap());
    let claim = {
        let (previous, served) = (Arc::clone(&previous), Arc::clone(&served));
        Arc::new(move |run_id: &str| {
            // Between the server's first read and its claim, the owner suspends the run.
            let asked = ApprovalRequest {
                call_id: "c1".into(),
                tool: "write".into(),
                arguments: json!({}),
                agent: String::new(),
                question: None,
            };
            futures::executor::block_on(previous.suspend(run_id, &[asked]))
                .map_err(|e| e.to_string())?;
            served.own(run_id).map_err(|e| e.to_string())
        })
    };
    let release = {
        let served = Arc::clone(&served);
        Arc::new(move |run_id: &str| served.release(run_id))
    };
    let journal = Arc::clone(&served);
    let server = A2aServer::new(vec![ServedAgent {
        name: "forecaster".into(),
        description: "Forecasts.".into(),
        version: "1".into(),
        build: Arc::new(|_approver| Err("no run goes on in this test".into())),
        options: Arc::new(move || agentloop::RunOptions {
            journal: Some(Arc::clone(&journal) as Arc<dyn Journal>),
            ..agentloop::RunOptions::default()
        }),
        claim: Some(claim),
        release: Some(release),
    }]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/forecaster", listener.local_addr().unwrap());
    let serving = tokio::spawn(async move {
        agentloop_a2a::serve(&server, listener, std::future::pending()).await
    });

    let (_, answer) = tokio::task::spawn_blocking(move || {
        rpc_call(
            &url,
            json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
        )
    })
    .await
    .unwrap();
    // A run suspended for its own approver is no task of the server's.
    assert!(answer["result"].is_null(), "{answer}");
    let other = SqliteJournal::open(&path).unwrap();
    other
        .own(id)
        .expect("the run the server did not go on with is free for another process");
    serving.abort();
}

/// A caller that waits on its task (`SendMessage` without `returnImmediately`, or
/// `SendStreamingMessage` when `streaming`), while the task's run is in its slow tool, when the
/// server is stopped (SIGTERM): the answer's status and body, as the caller read them.
fn answer_to_a_stop(journaled: bool, streaming: bool) -> (u16, String, AgentDir) {
    let dir = forecaster("");
    slow_script(&dir);
    // Longer than the stop's 10 s grace for requests in progress.
    dir.write(
        "slow.py",
        "import time\nopen('started', 'w').close()\ntime.sleep(30)\n",
    );
    let (agent, journal) = (dir.agent(), dir.path("journal.db"));
    let (agent, journal) = (agent.to_str().unwrap(), journal.to_str().unwrap());
    let server = if journaled {
        HttpServer::start("a2a", &[agent, "--journal", journal])
    } else {
        HttpServer::start("a2a", &[agent])
    };
    let url = server.url.clone();
    let method = if streaming {
        "SendStreamingMessage"
    } else {
        "SendMessage"
    };
    let request = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {
        "message": {"role": "ROLE_USER", "messageId": uuid_like(),
                    "parts": [{"text": "Take your time."}]}}});
    let waiting = std::thread::spawn(move || {
        let host = url.trim_start_matches("http://").split('/').next().unwrap();
        http_request(&url, "POST", host, &A2A_JSON, &request.to_string())
    });
    server.terminate_once_exists(&dir.path("started"));
    let (status, body) = waiting.join().unwrap();
    (status, body, dir)
}

/// Asserts `answer` is the error of a stop that names the task, and returns its id.
fn stopped_error(answer: &Value, journaled: bool) -> String {
    assert_eq!(answer["id"], 7, "{answer}");
    let error = &answer["error"];
    assert_eq!(error["code"], -32603, "{answer}");
    assert_eq!(error["data"]["code"], "a2a.stopped", "{answer}");
    let text = error["message"].as_str().unwrap();
    assert!(text.contains("the server stopped while task "), "{text}");
    assert_eq!(
        text.contains("goes on when the server starts again"),
        journaled,
        "{text}"
    );
    text.split("task ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_owned()
}

#[test]
fn a_stream_at_a_stop_ends_with_the_error_that_says_so() {
    for journaled in [true, false] {
        let (status, body, _dir) = answer_to_a_stop(journaled, true);
        assert_eq!(status, 200, "{body}");
        let events: Vec<Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect();
        let last = events
            .last()
            .unwrap_or_else(|| panic!("no event: {body:?}"));
        let id = stopped_error(last, journaled);
        assert_eq!(events[0]["result"]["task"]["id"], id.as_str(), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_waiting_on_its_task_at_a_stop_is_answered_with_an_error_naming_it() {
    for journaled in [true, false] {
        let (status, body, dir) = answer_to_a_stop(journaled, false);
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        let id = stopped_error(&answer, journaled);
        if journaled {
            // As it says: the server started again finds the task, which goes on to its end.
            dir.write("slow.py", "print('quick')\n");
            let (agent, journal) = (dir.agent(), dir.path("journal.db"));
            let server = HttpServer::start(
                "a2a",
                &[
                    agent.to_str().unwrap(),
                    "--journal",
                    journal.to_str().unwrap(),
                ],
            );
            assert_eq!(
                settled_state(&server.url, &id).await,
                "TASK_STATE_COMPLETED"
            );
        }
    }
}
