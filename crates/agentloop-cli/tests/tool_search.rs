#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Deferred tools (`defer = true`) found with the built-in `search_tools`, end to end through the
//! CLI with the project's 200-tool MCP server (`scripts/mcp/many_tools_server.py`): a scripted
//! agent finds and calls the one tool it needs, a call made before the search is an unknown
//! tool's, a journaled run resumed after a suspension still has what it found, and the requests
//! an OpenAI agent sends carry only the search tool until the search, then the found tools after
//! it, the prefix unchanged.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use serde_json::{Value, json};
use support::*;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer};

fn many_tools_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/many_tools_server.py")
}

/// An agent of `model` (a `[model]` table's keys) with the 200-tool server, its tools deferred,
/// and a deferred command tool of its own; `extra` goes at the end.
fn agent(model: &str, extra: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "backoffice"
[model]
{model}

[[tools]]
name = "roll_dice"
description = "Rolls a six-sided die."
command = ["python3", "-c", "print(4)"]
defer = true

[[mcp]]
name = "biz"
command = ["python3", "{}"]
defer = true
{extra}"#,
        many_tools_server().display()
    ))
}

/// A loopback server answering POSTs to `route` with these JSON bodies in order (a 500 past
/// the last).
async fn serve_in_order(route: &str, bodies: Vec<Value>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(Replies {
            bodies,
            next: Arc::new(AtomicUsize::new(0)),
        })
        .mount(&server)
        .await;
    server
}

/// `agentloop run` of the agent in `dir` on `input`, with `--json` and the test key.
async fn run_json(dir: &AgentDir, input: &str) -> std::process::Output {
    agentloop_env(
        args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            input,
            "--json",
        ]),
        vec![("AGENTLOOP_TEST_KEY", TEST_KEY)],
    )
    .await
}

fn scripted(script: Value, extra: &str) -> AgentDir {
    let dir = agent("provider = \"scripted\"\nscript = \"script.json\"", extra);
    dir.write("script.json", &script.to_string());
    dir
}

fn search(id: &str, query: &str) -> Value {
    json!({"id": id, "name": "search_tools", "arguments": {"query": query}})
}

fn convert(id: &str) -> Value {
    json!({"id": id, "name": "biz__convert_currency", "arguments": {"amount": 100, "from": "EUR", "to": "USD"}})
}

fn call<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no call {id} in {run}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_agent_finds_and_calls_the_one_tool_it_needs_among_200() {
    let dir = scripted(
        json!([
            {"tool_calls": [convert("early")]},
            {"tool_calls": [search("s", "convert money between currencies")]},
            {"tool_calls": [convert("c")]},
            {"text": "100 EUR is 108 USD."}
        ]),
        "",
    );
    let trace = dir.path("t.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "How much is 100 EUR in USD?",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let run = stdout_json(&out);
    assert_eq!(run["stop_reason"], "finished", "{run}");

    // Before the search the tool is not the run's: the call is rejected as an unknown tool's.
    let early = call(&run, "early");
    assert_eq!(early["ok"], false, "{early}");
    assert_eq!(early["error"]["code"], "unknown_tool", "{early}");
    let message = early["error"]["message"].as_str().unwrap();
    assert!(message.contains("search_tools"), "{message}");
    assert!(!message.contains("list_invoices"), "{message}");

    let found = &call(&run, "s")["output"]["found"];
    assert_eq!(found[0]["name"], "biz__convert_currency", "{found}");
    assert!(found.as_array().unwrap().len() <= 5, "{found}");

    let c = call(&run, "c");
    assert_eq!(c["ok"], true, "{c}");
    assert!(
        c["output"].to_string().contains("100.00 EUR = 108.00 USD"),
        "{c}"
    );
    // The run's tools changed at the turn after the search, by what it found, in its order.
    let records: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut changed: Vec<(u64, Value)> = records
        .iter()
        .filter(|r| r["kind"] == "turn" && !r["tools_changed"].is_null())
        .map(|r| {
            (
                r["turn"].as_u64().unwrap(),
                r["tools_changed"]["added"].clone(),
            )
        })
        .collect();
    // A turn's record may be written more than once as it goes on.
    changed.dedup();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].0, 3, "{changed:?}");
    let found_names: Vec<&Value> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["name"])
        .collect();
    let added: Vec<&Value> = changed[0].1.as_array().unwrap().iter().collect();
    assert_eq!(added, found_names);
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_marks_what_is_deferred_and_its_first_request_holds_search_tools_alone() {
    let dir = scripted(json!([{"text": "hi"}]), "");
    let agent = dir.agent();
    let out = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let plan = stdout_json(&out);
    let names: Vec<&str> = plan["first_request"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["search_tools"], "{plan}");
    assert_eq!(plan["tools"][0]["deferred"], true, "{plan}");
    assert_eq!(plan["mcp"][0]["deferred"], true, "{plan}");

    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.matches("deferred: out of the request").count(),
        2,
        "the tool and the server are shown deferred: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_still_has_the_tools_it_found_before_it_was_suspended() {
    let dir = scripted(
        json!([
            {"tool_calls": [search("s", "convert currency")]},
            {"tool_calls": [convert("c")]},
            {"text": "done"}
        ]),
        "[permissions]\nask = [\"biz__convert_currency\"]\n",
    );
    let journal = dir.path("runs.db");
    let j = journal.to_str().unwrap();
    let agent = dir.agent();
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--input",
        "convert",
        "--journal",
        j,
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(8), "stderr: {}", stderr(&out));
    let suspended = stdout_json(&out);
    let id = suspended["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        suspended["pending_approvals"][0]["tool"],
        "biz__convert_currency"
    );

    let approved = agentloop(args(&[
        "approve",
        &id,
        "--call",
        "c",
        "--allow",
        "--journal",
        j,
    ]))
    .await;
    assert_eq!(
        approved.status.code(),
        Some(0),
        "stderr: {}",
        stderr(&approved)
    );
    let out = agentloop(args(&["resume", &id, "--journal", j, "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let resumed = stdout_json(&out);
    assert_eq!(resumed["stop_reason"], "finished", "{resumed}");
    let c = call(&resumed, "c");
    assert_eq!(
        c["ok"], true,
        "the resumed process knows the found tool: {c}"
    );
    assert!(c["output"].to_string().contains("108.00 USD"), "{c}");
}

fn calling(id: &str, name: &str, arguments: Value) -> Value {
    completion(
        json!({"role": "assistant", "content": null, "tool_calls": [chat_call(id, name, arguments)]}),
    )
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_request_carries_the_found_tools_from_the_turn_after_the_search_after_the_others()
{
    let server = serve_in_order(
        "/v1/chat/completions",
        vec![
            calling(
                "s1",
                "search_tools",
                json!({"query": "convert currency", "limit": 2}),
            ),
            calling(
                "s2",
                "search_tools",
                json!({"query": "roll a die", "limit": 1}),
            ),
            calling(
                "c",
                "biz__convert_currency",
                json!({"amount": 10, "from": "EUR", "to": "GBP"}),
            ),
            completion(json!({"role": "assistant", "content": "8.50 GBP"})),
        ],
    )
    .await;
    let dir = agent(
        &format!(
            "provider = \"openai\"\nname = \"gpt-4o\"\nbase_url = \"{}/v1\"\napi_key_env = \"AGENTLOOP_TEST_KEY\"\nstream = false",
            server.uri()
        ),
        "",
    );
    let out = run_json(&dir, "10 EUR in GBP?").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let bodies: Vec<Value> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(bodies.len(), 4);
    let names: Vec<Vec<String>> = bodies.iter().map(tool_names).collect();
    assert_eq!(
        names[0],
        ["search_tools"],
        "nothing deferred is sent before a search"
    );
    assert_eq!(names[1].len(), 3, "{:?}", names[1]);
    assert_eq!(names[1][..2], ["search_tools", "biz__convert_currency"]);
    assert_eq!(
        names[2][..3],
        names[1][..],
        "a later find is appended: the earlier request is a prefix"
    );
    assert_eq!(names[2][3], "roll_dice");
    assert_eq!(names[3], names[2]);
    // The found tools' schemas are sent whole, as any other tool's.
    let convert = bodies[2]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "biz__convert_currency")
        .unwrap();
    assert_eq!(
        convert["function"]["parameters"]["required"],
        json!(["amount", "from", "to"])
    );
    let run = stdout_json(&out);
    assert!(
        call(&run, "c")["output"].to_string().contains("8.50 GBP"),
        "{run}"
    );
}

/// An Anthropic answer (a whole message) with these content blocks.
fn anthropic_message(content: Value, stop: &str) -> Value {
    json!({
        "id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop,
        "usage": {"input_tokens": 100, "output_tokens": 10}
    })
}

fn anthropic_agent(server: &MockServer, tool_search: &str) -> AgentDir {
    agent(
        &format!(
            "provider = \"anthropic\"\nname = \"claude-test\"\nbase_url = \"{}\"\napi_key_env = \"AGENTLOOP_TEST_KEY\"\nstream = false\n{tool_search}",
            server.uri()
        ),
        "",
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_agent_finds_the_tool_with_the_server_search_and_calls_it() {
    let search_use = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_bm25", "input": {"query": "convert money between currencies"}});
    let search_result = json!({"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {"type": "tool_search_tool_search_result", "tool_references": [{"type": "tool_reference", "tool_name": "biz__convert_currency"}]}});
    let server = serve_in_order("/v1/messages", vec![
                anthropic_message(
                    json!([
                        search_use.clone(),
                        search_result.clone(),
                        {"type": "tool_use", "id": "c", "name": "biz__convert_currency", "input": {"amount": 100, "from": "EUR", "to": "USD"}}
                    ]),
                    "tool_use",
                ),
                anthropic_message(json!([{"type": "text", "text": "108 USD."}]), "end_turn"),
            ]).await;
    // `auto`, the default, is the server's search on Anthropic.
    let dir = anthropic_agent(&server, "");
    let out = run_json(&dir, "How much is 100 EUR in USD?").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let run = stdout_json(&out);
    let c = call(&run, "c");
    assert_eq!(c["ok"], true, "{c}");
    assert!(
        c["output"].to_string().contains("100.00 EUR = 108.00 USD"),
        "{c}"
    );

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(
            r.headers.get("anthropic-beta").unwrap(),
            "advanced-tool-use-2025-11-20"
        );
    }
    let bodies: Vec<Value> = requests
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let tools = bodies[0]["tools"].as_array().unwrap();
    // The server's search first (nothing else is shown), then the 201 deferred tools.
    assert_eq!(tools.len(), 202, "{}", bodies[0]["tools"]);
    assert_eq!(
        tools[0],
        json!({"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25", "cache_control": {"type": "ephemeral"}})
    );
    assert!(tools[1..].iter().all(|t| t["defer_loading"] == true));
    let names: Vec<&str> = tools[1..]
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "roll_dice");
    assert!(names.contains(&"biz__convert_currency"));
    assert!(
        !names.contains(&"search_tools"),
        "no local search beside it"
    );
    assert_eq!(
        bodies[1]["tools"], bodies[0]["tools"],
        "the same tools every turn"
    );
    assert_eq!(
        bodies[1]["messages"][1]["content"].as_array().unwrap()[..2],
        [search_use, search_result],
        "the search goes back with the call: {}",
        bodies[1]["messages"][1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_turn_the_server_paused_in_its_search_is_continued_not_taken_as_the_answer() {
    let opening = json!({"type": "text", "text": "Let me find a converter. "});
    let search_use = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_bm25", "input": {"query": "convert money between currencies"}});
    let search_result = json!({"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {"type": "tool_search_tool_search_result", "tool_references": [{"type": "tool_reference", "tool_name": "biz__convert_currency"}]}});
    let call_it = json!({"type": "tool_use", "id": "c", "name": "biz__convert_currency", "input": {"amount": 100, "from": "EUR", "to": "USD"}});
    let server = serve_in_order(
        "/v1/messages",
        vec![
            // The server's own loop paused after its search: no answer yet.
            anthropic_message(
                json!([opening.clone(), search_use.clone(), search_result.clone()]),
                "pause_turn",
            ),
            anthropic_message(json!([call_it.clone()]), "tool_use"),
            anthropic_message(json!([{"type": "text", "text": "108 USD."}]), "end_turn"),
        ],
    )
    .await;
    let dir = anthropic_agent(&server, "");
    let out = run_json(&dir, "How much is 100 EUR in USD?").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let run = stdout_json(&out);
    assert_eq!(run["output"], "108 USD.", "{run}");
    assert_eq!(
        call(&run, "c")["ok"],
        true,
        "the call the continued turn made ran"
    );
    assert_eq!(
        run["usage"]["input_tokens"], 300,
        "all three requests' tokens"
    );
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
    let bodies: Vec<Value> = requests
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(
        bodies[1]["messages"].as_array().unwrap().last().unwrap(),
        &json!({"role": "assistant", "content": [opening, search_use, search_result]}),
        "the paused turn goes back as it came, to be continued"
    );
    let turn = &bodies[2]["messages"].as_array().unwrap()[1];
    assert_eq!(turn["role"], "assistant");
    let kinds: Vec<&str> = turn["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "server_tool_use",
            "tool_search_tool_result",
            "text",
            "tool_use"
        ],
        "the whole turn, its search kept: {turn}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_turn_that_stays_paused_fails_the_run_with_model_paused() {
    let paused = anthropic_message(
        json!([{"type": "text", "text": "Still searching. "}]),
        "pause_turn",
    );
    // The first answer and the 8 continuations the bound allows.
    let server = serve_in_order("/v1/messages", vec![paused; 9]).await;
    let dir = anthropic_agent(&server, "");
    let out = run_json(&dir, "How much is 100 EUR in USD?").await;
    assert_eq!(out.status.code(), Some(4), "stdout: {}", stdout(&out));
    let run = stdout_json(&out);
    assert_eq!(run["error"]["code"], "model.paused", "{run}");
    assert!(
        run["output"].is_null(),
        "the opening words are no answer: {run}"
    );
    assert_eq!(server.received_requests().await.unwrap().len(), 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_search_local_keeps_search_tools_on_anthropic_and_native_is_refused_elsewhere() {
    let server = serve_in_order(
        "/v1/messages",
        vec![anthropic_message(
            json!([{"type": "text", "text": "hi"}]),
            "end_turn",
        )],
    )
    .await;
    let dir = anthropic_agent(&server, "tool_search = \"local\"");
    let out = run_json(&dir, "hi").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let requests = server.received_requests().await.unwrap();
    assert!(requests[0].headers.get("anthropic-beta").is_none());
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["tools"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["tools"][0]["name"], "search_tools");

    let dir = agent(
        "provider = \"openai\"\nname = \"gpt-4o\"\ntool_search = \"native\"",
        "",
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_ne!(out.status.code(), Some(0));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("the openai provider has no native tool search"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_of_an_anthropic_agent_shows_the_native_search_and_every_tool_marked() {
    let dir = agent(
        "provider = \"anthropic\"\nname = \"claude-test\"\napi_key_env = \"AGENTLOOP_TEST_KEY\"",
        "",
    );
    let agent = dir.agent();
    let out = agentloop(args(&["plan", agent.to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let plan = stdout_json(&out);
    assert_eq!(plan["model"]["tool_search"], "native", "{plan}");
    let body = &plan["first_request"]["body"];
    let tools = plan["first_request"].to_string();
    assert!(!tools.contains("search_tools"), "{plan}");
    assert!(
        tools.contains("tool_search_tool_bm25_20251119"),
        "the first request offers the server's search: {body}"
    );
    assert_eq!(
        plan["first_request"]["headers"]["anthropic-beta"],
        "advanced-tool-use-2025-11-20"
    );
    let marked = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["defer_loading"] == true)
        .count();
    assert_eq!(marked, 1, "plan lists the agent's own tools: {body}");

    let out = agentloop(args(&["plan", agent.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("tool_search: native"), "{text}");
    assert_eq!(
        text.matches("the provider's own tool search finds it")
            .count(),
        2,
        "{text}"
    );

    // The dry run starts the server: its 200 tools are in the request, marked, as a run sends
    // them.
    let out = agentloop(args(&[
        "run",
        agent.to_str().unwrap(),
        "--input",
        "hi",
        "--dry-run",
        "--json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let view = stdout_json(&out);
    let tools = view["request"]["body"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 202, "{}", view["request"]["body"]["tools"]);
    assert_eq!(tools[0]["type"], "tool_search_tool_bm25_20251119");
    assert!(tools[1..].iter().all(|t| t["defer_loading"] == true));
}
