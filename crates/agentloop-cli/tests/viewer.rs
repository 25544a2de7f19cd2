#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop trace serve` end to end in a real headless browser (Debian's Chromium, which
//! `.ci/run` installs): the run list, a run's timeline with every call (the failed one marked),
//! the subagent tree, a run appended while the viewer serves, and a screenshot kept as an
//! artifact (`$CARGO_TARGET_TMPDIR/trace-viewer.png`).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use support::repo;

fn agentloop(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn chromium() -> PathBuf {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "Chromium is needed for the viewer's browser test: .ci/run installs Debian's `chromium`"
        )
    })
}

/// The page after its scripts ran, or a screenshot of it.
fn browse(url: &str, profile: &Path, screenshot: Option<&Path>) -> String {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=8000",
        "--window-size=1400,1400",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    match screenshot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd.arg(url).stderr(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Viewer {
    child: Child,
    url: String,
}

impl Viewer {
    fn start(trace: &Path) -> Viewer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["trace", "serve"])
            .arg(trace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut url = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut url)
            .unwrap();
        let url = url.trim().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        Viewer { child, url }
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runs(trace: &Path) -> Vec<Value> {
    let out = agentloop(&["trace", "list", trace.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn the_viewer_lists_runs_shows_each_calls_timeline_and_follows_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.ndjson");
    let t = trace.to_str().unwrap();
    let question = "Compare the weather in Paris and Lisbon, in Fahrenheit.";
    let run = |agent: &str| {
        let out = agentloop(&[
            "run",
            agent,
            "--input",
            question,
            "--trace",
            t,
            "--trace-payloads",
            "--quiet",
        ]);
        assert_eq!(out.status.code(), Some(0));
    };
    run("examples/quickstart/agent.toml");
    run("examples/team/coordinator.toml");
    let listed = runs(&trace);
    assert_eq!(
        listed.len(),
        4,
        "quickstart, coordinator and its two workers"
    );

    let viewer = Viewer::start(&trace);
    let profile = dir.path().join("profile");
    let page = browse(&viewer.url, &profile, None);
    for r in &listed {
        let id = r["id"].as_str().unwrap();
        assert!(
            page.contains(&format!("data-run-id=\"{id}\"")),
            "{id} not listed:\n{page}"
        );
    }

    // The quickstart's run: every call on the timeline, the failed conversion marked.
    let quick = listed.iter().find(|r| r["agent"] == "weather").unwrap();
    let url = format!("{}#/run/{}", viewer.url, quick["id"].as_str().unwrap());
    let page = browse(&url, &profile, None);
    for call in [
        "call_paris",
        "call_lisbon",
        "call_conv1",
        "call_conv2",
        "call_conv3",
    ] {
        assert!(
            page.contains(&format!("data-call-id=\"{call}\"")),
            "{call} missing:\n{page}"
        );
    }
    assert!(
        page.contains("class=\"bar tool_call error\" style=")
            && page.contains("data-call-id=\"call_conv1\""),
        "the failed call is not marked:\n{page}"
    );
    assert!(
        page.contains("Lisbon is warmer"),
        "the recorded output is shown"
    );
    assert_eq!(page.matches("class=\"row turn\"").count(), 4, "four turns");

    // The coordinator's run: its subagents nested under it, each under its tool call.
    let coordinator = listed.iter().find(|r| r["agent"] == "coordinator").unwrap();
    let url = format!(
        "{}#/run/{}",
        viewer.url,
        coordinator["id"].as_str().unwrap()
    );
    let page = browse(&url, &profile, None);
    assert!(page.contains("subagent paris-worker"), "{page}");
    assert!(page.contains("subagent lisbon-worker"), "{page}");
    assert!(page.contains("ask_paris"));
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trace-viewer.png");
    let _ = std::fs::remove_file(&shot);
    browse(&url, &profile, Some(&shot));
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("screenshot: {}", shot.display());

    // A run written while the viewer serves shows up.
    run("examples/quickstart/agent.toml");
    let now = runs(&trace);
    assert_eq!(now.len(), 5);
    let page = browse(&viewer.url, &profile, None);
    let newest = now.last().unwrap()["id"].as_str().unwrap();
    assert!(
        page.contains(&format!("data-run-id=\"{newest}\"")),
        "{page}"
    );

    // A hand-off: the agent handed to is headed as such under the run, not as a subagent.
    let handoff_trace = dir.path().join("handoff.ndjson");
    let out = agentloop(&[
        "run",
        "examples/handoff/agent.toml",
        "--input",
        "I was charged twice for invoice 7.",
        "--trace",
        handoff_trace.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let listed = runs(&handoff_trace);
    let triage = listed.iter().find(|r| r["agent"] == "triage").unwrap();
    let viewer = Viewer::start(&handoff_trace);
    let url = format!("{}#/run/{}", viewer.url, triage["id"].as_str().unwrap());
    let page = browse(&url, &profile, None);
    assert!(page.contains("<h2>hand-off to billing"), "{page}");
    assert!(!page.contains("<h2>subagent billing"), "{page}");
}

#[test]
fn an_unreadable_trace_is_refused_before_serving() {
    let out = agentloop(&["trace", "serve", "/nonexistent/trace.ndjson"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the trace"));
}
