//! Stored conversations: a [`SessionStore`] keeps a conversation by id (its transcript, usage
//! and metadata) across processes; [`crate::Agent::run_session`] runs one turn of it. One writer
//! at a time: a turn holds the session's lock ([`SessionStore::lock`]), and a second writer is
//! refused with [`SessionError::Busy`] rather than interleaving its turn. A stored transcript is
//! used only if it is valid for any provider ([`check_transcript`]); a damaged one is reported,
//! never sent.
//!
//! `agentloop-store` has the SQLite store. Codes:
//!
//! | code | meaning |
//! |---|---|
//! | `session.io` | the store could not be read or written |
//! | `session.busy` | another writer holds the session |
//! | `session.damaged` | the stored session cannot be used (what is wrong is named) |
//! | `session.not_found` | no session has this id |
//! | `session.exists` | a session already has this id (fork) |

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Message;
use crate::model::Usage;

/// A stored conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSession {
    /// Its id.
    pub id: String,
    /// The agent that last wrote it.
    pub agent: String,
    /// The transcript the next turn continues (compacted, when the conversation outgrew its
    /// model's context).
    pub messages: Vec<Message>,
    /// The whole conversation, as it happened, once a compaction made it differ from
    /// `messages` (empty until then): [`StoredSession::full_history`] reads either.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// Tokens over all its runs.
    pub usage: Usage,
    /// USD over all its runs.
    pub cost_usd: f64,
    /// How many runs it took.
    pub runs: u32,
    /// What the application keeps with it.
    #[serde(default)]
    pub metadata: BTreeMap<String, Value>,
    /// When it was created and last written (ms since the Unix epoch).
    pub created_ms: i64,
    /// When it was last written.
    pub updated_ms: i64,
}

impl StoredSession {
    /// A new, empty session.
    pub fn new(id: impl Into<String>, agent: impl Into<String>) -> Self {
        let now = now_ms();
        StoredSession {
            id: id.into(),
            agent: agent.into(),
            messages: Vec::new(),
            history: Vec::new(),
            usage: Usage::default(),
            cost_usd: 0.0,
            runs: 0,
            metadata: BTreeMap::new(),
            created_ms: now,
            updated_ms: now,
        }
    }

    /// The whole conversation as it happened, compacted parts included.
    pub fn full_history(&self) -> &[Message] {
        if self.history.is_empty() {
            &self.messages
        } else {
            &self.history
        }
    }

    /// Takes in a run's outcome: its transcript, and what it spent. `started_with` is how many
    /// messages the transcript held when the run started. When the run compacted the
    /// conversation, the full history keeps what the compactions replaced.
    pub fn record(&mut self, agent: &str, started_with: usize, outcome: &crate::RunOutcome) {
        self.agent = agent.to_owned();
        if !outcome.compactions.is_empty() || !self.history.is_empty() {
            if self.history.is_empty() {
                self.history = self.messages.clone();
            }
            let expanded = crate::compaction::expand(&outcome.transcript, &outcome.compactions);
            self.history.extend(expanded.into_iter().skip(started_with));
        }
        self.messages = outcome.transcript.clone();
        self.usage.add(&outcome.usage);
        self.cost_usd += outcome.cost_usd;
        self.runs += 1;
        self.updated_ms = now_ms();
    }
}

/// A session as a list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// Its id.
    pub id: String,
    /// The agent that last wrote it.
    pub agent: String,
    /// How many messages it holds.
    pub messages: usize,
    /// How many runs it took.
    pub runs: u32,
    /// Tokens over all its runs.
    pub usage: Usage,
    /// USD over all its runs.
    pub cost_usd: f64,
    /// When it was last written (ms since the Unix epoch).
    pub updated_ms: i64,
    /// Why the stored session cannot be used, when the list can tell (loading it is refused as
    /// [`SessionError::Damaged`]); the fields above are then what could be read of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damage: Option<String>,
}

/// Why a session could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The store could not be read or written.
    #[error("session store: {message}")]
    Io {
        /// What went wrong.
        message: String,
    },
    /// Another writer holds the session.
    #[error("session {id} is in use by {holder}; try again when its turn ends")]
    Busy {
        /// The session.
        id: String,
        /// Who holds it (process id and since when).
        holder: String,
    },
    /// The stored session cannot be used.
    #[error("session {id} is damaged: {reason}")]
    Damaged {
        /// The session.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// No session has this id.
    #[error("no session {id}")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// A session already has this id.
    #[error("a session {id} already exists")]
    Exists {
        /// The id.
        id: String,
    },
}

impl SessionError {
    /// The stable code (see the module's table).
    pub fn code(&self) -> &'static str {
        match self {
            SessionError::Io { .. } => "session.io",
            SessionError::Busy { .. } => "session.busy",
            SessionError::Damaged { .. } => "session.damaged",
            SessionError::NotFound { .. } => "session.not_found",
            SessionError::Exists { .. } => "session.exists",
        }
    }
}

/// A session's lock, held while a turn runs; dropping it releases the session.
pub trait SessionLock: Send {}

/// Where conversations are kept. Implement it for another store; `agentloop-store` has SQLite.
pub trait SessionStore: Send + Sync {
    /// The session, if there is one. A stored transcript that is not valid
    /// ([`check_transcript`]) is [`SessionError::Damaged`].
    fn load(&self, id: &str) -> Result<Option<StoredSession>, SessionError>;
    /// Writes the session (replacing what the store held under its id).
    fn save(&self, session: &StoredSession) -> Result<(), SessionError>;
    /// Every session, most recently written first.
    fn list(&self) -> Result<Vec<SessionSummary>, SessionError>;
    /// Deletes a session; false when there was none.
    fn delete(&self, id: &str) -> Result<bool, SessionError>;
    /// Copies session `from` to a new session `to`, which then goes its own way.
    fn fork(&self, from: &str, to: &str) -> Result<(), SessionError>;
    /// Takes the session for one writer: [`SessionError::Busy`] while another holds it.
    fn lock(&self, id: &str) -> Result<Box<dyn SessionLock>, SessionError>;
}

/// Checks that a transcript can be sent to any provider: every tool call answered once, by a
/// result after it and before the next model turn, and no result without its call.
pub fn check_transcript(messages: &[Message]) -> Result<(), String> {
    let mut open: Vec<&str> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        match m {
            Message::Assistant(a) => {
                if let Some(id) = open.first() {
                    return Err(format!(
                        "message {i}: a model turn before call {id} was answered"
                    ));
                }
                for c in &a.tool_calls {
                    if !seen.insert(&c.call_id) {
                        return Err(format!("message {i}: call id {} is used twice", c.call_id));
                    }
                    open.push(&c.call_id);
                }
            }
            Message::Tool(r) => match open.iter().position(|id| **id == *r.call_id) {
                Some(at) => {
                    open.remove(at);
                }
                None => {
                    return Err(format!(
                        "message {i}: a result for call {} that is not waiting for one",
                        r.call_id
                    ));
                }
            },
            Message::User { .. } => {
                if let Some(id) = open.first() {
                    return Err(format!(
                        "message {i}: a user message before call {id} was answered"
                    ));
                }
            }
        }
    }
    match open.first() {
        Some(id) => Err(format!("call {id} has no result")),
        None => Ok(()),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One turn of a stored conversation that ran ([`crate::Agent::run_session_turn`]): the run's
/// outcome, and why the session could not be written afterwards, if it could not.
#[derive(Debug, Clone)]
pub struct SessionTurn {
    /// The run's outcome, whether or not the session was written.
    pub outcome: crate::RunOutcome,
    /// Why the session was not written after the run. The run still happened (its tools ran,
    /// its spend is real); only the stored conversation lacks this turn.
    pub unsaved: Option<SessionError>,
}

impl crate::Agent {
    /// Runs one turn of a stored conversation: takes the session's lock, loads it (a new one
    /// when there is none; a damaged one is refused), runs `input` on its transcript, and writes
    /// the new transcript and what the run spent back. The lock is held for the whole turn, so
    /// two writers never interleave their turns.
    ///
    /// A session that cannot be written after the run is an error here, and the run's outcome
    /// is lost with it: [`crate::Agent::run_session_turn`] keeps it.
    pub async fn run_session(
        &self,
        store: &dyn SessionStore,
        id: &str,
        input: impl Into<String>,
        options: crate::RunOptions,
    ) -> Result<crate::RunOutcome, SessionError> {
        let turn = self.run_session_turn(store, id, input, options).await?;
        match turn.unsaved {
            Some(e) => Err(e),
            None => Ok(turn.outcome),
        }
    }

    /// [`crate::Agent::run_session`], keeping the run's outcome when the session cannot be
    /// written after it: an error is returned only when nothing ran (the session was busy,
    /// damaged or unreadable), and a failed write is [`SessionTurn::unsaved`] beside the outcome.
    pub async fn run_session_turn(
        &self,
        store: &dyn SessionStore,
        id: &str,
        input: impl Into<String>,
        mut options: crate::RunOptions,
    ) -> Result<SessionTurn, SessionError> {
        let _lock = store.lock(id)?;
        options.session.get_or_insert_with(|| id.to_owned());
        let mut session = store
            .load(id)?
            .unwrap_or_else(|| StoredSession::new(id, self.config().name()));
        let transcript = session.messages.clone();
        let started_with = transcript.len();
        let outcome = self
            .run_with(transcript, Some(Message::user(input)), options)
            .await;
        session.record(self.config().name(), started_with, &outcome);
        let unsaved = store.save(&session).err();
        Ok(SessionTurn { outcome, unsaved })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::call_of_tool_t as call;
    use crate::message::{ToolContent, ToolResult};

    fn result(id: &str) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            tool: "t".into(),
            content: ToolContent::Text("ok".into()),
            is_error: false,
        })
    }

    #[test]
    fn a_transcript_is_valid_only_with_every_call_answered_in_place() {
        let ok = [
            Message::user("hi"),
            call("a"),
            result("a"),
            Message::user("more"),
        ];
        assert_eq!(check_transcript(&ok), Ok(()));
        assert_eq!(
            check_transcript(&[Message::user("hi"), call("a")]),
            Err("call a has no result".into())
        );
        assert!(check_transcript(&[Message::user("hi"), result("x")]).is_err());
        assert!(check_transcript(&[call("a"), Message::user("x"), result("a")]).is_err());
        assert!(check_transcript(&[call("a"), result("a"), call("a"), result("a")]).is_err());
    }
}
