#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop eval`: the example suites (`examples/quickstart`, `examples/coder`) pass on their
//! scripted models with their tools really running; the quickstart suite with a changed script
//! fails naming the check and its reason, and is named worse than a baseline; repeats give
//! pass@k and pass^k; a judge agent's verdict counts, its cost apart; the runs are in the trace
//! under the report's run ids; JUnit XML for CI.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::copy_dir;

/// A copy of an example, so that its runs write nothing in the repository.
fn example(name: &str) -> tempfile::TempDir {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&from, dir.path());
    dir
}

fn eval(dir: &Path, cases: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .current_dir(dir)
        .args(["eval", "agent.toml", "--cases", cases])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn failures(report: &Value) -> Vec<String> {
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["runs"].as_array().unwrap().clone())
        .flat_map(|r| r["checks"].as_array().unwrap().clone())
        .filter(|c| c["passed"] == false)
        .map(|c| format!("{}: {}", c["check"], c["reason"]))
        .collect()
}

#[test]
fn the_quickstart_suite_passes_its_ten_cases_with_junit_and_the_runs_in_the_trace() {
    let dir = example("quickstart");
    let junit = dir.path().join("junit.xml");
    let out = eval(
        dir.path(),
        "evals.toml",
        &["--json", "--junit", "junit.xml", "--trace", "runs.ndjson"],
    );
    let report = json(&out);
    assert_eq!(out.status.code(), Some(0), "{:#?}", failures(&report));
    assert_eq!(report["suite"], "quickstart");
    assert_eq!(report["summary"]["cases"], 10);
    assert_eq!(report["summary"]["runs"], 10);
    assert_eq!(report["summary"]["pass_rate"], 1.0);
    let first = &report["cases"][0];
    assert_eq!(first["name"], "compare_paris_lisbon");
    assert_eq!(first["runs"][0]["turns"], 4);
    assert_eq!(
        first["runs"][0]["tool_calls"],
        serde_json::json!([
            "get_weather",
            "get_weather",
            "convert_temperature",
            "convert_temperature",
            "convert_temperature"
        ])
    );
    // The script's usage: 182+41 + 268+22 + 331+48 + 402+25 tokens.
    assert_eq!(first["tokens"]["mean"], 1319.0);
    let limited = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "too_many_calls_stop_the_run")
        .unwrap();
    assert_eq!(limited["runs"][0]["stop_reason"], "max_tool_calls");

    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 10, "{xml}");
    assert!(!xml.contains("<failure"), "{xml}");
    assert!(xml.contains("name=\"compare_paris_lisbon\""), "{xml}");

    // Every case's run is in the trace, under the id the report gives it.
    let listed = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .current_dir(dir.path())
        .args(["trace", "list", "runs.ndjson", "--json"])
        .output()
        .unwrap();
    let runs = json(&listed);
    let traced: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    for c in report["cases"].as_array().unwrap() {
        let id = c["runs"][0]["run_id"].as_str().unwrap();
        assert!(traced.contains(&id), "{id} not in {traced:?}");
    }
}

#[test]
fn the_coder_suite_passes_with_its_tools_and_permissions_really_at_work() {
    let dir = example("coder");
    let out = eval(dir.path(), "evals.toml", &["--json"]);
    let report = json(&out);
    assert_eq!(out.status.code(), Some(0), "{:#?}", failures(&report));
    assert_eq!(report["summary"]["cases"], 10);
    assert_eq!(report["summary"]["passed_runs"], 10);
    let program = std::fs::read_to_string(dir.path().join("workspace/calc.py")).unwrap();
    assert!(program.contains("return a + b"), "{program}");
    // The write outside the workspace was refused.
    assert!(!Path::new("/tmp/agentloop-coder-outside.txt").exists());
}

/// The quickstart with its script changed: the model answers the opposite and never retries
/// the misspelled unit.
fn broken_quickstart() -> tempfile::TempDir {
    let dir = example("quickstart");
    let path = dir.path().join("script.json");
    let script = std::fs::read_to_string(&path).unwrap().replace(
        "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris.",
        "Paris is warmer.",
    );
    let mut steps: Vec<Value> = serde_json::from_str(&script).unwrap();
    steps.remove(2);
    std::fs::write(&path, serde_json::to_string(&steps).unwrap()).unwrap();
    dir
}

#[test]
fn a_changed_script_fails_the_suite_naming_each_failed_check_and_why() {
    let dir = broken_quickstart();
    let out = eval(dir.path(), "evals.toml", &["--junit", "junit.xml"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(12), "{shown}");
    assert!(
        shown
            .contains("✗ run 1: contains \"Lisbon is warmer\": the output is \"Paris is warmer.\""),
        "{shown}"
    );
    assert!(
        shown.contains("called convert_temperature {\"celsius\":23,\"to\":\"fahrenheit\"} ok → \"73.4\": convert_temperature called 1 times, 0 matching"),
        "{shown}"
    );
    assert!(shown.contains("9/10 runs passed"), "{shown}");
    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    assert_eq!(xml.matches("<failure").count(), 1, "{xml}");
    assert!(xml.contains("0 of 1 runs passed"), "{xml}");

    // Against the good suite's report, the case and its checks are named worse.
    let good = example("quickstart");
    let baseline = good.path().join("baseline.json");
    let out = eval(good.path(), "evals.toml", &["--report", "baseline.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = eval(
        dir.path(),
        "evals.toml",
        &["--json", "--baseline", baseline.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    let report = json(&out);
    let worse: Vec<&str> = report["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["message"].as_str().unwrap())
        .collect();
    assert!(
        worse.contains(&"the suite's pass rate fell from 100% to 90%"),
        "{worse:#?}"
    );
    assert!(
        worse.contains(&"case compare_paris_lisbon: its pass rate fell from 100% to 0%"),
        "{worse:#?}"
    );
    assert!(
        worse.contains(&"case compare_paris_lisbon, check contains \"Lisbon is warmer\": passed 0% of runs, 100% before"),
        "{worse:#?}"
    );
    // A tolerance as wide as the fall lets the suite's rate through, not the case's.
    let out = eval(
        dir.path(),
        "evals.toml",
        &[
            "--json",
            "--baseline",
            baseline.to_str().unwrap(),
            "--tolerance",
            "0.1",
            "--min-pass-rate",
            "0.9",
        ],
    );
    let report = json(&out);
    assert_eq!(out.status.code(), Some(13), "{report:#}");
    assert!(
        report["regressions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["case"] == "compare_paris_lisbon")
    );
}

#[test]
fn repeats_run_concurrently_and_give_pass_at_k_and_pass_hat_k() {
    let dir = example("quickstart");
    std::fs::write(
        dir.path().join("flaky.jsonl"),
        concat!(
            "{\"name\": \"paris\", \"input\": \"Paris?\", \"script\": \"evals/paris.json\", \"checks\": [{\"contains\": \"18 °C\"}]}\n",
            "// the greeting never says Paris\n",
            "{\"name\": \"greeting\", \"input\": \"Hi\", \"script\": \"evals/greeting.json\", \"checks\": [{\"contains\": \"Paris\"}, {\"max_turns\": 1}]}\n",
            "{\"name\": \"never\", \"input\": \"Hi\", \"script\": \"evals/greeting.json\", \"checks\": [{\"contains\": \"Berlin\"}]}\n",
        ),
    )
    .unwrap();
    let out = eval(
        dir.path(),
        "flaky.jsonl",
        &[
            "--json",
            "--repeat",
            "3",
            "--concurrency",
            "4",
            "--min-pass-rate",
            "0.6",
        ],
    );
    let report = json(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let s = &report["summary"];
    assert_eq!(s["runs"], 9);
    assert_eq!(s["passed_runs"], 6);
    assert_eq!(s["k"], 3);
    // Two cases always pass, one never: pass@3 = pass^3 = 2/3.
    assert!(
        (s["pass_at_k"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{s}"
    );
    assert!(
        (s["pass_hat_k"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{s}"
    );
    let never = &report["cases"][2];
    assert_eq!(never["pass_rate"], 0.0);
    let repeats: Vec<u64> = never["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["repeat"].as_u64().unwrap())
        .collect();
    assert_eq!(repeats, [1, 2, 3]);
    assert_eq!(never["checks"][0]["check"], "contains \"Berlin\"");
    let out = eval(dir.path(), "flaky.jsonl", &["--repeat", "2"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out));
    assert!(
        text(&out).contains("pass@2 0.667, pass^2 0.667"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_judge_agent_gives_a_verdict_and_its_cost_is_counted_apart() {
    let dir = example("quickstart");
    let judge = |pass: bool, reason: &str| {
        let verdict = serde_json::json!({"pass": pass, "score": if pass { 0.9 } else { 0.2 }, "reason": reason}).to_string();
        serde_json::json!([
            {"text": verdict, "usage": {"input_tokens": 1000, "output_tokens": 100}},
            {"text": verdict, "usage": {"input_tokens": 1000, "output_tokens": 100}}
        ])
        .to_string()
    };
    std::fs::write(
        dir.path().join("judge.json"),
        judge(true, "it names the warmer city"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("harsh.json"),
        judge(false, "no sources cited"),
    )
    .unwrap();
    let agent = |script: &str| {
        format!(
            "name = \"judge\"\ninstructions = \"Judge answers.\"\n\
             output_schema = {{ type = \"object\", properties = {{ pass = {{ type = \"boolean\" }}, score = {{ type = \"number\" }}, reason = {{ type = \"string\" }} }}, required = [\"pass\", \"reason\"] }}\n\
             [model]\nprovider = \"scripted\"\nscript = \"{script}\"\nprice = {{ input = 1.0, output = 10.0 }}\n"
        )
    };
    std::fs::write(dir.path().join("judge.toml"), agent("judge.json")).unwrap();
    std::fs::write(dir.path().join("harsh.toml"), agent("harsh.json")).unwrap();
    std::fs::write(
        dir.path().join("judged.toml"),
        r#"
[[cases]]
name = "judged"
input = "Compare the weather in Paris and Lisbon, in Fahrenheit."
checks = [{ judge = { agent = "judge.toml", rubric = "Names the warmer city." } }]

[[cases]]
name = "judged_harshly"
input = "Compare the weather in Paris and Lisbon, in Fahrenheit."
checks = [{ judge = { agent = "harsh.toml", rubric = "Cites its sources." } }]
"#,
    )
    .unwrap();
    let out = eval(dir.path(), "judged.toml", &["--json"]);
    let report = json(&out);
    assert_eq!(out.status.code(), Some(12), "{report:#}");
    let passed = &report["cases"][0]["runs"][0]["checks"][0];
    assert_eq!(passed["check"], "judge judge.toml");
    assert_eq!(passed["passed"], true, "{passed}");
    assert_eq!(passed["score"], 0.9);
    assert_eq!(passed["reason"], "the judge: it names the warmer city");
    let failed = &report["cases"][1]["runs"][0]["checks"][0];
    assert_eq!(failed["passed"], false, "{failed}");
    assert_eq!(failed["reason"], "the judge: no sources cited");
    // Each verdict: 1000 input tokens at $1/M and 100 output at $10/M = $0.002; the runs' own
    // cost is the agent's, unpriced here.
    let s = &report["summary"];
    assert!(
        (s["judge_cost_usd"].as_f64().unwrap() - 0.004).abs() < 1e-12,
        "{s}"
    );
    assert_eq!(s["judge_tokens"], 2200);
    assert_eq!(s["cost_usd"]["mean"], 0.0);
}

#[test]
fn bad_cases_are_refused_with_their_code_and_what_is_wrong() {
    let dir = example("quickstart");
    let write = |name: &str, body: &str| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    write(
        "typo.toml",
        "[[cases]]\nname = \"a\"\ninput = \"x\"\nchecks = [{ containz = \"y\" }]\n",
    );
    let out = eval(dir.path(), "typo.toml", &["--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let v = json(&out);
    assert_eq!(v["error"]["code"], "eval.dataset", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("containz"),
        "{v}"
    );

    write(
        "regex.toml",
        "[[cases]]\nname = \"a\"\ninput = \"x\"\nchecks = [{ regex = \"(\" }]\n",
    );
    let out = eval(dir.path(), "regex.toml", &[]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("case a: the check regex \"(\" is invalid"),
        "{}",
        text(&out)
    );

    write(
        "script.toml",
        "[[cases]]\nname = \"a\"\ninput = \"x\"\nscript = \"missing.json\"\n",
    );
    let out = eval(dir.path(), "script.toml", &["--json"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out));
    let v = json(&out);
    assert_eq!(v["cases"][0]["runs"][0]["stop_reason"], "not_run");
    assert!(
        v["cases"][0]["runs"][0]["error"]
            .as_str()
            .unwrap()
            .contains("missing.json"),
        "{v}"
    );

    let out = eval(dir.path(), "evals.toml", &["--baseline", "nowhere.json"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("cannot read the baseline nowhere.json"),
        "{}",
        text(&out)
    );
}

/// `agentloop trace serve`, killed when dropped.
struct Viewer(Child, String);

impl Viewer {
    fn start(dir: &Path, args: &[&str]) -> Viewer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .current_dir(dir)
            .args(["trace", "serve"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        Viewer(child, addr)
    }

    /// `GET path` over loopback, the body as JSON.
    fn get(&self, path: &str) -> Value {
        let mut s = TcpStream::connect(&self.1).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.1
        )
        .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_str(body).unwrap()
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_trace_viewer_lists_an_evaluations_runs_with_their_case_and_verdict() {
    let dir = broken_quickstart();
    // A run of its own in the same trace, before the evaluation's.
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .current_dir(dir.path())
        .args([
            "run",
            "agent.toml",
            "--input",
            "hi",
            "--quiet",
            "--trace",
            "runs.ndjson",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = eval(
        dir.path(),
        "evals.toml",
        &["--trace", "runs.ndjson", "--report", "report.json"],
    );
    assert_eq!(out.status.code(), Some(12), "{}", text(&out));

    let all = Viewer::start(dir.path(), &["runs.ndjson"]).get("/api/runs");
    assert_eq!(all["runs"].as_array().unwrap().len(), 11, "{all:#}");
    assert!(all.get("eval").is_none());

    let viewer = Viewer::start(dir.path(), &["runs.ndjson", "--eval", "report.json"]);
    let listed = viewer.get("/api/runs");
    assert_eq!(listed["eval"]["suite"], "quickstart", "{listed:#}");
    assert_eq!(listed["eval"]["passed_runs"], 9);
    let runs = listed["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 10, "{listed:#}");
    let failed: Vec<&Value> = runs
        .iter()
        .filter(|r| r["eval"]["passed"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{listed:#}");
    assert_eq!(failed[0]["eval"]["case"], "compare_paris_lisbon");
    assert_eq!(failed[0]["eval"]["repeat"], 1);
    assert!(
        failed[0]["eval"]["failures"][0]
            .as_str()
            .unwrap()
            .starts_with("contains \"Lisbon is warmer\""),
        "{listed:#}"
    );
    // Each case's run is a click away: its tree by the id listed.
    let id = failed[0]["id"].as_str().unwrap();
    let tree = viewer.get(&format!("/api/runs/{id}"));
    assert_eq!(tree["run"]["stop_reason"], "finished", "{tree:#}");
}
