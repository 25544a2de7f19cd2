//! `#[tool]`: the spec it generates (name, description, schema, mode, flags), the handler it
//! builds (arguments, defaults, context, errors), and a full agent run that calls a macro tool.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{
    Agent, CallStatus, Event, EventKind, Message, ModelResponse, StopReason, ToolContext,
    ToolError, ToolOutput, message::ToolContent, testing::ScriptedModel, tool, tool::ExecutionMode,
};
use serde_json::{Value, json};

/// Gets the current weather for a city.
#[tool]
async fn get_weather(
    /// The city, e.g. "Paris".
    city: String,
    /// "metric" or "imperial".
    #[tool(default = "metric".to_string())]
    units: String,
    /// How many days ahead (none for today).
    days: Option<u32>,
    ctx: ToolContext,
) -> Result<String, ToolError> {
    if city.is_empty() {
        return Err(ToolError::new("bad_city", "the city is empty"));
    }
    ctx.progress.send(json!({"looking_up": city}));
    let when = days.map_or_else(|| "today".to_owned(), |d| format!("in {d} days"));
    Ok(format!("18 degrees ({units}) in {city} {when}"))
}

fn ctx(tool: &str) -> ToolContext {
    ToolContext::detached("call-1", tool)
}

async fn call(tool: &agentloop::Tool, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(args, ctx(tool.name())).await
}

fn text(out: &ToolOutput) -> &str {
    match &out.content {
        ToolContent::Text(t) => t,
        other => panic!("expected text, got {other:?}"),
    }
}

#[test]
fn schema_has_one_property_per_parameter_with_doc_descriptions() {
    let tool = get_weather_tool();
    let schema = &tool.spec().input_schema;
    assert_eq!(schema["type"], "object");
    let props = schema["properties"].as_object().unwrap();
    let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["city", "days", "units"]);
    assert_eq!(props["city"]["type"], "string");
    assert_eq!(props["city"]["description"], "The city, e.g. \"Paris\".");
    assert_eq!(props["units"]["description"], "\"metric\" or \"imperial\".");
    assert_eq!(
        props["days"]["description"],
        "How many days ahead (none for today)."
    );
}

#[test]
fn schema_requires_only_parameters_without_default_or_option() {
    let schema = get_weather_tool().spec().input_schema.clone();
    assert_eq!(schema["required"], json!(["city"]));
}

#[test]
fn schema_shows_the_default_value() {
    let schema = get_weather_tool().spec().input_schema.clone();
    assert_eq!(schema["properties"]["units"]["default"], "metric");
}

#[test]
fn context_parameter_never_appears_in_schema() {
    let schema = get_weather_tool().spec().input_schema.clone();
    let text = schema.to_string();
    assert!(!text.contains("ctx"), "{text}");
    assert!(!text.contains("ToolContext"), "{text}");
    assert!(!text.contains("call_id"), "{text}");
}

#[test]
fn name_and_description_come_from_the_function_and_its_doc() {
    let tool = get_weather_tool();
    assert_eq!(tool.name(), "get_weather");
    assert_eq!(
        tool.spec().description,
        "Gets the current weather for a city."
    );
    assert_eq!(tool.spec().mode, ExecutionMode::Parallel);
    assert!(!tool.spec().mutating);
    assert!(!tool.spec().idempotent);
    assert_eq!(tool.policy().timeout, None);
}

///   Counts words.
///
/// Words are runs of characters between whitespace.
///   Leading spaces past the first are kept.
///
#[tool]
async fn count_words(text: String) -> usize {
    text.split_whitespace().count()
}

#[test]
fn multi_line_doc_is_joined_with_newlines_and_trimmed() {
    assert_eq!(
        count_words_tool().spec().description,
        "Counts words.\n\nWords are runs of characters between whitespace.\n  Leading spaces past the first are kept."
    );
}

/// This doc is replaced.
#[tool(name = "lookup", description = "  Looks a key up.  ", sequential)]
async fn lookup_impl(key: String) -> String {
    format!("value of {key}")
}

#[tool(mode = "sequential", timeout_secs = 5, idempotent, mutating, poller)]
async fn write_file(path: String) {
    let _ = path;
}

#[tool(
    mode = "parallel",
    timeout_ms = 250,
    idempotent = false,
    mutating = true
)]
async fn delete_file(path: String) {
    let _ = path;
}

#[test]
fn attribute_overrides_name_description_and_mode() {
    let tool = lookup_impl_tool();
    assert_eq!(tool.name(), "lookup");
    assert_eq!(tool.spec().description, "Looks a key up.");
    assert_eq!(tool.spec().mode, ExecutionMode::Sequential);
}

#[test]
fn mode_string_and_flags_reach_the_spec_and_the_timeout_the_policy() {
    let spec = write_file_tool().spec().clone();
    assert_eq!(spec.mode, ExecutionMode::Sequential);
    assert_eq!(
        write_file_tool().policy().timeout,
        Some(Duration::from_secs(5))
    );
    assert!(spec.idempotent);
    assert!(spec.mutating);
    assert!(spec.poller);

    let spec = delete_file_tool().spec().clone();
    assert!(!spec.poller);
    assert_eq!(spec.mode, ExecutionMode::Parallel);
    assert_eq!(
        delete_file_tool().policy().timeout,
        Some(Duration::from_millis(250))
    );
    assert!(!spec.idempotent);
    assert!(spec.mutating);
}

#[tokio::test]
async fn calling_the_tool_with_json_args_runs_the_function() {
    let out = call(
        &get_weather_tool(),
        json!({"city": "Oslo", "units": "imperial", "days": 2}),
    )
    .await
    .unwrap();
    assert_eq!(text(&out), "18 degrees (imperial) in Oslo in 2 days");
}

#[tokio::test]
async fn a_missing_argument_takes_its_default() {
    let out = call(&get_weather_tool(), json!({"city": "Oslo"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "18 degrees (metric) in Oslo today");
}

/// Pages through results.
#[tool]
async fn page(
    #[tool(default)] offset: u32,
    #[tool(default = 20)] limit: u32,
    #[tool(default = vec!["id".to_owned(), "name".to_owned()])] fields: Vec<String>,
) -> String {
    format!("{offset}+{limit} {}", fields.join(","))
}

#[tokio::test]
async fn trait_default_and_expression_defaults_fill_missing_arguments() {
    let tool = page_tool();
    assert_eq!(tool.spec().input_schema.get("required"), None);
    assert_eq!(
        tool.spec().input_schema["properties"]["limit"]["default"],
        20
    );
    assert_eq!(
        tool.spec().input_schema["properties"]["fields"]["default"],
        json!(["id", "name"])
    );
    assert_eq!(text(&call(&tool, json!({})).await.unwrap()), "0+20 id,name");
    assert_eq!(
        text(
            &call(&tool, json!({"limit": 5, "fields": ["x"]}))
                .await
                .unwrap()
        ),
        "0+5 x"
    );
}

#[tokio::test]
async fn an_err_result_becomes_the_tool_error() {
    let err = call(&get_weather_tool(), json!({"city": ""}))
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::new("bad_city", "the city is empty"));
}

/// An application error with its own conversion.
#[derive(Debug)]
struct NotFound(String);

impl From<NotFound> for ToolError {
    fn from(e: NotFound) -> Self {
        ToolError::new("not_found", format!("no entry named {}", e.0))
    }
}

/// Finds an entry.
#[tool]
async fn find(name: String) -> Result<Value, NotFound> {
    if name == "a" {
        Ok(json!({"name": "a", "size": 1}))
    } else {
        Err(NotFound(name))
    }
}

/// Reads a file.
#[tool]
async fn read_file(path: String) -> std::io::Result<String> {
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("{path}: no such file"),
    ))
}

/// Always fails the run.
#[tool]
async fn explode() -> Result<String, ToolError> {
    Err(ToolError::fatal("the disk is on fire"))
}

#[tokio::test]
async fn any_error_type_that_converts_into_tool_error_is_accepted() {
    let out = call(&find_tool(), json!({"name": "a"})).await.unwrap();
    assert_eq!(
        out.content,
        ToolContent::Json(json!({"name": "a", "size": 1}))
    );
    let err = call(&find_tool(), json!({"name": "b"})).await.unwrap_err();
    assert_eq!(err, ToolError::new("not_found", "no entry named b"));
    let err = call(&read_file_tool(), json!({"path": "x.txt"}))
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::new("io_error", "x.txt: no such file"));
    let err = call(&explode_tool(), json!({})).await.unwrap_err();
    assert!(err.is_fatal());
}

#[tokio::test]
async fn a_plain_return_value_is_wrapped_in_ok() {
    assert_eq!(
        text(
            &call(&count_words_tool(), json!({"text": "a b  c"}))
                .await
                .unwrap()
        ),
        "3"
    );
    assert_eq!(
        text(
            &call(&write_file_tool(), json!({"path": "p"}))
                .await
                .unwrap()
        ),
        "ok"
    );
}

#[tokio::test]
async fn the_original_function_stays_callable() {
    assert_eq!(count_words("one two".into()).await, 2);
    let direct = get_weather("Rome".into(), "metric".into(), Some(1), ctx("get_weather"))
        .await
        .unwrap();
    assert_eq!(direct, "18 degrees (metric) in Rome in 1 days");
    assert_eq!(lookup_impl("k".into()).await, "value of k");
}

/// Reports who called it.
#[tool]
async fn whoami(prefix: String, ctx: &agentloop::ToolContext) -> String {
    format!(
        "{prefix}{} of {} on turn {}",
        ctx.call_id, ctx.tool, ctx.turn
    )
}

/// Takes the context mutably, before its argument.
#[tool]
async fn whoami_mut(ctx: &mut ToolContext, suffix: String) -> String {
    ctx.turn += 1;
    format!("{}{suffix}", ctx.turn)
}

#[tokio::test]
async fn the_context_reaches_the_function_by_value_or_by_reference() {
    let tool = whoami_tool();
    assert_eq!(tool.spec().input_schema["required"], json!(["prefix"]));
    let out = tool
        .call(
            json!({"prefix": "I am "}),
            ToolContext::detached("c-7", "whoami"),
        )
        .await
        .unwrap();
    assert_eq!(text(&out), "I am c-7 of whoami on turn 0");

    let tool = whoami_mut_tool();
    assert_eq!(
        tool.spec().input_schema["properties"]
            .as_object()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        text(&call(&tool, json!({"suffix": "!"})).await.unwrap()),
        "1!"
    );
}

/// Searches.
#[tool]
async fn search(
    /// The query.
    #[serde(rename = "q")]
    query: String,
    /// At most this many hits.
    #[schemars(range(min = 1, max = 50))]
    #[tool(default = 10)]
    max_hits: u32,
) -> String {
    format!("{query}:{max_hits}")
}

#[tokio::test]
async fn serde_and_schemars_attributes_on_parameters_pass_through() {
    let tool = search_tool();
    let schema = &tool.spec().input_schema;
    assert_eq!(schema["required"], json!(["q"]));
    assert_eq!(schema["properties"]["q"]["description"], "The query.");
    assert_eq!(schema["properties"]["max_hits"]["maximum"], 50);
    assert_eq!(schema["properties"]["max_hits"]["minimum"], 1);
    assert_eq!(
        text(&call(&tool, json!({"q": "rust"})).await.unwrap()),
        "rust:10"
    );
}

/// Echoes its argument: the parameter shares the function's name, and another one is named like
/// the macro's own locals.
#[tool]
async fn echo(echo: String, r#type: Option<String>, __agentloop_args: u8) -> String {
    format!("{echo} {} {__agentloop_args}", r#type.unwrap_or_default())
}

#[tokio::test]
async fn parameter_names_do_not_clash_with_the_function_or_the_expansion() {
    let tool = echo_tool();
    let props = tool.spec().input_schema["properties"].as_object().unwrap();
    assert!(props.contains_key("type"), "{props:?}");
    assert!(props.contains_key("echo"));
    let out = call(
        &tool,
        json!({"echo": "hi", "type": "t", "__agentloop_args": 3}),
    )
    .await
    .unwrap();
    assert_eq!(text(&out), "hi t 3");
}

/// Takes nothing.
#[tool]
async fn r#ping_it() -> &'static str {
    "pong"
}

/// Takes nothing either.
#[tool]
async fn r#type() -> &'static str {
    "typed"
}

#[tokio::test]
async fn a_tool_without_parameters_takes_an_empty_object_and_raw_names_lose_their_prefix() {
    let tool = type_tool();
    assert_eq!(tool.name(), "type");
    assert_eq!(tool.spec().input_schema["properties"], json!({}));
    assert_eq!(text(&call(&tool, json!({})).await.unwrap()), "typed");
    assert_eq!(ping_it_tool().name(), "ping_it");
}

#[tokio::test]
async fn wrong_argument_types_are_an_invalid_arguments_error() {
    let err = call(&get_weather_tool(), json!({"city": 3}))
        .await
        .unwrap_err();
    match err {
        ToolError::Recoverable { code, .. } => assert_eq!(code, "invalid_arguments"),
        other => panic!("expected a recoverable error, got {other:?}"),
    }
}

#[tokio::test]
async fn an_agent_run_calls_macro_tools_with_defaults_errors_and_progress() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ("c1", "get_weather", r#"{"city": "Paris"}"#),
            ("c2", "get_weather", r#"{"city": "", "units": "imperial"}"#),
            ("c3", "lookup", r#"{"key": "k"}"#),
        ]),
        ModelResponse::tool_calls([("c4", "get_weather", r#"{"city": "Paris", "days": "soon"}"#)]),
        ModelResponse::text("It is 18 degrees in Paris."),
    ]);
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink_events = events.clone();
    let agent = Agent::builder()
        .model(model)
        .tool(get_weather_tool())
        .tool(lookup_impl_tool())
        .sink(move |e: &Event| sink_events.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let outcome = agent.run("Weather in Paris?").await;

    assert_eq!(
        outcome.stop_reason,
        StopReason::Finished,
        "{:?}",
        outcome.error
    );
    assert_eq!(
        outcome.output.as_deref(),
        Some("It is 18 degrees in Paris.")
    );
    let statuses: Vec<(&str, CallStatus)> = outcome
        .tool_calls
        .iter()
        .map(|r| (&*r.call_id, r.outcome.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("c1", CallStatus::Ok),
            ("c2", CallStatus::Error),
            ("c3", CallStatus::Ok),
            ("c4", CallStatus::Rejected)
        ]
    );

    let results: Vec<(String, String, bool)> = outcome
        .transcript
        .iter()
        .filter_map(Message::as_tool_result)
        .map(|r| (r.call_id.to_string(), r.content.to_text(), r.is_error))
        .collect();
    assert_eq!(
        results[0],
        (
            "c1".into(),
            "18 degrees (metric) in Paris today".into(),
            false
        )
    );
    assert_eq!(results[1].0, "c2");
    assert!(
        results[1].1.contains("the city is empty"),
        "{}",
        results[1].1
    );
    assert!(results[1].2);
    assert_eq!(results[2], ("c3".into(), "value of k".into(), false));
    // The schema generated by the macro is what the run validates against.
    assert_eq!(results[3].0, "c4");
    assert!(results[3].1.contains("/days"), "{}", results[3].1);
    assert!(results[3].2);

    let progress: Vec<(String, Value)> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolProgress {
                call_id, progress, ..
            } => Some((call_id.clone(), progress.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        progress,
        [("c1".to_owned(), json!({"looking_up": "Paris"}))]
    );
}

mod weather {
    use agentloop::tool;

    /// A path under which agentloop is re-exported, as a facade crate would.
    pub(crate) mod facade {
        pub(crate) use agentloop::*;
    }

    #[doc = concat!("Converts ", "degrees.")]
    #[doc = "  Celsius to Fahrenheit.  "]
    #[tool(crate = crate::weather::facade)]
    pub(crate) async fn to_fahrenheit(celsius: f64) -> f64 {
        celsius * 9.0 / 5.0 + 32.0
    }
}

#[tokio::test]
async fn the_constructor_keeps_the_visibility_and_a_crate_path_override_works() {
    let tool = weather::to_fahrenheit_tool();
    assert_eq!(
        tool.spec().input_schema["properties"]["celsius"]["type"],
        "number"
    );
    assert_eq!(
        text(&call(&tool, json!({"celsius": 100.0})).await.unwrap()),
        "212"
    );
    assert_eq!(weather::to_fahrenheit(0.0).await, 32.0);
}

#[test]
fn a_doc_built_by_macros_becomes_the_description() {
    assert_eq!(
        weather::to_fahrenheit_tool().spec().description,
        "Converts degrees.\n Celsius to Fahrenheit."
    );
}
