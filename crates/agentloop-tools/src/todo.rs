//! `todo`: the plan the model keeps while it works: it adds tasks, marks each as it goes, and
//! lists them. The list belongs to the run (one list per run id), answers every call whole, and
//! rides in each call's details, so the run's outcome holds the last state of it
//! ([`todos_of`]) and a live view can show it as it changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agentloop::{RunOutcome, Tool, ToolContext, ToolError, ToolOutput};
use serde::{Deserialize, Serialize};

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Finished.
    Done,
    /// Dropped.
    Cancelled,
}

impl TodoStatus {
    fn mark(self) -> &'static str {
        match self {
            TodoStatus::Pending => "[ ]",
            TodoStatus::InProgress => "[>]",
            TodoStatus::Done => "[x]",
            TodoStatus::Cancelled => "[-]",
        }
    }
}

/// One task of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Todo {
    /// Its number, from 1, in the order it was added.
    pub id: u32,
    /// What it is.
    pub title: String,
    /// Where it stands.
    pub status: TodoStatus,
}

/// The most tasks one list holds: a plan, not a backlog.
pub const MAX_TODOS: usize = 50;

// `todo`'s arguments; the schema the model reads is written by hand (`schema`): flat and short,
// which small models follow better than a derived one with `$defs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TodoArgs {
    action: Action,
    #[serde(default)]
    items: Vec<String>,
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    status: Option<TodoStatus>,
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": ["add", "update", "list"],
                "description": "add new tasks, update one task's status, or list the plan"
            },
            "items": {
                "type": "array",
                "items": {"type": "string"},
                "description": "add: the new tasks, in the order to do them"
            },
            "id": {"type": "integer", "minimum": 1, "description": "update: the task's number"},
            "status": {
                "type": "string",
                "enum": ["pending", "in_progress", "done", "cancelled"],
                "description": "update: its new status"
            }
        },
        "required": ["action"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Add,
    Update,
    List,
}

type Lists = Arc<Mutex<HashMap<Arc<str>, Vec<Todo>>>>;

/// The `todo` tool under the name `name`.
pub fn todo_tool(name: &str) -> Tool {
    let lists: Lists = Arc::default();
    Tool::builder(name)
        .description(
            "Keeps your plan for this task: a numbered list of steps, each pending, in_progress, \
             done or cancelled. Make the plan first for work of several steps, mark a step \
             in_progress when you start it and done when it is finished, and add steps as you \
             learn more. Every call answers the whole list. Examples: {\"action\": \"add\", \
             \"items\": [\"Read config.toml\", \"Fix the port\", \"Run the tests\"]}; \
             {\"action\": \"update\", \"id\": 2, \"status\": \"done\"}; {\"action\": \"list\"}",
        )
        // One list per run, changed in call order.
        .sequential()
        .dynamic(
            schema(),
            move |args: serde_json::Value, ctx: ToolContext| {
                let lists = Arc::clone(&lists);
                async move {
                    // The schema was checked before the call; this only gives the arguments a type.
                    let args: TodoArgs = serde_json::from_value(args)
                        .map_err(|e| ToolError::new("todo.arguments", e.to_string()))?;
                    apply(&lists, &ctx.run_id, args)
                }
            },
        )
}

fn apply(lists: &Lists, run: &Arc<str>, args: TodoArgs) -> Result<ToolOutput, ToolError> {
    let mut all = lists.lock().unwrap_or_else(|p| p.into_inner());
    let list = all.entry(Arc::clone(run)).or_default();
    match args.action {
        Action::Add => {
            let items: Vec<String> = args
                .items
                .iter()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect();
            if items.is_empty() {
                return Err(ToolError::new(
                    "todo.empty",
                    "add needs `items`: the tasks to add, e.g. {\"action\": \"add\", \"items\": [\"Run the tests\"]}",
                ));
            }
            if list.len() + items.len() > MAX_TODOS {
                return Err(ToolError::new(
                    "todo.full",
                    format!(
                        "the plan holds at most {MAX_TODOS} tasks ({} now): finish or cancel some, \
                         or plan in bigger steps",
                        list.len()
                    ),
                ));
            }
            for title in items {
                let id = u32::try_from(list.len() + 1).unwrap_or(u32::MAX);
                list.push(Todo {
                    id,
                    title,
                    status: TodoStatus::Pending,
                });
            }
        }
        Action::Update => {
            let (Some(id), Some(status)) = (args.id, args.status) else {
                return Err(ToolError::new(
                    "todo.update",
                    "update needs `id` and `status`, e.g. {\"action\": \"update\", \"id\": 1, \"status\": \"done\"}",
                ));
            };
            let count = list.len();
            let Some(task) = list.iter_mut().find(|t| t.id == id) else {
                return Err(ToolError::new(
                    "todo.unknown",
                    if count == 0 {
                        format!("there is no task {id}: the plan is empty (add tasks first)")
                    } else {
                        format!("there is no task {id}: the tasks are numbered 1 to {count}")
                    },
                ));
            };
            task.status = status;
        }
        Action::List => {}
    }
    Ok(ToolOutput::text(render(list)).with_details(serde_json::json!({ "todos": list })))
}

/// The list as the model (and a terminal) reads it: `2. [>] Fix the port`.
pub fn render(list: &[Todo]) -> String {
    if list.is_empty() {
        return "The plan is empty.".into();
    }
    let done = list
        .iter()
        .filter(|t| matches!(t.status, TodoStatus::Done | TodoStatus::Cancelled))
        .count();
    let mut out = format!("Plan ({done} of {} finished):", list.len());
    for t in list {
        out.push_str(&format!("\n{}. {} {}", t.id, t.status.mark(), t.title));
    }
    out
}

/// The plan as the run left it: the list of its last successful `todo` call (any tool whose
/// details carry `todos`), if it made one.
pub fn todos_of(outcome: &RunOutcome) -> Option<Vec<Todo>> {
    outcome
        .tool_calls
        .iter()
        .rev()
        .filter(|r| r.ok())
        .find_map(|r| todos_in(r.outcome.details.as_ref()?))
}

/// The list a call's details carry.
pub fn todos_in(details: &serde_json::Value) -> Option<Vec<Todo>> {
    serde_json::from_value(details.get("todos")?.clone()).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn call(lists: &Lists, run: &str, args: serde_json::Value) -> Result<ToolOutput, ToolError> {
        apply(
            lists,
            &Arc::from(run),
            serde_json::from_value(args).unwrap(),
        )
    }

    #[test]
    fn a_plan_is_added_to_marked_and_listed_per_run() {
        let lists = Lists::default();
        let out = call(
            &lists,
            "r1",
            serde_json::json!({"action": "add", "items": ["Read", " ", "Fix", "Test"]}),
        )
        .unwrap();
        assert_eq!(
            out.content.to_text(),
            "Plan (0 of 3 finished):\n1. [ ] Read\n2. [ ] Fix\n3. [ ] Test"
        );
        call(
            &lists,
            "r1",
            serde_json::json!({"action": "update", "id": 1, "status": "done"}),
        )
        .unwrap();
        let out = call(
            &lists,
            "r1",
            serde_json::json!({"action": "update", "id": 2, "status": "in_progress"}),
        )
        .unwrap();
        assert!(out.content.to_text().contains("1. [x] Read\n2. [>] Fix"));
        let todos = todos_in(out.details.as_ref().unwrap()).unwrap();
        assert_eq!(todos[1].status, TodoStatus::InProgress);
        // Another run has its own list.
        let other = call(&lists, "r2", serde_json::json!({"action": "list"})).unwrap();
        assert_eq!(other.content.to_text(), "The plan is empty.");
        let e = call(
            &lists,
            "r1",
            serde_json::json!({"action": "update", "id": 9, "status": "done"}),
        )
        .unwrap_err();
        assert_eq!(crate::testing::code(&e), "todo.unknown");
        assert!(e.to_string().contains("1 to 3"), "{e}");
        let e = call(&lists, "r1", serde_json::json!({"action": "add"})).unwrap_err();
        assert_eq!(crate::testing::code(&e), "todo.empty");
    }
}
