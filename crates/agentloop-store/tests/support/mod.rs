//! What the journal tests share.

use agentloop::journal::{Definition, JournalHeader};
use agentloop::machine::{Input, Seams, Step};

/// The header of a run of an empty agent.
#[allow(dead_code)] // not every test file uses every helper
pub(crate) fn header(run_id: &str) -> JournalHeader {
    JournalHeader {
        run_id: run_id.into(),
        agent: "a".into(),
        definition: Definition::new(),
        fingerprint: Definition::new().fingerprint(),
        seams: Seams::default(),
        limits: None,
        transcript: Vec::new(),
        input: None,
        origin: None,
        parent: None,
        session: None,
        served_by: None,
    }
}

/// A fresh folder for test `name` of this process.
#[allow(dead_code)] // not every test file uses every helper
pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agentloop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A step that says nothing, at `n` ms.
#[allow(dead_code)] // not every test file uses every helper
pub(crate) fn step(n: u64) -> Step {
    Step {
        at: std::time::Duration::from_millis(n),
        input: Input::ToolsListed { tools: None },
    }
}
