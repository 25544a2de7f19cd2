#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Budgets that hold: `max_cost_usd` needs a price for the model (the file's `[model] price`, or
//! the built-in table's for a live model it knows), or the file is refused before anything runs;
//! a price in the file prices the run; `plan` shows the price and where it comes from.

mod support;

use serde_json::{Value, json};
use support::*;

/// A scripted agent with `model_extra` in `[model]` and `limits` as its `[limits]`; its model
/// calls `get_weather` once, reporting a million input tokens, then answers.
fn scripted(model_extra: &str, limits: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "priced"
[model]
provider = "scripted"
script = "script.json"
{model_extra}
[limits]
{limits}
[[tools]]
name = "get_weather"
command = ["python3", "tool.py"]
"#
    ));
    let million = json!({"input_tokens": 1_000_000, "output_tokens": 0});
    let script = json!([
        {"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}],
         "usage": million},
        {"text": "done", "usage": million}
    ]);
    dir.write("script.json", &script.to_string());
    dir
}

async fn run_json(dir: &AgentDir) -> (Option<i32>, Value, String) {
    run_file_json(&dir.agent()).await
}

/// `agentloop run --json` of the agent file at `agent` on "hi".
async fn run_file_json(agent: &std::path::Path) -> (Option<i32>, Value, String) {
    let out = run_agent_json(agent, "hi").await;
    (out.status.code(), stdout_json(&out), stderr(&out))
}

fn line_of(dir: &AgentDir, start: &str) -> usize {
    let text = std::fs::read_to_string(dir.agent()).unwrap();
    text.lines().position(|l| l.starts_with(start)).unwrap() + 1
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cost_budget_for_an_unpriced_model_is_refused_naming_model_price() {
    let dir = scripted("", "max_cost_usd = 0.5");
    let line = line_of(&dir, "max_cost_usd");
    let agent = dir.agent();
    let out = agentloop(args(&["run", agent.to_str().unwrap(), "--input", "hi"])).await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("agent.toml:{line}:16: limits.max_cost_usd: max_cost_usd needs a price for the model, and the scripted model has no price: give it in [model] as `price = {{ input = 0.40, output = 1.60 }}`")),
        "{err}"
    );
    assert!(!dir.path("stdin.log").exists(), "nothing ran");

    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(3));
    let problems = &v["error"]["problems"];
    assert_eq!(problems[0]["path"], "limits.max_cost_usd", "{v}");
    assert_eq!(problems[0]["line"], line);

    // A live model the built-in table does not know (a local server's name): refused the same
    // way, before any request (nothing listens at the base URL; a request would exit 4).
    let local = AgentDir::new(
        r#"name = "local"
[model]
provider = "openai"
name = "qwen2.5-0.5b-instruct"
base_url = "http://127.0.0.1:9/v1"
[limits]
max_cost_usd = 1
"#,
    );
    let out = agentloop(args(&[
        "run",
        local.agent().to_str().unwrap(),
        "--input",
        "hi",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "the model \"qwen2.5-0.5b-instruct\" is not in the built-in price table: give it in [model] as `price = "
        ),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_price_in_the_agent_file_prices_the_run_and_the_budget_holds() {
    // $1 a million input tokens: the first answer costs $1, over the $0.5 budget, so the run
    // stops before the second model call.
    let dir = scripted(
        "price = { input = 1.0, output = 2.0 }",
        "max_cost_usd = 0.5",
    );
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(5), "{v}");
    assert_eq!(v["stop_reason"], "budget", "{v}");
    assert_eq!(v["limit"]["limit"], "max_cost_usd", "{v}");
    assert_eq!(v["cost_usd"], 1.0, "{v}");
    assert_eq!(v["model_calls"], 1, "{v}");

    // Without a budget the price still counts the cost: two answers, $2.
    let dir = scripted(
        "price = { input = 1.0, output = 2.0, cached_input = 0.5, cache_write = 1.25 }",
        "max_turns = 4",
    );
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["cost_usd"], 2.0, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_price_that_is_not_a_price_is_refused_with_its_key_path_and_line() {
    let dir = scripted(
        "price = { input = -1, output = nan, cache_write = inf }",
        "max_turns = 2",
    );
    let line = line_of(&dir, "price");
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(3), "{v}");
    let paths: Vec<(&str, u64)> = v["error"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["path"].as_str().unwrap(), p["line"].as_u64().unwrap()))
        .collect();
    let line = line as u64;
    assert_eq!(
        paths,
        [
            ("model.price.input", line),
            ("model.price.output", line),
            ("model.price.cache_write", line)
        ],
        "{v}"
    );
    assert!(
        v["error"]["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("USD per million tokens, zero or more"),
        "{v}"
    );

    let dir = scripted("price = { input = 1, outptu = 2 }", "max_turns = 2");
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(3), "{v}");
    let messages = v["error"]["problems"].to_string();
    assert!(messages.contains("unknown key `outptu`"), "{messages}");
    assert!(
        messages.contains("missing required key `output`"),
        "{messages}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_price_whose_cost_could_overflow_is_refused_and_the_largest_one_prices_a_run() {
    // 1e308 USD per million tokens: a million tokens would cost more than any f64 holds.
    let dir = scripted("price = { input = 1e308, output = 1 }", "max_turns = 4");
    let line = line_of(&dir, "price") as u64;
    let (code, v, said) = run_json(&dir).await;
    assert_eq!(code, Some(3), "{v} {said}");
    let problem = &v["error"]["problems"][0];
    assert_eq!(problem["path"], "model.price.input", "{v}");
    assert_eq!(problem["line"], line, "{v}");
    assert!(
        problem["message"]
            .as_str()
            .unwrap()
            .contains("zero or more and at most 1000000"),
        "{v}"
    );
    assert!(!dir.path("stdin.log").exists(), "nothing ran");

    // The largest price there may be: the cost is a number, and the budget stops the run.
    let dir = scripted(
        "price = { input = 1000000, output = 1000000 }",
        "max_cost_usd = 500000",
    );
    let (code, v, _) = run_json(&dir).await;
    assert_eq!(code, Some(5), "{v}");
    assert_eq!(v["stop_reason"], "budget", "{v}");
    assert_eq!(v["cost_usd"], 1_000_000.0, "{v}");
    assert_eq!(v["model_calls"], 1, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_the_price_and_where_it_comes_from() {
    let plan = |dir: &AgentDir, json: bool| {
        let agent = dir.agent();
        let mut a = vec!["plan", agent.to_str().unwrap()];
        if json {
            a.push("--json");
        }
        agentloop(args(&a))
    };
    let dir = scripted(
        "price = { input = 1.0, output = 2.5, cached_input = 0.5 }",
        "max_cost_usd = 1",
    );
    let out = plan(&dir, true).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out)["model"]["price"],
        json!({"input": 1.0, "output": 2.5, "cached_input": 0.5, "cache_write": null, "source": "agent_file"})
    );
    let text = stdout(&plan(&dir, false).await);
    assert!(
        text.contains(
            "        price: $1.0 in, $2.5 out per million tokens (cached input $0.5; [model] price)\n"
        ),
        "{text}"
    );

    let live = AgentDir::new(&openai_agent("http://127.0.0.1:9", ""));
    let v = stdout_json(&plan(&live, true).await);
    assert_eq!(v["model"]["price"]["input"], 2.5, "gpt-4o: {v}");
    assert_eq!(v["model"]["price"]["source"], "built_in");

    let unpriced = scripted("", "max_turns = 2");
    let v = stdout_json(&plan(&unpriced, true).await);
    assert_eq!(v["model"]["price"], Value::Null);
    let text = stdout(&plan(&unpriced, false).await);
    assert!(
        text.contains("        price: none (the run's cost is not counted; max_cost_usd needs [model] price)\n"),
        "{text}"
    );
}

#[path = "../../agentloop-providers/tests/quirks/server.rs"]
mod server;

/// A server answering (every time) with an answer named for a model no price table knows.
async fn answering_as_an_unknown_model() -> server::QuirkServer {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../agentloop-providers/tests/quirks/chat-openrouter-error-chunk-before-any-text");
    let reply = server::Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: Some("2.sse".into()),
        pause: None,
        bytes: Vec::new(),
    }
    .load(&dir);
    server::QuirkServer::start(vec![reply]).await
}

/// A live OpenAI-compatible agent named `model` at `uri`, with `limits` as its `[limits]`.
fn live(uri: &str, model: &str, limits: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "live"
[model]
provider = "openai"
name = "{model}"
base_url = "{uri}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
[limits]
{limits}
"#
    ))
}

/// `agentloop run --json` of `dir`, which must finish: its JSON object and its stderr.
async fn finished(dir: &AgentDir) -> (Value, String) {
    let (code, v, said) = run_json(dir).await;
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(v["stop_reason"], "finished", "{v}");
    (v, said)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_of_a_model_no_price_is_known_for_has_an_unknown_cost_not_zero() {
    let server = answering_as_an_unknown_model().await;
    let (v, said) = finished(&live(&server.uri, "my-local-model", "")).await;
    assert_eq!(v["cost_usd"], Value::Null, "the cost is unknown: {v}");
    assert!(
        said.contains("the cost of 1 model answer is unknown"),
        "{said}"
    );
    // On the terminal the closing line says so too, rather than a metered $0.0000.
    let dir = live(&server.uri, "my-local-model", "");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "hi",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let closing = stderr(&out);
    let closing = closing
        .lines()
        .find(|l| l.starts_with('■'))
        .unwrap_or_default();
    assert!(closing.contains("cost unknown"), "{closing}");
    assert!(!closing.contains('$'), "{closing}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_named_otherwise_is_priced_by_the_configured_model() {
    let server = answering_as_an_unknown_model().await;
    // The server answers as `nvidia/…:free`; the file names a model the table prices.
    let (v, said) = finished(&live(&server.uri, "gpt-4o-mini", "max_cost_usd = 1")).await;
    assert_eq!(v["output"], "Sunny in Paris.", "{v}");
    assert!(v["cost_usd"].as_f64().unwrap() > 0.0, "{v}");
    assert!(!said.contains("unknown"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn zero_lifts_the_cost_budget_and_the_deadline_as_it_lifts_every_bound() {
    // `max_cost_usd = 0` is no budget (as in the README, the core's `Limits` and Python's
    // `Limits(max_cost_usd=0)`), not a budget spent before the first model call; nor does it
    // need a price. `timeout_secs = 0` is no deadline.
    for model_extra in ["price = { input = 1.0, output = 2.0 }", ""] {
        let dir = scripted(model_extra, "max_cost_usd = 0\ntimeout_secs = 0");
        let (code, v, err) = run_json(&dir).await;
        assert_eq!(code, Some(0), "{model_extra}: {v} {err}");
        assert_eq!(v["stop_reason"], "finished", "{v}");
        assert_eq!(v["model_calls"], 2, "{v}");
    }
    // A subagent tool's caps read 0 the same way: the child is not stopped at once.
    let dir = scripted("price = { input = 1.0, output = 2.0 }", "max_turns = 4");
    dir.write(
        "parent.toml",
        r#"name = "parent"
[model]
provider = "scripted"
script = "parent.json"
price = { input = 1.0, output = 2.0 }
[[tools]]
name = "worker"
agent = "agent.toml"
max_cost_usd = 0
max_turns = 0
"#,
    );
    dir.write(
        "parent.json",
        &json!([
            {"tool_calls": [{"id": "w1", "name": "worker", "arguments": {"task": "weather"}}]},
            {"text": "all done"}
        ])
        .to_string(),
    );
    let (code, v, err) = run_file_json(&dir.path("parent.toml")).await;
    assert_eq!(code, Some(0), "{v} {err}");
    assert_eq!(v["subagents"][0]["stop_reason"], "finished", "{v}");
    assert_eq!(v["subagents"][0]["model_calls"], 2, "{v}");
}
