//! What every command that runs an agent shares (`run`, `chat`, `resume`, `submit`/`attach`): the
//! run's sinks and the trace's end, Ctrl-C, who answers approvals, and how the outcome is shown
//! (the final output printed once, `--json`, the closing line).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use agentloop::session::SessionError;
use agentloop::{CancellationToken, EventSink, RunOutcome};
use agentloop_store::TraceSink;

use crate::approval::{AnswerLines, Console, NO_TERMINAL_REASON, StdinLines, TerminalPrompter};
use crate::args::ApprovalArgs;
use crate::assemble::Approval;
use crate::error::{CliError, code, outcome_exit_code};
use crate::render::{self, Progress};
use crate::{durable, terminal};

pub(crate) fn finish_trace(trace: Option<&Arc<TraceSink>>) -> Result<(), CliError> {
    match trace {
        Some(t) => t.finish().map_err(|e| CliError::Io {
            message: format!("the trace could not be written: {e}"),
        }),
        None => Ok(()),
    }
}

/// A signal that stops a command that runs agents: Ctrl-C, or the environment's stop (SIGTERM:
/// `kill`, `docker stop`, systemd, a CI timeout; SIGHUP: a closed terminal or SSH session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGINT: the person cancels the run.
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGHUP.
    Hangup,
}

impl Stop {
    /// The signal's name, as `kill -l` spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
            Stop::Hangup => "SIGHUP",
        }
    }

    /// 128 + the signal's number, the shell's code for a death by it: a command a signal stopped
    /// exits as its callers saw it end when it had no handler (SIGINT's is the cancellation
    /// code).
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Stop::Interrupt => code::CANCELLED,
            Stop::Terminate => code::TERMINATED,
            Stop::Hangup => code::HUNG_UP,
        }
    }

    /// True for the environment's stop rather than the person's Ctrl-C.
    pub(crate) fn is_environment(self) -> bool {
        self != Stop::Interrupt
    }
}

/// The signals this process was started with ignored (`nohup` ignores SIGHUP), as a bit set of
/// signal numbers; read before any handler replaces the dispositions.
static IGNORED_AT_START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Notes which signals were ignored when the process started: a stop signal ignored then is
/// never heard (`nohup agentloop run ...` goes on when its terminal closes, as it did before
/// agentloop heard SIGHUP). Call it first thing, before any signal handler is installed.
pub(crate) fn note_ignored_signals() {
    let _ = IGNORED_AT_START.set(ignored_now());
}

/// The ignored signals' mask, from `/proc/self/status` (`SigIgn`, hexadecimal); none where it
/// cannot be read.
fn ignored_now() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// True when signal `number` was ignored when the process started.
#[cfg(unix)]
fn ignored_at_start(number: i32) -> bool {
    let mask = *IGNORED_AT_START.get_or_init(ignored_now);
    u32::try_from(number - 1)
        .ok()
        .and_then(|bit| mask.checked_shr(bit))
        .is_some_and(|m| m & 1 == 1)
}

/// The stop signals' deliveries, with the handlers in place from this call on ([`CtrlC`] says
/// why). A stop signal ignored when the process started is left ignored.
pub(crate) struct StopSignals {
    interrupt: CtrlC,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Installs the handlers (on a runtime's thread).
    pub(crate) fn new() -> Self {
        #[cfg(unix)]
        use tokio::signal::unix::{SignalKind, signal};
        #[cfg(unix)]
        let heard = |kind: SignalKind| {
            if ignored_at_start(kind.as_raw_value()) {
                None
            } else {
                signal(kind).ok()
            }
        };
        StopSignals {
            interrupt: CtrlC::new(),
            #[cfg(unix)]
            terminate: heard(SignalKind::terminate()),
            #[cfg(unix)]
            hangup: heard(SignalKind::hangup()),
        }
    }

    /// The next stop signal; `None` when none can be heard.
    pub(crate) async fn next(&mut self) -> Option<Stop> {
        #[cfg(unix)]
        {
            tokio::select! {
                heard = self.interrupt.next() => heard.then_some(Stop::Interrupt),
                () = received(self.terminate.as_mut()) => Some(Stop::Terminate),
                () = received(self.hangup.as_mut()) => Some(Stop::Hangup),
            }
        }
        #[cfg(not(unix))]
        {
            self.interrupt.next().await.then_some(Stop::Interrupt)
        }
    }
}

/// What stopped a command's runs, once a stop signal came; shared with the task that hears them.
#[derive(Clone, Default)]
pub(crate) struct Stopped {
    first: Arc<std::sync::OnceLock<Stop>>,
    /// Cancelled at the environment's stop where the command ends without waiting for its run
    /// to end (a journaled run, left unfinished), or ends after it (a chat).
    left: CancellationToken,
    /// Set once the outcome is shown: what is left (the spans' export) is not waited for at a
    /// stop signal.
    shown: Arc<std::sync::atomic::AtomicBool>,
}

impl Stopped {
    /// The first stop signal, if one came (in a chat, the first of the environment).
    pub(crate) fn signal(&self) -> Option<Stop> {
        self.first.get().copied()
    }

    /// The environment's stop, if it stopped the command (Ctrl-C is a cancel, not a stop).
    pub(crate) fn by_environment(&self) -> Option<Stop> {
        self.signal().filter(|s| s.is_environment())
    }

    /// The outcome is shown: from now on a stop signal quits at once, with its code.
    pub(crate) fn shown(&self) {
        self.shown.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Quits at once, with the code of `stop`, if the outcome is shown.
    fn quit_once_shown(&self, stop: Stop) {
        if self.shown.load(std::sync::atomic::Ordering::SeqCst) {
            err!("\nagentloop: {}: quitting", stop.name());
            std::process::exit(stop.exit_code());
        }
    }

    /// Resolves when a journaled run is to be left unfinished where its journal has it, or a
    /// chat is to end.
    pub(crate) async fn left_unfinished(&self) {
        self.left.cancelled().await;
    }
}

/// Stops a run at a stop signal, and exits at once, with the code of the signal, at a second
/// (but SIGHUP). Ctrl-C cancels it (`token`). The environment's stop (SIGTERM, SIGHUP) cancels it too, unless
/// it is `journaled`: a stop is not a cancel, and a journaled run it cancelled would be
/// journaled `cancelled`, never to go on; such a run is left where its journal has it
/// ([`Stopped::left_unfinished`]), for `agentloop resume`.
pub(crate) fn stop_on_signals(token: CancellationToken, journaled: bool) -> Stopped {
    let mut signals = StopSignals::new();
    let stopped = Stopped::default();
    let shared = stopped.clone();
    tokio::spawn(async move {
        let Some(stop) = signals.next().await else {
            return;
        };
        shared.quit_once_shown(stop);
        let _ = shared.first.set(stop);
        match stop {
            Stop::Interrupt => {
                err!("\nagentloop: cancelling (Ctrl-C again to quit at once)");
                token.cancel();
            }
            _ if journaled => {
                err!(
                    "\nagentloop: {}: stopping; the run is left unfinished in its journal",
                    stop.name()
                );
                shared.left.cancel();
            }
            _ => {
                err!(
                    "\nagentloop: {}: cancelling (another signal quits at once)",
                    stop.name()
                );
                token.cancel();
            }
        }
        // A closing terminal may hang up twice (the kernel's SIGHUP and the shell's): only
        // another signal quits.
        while let Some(again) = signals.next().await {
            shared.quit_once_shown(again);
            if again != Stop::Hangup {
                std::process::exit(again.exit_code());
            }
        }
    });
    stopped
}

/// The exit code of a run that `stopped` may have stopped: a run the environment's stop
/// cancelled exits with the signal's code, as it did when the signal killed the process.
pub(crate) fn exit_code(outcome: &RunOutcome, stopped: &Stopped) -> i32 {
    match stopped.by_environment() {
        Some(stop) if outcome.stop_reason == agentloop::StopReason::Cancelled => stop.exit_code(),
        _ => outcome_exit_code(outcome),
    }
}

/// The end of a journaled run the environment's stop left unfinished (its future dropped, its
/// tools' processes killed): the trace and the spans closed with the run open in them recorded
/// as interrupted, and the error that names the run for `agentloop resume`.
pub(crate) fn left_unfinished(
    stopped: &Stopped,
    run_id: String,
    journal: Option<&Path>,
    trace: Option<&Arc<TraceSink>>,
    otel: Option<crate::otel::Otel>,
) -> CliError {
    if let Err(e) = finish_trace(trace) {
        err!("agentloop: warning: {e}");
    }
    if let Some(o) = otel {
        stopped.shown();
        o.finish();
    }
    let stop = stopped.signal().unwrap_or(Stop::Terminate);
    CliError::Stopped {
        signal: stop.name(),
        exit_code: stop.exit_code(),
        run_id,
        journal: journal.map(terminal::shown_path).unwrap_or_default(),
    }
}

/// The process's Ctrl-C deliveries, with the handler in place from this call on rather than from
/// the first poll of the task that waits for them. A loaded machine can leave a spawned task
/// unpolled past a quick Ctrl-C (a chat's at its first approval prompt): the signal's default
/// action then killed the process, where the run should have been cancelled.
pub(crate) struct CtrlC {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl CtrlC {
    /// Installs the handler (on a runtime's thread).
    pub(crate) fn new() -> Self {
        CtrlC {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok(),
        }
    }

    /// The next Ctrl-C; `false` when none can be heard.
    pub(crate) async fn next(&mut self) -> bool {
        #[cfg(unix)]
        {
            match &mut self.signal {
                Some(s) => s.recv().await.is_some(),
                None => tokio::signal::ctrl_c().await.is_ok(),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await.is_ok()
        }
    }
}

/// The token of a chat's run in progress, if any (one run per input). Only the chat's Ctrl-C
/// handler needs it, to tell a run to cancel from no run at all; an approval prompt gets the
/// run's token through its gate.
pub(crate) type CurrentRun = Arc<Mutex<Option<CancellationToken>>>;

/// In a chat, Ctrl-C cancels the run in progress; between runs it quits with the cancellation
/// code. The environment's stop (SIGTERM, SIGHUP) cancels the run in progress, if any, and ends
/// the chat ([`Stopped::left_unfinished`]) as its end of input does, the trace closed, with the
/// signal's code; a second stop signal (but SIGHUP) quits at once.
pub(crate) fn chat_signals(current: CurrentRun) -> Stopped {
    let mut signals = StopSignals::new();
    let stopped = Stopped::default();
    let shared = stopped.clone();
    tokio::spawn(async move {
        while let Some(stop) = signals.next().await {
            shared.quit_once_shown(stop);
            let running = current
                .lock()
                .ok()
                .and_then(|slot| slot.clone())
                .filter(|t| !t.is_cancelled());
            if stop.is_environment() {
                if shared.first.set(stop).is_err() {
                    if stop == Stop::Hangup {
                        continue;
                    }
                    std::process::exit(stop.exit_code());
                }
                err!("\nagentloop: {}: ending the chat", stop.name());
                if let Some(token) = running {
                    token.cancel();
                }
                shared.left.cancel();
                continue;
            }
            match running {
                Some(token) => {
                    err!("\nagentloop: cancelling this turn (Ctrl-C again between turns quits)");
                    token.cancel();
                }
                None => std::process::exit(code::CANCELLED),
            }
        }
    });
    stopped
}

/// A run's sinks: the progress lines when `shown`, and the trace.
pub(crate) fn run_sinks(
    progress: &Arc<Progress>,
    trace: Option<&Arc<TraceSink>>,
    shown: bool,
) -> Vec<Arc<dyn EventSink>> {
    let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
    if shown {
        sinks.push(progress.clone());
    }
    if let Some(t) = trace {
        sinks.push(t.clone());
    }
    sinks
}

/// Who answers a call that needs approval: `--yes`, the person at the terminal, or nobody (the
/// call is denied, or a journaled run suspends on it).
pub(crate) fn approval_for(args: &ApprovalArgs, json: bool, progress: &Arc<Progress>) -> Approval {
    if !json && can_prompt() {
        ask_at_the_terminal(Box::new(StdinLines), progress, args.yes)
    } else if args.yes {
        Approval::Yes
    } else {
        Approval::Nobody(NO_TERMINAL_REASON)
    }
}

/// How a run's outcome is shown.
pub(crate) struct Shown<'a> {
    pub(crate) json: bool,
    pub(crate) quiet: bool,
    pub(crate) dry_run: bool,
    /// The journal of a durable run.
    pub(crate) journal: Option<&'a Path>,
    /// The agent prices its answers ([`crate::assemble::has_pricing`]).
    pub(crate) priced: bool,
    /// Why the run's session could not be saved after it, if it could not.
    pub(crate) unsaved: Option<&'a SessionError>,
}

/// Approval asked of the person at the terminal, who also answers the model's questions:
/// questions on stderr, answers from `lines`. With `yes` (`--yes`) only the model's questions
/// are asked: every call that needs approval runs.
pub(crate) fn ask_at_the_terminal(
    lines: Box<dyn AnswerLines>,
    progress: &Arc<Progress>,
    yes: bool,
) -> Approval {
    let person = Arc::new(TerminalPrompter::new(
        Console {
            lines,
            out: Box::new(std::io::stderr()),
        },
        Some(progress.clone()),
    ));
    if yes {
        let all = agentloop::permissions::FixedAnswer(agentloop::permissions::Answer::AllowOnce);
        return Approval::Person(Arc::new(all), person);
    }
    Approval::Person(person.clone(), person)
}

/// True when a person can be asked: stdin and stderr are terminals.
pub(crate) fn can_prompt() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// True when stdout and stderr are the same terminal, so what streamed on stderr was seen where
/// stdout prints.
pub(crate) fn same_terminal() -> bool {
    let (out, err) = (std::io::stdout(), std::io::stderr());
    if !(out.is_terminal() && err.is_terminal()) {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let id = |fd: std::os::fd::BorrowedFd<'_>| {
            let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
            file.metadata().ok().map(|m| (m.dev(), m.ino(), m.rdev()))
        };
        let (a, b) = (id(out.as_fd()), id(err.as_fd()));
        a.is_some() && a == b
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// True when the final output was already shown: it streamed (progress on, not `--quiet`) to the
/// terminal that stdout prints to.
pub(crate) fn already_shown(
    quiet: bool,
    same_terminal: bool,
    streamed: &str,
    output: &str,
) -> bool {
    !quiet && same_terminal && !streamed.trim().is_empty() && streamed.trim() == output.trim()
}

/// Prints the final output on stdout, unless it already streamed to the same terminal.
pub(crate) fn print_final(outcome: &RunOutcome, progress: &Progress, quiet: bool) {
    print_final_text(
        outcome.output.as_deref().unwrap_or_default(),
        progress,
        quiet,
    );
}

/// The final output on stdout, unless it already streamed to the same terminal.
pub(crate) fn print_final_text(output: &str, progress: &Progress, quiet: bool) {
    if output.is_empty() {
        return;
    }
    if !already_shown(quiet, same_terminal(), &progress.last_streamed(), output) {
        let mut stdout = std::io::stdout().lock();
        let output = output.trim_end_matches('\n');
        // On a terminal the model's escape sequences would act; piped, the output stays as is.
        let _ = if stdout.is_terminal() {
            writeln!(stdout, "{}", terminal::strip_escapes(output))
        } else {
            writeln!(stdout, "{output}")
        };
        let _ = stdout.flush();
    }
}

pub(crate) fn print_outcome(outcome: &RunOutcome, args: &Shown<'_>, progress: &Progress) {
    let waiting = match args.journal {
        Some(path) if outcome.stop_reason == agentloop::StopReason::Suspended => {
            durable::waiting(path, &outcome.run_id)
        }
        _ => Vec::new(),
    };
    // An answer the pricing does not know has an unknown cost, never a silent $0.
    if render::cost_unknown(outcome, args.priced) {
        err!("{}", render::unknown_cost_warning(outcome));
    }
    if args.json {
        let mut value = render::priced_outcome_json(outcome, args.dry_run, args.priced);
        if let (Some(path), Some(map)) = (args.journal, value.as_object_mut()) {
            map.insert("journal".into(), path.display().to_string().into());
            map.insert(
                "pending_approvals".into(),
                serde_json::to_value(&waiting).unwrap_or_default(),
            );
        }
        if let (Some(e), Some(map)) = (args.unsaved, value.as_object_mut()) {
            map.insert("error".into(), render::unsaved_session_json(outcome, e));
        }
        out!("{value}");
        return;
    }
    if let Some(path) = args.journal {
        durable::how_to_go_on(outcome, path, &waiting, args.quiet);
    }
    if !args.quiet {
        progress.end_line();
        for line in render::skipped_lines(outcome) {
            err!("{line}");
        }
    }
    print_final(outcome, progress, args.quiet);
    if !args.quiet {
        err!(
            "{}",
            render::closing_line(outcome, render::cost_unknown(outcome, args.priced))
        );
    }
    if let Some(e) = args.unsaved {
        err!("agentloop: {}", render::unsaved_session_message(e));
    }
}

/// Ctrl-C, or SIGTERM where there is one: what stops a long-running server. The handlers are in
/// place from this call on, not from the future's first poll: a server takes it before it starts
/// its MCP servers and says its address, so a signal sent as soon as it does (a service manager
/// stopping it at once) stops it as any stop does, its servers ended, rather than killing the
/// process by the signal's default action half-way through its start.
pub(crate) fn terminated() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                () = received(term.as_mut()) => {}
                () = received(interrupt.as_mut()) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The next delivery of a signal whose handler is in place; never, without one.
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::already_shown;

    #[test]
    fn the_final_output_is_printed_again_only_where_it_was_not_seen() {
        let text = "Lisbon is warmer.";
        assert!(already_shown(false, true, "Lisbon is warmer.\n", text));
        assert!(!already_shown(false, false, text, text), "stdout elsewhere");
        assert!(
            !already_shown(true, true, text, text),
            "--quiet shows no progress"
        );
        assert!(
            !already_shown(false, true, "Let me look.", text),
            "other text streamed"
        );
        assert!(!already_shown(false, true, "", ""), "nothing streamed");
    }
}
