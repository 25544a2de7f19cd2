//! What the command tools and the shell tool share about running a child: it leads its own
//! process group, which is killed whole when the child exits (its leftovers), when the call is
//! cancelled or times out, or when the call's future is dropped; it runs in the tool's sandbox
//! ([`agentloop_sandbox`]), whose seccomp filter keeps every descendant in that group; its output
//! is read into bounded captures while it runs, so a chatty child never fills memory. On Linux it
//! and all it starts die with a killed agentloop: the pid seen here is a supervisor's, which runs
//! the program as its child and exits as the program did (`agentloop_sandbox`'s
//! `Confinement::dying_with_parent`, whose limits `docs/sandbox.md` lists).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use agentloop_sandbox::{Sandbox, SandboxError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// True for a variable no tool process ever sees, whatever a configuration says
/// (case-insensitive): `API_KEY`, `TOKEN`, `SECRET`, `PASSWORD` and any name ending in `_KEY`
/// (`OPENAI_API_KEY`, `AWS_SECRET_ACCESS_KEY`), `_TOKEN` (`GITHUB_TOKEN`), `_SECRET`, `_PAT`,
/// `PASSWORD` (`DB_PASSWORD`, and libpq's `PGPASSWORD`), `_PASSWD`, `_PWD` (MySQL's
/// `MYSQL_PWD`), `APIKEY` or `_CONNECTION_STRING` (Azure's, which holds the account key);
/// OpenTelemetry exporter headers (`OTEL_EXPORTER_OTLP_HEADERS` and the
/// per-signal ones), which carry collector credentials; and `AGENTLOOP_RESTATE` and every
/// `AGENTLOOP_RESTATE_*` (`AGENTLOOP_RESTATE_ADMIN`), whose URLs may hold a user and password.
pub fn is_secret_env(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    const EXACT: [&str; 4] = ["API_KEY", "TOKEN", "SECRET", "PASSWORD"];
    const SUFFIXES: [&str; 9] = [
        "_KEY",
        "_TOKEN",
        "_SECRET",
        "_PAT",
        "PASSWORD",
        "_PASSWD",
        "_PWD",
        "APIKEY",
        "_CONNECTION_STRING",
    ];
    EXACT.contains(&upper.as_str())
        || SUFFIXES.iter().any(|s| upper.ends_with(s))
        || (upper.starts_with("OTEL_EXPORTER_OTLP_") && upper.ends_with("HEADERS"))
        || upper.starts_with("AGENTLOOP_RESTATE")
}

/// Kills a process group once: when the program exits (its leftovers), or when dropped (the call
/// was cancelled or timed out). After one kill it is disarmed, so a recycled group id is never
/// signalled.
pub(crate) struct GroupKill(AtomicI32);

impl GroupKill {
    fn new(pid: Option<u32>) -> Self {
        GroupKill(AtomicI32::new(
            pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
        ))
    }

    fn kill(&self) {
        let pgid = self.0.swap(0, Ordering::SeqCst);
        if pgid > 0 {
            // ESRCH (the group is gone) is the usual answer and is fine.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where a pipe's bytes go: a capture that keeps what it can within its bound.
pub(crate) trait Capture: Send {
    /// Takes the next bytes.
    fn push(&mut self, bytes: &[u8]);
}

/// A capture shared with whoever reads it while the child still runs (or after it was killed).
impl<C: Capture> Capture for std::sync::Arc<std::sync::Mutex<C>> {
    fn push(&mut self, bytes: &[u8]) {
        // Poisoned only by a panic in another push: the capture then keeps what it had.
        if let Ok(mut c) = self.lock() {
            c.push(bytes);
        }
    }
}

/// The first bytes of a stream, at most a bound, and how many there were in all.
/// Both ends are kept too, within the same bound: a program that fails says why last (a test
/// run's verdict, a compiler's error count), so a failure's text shows the head and the tail.
pub(crate) struct Captured {
    pub(crate) bytes: Vec<u8>,
    pub(crate) total: usize,
    bound: usize,
    ends: HeadTail,
}

impl Captured {
    pub(crate) fn new(bound: usize) -> Self {
        Captured {
            bytes: Vec::new(),
            total: 0,
            bound,
            ends: HeadTail::new(bound),
        }
    }

    /// True when the stream had more than the bound.
    pub(crate) fn was_cut(&self) -> bool {
        self.total > self.bytes.len()
    }

    /// The head and the tail of the stream, each half the bound.
    pub(crate) fn ends(&self) -> &HeadTail {
        &self.ends
    }
}

impl Capture for Captured {
    fn push(&mut self, bytes: &[u8]) {
        let room = self.bound.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(bytes.get(..bytes.len().min(room)).unwrap_or_default());
        self.total += bytes.len();
        self.ends.push(bytes);
    }
}

/// The head and the tail of a stream, each at most half a bound: what a build or a test run says
/// first (the command) and last (the verdict) both matter; the middle is dropped and counted.
pub(crate) struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
    half: usize,
}

impl HeadTail {
    pub(crate) fn new(bound: usize) -> Self {
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            half: bound / 2,
        }
    }

    /// The text kept, with a line saying how many bytes were cut from the middle, if any.
    pub(crate) fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let cut = self.total - self.head.len() - self.tail.len();
        if cut == 0 {
            let tail: Vec<u8> = self.tail.iter().copied().collect();
            return format!("{head}{}", String::from_utf8_lossy(&tail));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        format!(
            "{head}\n[... {cut} bytes cut from the middle ({} bytes in all) ...]\n{}",
            self.total,
            String::from_utf8_lossy(&tail)
        )
    }

    /// How many bytes the stream had in all.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

impl Capture for HeadTail {
    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len();
        let room = self.half.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(bytes.len().min(room));
        self.head.extend_from_slice(to_head);
        self.tail.extend(rest);
        let over = self.tail.len().saturating_sub(self.half);
        self.tail.drain(..over);
    }
}

async fn read_into<C: Capture>(pipe: Option<impl AsyncRead + Unpin>, mut capture: C) -> C {
    let Some(mut pipe) = pipe else {
        return capture;
    };
    let mut chunk = [0u8; 8192];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => capture.push(chunk.get(..n).unwrap_or_default()),
        }
    }
    capture
}

/// A child to run in a process group of its own: the program, its arguments, its folder, its
/// whole environment (nothing is inherited) and its sandbox.
pub(crate) struct GroupCommand<'a> {
    pub(crate) program: &'a std::path::Path,
    pub(crate) args: &'a [String],
    pub(crate) working_dir: &'a std::path::Path,
    pub(crate) env: &'a [(OsString, OsString)],
    /// Written to the child's stdin, which is then closed; `None` gives it no stdin at all.
    pub(crate) stdin: Option<Vec<u8>>,
    /// Where the child (and all it starts) is confined; `TMPDIR` is its private folder.
    pub(crate) sandbox: &'a Sandbox,
}

/// Why a child did not start.
pub(crate) enum SpawnError {
    /// The sandbox could not be prepared (or this system cannot enforce it).
    Sandbox(SandboxError),
    /// The program could not be started.
    Io(std::io::Error),
}

impl SpawnError {
    /// The tool error: a sandbox that could not be prepared answers its stable code
    /// (`sandbox.unsupported`, ...), permanent since the system will not change between
    /// attempts; an I/O error is the tool's to describe with `io`.
    pub(crate) fn into_tool_error(
        self,
        io: impl FnOnce(std::io::Error) -> agentloop::ToolError,
    ) -> agentloop::ToolError {
        match self {
            SpawnError::Sandbox(e) => {
                agentloop::ToolError::new(e.code(), e.to_string()).permanent()
            }
            SpawnError::Io(e) => io(e),
        }
    }
}

/// How a child ended, and what it wrote.
pub(crate) struct Finished<O, E> {
    pub(crate) status: std::io::Result<ExitStatus>,
    pub(crate) stdout: O,
    pub(crate) stderr: E,
    /// Under `best-effort`, what of the sandbox this system could not enforce.
    pub(crate) sandbox_note: Option<String>,
}

impl GroupCommand<'_> {
    /// Starts the child. The returned future runs it to its end, reading its output into the two
    /// captures; dropping the future (a timeout, a cancellation) kills its whole group, and when
    /// the child exits, whatever it left running in its group is killed too, so the pipes close.
    pub(crate) fn spawn<O: Capture, E: Capture>(
        &self,
        stdout: O,
        stderr: E,
    ) -> Result<impl Future<Output = Finished<O, E>> + Send + use<O, E>, SpawnError> {
        let (mut child, confinement, own_group) = match self.start(true) {
            // Inside another agentloop's sandbox (this agentloop served as a sandboxed MCP
            // server, or run by a sandboxed tool) seccomp refuses a new process group, and no
            // tool could start. The child then stays in this process's group, which is the outer
            // call's: its supervisor still takes its orphans and kills them if this process dies,
            // a timeout kills the supervisor (and with it the program), and what the program left
            // running goes with the outer call's group at the latest. A program that cannot be
            // executed fails with `EACCES`, not this.
            Err(SpawnError::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => {
                let (child, confinement) = self.start(false)?;
                (child, confinement, false)
            }
            started => {
                let (child, confinement) = started?;
                (child, confinement, true)
            }
        };
        let group = GroupKill::new(child.id().filter(|_| own_group));
        let stdin_pipe = child.stdin.take();
        let out_pipe = child.stdout.take();
        let err_pipe = child.stderr.take();
        let input = self.stdin.clone().unwrap_or_default();
        let sandbox_note = confinement.note().map(str::to_owned);
        Ok(async move {
            let feed = async move {
                if let Some(mut pipe) = stdin_pipe {
                    // A program that does not read its stdin closes the pipe: its business.
                    let _ = pipe.write_all(&input).await;
                    let _ = pipe.shutdown().await;
                }
            };
            let wait = async {
                let status = child.wait().await;
                group.kill();
                status
            };
            let ((), stdout, stderr, status) = tokio::join!(
                feed,
                read_into(out_pipe, stdout),
                read_into(err_pipe, stderr),
                wait
            );
            // The private temporary folder goes once the group is dead.
            drop(confinement);
            Finished {
                status,
                stdout,
                stderr,
                sandbox_note,
            }
        })
    }
}

impl GroupCommand<'_> {
    /// Spawns the child confined, leading a process group of its own when `own_group`.
    fn start(
        &self,
        own_group: bool,
    ) -> Result<(tokio::process::Child, agentloop_sandbox::Confinement), SpawnError> {
        // The child and its tree die with agentloop: a killed journaled run is resumed
        // elsewhere, which answers this call "interrupted" (or runs it again when idempotent),
        // so nothing of the call may go on acting behind that answer.
        let mut confinement = self
            .sandbox
            .prepare()
            .map_err(SpawnError::Sandbox)?
            .dying_with_parent();
        let mut cmd = Command::new(self.program);
        cmd.args(self.args)
            .current_dir(self.working_dir)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if own_group {
            cmd.process_group(0);
        }
        confinement.install(cmd.as_std_mut());
        let child = cmd.spawn().map_err(SpawnError::Io)?;
        Ok((child, confinement))
    }
}

/// An environment given as pairs, owned.
pub(crate) fn env_pairs(
    vars: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

/// The variables of `base` (this process's when `None`) whose names `keep` accepts; a secret
/// ([`is_secret_env`]) never, whatever `keep` says.
pub(crate) fn scrubbed_env(
    base: Option<Vec<(OsString, OsString)>>,
    keep: impl Fn(&str) -> bool,
) -> Vec<(OsString, OsString)> {
    base.unwrap_or_else(|| std::env::vars_os().collect())
        .into_iter()
        .filter(|(k, _)| {
            let name = k.to_string_lossy();
            !is_secret_env(&name) && keep(&name)
        })
        .collect()
}

/// Refuses to start a child once the call is cancelled: a cancel that fired before the handler
/// got here (the run was stopped while the call waited to be polled) must not start a program
/// whose effect would come after the run said it stopped.
pub(crate) fn not_cancelled(
    cancel: &tokio_util::sync::CancellationToken,
    what: &str,
) -> Result<(), agentloop::ToolError> {
    if cancel.is_cancelled() {
        return Err(agentloop::ToolError::new(
            "cancelled",
            format!("the call was cancelled before {what} started"),
        ));
    }
    Ok(())
}

/// Why a child was stopped before it ended.
pub(crate) enum Stopped {
    /// The call's cancellation token fired.
    Cancelled,
    /// The timeout passed.
    TimedOut,
}

/// Runs `work` (a started child, see [`GroupCommand::spawn`]) until it ends, the call is
/// cancelled or `timeout` passes; in the last two cases `work` is dropped, which kills the group.
pub(crate) async fn run_until<T>(
    work: impl Future<Output = T>,
    cancel: &tokio_util::sync::CancellationToken,
    timeout: Option<std::time::Duration>,
) -> Result<T, Stopped> {
    let timeout = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(Stopped::Cancelled),
        () = timeout => Err(Stopped::TimedOut),
        r = work => Ok(r),
    }
}

/// `exit status 3`, `killed by signal 9`.
pub(crate) fn describe_status(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "an unknown exit status".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn head_tail_keeps_both_ends_and_counts_the_cut() {
        let mut c = HeadTail::new(8);
        c.push(b"abc");
        c.push(b"defghij");
        c.push(b"klmnop");
        assert_eq!(c.total(), 16);
        assert_eq!(
            c.text(),
            "abcd\n[... 8 bytes cut from the middle (16 bytes in all) ...]\nmnop"
        );
        let mut small = HeadTail::new(8);
        small.push(b"abcdef");
        assert_eq!(small.text(), "abcdef");
    }

    #[test]
    fn captured_keeps_the_head_and_counts_all() {
        let mut c = Captured::new(4);
        c.push(b"abc");
        c.push(b"defg");
        assert_eq!(c.bytes, b"abcd");
        assert_eq!(c.total, 7);
    }
}
