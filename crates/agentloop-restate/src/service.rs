//! The services an endpoint serves: [`crate::SESSION_SERVICE`], whose `run` handler drives a
//! run, and [`crate::RUNS_SERVICE`], which keeps each run's news for whoever watches it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentloop::journal::{JournalError, JournalHeader, JournaledRun, RunStatus};
use agentloop::machine::Step;
use agentloop::permissions::{Answer, ApprovalRequest};
use agentloop::{Agent, EventSink, Message, RunOptions, RunOutcome, StopReason};
use restate_sdk::context::DurableFuture;
use restate_sdk::prelude::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::RestateError;
use crate::ingress::{Ingress, News, NewsBatch, PendingApproval, Resolution, RunRequest};
use crate::journal::{ChannelJournal, Entry, Request};
use crate::news::News as NewsSender;

/// What a worker runs: its agents, by name.
pub trait Agents: Send + Sync + 'static {
    /// The agent `name`. `Err` says why there is none. (A resumed run's model goes on where
    /// its journal left it by [`agentloop::model::Model::resumed`], as every resume does.)
    fn agent(&self, name: &str) -> Result<Agent, String>;

    /// Sinks of this worker for a run's events, besides the run's news (a trace file, say).
    fn sinks(&self, _run_id: &str) -> Vec<Arc<dyn EventSink>> {
        Vec::new()
    }

    /// The run's result, as the invocation's output (what `attach` receives).
    fn report(&self, outcome: &RunOutcome) -> Value {
        json!({
            "run_id": outcome.run_id,
            "stop_reason": outcome.stop_reason.as_str(),
            "output": outcome.output,
            "error": outcome.error.as_ref().map(|e| json!({"code": e.code(), "message": e.to_string()})),
        })
    }

    /// The invocation's output when the run could not go on from its journal (its agent
    /// changed between workers, say): the run ends there, failed with the journal's code.
    fn refused(&self, run_id: &str, error: &JournalError) -> Value {
        json!({
            "run_id": run_id,
            "stop_reason": StopReason::Failed.as_str(),
            "output": null,
            "error": {"code": error.code(), "message": error.to_string()},
        })
    }
}

/// How an endpoint behaves.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// Where runs publish their news (events, approvals); none: they publish nothing.
    pub ingress: Option<Ingress>,
    /// How soon Restate tries a run again on another attempt (a worker that died): the first
    /// retry's delay, doubling up to [`EndpointOptions::retry_max`].
    pub retry_initial: Duration,
    /// The longest delay between attempts.
    pub retry_max: Duration,
    /// How long a step may go without a journal entry before the worker writes a heartbeat
    /// entry. Keep it well below the server's inactivity timeout (a minute by default): an
    /// attempt that stays silent past that (and the abort timeout) is cut, and the calls it was
    /// running are then answered "interrupted". It is also how soon Restate's cancel reaches a
    /// run in the middle of a long step.
    pub heartbeat: Duration,
    /// How long a run's news (its events, for `attach`) is kept after the run ends.
    pub news_retention: Duration,
    /// The public keys of the Restate servers the endpoint answers (`publickeyv1_…`): a request
    /// must carry the signature of one of them. None: the endpoint answers whoever reaches it,
    /// and whoever does can run its agents and supply their journals (approvals included), so it
    /// belongs on loopback.
    pub identity_keys: Vec<String>,
    /// For the crash tests only: right after step N of a run is journaled, the worker says so on
    /// stderr (`agentloop-restate: fault: paused after step N`) and that run goes no further,
    /// for the test to kill the process. Set from `AGENTLOOP_TEST_RESTATE_CRASH_AFTER_STEP` by
    /// [`EndpointOptions::default`], and only in a build with the `test-faults` feature.
    crash_after_step: Option<u64>,
    /// For the clock tests only: this worker's clock reads this many ms behind the system's
    /// (another machine's clock). Set from `AGENTLOOP_TEST_RESTATE_CLOCK_BEHIND_MS`, only in a
    /// build with the `test-faults` feature.
    clock_behind_ms: u64,
}

/// A test's fault, a number from the variable `name`: none unless this crate is built with the
/// `test-faults` feature, so no shipped worker can be made to stall, or to misread its clock, by
/// its environment.
fn test_fault(name: &str) -> Option<u64> {
    #[cfg(feature = "test-faults")]
    {
        std::env::var(name).ok().and_then(|v| v.parse().ok())
    }
    #[cfg(not(feature = "test-faults"))]
    {
        let _ = name;
        None
    }
}

impl EndpointOptions {
    /// Now, on this worker's clock (Unix time, ms).
    fn now_ms(&self) -> u64 {
        now_ms().saturating_sub(self.clock_behind_ms)
    }
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            ingress: None,
            retry_initial: Duration::from_millis(250),
            retry_max: Duration::from_secs(10),
            heartbeat: Duration::from_secs(5),
            news_retention: Duration::from_secs(24 * 60 * 60),
            identity_keys: Vec::new(),
            crash_after_step: test_fault("AGENTLOOP_TEST_RESTATE_CRASH_AFTER_STEP"),
            clock_behind_ms: test_fault("AGENTLOOP_TEST_RESTATE_CLOCK_BEHIND_MS").unwrap_or(0),
        }
    }
}

/// What a run's Restate journal held, read back, and what it holds as the run goes on.
#[derive(Debug, Default)]
struct Journaled {
    header: Option<JournalHeader>,
    steps: Vec<Step>,
    /// Every answered approval (the gate finds its answers here when asked again).
    approvals: Vec<agentloop::journal::PendingApproval>,
    /// The calls of the last suspension, until they are answered.
    pending: Vec<ApprovalRequest>,
    /// When the run started (Unix time, ms).
    started_ms: Option<u64>,
    /// When it last suspended (Unix time, ms).
    suspended_ms: Option<u64>,
    /// When the wait for answers of the last suspension ends (Unix time, ms).
    wait_until_ms: Option<u64>,
    /// A time the run has surely reached (Unix time, ms, on the clock that journaled it): the
    /// end of a wait that ended on its timer. Its elapsed time is never less, whatever the clock
    /// of the worker that goes on with it says.
    reached_ms: Option<u64>,
    /// The run's deadline (its agent's `timeout`), once its agent is built.
    deadline: Option<Duration>,
    /// Its subagents' runs, part of this invocation, by run id.
    children: std::collections::HashMap<String, JournaledRun>,
}

impl Journaled {
    fn record(&mut self, entry: Entry) {
        if let Some(id) = entry.child() {
            let id = id.to_owned();
            return self.record_child(id, entry);
        }
        match entry {
            Entry::Begin { header, started_ms } => {
                self.header = Some(*header);
                self.started_ms = started_ms;
            }
            Entry::Step { step, .. } => self.steps.push(*step),
            Entry::Suspend {
                pending,
                at_ms,
                until_ms,
                ..
            } => {
                self.pending = pending;
                self.suspended_ms = at_ms;
                self.wait_until_ms = until_ms;
            }
            Entry::Live | Entry::Finish { .. } | Entry::Heartbeat => {}
        }
    }

    /// An entry of a subagent's run.
    fn record_child(&mut self, id: String, entry: Entry) {
        if let Entry::Begin { header, .. } = entry {
            let run = JournaledRun {
                header: *header,
                steps: Vec::new(),
                status: RunStatus::Running,
                approvals: Vec::new(),
            };
            self.children.insert(id, run);
            return;
        }
        let Some(run) = self.children.get_mut(&id) else {
            return;
        };
        match entry {
            Entry::Step { step, .. } => {
                run.steps.push(*step);
                run.status = RunStatus::Running;
            }
            Entry::Suspend { pending, .. } => {
                run.status = RunStatus::Suspended;
                run.approvals
                    .retain(|a| !pending.iter().any(|p| p.call_id == a.request.call_id));
                run.approvals.extend(pending.into_iter().map(|request| {
                    agentloop::journal::PendingApproval {
                        request,
                        answer: None,
                        reply: None,
                    }
                }));
            }
            Entry::Finish { .. } => {
                run.status = RunStatus::Finished {
                    stop_reason: String::new(),
                };
            }
            Entry::Begin { .. } | Entry::Live | Entry::Heartbeat => {}
        }
    }

    /// How long the wait for answers may last: what was left of the run's deadline when it
    /// suspended (from journaled times only, so that every attempt waits on the same timer).
    fn wait_limit(&self) -> Option<Duration> {
        let left = self.wait_until_ms?.saturating_sub(self.suspended_ms?);
        Some(Duration::from_millis(left))
    }

    /// The wall-clock time since the run started, at `now_ms` on this worker's clock; at least
    /// to the end of a wait its timer ended (a worker whose clock is behind the one that began
    /// the run would otherwise go on before the deadline the timer marked, and the run, its
    /// calls unanswered, could not go on at all).
    fn elapsed_at(&self, now_ms: u64) -> Option<Duration> {
        let started = self.started_ms?;
        let reached = self.reached_ms.map_or(0, |r| r.saturating_sub(started));
        Some(Duration::from_millis(
            now_ms.saturating_sub(started).max(reached),
        ))
    }

    /// The wait for answers ended on its timer: the run has reached the wait's end.
    fn timer_ended(&mut self) {
        self.reached_ms = self.reached_ms.max(self.wait_until_ms);
    }

    fn run(&self) -> Option<JournaledRun> {
        Some(JournaledRun {
            header: self.header.clone()?,
            steps: self.steps.clone(),
            status: RunStatus::Running,
            approvals: self.approvals.clone(),
        })
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What an approval wait ends on.
enum Waited {
    Answer(Result<Json<Resolution>, TerminalError>),
    Timer,
}

/// Restate's code for an invocation that was cancelled.
const CANCELLED: u16 = 409;

/// The conversations: one run at a time per session key.
pub(crate) struct SessionObject {
    agents: Arc<dyn Agents>,
    options: Arc<EndpointOptions>,
}

#[restate_sdk::object(name = "AgentSession")]
impl SessionObject {
    /// Runs an agent on the conversation's transcript and one new input; the transcript is the
    /// object's state afterwards.
    #[handler]
    async fn run(
        &self,
        ctx: ObjectContext<'_>,
        request: Json<RunRequest>,
    ) -> HandlerResult<Json<Value>> {
        let request = request.into_inner();
        let run_key = ctx.invocation_id().to_owned();
        let transcript: Vec<Message> = ctx
            .get::<Json<Vec<Message>>>("transcript")
            .await?
            .map(Json::into_inner)
            .unwrap_or_default();
        let news = self
            .options
            .ingress
            .clone()
            .map(|i| NewsSender::start(i, run_key.clone()));
        let cancel = CancellationToken::new();
        let mut journaled = Journaled::default();

        self.replay(&ctx, news.as_ref(), &mut journaled, &cancel)
            .await?;

        loop {
            let agent = self
                .agents
                .agent(&request.agent)
                .map_err(TerminalError::new)?;
            journaled.deadline = agent.config().limits().timeout;
            let top = journaled.header.as_ref().map(|h| h.run_id.clone());
            let (journal, mut writes) = ChannelJournal::new(top);
            let mut sinks = self.agents.sinks(&run_key);
            if let Some(n) = &news {
                sinks.push(Arc::new(n.clone()));
            }
            let options = RunOptions {
                journal: Some(Arc::new(journal)),
                sinks,
                cancel: Some(cancel.clone()),
                origin: Some(request.agent.clone()),
                ..RunOptions::default()
            };
            // The deadline is wall-clock time since the run started, whichever worker goes on
            // with it and however long it waited.
            let elapsed = journaled.elapsed_at(self.options.now_ms());
            let earlier = journaled.run();
            let input = Message::user(request.input.clone());
            let transcript = transcript.clone();
            let run = async move {
                match earlier {
                    None => Ok(agent.run_with(transcript, Some(input), options).await),
                    Some(run) => match elapsed {
                        Some(elapsed) => agent.resume_at(run, options, false, elapsed).await,
                        None => agent.resume(run, options, false).await,
                    },
                }
            };
            tokio::pin!(run);
            // The run goes on while its writes are journaled, one at a time: the context is
            // this future's alone.
            let mut quiet_since = tokio::time::Instant::now();
            let outcome = loop {
                let heartbeat = quiet_since + self.options.heartbeat;
                tokio::select! {
                    biased;
                    Some(request) = writes.recv() => match request {
                        Request::Write(entry, done) => {
                            let written = self.write(&ctx, entry, &mut journaled, &cancel).await;
                            let _ = done.send(written);
                            quiet_since = tokio::time::Instant::now();
                        }
                        Request::Load(id, done) => {
                            let _ = done.send(journaled.children.get(&id).cloned());
                        }
                    },
                    outcome = &mut run => break outcome,
                    () = tokio::time::sleep_until(heartbeat) => {
                        // A failed heartbeat changes nothing: the step's own write will say.
                        let _ = self.write(&ctx, Entry::Heartbeat, &mut journaled, &cancel).await;
                        quiet_since = tokio::time::Instant::now();
                    }
                }
            };
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(e) => {
                    // Refused: the run ends visibly, with the journal's code, and the session's
                    // transcript stays as the last run that ended left it.
                    let run_id = journaled
                        .header
                        .as_ref()
                        .map_or_else(|| run_key.clone(), |h| h.run_id.clone());
                    self.close_news(&ctx, news.as_ref(), &run_key).await;
                    return Ok(Json(self.agents.refused(&run_id, &e)));
                }
            };
            if outcome.stop_reason == StopReason::Suspended {
                self.wait(&ctx, news.as_ref(), &mut journaled, &cancel)
                    .await?;
                continue;
            }
            ctx.set("transcript", Json(outcome.transcript.clone()));
            self.close_news(&ctx, news.as_ref(), &run_key).await;
            return Ok(Json(self.agents.report(&outcome)));
        }
    }
}

impl SessionObject {
    /// Reads back what earlier attempts journaled, to where the journal ends: there this attempt
    /// goes on (the read writes an `Entry::Live`, and so does the next attempt's).
    async fn replay(
        &self,
        ctx: &ObjectContext<'_>,
        news: Option<&NewsSender>,
        journaled: &mut Journaled,
        cancel: &CancellationToken,
    ) -> HandlerResult<()> {
        loop {
            let fresh = Arc::new(AtomicBool::new(false));
            let mark = Arc::clone(&fresh);
            let entry = ctx
                .run(move || async move {
                    mark.store(true, Ordering::SeqCst);
                    Ok(Json(Entry::Live))
                })
                .name("journal")
                .await;
            if fresh.load(Ordering::SeqCst) {
                break;
            }
            match entry {
                Ok(Json(entry @ Entry::Suspend { run: None, .. })) => {
                    journaled.record(entry);
                    self.wait(ctx, news, journaled, cancel).await?;
                }
                Ok(Json(entry)) => journaled.record(entry),
                Err(e) if e.code() == CANCELLED => cancel.cancel(),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Sends the run's last news, and has it cleared when nobody will follow the run any more
    /// (its outcome stays with the invocation, for Restate's own retention).
    async fn close_news(&self, ctx: &ObjectContext<'_>, news: Option<&NewsSender>, run_key: &str) {
        if let Some(n) = news {
            n.flush().await;
            ctx.object_client::<RunsObjectClient>(run_key.to_owned())
                .clear()
                .send_after(self.options.news_retention);
        }
    }

    /// Makes one journal write a Restate entry, and keeps it. Restate's cancellation, which
    /// surfaces here, cancels the run (which drains as it would locally) and the write goes on.
    async fn write(
        &self,
        ctx: &ObjectContext<'_>,
        entry: Entry,
        journaled: &mut Journaled,
        cancel: &CancellationToken,
    ) -> Result<(), JournalError> {
        let mut entry = entry;
        match &mut entry {
            Entry::Begin { started_ms, .. } => *started_ms = Some(self.options.now_ms()),
            Entry::Suspend {
                at_ms, until_ms, ..
            } => {
                *at_ms = Some(self.options.now_ms());
                *until_ms = journaled
                    .started_ms
                    .zip(journaled.deadline)
                    .map(|(start, d)| {
                        start.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    });
            }
            _ => {}
        }
        loop {
            let copy = entry.clone();
            match ctx
                .run(move || async move { Ok(Json(copy)) })
                .name("journal")
                .await
            {
                Ok(_) => break,
                Err(e) if e.code() == CANCELLED && !cancel.is_cancelled() => cancel.cancel(),
                Err(e) => {
                    return Err(JournalError::Io {
                        message: e.to_string(),
                    });
                }
            }
        }
        let crash = match (&entry, self.options.crash_after_step) {
            (Entry::Step { seq, run, .. }, Some(n)) if *seq == n => Some(
                run.as_deref()
                    .map(|r| format!(" of run {r}"))
                    .unwrap_or_default(),
            ),
            _ => None,
        };
        journaled.record(entry);
        if let Some(of) = crash {
            let n = self.options.crash_after_step.unwrap_or_default();
            eprintln!("agentloop-restate: fault: paused after step {n}{of}");
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    /// Waits for a human's answers to the calls the run last suspended on (approvals and
    /// questions alike): one awakeable each, their ids published in the run's news. The invocation holds no worker while it waits. The wait
    /// ends at the run's deadline (a durable timer): the run goes on past its deadline, and the
    /// machine stops it there, the calls it waited on not run (the rule a local resume follows
    /// too). A cancel denies the calls not answered, and the run drains.
    async fn wait(
        &self,
        ctx: &ObjectContext<'_>,
        news: Option<&NewsSender>,
        journaled: &mut Journaled,
        cancel: &CancellationToken,
    ) -> Result<(), TerminalError> {
        let pending = std::mem::take(&mut journaled.pending);
        let mut waits: DurableFuturesUnordered<
            std::pin::Pin<Box<dyn DurableFuture<Output = Waited> + Send + '_>>,
        > = DurableFuturesUnordered::new();
        let mut published = Vec::with_capacity(pending.len());
        for request in &pending {
            let (id, answer) = ctx.awakeable::<Json<Resolution>>();
            published.push(PendingApproval {
                request: request.clone(),
                awakeable: id,
            });
            waits.push(Box::pin(answer.map(Waited::Answer)));
        }
        if let Some(limit) = journaled.wait_limit() {
            waits.push(Box::pin(ctx.sleep(limit).map(|_| Waited::Timer)));
        }
        if let Some(n) = news {
            n.approvals(published).await;
        }
        let mut answers: Vec<Option<Resolution>> = vec![None; pending.len()];
        let mut cancelled = false;
        while answers.iter().any(Option::is_none) {
            match waits.next().await {
                Ok(Some((i, Waited::Answer(Ok(Json(a)))))) => {
                    if let Some(slot) = answers.get_mut(i) {
                        *slot = Some(a);
                    }
                }
                Ok(Some((_, Waited::Answer(Err(e))))) | Err(e) if e.code() == CANCELLED => {
                    cancel.cancel();
                    cancelled = true;
                    break;
                }
                // An awakeable rejected through Restate's API: that call is denied (a question
                // is refused), the others still wait (a rejection must not fail the run and
                // lose its transcript).
                Ok(Some((i, Waited::Answer(Err(_))))) => {
                    if let Some(slot) = answers.get_mut(i) {
                        *slot = Some(Resolution::Answer(Answer::DenyOnce));
                    }
                }
                Err(e) => return Err(e),
                Ok(Some((_, Waited::Timer))) => {
                    journaled.timer_ended();
                    break;
                }
                Ok(None) => break,
            }
        }
        for (request, resolution) in pending.iter().zip(answers) {
            // A question's reply goes to the gate as an allowed call with its reply; the gate
            // checks it against the schema again (one resolved through Restate's own API was
            // not) and asks again when it does not fit.
            let (answer, reply) = match resolution {
                Some(Resolution::Reply { reply }) => (Some(Answer::AllowOnce), Some(reply)),
                Some(Resolution::Answer(a)) => (Some(a), None),
                None => (None, None),
            };
            // A call id answered before belongs to another request now: its old answer goes
            // (the gate would not take it for this call anyway: it matches tool and arguments).
            journaled
                .approvals
                .retain(|a| a.request.call_id != request.call_id);
            journaled
                .approvals
                .push(agentloop::journal::PendingApproval {
                    request: request.clone(),
                    // Unanswered at the deadline: no answer (the machine ends the run there).
                    answer: answer.or(cancelled.then_some(Answer::DenyOnce)),
                    reply,
                });
        }
        if let Some(n) = news {
            n.approvals(Vec::new()).await;
        }
        Ok(())
    }
}

/// Batches of a run's news read at most at once.
const READ_BATCHES: u64 = 64;

/// Each run's news: its events in batches, and the approvals it waits on.
pub(crate) struct RunsObject;

#[restate_sdk::object(name = "AgentRuns")]
impl RunsObject {
    /// Adds a batch of news.
    #[handler]
    async fn publish(&self, ctx: ObjectContext<'_>, batch: Json<NewsBatch>) -> HandlerResult<()> {
        let batch = batch.into_inner();
        if !batch.events.is_empty() {
            let n = ctx
                .get::<Json<u64>>("batches")
                .await?
                .map_or(0, Json::into_inner);
            ctx.set(&format!("batch:{n}"), Json(batch.events));
            ctx.set("batches", Json(n + 1));
        }
        if let Some(approvals) = batch.approvals {
            ctx.set("approvals", Json(approvals));
        }
        Ok(())
    }

    /// Forgets the run's news.
    #[handler]
    async fn clear(&self, ctx: ObjectContext<'_>) -> HandlerResult<()> {
        ctx.clear_all();
        Ok(())
    }

    /// The news from batch `from` on (at most a few dozen batches), and where to read next.
    #[handler]
    async fn read(
        &self,
        ctx: SharedObjectContext<'_>,
        from: Json<u64>,
    ) -> HandlerResult<Json<News>> {
        let from = from.into_inner();
        let batches = ctx
            .get::<Json<u64>>("batches")
            .await?
            .map_or(0, Json::into_inner);
        let end = batches.min(from.saturating_add(READ_BATCHES));
        let mut events = Vec::new();
        for i in from..end {
            if let Some(Json(batch)) = ctx.get::<Json<Vec<Value>>>(&format!("batch:{i}")).await? {
                events.extend(batch);
            }
        }
        let approvals = ctx
            .get::<Json<Vec<PendingApproval>>>("approvals")
            .await?
            .map(Json::into_inner)
            .unwrap_or_default();
        Ok(Json(News {
            events,
            next: end.max(from.min(batches)),
            approvals,
        }))
    }
}

/// The endpoint serving `agents`: the conversations and the runs' news; with
/// [`EndpointOptions::identity_keys`], only to requests a Restate server of those keys signed.
pub fn endpoint(
    agents: Arc<dyn Agents>,
    options: EndpointOptions,
) -> Result<Endpoint, RestateError> {
    let retries = ServiceOptions::default()
        .retry_policy_initial_interval(options.retry_initial)
        .retry_policy_exponentiation_factor(2.0)
        .retry_policy_max_interval(options.retry_max);
    let mut builder = Endpoint::builder();
    for key in &options.identity_keys {
        builder = builder
            .identity_key(key)
            .map_err(|e| RestateError::IdentityKey {
                message: e.to_string(),
            })?;
    }
    let sessions = SessionObject {
        agents,
        options: Arc::new(options),
    }
    .into_service_definition()
    .options(retries);
    Ok(builder.bind(sessions).bind(RunsObject).build())
}

/// A listener on `addr` that other worker processes on this machine may share (`SO_REUSEPORT`):
/// Restate keeps each invocation on the deployment (the address) that started it, so the
/// workers of one deployment answer at one address, and when one dies the others take its runs.
pub fn listener(addr: SocketAddr) -> Result<tokio::net::TcpListener, RestateError> {
    let failed = |e: std::io::Error| RestateError::Endpoint {
        addr: addr.to_string(),
        message: e.to_string(),
    };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(failed)?;
    socket.set_reuseaddr(true).map_err(failed)?;
    #[cfg(unix)]
    socket.set_reuseport(true).map_err(failed)?;
    socket.bind(addr).map_err(failed)?;
    socket.listen(1024).map_err(failed)
}

/// Registers the endpoint at `endpoint_url` with the Restate admin API at `admin_url` (again,
/// when it was: its services may have changed).
pub async fn register(admin_url: &str, endpoint_url: &str) -> Result<(), RestateError> {
    let failed = |message: String| RestateError::Admin {
        url: crate::ingress::shown(admin_url),
        message,
    };
    let url = format!("{}/deployments", admin_url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(url)
        .json(&json!({"uri": endpoint_url, "force": true}))
        .send()
        .await
        .map_err(|e| failed(e.without_url().to_string()))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(failed(format!("{status}: {}", body.trim())));
    }
    Ok(())
}

/// Serves `endpoint` on `listener` (HTTP/2 without TLS, as Restate speaks to endpoints) until
/// `stop` completes; the connections in progress are closed gracefully.
pub async fn serve(endpoint: Endpoint, listener: tokio::net::TcpListener, stop: impl Future) {
    restate_sdk::http_server::HttpServer::new(endpoint)
        .serve_with_cancel(listener, stop)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run begun at 1 000 with a 3 s deadline, suspended at 1 500 until its deadline (4 000).
    fn suspended() -> Journaled {
        Journaled {
            started_ms: Some(1_000),
            suspended_ms: Some(1_500),
            wait_until_ms: Some(4_000),
            ..Journaled::default()
        }
    }

    #[test]
    fn a_wait_ended_by_its_timer_counts_to_its_end_on_a_clock_behind_the_runs() {
        let mut journaled = suspended();
        journaled.timer_ended();
        // This worker's clock says 3 990: 10 ms behind the one that began the run, which the
        // timer's end (4 000) says the run has reached.
        assert_eq!(
            journaled.elapsed_at(3_990),
            Some(Duration::from_secs(3)),
            "at the deadline, not 10 ms before it"
        );
        // A clock ahead counts as it reads.
        assert_eq!(
            journaled.elapsed_at(4_250),
            Some(Duration::from_millis(3_250))
        );
    }

    #[test]
    fn a_wait_answered_before_its_timer_counts_on_the_workers_clock() {
        let journaled = suspended();
        assert_eq!(journaled.elapsed_at(2_000), Some(Duration::from_secs(1)));
        // A clock behind the run's start counts nothing rather than wrap.
        assert_eq!(journaled.elapsed_at(500), Some(Duration::ZERO));
        assert_eq!(Journaled::default().elapsed_at(2_000), None, "not begun");
    }
}
