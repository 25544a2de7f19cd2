#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A cost budget holds only for a model that has a price: `max_cost_usd` with a model the
//! agent's pricing cannot price is refused before any model call, at build or at the start of a
//! run whose own limits set it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentloop::{
    Agent, Limits, ModelResponse, Price, PriceTable, RunError, RunOptions, StopReason,
    model::Usage, testing::FunctionModel,
};

fn budget() -> Limits {
    Limits {
        max_cost_usd: Some(1.0),
        ..Limits::default()
    }
}

/// A model named `local-model` that counts its calls.
fn counted(calls: &Arc<AtomicUsize>) -> FunctionModel {
    let calls = calls.clone();
    FunctionModel::new(move |_| {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(ModelResponse::text("done"))
    })
    .with_id("local-model")
}

fn unpriced(result: Result<Agent, RunError>) -> RunError {
    let err = result.expect_err("the agent was built");
    assert_eq!(err.code(), "config.unpriced_model", "{err}");
    assert_eq!(err.kind(), agentloop::ErrorKind::Definition);
    err
}

#[test]
fn a_cost_budget_for_an_unpriced_model_is_refused_at_build() {
    let calls = Arc::new(AtomicUsize::new(0));
    let build = |pricing: Option<PriceTable>| {
        let mut b = Agent::builder().model(counted(&calls)).limits(budget());
        if let Some(p) = pricing {
            b = b.pricing(p);
        }
        b.build()
    };
    let err = unpriced(build(None));
    assert!(err.to_string().contains("\"local-model\""), "{err}");
    assert!(err.to_string().contains("PriceTable"), "{err}");
    // A table that prices other models, or a name that only starts like the model.
    unpriced(build(Some(
        PriceTable::new().with("gpt-4o", Price::new(1.0, 1.0)),
    )));
    unpriced(build(Some(
        PriceTable::new().with("local", Price::new(1.0, 1.0)),
    )));
    build(Some(
        PriceTable::new().with("local-model", Price::new(1.0, 1.0)),
    ))
    .unwrap();
    // A pricing function that prices nothing, or panics, prices nothing.
    unpriced(
        Agent::builder()
            .model(counted(&calls))
            .limits(budget())
            .pricing(|_: &str, _: &str, _: &Usage| None)
            .build(),
    );
    unpriced(
        Agent::builder()
            .model(counted(&calls))
            .limits(budget())
            .pricing(|_: &str, _: &str, _: &Usage| -> Option<f64> { panic!("no prices here") })
            .build(),
    );
    // No budget, no price needed.
    Agent::builder().model(counted(&calls)).build().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_run_s_own_cost_budget_for_an_unpriced_model_fails_before_any_model_call() {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder().model(counted(&calls)).build().unwrap();
    let out = agent
        .run_with(
            Vec::new(),
            Some(agentloop::Message::user("go")),
            RunOptions {
                limits: Some(budget()),
                ..RunOptions::default()
            },
        )
        .await;
    assert_eq!(out.stop_reason, StopReason::Failed);
    assert_eq!(
        out.error.as_ref().map(RunError::code),
        Some("config.unpriced_model")
    );
    assert_eq!(out.model_calls, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no model call was made");
    assert_eq!(out.transcript.len(), 1, "the input is kept");

    // The same run without the budget goes ahead.
    let out = agent.run("go").await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_dated_snapshot_in_the_response_is_priced_by_its_base_entry() {
    let calls = Arc::new(AtomicUsize::new(0));
    let usage = Usage {
        input_tokens: 1_000_000,
        ..Usage::default()
    };
    let model = {
        let calls = calls.clone();
        FunctionModel::new(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut r = ModelResponse::text("done").with_usage(usage);
            r.model = Some("local-model-2025-01-31".into());
            Ok(r)
        })
        .with_id("local-model")
    };
    let out = Agent::builder()
        .model(model)
        .pricing(PriceTable::new().with("local-model", Price::new(2.0, 0.0)))
        .limits(budget())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert!((out.cost_usd - 2.0).abs() < 1e-9, "{}", out.cost_usd);
}

/// A model with the id `local-model` whose answers name themselves `name`.
fn answering_as(name: &'static str, usage: Usage) -> FunctionModel {
    FunctionModel::new(move |_| {
        let mut r = ModelResponse::text("done").with_usage(usage);
        r.model = Some(name.into());
        Ok(r)
    })
    .with_id("local-model")
}

#[tokio::test]
async fn an_answer_named_for_a_model_the_table_lacks_is_priced_by_the_configured_name() {
    let usage = Usage {
        input_tokens: 1_000_000,
        ..Usage::default()
    };
    // A gateway's name for the configured model.
    let out = Agent::builder()
        .model(answering_as("vendor/local-model", usage))
        .pricing(PriceTable::new().with("local-model", Price::new(2.0, 0.0)))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert!((out.cost_usd - 2.0).abs() < 1e-9, "{}", out.cost_usd);
    assert_eq!(out.unpriced_model_calls, 0);
}

#[tokio::test]
async fn an_answer_whose_cost_is_unknown_is_counted_unpriced_never_as_zero() {
    let out = Agent::builder()
        .model(answering_as("someone-else", Usage::default()))
        .pricing(PriceTable::new().with("gpt-4o", Price::new(2.0, 0.0)))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.unpriced_model_calls, 1, "the answer's cost is unknown");
}

#[tokio::test]
async fn under_a_cost_budget_an_answer_of_unknown_cost_stops_the_run_before_its_calls_run() {
    use agentloop::{Tool, ToolOutput, limits::OnLimit};
    use serde_json::{Value, json};

    let ran = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));
    let tool = {
        let ran = ran.clone();
        Tool::dynamic(
            "probe",
            "Probes.",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            move |_args: Value, _ctx| {
                let ran = ran.clone();
                async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok(ToolOutput::text("ok"))
                }
            },
        )
    };
    let model = {
        let asked = asked.clone();
        FunctionModel::new(move |_| {
            let n = asked.fetch_add(1, Ordering::SeqCst) + 1;
            // The second answer is past the tier the pricing knows a price for.
            let usage = Usage {
                input_tokens: if n == 1 { 100 } else { 500_000 },
                ..Usage::default()
            };
            let id = format!("c{n}");
            Ok(
                ModelResponse::tool_calls([(id, "probe", format!("{{\"n\": {n}}}"))])
                    .with_usage(usage),
            )
        })
        .with_id("local-model")
    };
    let out = Agent::builder()
        .model(model)
        .tool(tool)
        // Known up to 200k input tokens only, as a table without a long-context tier.
        .pricing(|_: &str, _: &str, u: &Usage| {
            (u.input_tokens <= 200_000).then_some(u.input_tokens as f64 * 1e-6)
        })
        .limits(Limits {
            max_cost_usd: Some(5.0),
            // A last answer would be spent unmetered too: none is asked for.
            on_limit: OnLimit::Answer,
            ..Limits::default()
        })
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Budget);
    let error = out.error.as_ref().expect("an error says why");
    assert_eq!(error.code(), "limit.cost_unknown", "{error}");
    assert_eq!(error.kind(), agentloop::ErrorKind::Limit);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "no model call after the unknown cost"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the second answer's call never ran"
    );
    assert_eq!(out.unpriced_model_calls, 1);
    assert!((out.cost_usd - 0.0001).abs() < 1e-12, "{}", out.cost_usd);
    assert_eq!(out.tool_calls.len(), 2);
    assert!(!out.tool_calls[1].ok(), "{:?}", out.tool_calls[1]);
}

/// A model that asks for one call of `probe`, then answers; each answer reports a million input
/// tokens.
fn probing() -> FunctionModel {
    let asked = Arc::new(AtomicUsize::new(0));
    FunctionModel::new(move |_| {
        let usage = Usage {
            input_tokens: 1_000_000,
            ..Usage::default()
        };
        let r = if asked.fetch_add(1, Ordering::SeqCst) == 0 {
            ModelResponse::tool_calls([("c1", "probe", "{}")])
        } else {
            ModelResponse::text("done")
        };
        Ok(r.with_usage(usage))
    })
    .with_id("local-model")
}

fn probe() -> agentloop::Tool {
    agentloop::Tool::dynamic(
        "probe",
        "Probes.",
        serde_json::json!({"type": "object"}),
        |_args: serde_json::Value, _ctx| async { Ok(agentloop::ToolOutput::text("ok")) },
    )
}

#[tokio::test]
async fn a_cost_that_overflows_is_unknown_never_infinite_and_a_budget_still_stops_the_run() {
    // 1e308 USD per million tokens, times a million tokens: past the largest f64.
    let huge = || PriceTable::new().with("local-model", Price::new(1e308, 0.0));
    let out = Agent::builder()
        .model(probing())
        .tool(probe())
        .pricing(huge())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert!(out.cost_usd.is_finite(), "{}", out.cost_usd);
    assert_eq!(
        out.unpriced_model_calls, 2,
        "both answers' costs are unknown"
    );
    // What a JSON outcome shows: a number, not null.
    assert!(serde_json::json!(out.cost_usd).is_number());

    // Under a budget, the first answer of unknown cost stops the run before its call runs.
    let out = Agent::builder()
        .model(probing())
        .tool(probe())
        .pricing(huge())
        .limits(Limits {
            max_cost_usd: Some(1e300),
            ..Limits::default()
        })
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Budget);
    assert_eq!(
        out.error.as_ref().map(RunError::code),
        Some("limit.cost_unknown")
    );
    assert_eq!(out.model_calls, 1);

    // NaN and a negative cost are no costs either: neither makes the run's cost NaN nor gives
    // the budget money back.
    for cost in [f64::NAN, -5.0, f64::INFINITY] {
        let out = Agent::builder()
            .model(probing())
            .tool(probe())
            .pricing(move |_: &str, _: &str, _: &Usage| Some(cost))
            .limits(budget())
            .build()
            .unwrap()
            .run("go")
            .await;
        assert_eq!(out.stop_reason, StopReason::Budget, "{cost}");
        assert_eq!(out.cost_usd, 0.0, "{cost}");
    }
}

#[tokio::test]
async fn finite_costs_that_add_up_past_the_largest_number_stay_a_number_over_any_budget() {
    let out = Agent::builder()
        .model(probing())
        .tool(probe())
        .pricing(|_: &str, _: &str, _: &Usage| Some(f64::MAX))
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(out.stop_reason, StopReason::Finished);
    assert_eq!(out.cost_usd, f64::MAX);
    assert_eq!(out.unpriced_model_calls, 0);
    // What a JSON outcome shows: a number, not null.
    assert!(serde_json::json!(out.cost_usd).is_number());
}
