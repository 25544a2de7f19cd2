#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Real children in each mode: what they may do (the controls) and what they may not. Linux
//! only; on a kernel without Landlock ABI 6 the strict modes must refuse, which is checked too.
#![cfg(target_os = "linux")]

mod metadata;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

use agentloop_sandbox::{ReadOnlyMounts, Resources, Sandbox, SandboxMode, SandboxPolicy, Support};

fn supported() -> bool {
    Support::missing(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).is_empty()
}

/// `sh -c script` in `dir`, confined by `sandbox`.
fn sh(sandbox: &Sandbox, dir: &Path, script: &str) -> Output {
    let mut confinement = sandbox.prepare().unwrap();
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).current_dir(dir);
    confinement.install(&mut command);
    let out = command.output().unwrap();
    drop(confinement);
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn write(dir: &Path) -> Sandbox {
    Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).writable(dir)
}

#[test]
fn strict_modes_refuse_where_the_kernel_lacks_support() {
    if supported() {
        return;
    }
    let e = write(Path::new("/tmp")).prepare().unwrap_err();
    assert_eq!(e.code(), "sandbox.unsupported");
}

#[test]
fn workspace_write_writes_the_root_and_tmpdir_only() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let script = format!(
        "echo a > in.txt && echo b > \"$TMPDIR/t\" && echo c > /dev/null && echo inside-ok; \
         echo d > {}/out.txt || echo outside-refused; \
         true > /etc/hostname-agentloop-test || echo etc-refused",
        outside.path().display()
    );
    let out = sh(&write(root.path()), root.path(), &script);
    let said = text(&out);
    assert!(said.contains("inside-ok"), "{said}");
    assert!(said.contains("outside-refused"), "{said}");
    assert!(said.contains("etc-refused"), "{said}");
    assert!(root.path().join("in.txt").exists());
    assert!(!outside.path().join("out.txt").exists());
}

#[test]
fn read_only_writes_only_its_tmpdir() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxPolicy::new(SandboxMode::ReadOnly)).writable(root.path());
    let out = sh(
        &sandbox,
        root.path(),
        "echo a > in.txt || echo root-refused; echo b > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"",
    );
    let said = text(&out);
    assert!(said.contains("root-refused"), "{said}");
    assert!(said.contains("\nb\n") || said.ends_with("b\n"), "{said}");
    assert!(!root.path().join("in.txt").exists());
}

#[test]
fn the_terminal_and_the_rest_of_dev_are_out_of_reach() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let out = sh(
        &write(root.path()),
        root.path(),
        "head -c 4 /dev/urandom > /dev/null && echo urandom-ok; ls /dev > /dev/null 2>&1 || echo dev-refused",
    );
    let said = text(&out);
    assert!(said.contains("urandom-ok"), "{said}");
    assert!(said.contains("dev-refused"), "{said}");
}

#[test]
fn setsid_and_inet_sockets_are_refused_socket_pairs_are_not() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let probe = "import socket, os\n\
        for name, make in [('pair', lambda: socket.socketpair()), ('inet', lambda: socket.socket(socket.AF_INET)), ('udp6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))]:\n\
        \x20   try:\n\
        \x20       make(); print(name, 'ok')\n\
        \x20   except OSError as e: print(name, 'refused', e.errno)\n\
        try:\n\
        \x20   os.setsid(); print('setsid ok')\n\
        except OSError as e: print('setsid refused', e.errno)\n";
    std::fs::write(root.path().join("probe.py"), probe).unwrap();
    let closed = sh(&write(root.path()), root.path(), "python3 probe.py");
    let said = text(&closed);
    assert!(said.contains("pair ok"), "{said}");
    assert!(said.contains("inet refused 1"), "{said}");
    assert!(said.contains("udp6 refused 1"), "{said}");
    assert!(said.contains("setsid refused 1"), "{said}");
    let open = sh(
        &Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite).network(true))
            .writable(root.path()),
        root.path(),
        "python3 probe.py",
    );
    let said = text(&open);
    assert!(said.contains("inet ok"), "{said}");
    assert!(said.contains("udp6 ok"), "{said}");
    assert!(said.contains("pair ok"), "{said}");
    assert!(said.contains("setsid refused 1"), "{said}");
}

/// A call of the x32 ABI (its number with bit 30 set) would match none of the filter's numbers:
/// it fails with EPERM, where an unconfined process gets ENOSYS (a kernel without x32) or runs it.
#[cfg(target_arch = "x86_64")]
#[test]
fn calls_of_the_x32_abi_are_refused() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let probe = "import ctypes\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        for name, nr in [('getpid', 39), ('setsid', 112), ('socket', 41)]:\n\
        \x20   r = libc.syscall(0x40000000 | nr, 2, 2, 0)\n\
        \x20   print('x32', name, r, ctypes.get_errno())\n";
    std::fs::write(root.path().join("probe.py"), probe).unwrap();
    let said = text(&sh(&write(root.path()), root.path(), "python3 probe.py"));
    for name in ["getpid", "setsid", "socket"] {
        assert!(said.contains(&format!("x32 {name} -1 1\n")), "{said}");
    }
    let open = Command::new("python3")
        .arg("probe.py")
        .current_dir(root.path())
        .output()
        .unwrap();
    let said = text(&open);
    assert!(!said.contains("x32 getpid -1 1\n"), "unconfined: {said}");
}

/// No new namespace, by `unshare`, `clone` or `clone3`, and no mount, by the old or the new
/// mount API: a user namespace would hand the process every capability over what it makes.
/// `clone3` answers ENOSYS, so that threads and processes still start (by `clone`).
#[test]
fn namespaces_and_mounts_are_refused_threads_and_processes_still_start() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let probe = "import ctypes, os, threading, subprocess\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        def call(name, *args):\n\
        \x20   r = libc.syscall(*args); print(name, r, ctypes.get_errno() if r < 0 else 0)\n\
        \x20   if r == 0 and name == 'clone': os._exit(0)\n\
        fd = os.open('/proc/self/ns/net', os.O_RDONLY)\n\
        nr = {'x86_64': (272, 308, 56, 435, 430, 428, 165), 'aarch64': (97, 268, 220, 435, 430, 428, 40)}[os.uname().machine]\n\
        call('unshare', nr[0], 0x10000000)\n\
        call('setns', nr[1], fd, 0)\n\
        call('clone', nr[2], 0x10000000 | 17, 0, 0, 0, 0)\n\
        call('clone3', nr[3], 0, 0)\n\
        call('fsopen', nr[4], b'tmpfs', 0)\n\
        call('open_tree', nr[5], -100, b'/', 1)\n\
        call('mount', nr[6], b'none', b'/tmp', b'tmpfs', 0, 0)\n\
        t = threading.Thread(target=lambda: print('thread ok')); t.start(); t.join()\n\
        print(subprocess.run(['echo', 'process ok'], capture_output=True, text=True).stdout.strip())\n";
    std::fs::write(root.path().join("probe.py"), probe).unwrap();
    let said = text(&sh(&write(root.path()), root.path(), "python3 probe.py"));
    for name in ["unshare", "setns", "clone", "fsopen", "open_tree", "mount"] {
        assert!(said.contains(&format!("{name} -1 1\n")), "{name}: {said}");
    }
    assert!(said.contains("clone3 -1 38\n"), "{said}");
    assert!(said.contains("thread ok\n"), "{said}");
    assert!(said.contains("process ok"), "{said}");
    let open = Command::new("python3")
        .arg("probe.py")
        .current_dir(root.path())
        .output()
        .unwrap();
    let said = text(&open);
    assert!(!said.contains("clone3 -1 38\n"), "unconfined: {said}");
    assert!(said.contains("thread ok\n"), "unconfined: {said}");
}

/// No set-user-ID or set-group-ID bit on a file of a root, by any call that sets a mode: a
/// program left so would run as its owner for whoever runs it later, outside the sandbox. Other
/// modes are set as before, and a mode passed to `open` without `O_CREAT` is no matter.
#[test]
fn no_set_user_id_or_set_group_id_bit_is_set() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let probe = "import ctypes, os, stat\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        def attempt(name, f):\n\
        \x20   try:\n\
        \x20       f(); print(name, 'ok')\n\
        \x20   except OSError as e: print(name, 'refused', e.errno)\n\
        open('f', 'w').close()\n\
        attempt('chmod-suid', lambda: os.chmod('f', 0o4755))\n\
        attempt('chmod-sgid', lambda: os.chmod('f', 0o2755))\n\
        attempt('chmod-plain', lambda: os.chmod('f', 0o755))\n\
        fd = os.open('f', os.O_RDONLY)\n\
        attempt('fchmod-suid', lambda: os.fchmod(fd, 0o4755))\n\
        attempt('fchmodat-suid', lambda: os.chmod('f', 0o4755, dir_fd=os.open('.', os.O_RDONLY)))\n\
        attempt('create-suid', lambda: os.close(os.open('g', os.O_CREAT | os.O_WRONLY, 0o4755)))\n\
        attempt('create-plain', lambda: os.close(os.open('h', os.O_CREAT | os.O_WRONLY, 0o755)))\n\
        attempt('open-any-mode', lambda: os.close(os.open('f', os.O_RDONLY, 0o6777)))\n\
        attempt('mknod-suid', lambda: os.mknod('m', stat.S_IFREG | 0o4755))\n\
        r = libc.syscall(437, -100, b'n', bytes(24), 24)\n\
        print('openat2', r, ctypes.get_errno() if r < 0 else 0)\n\
        print('mode', oct(os.stat('f').st_mode & 0o7777))\n";
    std::fs::write(root.path().join("probe.py"), probe).unwrap();
    let said = text(&sh(&write(root.path()), root.path(), "python3 probe.py"));
    for name in [
        "chmod-suid",
        "chmod-sgid",
        "fchmod-suid",
        "fchmodat-suid",
        "create-suid",
        "mknod-suid",
    ] {
        assert!(
            said.contains(&format!("{name} refused 1\n")),
            "{name}: {said}"
        );
    }
    for name in ["chmod-plain", "create-plain", "open-any-mode"] {
        assert!(said.contains(&format!("{name} ok\n")), "{name}: {said}");
    }
    assert!(said.contains("openat2 -1 38\n"), "{said}");
    assert!(said.contains("mode 0o755\n"), "{said}");
    assert!(!root.path().join("g").exists() && !root.path().join("m").exists());
    // Unconfined, the same calls set the bits: the probe tells.
    let open = text(
        &Command::new("python3")
            .arg("probe.py")
            .current_dir(root.path())
            .output()
            .unwrap(),
    );
    assert!(open.contains("chmod-suid ok\n"), "unconfined: {open}");
    assert!(open.contains("create-suid ok\n"), "unconfined: {open}");
}

/// A daemon's socket outside the tool's roots (as `/var/run/docker.sock` or an SSH agent's) is
/// out of reach unless `unix_sockets` is set, with or without network; `off` reaches it.
#[test]
fn the_systems_unix_sockets_are_out_of_reach_unless_allowed() {
    if !supported() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let path = outside.path().join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let root = tempfile::tempdir().unwrap();
    let probe = format!(
        "import socket\n\
         try:\n\
         \x20   s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connect ok')\n\
         except OSError as e: print('connect refused', e.errno)\n",
        path.display().to_string()
    );
    std::fs::write(root.path().join("probe.py"), probe).unwrap();
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite);
    for p in [
        policy,
        policy.network(true),
        SandboxPolicy::new(SandboxMode::ReadOnly),
    ] {
        let said = text(&sh(
            &Sandbox::new(p).writable(root.path()),
            root.path(),
            "python3 probe.py",
        ));
        assert!(said.contains("connect refused"), "{p:?}: {said}");
    }
    for p in [
        policy.unix_sockets(true),
        SandboxPolicy::new(SandboxMode::Off),
    ] {
        let said = text(&sh(
            &Sandbox::new(p).writable(root.path()),
            root.path(),
            "python3 probe.py",
        ));
        assert!(said.contains("connect ok"), "{p:?}: {said}");
    }
}

/// Each limit reaches the process as its `ulimit`, in a strict mode and under `off`, and the
/// ones a test can trip without harm do what they say.
#[test]
fn resource_limits_reach_the_process_and_hold() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let limits = Resources {
        memory_bytes: Some(512 * 1024 * 1024),
        cpu_secs: Some(7),
        processes: Some(300),
        file_size_bytes: Some(1024 * 1024),
        open_files: Some(64),
    };
    for mode in [SandboxMode::WorkspaceWrite, SandboxMode::Off] {
        let sandbox =
            Sandbox::new(SandboxPolicy::new(mode).resources(limits)).writable(root.path());
        let said = text(&sh(
            &sandbox,
            root.path(),
            "python3 -c \"import resource as r; print(*(f'{n}={r.getrlimit(getattr(r, n))}' for n in              ['RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE']))\"",
        ));
        for (name, value) in [
            ("AS", 512 * 1024 * 1024),
            ("CPU", 7),
            ("NPROC", 300),
            ("FSIZE", 1024 * 1024),
            ("NOFILE", 64),
            ("CORE", 0),
        ] {
            let want = format!("RLIMIT_{name}=({value}, {value})");
            assert!(said.contains(&want), "{mode}: {want} not in {said}");
        }
        // Writing past the file size fails; allocating past the memory fails.
        let big = text(&sh(
            &sandbox,
            root.path(),
            "python3 -c \"open('big', 'wb').write(b'x' * 2_000_000)\" 2>&1; echo rc=$?; \
             python3 -c \"b = bytearray(700 * 1024 * 1024)\" 2>&1; echo rc=$?",
        ));
        assert!(!big.contains("rc=0"), "{mode}: {big}");
        assert!(big.contains("MemoryError"), "{mode}: {big}");
        let written = std::fs::metadata(root.path().join("big")).map_or(0, |m| m.len());
        assert!(written <= 1024 * 1024, "{mode}: wrote {written} bytes");
    }
}

#[test]
fn every_mode_drops_the_capabilities_that_read_other_processes() {
    let root = tempfile::tempdir().unwrap();
    let mut modes = vec![SandboxMode::Off];
    if supported() {
        modes.push(SandboxMode::WorkspaceWrite);
    }
    for mode in modes {
        let sandbox = Sandbox::new(SandboxPolicy::new(mode)).writable(root.path());
        let out = sh(
            &sandbox,
            root.path(),
            "grep -E '^Cap(Bnd|Inh|Eff)' /proc/self/status",
        );
        let said = text(&out);
        for line in said.lines() {
            let mask = u64::from_str_radix(line.split_whitespace().last().unwrap(), 16).unwrap();
            for cap in [16, 17, 19, 21, 38, 39] {
                assert_eq!(mask & (1 << cap), 0, "{mode}: cap {cap} kept: {line}");
            }
        }
        assert!(said.contains("CapBnd"), "{said}");
    }
}

#[test]
fn the_private_tmpdir_is_removed_with_its_confinement() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let out = sh(&write(root.path()), root.path(), "echo $TMPDIR");
    let tmp = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(tmp.contains("agentloop-tool-"), "{tmp}");
    assert!(!Path::new(&tmp).exists(), "{tmp} was left behind");
}

/// Landlock has no right for a file's metadata: what refuses changing it outside the roots is
/// the read-only view of the file system. Its mode, owner, times, a set-user-ID bit (on a copy of
/// a shell, which would make a way to root for anyone when root runs the tool) and its extended
/// attributes stay as they were, while inside the root `chmod +x`, creating, renaming and
/// deleting work, and `/dev/null` takes writes. Run as root here: the plain mount namespace;
/// `unprivileged.rs` runs the same as an ordinary user.
#[test]
fn files_outside_the_roots_keep_their_mode_owner_times_and_attributes() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let sandbox = write(root.path());
    let confinement = sandbox.prepare().unwrap();
    let Some(how) = Support::current().read_only_mounts else {
        // A system that cannot: the process runs, saying so.
        let note = confinement.note().unwrap_or_default();
        assert!(note.contains("read-only mounts"), "{note}");
        assert!(
            !has_cap_sys_admin(),
            "CAP_SYS_ADMIN, yet no mount namespace"
        );
        return;
    };
    if has_cap_sys_admin() {
        assert_eq!(how, ReadOnlyMounts::MountNamespace);
    }
    assert_eq!(confinement.note(), None);
    drop(confinement);
    let uid = std::fs::metadata(root.path()).unwrap().uid();
    let chown_to = (uid == 0).then_some(65534);
    let files = metadata::Outside::new(outside.path());
    let said = text(&sh(
        &sandbox,
        root.path(),
        &metadata::script(&files, chown_to),
    ));
    metadata::assert_refused_outside_and_done_inside(&said, &files, root.path());
}

fn has_cap_sys_admin() -> bool {
    has_cap(21)
}

/// This process holds capability `cap` in its effective set.
fn has_cap(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << cap) != 0)
}

/// The roots' copies in the read-only view are `nodev` and `nosuid`: a device node already in a
/// root (here one with `/dev/null`'s numbers, made by root beforehand; of a disk it would write
/// the disk beneath Landlock) does not open, and the root's mount says both. The node is made
/// unconfined, as the sandbox lets no process make one.
#[test]
fn a_device_node_in_a_root_does_not_open_and_the_roots_are_nosuid() {
    if !supported() || Support::current().read_only_mounts.is_none() || !is_root() {
        eprintln!("skipped: no read-only view here, or not root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let made = Command::new("mknod")
        .args(["node", "c", "1", "3"])
        .current_dir(root.path())
        .status()
        .unwrap();
    assert!(made.success());
    let said = text(&sh(
        &write(root.path()),
        root.path(),
        "echo x > node; echo write $?; cat /proc/self/mountinfo",
    ));
    assert!(said.contains("write 2\n"), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
    let canonical = std::fs::canonicalize(root.path()).unwrap();
    let options = said
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4).copied() == canonical.to_str())
        .and_then(|f| {
            f.get(5)
                .map(|o| o.split(',').map(str::to_owned).collect::<Vec<_>>())
        })
        .unwrap_or_else(|| panic!("no mount at {}: {said}", canonical.display()));
    for flag in ["rw", "nodev", "nosuid"] {
        assert!(options.iter().any(|o| o == flag), "{flag}: {options:?}");
    }
    // Unconfined, the same node takes the write: the refusal is the view's.
    let open = Command::new("sh")
        .args(["-c", "echo x > node; echo write $?"])
        .current_dir(root.path())
        .output()
        .unwrap();
    assert!(text(&open).contains("write 0\n"), "{}", text(&open));
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `CAP_CHOWN`, `CAP_DAC_OVERRIDE` and `CAP_FOWNER`: all a confined root keeps.
const KEPT_CAPS: u64 = 0b1011;

/// Run as root, a confined process holds no capability but its power over files, in no set (the
/// bounding and inheritable ones included, so no `exec` gets one back): it cannot raise its
/// resource limits back (`CAP_SYS_RESOURCE`), which `off` still can, nor make a device node
/// (`CAP_MKNOD`, Landlock and seccomp refuse it too). Ordinary work goes on: git, python3,
/// `mkfifo`, `cp`, `chmod`; and in its root it still writes, `chmod`s and `chown`s a file
/// another user owns, as under `sudo` in that user's checkout.
#[test]
fn a_confined_root_keeps_only_its_power_over_files() {
    if !supported() || !is_root() {
        eprintln!("skipped: no sandbox here, or not root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let theirs = root.path().join("theirs.txt");
    std::fs::write(&theirs, "theirs\n").unwrap();
    std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
    let limits = Resources {
        open_files: Some(64),
        ..Resources::default()
    };
    let raise = "python3 -c \"import resource as r; r.setrlimit(r.RLIMIT_NOFILE, (64, 65)); \
                 print('raised')\" 2>&1 | tail -n 1";
    let script = format!(
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; {raise}; \
         mknod blk b 0 0; echo mknod $?; \
         git init -q repo && cd repo && echo a > a && git add a && \
         git -c user.name=t -c user.email=t@t commit -q -m a && git log --oneline | wc -l && cd .. && \
         python3 -c \"open('py.txt', 'w').write('py')\" && mkfifo fifo && test -p fifo && \
         cp py.txt copy.txt && chmod 600 copy.txt && echo work-ok; \
         echo more >> theirs.txt && chmod 755 theirs.txt && chown 4243 theirs.txt && echo theirs-ok"
    );
    let sandbox = Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite).resources(limits))
        .writable(root.path());
    let said = text(&sh(&sandbox, root.path(), &script));
    let mut sets = 0;
    for line in said.lines().filter(|l| l.starts_with("Cap")) {
        let mask = u64::from_str_radix(line.split_whitespace().last().unwrap(), 16).unwrap();
        assert_eq!(mask & !KEPT_CAPS, 0, "{line}: {said}");
        if line.starts_with("CapEff") || line.starts_with("CapBnd") {
            assert_eq!(mask, KEPT_CAPS, "{line}: {said}");
        }
        sets += 1;
    }
    assert_eq!(sets, 5, "{said}");
    assert!(
        said.contains("not allowed to raise maximum limit"),
        "{said}"
    );
    assert!(!said.contains("raised"), "{said}");
    assert!(said.contains("mknod 1\n"), "{said}");
    assert!(!root.path().join("blk").exists());
    assert!(said.contains("\n1\nwork-ok\n"), "{said}");
    assert!(said.contains("theirs-ok"), "{said}");
    let meta = std::fs::metadata(&theirs).unwrap();
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "theirs\nmore\n");
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o755, 4243));
    // `off` keeps root's other capabilities: it raises the limit, where this process may (a
    // container's root may lack `CAP_SYS_RESOURCE`: then the capability sets above tell).
    if has_cap(24) {
        let off = Sandbox::new(SandboxPolicy::new(SandboxMode::Off).resources(limits));
        assert!(text(&sh(&off, root.path(), raise)).contains("raised"));
    }
}

/// A System V shared memory segment of this test process's (the host's), removed when dropped.
struct HostSegment(libc::c_int);

impl HostSegment {
    fn new() -> Self {
        // SAFETY: shmget takes integers only.
        #[allow(unsafe_code)]
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        HostSegment(id)
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

/// `python3 ipc.py HOST_ID`: makes a segment of its own, which a forked child writes and the
/// process reads back (`own from-child`, or `own refused ERRNO`), then attaches the segment
/// `HOST_ID` (`host attached`, or `host refused ERRNO`).
const IPC_PROBE: &str = "import ctypes, os, sys\n\
    libc = ctypes.CDLL(None, use_errno=True)\n\
    libc.shmat.restype = ctypes.c_void_p\n\
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n\
    def attach(id):\n\
    \x20   addr = libc.shmat(id, None, 0)\n\
    \x20   return None if addr in (None, ctypes.c_void_p(-1).value) else addr\n\
    own = libc.shmget(0, 4096, 0o1600)\n\
    if own < 0: print('own refused', ctypes.get_errno())\n\
    else:\n\
    \x20   pid = os.fork()\n\
    \x20   if pid == 0:\n\
    \x20       ctypes.memmove(attach(own), b'from-child', 10); os._exit(0)\n\
    \x20   os.waitpid(pid, 0)\n\
    \x20   print('own', ctypes.string_at(attach(own), 10).decode()); libc.shmctl(own, 0, None)\n\
    host = attach(int(sys.argv[1]))\n\
    print('host attached' if host else 'host refused %d' % ctypes.get_errno())\n";

/// System V IPC reached by number, not path: a confined call never attaches a segment of the
/// host's, whose id it was given. With the call's own IPC namespace (the read-only view) the
/// id names nothing there (`EINVAL`), and the call's processes still share a segment of their
/// own; without one (a writable root of `/` takes no view, as a system without mount
/// namespaces gives none) seccomp refuses System V IPC whole (`EPERM`).
#[test]
fn a_call_shares_its_own_ipc_and_never_reaches_the_host_s() {
    if !supported() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("ipc.py"), IPC_PROBE).unwrap();
    let host = HostSegment::new();
    let script = format!("python3 ipc.py {}", host.0);
    let said = text(&sh(&write(root.path()), root.path(), &script));
    if Support::current().read_only_mounts.is_some() {
        assert!(said.contains("own from-child"), "{said}");
        assert!(said.contains("host refused 22"), "{said}");
    } else {
        assert!(said.contains("own refused 1"), "{said}");
        assert!(said.contains("host refused 1"), "{said}");
    }
    let no_view = Sandbox::new(SandboxPolicy::new(SandboxMode::WorkspaceWrite)).writable("/");
    let said = text(&sh(&no_view, root.path(), &script));
    assert!(said.contains("own refused 1"), "{said}");
    assert!(said.contains("host refused 1"), "{said}");
    // The control: unconfined, the same process attaches the host's segment.
    let open = Sandbox::new(SandboxPolicy::new(SandboxMode::Off));
    let said = text(&sh(&open, root.path(), &script));
    assert!(said.contains("own from-child"), "{said}");
    assert!(said.contains("host attached"), "{said}");
}

/// A FAT image in `fusefat` (FUSE; `scripts/fat/install.sh`) in a temporary folder, unmounted
/// with it; `Err` says why this machine cannot make one.
struct Fat(tempfile::TempDir);

impl Fat {
    fn mount() -> Result<Fat, String> {
        if !has_cap_sys_admin() || !Path::new("/dev/fuse").exists() {
            return Err("no CAP_SYS_ADMIN or no /dev/fuse".into());
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fat.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let made = Command::new("/usr/sbin/mkfs.vfat")
            .arg(&image)
            .output()
            .map_err(|e| format!("mkfs.vfat: {e}"))?;
        let mounted = Command::new("fusefat")
            .args(["-o", "rw+"])
            .arg(&image)
            .arg(dir.path().join("mnt"))
            .output()
            .map_err(|e| format!("fusefat: {e}"))?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if !made.status.success() || !mounts.contains(&format!(" {}/mnt ", dir.path().display())) {
            return Err(format!("no FAT mount: {made:?} {mounted:?}"));
        }
        Ok(Fat(dir))
    }
}

impl Drop for Fat {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.0.path().join("mnt"))
            .status();
    }
}

/// On a file system that ignores case through FUSE a root is written under the spelling its
/// folder lists too, and a path kept read-only under it stays so under that spelling: the other
/// spelling opens no own file. A strict mode refuses to keep a path there at all, as a third
/// spelling of its own name (`OWN.TXT`) is no bind's; `best-effort` runs, says so, and keeps
/// what it can. Skipped, saying why, without FUSE or fusefat.
#[test]
fn a_file_kept_read_only_stays_so_under_the_listed_spelling_of_its_root() {
    if !supported() || Support::current().read_only_mounts.is_none() {
        return;
    }
    let fat = match Fat::mount() {
        Ok(fat) => fat,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let mnt = fat.0.path().join("mnt");
    std::fs::create_dir(mnt.join("Work")).unwrap();
    std::fs::write(mnt.join("Work/own.txt"), "own\n").unwrap();
    let refused = write(&mnt.join("work"))
        .read_only([mnt.join("work/own.txt")])
        .prepare()
        .unwrap_err();
    assert!(refused.to_string().contains("OWN.TXT"), "{refused}");
    let sandbox = Sandbox::new(SandboxPolicy::new(SandboxMode::BestEffort))
        .writable(mnt.join("work"))
        .read_only([mnt.join("work/own.txt")]);
    let note = sandbox.prepare().unwrap().note().map(str::to_owned);
    assert!(note.is_some_and(|n| n.contains("ignores case")));
    let out = sh(
        &sandbox,
        &mnt,
        "echo x > Work/new.txt; echo new $?; echo x >> Work/own.txt; echo own $?; \
         echo x >> work/own.txt; echo given $?",
    );
    let out = text(&out);
    assert!(out.contains("new 0"), "{out}");
    assert!(out.contains("own 2") && out.contains("given 2"), "{out}");
    assert_eq!(
        std::fs::read_to_string(mnt.join("Work/own.txt")).unwrap(),
        "own\n"
    );
}
