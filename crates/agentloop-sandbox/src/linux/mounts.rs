//! The read-only view of the file system a confined process gets: everything outside its
//! writable roots (and its private temporary folder) is read-only at the mount level, so that
//! changing a file's mode, owner, times or extended attributes there fails with `EROFS`,
//! whatever the caller's user. Landlock has no right for a file's metadata and seccomp cannot
//! tell one path from another; a read-only mount refuses all of it.
//!
//! How, in the child, before the rest of the sandbox (seccomp then refuses every mount call to
//! the program): a private mount namespace (`unshare(CLONE_NEWNS)`, under a new user namespace
//! where this process lacks `CAP_SYS_ADMIN`), propagation made private so that nothing reaches
//! the system's mounts, a copy of each root's mounts taken (`open_tree`), the whole tree made
//! read-only (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`, Linux 5.12), then each copy
//! mounted back over its root, read-write as it was but `nodev` and `nosuid`. The namespace is
//! the call's: it goes when its last process ends.
//!
//! A read-only mount still lets a process write into device nodes and FIFOs (`/dev/null`), only
//! not change them; `/proc` and `/sys`, read-only under Landlock already, lose nothing more. In
//! the roots' copies no device node opens at all (`nodev`: a node root made or found there, of
//! a disk, would write it beneath Landlock) and no set-user-ID or file capability takes effect
//! (`nosuid`).
//!
//! The user namespace gets no uid or gid map. Writing `/proc/self/uid_map` needs the process to
//! be dumpable (a non-dumpable process's `/proc` files are root's), and this process is a copy of
//! the agentloop process's memory, non-dumpable precisely so that no other process of the user
//! can read it: becoming dumpable for the write would let one attach in that moment. Unmapped,
//! the process keeps its real user for every access the kernel checks (files it creates are the
//! user's), but it sees itself and every file as the overflow user (`nobody`, 65534), and its
//! `exec` gives it no capability. Root is never put in a user namespace: it would lose its
//! capabilities over files (an unmapped root is nobody); root without `CAP_SYS_ADMIN` gets no
//! read-only view (see [`available`]).

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libc::{c_int, c_uint};

use super::supervisor;
use crate::{ReadOnlyMounts, SandboxError};

/// The `unshare` flags of each way, for the mounts alone.
fn view_flags(how: ReadOnlyMounts) -> c_int {
    match how {
        ReadOnlyMounts::MountNamespace => libc::CLONE_NEWNS,
        ReadOnlyMounts::UserNamespace => libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
    }
}

/// The `unshare` flags of each way: the mounts' and, where the kernel has them, a System V IPC
/// namespace of the call's own (`CLONE_NEWIPC`). Shared memory segments, message queues and
/// semaphore sets are reached by a number, not a path, so neither Landlock nor the view stands
/// in the way: without it a confined process could write another process's shared memory
/// (`shmat`), read or fill its message queues, and leave objects that outlive the call and the
/// run. POSIX message queues (`mq_open`) are the IPC namespace's too. Inside, the call's
/// processes share such objects among themselves as before; they go with the namespace.
fn unshare_flags(how: ReadOnlyMounts) -> c_int {
    static AS_ROOT: OnceLock<bool> = OnceLock::new();
    static AS_USER: OnceLock<bool> = OnceLock::new();
    let slot = match how {
        ReadOnlyMounts::MountNamespace => &AS_ROOT,
        ReadOnlyMounts::UserNamespace => &AS_USER,
    };
    let with_ipc = view_flags(how) | libc::CLONE_NEWIPC;
    // A kernel built without IPC namespaces refuses the flag: the view goes on without it, and
    // seccomp refuses the IPC calls instead (`ReadOnlyView::own_ipc`).
    if *slot.get_or_init(|| works(with_ipc)) {
        with_ipc
    } else {
        view_flags(how)
    }
}

/// How this process's confined children get their read-only view, found once by trying it in a
/// throwaway child (a mount namespace of its own, gone with it): a plain mount namespace first
/// (root, or `CAP_SYS_ADMIN`), then, for an ordinary user, a user namespace (where the kernel
/// allows unprivileged ones and nothing, such as AppArmor's restriction, takes their
/// capabilities). `None` when neither works.
pub(super) fn available() -> Option<ReadOnlyMounts> {
    static AVAILABLE: OnceLock<Option<ReadOnlyMounts>> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if works(view_flags(ReadOnlyMounts::MountNamespace)) {
            return Some(ReadOnlyMounts::MountNamespace);
        }
        // SAFETY: geteuid takes nothing and cannot fail.
        #[allow(unsafe_code)]
        let root = unsafe { libc::geteuid() } == 0;
        (!root && works(view_flags(ReadOnlyMounts::UserNamespace)))
            .then_some(ReadOnlyMounts::UserNamespace)
    })
}

/// What a confined process may still do here for want of the read-only view, for the sandbox's
/// note. With `seccomp`, its filter refuses System V IPC and POSIX message queues instead of the
/// IPC namespace the view would have brought.
pub(super) fn unavailable(seccomp: bool) -> String {
    let ipc = if seccomp {
        "; System V IPC and POSIX message queues are refused instead (seccomp), so that no \
         object of another process is reached"
    } else {
        ", and the System V IPC objects and POSIX message queues of other processes reached"
    };
    format!(
        "read-only mounts outside the writable roots (they need CAP_SYS_ADMIN, or user \
         namespaces for an ordinary user, and Linux 5.12): the mode, owner and times of files \
         outside the roots can still be changed{ipc}"
    )
}

/// Tries the whole view, entered with `flags`, in a forked child, which says so through a pipe
/// before it exits.
fn works(flags: c_int) -> bool {
    let mut ends = [-1 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into our stack array.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
    let [read_end, write_end] = ends;
    if rc != 0 {
        return false;
    }
    let Ok(slash) = CString::new("/") else {
        return false;
    };
    let mut view = ReadOnlyView {
        flags,
        roots: vec![slash],
        trees: vec![-1],
        pins: Vec::new(),
    };
    let child = match supervisor::fork() {
        Ok(0) => {
            // The child: raw system calls only, then gone without running anything of ours.
            let ok = view.enter().is_ok();
            if ok {
                // SAFETY: write reads one byte of a static; _exit ends this process at once.
                #[allow(unsafe_code)]
                unsafe {
                    libc::write(write_end, b"1".as_ptr().cast(), 1);
                }
            }
            // SAFETY: _exit ends the process without running anything of the parent's.
            #[allow(unsafe_code)]
            unsafe {
                libc::_exit(0)
            }
        }
        Ok(pid) => Some(pid),
        Err(_) => None,
    };
    // SAFETY: close takes the descriptor pipe2 gave.
    #[allow(unsafe_code)]
    unsafe {
        libc::close(write_end);
    }
    let mut said = [0u8; 1];
    let n = loop {
        // SAFETY: read writes at most one byte into our stack buffer.
        #[allow(unsafe_code)]
        let n = unsafe { libc::read(read_end, said.as_mut_ptr().cast(), 1) };
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break n;
        }
    };
    // SAFETY: close takes the descriptor pipe2 gave; waitpid writes one int on our stack (its
    // answer does not matter: the pipe said it, and a parent that ignores SIGCHLD has none).
    #[allow(unsafe_code)]
    unsafe {
        libc::close(read_end);
        if let Some(pid) = child {
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
    }
    child.is_some() && n == 1
}

/// What the child does for its read-only view, prepared by the parent.
#[derive(Debug)]
pub(super) struct ReadOnlyView {
    /// `unshare`'s flags.
    flags: c_int,
    /// The writable roots and the private temporary folder: canonical paths.
    roots: Vec<CString>,
    /// The copies of their mounts, one descriptor per root, filled in the child (allocated
    /// here, as the child may not).
    trees: Vec<c_int>,
    /// Paths under the roots bound over themselves once the roots are back, outer first: the
    /// agent's own files read-only (`true`), and each folder between a root and one of them
    /// left writable (`false`), made a mount point so that it cannot be renamed or removed with
    /// the file inside.
    pins: Vec<(CString, bool)>,
}

impl ReadOnlyView {
    /// The view of a process that may write `writable` (canonical paths) but not `read_only`
    /// (canonical paths under them); `None` when one of the roots is `/` itself, which leaves
    /// nothing to make read-only (refused when something under it must be).
    pub(super) fn new(
        how: ReadOnlyMounts,
        writable: &[PathBuf],
        read_only: &[PathBuf],
    ) -> Result<Option<Self>, SandboxError> {
        let c_path = |path: &Path| {
            CString::new(path.as_os_str().as_bytes()).map_err(|e| SandboxError::Setup {
                reason: format!("the path {}: {e}", path.display()),
            })
        };
        if writable.iter().any(|root| root == Path::new("/")) {
            if read_only.is_empty() {
                return Ok(None);
            }
            return Err(SandboxError::Setup {
                reason: "a writable root of / cannot keep the agent's own files read-only".into(),
            });
        }
        let roots = writable
            .iter()
            .map(|root| c_path(root))
            .collect::<Result<Vec<_>, _>>()?;
        let mut pins: Vec<(PathBuf, bool)> = Vec::new();
        for path in read_only {
            let root = writable.iter().find(|r| path.starts_with(r));
            let mut folder = path.parent();
            while let (Some(f), Some(r)) = (folder, root) {
                if f == r.as_path() || !f.starts_with(r) {
                    break;
                }
                pins.push((f.to_path_buf(), false));
                folder = f.parent();
            }
            pins.push((path.clone(), true));
        }
        // Outer first (a folder's pin before what is inside it); a path both kept and passed
        // through is kept.
        pins.sort_by(|a, b| {
            (a.0.components().count(), &a.0).cmp(&(b.0.components().count(), &b.0))
        });
        pins.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 |= later.1;
            }
            same
        });
        let pins = pins
            .into_iter()
            .map(|(p, read_only)| Ok((c_path(&p)?, read_only)))
            .collect::<Result<Vec<_>, SandboxError>>()?;
        Ok(Some(ReadOnlyView {
            flags: unshare_flags(how),
            trees: vec![-1; roots.len()],
            roots,
            pins,
        }))
    }

    /// Whether the child takes an IPC namespace of its own with the view (where the kernel has
    /// them): where it does not, seccomp refuses System V IPC and POSIX message queues instead.
    pub(super) fn own_ipc(&self) -> bool {
        self.flags & libc::CLONE_NEWIPC != 0
    }

    /// Runs in the child: only system calls on what the parent prepared. On an error the
    /// process must not go on (its mounts may be half made).
    pub(super) fn enter(&mut self) -> io::Result<()> {
        // SAFETY: unshare takes flags only.
        #[allow(unsafe_code)]
        check(unsafe { libc::unshare(self.flags) })?;
        // First of all, so that no mount made below reaches the system's mounts (a shared `/`,
        // as systemd makes it, would carry them over).
        // SAFETY: mount reads a static NUL-terminated path; the other pointers are null.
        #[allow(unsafe_code)]
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        // The copies come first: they keep each root's mounts as they are (a read-only one
        // under a root stays so), where making them read-write again afterwards could not.
        for (root, tree) in self.roots.iter().zip(self.trees.iter_mut()) {
            let flags = libc::OPEN_TREE_CLONE
                | libc::OPEN_TREE_CLOEXEC
                | c_uint::try_from(libc::AT_RECURSIVE).unwrap_or(0);
            // SAFETY: open_tree reads the NUL-terminated path the parent prepared.
            #[allow(unsafe_code)]
            let fd =
                unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, root.as_ptr(), flags) };
            *tree = c_int::try_from(fd).map_err(|_| io::Error::last_os_error())?;
            if *tree < 0 {
                return Err(io::Error::last_os_error());
            }
            // No device node and no set-user-ID bit in a root works through the copy: root
            // could make a node of a disk there (or find one) and write the disk beneath
            // Landlock, and a set-user-ID program made there would run as its owner.
            set_mount_attr(
                *tree,
                c"",
                libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
                libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOSUID,
            )?;
        }
        set_mount_attr(
            libc::AT_FDCWD,
            c"/",
            libc::AT_RECURSIVE,
            libc::MOUNT_ATTR_RDONLY,
        )?;
        for (root, tree) in self.roots.iter().zip(self.trees.iter_mut()) {
            // SAFETY: move_mount takes the copy's descriptor, an empty static path and the
            // root's NUL-terminated path; close takes the descriptor open_tree gave.
            #[allow(unsafe_code)]
            let rc = unsafe {
                let rc = libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    root.as_ptr(),
                    libc::MOVE_MOUNT_F_EMPTY_PATH,
                );
                libc::close(*tree);
                rc
            };
            *tree = -1;
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        for (path, read_only) in &self.pins {
            pin(path, *read_only)?;
        }
        // The working folder was entered before (by `std`) and still is the folder under the
        // copy, on the read-only mount: enter it again by its name, through the copy.
        let mut cwd = [0u8; 4096];
        // SAFETY: getcwd writes at most cwd.len() bytes into our stack buffer; chdir reads the
        // NUL-terminated path it wrote.
        #[allow(unsafe_code)]
        unsafe {
            if libc::syscall(libc::SYS_getcwd, cwd.as_mut_ptr(), cwd.len()) > 0
                && cwd.first() == Some(&b'/')
            {
                // A folder that cannot be entered again (removed since) stays as it was.
                libc::chdir(cwd.as_ptr().cast());
            }
        }
        Ok(())
    }
}

/// Binds `path` over itself, read-only when `read_only` (the copy taken of a read-only mount
/// stays read-only either way). A path gone since the parent looked (a store's side file) is
/// left: there is nothing to keep.
fn pin(path: &CString, read_only: bool) -> io::Result<()> {
    let gone = |e: io::Error| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            Ok(())
        } else {
            Err(e)
        }
    };
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | c_uint::try_from(libc::AT_RECURSIVE).unwrap_or(0);
    // SAFETY: open_tree reads the NUL-terminated path the parent prepared.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    let Ok(tree) = c_int::try_from(fd) else {
        return gone(io::Error::last_os_error());
    };
    if tree < 0 {
        return gone(io::Error::last_os_error());
    }
    // SAFETY: move_mount takes the copy's descriptor, an empty static path and the
    // NUL-terminated path; close takes the descriptor open_tree gave (its error is read first).
    #[allow(unsafe_code)]
    let moved = unsafe {
        let rc = libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        );
        let moved = if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        libc::close(tree);
        moved
    };
    moved?;
    if !read_only {
        return Ok(());
    }
    set_mount_attr(
        libc::AT_FDCWD,
        path,
        libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW,
        libc::MOUNT_ATTR_RDONLY,
    )
}

/// `mount_setattr(2)`: sets `attr_set` on the mount at `path` (from `dir`), with `flags`.
fn set_mount_attr(dir: c_int, path: &CStr, flags: c_int, attr_set: u64) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr reads the NUL-terminated path and the attribute struct on our
    // stack, whose size it is given; `dir` is a descriptor or AT_FDCWD, which it only reads.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dir,
            path.as_ptr(),
            c_uint::try_from(flags).unwrap_or(0),
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn check(rc: c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
