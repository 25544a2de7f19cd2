//! A model answer that fails part-way through its stream, on every API, over raw loopback HTTP
//! (the server controls every byte: it streams part of an answer, then drops the connection or
//! sends the API's own in-stream error). Under the [`Retry`] layer, a transient failure is retried
//! like one before the first byte: the run's answer is the next attempt's alone, the events say
//! that what streamed was discarded (`model_retrying`, after the partial deltas), and the tokens
//! the provider reported for the abandoned attempt count beside the answer's. A failure that
//! outlasts the attempts ends the run with the model's error; a non-transient one is not retried.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::model::{Discarded, Usage};
use agentloop::{
    Agent, Event, EventKind, Limits, Message, Model, Price, PriceTable, RetryPolicy, RunOutcome,
    StopReason, Tool, ToolOutput,
};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_chat::OpenAiChat;
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{Fallback, Retry};
use tokio::io::AsyncWriteExt;

mod support;
use support::raw_http::serve_each;

/// What the failed attempt streamed before it failed.
const PARTIAL: &str = "Half an ans";
/// The answer of the attempt that succeeds.
const ANSWER: &str = "The whole answer.";

/// One reply of the server.
#[derive(Clone)]
enum Reply {
    /// The body, and the stream closed properly.
    Whole(Vec<u8>),
    /// The body, then the connection dropped mid-stream (no closing chunk).
    Dropped(Vec<u8>),
}

/// A server answering its requests in order with `replies` (the last one again once they run
/// out); the count says how many requests it read.
async fn serve(replies: Vec<Reply>) -> (String, Arc<AtomicUsize>) {
    serve_each(move |mut socket, n| {
        let reply = replies[n.min(replies.len() - 1)].clone();
        async move {
            let (body, whole) = match reply {
                Reply::Whole(b) => (b, true),
                Reply::Dropped(b) => (b, false),
            };
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket
                .write_all(format!("{:x}\r\n", body.len()).as_bytes())
                .await;
            let _ = socket.write_all(&body).await;
            let _ = socket.write_all(b"\r\n").await;
            let _ = socket.flush().await;
            if whole {
                let _ = socket.write_all(b"0\r\n\r\n").await;
                let _ = socket.flush().await;
            } else {
                // The client reads the deltas before the connection goes.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
    .await
}

/// Server-sent events, each `(name, data)`; a `None` name sends the data alone.
fn sse(events: &[(Option<&str>, String)]) -> Vec<u8> {
    let mut out = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    out.into_bytes()
}

/// One API's streams: part of an answer, the API's in-stream errors, a whole answer.
struct Api {
    name: &'static str,
    /// The start of an answer and its first text.
    partial: Vec<(Option<&'static str>, String)>,
    /// The API's in-stream error of a transient kind, and its code as the run reports it.
    transient: (Vec<(Option<&'static str>, String)>, &'static str),
    /// The API's in-stream error of a kind no retry mends, and its code.
    fatal: (Vec<(Option<&'static str>, String)>, &'static str),
    /// A whole answer.
    whole: Vec<(Option<&'static str>, String)>,
    /// The tokens the failed attempt's stream reported (none on the OpenAI APIs: their usage
    /// comes at the end), and the whole answer's.
    partial_usage: Usage,
    whole_usage: Usage,
    model: fn(&str) -> Box<dyn Model>,
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

fn anthropic() -> Api {
    let start = |input: u64| {
        format!(
            r#"{{"type":"message_start","message":{{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-3-opus-latest","stop_reason":null,"usage":{{"input_tokens":{input},"output_tokens":1}}}}}}"#
        )
    };
    let block =
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
    let delta = |t: &str| {
        format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{t}"}}}}"#
        )
    };
    let error = |kind: &str| {
        vec![(
            Some("error"),
            format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"said {kind}"}}}}"#),
        )]
    };
    Api {
        name: "anthropic",
        partial: vec![
            (Some("message_start"), start(10)),
            (Some("content_block_start"), block.to_owned()),
            (Some("content_block_delta"), delta("Half ")),
            (Some("content_block_delta"), delta("an ans")),
        ],
        transient: (error("overloaded_error"), "model.overloaded"),
        fatal: (error("invalid_request_error"), "model.invalid_request"),
        whole: vec![
            (Some("message_start"), start(12)),
            (Some("content_block_start"), block.to_owned()),
            (Some("content_block_delta"), delta("The whole ")),
            (Some("content_block_delta"), delta("answer.")),
            (
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":0}"#.to_owned(),
            ),
            (
                Some("message_delta"),
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}"#.to_owned(),
            ),
            (
                Some("message_stop"),
                r#"{"type":"message_stop"}"#.to_owned(),
            ),
        ],
        partial_usage: usage(10, 1),
        whole_usage: usage(12, 5),
        model: |uri| {
            Box::new(
                Anthropic::builder("claude-3-opus-latest")
                    .base_url(uri)
                    .api_key("sk-ant-test")
                    .build()
                    .unwrap(),
            )
        },
    }
}

fn chat() -> Api {
    let chunk = |delta: &str, finish: &str| {
        format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{{"index":0,"delta":{delta},"finish_reason":{finish}}}]}}"#
        )
    };
    // OpenRouter's error chunk after the response was committed (see the quirk
    // `chat-openrouter-error-chunk-mid-stream`).
    let error = |code: &str| {
        vec![(
            None,
            format!(
                r#"{{"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{{"index":0,"delta":{{"content":""}},"finish_reason":"error"}}],"error":{{"code":"{code}","message":"said {code}"}}}}"#
            ),
        )]
    };
    Api {
        name: "openai chat",
        partial: vec![
            (None, chunk(r#"{"role":"assistant","content":"Half "}"#, "null")),
            (None, chunk(r#"{"content":"an ans"}"#, "null")),
        ],
        transient: (error("server_error"), "model.server_error"),
        fatal: (error("authentication_error"), "model.authentication"),
        whole: vec![
            (None, chunk(r#"{"role":"assistant","content":"The whole "}"#, "null")),
            (None, chunk(r#"{"content":"answer."}"#, "null")),
            (None, chunk("{}", r#""stop""#)),
            (
                None,
                r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#.to_owned(),
            ),
            (None, "[DONE]".to_owned()),
        ],
        partial_usage: Usage::default(),
        whole_usage: usage(12, 5),
        model: |uri| {
            Box::new(
                OpenAiChat::builder("gpt-4.1-mini")
                    .base_url(uri)
                    .api_key("sk-test")
                    .build()
                    .unwrap(),
            )
        },
    }
}

fn responses() -> Api {
    let created = r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","model":"gpt-4.1-mini","output":[]}}"#;
    let item = r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}"#;
    let part = r#"{"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#;
    let delta = |t: &str| {
        format!(
            r#"{{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"{t}"}}"#
        )
    };
    let failed = |code: &str| {
        vec![(
            Some("response.failed"),
            format!(
                r#"{{"type":"response.failed","response":{{"id":"resp_1","status":"failed","error":{{"code":"{code}","message":"said {code}"}}}}}}"#
            ),
        )]
    };
    let opening = |t: &str, u: &str| {
        vec![
            (Some("response.created"), created.to_owned()),
            (Some("response.output_item.added"), item.to_owned()),
            (Some("response.content_part.added"), part.to_owned()),
            (Some("response.output_text.delta"), delta(t)),
            (Some("response.output_text.delta"), delta(u)),
        ]
    };
    let mut whole = opening("The whole ", "answer.");
    whole.push((
        Some("response.completed"),
        r#"{"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1-mini","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"The whole answer.","annotations":[]}]}],"usage":{"input_tokens":12,"output_tokens":5,"total_tokens":17}}}"#.to_owned(),
    ));
    Api {
        name: "openai responses",
        partial: opening("Half ", "an ans"),
        transient: (failed("server_error"), "model.server_error"),
        fatal: (failed("invalid_request_error"), "model.invalid_request"),
        whole,
        partial_usage: Usage::default(),
        whole_usage: usage(12, 5),
        model: |uri| {
            Box::new(
                OpenAiResponses::builder("gpt-4.1-mini")
                    .base_url(uri)
                    .api_key("sk-test")
                    .build()
                    .unwrap(),
            )
        },
    }
}

fn apis() -> [Api; 3] {
    [anthropic(), chat(), responses()]
}

/// A run of the API's model under a fast three-attempt retry, against `replies`: its outcome,
/// its events, and how many requests the server read.
async fn run(api: &Api, replies: Vec<Reply>) -> (RunOutcome, Vec<Event>, usize) {
    let (uri, count) = serve(replies).await;
    let model = Retry::with_policy((api.model)(&uri), fast(3));
    let (outcome, events) = run_model(model, Limits::default()).await;
    (outcome, events, count.load(Ordering::SeqCst))
}

/// A policy of `attempts` with a short backoff and no jitter.
fn fast(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts)
        .with_base_delay(Duration::from_millis(10))
        .with_jitter(0.0)
}

/// A run of `model` within `limits`: its outcome and its events.
async fn run_model(model: impl Model + 'static, limits: Limits) -> (RunOutcome, Vec<Event>) {
    run_with_tools(model, limits, Vec::new()).await
}

/// [`run_model`] with `tools`.
async fn run_with_tools(
    model: impl Model + 'static,
    limits: Limits,
    tools: Vec<Tool>,
) -> (RunOutcome, Vec<Event>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let agent = Agent::builder()
        .model(model)
        .limits(limits)
        .tools(tools)
        .sink(move |e: &Event| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), agent.run("hello"))
        .await
        .expect("the run hung");
    let events = events.lock().unwrap().clone();
    (outcome, events)
}

/// The partial answer followed by `tail`.
fn partial_then(api: &Api, tail: &[(Option<&'static str>, String)]) -> Vec<u8> {
    let mut events = api.partial.clone();
    events.extend_from_slice(tail);
    sse(&events)
}

/// The text deltas' text in order, split where the model was retried.
fn texts_between_retries(events: &[Event]) -> Vec<String> {
    let mut parts = vec![String::new()];
    for e in events {
        match &e.kind {
            EventKind::TextDelta { text } => parts.last_mut().unwrap().push_str(text),
            EventKind::ModelRetrying { .. } => parts.push(String::new()),
            _ => {}
        }
    }
    parts
}

fn retries(events: &[Event]) -> Vec<(u32, String, Discarded, Option<Usage>)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelRetrying {
                retry,
                code,
                discarded,
                usage,
                ..
            } => Some((*retry, code.clone(), *discarded, *usage)),
            _ => None,
        })
        .collect()
}

fn assistant_texts(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .transcript
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => Some(a.text.clone()),
            _ => None,
        })
        .collect()
}

/// The run answers with the second attempt's text alone, told the partial one was discarded.
fn check_retried_answer(api: &Api, outcome: &RunOutcome, events: &[Event], code: &str) {
    let name = api.name;
    assert_eq!(
        outcome.stop_reason,
        StopReason::Finished,
        "{name}: {:?}",
        outcome.error
    );
    assert_eq!(outcome.output.as_deref(), Some(ANSWER), "{name}");
    assert_eq!(assistant_texts(outcome), vec![ANSWER.to_owned()], "{name}");
    assert_eq!(
        texts_between_retries(events),
        vec![PARTIAL.to_owned(), ANSWER.to_owned()],
        "{name}: the partial deltas, the retry, then the answer's"
    );
    let reported = (!api.partial_usage.is_zero()).then_some(api.partial_usage);
    let discarded = Discarded {
        text_chars: PARTIAL.chars().count(),
        ..Discarded::default()
    };
    assert_eq!(
        retries(events),
        vec![(1, code.to_owned(), discarded, reported)],
        "{name}"
    );
    let mut expected = api.whole_usage;
    expected.add(&api.partial_usage);
    assert_eq!(
        outcome.usage, expected,
        "{name}: both attempts' reported tokens, once each"
    );
    let responses: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModelResponse { .. }))
        .collect();
    assert_eq!(responses.len(), 1, "{name}: one response");
    let EventKind::ModelResponse { text, usage, .. } = &responses[0].kind else {
        unreachable!()
    };
    assert_eq!((text.as_str(), *usage), (ANSWER, expected), "{name}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ModelError { .. })),
        "{name}"
    );
}

/// On every API: the first reply `first` makes fails part-way, the second is whole; the run
/// answers with the second's text after two requests, the retry told with `code`.
async fn check_retried(first: fn(&Api) -> Reply, code: fn(&Api) -> &'static str) {
    for api in apis() {
        let replies = vec![first(&api), Reply::Whole(sse(&api.whole))];
        let (outcome, events, requests) = run(&api, replies).await;
        assert_eq!(requests, 2, "{}", api.name);
        check_retried_answer(&api, &outcome, &events, code(&api));
    }
}

#[tokio::test]
async fn a_connection_dropped_mid_answer_is_retried_and_the_partial_text_discarded() {
    check_retried(
        |api| Reply::Dropped(partial_then(api, &[])),
        |_| "model.connection",
    )
    .await;
}

#[tokio::test]
async fn a_stream_that_ends_before_its_answer_is_complete_is_retried() {
    // The body closes properly, but the answer in it never finished.
    check_retried(
        |api| Reply::Whole(partial_then(api, &[])),
        |_| "model.stream",
    )
    .await;
}

#[tokio::test]
async fn a_transient_in_stream_error_after_text_is_retried_and_the_partial_text_discarded() {
    check_retried(
        |api| Reply::Whole(partial_then(api, &api.transient.0)),
        |api| api.transient.1,
    )
    .await;
}

#[tokio::test]
async fn failures_past_the_last_attempt_end_the_run_with_the_model_error() {
    for api in apis() {
        let replies = vec![Reply::Whole(partial_then(&api, &api.transient.0))];
        let (outcome, events, requests) = run(&api, replies).await;
        let name = api.name;
        assert_eq!(requests, 3, "{name}: the policy's three attempts");
        assert_eq!(outcome.stop_reason, StopReason::Failed, "{name}");
        let error = outcome.error.as_ref().expect("an error");
        assert_eq!(error.code(), api.transient.1, "{name}");
        let model_error = error.as_model_error().unwrap();
        assert!(
            model_error.partial,
            "{name}: the last attempt's text had streamed"
        );
        assert_eq!(
            retries(&events).iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![1, 2],
            "{name}"
        );
        assert_eq!(
            texts_between_retries(&events),
            vec![PARTIAL.to_owned(); 3],
            "{name}"
        );
        // The run's tokens: what each failed attempt reported, once each.
        let mut spent = Usage::default();
        for _ in 0..3 {
            spent.add(&api.partial_usage);
        }
        assert_eq!(outcome.usage, spent, "{name}");
        let last = events.last().unwrap();
        let EventKind::RunFinished { usage, .. } = &last.kind else {
            panic!("{name}: {last:?}")
        };
        assert_eq!(*usage, spent, "{name}");
        assert!(
            events.iter().any(
                |e| matches!(&e.kind, EventKind::ModelError { code, .. } if code == api.transient.1)
            ),
            "{name}"
        );
        assert!(assistant_texts(&outcome).is_empty(), "{name}");
    }
}

#[tokio::test]
async fn an_in_stream_error_no_retry_mends_is_not_retried() {
    for api in apis() {
        let replies = vec![
            Reply::Whole(partial_then(&api, &api.fatal.0)),
            Reply::Whole(sse(&api.whole)),
        ];
        let (outcome, events, requests) = run(&api, replies).await;
        let name = api.name;
        assert_eq!(requests, 1, "{name}");
        assert_eq!(outcome.stop_reason, StopReason::Failed, "{name}");
        assert_eq!(
            outcome.error.as_ref().unwrap().code(),
            api.fatal.1,
            "{name}"
        );
        assert!(retries(&events).is_empty(), "{name}");
    }
}

#[tokio::test]
async fn a_fallback_moves_on_after_the_primary_fails_part_way_and_its_text_is_discarded() {
    for api in apis() {
        let name = api.name;
        let (primary, tried) = serve(vec![Reply::Dropped(partial_then(&api, &[]))]).await;
        let (backup, _) = serve(vec![Reply::Whole(sse(&api.whole))]).await;
        let model = Fallback::new(vec![
            Box::new(Retry::with_policy((api.model)(&primary), fast(2))),
            Box::new((api.model)(&backup)),
        ]);
        let (outcome, events) = run_model(model, Limits::default()).await;
        assert_eq!(
            tried.load(Ordering::SeqCst),
            2,
            "{name}: the primary's two attempts"
        );
        assert_eq!(outcome.stop_reason, StopReason::Finished, "{name}");
        assert_eq!(assistant_texts(&outcome), vec![ANSWER.to_owned()], "{name}");
        assert_eq!(
            texts_between_retries(&events),
            vec![PARTIAL.to_owned(), PARTIAL.to_owned(), ANSWER.to_owned()],
            "{name}: the primary's retry, then the fall to the backup"
        );
        let codes: Vec<(u32, String)> = retries(&events).into_iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            codes,
            vec![
                (1, "model.connection".into()),
                (1, "model.connection".into())
            ],
            "{name}"
        );
        let mut expected = api.whole_usage;
        expected.add(&api.partial_usage);
        expected.add(&api.partial_usage);
        assert_eq!(outcome.usage, expected, "{name}");
    }
}

/// The prices of the two models the fallback tests answer as: far apart, so a token priced at
/// the wrong one shows.
fn two_prices() -> PriceTable {
    PriceTable::new()
        .with("claude-3-opus-latest", Price::new(15.0, 75.0))
        .with("gpt-4.1-mini", Price::new(0.4, 1.6))
}

/// What `input` and `output` tokens cost at `price`.
fn at(price: (f64, f64), tokens: Usage) -> f64 {
    (tokens.input_tokens as f64 * price.0 + tokens.output_tokens as f64 * price.1) / 1e6
}

/// A run of `model` priced by `prices`.
async fn run_priced(model: impl Model + 'static, prices: PriceTable) -> RunOutcome {
    let agent = Agent::builder()
        .model(model)
        .pricing(prices)
        .build()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), agent.run("hello"))
        .await
        .expect("the run hung")
}

#[tokio::test]
async fn after_a_fallback_each_attempts_tokens_are_priced_at_its_own_models_rate() {
    // The primary (Claude) streams part of an answer, reports 10 + 1 tokens and drops; the
    // backup (gpt-4.1-mini) answers with 12 + 5. Claude's tokens cost Claude's rate, not the
    // backup's, which would price them 30 times lower.
    let (anthropic, chat) = (anthropic(), chat());
    let (primary, _) = serve(vec![Reply::Dropped(partial_then(&anthropic, &[]))]).await;
    let (backup, _) = serve(vec![Reply::Whole(sse(&chat.whole))]).await;
    let fallback = || Fallback::new(vec![(anthropic.model)(&primary), (chat.model)(&backup)]);
    let outcome = run_priced(fallback(), two_prices()).await;
    assert_eq!(
        outcome.stop_reason,
        StopReason::Finished,
        "{:?}",
        outcome.error
    );
    assert_eq!(outcome.usage, usage(22, 6));
    let expected = at((15.0, 75.0), usage(10, 1)) + at((0.4, 1.6), usage(12, 5));
    assert!(
        (outcome.cost_usd - expected).abs() < 1e-12,
        "{} against {expected}",
        outcome.cost_usd
    );
    assert_eq!(outcome.unpriced_model_calls, 0);

    // With no price for Claude, the call's cost is unknown, as an unpriced answer's would be:
    // never the backup's part alone, as if Claude's tokens were free.
    let backup_only = PriceTable::new().with("gpt-4.1-mini", Price::new(0.4, 1.6));
    let outcome = run_priced(fallback(), backup_only).await;
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(outcome.unpriced_model_calls, 1);
    assert_eq!(outcome.cost_usd, 0.0);
}

#[tokio::test]
async fn a_call_that_fails_after_a_fallback_is_priced_by_the_model_that_spent_the_tokens() {
    // The primary (gpt-4.1-mini, the fallback's own id) drops before it reports any tokens; the
    // backup (Claude) reports 10 + 1 and drops too. The run fails having spent Claude's tokens,
    // at Claude's rate.
    let (anthropic, chat) = (anthropic(), chat());
    let (primary, _) = serve(vec![Reply::Dropped(partial_then(&chat, &[]))]).await;
    let (backup, _) = serve(vec![Reply::Dropped(partial_then(&anthropic, &[]))]).await;
    let outcome = run_priced(
        Fallback::new(vec![(chat.model)(&primary), (anthropic.model)(&backup)]),
        two_prices(),
    )
    .await;
    assert_eq!(outcome.stop_reason, StopReason::Failed);
    assert_eq!(outcome.usage, usage(10, 1));
    let expected = at((15.0, 75.0), usage(10, 1));
    assert!(
        (outcome.cost_usd - expected).abs() < 1e-12,
        "{} against {expected}",
        outcome.cost_usd
    );
}

#[tokio::test]
async fn the_runs_deadline_ends_the_wait_before_a_retry() {
    let api = anthropic();
    let (uri, count) = serve(vec![Reply::Dropped(partial_then(&api, &[]))]).await;
    let slow = RetryPolicy::attempts(3)
        .with_base_delay(Duration::from_secs(30))
        .with_jitter(0.0);
    let limits = Limits {
        timeout: Some(Duration::from_millis(500)),
        ..Limits::default()
    };
    let started = std::time::Instant::now();
    let (outcome, events) = run_model(Retry::with_policy((api.model)(&uri), slow), limits).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        outcome.stop_reason,
        StopReason::Deadline,
        "{:?}",
        outcome.error
    );
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "no retry after the deadline"
    );
    assert_eq!(
        retries(&events).len(),
        1,
        "the retry was announced, with its 30 s wait"
    );
}

#[tokio::test]
async fn the_tokens_an_abandoned_attempt_reported_count_toward_the_token_budget() {
    // The retried answer calls a tool. Its own tokens (12 + 5) are inside a budget of 25; with
    // the abandoned attempt's (10 + 1) they cross it, so its tool does not run. Within 30 it runs.
    let api = anthropic();
    let call = sse(&[
        (
            Some("message_start"),
            r#"{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"claude-3-opus-latest","stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#.to_owned(),
        ),
        (
            Some("content_block_start"),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"noop","input":{}}}"#.to_owned(),
        ),
        (
            Some("content_block_delta"),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#.to_owned(),
        ),
        (
            Some("content_block_stop"),
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        ),
        (
            Some("message_delta"),
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":5}}"#.to_owned(),
        ),
        (Some("message_stop"), r#"{"type":"message_stop"}"#.to_owned()),
    ]);
    for (budget, ran) in [(25, 0), (30, 1)] {
        let (uri, _) = serve(vec![
            Reply::Dropped(partial_then(&api, &[])),
            Reply::Whole(call.clone()),
            Reply::Whole(sse(&api.whole)),
        ])
        .await;
        let limits = Limits {
            max_tokens: Some(budget),
            ..Limits::default()
        };
        let noop = Tool::dynamic(
            "noop",
            "Does nothing.",
            serde_json::json!({"type": "object"}),
            |_args: serde_json::Value, _ctx| async move { Ok(ToolOutput::text("done")) },
        );
        let model = Retry::with_policy((api.model)(&uri), fast(3));
        let (outcome, _) = run_with_tools(model, limits, vec![noop]).await;
        assert_eq!(
            outcome.tool_calls_run, ran,
            "budget {budget}: {:?}",
            outcome.error
        );
        if ran == 0 {
            assert_eq!(outcome.stop_reason, StopReason::Budget, "budget {budget}");
            assert_eq!(outcome.usage, usage(22, 6), "budget {budget}");
        }
    }
}
