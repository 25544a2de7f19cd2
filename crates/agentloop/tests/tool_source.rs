//! A tool source whose tools change during a run (as an MCP server's do after
//! `tools/list_changed`): the machine takes the new specs at the next turn boundary, validates
//! later calls against them and sends them to the model; the driver finds their handlers by name;
//! a replay of the step log reproduces the run, the new tools included, with no source at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::driver::{RunLog, StepLog, replay};
use agentloop::machine::{Action, Input, RunMachine, RunStart, Seams, Step};
use agentloop::tool::{RefreshFuture, ToolSource, ToolSpec};
use agentloop::{
    Agent, CallOutcome, CallStatus, EventKind, Message, ModelResponse, RunOptions, StopReason,
    Tool, ToolOutput, ids::SequentialIds, testing::FunctionModel,
};
use serde_json::{Value, json};

/// A source whose list the test (or one of its tools) replaces; `refresh` reports a change once.
#[derive(Default)]
struct Listed {
    tools: Mutex<Vec<Tool>>,
    changed: AtomicBool,
    output: Mutex<Vec<String>>,
}

impl Listed {
    fn set(&self, tools: Vec<Tool>) {
        *self.tools.lock().unwrap() = tools;
        self.changed.store(true, Ordering::Release);
    }
}

impl ToolSource for Listed {
    fn tools(&self) -> Vec<Tool> {
        self.tools.lock().unwrap().clone()
    }
    fn refresh(&self) -> RefreshFuture<'_> {
        let changed = self.changed.swap(false, Ordering::AcqRel);
        Box::pin(async move { changed })
    }
    fn take_output(&self) -> Vec<(String, Vec<String>)> {
        let lines = std::mem::take(&mut *self.output.lock().unwrap());
        vec![("src".to_owned(), lines)]
    }
}

fn echo(name: &str, schema: Value) -> Tool {
    let tag = name.to_owned();
    Tool::dynamic(
        name,
        format!("{name} echoes."),
        schema,
        move |a: Value, _c| {
            let tag = tag.clone();
            async move { Ok(ToolOutput::json(json!({"tool": tag, "args": a}))) }
        },
    )
}

fn object() -> Value {
    json!({"type": "object"})
}

fn needs_n() -> Value {
    json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
}

fn spec(tool: &Tool) -> ToolSpec {
    tool.spec().clone()
}

fn tool_names(tools: &[ToolSpec]) -> Vec<&str> {
    tools.iter().map(|s| s.name.as_str()).collect()
}

/// Answers the model call the machine asks for, checking the tools it offers.
fn respond(m: &mut RunMachine, log: &mut Vec<Step>, offered: &[&str], response: ModelResponse) {
    let Action::CallModel(request) = m.action() else {
        panic!("expected a model call, got {:?}", m.action())
    };
    assert_eq!(tool_names(request.tools), offered);
    let input = Input::ModelResponded {
        response: Box::new(response),
        cost: None,
        failures: Vec::new(),
    };
    m.feed_logged(step(input), log);
}

fn step(input: Input) -> Step {
    Step {
        at: Duration::ZERO,
        input,
    }
}

/// Starts and finishes every call of the batch with `ok`; the positions that ran.
fn run_batch(m: &mut RunMachine, log: &mut Vec<Step>) -> Vec<usize> {
    let mut started = Vec::new();
    let mut ran = Vec::new();
    loop {
        match m.action() {
            Action::StartCall(call) => {
                let position = call.position;
                started.push(position);
                m.feed_logged(step(Input::CallStarted { position }), log);
            }
            Action::AwaitCalls { .. } => {
                let position = started.remove(0);
                ran.push(position);
                let input = Input::CallFinished {
                    position,
                    outcome: CallOutcome::ok(ToolOutput::text("ok")),
                    failures: Vec::new(),
                };
                m.feed_logged(step(input), log);
            }
            _ => return ran,
        }
    }
}

#[test]
fn the_machine_switches_tool_sets_between_turns_and_a_replay_reproduces_it() {
    let source = Arc::new(Listed::default());
    let old = echo("old", object());
    let new = echo("new", needs_n());
    source.set(vec![old.clone()]);
    let agent = Agent::builder()
        .model(FunctionModel::new(|_| Ok(ModelResponse::text("unused"))))
        .tool(echo("own", object()))
        .tool_source(source.clone())
        .build()
        .unwrap();
    let seams = Seams {
        dynamic_tools: true,
        ..Seams::default()
    };
    let start = || RunStart {
        run_id: Arc::from("r"),
        ids: Arc::new(SequentialIds::default()),
        seams,
        limits: None,
        transcript: Vec::new(),
        input: Some(Message::user("go")),
        observed: true,
    };
    let mut m = RunMachine::new(Arc::clone(agent.config()), start());
    let mut log = Vec::new();

    // Turn 1: the source's tools are the ones the agent was built with.
    assert!(matches!(m.action(), Action::ListTools));
    m.feed_logged(step(Input::ToolsListed { tools: None }), &mut log);
    respond(
        &mut m,
        &mut log,
        &["own", "old"],
        ModelResponse::tool_calls([("c1", "old", "{}")]),
    );
    assert_eq!(run_batch(&mut m, &mut log), vec![0]);

    // Turn 2: the source lists `new` instead of `old`.
    assert!(
        matches!(m.action(), Action::ListTools),
        "each turn asks again"
    );
    m.feed_logged(
        step(Input::ToolsListed {
            tools: Some(vec![spec(&new)]),
        }),
        &mut log,
    );
    let changed: Vec<EventKind> = m.drain_events().map(|(_, k)| k).collect();
    assert!(
        changed.iter().any(|k| matches!(k,
            EventKind::ToolsChanged { added, removed, .. } if *added == ["new"] && *removed == ["old"])),
        "{changed:?}"
    );
    respond(
        &mut m,
        &mut log,
        &["own", "new"],
        ModelResponse::tool_calls([
            ("c2", "old", "{}"),
            ("c3", "new", r#"{"n": "x"}"#),
            ("c4", "new", r#"{"n": 4}"#),
            ("c5", "own", "{}"),
        ]),
    );
    // The vanished tool is unknown and the new schema is the one that judges: only the valid
    // call of `new` and the agent's own tool run.
    assert_eq!(run_batch(&mut m, &mut log), vec![2, 3]);
    m.feed_logged(step(Input::ToolsListed { tools: None }), &mut log);
    respond(
        &mut m,
        &mut log,
        &["own", "new"],
        ModelResponse::text("done"),
    );
    assert!(matches!(m.action(), Action::Finish));
    let out = m.into_outcome(Duration::ZERO);
    assert_eq!(out.stop_reason, StopReason::Finished);
    let status = |id: &str| {
        let r = out.tool_calls.iter().find(|r| &*r.call_id == id).unwrap();
        (r.outcome.status, r.outcome.code.clone())
    };
    assert_eq!(
        status("c2"),
        (CallStatus::Rejected, Some("unknown_tool".into()))
    );
    assert_eq!(
        status("c3"),
        (CallStatus::Rejected, Some("invalid_arguments".into()))
    );
    assert_eq!(status("c4").0, CallStatus::Ok);

    // The log alone rebuilds the run: the new specs travel in it, no source is asked.
    let run_log = RunLog {
        run_id: "r".into(),
        seams,
        limits: None,
        transcript: Vec::new(),
        input: Some(Message::user("go")),
        steps: log,
    };
    let text = serde_json::to_string(&run_log).unwrap();
    let back: RunLog = serde_json::from_str(&text).unwrap();
    let replayed = replay(Arc::clone(agent.config()), &back);
    assert_eq!(replayed.transcript, out.transcript);
    assert_eq!(replayed.tool_calls, out.tool_calls);
}

#[test]
fn a_log_without_the_flag_never_asks_for_tools() {
    // Old logs and journals have no `dynamic_tools`: it reads as false, and the turn starts with
    // the model call as it always did.
    let seams: Seams = serde_json::from_value(json!({
        "input_guardrails": false, "output_guardrails": false, "hooks": false,
        "gates": 0, "steering": false, "skip_tools": false
    }))
    .unwrap();
    assert!(!seams.dynamic_tools);
    assert!(
        !serde_json::to_string(&seams)
            .unwrap()
            .contains("dynamic_tools")
    );
}

#[tokio::test]
async fn a_tool_added_during_a_run_is_offered_and_runs_from_the_next_turn() {
    let source = Arc::new(Listed::default());
    // `grow` adds `fresh` to its own source, as a server announces tools/list_changed.
    let grow = {
        let source = Arc::downgrade(&source);
        Tool::dynamic("grow", "Adds fresh.", object(), move |_a: Value, _c| {
            let source = source.clone();
            async move {
                if let Some(s) = source.upgrade() {
                    let mut tools = s.tools();
                    tools.push(echo("fresh", needs_n()));
                    s.output.lock().unwrap().push("grow: added fresh".into());
                    s.set(tools);
                }
                Ok(ToolOutput::text("added"))
            }
        })
    };
    source.set(vec![grow]);
    let offered = Arc::new(Mutex::new(Vec::<Vec<String>>::new()));
    let model = {
        let offered = Arc::clone(&offered);
        FunctionModel::new(move |req| {
            let mut seen = offered.lock().unwrap();
            seen.push(req.tools.iter().map(|s| s.name.clone()).collect());
            Ok(match seen.len() {
                1 => ModelResponse::tool_calls([("g", "grow", "{}")]),
                2 => ModelResponse::tool_calls([("f", "fresh", r#"{"n": 1}"#)]),
                _ => ModelResponse::text("done"),
            })
        })
    };
    let events = Arc::new(Mutex::new(Vec::new()));
    let agent = {
        let events = Arc::clone(&events);
        Agent::builder()
            .model(model)
            .tool_source(source.clone())
            .sink(move |e: &agentloop::Event| events.lock().unwrap().push(e.clone()))
            .build()
            .unwrap()
    };
    assert!(agent.seams(&RunOptions::default()).dynamic_tools);
    let log = StepLog::new();
    let out = agent
        .run_with(
            Vec::new(),
            Some(Message::user("go")),
            RunOptions {
                log: Some(log.clone()),
                ..RunOptions::default()
            },
        )
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(
        *offered.lock().unwrap(),
        vec![
            vec!["grow".to_owned()],
            vec!["grow".to_owned(), "fresh".to_owned()],
            vec!["grow".to_owned(), "fresh".to_owned()],
        ]
    );
    let fresh = out.tool_calls.iter().find(|r| &*r.call_id == "f").unwrap();
    assert_eq!(fresh.outcome.status, CallStatus::Ok, "{:?}", fresh.outcome);
    assert_eq!(
        fresh.outcome.content.to_text(),
        json!({"tool": "fresh", "args": {"n": 1}}).to_string()
    );
    let events = events.lock().unwrap();
    let changed: Vec<(u32, &EventKind)> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolsChanged { .. }))
        .map(|e| (e.turn, &e.kind))
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(
        matches!(changed[0], (2, EventKind::ToolsChanged { added, removed, .. }) if *added == ["fresh"] && removed.is_empty()),
        "{changed:?}"
    );
    assert!(
        events.iter().any(|e| matches!(&e.kind,
            EventKind::ToolSourceOutput { origin, lines } if origin == "src" && *lines == ["grow: added fresh"])),
        "the source's output is an event"
    );
    let replayed = replay(Arc::clone(agent.config()), &log.take().unwrap());
    assert_eq!(replayed.transcript, out.transcript);
    assert_eq!(replayed.tool_calls, out.tool_calls);
}

/// `fresh`, which `grow` adds: idempotent, as `grow` is.
fn fresh_tool() -> Tool {
    Tool::builder("fresh")
        .description("Echoes.")
        .idempotent(true)
        .dynamic(needs_n(), |a: Value, _c| async move {
            Ok(ToolOutput::json(json!({"tool": "fresh", "args": a})))
        })
}

/// A source whose `grow` adds `fresh` (once), as a server announces tools/list_changed; `grown`:
/// it lists `fresh` already (a server that kept it while the run's process was gone).
fn growing_source(grown: bool) -> Arc<Listed> {
    let source = Arc::new(Listed::default());
    let weak = Arc::downgrade(&source);
    let grow = Tool::builder("grow")
        .description("Adds fresh.")
        .idempotent(true)
        .dynamic(object(), move |_a: Value, _c| {
            let weak = weak.clone();
            async move {
                if let Some(s) = weak.upgrade() {
                    let mut tools = s.tools();
                    if !tools.iter().any(|t| t.spec().name == "fresh") {
                        tools.push(fresh_tool());
                        s.set(tools);
                    }
                }
                Ok(ToolOutput::text("added"))
            }
        });
    let mut tools = vec![grow];
    if grown {
        tools.push(fresh_tool());
    }
    source.set(tools);
    source
}

/// A model that answers from the conversation alone (so a resumed run's calls match): `grow`,
/// then `fresh`, then done; and records the tools each call offered.
fn conversation_model(offered: Arc<Mutex<Vec<Vec<String>>>>) -> FunctionModel {
    FunctionModel::new(move |req| {
        offered
            .lock()
            .unwrap()
            .push(req.tools.iter().map(|s| s.name.clone()).collect());
        let answered = req
            .messages
            .iter()
            .filter(|m| m.as_assistant().is_some())
            .count();
        Ok(match answered {
            0 => ModelResponse::tool_calls([("g", "grow", "{}")]),
            1 => ModelResponse::tool_calls([("f", "fresh", r#"{"n": 1}"#)]),
            _ => ModelResponse::text("done"),
        })
    })
}

#[tokio::test]
async fn a_journaled_run_whose_tools_changed_resumes_from_any_step_to_the_same_transcript() {
    use common::journal::Memory;

    let offered = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder()
        .model(conversation_model(Arc::clone(&offered)))
        .tool_source(growing_source(false))
        .build()
        .unwrap();
    let journal = Arc::new(Memory::default());
    let base = agent
        .run_with(
            Vec::new(),
            Some(Message::user("go")),
            RunOptions {
                journal: Some(journal.clone()),
                ..RunOptions::default()
            },
        )
        .await;
    assert_eq!(base.stop_reason, StopReason::Finished, "{:?}", base.error);
    assert_eq!(
        *offered.lock().unwrap(),
        [vec!["grow"], vec!["grow", "fresh"], vec!["grow", "fresh"]]
    );
    let total = journal.steps.lock().unwrap().len();
    for n in 0..=total {
        let run = journal.cut(n);
        let offered = Arc::new(Mutex::new(Vec::new()));
        let fresh_agent = Agent::builder()
            .model(conversation_model(Arc::clone(&offered)))
            .tool_source(growing_source(true))
            .build()
            .unwrap();
        let again = Arc::new(Memory::default());
        *again.header.lock().unwrap() = Some(run.header.clone());
        *again.steps.lock().unwrap() = run.steps.clone();
        let options = RunOptions {
            journal: Some(again),
            ..RunOptions::default()
        };
        let resumed = fresh_agent.resume(run, options, false).await.unwrap();
        assert_eq!(
            resumed.stop_reason,
            StopReason::Finished,
            "cut at {n}: {:?}",
            resumed.error
        );
        assert_eq!(resumed.transcript, base.transcript, "cut at {n}");
        assert_eq!(resumed.tool_calls.len(), 2, "cut at {n}");
        for call in &resumed.tool_calls {
            assert_eq!(call.outcome.status, CallStatus::Ok, "cut at {n}: {call:?}");
        }
    }
}

/// A tool named `name` that answers `said`: two of one name tell by their answers which ran.
fn saying(name: &str, said: &'static str, mutating: bool) -> Tool {
    Tool::builder(name)
        .description(format!("Answers {said}."))
        .mutating(mutating)
        .dynamic(object(), move |_a: Value, _c| async move {
            Ok(ToolOutput::text(said))
        })
}

/// A model that calls `grow`, then `lookup`, then is done; and the run's events.
async fn grow_then_lookup(source: Arc<Listed>) -> (agentloop::RunOutcome, Vec<agentloop::Event>) {
    let model = FunctionModel::new(move |req| {
        let answered = req
            .messages
            .iter()
            .filter(|m| m.as_assistant().is_some())
            .count();
        Ok(match answered {
            0 => ModelResponse::tool_calls([("g", "grow", "{}")]),
            1 => ModelResponse::tool_calls([("l", "lookup", "{}")]),
            _ => ModelResponse::text("done"),
        })
    });
    let events = Arc::new(Mutex::new(Vec::new()));
    let agent = {
        let events = Arc::clone(&events);
        Agent::builder()
            .model(model)
            .tool_source(source)
            .sink(move |e: &agentloop::Event| events.lock().unwrap().push(e.clone()))
            .build()
            .unwrap()
    };
    let out = agent
        .run_with(Vec::new(), Some(Message::user("go")), RunOptions::default())
        .await;
    let events = events.lock().unwrap().clone();
    (out, events)
}

/// `grow`, which lists `tools` after it in its source (as a server that announces
/// tools/list_changed); `fixed` is listed from the start.
fn growing_into(fixed: Vec<Tool>, later: Vec<Tool>) -> Arc<Listed> {
    let source = Arc::new(Listed::default());
    let weak = Arc::downgrade(&source);
    let grow = Tool::dynamic("grow", "Adds tools.", object(), move |_a: Value, _c| {
        let (weak, later) = (weak.clone(), later.clone());
        async move {
            if let Some(s) = weak.upgrade() {
                let mut tools = s.tools();
                tools.extend(later);
                s.set(tools);
            }
            Ok(ToolOutput::text("grown"))
        }
    });
    let mut tools = vec![grow];
    tools.extend(fixed);
    source.set(tools);
    source
}

fn lookup_call(out: &agentloop::RunOutcome) -> &CallOutcome {
    &out.tool_calls
        .iter()
        .find(|r| &*r.call_id == "l")
        .expect("the lookup call")
        .outcome
}

fn refused(events: &[agentloop::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolsChanged { refused, .. } => Some(refused.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn collide_a_tool_listed_later_under_a_taken_name_never_runs_in_place_of_the_first() {
    // A trusted read-only `lookup`, then one of the same name that another origin adds during the
    // run: the model and the gates have the first's spec, so the first's handler must run.
    let source = growing_into(
        vec![saying("lookup", "first", false)],
        vec![saying("lookup", "second", true)],
    );
    let (out, events) = grow_then_lookup(source).await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    let call = lookup_call(&out);
    assert_eq!(call.status, CallStatus::Ok, "{call:?}");
    assert_eq!(
        call.content.to_text(),
        "first",
        "the later tool's handler ran"
    );
    let refused = refused(&events);
    assert!(
        refused.len() == 1 && refused[0].starts_with("lookup: "),
        "the later one is refused, and said so: {refused:?}"
    );
}

#[tokio::test]
async fn collide_two_tools_of_one_name_listed_at_build_run_the_first_and_the_second_is_refused() {
    // Both listed when the agent is built: the agent builds (a source's list is not the
    // application's to fix), the run reports the second at its first turn, the first runs.
    let source = growing_into(
        vec![
            saying("lookup", "first", false),
            saying("lookup", "second", true),
        ],
        Vec::new(),
    );
    let (out, events) = grow_then_lookup(source).await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{:?}", out.error);
    assert_eq!(lookup_call(&out).content.to_text(), "first");
    // Said at the first turn (and again at each listing after, `grow` relisting).
    let first = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::ToolsChanged { .. }))
        .unwrap();
    assert!(
        matches!(&first.kind, EventKind::ToolsChanged { added, refused, .. }
            if first.turn == 1 && added.is_empty() && refused.len() == 1
                && refused[0].starts_with("lookup: ")),
        "{first:?}"
    );
}

#[tokio::test]
async fn collide_a_name_whose_first_tool_is_refused_is_not_given_to_a_later_one() {
    // The first `lookup` has a schema no tool may have: the catalog refuses it. A later `lookup`
    // does not take its place: both are refused, so no call runs a handler whose spec the model
    // never saw.
    let bad = Tool::dynamic(
        "lookup",
        "Bad schema.",
        json!({"type": "object", "properties": {"a": {"type": 12}}}),
        |_a: Value, _c| async { Ok(ToolOutput::text("bad")) },
    );
    let source = growing_into(Vec::new(), vec![bad, saying("lookup", "second", false)]);
    let (out, events) = grow_then_lookup(source).await;
    let call = lookup_call(&out);
    assert_eq!(call.status, CallStatus::Rejected, "{call:?}");
    assert_eq!(call.code.as_deref(), Some("unknown_tool"), "{call:?}");
    let refused = refused(&events);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused.iter().all(|r| r.starts_with("lookup: ")),
        "{refused:?}"
    );
}
