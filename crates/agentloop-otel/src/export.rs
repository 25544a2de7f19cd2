//! The sink, its bounded queue and the exporting thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use agentloop::{Event, EventSink};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::spans::Spans;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`grpc`; default port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, the default; port 4318).
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies (`http/json`).
    HttpJson,
}

impl Protocol {
    /// Reads `grpc`, `http/protobuf` or `http/json`.
    pub fn parse(text: &str) -> Result<Protocol, OtelError> {
        match text.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => Ok(Protocol::HttpJson),
            other => Err(OtelError::Config {
                message: format!(
                    "unknown OTLP protocol {other:?}: use grpc, http/protobuf or http/json"
                ),
            }),
        }
    }
}

/// Why the exporter could not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// A setting is not usable (code `otel.config`).
    #[error("OpenTelemetry: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The exporter could not be built (code `otel.exporter`).
    #[error("OpenTelemetry exporter: {message}")]
    Exporter {
        /// What went wrong.
        message: String,
    },
}

impl OtelError {
    /// The stable code: `otel.config` or `otel.exporter`.
    pub fn code(&self) -> &'static str {
        match self {
            OtelError::Config { .. } => "otel.config",
            OtelError::Exporter { .. } => "otel.exporter",
        }
    }
}

/// What to export, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelConfig {
    /// The transport.
    pub protocol: Protocol,
    /// The collector's address; `None` reads `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`, else the
    /// protocol's default on localhost.
    pub endpoint: Option<String>,
    /// Record prompts, arguments, outputs and answers (redacted); off by default.
    pub payloads: bool,
    /// The most finished spans waiting for export; more are dropped and counted.
    pub queue: usize,
    /// The most spans one export sends.
    pub batch: usize,
    /// How long a span may wait for a batch to fill before it is sent.
    pub interval: Duration,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: None,
            payloads: false,
            queue: 2048,
            batch: 512,
            interval: Duration::from_millis(500),
        }
    }
}

impl OtelConfig {
    /// The configuration the standard environment variables give: the protocol from
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`, payloads from
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`. The endpoint, headers and timeout
    /// are read by the exporter itself.
    pub fn from_env() -> Result<OtelConfig, OtelError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            Some(p) => Protocol::parse(&p)?,
            None => Protocol::HttpProtobuf,
        };
        let payloads = var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Ok(OtelConfig {
            protocol,
            payloads,
            ..OtelConfig::default()
        })
    }
}

/// What the exporter did, as [`OtelSink::shutdown`] reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelReport {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans dropped because the queue was full.
    pub dropped: u64,
    /// Spans whose export failed (the collector was down or refused them).
    pub failed: u64,
    /// Spans queued and neither exported nor failed yet: after [`OtelSink::shutdown`], those
    /// still waiting or being exported when its time ran out (a collector that never answers).
    pub unsent: u64,
    /// The last export error, if any.
    pub last_error: Option<String>,
}

enum Msg {
    Span(Box<SpanData>),
    Flush(mpsc::Sender<()>),
}

#[derive(Default)]
struct Counters {
    /// Spans that went into the queue.
    queued: AtomicU64,
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// The sink: add it to an agent (or pass it to a run) to export the runs it sees.
pub struct OtelSink {
    spans: Mutex<Spans>,
    tx: Mutex<Option<SyncSender<Msg>>>,
    counters: Arc<Counters>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Disconnected when the exporting thread ends: a wait on it can have a deadline, a join
    /// cannot.
    ended: Mutex<Option<Receiver<()>>>,
}

impl std::fmt::Debug for OtelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtelSink").finish_non_exhaustive()
    }
}

impl OtelSink {
    /// Starts the exporting thread with an OTLP exporter built from `config` and the standard
    /// environment variables.
    pub fn start(config: OtelConfig) -> Result<OtelSink, OtelError> {
        let protocol = config.protocol;
        let endpoint = config.endpoint.clone();
        OtelSink::with_exporter(config, move || build_exporter(protocol, endpoint))
    }

    /// Starts the exporting thread with an exporter of the caller's (built on that thread, inside
    /// a Tokio runtime of its own, as the OTLP exporters need).
    pub fn with_exporter<E, F>(config: OtelConfig, build: F) -> Result<OtelSink, OtelError>
    where
        E: SpanExporter + 'static,
        F: FnOnce() -> Result<E, OtelError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let (ready_tx, ready_rx) = mpsc::channel();
        let worker_counters = Arc::clone(&counters);
        let (batch, interval) = (config.batch.max(1), config.interval);
        let (ended_tx, ended) = mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("agentloop-otel".into())
            .spawn(move || {
                // Dropped when the thread ends, however it ends.
                let _ended = ended_tx;
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(OtelError::Exporter {
                            message: format!("no runtime for the exporter: {e}"),
                        }));
                        return;
                    }
                };
                let built = {
                    let _entered = runtime.enter();
                    build()
                };
                let mut exporter = match built {
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                exporter.set_resource(
                    &Resource::builder()
                        .with_service_name(service_name())
                        .build(),
                );
                run_worker(&runtime, &exporter, &rx, &worker_counters, batch, interval);
                let _ = exporter.shutdown();
            })
            .map_err(|e| OtelError::Exporter {
                message: format!("cannot start the exporting thread: {e}"),
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(OtelError::Exporter {
                    message: "the exporting thread stopped before it was ready".into(),
                });
            }
        }
        Ok(OtelSink {
            spans: Mutex::new(Spans::new(config.payloads)),
            tx: Mutex::new(Some(tx)),
            counters,
            worker: Mutex::new(Some(worker)),
            ended: Mutex::new(Some(ended)),
        })
    }

    /// Exports what waits, within `timeout`; true when it all went. It never waits longer, a
    /// full queue in front of a collector that does not answer included.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let Some(tx) = self.sender() else {
            return true;
        };
        let (done_tx, done_rx) = mpsc::channel();
        let mut flush = Msg::Flush(done_tx);
        // A blocking send would wait on a full queue for as long as the exporter is stuck.
        loop {
            match tx.try_send(flush) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    flush = back;
                    std::thread::sleep(left.min(Duration::from_millis(5)));
                }
            }
        }
        done_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }

    /// Exports what waits and stops the exporting thread, within `timeout` as a whole, and
    /// reports. What is still queued or being exported when the time is up (a collector that
    /// accepts and never answers holds each export for the exporter's own timeout) is not waited
    /// for: it is counted in [`OtelReport::unsent`], and the thread is left to end on its own.
    pub fn shutdown(&self, timeout: Duration) -> OtelReport {
        let deadline = Instant::now() + timeout;
        // Closing the queue makes the thread export what it holds, then end.
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner()).take();
        let done = ended.is_none_or(|rx| {
            let left = deadline.saturating_duration_since(Instant::now());
            rx.recv_timeout(left) != Err(RecvTimeoutError::Timeout)
        });
        // A thread not done is detached (its handle dropped): the command ends without it.
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (true, Some(worker)) = (done, worker) {
            let _ = worker.join();
        }
        self.report()
    }

    /// What the exporter did so far.
    pub fn report(&self) -> OtelReport {
        let c = &self.counters;
        let (exported, failed) = (
            c.exported.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
        );
        OtelReport {
            exported,
            dropped: c.dropped.load(Ordering::Relaxed),
            failed,
            unsent: c
                .queued
                .load(Ordering::Relaxed)
                .saturating_sub(exported + failed),
            last_error: c
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn sender(&self) -> Option<SyncSender<Msg>> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl EventSink for OtelSink {
    fn emit(&self, event: &Event) {
        let finished = self
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on_event(event);
        if finished.is_empty() {
            return;
        }
        let Some(tx) = self.sender() else {
            self.counters
                .dropped
                .fetch_add(finished.len() as u64, Ordering::Relaxed);
            return;
        };
        for span in finished {
            // Counted before it goes: the thread may export it before `try_send` returns.
            self.counters.queued.fetch_add(1, Ordering::Relaxed);
            match tx.try_send(Msg::Span(Box::new(span))) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.counters.queued.fetch_sub(1, Ordering::Relaxed);
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for OtelSink {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "agentloop".into())
}

/// Batches the queue: a batch goes when it is full, when its oldest span has waited `interval`,
/// on a flush, and when the queue closes.
fn run_worker<E: SpanExporter>(
    runtime: &tokio::runtime::Runtime,
    exporter: &E,
    rx: &Receiver<Msg>,
    counters: &Counters,
    batch: usize,
    interval: Duration,
) {
    let mut pending: Vec<SpanData> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let send = |pending: &mut Vec<SpanData>| {
        if pending.is_empty() {
            return;
        }
        let spans = std::mem::take(pending);
        let n = spans.len() as u64;
        match runtime.block_on(exporter.export(spans)) {
            Ok(()) => {
                counters.exported.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                *counters
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) =
                    // An exporter's error may name the collector's URL, credentials and all.
                    Some(agentloop_observe::redact::redact_text(&e.to_string()));
            }
        }
    };
    loop {
        let wait = oldest.map_or(Duration::from_secs(3600), |o| {
            interval.saturating_sub(o.elapsed())
        });
        match rx.recv_timeout(wait) {
            Ok(Msg::Span(span)) => {
                pending.push(*span);
                oldest.get_or_insert_with(Instant::now);
                if pending.len() >= batch {
                    send(&mut pending);
                    oldest = None;
                }
            }
            Ok(Msg::Flush(done)) => {
                send(&mut pending);
                oldest = None;
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut pending);
                oldest = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut pending);
                return;
            }
        }
    }
}

fn build_exporter(
    protocol: Protocol,
    endpoint: Option<String>,
) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let failed = |e: opentelemetry_otlp::ExporterBuildError| OtelError::Exporter {
        message: e.to_string(),
    };
    match protocol {
        Protocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            b.build().map_err(failed)
        }
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let otlp = if protocol == Protocol::HttpJson {
                opentelemetry_otlp::Protocol::HttpJson
            } else {
                opentelemetry_otlp::Protocol::HttpBinary
            };
            // The exporter's headers (OTEL_EXPORTER_OTLP_HEADERS) are a collector's credentials,
            // and reqwest keeps custom headers across a redirect to another host: a collector
            // answers, it does not redirect, so none is followed.
            let client = reqwest::Client::builder()
                .timeout(export_timeout())
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| OtelError::Exporter {
                    message: format!("no HTTP client: {e}"),
                })?;
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(otlp)
                .with_http_client(crate::client::Client(client));
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            b.build().map_err(failed)
        }
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else 10 s.
fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse::<u64>().ok())
    .map_or(Duration::from_secs(10), Duration::from_millis)
}
