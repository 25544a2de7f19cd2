//! What the journal tests share.

use agentloop::journal::{Definition, JournalHeader};
use agentloop::machine::Seams;

/// The header of a run of an empty agent.
pub fn header(run_id: &str) -> JournalHeader {
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
    }
}
