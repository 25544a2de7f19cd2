//! Linux: a read-only view of the file system outside the writable roots ([`mounts`]), Landlock
//! for the filesystem, TCP and scopes (signals, abstract UNIX sockets) and, from
//! ABI 9, pathname UNIX sockets; seccomp for what Landlock does not reach (non-UNIX sockets, UNIX
//! sockets on older kernels, leaving the process group, tracing, terminal injection, namespaces
//! and mounts, set-user-ID and set-group-ID bits, System V IPC and POSIX message queues where
//! the child has no IPC namespace of its own, and what changes the machine: rebooting, the
//! clock, device nodes...);
//! capabilities dropped (all but root's power over files, in a confined child) and resource
//! limits set in every child. The parent builds
//! the ruleset, opens the paths, compiles the filter and works out the limits; the child only
//! makes system calls. A tool call's process is split in two before `exec`: a supervisor that
//! kills the whole tree when agentloop dies, and the program ([`supervisor`]).

mod mounts;
mod supervisor;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use crate::{Resources, SandboxError, SandboxMode, SandboxPolicy, Support};

/// The Landlock ABI the strict modes need: 3 for truncation, 4 for TCP, 5 for device ioctls and
/// 6 for the scopes that keep signals and abstract UNIX sockets inside the sandbox.
const NEEDED_ABI: i32 = 6;

/// The newest ABI whose rights this crate hands to Landlock: 9 adds connecting to pathname UNIX
/// sockets (`ResolveUnix`), granted under the writable roots only. Later ABIs may restrict more,
/// which would change what a sandboxed tool can do with the kernel, so they wait for a review.
const HIGHEST_ABI: ABI = ABI::V9;
/// The ABI from which Landlock tells pathname UNIX sockets apart; before it, seccomp refuses
/// every `socket(AF_UNIX)` of a process that may not reach the system's sockets.
const UNIX_SOCKET_ABI: i32 = 9;

/// The capabilities every child loses, `off`'s included: those that read or write another
/// process's memory or the kernel's (`ptrace`, `/proc/<pid>/mem` of a non-dumpable process,
/// `/dev/mem`, kernel modules, BPF and perf programs that read any memory).
const DROPPED_CAPS: [u32; 6] = [
    16, // CAP_SYS_MODULE
    17, // CAP_SYS_RAWIO
    19, // CAP_SYS_PTRACE
    21, // CAP_SYS_ADMIN
    38, // CAP_PERFMON
    39, // CAP_BPF
];

/// The only capabilities a confined child keeps (it loses every other one the kernel has):
/// those by which root owns files whatever their owner and mode, so that a tool run as root
/// still reads, writes, `chmod`s and `chown`s in a root that another user owns (a checkout
/// under `sudo`, a folder a container mounted from its host), as `tar` and `cp -a` do. Where
/// they reach is bounded by Landlock (writes in the roots only) and the read-only view (no
/// metadata changed outside them); reading stays as wide as root's, which the sandbox never
/// limited. Every capability that changes the machine rather than a file goes: devices
/// (`CAP_MKNOD`), rebooting, the clock, resource limits, networking, other users' identities.
const KEPT_CAPS: [u32; 3] = [
    0, // CAP_CHOWN
    1, // CAP_DAC_OVERRIDE
    3, // CAP_FOWNER
];

/// Every capability from 0 to `last` as a mask.
fn cap_mask_up_to(last: u32) -> u64 {
    if last >= 63 {
        u64::MAX
    } else {
        (1 << (last + 1)) - 1
    }
}

/// The set of `caps` as a mask, bit N for capability N.
fn cap_mask(caps: &[u32]) -> u64 {
    caps.iter()
        .filter(|&&cap| cap < 64)
        .fold(0, |mask, &cap| mask | (1 << cap))
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`), read once in the
/// parent; 63, the most a `capset` can name, where it cannot be read (dropping one the kernel
/// does not know fails harmlessly).
fn last_cap() -> u32 {
    static LAST: OnceLock<u32> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .map_or(63, |last| last.min(63))
    })
}

/// The devices a confined process may read and write besides its roots.
const WRITABLE_DEVICES: [&str; 3] = ["/dev/null", "/dev/zero", "/dev/full"];
/// The devices it may read (the rest of `/dev`, the terminal above all, is out of its reach).
const READABLE_DEVICES: [&str; 2] = ["/dev/random", "/dev/urandom"];

pub(crate) fn support() -> Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    *SUPPORT.get_or_init(|| Support {
        landlock_abi: landlock_abi(),
        seccomp: seccomp_available(),
        read_only_mounts: mounts::available(),
    })
}

/// True when `path` lies on a read-only mount of this process's view of the file system.
pub(crate) fn on_read_only_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs reads the NUL-terminated path and writes one `statvfs` into `stat`, which
    // is read only when it answered 0.
    #[allow(unsafe_code)]
    let stat = unsafe {
        if libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return false;
        }
        stat.assume_init()
    };
    stat.f_flag & libc::ST_RDONLY != 0
}

/// The running kernel's Landlock ABI version, 0 when Landlock is missing or disabled.
fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the VERSION flag only
    // answers the ABI version (or -1 with errno); it reads and writes no memory of ours.
    #[allow(unsafe_code)]
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointer; it answers this thread's seccomp mode (or -1).
    #[allow(unsafe_code)]
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    mode >= 0 && target_arch().is_ok()
}

fn target_arch() -> Result<seccompiler::TargetArch, seccompiler::BackendError> {
    std::env::consts::ARCH.try_into()
}

pub(crate) fn missing() -> Vec<String> {
    let s = support();
    let mut missing = Vec::new();
    if s.landlock_abi < NEEDED_ABI {
        missing.push(if s.landlock_abi == 0 {
            "Landlock (missing or disabled in this kernel)".to_owned()
        } else {
            format!(
                "Landlock ABI {NEEDED_ABI} (Linux 6.12; this kernel has ABI {})",
                s.landlock_abi
            )
        });
    }
    if !s.seccomp {
        missing.push(format!(
            "seccomp filters (not available on {})",
            std::env::consts::ARCH
        ));
    }
    missing
}

/// What a strict mode runs without where this system cannot give it (rather than refuse to run
/// at all): the read-only view of the file system outside the roots, which needs
/// `CAP_SYS_ADMIN` or user namespaces.
pub(crate) fn partial(mode: SandboxMode) -> Vec<String> {
    if mode.confines() && support().read_only_mounts.is_none() {
        vec![mounts::unavailable(support().seccomp)]
    } else {
        Vec::new()
    }
}

/// Linux applies every resource limit.
pub(crate) fn missing_resources(_resources: Resources) -> Vec<String> {
    Vec::new()
}

/// One `setrlimit` the child makes: the resource and its value (soft and hard).
type Limit = (libc::__rlimit_resource_t, libc::rlim_t);

/// The limits a child sets, worked out in the parent: core dumps off, then each limit asked for,
/// never above this process's own hard limit (lowering needs no privilege; raising would fail).
fn limits(resources: Resources) -> Vec<Limit> {
    let asked = [
        (libc::RLIMIT_AS, resources.memory_bytes),
        (libc::RLIMIT_CPU, resources.cpu_secs),
        (libc::RLIMIT_NPROC, resources.processes),
        (libc::RLIMIT_FSIZE, resources.file_size_bytes),
        (libc::RLIMIT_NOFILE, resources.open_files),
    ];
    let mut limits = vec![(libc::RLIMIT_CORE, 0)];
    for (resource, value) in asked {
        let Some(value) = value else { continue };
        let mut own = libc::rlimit {
            rlim_cur: 0,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: getrlimit writes one rlimit through a pointer to our stack variable.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::getrlimit(resource, &mut own) };
        let hard = if rc == 0 {
            own.rlim_max
        } else {
            libc::RLIM_INFINITY
        };
        limits.push((resource, value.min(hard)));
    }
    limits
}

/// What the child applies between `fork` and `exec`, all prepared by the parent.
#[derive(Debug)]
pub(crate) struct ChildHook {
    /// The resource limits to set (core dumps off at least).
    limits: Vec<Limit>,
    /// Set `no_new_privs` (needed by Landlock and seccomp; also keeps set-user-ID programs from
    /// raising the child's privileges).
    no_new_privs: bool,
    /// The read-only view of the file system outside the writable roots, made first.
    view: Option<mounts::ReadOnlyView>,
    /// The Landlock ruleset to restrict the child with.
    landlock: Option<OwnedFd>,
    /// A ruleset of Landlock's signal scope alone (ABI 6), which the program's process takes
    /// after the supervisor's split: a domain nested in the supervisor's, from which no signal
    /// reaches the supervisor. `SIGSTOP`, which it cannot block, would otherwise freeze it, and
    /// a frozen supervisor kills nothing when agentloop dies.
    signal_scope: Option<OwnedFd>,
    /// The seccomp program to install (compiled once per [`Filter`]).
    seccomp: Option<Arc<BpfProgram>>,
    /// When the child's whole tree dies with the agentloop process ([`supervisor`]): that
    /// process's id and the bound of its file descriptors, read in the parent.
    parent: Option<(libc::pid_t, libc::c_int)>,
    /// The capabilities it drops, bit N for capability N, up to [`last_cap`].
    drop_caps: u64,
    /// The bound of this process's file descriptors, read in the parent: where `close_range`
    /// is missing, the child marks them close-on-exec one by one up to it.
    fd_bound: libc::c_int,
}

impl ChildHook {
    /// `off`: only the capabilities are dropped and the resource limits set.
    pub(crate) fn unconfined(resources: Resources) -> Self {
        ChildHook {
            limits: limits(resources),
            no_new_privs: false,
            view: None,
            landlock: None,
            signal_scope: None,
            seccomp: None,
            parent: None,
            drop_caps: cap_mask(&DROPPED_CAPS),
            fd_bound: fd_bound(),
        }
    }

    /// A confined mode: whatever of Landlock and seccomp the system has (the caller refused a
    /// strict mode the system cannot enforce whole). `writable` holds canonical paths;
    /// `read_only`, the canonical paths under them kept read-only in the view.
    pub(crate) fn confined(
        policy: SandboxPolicy,
        writable: &[PathBuf],
        read_only: &[PathBuf],
    ) -> Result<Self, SandboxError> {
        let s = support();
        let landlock = if s.landlock_abi > 0 {
            Some(ruleset(s.landlock_abi, policy, writable)?)
        } else {
            None
        };
        let signal_scope = if s.landlock_abi >= 6 {
            Some(signal_scope()?)
        } else {
            None
        };
        // Where Landlock cannot tell the system's sockets from the tool's own, none is reached.
        let refuse_unix = !policy.unix_sockets && s.landlock_abi < UNIX_SOCKET_ABI;
        let view = match s.read_only_mounts {
            Some(how) => mounts::ReadOnlyView::new(how, writable, read_only)?,
            None => None,
        };
        // Without an IPC namespace of the call's own, System V IPC and POSIX message queues
        // would reach the host's objects by number or name: refused whole.
        let refuse_ipc = !view.as_ref().is_some_and(mounts::ReadOnlyView::own_ipc);
        let seccomp = if s.seccomp {
            Some(seccomp_program(Filter {
                network: policy.network,
                refuse_unix,
                refuse_ipc,
            })?)
        } else {
            None
        };
        Ok(ChildHook {
            limits: limits(policy.resources),
            no_new_privs: true,
            view,
            landlock,
            signal_scope,
            seccomp,
            parent: None,
            drop_caps: cap_mask_up_to(last_cap()) & !cap_mask(&KEPT_CAPS),
            fd_bound: fd_bound(),
        })
    }

    /// Runs in the child: only async-signal-safe system calls, no allocation (an error is a raw
    /// OS error).
    fn enter(&mut self) -> io::Result<()> {
        // In every mode, `off` included: a descriptor is reached without a path, so neither
        // Landlock nor the read-only view stands between the program and one it inherits.
        close_inherited_on_exec(self.fd_bound)?;
        // Before all else: it needs CAP_SYS_ADMIN (dropped below) and the mount calls seccomp
        // refuses, and it may enter a user namespace, a change of credentials that the
        // parent-death signal asked for next must come after.
        if let Some(view) = &mut self.view {
            view.enter()?;
        }
        // Then, so that a parent dying from here on is seen; the split comes last, so that the
        // supervisor and the program are both confined.
        let supervised = match self.parent {
            Some((parent, fd_bound)) => Some(supervisor::arm(parent, fd_bound)?),
            None => None,
        };
        for &(resource, value) in &self.limits {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit reads one rlimit from our stack; it is a plain system call.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::setrlimit(resource, &limit) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        drop_capabilities(self.drop_caps)?;
        if self.no_new_privs {
            // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointer.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(fd) = &self.landlock {
            restrict_self(fd)?;
        }
        if let Some(program) = &self.seccomp {
            // Last, once nothing it denies is needed any more. `apply_filter` makes two system
            // calls on a borrowed program and allocates nothing.
            match seccompiler::apply_filter(program.as_slice()) {
                Ok(()) => {}
                Err(seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e)) => {
                    return Err(e);
                }
                Err(_) => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        // The seccomp filter refuses nothing the supervisor needs (`clone`, `prctl`, `wait4`,
        // `kill`, `pidfd_open`, `pidfd_send_signal`, `rt_sigtimedwait`, reading `/proc`), and
        // Landlock lets it signal its own domain and the program's, nested in it.
        if let Some(supervised) = supervised {
            supervised.split()?;
            // In the program's process from here: its tree signals only inside its own domain.
            if let Some(fd) = &self.signal_scope {
                restrict_self(fd)?;
            }
        }
        Ok(())
    }
}

/// Restricts this process with a Landlock ruleset (a new domain, nested in any it is in).
fn restrict_self(ruleset: &OwnedFd) -> io::Result<()> {
    // SAFETY: landlock_restrict_self takes a ruleset fd that the hook owns (open until the
    // command is dropped) and flags 0; it touches no memory of ours.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl ChildHook {
    /// The child and all it starts will die with this process ([`supervisor`]).
    pub(crate) fn die_with_parent(&mut self) {
        let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
        self.parent = Some((parent, self.fd_bound));
    }
}

/// The bound of this process's file descriptors: none is above its soft `RLIMIT_NOFILE`.
fn fd_bound() -> libc::c_int {
    let mut own = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a pointer to our stack variable.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut own) };
    if rc == 0 {
        libc::c_int::try_from(own.rlim_cur.min(1 << 20)).unwrap_or(1 << 20)
    } else {
        1 << 16
    }
}

/// Marks every descriptor above the standard three close-on-exec, in the child before `exec`.
/// The agentloop process may hold descriptors it inherited without that flag from whoever
/// started it (a script's `exec 9>lock` for `flock`, `exec 7>>log`, a service manager's socket,
/// a jobserver's pipe), which it never uses; the program would get them, and a file open for
/// writing outside the roots would stay writable through one. The program's own standard
/// input, output and error are in place by then; std's error pipe is close-on-exec already.
fn close_inherited_on_exec(fd_bound: libc::c_int) -> io::Result<()> {
    // SAFETY: close_range takes three integers.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Before Linux 5.11 (no `CLOSE_RANGE_CLOEXEC`): one descriptor at a time.
    for fd in 3..fd_bound {
        // SAFETY: fcntl takes integers; EBADF for a descriptor not open is fine.
        #[allow(unsafe_code)]
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 || flags & libc::FD_CLOEXEC != 0 {
            continue;
        }
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(crate) fn install(mut hook: ChildHook, command: &mut std::process::Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: `enter` makes raw system calls (unshare and the mount calls, prctl,
    // capget, capset, landlock_restrict_self, seccomp, and the supervisor's clone, signal, wait
    // and /proc calls) on data the parent prepared, allocates nothing, takes no lock and builds
    // its errors from raw OS error numbers.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || hook.enter());
    }
}

/// The `capget`/`capset` header (`_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops the capabilities of `mask` from the bounding set (so that no `exec`, root's included,
/// gets them back), from the ambient set, and from the effective, permitted and inheritable
/// sets (a root `exec` adds the inheritable ones whatever the bounding set). A process without
/// `CAP_SETPCAP` cannot shrink its bounding set; that only matters for root (whose `exec` draws
/// its capabilities from it), which is then refused.
fn drop_capabilities(mask: u64) -> io::Result<()> {
    let dropped = |cap: u32| cap < 64 && mask & (1 << cap) != 0;
    for cap in (0..64).filter(|&cap| dropped(cap)) {
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes no pointer. EINVAL (a capability this
        // kernel does not know) and EPERM (no CAP_SETPCAP) are checked below.
        #[allow(unsafe_code)]
        unsafe {
            libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0);
        }
    }
    // SAFETY: as above, no pointer; EINVAL on kernels without ambient capabilities is fine.
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    let mut header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget writes two CapData (version 3) through a pointer to our stack array and
    // reads the header; both outlive the call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    for (word, d) in data.iter_mut().enumerate() {
        // The 32 bits of this word's capabilities (word 0: 0 to 31, word 1: 32 to 63).
        let bits = u32::try_from((mask >> (32 * word)) & u64::from(u32::MAX)).unwrap_or(u32::MAX);
        d.effective &= !bits;
        d.permitted &= !bits;
        d.inheritable &= !bits;
    }
    // SAFETY: capset reads the header and two CapData from our stack; lowering sets needs no
    // privilege.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: geteuid takes nothing and cannot fail.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        for cap in (0..64).filter(|&cap| dropped(cap)) {
            // SAFETY: prctl(PR_CAPBSET_READ, cap) takes no pointer; 1 means still there (a
            // capability the kernel does not know answers -1).
            #[allow(unsafe_code)]
            let kept =
                unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) };
            if kept == 1 {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
        }
    }
    Ok(())
}

fn setup(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup {
        reason: format!("{what}: {e}"),
    }
}

/// The Landlock ruleset of a confined mode, as a file descriptor for the child.
fn ruleset(
    kernel_abi: i32,
    policy: SandboxPolicy,
    writable: &[PathBuf],
) -> Result<OwnedFd, SandboxError> {
    // A process allowed the system's UNIX sockets gets no ruleset that could refuse them.
    let highest = if policy.unix_sockets {
        ABI::V8
    } else {
        HIGHEST_ABI
    };
    let abi = ABI::from(kernel_abi.min(highest as i32));
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let device = AccessFs::from_file(abi) & !AccessFs::Execute & !AccessFs::IoctlDev;
    let landlock = |e: landlock::RulesetError| setup("Landlock", e);
    let mut ruleset = Ruleset::default().handle_access(all).map_err(landlock)?;
    if !policy.network && abi >= ABI::V4 {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(landlock)?;
    }
    if abi >= ABI::V6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(landlock)?;
    }
    let mut created = ruleset.create().map_err(landlock)?;
    for path in readable_paths() {
        created = add(created, path, read)?;
    }
    for device_path in READABLE_DEVICES {
        created = add(created, Path::new(device_path), read & !AccessFs::Execute)?;
    }
    for device_path in WRITABLE_DEVICES {
        created = add(created, Path::new(device_path), device)?;
    }
    // Every right under the roots but making a block or character device, through which root
    // would read and write a disk beneath every rule here (FIFOs and sockets stay allowed).
    let under_roots = all & !AccessFs::MakeBlock & !AccessFs::MakeChar;
    for root in writable {
        let fd = open_without_links(root).map_err(|e| setup(&root.display().to_string(), e))?;
        created = created
            .add_rule(PathBeneath::new(fd, under_roots))
            .map_err(landlock)?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| setup("Landlock", "the kernel gave no ruleset"))
}

/// The ruleset behind [`ChildHook`]'s `signal_scope`: Landlock's signal scope, and no right.
fn signal_scope() -> Result<OwnedFd, SandboxError> {
    let landlock = |e: landlock::RulesetError| setup("Landlock", e);
    let created = Ruleset::default()
        .scope(Scope::Signal)
        .map_err(landlock)?
        .create()
        .map_err(landlock)?;
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| setup("Landlock", "the kernel gave no ruleset"))
}

/// A writable root (a canonical path), opened refusing any link on the way (`openat2` with
/// `RESOLVE_NO_SYMLINKS`): a link put in the place of a folder after the root was resolved would
/// otherwise grant what lies behind it. Before Linux 5.6 (no `openat2`), the path as it is.
fn open_without_links(root: &Path) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // `struct open_how` (libc's is non-exhaustive, so it cannot be built here).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS,
    };
    // SAFETY: openat2 reads the NUL-terminated path and the open_how on our stack, whose size it
    // is given; it returns a new descriptor or -1.
    #[allow(unsafe_code)]
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Ok(OwnedFd::from(std::fs::File::open(root)?));
        }
        return Err(e);
    }
    let fd = libc::c_int::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the descriptor openat2 just gave is ours alone.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds a rule for a path that may be missing (a device, an entry of `/` that vanished).
fn add(
    created: landlock::RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, SandboxError> {
    let Ok(fd) = PathFd::new(path) else {
        return Ok(created);
    };
    created
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| setup(&path.display().to_string(), e))
}

/// Everything under `/` but `/dev` (its entries as this process first saw them): readable (and
/// executable). `/dev` is left out so that the
/// terminal (`/dev/tty`, `/dev/pts/*`) cannot be read or written; the harmless devices are
/// granted one by one.
fn readable_paths() -> &'static [PathBuf] {
    static PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let Ok(entries) = std::fs::read_dir("/") else {
            return vec![PathBuf::from("/")];
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p != Path::new("/dev"))
            .collect()
    })
}

/// What a confined mode's seccomp program refuses beside what it always does.
#[derive(Debug, Clone, Copy)]
struct Filter {
    /// Sockets of other families than `AF_UNIX` are allowed.
    network: bool,
    /// `socket(AF_UNIX)` is refused (Landlock cannot tell the system's sockets apart).
    refuse_unix: bool,
    /// System V IPC and POSIX message queues are refused: the child gets no IPC namespace of
    /// its own, so they would reach the host's objects.
    refuse_ipc: bool,
}

/// The seccomp program of a confined mode, for each [`Filter`], compiled once.
fn seccomp_program(filter: Filter) -> Result<Arc<BpfProgram>, SandboxError> {
    type Compiled = OnceLock<Result<Arc<BpfProgram>, SandboxError>>;
    static PROGRAMS: [Compiled; 8] = [const { OnceLock::new() }; 8];
    let index = usize::from(filter.network) * 4
        + usize::from(filter.refuse_unix) * 2
        + usize::from(filter.refuse_ipc);
    let Some(cell) = PROGRAMS.get(index) else {
        return Err(setup("seccomp", "no such program"));
    };
    cell.get_or_init(|| compile_seccomp(filter).map(Arc::new))
        .clone()
}

/// System V IPC (shared memory, message queues, semaphore sets) and POSIX message queues,
/// refused where the child has no IPC namespace of its own: one call each on the architectures
/// `seccompiler` builds filters for, none of which has the `ipc(2)` multiplexer.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
const IPC_CALLS: [libc::c_long; 18] = [
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_semctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
];
/// Elsewhere (x86, where `ipc(2)` multiplexes them, s390x, PowerPC...) no filter is built at
/// all ([`seccomp_available`] is false): there is nothing to list.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const IPC_CALLS: [libc::c_long; 0] = [];

/// The seccomp program of a confined mode: each listed call fails with `EPERM`.
fn compile_seccomp(filter: Filter) -> Result<BpfProgram, SandboxError> {
    let Filter {
        network,
        refuse_unix,
        refuse_ipc,
    } = filter;
    let seccomp = |e: seccompiler::BackendError| setup("seccomp", e);
    // Unconditionally refused: leaving the call's process group (so that the group kill reaches
    // every descendant), tracing or reading other processes, io_uring (its operations bypass
    // this filter), kernel keyrings, BPF and perf programs, kernel modules, and entering or
    // making namespaces and mounts: a new user namespace hands the process every capability
    // over what it creates (network namespaces, file systems with `fsopen`), which is kernel
    // surface no tool needs; Landlock refuses `mount` but not all of the new mount API. Then
    // what changes the machine rather than files, which root keeps the right to do only through
    // capabilities the child drops (this is the second wall, should a capability be kept):
    // rebooting, swap, process accounting, the kernel log, the clock (`adjtimex` and
    // `clock_adjtime` even when they only read it: their mode is behind a pointer), quotas,
    // hanging up the terminal, I/O ports, changing the root folder, and opening a file by its
    // handle, which bypasses every path check (Landlock's, the read-only view's).
    let denied = [
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_setsid,
        libc::SYS_setpgid,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        SYS_KEXEC_FILE_LOAD,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_syslog,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_vhangup,
        libc::SYS_nfsservctl,
        libc::SYS_lookup_dcookie,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_chroot,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_ioperm,
    ];
    let ipc: &[libc::c_long] = if refuse_ipc { &IPC_CALLS } else { &[] };
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = denied
        .into_iter()
        .chain(ipc.iter().copied())
        .map(|nr| (nr, Vec::new()))
        .collect();
    let arg_is = |index: u8, op: SeccompCmpOp, value: u64| -> Result<SeccompRule, SandboxError> {
        let condition =
            SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value).map_err(seccomp)?;
        SeccompRule::new(vec![condition]).map_err(seccomp)
    };
    // `clone` into new namespaces (`clone3`, whose flags are behind a pointer the filter cannot
    // read, is answered "not implemented" before the filter's body: see `prologue`).
    rules.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .into_iter()
            .map(|flag| arg_is(0, SeccompCmpOp::MaskedEq(flag), flag))
            .collect::<Result<_, _>>()?,
    );
    // Making a block or a character device node, through which root would read and write a
    // disk or memory beneath Landlock and the read-only view (FIFOs, sockets and regular files
    // stay allowed). The kernel reads only the low 16 bits of the mode, which the mask covers.
    let device_node = |index: u8| -> Result<Vec<SeccompRule>, SandboxError> {
        [S_IFBLK, S_IFCHR]
            .into_iter()
            .map(|kind| arg_is(index, SeccompCmpOp::MaskedEq(S_IFMT), kind))
            .collect()
    };
    // A set-user-ID or set-group-ID bit on a file: a program left so in a root would run as
    // its owner (root, when agentloop runs as root) for whoever runs it later, outside the
    // sandbox (inside, the roots' copies are `nosuid`). Refused in every mode a call sets
    // (`chmod u+s`, `install -m 4755`, `cp -p` of such a file), and in the mode of a file a call
    // creates: `open`/`openat` with `O_CREAT` or `O_TMPFILE` (their mode means nothing
    // otherwise, and callers pass anything there), `creat`, `mknod` of a regular file.
    // `mkdir` drops both bits itself; `openat2` takes its mode behind a pointer, and fails
    // with `ENOSYS` (see `prologue`).
    let special = |index: u8| -> Result<Vec<SeccompRule>, SandboxError> {
        [S_ISUID, S_ISGID]
            .into_iter()
            .map(|bit| arg_is(index, SeccompCmpOp::MaskedEq(bit), bit))
            .collect()
    };
    let creating_special = |flags: u8, mode: u8| -> Result<Vec<SeccompRule>, SandboxError> {
        let mut out = Vec::new();
        for creates in [O_CREAT, O_TMPFILE] {
            for bit in [S_ISUID, S_ISGID] {
                let conditions = vec![
                    SeccompCondition::new(
                        flags,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(creates),
                        creates,
                    )
                    .map_err(seccomp)?,
                    SeccompCondition::new(
                        mode,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(bit),
                        bit,
                    )
                    .map_err(seccomp)?,
                ];
                out.push(SeccompRule::new(conditions).map_err(seccomp)?);
            }
        }
        Ok(out)
    };
    rules.insert(libc::SYS_fchmod, special(1)?);
    rules.insert(libc::SYS_fchmodat, special(2)?);
    rules.insert(SYS_FCHMODAT2, special(2)?);
    rules.insert(libc::SYS_openat, creating_special(2, 3)?);
    let mut mknodat = device_node(2)?;
    mknodat.extend(special(2)?);
    rules.insert(libc::SYS_mknodat, mknodat);
    #[cfg(target_arch = "x86_64")]
    {
        let mut mknod = device_node(1)?;
        mknod.extend(special(1)?);
        rules.insert(libc::SYS_mknod, mknod);
        rules.insert(libc::SYS_chmod, special(1)?);
        rules.insert(libc::SYS_creat, special(1)?);
        rules.insert(libc::SYS_open, creating_special(1, 2)?);
    }
    // Typing into the terminal's input queue (TIOCSTI) or the console (TIOCLINUX).
    rules.insert(
        libc::SYS_ioctl,
        vec![
            arg_is(1, SeccompCmpOp::Eq, libc::TIOCSTI)?,
            arg_is(1, SeccompCmpOp::Eq, libc::TIOCLINUX)?,
        ],
    );
    let unix = u64::try_from(libc::AF_UNIX).unwrap_or(1);
    let mut socket = Vec::new();
    if !network {
        // Every socket but a UNIX one: TCP and UDP of any address family, raw, netlink...
        socket.push(arg_is(0, SeccompCmpOp::Ne, unix)?);
        rules.insert(
            libc::SYS_socketpair,
            vec![arg_is(0, SeccompCmpOp::Ne, unix)?],
        );
    }
    if refuse_unix {
        // A UNIX socket that could connect to a path (the Docker daemon's, an SSH agent's); a
        // socket pair has no path and stays allowed.
        socket.push(arg_is(0, SeccompCmpOp::Eq, unix)?);
    }
    if !socket.is_empty() {
        rules.insert(libc::SYS_socket, socket);
    }
    let arch = target_arch().map_err(seccomp)?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(libc::EPERM).unwrap_or(1)),
        arch,
    )
    .map_err(seccomp)?;
    let mut program: BpfProgram = filter.try_into().map_err(seccomp)?;
    prologue(&mut program)?;
    Ok(program)
}

/// The set-user-ID and set-group-ID bits of a mode.
const S_ISUID: u64 = 0o4000;
const S_ISGID: u64 = 0o2000;

/// The `open` flags that create a file (`O_TMPFILE` holds `O_DIRECTORY`'s bit too, which a
/// masked compare on the whole of it leaves to `O_TMPFILE` alone).
const O_CREAT: u64 = libc::O_CREAT as u64;
const O_TMPFILE: u64 = libc::O_TMPFILE as u64;

/// `fchmodat2` (Linux 6.6), numbered alike on every architecture.
const SYS_FCHMODAT2: libc::c_long = 452;

/// A file's type in its mode (`S_IFMT`), and the two types of device node.
const S_IFMT: u64 = 0o170_000;
const S_IFBLK: u64 = 0o060_000;
const S_IFCHR: u64 = 0o020_000;

/// `kexec_file_load`, which the `libc` crate names on x86-64 and aarch64 only; the other
/// architectures seccomp runs on here (riscv64) number it as the generic table does.
#[cfg(target_arch = "x86_64")]
const SYS_KEXEC_FILE_LOAD: libc::c_long = libc::SYS_kexec_file_load;
#[cfg(not(target_arch = "x86_64"))]
const SYS_KEXEC_FILE_LOAD: libc::c_long = 294;

/// The `clone` flags that make a new namespace (`CLONE_NEWNS`, `CLONE_NEWCGROUP`,
/// `CLONE_NEWUTS`, `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`, `CLONE_NEWNET`).
const NAMESPACE_FLAGS: [u64; 7] = [
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// Checks that go before the filter's body, as it answers only `EPERM`:
///
/// - `clone3` fails with `ENOSYS`: its flags (a new namespace among them) are in a structure
///   behind a pointer, which a filter cannot read, and on `ENOSYS` the C library starts threads
///   and processes with `clone`, whose flags the body checks (on `EPERM` it would give up);
/// - `openat2` fails with `ENOSYS` too: the mode of a file it creates (a set-user-ID bit) is
///   behind a pointer as well, and its callers go back to `openat` on `ENOSYS` (kernels before
///   5.6 lack it), whose mode the body checks;
/// - on x86-64, every call of the x32 ABI fails with `EPERM`. An x32 call reports the x86-64
///   architecture and its number with bit 30 set (`setsid` is `0x40000070`), so it matches none
///   of the filter's numbers and would be allowed: on a kernel built with x32, the filter would
///   refuse nothing.
///
/// They go right after the filter's own check of the architecture, which jumps past its `KILL`
/// to the fourth instruction; the filter's body loads the number again itself.
fn prologue(program: &mut BpfProgram) -> Result<(), SandboxError> {
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JGE | BPF_K, BPF_JMP | BPF_JEQ | BPF_K,
    // BPF_RET | BPF_K.
    const LD_W_ABS: u16 = 0x20;
    const JMP_JGE_K: u16 = 0x35;
    const JMP_JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const ARCH_OFFSET: u32 = 4;
    const X32_BIT: u32 = 0x4000_0000;
    let arch_checked = program.len() >= 3
        && program
            .first()
            .is_some_and(|i| i.code == LD_W_ABS && i.k == ARCH_OFFSET)
        && program.get(2).is_some_and(|i| i.code == RET_K);
    if !arch_checked {
        // Another shape than seccompiler's: refuse to confine with a filter this cannot vouch for.
        return Err(setup(
            "seccomp",
            "the filter does not begin with its architecture check",
        ));
    }
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | u32::try_from(e).unwrap_or(1);
    let op = |code: u16, jf: u8, k: u32| seccompiler::sock_filter { code, jt: 0, jf, k };
    let clone3 = u32::try_from(libc::SYS_clone3).map_err(|e| setup("seccomp", e))?;
    let openat2 = u32::try_from(libc::SYS_openat2).map_err(|e| setup("seccomp", e))?;
    let mut block = vec![
        op(LD_W_ABS, 0, 0),
        op(JMP_JEQ_K, 1, clone3),
        op(RET_K, 0, errno(libc::ENOSYS)),
        op(JMP_JEQ_K, 1, openat2),
        op(RET_K, 0, errno(libc::ENOSYS)),
    ];
    if cfg!(target_arch = "x86_64") {
        block.extend([op(JMP_JGE_K, 1, X32_BIT), op(RET_K, 0, errno(libc::EPERM))]);
    }
    program.splice(3..3, block);
    Ok(())
}

pub(crate) fn protect_process() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) takes no pointer.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
