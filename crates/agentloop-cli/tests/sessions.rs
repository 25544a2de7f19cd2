#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Stored sessions through the command: a conversation continued in a second process (the
//! provider reads the first turn again), two writers on one session, fork, and a damaged
//! transcript that is reported and never sent.

mod support;

use std::process::{Command, Stdio};

use serde_json::Value;
use support::*;

fn run_in(dir: &AgentDir, session: &str, input: &str) -> std::process::Output {
    run_in_with(dir, session, input, &[])
}

fn run_in_with(dir: &AgentDir, session: &str, input: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args([
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            input,
            "--json",
        ])
        .args(["--session", session])
        .args(extra)
        .current_dir(dir.path("."))
        .env("AGENTLOOP_TEST_KEY", TEST_KEY)
        .env_remove("AGENTLOOP_SESSIONS")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn sessions(dir: &AgentDir, rest: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("sessions")
        .args(rest)
        .current_dir(dir.path("."))
        .env_remove("AGENTLOOP_SESSIONS")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn user_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test]
async fn a_conversation_goes_on_in_a_second_process_and_forks() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_text.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let first = run_in(&dir, "trip", "Plan a trip to Lisbon.");
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = run_in(&dir, "trip", "And the weather there?");
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let bodies = fake.bodies().await;
    assert_eq!(bodies.len(), 2);
    let users = user_texts(&bodies[1]);
    assert_eq!(
        users.len(),
        2,
        "the second process sends the first turn again: {users:?}"
    );
    assert!(users[0].contains("Plan a trip to Lisbon."));
    assert!(
        bodies[1]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "assistant")
    );

    let listed: Value =
        serde_json::from_slice(&sessions(&dir, &["list", "--json"]).stdout).unwrap();
    assert_eq!(listed[0]["id"], "trip");
    assert_eq!(listed[0]["runs"], 2);
    assert_eq!(listed[0]["messages"], 4);

    // A fork goes its own way; the original keeps its four messages.
    assert_eq!(
        sessions(&dir, &["fork", "trip", "trip2"]).status.code(),
        Some(0)
    );
    let third = run_in(&dir, "trip2", "Only for the fork.");
    assert_eq!(third.status.code(), Some(0));
    let show = |name: &str| -> Value {
        serde_json::from_slice(&sessions(&dir, &["show", name, "--json"]).stdout).unwrap()
    };
    assert_eq!(show("trip")["messages"].as_array().unwrap().len(), 4);
    assert_eq!(show("trip2")["messages"].as_array().unwrap().len(), 6);
    assert_eq!(show("trip2")["metadata"]["forked_from"], "trip");
    assert_eq!(
        sessions(&dir, &["fork", "trip", "trip2"]).status.code(),
        Some(10),
        "the new name is taken"
    );
    assert_eq!(sessions(&dir, &["delete", "trip2"]).status.code(), Some(0));
    assert_eq!(sessions(&dir, &["show", "trip2"]).status.code(), Some(10));
}

/// `--dry-run` runs nothing with side effects, so it adds no turn to a stored conversation: a
/// live one shows the session's transcript in the request it would send, a scripted one runs its
/// script on it, and the session is as the last real run left it.
#[tokio::test]
async fn a_dry_run_goes_on_from_the_session_and_stores_no_turn() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    assert_eq!(
        run_in(&dir, "trip", "Plan a trip to Lisbon.").status.code(),
        Some(0)
    );
    let live = run_in_with(&dir, "trip", "And the weather there?", &["--dry-run"]);
    assert_eq!(live.status.code(), Some(0), "{}", stderr(&live));
    let shown = stdout_json(&live);
    let users = user_texts(&shown["request"]["body"]);
    assert_eq!(
        users.len(),
        2,
        "the request goes on from the session: {users:?}"
    );
    assert!(users[0].contains("Plan a trip to Lisbon."), "{users:?}");
    assert_eq!(fake.bodies().await.len(), 1, "a dry run sent a request");

    let scripted = scripted_weather(
        "s",
        r#"[{"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}]}, {"text": "done"}]"#,
    );
    assert_eq!(run_in(&scripted, "trip", "first").status.code(), Some(0));
    let dry = run_in_with(&scripted, "trip", "second", &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let v = stdout_json(&dry);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["tool_calls"][0]["status"], "skipped", "{v}");
    let said = v["transcript"].to_string();
    assert!(said.contains("first") && said.contains("second"), "{said}");

    for (dir, name) in [(&dir, "trip"), (&scripted, "trip")] {
        let listed: Value =
            serde_json::from_slice(&sessions(dir, &["list", "--json"]).stdout).unwrap();
        assert_eq!(listed[0]["id"], name);
        assert_eq!(listed[0]["runs"], 1, "a dry run stored its turn: {listed}");
    }
    assert_eq!(
        scripted.tool_inputs().len(),
        1,
        "only the real run ran its tool"
    );
}

#[tokio::test]
async fn a_second_writer_is_refused_while_the_first_holds_the_session() {
    // The tool sleeps, so the first run holds the session while the second tries.
    let dir = AgentDir::new(
        r#"name = "slow"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "wait"
command = ["sh", "-c", "sleep 3; echo done"]
"#,
    );
    dir.write(
        "s.json",
        r#"[{"tool_calls": [{"id": "w", "name": "wait", "arguments": {}}]}, {"text": "ok"}]"#,
    );
    let mut first = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args([
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "go",
            "--quiet",
        ])
        .args(["--session", "shared"])
        .current_dir(dir.path("."))
        .env_remove("AGENTLOOP_SESSIONS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first run holds the session's lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let held = rusqlite::Connection::open(dir.path("sessions.db"))
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM session_locks WHERE id = 'shared'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .unwrap_or(0);
        if held == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first run never took the lock"
        );
    }
    let second = run_in(&dir, "shared", "me too");
    assert_eq!(
        second.status.code(),
        Some(10),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let error: Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(error["error"]["code"], "session.busy");
    assert!(first.wait().unwrap().success());
    // Once the first is done, the session takes the next writer.
    let after = run_in(&dir, "shared", "now");
    assert_eq!(
        after.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
}

#[tokio::test]
async fn a_damaged_transcript_is_reported_and_never_sent() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![ok("openai_chat/oai_chat_s_text.sse")],
    )
    .await;
    let dir = AgentDir::new(&openai_agent(&fake.uri(), ""));
    let db = dir.path("sessions.db");
    let store = agentloop_store::SqliteSessions::open(&db).unwrap();
    use agentloop::session::SessionStore;
    let mut s = agentloop::session::StoredSession::new("broken", "weather");
    s.messages = vec![
        agentloop::Message::user("hi"),
        serde_json::from_value(serde_json::json!({
            "role": "assistant", "text": "",
            "tool_calls": [{"call_id": "c1", "tool": "get_weather", "arguments": "{}"}]
        }))
        .unwrap(),
    ];
    store.save(&s).unwrap();
    drop(store);
    let out = run_in(&dir, "broken", "go on");
    assert_eq!(out.status.code(), Some(10));
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"]["code"], "session.damaged");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call c1 has no result")
    );
    assert!(fake.bodies().await.is_empty(), "nothing was sent");
}

/// A row whose transcript or usage is not JSON any more (a disk error, a hand edit) is listed
/// beside the others, marked with what is wrong, and can be deleted; `list` failed as a whole
/// ("malformed JSON"), and so hid the sessions that were sound, and the damaged one's name.
#[test]
fn sessions_list_shows_a_damaged_row_beside_the_sound_ones_and_it_can_be_deleted() {
    use agentloop::session::SessionStore;
    let dir = AgentDir::new("name = \"unused\"\n");
    let db = dir.path("sessions.db");
    let store = agentloop_store::SqliteSessions::open(&db).unwrap();
    for id in ["sound", "torn", "odd-usage"] {
        let mut s = agentloop::session::StoredSession::new(id, "weather");
        s.messages = vec![agentloop::Message::user("hi")];
        store.save(&s).unwrap();
    }
    drop(store);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE sessions SET messages = '[{\"role\": \"us' WHERE id = 'torn'",
        [],
    )
    .unwrap();
    conn.execute(
        "UPDATE sessions SET usage = 'not json' WHERE id = 'odd-usage'",
        [],
    )
    .unwrap();
    drop(conn);

    let out = sessions(&dir, &["list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_id = |id: &str| -> Value {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} is not listed: {listed:#}"))
    };
    assert!(by_id("sound").get("damage").is_none(), "{listed:#}");
    assert_eq!(by_id("sound")["messages"], 1);
    let torn = by_id("torn")["damage"].as_str().unwrap().to_owned();
    assert!(torn.contains("transcript"), "{torn}");
    let odd = by_id("odd-usage")["damage"].as_str().unwrap().to_owned();
    assert!(odd.contains("usage"), "{odd}");
    assert_eq!(by_id("odd-usage")["messages"], 1);

    let out = sessions(&dir, &["list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("sound  weather  1 messages"), "{text}");
    assert!(
        text.contains("torn  weather") && text.contains("damaged: "),
        "{text}"
    );

    // Loading it is still refused, as damaged; deleting it leaves the sound one.
    let out = sessions(&dir, &["show", "torn"]);
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("session torn is damaged"),
        "{}",
        stderr(&out)
    );
    for id in ["torn", "odd-usage"] {
        let out = sessions(&dir, &["delete", id]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = sessions(&dir, &["list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!(listed[0]["id"], "sound");

    // A store a newer agentloop wrote is refused whole, by every command, and left as it was.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE agentloop_meta SET value = '99' WHERE key = 'version'",
        [],
    )
    .unwrap();
    drop(conn);
    let before = std::fs::read(&db).unwrap();
    for command in [vec!["list"], vec!["show", "sound"], vec!["delete", "sound"]] {
        let out = sessions(&dir, &command);
        assert_eq!(out.status.code(), Some(10), "{command:?}");
        assert!(
            stderr(&out).contains("its format version 99 is newer than this program's"),
            "{command:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[tokio::test]
async fn a_call_id_the_provider_repeats_in_a_later_run_never_damages_the_session() {
    // The scripted provider starts its script over in every process: each run of the session
    // calls with the id `c0` again.
    let dir = AgentDir::new(
        r#"name = "again"
[model]
provider = "scripted"
script = "s.json"
[[tools]]
name = "weather"
command = ["python3", "tool.py"]
"#,
    );
    dir.write(
        "s.json",
        r#"[{"tool_calls": [{"id": "c0", "name": "weather", "arguments": {}}]}, {"text": "ok"}]"#,
    );
    let mut ids = Vec::new();
    for input in ["one", "two", "three"] {
        let out = run_in(&dir, "repeat", input);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{input}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        ids.push(v["tool_calls"][0]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids, ["c0", "c0_2", "c0_3"]);
    let shown = sessions(&dir, &["show", "repeat"]);
    assert_eq!(
        shown.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
}

#[test]
fn a_sessions_command_on_a_missing_or_empty_store_says_so_and_makes_nothing() {
    // A mistyped `--sessions` path (or the default `sessions.db` where there is none) is an
    // error: an empty file given is left empty, not made a store, and nothing else appears.
    let dir = AgentDir::new("name = \"unused\"\n");
    let files = || dir.file_names();
    dir.write("empty.db", "");
    let before = files();
    for store in ["typo.db", "empty.db"] {
        for command in [
            vec!["list"],
            vec!["list", "--json"],
            vec!["show", "s1"],
            vec!["delete", "s1"],
            vec!["fork", "s1", "s2"],
        ] {
            let mut args = command.clone();
            args.extend(["--sessions", store]);
            let out = sessions(&dir, &args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(10), "{args:?}: {err}");
            let said = if store == "typo.db" {
                "no session store at typo.db"
            } else {
                "empty.db is not an agentloop session store: it is empty"
            };
            assert!(err.contains(said), "{args:?}: {err}");
            assert_eq!(files(), before, "{args:?} left the folder changed");
            assert_eq!(std::fs::metadata(dir.path("empty.db")).unwrap().len(), 0);
        }
    }
    // The default store, where there is none.
    let out = sessions(&dir, &["list"]);
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("no session store at sessions.db"));
    assert_eq!(files(), before);
}

/// A run whose session cannot be written after it (a full disk, a store another program holds)
/// still happened: its outcome is shown, with an error naming the failed save, and the exit code
/// is the session's.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_session_cannot_be_saved_still_shows_its_outcome() {
    let script = serde_json::json!([
        {"tool_calls": [{"id": "w", "name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"text": "18 degrees in Paris."}
    ]);
    let dir = scripted_weather("keeper", &script.to_string());
    let first = run_in(&dir, "other", "Weather?");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    // From now on every write of a session fails, as on a full disk.
    let store = rusqlite::Connection::open(dir.path("sessions.db")).unwrap();
    store
        .execute_batch(
            "CREATE TRIGGER full BEFORE INSERT ON sessions \
             BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
        )
        .unwrap();
    drop(store);

    let out = run_in(&dir, "trip", "Weather in Paris?");
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["output"], "18 degrees in Paris.");
    assert_eq!(v["turns"], 2);
    assert_eq!(v["model_calls"], 2);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["ok"], true, "{v}");
    assert_eq!(dir.tool_inputs().len(), 2, "the tool ran in both runs");
    assert_eq!(v["error"]["code"], "session.io");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("could not be saved"), "{message}");
    assert!(message.contains("database or disk is full"), "{message}");

    // Without --json: the answer on stdout, the failed save on stderr.
    let text = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["run", dir.agent().to_str().unwrap(), "--input", "Again?"])
        .args(["--session", "trip"])
        .current_dir(dir.path("."))
        .env_remove("AGENTLOOP_SESSIONS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(text.status.code(), Some(10), "{}", stderr(&text));
    assert_eq!(stdout(&text).trim(), "18 degrees in Paris.");
    let said = stderr(&text);
    assert!(said.contains("■ finished"), "{said}");
    assert!(said.contains("database or disk is full"), "{said}");
}
