#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! The agent cannot rewrite itself: with the file tools rooted in the agent's own folder (the
//! default root), a scripted model tries to write every one of the agent's own files (the agent
//! file, a subagent's file, instructions, the script, a command tool's program and a new module
//! beside it, the permission store, the journal and the trace the run writes). Each write is
//! refused with
//! `workspace.protected` and the file is left as it was, while a write to an ordinary file and a
//! read of the agent file go through.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::fat::FatMount;
use support::*;

const SELF_EDITING_AGENT: &str = r#"name = "self-editor"
instructions_file = "instructions.md"
[model]
provider = "scripted"
script = "script.json"

[[tools]]
builtin = "write_file"

[[tools]]
builtin = "edit_file"

[[tools]]
builtin = "read_file"

[[tools]]
name = "count_words"
command = ["python3", "tools/count.py", "data/words.txt"]

[[tools]]
name = "helper"
agent = "helpers/child.toml"

[permissions]
store = "permissions.json"
"#;

const CHILD: &str = r#"name = "child"
[model]
provider = "scripted"
script = "child.json"
"#;

fn write(id: &str, path: &str) -> Value {
    json!({"id": id, "name": "write_file", "arguments": {"path": path, "content": "import os\n"}})
}

/// The self-editing agent's folder: its files, a subagent's, a script and its data file.
fn self_editor() -> AgentDir {
    self_editor_in(AgentDir::new(SELF_EDITING_AGENT))
}

/// `dir`, holding an agent file, with the self-editing agent's other files.
fn self_editor_in(dir: AgentDir) -> AgentDir {
    std::fs::create_dir_all(dir.path("tools")).unwrap();
    std::fs::create_dir_all(dir.path("helpers")).unwrap();
    dir.write("tools/count.py", "import json\nprint(3)\n");
    std::fs::create_dir_all(dir.path("data")).unwrap();
    dir.write("data/words.txt", "a b c\n");
    dir.write("instructions.md", "Count words.\n");
    dir.write("helpers/child.toml", CHILD);
    dir.write("helpers/child.json", "[]");
    dir.write("permissions.json", "{\"rules\": []}");
    dir
}

/// Runs the self-editing agent with its journal (`run.db`) and trace (`trace.ndjson`) in
/// `stores`, and answers the records of its calls, the run having finished.
async fn run_self_editor(dir: &AgentDir, stores: &Path) -> Vec<Value> {
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "go",
        "--json",
        "--journal",
        stores.join("run.db").to_str().unwrap(),
        "--trace",
        stores.join("trace.ndjson").to_str().unwrap(),
    ]))
    .await;
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}\n{}", stderr(&out));
    v["tool_calls"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_write_tools_refuse_the_agents_own_files_wherever_the_root_is() {
    let dir = self_editor();
    let protected = [
        ("p1", "agent.toml"),
        ("p2", "./tools/count.py"),
        ("p3", "instructions.md"),
        ("p4", "script.json"),
        ("p5", "permissions.json"),
        ("p6", "helpers/child.toml"),
        ("p7", "run.db"),
        ("p8", "trace.ndjson"),
        ("p9", "run.db-wal"),
        // Beside a script, a new module would be loaded by it (`import json` finds
        // `tools/json.py` or `tools/json/` first): the script's whole folder is the agent's.
        ("p10", "tools/json.py"),
        ("p11", "tools/json/__init__.py"),
        // A data file a command names is the agent's, not its folder.
        ("p12", "data/words.txt"),
    ];
    let mut calls: Vec<Value> = protected.iter().map(|(id, p)| write(id, p)).collect();
    calls.push(json!({"id": "e1", "name": "edit_file", "arguments": {
        "path": "agent.toml", "old_string": "self-editor", "new_string": "owned"}}));
    calls.push(write("ok", "notes/plan.md"));
    calls.push(write("ok2", "data/other.txt"));
    calls.push(json!({"id": "r", "name": "read_file", "arguments": {"path": "agent.toml"}}));
    dir.write(
        "script.json",
        &json!([{"tool_calls": calls}, {"text": "done"}]).to_string(),
    );
    let before: Vec<(String, String)> = [
        "agent.toml",
        "tools/count.py",
        "data/words.txt",
        "instructions.md",
        "script.json",
        "permissions.json",
        "helpers/child.toml",
    ]
    .iter()
    .map(|p| (p.to_string(), std::fs::read_to_string(dir.path(p)).unwrap()))
    .collect();
    let journal = dir.path("run.db");
    let trace = dir.path("trace.ndjson");
    let records = run_self_editor(&dir, &dir.path(".")).await;
    let record = |id: &str| records.iter().find(|c| c["id"] == id).unwrap().clone();
    for id in protected.iter().map(|(id, _)| *id).chain(["e1"]) {
        let r = record(id);
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "workspace.protected", "{r}");
    }
    assert_eq!(record("ok")["ok"], true);
    assert_eq!(record("ok2")["ok"], true);
    assert!(!dir.path("tools/json.py").exists() && !dir.path("tools/json").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path("notes/plan.md")).unwrap(),
        "import os\n"
    );
    let read = record("r");
    assert_eq!(read["ok"], true, "{read}");
    assert!(read["output"].as_str().unwrap().contains("self-editor"));
    for (path, text) in before {
        assert_eq!(
            std::fs::read_to_string(dir.path(&path)).unwrap(),
            text,
            "{path}"
        );
    }
    // The journal and the trace are the run's own: written by it, not by the model.
    assert!(
        std::fs::read_to_string(&trace)
            .unwrap()
            .contains("self-editor")
    );
    assert_ne!(
        std::fs::read(&journal).unwrap().get(..6),
        Some(&b"import"[..])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_that_may_write_the_agents_own_files_is_refused_at_load() {
    let file = |shell: &str| {
        format!(
            "name = \"s\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\
             [[tools]]\nbuiltin = \"shell\"\n{shell}\n"
        )
    };
    let dir = AgentDir::new(&file(""));
    dir.write("script.json", "[]");
    std::fs::create_dir(dir.path("work")).unwrap();
    let plan = |dir: &AgentDir| {
        let agent = dir.agent();
        async move { agentloop(args(&["plan", agent.to_str().unwrap()])).await }
    };
    let out = plan(&dir).await;
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("tools[0].root") && err.contains("agent's own file agent.toml"),
        "{err}"
    );
    for ok in [
        "root = \"work\"",
        "sandbox = \"read-only\"",
        "sandbox = \"off\"",
    ] {
        dir.write("agent.toml", &file(ok));
        let out = plan(&dir).await;
        assert_eq!(out.status.code(), Some(0), "{ok}: {}", stderr(&out));
    }
    // A link to the agent's folder is the same folder.
    std::os::unix::fs::symlink(dir.path("."), dir.path("work/up")).unwrap();
    dir.write("agent.toml", &file("root = \"work/up\""));
    assert_eq!(plan(&dir).await.status.code(), Some(3));
    // A root that is a script's folder is the agent's whole, and said so (it was named as an
    // own file with an empty name).
    std::fs::create_dir(dir.path("tools")).unwrap();
    dir.write("tools/count.sh", "echo 3\n");
    dir.write(
        "agent.toml",
        &format!(
            "{}[[tools]]\nname = \"count\"\ndescription = \"counts\"\n\
             command = [\"sh\", \"tools/count.sh\"]\n",
            file("root = \"tools\"")
        ),
    );
    let out = plan(&dir).await;
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("\"tools\", which is the folder of one of the agent's scripts"),
        "{err}"
    );
}

/// The write tools refuse the agent's own files under any case and Unicode normalization: on a
/// file system that ignores them (macOS's, Windows', FAT) `AGENT.TOML` is `agent.toml` and
/// `RUN.DB` the journal the run opens. Here, where case tells names apart, the variants are
/// refused all the same (refusing more), and none is created.
#[tokio::test(flavor = "multi_thread")]
async fn the_write_tools_refuse_the_agents_own_files_in_any_case() {
    let dir = self_editor();
    let variants = [
        ("c1", "AGENT.TOML"),
        ("c2", "Instructions.MD"),
        ("c3", "TOOLS/count.py"),
        ("c4", "Tools/json.py"),
        ("c5", "Permissions.JSON"),
        ("c6", "HELPERS/Child.toml"),
        ("c7", "RUN.DB"),
        ("c8", "Script.Json"),
    ];
    let mut calls: Vec<Value> = variants.iter().map(|(id, p)| write(id, p)).collect();
    calls.push(json!({"id": "e1", "name": "edit_file", "arguments": {
        "path": "Agent.Toml", "old_string": "self-editor", "new_string": "owned"}}));
    calls.push(write("ok", "Notes.md"));
    dir.write(
        "script.json",
        &json!([{"tool_calls": calls}, {"text": "done"}]).to_string(),
    );
    let records = run_self_editor(&dir, &dir.path(".")).await;
    for (id, path) in variants.iter().copied().chain([("e1", "Agent.Toml")]) {
        let r = records.iter().find(|c| c["id"] == id).unwrap();
        assert_eq!(r["error"]["code"], "workspace.protected", "{path}: {r}");
        assert!(!dir.path(path).exists(), "{path} was created");
    }
    let ok = records.iter().find(|c| c["id"] == "ok").unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    assert!(
        !std::fs::read_to_string(dir.agent())
            .unwrap()
            .contains("owned")
    );
}

/// As above on a real file system that ignores case ([`FatMount`]), where the other spelling
/// opens the agent's file: the write tools refuse it, though that file system gives it an inode
/// number of its own, which no check by identity could tell; a `deny` path rule holds for a
/// path in another case. (The journal and trace are kept off it: SQLite cannot lock there.) Skipped, saying why, where FUSE, root or fusefat is missing.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_file_system_that_ignores_case_no_spelling_of_an_own_or_denied_file_gets_through() {
    let mount = match FatMount::new() {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("skipped: no file system that ignores case here: {why}");
            return;
        }
    };
    // Its command tool gets a root of its own: one that may write the agent's folder is
    // refused on such a file system (the next test).
    let agent = format!(
        "{}default = \"allow\"\n[[permissions.rules]]\ntool = \"read_file\"\n\
         permission = \"deny\"\npath_glob = {{ field = \"path\", glob = \"secrets/**\" }}\n",
        SELF_EDITING_AGENT.replace(
            "name = \"count_words\"",
            "name = \"count_words\"\nroot = \"work\""
        )
    );
    let dir = self_editor_in(AgentDir::new_in(&mount.path(), &agent));
    std::fs::create_dir(dir.path("work")).unwrap();
    std::fs::create_dir(dir.path("secrets")).unwrap();
    dir.write("secrets/key.pem", "PRIVATE KEY\n");
    dir.write("notes.md", "draft\n");
    assert_eq!(
        std::fs::read_to_string(dir.path("AGENT.TOML")).unwrap(),
        agent,
        "the file system ignores case"
    );
    let refused = [
        ("w1", "AGENT.TOML"),
        ("w2", "Instructions.MD"),
        ("w3", "SCRIPT.JSON"),
        ("w4", "Tools/Count.py"),
    ];
    let mut calls: Vec<Value> = refused.iter().map(|(id, p)| write(id, p)).collect();
    calls.push(json!({"id": "e1", "name": "edit_file", "arguments": {
        "path": "Agent.Toml", "old_string": "self-editor", "new_string": "owned"}}));
    for (id, path) in [("r1", "SECRETS/key.pem"), ("r2", "Secrets/KEY.PEM")] {
        calls.push(json!({"id": id, "name": "read_file", "arguments": {"path": path}}));
    }
    // An ordinary file, replaced under another spelling (FAT keeps no permissions to carry
    // over to the new file).
    calls.push(write("ok", "Notes.md"));
    let script = json!([{"tool_calls": calls}, {"text": "done"}]).to_string();
    dir.write("script.json", &script);
    let records = run_self_editor(&dir, &mount.stores()).await;
    let record = |id: &str| records.iter().find(|c| c["id"] == id).unwrap().clone();
    for id in refused.iter().map(|(id, _)| *id).chain(["e1"]) {
        assert_eq!(
            record(id)["error"]["code"],
            "workspace.protected",
            "{}",
            record(id)
        );
    }
    for id in ["r1", "r2"] {
        assert_eq!(record(id)["status"], "denied", "{}", record(id));
    }
    assert_eq!(record("ok")["ok"], true, "{}", record("ok"));
    assert_eq!(std::fs::read_to_string(dir.agent()).unwrap(), agent);
    assert_eq!(
        std::fs::read_to_string(dir.path("instructions.md")).unwrap(),
        "Count words.\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("script.json")).unwrap(),
        script
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("notes.md")).unwrap(),
        "import os\n"
    );
    assert!(!format!("{records:?}").contains("PRIVATE KEY"));
}

/// A process of the agent sees its own files read-only by a bind of their names, which a FUSE
/// file system that ignores case does not hold for another spelling: a command tool whose root
/// is the agent's folder there renamed a file of its own over `AGENT.TOML`. Such an agent is
/// refused before anything starts (exit 3, `agent.setup`); with a root of its own the tool
/// runs. Skipped, saying why, where FUSE, root or fusefat is missing.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_file_system_that_ignores_case_a_process_that_may_write_the_agents_folder_is_refused()
{
    let mount = match FatMount::new() {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("skipped: no file system that ignores case here: {why}");
            return;
        }
    };
    let agent = |root: &str| {
        format!(
            "name = \"swapper\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\
             [[tools]]\nname = \"swap\"\nroot = \"{root}\"\ncommand = [\"sh\", \"-c\", \
             \"echo owned > new.toml && mv new.toml AGENT.TOML && echo ran\"]\n"
        )
    };
    let dir = AgentDir::new_in(&mount.path(), &agent("."));
    std::fs::create_dir(dir.path("work")).unwrap();
    let script = json!([
        {"tool_calls": [{"id": "s", "name": "swap", "arguments": {}}]},
        {"text": "done"}
    ]);
    dir.write("script.json", &script.to_string());
    let run = || async {
        agentloop(args(&[
            "run",
            dir.agent().to_str().unwrap(),
            "--input",
            "go",
            "--json",
        ]))
        .await
    };
    // outside-paths: off (the agent's own folder, named from inside it)
    // The agent's folder, and the same folder named in another case (`../.TMPaBc`), which a
    // canonical path on Linux keeps as given.
    let folder = dir.dir.path().file_name().unwrap().to_str().unwrap();
    let swapped: String = folder
        .chars()
        .map(|c| match c {
            'a'..='z' => c.to_ascii_uppercase(),
            _ => c.to_ascii_lowercase(),
        })
        .collect();
    // fusefat does not truncate a file opened to be written over: each is written anew.
    let rewrite = |text: &str| {
        std::fs::remove_file(dir.agent()).unwrap();
        dir.write("agent.toml", text);
    };
    for root in [".".to_owned(), format!("../{swapped}")] {
        // outside-paths: on
        rewrite(&agent(&root));
        let out = run().await;
        assert_eq!(out.status.code(), Some(3), "{root}: {}", stdout(&out));
        let error = &stdout_json(&out)["error"];
        assert_eq!(error["code"], "agent.setup", "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("agent.toml") && message.contains("ignores case"),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(dir.agent()).unwrap(), agent(&root));
    }
    // A root of its own holds none of the agent's files: the run starts and calls the tool
    // (whatever its sandbox then lets it do in that folder).
    rewrite(&agent("work"));
    let out = run().await;
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}\n{}", stderr(&out));
    assert_eq!(v["tool_calls"][0]["id"], "s", "{v}");
    assert_eq!(std::fs::read_to_string(dir.agent()).unwrap(), agent("work"));
}

/// The same hole for a program that uses the sandbox as a library, with no agent file and no
/// check at load: a root holding an own file on a FUSE file system that ignores case is
/// refused when the process is prepared (`sandbox.unsupported`) in a strict mode, where a
/// process would have written `AGENT.TOML` past the bind of `agent.toml`; `best-effort` starts
/// it and says what it could not keep. Skipped, saying why, where FUSE, root or fusefat is
/// missing.
#[test]
fn on_a_file_system_that_ignores_case_the_sandbox_refuses_to_keep_an_own_file_by_one_spelling() {
    use agentloop_sandbox::{Sandbox, SandboxMode, SandboxPolicy};
    let mount = match FatMount::new() {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("skipped: no file system that ignores case here: {why}");
            return;
        }
    };
    let root = mount.path().join("work");
    std::fs::create_dir(&root).unwrap();
    let own = root.join("agent.toml");
    std::fs::write(&own, "name = \"kept\"\n").unwrap();
    let sandbox = |mode| {
        Sandbox::new(SandboxPolicy::new(mode))
            .writable(&root)
            .read_only([&own])
    };
    let overwrite = |confinement: &mut agentloop_sandbox::Confinement| {
        let mut command = std::process::Command::new("sh");
        command
            .args(["-c", "echo owned > new.toml && mv new.toml AGENT.TOML"])
            .current_dir(&root);
        confinement.install(&mut command);
        command.status().unwrap()
    };
    match sandbox(SandboxMode::WorkspaceWrite).prepare() {
        Err(e) => {
            assert_eq!(e.code(), "sandbox.unsupported", "{e}");
            let message = e.to_string();
            assert!(
                message.contains("agent.toml")
                    && message.contains("AGENT.TOML")
                    && message.contains("ignores case"),
                "{message}"
            );
        }
        Ok(mut confinement) => {
            let status = overwrite(&mut confinement);
            panic!(
                "prepared; a process then exited {status} and left the own file {:?}",
                std::fs::read_to_string(&own)
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&own).unwrap(), "name = \"kept\"\n");
    let confinement = sandbox(SandboxMode::BestEffort).prepare().unwrap();
    let note = confinement.note().unwrap_or_default();
    assert!(
        note.contains("agent.toml") && note.contains("ignores case"),
        "{note}"
    );
    // Where case is told apart (the machine's own file system beside the mount), nothing is
    // said and the process is kept from the file.
    let plain = mount.stores().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let own = plain.join("agent.toml");
    std::fs::write(&own, "name = \"kept\"\n").unwrap();
    let mut confinement = Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite))
        .writable(&plain)
        .read_only([&own])
        .prepare()
        .unwrap();
    assert!(
        !confinement
            .note()
            .is_some_and(|n| n.contains("ignores case")),
        "{:?}",
        confinement.note()
    );
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", "echo owned > agent.toml"])
        .current_dir(&plain);
    confinement.install(&mut command);
    assert!(!command.status().unwrap().success());
    assert_eq!(std::fs::read_to_string(&own).unwrap(), "name = \"kept\"\n");
}

/// A shell whose root is a folder of the agent's own named in another case (`TOOLS` for the
/// folder of `tools/count.sh`) is refused at load: where case is ignored it is that folder, and
/// a canonical path on Linux keeps the case it was given in. Here, where case tells them apart,
/// `TOOLS` is another folder, refused all the same (refusing more); on a FAT mount too, where
/// fusefat is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_shell_root_that_is_an_own_folder_in_another_case_is_refused_at_load() {
    let fat = FatMount::new()
        .map_err(|why| eprintln!("on this machine's file system only: {why}"))
        .ok();
    let local = tempfile::tempdir().unwrap();
    let places: Vec<PathBuf> = std::iter::once(local.path().to_path_buf())
        .chain(fat.as_ref().map(FatMount::path))
        .collect();
    let agent = "name = \"s\"\n[model]\nprovider = \"scripted\"\nscript = \"script.json\"\n\
                 [[tools]]\nname = \"count\"\ncommand = [\"sh\", \"tools/count.sh\"]\n\
                 [[tools]]\nbuiltin = \"shell\"\nroot = \"TOOLS\"\n";
    for place in places {
        let dir = AgentDir::new_in(&place, agent);
        dir.write("script.json", "[]");
        std::fs::create_dir(dir.path("tools")).unwrap();
        dir.write("tools/count.sh", "echo 3\n");
        std::fs::create_dir_all(dir.path("TOOLS")).unwrap();
        let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
        assert_eq!(out.status.code(), Some(3), "{place:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains("tools[1].root"), "{err}");
    }
}
