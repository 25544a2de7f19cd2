//! Compaction: a conversation that would pass its context budget is compacted before the model
//! call, keeping the latest turns whole and every call with its result.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::sync::{Arc, Mutex};

use agentloop::compaction::{
    self, Compaction, CompactionPolicy, SUMMARY_INSTRUCTIONS, estimate, is_summary,
};
use agentloop::model::{ModelError, ModelRequest, Usage};
use agentloop::session::check_transcript;
use agentloop::testing::FunctionModel;
use agentloop::{Agent, EventKind, Message, ModelResponse, StopReason, Tool, ToolOutput};
use serde_json::{Value, json};

const LOOKUPS: usize = 6;

/// A tool whose every result is 600 bytes: a few of them pass a small budget.
fn lookup() -> Tool {
    Tool::dynamic(
        "lookup",
        "Looks a key up.",
        json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
        |args: Value, _ctx| async move {
            let key = args["key"].as_str().unwrap_or_default().to_owned();
            Ok(ToolOutput::text(format!("{key}: {}", "x".repeat(600))))
        },
    )
}

#[derive(Default)]
struct Seen {
    /// Each turn request's estimate, and its messages.
    turns: Vec<(u64, Vec<Message>)>,
    /// What each summary call read.
    summaries: Vec<String>,
    /// The tokens each call reported, in call order.
    spent: Vec<u64>,
}

/// How the model answers a summary call.
#[derive(Clone, Copy, PartialEq)]
enum Summary {
    Short,
    Fails,
    /// Far longer than anything it could replace, as a small model's looping text.
    Rambles,
}

/// A model that looks up `LOOKUPS` keys, one a turn, then answers; asked for a summary, it
/// writes one (or fails, when `summary_fails`). With `usage`, each response reports it; an input
/// count of 0 there stands for the request's own estimate.
fn model(seen: &Arc<Mutex<Seen>>, summary_fails: bool, usage: Option<Usage>) -> FunctionModel {
    let summary = if summary_fails {
        Summary::Fails
    } else {
        Summary::Short
    };
    model_with(seen, summary, usage)
}

fn model_with(seen: &Arc<Mutex<Seen>>, summary: Summary, usage: Option<Usage>) -> FunctionModel {
    let seen = Arc::clone(seen);
    FunctionModel::new(move |req: &ModelRequest<'_>| {
        let mut s = seen.lock().unwrap();
        if req.instructions == Some(SUMMARY_INSTRUCTIONS) {
            assert!(req.tools.is_empty(), "a summary call offers no tools");
            s.summaries.push(req.messages[0].text());
            if summary == Summary::Fails {
                return Err(ModelError::new(
                    agentloop::model::ModelErrorKind::Server,
                    "the summarizer is down",
                ));
            }
            if summary == Summary::Rambles {
                let ramble = "The assistant looked keys up. ".repeat(2000);
                return Ok(report(&mut s, req, usage, ModelResponse::text(ramble)));
            }
            let response = ModelResponse::text(
                "The user asked for keys k0.. to be looked up; each was x-filled.",
            );
            return Ok(report(&mut s, req, usage, response));
        }
        s.turns.push((estimate(req), req.messages.to_vec()));
        let done = req
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(a) if !a.tool_calls.is_empty()))
            .count()
            + req
                .messages
                .first()
                .filter(|m| is_summary(m))
                .map_or(0, |_| 100);
        let made = s.turns.len() - 1;
        let response = if made < LOOKUPS && done < 100 + LOOKUPS {
            ModelResponse::tool_calls([(
                format!("c{made}"),
                "lookup".to_owned(),
                json!({"key": format!("k{made}")}).to_string(),
            )])
        } else {
            ModelResponse::text("done")
        };
        Ok(report(&mut s, req, usage, response))
    })
}

fn report(
    s: &mut Seen,
    req: &ModelRequest<'_>,
    usage: Option<Usage>,
    response: ModelResponse,
) -> ModelResponse {
    let Some(mut u) = usage else {
        return response;
    };
    if u.input_tokens == 0 {
        u.input_tokens = estimate(req);
    }
    s.spent.push(u.total_tokens());
    response.with_usage(u)
}

fn agent(model: FunctionModel, compaction: Option<Compaction>) -> Agent {
    let b = Agent::builder()
        .model(model)
        .instructions("Look things up.")
        .tool(lookup());
    match compaction {
        Some(c) => b.compaction(c),
        None => b.without_compaction(),
    }
    .build()
    .unwrap()
}

/// The run without compaction, and its largest request's estimate.
async fn uncompacted() -> (agentloop::RunOutcome, u64) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let plain = agent(model(&seen, false, None), None)
        .run("look up six keys")
        .await;
    assert_eq!(plain.stop_reason, StopReason::Finished);
    let peak = seen
        .lock()
        .unwrap()
        .turns
        .iter()
        .map(|t| t.0)
        .max()
        .unwrap();
    (plain, peak)
}

fn budget(c: &Compaction) -> u64 {
    c.budget(&Default::default())
}

#[tokio::test]
async fn a_summary_replaces_the_older_part_keeping_the_latest_turns_and_every_pair() {
    let (plain, peak) = uncompacted().await;

    let c = Compaction::new(peak / 2 + 100)
        .reserve_tokens(100)
        .keep_turns(2);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let events = common::Events::default();
    let compacted = Agent::builder()
        .model(model(&seen, false, None))
        .instructions("Look things up.")
        .tool(lookup())
        .compaction(c.clone())
        .sink(events.sink())
        .build()
        .unwrap()
        .run("look up six keys")
        .await;
    assert_eq!(compacted.stop_reason, StopReason::Finished, "{compacted:?}");
    assert_eq!(compacted.output.as_deref(), Some("done"));

    // Every request the model saw for a turn fits the budget.
    let seen = seen.lock().unwrap();
    for (tokens, _) in &seen.turns {
        assert!(*tokens <= budget(&c), "{tokens} > {}", budget(&c));
    }
    assert!(!compacted.compactions.is_empty());
    assert_eq!(seen.summaries.len(), compacted.compactions.len());
    let first = &compacted.compactions[0];
    assert_eq!(first.policy, CompactionPolicy::Summarize);
    assert!(first.tokens_after < first.tokens_before);
    // The summary call read the older part (the first lookups) and none of the kept turns.
    assert!(
        seen.summaries[0].contains("k0: xxx"),
        "{}",
        seen.summaries[0]
    );
    assert!(seen.summaries[0].contains("look up six keys"));

    // The transcript starts with the summary, sends every call with its result, and ends with
    // the same latest turns as the run without compaction.
    let t = &compacted.transcript;
    assert!(is_summary(&t[0]));
    check_transcript(t).unwrap();
    common::assert_tool_cycle(t);
    let tail = 5; // the last lookup (call + result) and the answer, and the turn before
    assert_eq!(
        t[t.len() - tail..],
        plain.transcript[plain.transcript.len() - tail..]
    );

    // Nothing is lost: undoing the compactions gives the uncompacted conversation.
    assert_eq!(
        compaction::expand(t, &compacted.compactions),
        plain.transcript
    );
    assert!(compacted.new_messages_from <= t.len());

    // The event says what was replaced.
    let compactions: Vec<_> = events
        .all()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Compacted {
                policy,
                messages_replaced,
                replaced,
                summary,
                ..
            } => Some((policy, messages_replaced, replaced, summary)),
            _ => None,
        })
        .collect();
    assert_eq!(compactions.len(), compacted.compactions.len());
    assert_eq!(compactions[0].0, "summarize");
    assert_eq!(compactions[0].1, first.replaced.len());
    assert_eq!(compactions[0].2[0], Message::user("look up six keys"));
    assert!(compactions[0].3.as_deref().unwrap().contains("looked up"));
}

#[tokio::test]
async fn dropping_tool_results_keeps_each_call_answered_and_the_latest_turns_whole() {
    let (plain, peak) = uncompacted().await;
    let c = Compaction::new(peak / 2 + 100)
        .reserve_tokens(100)
        .policy(CompactionPolicy::DropToolResults)
        .keep_turns(1);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = agent(model(&seen, false, None), Some(c.clone()))
        .run("look up six keys")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{out:?}");
    let seen = seen.lock().unwrap();
    assert!(seen.summaries.is_empty(), "no summary call");
    for (tokens, _) in &seen.turns {
        assert!(*tokens <= budget(&c), "{tokens} > {}", budget(&c));
    }
    assert!(!out.compactions.is_empty());
    let t = &out.transcript;
    check_transcript(t).unwrap();
    assert_eq!(
        t.len(),
        plain.transcript.len(),
        "no message goes, only bodies"
    );
    let dropped = t
        .iter()
        .filter(|m| m.text() == compaction::DROPPED_RESULT)
        .count();
    assert!(dropped > 0);
    // The latest turn keeps its result.
    assert_eq!(
        t[t.len() - 3..],
        plain.transcript[plain.transcript.len() - 3..]
    );
    assert_eq!(compaction::expand(t, &out.compactions), plain.transcript);
}

/// The run's first compaction dropped tool results instead of summarizing, saying `why`.
fn assert_fell_back(out: &agentloop::RunOutcome, why: &str) {
    let first = &out.compactions[0];
    assert_eq!(first.policy, CompactionPolicy::DropToolResults);
    let fallback = first.fallback.as_deref().unwrap_or_default();
    assert!(fallback.contains(why), "{first:?}");
}

#[tokio::test]
async fn a_failed_summary_falls_back_to_dropping_tool_results() {
    let (plain, peak) = uncompacted().await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = agent(
        model(&seen, true, None),
        Some(Compaction::new(peak / 2 + 100).reserve_tokens(100)),
    )
    .run("look up six keys")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{out:?}");
    assert!(!seen.lock().unwrap().summaries.is_empty());
    assert_fell_back(&out, "summarizer is down");
    check_transcript(&out.transcript).unwrap();
    assert_eq!(
        compaction::expand(&out.transcript, &out.compactions),
        plain.transcript
    );
}

#[tokio::test]
async fn a_summary_is_a_model_call_and_is_not_made_without_room_for_the_turns_own() {
    let (_, peak) = uncompacted().await;
    let c = Compaction::new(peak / 2 + 100).reserve_tokens(100);
    let run = |max_model_calls: Option<u32>, seen: &Arc<Mutex<Seen>>| {
        let agent = Agent::builder()
            .model(model(seen, false, None))
            .tool(lookup())
            .instructions("Look things up.")
            .compaction(c.clone())
            .limits(agentloop::Limits {
                max_model_calls,
                ..Default::default()
            })
            .build()
            .unwrap();
        async move { agent.run("look up six keys").await }
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let free = run(None, &seen).await;
    assert_eq!(free.stop_reason, StopReason::Finished, "{free:?}");
    let (turns, summaries) = {
        let s = seen.lock().unwrap();
        (s.turns.len(), s.summaries.len())
    };
    assert!(summaries > 0);
    assert_eq!(
        free.model_calls as usize,
        turns + summaries,
        "every call counts"
    );

    // Room for the turns before the first compaction and that turn's own call, not for a
    // summary too: the compaction drops tool results instead, and the limit holds.
    let k = free.compactions[0].turn;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let tight = run(Some(k), &seen).await;
    let s = seen.lock().unwrap();
    assert!(s.summaries.is_empty(), "{:?}", s.summaries);
    assert_eq!(s.turns.len() as u32, tight.model_calls);
    assert!(tight.model_calls <= k);
    assert_fell_back(&tight, "max_model_calls");
    check_transcript(&tight.transcript).unwrap();
}

#[tokio::test]
async fn the_providers_own_count_decides_when_it_reports_one() {
    // Each response reports 5000 input tokens: far more than the text's estimate.
    let usage = Usage {
        input_tokens: 5000,
        output_tokens: 10,
        ..Usage::default()
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = agent(
        model(&seen, false, Some(usage)),
        Some(Compaction::new(4000).reserve_tokens(0).keep_turns(1)),
    )
    .run("look up six keys")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{out:?}");
    // The first request's estimate is small; the second's, on the provider's count, is over the
    // budget but holds only the latest turn; the third compacts.
    assert!(!out.compactions.is_empty());
    assert_eq!(out.compactions[0].turn, 3);
    assert!(out.compactions[0].tokens_before >= 5000);
}

#[tokio::test]
async fn a_conversation_within_its_budget_is_never_compacted() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = agent(model(&seen, false, None), Some(Compaction::new(1_000_000)))
        .run("look up six keys")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert!(out.compactions.is_empty());
    assert!(seen.lock().unwrap().summaries.is_empty());
}

#[tokio::test]
async fn a_summary_counts_against_the_token_budget() {
    let usage = Usage {
        output_tokens: 10,
        ..Usage::default()
    };
    let (_, peak) = uncompacted().await;
    let c = Compaction::new(peak / 2 + 100).reserve_tokens(100);
    let run = |limits: agentloop::Limits, seen: &Arc<Mutex<Seen>>| {
        let agent = Agent::builder()
            .model(model(seen, false, Some(usage)))
            .tool(lookup())
            .instructions("Look things up.")
            .compaction(c.clone())
            .limits(limits)
            .build()
            .unwrap();
        async move { agent.run("look up six keys").await }
    };
    let free_seen = Arc::new(Mutex::new(Seen::default()));
    let free = run(agentloop::Limits::default(), &free_seen).await;
    assert_eq!(free.stop_reason, StopReason::Finished, "{free:?}");
    let spent = free_seen.lock().unwrap().spent.clone();
    assert_eq!(
        free.usage.total_tokens(),
        spent.iter().sum::<u64>(),
        "the summaries count too"
    );
    // Room for the calls before the first compaction, and not for the summary too.
    let k = free.compactions[0].turn as usize;
    let before: u64 = spent[..k - 1].iter().sum();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let limited = run(
        agentloop::Limits {
            max_tokens: Some(before + 1),
            ..Default::default()
        },
        &seen,
    )
    .await;
    assert_eq!(limited.stop_reason, StopReason::Budget, "{limited:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.summaries.len(), 1);
    assert_eq!(
        seen.turns.len(),
        k - 1,
        "the turn's call after the summary never went"
    );
    check_transcript(&limited.transcript).unwrap();
}

#[tokio::test]
async fn a_summary_longer_than_what_it_replaces_falls_back_to_dropping_results() {
    let (plain, peak) = uncompacted().await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = agent(
        model_with(&seen, Summary::Rambles, None),
        Some(Compaction::new(peak / 2 + 100).reserve_tokens(100)),
    )
    .run("look up six keys")
    .await;
    assert_eq!(out.stop_reason, StopReason::Finished, "{out:?}");
    assert!(!seen.lock().unwrap().summaries.is_empty());
    let first = &out.compactions[0];
    assert_eq!(first.policy, CompactionPolicy::DropToolResults);
    assert!(
        first.fallback.as_deref().unwrap().contains("no shorter"),
        "{first:?}"
    );
    assert!(
        !out.transcript.iter().any(is_summary),
        "the rambling summary is not kept"
    );
    check_transcript(&out.transcript).unwrap();
    assert_eq!(
        compaction::expand(&out.transcript, &out.compactions),
        plain.transcript
    );
}
