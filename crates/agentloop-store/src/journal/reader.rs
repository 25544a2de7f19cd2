//! The reading side of a journal file: [`JournalReader`] lists runs and the calls suspended
//! runs wait on, loads a run's steps checked against their chain, and records answers; and
//! [`read_steps`], the checked read the writer's fork and fold share.

use std::path::{Path, PathBuf};

use agentloop::journal::{JournalError, JournalHeader, JournaledRun, PendingApproval, RunStatus};
use agentloop::machine::Step;
use agentloop::permissions::{Answer, ApprovalRequest};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::schema::{Access, open_checked};
use super::sum::{Sum, checked_header, step_sum};
use super::{ForkOrigin, io, log, now_ms};

/// The steps of run number `run_no` in order, each checked against the chain from its header's
/// sum, up to step `upto` (all without it), into `steps` (and their text into `texts`): the
/// file's, then those of its step log `logged` that follow on from them without a gap; the
/// damage that ends them, if any.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_steps(
    conn: &Connection,
    run_no: i64,
    header_sum: &Sum,
    upto: Option<u64>,
    logged: &[(u64, String)],
    steps: &mut Vec<Step>,
    texts: &mut Vec<String>,
    damaged: impl Fn(Option<u64>, String) -> JournalError,
) -> Result<Option<JournalError>, JournalError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, step, sum FROM step_log WHERE run_no = ?1 AND seq <= ?2 ORDER BY seq",
        )
        .map_err(io)?;
    let last = upto.map_or(i64::MAX, |u| i64::try_from(u).unwrap_or(i64::MAX));
    let mut rows = stmt.query(params![run_no, last]).map_err(io)?;
    let mut previous = *header_sum;
    let mut expected: u64 = 0;
    // Takes step `expected`'s text, checked against `sum` when the file holds one.
    let mut take = |text: String, sum: Option<&[u8]>, expected: &mut u64| {
        let computed = step_sum(&previous, *expected, &text);
        if sum.is_some_and(|sum| computed.as_slice() != sum) {
            return Some(damaged(
                Some(*expected),
                "its checksum does not match (the row was changed or torn)".into(),
            ));
        }
        match serde_json::from_str::<Step>(&text) {
            Ok(step) => steps.push(step),
            Err(e) => {
                return Some(damaged(
                    Some(*expected),
                    format!("it cannot be parsed ({e})"),
                ));
            }
        }
        texts.push(text);
        previous = computed;
        *expected += 1;
        None
    };
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(e) => {
                return Ok(Some(damaged(
                    Some(expected),
                    format!("the row cannot be read ({e})"),
                )));
            }
        };
        let read: Result<(i64, String, &[u8]), _> = (|| {
            let sum = row.get_ref(2)?.as_bytes().map_err(rusqlite::Error::from)?;
            Ok::<_, rusqlite::Error>((row.get(0)?, row.get(1)?, sum))
        })();
        let (seq, text, sum) = match read {
            Ok(r) => r,
            Err(e) => {
                return Ok(Some(damaged(
                    Some(expected),
                    format!("the row cannot be read ({e})"),
                )));
            }
        };
        if u64::try_from(seq).ok() != Some(expected) {
            return Ok(Some(damaged(
                Some(expected),
                format!("the step is missing (the next row is step {seq})"),
            )));
        }
        if let Some(damage) = take(text, Some(sum), &mut expected) {
            return Ok(Some(damage));
        }
    }
    // The step log's frames were checked as they were read; its steps are chained on here.
    for (seq, text) in logged {
        if *seq < expected {
            continue;
        }
        if *seq != expected || upto.is_some_and(|u| *seq > u) {
            break;
        }
        if let Some(damage) = take(text.clone(), None, &mut expected) {
            return Ok(Some(damage));
        }
    }
    Ok(None)
}

/// One run of a journal, as [`JournalReader::runs`] lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunEntry {
    /// The run's id.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// `running`, `suspended` or `finished`.
    pub status: String,
    /// Its stop reason, once finished.
    pub stop_reason: Option<String>,
    /// How many steps are journaled.
    pub steps: u64,
    /// Its definition's fingerprint.
    pub fingerprint: String,
    /// When it started and was last written (ms since the Unix epoch).
    pub created_ms: i64,
    /// When it was last written: exact for the write that began, suspended or finished it;
    /// while it runs, at most a second before its last step (its row is not rewritten with
    /// every step).
    pub updated_ms: i64,
    /// The run and step it was forked from
    /// ([`SqliteJournal::fork`](super::SqliteJournal::fork)), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
    /// For a subagent's run (a child journal), its parent run: the parent is the one resumed,
    /// and the one whose approvals hold the child's questions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// A call a suspended run waits on, as [`JournalReader::pending`] lists it. Its JSON has one
/// `agent`: the call's place in the tree (`lead/helper`) when a subagent asks, else the run's
/// agent.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingCall {
    /// The run.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// The call.
    pub request: ApprovalRequest,
    /// The answer, once recorded (a question's is `allow_once`, with its `reply`).
    pub answer: Option<Answer>,
    /// The answer to a question, once recorded.
    pub reply: Option<Value>,
}

impl serde::Serialize for WaitingCall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            run_id: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            agent: &'a str,
            #[serde(flatten)]
            request: &'a ApprovalRequest,
            answer: &'a Option<Answer>,
            #[serde(skip_serializing_if = "Option::is_none")]
            reply: &'a Option<Value>,
        }
        // The request names its place in the tree when a subagent asks: written twice, the key
        // would leave the reader to pick one.
        let agent = if self.request.agent.is_empty() {
            self.agent.as_str()
        } else {
            ""
        };
        Out {
            run_id: &self.run_id,
            agent,
            request: &self.request,
            answer: &self.answer,
            reply: &self.reply,
        }
        .serialize(serializer)
    }
}

/// What the `answer` column of an approval holds: an approval's answer (`"allow_once"`, ...),
/// or a question's reply (`{"reply": ...}`).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredAnswer {
    Approval(Answer),
    Reply { reply: Value },
}

/// The reading side of a journal file: runs, their steps (checked), approvals, and answers.
pub struct JournalReader {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for JournalReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalReader").finish_non_exhaustive()
    }
}

impl JournalReader {
    /// Opens an existing journal, to read it and record answers in it. A file that is not a
    /// journal (an empty one included) is refused, and left as it is.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Ok(JournalReader {
            conn: open_checked(path.as_ref(), Access::Write)?,
            path: path.as_ref().to_path_buf(),
        })
    }

    /// Opens an existing journal to read it only ([`JournalReader::answer`] and
    /// [`JournalReader::reply`] then fail): a file that is not a journal is refused, and
    /// nothing of it is changed. A journal in an older format is brought up to this one first.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Ok(JournalReader {
            conn: open_checked(path.as_ref(), Access::Read)?,
            path: path.as_ref().to_path_buf(),
        })
    }

    /// Every run, oldest first. A run that goes on at `process` (or whose process died) counts
    /// the steps of its step log too, and was last written when its log was.
    pub fn runs(&self) -> Result<Vec<RunEntry>, JournalError> {
        // The logs first, then the file: a fold between the two reads loses no step.
        let logs = log::read_all(&self.path);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.run_id, r.agent, r.status, r.stop_reason, r.fingerprint, r.created_ms, \
                 r.updated_ms, (SELECT COUNT(*) FROM step_log s WHERE s.run_no = r.run_no), \
                 json_extract(r.header, '$.forked_from.run_id'), \
                 json_extract(r.header, '$.forked_from.step'), \
                 json_extract(r.header, '$.parent.run_id') \
                 FROM runs r ORDER BY r.created_ms, r.run_id",
            )
            .map_err(io)?;
        let rows = stmt
            .query_map([], |r| {
                Ok(RunEntry {
                    run_id: r.get(0)?,
                    agent: r.get(1)?,
                    status: r.get(2)?,
                    stop_reason: r.get(3)?,
                    fingerprint: r.get(4)?,
                    created_ms: r.get(5)?,
                    updated_ms: r.get(6)?,
                    steps: u64::try_from(r.get::<_, i64>(7)?).unwrap_or(0),
                    forked_from: match (r.get::<_, Option<String>>(8)?, r.get::<_, Option<i64>>(9)?)
                    {
                        (Some(run_id), Some(step)) => Some(ForkOrigin {
                            run_id,
                            step: u64::try_from(step).unwrap_or(0),
                        }),
                        _ => None,
                    },
                    parent: r.get(10)?,
                })
            })
            .map_err(io)?;
        let mut runs: Vec<RunEntry> = rows.collect::<Result<_, _>>().map_err(io)?;
        for run in &mut runs {
            if let Some((logged, written)) = logs.get(&run.run_id) {
                run.steps = log::count(run.steps, logged);
                run.updated_ms = run.updated_ms.max(*written);
            }
        }
        Ok(runs)
    }

    /// The run whose id is `id`, or starts with it when only one does.
    pub fn find(&self, id: &str) -> Result<String, JournalError> {
        let unknown = || JournalError::UnknownRun {
            run_id: id.to_owned(),
        };
        let ids: Vec<String> = self
            .runs()?
            .into_iter()
            .map(|r| r.run_id)
            .filter(|r| r.starts_with(id))
            .collect();
        if ids.iter().any(|r| r == id) {
            return Ok(id.to_owned());
        }
        match ids.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(unknown()),
        }
    }

    /// A run, whole and checked: any damage is an error naming the run and step.
    pub fn load(&self, run_id: &str) -> Result<JournaledRun, JournalError> {
        let (run, damage) = self.load_intact(run_id)?;
        match damage {
            Some(e) => Err(e),
            None => Ok(run),
        }
    }

    /// The clock a suspended run `run` (as [`JournalReader::load`] read it) goes on with: the
    /// time to its suspension and the wall-clock time it has waited since, which counts toward
    /// its deadline (give it to [`agentloop::Agent::resume_at`]), as it does on Restate. `None`
    /// for a run that did not suspend: the time between a crash and its resume is not the
    /// run's. Read before the resumed run writes its first step, which marks it running.
    pub fn waited(&self, run: &JournaledRun) -> Option<std::time::Duration> {
        if run.status != RunStatus::Suspended {
            return None;
        }
        let since: i64 = self
            .conn
            .query_row(
                "SELECT updated_ms FROM runs WHERE run_id = ?1 AND status = 'suspended'",
                [&run.header.run_id],
                |r| r.get(0),
            )
            .ok()?;
        let waited = u64::try_from(now_ms().saturating_sub(since)).unwrap_or(0);
        let at = run.steps.last().map_or(std::time::Duration::ZERO, |s| s.at);
        Some(at + std::time::Duration::from_millis(waited))
    }

    /// A run's intact part, and the damage that ends it, if any: the steps before a damaged row
    /// are returned, none after it.
    pub fn load_intact(
        &self,
        run_id: &str,
    ) -> Result<(JournaledRun, Option<JournalError>), JournalError> {
        let damaged = |step: Option<u64>, reason: String| JournalError::Damaged {
            run_id: run_id.to_owned(),
            step,
            reason,
        };
        // The log first, then the file: a fold between the two reads loses no step.
        let (logged, log_damage) = log::read_run(&self.path, run_id);
        type Row = (i64, String, String, String, Option<String>);
        let row: Option<Row> = self
            .conn
            .query_row(
                "SELECT run_no, header, header_sum, status, stop_reason FROM runs \
                 WHERE run_id = ?1",
                [run_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(|e| damaged(None, format!("its row cannot be read ({e})")))?;
        let Some((run_no, header_text, stored, status, stop_reason)) = row else {
            return Err(JournalError::UnknownRun {
                run_id: run_id.to_owned(),
            });
        };
        let Some(sum) = checked_header(&header_text, &stored) else {
            return Err(damaged(None, "its checksum does not match".into()));
        };
        let header: JournalHeader = serde_json::from_str(&header_text)
            .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
        let status = match status.as_str() {
            "running" => RunStatus::Running,
            "suspended" => RunStatus::Suspended,
            "finished" => RunStatus::Finished {
                stop_reason: stop_reason.unwrap_or_default(),
            },
            other => return Err(damaged(None, format!("unknown status {other:?}"))),
        };
        let approvals = self.approvals(run_id)?;
        let mut run = JournaledRun {
            header,
            steps: Vec::new(),
            status,
            approvals,
        };
        let damage = read_steps(
            &self.conn,
            run_no,
            &sum,
            None,
            &logged,
            &mut run.steps,
            &mut Vec::new(),
            damaged,
        )?;
        // The log's damage ends the run where its intact frames do.
        let damage = damage
            .or_else(|| log_damage.map(|reason| damaged(Some(run.steps.len() as u64), reason)));
        Ok((run, damage))
    }

    fn approvals(&self, run_id: &str) -> Result<Vec<PendingApproval>, JournalError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT call_id, request, answer FROM approvals WHERE run_id = ?1 ORDER BY rowid",
            )
            .map_err(io)?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })
            .map_err(io)?;
        let mut out = Vec::new();
        for row in rows {
            let (call_id, request, answer) = row.map_err(io)?;
            let damaged = |what: &str, e: serde_json::Error| JournalError::Damaged {
                run_id: run_id.to_owned(),
                step: None,
                reason: format!(
                    "the approval of call {call_id}: its {what} cannot be parsed ({e})"
                ),
            };
            let request: ApprovalRequest =
                serde_json::from_str(&request).map_err(|e| damaged("request", e))?;
            let (answer, reply) = match answer {
                Some(a) => {
                    let stored: StoredAnswer =
                        serde_json::from_str(&a).map_err(|e| damaged("answer", e))?;
                    match stored {
                        StoredAnswer::Approval(a) => (Some(a), None),
                        StoredAnswer::Reply { reply } => (Some(Answer::AllowOnce), Some(reply)),
                    }
                }
                None => (None, None),
            };
            out.push(PendingApproval {
                request,
                answer,
                reply,
            });
        }
        Ok(out)
    }

    /// The calls suspended runs wait on (answered or not), in run order. A subagent's question
    /// is listed once, on the top run of its tree (its call id prefixed with the calls that led
    /// to it, its agent the subagent's path), where it is answered.
    pub fn pending(&self) -> Result<Vec<WaitingCall>, JournalError> {
        let mut out = Vec::new();
        for run in self.runs()? {
            if run.status != "suspended" || run.parent.is_some() {
                continue;
            }
            for a in self.approvals(&run.run_id)? {
                out.push(WaitingCall {
                    run_id: run.run_id.clone(),
                    agent: run.agent.clone(),
                    request: a.request,
                    answer: a.answer,
                    reply: a.reply,
                });
            }
        }
        Ok(out)
    }

    /// Records a human's answer about a call a suspended run waits on.
    pub fn answer(&self, run_id: &str, call_id: &str, answer: Answer) -> Result<(), JournalError> {
        let text = serde_json::to_string(&answer).map_err(io)?;
        self.record(run_id, call_id, &text)
    }

    /// Records the user's answer to a question a suspended run waits on. The caller checks it
    /// against the question's schema first (`agentloop::ask::check_answer`).
    pub fn reply(&self, run_id: &str, call_id: &str, reply: &Value) -> Result<(), JournalError> {
        let text = serde_json::to_string(&StoredAnswer::Reply {
            reply: reply.clone(),
        })
        .map_err(io)?;
        self.record(run_id, call_id, &text)
    }

    fn record(&self, run_id: &str, call_id: &str, text: &str) -> Result<(), JournalError> {
        let status: Option<String> = self
            .conn
            .query_row("SELECT status FROM runs WHERE run_id = ?1", [run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(io)?;
        let not = |reason: String| JournalError::NotResumable {
            run_id: run_id.to_owned(),
            reason,
        };
        match status.as_deref() {
            None => {
                return Err(JournalError::UnknownRun {
                    run_id: run_id.to_owned(),
                });
            }
            Some("suspended") => {}
            Some(other) => return Err(not(format!("it is {other}, not waiting for approval"))),
        }
        let changed = self
            .conn
            .execute(
                "UPDATE approvals SET answer = ?3 WHERE run_id = ?1 AND call_id = ?2",
                params![run_id, call_id, text],
            )
            .map_err(io)?;
        if changed == 0 {
            // The calls it does wait on, so that a mistyped id is mended from the message.
            let waiting: Vec<String> = self
                .approvals(run_id)?
                .into_iter()
                .filter(|a| a.answer.is_none())
                .map(|a| a.request.call_id)
                .collect();
            return Err(not(match waiting.as_slice() {
                [] => format!("it does not wait on a call {call_id}, nor on any other"),
                _ => format!(
                    "it does not wait on a call {call_id}; it waits on {}",
                    waiting.join(", ")
                ),
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_waiting_calls_json_has_one_agent_its_place_in_the_tree_when_a_subagent_asks() {
        let request = |agent: &str| ApprovalRequest {
            call_id: "c1".into(),
            tool: "shell".into(),
            arguments: serde_json::json!({}),
            agent: agent.into(),
            question: None,
        };
        let waiting = |agent: &str| WaitingCall {
            run_id: "r".into(),
            agent: "lead".into(),
            request: request(agent),
            answer: None,
            reply: None,
        };
        for (place, agent) in [("", "lead"), ("lead/helper", "lead/helper")] {
            let text = serde_json::to_string(&waiting(place)).unwrap();
            assert_eq!(text.matches("\"agent\"").count(), 1, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["agent"], agent);
            assert_eq!(v["call_id"], "c1");
            assert!(v.get("reply").is_none(), "{text}");
        }
    }
}
