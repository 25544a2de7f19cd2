//! OpenTelemetry export of agentloop runs: an [`agentloop::EventSink`] that turns a run's events
//! into spans of the OpenTelemetry GenAI semantic conventions and exports them over OTLP.
//!
//! The conventions are those of semantic-conventions [`SEMCONV_VERSION`] (`docs/gen-ai`, status
//! Development): `invoke_agent {agent}` for a run, `chat {model}` for each model call (and for a
//! compaction's summary call, marked `agentloop.compaction`), `execute_tool {tool}` for each tool
//! call. A tool call's span is a child of its run's; a subagent's run is a child of the tool call
//! that started it, in the same trace. Attributes follow the conventions (`gen_ai.operation.name`,
//! `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.agent.name`, token usage, finish
//! reasons, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `error.type`), with agentloop's own under
//! `agentloop.*` (run id, stop reason, cost). Prompts, arguments, outputs and answers
//! (`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
//! `gen_ai.tool.call.result`) are recorded only with [`OtelConfig::payloads`], redacted like trace
//! payloads; secrets never.
//!
//! Exporting never blocks or slows the run: a finished span goes into a bounded queue (never
//! waited on); a thread of its own batches the queue and exports it. A span that finds the queue
//! full is dropped and counted, and [`OtelSink::shutdown`] reports what was exported, dropped and
//! failed. Shutting down takes at most the time it is given, whatever the collector does: what
//! it had no time for is reported as unsent.
//!
//! Configuration follows the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default,
//! `http/json` or `grpc`), `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`; and
//! `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` for payloads.
#![forbid(unsafe_code)]

mod client;
mod export;
mod spans;

pub use export::{OtelConfig, OtelError, OtelReport, OtelSink, Protocol};

/// The version of the OpenTelemetry semantic conventions whose GenAI spans this crate writes.
pub const SEMCONV_VERSION: &str = "1.41.0";
