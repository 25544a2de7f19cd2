#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! Durable runs in the library: a run journaled into memory, cut at every step as a crash would
//! cut it, and resumed by a fresh agent (`Agent::resume`); a journal that fails; a changed agent.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentloop::journal::JournalError;
use agentloop::message::ToolResult;
use agentloop::testing::ScriptedModel;
use agentloop::{Agent, Limits, Message, RunOptions, StopReason, Tool, ToolOutput};
use common::calls;
use common::journal::Memory;
use serde_json::{Value, json};

struct Counts {
    idem: Arc<AtomicUsize>,
    once: Arc<AtomicUsize>,
}

fn counter(name: &str, idempotent: bool, n: &Arc<AtomicUsize>) -> Tool {
    let n = n.clone();
    let name_owned = name.to_owned();
    Tool::builder(name)
        .description("Counts.")
        .idempotent(idempotent)
        .dynamic(json!({"type": "object"}), move |a: Value, _c| {
            let n = n.clone();
            let name = name_owned.clone();
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::text(format!("{name} {a}")))
            }
        })
}

fn script() -> Vec<agentloop::ModelResponse> {
    vec![
        calls(&[("a", "idem", r#"{"k":1}"#), ("b", "once", r#"{"k":2}"#)]),
        calls(&[("c", "once", r#"{"k":3}"#), ("d", "idem", r#"{"k":4}"#)]),
        agentloop::ModelResponse::text("done"),
    ]
}

fn agent(skip: usize, version: &str) -> (Agent, Counts) {
    agent_with(skip, version, |b| b)
}

/// [`agent`], its builder passed through `more` first (a sink, say).
fn agent_with(
    skip: usize,
    version: &str,
    more: impl FnOnce(agentloop::AgentBuilder) -> agentloop::AgentBuilder,
) -> (Agent, Counts) {
    let counts = Counts {
        idem: Arc::new(AtomicUsize::new(0)),
        once: Arc::new(AtomicUsize::new(0)),
    };
    let builder = Agent::builder()
        .model(ScriptedModel::new(script()).skip(skip))
        .tool(counter("idem", true, &counts.idem))
        .tool(counter("once", false, &counts.once))
        .limits(Limits::default())
        .version(version);
    (more(builder).build().unwrap(), counts)
}

/// The run stopped at its journal, which wrote the batch (`batches`) and kept `at` steps:
/// failed, no call ran, every call answered.
fn assert_stopped_before_any_call(
    out: &agentloop::RunOutcome,
    journal: &Memory,
    batches: &[usize],
    at: u64,
    counts: &Counts,
) {
    assert_eq!(*journal.batches.lock().unwrap(), batches);
    assert_eq!(
        journal.steps.lock().unwrap().len() as u64,
        at,
        "the steps before the failed one are kept, no more"
    );
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.as_ref().unwrap().code(), "journal.write");
    let ran = counts.idem.load(Ordering::SeqCst) + counts.once.load(Ordering::SeqCst);
    assert_eq!(ran, 0, "no call runs once the run stopped at its journal");
    common::assert_tool_cycle(&out.transcript);
}

/// A run of `agent` on "go", journaled in `journal`.
async fn journaled(agent: &Agent, journal: Arc<Memory>) -> agentloop::RunOutcome {
    let options = RunOptions {
        journal: Some(journal),
        ..RunOptions::default()
    };
    agent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await
}

/// A journal that fails from the step `after` steps past the first step that `is` (in a run of
/// the test's agent whose journal holds everything), and that step's number.
async fn failing_at(is: fn(&agentloop::machine::Input) -> bool, after: u64) -> (Arc<Memory>, u64) {
    let whole = Arc::new(Memory::default());
    let (agent, _) = agent(0, "1");
    journaled(&agent, whole.clone()).await;
    let first = whole
        .steps
        .lock()
        .unwrap()
        .iter()
        .position(|s| is(&s.input));
    let at = first.unwrap() as u64 + after;
    let journal = Memory {
        fail_at: Some(at),
        ..Memory::default()
    };
    (Arc::new(journal), at)
}

fn results(transcript: &[Message]) -> Vec<&ToolResult> {
    transcript
        .iter()
        .filter_map(Message::as_tool_result)
        .collect()
}

#[tokio::test]
async fn a_run_cut_at_any_step_resumes_without_running_a_finished_call_again() {
    let journal = Arc::new(Memory::default());
    let (whole, counts) = agent(0, "1");
    let options = RunOptions {
        journal: Some(journal.clone()),
        ..RunOptions::default()
    };
    let base = whole
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(base.stop_reason, StopReason::Finished);
    assert_eq!(counts.idem.load(Ordering::SeqCst), 2);
    assert_eq!(counts.once.load(Ordering::SeqCst), 2);
    let total = journal.steps.lock().unwrap().len();
    for n in 0..=total {
        let run = journal.cut(n);
        // The script is not told where to go on: the resume asks the model (`Model::resumed`).
        let (fresh, counts) = agent(0, "1");
        let again = Arc::new(Memory::default());
        *again.header.lock().unwrap() = Some(run.header.clone());
        *again.steps.lock().unwrap() = run.steps.clone();
        let options = RunOptions {
            journal: Some(again.clone()),
            ..RunOptions::default()
        };
        let resumed = fresh.resume(run, options, false).await.unwrap();
        assert_eq!(resumed.stop_reason, StopReason::Finished, "cut at {n}");
        assert_eq!(resumed.run_id, base.run_id);
        assert_eq!(resumed.usage, base.usage, "usage goes on from the journal");
        assert_eq!(resumed.model_calls, base.model_calls);
        assert_eq!(resumed.transcript.len(), base.transcript.len());
        let mut interrupted = 0;
        for (b, r) in results(&base.transcript)
            .into_iter()
            .zip(results(&resumed.transcript))
        {
            if r.content.to_text().starts_with("interrupted:") {
                assert_eq!(&*r.tool, "once", "cut at {n}: only a non-idempotent call");
                interrupted += 1;
            } else {
                assert_eq!(b, r, "cut at {n}");
            }
        }
        // Each call ran once in all: in the first process (its result journaled), or in this one.
        let once_now = counts.once.load(Ordering::SeqCst);
        assert!(
            once_now + interrupted <= 2,
            "cut at {n}: a non-idempotent call ran twice"
        );
        assert!(counts.idem.load(Ordering::SeqCst) <= 2, "cut at {n}");
    }
}

#[tokio::test]
async fn a_journal_that_fails_stops_the_run_with_its_error() {
    let journal = Arc::new(Memory {
        fail_at: Some(2),
        ..Memory::default()
    });
    let (agent, _) = agent(0, "1");
    let out = journaled(&agent, journal.clone()).await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    let error = out.error.unwrap();
    assert_eq!(error.code(), "journal.write");
    assert!(error.to_string().contains("disk full"), "{error}");
    assert_eq!(
        journal.steps.lock().unwrap().len(),
        2,
        "nothing after the failed write"
    );
}

#[tokio::test]
async fn a_cancel_during_the_call_started_write_starts_no_handler() {
    let cancel = agentloop::CancellationToken::new();
    let journal = Arc::new(Memory {
        cancel_at_start: Some(cancel.clone()),
        ..Memory::default()
    });
    let counter = Arc::new(AtomicUsize::new(0));
    let agent = common::agent(
        ScriptedModel::new([
            calls(&[("a", "count", r#"{"n": 1}"#), ("b", "count", r#"{"n": 2}"#)]),
            agentloop::model::ModelResponse::text("done"),
        ]),
        vec![common::counting_tool("count", &counter)],
        Limits::default(),
    );
    let options = RunOptions {
        journal: Some(journal),
        cancel: Some(cancel),
        ..RunOptions::default()
    };
    let out = agent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(
        counter.load(Ordering::SeqCst),
        0,
        "a handler started after the run was cancelled"
    );
    assert_eq!(out.tool_calls.len(), 2, "every call still has its outcome");
    common::assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn a_journal_that_cannot_record_the_end_never_leaves_the_run_finished() {
    let journal = Arc::new(Memory {
        fail_finish: true,
        ..Memory::default()
    });
    let (agent, _) = agent(0, "1");
    let log = agentloop::driver::StepLog::new();
    let options = RunOptions {
        journal: Some(journal),
        log: Some(log.clone()),
        ..RunOptions::default()
    };
    let out = agent
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    let error = out.error.as_ref().unwrap();
    assert_eq!(error.code(), "journal.write");
    assert!(error.to_string().contains("at the end"), "{error}");
    // The failed last write is a step of the run, so a replay of its log ends the same way.
    let log = log.take().unwrap();
    assert!(matches!(
        log.steps.last().map(|s| &s.input),
        Some(agentloop::machine::Input::JournalFailed { .. })
    ));
    let replayed = agentloop::driver::replay(Arc::clone(agent.config()), &log);
    assert_eq!(replayed.stop_reason, StopReason::Failed);
    assert_eq!(replayed.error, out.error);
}

#[tokio::test]
async fn a_suspension_the_journal_cannot_record_fails_the_run_rather_than_saying_suspended() {
    // A run whose suspension was not written has nothing waiting to approve: "suspended" (exit 8)
    // would send its user to `approve`, which finds the run still running.
    use agentloop::permissions::{Permission, PermissionGate, PermissionStore};
    for fail_suspend in [false, true] {
        let journal = Arc::new(Memory {
            fail_suspend,
            ..Memory::default()
        });
        let counter = Arc::new(AtomicUsize::new(0));
        let agent = Agent::builder()
            .model(ScriptedModel::new([
                calls(&[("a", "count", r#"{"n": 1}"#)]),
                agentloop::model::ModelResponse::text("done"),
            ]))
            .tool(common::counting_tool("count", &counter))
            .gate(Arc::new(PermissionGate::new(PermissionStore::new(
                Permission::Ask,
            ))))
            .build()
            .unwrap();
        let options = RunOptions {
            journal: Some(journal),
            ..RunOptions::default()
        };
        let out = agent
            .run_with(Vec::new(), Some(Message::user("go")), options)
            .await;
        assert_eq!(
            counter.load(Ordering::SeqCst),
            0,
            "the asked call never ran"
        );
        if fail_suspend {
            assert_eq!(out.stop_reason, StopReason::Failed);
            assert_eq!(out.error.as_ref().unwrap().code(), "journal.write");
        } else {
            assert_eq!(out.stop_reason, StopReason::Suspended, "{:?}", out.error);
        }
    }
}

#[tokio::test]
async fn a_completed_call_whose_record_failed_is_reported_completed_and_the_run_fails() {
    // Where the first call's result is written.
    let (journal, _) = failing_at(
        |i| matches!(i, agentloop::machine::Input::CallFinished { .. }),
        0,
    )
    .await;
    let (agent_b, counts) = agent(0, "1");
    let out = journaled(&agent_b, journal).await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(out.error.as_ref().unwrap().code(), "journal.write");
    let ran = counts.idem.load(Ordering::SeqCst) + counts.once.load(Ordering::SeqCst);
    assert!(ran >= 1, "a call ran");
    let completed: Vec<_> = out
        .tool_calls
        .iter()
        .filter(|c| {
            c.outcome
                .diagnostic
                .as_deref()
                .is_some_and(|d| d.contains("not recorded in the journal"))
        })
        .collect();
    assert_eq!(completed.len(), 1, "{:#?}", out.tool_calls);
    assert_eq!(
        completed[0].outcome.status,
        agentloop::outcome::CallStatus::Ok,
        "a call that completed is not reported cancelled"
    );
    common::assert_tool_cycle(&out.transcript);
}

#[tokio::test]
async fn a_response_the_journal_could_not_keep_starts_no_call() {
    // The response that asks for the calls is written with their starts, in one write: that
    // write fails at the response itself.
    let (journal, at) = failing_at(
        |i| matches!(i, agentloop::machine::Input::ModelResponded { .. }),
        0,
    )
    .await;
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = events.clone();
    let (agent_b, counts) = agent_with(0, "1", |b| {
        b.sink(move |e: &agentloop::Event| seen.lock().unwrap().push(e.kind.clone()))
    });
    let out = journaled(&agent_b, journal.clone()).await;
    // The response and its two starts, in one write; none of it kept.
    assert_stopped_before_any_call(&out, &journal, &[3], at, &counts);
    let events = events.lock().unwrap();
    assert!(
        !events
            .iter()
            .any(|k| matches!(k, agentloop::EventKind::ToolStarted { .. })),
        "{events:#?}"
    );
}

#[tokio::test]
async fn a_start_the_journal_could_not_keep_runs_no_call_of_its_batch() {
    // The response and the batch's two starts go to the journal together; the second start
    // fails.
    let (journal, at) = failing_at(
        |i| matches!(i, agentloop::machine::Input::CallStarted { .. }),
        1,
    )
    .await;
    let (agent_b, counts) = agent(0, "1");
    let out = journaled(&agent_b, journal.clone()).await;
    // The response and the first start are kept.
    assert_stopped_before_any_call(&out, &journal, &[3], at, &counts);
}

#[tokio::test]
async fn a_changed_agent_is_refused_unless_forced() {
    let journal = Arc::new(Memory::default());
    let (first, _) = agent(0, "1");
    let options = RunOptions {
        journal: Some(journal.clone()),
        ..RunOptions::default()
    };
    first
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    let (changed, _) = agent(1, "2");
    let refused = changed
        .resume(journal.cut(3), RunOptions::default(), false)
        .await
        .unwrap_err();
    match &refused {
        JournalError::Changed { changes, .. } => assert_eq!(changes, &["/version"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(refused.code(), "journal.changed");
    let forced = changed
        .resume(journal.cut(3), RunOptions::default(), true)
        .await
        .unwrap();
    assert_eq!(forced.stop_reason, StopReason::Finished);
}

#[tokio::test]
async fn the_clock_goes_on_from_the_journal() {
    let limits = Limits {
        timeout: Some(std::time::Duration::from_secs(5)),
        ..Limits::default()
    };
    let make = |skip: usize| {
        Agent::builder()
            .model(ScriptedModel::new(script()).skip(skip))
            .tool(counter("idem", true, &Arc::default()))
            .tool(counter("once", false, &Arc::default()))
            .limits(limits.clone())
            .build()
            .unwrap()
    };
    let journal = Arc::new(Memory::default());
    let options = RunOptions {
        journal: Some(journal.clone()),
        ..RunOptions::default()
    };
    let whole = make(0)
        .run_with(Vec::new(), Some(Message::user("go")), options)
        .await;
    assert_eq!(whole.stop_reason, StopReason::Finished);
    // As if the first process had worked for six seconds before it died.
    let mut run = journal.cut(3);
    for step in run.steps.iter_mut() {
        step.at = std::time::Duration::from_secs(6);
    }
    let skip = run.model_calls();
    let out = make(skip)
        .resume(run, RunOptions::default(), false)
        .await
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Deadline);
    assert!(out.duration >= std::time::Duration::from_secs(6));
}

#[tokio::test]
async fn calls_that_start_or_finish_together_are_journaled_together_and_resume_the_same() {
    // Two calls that can only finish together: each waits for the other at a barrier.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let meet = |name: &str| {
        let barrier = barrier.clone();
        Tool::builder(name).description("Meets the other.").dynamic(
            json!({"type": "object"}),
            move |_a: Value, _c| {
                let barrier = barrier.clone();
                async move {
                    barrier.wait().await;
                    Ok(ToolOutput::text("met"))
                }
            },
        )
    };
    let build = |skip: usize| {
        Agent::builder()
            .model(
                ScriptedModel::new(vec![
                    calls(&[("a", "left", "{}"), ("b", "right", "{}")]),
                    agentloop::ModelResponse::text("done"),
                ])
                .skip(skip),
            )
            .tool(meet("left"))
            .tool(meet("right"))
            .build()
            .unwrap()
    };
    let journal = Arc::new(Memory::default());
    let base = journaled(&build(0), journal.clone()).await;
    assert_eq!(base.stop_reason, StopReason::Finished);
    assert_eq!(
        *journal.batches.lock().unwrap(),
        [3, 2],
        "the response and its two starts went to the journal in one write, and so did the two \
         results"
    );
    let steps = journal.steps.lock().unwrap().clone();
    let count =
        |f: fn(&agentloop::machine::Input) -> bool| steps.iter().filter(|s| f(&s.input)).count();
    assert_eq!(
        count(|i| matches!(i, agentloop::machine::Input::CallStarted { .. })),
        2
    );
    assert_eq!(
        count(|i| matches!(i, agentloop::machine::Input::CallFinished { .. })),
        2
    );
    // The journal, fed to a fresh machine, is the run: nothing was fed that it does not hold.
    let mut run = journal.cut(steps.len());
    run.status = agentloop::journal::RunStatus::Running;
    let again = Arc::new(Memory::default());
    *again.header.lock().unwrap() = Some(run.header.clone());
    *again.steps.lock().unwrap() = run.steps.clone();
    let options = RunOptions {
        journal: Some(again),
        ..RunOptions::default()
    };
    let replayed = build(0).resume(run, options, false).await.unwrap();
    assert_eq!(replayed.transcript, base.transcript);
    assert_eq!(replayed.usage, base.usage);
}

#[tokio::test]
async fn a_call_starting_alone_whose_start_the_journal_lost_never_runs_and_the_run_fails_on_the_journal()
 {
    // Two calls may run at once: the third starts alone, once the first is done, while the
    // second still runs; the journal fails at that start.
    let ran = Arc::new(AtomicUsize::new(0));
    let slow_done = Arc::new(AtomicUsize::new(0));
    let build = |ran: &Arc<AtomicUsize>, slow_done: &Arc<AtomicUsize>| {
        let done = slow_done.clone();
        Agent::builder()
            .model(ScriptedModel::new(vec![
                calls(&[
                    ("a", "once", r#"{"k":1}"#),
                    ("b", "slow", "{}"),
                    ("c", "once", r#"{"k":3}"#),
                ]),
                agentloop::ModelResponse::text("done"),
            ]))
            .tool(counter("once", false, ran))
            .tool(Tool::builder("slow").description("Slow.").dynamic(
                json!({"type": "object"}),
                move |_a: Value, _c| {
                    let done = done.clone();
                    async move {
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        done.fetch_add(1, Ordering::SeqCst);
                        Ok(ToolOutput::text("slow done"))
                    }
                },
            ))
            .limits(Limits {
                max_concurrency: 2,
                ..Limits::default()
            })
            .build()
            .unwrap()
    };
    let whole = Arc::new(Memory::default());
    let out = journaled(&build(&ran, &slow_done), whole.clone()).await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    let starts: Vec<usize> = whole
        .steps
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.input, agentloop::machine::Input::CallStarted { .. }))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(starts.len(), 3);

    let (ran, slow_done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let journal = Arc::new(Memory {
        fail_at: Some(starts[2] as u64),
        ..Memory::default()
    });
    let out = journaled(&build(&ran, &slow_done), journal.clone()).await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(
        out.error.as_ref().unwrap().code(),
        "journal.write",
        "{:?}",
        out.error
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the call whose start was lost never ran"
    );
    assert_eq!(
        slow_done.load(Ordering::SeqCst),
        1,
        "the call still running was given its grace period"
    );
    assert_eq!(
        journal.steps.lock().unwrap().len(),
        starts[2],
        "the steps before the lost start are kept"
    );
    common::assert_tool_cycle(&out.transcript);
}
