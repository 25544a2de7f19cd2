//! The model's questions through the library seam: an application's [`Answerer`] (a web app's,
//! here in memory) gets all the open questions of a batch at once, before any tool of the batch
//! starts; its answers are checked against each question's schema and become the calls' results.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use agentloop::{
    Agent, CallStatus, ModelResponse,
    ask::{Answerer, AskGate, ask_user_tool},
    gate::GateContext,
    permissions::ApprovalRequest,
    testing::ScriptedModel,
};
use common::{CallLog, calls, sleeper};
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// Answers from a list, and remembers what it was asked and how many tools had run by then.
struct App {
    answers: Vec<Value>,
    asked: Mutex<Vec<(Vec<String>, usize)>>,
    log: CallLog,
}

impl Answerer for App {
    fn answer<'a>(
        &'a self,
        _cx: GateContext<'a>,
        questions: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Value>, String>> {
        let texts = questions
            .iter()
            .map(|q| q.question.as_ref().unwrap().text.clone())
            .collect();
        self.asked.lock().unwrap().push((texts, self.log.len()));
        let answers = self.answers.clone();
        Box::pin(async move { Ok(answers) })
    }
}

#[tokio::test]
async fn an_application_answers_a_batch_of_questions_at_once_checked_against_their_schemas() {
    let log = CallLog::default();
    let app = Arc::new(App {
        answers: vec![json!("large"), json!("many")],
        asked: Mutex::default(),
        log: log.clone(),
    });
    let size = r#"{"question": "Which size?", "schema": {"enum": ["small", "large"]}}"#;
    let count = r#"{"question": "How many?", "schema": {"type": "integer"}}"#;
    let model = ScriptedModel::new([
        calls(&[
            ("q1", "ask_user", size),
            ("t1", "alpha", "{}"),
            ("q2", "ask_user", count),
        ]),
        ModelResponse::text("done"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(ask_user_tool("ask_user"))
        .tool(sleeper("alpha", &log))
        .gate(Arc::new(AskGate::new().with_answerer(app.clone())))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert!(out.is_success(), "{:?}", out.error);
    assert_eq!(
        *app.asked.lock().unwrap(),
        [(vec!["Which size?".to_owned(), "How many?".to_owned()], 0)],
        "both questions in one ask, before the batch's tool ran"
    );
    let by_id = |id: &str| {
        out.tool_calls
            .iter()
            .find(|c| &*c.call_id == id)
            .unwrap()
            .outcome
            .clone()
    };
    assert_eq!(by_id("q1").status, CallStatus::Ok);
    assert_eq!(by_id("q1").content.to_text(), "large");
    // "many" is no integer: the model reads why, and the run goes on.
    let q2 = by_id("q2");
    assert_eq!(q2.status, CallStatus::Denied);
    assert!(
        q2.content.to_text().contains("answer.invalid")
            || q2.content.to_text().contains("does not match"),
        "{}",
        q2.content.to_text()
    );
    assert_eq!(by_id("t1").status, CallStatus::Ok);
    assert_eq!(log.names(), ["alpha"]);
}

#[tokio::test]
async fn without_an_answerer_or_a_journal_a_question_is_refused_and_the_model_reads_why() {
    let model = ScriptedModel::new([
        calls(&[("q1", "ask_user", r#"{"question": "Why?"}"#)]),
        ModelResponse::text("done"),
    ]);
    let out = Agent::builder()
        .model(model)
        .tool(ask_user_tool("ask_user"))
        .gate(Arc::new(AskGate::new()))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert!(out.is_success(), "{:?}", out.error);
    let q1 = &out.tool_calls[0].outcome;
    assert_eq!(q1.status, CallStatus::Denied);
    assert!(
        q1.content.to_text().contains("nobody can answer"),
        "{}",
        q1.content.to_text()
    );
}
