//! Reading, replacing, listing and walking what the workspace resolved, by exactly the path it
//! resolved: each folder on the way is opened from the one before it, from the root down, and a
//! link on the way is refused (`O_NOFOLLOW`). The path [`crate::workspace::Workspace::resolve`] returns holds no
//! link (they are all followed), so a link found here was put there after the check, by another
//! process sharing the root (the model's own shell, in a sibling call): the call fails rather
//! than reach outside the root.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// The open folder a file is in, and the file's name in it.
struct Parent {
    dir: OwnedFd,
    name: OsString,
}

fn open_dir(dir: &OwnedFd, name: &OsString) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name.as_os_str(), flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        // Linux answers a link met with `O_DIRECTORY` as "not a folder": told apart from a file
        // here, as the link is the path changed under the check.
        Err(rustix::io::Errno::NOTDIR) if is_link(dir, name) => Err(rustix::io::Errno::LOOP.into()),
        Err(e) => Err(e.into()),
    }
}

fn is_link(dir: &OwnedFd, name: &OsString) -> bool {
    rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
    })
}

/// The root, a canonical path resolved once when the workspace was made: opened refusing any
/// link on the way (`RESOLVE_NO_SYMLINKS`), so that a link put in its place (or in the place of
/// a folder above it) since then is refused rather than followed out of the root. Before Linux
/// 5.6 (no `openat2`), the path as it is.
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    match rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        flags,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {}
        other => return Ok(other?),
    }
    Ok(rustix::fs::open(root, flags, Mode::empty())?)
}

/// The parts of `path` below `root`, or an error when it is not below it.
fn parts(root: &Path, path: &Path) -> io::Result<Vec<OsString>> {
    let below = path
        .strip_prefix(root)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path is outside the root"))?;
    below
        .components()
        .map(|c| match c {
            Component::Normal(p) => Ok(p.to_owned()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path is not a plain path below the root",
            )),
        })
        .collect()
}

/// The folder holding `path` (under `root`), opened one folder at a time from the root; the
/// folders missing on the way are made when `create`. `None` for the root itself.
fn parent_of(root: &Path, path: &Path, create: bool) -> io::Result<Option<Parent>> {
    let mut parts = parts(root, path)?;
    let Some(name) = parts.pop() else {
        return Ok(None);
    };
    let mut dir = open_root(root)?;
    for part in parts {
        dir = match open_dir(&dir, &part) {
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                match rustix::fs::mkdirat(&dir, part.as_os_str(), Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open_dir(&dir, &part)?
            }
            other => other?,
        };
    }
    Ok(Some(Parent { dir, name }))
}

/// Opens `path` (under `root`) to read, without waiting (a named pipe opens at once, and its
/// caller refuses it by the handle's type). The root itself opens as a folder.
pub(crate) fn open_read(root: &Path, path: &Path) -> io::Result<std::fs::File> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match parent_of(root, path, false)? {
        Some(p) => rustix::fs::openat(&p.dir, p.name.as_os_str(), flags, Mode::empty())?,
        None => open_root(root)?,
    };
    Ok(std::fs::File::from(fd))
}

/// Replaces `path` (under `root`) with `bytes` atomically: a new file beside it, synced, renamed
/// over it (a link at its name is replaced, never followed), and the folder synced so that the
/// rename lasts. An existing file keeps its permissions but its set-user-ID and set-group-ID
/// bits, which the new content does not inherit (the kernel clears them on any write to a file,
/// so that a setuid program rewritten by someone else runs with no one's rights but theirs);
/// missing folders are made.
pub(crate) fn replace(root: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let parent = parent_of(root, path, true)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::IsADirectory,
            "the root is a folder, not a file",
        )
    })?;
    let mode = match rustix::fs::statat(
        &parent.dir,
        parent.name.as_os_str(),
        AtFlags::SYMLINK_NOFOLLOW,
    ) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::RegularFile =>
        {
            Some(Mode::from_raw_mode(st.st_mode & 0o1777))
        }
        _ => None,
    };
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let (tmp_name, fd) = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!(".agentloop-write-{}-{n}", std::process::id());
        match rustix::fs::openat(
            &parent.dir,
            name.as_str(),
            flags,
            Mode::from_raw_mode(0o666),
        ) {
            Ok(fd) => break (name, fd),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let written = (|| -> io::Result<()> {
        if let Some(mode) = mode {
            match rustix::fs::fchmod(&fd, mode) {
                // A file system without permissions (FAT or exFAT in FUSE) cannot keep them:
                // the new file has the default ones, and no set-user-ID bit either way.
                Err(rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP) | Ok(()) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        rustix::fs::renameat(
            &parent.dir,
            tmp_name.as_str(),
            &parent.dir,
            parent.name.as_os_str(),
        )?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&parent.dir, tmp_name.as_str(), AtFlags::empty());
        return Err(e);
    }
    // Not every file system syncs a folder; the file itself is already safe.
    let _ = rustix::fs::fsync(&parent.dir);
    Ok(())
}

/// Opens the folder `path` (under `root`): each folder on the way, and the folder itself, opened
/// from the one before it without following a link. The root itself opens as it is.
pub(crate) fn open_folder(root: &Path, path: &Path) -> io::Result<OwnedFd> {
    match parent_of(root, path, false)? {
        Some(p) => open_dir(&p.dir, &p.name),
        None => open_root(root),
    }
}

/// The most entries of folders a listing or a walk reads and holds at once by default: a folder
/// of millions of entries (or one a process keeps filling while it is read) would otherwise
/// cost memory and time without bound, the whole folder read before a word of the answer.
pub(crate) const MAX_ENTRIES_READ: usize = 50_000;

/// How many entries are read between two asks whether the call is still wanted.
const ENTRIES_BETWEEN_ASKS: usize = 1024;

/// What was read of a folder: at most the number asked for, in name order.
pub(crate) struct Entries {
    /// The names read, each with its type.
    pub(crate) names: Vec<(OsString, FileType)>,
    /// True when the folder held more than were read: the names are those the file system gave
    /// first, not the first by name.
    pub(crate) cut: bool,
}

/// The entries of an open folder, `.` and `..` left out, at most `most` of them, in name order:
/// each name with its type, a link being a link (never followed). Read as a stream, asking
/// `stop` every so often: an `Interrupted` error when it says the call is no longer wanted.
pub(crate) fn entries(dir: &OwnedFd, most: usize, stop: &dyn Fn() -> bool) -> io::Result<Entries> {
    let mut names = Vec::new();
    let mut cut = false;
    for (seen, entry) in rustix::fs::Dir::read_from(dir)?.enumerate() {
        if seen % ENTRIES_BETWEEN_ASKS == ENTRIES_BETWEEN_ASKS - 1 && stop() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the call was cancelled while the folder was read",
            ));
        }
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        if names.len() == most {
            cut = true;
            break;
        }
        let kind = match entry.file_type() {
            // Some file systems do not say: asked of the entry itself.
            FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode)),
            kind => kind,
        };
        names.push((name.to_owned(), kind));
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Entries { names, cut })
}

/// The size of the entry `name` of an open folder, a link's own (never followed).
pub(crate) fn size_of(dir: &OwnedFd, name: &OsStr) -> Option<u64> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| st.st_size.unsigned_abs())
}

/// One entry met by a [`Walk`]: its path (under the folder walked) and its type.
pub(crate) struct WalkEntry {
    pub(crate) path: PathBuf,
    pub(crate) kind: FileType,
}

/// How many levels of folders a walk holds open at once, the folder walked included: a folder
/// deeper than that is met but not entered. Each level holds its folder open (the next is
/// opened from it, refusing links), so a tree nested thousands deep (`mkdir d && cd d` in a
/// loop, from the model's shell) would otherwise hold as many descriptors at once and run the
/// whole process out of them while the walk goes on: every other open of the run (a file tool,
/// the journal, the provider's connection), and of the other runs of `a2a serve`, would fail.
pub(crate) const MAX_WALK_DEPTH: usize = 64;

/// The entries under a folder, depth first in name order, folders named `.git` skipped: each
/// folder is opened from the one above it without following a link, so a folder swapped for a
/// link while the walk goes on is not entered (nor anything outside the root reached by it).
/// Folders more than [`MAX_WALK_DEPTH`] levels down are not entered. The folders being walked
/// hold at most the walk's bound of entries read between them (a folder entered gets what the
/// ones above it left), so that neither a huge folder nor a deep tree of large ones costs
/// memory without bound: a folder of more is walked in part, and counted ([`Walk::counting_cut`]).
pub(crate) struct Walk<'a> {
    levels: Vec<Level>,
    /// The most entries the levels hold between them.
    most: usize,
    /// True when the folder walked held more entries than were read of it.
    base_cut: bool,
    /// Entries left out: neither met nor, for a folder, entered.
    skip: Option<&'a dyn Fn(&Path) -> bool>,
    /// Counts the folders met but not entered for being too deep.
    too_deep: Option<&'a std::cell::Cell<usize>>,
    /// Counts the folders walked in part for holding more entries than there was room for.
    cut: Option<&'a std::cell::Cell<usize>>,
    /// Asked between entries as a folder is read: true when the call is no longer wanted.
    stop: &'a dyn Fn() -> bool,
}

/// A folder being walked: the open folder, its path, how many entries were read of it, and
/// those not yet met.
struct Level {
    dir: OwnedFd,
    path: PathBuf,
    read: usize,
    rest: std::vec::IntoIter<(OsString, FileType)>,
}

impl<'a> Walk<'a> {
    /// A walk of the folder `base` (under `root`), which is opened as [`open_folder`] opens it,
    /// holding at most `most` entries at once, and asking `stop` as it reads a folder.
    pub(crate) fn new(
        root: &Path,
        base: &Path,
        most: usize,
        stop: &'a dyn Fn() -> bool,
    ) -> io::Result<Walk<'a>> {
        let dir = open_folder(root, base)?;
        let read = entries(&dir, most, stop)?;
        Ok(Walk {
            levels: vec![Level {
                dir,
                path: base.to_path_buf(),
                read: read.names.len(),
                rest: read.names.into_iter(),
            }],
            most,
            base_cut: read.cut,
            skip: None,
            too_deep: None,
            cut: None,
            stop,
        })
    }

    /// The same walk, counting in `too_deep` each folder it does not enter for lying more than
    /// [`MAX_WALK_DEPTH`] levels down, so that its caller can say the answer is not whole.
    pub(crate) fn counting_too_deep(mut self, too_deep: &'a std::cell::Cell<usize>) -> Self {
        self.too_deep = Some(too_deep);
        self
    }

    /// The same walk, counting in `cut` each folder it walks in part for holding more entries
    /// than its bound left room for (the folder walked included), so that its caller can say
    /// the answer is not whole.
    pub(crate) fn counting_cut(mut self, cut: &'a std::cell::Cell<usize>) -> Self {
        if self.base_cut {
            cut.set(cut.get() + 1);
        }
        self.cut = Some(cut);
        self
    }

    /// The same walk, leaving out the entries (by path) for which `skip` is true: a folder left
    /// out is not entered.
    pub(crate) fn skipping(mut self, skip: &'a dyn Fn(&Path) -> bool) -> Self {
        self.skip = Some(skip);
        self
    }
}

impl Iterator for Walk<'_> {
    type Item = WalkEntry;

    fn next(&mut self) -> Option<WalkEntry> {
        loop {
            let depth = self.levels.len();
            let level = self.levels.last_mut()?;
            let Some((name, kind)) = level.rest.next() else {
                self.levels.pop();
                continue;
            };
            let path = level.path.join(&name);
            if kind == FileType::Directory && name == ".git" {
                continue;
            }
            if self.skip.is_some_and(|skip| skip(&path)) {
                continue;
            }
            if kind == FileType::Directory && depth >= MAX_WALK_DEPTH {
                if let Some(count) = self.too_deep {
                    count.set(count.get() + 1);
                }
            } else if kind == FileType::Directory {
                let held: usize = self.levels.iter().map(|l| l.read).sum();
                let room = self.most.saturating_sub(held);
                // A folder that cannot be opened (gone, swapped for a link, no permission) or
                // whose reading was stopped is met but not entered.
                let Some(level) = self.levels.last() else {
                    continue;
                };
                let below = open_dir(&level.dir, &name)
                    .and_then(|dir| Ok((entries(&dir, room, self.stop)?, dir)));
                if let Ok((read, dir)) = below {
                    if read.cut
                        && let Some(count) = self.cut
                    {
                        count.set(count.get() + 1);
                    }
                    self.levels.push(Level {
                        dir,
                        path: path.clone(),
                        read: read.names.len(),
                        rest: read.names.into_iter(),
                    });
                }
            }
            return Some(WalkEntry { path, kind });
        }
    }
}

/// True for the error of a link found on the way: the path changed after it was checked.
pub(crate) fn is_link_on_the_way(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::workspace::Workspace;

    /// A folder `d` in the root, checked by the workspace, then swapped for a link to a folder
    /// outside, as a shell in a sibling call could between the check and the use.
    fn swapped() -> (tempfile::TempDir, Workspace, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("d/notes.txt"), "inside\n").unwrap();
        std::fs::write(outside.join("notes.txt"), "outside secret\n").unwrap();
        let ws = Workspace::new(&root).unwrap();
        let checked = ws.resolve_for_write("d/notes.txt").unwrap();
        std::fs::rename(root.join("d"), root.join("d-was")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("d")).unwrap();
        (dir, ws, checked)
    }

    #[test]
    fn a_folder_swapped_for_a_link_after_the_check_is_neither_written_nor_read() {
        let (dir, ws, checked) = swapped();
        let e = replace(ws.root(), &checked, b"owned\n").unwrap_err();
        assert!(is_link_on_the_way(&e), "{e}");
        let outside = dir.path().join("outside");
        assert_eq!(
            std::fs::read_to_string(outside.join("notes.txt")).unwrap(),
            "outside secret\n"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "no file left there"
        );
        let e = open_read(ws.root(), &checked).unwrap_err();
        assert!(is_link_on_the_way(&e), "{e}");
    }

    /// The descriptors this process has open now.
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn a_walk_holds_at_most_its_depth_cap_of_folders_open_however_deep_the_tree() {
        // A tree 300 folders deep, as a shell's `mkdir d && cd d` loop makes one: each
        // walk level held its folder open, 300 descriptors at the bottom (a process's soft
        // limit is often 1,024, shared by everything it does).
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let mut deepest = root.clone();
        for _ in 0..300 {
            deepest.push("d");
        }
        std::fs::create_dir_all(&deepest).unwrap();
        let ws = Workspace::new(&root).unwrap();
        let before = open_descriptors();
        let too_deep = std::cell::Cell::new(0);
        let mut most = 0;
        let mut met = 0;
        for _ in Walk::new(ws.root(), ws.root(), MAX_ENTRIES_READ, &|| false)
            .unwrap()
            .counting_too_deep(&too_deep)
        {
            met += 1;
            most = most.max(open_descriptors().saturating_sub(before));
        }
        // Some slack for the other tests of this process, which open files meanwhile.
        assert!(
            most <= MAX_WALK_DEPTH + 32,
            "{most} descriptors open at once during the walk"
        );
        assert_eq!(met, MAX_WALK_DEPTH, "the folders down to the cap are met");
        assert_eq!(
            too_deep.get(),
            1,
            "the first folder below the cap is counted"
        );
    }

    #[test]
    fn a_replaced_file_keeps_its_permissions_but_not_its_setuid_or_setgid_bits() {
        // A write to a setuid program (which the model's content would then be, run with its
        // owner's rights by whoever runs it) loses the bits, as the kernel clears them when any
        // process writes to such a file; its other permissions stay.
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let path = ws.resolve_for_write("tool").unwrap();
        std::fs::write(&path, "#!/bin/sh\necho old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o6751)).unwrap();
        let before = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(before, 0o6751, "this system kept the bits on the original");
        replace(ws.root(), &path, b"#!/bin/sh\necho new\n").unwrap();
        let after = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(after, 0o751, "{after:o}");
    }

    #[test]
    fn a_link_at_the_files_own_name_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside.txt"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(&outside, "outside\n").unwrap();
        let ws = Workspace::new(&root).unwrap();
        let checked = ws.resolve_for_write("new/deep/file.txt").unwrap();
        replace(ws.root(), &checked, b"one\n").unwrap();
        assert_eq!(std::fs::read_to_string(&checked).unwrap(), "one\n");
        std::fs::remove_file(&checked).unwrap();
        std::os::unix::fs::symlink(&outside, &checked).unwrap();
        replace(ws.root(), &checked, b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "outside\n");
        assert!(!std::fs::symlink_metadata(&checked).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&checked).unwrap(), "two\n");
        assert!(
            open_read(ws.root(), ws.root())
                .unwrap()
                .metadata()
                .unwrap()
                .is_dir()
        );
    }
}
