//! Runs a real agent with one tool on OpenAI Chat Completions.
//!
//! ```sh
//! OPENAI_API_KEY=sk-... cargo run -p agentloop-providers --example openai_chat
//! # any compatible server:
//! OPENAI_API_KEY=... OPENAI_BASE_URL=https://api.deepseek.com/v1 OPENAI_MODEL=deepseek-chat \
//!     cargo run -p agentloop-providers --example openai_chat
//! ```
//!
//! Without `OPENAI_API_KEY` it says so and exits 0, so CI can run it.

use agentloop::{Agent, Limits, tool};
use agentloop_providers::{OpenAiChat, Retry, default_prices};

/// Adds two integers and returns the sum.
#[tool]
async fn add(
    /// The first addend.
    a: i64,
    /// The second addend.
    b: i64,
) -> String {
    (a + b).to_string()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    if std::env::var("OPENAI_API_KEY").map_or(true, |k| k.trim().is_empty()) {
        println!("OPENAI_API_KEY is not set: skipping the live OpenAI Chat Completions example.");
        return std::process::ExitCode::SUCCESS;
    }
    let model_name = std::env::var("OPENAI_MODEL").unwrap_or_else(|_| "gpt-4.1-mini".to_owned());
    let mut builder = OpenAiChat::builder(&model_name);
    if let Ok(base) = std::env::var("OPENAI_BASE_URL") {
        builder = builder.base_url(base);
    }
    let model = match builder.build() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cannot build the model: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let agent = Agent::builder()
        .model(Retry::new(model))
        .instructions("Use the add tool for arithmetic. Answer with the number only.")
        .tool(add_tool())
        .limits(Limits::default())
        .pricing(default_prices())
        .build();
    let agent = match agent {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cannot build the agent: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = agent.run("What is 1234 + 5678? Then add 1 to that.").await;
    println!("stop: {:?}", outcome.stop_reason);
    println!("answer: {}", outcome.output.as_deref().unwrap_or("(none)"));
    println!(
        "turns: {}, tool calls: {}, tokens: {} in / {} out, cost: ${:.6}",
        outcome.turns,
        outcome.tool_calls_run,
        outcome.usage.input_tokens,
        outcome.usage.output_tokens,
        outcome.cost_usd
    );
    if let Some(error) = &outcome.error {
        eprintln!("error: {error}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
