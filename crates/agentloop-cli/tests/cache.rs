#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `[model] cache = true`: the second identical run is answered from the response cache (the
//! provider sees one request), priced at zero, and its trace marks the model call cached.

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
