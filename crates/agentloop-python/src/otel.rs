//! `Agent(otel=True)`: the agent's runs as OpenTelemetry GenAI spans over OTLP, as the CLI's
//! `--otel` exports them (the same sink, set up from the same `OTEL_EXPORTER_OTLP_*` variables).
//! Each run's spans are flushed when it ends, so they have reached the collector when the run's
//! outcome reaches Python; what could not be sent is said on stderr, never the run's failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentloop::EventSink;
use agentloop_otel::{OtelConfig, OtelSink};
use pyo3::PyResult;

use crate::error;

/// How long the end of a run waits for its spans to reach the collector (as the CLI's end does).
const FLUSH: Duration = Duration::from_secs(5);

/// The exporter of one agent, shared by its runs.
pub(crate) struct Otel {
    sink: Arc<OtelSink>,
    /// The dropped and failed counts already said on stderr: each run says only its own.
    said: [AtomicU64; 2],
}

impl Otel {
    /// Starts the exporter from the standard environment variables; `payloads` records
    /// prompts, arguments and answers (redacted), as `--otel-payloads`.
    pub(crate) fn start(payloads: bool) -> PyResult<Arc<Otel>> {
        let mut config = OtelConfig::from_env().map_err(|e| error(e.code(), e))?;
        config.payloads |= payloads;
        let sink = OtelSink::start(config).map_err(|e| error(e.code(), e))?;
        Ok(Arc::new(Otel {
            sink: Arc::new(sink),
            said: [AtomicU64::new(0), AtomicU64::new(0)],
        }))
    }

    /// The sink to add to a run.
    pub(crate) fn sink(&self) -> Arc<dyn EventSink> {
        Arc::clone(&self.sink) as Arc<dyn EventSink>
    }

    /// Sends what the run left waiting (this blocks: call it off the runtime's workers) and
    /// says on stderr what was dropped or not exported since the last time.
    pub(crate) fn flush(&self) {
        self.sink.flush(FLUSH);
        let report = self.sink.report();
        let [dropped, failed] = &self.said;
        let new_dropped = report
            .dropped
            .saturating_sub(dropped.swap(report.dropped, Ordering::Relaxed));
        if new_dropped > 0 {
            eprintln!(
                "agentloop: warning: OpenTelemetry: {new_dropped} spans dropped (the export queue was full)"
            );
        }
        let new_failed = report
            .failed
            .saturating_sub(failed.swap(report.failed, Ordering::Relaxed));
        if new_failed > 0 {
            eprintln!(
                "agentloop: warning: OpenTelemetry: {new_failed} spans not exported: {}",
                report.last_error.as_deref().unwrap_or("unknown error")
            );
        }
    }

    /// Exports what waits and stops the exporting thread (`Agent.close`).
    pub(crate) fn shutdown(&self) {
        self.flush();
        self.sink.shutdown(FLUSH);
    }
}
