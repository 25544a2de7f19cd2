//! The supervisor of a tool call's process (and of a stdio MCP server's): what makes the whole tree
//! of a call die with a killed agentloop, not only the process agentloop started.
//!
//! Why: a journaled run whose agentloop is killed (SIGKILL, the OOM killer) is resumed by another
//! process, which answers a call that was running "interrupted" (or runs it again). The call's
//! program gets `PR_SET_PDEATHSIG` SIGKILL, but what it started (`sh -c '(sleep 2; touch x) &
//! wait'`) does not, and a killed agentloop can kill nothing, so that background child would go
//! on acting behind the resumed run's back.
//!
//! How: the child agentloop forks (in its own process group, confined) forks once more before
//! `exec`. The grandchild runs the program, in the same group, with SIGKILL as its parent-death
//! signal against the supervisor. The supervisor never returns to `exec`: it closes every file
//! descriptor (so the output pipes and std's exec-error pipe close when the program's side
//! does), becomes the subreaper of what the program starts (`PR_SET_CHILD_SUBREAPER`: orphans
//! come to it, not to init) and waits. When the program exits, it kills what is left of the group
//! and exits as the program did (the same code, or the same signal raised on itself), so a call's
//! result reads as before. When agentloop dies (its parent-death signal, a catchable one kept
//! blocked, then `getppid` changed), it kills the group and every process that came to it as an
//! orphan, then the group again, itself included. The pid agentloop sees is the supervisor's, which
//! leads the group, so the group kill at a timeout or a cancellation still reaches everything.
//!
//! Without a group of its own (an agentloop inside another's sandbox, whose seccomp refuses
//! `setpgid`, starts its children in the group it is in), the supervisor kills no group: when
//! the program exits it kills what came to it as an orphan instead (all the program's tree by
//! then, round after round), and it passes a SIGTERM sent to it on to the program, which a
//! group's SIGTERM would have reached (an MCP server's polite stop).
//!
//! The parent-death signal comes when the agentloop *thread* that started the child ends, not
//! only the process; the supervisor tells the two apart with `getppid` (a thread's children pass
//! to another thread of the same process), so a call no longer dies with a thread that ended
//! while the process lives, and the program's own signal is against the supervisor, a process of
//! one thread.
//!
//! The supervisor is a copy of the agentloop process that never runs another program, so it holds
//! agentloop's memory and environment: it makes itself non-dumpable, which keeps its `/proc` files
//! and `ptrace` from every process without `CAP_SYS_PTRACE` (which the sandbox drops), even in an
//! application that did not call [`crate::protect_process`].
//!
//! Everything here runs between `fork` and `exec`, in a process of one thread: raw system calls
//! only, no allocation, no lock.
//!
//! What remains:
//! - Under `off`, and before Landlock ABI 6, the program can `SIGSTOP` the supervisor, which no
//!   mask blocks; a stopped supervisor kills nothing when agentloop dies. Confined with ABI 6,
//!   the program's half takes a Landlock domain of its own after the split (the signal scope
//!   alone), from which no signal reaches the supervisor.
//! - A process that leaves the group: under `off` (and `best-effort` without seccomp) a `setsid`
//!   child is out of it, and is killed when agentloop dies as an orphan that came to the
//!   supervisor, which it is once its parent is killed (in the group, or such an orphan itself):
//!   a round for each level of the tree out of the group. A process whose first thread ended
//!   while others run is listed as a zombie; its thread count tells it from a dead one. A
//!   process another one starts on the tool's behalf (a daemon reached through a socket,
//!   `systemd-run`, `at`) is no descendant at all.
//! - When the program exits normally, what left the group (under `off`) is left running, as
//!   before: only the group is the call's.
//! - Without a group of its own, a SIGKILL of the supervisor (agentloop's kill at a timeout, or
//!   of an MCP server deaf to SIGTERM) leaves the program's tree to the next subreaper above
//!   (the outer call's supervisor) or init; the program itself dies with the supervisor.
//! - Killing what came to the supervisor needs `/proc` (it is read for each process's parent and
//!   group); without it, only the group is killed. A tree that forks faster than the supervisor
//!   kills outside the group is given up on after a bounded number of rounds; inside it, the last
//!   group kill is atomic.
//! - A listed process is killed through a pidfd once its `/proc` line, read after the pidfd was
//!   opened, still shows it in the group (or a child of this process) with the start time
//!   listed, so a pid another process took over since the listing is spared. Where `pidfd_open`
//!   is missing (before Linux 5.3) or refused, it is `kill`, which such a pid would get.
//! - A timeout, a cancellation or a kill of the supervisor itself (SIGKILL, by agentloop's group
//!   kill or anyone's) leaves it no time: the group dies with it, the orphans it held go to
//!   init.

use std::io;

use libc::{c_int, pid_t};

/// The supervisor's parent-death signal: catchable, so that it can kill the tree first; kept
/// blocked and taken with `sigtimedwait`.
const DEATH_SIGNAL: c_int = libc::SIGUSR1;

/// How many times the supervisor looks for processes to kill and kills them, at most, before it
/// gives up on a tree that forks faster than it kills.
const KILL_ROUNDS: u32 = 500;

/// The pause between two rounds, for killed processes to be gone (1 ms).
const ROUND_PAUSE: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 1_000_000,
};

/// How long the supervisor sleeps at most before it checks again whether agentloop lives; the
/// signals wake it at once, this only bounds a missed one.
const CHECK_EVERY: libc::timespec = libc::timespec {
    tv_sec: 1,
    tv_nsec: 0,
};

/// The exit code of a supervisor whose agentloop died (nobody reads it): SIGKILL's shell code.
const ORPHANED_EXIT: c_int = 128 + libc::SIGKILL;

/// The name the supervisor shows in `ps` and `top` (at most 15 bytes).
const NAME: &std::ffi::CStr = c"agentloop-reap";

/// The signals the supervisor takes, and what the program's process gets back before `exec`.
pub(super) struct Armed {
    /// The agentloop process.
    parent: pid_t,
    /// Where to stop closing file descriptors when `close_range` is missing (Linux before 5.9).
    fd_bound: c_int,
    /// The signal mask std set before the hook ran, restored in the program's process.
    mask: libc::sigset_t,
    /// The dispositions of SIGCHLD and [`DEATH_SIGNAL`] before, restored there too.
    actions: [(c_int, libc::sigaction); 2],
}

/// First thing in the child agentloop forks, before the sandbox closes in: blocks the
/// supervisor's two signals (with their default dispositions, so that exited children wait as
/// zombies), asks for [`DEATH_SIGNAL`] when the parent dies (and fails with `ESRCH` when it
/// already has), becomes a subreaper and non-dumpable.
pub(super) fn arm(parent: pid_t, fd_bound: c_int) -> io::Result<Armed> {
    let mut set = empty_set();
    add(&mut set, libc::SIGCHLD);
    add(&mut set, DEATH_SIGNAL);
    let mut mask = empty_set();
    // SAFETY: sigprocmask reads one set and writes one, both on our stack.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, &mut mask) };
    check(rc)?;
    let actions = [
        (libc::SIGCHLD, set_default(libc::SIGCHLD)?),
        (DEATH_SIGNAL, set_default(DEATH_SIGNAL)?),
    ];
    prctl(libc::PR_SET_PDEATHSIG, DEATH_SIGNAL as libc::c_ulong)?;
    if getppid() != parent {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    prctl(libc::PR_SET_CHILD_SUBREAPER, 1)?;
    prctl(libc::PR_SET_DUMPABLE, 0)?;
    Ok(Armed {
        parent,
        fd_bound,
        mask,
        actions,
    })
}

impl Armed {
    /// Last thing, once the sandbox holds this process: forks. Returns in the grandchild, which
    /// goes on to `exec` the program with the mask and dispositions std left and SIGKILL as its
    /// parent-death signal; the supervisor never returns.
    pub(super) fn split(self) -> io::Result<()> {
        let me = getpid();
        if getppid() != self.parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        let program = fork()?;
        if program != 0 {
            supervise(self.parent, me, program, self.fd_bound);
        }
        for (signal, action) in &self.actions {
            // SAFETY: sigaction reads one struct from self; no old action is asked for.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::sigaction(*signal, action, std::ptr::null_mut()) };
            check(rc)?;
        }
        // SAFETY: sigprocmask reads one set from self.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.mask, std::ptr::null_mut()) };
        check(rc)?;
        prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)?;
        // The supervisor died before the signal was asked for: the program does not run.
        if getppid() != me {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    }
}

/// The supervisor's life: see the module's docs.
fn supervise(parent: pid_t, me: pid_t, program: pid_t, fd_bound: c_int) -> ! {
    close_all(fd_bound);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, a static here.
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr(), 0, 0, 0);
    }
    // Every other signal waits, blocked: the supervisor must not die of a stray one (a hang-up
    // of an orphaned group) before it has killed the tree. SIGKILL still ends it.
    let mut all = empty_set();
    // SAFETY: sigfillset and sigprocmask write and read one set on our stack.
    #[allow(unsafe_code)]
    unsafe {
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    // Only a group of its own is killed; a caller that did not ask for one keeps its own.
    // SAFETY: getpgrp takes nothing.
    #[allow(unsafe_code)]
    let group = (unsafe { libc::getpgrp() } == me).then_some(me);
    let mut wake = empty_set();
    add(&mut wake, libc::SIGTERM);
    add(&mut wake, libc::SIGCHLD);
    add(&mut wake, DEATH_SIGNAL);
    let mut status = None;
    loop {
        reap(program, &mut status);
        if getppid() != parent {
            kill_leftovers(me, group, true);
            if let Some(group) = group {
                // Last, this process with them.
                // SAFETY: killpg takes two integers.
                #[allow(unsafe_code)]
                unsafe {
                    libc::killpg(group, libc::SIGKILL);
                }
            }
            exit(ORPHANED_EXIT);
        }
        if let Some(status) = status {
            // What the program left: its group or, without one, what came here as an orphan,
            // which is all of its tree once it has exited (the group's kill under `off` spares
            // what left it; without a group nothing tells such a process apart).
            kill_leftovers(me, group, group.is_none());
            mirror(me, status);
        }
        // SAFETY: sigtimedwait reads a set and a timeout on our stack; no info is asked for.
        // Whichever signal woke it, or none, the loop looks again.
        #[allow(unsafe_code)]
        let taken = unsafe { libc::sigtimedwait(&wake, std::ptr::null_mut(), &CHECK_EVERY) };
        if taken == libc::SIGTERM && group.is_none() {
            // A SIGTERM to the pid the caller sees, the polite stop of an MCP server, would
            // have reached the program with the group's; without one it is passed on (the
            // program is not reaped yet, so its pid is still its own). With a group, the
            // program had its own and this one is dropped.
            // SAFETY: kill takes two integers.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(program, libc::SIGTERM);
            }
        }
    }
}

/// Reaps every child that has ended; the program's status is kept.
fn reap(program: pid_t, status: &mut Option<c_int>) {
    loop {
        let mut st: c_int = 0;
        // SAFETY: waitpid writes one int on our stack.
        #[allow(unsafe_code)]
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if pid == program {
            *status = Some(st);
        }
    }
}

/// Kills, with SIGKILL, every live process of the group (but this one) and, with `orphans`,
/// every child of this process, round after round until none is left (what a killed process
/// leaves comes here as an orphan), reaping as it goes.
fn kill_leftovers(me: pid_t, group: Option<pid_t>, orphans: bool) {
    if group.is_none() && !orphans {
        return;
    }
    let mut ignored = None;
    for _ in 0..KILL_ROUNDS {
        let mut killed = 0u32;
        let ours = |p: &Process| group == Some(p.pgrp) || (orphans && p.ppid == me);
        let read = each_process(|proc_dir, p| {
            if p.pid == me || !ours(&p) || p.ended() {
                return;
            }
            // Gone, out of reach (EPERM) or no longer the listed process: not counted, as only
            // a process that will die makes the next round worth it.
            if kill_if_still(proc_dir, &p, ours) {
                killed += 1;
            }
        });
        reap(0, &mut ignored);
        if !read || killed == 0 {
            return;
        }
        // SAFETY: nanosleep reads one timespec, a constant.
        #[allow(unsafe_code)]
        unsafe {
            libc::nanosleep(&ROUND_PAUSE, std::ptr::null_mut());
        }
    }
}

/// Sends SIGKILL to `listed` if the process its pid names is still the one listed (the same
/// start time) and still `ours`; true when the signal was sent.
///
/// Between the listing and the kill the process may end and its pid go to another process of
/// the user's (a group member is not this process's child, so nothing holds its pid; under
/// `off` nothing else keeps such a process out of reach either). A pidfd names one process for
/// good: its `/proc` line, read after it was opened, is that process's while it lives, so a
/// match means the signal reaches the listed one; a process that ended since cannot be
/// signalled through it. Where `pidfd_open` is missing (`ENOSYS`, Linux before 5.3) or refused
/// (a container's seccomp profile, `EPERM`), it is `kill` as before: a kill that might miss is
/// better than a leftover that acts.
fn kill_if_still(proc_dir: c_int, listed: &Process, ours: impl Fn(&Process) -> bool) -> bool {
    // SAFETY: pidfd_open takes a pid and flags; it returns a descriptor this function closes.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, listed.pid, 0u32) };
    let Ok(fd) = c_int::try_from(fd) else {
        return false;
    };
    if fd < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOSYS | libc::EPERM) => {
                // SAFETY: kill takes two integers.
                #[allow(unsafe_code)]
                let rc = unsafe { libc::kill(listed.pid, libc::SIGKILL) };
                rc == 0
            }
            // ESRCH: gone. Anything else (no descriptor left): the next round tries again.
            _ => false,
        };
    }
    let now = pid_name(listed.pid).and_then(|name| read_stat(proc_dir, name.as_slice()));
    let same = now.is_some_and(|now| now.start == listed.start && ours(&now));
    let sent = same && {
        // SAFETY: pidfd_send_signal takes the descriptor opened above, a signal, no siginfo (a
        // null pointer: the kernel fills in a kill's) and flags 0.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        rc == 0
    };
    // SAFETY: close takes the descriptor opened above.
    #[allow(unsafe_code)]
    unsafe {
        libc::close(fd);
    }
    sent
}

/// A pid's decimal digits, as `/proc` names its folder.
fn pid_name(pid: pid_t) -> Option<PidName> {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut n = u32::try_from(pid).ok()?;
    loop {
        at = at.checked_sub(1)?;
        *digits.get_mut(at)? = b'0' + u8::try_from(n % 10).ok()?;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Some(PidName { digits, at })
}

/// A pid's name in `/proc`, on the stack (the supervisor allocates nothing).
struct PidName {
    digits: [u8; 10],
    at: usize,
}

impl PidName {
    fn as_slice(&self) -> &[u8] {
        self.digits.get(self.at..).unwrap_or_default()
    }
}

/// Ends this process as the program ended: with its exit code, or killed by its signal.
fn mirror(me: pid_t, status: c_int) -> ! {
    if libc::WIFEXITED(status) {
        exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let _ = set_default(signal);
        let mut set = empty_set();
        add(&mut set, signal);
        // SAFETY: sigprocmask reads one set on our stack; kill takes two integers. The signal,
        // unblocked with its default action, ends this process before kill returns.
        #[allow(unsafe_code)]
        unsafe {
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(me, signal);
        }
        exit(128 + signal);
    }
    exit(1);
}

/// Closes every file descriptor: the ends of the program's pipes and std's exec-error pipe
/// must close when the program's side does, or agentloop would wait on them.
fn close_all(fd_bound: c_int) {
    // SAFETY: close_range takes three integers.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    for fd in 0..fd_bound {
        // SAFETY: close takes an integer; EBADF for a descriptor not open is fine.
        #[allow(unsafe_code)]
        unsafe {
            libc::close(fd);
        }
    }
}

/// What `/proc/<pid>/stat` tells of a process.
#[derive(Clone, Copy)]
struct Process {
    pid: pid_t,
    state: u8,
    ppid: pid_t,
    pgrp: pid_t,
    /// Its threads, its first one counted while the others run (`None` when the line was cut
    /// before the field).
    threads: Option<pid_t>,
    /// When it started, in clock ticks after boot: with the pid, what tells it from a process
    /// that took the pid over later (`None` when the line was cut before the field).
    start: Option<u64>,
}

impl Process {
    /// True when nothing of it runs any more. A process whose first thread ended while others
    /// run on (`pthread_exit` in `main`) is shown as a zombie until the last one ends: it is
    /// alive, and a SIGKILL to its pid ends them all.
    fn ended(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.threads.is_none_or(|n| n <= 1)
    }
}

/// Calls `each` for every process `/proc` lists, with `/proc` open; false when it cannot be read.
fn each_process(mut each: impl FnMut(c_int, Process)) -> bool {
    // SAFETY: open reads a static NUL-terminated path.
    #[allow(unsafe_code)]
    let dir = unsafe {
        libc::open(
            c"/proc".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return false;
    }
    let mut entries = [0u8; 4096];
    loop {
        // SAFETY: getdents64 writes at most entries.len() bytes into our stack buffer.
        #[allow(unsafe_code)]
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                entries.as_mut_ptr(),
                entries.len(),
            )
        };
        let Ok(n) = usize::try_from(n) else { break };
        if n == 0 {
            break;
        }
        // Each record: inode (8 bytes), offset (8), length (2), type (1), NUL-terminated name.
        let mut at = 0;
        while let Some(record) = entries.get(at..n.min(entries.len())) {
            let Some(&[lo, hi]) = record.get(16..18) else {
                break;
            };
            let len = usize::from(u16::from_ne_bytes([lo, hi]));
            if len == 0 {
                break;
            }
            if let Some(name) = record.get(19..len.min(record.len())) {
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                if let Some(p) = read_stat(dir, name) {
                    each(dir, p);
                }
            }
            at += len;
        }
    }
    // SAFETY: close takes the descriptor opened above.
    #[allow(unsafe_code)]
    unsafe {
        libc::close(dir);
    }
    true
}

/// Reads `<name>/stat` under the open `/proc`, when `name` is a process id.
fn read_stat(dir: c_int, name: &[u8]) -> Option<Process> {
    let pid = number(name)?;
    let mut path = [0u8; 32];
    let suffix = b"/stat\0";
    path.get_mut(..name.len())?.copy_from_slice(name);
    path.get_mut(name.len()..name.len() + suffix.len())?
        .copy_from_slice(suffix);
    // SAFETY: openat reads the NUL-terminated path on our stack, under the open directory.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::openat(dir, path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // `pid (comm) S ppid pgrp ... num_threads itrealvalue starttime ...`: the name is at most
    // 16 bytes and each of the 20 fields up to the start time at most 21, so this holds the
    // fields needed.
    let mut line = [0u8; 512];
    // SAFETY: read writes at most line.len() bytes into our stack buffer; close takes the
    // descriptor just opened.
    #[allow(unsafe_code)]
    let n = unsafe {
        let n = libc::read(fd, line.as_mut_ptr().cast(), line.len());
        libc::close(fd);
        n
    };
    let line = line.get(..usize::try_from(n).ok()?)?;
    // The name may hold any byte, `)` too; the fields after it do not.
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line.get(close + 1..)?.split(|&b| b == b' ').skip(1);
    let state = *fields.next()?.first()?;
    let ppid = number(fields.next()?)?;
    let pgrp = number(fields.next()?)?;
    // After the group: session, tty, tpgid, flags, four fault counts, four times, priority and
    // nice (tpgid, priority and nice may be negative; none is read), then the thread count.
    let threads = fields.nth(14).and_then(number);
    // Then `itrealvalue` (always 0) and the start time.
    let start = fields.nth(1).and_then(number_u64);
    Some(Process {
        pid,
        state,
        ppid,
        pgrp,
        threads,
        start,
    })
}

/// A decimal number of digits only.
fn number(digits: &[u8]) -> Option<pid_t> {
    if digits.len() > 10 {
        return None;
    }
    pid_t::try_from(number_u64(digits)?).ok()
}

/// A decimal number of digits only, at most `u64::MAX`.
fn number_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// `fork` as a raw `clone`: no `pthread_atfork` handler runs (they may take locks or allocate),
/// and the child, like this one, has one thread.
pub(super) fn fork() -> io::Result<pid_t> {
    let flags = libc::SIGCHLD as libc::c_ulong;
    // SAFETY: clone without CLONE_VM and without a stack is fork: the child gets a copy of this
    // process and goes on from here; no pointer is passed (s390x takes the stack first).
    #[allow(unsafe_code)]
    let rc = unsafe {
        if cfg!(target_arch = "s390x") {
            libc::syscall(libc::SYS_clone, 0, flags, 0, 0, 0)
        } else {
            libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0)
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    pid_t::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: a sigset_t is plain bits; sigemptyset then writes it whole.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

fn add(set: &mut libc::sigset_t, signal: c_int) {
    // SAFETY: sigaddset writes one bit of the set it is given.
    #[allow(unsafe_code)]
    unsafe {
        libc::sigaddset(set, signal);
    }
}

/// Gives `signal` its default action; answers the one it had.
fn set_default(signal: c_int) -> io::Result<libc::sigaction> {
    // SAFETY: a sigaction is plain data; all zero is SIG_DFL with no flag and an empty mask.
    #[allow(unsafe_code)]
    let (default, mut old): (libc::sigaction, libc::sigaction) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: sigaction reads one struct and writes one, both on our stack.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sigaction(signal, &default, &mut old) };
    check(rc)?;
    Ok(old)
}

fn prctl(option: c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: these prctl options take integers only.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::prctl(option, arg, 0, 0, 0) };
    check(rc)
}

fn getpid() -> pid_t {
    // SAFETY: getpid takes nothing and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::getpid()
    }
}

fn getppid() -> pid_t {
    // SAFETY: getppid takes nothing and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::getppid()
    }
}

fn exit(code: c_int) -> ! {
    // SAFETY: _exit ends the process at once: no atexit handler, no buffer flushed (they are
    // agentloop's, copied by fork).
    #[allow(unsafe_code)]
    unsafe {
        libc::_exit(code)
    }
}

fn check(rc: c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_zombie_is_ended_unless_other_threads_of_it_run() {
        let process = |state, threads| Process {
            pid: 2,
            state,
            ppid: 1,
            pgrp: 2,
            threads,
            start: Some(1),
        };
        assert!(process(b'Z', Some(1)).ended());
        assert!(process(b'X', Some(1)).ended());
        assert!(process(b'Z', None).ended());
        assert!(!process(b'Z', Some(2)).ended());
        assert!(!process(b'S', Some(1)).ended());
        assert!(!process(b'R', None).ended());
    }

    #[test]
    fn numbers_are_digits_only() {
        assert_eq!(number(b"4711"), Some(4711));
        assert_eq!(number(b""), None);
        assert_eq!(number(b"self"), None);
        assert_eq!(number(b"12a"), None);
        assert_eq!(number(b"99999999999"), None);
    }

    #[test]
    fn a_listed_process_is_killed_only_while_its_pid_names_the_one_listed() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        // A leftover of a call: a process of its own group, not a child of the killer's.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = pid_t::try_from(child.id()).unwrap();
        let ours = |p: &Process| p.pgrp == pid;
        // SAFETY: open reads a static NUL-terminated path.
        #[allow(unsafe_code)]
        let proc_dir = unsafe {
            libc::open(
                c"/proc".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(proc_dir >= 0);
        let listed = read_stat(proc_dir, pid_name(pid).unwrap().as_slice()).unwrap();
        assert!(listed.start.is_some());
        // The pid listed with another start time: a process that has taken the pid over since.
        let other = Process {
            start: listed.start.map(|s| s + 1),
            ..listed
        };
        assert!(!kill_if_still(proc_dir, &other, ours));
        // The same process, out of the group by now.
        assert!(!kill_if_still(proc_dir, &listed, |p: &Process| p.pgrp != pid));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let refused = child.try_wait().unwrap().is_none();
        // The one listed, still in its group: killed.
        let sent = kill_if_still(proc_dir, &listed, ours);
        if !sent {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        // Reaped, its pid names no process: nothing is sent.
        let after = kill_if_still(proc_dir, &listed, ours);
        // SAFETY: close takes the descriptor opened above.
        #[allow(unsafe_code)]
        unsafe {
            libc::close(proc_dir);
        }
        assert!(refused, "a process not the listed one was killed");
        assert!(sent, "the listed process was not signalled");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(!after);
    }

    #[test]
    fn pids_are_named_as_proc_names_them() {
        assert_eq!(pid_name(1).unwrap().as_slice(), b"1");
        assert_eq!(pid_name(4_194_304).unwrap().as_slice(), b"4194304");
        assert_eq!(pid_name(pid_t::MAX).unwrap().as_slice(), b"2147483647");
        assert!(pid_name(-1).is_none());
    }

    #[test]
    fn this_process_is_listed_with_its_parent_and_group() {
        let me = getpid();
        let mut seen = None;
        assert!(each_process(|_, p| {
            if p.pid == me {
                seen = Some((p.ppid, p.pgrp, p.threads.is_some_and(|n| n >= 1), p.ended()));
            }
        }));
        // SAFETY: getpgrp takes nothing.
        #[allow(unsafe_code)]
        let group = unsafe { libc::getpgrp() };
        assert_eq!(seen, Some((getppid(), group, true, false)));
    }
}
