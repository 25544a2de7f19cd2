#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! The response cache: a hit, a miss, expiry, ten concurrent identical requests reaching the
//! model once, and a cached answer streaming as deltas, marked, and priced at zero.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentloop::model::cache::{CachedModel, ResponseCache};
use agentloop::model::{ModelEvent, ModelRequest, ModelSettings, ModelStream, Usage};
use agentloop::{Agent, Message, Model, ModelResponse, Price, PriceTable};
use futures::StreamExt;

/// Kept in memory, each answer until its time to live runs out.
#[derive(Default)]
struct Memory(Mutex<HashMap<String, (ModelResponse, Instant)>>);

impl ResponseCache for Memory {
    fn get(&self, key: &str) -> Result<Option<ModelResponse>, String> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(r, _)| r.clone()))
    }
    fn put(&self, key: &str, response: &ModelResponse, ttl: Duration) -> Result<(), String> {
        self.0
            .lock()
            .unwrap()
            .insert(key.to_owned(), (response.clone(), Instant::now() + ttl));
        Ok(())
    }
}

/// A slow model that counts its calls and answers with the last user message.
struct Slow(Arc<AtomicUsize>);

impl Model for Slow {
    fn id(&self) -> &str {
        "slow"
    }
    fn provider(&self) -> &str {
        "test"
    }
    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let text = request
            .messages
            .last()
            .map(Message::text)
            .unwrap_or_default();
        Box::pin(futures::stream::once(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(ModelEvent::Response(
                ModelResponse::text(format!("echo: {text}")).with_usage(Usage {
                    input_tokens: 100,
                    output_tokens: 10,
                    ..Usage::default()
                }),
            ))
        }))
    }
}

fn cached(ttl: Duration) -> (Arc<CachedModel>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = CachedModel::new(
        Arc::new(Slow(calls.clone())),
        Arc::new(Memory::default()),
        ttl,
    );
    (Arc::new(model), calls)
}

async fn ask(model: &CachedModel, text: &str) -> Vec<ModelEvent> {
    let messages = [Message::user(text)];
    let settings = ModelSettings::default();
    let request = ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &[],
        output_schema: None,
        settings: &settings,
    };
    model
        .stream(request)
        .map(|e| e.unwrap())
        .collect::<Vec<_>>()
        .await
}

#[tokio::test]
async fn a_hit_is_served_from_the_cache_marked_and_priced_at_zero() {
    let (model, calls) = cached(Duration::from_secs(60));
    let agent = Agent::builder()
        .model(Arc::clone(&model) as Arc<dyn Model>)
        .pricing(PriceTable::new().with("slow", Price::new(1.0, 2.0)))
        .build()
        .unwrap();
    let first = agent.run("hello").await;
    assert_eq!(first.output.as_deref(), Some("echo: hello"));
    assert!(first.cost_usd > 0.0);
    let second = agent.run("hello").await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the second run was served from the cache"
    );
    assert_eq!(second.output.as_deref(), Some("echo: hello"));
    assert_eq!(second.cost_usd, 0.0);
    assert_eq!(second.usage.cached_input_tokens, 100);
    // A different request misses.
    let other = agent.run("something else").await;
    assert_eq!(other.output.as_deref(), Some("echo: something else"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_cached_answer_streams_as_deltas_and_expires() {
    let (model, calls) = cached(Duration::from_millis(100));
    let fresh = ask(&model, "one two three").await;
    assert!(!fresh.contains(&ModelEvent::Cached));
    let hit = ask(&model, "one two three").await;
    assert_eq!(hit.first(), Some(&ModelEvent::Cached));
    let deltas: Vec<&str> = hit
        .iter()
        .filter_map(|e| match e {
            ModelEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 1, "streamed in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "echo: one two three");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let expired = ask(&model, "one two three").await;
    assert!(!expired.contains(&ModelEvent::Cached));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "an expired answer is asked again"
    );
}

#[tokio::test]
async fn ten_concurrent_identical_requests_reach_the_model_once() {
    let (model, calls) = cached(Duration::from_secs(60));
    let asks = (0..10).map(|_| {
        let model = Arc::clone(&model);
        tokio::spawn(async move { ask(&model, "same").await })
    });
    let answers = futures::future::join_all(asks).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let shared = answers
        .iter()
        .filter(|a| a.as_ref().unwrap().contains(&ModelEvent::Cached))
        .count();
    assert_eq!(shared, 9, "one asked the model, nine shared its answer");
}

/// A run served wholly from the cache spends no tokens: its usage reports the answers as they
/// came (and `cached_tokens` says which), and `max_tokens` does not stop it, where the same
/// answers fresh from the model would.
#[tokio::test]
async fn cached_answers_count_toward_no_token_budget() {
    let fresh = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&fresh);
    // Two tool turns, then an answer: 100 tokens each.
    let model = agentloop::testing::FunctionModel::new(move |req: &ModelRequest<'_>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let results = req
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Tool(_)))
            .count();
        let response = if results < 2 {
            ModelResponse::tool_calls([(format!("c{results}"), "t".to_owned(), "{}".to_owned())])
        } else {
            ModelResponse::text("done")
        };
        Ok(response.with_usage(Usage {
            input_tokens: 90,
            output_tokens: 10,
            ..Usage::default()
        }))
    });
    let model = Arc::new(CachedModel::new(
        Arc::new(model),
        Arc::new(Memory::default()),
        Duration::from_secs(60),
    ));
    let tool = agentloop::Tool::dynamic(
        "t",
        "A tool.",
        serde_json::json!({"type": "object"}),
        |_a: serde_json::Value, _c| async { Ok(agentloop::ToolOutput::text("ok")) },
    );
    let agent = |max_tokens: u64| {
        Agent::builder()
            .model(Arc::clone(&model) as Arc<dyn Model>)
            .tool(tool.clone())
            .limits(agentloop::Limits {
                max_tokens: Some(max_tokens),
                ..agentloop::Limits::default()
            })
            .build()
            .unwrap()
    };
    // Fresh, 150 tokens stop it at its second answer.
    let first = agent(150).run("go").await;
    assert_eq!(
        first.stop_reason,
        agentloop::StopReason::Budget,
        "{first:?}"
    );
    assert_eq!(fresh.load(Ordering::SeqCst), 2);
    let warm = agent(1_000).run("go").await;
    assert_eq!(warm.stop_reason, agentloop::StopReason::Finished);
    assert_eq!(
        fresh.load(Ordering::SeqCst),
        3,
        "the third answer was fresh"
    );
    assert_eq!(warm.cached_tokens, 200);
    // All three answers cached: nothing spent, so 150 tokens hold.
    let cached = agent(150).run("go").await;
    assert_eq!(
        fresh.load(Ordering::SeqCst),
        3,
        "every answer came from the cache"
    );
    assert_eq!(
        cached.stop_reason,
        agentloop::StopReason::Finished,
        "{cached:?}"
    );
    assert_eq!(cached.usage.total_tokens(), 300);
    assert_eq!(cached.cached_tokens, 300);
    assert_eq!(cached.cost_usd, 0.0);
}

/// A subagent's cached answers spend nothing of its parent's token budget either: the tree's
/// usage reports them, each record says how many were cached, and the parent finishes under a
/// budget the same answers fresh would pass.
#[tokio::test]
async fn a_subagents_cached_answers_count_toward_no_budget_of_its_parent() {
    let (model, calls) = cached(Duration::from_secs(60));
    let worker = Agent::builder()
        .name("worker")
        .model(Arc::clone(&model) as Arc<dyn Model>)
        .build()
        .unwrap();
    for task in ["a", "b", "c"] {
        assert_eq!(
            worker.run(task).await.output.unwrap(),
            format!("echo: {task}")
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let delegate = |id: &str, task: &str| {
        ModelResponse::tool_calls([(
            id.to_owned(),
            "delegate".to_owned(),
            format!(r#"{{"task": "{task}"}}"#),
        )])
    };
    let parent = Agent::builder()
        .model(agentloop::testing::ScriptedModel::new([
            delegate("s1", "a"),
            delegate("s2", "b"),
            delegate("s3", "c"),
            ModelResponse::text("done"),
        ]))
        .tool(worker.as_tool("delegate", "Delegates."))
        .limits(agentloop::Limits {
            max_tokens: Some(250),
            ..agentloop::Limits::default()
        })
        .build()
        .unwrap();
    let out = parent.run("go").await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "every answer came from the cache"
    );
    assert_eq!(
        out.stop_reason,
        agentloop::StopReason::Finished,
        "{:?}",
        out.error
    );
    assert_eq!(out.usage.total_tokens(), 330);
    assert_eq!(out.cached_tokens, 330);
    assert!(
        out.subagents
            .iter()
            .all(|s| s.cached_tokens == 110 && s.spent_tokens() == 0)
    );
}

/// [`ask`]'s events as one response.
async fn answer(model: &CachedModel, text: &str) -> ModelResponse {
    let mut acc = agentloop::model::ResponseAccumulator::new();
    for event in ask(model, text).await {
        acc.push(event).unwrap();
    }
    acc.finish().unwrap()
}

#[tokio::test]
async fn honest5_two_scripts_of_one_name_sharing_a_store_each_get_their_own_answer() {
    // Both are `scripted` models named `scripted`: only what they say of themselves
    // (`Model::cache_identity`, their scripts) keeps their answers apart.
    use agentloop::testing::ScriptedModel;
    let store: Arc<dyn ResponseCache> = Arc::new(Memory::default());
    let ttl = Duration::from_secs(60);
    let a = CachedModel::new(
        Arc::new(ScriptedModel::new([ModelResponse::text("from A")])),
        Arc::clone(&store),
        ttl,
    );
    let b = CachedModel::new(
        Arc::new(ScriptedModel::new([ModelResponse::text("from B")])),
        Arc::clone(&store),
        ttl,
    );
    let from_a = answer(&a, "Who are you?").await;
    let from_b = answer(&b, "Who are you?").await;
    assert_eq!(from_a.message.text, "from A");
    assert_eq!(from_b.message.text, "from B", "B was given A's answer");
    assert!(!from_b.cached);
}
