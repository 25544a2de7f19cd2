//! Runs a real agent with one tool on the OpenAI Responses API (`store: false`; reasoning items
//! travel back encrypted with each request).
//!
//! ```sh
//! OPENAI_API_KEY=sk-... cargo run -p agentloop-providers --example openai_responses
//! # another model and effort:
//! OPENAI_MODEL=gpt-5 OPENAI_REASONING_EFFORT=medium OPENAI_API_KEY=... \
//!     cargo run -p agentloop-providers --example openai_responses
//! ```
//!
//! Without `OPENAI_API_KEY` it says so and exits 0, so CI can run it.

use std::process::ExitCode;

use agentloop::{Agent, Limits, Message, tool};
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{Retry, default_prices};

/// Counts how often a letter occurs in a word (case-insensitive).
#[tool]
async fn letter_count(
    /// The word to look in.
    word: String,
    /// The letter to count.
    letter: String,
) -> String {
    let letter = letter.to_lowercase();
    word.to_lowercase()
        .matches(letter.as_str())
        .count()
        .to_string()
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var("OPENAI_API_KEY").map_or(true, |k| k.trim().is_empty()) {
        println!("OPENAI_API_KEY is not set: skipping the live OpenAI Responses example.");
        return ExitCode::SUCCESS;
    }
    let model_name = std::env::var("OPENAI_MODEL").unwrap_or_else(|_| "gpt-5-mini".to_owned());
    let effort = std::env::var("OPENAI_REASONING_EFFORT").unwrap_or_else(|_| "low".to_owned());
    let built = OpenAiResponses::builder(model_name).reasoning_effort(effort).build().map_err(|e| e.to_string()).and_then(
        |model| {
            Agent::builder()
                .model(Retry::new(model))
                .instructions("Use the letter_count tool; never count letters yourself. Answer with the numbers only.")
                .tool(letter_count_tool())
                .limits(Limits::default())
                .pricing(default_prices())
                .build()
                .map_err(|e| e.to_string())
        },
    );
    let agent = match built {
        Ok(agent) => agent,
        Err(e) => {
            eprintln!("cannot start the agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = agent
        .run("How many r's are in 'strawberry', and how many s's in 'mississippi'?")
        .await;
    let reasoning_items: usize = outcome
        .transcript
        .iter()
        .filter_map(Message::as_assistant)
        .map(|a| {
            a.reasoning
                .iter()
                .filter(|r| r.provider_data.is_some())
                .count()
        })
        .sum();
    println!("stop: {:?}", outcome.stop_reason);
    println!("answer: {}", outcome.output.as_deref().unwrap_or("(none)"));
    println!(
        "model calls: {}, tool calls: {}, reasoning items carried: {reasoning_items}, tokens: {} in ({} cached) / {} out ({} reasoning), cost: ${:.6}",
        outcome.model_calls,
        outcome.tool_calls_run,
        outcome.usage.input_tokens,
        outcome.usage.cached_input_tokens,
        outcome.usage.output_tokens,
        outcome.usage.reasoning_tokens,
        outcome.cost_usd
    );
    if let Some(error) = &outcome.error {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
