//! Stored conversations from the command line: `run`/`chat --session NAME`, and
//! `agentloop sessions list|show|delete|fork`. The store is SQLite (`agentloop-store`); one
//! writer at a time per session.

use std::path::PathBuf;

use agentloop::Message;
use agentloop::session::{SessionError, SessionStore};
use agentloop_store::SqliteSessions;
use clap::{Args, Subcommand};

use crate::error::{CliError, code};

/// `--session` and `--sessions`, as `run` and `chat` take them.
#[derive(Debug, Args)]
pub(crate) struct SessionArgs {
    /// Continues the stored conversation NAME (created on first use) and stores this turn in it.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    #[command(flatten)]
    store: StoreArg,
}

impl SessionArgs {
    /// The store's path, when a session was asked for.
    pub(crate) fn store_path(&self) -> Option<PathBuf> {
        self.session.as_ref().map(|_| self.store.sessions.clone())
    }

    /// The session's name, when one was asked for.
    fn name(&self) -> Result<Option<&str>, CliError> {
        match self.session.as_deref() {
            Some(name) if name.trim().is_empty() => Err(CliError::Usage {
                message: "--session needs a name".into(),
            }),
            name => Ok(name),
        }
    }

    /// The store and the session's name, when a session was asked for.
    pub(crate) fn open(&self) -> Result<Option<(SqliteSessions, String)>, CliError> {
        let Some(name) = self.name()? else {
            return Ok(None);
        };
        Ok(Some((
            SqliteSessions::open(&self.store.sessions)?,
            name.to_owned(),
        )))
    }

    /// The conversation a dry run goes on from: the session's transcript, read only (empty
    /// when there is no such session or store yet). A dry run has no side effects, so it neither
    /// makes the store nor adds its turn to the conversation.
    pub(crate) fn transcript_read_only(&self) -> Result<Vec<Message>, CliError> {
        let Some(name) = self.name()? else {
            return Ok(Vec::new());
        };
        if !self.store.sessions.exists() {
            return Ok(Vec::new());
        }
        let store = SqliteSessions::open_read_only(&self.store.sessions)?;
        Ok(store.load(name)?.map(|s| s.messages).unwrap_or_default())
    }
}

/// `agentloop sessions`.
#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCommand {
    /// Lists the stored conversations, most recent first.
    List {
        #[command(flatten)]
        store: StoreArg,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Shows one conversation: its messages, usage and cost.
    Show {
        /// The session.
        name: String,
        #[command(flatten)]
        store: StoreArg,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a conversation.
    Delete {
        /// The session.
        name: String,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Copies a conversation under a new name, which then goes its own way.
    Fork {
        /// The session to copy.
        from: String,
        /// The new session.
        to: String,
        #[command(flatten)]
        store: StoreArg,
    },
}

/// `--sessions`, for the `sessions` commands.
#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// The session store (default: $AGENTLOOP_SESSIONS, else sessions.db).
    #[arg(
        long,
        value_name = "PATH",
        env = "AGENTLOOP_SESSIONS",
        default_value = "sessions.db"
    )]
    sessions: PathBuf,
}

impl StoreArg {
    /// The store, which must be one already: these commands read or change stored sessions, so
    /// a path with nothing there, or an empty file, is a mistake to report, not a store to make.
    fn open(&self) -> Result<SqliteSessions, CliError> {
        Ok(SqliteSessions::open_existing(&self.sessions)?)
    }

    /// The store, to read only (`list`, `show`): nothing of it changes and nothing is left
    /// beside it, and one in a read-only folder is read all the same.
    fn read_only(&self) -> Result<SqliteSessions, CliError> {
        Ok(SqliteSessions::open_read_only(&self.sessions)?)
    }
}

/// `agentloop sessions ...`.
pub(crate) fn sessions(cmd: SessionsCommand) -> Result<i32, CliError> {
    match cmd {
        SessionsCommand::List { store, json } => {
            let list = store.read_only()?.list()?;
            if json {
                out!(
                    "{}",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                );
            } else if list.is_empty() {
                out!("no sessions");
            } else {
                for s in &list {
                    let damage = s
                        .damage
                        .as_ref()
                        .map(|d| format!("  damaged: {d}"))
                        .unwrap_or_default();
                    out!(
                        "{}  {}  {} messages  {} runs  {} in / {} out tokens  ${:.4}{damage}",
                        s.id,
                        s.agent,
                        s.messages,
                        s.runs,
                        s.usage.input_tokens,
                        s.usage.output_tokens,
                        s.cost_usd
                    );
                }
            }
        }
        SessionsCommand::Show { name, store, json } => {
            let Some(s) = store.read_only()?.load(&name)? else {
                return Err(SessionError::NotFound { id: name }.into());
            };
            if json {
                out!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                out!(
                    "session {}  agent {}  {} runs  {} in / {} out tokens  ${:.4}",
                    s.id,
                    s.agent,
                    s.runs,
                    s.usage.input_tokens,
                    s.usage.output_tokens,
                    s.cost_usd
                );
                for m in s.full_history() {
                    let (role, text) = match m {
                        agentloop::Message::User { .. } => ("user", m.text()),
                        agentloop::Message::Assistant(a) => {
                            let calls: Vec<String> = a
                                .tool_calls
                                .iter()
                                .map(|c| format!("{}({})", c.tool, c.arguments))
                                .collect();
                            let text = if calls.is_empty() {
                                a.text.clone()
                            } else {
                                format!("{} [calls {}]", a.text, calls.join(", "))
                            };
                            ("assistant", text)
                        }
                        agentloop::Message::Tool(r) => {
                            ("tool", format!("{}: {}", r.tool, m.text()))
                        }
                    };
                    out!("{role:>9}  {}", text.trim());
                }
                if !s.history.is_empty() {
                    out!(
                        "(compacted: the next turn sends {} messages, the first a summary of the \
                         earlier ones)",
                        s.messages.len()
                    );
                }
            }
        }
        SessionsCommand::Delete { name, store } => {
            if !store.open()?.delete(&name)? {
                return Err(SessionError::NotFound { id: name }.into());
            }
        }
        SessionsCommand::Fork { from, to, store } => store.open()?.fork(&from, &to)?,
    }
    Ok(code::OK)
}
