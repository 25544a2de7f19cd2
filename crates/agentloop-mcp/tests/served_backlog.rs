//! A served agent's progress notifications to a client that does not read: the run waits for it
//! (its tool calls stop well before the run's end) instead of queueing every notification in
//! memory, and once the client reads it gets every one, in order, and the call's result.
//! The server speaks MCP's stdio framing over an in-memory pipe as small as a pipe's buffer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop::RunOptions;
use agentloop_mcp::serve::{AgentServer, Offer, ServedAgent};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

mod chatty;
use chatty::chatty;

/// The turns of the run, each one tool call: far more notifications than the backlog holds.
const TURNS: usize = 2000;

async fn send(to: &mut (impl AsyncWriteExt + Unpin), message: Value) {
    let mut line = message.to_string();
    line.push('\n');
    to.write_all(line.as_bytes()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest5_a_client_that_does_not_read_holds_the_run_and_loses_no_notification() {
    let done = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&done);
    let mut offer = Offer::new();
    offer
        .agent(ServedAgent {
            name: "worker".into(),
            description: "Counts a lot.".into(),
            output_schema: None,
            build: Arc::new(move |_prompter| chatty(TURNS, Arc::clone(&counted))),
            options: Arc::new(RunOptions::default),
        })
        .unwrap();
    // A pipe's buffer each way, as stdio has.
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (server_read, server_write) = tokio::io::split(server);
    tokio::spawn(async move {
        let running = rmcp::serve_server(AgentServer::new(offer), (server_read, server_write))
            .await
            .unwrap();
        let _ = running.waiting().await;
    });
    let (client_read, mut client_write) = tokio::io::split(client);
    let mut lines = BufReader::new(client_read).lines();
    send(
        &mut client_write,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "slow", "version": "0"}}}),
    )
    .await;
    let answer: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(answer["id"], 0, "{answer}");
    send(
        &mut client_write,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    send(
        &mut client_write,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "worker", "arguments": {"task": "count"},
            "_meta": {"progressToken": 7}}}),
    )
    .await;

    // The client reads nothing: the run goes on until the backlog is full, then waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = done.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(done.load(Ordering::SeqCst), held, "the run went on");
    assert!(
        held < TURNS / 2,
        "{held} of {TURNS} calls ran while nobody read their notifications"
    );

    // It reads: every notification, numbered without a gap, then the result.
    let mut seen = 0u64;
    let result = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the server went quiet")
            .unwrap()
            .expect("the server closed the pipe");
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["method"] == "notifications/progress" {
            seen += 1;
            assert_eq!(message["params"]["progress"].as_f64(), Some(seen as f64));
            continue;
        }
        break message;
    };
    assert_eq!(result["id"], 1, "{result}");
    assert_eq!(result["result"]["isError"], false, "{result}");
    assert_eq!(done.load(Ordering::SeqCst), TURNS);
    // A turn's start, its call's start and end, for every call.
    assert!(seen > 3 * TURNS as u64, "{seen} notifications");
}
