#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! The SQLite journal's approvals: an answer stays with the request it was given for. A new
//! suspension on a call id the journal holds (another tool or other arguments under that id)
//! asks afresh; it never inherits the old answer.

mod support;

use agentloop::journal::Journal;
use agentloop::permissions::{Answer, ApprovalRequest};
use agentloop_store::{JournalReader, SqliteJournal};
use serde_json::json;
use support::header;

fn request(call_id: &str, command: &str) -> ApprovalRequest {
    ApprovalRequest {
        call_id: call_id.into(),
        tool: "shell".into(),
        arguments: json!({ "command": command }),
        agent: String::new(),
        question: None,
    }
}

#[test]
fn a_new_request_under_an_answered_call_id_is_asked_afresh() {
    let dir = std::env::temp_dir().join(format!("agentloop-approvals-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let journal = SqliteJournal::open(&path).unwrap();
    let header = header("r1");
    futures::executor::block_on(async {
        journal.begin(&header).await.unwrap();
        journal
            .suspend("r1", &[request("c1", "echo one")])
            .await
            .unwrap();
    });
    let reader = JournalReader::open(&path).unwrap();
    reader.answer("r1", "c1", Answer::AllowOnce).unwrap();
    let answered = reader.load("r1").unwrap().approvals;
    assert_eq!(answered[0].answer, Some(Answer::AllowOnce));

    futures::executor::block_on(async {
        journal
            .suspend("r1", &[request("c1", "rm -rf ~")])
            .await
            .unwrap();
    });
    let approvals = reader.load("r1").unwrap().approvals;
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].request, request("c1", "rm -rf ~"));
    assert_eq!(
        approvals[0].answer, None,
        "the old answer is not the new one's"
    );
}
