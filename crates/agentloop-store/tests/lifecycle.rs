//! The trace of event streams a well-behaved run never sends, by the rules of the shared tracker:
//! a run joined mid-way, ends whose start was never seen, parallel calls that end out of order,
//! and calls a run leaves open. Events go straight to the sink, at the instants of a fixed clock.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::model::{FinishReason, Usage};
use agentloop::{CallOutcome, Event, EventKind, EventSink, StopReason, ToolOutput};
use agentloop_store::{
    Status, TraceError, TraceOptions, TraceRecord, TraceSink, TraceWriter, latest_versions,
};

/// Keeps every record written, in order.
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<Vec<TraceRecord>>>);

impl TraceWriter for Kept {
    fn write(&mut self, record: &TraceRecord) -> Result<(), TraceError> {
        self.0.lock().unwrap().push(record.clone());
        Ok(())
    }
    fn flush(&mut self) -> Result<(), TraceError> {
        Ok(())
    }
}

/// Unix microseconds of the clock: a whole second, so that milliseconds read plainly.
const NOW: i64 = 1_795_961_758_000_000;

fn sink() -> (TraceSink, Kept) {
    let kept = Kept::default();
    let sink = TraceSink::new(Box::new(kept.clone()), TraceOptions { payloads: true })
        .with_clock(Arc::new(|| NOW));
    (sink, kept)
}

fn send(sink: &TraceSink, run: &str, turn: u32, kind: EventKind) {
    sink.emit(&Event {
        run_id: Arc::from(run),
        turn,
        kind,
    });
}

fn finished(call_id: &str, took_ms: u64) -> EventKind {
    EventKind::ToolFinished {
        call_id: call_id.into(),
        tool: "t".into(),
        outcome: CallOutcome::ok(ToolOutput::text("done")).took(Duration::from_millis(took_ms)),
    }
}

fn started(call_id: &str) -> EventKind {
    EventKind::ToolStarted {
        call_id: call_id.into(),
        tool: "t".into(),
        arguments: serde_json::json!({"n": 1}),
    }
}

fn run_finished(stop_reason: StopReason) -> EventKind {
    EventKind::RunFinished {
        stop_reason,
        usage: Usage::default(),
        cost_usd: 0.0,
        turns: 1,
        error: None,
    }
}

#[test]
fn a_run_joined_mid_way_records_its_orphan_ends_as_spans_that_took_what_they_say() {
    let (sink, kept) = sink();
    send(
        &sink,
        "r",
        1,
        EventKind::ModelResponse {
            usage: Usage::default(),
            cost_usd: None,
            finish_reason: FinishReason::ToolCalls,
            tool_calls: 1,
            text: "calling".into(),
            duration: Duration::from_millis(40),
            cached: false,
            warnings: Vec::new(),
        },
    );
    send(&sink, "r", 1, finished("c1", 7));
    send(&sink, "r", 1, run_finished(StopReason::Finished));
    let records = latest_versions(kept.0.lock().unwrap().clone());
    let [
        TraceRecord::Run(run),
        TraceRecord::ModelCall(model),
        TraceRecord::ToolCall(tool),
    ] = records.as_slice()
    else {
        panic!("a run, a model call and a tool call: {records:?}");
    };
    // Joined: nothing known of who it is, but what it did is counted.
    assert_eq!((run.agent.as_str(), run.model.as_str()), ("", ""));
    assert_eq!((run.model_calls, run.tool_calls), (Some(1), Some(1)));
    assert_eq!(run.output.as_deref(), Some("calling"));
    assert_eq!(run.span.status, Status::Ok);
    assert_eq!(model.span.id, "r:t1:m1");
    assert_eq!(model.span.started_at_ms, NOW / 1000 - 40);
    assert_eq!(model.span.duration_ms, Some(40.0));
    assert_eq!(tool.span.id, "r:t1:c1");
    assert_eq!(tool.span.started_at_ms, NOW / 1000 - 7);
    assert_eq!(
        (tool.span.status, tool.span.duration_ms),
        (Status::Ok, Some(7.0))
    );
}

#[test]
fn parallel_calls_end_by_their_ids_and_a_cancelled_run_cancels_the_one_left_open() {
    let (sink, kept) = sink();
    send(
        &sink,
        "r",
        0,
        EventKind::RunStarted {
            agent: "a".into(),
            model: "m".into(),
            parent_run_id: None,
            parent_call_id: None,
            input: "go".into(),
        },
    );
    send(&sink, "r", 1, EventKind::TurnStarted);
    for id in ["a", "b", "c"] {
        send(&sink, "r", 1, started(id));
    }
    send(&sink, "r", 1, finished("c", 3));
    send(&sink, "r", 1, finished("a", 5));
    send(&sink, "r", 1, run_finished(StopReason::Cancelled));
    let records = latest_versions(kept.0.lock().unwrap().clone());
    let tools: Vec<(String, Status, Option<f64>)> = records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::ToolCall(t) => {
                Some((t.call_id.clone(), t.span.status, t.span.duration_ms))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("a".to_owned(), Status::Ok, Some(5.0)),
            ("b".to_owned(), Status::Cancelled, Some(0.0)),
            ("c".to_owned(), Status::Ok, Some(3.0)),
        ]
    );
    let left = records
        .iter()
        .find_map(|r| match r {
            TraceRecord::ToolCall(t) if t.call_id == "b" => t.span.error.clone(),
            _ => None,
        })
        .unwrap();
    assert_eq!(left.code, "run.cancelled");
    let turn = records
        .iter()
        .find_map(|r| match r {
            TraceRecord::Turn(t) => Some(t.span.status),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        turn,
        Status::Cancelled,
        "the turn is marked by the call cut short"
    );
    let run = records
        .iter()
        .find_map(|r| match r {
            TraceRecord::Run(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (run.span.status, run.tool_calls),
        (Status::Cancelled, Some(3))
    );
}

#[test]
fn a_model_call_a_second_request_supersedes_ends_interrupted_with_its_code() {
    let (sink, kept) = sink();
    let request = || EventKind::ModelRequestStarted {
        model: "m".into(),
        provider: "openai".into(),
        messages: 1,
    };
    send(&sink, "r", 1, request());
    send(&sink, "r", 1, request());
    send(
        &sink,
        "r",
        1,
        EventKind::ModelError {
            code: "model.server".into(),
            message: "down".into(),
        },
    );
    send(&sink, "r", 1, run_finished(StopReason::Failed));
    let records = latest_versions(kept.0.lock().unwrap().clone());
    let calls: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::ModelCall(c) => Some(c),
            _ => None,
        })
        .collect();
    let [first, second] = calls.as_slice() else {
        panic!("two model calls: {records:?}");
    };
    assert_eq!(first.span.status, Status::Interrupted, "{first:?}");
    assert_eq!(
        first.span.error.as_ref().map(|e| e.code.as_str()),
        Some(agentloop_store::SUPERSEDED)
    );
    assert!(first.span.ended_at_ms.is_some());
    assert_eq!(second.span.status, Status::Error);
}
