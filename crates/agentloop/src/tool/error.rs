//! How a tool call failed ([`ToolError`], what the handler returns) and why a tool could not be
//! registered ([`ToolDefinitionError`]).

use serde::{Deserialize, Serialize};

/// How a tool call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolError {
    /// An expected failure: the model reads `message` and may recover.
    #[error("{code}: {message}")]
    Recoverable {
        /// A short machine-readable code (`not_found`, `timeout`).
        code: String,
        /// What the model reads.
        message: String,
        /// Another attempt with the same arguments would fail the same way: the tool's `retries`
        /// do not apply ([`ToolError::permanent`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        permanent: bool,
    },
    /// The run cannot go on: it fails, running siblings drain, nothing more is dispatched.
    #[error("fatal: {message}")]
    Fatal {
        /// The operator's diagnostic (never shown to the model as a recoverable result).
        message: String,
    },
}

impl ToolError {
    /// A recoverable error the model reads.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::Recoverable {
            code: code.into(),
            message: message.into(),
            permanent: false,
        }
    }

    /// Marks a recoverable error as one that another attempt with the same arguments cannot
    /// cure (a city that does not exist, a program that is not installed): the tool's `retries`
    /// are not spent on it. A fatal error is left as it is.
    #[must_use]
    pub fn permanent(mut self) -> Self {
        if let ToolError::Recoverable { permanent, .. } = &mut self {
            *permanent = true;
        }
        self
    }

    /// The same error with its message rewritten by `f` (its code and kind kept): for a tool
    /// that must take what it cannot show out of any error it passes on (a credential a server
    /// echoed).
    #[must_use]
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            ToolError::Recoverable {
                code,
                message,
                permanent,
            } => ToolError::Recoverable {
                code,
                message: f(message),
                permanent,
            },
            ToolError::Fatal { message } => ToolError::Fatal {
                message: f(message),
            },
        }
    }

    /// A fatal failure that ends the run.
    pub fn fatal(message: impl Into<String>) -> Self {
        ToolError::Fatal {
            message: message.into(),
        }
    }

    /// True for a fatal failure.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ToolError::Fatal { .. })
    }
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        ToolError::new("tool_error", message)
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        ToolError::new("tool_error", message)
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError::new("io_error", e.to_string())
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        ToolError::new("invalid_arguments", e.to_string()).permanent()
    }
}

/// Why a tool could not be registered. The message says what is wrong and lists what is
/// registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolDefinitionError {
    /// The name breaks the naming rule.
    #[error(
        "invalid tool name {name:?}: {reason} (registered: {})",
        list(registered)
    )]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
    /// The name is taken.
    #[error("duplicate tool name {name:?} (registered: {})", list(registered))]
    Duplicate {
        /// The name.
        name: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
    /// The input or output schema is not a valid JSON Schema for a tool.
    #[error(
        "invalid schema for tool {name:?}: {reason} (registered: {})",
        list(registered)
    )]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
        /// The tools registered so far.
        registered: Vec<String>,
    },
}

impl ToolDefinitionError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ToolDefinitionError::InvalidName { .. } => "tool.invalid_name",
            ToolDefinitionError::Duplicate { .. } => "tool.duplicate",
            ToolDefinitionError::InvalidSchema { .. } => "tool.invalid_schema",
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
