//! Each layer of the sandbox on its own, in a child that keeps root's capabilities: the whole
//! sandbox refuses what these refuse several times over (a dropped capability answers `EPERM`
//! as seccomp does), so only a child with one layer tells whether that layer holds. Run as root
//! (as CI does); as an ordinary user the kernel refuses all of it anyway, and they return.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;

fn root() -> bool {
    // SAFETY: geteuid takes nothing and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

/// `python3 -c probe` in `dir`, with `layer` applied between fork and exec (or nothing).
fn python(
    dir: &Path,
    probe: &str,
    layer: Option<Box<dyn FnMut() -> io::Result<()> + Send + Sync>>,
) -> String {
    let mut command = Command::new("python3");
    command.arg("-c").arg(probe).current_dir(dir);
    if let Some(layer) = layer {
        // SAFETY: the closures below make raw system calls only, on what they captured.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(layer);
        }
    }
    let out = command.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A session of its own, without a controlling terminal, so that `vhangup`, should it pass,
/// hangs up none.
fn no_terminal() {
    // SAFETY: setsid takes nothing.
    #[allow(unsafe_code)]
    unsafe {
        libc::setsid();
    }
}

/// One call per line, `name number args...`, each printed as `name rc errno`. Every argument is
/// harmless should the call be allowed: a reboot with a wrong magic number, device nodes in a
/// folder that does not exist, a clock set to an invalid time, a read of the clock's state, and
/// `vhangup` only in a process without a terminal (the probe makes sure).
fn machine_probe() -> String {
    let mut calls = vec![
        format!("('reboot', {}, 0, 0, 0, None)", libc::SYS_reboot),
        format!(
            "('mknodat-block', {}, -100, b'/nonexistent/n', 0o060600, 0)",
            libc::SYS_mknodat
        ),
        format!(
            "('mknodat-char', {}, -100, b'/nonexistent/n', 0o020600, 0)",
            libc::SYS_mknodat
        ),
        // Bits above the 16 the kernel reads do not hide the type.
        format!(
            "('mknodat-block-high', {}, -100, b'/nonexistent/n', 0x7fff0000 | 0o060600, 0)",
            libc::SYS_mknodat
        ),
        format!("('swapon', {}, b'/nonexistent', 0)", libc::SYS_swapon),
        format!("('swapoff', {}, b'/nonexistent')", libc::SYS_swapoff),
        format!("('acct', {}, b'/nonexistent/a')", libc::SYS_acct),
        format!("('syslog', {}, 10, None, 0)", libc::SYS_syslog),
        format!(
            "('settimeofday', {}, struct.pack('qq', 0, -1), None)",
            libc::SYS_settimeofday
        ),
        format!(
            "('clock_settime', {}, 0, struct.pack('qq', 0, -1))",
            libc::SYS_clock_settime
        ),
        format!(
            "('clock_adjtime', {}, 0, bytes(512))",
            libc::SYS_clock_adjtime
        ),
        format!("('adjtimex', {}, bytes(512))", libc::SYS_adjtimex),
        // Flags no kernel knows, and more segments than it takes: nothing (un)loaded.
        format!(
            "('kexec_load', {}, 0, 1000, None, 0x100)",
            libc::SYS_kexec_load
        ),
        format!(
            "('kexec_file_load', {}, -1, -1, 0, None, 0)",
            SYS_KEXEC_FILE_LOAD
        ),
        format!("('quotactl', {}, 0, None, 0, None)", libc::SYS_quotactl),
        format!("('quotactl_fd', {}, -1, 0, 0, None)", libc::SYS_quotactl_fd),
        format!("('vhangup', {})", libc::SYS_vhangup),
        format!("('nfsservctl', {}, 0, None, None)", libc::SYS_nfsservctl),
        format!(
            "('lookup_dcookie', {}, 0, None, 0)",
            libc::SYS_lookup_dcookie
        ),
        format!(
            "('open_by_handle_at', {}, -1, None, 0)",
            libc::SYS_open_by_handle_at
        ),
        format!(
            "('name_to_handle_at', {}, -100, b'/', None, None, 0)",
            libc::SYS_name_to_handle_at
        ),
        format!("('chroot', {}, b'/nonexistent')", libc::SYS_chroot),
        format!(
            "('pivot_root', {}, b'/nonexistent', b'/nonexistent')",
            libc::SYS_pivot_root
        ),
        // The controls: a FIFO and a regular file go through (and fail on the missing folder).
        format!(
            "('mknodat-fifo', {}, -100, b'/nonexistent/n', 0o010600, 0)",
            libc::SYS_mknodat
        ),
        format!(
            "('mknodat-file', {}, -100, b'/nonexistent/n', 0o100600, 0)",
            libc::SYS_mknodat
        ),
    ];
    if cfg!(target_arch = "x86_64") {
        calls.extend([
            "('mknod-block', 133, b'/nonexistent/n', 0o060600, 0)".to_owned(),
            "('mknod-char', 133, b'/nonexistent/n', 0o020600, 0)".to_owned(),
            "('mknod-fifo', 133, b'/nonexistent/n', 0o010600, 0)".to_owned(),
            "('iopl', 172, 0)".to_owned(),
            "('ioperm', 173, 0, 0, 0)".to_owned(),
        ]);
    }
    format!(
        "import ctypes, struct\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         try:\n\
         \x20   open('/dev/tty').close(); tty = True\n\
         except OSError:\n\
         \x20   tty = False\n\
         for name, nr, *args in [{}]:\n\
         \x20   if name == 'vhangup' and tty: continue\n\
         \x20   args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]\n\
         \x20   r = libc.syscall(ctypes.c_long(nr), *args)\n\
         \x20   print(name, r, ctypes.get_errno() if r < 0 else 0)\n",
        calls.join(", ")
    )
}

/// The calls that change the machine rather than files fail with `EPERM` under the filter
/// alone, where root, keeping every capability, gets another answer without it; FIFOs and
/// regular files still pass `mknod`.
#[test]
fn seccomp_alone_refuses_what_changes_the_machine_and_device_nodes() {
    if !root() || !support().seccomp {
        eprintln!("skipped: not root, or no seccomp here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let probe = machine_probe();
    let program = seccomp_program(Filter {
        network: false,
        refuse_unix: false,
        refuse_ipc: false,
    })
    .unwrap();
    let filtered = python(
        dir.path(),
        &probe,
        Some(Box::new(move || {
            no_terminal();
            seccompiler::apply_filter(program.as_slice()).map_err(|_| io::Error::last_os_error())
        })),
    );
    let open = python(
        dir.path(),
        &probe,
        Some(Box::new(|| {
            no_terminal();
            Ok(())
        })),
    );
    let mut refused = 0;
    for line in open.lines() {
        let name = line.split(' ').next().unwrap();
        let controls = name.ends_with("-fifo") || name.ends_with("-file");
        let got = filtered
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not probed under the filter: {filtered}"));
        if controls {
            assert!(got.ends_with(" 2"), "{name}: {got} (ENOENT expected)");
            continue;
        }
        assert!(
            !line.ends_with(" 1"),
            "unfiltered root refused {name}: {line}"
        );
        assert_eq!(got, format!("{name} -1 1"), "{filtered}");
        refused += 1;
    }
    assert!(refused >= 23, "{open}");
}

/// `python3` making a node of each type in its working folder, each printed as `name ok` or
/// `name refused errno`: devices numbered 0:0, which lead nowhere should they be made.
const NODES: &str = "import os, stat\n\
    for name, kind in [('block', stat.S_IFBLK), ('char', stat.S_IFCHR), ('fifo', stat.S_IFIFO), ('file', stat.S_IFREG)]:\n\
    \x20   try:\n\
    \x20       os.mknod(name, kind | 0o600, os.makedev(0, 0)); print(name, 'ok')\n\
    \x20   except OSError as e: print(name, 'refused', e.errno)\n";

/// Under Landlock alone, root (keeping `CAP_MKNOD`) makes no block or character device in a
/// writable root, where it still makes FIFOs and files; unconfined it makes all four.
#[test]
fn landlock_alone_refuses_device_nodes_under_the_roots() {
    if !root() || support().landlock_abi < 1 {
        eprintln!("skipped: not root, or no Landlock here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let canonical = std::fs::canonicalize(dir.path()).unwrap();
    let confined = tempfile::tempdir_in(&canonical).unwrap();
    let ruleset = ruleset(
        support().landlock_abi,
        SandboxPolicy::new(SandboxMode::WorkspaceWrite),
        std::slice::from_ref(&canonical),
    )
    .unwrap();
    let said = python(
        confined.path(),
        NODES,
        Some(Box::new(move || {
            // SAFETY: prctl takes no pointer; landlock_restrict_self takes the ruleset's
            // descriptor, owned by this closure, and flags 0.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        })),
    );
    for line in ["block refused 13", "char refused 13", "fifo ok", "file ok"] {
        assert!(said.lines().any(|l| l == line), "{line}: {said}");
    }
    let open = tempfile::tempdir_in(&canonical).unwrap();
    let said = python(open.path(), NODES, None);
    for line in ["block ok", "char ok", "fifo ok", "file ok"] {
        assert!(said.lines().any(|l| l == line), "unconfined {line}: {said}");
    }
}

/// A System V shared memory segment of this test process's, as another process of the host
/// would have: made with `text` at its start, removed when dropped.
struct HostSegment(libc::c_int);

impl HostSegment {
    fn new(text: &[u8]) -> Self {
        // SAFETY: shmget takes integers; shmat maps the new segment (4 KiB) or answers -1;
        // the copy writes `text` (shorter than the segment) into it, then shmdt unmaps it.
        #[allow(unsafe_code)]
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600);
            assert!(id >= 0, "shmget: {}", io::Error::last_os_error());
            let segment = HostSegment(id);
            let addr = libc::shmat(id, std::ptr::null(), 0);
            assert_ne!(addr as isize, -1, "shmat: {}", io::Error::last_os_error());
            std::ptr::copy_nonoverlapping(text.as_ptr(), addr.cast::<u8>(), text.len().min(64));
            libc::shmdt(addr);
            segment
        }
    }

    /// The text at its start, up to the first NUL.
    fn text(&self) -> String {
        let mut bytes = [0u8; 64];
        // SAFETY: shmat maps the segment read-only (4 KiB, more than is copied out of it);
        // shmdt unmaps it.
        #[allow(unsafe_code)]
        unsafe {
            let addr = libc::shmat(self.0, std::ptr::null(), libc::SHM_RDONLY);
            assert_ne!(addr as isize, -1, "shmat: {}", io::Error::last_os_error());
            std::ptr::copy_nonoverlapping(addr.cast::<u8>(), bytes.as_mut_ptr(), bytes.len());
            libc::shmdt(addr);
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }
}

impl Drop for HostSegment {
    fn drop(&mut self) {
        // SAFETY: shmctl(IPC_RMID) takes the id and no buffer.
        #[allow(unsafe_code)]
        unsafe {
            libc::shmctl(self.0, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// `python3` attaching the segment `id` and writing into it, then making a message queue, a
/// semaphore set and a POSIX message queue (each removed again), each printed as `name rc
/// errno`.
fn ipc_probe(id: libc::c_int) -> String {
    format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.shmat.restype = ctypes.c_void_p\n\
         libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n\
         def say(name, r): print(name, r, ctypes.get_errno() if r < 0 else 0)\n\
         addr = libc.shmat({id}, None, 0)\n\
         if addr in (None, ctypes.c_void_p(-1).value): say('shmat', -1)\n\
         else:\n\
         \x20   ctypes.memmove(addr, b'model-was-here\\0', 15); say('shmat', 0)\n\
         q = libc.msgget(0, 0o1600); say('msgget', q)\n\
         if q >= 0: libc.msgctl(q, 0, None)\n\
         s = libc.semget(0, 1, 0o1600); say('semget', s)\n\
         if s >= 0: libc.semctl(s, 0, 0)\n\
         name = b'agentloop-ipc-%d' % __import__('os').getpid()\n\
         m = libc.syscall(ctypes.c_long({mq_open}), name, 0o102, 0o600, None); say('mq_open', m)\n\
         if m >= 0: libc.syscall(ctypes.c_long({mq_unlink}), name)\n",
        mq_open = libc::SYS_mq_open,
        mq_unlink = libc::SYS_mq_unlink,
    )
}

/// Where the child gets no IPC namespace of its own (no read-only view), the filter refuses
/// System V IPC and POSIX message queues: a segment of the host's, whose id the child was
/// given, is neither attached nor written, and no queue or semaphore set is made. The same
/// child under the filter of a call that has the namespace (where these calls reach only its
/// own objects) attaches and writes the host's segment: the refusal is the filter's.
#[test]
fn without_an_ipc_namespace_no_host_ipc_object_is_reached() {
    if !support().seccomp {
        eprintln!("skipped: no seccomp here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let segment = HostSegment::new(b"host's own\0");
    let run = |refuse_ipc: bool| {
        let program = seccomp_program(Filter {
            network: false,
            refuse_unix: false,
            refuse_ipc,
        })
        .unwrap();
        python(
            dir.path(),
            &ipc_probe(segment.0),
            Some(Box::new(move || {
                seccompiler::apply_filter(program.as_slice())
                    .map_err(|_| io::Error::last_os_error())
            })),
        )
    };
    let refused = run(true);
    for name in ["shmat", "msgget", "semget", "mq_open"] {
        let line = format!("{name} -1 1");
        assert!(refused.lines().any(|l| l == line), "{line}: {refused}");
    }
    assert_eq!(segment.text(), "host's own", "{refused}");
    let allowed = run(false);
    for name in ["shmat", "msgget", "semget", "mq_open"] {
        let ok = allowed
            .lines()
            .filter_map(|l| l.strip_prefix(name))
            .any(|rest| rest.ends_with(" 0") && !rest.starts_with(" -1"));
        assert!(ok, "{name} refused without the IPC rule: {allowed}");
    }
    assert_eq!(segment.text(), "model-was-here", "{allowed}");
}
