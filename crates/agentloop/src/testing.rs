//! Models for demos and tests: [`ScriptedModel`] answers with a fixed sequence of responses (from
//! code or JSON text; the CLI reads script files), [`FunctionModel`] calls a closure that sees each request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{AssistantMessage, Reasoning, ToolCall};
use crate::model::{
    CacheIdentity, FinishReason, Model, ModelError, ModelErrorKind, ModelEvent, ModelRequest,
    ModelResponse, ModelStream, Usage,
};

/// One step of a script: a response, or an error the model call fails with.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptStep {
    /// Answer with this response.
    Respond(ModelResponse),
    /// Fail with this error.
    Fail(ModelError),
}

/// One step as written in a script file.
///
/// ```json
/// [
///   {"tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}]},
///   {"text": "It is 18 °C in Paris.", "usage": {"input_tokens": 50, "output_tokens": 9}}
/// ]
/// ```
/// `arguments` is an object (serialized as the provider would) or a raw string sent as it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptFileStep {
    /// Visible text.
    #[serde(default)]
    pub text: Option<String>,
    /// Reasoning text.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// Tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ScriptFileCall>,
    /// Usage of this call.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// The finish reason (default: `tool_calls` when there are calls, else `stop`).
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    /// Fail the call with this error instead of answering.
    #[serde(default)]
    pub error: Option<ScriptFileError>,
    /// Wait this long before answering (simulated latency).
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// A tool call in a script file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptFileCall {
    /// The call id (generated when empty or missing).
    #[serde(default)]
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments: an object, or a raw JSON string.
    #[serde(default)]
    pub arguments: Value,
}

/// An error in a script file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptFileError {
    /// The kind (`rate_limited`, `server`, ...).
    pub kind: ModelErrorKind,
    /// The message.
    pub message: String,
}

impl ScriptFileStep {
    fn into_step(self) -> (ScriptStep, Option<Duration>) {
        let delay = self.delay_ms.map(Duration::from_millis);
        if let Some(e) = self.error {
            return (
                ScriptStep::Fail(ModelError::new(e.kind, e.message).with_provider("scripted")),
                delay,
            );
        }
        let tool_calls: Vec<ToolCall> = self
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                call_id: c.id.into(),
                tool: c.name.into(),
                arguments: match c.arguments {
                    Value::String(raw) => raw,
                    Value::Null => String::new(),
                    other => other.to_string(),
                },
            })
            .collect();
        let finish_reason = self.finish_reason.unwrap_or(if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        });
        let reasoning = self
            .reasoning
            .map(|text| {
                vec![Reasoning {
                    text,
                    ..Default::default()
                }]
            })
            .unwrap_or_default();
        // A response cut by the output limit (`finish_reason: "length"`) drops the calls it cut,
        // by the accumulator's rule, as a provider's stream would.
        let (cut_calls, tool_calls): (Vec<ToolCall>, Vec<ToolCall>) = tool_calls
            .into_iter()
            .partition(|c| crate::model::cut_by_the_limit(finish_reason, &c.arguments));
        let response = ModelResponse {
            message: AssistantMessage {
                reasoning,
                text: self.text.unwrap_or_default(),
                tool_calls,
            },
            usage: self.usage.unwrap_or_default(),
            finish_reason,
            raw_finish_reason: None,
            id: None,
            model: Some("scripted".into()),
            truncated: !cut_calls.is_empty(),
            cut_calls,
            warnings: Vec::new(),
            cached: false,
        };
        (ScriptStep::Respond(response), delay)
    }
}

/// A model that answers with a fixed sequence of responses, then fails with
/// [`ModelErrorKind::Exhausted`]. Cheap to clone; clones share the position in the script.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    inner: Arc<ScriptInner>,
}

#[derive(Debug)]
struct ScriptInner {
    id: String,
    steps: Vec<(ScriptStep, Option<Duration>)>,
    next: AtomicUsize,
    stream_deltas: bool,
}

impl ScriptedModel {
    /// A script of responses.
    pub fn new(responses: impl IntoIterator<Item = ModelResponse>) -> Self {
        Self::from_steps(responses.into_iter().map(ScriptStep::Respond))
    }

    /// A script of responses and failures.
    pub fn from_steps(steps: impl IntoIterator<Item = ScriptStep>) -> Self {
        Self::build(steps.into_iter().map(|s| (s, None)).collect(), false)
    }

    /// A script from JSON text (an array of [`ScriptFileStep`]).
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        let steps: Vec<ScriptFileStep> = serde_json::from_str(json)?;
        Ok(Self::build(
            steps.into_iter().map(ScriptFileStep::into_step).collect(),
            false,
        ))
    }

    fn build(steps: Vec<(ScriptStep, Option<Duration>)>, stream_deltas: bool) -> Self {
        ScriptedModel {
            inner: Arc::new(ScriptInner {
                id: "scripted".into(),
                steps,
                next: AtomicUsize::new(0),
                stream_deltas,
            }),
        }
    }

    /// Streams each response as deltas (text in pieces, tool calls as start and argument
    /// pieces), as a provider would, instead of one whole response.
    #[must_use]
    pub fn streaming(self, yes: bool) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|arc| ScriptInner {
            id: arc.id.clone(),
            steps: arc.steps.clone(),
            next: AtomicUsize::new(arc.next.load(Ordering::Relaxed)),
            stream_deltas: arc.stream_deltas,
        });
        ScriptedModel {
            inner: Arc::new(ScriptInner {
                stream_deltas: yes,
                ..inner
            }),
        }
    }

    /// Goes on from step `n` of the script, as if `n` calls were made: a resumed run's model
    /// picks up where its journal left it.
    #[must_use]
    pub fn skip(self, n: usize) -> Self {
        self.inner.next.store(n, Ordering::Relaxed);
        self
    }

    /// How many calls were made so far.
    pub fn calls(&self) -> usize {
        self.inner.next.load(Ordering::Relaxed)
    }

    /// How many steps the script holds.
    pub fn len(&self) -> usize {
        self.inner.steps.len()
    }

    /// True for an empty script.
    pub fn is_empty(&self) -> bool {
        self.inner.steps.is_empty()
    }
}

impl Model for ScriptedModel {
    fn id(&self) -> &str {
        &self.inner.id
    }

    /// A script of its own that goes on at step `model_calls`.
    fn resumed(&self, model_calls: usize) -> Option<Arc<dyn Model>> {
        let inner = ScriptInner {
            id: self.inner.id.clone(),
            steps: self.inner.steps.clone(),
            next: AtomicUsize::new(model_calls),
            stream_deltas: self.inner.stream_deltas,
        };
        Some(Arc::new(ScriptedModel {
            inner: Arc::new(inner),
        }))
    }

    fn provider(&self) -> &str {
        "scripted"
    }

    /// Its script: what it answers depends on nothing else, so two scripts never share a
    /// cache's answers.
    fn cache_identity(&self, _request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        let steps: Vec<serde_json::Value> = self
            .inner
            .steps
            .iter()
            .map(|(step, _)| match step {
                ScriptStep::Respond(r) => serde_json::json!({ "respond": r }),
                ScriptStep::Fail(e) => serde_json::json!({ "fail": e }),
            })
            .collect();
        Some(CacheIdentity::of(&serde_json::Value::Array(steps)))
    }

    fn stream<'a>(&'a self, _request: ModelRequest<'a>) -> ModelStream<'a> {
        let at = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let Some((step, delay)) = self.inner.steps.get(at) else {
            let err = ModelError::new(
                ModelErrorKind::Exhausted,
                format!(
                    "the script has {} responses and all were used",
                    self.inner.steps.len()
                ),
            )
            .with_provider("scripted");
            return Box::pin(stream::iter([Err(err)]));
        };
        let events: Vec<Result<ModelEvent, ModelError>> = match step {
            ScriptStep::Fail(e) => vec![Err(e.clone())],
            ScriptStep::Respond(r) if self.inner.stream_deltas => crate::model::replay_events(r),
            ScriptStep::Respond(r) => vec![Ok(ModelEvent::Response(r.clone()))],
        };
        match delay {
            Some(d) => {
                let d = *d;
                Box::pin(futures::StreamExt::flatten(stream::once(async move {
                    tokio::time::sleep(d).await;
                    stream::iter(events)
                })))
            }
            None => Box::pin(stream::iter(events)),
        }
    }
}

type ResponderFn = dyn Fn(&ModelRequest<'_>) -> Result<ModelResponse, ModelError> + Send + Sync;

/// A model whose answers come from a closure that sees each request.
#[derive(Clone)]
pub struct FunctionModel {
    id: String,
    f: Arc<ResponderFn>,
}

impl std::fmt::Debug for FunctionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionModel")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl FunctionModel {
    /// A model answering with `f(request)`.
    pub fn new<F>(f: F) -> Self
    where
        F: Fn(&ModelRequest<'_>) -> Result<ModelResponse, ModelError> + Send + Sync + 'static,
    {
        FunctionModel {
            id: "function".into(),
            f: Arc::new(f),
        }
    }

    /// Sets the model id (for pricing and events).
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
}

impl Model for FunctionModel {
    fn id(&self) -> &str {
        &self.id
    }

    fn provider(&self) -> &str {
        "function"
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let result = (self.f)(&request).map(ModelEvent::Response);
        Box::pin(stream::iter([result]))
    }
}
