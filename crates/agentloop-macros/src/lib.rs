//! `#[tool]`: turns a plain `async fn` into an agentloop tool. Use it through `agentloop::tool`
//! (the `macros` feature, on by default); see [`macro@tool`] for the convention and the options.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

mod expand;
mod options;

/// Turns a free `async fn` into an agentloop tool.
///
/// The function stays as it was, callable and testable. Beside it, `#[tool]` generates a
/// constructor with the same visibility, named after the function with `_tool` appended:
/// `#[tool] async fn get_weather(..)` gives `fn get_weather_tool() -> agentloop::Tool`.
///
/// - **Name**: the function's name (`r#` stripped). Override: `#[tool(name = "weather")]`.
/// - **Description**: the function's doc comment, lines joined with newlines, trimmed. Override:
///   `#[tool(description = "...")]`.
/// - **Input schema**: one property per parameter, from a hidden struct that derives serde's
///   `Deserialize` and schemars' `JsonSchema` (through `agentloop::__private`, so the user needs
///   neither crate). A parameter's doc comment becomes its description. A parameter is required
///   unless its type is `Option<T>` or it has `#[tool(default = EXPR)]` (a missing value takes
///   `EXPR`, shown as the schema's `default` when the type is `Serialize`) or `#[tool(default)]`
///   (the type's `Default`). `#[serde(...)]` and `#[schemars(...)]` on a parameter pass through to
///   its field (`#[serde(rename = "q")]`, `#[schemars(range(min = 1))]`).
/// - **Context**: a parameter of type `ToolContext` (also `&ToolContext`, `&mut ToolContext`,
///   `agentloop::ToolContext`) receives the call's context (call id, cancellation token, progress
///   sender) and never appears in the schema. At most one.
/// - **Return**: `Result<T, E>` with `T: IntoToolOutput` and `E: Into<ToolError>` (any type whose
///   last path segment is `Result`, such as `std::io::Result<T>`), or a plain `T: IntoToolOutput`,
///   which is always `Ok`.
/// - **Options** on the function: `name = "..."`, `description = "..."`, `sequential` (or
///   `mode = "sequential"`; `parallel` / `mode = "parallel"` is the default), `timeout_secs = N`
///   or `timeout_ms = N`, `idempotent`, `mutating`, `poller` (each also `= true`/`= false`), and
///   `crate = path` when `agentloop` is reachable only under another path.
///
/// Mistakes are compile errors that point at the offending token: a fn that is not `async`, a
/// `self` parameter, a pattern other than a plain name, a borrowed parameter type (`&str`), generic
/// parameters, an unknown option, an invalid tool name.
///
/// ```
/// use agentloop::{ToolContext, ToolError, tool, tool::ExecutionMode};
///
/// /// Gets the current weather for a city.
/// #[tool(timeout_secs = 10)]
/// async fn get_weather(
///     /// The city, e.g. "Paris".
///     city: String,
///     /// "metric" or "imperial".
///     #[tool(default = "metric".to_string())]
///     units: String,
///     ctx: ToolContext,
/// ) -> Result<String, ToolError> {
///     if city.is_empty() {
///         return Err(ToolError::new("bad_city", "the city is empty"));
///     }
///     ctx.progress.send("looking it up");
///     Ok(format!("18 degrees ({units}) in {city}"))
/// }
///
/// /// Appends a line to the log.
/// #[tool(sequential, mutating)]
/// async fn append_log(line: String) -> String {
///     format!("appended {line}")
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // The function is still a function...
/// let ctx = ToolContext::detached("call-1", "get_weather");
/// assert_eq!(get_weather("Oslo".into(), "metric".into(), ctx).await.unwrap(), "18 degrees (metric) in Oslo");
///
/// // ...and `get_weather_tool()` is the tool.
/// let weather = get_weather_tool();
/// assert_eq!(weather.name(), "get_weather");
/// assert_eq!(weather.spec().description, "Gets the current weather for a city.");
/// assert_eq!(weather.spec().input_schema["required"], serde_json::json!(["city"]));
/// let out = weather
///     .call(serde_json::json!({"city": "Paris"}), ToolContext::detached("c1", "get_weather"))
///     .await
///     .unwrap();
/// assert_eq!(out.content, agentloop::message::ToolContent::Text("18 degrees (metric) in Paris".into()));
///
/// assert_eq!(append_log_tool().spec().mode, ExecutionMode::Sequential);
/// let agent = agentloop::Agent::builder()
///     .model(agentloop::testing::ScriptedModel::new([agentloop::ModelResponse::text("done")]))
///     .tool(get_weather_tool())
///     .tool(append_log_tool())
///     .build()
///     .unwrap();
/// # let _ = agent;
/// # }
/// ```
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
