//! `--otel`: the runs as OpenTelemetry spans, exported while they run, flushed at the end; what
//! could not be exported is reported on stderr, never on stdout and never as the run's failure.

use std::sync::Arc;

use agentloop::EventSink;

use crate::error::CliError;

/// How long the end of a command waits for the last spans to reach the collector, in all: what
/// has not gone by then is reported unsent, not waited for.
const FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// The exporter of one command.
pub(crate) struct Otel {
    #[cfg(feature = "otel")]
    sink: Arc<agentloop_otel::OtelSink>,
}

impl Otel {
    /// Starts the exporter from the standard environment variables.
    #[cfg(feature = "otel")]
    pub(crate) fn start(payloads: bool) -> Result<Otel, CliError> {
        let mut config = agentloop_otel::OtelConfig::from_env().map_err(usage)?;
        config.payloads |= payloads;
        let sink = agentloop_otel::OtelSink::start(config).map_err(usage)?;
        Ok(Otel {
            sink: Arc::new(sink),
        })
    }

    /// Without the `otel` feature there is nothing to start.
    #[cfg(not(feature = "otel"))]
    pub fn start(_payloads: bool) -> Result<Otel, CliError> {
        Err(CliError::Usage {
            message: "this agentloop was built without the `otel` feature".into(),
        })
    }

    /// The sink to add to a run.
    pub(crate) fn sink(&self) -> Arc<dyn EventSink> {
        #[cfg(feature = "otel")]
        {
            self.sink.clone()
        }
        #[cfg(not(feature = "otel"))]
        {
            Arc::new(|_: &agentloop::Event| {})
        }
    }

    /// Sends what waits (for [`FLUSH`] at most) and says on stderr what could not be sent. The
    /// run's outcome is shown before: this wait holds only the exit. A stop signal ends the
    /// wait, and the command, at once, with its code (Ctrl-C 130, SIGTERM 143, SIGHUP 129):
    /// the command's handler of them, told the outcome is shown ([`crate::runs::Stopped::shown`]),
    /// quits at the next. Its handler it must be: once tokio's is installed, the signals'
    /// default actions are gone for good, and a handler installed only here would miss a signal
    /// sent as the outcome was printed.
    pub(crate) fn finish(self) {
        #[cfg(feature = "otel")]
        {
            let report = self.sink.shutdown(FLUSH);
            if report.dropped > 0 {
                err!(
                    "agentloop: warning: OpenTelemetry: {} spans dropped (the export queue was full)",
                    report.dropped
                );
            }
            if report.unsent > 0 {
                err!(
                    "agentloop: warning: OpenTelemetry: {} spans not exported: the collector did not answer within {} s",
                    report.unsent,
                    FLUSH.as_secs()
                );
            }
            if report.failed > 0 {
                err!(
                    "agentloop: warning: OpenTelemetry: {} spans not exported: {}",
                    report.failed,
                    report.last_error.as_deref().unwrap_or("unknown error")
                );
            }
        }
    }
}

#[cfg(feature = "otel")]
fn usage(e: agentloop_otel::OtelError) -> CliError {
    CliError::Usage {
        message: e.to_string(),
    }
}
