#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `[model] cache = true`: the second identical run is answered from the response cache (the
//! provider sees one request), priced at zero, and its trace marks the model call cached; a
//! journaled run killed before its journal kept an answer counts that answer's spend when it
//! resumes and the cache gives it back.

mod support;

use support::*;

/// A fake Chat Completions server with `n` text answers.
async fn answering(n: usize) -> FakeProvider {
    let turns = (0..n)
        .map(|_| ok("openai_chat/oai_chat_s_text.sse"))
        .collect();
    FakeProvider::start("/v1/chat/completions", turns).await
}

#[tokio::test]
async fn an_identical_run_is_answered_from_the_cache() {
    let fake = answering(2).await;
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "cache = true\ncache_ttl_secs = 600\nprice = { input = 1.0, output = 2.0 }",
    ));
    let trace = dir.path("t.ndjson");
    let run = || {
        agentloop(args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "Say hello.",
            "--json",
            "--trace",
            trace.to_str().unwrap(),
        ]))
    };
    let first = run().await;
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let second = run().await;
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(fake.bodies().await.len(), 1, "the provider was asked once");
    let (a, b) = (stdout_json(&first), stdout_json(&second));
    assert_eq!(a["output"], b["output"]);
    assert!(a["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(b["cost_usd"], 0.0);
    assert_eq!(
        b["usage"]["cached_input_tokens"],
        b["usage"]["input_tokens"]
    );
    assert!(dir.path("responses.db").exists());
    let shown = std::fs::read_to_string(&trace).unwrap();
    let cached: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("\"cached\":true"))
        .collect();
    assert_eq!(
        cached.len(),
        1,
        "the second run's model call is marked: {shown}"
    );
}

/// Runs `agent` with `--json` and the response cache at `cache`.
async fn run_cached(agent: &std::path::Path, cache: &std::path::Path) -> std::process::Output {
    let cache: &'static str = Box::leak(cache.to_str().unwrap().to_owned().into_boxed_str());
    agentloop_env(
        args(&[
            "run",
            agent.to_str().unwrap(),
            "--input",
            "Say hello.",
            "--json",
        ]),
        vec![
            ("AGENTLOOP_TEST_KEY", TEST_KEY),
            ("AGENTLOOP_RESPONSE_CACHE", cache),
        ],
    )
    .await
}

#[tokio::test]
async fn a_cache_shared_by_two_servers_never_answers_for_the_other() {
    let (a, b) = (answering(1).await, answering(1).await);
    let shared = tempfile::tempdir().unwrap();
    let cache = shared.path().join("responses.db");
    // One model name, two servers.
    let dir_a = AgentDir::new(&openai_agent(&a.uri(), "cache = true"));
    let dir_b = AgentDir::new(&openai_agent(&b.uri(), "cache = true"));
    for dir in [&dir_a, &dir_b] {
        let out = run_cached(&dir.agent(), &cache).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(a.bodies().await.len(), 1);
    assert_eq!(b.bodies().await.len(), 1, "the second server was asked");

    // Once more at the first server: its own answer, from the cache.
    let out = run_cached(&dir_a.agent(), &cache).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(a.bodies().await.len(), 1, "answered from the cache");
}

#[tokio::test]
async fn an_option_that_changes_the_request_on_the_wire_changes_the_cache_key() {
    let fake = answering(2).await;
    let shared = tempfile::tempdir().unwrap();
    let cache = shared.path().join("responses.db");
    let plain = AgentDir::new(&openai_agent(&fake.uri(), "cache = true"));
    // The tools go in the prompt instead of the request's `tools`.
    let hermes = AgentDir::new(&openai_agent(
        &fake.uri(),
        "cache = true\ntool_dialect = \"hermes\"",
    ));
    for dir in [&plain, &hermes] {
        let out = run_cached(&dir.agent(), &cache).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(fake.bodies().await.len(), 2, "each encoding was sent");
}

/// `run --journal runs.db --json` of the weather agent at `uri`, its cache in its folder.
fn journaled_cached_run(dir: &AgentDir) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(["run", "agent.toml", "--input", "Weather?", "--json"])
        .args(["--journal", "runs.db"])
        .current_dir(dir.path("."))
        .env("AGENTLOOP_TEST_KEY", TEST_KEY)
        .env("AGENTLOOP_RESPONSE_CACHE", dir.path("responses.db"))
        .stdin(std::process::Stdio::null());
    cmd
}

fn priced_cached_weather(uri: &str) -> AgentDir {
    let dir = AgentDir::new(&openai_agent(
        uri,
        "cache = true\nprice = { input = 1.0, output = 2.0 }",
    ));
    dir.write("tool.py", LOGGING_TOOL);
    dir
}

#[tokio::test]
async fn a_run_killed_before_its_journal_kept_a_paid_answer_counts_it_when_the_cache_gives_it_back()
{
    use support::crash::{journal_runs, json_of, killed_at_fault};
    let fake = one_call_then_text().await;
    let base_dir = priced_cached_weather(&fake.uri());
    let base = json_of(&journaled_cached_run(&base_dir).output().unwrap());
    assert_eq!(base["stop_reason"], "finished", "{base}");
    assert!(base["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(base["usage"]["cached_input_tokens"], 0);

    // Step 0 is the tool call's answer, committed with the call's start; step 3 the last
    // answer, committed with the run's end. Killed inside either commit, the run has paid for
    // an answer its journal does not hold, and the cache holds it.
    for fault in ["in-step:0", "in-step:3"] {
        let fake = one_call_then_text().await;
        let dir = priced_cached_weather(&fake.uri());
        let mut cmd = journaled_cached_run(&dir);
        cmd.env("AGENTLOOP_TEST_JOURNAL_FAULT", fault);
        assert!(killed_at_fault(cmd), "{fault}: reached");
        let runs = journal_runs(&dir, &dir.path("runs.db"));
        assert_eq!(runs[0]["status"], "running", "{fault}");
        let id = runs[0]["run_id"].as_str().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["resume", id, "--journal", "runs.db", "--json"])
            .current_dir(dir.path("."))
            .env("AGENTLOOP_TEST_KEY", TEST_KEY)
            .env("AGENTLOOP_RESPONSE_CACHE", dir.path("responses.db"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let resumed = json_of(&out);
        assert_eq!(resumed["stop_reason"], "finished", "{fault}: {resumed}");
        assert_eq!(
            fake.bodies().await.len(),
            2,
            "{fault}: the answer the killed run paid for came from the cache"
        );
        // What was paid is counted once, as in the run that was never killed.
        assert_eq!(resumed["usage"], base["usage"], "{fault}");
        assert_eq!(resumed["cost_usd"], base["cost_usd"], "{fault}");

        // Another run's identical request is still answered free.
        let again = json_of(&journaled_cached_run(&dir).output().unwrap());
        assert_eq!(again["stop_reason"], "finished", "{fault}: {again}");
        assert_eq!(
            fake.bodies().await.len(),
            2,
            "{fault}: answered from the cache"
        );
        assert_eq!(again["cost_usd"], 0.0, "{fault}");
    }
}
