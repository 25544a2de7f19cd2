//! What the agent a hand-off passes the conversation to sees of it ([`HandoffHistory`]): a file
//! of its own, below both the hand-off (`handoff.rs`) and the subagent tool that runs it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::message::Message;

/// What the agent a hand-off passes the conversation to sees of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffHistory {
    /// The whole conversation, tool calls and results included (the default).
    #[default]
    All,
    /// What the user and the agents said, without tool calls and their results.
    NoTools,
    /// The user's last message only.
    LastUser,
    /// Nothing of it: the hand-off takes a `task`, which the model writes for the next agent.
    None,
}

impl HandoffHistory {
    /// The stable word (`all`, `no_tools`, `last_user`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            HandoffHistory::All => "all",
            HandoffHistory::NoTools => "no_tools",
            HandoffHistory::LastUser => "last_user",
            HandoffHistory::None => "none",
        }
    }

    /// The hand-off tool's input: a `task` when the next agent sees nothing, else an optional
    /// `reason`, kept in the call's record.
    pub(crate) fn input_schema(self) -> Value {
        if self == HandoffHistory::None {
            return json!({
                "type": "object",
                "properties": {"task": {
                    "type": "string",
                    "description": "The task, with everything the next agent needs to know: it sees nothing of this conversation."
                }},
                "required": ["task"]
            });
        }
        json!({
            "type": "object",
            "properties": {"reason": {
                "type": "string",
                "description": "Why the conversation goes to this agent (optional)."
            }}
        })
    }

    /// The next agent's transcript and first input: `history` filtered (its last user message
    /// becomes the input, when it ends with one), or the model's `task`.
    pub(crate) fn passed(
        self,
        mut history: Vec<Message>,
        task: String,
    ) -> (Vec<Message>, Option<Message>) {
        match self {
            HandoffHistory::None => return (Vec::new(), Some(Message::user(task))),
            HandoffHistory::LastUser => {
                let last = history
                    .iter()
                    .rposition(|m| matches!(m, Message::User { .. }))
                    .map(|at| history.swap_remove(at));
                return (Vec::new(), last);
            }
            HandoffHistory::NoTools => history.retain_mut(|m| match m {
                Message::Tool(_) => false,
                Message::Assistant(a) => {
                    a.tool_calls.clear();
                    !a.text.trim().is_empty()
                }
                Message::User { .. } => true,
            }),
            HandoffHistory::All => {}
        }
        let input = match history.last() {
            Some(Message::User { .. }) => history.pop(),
            _ => None,
        };
        (history, input)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::message::{AssistantMessage, ToolCall, ToolContent, ToolResult};

    fn said(text: &str) -> AssistantMessage {
        AssistantMessage {
            text: text.into(),
            ..AssistantMessage::default()
        }
    }

    fn conversation() -> Vec<Message> {
        let mut asked = said("Let me look.");
        asked.tool_calls.push(ToolCall {
            call_id: "c1".into(),
            tool: "lookup".into(),
            arguments: "{}".into(),
        });
        vec![
            Message::user("first"),
            Message::Assistant(asked),
            Message::Tool(ToolResult {
                call_id: "c1".into(),
                tool: "lookup".into(),
                content: ToolContent::Text("found".into()),
                is_error: false,
            }),
            Message::Assistant(said("Anything else?")),
            Message::user("I was charged twice"),
        ]
    }

    #[test]
    fn each_filter_passes_what_it_says() {
        let (h, input) = HandoffHistory::All.passed(conversation(), String::new());
        assert_eq!(h.len(), 4);
        assert_eq!(input, Some(Message::user("I was charged twice")));
        let (h, _) = HandoffHistory::NoTools.passed(conversation(), String::new());
        assert_eq!(h.len(), 3, "the tool result goes, the calls' text stays");
        assert!(h.iter().all(|m| match m {
            Message::Assistant(a) => a.tool_calls.is_empty(),
            Message::Tool(_) => false,
            Message::User { .. } => true,
        }));
        let (h, input) = HandoffHistory::LastUser.passed(conversation(), String::new());
        assert!(h.is_empty());
        assert_eq!(input, Some(Message::user("I was charged twice")));
        let (h, input) = HandoffHistory::None.passed(conversation(), "refund order 7".into());
        assert!(h.is_empty());
        assert_eq!(input, Some(Message::user("refund order 7")));
    }
}
