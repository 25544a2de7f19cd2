//! Real runs of an agent (a scripted model, a tool that works and one that fails recoverably),
//! traced to NDJSON and SQLite, then read back.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::{
    Agent, Message, ModelError, ModelResponse, Price, PriceTable, RunOptions, RunOutcome, Tool,
    ToolError, ToolOutput,
    ids::SequentialIds,
    model::{ModelErrorKind, Usage},
    testing::{ScriptStep, ScriptedModel},
};
use agentloop_store::{
    Status, Trace, TraceError, TraceOptions, TraceRecord, TraceSink, convert, read_trace,
    render_list, render_list_json, render_run, render_run_json, summarize_runs,
};
use serde_json::{Value, json};

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentloop-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The one integer a query answers.
fn query_i64(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

/// Turn 1 calls a working tool (with a secret among its arguments), a failing one and an unknown
/// one; turn 2 answers.
fn weather_script() -> ScriptedModel {
    ScriptedModel::new([
        ModelResponse::tool_calls([
            (
                "c1",
                "get_weather",
                r#"{"city":"Paris","api_key":"sk-secret-1"}"#,
            ),
            ("c2", "flaky", r#"{"city":"Oslo"}"#),
            ("c3", "nope", "{}"),
        ])
        .with_usage(usage(50, 10)),
        ModelResponse::text("It is 18 °C in Paris.").with_usage(Usage {
            cached_input_tokens: 20,
            ..usage(80, 12)
        }),
    ])
}

fn tools() -> Vec<Tool> {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "api_key": {"type": "string"}}, "required": ["city"]});
    vec![
        Tool::dynamic(
            "get_weather",
            "Current weather.",
            schema.clone(),
            |args: Value, _ctx| async move {
                Ok(ToolOutput::json(
                    json!({"city": args["city"], "temp_c": 18, "token": "tok-secret-2"}),
                )
                .with_details(json!({"source": "test", "authorization": "Bearer abc"})))
            },
        ),
        Tool::dynamic(
            "flaky",
            "Always down.",
            schema,
            |_args: Value, _ctx| async move {
                Err::<ToolOutput, _>(ToolError::new("unavailable", "the service is down"))
            },
        ),
    ]
}

fn agent(model: ScriptedModel, sequential_ids: bool) -> Agent {
    let builder = Agent::builder()
        .name("weather")
        .model(model)
        .instructions("Answer weather questions.")
        .tools(tools())
        .pricing(PriceTable::new().with("scripted", Price::new(1.0, 2.0)));
    let builder = if sequential_ids {
        builder.ids(SequentialIds::default())
    } else {
        builder
    };
    builder.build().unwrap()
}

async fn run_traced(agent: &Agent, sink: &Arc<TraceSink>, options: RunOptions) -> RunOutcome {
    let options = RunOptions {
        sinks: vec![sink.clone()],
        ..options
    };
    agent
        .run_with(
            Vec::new(),
            Some(Message::user("Weather in Paris? My key is sk-secret-1")),
            options,
        )
        .await
}

/// Runs the weather agent once into `path` and reads the trace back.
async fn traced_run(path: &Path, payloads: bool) -> (RunOutcome, Trace) {
    let sink = Arc::new(TraceSink::open(path, TraceOptions { payloads }).unwrap());
    let outcome = run_traced(&agent(weather_script(), true), &sink, RunOptions::default()).await;
    sink.finish().unwrap();
    (outcome, read_trace(path).unwrap())
}

fn runs(t: &Trace) -> Vec<&agentloop_store::RunSpan> {
    t.records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::Run(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .collect()
}
fn turns(t: &Trace) -> Vec<&agentloop_store::TurnSpan> {
    t.records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::Turn(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .collect()
}
fn model_calls(t: &Trace) -> Vec<&agentloop_store::ModelCallSpan> {
    t.records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::ModelCall(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .collect()
}
fn tool_calls(t: &Trace) -> Vec<&agentloop_store::ToolCallSpan> {
    t.records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::ToolCall(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .collect()
}

fn assert_trace_matches_outcome(trace: &Trace, outcome: &RunOutcome) {
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let runs = runs(trace);
    assert_eq!(runs.len(), 1);
    let run = runs[0];
    assert_eq!(run.span.id, outcome.run_id);
    assert_eq!(run.span.parent_id, None);
    assert_eq!(run.span.status, Status::Ok);
    assert_eq!(run.stop_reason.as_deref(), Some("finished"));
    assert_eq!(
        (run.agent.as_str(), run.model.as_str()),
        ("weather", "scripted")
    );
    assert_eq!(run.turns, Some(outcome.turns));
    assert_eq!(run.tool_calls, Some(3));
    assert_eq!(run.model_calls, Some(2));
    assert_eq!(run.usage, Some(outcome.usage));
    assert_eq!(run.cost_usd, Some(outcome.cost_usd));
    assert!(run.span.ended_at_ms.unwrap() >= run.span.started_at_ms);

    let turns = turns(trace);
    assert_eq!(turns.iter().map(|t| t.turn).collect::<Vec<_>>(), vec![1, 2]);
    for t in &turns {
        assert_eq!(t.span.parent_id.as_deref(), Some(run.span.id.as_str()));
        assert_eq!(t.span.run_id, run.span.id);
        assert_eq!(t.span.status, Status::Ok);
        assert!(t.span.ended_at_ms.is_some() && t.span.duration_ms.is_some());
    }
    let turn_ids: Vec<&str> = turns.iter().map(|t| t.span.id.as_str()).collect();

    let calls = model_calls(trace);
    assert_eq!(calls.len(), 2);
    let mut summed = Usage::default();
    let mut cost = 0.0;
    for (m, turn_id) in calls.iter().zip(&turn_ids) {
        assert_eq!(m.span.parent_id.as_deref(), Some(*turn_id));
        assert_eq!(m.span.status, Status::Ok);
        assert!(m.span.duration_ms.is_some());
        summed.add(&m.usage.unwrap());
        cost += m.cost_usd.unwrap();
    }
    assert_eq!(summed, outcome.usage);
    assert_eq!(summed.cached_input_tokens, 20);
    assert!((cost - outcome.cost_usd).abs() < 1e-12);
    assert_eq!(calls[0].tool_calls, Some(3));

    let tools = tool_calls(trace);
    assert_eq!(tools.len(), 3);
    for t in &tools {
        assert_eq!(t.span.parent_id.as_deref(), Some(turn_ids[0]));
        assert!(t.span.ended_at_ms.is_some(), "{} has no end", t.call_id);
        assert!(
            t.span.duration_ms.is_some(),
            "{} has no duration",
            t.call_id
        );
        assert!(t.span.ended_at_ms.unwrap() >= t.span.started_at_ms);
    }
    let by_id = |id: &str| tools.iter().find(|t| t.call_id == id).copied().unwrap();
    assert_eq!(
        (by_id("c1").tool.as_str(), by_id("c1").span.status),
        ("get_weather", Status::Ok)
    );
    let c2 = by_id("c2");
    assert_eq!(c2.span.status, Status::Error);
    let e = c2.span.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("unavailable", "the service is down")
    );
    let c3 = by_id("c3");
    assert_eq!(c3.span.status, Status::Rejected);
    assert_eq!(c3.tool, "nope");
    // Ids are unique across the trace.
    let mut ids: Vec<&str> = trace.records.iter().map(|r| r.span().id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), trace.records.len());
}

fn assert_no_payloads(trace: &Trace, raw: &[u8]) {
    let run = runs(trace)[0];
    assert_eq!((run.input.as_ref(), run.output.as_ref()), (None, None));
    for m in model_calls(trace) {
        assert_eq!((m.text.as_ref(), m.reasoning.as_ref()), (None, None));
    }
    for t in tool_calls(trace) {
        assert_eq!(
            (t.arguments.as_ref(), t.output.as_ref(), t.details.as_ref()),
            (None, None, None)
        );
    }
    let raw = String::from_utf8_lossy(raw);
    for secret_or_payload in ["Paris", "Oslo", "sk-secret-1", "tok-secret-2", "18 °C"] {
        assert!(
            !raw.contains(secret_or_payload),
            "the trace holds {secret_or_payload}"
        );
    }
}

#[tokio::test]
async fn ndjson_trace_of_a_real_run_links_ids_and_matches_the_outcome() {
    let path = scratch("ndjson-run").join("trace.ndjson");
    let (outcome, trace) = traced_run(&path, false).await;
    assert_eq!(outcome.stop_reason.as_str(), "finished");
    assert_trace_matches_outcome(&trace, &outcome);
    let raw = std::fs::read(&path).unwrap();
    assert_no_payloads(&trace, &raw);
    // Every span is written when it starts and again when it ends (a rejected call only once).
    let lines = raw.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
    assert_eq!(lines, 2 * trace.records.len() - 1);
}

#[tokio::test]
async fn sqlite_trace_of_a_real_run_links_ids_and_matches_the_outcome() {
    let path = scratch("sqlite-run").join("trace.sqlite");
    let (outcome, trace) = traced_run(&path, false).await;
    assert_trace_matches_outcome(&trace, &outcome);
    let raw = std::fs::read(&path).unwrap();
    assert_no_payloads(&trace, &raw);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let failed: String = conn
        .query_row(
            "SELECT error_code FROM tool_calls WHERE status = 'error'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(failed, "unavailable");
}

#[tokio::test]
async fn payloads_are_recorded_with_the_option_and_secrets_are_redacted() {
    for name in ["payloads.ndjson", "payloads.db"] {
        let path = scratch("payloads").join(name);
        let (outcome, trace) = traced_run(&path, true).await;
        assert_trace_matches_outcome(&trace, &outcome);
        let run = runs(&trace)[0];
        assert_eq!(
            run.input.as_deref(),
            Some("Weather in Paris? My key is sk-secret-1")
        );
        assert_eq!(run.output.as_deref(), Some("It is 18 °C in Paris."));
        assert_eq!(
            model_calls(&trace)[1].text.as_deref(),
            Some("It is 18 °C in Paris.")
        );
        let tools = tool_calls(&trace);
        let c1 = tools.iter().find(|t| t.call_id == "c1").unwrap();
        assert_eq!(
            c1.arguments,
            Some(json!({"city": "Paris", "api_key": "[redacted]"}))
        );
        assert_eq!(
            c1.output,
            Some(json!({"city": "Paris", "temp_c": 18, "token": "[redacted]"}))
        );
        assert_eq!(
            c1.details,
            Some(json!({"source": "test", "authorization": "[redacted]"}))
        );
        let c2 = tools.iter().find(|t| t.call_id == "c2").unwrap();
        assert_eq!(c2.arguments, Some(json!({"city": "Oslo"})));
        let raw = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        assert!(
            !raw.contains("tok-secret-2") && !raw.contains("Bearer abc"),
            "{name} holds a secret"
        );
        // Secrets in the user's own words are the user's payload, kept only when asked for.
        assert!(raw.contains("Oslo"));
    }
}

#[tokio::test]
async fn two_runs_append_to_one_file_and_both_are_listed() {
    for name in ["two.ndjson", "two.sqlite"] {
        let path = scratch("append").join(name);
        let mut ids = Vec::new();
        for _ in 0..2 {
            let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
            let outcome = run_traced(
                &agent(weather_script(), false),
                &sink,
                RunOptions::default(),
            )
            .await;
            sink.finish().unwrap();
            ids.push(outcome.run_id);
        }
        let trace = read_trace(&path).unwrap();
        let summaries = summarize_runs(&trace.records);
        assert_eq!(
            summaries.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            ids,
            "{name}"
        );
        for s in &summaries {
            assert_eq!(
                (s.turns, s.tool_calls, s.stop_reason.as_deref()),
                (2, 3, Some("finished"))
            );
            assert_eq!((s.usage.input_tokens, s.usage.output_tokens), (130, 22));
        }
        let list = render_list(&trace.records);
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), 3, "{list}");
        assert!(lines[0].starts_with("RUN") && lines[0].contains("COST"));
        for (line, id) in lines[1..].iter().zip(&ids) {
            assert!(
                line.starts_with(id.as_str())
                    && line.contains("weather")
                    && line.contains("finished"),
                "{line}"
            );
            assert!(line.contains("130/22"), "{line}");
        }
        let json: Value = serde_json::from_str(&render_list_json(&trace.records).unwrap()).unwrap();
        assert_eq!(json.as_array().unwrap().len(), 2);
        assert_eq!(json[1]["id"], ids[1].as_str());
    }
}

#[tokio::test]
async fn ndjson_converts_to_sqlite_and_back_with_equal_records() {
    let dir = scratch("roundtrip");
    let first = dir.join("run.ndjson");
    let (_, original) = traced_run(&first, true).await;
    let db = dir.join("run.sqlite");
    let back = dir.join("back.ndjson");
    convert(&first, &db).unwrap();
    convert(&db, &back).unwrap();
    let via_sqlite = read_trace(&db).unwrap();
    let round_trip = read_trace(&back).unwrap();
    assert!(original.records.len() >= 7);
    assert_eq!(via_sqlite.records, original.records);
    assert_eq!(round_trip.records, original.records);
    // A conversion never overwrites.
    let again = convert(&first, &db).unwrap_err();
    assert_eq!(again.code(), "trace.destination_exists");
}

#[tokio::test]
async fn a_trace_cut_off_mid_line_reads_with_a_warning_and_takes_more_runs() {
    let path = scratch("truncated").join("trace.ndjson");
    let (_, whole) = traced_run(&path, false).await;
    let mut raw = std::fs::read(&path).unwrap();
    raw.extend_from_slice(br#"{"kind":"tool_call","id":"run_1:t3:c9","run_"#);
    std::fs::write(&path, &raw).unwrap();

    let cut = read_trace(&path).unwrap();
    assert_eq!(cut.records, whole.records);
    assert_eq!(cut.warnings.len(), 1);
    assert!(cut.warnings[0].contains("cut off"), "{}", cut.warnings[0]);

    // The next writer starts on a fresh line, so its records survive.
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let second = run_traced(
        &agent(weather_script(), false),
        &sink,
        RunOptions::default(),
    )
    .await;
    sink.finish().unwrap();
    let after = read_trace(&path).unwrap();
    assert_eq!(after.warnings.len(), 1);
    let ids: Vec<String> = summarize_runs(&after.records)
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, vec!["run_1".to_owned(), second.run_id]);
}

#[tokio::test]
async fn a_run_whose_end_was_never_written_shows_as_running() {
    let path = scratch("crashed").join("trace.ndjson");
    traced_run(&path, false).await;
    let text = std::fs::read_to_string(&path).unwrap();
    // Keep what was written up to the second model call's start: the crash came after it.
    let kept: Vec<&str> = text
        .lines()
        .take_while(|l| !l.contains(r#""id":"run_1:t2:m1","#))
        .collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    let trace = read_trace(&path).unwrap();
    let summary = &summarize_runs(&trace.records)[0];
    assert_eq!(
        (summary.status, summary.stop_reason.as_ref()),
        (Status::Running, None)
    );
    assert_eq!((summary.turns, summary.tool_calls), (2, 3));
    assert_eq!(summary.usage, usage(50, 10));
    assert!(
        render_list(&trace.records)
            .lines()
            .nth(1)
            .unwrap()
            .contains("running")
    );
    let shown = render_run(&trace.records, Some("run_1")).unwrap();
    assert!(shown.contains("└─ turn 2  running"), "{shown}");
}

#[tokio::test]
async fn show_draws_the_run_as_a_tree_with_errors_and_payloads() {
    let path = scratch("show").join("trace.ndjson");
    traced_run(&path, true).await;
    let trace = read_trace(&path).unwrap();
    let shown = render_run(&trace.records, None).unwrap();
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        lines[0].starts_with("run run_1  agent weather  model scripted  finished  ok"),
        "{shown}"
    );
    assert!(
        shown.contains("tokens 130 in / 22 out (cached 20, reasoning 0)"),
        "{shown}"
    );
    assert!(shown.contains("├─ turn 1  ok"), "{shown}");
    assert!(
        shown.contains("│  ├─ model scripted (scripted)  ok"),
        "{shown}"
    );
    assert!(
        shown.contains("tool_calls  50 in / 10 out  $0.00007"),
        "{shown}"
    );
    // Rejected calls are known before the batch runs, so they come first.
    assert!(shown.contains("│  ├─ tool nope [c3]  rejected"), "{shown}");
    assert!(
        shown.contains(r#"unknown_tool: unknown tool "nope""#),
        "{shown}"
    );
    assert!(shown.contains("│  ├─ tool get_weather [c1]  ok"), "{shown}");
    assert!(
        shown.contains(r#"arguments: {"api_key":"[redacted]","city":"Paris"}"#),
        "{shown}"
    );
    assert!(shown.contains("│  └─ tool flaky [c2]  error"), "{shown}");
    assert!(
        shown.contains("unavailable: the service is down"),
        "{shown}"
    );
    assert!(shown.contains("└─ turn 2  ok"), "{shown}");
    assert!(
        shown.contains(r#"text: "It is 18 °C in Paris.""#),
        "{shown}"
    );

    let tree: Value =
        serde_json::from_str(&render_run_json(&trace.records, Some("run_")).unwrap()).unwrap();
    assert_eq!(tree["run"]["id"], "run_1");
    assert_eq!(tree["turns"].as_array().unwrap().len(), 2);
    assert_eq!(tree["turns"][0]["tool_calls"].as_array().unwrap().len(), 3);
    assert_eq!(tree["summary"]["tool_calls"], 3);

    let missing = render_run(&trace.records, Some("run_9")).unwrap_err();
    assert_eq!(missing.code(), "trace.run_not_found");
}

#[tokio::test]
async fn a_failed_model_call_is_recorded_with_its_code() {
    let path = scratch("model-error").join("trace.sqlite");
    let model = ScriptedModel::from_steps([ScriptStep::Fail(ModelError::new(
        ModelErrorKind::RateLimited,
        "slow down",
    ))]);
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let outcome = run_traced(&agent(model, true), &sink, RunOptions::default()).await;
    sink.finish().unwrap();
    assert_eq!(outcome.stop_reason.as_str(), "failed");
    let trace = read_trace(&path).unwrap();
    let call = model_calls(&trace)[0];
    assert_eq!(call.span.status, Status::Error);
    let e = call.span.error.as_ref().unwrap();
    assert_eq!(
        e.code,
        ModelError::new(ModelErrorKind::RateLimited, "").code()
    );
    assert_eq!(e.message, "slow down");
    assert_eq!(turns(&trace)[0].span.status, Status::Error);
    let run = runs(&trace)[0];
    assert_eq!(
        (run.span.status, run.stop_reason.as_deref()),
        (Status::Error, Some("failed"))
    );
    assert!(
        run.span
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("slow down")
    );
}

/// A refused answer's error quotes the model's words, and a fatal tool's what the tool read:
/// the run's error in the trace keeps the words only with payloads, and never a credential.
#[tokio::test]
async fn a_runs_error_text_keeps_the_answers_words_only_with_payloads_and_no_secret() {
    let words = "I will not help with that";
    let secret = "sk-abcdefghijklmnopqrstuvwx";
    for payloads in [false, true] {
        let dir = scratch(&format!("run-error-{payloads}"));
        let mut refusal = ModelResponse::text(format!("{words}, {secret}"));
        refusal.finish_reason = agentloop::model::FinishReason::Refusal;
        refusal.raw_finish_reason = Some("refusal".into());
        let path = dir.join("refused.ndjson");
        let sink = Arc::new(TraceSink::open(&path, TraceOptions { payloads }).unwrap());
        let outcome = run_traced(
            &agent(ScriptedModel::new([refusal]), true),
            &sink,
            RunOptions::default(),
        )
        .await;
        sink.finish().unwrap();
        assert_eq!(outcome.stop_reason.as_str(), "refused");
        let raw = std::fs::read_to_string(&path).unwrap();
        assert_eq!(raw.contains(words), payloads, "{raw}");
        assert!(!raw.contains(secret), "{raw}");
        let trace = read_trace(&path).unwrap();
        let error = runs(&trace)[0].span.error.clone().unwrap();
        assert_eq!(error.code, "model.refused");
        assert!(
            error.message.contains("refused to answer (refusal)"),
            "{error:?}"
        );
        let shown = render_run(&trace.records, None).unwrap();
        assert_eq!(shown.contains(words), payloads, "{shown}");

        let fatal = Tool::dynamic(
            "vault",
            "Reads the vault.",
            json!({"type": "object"}),
            move |_args: Value, _ctx| async move {
                Err::<ToolOutput, _>(ToolError::fatal(format!(
                    "the vault answered OPENAI_API_KEY={secret}"
                )))
            },
        );
        let agent = Agent::builder()
            .name("vaulted")
            .model(ScriptedModel::new([ModelResponse::tool_calls([(
                "v1", "vault", "{}",
            )])]))
            .tools(vec![fatal])
            .build()
            .unwrap();
        let path = dir.join("fatal.ndjson");
        let sink = Arc::new(TraceSink::open(&path, TraceOptions { payloads }).unwrap());
        let outcome = run_traced(&agent, &sink, RunOptions::default()).await;
        sink.finish().unwrap();
        assert_eq!(outcome.error.as_ref().map(|e| e.code()), Some("tool.fatal"));
        let raw = std::fs::read_to_string(&path).unwrap();
        assert!(raw.contains("the vault answered"), "{raw}");
        assert!(!raw.contains(secret), "{raw}");
    }
}

#[tokio::test]
async fn a_subagent_run_links_to_its_parent() {
    let path = scratch("subagent").join("trace.ndjson");
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let child = agent(weather_script(), true);
    let parent = Agent::builder()
        .name("lead")
        .model(ScriptedModel::new(vec![
            ModelResponse::tool_calls([("c1", "ask", r#"{"task":"weather in Paris?"}"#)]),
            ModelResponse::text("done"),
        ]))
        .tool(child.as_tool("ask", "Asks the weather agent."))
        .build()
        .unwrap();
    let outcome = run_traced(&parent, &sink, RunOptions::default()).await;
    sink.finish().unwrap();
    assert_eq!(outcome.stop_reason.as_str(), "finished", "{outcome:?}");
    let sub = &outcome.subagents[0];
    let trace = read_trace(&path).unwrap();
    let child_span = runs(&trace)
        .into_iter()
        .find(|r| r.span.id == sub.run_id)
        .unwrap();
    assert_eq!(
        child_span.span.parent_id.as_deref(),
        Some(outcome.run_id.as_str())
    );
    assert!(
        render_run(&trace.records, Some(&sub.run_id))
            .unwrap()
            .contains(&format!("parent run {}", outcome.run_id))
    );
}

#[test]
fn an_unknown_extension_is_refused_with_a_clear_message() {
    let path = scratch("unknown").join("trace.json");
    let err = TraceSink::open(&path, TraceOptions::default()).unwrap_err();
    assert!(matches!(err, TraceError::UnknownFormat { .. }));
    assert_eq!(err.code(), "trace.unknown_format");
    let message = err.to_string();
    assert!(
        message.contains("trace.json")
            && message.contains(".ndjson")
            && message.contains(".sqlite"),
        "{message}"
    );
    assert!(!path.exists());
    assert_eq!(
        read_trace(&path).unwrap_err().code(),
        "trace.unknown_format"
    );
}

#[test]
fn the_sqlite_schema_is_created_once_and_a_newer_one_is_refused() {
    let path = scratch("schema").join("trace.db");
    for _ in 0..2 {
        let sink = TraceSink::open(&path, TraceOptions::default()).unwrap();
        sink.finish().unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = query_i64(&conn, "PRAGMA user_version");
    assert_eq!(version, agentloop_store::SCHEMA_VERSION);
    let tables: i64 = query_i64(
        &conn,
        "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
    );
    assert_eq!(
        tables, 5,
        "runs, turns, model_calls, tool_calls, compactions"
    );
    assert!(read_trace(&path).unwrap().records.is_empty());
    conn.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(conn);
    let err = TraceSink::open(&path, TraceOptions::default()).unwrap_err();
    assert_eq!(err.code(), "trace.newer_schema");
    assert_eq!(read_trace(&path).unwrap_err().code(), "trace.newer_schema");
}

#[tokio::test]
async fn a_damaged_sqlite_row_is_skipped_with_a_warning() {
    let path = scratch("damaged-row").join("trace.sqlite");
    let (_, whole) = traced_run(&path, false).await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE tool_calls SET status = 'exploded' WHERE call_id = 'c2'",
        [],
    )
    .unwrap();
    drop(conn);
    let trace = read_trace(&path).unwrap();
    assert_eq!(trace.records.len(), whole.records.len() - 1);
    assert_eq!(trace.warnings.len(), 1);
    assert!(
        trace.warnings[0].contains("tool_calls") && trace.warnings[0].contains("exploded"),
        "{:?}",
        trace.warnings
    );
}

#[test]
fn a_file_that_is_not_a_database_is_an_error_not_a_crash() {
    let path = scratch("notdb").join("trace.sqlite");
    std::fs::write(
        &path,
        "hello, this is not SQLite, and it is long enough to have a header",
    )
    .unwrap();
    assert_eq!(read_trace(&path).unwrap_err().code(), "trace.sqlite");
    let missing = read_trace(scratch("missing").join("nothing.ndjson")).unwrap_err();
    assert_eq!(missing.code(), "trace.io");
}

#[tokio::test]
async fn a_dry_run_records_its_calls_as_skipped() {
    let path = scratch("dry-run").join("trace.ndjson");
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let options = RunOptions {
        skip_tools: true,
        ..RunOptions::default()
    };
    run_traced(&agent(weather_script(), true), &sink, options).await;
    sink.finish().unwrap();
    let trace = read_trace(&path).unwrap();
    let mut statuses: Vec<(String, Status)> = tool_calls(&trace)
        .iter()
        .map(|t| (t.call_id.clone(), t.span.status))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        statuses,
        vec![
            ("c1".into(), Status::Skipped),
            ("c2".into(), Status::Skipped),
            ("c3".into(), Status::Rejected)
        ]
    );
}

#[tokio::test]
async fn a_cancelled_run_records_its_running_call_as_cancelled() {
    let path = scratch("cancelled").join("trace.sqlite");
    let slow = Tool::dynamic(
        "slow",
        "Takes long.",
        json!({"type": "object"}),
        |_args: Value, _ctx| async move {
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            Ok(ToolOutput::text("done"))
        },
    );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([("s1", "slow", "{}")]),
        ModelResponse::text("never"),
    ]);
    let limits = agentloop::Limits {
        grace_period: std::time::Duration::from_millis(20),
        ..Default::default()
    };
    let agent = Agent::builder()
        .name("slowpoke")
        .model(model)
        .tool(slow)
        .limits(limits)
        .build()
        .unwrap();
    let cancel = agentloop::CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        trigger.cancel();
    });
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let outcome = run_traced(
        &agent,
        &sink,
        RunOptions {
            cancel: Some(cancel),
            ..RunOptions::default()
        },
    )
    .await;
    sink.finish().unwrap();
    assert_eq!(outcome.stop_reason.as_str(), "cancelled");
    let trace = read_trace(&path).unwrap();
    let call = tool_calls(&trace)[0];
    assert_eq!(call.span.status, Status::Cancelled);
    assert!(call.span.ended_at_ms.is_some());
    assert_eq!(turns(&trace)[0].span.status, Status::Cancelled);
    let run = runs(&trace)[0];
    assert_eq!(
        (run.span.status, run.stop_reason.as_deref()),
        (Status::Cancelled, Some("cancelled"))
    );
}

#[tokio::test]
async fn a_deadline_during_a_model_call_ends_the_call_as_interrupted() {
    let path = scratch("deadline").join("trace.ndjson");
    let model = ScriptedModel::from_json(r#"[{"text": "too late", "delay_ms": 5000}]"#).unwrap();
    let limits = agentloop::Limits {
        timeout: Some(std::time::Duration::from_millis(100)),
        ..Default::default()
    };
    let agent = Agent::builder()
        .name("late")
        .model(model)
        .limits(limits)
        .build()
        .unwrap();
    let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
    let outcome = run_traced(&agent, &sink, RunOptions::default()).await;
    sink.finish().unwrap();
    assert_eq!(outcome.stop_reason.as_str(), "deadline");
    let trace = read_trace(&path).unwrap();
    let call = model_calls(&trace)[0];
    assert_eq!(call.span.status, Status::Interrupted);
    assert_eq!(call.span.error.as_ref().unwrap().code, "run.deadline");
    let run = runs(&trace)[0];
    assert_eq!(
        (run.span.status, run.stop_reason.as_deref()),
        (Status::Error, Some("deadline"))
    );
    assert_eq!(
        run.limit.unwrap().limit,
        agentloop::limits::LimitKind::Deadline
    );
    assert!(
        render_run(&trace.records, None)
            .unwrap()
            .contains("limit deadline reached")
    );
}

/// A writer whose disk is full.
struct FullDisk;

impl agentloop_store::TraceWriter for FullDisk {
    fn write(&mut self, _record: &TraceRecord) -> Result<(), TraceError> {
        Err(TraceError::Io {
            path: "full.ndjson".into(),
            source: std::io::Error::other("no space left on device"),
        })
    }
    fn flush(&mut self) -> Result<(), TraceError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_write_error_leaves_the_run_alone_and_is_returned_by_finish() {
    let sink = Arc::new(TraceSink::new(Box::new(FullDisk), TraceOptions::default()));
    let outcome = run_traced(&agent(weather_script(), true), &sink, RunOptions::default()).await;
    assert_eq!(outcome.stop_reason.as_str(), "finished");
    let err = sink.finish().unwrap_err();
    assert_eq!(err.code(), "trace.io");
    assert!(err.to_string().contains("no space left"));
    // The error is reported once.
    sink.finish().unwrap();
}

#[test]
fn finishing_a_trace_with_a_run_still_open_records_it_as_interrupted() {
    let path = scratch("unfinished").join("trace.ndjson");
    // A clock that advances 1.5 ms at each reading.
    let ticks = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let sink = TraceSink::open(&path, TraceOptions::default())
        .unwrap()
        .with_clock(Arc::new(move || {
            1_795_961_758_000_000 + 1500 * ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        }));
    use agentloop::{Event, EventKind, EventSink};
    let started = EventKind::RunStarted {
        agent: "a".into(),
        model: "m".into(),
        parent_run_id: None,
        parent_call_id: None,
        input: "secret input".into(),
    };
    sink.emit(&Event {
        run_id: "r1".into(),
        turn: 0,
        kind: started,
    });
    sink.emit(&Event {
        run_id: "r1".into(),
        turn: 1,
        kind: EventKind::TurnStarted,
    });
    sink.finish().unwrap();
    let trace = read_trace(&path).unwrap();
    let run = runs(&trace)[0];
    assert_eq!(run.span.status, Status::Interrupted);
    assert_eq!(run.span.error.as_ref().unwrap().code, "trace.unfinished");
    assert_eq!(run.span.started_at_ms, 1_795_961_758_000);
    assert_eq!(run.span.ended_at_ms, Some(1_795_961_758_003));
    assert_eq!(run.span.duration_ms, Some(3.0));
    assert_eq!(run.input, None);
    let turn = turns(&trace)[0];
    assert_eq!(turn.span.status, Status::Ok);
    assert_eq!(
        (turn.span.started_at_ms, turn.span.duration_ms),
        (1_795_961_758_001, Some(1.5))
    );
    assert!(render_list(&trace.records).contains("2026-11-29T14:15:58.000Z"));
}

#[tokio::test]
async fn a_trace_cut_at_any_byte_reads_without_error() {
    let dir = scratch("every-cut");
    let path = dir.join("whole.ndjson");
    let (_, whole) = traced_run(&path, true).await;
    let raw = std::fs::read(&path).unwrap();
    let cut_path = dir.join("cut.ndjson");
    // Every 11th byte, and each line end with the bytes around it.
    let ends = raw
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1);
    let mut cuts: Vec<usize> = (0..=raw.len())
        .step_by(11)
        .chain(ends.flat_map(|e| [e - 1, e, e + 1]))
        .collect();
    cuts.retain(|at| *at <= raw.len());
    for at in cuts {
        let prefix = raw.get(..at).unwrap();
        std::fs::write(&cut_path, prefix).unwrap();
        let trace = read_trace(&cut_path).unwrap();
        let on_boundary = at == 0 || prefix.ends_with(b"\n");
        assert!(
            trace.warnings.len() <= 1,
            "cut at {at}: {:?}",
            trace.warnings
        );
        if on_boundary {
            assert!(
                trace.warnings.is_empty(),
                "cut at {at}: {:?}",
                trace.warnings
            );
        }
        assert!(trace.records.len() <= whole.records.len());
        // Every span read is one the whole trace holds (possibly an earlier version of it).
        for r in &trace.records {
            assert!(
                whole.records.iter().any(|w| w.span().id == r.span().id),
                "cut at {at}"
            );
        }
    }
}

#[tokio::test]
async fn header_like_lines_in_recorded_text_are_redacted() {
    let path = scratch("text-redaction").join("trace.ndjson");
    let model = ScriptedModel::new([ModelResponse::text(
        "Set it like this:\nOPENAI_API_KEY=sk-zzz\nthen run again.",
    )]);
    let agent = Agent::builder()
        .name("helper")
        .model(model)
        .build()
        .unwrap();
    let sink = Arc::new(TraceSink::open(&path, TraceOptions { payloads: true }).unwrap());
    let options = RunOptions {
        sinks: vec![sink.clone()],
        ..RunOptions::default()
    };
    agent
        .run_with(
            Vec::new(),
            Some(Message::user(
                "My request failed with\nAuthorization: Bearer qqq",
            )),
            options,
        )
        .await;
    sink.finish().unwrap();
    let raw = std::fs::read_to_string(&path).unwrap();
    assert!(!raw.contains("sk-zzz") && !raw.contains("qqq"), "{raw}");
    let trace = read_trace(&path).unwrap();
    let run = runs(&trace)[0];
    assert_eq!(
        run.input.as_deref(),
        Some("My request failed with\nAuthorization: [redacted]")
    );
    assert_eq!(
        run.output.as_deref(),
        Some("Set it like this:\nOPENAI_API_KEY= [redacted]\nthen run again.")
    );
}

/// An observer whose `after_model_call` always fails.
struct BrokenObserver;

impl agentloop::Hook for BrokenObserver {
    fn name(&self) -> &str {
        "audit"
    }
    fn after_model_call<'a>(
        &'a self,
        _ctx: agentloop::hooks::HookContext<'a>,
        _response: &'a ModelResponse,
    ) -> futures::future::BoxFuture<'a, agentloop::hooks::HookResult<()>> {
        Box::pin(async { Err(agentloop::hooks::HookError("the audit log is full".into())) })
    }
}

#[tokio::test]
async fn a_failing_observer_hook_is_kept_as_a_run_warning_in_both_formats() {
    for name in ["hooks.ndjson", "hooks.sqlite"] {
        let path = scratch("hooks").join(name);
        let model = ScriptedModel::new([ModelResponse::text("done")]);
        let agent = Agent::builder()
            .name("audited")
            .model(model)
            .observer(BrokenObserver)
            .build()
            .unwrap();
        let sink = Arc::new(TraceSink::open(&path, TraceOptions::default()).unwrap());
        let outcome = run_traced(&agent, &sink, RunOptions::default()).await;
        sink.finish().unwrap();
        assert_eq!(outcome.stop_reason.as_str(), "finished");
        let trace = read_trace(&path).unwrap();
        let run = runs(&trace)[0];
        assert_eq!(run.warnings.len(), 1, "{name}");
        assert!(
            run.warnings[0].contains("audit") && run.warnings[0].contains("the audit log is full"),
            "{name}"
        );
        assert!(
            render_run(&trace.records, None)
                .unwrap()
                .contains("warning: hook audit failed")
        );
    }
}

#[test]
fn a_version_1_sqlite_trace_is_migrated_and_keeps_its_runs() {
    let path = scratch("migrate").join("trace.sqlite");
    let sink = TraceSink::open(&path, TraceOptions::default()).unwrap();
    use agentloop::{Event, EventKind, EventSink};
    let started = EventKind::RunStarted {
        agent: "old".into(),
        model: "m".into(),
        parent_run_id: None,
        parent_call_id: None,
        input: String::new(),
    };
    sink.emit(&Event {
        run_id: "r_old".into(),
        turn: 0,
        kind: started,
    });
    sink.finish().unwrap();
    drop(sink);
    // Make it the file version 1 wrote.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE runs DROP COLUMN warnings; ALTER TABLE runs DROP COLUMN parent_call_id; \
         ALTER TABLE tool_calls DROP COLUMN retries; ALTER TABLE model_calls DROP COLUMN cached; \
         ALTER TABLE turns DROP COLUMN tools_changed; ALTER TABLE runs DROP COLUMN tool_output; \
         ALTER TABLE runs DROP COLUMN handoff; PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(conn);
    // Readers read it as it is, without migrating it.
    let before = read_trace(&path).unwrap();
    assert!(before.warnings.is_empty(), "{:?}", before.warnings);
    assert_eq!(runs(&before)[0].agent, "old");

    let sink = TraceSink::open(&path, TraceOptions::default()).unwrap();
    sink.finish().unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = query_i64(&conn, "PRAGMA user_version");
    assert_eq!(version, agentloop_store::SCHEMA_VERSION);
    let columns: i64 = query_i64(
        &conn,
        "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'warnings'",
    );
    assert_eq!(columns, 1);
    let columns: i64 = query_i64(
        &conn,
        "SELECT count(*) FROM pragma_table_info('tool_calls') WHERE name = 'retries'",
    );
    assert_eq!(columns, 1, "version 3 added the calls' retries");
    let columns: i64 = query_i64(
        &conn,
        "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'handoff'",
    );
    assert_eq!(columns, 1, "version 8 added the runs' hand-off");
    let columns: i64 = query_i64(
        &conn,
        "SELECT count(*) FROM pragma_table_info('turns') WHERE name = 'tools_changed'",
    );
    assert_eq!(columns, 1, "version 7 added the turns' tool changes");
    assert_eq!(read_trace(&path).unwrap().records, before.records);
}

/// Hands `sink` an event of run `r1`.
fn emit_to(sink: &TraceSink, turn: u32, kind: agentloop::EventKind) {
    use agentloop::EventSink;
    sink.emit(&agentloop::Event {
        run_id: "r1".into(),
        turn,
        kind,
    });
}

/// Run `r1` of agent `a` begins.
fn run_started() -> agentloop::EventKind {
    agentloop::EventKind::RunStarted {
        agent: "a".into(),
        model: "m".into(),
        parent_run_id: None,
        parent_call_id: None,
        input: String::new(),
    }
}

#[test]
fn a_tool_error_quoting_a_secret_is_redacted_in_the_trace_and_its_retries() {
    use agentloop::EventKind;
    use std::time::Duration;
    for name in ["secret.ndjson", "secret.sqlite"] {
        let path = scratch("secret-error").join(name);
        let sink = TraceSink::open(&path, TraceOptions::default()).unwrap();
        let emit = |turn: u32, kind: EventKind| emit_to(&sink, turn, kind);
        emit(0, run_started());
        emit(
            1,
            EventKind::ToolStarted {
                call_id: "c1".into(),
                tool: "t".into(),
                arguments: json!({}),
            },
        );
        emit(
            1,
            EventKind::ToolRetrying {
                call_id: "c1".into(),
                tool: "t".into(),
                retry: 1,
                code: "command_failed".into(),
                message: "OPENAI_API_KEY=sk-first-4711".into(),
                delay: Duration::from_millis(100),
            },
        );
        emit(
            1,
            EventKind::ToolFinished {
                call_id: "c1".into(),
                tool: "t".into(),
                outcome: agentloop::CallOutcome::error(
                    "command_failed",
                    "OPENAI_API_KEY=sk-second-4711",
                )
                .took(Duration::from_millis(300)),
            },
        );
        sink.finish().unwrap();
        drop(sink);
        let trace = read_trace(&path).unwrap();
        let call = tool_calls(&trace)[0].clone();
        let text = serde_json::to_string(&call).unwrap();
        assert!(
            !text.contains("sk-first") && !text.contains("sk-second"),
            "{name}: {text}"
        );
        assert_eq!(call.retries.len(), 1, "{name}");
        assert!(
            call.retries[0].starts_with("command_failed: OPENAI_API_KEY"),
            "{name}: {text}"
        );
        let raw = std::fs::read(&path).unwrap();
        assert!(
            !raw.windows(9)
                .any(|w| w == b"sk-first-" || w == b"sk-second"),
            "{name}: a secret reached the file"
        );
    }
}

/// The events of a run whose tool source changed its tools at turn 2 and wrote on stderr.
fn tool_source_events() -> Vec<agentloop::Event> {
    use agentloop::{Event, EventKind, StopReason};
    let at = |turn: u32, kind: EventKind| Event {
        run_id: Arc::from("run-src"),
        turn,
        kind,
    };
    vec![
        at(
            0,
            EventKind::RunStarted {
                agent: "a".into(),
                model: "m".into(),
                parent_run_id: None,
                parent_call_id: None,
                input: "go".into(),
            },
        ),
        at(1, EventKind::TurnStarted),
        at(
            1,
            EventKind::ToolSourceOutput {
                origin: "notes".into(),
                lines: vec![
                    "listening".into(),
                    "OPENAI_API_KEY=sk-test-secret-4711".into(),
                ],
            },
        ),
        at(2, EventKind::TurnStarted),
        at(
            2,
            EventKind::ToolsChanged {
                added: vec!["notes__grow".into()],
                removed: vec!["notes__old".into()],
                updated: Vec::new(),
                refused: Vec::new(),
            },
        ),
        at(
            2,
            EventKind::RunFinished {
                stop_reason: StopReason::Finished,
                usage: usage(1, 1),
                cost_usd: 0.0,
                turns: 2,
                error: None,
            },
        ),
    ]
}

#[test]
fn a_tool_change_and_a_sources_output_survive_ndjson_and_sqlite() {
    let dir = scratch("tool-source");
    for name in ["run.ndjson", "run.sqlite"] {
        let path = dir.join(name);
        let sink = TraceSink::open(&path, TraceOptions { payloads: true }).unwrap();
        for e in tool_source_events() {
            agentloop::EventSink::emit(&sink, &e);
        }
        sink.finish().unwrap();
        let trace = read_trace(&path).unwrap();
        let run = runs(&trace)[0];
        assert_eq!(run.tool_output.len(), 2, "{name}: {run:?}");
        assert_eq!(run.tool_output[0], "notes: listening", "{name}");
        assert!(
            run.tool_output[1].starts_with("notes: OPENAI_API_KEY")
                && !run.tool_output[1].contains("sk-test-secret-4711"),
            "{name}: a secret in a server's output is redacted: {}",
            run.tool_output[1]
        );
        let changed: Vec<_> = turns(&trace)
            .iter()
            .filter_map(|t| t.tools_changed.clone().map(|c| (t.turn, c)))
            .collect();
        assert_eq!(changed.len(), 1, "{name}: {changed:?}");
        assert_eq!(changed[0].0, 2, "{name}");
        assert_eq!(changed[0].1.added, ["notes__grow"], "{name}");
        assert_eq!(changed[0].1.removed, ["notes__old"], "{name}");
    }
    // And a conversion keeps them.
    convert(dir.join("run.ndjson"), dir.join("converted.sqlite")).unwrap();
    let a = read_trace(dir.join("run.ndjson")).unwrap();
    let b = read_trace(dir.join("converted.sqlite")).unwrap();
    assert_eq!(a.records, b.records);
}

#[tokio::test]
async fn an_ndjson_trace_is_never_appended_to_a_file_that_holds_something_else() {
    let dir = scratch("ndjson-other");
    // An image, and a log, given as `--trace` by mistake: left byte for byte as they were.
    let image = dir.join("photo.ndjson");
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    std::fs::write(&image, &png).unwrap();
    let log = dir.join("server.ndjson");
    std::fs::write(&log, "2026-12-05 started\n").unwrap();
    for path in [&image, &log] {
        let e = TraceSink::open(path, TraceOptions::default()).unwrap_err();
        assert_eq!(e.code(), "trace.not_a_trace", "{e}");
    }
    assert_eq!(std::fs::read(&image).unwrap(), png);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "2026-12-05 started\n"
    );

    // A trace whose only line a crash cut off is still a trace: the next run appends to it.
    let cut = dir.join("cut.ndjson");
    std::fs::write(&cut, "{\"type\":\"run_sta").unwrap();
    TraceSink::open(&cut, TraceOptions::default()).unwrap();

    // A named pipe is refused at once, by the writer and the reader, rather than waited on.
    let fifo = dir.join("pipe.ndjson");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = TraceSink::open(&fifo, TraceOptions::default()).unwrap_err();
    assert_eq!(e.code(), "trace.not_a_trace", "{e}");
    let e = read_trace(&fifo).unwrap_err();
    assert_eq!(e.code(), "trace.not_a_trace", "{e}");
}

#[tokio::test]
async fn a_line_too_long_to_be_a_record_is_skipped_not_held() {
    let dir = scratch("ndjson-long");
    let path = dir.join("runs.ndjson");
    let (_, whole) = traced_run(&path, false).await;
    // 20 MB of one line without an end, put between the records.
    let text = std::fs::read_to_string(&path).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    let long = "x".repeat(20 * 1024 * 1024);
    std::fs::write(&path, format!("{first}\n{long}\n{rest}")).unwrap();
    let read = read_trace(&path).unwrap();
    assert_eq!(read.records.len(), whole.records.len());
    assert!(
        read.warnings
            .iter()
            .any(|w| w.contains("line 2 is longer than")),
        "{:?}",
        read.warnings
    );
}

/// A model call retried part-way: the trace keeps the retry (a run warning, its secret
/// redacted), and the call's reasoning is the answer's alone, not the discarded attempt's.
#[test]
fn a_model_call_retried_part_way_keeps_the_retry_and_only_the_answers_reasoning() {
    use agentloop::model::{Discarded, FinishReason};
    use agentloop::{EventKind, StopReason};
    use std::time::Duration;
    for name in ["retry.ndjson", "retry.sqlite"] {
        let path = scratch("model-retry").join(name);
        let sink = TraceSink::open(&path, TraceOptions { payloads: true }).unwrap();
        let emit = |turn: u32, kind: EventKind| emit_to(&sink, turn, kind);
        emit(0, run_started());
        emit(1, EventKind::TurnStarted);
        emit(
            1,
            EventKind::ModelRequestStarted {
                model: "m".into(),
                provider: "p".into(),
                messages: 1,
            },
        );
        emit(
            1,
            EventKind::ReasoningDelta {
                text: "first thought".into(),
            },
        );
        emit(
            1,
            EventKind::TextDelta {
                text: "Half".into(),
            },
        );
        emit(
            1,
            EventKind::ModelRetrying {
                retry: 1,
                model: "m".into(),
                code: "model.overloaded".into(),
                message: "busy, key sk-abcdefghijklmnopqrstuvwx".into(),
                delay: Duration::from_millis(500),
                discarded: Discarded {
                    text_chars: 4,
                    reasoning_chars: 13,
                    tool_calls: 0,
                },
                usage: Some(usage(10, 1)),
            },
        );
        emit(
            1,
            EventKind::ReasoningDelta {
                text: "second thought".into(),
            },
        );
        emit(
            1,
            EventKind::ModelResponse {
                usage: usage(22, 6),
                cost_usd: None,
                finish_reason: FinishReason::Stop,
                tool_calls: 0,
                text: "Whole".into(),
                duration: Duration::from_millis(900),
                cached: false,
                warnings: Vec::new(),
            },
        );
        emit(
            1,
            EventKind::RunFinished {
                stop_reason: StopReason::Finished,
                usage: usage(22, 6),
                cost_usd: 0.0,
                turns: 1,
                error: None,
            },
        );
        sink.finish().unwrap();
        drop(sink);
        let trace = read_trace(&path).unwrap();
        let call = model_calls(&trace)[0];
        assert_eq!(call.reasoning.as_deref(), Some("second thought"), "{name}");
        assert_eq!(call.text.as_deref(), Some("Whole"), "{name}");
        let run = runs(&trace)[0];
        assert_eq!(
            run.warnings,
            vec![
                "model call in turn 1 failed and was retried (1, m): model.overloaded: busy, key \
                 [redacted]; discarded what it streamed: 4 characters of text, 13 of reasoning, \
                 0 tool calls"
                    .to_owned()
            ],
            "{name}"
        );
    }
}
