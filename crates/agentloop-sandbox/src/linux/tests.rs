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
    let program = seccomp_program(false, false).unwrap();
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
