//! A served agent's tasks: each one a run of the agent under the task's id, kept in memory while
//! the server runs and, where the agent's runs are journaled, found again in the journal after a
//! restart (a finished run read back, an interrupted one resumed). A call the agent's permissions
//! ask about puts the task in `input-required` until a message on the task answers it; the
//! task's events reach every stream that watches it: at most [`STREAM_BACKLOG`] of them wait
//! unread among its streams (the task's [`Backlog`]), past which its run waits for a stream
//! that lags, so a caller that does not read slows the run and loses nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::driver::replay::{RunLog, replay};
use agentloop::journal::{Journal, JournaledRun, RunStatus};
use agentloop::permissions::{Answer, ApprovalPrompter, ApprovalRequest};
use agentloop::session::{SessionLock, SessionStore, StoredSession};
use agentloop::{
    Agent, Backlog, CancellationToken, Event, EventKind, EventSink, RunOptions, STREAM_BACKLOG,
    StopReason,
};
use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore, oneshot, watch};

use crate::A2aError;
use crate::wire::{Artifact, Message, Part, StreamResponse, Task, TaskState, TaskStatus};

/// Builds the agent a task runs, with the approver of the calls its permissions ask about (the
/// task's caller, through `input-required` and a message on the task).
pub type BuildAgent =
    Arc<dyn Fn(Arc<dyn ApprovalPrompter>) -> Result<Agent, String> + Send + Sync + 'static>;

/// The options of each run (its journal, its trace): all but the cancellation, the event sink,
/// the run id and the session of the task, which the server adds. A task of an agent whose runs
/// are journaled is found in the journal after a restart.
pub type RunOptionsFor = Arc<dyn Fn() -> RunOptions + Send + Sync + 'static>;

/// An agent served over A2A.
#[derive(Clone)]
pub struct ServedAgent {
    /// Its name: the card's, and the path it is served at.
    pub name: String,
    /// What a caller reads about it.
    pub description: String,
    /// Its version, as the card shows it.
    pub version: String,
    /// The agent each task runs.
    pub build: BuildAgent,
    /// The options of each run.
    pub options: RunOptionsFor,
    /// Takes a journaled run for this process before it is resumed (the SQLite journal's
    /// `own`), so that a run another live process drives is refused rather than driven twice.
    pub claim: Option<ClaimRun>,
    /// Lets go of a run [`ServedAgent::claim`] took that does not go on here after all (read
    /// again once claimed, it was finished, suspended or could not be read): another process,
    /// the CLI's `resume` say, may then take it (the SQLite journal's `release`).
    pub release: Option<ReleaseRun>,
}

/// Takes journaled run `run_id` for this process, or says why it cannot.
pub type ClaimRun = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync + 'static>;

/// Lets journaled run `run_id` go, after a [`ClaimRun`] took it.
pub type ReleaseRun = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// What a task's journaled run names as the service that started it
/// ([`agentloop::journal::JournalHeader::served_by`]): the server finds only such runs there.
pub(crate) const SERVED_BY: &str = "a2a";

/// The most tasks a served agent keeps: past it, the oldest that ended are forgotten (a
/// `GetTask` of one then answers from the journal, or that no such task exists). Running tasks
/// are always kept.
pub(crate) const MAX_TASKS: usize = 10_000;

/// The most bytes the ended tasks a served agent keeps may weigh together (each task as its JSON,
/// with the transcript its run left its context): past it, the oldest are forgotten as past
/// [`MAX_TASKS`]. A caller's message may be megabytes; ten thousand of them would be gigabytes.
pub(crate) const MAX_KEPT_BYTES: usize = 256 << 20;

/// The longest `contextId` a message may name: the id is kept as long as its context is.
pub(crate) const MAX_CONTEXT_ID_BYTES: usize = 256;

/// How long a task waits in `input-required` for its caller's answer unless told otherwise
/// ([`crate::A2aServer::with_answer_timeout`]): one hour.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most runs a server drives at once unless told otherwise ([`crate::A2aServer::with_max_runs`]).
pub const DEFAULT_MAX_RUNS: usize = agentloop_serve::DEFAULT_MAX_RUNS;

/// The server's bound on the runs it drives at once, shared by its agents: each run costs its
/// model's tokens, so a caller who sends a thousand messages gets [`A2aError::Busy`] past the
/// bound rather than a thousand paid runs.
pub(crate) struct RunSlots {
    free: Arc<Semaphore>,
    most: AtomicUsize,
}

impl RunSlots {
    pub(crate) fn new(most: usize) -> RunSlots {
        let most = most.max(1);
        RunSlots {
            free: Arc::new(Semaphore::new(most)),
            most: AtomicUsize::new(most),
        }
    }

    /// Sets the bound (at least one), as the server is built, before any run holds a slot.
    pub(crate) fn set_most(&self, most: usize) {
        let most = most.max(1);
        let was = self.most.swap(most, Ordering::Relaxed);
        if most > was {
            self.free.add_permits(most - was);
        } else {
            self.free.forget_permits(was - most);
        }
    }

    /// A slot for one run, held until the run ends, or why there is none.
    pub(crate) fn take(&self) -> Result<OwnedSemaphorePermit, A2aError> {
        Arc::clone(&self.free)
            .try_acquire_owned()
            .map_err(|_| self.busy())
    }

    /// A slot for one run, once one is free.
    async fn wait(&self) -> Result<OwnedSemaphorePermit, A2aError> {
        Arc::clone(&self.free)
            .acquire_owned()
            .await
            .map_err(|_| self.busy())
    }

    fn busy(&self) -> A2aError {
        A2aError::Busy {
            most: self.most.load(Ordering::Relaxed),
        }
    }
}

/// One served agent and its tasks.
pub(crate) struct Served {
    pub(crate) agent: ServedAgent,
    /// The journal its runs are written to, where its tasks are found after a restart.
    journal: Option<Arc<dyn Journal>>,
    /// Where its contexts are kept as sessions (the context's id is the session's), if anywhere.
    sessions: Option<Arc<dyn SessionStore>>,
    tasks: Mutex<HashMap<String, TaskEntry>>,
    created: AtomicU64,
    /// Each context's transcript; its lock keeps the runs of one context one at a time.
    contexts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Vec<agentloop::Message>>>>>,
    /// The server's bound on runs at once.
    pub(crate) runs: Arc<RunSlots>,
    /// How long a task waits for its caller's answer, in milliseconds (the server's setting).
    answer_within_ms: Arc<AtomicU64>,
    /// Cancelled when the server stops: a caller waiting for a task to settle is answered then.
    pub(crate) stopping: CancellationToken,
}

pub(crate) struct TaskEntry {
    pub(crate) task: Task,
    cancel: CancellationToken,
    state: watch::Sender<TaskState>,
    /// The streams that follow the task until it ends or asks.
    watchers: Vec<UnboundedSender<StreamResponse>>,
    /// The items sent to its streams that they have not read yet (see the module's docs).
    backlog: Arc<Backlog>,
    /// The calls the task waits on an answer for, and where the answer goes.
    asking: Option<oneshot::Sender<Answer>>,
    /// The order it was created in, for forgetting the oldest ended tasks first.
    created: u64,
    /// Its place among the server's runs at once, held while it works: a task that waits for
    /// its caller's answer, or behind another task of its context, or ended, holds none.
    slot: Option<OwnedSemaphorePermit>,
    /// What it weighs once ended (its JSON, and the transcript its run left its context), for
    /// [`MAX_KEPT_BYTES`].
    bytes: usize,
    /// Nobody answered its question in time: why it ended.
    expired: Option<String>,
}

/// What a task's run does: start on a message, or go on with a journaled run.
pub(crate) enum Work {
    Fresh(String),
    Resume(Box<JournaledRun>),
}

/// True when a blocking `SendMessage` answers: the task ended or waits for its caller.
pub(crate) fn settled(state: TaskState) -> bool {
    state.is_terminal() || state == TaskState::InputRequired
}

/// Forgets the oldest ended tasks past [`MAX_TASKS`] or [`MAX_KEPT_BYTES`]; answers the
/// contexts no task kept names any more.
pub(crate) fn forget_oldest(tasks: &mut HashMap<String, TaskEntry>) -> Vec<String> {
    let mut weight: usize = tasks.values().map(|e| e.bytes).sum();
    if tasks.len() <= MAX_TASKS && weight <= MAX_KEPT_BYTES {
        return Vec::new();
    }
    let mut ended: Vec<(u64, String)> = tasks
        .iter()
        .filter(|(_, e)| e.task.status.state.is_terminal())
        .map(|(id, e)| (e.created, id.clone()))
        .collect();
    ended.sort_unstable();
    let mut contexts = HashSet::new();
    for (_, id) in ended {
        if tasks.len() <= MAX_TASKS && weight <= MAX_KEPT_BYTES {
            break;
        }
        if let Some(e) = tasks.remove(&id) {
            weight = weight.saturating_sub(e.bytes);
            contexts.insert(e.task.context_id);
        }
    }
    for e in tasks.values() {
        contexts.remove(&e.task.context_id);
    }
    contexts.into_iter().collect()
}

impl Served {
    pub(crate) fn new(
        agent: ServedAgent,
        sessions: Option<Arc<dyn SessionStore>>,
        runs: Arc<RunSlots>,
        answer_within_ms: Arc<AtomicU64>,
        stopping: CancellationToken,
    ) -> Served {
        let journal = (agent.options)().journal;
        Served {
            agent,
            journal,
            sessions,
            tasks: Mutex::default(),
            created: AtomicU64::new(0),
            contexts: Mutex::default(),
            runs,
            answer_within_ms,
            stopping,
        }
    }

    /// True when its runs are journaled, so that its tasks go on after a restart.
    pub(crate) fn journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// How long a task waits for its caller's answer.
    fn answer_within(&self) -> Duration {
        Duration::from_millis(self.answer_within_ms.load(Ordering::Relaxed))
    }

    /// Task `id` gives its place among the runs back (it waits behind another of its context).
    fn release_slot(&self, id: &str) {
        if let Some(e) = self.tasks().get_mut(id) {
            e.slot = None;
        }
    }

    /// True when task `id` holds a place among the runs.
    fn holds_slot(&self, id: &str) -> bool {
        self.tasks().get(id).is_some_and(|e| e.slot.is_some())
    }

    /// True when a task of context `id` holds it (works, or waits for its caller's answer): a
    /// new message of it waits behind that task, and takes a place among the runs only once the
    /// context is its own (see `queue_for`).
    pub(crate) fn context_held(&self, id: &str) -> bool {
        let contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        contexts.get(id).is_some_and(|c| c.try_lock().is_err())
    }

    /// Task `id` holds `slot` while it works.
    fn hold_slot(&self, id: &str, slot: OwnedSemaphorePermit) {
        if let Some(e) = self.tasks().get_mut(id) {
            e.slot = Some(slot);
        }
    }

    /// Nobody answered task `id`'s question within `within`: it takes no answer any more, and
    /// its run is cancelled, so that it stops holding its context (and its agent's servers).
    fn expire(&self, id: &str, within: Duration) {
        if let Some(e) = self.tasks().get_mut(id) {
            e.asking = None;
            e.expired = Some(format!(
                "nobody answered its approval within {} s: the task ended without its calls",
                within.as_secs()
            ));
            e.cancel.cancel();
        }
    }

    /// Why task `id` expired, if it did.
    fn expired(&self, id: &str) -> Option<String> {
        self.tasks().get(id).and_then(|e| e.expired.clone())
    }

    /// Records what the transcript task `id`'s run left its context weighs.
    fn weigh_context(&self, id: &str, bytes: usize) {
        if let Some(e) = self.tasks().get_mut(id) {
            e.bytes = e.bytes.saturating_add(bytes);
        }
    }

    /// Drives task `id`'s run on a task of its own, the task holding `slot` while it works.
    pub(crate) fn start(
        self: &Arc<Self>,
        id: String,
        work: Work,
        slot: Option<OwnedSemaphorePermit>,
    ) {
        if let Some(e) = self.tasks().get_mut(&id) {
            e.slot = slot;
        }
        let served = Arc::clone(self);
        tokio::spawn(async move {
            drive(served.clone(), id.clone(), work).await;
            // However the run ended, its place is free.
            if let Some(e) = served.tasks().get_mut(&id) {
                e.slot = None;
            }
        });
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskEntry>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task, as it stands.
    pub(crate) fn task(&self, id: &str) -> Result<Task, A2aError> {
        self.tasks()
            .get(id)
            .map(|e| e.task.clone())
            .ok_or_else(|| A2aError::TaskNotFound { id: id.to_owned() })
    }

    /// Its state, to wait on, and its cancellation.
    pub(crate) fn watch(
        &self,
        id: &str,
    ) -> Result<(watch::Receiver<TaskState>, CancellationToken), A2aError> {
        self.tasks()
            .get(id)
            .map(|e| (e.state.subscribe(), e.cancel.clone()))
            .ok_or_else(|| A2aError::TaskNotFound { id: id.to_owned() })
    }

    /// Adds a task (false, and nothing changed, when it is here already); `watcher` gets it
    /// first, then its events.
    pub(crate) fn add(&self, task: Task, watcher: Option<UnboundedSender<StreamResponse>>) -> bool {
        let mut tasks = self.tasks();
        if tasks.contains_key(&task.id) {
            return false;
        }
        let created = self.created.fetch_add(1, Ordering::Relaxed);
        let (state, _) = watch::channel(task.status.state);
        let mut watchers = Vec::new();
        let backlog = Arc::new(Backlog::new(STREAM_BACKLOG));
        if let Some(tx) = watcher
            && tell(&backlog, &tx, StreamResponse::Task(task.clone()))
        {
            watchers.push(tx);
        }
        let bytes = if task.status.state.is_terminal() {
            weight(&task)
        } else {
            0
        };
        tasks.insert(
            task.id.clone(),
            TaskEntry {
                task,
                cancel: CancellationToken::new(),
                state,
                watchers,
                backlog,
                asking: None,
                created,
                slot: None,
                bytes,
                expired: None,
            },
        );
        let unused = forget_oldest(&mut tasks);
        drop(tasks);
        if !unused.is_empty() {
            // A context's transcript goes with the last task of it this server remembers.
            let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
            for id in unused {
                contexts.remove(&id);
            }
        }
        true
    }

    /// Answers the calls task `id` waits on with `message` (approve or deny): the task works
    /// again, and `watcher` follows it from here.
    pub(crate) fn answer(
        &self,
        id: &str,
        message: Message,
        watcher: Option<UnboundedSender<StreamResponse>>,
    ) -> Result<(), A2aError> {
        let mut tasks = self.tasks();
        let entry = tasks
            .get_mut(id)
            .ok_or_else(|| A2aError::TaskNotFound { id: id.to_owned() })?;
        if let Some(why) = &entry.expired {
            return Err(A2aError::InvalidParams {
                reason: format!("the task {id} takes no answer any more: {why}"),
            });
        }
        if entry.task.status.state != TaskState::InputRequired {
            return Err(A2aError::InvalidParams {
                reason: format!(
                    "the task {id} waits for no answer ({}): a new message goes in the same \
                     contextId, without a taskId",
                    entry.task.status.state
                ),
            });
        }
        let text = message.input_text();
        let answer = answer_of(&text).ok_or_else(|| A2aError::InvalidParams {
            reason: format!(
                "the task {id} waits for approval: answer \"approve\" or \"deny\", not {:?}",
                text.chars().take(80).collect::<String>()
            ),
        })?;
        // The run works again: it takes a place among the runs at once, or the answer waits.
        let slot = self.runs.take()?;
        let asking = entry.asking.take().ok_or_else(|| A2aError::Internal {
            reason: format!("the task {id} has nobody waiting on its answer"),
        })?;
        entry.slot = Some(slot);
        let _ = asking.send(answer);
        entry.task.history.push(message);
        entry.task.status = TaskStatus {
            state: TaskState::Working,
            message: None,
        };
        entry.state.send_replace(TaskState::Working);
        if let Some(tx) = watcher
            && tell(
                &entry.backlog,
                &tx,
                StreamResponse::Task(entry.task.clone()),
            )
        {
            entry.watchers.push(tx);
        }
        Ok(())
    }

    /// Sends `item` to the task's watchers (those gone are dropped).
    fn publish(&self, id: &str, item: &StreamResponse) {
        if let Some(e) = self.tasks().get_mut(id) {
            let backlog = &e.backlog;
            e.watchers.retain(|tx| tell(backlog, tx, item.clone()));
        }
    }

    /// What task `id`'s streams have not read yet.
    pub(crate) fn backlog(&self, id: &str) -> Option<Arc<Backlog>> {
        self.tasks().get(id).map(|e| Arc::clone(&e.backlog))
    }

    /// Sets the task's status (its message kept in the history) and tells its watchers; a
    /// task that ended or asks lets its streams end.
    fn set_status(&self, id: &str, status: TaskStatus, artifact: Option<Artifact>) {
        let mut tasks = self.tasks();
        let Some(e) = tasks.get_mut(id) else {
            return;
        };
        e.task.status = status.clone();
        e.task.history.extend(status.message.clone());
        let update = StreamResponse::StatusUpdate {
            task_id: e.task.id.clone(),
            context_id: e.task.context_id.clone(),
            status: status.clone(),
        };
        if let Some(artifact) = artifact {
            e.task.artifacts.push(artifact.clone());
            let item = StreamResponse::ArtifactUpdate {
                task_id: e.task.id.clone(),
                context_id: e.task.context_id.clone(),
                artifact,
                last_chunk: true,
            };
            let backlog = &e.backlog;
            e.watchers.retain(|tx| tell(backlog, tx, item.clone()));
        }
        let backlog = &e.backlog;
        e.watchers.retain(|tx| tell(backlog, tx, update.clone()));
        if settled(status.state) {
            e.watchers.clear();
            // Waiting for its caller, or ended, it costs nothing: another run may take its place.
            e.slot = None;
        }
        if status.state.is_terminal() {
            e.asking = None;
            e.bytes = e.bytes.saturating_add(weight(&e.task));
        }
        e.state.send_replace(status.state);
    }

    fn context(&self, id: &str) -> Arc<tokio::sync::Mutex<Vec<agentloop::Message>>> {
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        contexts.entry(id.to_owned()).or_default().clone()
    }

    /// Makes sure task `id` is here: one this server no longer holds (it restarted, or forgot
    /// the task) is read from the journal, where its run has the task's id; a run that was
    /// interrupted goes on. False when there is no such task of this agent.
    pub(crate) async fn find(self: &Arc<Self>, id: &str) -> Result<bool, A2aError> {
        if self.tasks().contains_key(id) {
            return Ok(true);
        }
        let Some(journal) = &self.journal else {
            return Ok(false);
        };
        let finished = |r: &JournaledRun| matches!(r.status, RunStatus::Finished { .. });
        let (run, slot) = match self.served_run(journal.as_ref(), id).await? {
            None => return Ok(false),
            Some(run) if finished(&run) => (run, None),
            Some(_) => {
                // Going on with it is a run like any other: it waits for a slot like a new one.
                let slot = self.runs.take()?;
                if let Some(claim) = &self.agent.claim {
                    claim(id).map_err(|reason| A2aError::Internal {
                        reason: format!("the task's run cannot go on here: {reason}"),
                    })?;
                }
                // Read again for good once it is this process's (as the CLI's `resume`): its
                // owner may have moved it on, or finished it, since the first read.
                match self.served_run(journal.as_ref(), id).await {
                    Ok(Some(run)) if !finished(&run) => (run, Some(slot)),
                    again => {
                        // It does not go on here: were it kept, no other process could resume
                        // it while this one lives (one it was suspended for, say).
                        if let Some(release) = &self.agent.release {
                            release(id);
                        }
                        match again? {
                            None => return Ok(false),
                            Some(run) => (run, None),
                        }
                    }
                }
            }
        };
        let context_id = run.header.session.clone().unwrap_or_else(|| id.to_owned());
        let mut history: Vec<Message> = run
            .header
            .input
            .as_ref()
            .map(|m| Message::user(id, &context_id, m.text()))
            .into_iter()
            .collect();
        let mut task = Task {
            id: id.to_owned(),
            context_id,
            status: TaskStatus {
                state: TaskState::Working,
                message: None,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
        };
        let Some(slot) = slot else {
            // Its outcome, from its steps alone: no model is called, no tool runs.
            let agent = (self.agent.build)(Arc::new(Unanswerable)).map_err(|reason| {
                A2aError::Internal {
                    reason: format!("the agent could not be built: {reason}"),
                }
            })?;
            let outcome = replay(agent.config().clone(), &run_log(run));
            let (state, text, artifact) = ended(&task, &outcome);
            history.push(Message::agent(&task, text));
            task.status = TaskStatus {
                state,
                message: history.last().cloned(),
            };
            task.artifacts.extend(artifact);
            task.history = history;
            // The context goes on from the run's transcript, unless this server has it already
            // (or keeps its contexts as sessions, which hold their transcripts).
            let context = self.context(&task.context_id);
            if self.sessions.is_none()
                && let Ok(mut transcript) = context.try_lock()
                && transcript.is_empty()
            {
                *transcript = outcome.transcript;
            }
            self.add(task, None);
            return Ok(true);
        };
        task.history = history;
        // Another request may have found it meanwhile: one of them resumes it.
        if self.add(task, None) {
            self.start(id.to_owned(), Work::Resume(Box::new(run)), Some(slot));
        }
        Ok(true)
    }

    /// Run `id` of `journal` when it is a task of this server's: one its agent started for a
    /// caller, and not suspended. A run suspended for approvals is waiting for whoever ran it
    /// (`agentloop approve`), never this server's runs (their questions go to the task's
    /// caller, in the process): a caller that found its id must not answer them. The journal
    /// may be shared with the user's own runs (`agentloop run --journal`), which a caller who
    /// names their id must neither read nor, when they were cut short, drive on.
    async fn served_run(
        &self,
        journal: &dyn Journal,
        id: &str,
    ) -> Result<Option<JournaledRun>, A2aError> {
        let run = journal.load(id).await.map_err(|e| A2aError::Internal {
            reason: format!("{}: {e}", e.code()),
        })?;
        Ok(run.filter(|r| {
            r.header.agent == self.agent.name
                && r.header.served_by.as_deref() == Some(SERVED_BY)
                && r.header.parent.is_none()
                && r.status != RunStatus::Suspended
        }))
    }
}

/// The step log of a journaled run, for its replay.
fn run_log(run: JournaledRun) -> RunLog {
    RunLog {
        run_id: run.header.run_id,
        seams: run.header.seams,
        limits: run.header.limits,
        transcript: run.header.transcript,
        input: run.header.input,
        steps: run.steps,
    }
}

/// An approval answer in a follow-up message's words. A caller's answer settles the calls it was
/// shown, never later ones: "approve always" (or "deny always") is taken as "approve" ("deny"),
/// as a remote caller's "always" would otherwise be remembered for every caller of the server,
/// and written to the agent's permission store for the user's own runs.
fn answer_of(text: &str) -> Option<Answer> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    let always = words.len() == 2 && words.get(1).is_some_and(|w| w == "always");
    if words.len() != 1 && !always {
        return None;
    }
    let allow = match words.first()?.as_str() {
        "approve" | "approved" | "allow" | "yes" => true,
        "deny" | "denied" | "no" => false,
        _ => return None,
    };
    Some(if allow {
        Answer::AllowOnce
    } else {
        Answer::DenyOnce
    })
}

/// The approver of a task's run: an asked call puts the task in `input-required`, and the
/// answer is the caller's next message on the task.
struct TaskApprover {
    served: Arc<Served>,
    task_id: String,
}

impl ApprovalPrompter for TaskApprover {
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let task = self.served.task(&self.task_id).map_err(|e| e.to_string())?;
            let calls: Vec<String> = requests
                .iter()
                .map(|r| format!("{} {} (call {})", r.tool, r.arguments, r.call_id))
                .collect();
            let mut message = Message::agent(
                &task,
                format!(
                    "approval needed for: {}. Answer on this task: \"approve\" or \"deny\" \
                     (for these calls; a later call is asked about again).",
                    calls.join("; ")
                ),
            );
            message.parts.push(Part {
                data: Some(json!({ "approvals": requests })),
                media_type: Some("application/json".into()),
                ..Part::default()
            });
            if let Some(e) = self.served.tasks().get_mut(&self.task_id) {
                e.asking = Some(tx);
            }
            let status = TaskStatus {
                state: TaskState::InputRequired,
                message: Some(message),
            };
            self.served.set_status(&self.task_id, status, None);
            let within = self.served.answer_within();
            let answer = match tokio::time::timeout(within, rx).await {
                Ok(answer) => answer
                    .map_err(|_| "the task ended before its calls were answered".to_owned())?,
                Err(_) => {
                    self.served.expire(&self.task_id, within);
                    return Err(format!("nobody answered within {} s", within.as_secs()));
                }
            };
            Ok(vec![answer; requests.len()])
        })
    }
}

/// The approver of a finished run's replay: nothing is asked there.
struct Unanswerable;

impl ApprovalPrompter for Unanswerable {
    fn ask<'a>(
        &'a self,
        _requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        Box::pin(async { Err("nobody answers here".to_owned()) })
    }
}

/// Sends `item` to a stream, counted in its task's `backlog` (before it is sent, so that the
/// stream's `taken` never comes first); false when the stream is gone.
fn tell(backlog: &Backlog, tx: &UnboundedSender<StreamResponse>, item: StreamResponse) -> bool {
    backlog.pushed();
    let sent = tx.send(item).is_ok();
    if !sent {
        backlog.taken();
    }
    sent
}

/// The run's events as the task's status updates.
struct StatusSink {
    served: Arc<Served>,
    task: Task,
    /// The task's: the run waits for its streams when they lag.
    backlog: Arc<Backlog>,
}

impl EventSink for StatusSink {
    fn emit(&self, event: &Event) {
        let text = match &event.kind {
            EventKind::TurnStarted => format!("turn {}", event.turn),
            EventKind::ToolStarted { tool, .. } => format!("calling {tool}"),
            EventKind::ToolFinished { tool, outcome, .. } => {
                let status = serde_json::to_value(outcome.status).unwrap_or_default();
                format!("{tool}: {}", status.as_str().unwrap_or("ended"))
            }
            EventKind::ToolRejected { tool, code, .. } => format!("{tool}: {code}"),
            // A tool's progress (a remote agent's status, a subagent's): its words as they are.
            EventKind::ToolProgress { tool, progress, .. } => match progress.as_str() {
                Some(words) => format!("{tool}: {words}"),
                None => format!("{tool}: {progress}"),
            },
            _ => return,
        };
        let update = StreamResponse::StatusUpdate {
            task_id: self.task.id.clone(),
            context_id: self.task.context_id.clone(),
            status: TaskStatus {
                state: TaskState::Working,
                message: Some(Message::agent(&self.task, text)),
            },
        };
        self.served.publish(&self.task.id, &update);
    }

    fn backlog(&self) -> Option<&Backlog> {
        Some(&self.backlog)
    }
}

/// Runs the task: the agent on the context's transcript and the message (or the journaled run
/// going on), then the task's end.
pub(crate) async fn drive(served: Arc<Served>, id: String, work: Work) {
    let Ok(task) = served.task(&id) else {
        return;
    };
    let Ok((_, cancel)) = served.watch(&id) else {
        return;
    };
    let context = served.context(&task.context_id);
    // One run of a context at a time, each on the transcript the last one left.
    let Some(mut transcript) = queue_for(&served, &task, context, &cancel).await else {
        return;
    };
    let working = TaskStatus {
        state: TaskState::Working,
        message: None,
    };
    served.set_status(&id, working, None);
    let approver = Arc::new(TaskApprover {
        served: served.clone(),
        task_id: id.clone(),
    });
    let (state, text, artifact) = match (served.agent.build)(approver) {
        Err(e) => (
            TaskState::Failed,
            format!("the agent could not be started: {e}"),
            None,
        ),
        Ok(agent) => {
            let mut options = (served.agent.options)();
            options.cancel = Some(cancel);
            options.run_id = Some(id.clone());
            options.session = Some(task.context_id.clone());
            options.served_by = Some(SERVED_BY.to_owned());
            options.sinks.push(Arc::new(StatusSink {
                served: served.clone(),
                task: task.clone(),
                backlog: served
                    .backlog(&id)
                    .unwrap_or_else(|| Arc::new(Backlog::new(STREAM_BACKLOG))),
            }));
            let turn = match &served.sessions {
                Some(store) => {
                    match begin_turn(store, &task.context_id, &served.agent.name).await {
                        Ok(turn) => Some(turn),
                        Err(text) => {
                            let status = TaskStatus {
                                state: TaskState::Failed,
                                message: Some(Message::agent(&task, text)),
                            };
                            served.set_status(&id, status, None);
                            return;
                        }
                    }
                }
                None => None,
            };
            let before = match (&turn, &work) {
                (_, Work::Resume(r)) => r.header.transcript.clone(),
                (Some(turn), Work::Fresh(_)) => turn.session.messages.clone(),
                (None, Work::Fresh(_)) => transcript.clone(),
            };
            // A run resumed after a restart goes on from the transcript it began with. When its
            // context took turns since (later tasks of it ran first), that transcript is not the
            // context's any more: the run's end must not replace those turns.
            let moved_on = matches!(work, Work::Resume(_))
                && !before.starts_with(match &turn {
                    Some(turn) => &turn.session.messages,
                    None => &transcript,
                });
            let started_with = before.len();
            match run(&agent, work, before, options).await {
                Ok(outcome) => {
                    let (state, mut text, artifact) = ended(&task, &outcome);
                    if moved_on {
                        text.push_str(MOVED_ON);
                    } else {
                        if served.sessions.is_none() {
                            *transcript = outcome.transcript.clone();
                            served.weigh_context(&id, weight(&*transcript));
                        }
                        if let Some(turn) = turn
                            && let Err(e) =
                                turn.end(&served.agent.name, started_with, &outcome).await
                        {
                            text.push_str(&format!(" (the context was not saved: {e})"));
                        }
                    }
                    (state, text, artifact)
                }
                Err(text) => (TaskState::Failed, text, None),
            }
        }
    };
    drop(transcript);
    // A run cancelled because nobody answered its question ended for that reason.
    let (state, text) = match served.expired(&id) {
        Some(why) => (TaskState::Failed, why),
        None => (state, text),
    };
    let status = TaskStatus {
        state,
        message: Some(Message::agent(&task, text)),
    };
    served.set_status(&id, status, artifact);
}

/// Said after the answer of a task resumed after a restart whose context took turns since it
/// began: its run is not recorded in the context, whose newer turns it would replace.
const MOVED_ON: &str = " (not added to its context: the context took other turns while this \
                        task was cut off by the server's restart)";

/// Takes `context` for `task`'s run. A task behind another of its context (one that works, or
/// waits for its caller's answer for as long as that takes) gives its place among the runs back
/// while it waits: a place held by a task that does nothing could leave that answer no place to
/// run in, and the server locked. It takes a place again once the context is its own. Cancelled
/// meanwhile, it ends canceled (`None`).
async fn queue_for(
    served: &Arc<Served>,
    task: &Task,
    context: Arc<tokio::sync::Mutex<Vec<agentloop::Message>>>,
    cancel: &CancellationToken,
) -> Option<OwnedMutexGuard<Vec<agentloop::Message>>> {
    let canceled = || {
        let status = TaskStatus {
            state: TaskState::Canceled,
            message: Some(Message::agent(
                task,
                "the task was cancelled before it started",
            )),
        };
        served.set_status(&task.id, status, None);
    };
    let transcript = match Arc::clone(&context).try_lock_owned() {
        Ok(transcript) if served.holds_slot(&task.id) => return Some(transcript),
        // Its message came while the context was held, so it took no place (see
        // `Served::context_held`); the context came free since: the place is taken below.
        Ok(transcript) => transcript,
        Err(_) => {
            served.release_slot(&task.id);
            tokio::select! {
                transcript = context.lock_owned() => transcript,
                () = cancel.cancelled() => {
                    canceled();
                    return None;
                }
            }
        }
    };
    let slot = tokio::select! {
        slot = served.runs.wait() => slot,
        () = cancel.cancelled() => {
            canceled();
            return None;
        }
    };
    match slot {
        Ok(slot) => served.hold_slot(&task.id, slot),
        Err(e) => {
            let status = TaskStatus {
                state: TaskState::Failed,
                message: Some(Message::agent(task, e.to_string())),
            };
            served.set_status(&task.id, status, None);
            return None;
        }
    }
    Some(transcript)
}

/// What `value` weighs as JSON, in bytes (counted, not written).
fn weight(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The key of a session's metadata that makes it an A2A context, naming the served agent that
/// began it.
const CONTEXT_OF: &str = "a2a_context_of";

/// One turn of a context kept as a session: its lock, held while the turn runs, and the session.
struct Turn {
    store: Arc<dyn SessionStore>,
    _lock: Box<dyn SessionLock>,
    session: StoredSession,
}

/// Takes context `id`'s session for a turn (another process's turn refuses this one).
async fn begin_turn(store: &Arc<dyn SessionStore>, id: &str, agent: &str) -> Result<Turn, String> {
    let (store, id, agent) = (store.clone(), id.to_owned(), agent.to_owned());
    tokio::task::spawn_blocking(move || {
        let failed = |e: agentloop::session::SessionError| {
            format!("the context's session could not be used: {}: {e}", e.code())
        };
        let lock = store.lock(&id).map_err(failed)?;
        let session = match store.load(&id).map_err(failed)? {
            // A caller names its context: only a session this server's agent began is one. The
            // store may hold the user's own conversations (`agentloop run --session`).
            Some(s) if s.metadata.get(CONTEXT_OF).and_then(|v| v.as_str()) != Some(&agent) => {
                return Err(format!(
                    "the context {id:?} is not one of this agent's: its session holds another \
                     conversation; leave contextId out to begin a new one"
                ));
            }
            Some(s) => s,
            None => {
                let mut s = StoredSession::new(id, agent.clone());
                s.metadata.insert(CONTEXT_OF.into(), agent.into());
                s
            }
        };
        Ok(Turn {
            store,
            _lock: lock,
            session,
        })
    })
    .await
    .map_err(|e| format!("the context's session could not be read: {e}"))?
}

impl Turn {
    /// Records the run in the session and writes it; the lock goes with the turn.
    async fn end(
        mut self,
        agent: &str,
        started_with: usize,
        outcome: &agentloop::RunOutcome,
    ) -> Result<(), String> {
        self.session.record(agent, started_with, outcome);
        tokio::task::spawn_blocking(move || {
            self.store
                .save(&self.session)
                .map_err(|e| format!("{}: {e}", e.code()))
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

async fn run(
    agent: &Agent,
    work: Work,
    transcript: Vec<agentloop::Message>,
    options: agentloop::RunOptions,
) -> Result<agentloop::RunOutcome, String> {
    match work {
        Work::Fresh(input) => Ok(agent
            .run_with(transcript, Some(agentloop::Message::user(input)), options)
            .await),
        Work::Resume(run) => agent
            .resume(*run, options, false)
            .await
            .map_err(|e| format!("the run could not go on: {}: {e}", e.code())),
    }
}

/// The task's end for a run's outcome: its state, the agent's last words, and the answer as an
/// artifact (text, and the structured answer as data).
fn ended(task: &Task, outcome: &agentloop::RunOutcome) -> (TaskState, String, Option<Artifact>) {
    match outcome.stop_reason {
        StopReason::Finished => {
            let text = outcome.output.clone().unwrap_or_default();
            let mut parts = vec![Part::text(text.clone())];
            if let Some(data) = &outcome.structured_output {
                parts.push(Part {
                    data: Some(data.clone()),
                    media_type: Some("application/json".into()),
                    ..Part::default()
                });
            }
            let artifact = Artifact {
                artifact_id: format!("{}-answer", task.id),
                name: "answer".into(),
                parts,
            };
            (TaskState::Completed, text, Some(artifact))
        }
        StopReason::Cancelled => (TaskState::Canceled, "the run was cancelled".into(), None),
        ref other => {
            let mut text = format!("the run stopped: {}", other.as_str());
            if let Some(e) = &outcome.error {
                text.push_str(&format!(" ({}: {e})", e.code()));
            }
            (TaskState::Failed, text, None)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn entry(created: u64, state: TaskState) -> (String, TaskEntry) {
        let id = format!("t{created}");
        let task = Task {
            id: id.clone(),
            context_id: "c".into(),
            status: TaskStatus {
                state,
                message: None,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
        };
        let entry = TaskEntry {
            task,
            cancel: CancellationToken::new(),
            state: watch::channel(state).0,
            watchers: Vec::new(),
            backlog: Arc::new(Backlog::new(STREAM_BACKLOG)),
            asking: None,
            created,
            slot: None,
            bytes: 0,
            expired: None,
        };
        (id, entry)
    }

    #[test]
    fn past_the_cap_the_oldest_ended_tasks_are_forgotten_and_running_ones_kept() {
        let mut tasks: HashMap<String, TaskEntry> = HashMap::new();
        // The oldest is still running; the next two ended.
        tasks.extend([entry(0, TaskState::Working)]);
        tasks.extend([
            entry(1, TaskState::Completed),
            entry(2, TaskState::Canceled),
        ]);
        for n in 3..(MAX_TASKS as u64 + 2) {
            tasks.extend([entry(n, TaskState::Completed)]);
        }
        assert_eq!(tasks.len(), MAX_TASKS + 2);
        // Every task is of context "c", and some are kept: the context is too.
        assert!(forget_oldest(&mut tasks).is_empty());
        assert_eq!(tasks.len(), MAX_TASKS);
        assert!(tasks.contains_key("t0"), "a running task is kept");
        assert!(!tasks.contains_key("t1") && !tasks.contains_key("t2"));
        assert!(tasks.contains_key("t3"));
        forget_oldest(&mut tasks);
        assert_eq!(
            tasks.len(),
            MAX_TASKS,
            "nothing past the cap: nothing forgotten"
        );
    }

    #[test]
    fn past_the_byte_budget_the_oldest_ended_tasks_go_and_their_contexts_with_the_last() {
        let mut tasks: HashMap<String, TaskEntry> = HashMap::new();
        for n in 0..4 {
            let (id, mut e) = entry(n, TaskState::Completed);
            e.bytes = MAX_KEPT_BYTES / 2;
            e.task.context_id = format!("c{}", n / 2);
            tasks.insert(id, e);
        }
        // Heavy, but running: never forgotten, though it counts.
        let (id, mut e) = entry(4, TaskState::Working);
        e.bytes = MAX_KEPT_BYTES / 2;
        tasks.insert(id, e);
        let mut gone = forget_oldest(&mut tasks);
        gone.sort();
        // t0, t1 (all of c0) and t2 went; c1 still has t3.
        assert_eq!(gone, vec!["c0".to_owned()]);
        let mut left: Vec<&String> = tasks.keys().collect();
        left.sort();
        assert_eq!(left, ["t3", "t4"]);
    }

    #[test]
    fn a_task_weighs_its_json() {
        let (_, e) = entry(0, TaskState::Completed);
        assert_eq!(weight(&e.task), serde_json::to_vec(&e.task).unwrap().len());
    }

    #[test]
    fn a_follow_up_answers_approve_or_deny_and_nothing_else() {
        assert_eq!(answer_of("approve"), Some(Answer::AllowOnce));
        assert_eq!(answer_of(" Yes! "), Some(Answer::AllowOnce));
        assert_eq!(answer_of("approve always"), Some(Answer::AllowOnce));
        assert_eq!(answer_of("deny"), Some(Answer::DenyOnce));
        assert_eq!(answer_of("Deny always."), Some(Answer::DenyOnce));
        assert_eq!(answer_of("approve it"), None);
        assert_eq!(answer_of("please deny"), None);
        assert_eq!(answer_of(""), None);
        assert_eq!(answer_of("sure"), None);
    }
}
