//! `agentloop init`, `--version` and `completions`: what a newcomer types first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

fn agentloop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn init_writes_an_agent_that_the_printed_command_runs_to_finished() {
    let tmp = tempfile::tempdir().unwrap();
    // A space in the folder: the printed command must still paste into a shell as is.
    let dir = tmp.path().join("my agent");
    let out = agentloop().arg("init").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    for file in ["agent.toml", "script.json", "tools/count_words.py"] {
        assert!(dir.join(file).is_file(), "{file} was not written");
    }
    let agent = std::fs::read_to_string(dir.join("agent.toml")).unwrap();
    assert!(
        agent.contains("# [model]\n# provider = \"openai\""),
        "a commented [model] block for a real provider: {agent}"
    );

    let printed = stdout(&out);
    let command = printed.trim();
    let rest = command
        .strip_prefix("agentloop ")
        .unwrap_or_else(|| panic!("prints the command that runs it: {printed:?}"));
    // Run exactly what was printed, from another folder, with the real binary in its place.
    let run = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("\"$AGENTLOOP\" {rest} --json"))
        .env("AGENTLOOP", env!("CARGO_BIN_EXE_agentloop"))
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let json: Value = serde_json::from_str(&stdout(&run)).unwrap();
    assert_eq!(json["stop_reason"], "finished", "{json}");
    assert_eq!(json["output"], "That text has 5 words.");
    let calls = json["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{json}");
    assert_eq!(calls[0]["tool"], "count_words");
    assert_eq!(calls[0]["ok"], true, "the python tool ran: {json}");
    let result: Value = serde_json::from_str(calls[0]["output"].as_str().unwrap()).unwrap();
    assert_eq!(result["words"], 5, "the tool counted the words itself");
}

#[test]
fn init_keeps_existing_files_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("agent.toml"), "mine").unwrap();

    let out = agentloop().arg("init").arg(dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(read(dir, "agent.toml"), "mine");
    assert!(!dir.join("script.json").exists(), "nothing was written");

    let out = agentloop()
        .arg("init")
        .arg(dir)
        .arg("--force")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(read(dir, "agent.toml").contains("provider = \"scripted\""));
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[test]
fn version_prints_the_crate_version() {
    let out = agentloop().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        stdout(&out).trim(),
        format!("agentloop {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bash_completions_register_a_completion_function_for_every_subcommand() {
    let out = agentloop().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let script = stdout(&out);
    for sub in ["run", "chat", "plan", "trace", "init", "completions"] {
        assert!(script.contains(sub), "{sub} is completed");
    }
    // Sourced by bash, it registers itself for the `agentloop` command.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("agentloop.bash");
    std::fs::write(&file, &script).unwrap();
    let bash = std::process::Command::new("bash")
        .arg("-c")
        .arg("source \"$1\" && complete -p agentloop")
        .arg("bash")
        .arg(&file)
        .output()
        .unwrap();
    assert!(bash.status.success(), "{bash:?}");
    assert!(stdout(&bash).contains("_agentloop"), "{}", stdout(&bash));
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    let out = agentloop()
        .args(["completions", "nosuchshell"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The agent file the root README shows is a valid one: `plan` reads it without a key.
#[test]
fn the_readme_agent_file_is_valid() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let block = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md shows an agent file in a ```toml block");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("agent.toml"), block).unwrap();
    std::fs::create_dir(tmp.path().join("tools")).unwrap();
    std::fs::write(tmp.path().join("tools/weather.py"), "print('18')\n").unwrap();

    let out = agentloop()
        .args(["plan", "--json"])
        .arg(tmp.path().join("agent.toml"))
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let plan: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let text = plan.to_string();
    assert!(text.contains("gpt-4.1-mini"), "{plan}");
    assert!(text.contains("get_weather"), "{plan}");
}
