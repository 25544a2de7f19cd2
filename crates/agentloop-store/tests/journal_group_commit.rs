#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! The journal's writer under concurrent runs: many runs of one process journaled into one
//! file, through handles of their own or one shared handle, at each durability level, commit
//! every step in order with the hash chain intact (the writer commits what is ready together);
//! a write that fails inside a group fails alone; and a fork copies a run's steps up to a step
//! into a new run, leaving the first one's rows as they were.

use std::sync::Arc;

mod support;

use agentloop::journal::{Definition, Journal, JournalError};
use agentloop::machine::Input;
use agentloop::model::ModelRequest;
use agentloop::testing::FunctionModel;
use agentloop::{Agent, Message, ModelResponse, RunOptions, StopReason, Tool, ToolError};
use agentloop_store::{Durability, ForkOrigin, JournalReader, SqliteJournal};
use support::{header, step, temp_dir};

const TURNS: u32 = 4;
const CALLS: u32 = 3;

/// An agent of `TURNS` turns of `CALLS` parallel calls, then an answer; the model keeps no
/// state (it reads the turn from the last result's id), so runs of it can run at once.
fn agent() -> Agent {
    let model = FunctionModel::new(|request: &ModelRequest<'_>| {
        let turn = match request.messages.last() {
            Some(Message::Tool(result)) => result
                .call_id
                .strip_prefix('t')
                .and_then(|rest| rest.split('_').next())
                .and_then(|t| t.parse::<u32>().ok())
                .map_or(u32::MAX, |t| t + 1),
            _ => 0,
        };
        if turn >= TURNS {
            return Ok(ModelResponse::text("done"));
        }
        Ok(ModelResponse::tool_calls((0..CALLS).map(|k| {
            (
                format!("t{turn}_{k}"),
                "echo",
                format!(r#"{{"turn":{turn},"k":{k}}}"#),
            )
        })))
    });
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Args {
        turn: u32,
        k: u32,
    }
    let tool = Tool::builder("echo")
        .description("Says which call it was.")
        .handler(|args: Args, _ctx| async move {
            tokio::task::yield_now().await;
            Ok::<_, ToolError>(format!("{}/{}", args.turn, args.k))
        });
    Agent::builder()
        .name("group")
        .model(model)
        .tool(tool)
        .build()
        .unwrap()
}

/// `runs` runs at once into one file, at `durability`; each through a handle of its own when
/// `own_handles`, else all through one. Returns the file.
fn run_concurrently(name: &str, runs: usize, durability: Durability, own_handles: bool) {
    let dir = temp_dir(name);
    let path = dir.join("runs.db");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let agent = agent();
    let shared = Arc::new(
        SqliteJournal::open(&path)
            .unwrap()
            .with_durability(durability),
    );
    let outcomes = rt.block_on(async {
        let tasks: Vec<_> = (0..runs)
            .map(|_| {
                let agent = agent.clone();
                let journal = if own_handles {
                    Arc::new(
                        SqliteJournal::open(&path)
                            .unwrap()
                            .with_durability(durability),
                    )
                } else {
                    shared.clone()
                };
                tokio::spawn(async move {
                    let options = RunOptions {
                        journal: Some(journal as Arc<dyn Journal>),
                        ..RunOptions::default()
                    };
                    agent
                        .run_with(Vec::new(), Some(Message::user("go")), options)
                        .await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        outcomes
    });
    let reader = JournalReader::open(&path).unwrap();
    let listed = reader.runs().unwrap();
    assert_eq!(listed.len(), runs, "{name}: every run is in the file");
    for outcome in &outcomes {
        assert_eq!(outcome.stop_reason, StopReason::Finished, "{outcome:?}");
        assert_eq!(outcome.tool_calls_run, TURNS * CALLS);
        let entry = listed.iter().find(|r| r.run_id == outcome.run_id).unwrap();
        assert_eq!(entry.status, "finished", "{name}");
        // Every step is there, in order, each row's sum chained over the ones before it.
        let run = reader.load(&outcome.run_id).unwrap();
        assert_eq!(run.steps.len() as u64, entry.steps);
        let model_answers = run
            .steps
            .iter()
            .filter(|s| matches!(s.input, Input::ModelResponded { .. }))
            .count();
        assert_eq!(model_answers as u32, TURNS + 1, "{name}");
        let finished = run
            .steps
            .iter()
            .filter(|s| matches!(s.input, Input::CallFinished { .. }))
            .count();
        assert_eq!(finished as u32, TURNS * CALLS, "{name}");
        let mut at = std::time::Duration::ZERO;
        for step in &run.steps {
            assert!(step.at >= at, "{name}: steps in the order they happened");
            at = step.at;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_runs_sharing_a_file_journal_every_step_in_order_at_power() {
    run_concurrently("group-power-own", 40, Durability::Power, true);
    run_concurrently("group-power-shared", 40, Durability::Power, false);
}

#[test]
fn concurrent_runs_sharing_a_file_journal_every_step_in_order_at_process() {
    run_concurrently("group-process-own", 40, Durability::Process, true);
    run_concurrently("group-process-shared", 40, Durability::Process, false);
}

#[test]
fn a_write_that_fails_inside_a_group_fails_alone() {
    let dir = temp_dir("group-isolated");
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    futures::executor::block_on(async {
        for id in ["a", "b", "c"] {
            journal.begin(&header(id)).await.unwrap();
        }
        let (s0, s5) = (step(0), step(5));
        // Sent at once (each write is queued when asked for), answered together.
        let a = journal.append("a", 0, &s0);
        let b = journal.append("b", 5, &s5);
        let c = journal.append("c", 0, &s0);
        let unknown = journal.append("nobody", 0, &s0);
        let (a, b, c, unknown) = futures::join!(a, b, c, unknown);
        a.unwrap();
        c.unwrap();
        assert!(
            matches!(&b, Err(JournalError::Io { message }) if message.contains("out of order")),
            "{b:?}"
        );
        assert!(
            matches!(unknown, Err(JournalError::UnknownRun { .. })),
            "{unknown:?}"
        );
        // The refused run goes on from where it was.
        journal.append("b", 0, &s0).await.unwrap();
    });
    let reader = JournalReader::open(&path).unwrap();
    for id in ["a", "b", "c"] {
        assert_eq!(reader.load(id).unwrap().steps, vec![step(0)], "{id}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_last_step_written_with_the_end_is_kept_with_it_or_not_at_all() {
    let dir = temp_dir("group-last-step");
    let path = dir.join("runs.db");
    let answer = Agent::builder()
        .model(FunctionModel::new(|_: &ModelRequest<'_>| {
            Ok(ModelResponse::text("done"))
        }))
        .build()
        .unwrap();
    for durability in [Durability::Process, Durability::Power] {
        let journal = SqliteJournal::open(&path)
            .unwrap()
            .with_durability(durability);
        let (a, b) = (format!("a-{durability:?}"), format!("b-{durability:?}"));
        futures::executor::block_on(async {
            let outcome = answer.run("go").await;
            for id in [&a, &b] {
                journal.begin(&header(id)).await.unwrap();
                journal.append(id, 0, &step(0)).await.unwrap();
            }
            journal
                .append_and_finish(&a, 1, &step(1), &outcome)
                .await
                .unwrap();
            // Out of order: neither the step nor the end is kept.
            let refused = journal.append_and_finish(&b, 5, &step(5), &outcome).await;
            assert!(
                matches!(&refused, Err(JournalError::Io { message }) if message.contains("out of order")),
                "{refused:?}"
            );
        });
        let reader = JournalReader::open(&path).unwrap();
        let run = reader.load(&a).unwrap();
        assert_eq!(run.steps, vec![step(0), step(1)]);
        assert_eq!(run.status.as_str(), "finished");
        let run = reader.load(&b).unwrap();
        assert_eq!(run.steps, vec![step(0)]);
        assert_eq!(run.status.as_str(), "running", "the end went with its step");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every row of run `id`, as the file holds it.
fn rows(path: &std::path::Path, id: &str) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut out: Vec<(String, String)> = conn
        .prepare("SELECT header || status || COALESCE(stop_reason, ''), header_sum FROM runs WHERE run_id = ?1")
        .unwrap()
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let steps = conn
        .prepare("SELECT seq || ':' || step, sum FROM steps WHERE run_id = ?1 ORDER BY seq")
        .unwrap()
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect::<Vec<_>>();
    out.extend(steps);
    out
}

#[test]
fn a_fork_copies_the_steps_up_to_its_step_and_leaves_the_first_run_as_it_was() {
    let dir = temp_dir("fork-store");
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    futures::executor::block_on(async {
        journal.begin(&header("first")).await.unwrap();
        for n in 0..6 {
            journal.append("first", n, &step(n)).await.unwrap();
        }
    });
    let before = rows(&path, "first");
    let mut changed = Definition::new();
    changed.set("version", serde_json::json!("2"));
    let forked =
        futures::executor::block_on(journal.fork("first", 2, "second", Some(changed.clone())))
            .unwrap();
    assert_eq!(forked.header.run_id, "second");
    assert_eq!(forked.header.definition, changed);
    assert_eq!(forked.header.fingerprint, changed.fingerprint());
    assert_eq!(forked.steps, vec![step(0), step(1), step(2)]);
    // It goes on like any run: its next step is 3.
    futures::executor::block_on(journal.append("second", 3, &step(30))).unwrap();
    assert_eq!(
        rows(&path, "first"),
        before,
        "the first run's rows are untouched"
    );

    let reader = JournalReader::open(&path).unwrap();
    let loaded = reader.load("second").unwrap();
    assert_eq!(loaded.steps, vec![step(0), step(1), step(2), step(30)]);
    let listed = reader.runs().unwrap();
    let second = listed.iter().find(|r| r.run_id == "second").unwrap();
    assert_eq!(
        second.forked_from,
        Some(ForkOrigin {
            run_id: "first".into(),
            step: 2
        })
    );
    assert_eq!(second.status, "running");
    let first = listed.iter().find(|r| r.run_id == "first").unwrap();
    assert_eq!(first.forked_from, None);

    // No such step, no such run, a taken id: refused, nothing written.
    let past = futures::executor::block_on(journal.fork("first", 6, "third", None));
    assert!(
        matches!(&past, Err(JournalError::NotResumable { reason, .. }) if reason.contains("no step 6")),
        "{past:?}"
    );
    let unknown = futures::executor::block_on(journal.fork("nobody", 0, "fourth", None));
    assert!(
        matches!(unknown, Err(JournalError::UnknownRun { .. })),
        "{unknown:?}"
    );
    let taken = futures::executor::block_on(journal.fork("first", 0, "second", None));
    assert!(taken.is_err());
    assert_eq!(reader.runs().unwrap().len(), 2);
    assert_eq!(reader.load("second").unwrap().steps.len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
