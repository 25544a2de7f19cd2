//! Runs a scripted agent with two tools (one fails recoverably) into an NDJSON trace with
//! payloads, converts it to SQLite, and prints `trace list` and `trace show` for it.
//!
//! `cargo run -p agentloop-store --example trace_demo [DIR]` (default: a temporary directory).

use std::sync::Arc;

use agentloop::{
    Agent, Message, ModelResponse, Price, PriceTable, RunOptions, Tool, ToolError, ToolOutput,
    model::Usage, testing::ScriptedModel,
};
use agentloop_store::{TraceOptions, TraceSink, convert, read_trace, render_list, render_run};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join(format!("agentloop-trace-demo-{}", std::process::id())),
        Into::into,
    );
    std::fs::create_dir_all(&dir)?;
    let ndjson = dir.join("demo.ndjson");
    let sqlite = dir.join("demo.sqlite");
    for stale in [&ndjson, &sqlite] {
        if stale.exists() {
            std::fs::remove_file(stale)?;
        }
    }

    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let weather = Tool::dynamic(
        "get_weather",
        "Current weather.",
        schema.clone(),
        |args: Value, _ctx| async move {
            Ok(ToolOutput::json(
                json!({"city": args.get("city"), "temp_c": 18}),
            ))
        },
    );
    let flaky = Tool::dynamic(
        "flaky_forecast",
        "A forecast service that is down.",
        schema,
        |_args, _ctx| async {
            Err::<ToolOutput, _>(ToolError::new(
                "unavailable",
                "the forecast service is down",
            ))
        },
    );
    let usage = |input, output| Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    };
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ("c1", "get_weather", r#"{"city":"Paris"}"#),
            ("c2", "flaky_forecast", r#"{"city":"Paris"}"#),
        ])
        .with_usage(usage(120, 24)),
        ModelResponse::text("It is 18 °C in Paris; no forecast is available right now.")
            .with_usage(usage(190, 16)),
    ]);
    let agent = Agent::builder()
        .name("weather")
        .model(model)
        .tools([weather, flaky])
        .pricing(PriceTable::new().with("scripted", Price::new(0.4, 1.6)))
        .build()?;

    let sink = Arc::new(TraceSink::open(&ndjson, TraceOptions { payloads: true })?);
    let options = RunOptions {
        sinks: vec![sink.clone()],
        ..RunOptions::default()
    };
    let outcome = agent
        .run_with(
            Vec::new(),
            Some(Message::user("What is the weather in Paris?")),
            options,
        )
        .await;
    sink.finish()?;
    println!("run {} stopped: {}\n", outcome.run_id, outcome.stop_reason);

    convert(&ndjson, &sqlite)?;
    let trace = read_trace(&sqlite)?;
    println!("$ agentloop trace list {}", sqlite.display());
    print!("{}", render_list(&trace.records));
    println!("\n$ agentloop trace show {}", sqlite.display());
    print!("{}", render_run(&trace.records, None)?);
    Ok(())
}
