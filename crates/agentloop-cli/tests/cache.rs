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

#[tokio::test]
async fn an_identical_run_is_answered_from_the_cache() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_s_text.sse"),
            ok("openai_chat/oai_chat_s_text.sse"),
        ],
    )
    .await;
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
