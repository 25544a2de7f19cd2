//! The tracker's lifecycle, told through a renderer that writes down every step it is asked to
//! take: orphans, superseded model calls, nested subagent runs, parallel tool calls, and what a
//! run leaves open when it ends or is abandoned.

use std::sync::Arc;
use std::time::Duration;

use agentloop::model::{FinishReason, Usage};
use agentloop::{CallOutcome, Event, EventKind, StopReason, ToolOutput};
use agentloop_observe::tracker::{
    ModelEnd, Opening, Parent, Render, RunEnd, RunHead, ToolEnd, Tracked, Tracker,
};
use serde_json::json;

/// Writes each step down as one line. Spans carry their names, so a line says which span the
/// tracker handed back.
#[derive(Default)]
struct Steps {
    lines: Vec<String>,
    /// Decline runs joined mid-stream (as the OpenTelemetry sink does).
    decline_joined: bool,
}

impl Render for Steps {
    type Run = String;
    type Turn = u32;
    type ModelCall = String;
    type ToolCall = String;

    fn open_run(
        &mut self,
        head: &RunHead,
        parent: Option<Parent<'_, Self>>,
        _: &Event,
    ) -> Option<String> {
        if head.joined && self.decline_joined {
            self.lines.push(format!("decline {}", head.run_id));
            return None;
        }
        let under = match parent {
            Some(p) => format!(
                " under {}/{}",
                p.run.data,
                p.call.map_or("-", String::as_str)
            ),
            None => String::new(),
        };
        self.lines.push(format!(
            "open run {} depth {}{}{under}",
            head.run_id,
            head.depth,
            if head.joined { " joined" } else { "" }
        ));
        Some(head.run_id.clone())
    }

    fn open_turn(&mut self, run: &mut Tracked<Self>, turn: u32) -> u32 {
        self.lines.push(format!("open {} turn {turn}", run.data));
        turn
    }

    fn close_turn(&mut self, run: &mut Tracked<Self>, turn: u32) {
        self.lines.push(format!("close {} turn {turn}", run.data));
    }

    fn open_model_call(&mut self, run: &mut Tracked<Self>, _: &Event, opening: Opening) -> String {
        let name = format!("m{}", run.calls_in_turn());
        self.lines.push(format!(
            "open {} {name} {}",
            run.data,
            opening_word(opening)
        ));
        name
    }

    fn close_model_call(&mut self, run: &mut Tracked<Self>, call: String, end: ModelEnd<'_>) {
        let why = match end {
            ModelEnd::Responded(_) => "responded".to_owned(),
            ModelEnd::Failed { code, .. } => format!("failed {code}"),
            ModelEnd::Superseded => "superseded".to_owned(),
            ModelEnd::RunEnded(end) => format!("run ended {}", end_word(end)),
        };
        self.lines.push(format!("close {} {call} {why}", run.data));
    }

    fn open_tool_call(
        &mut self,
        run: &mut Tracked<Self>,
        event: &Event,
        opening: Opening,
    ) -> String {
        let name = event.call_id().unwrap_or("?").to_owned();
        self.lines.push(format!(
            "open {} {name} {}",
            run.data,
            opening_word(opening)
        ));
        name
    }

    fn close_tool_call(&mut self, run: &mut Tracked<Self>, call: String, end: ToolEnd<'_>) {
        let why = match end {
            ToolEnd::Finished(o) => format!("finished {:?}", o.status),
            ToolEnd::Rejected { code, .. } => format!("rejected {code}"),
            ToolEnd::RunEnded(end) => format!("run ended {}", end_word(end)),
        };
        self.lines.push(format!("close {} {call} {why}", run.data));
    }

    fn close_run(&mut self, run: Tracked<Self>, end: &RunEnd<'_>) {
        self.lines.push(format!(
            "close run {} {} model_calls {} tool_calls {} last_text {:?}",
            run.data,
            end_word(end),
            run.model_calls(),
            run.tool_calls(),
            run.last_text()
        ));
    }

    fn on_event(&mut self, run: &mut Tracked<Self>, event: &Event) {
        if let EventKind::ToolRetrying { call_id, .. } = &event.kind {
            let open = run.tool(call_id).is_some();
            self.lines
                .push(format!("retry {} {call_id} open {open}", run.data));
        }
    }
}

fn opening_word(opening: Opening) -> String {
    match opening {
        Opening::Started => "started".into(),
        Opening::Orphan { ago } => format!("orphan {}ms ago", ago.as_millis()),
    }
}

fn end_word(end: &RunEnd<'_>) -> String {
    match end {
        RunEnd::Finished { stop_reason, .. } => stop_reason.as_str().to_owned(),
        RunEnd::Abandoned => "abandoned".into(),
    }
}

fn event(run: &str, turn: u32, kind: EventKind) -> Event {
    Event {
        run_id: Arc::from(run),
        turn,
        kind,
    }
}

fn run_started(run: &str, parent: Option<(&str, &str)>) -> Event {
    event(
        run,
        0,
        EventKind::RunStarted {
            agent: "a".into(),
            model: "m".into(),
            parent_run_id: parent.map(|p| p.0.to_owned()),
            parent_call_id: parent.map(|p| p.1.to_owned()),
            input: "hi".into(),
        },
    )
}

fn request(run: &str, turn: u32) -> Event {
    event(
        run,
        turn,
        EventKind::ModelRequestStarted {
            model: "m".into(),
            provider: "p".into(),
            messages: 1,
        },
    )
}

fn response(run: &str, turn: u32, text: &str) -> Event {
    event(
        run,
        turn,
        EventKind::ModelResponse {
            usage: Usage::default(),
            cost_usd: None,
            finish_reason: FinishReason::Stop,
            tool_calls: 0,
            text: text.into(),
            duration: Duration::from_millis(40),
            cached: false,
            warnings: Vec::new(),
        },
    )
}

fn tool_started(run: &str, turn: u32, call_id: &str) -> Event {
    event(
        run,
        turn,
        EventKind::ToolStarted {
            call_id: call_id.into(),
            tool: "t".into(),
            arguments: json!({}),
        },
    )
}

fn tool_finished(run: &str, turn: u32, call_id: &str) -> Event {
    event(
        run,
        turn,
        EventKind::ToolFinished {
            call_id: call_id.into(),
            tool: "t".into(),
            outcome: CallOutcome::ok(ToolOutput::text("done")).took(Duration::from_millis(7)),
        },
    )
}

fn run_finished(run: &str, stop_reason: StopReason) -> Event {
    event(
        run,
        1,
        EventKind::RunFinished {
            stop_reason,
            usage: Usage::default(),
            cost_usd: 0.0,
            turns: 1,
            error: None,
        },
    )
}

fn feed(steps: &mut Steps, events: &[Event]) -> Tracker<Steps> {
    let mut tracker = Tracker::new();
    for e in events {
        tracker.on_event(e, steps);
    }
    tracker
}

#[test]
fn ends_never_seen_start_open_and_close_at_once_as_orphans() {
    let mut steps = Steps::default();
    let tracker = feed(
        &mut steps,
        &[
            run_started("r", None),
            response("r", 1, "hello"),
            tool_finished("r", 1, "c1"),
        ],
    );
    assert_eq!(
        steps.lines,
        [
            "open run r depth 0",
            "open r m1 orphan 40ms ago",
            "close r m1 responded",
            "open r c1 orphan 7ms ago",
            "close r c1 finished Ok",
        ]
    );
    let run = tracker.run("r").map(|r| (r.model_calls(), r.tool_calls()));
    assert_eq!(run, Some((1, 1)), "orphans count as calls");
}

#[test]
fn a_run_never_seen_start_is_joined_or_its_events_are_ignored() {
    let mut steps = Steps::default();
    let tracker = feed(&mut steps, &[tool_started("x", 2, "c1")]);
    assert_eq!(
        steps.lines,
        [
            "open run x depth 0 joined",
            "open x turn 2",
            "open x c1 started"
        ]
    );
    assert_eq!(tracker.open_runs(), 1);

    let mut declining = Steps {
        decline_joined: true,
        ..Steps::default()
    };
    let tracker = feed(
        &mut declining,
        &[
            tool_started("x", 2, "c1"),
            run_finished("x", StopReason::Finished),
        ],
    );
    assert_eq!(declining.lines, ["decline x", "decline x"]);
    assert_eq!(tracker.open_runs(), 0);
}

#[test]
fn a_second_model_request_supersedes_the_open_one() {
    let mut steps = Steps::default();
    feed(
        &mut steps,
        &[
            run_started("r", None),
            request("r", 1),
            request("r", 1),
            response("r", 1, "second"),
        ],
    );
    assert_eq!(
        steps.lines,
        [
            "open run r depth 0",
            "open r turn 1",
            "open r m1 started",
            "close r m1 superseded",
            "open r m2 started",
            "close r m2 responded",
        ]
    );
}

#[test]
fn subagent_runs_nest_under_the_call_that_started_them() {
    let mut steps = Steps::default();
    let tracker = feed(
        &mut steps,
        &[
            run_started("top", None),
            tool_started("top", 1, "call-a"),
            run_started("sub", Some(("top", "call-a"))),
            tool_started("sub", 1, "call-b"),
            run_started("subsub", Some(("sub", "call-b"))),
            // A parent never seen: one down from the top, with no parent to hang under.
            run_started("stray", Some(("gone", "call-z"))),
            // A call id the parent has not open: under the parent run alone.
            run_started("late", Some(("top", "call-q"))),
        ],
    );
    assert_eq!(
        steps.lines,
        [
            "open run top depth 0",
            "open top turn 1",
            "open top call-a started",
            "open run sub depth 1 under top/call-a",
            "open sub turn 1",
            "open sub call-b started",
            "open run subsub depth 2 under sub/call-b",
            "open run stray depth 1",
            "open run late depth 1 under top/-",
        ]
    );
    let depth = |id: &str| tracker.run(id).map(|r| r.head().depth);
    assert_eq!(depth("subsub"), Some(2));
    assert_eq!(
        tracker
            .run("sub")
            .and_then(|r| r.head().parent_call_id.clone()),
        Some("call-a".to_owned())
    );
}

#[test]
fn parallel_calls_close_by_their_own_ids_in_any_order() {
    let mut steps = Steps::default();
    feed(
        &mut steps,
        &[
            run_started("r", None),
            tool_started("r", 1, "a"),
            tool_started("r", 1, "b"),
            tool_started("r", 1, "c"),
            event(
                "r",
                1,
                EventKind::ToolRetrying {
                    call_id: "c".into(),
                    tool: "t".into(),
                    retry: 1,
                    code: "tool.timeout".into(),
                    message: "slow".into(),
                    delay: Duration::ZERO,
                },
            ),
            tool_finished("r", 1, "b"),
            tool_finished("r", 1, "a"),
            run_finished("r", StopReason::Cancelled),
        ],
    );
    assert_eq!(
        steps.lines,
        [
            "open run r depth 0",
            "open r turn 1",
            "open r a started",
            "open r b started",
            "open r c started",
            "retry r c open true",
            "close r b finished Ok",
            "close r a finished Ok",
            "close r c run ended cancelled",
            "close r turn 1",
            "close run r cancelled model_calls 0 tool_calls 3 last_text None",
        ]
    );
}

#[test]
fn a_run_end_closes_its_model_call_then_its_calls_by_turn_then_its_turn() {
    let mut steps = Steps::default();
    let mut tracker = feed(
        &mut steps,
        &[
            run_started("r", None),
            request("r", 1),
            response("r", 1, "calling"),
            tool_started("r", 1, "z"),
            event("r", 2, EventKind::TurnStarted),
            tool_started("r", 2, "a"),
            request("r", 2),
        ],
    );
    steps.lines.clear();
    tracker.on_event(&run_finished("r", StopReason::Finished), &mut steps);
    assert_eq!(
        steps.lines,
        [
            "close r m1 run ended finished",
            "close r z run ended finished",
            "close r a run ended finished",
            "close r turn 2",
            "close run r finished model_calls 2 tool_calls 2 last_text Some(\"calling\")",
        ]
    );
    assert_eq!(tracker.open_runs(), 0);
}

#[test]
fn a_rejected_call_opens_and_closes_at_once_and_abandoning_closes_every_run() {
    let mut steps = Steps::default();
    let mut tracker = feed(
        &mut steps,
        &[
            run_started("r", None),
            event(
                "r",
                1,
                EventKind::ToolRejected {
                    call_id: "c".into(),
                    tool: "t".into(),
                    code: "tool.denied".into(),
                    reason: "no".into(),
                    outcome: CallOutcome::denied("no"),
                },
            ),
            run_started("s", Some(("r", "c"))),
        ],
    );
    assert_eq!(
        steps.lines,
        [
            "open run r depth 0",
            "open r turn 1",
            "open r c started",
            "close r c rejected tool.denied",
            "open run s depth 1 under r/-",
        ]
    );
    steps.lines.clear();
    tracker.abandon_all(&mut steps);
    assert_eq!(
        steps.lines,
        [
            "close r turn 1",
            "close run r abandoned model_calls 0 tool_calls 1 last_text None",
            "close run s abandoned model_calls 0 tool_calls 0 last_text None",
        ]
    );
    assert_eq!(tracker.open_runs(), 0);
}
