#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! Limits, stops and results through `agentloop run --json`: default bounds, the stuck-loop rule,
//! answers that are not answers, cut tool calls, and `on_limit = "answer"`.

mod support;

use serde_json::Value;
use support::*;

/// A scripted agent with one command tool, `probe`: the support crate's logging tool, which logs
/// its arguments and prints the same answer whatever they are.
fn scripted(script: &str, extra: &str) -> AgentDir {
    let dir = AgentDir::new(&format!(
        r#"name = "limits"
[model]
provider = "scripted"
script = "script.json"
{extra}
[[tools]]
name = "probe"
command = ["python3", "tool.py"]
input_schema = {{ type = "object", properties = {{ n = {{ type = "integer" }} }} }}
"#
    ));
    dir.write("script.json", script);
    dir
}

async fn run_json(dir: &AgentDir) -> (Option<i32>, Value) {
    let out = run_agent_json(&dir.agent(), "go").await;
    (out.status.code(), stdout_json(&out))
}

fn probe_calls(n: usize, args: impl Fn(usize) -> String) -> String {
    let turns: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"tool_calls": [{{"id": "c{i}", "name": "probe", "arguments": {}}}]}}"#,
                args(i)
            )
        })
        .collect();
    format!("[{}, {{\"text\": \"done\"}}]", turns.join(", "))
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_shows_the_default_bounds_and_unlimited_lifts_one() {
    let dir = scripted(r#"[{"text": "hi"}]"#, "");
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let limits = &stdout_json(&out)["limits"];
    assert_eq!(limits["max_turns"], 25);
    assert_eq!(limits["max_tool_calls"], 100);
    assert_eq!(limits["max_model_calls"], 50);
    assert_eq!(limits["on_limit"], "stop");

    let dir = scripted(
        r#"[{"text": "hi"}]"#,
        "[limits]\nmax_turns = \"unlimited\"\nmax_tool_calls = 0\non_limit = \"answer\"\n",
    );
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("max_turns: unlimited"), "{text}");
    assert!(text.contains("max_tool_calls: unlimited"), "{text}");
    assert!(text.contains("max_model_calls: 50"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_loop_threshold_of_one_and_a_bad_bound_are_refused() {
    for (limits, key) in [
        ("stuck_loop_threshold = 1", "limits.stuck_loop_threshold"),
        ("max_turns = \"lots\"", "limits.max_turns"),
        ("max_tokens = -5", "limits.max_tokens"),
    ] {
        let dir = scripted(r#"[{"text": "hi"}]"#, &format!("[limits]\n{limits}\n"));
        let (code, v) = run_json(&dir).await;
        assert_eq!(code, Some(3), "{limits}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(key), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_call_with_the_same_result_is_stopped_but_a_changing_result_is_not() {
    // The same arguments, the same output, three turns: a loop.
    let dir = scripted(&probe_calls(5, |_| r#"{"n": 1}"#.into()), "");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(5), "{v}");
    assert_eq!(v["stop_reason"], "stuck_loop");
    assert_eq!(v["limit"]["limit"], "stuck_loop");
    assert_eq!(v["tool_calls"].as_array().unwrap().len(), 3);
    assert!(
        v["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["ok"] == true)
    );
    assert_eq!(dir.tool_inputs().len(), 3, "each call ran");

    // Changing arguments with the same result: progress for an ordinary tool...
    let dir = scripted(&probe_calls(4, |i| format!(r#"{{"n": {i}}}"#)), "");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["stop_reason"], "finished");

    // ... but a poller is judged by its results alone.
    let dir = AgentDir::new(
        r#"name = "poll"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "probe"
command = ["python3", "tool.py"]
poller = true
"#,
    );
    dir.write(
        "script.json",
        &probe_calls(4, |i| format!(r#"{{"n": {i}}}"#)),
    );
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(5), "{v}");
    assert_eq!(v["stop_reason"], "stuck_loop");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_turn_runs_no_tool_and_on_limit_answer_asks_for_a_last_answer() {
    let script = r#"[{"tool_calls": [{"id": "a", "name": "probe", "arguments": {"n": 1}}]},
                     {"text": "what I have so far"}]"#;
    let dir = scripted(script, "[limits]\nmax_turns = 1\n");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(5), "{v}");
    assert_eq!(v["stop_reason"], "max_turns");
    assert!(dir.tool_inputs().is_empty(), "the tool never ran");
    assert_eq!(v["tool_calls"][0]["error"]["code"], "limit.max_turns");
    assert_eq!(v["output"], Value::Null);

    let dir = scripted(script, "[limits]\nmax_turns = 1\non_limit = \"answer\"\n");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(5), "the limit still names the stop: {v}");
    assert_eq!(v["stop_reason"], "max_turns");
    assert_eq!(v["output"], "what I have so far");
    assert_eq!(v["model_calls"], 2);
    let pending = v["tool_calls"][0]["error"]["message"].as_str().unwrap();
    assert!(pending.starts_with("stopped:"), "{pending}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_answer_is_not_finished_and_its_calls_never_run() {
    let script = r#"[{"text": "I can't help with that.", "finish_reason": "refusal",
                      "tool_calls": [{"id": "a", "name": "probe", "arguments": {}}]}]"#;
    let dir = scripted(script, "");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(4), "{v}");
    assert_eq!(v["stop_reason"], "refused");
    assert_eq!(v["error"]["code"], "model.refused");
    assert_eq!(v["output"], "I can't help with that.");
    assert!(dir.tool_inputs().is_empty());

    let dir = scripted(r#"[{"text": "", "finish_reason": "content_filter"}]"#, "");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(4), "{v}");
    assert_eq!(v["stop_reason"], "content_filter");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_answer_over_http_is_asked_again_with_a_larger_limit_then_stops_truncated() {
    let fake = FakeProvider::start(
        "/v1/chat/completions",
        vec![
            ok("openai_chat/oai_chat_ns_length.json"),
            ok("openai_chat/oai_chat_ns_length.json"),
        ],
    )
    .await;
    // The recorded response is a whole body, not a stream.
    let dir = AgentDir::new(&openai_agent(
        &fake.uri(),
        "max_tokens = 50\nstream = false\n",
    ));
    let out = run_agent_json(&dir.agent(), "hi").await;
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "truncated", "{v}");
    assert_eq!(v["error"]["code"], "model.truncated");
    assert_eq!(v["output"], "{\"", "the partial text is kept");
    let bodies = fake.bodies().await;
    assert_eq!(bodies.len(), 2);
    let limit = |b: &Value| {
        b.get("max_completion_tokens")
            .or_else(|| b.get("max_tokens"))
            .cloned()
    };
    assert_eq!(limit(&bodies[0]), Some(Value::from(50)));
    assert_eq!(limit(&bodies[1]), Some(Value::from(100)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_cut_over_http_is_fed_back_and_the_run_goes_on() {
    let fake = FakeProvider::start(
        "/v1/messages",
        vec![
            ok("anthropic/anth_s_incomplete_json_max_tokens.sse"),
            ok("anthropic/anth_s_text.sse"),
        ],
    )
    .await;
    let dir = AgentDir::new(&anthropic_agent(&fake.uri(), "make_file"));
    let out = run_agent_json(&dir.agent(), "taxes").await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["tool_calls"][0]["error"]["code"], "truncated");
    assert!(dir.tool_inputs().is_empty(), "the cut call never ran");
    let bodies = fake.bodies().await;
    let second = bodies[1].to_string();
    assert!(
        second.contains("cut off by the output token limit"),
        "{second}"
    );
    assert!(
        second.contains("toolu_01EKqbqmZrGRXy18eN7m9kvY"),
        "{second}"
    );
    assert_eq!(
        bodies[1]["max_tokens"], 1024,
        "the limit is raised once after a cut"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_reach_the_tool_and_the_record_as_the_json_value_of_the_text_the_model_wrote() {
    // Raw argument texts with spaces, escapes, keys out of order and a repeated key: the tool
    // reads, and `--json` records, the JSON value of each text (the last of a repeated key), and
    // the schema judges that value too (the second call's last `n` is not an integer).
    let first = r#" { "z" : "a\u00e9\n", "n": "one", "n": 2 } "#;
    let second = r#"{"n": 1, "n": "two"}"#;
    let script = format!(
        r#"[{{"tool_calls": [{{"id": "c1", "name": "probe", "arguments": {}}}, {{"id": "c2", "name": "probe", "arguments": {}}}]}}, {{"text": "done"}}]"#,
        serde_json::to_string(first).unwrap(),
        serde_json::to_string(second).unwrap()
    );
    let dir = scripted(&script, "");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(0), "{v}");
    let expected = serde_json::json!({"n": 2, "z": "a\u{e9}\n"});
    assert_eq!(dir.tool_inputs(), vec![expected.clone()]);
    let records = v["tool_calls"].as_array().unwrap();
    assert_eq!(records[0]["input"], expected, "{v}");
    assert_eq!(records[0]["ok"], true, "{v}");
    assert_eq!(records[1]["input"], serde_json::json!({"n": "two"}), "{v}");
    assert_eq!(records[1]["ok"], false, "{v}");
    assert_eq!(records[1]["error"]["code"], "invalid_arguments", "{v}");
    let why = records[1]["error"]["message"].as_str().unwrap();
    assert!(why.contains("/n"), "{why}");
}

/// A scripted agent whose tool turn and final answer spend `first` and `last` input tokens, at
/// $1 a million.
fn spending(first: u64, last: u64, limits: &str) -> AgentDir {
    let script = serde_json::json!([
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {"n": 1}}],
         "usage": {"input_tokens": first, "output_tokens": 0}},
        {"text": "the answer", "usage": {"input_tokens": last, "output_tokens": 0}}
    ]);
    scripted(
        &script.to_string(),
        &format!("price = {{ input = 1.0, output = 1.0 }}\n[limits]\n{limits}\n"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_final_answer_that_crosses_a_budget_finishes_and_says_it_went_past() {
    // $0.25, then a final answer of $0.5: over the $0.5 budget, with nothing left to refuse.
    let dir = spending(250_000, 500_000, "max_cost_usd = 0.5");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["output"], "the answer", "{v}");
    assert_eq!(v["cost_usd"], 0.75, "{v}");
    assert_eq!(v["limit"], Value::Null, "{v}");
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("over budget: max_cost_usd went past its bound (bound 0.5, spent 0.75)")),
        "{v}"
    );

    // The same for tokens; and the closing line on the terminal says it.
    let dir = spending(600, 600, "max_tokens = 1000");
    let (code, v) = run_json(&dir).await;
    assert_eq!(
        (code, &v["stop_reason"]),
        (Some(0), &"finished".into()),
        "{v}"
    );
    assert!(
        v["warnings"]
            .to_string()
            .contains("over budget: max_tokens went past its bound (bound 1000, spent 1200)"),
        "{v}"
    );
    let out = run_agent_with(&dir.agent(), "go", &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("⚠ over budget: max_tokens went past"),
        "{said}"
    );

    // Spent to the bound exactly is not past it: no warning.
    let dir = spending(250_000, 250_000, "max_cost_usd = 0.5");
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spent_output_retries_fail_saying_what_was_wrong_and_that_the_retries_are_spent() {
    let dir = AgentDir::new(
        r#"name = "structured"
output_schema = { type = "object", properties = { answer = { type = "string" } }, required = ["answer"] }
[model]
provider = "scripted"
script = "script.json"
"#,
    );
    dir.write(
        "script.json",
        r#"[{"text": "not json"}, {"text": "{\"answer\": 5}"}, {"text": "{\"x\": 1}"}]"#,
    );
    let (code, v) = run_json(&dir).await;
    assert_eq!(code, Some(7), "{v}");
    assert_eq!(v["stop_reason"], "failed", "{v}");
    assert_eq!(v["model_calls"], 3, "{v}");
    assert_eq!(v["error"]["code"], "output.invalid", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(r#""answer" is a required property"#),
        "{message}"
    );
    assert!(
        message.contains("the last of 3 answers, its 2 retries spent"),
        "{message}"
    );
    // What asked the model again is the model's, not the operator's.
    assert!(!message.contains("Answer again"), "{message}");

    // Each answer sent back is said as it happens, on the terminal and in the trace (where,
    // without payloads, the values the schema's problem quotes are cut).
    let trace = dir.path("trace.ndjson");
    let out = run_agent_with(&dir.agent(), "go", &["--trace", trace.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let said = stderr(&out);
    let sent_back = "answer sent back: the final answer does not match the output schema";
    assert_eq!(said.matches(&format!("↻ {sent_back}")).count(), 2, "{said}");
    let recorded = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(recorded.matches(sent_back).count(), 2, "{recorded}");
    assert!(!recorded.contains("5 is not of type"), "{recorded}");
}
