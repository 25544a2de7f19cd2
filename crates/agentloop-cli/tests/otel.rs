#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `--otel` against a real OTLP receiver on loopback (`scripts/otel/receiver.sh`: the official
//! `opentelemetry-proto` classes with `grpcio`, installed from PyPI into the cache): OTLP/HTTP
//! (protobuf and JSON) and OTLP/gRPC, the GenAI span names, their nesting (a subagent's run under
//! the tool call that started it), their attributes, and no payload unless asked for.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

use serde_json::Value;
use support::repo;

/// The receiver: it stops when its stdin closes.
struct Receiver {
    child: Child,
    stdin: Option<ChildStdin>,
    http: u16,
    grpc: u16,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    fn start() -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let mut child = Command::new(repo().join("scripts/otel/receiver.sh"))
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"ready"), "the receiver said {line:?}");
        Receiver {
            stdin: child.stdin.take(),
            child,
            http: words[1].parse().unwrap(),
            grpc: words[2].parse().unwrap(),
            out,
            _dir: dir,
        }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(agent: &str, input: &str, env: &[(&str, String)], extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(["run", agent, "--input", input, "--json", "--otel"])
        .args(extra)
        .current_dir(repo())
        .env("OTEL_SERVICE_NAME", "agentloop-test")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn by_name<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

const QUICKSTART: &str = "examples/quickstart/agent.toml";
const QUESTION: &str = "Compare the weather in Paris and Lisbon, in Fahrenheit.";

#[test]
fn a_run_is_exported_as_genai_spans_over_http_and_grpc_without_payloads() {
    let receiver = Receiver::start();
    for (protocol, port) in [
        ("http/protobuf", receiver.http),
        ("http/json", receiver.http),
        ("grpc", receiver.grpc),
    ] {
        let out = run(
            QUICKSTART,
            QUESTION,
            &[
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("http://127.0.0.1:{port}"),
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.into()),
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{protocol}: {stderr}");
        assert!(!stderr.contains("OpenTelemetry"), "{protocol}: {stderr}");
    }
    let all = receiver.spans();
    for transport in ["http/protobuf", "http/json", "grpc"] {
        let spans: Vec<Value> = all
            .iter()
            .filter(|s| s["transport"] == transport)
            .cloned()
            .collect();
        let runs = by_name(&spans, "invoke_agent weather");
        assert_eq!(runs.len(), 1, "{transport}: {spans:#?}");
        let run = runs[0];
        let a = &run["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
        assert_eq!(a["gen_ai.agent.name"], "weather");
        assert_eq!(a["agentloop.stop_reason"], "finished");
        assert_eq!(a["gen_ai.usage.input_tokens"], 182 + 268 + 331 + 402);
        assert_eq!(run["parent_span_id"], "", "a top-level run has no parent");
        assert_eq!(run["resource"]["service.name"], "agentloop-test");
        assert_eq!(run["status"]["code"], 1, "ok");

        let chats = by_name(&spans, "chat scripted");
        assert_eq!(chats.len(), 4, "{transport}");
        let tools: Vec<&Value> = spans
            .iter()
            .filter(|s| s["name"].as_str().unwrap().starts_with("execute_tool "))
            .collect();
        assert_eq!(tools.len(), 5, "{transport}: {spans:#?}");
        for s in chats.iter().chain(tools.iter()) {
            assert_eq!(s["trace_id"], run["trace_id"], "{transport}: one trace");
            assert_eq!(
                s["parent_span_id"], run["span_id"],
                "{transport}: under the run"
            );
            assert!(s["start_ns"].as_u64() <= s["end_ns"].as_u64());
        }
        let first = chats[0]["attributes"].clone();
        assert_eq!(first["gen_ai.operation.name"], "chat");
        assert_eq!(first["gen_ai.provider.name"], "scripted");
        assert_eq!(first["gen_ai.usage.input_tokens"], 182);
        assert_eq!(first["gen_ai.usage.output_tokens"], 41);
        assert_eq!(
            first["gen_ai.response.finish_reasons"],
            serde_json::json!(["tool_calls"])
        );
        assert_eq!(chats[0]["kind"], 3, "a chat span is a client span");
        let weather = tools
            .iter()
            .find(|t| t["attributes"]["gen_ai.tool.call.id"] == "call_paris")
            .unwrap();
        assert_eq!(weather["name"], "execute_tool get_weather");
        assert_eq!(weather["attributes"]["gen_ai.tool.name"], "get_weather");
        assert_eq!(
            weather["attributes"]["gen_ai.operation.name"],
            "execute_tool"
        );
        // The misspelled unit fails: an error span with its type.
        let failed = tools
            .iter()
            .find(|t| t["attributes"]["gen_ai.tool.call.id"] == "call_conv1")
            .unwrap();
        assert_eq!(failed["status"]["code"], 2, "error");
        assert!(failed["attributes"]["error.type"].is_string());
        // No payload without the switch.
        for s in &spans {
            let keys: Vec<&String> = s["attributes"].as_object().unwrap().keys().collect();
            for payload in [
                "gen_ai.input.messages",
                "gen_ai.output.messages",
                "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result",
            ] {
                assert!(!keys.iter().any(|k| *k == payload), "{payload} in {s:#}");
            }
            assert!(!s.to_string().contains("Lisbon is warmer"), "{s:#}");
        }
    }
}

#[test]
fn payloads_go_only_when_asked_and_a_subagent_nests_under_its_tool_call() {
    let receiver = Receiver::start();
    let endpoint = [(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", receiver.http),
    )];
    let out = run(QUICKSTART, QUESTION, &endpoint, &["--otel-payloads"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans();
    let run_span = by_name(&spans, "invoke_agent weather")[0];
    assert!(
        run_span["attributes"]["gen_ai.input.messages"]
            .as_str()
            .unwrap()
            .contains("Compare the weather")
    );
    assert!(
        run_span["attributes"]["gen_ai.output.messages"]
            .as_str()
            .unwrap()
            .contains("Lisbon is warmer")
    );
    let args: Vec<&str> = spans
        .iter()
        .filter_map(|s| s["attributes"]["gen_ai.tool.call.arguments"].as_str())
        .collect();
    assert!(args.iter().any(|a| a.contains("Paris")), "{args:?}");

    let team = run(
        "examples/team/coordinator.toml",
        "Compare the weather in Paris and Lisbon.",
        &endpoint,
        &[],
    );
    assert_eq!(
        team.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&team.stderr)
    );
    let spans = receiver.spans();
    let coordinator = by_name(&spans, "invoke_agent coordinator")[0];
    let ask: HashMap<String, &Value> = spans
        .iter()
        .filter(|s| s["name"].as_str().unwrap().starts_with("execute_tool ask_"))
        .map(|s| (s["name"].as_str().unwrap().to_owned(), s))
        .collect();
    assert_eq!(ask.len(), 2, "{spans:#?}");
    for (worker, tool) in [
        ("paris-worker", "execute_tool ask_paris"),
        ("lisbon-worker", "execute_tool ask_lisbon"),
    ] {
        let sub = by_name(&spans, &format!("invoke_agent {worker}"))[0];
        assert_eq!(
            sub["trace_id"], coordinator["trace_id"],
            "one trace for the tree"
        );
        assert_eq!(
            sub["parent_span_id"], ask[tool]["span_id"],
            "{worker} under {tool}"
        );
        assert_eq!(ask[tool]["parent_span_id"], coordinator["span_id"]);
        let worker_tools: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_span_id"] == sub["span_id"])
            .collect();
        assert!(!worker_tools.is_empty(), "{worker} has its own spans");
    }
}

#[test]
fn a_collector_that_is_down_costs_a_warning_not_the_run() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(
        QUICKSTART,
        QUESTION,
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["stop_reason"], "finished");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spans not exported"), "{stderr}");

    let bad = run(
        QUICKSTART,
        QUESTION,
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon".into())],
        &[],
    );
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    let error: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(error["error"]["code"], "cli.usage");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("carrier-pigeon")
    );
}

/// A hand-off is an event on the top run's span naming both agents, and the agent handed to
/// runs as a child span under the hand-off's tool call, in the same trace.
#[test]
fn a_handoff_is_an_event_on_the_run_and_the_second_agent_nests_under_it() {
    let receiver = Receiver::start();
    let endpoint = [(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", receiver.http),
    )];
    let out = run(
        "examples/handoff/agent.toml",
        "I was charged twice for invoice 7.",
        &endpoint,
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["answered_by"], "billing", "{outcome}");
    let spans = receiver.spans();
    let triage = by_name(&spans, "invoke_agent triage")[0];
    let handoffs: Vec<&Value> = triage["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "agentloop.handoff")
        .collect();
    assert_eq!(handoffs.len(), 1, "{triage:#}");
    let event = &handoffs[0]["attributes"];
    assert_eq!(event["agentloop.handoff.from"], "triage");
    assert_eq!(event["agentloop.handoff.to"], "billing");
    assert_eq!(event["agentloop.handoff.answered_by"], "billing");
    assert_eq!(event["gen_ai.tool.name"], "transfer_to_billing");
    assert_eq!(event["gen_ai.tool.call.id"], "call_handoff");
    let transfer = by_name(&spans, "execute_tool transfer_to_billing")[0];
    assert_eq!(transfer["parent_span_id"], triage["span_id"]);
    let billing = by_name(&spans, "invoke_agent billing")[0];
    assert_eq!(billing["trace_id"], triage["trace_id"], "one trace");
    assert_eq!(billing["parent_span_id"], transfer["span_id"]);
    assert_eq!(
        event["agentloop.handoff.run_id"], billing["attributes"]["agentloop.run_id"],
        "the event names the second agent's run: {billing:#}"
    );
}

/// `agentloop run` of the quickstart with `--json --otel`, exporting to a collector that
/// accepts the connection and never answers (a hung proxy, a firewall that drops), each export
/// allowed a minute.
fn run_exporting_to_a_silent_collector() -> std::process::Command {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts, keeps every connection open, reads nothing and answers nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
    run.args(["run", QUICKSTART, "--input", QUESTION, "--json", "--otel"])
        .current_dir(repo())
        .env("OTEL_SERVICE_NAME", "agentloop-test")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        // Each export would wait a minute: the end of the command must not.
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .stdin(std::process::Stdio::null());
    run
}

/// A collector that never answers holds each export for the exporter's timeout: the command
/// still ends within its flush bound, its outcome printed, what was not exported said on
/// stderr.
#[test]
fn a_collector_that_never_answers_holds_the_command_only_for_the_flush_bound() {
    let started = std::time::Instant::now();
    let out = assert_cmd::Command::from_std(run_exporting_to_a_silent_collector())
        .timeout(std::time::Duration::from_secs(90))
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < std::time::Duration::from_secs(15),
        "the command took {took:?}: {stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["stop_reason"], "finished");
    assert!(stderr.contains("spans not exported"), "{stderr}");
}

/// The wait for a collector that never answers ends at a stop signal, as at Ctrl-C: a service
/// manager's SIGTERM is not held for the flush bound, and the command exits with its code.
#[test]
fn sigterm_ends_the_wait_for_a_collector_that_never_answers_at_once() {
    let mut run = run_exporting_to_a_silent_collector()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The outcome is printed before the wait: its line says the wait has begun.
    let mut stdout = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let body: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(body["stop_reason"], "finished");
    let stop = std::time::Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = run.wait_with_output().unwrap();
    let took = stop.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < std::time::Duration::from_secs(3),
        "{took:?}: {stderr}"
    );
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("SIGTERM: quitting"), "{stderr}");
}
