//! Subagents: an agent as a tool of another ([`crate::Agent::as_tool`], [`SubagentTool`]), under
//! one budget for the whole tree.
//!
//! A subagent's call draws its limits from what its parent has left when the call's batch
//! starts: turns, model calls, tool calls, tokens, dollars and time, each capped further by the
//! tool's own [`SubagentTool::cap`] and the subagent's own limits. The parent keeps one turn and
//! one model call back, to read what its subagents did (none for a hand-off, whose answer is the
//! parent's). The calls of one batch share that remainder and take from it atomically (a grant
//! is held from the moment a subagent starts until it returns, then settled to what it spent),
//! so subagents racing in parallel can never together spend more than their parent had: one
//! that finds a resource exhausted does not start, and the model reads why. What a subagent
//! spent is then charged to its parent's run (its machine counts it against every limit from
//! there on, and so, up the tree, does every ancestor), and the parent's outcome carries the
//! tree ([`crate::RunOutcome::subagents`]).
//!
//! Depth is bounded by [`crate::Limits::max_depth`]; cancellation and the deadline reach every
//! level (a subagent runs under its call's cancellation, with the time its parent has left). A
//! subagent that does not finish is an error result its parent's model reads, with its partial
//! output, unless its tool is [`SubagentTool::fatal`]. One cut short by its parent's cancel or
//! deadline is `cancelled`, fatal or not: the parent stops as the interrupt says.

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::agent::handoff_history::HandoffHistory;
use crate::agent::{Agent, Plumbing, RunOptions};
use crate::budget::{Pool, Scope};
use crate::driver::Tree;
use crate::gate::{ApprovalRequest, Approvals};
use crate::journal::{
    Journal, JournalError, JournaledRun, ParentCall, RunStatus, child_approval_id, child_run_id,
    legacy_child_run_id,
};
use crate::limits::Limits;
use crate::message::{Message, ToolContent};
use crate::outcome::{RunOutcome, StopReason, SubagentRun};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// An agent as a tool of another. The model calls it with a `task`; the subagent runs on it
/// from a fresh transcript, and its final answer (its structured answer, when it has an output
/// schema) is the call's result.
#[derive(Debug, Clone)]
#[must_use]
pub struct SubagentTool {
    /// Set once: a hand-off's target may be built after the agent that names it (a cycle).
    agent: Arc<OnceLock<Agent>>,
    /// For a hand-off: what its agent sees of the conversation.
    pub(crate) handoff: Option<HandoffHistory>,
    name: String,
    description: String,
    cap: Option<Limits>,
    fatal: bool,
    input_schema: Option<Value>,
}

impl SubagentTool {
    /// `agent` as a tool named `name`.
    pub fn new(agent: Agent, name: impl Into<String>, description: impl Into<String>) -> Self {
        SubagentTool {
            agent: Arc::new(OnceLock::from(agent)),
            handoff: None,
            name: name.into(),
            description: description.into(),
            cap: None,
            fatal: false,
            input_schema: None,
        }
    }

    /// Takes structured input instead of a `task`: the model's arguments, checked against
    /// `schema` like any tool's, are the subagent's first message, as JSON.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// [`SubagentTool::input_schema`] from a type's JSON Schema.
    pub fn input<T: schemars::JsonSchema>(self) -> Self {
        self.input_schema(crate::tool::schema_for::<T>())
    }

    /// Caps what one call may draw from its parent's budget, whatever is left: its turns, tool
    /// calls, model calls, tokens, dollars and time (`timeout`).
    pub fn cap(mut self, limits: Limits) -> Self {
        self.cap = Some(limits);
        self
    }

    /// A subagent that does not finish fails its parent's run (by default its parent's model
    /// reads an error result with its partial output). One cut short by its parent's cancel or
    /// deadline does not: the call is `cancelled` and the run stops as the interrupt says.
    pub fn fatal(mut self, yes: bool) -> Self {
        self.fatal = yes;
        self
    }

    /// The tool.
    pub fn into_tool(self) -> Tool {
        let task = json!({
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "description": "The task, with everything the subagent needs to know: it sees nothing of this conversation."
                }
            },
            "required": ["task"],
            "additionalProperties": false
        });
        let schema = match self.handoff {
            Some(h) => h.input_schema(),
            None => self.input_schema.clone().unwrap_or(task),
        };
        let builder = Tool::builder(self.name.clone()).description(self.description.clone());
        let builder = match self.handoff {
            Some(_) => builder.handoff(),
            None => builder.subagent(),
        };
        let tool = Arc::new(self);
        builder.dynamic(schema, move |args: Value, ctx: ToolContext| {
            let tool = Arc::clone(&tool);
            async move { tool.call(args, ctx).await }
        })
    }

    /// A hand-off's target, built once: one not set yet cannot take over.
    pub(crate) fn with_target(
        agent: Arc<OnceLock<Agent>>,
        name: String,
        description: String,
    ) -> Self {
        SubagentTool {
            agent,
            handoff: None,
            name,
            description,
            cap: None,
            fatal: false,
            input_schema: None,
        }
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let agent = self.target()?;
        let task = match &self.input_schema {
            Some(_) => serde_json::to_string_pretty(&args).unwrap_or_default(),
            None => args
                .get("task")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        let own = agent.config().limits().clone();
        let scope = ctx.scope.clone();
        let depth = scope.as_ref().map_or(0, |s| s.depth) + 1;
        let max_depth = scope.as_ref().map_or(own.max_depth, |s| s.max_depth);
        if depth > max_depth {
            return Err(ToolError::new(
                "subagent.depth",
                format!(
                    "the subagent {} cannot start: subagents may nest {max_depth} deep, and this \
                     one would be at depth {depth}; do the task here instead",
                    self.name
                ),
            )
            .permanent());
        }
        // It never needs more than its own limits allow.
        let mut cap = Pool::of(&own);
        if let Some(c) = &self.cap {
            cap = cap.min(&Pool::of(c));
        }
        let journal = scope.as_ref().and_then(|s| tree(s)?.journal.clone());
        let parent = ParentCall {
            run_id: ctx.run_id.to_string(),
            call_id: ctx.call_id.to_string(),
            agent_path: scope.as_ref().map_or_else(
                || agent.config().name().to_owned(),
                |s| format!("{}/{}", s.path, agent.config().name()),
            ),
        };
        // A resumed parent's call finds the child it started before.
        let earlier = match &journal {
            Some(j) => earlier_child(j.as_ref(), &parent)
                .await
                .map_err(|e| self.journal_error(&e))?,
            None => None,
        };
        let child_id = earlier.as_ref().map_or_else(
            || child_run_id(&parent.run_id, &parent.call_id),
            |run| run.header.run_id.clone(),
        );
        let grant = match (&scope, &earlier) {
            (Some(s), Some(run)) => {
                // The child goes on within the grant its journal recorded.
                let grant = run.header.limits.as_ref().map_or(cap, Pool::of);
                s.reserve_exact(&grant);
                grant
            }
            (Some(s), None) => s.reserve(&cap).map_err(|why| {
                ToolError::new(
                    "subagent.budget",
                    format!("the subagent {} cannot start: {why}", self.name),
                )
                .permanent()
            })?,
            (None, _) => cap,
        };
        let deadline = scope.as_ref().and_then(|s| s.deadline);
        let mut limits = self.child_limits(&own, &grant, deadline, max_depth);
        if let Some(s) = &scope {
            // Cancelled with its parent, a child that waits out a grace period as long as its
            // parent's is dropped by the parent first, and what it spent is lost from the
            // parent's totals: it gets half, and returns its outcome in time.
            limits.grace_period = limits.grace_period.min(s.grace / 2);
        }
        let child_cancel = CancellationToken::new();
        let options = RunOptions {
            cancel: Some(child_cancel.clone()),
            sinks: scope
                .as_ref()
                .map(|s| s.sinks.0.clone())
                .unwrap_or_default(),
            limits: Some(limits),
            journal: journal.clone(),
            ..RunOptions::default()
        };
        let plumbing = Plumbing {
            agent_path: scope.as_ref().map(|_| parent.agent_path.clone()),
            parent: Some(parent),
            depth,
            elapsed: None,
        };
        let prefix = plumbing
            .parent
            .as_ref()
            .map(|p| p.call_id.clone())
            .unwrap_or_default();
        let mut earlier = earlier;
        // What the parent's journal answered for the child is the child's; the journal of the
        // child still lists those calls as waiting until it goes on.
        let answered = match (scope.as_deref().and_then(tree), &mut earlier) {
            (Some(t), Some(run)) => answer_from_parent(run, &t.approvals, &prefix),
            _ => Vec::new(),
        };
        // A child that asked before its parent's suspension was written (the process was killed
        // between the two) holds calls the parent's journal has no answer for: it cannot go on,
        // so its question is asked again, on the top run, all of it (answers taken above are
        // asked for again rather than half kept).
        if let (Some(s), Some(j), Some(run)) = (&scope, &journal, &earlier)
            && run.status == RunStatus::Suspended
            && !agent
                .waiting_on(&run.header, &run.steps, &run.approvals, None)
                .is_empty()
            && tree(s).is_some_and(|t| t.approvals.can_suspend())
        {
            suspend_tree(s, j.as_ref(), &child_id, &[], &prefix).await;
        }
        let run = async {
            match earlier {
                None => {
                    let (history, input) = self.first_input(scope.as_deref(), task);
                    Ok(agent.start(history, input, options, plumbing).await)
                }
                Some(run) if matches!(run.status, RunStatus::Finished { .. }) => {
                    Ok(agent.replayed(run))
                }
                // Boxed: a child that goes on after its parent's process stopped is rare, and
                // its future (6 KB) inline would be in every subagent call's.
                Some(run) => Box::pin(agent.go_on(run, options, false, plumbing)).await,
            }
        };
        // Boxed: passed by value, the child's run was kept twice by `watch` and a third time by
        // this call's future (16 KB a running subagent call, held by its parent's run).
        let outcome = self
            .watch(Box::pin(run), &ctx, &child_cancel, scope.as_ref())
            .await
            .map_err(|e| self.journal_error(&e))?;
        if outcome.stop_reason == StopReason::Suspended
            && let (Some(s), Some(j)) = (&scope, &journal)
        {
            suspend_tree(s, j.as_ref(), &child_id, &answered, &prefix).await;
        }
        let record = self.record(agent, &outcome, &ctx);
        if let Some(s) = &scope {
            s.settle(&grant, &record);
        }
        // A hand-off's run answers for this one, finished or not (the machine ends the run so).
        let content = if outcome.is_success() || self.handoff.is_some() {
            match outcome.structured_output.clone() {
                Some(v) => ToolContent::Json(v),
                None => ToolContent::Text(outcome.output.as_deref().unwrap_or_default().into()),
            }
        } else {
            ToolContent::Text(stopped_text(&self.name, &outcome, &record).into())
        };
        if let Some(s) = &scope {
            // The driver charges it to the run and puts it on the call's outcome.
            s.finished(&ctx.call_id, record);
        }
        Ok(ToolOutput {
            content,
            details: None,
            terminate: false,
        })
    }

    /// The child's limits: its own, within what the tree granted it, the parent's deadline,
    /// this tool's cap, and the tree's depth.
    fn child_limits(
        &self,
        own: &Limits,
        grant: &Pool,
        deadline: Option<Instant>,
        max_depth: u32,
    ) -> Limits {
        let mut limits = own.clone();
        limits.max_turns = min_bound(own.max_turns, grant.turns);
        limits.max_model_calls = min_bound(own.max_model_calls, grant.model_calls);
        limits.max_tool_calls = min_bound(own.max_tool_calls, grant.tool_calls);
        limits.max_tokens = min_bound(own.max_tokens.filter(|&n| n > 0), grant.tokens);
        limits.max_cost_usd = match (own.cost_bound(), grant.cost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let capped = self.cap.as_ref().and_then(|c| c.timeout);
        limits.timeout = [own.deadline(), left, capped].into_iter().flatten().min();
        limits.max_depth = own.max_depth.min(max_depth);
        limits
    }

    /// The agent it runs; a hand-off's target that is not set yet cannot take over.
    fn target(&self) -> Result<&Agent, ToolError> {
        self.agent.get().ok_or_else(|| {
            ToolError::new(
                "handoff.unset",
                format!("the agent of {} is not built yet", self.name),
            )
            .permanent()
        })
    }

    /// What a new child starts from: the model's task, or for a hand-off the conversation its
    /// filter passes on.
    fn first_input(&self, scope: Option<&Scope>, task: String) -> (Vec<Message>, Option<Message>) {
        match self.handoff {
            Some(h) => {
                let passed = scope.and_then(|s| s.history.clone());
                h.passed(passed.unwrap_or_default(), task)
            }
            None => (Vec::new(), Some(Message::user(task))),
        }
    }

    /// Awaits the child's run. The parent's cancellation reaches the child, except when the
    /// parent is suspending: then the child is left as it is (dropped with the call, its journal
    /// resumable), not cancelled for good.
    async fn watch(
        &self,
        run: impl Future<Output = Result<RunOutcome, JournalError>>,
        ctx: &ToolContext,
        child_cancel: &CancellationToken,
        scope: Option<&Arc<Scope>>,
    ) -> Result<RunOutcome, JournalError> {
        let mut run = std::pin::pin!(run);
        tokio::select! {
            outcome = &mut run => return outcome,
            _ = ctx.cancel.cancelled() => {}
        }
        if scope.is_some_and(|s| tree(s).is_some_and(|t| t.approvals.suspended())) {
            std::future::pending::<()>().await;
        }
        child_cancel.cancel();
        run.await
    }

    /// A child journal that cannot be read or resumed: the call fails with the journal's code.
    fn journal_error(&self, e: &JournalError) -> ToolError {
        ToolError::new(
            e.code(),
            format!("the subagent {} cannot go on: {e}", self.name),
        )
        .permanent()
    }

    fn record(&self, agent: &Agent, outcome: &RunOutcome, ctx: &ToolContext) -> SubagentRun {
        SubagentRun {
            run_id: outcome.run_id.clone(),
            agent: agent.config().name().to_owned(),
            call_id: ctx.call_id.to_string(),
            tool: ctx.tool.to_string(),
            stop_reason: outcome.stop_reason.as_str().to_owned(),
            error: outcome
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.code(), e.message())),
            usage: outcome.usage,
            cached_tokens: outcome.cached_tokens,
            cost_usd: outcome.cost_usd,
            unpriced_model_calls: outcome.unpriced_model_calls,
            turns: outcome.turns + outcome.subagents.iter().map(|s| s.turns).sum::<u32>(),
            model_calls: outcome.model_calls,
            tool_calls: outcome.tool_calls_run,
            fatal: self.fatal,
            subagents: outcome.subagents.clone(),
            answered_by: self.handoff.is_some().then(|| outcome.answered_by.clone()),
        }
    }
}

/// The handles of the run above a subagent call (the driver's, on the call's scope).
fn tree(scope: &Scope) -> Option<&Tree> {
    scope.tree::<Tree>()
}

/// The child a resumed parent's call started before, if any: under its id, or, for a parent
/// journaled before child ids were encoded, under the id it had then. Each is taken only when
/// its header names this call as its parent: a run of another call's under the id is no child
/// of this one (the call fails rather than answer with another agent's outcome).
async fn earlier_child(
    journal: &dyn Journal,
    parent: &ParentCall,
) -> Result<Option<JournaledRun>, JournalError> {
    let id = child_run_id(&parent.run_id, &parent.call_id);
    let legacy = legacy_child_run_id(&parent.run_id, &parent.call_id);
    if let Some(run) = journal.load(&id).await? {
        return match &run.header.parent {
            Some(p) if p.run_id == parent.run_id && p.call_id == parent.call_id => Ok(Some(run)),
            _ => Err(JournalError::NotResumable {
                run_id: id,
                reason: format!(
                    "the run under the id of call {}'s child is not that call's",
                    parent.call_id
                ),
            }),
        };
    }
    if legacy == id {
        return Ok(None);
    }
    Ok(journal.load(&legacy).await?.filter(|run| {
        run.header
            .parent
            .as_ref()
            .is_some_and(|p| p.run_id == parent.run_id && p.call_id == parent.call_id)
    }))
}

/// Puts the answers the parent's journal recorded for a suspended child's calls (under
/// [`child_approval_id`], or the unencoded `prefix/CALL` a journal written before held) on the
/// child's run, so that it can go on; the calls it answered.
fn answer_from_parent(run: &mut JournaledRun, approvals: &Approvals, prefix: &str) -> Vec<String> {
    let mut answered = Vec::new();
    for pending in run.approvals.iter_mut().filter(|a| a.answer.is_none()) {
        let r = &pending.request;
        let mut ids = vec![child_approval_id(prefix, &r.call_id)];
        if prefix.contains(['/', '%']) {
            ids.push(format!("{prefix}/{}", r.call_id));
        }
        for id in ids {
            // A question's answer carries its reply along.
            pending.reply = approvals.take_reply(&id, &r.tool, &r.arguments);
            pending.answer = match pending.reply {
                Some(_) => Some(crate::gate::Answer::AllowOnce),
                None => approvals.take(&id, &r.tool, &r.arguments),
            };
            if pending.answer.is_some() {
                break;
            }
        }
        if pending.answer.is_some() {
            answered.push(r.call_id.clone());
        }
    }
    answered
}

/// What the parent's model reads of a subagent that did not finish.
fn stopped_text(name: &str, outcome: &RunOutcome, record: &SubagentRun) -> String {
    let why = record
        .error
        .as_deref()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    let partial = outcome
        .output
        .as_deref()
        .filter(|t| !t.trim().is_empty())
        .map_or_else(
            || "It had no answer yet.".to_owned(),
            |t| format!("What it had so far:\n{t}"),
        );
    format!(
        "The subagent {name} stopped before it finished: {}{why}. {partial}",
        outcome.stop_reason.as_str()
    )
}

/// A child's question suspends the tree: its calls (those the parent's journal has not answered
/// for it) are the parent's to answer, named under the parent's call, and the parent's call
/// stays unfinished (the parent stops it with the run), so that the parent's resume resumes the
/// child. Waits forever once the tree suspends.
async fn suspend_tree(
    scope: &Scope,
    journal: &dyn crate::journal::Journal,
    child_id: &str,
    answered: &[String],
    prefix: &str,
) {
    let asked: Vec<ApprovalRequest> = match journal.load(child_id).await {
        Ok(Some(run)) => run.unanswered().cloned().collect(),
        _ => Vec::new(),
    };
    let asked: Vec<ApprovalRequest> = asked
        .into_iter()
        .filter(|r| !answered.contains(&r.call_id))
        .map(|mut r| {
            r.call_id = child_approval_id(prefix, &r.call_id);
            r
        })
        .collect();
    if tree(scope).is_some_and(|t| t.approvals.suspend(asked)) {
        std::future::pending::<()>().await;
    }
}

fn min_bound<T: Ord + Copy + Default>(a: Option<T>, b: Option<T>) -> Option<T> {
    let a = a.filter(|n| *n != T::default());
    let b = b.filter(|n| *n != T::default());
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

impl Agent {
    /// This agent as a tool of another, called with a `task` (see [`SubagentTool`] for caps and
    /// `fatal`).
    pub fn as_tool(&self, name: impl Into<String>, description: impl Into<String>) -> Tool {
        SubagentTool::new(self.clone(), name, description).into_tool()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spent(turns: u32, tool_calls: u32) -> SubagentRun {
        SubagentRun {
            run_id: "r".into(),
            agent: "a".into(),
            call_id: "c".into(),
            tool: "t".into(),
            stop_reason: "finished".into(),
            error: None,
            usage: crate::model::Usage::default(),
            cached_tokens: 0,
            cost_usd: 0.0,
            unpriced_model_calls: 0,
            turns,
            model_calls: turns,
            tool_calls,
            fatal: false,
            subagents: Vec::new(),
            answered_by: None,
        }
    }

    #[test]
    fn grants_never_exceed_what_is_left_and_unspent_parts_come_back() {
        let mut pool = Pool {
            turns: Some(10),
            tool_calls: Some(5),
            waiting: 1,
            ..Pool::default()
        };
        let cap = Pool {
            turns: Some(4),
            ..Pool::default()
        };
        let a = pool.reserve(&cap).unwrap();
        assert_eq!((a.turns, a.tool_calls), (Some(4), Some(5)));
        assert_eq!(
            pool.reserve(&cap).unwrap_err(),
            "no tool calls left in the budget"
        );
        assert_eq!(pool.turns, Some(6), "a refused grant takes nothing");
        pool.settle(&a, &spent(1, 2));
        assert_eq!((pool.turns, pool.tool_calls), (Some(9), Some(3)));
    }

    /// The runs of a journal, by id, read back as they were put in.
    struct Runs(std::collections::HashMap<String, JournaledRun>);

    impl Journal for Runs {
        fn holds_children(&self) -> bool {
            true
        }
        fn load<'a>(
            &'a self,
            run_id: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Option<JournaledRun>, JournalError>> {
            Box::pin(std::future::ready(Ok(self.0.get(run_id).cloned())))
        }
        fn begin<'a>(
            &'a self,
            _: &'a crate::journal::JournalHeader,
        ) -> futures::future::BoxFuture<'a, Result<(), JournalError>> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn append<'a>(
            &'a self,
            _: &'a str,
            _: u64,
            _: &'a crate::machine::Step,
        ) -> futures::future::BoxFuture<'a, Result<(), JournalError>> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn suspend<'a>(
            &'a self,
            _: &'a str,
            _: &'a [ApprovalRequest],
        ) -> futures::future::BoxFuture<'a, Result<(), JournalError>> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn finish<'a>(
            &'a self,
            _: &'a str,
            _: &'a RunOutcome,
        ) -> futures::future::BoxFuture<'a, Result<(), JournalError>> {
            Box::pin(std::future::ready(Ok(())))
        }
    }

    /// A child run under `run_id`, started by call `call` of run `parent`.
    fn child(run_id: &str, parent: &str, call: &str) -> (String, JournaledRun) {
        let header = crate::journal::JournalHeader {
            run_id: run_id.into(),
            agent: "worker".into(),
            definition: crate::journal::Definition::default(),
            fingerprint: String::new(),
            seams: crate::machine::Seams::default(),
            limits: None,
            transcript: Vec::new(),
            input: None,
            origin: None,
            parent: Some(ParentCall {
                run_id: parent.into(),
                call_id: call.into(),
                agent_path: "lead/worker".into(),
            }),
            session: None,
            served_by: None,
        };
        let run = JournaledRun {
            header,
            steps: Vec::new(),
            status: RunStatus::Running,
            approvals: Vec::new(),
        };
        (run_id.into(), run)
    }

    fn call(parent: &str, call_id: &str) -> ParentCall {
        ParentCall {
            run_id: parent.into(),
            call_id: call_id.into(),
            agent_path: "lead/worker".into(),
        }
    }

    fn found(journal: &Runs, parent: &ParentCall) -> Result<Option<String>, JournalError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(earlier_child(journal, parent))
            .map(|run| run.map(|r| r.header.run_id))
    }

    #[test]
    fn a_childs_run_is_found_under_its_encoded_id_or_the_one_a_journal_written_before_gave_it() {
        assert_eq!(child_run_id("R", "x.y"), "R.x%2Ey");
        assert_eq!(child_run_id("R.x", "y"), "R.x.y");
        assert_eq!(
            child_run_id("R", "w:1"),
            "R.w:1",
            "other ids are as they were"
        );
        assert_eq!(child_approval_id("a/b", "c"), "a%2Fb/c");
        assert_eq!(child_approval_id("a%2F", "c"), "a%252F/c");
        assert_eq!(child_approval_id("p.1", "a1"), "p.1/a1");

        // A parent journaled before ids were encoded named its dotted call's child `R.x.y`.
        let legacy = Runs([child("R.x.y", "R", "x.y")].into_iter().collect());
        assert_eq!(
            found(&legacy, &call("R", "x.y")).unwrap().as_deref(),
            Some("R.x.y")
        );
        // That run is no child of the call `y` of `R.x`, nor is `R.x%2Ey` of `x.y` of another run.
        let deeper = Runs([child("R.x.y", "R.x", "y")].into_iter().collect());
        assert_eq!(found(&deeper, &call("R", "x.y")).unwrap(), None);
        assert_eq!(
            found(&deeper, &call("R.x", "y")).unwrap().as_deref(),
            Some("R.x.y")
        );
        // A run under the encoded id that another call started is a collision, never an answer.
        let foreign = Runs([child("R.x%2Ey", "R", "x%2Ey")].into_iter().collect());
        let e = found(&foreign, &call("R", "x.y")).unwrap_err();
        assert_eq!(e.code(), "journal.not_resumable");
    }

    #[test]
    fn siblings_share_what_is_left_evenly() {
        let mut pool = Pool {
            model_calls: Some(49),
            tool_calls: Some(1),
            waiting: 2,
            ..Pool::default()
        };
        let a = pool.reserve(&Pool::default()).unwrap();
        assert_eq!(a.model_calls, Some(24));
        assert_eq!(a.tool_calls, Some(1), "at least one of what is left");
        assert!(
            pool.reserve(&Pool::default()).is_err(),
            "nothing left for the second"
        );
        pool.tool_calls = Some(3);
        let b = pool.reserve(&Pool::default()).unwrap();
        assert_eq!(b.model_calls, Some(25), "the last takes the rest");
    }
}
