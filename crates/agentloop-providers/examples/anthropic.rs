//! Runs a real agent with one tool on the Anthropic Messages API.
//!
//! ```sh
//! ANTHROPIC_API_KEY=sk-ant-... cargo run -p agentloop-providers --example anthropic
//! # another model, with extended thinking (budget in tokens):
//! ANTHROPIC_MODEL=claude-sonnet-4-5 ANTHROPIC_THINKING=2048 ANTHROPIC_API_KEY=... \
//!     cargo run -p agentloop-providers --example anthropic
//! ```
//!
//! `ANTHROPIC_BASE_URL` points it at a proxy or gateway. Without `ANTHROPIC_API_KEY` it says so and exits 0, so CI can run it.

use std::process::ExitCode;

use agentloop::{Agent, Limits, RunOutcome, tool};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::{Retry, default_prices};

/// Counts the words of a text (split on whitespace).
#[tool]
async fn word_count(
    /// The text to count.
    text: String,
) -> String {
    text.split_whitespace().count().to_string()
}

fn report(outcome: &RunOutcome) -> ExitCode {
    println!("stop: {:?}", outcome.stop_reason);
    println!("answer: {}", outcome.output.as_deref().unwrap_or("(none)"));
    let u = &outcome.usage;
    println!(
        "model calls: {}, tool calls: {}, tokens: {} in (+{} cache read, +{} cache write) / {} out, cost: ${:.6}",
        outcome.model_calls,
        outcome.tool_calls_run,
        u.input_tokens,
        u.cached_input_tokens,
        u.cache_write_tokens,
        u.output_tokens,
        outcome.cost_usd
    );
    match &outcome.error {
        Some(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    }
}

async fn run() -> Result<RunOutcome, Box<dyn std::error::Error>> {
    let model_name =
        std::env::var("ANTHROPIC_MODEL").unwrap_or_else(|_| "claude-haiku-4-5".to_owned());
    let mut builder = Anthropic::builder(model_name).max_tokens(4096);
    if let Ok(base) = std::env::var("ANTHROPIC_BASE_URL") {
        builder = builder.base_url(base);
    }
    if let Some(budget) = std::env::var("ANTHROPIC_THINKING")
        .ok()
        .and_then(|b| b.parse().ok())
    {
        builder = builder.thinking(budget).max_tokens(budget + 2048);
    }
    let agent = Agent::builder()
        .model(Retry::new(builder.build()?))
        .instructions("Count words with the word_count tool, one call per sentence. Answer with the counts only.")
        .tool(word_count_tool())
        .limits(Limits::default())
        .pricing(default_prices())
        .build()?;
    Ok(agent
        .run("Count the words of each sentence: 'The quick brown fox jumps.' and 'Rust keeps agents honest.'")
        .await)
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var("ANTHROPIC_API_KEY").map_or(true, |k| k.trim().is_empty()) {
        println!("ANTHROPIC_API_KEY is not set: skipping the live Anthropic Messages example.");
        return ExitCode::SUCCESS;
    }
    match run().await {
        Ok(outcome) => report(&outcome),
        Err(e) => {
            eprintln!("cannot start the agent: {e}");
            ExitCode::FAILURE
        }
    }
}
