//! A tool call's answer slot, as the Python dispatcher gets it: the first answer counts, and goes
//! to the run waiting for it.

use std::sync::Mutex;

use agentloop::{ToolError, ToolOutput};
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

/// What a tool call's Python side answers with.
pub(crate) type Reply = Result<ToolOutput, ToolError>;

/// The answer slot of one call, handed to the Python dispatcher. The first answer counts.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct ToolReply {
    pub(crate) tx: Mutex<Option<oneshot::Sender<Reply>>>,
}

impl ToolReply {
    pub(crate) fn send(&self, reply: Reply) {
        let tx = match self.tx.lock() {
            Ok(mut slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(tx) = tx {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(reply);
        }
    }
}

#[pymethods]
impl ToolReply {
    /// A text result.
    fn text(&self, text: String) {
        self.send(Ok(ToolOutput::text(text)));
    }

    /// A JSON result (the JSON text of any other value the function returned).
    fn json(&self, json: &str) {
        self.send(
            serde_json::from_str::<Value>(json)
                .map(ToolOutput::json)
                .map_err(|e| ToolError::new("tool.output_not_json", e.to_string())),
        );
    }

    /// An error the model reads.
    fn error(&self, code: String, message: String) {
        self.send(Err(ToolError::new(code, message)));
    }

    /// A failure that ends the run.
    fn fatal(&self, message: String) {
        self.send(Err(ToolError::fatal(message)));
    }
}
