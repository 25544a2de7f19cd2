#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The sink never waits on the exporter: with the exporter stuck, spans past the queue's bound
//! are dropped and counted, and every span is either exported or counted as dropped.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{Event, EventKind, EventSink};
use agentloop_otel::{OtelConfig, OtelSink};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// An exporter that waits for a go-ahead before its first export, then keeps what it gets.
#[derive(Debug)]
struct Stuck {
    gate: Mutex<Option<mpsc::Receiver<()>>>,
    got: Arc<Mutex<Vec<String>>>,
}

impl SpanExporter for Stuck {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        if let Some(gate) = self.gate.lock().unwrap().take() {
            let _ = gate.recv();
        }
        self.got
            .lock()
            .unwrap()
            .extend(batch.into_iter().map(|s| s.name.into_owned()));
        std::future::ready(Ok(()))
    }
}

fn event(kind: EventKind) -> Event {
    Event {
        run_id: Arc::from("r1"),
        turn: 1,
        kind,
    }
}

/// A run that starts, then `calls` rejected calls: each ends a span at once.
fn emit_rejected_calls(sink: &OtelSink, calls: usize) {
    sink.emit(&event(EventKind::RunStarted {
        agent: "a".into(),
        model: "m".into(),
        parent_run_id: None,
        parent_call_id: None,
        input: "hi".into(),
    }));
    for i in 0..calls {
        sink.emit(&event(EventKind::ToolRejected {
            call_id: format!("c{i}"),
            tool: "t".into(),
            code: "tool.unknown".into(),
            reason: "no such tool".into(),
            outcome: agentloop::outcome::CallOutcome::rejected("tool.unknown", "no such tool"),
        }));
    }
}

#[test]
fn a_stuck_exporter_never_blocks_the_run_and_drops_are_counted() {
    let (go, gate) = mpsc::channel();
    let got = Arc::new(Mutex::new(Vec::new()));
    let exporter = Stuck {
        gate: Mutex::new(Some(gate)),
        got: Arc::clone(&got),
    };
    let config = OtelConfig {
        queue: 4,
        batch: 1,
        interval: Duration::from_millis(1),
        ..OtelConfig::default()
    };
    let sink = OtelSink::with_exporter(config, move || Ok(exporter)).unwrap();
    const CALLS: usize = 100;
    emit_rejected_calls(&sink, CALLS);
    // Every emit above returned while the exporter was stuck.
    let before = sink.report();
    assert!(before.dropped >= (CALLS - 5) as u64, "{before:?}");
    go.send(()).unwrap();
    let report = sink.shutdown(Duration::from_secs(30));
    assert_eq!(report.exported + report.dropped, CALLS as u64, "{report:?}");
    assert_eq!(got.lock().unwrap().len() as u64, report.exported);
    assert!(got.lock().unwrap().iter().all(|n| n == "execute_tool t"));
}

/// A collector that never answers holds each export for the exporter's own timeout (10 s by
/// default); the end of a command must not wait for all of them.
#[test]
fn shutdown_keeps_to_its_time_while_an_export_hangs_and_counts_the_rest_unsent() {
    // The go-ahead never comes: the first export hangs for as long as the test runs.
    let (_go, gate) = mpsc::channel::<()>();
    let exporter = Stuck {
        gate: Mutex::new(Some(gate)),
        got: Arc::new(Mutex::new(Vec::new())),
    };
    let config = OtelConfig {
        batch: 1,
        interval: Duration::from_millis(1),
        ..OtelConfig::default()
    };
    let sink = OtelSink::with_exporter(config, move || Ok(exporter)).unwrap();
    const CALLS: usize = 3;
    emit_rejected_calls(&sink, CALLS);
    let started = std::time::Instant::now();
    let report = sink.shutdown(Duration::from_millis(300));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    assert_eq!(report.exported, 0, "{report:?}");
    assert_eq!(report.unsent, CALLS as u64, "{report:?}");
}
