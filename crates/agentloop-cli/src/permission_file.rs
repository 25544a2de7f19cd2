//! The permission store's file: the "always" answers a person gave, kept as JSON
//! (`{"rules": [...]}`) so that later runs ask nobody again. The core's store decides; this file
//! only remembers.
//!
//! The store is written in place and never replaced: the processes the agent starts (command
//! tools, the shell, stdio MCP servers) see it through a read-only bind of its file, and a file
//! renamed over it (or unlinked) in agentloop's view drops that bind in theirs, leaving a plain
//! file that a server started at the run's start could then fill with an allow-all rule for the
//! next run. So its inode, and that of its recovery copy `<store>.next`, stay the ones made
//! before any process started ([`create_empty`]).
//!
//! Two processes (two `agentloop` runs of one agent) may answer at once. A save therefore takes an
//! advisory lock on a file of its own beside the store (`<store>.lock`), reads the store again
//! under the lock, merges its answers into what it finds (an answer replaces the rule of the same
//! tool and arguments; every other rule stays), and writes the result, each file opened without
//! following a link and synced before the next step: first whole into `<store>.next`, then over
//! the store, then `<store>.next` is emptied again. A crash leaves either the store as it was
//! (`.next` half-written or empty) or a whole `.next` with the store possibly half-written: a
//! store that does not read then gives way to a `.next` that does, so no earlier answer is lost,
//! while a store broken by hand with an empty `.next` is an error naming both files (never
//! quietly replaced by an older copy). A reader takes the lock shared, so it never sees a save
//! half done. Neither waits on the lock for ever: the model's processes see it read-only, but
//! may still hold it (`flock` needs no more), so a save gives up with an error after 5 s, and a
//! reader reads without it after 2 s.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentloop::permissions::{
    Permission, PermissionRule, PermissionStore, PermissionStoreError, SaveRules,
};
use serde::{Deserialize, Serialize};

use crate::text_file::{MAX_AGENT_TEXT_BYTES, TextFileError};

#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedRules {
    rules: Vec<PermissionRule>,
}

/// Saves a store's rules to its file.
#[derive(Debug)]
pub struct RulesFile {
    path: PathBuf,
}

/// Opens the store kept in `path` (empty when the file does not exist yet).
pub fn open(
    path: impl AsRef<Path>,
    fallback: Permission,
) -> Result<PermissionStore, PermissionStoreError> {
    let path = path.as_ref().to_path_buf();
    let rules = load(&path)?;
    Ok(PermissionStore::with_saved(
        rules,
        fallback,
        Arc::new(RulesFile { path }),
    ))
}

/// How long a reader waits for the store's lock before it reads without it. A save holds the
/// lock for milliseconds; a lock held longer is most likely held by something that is no save
/// (a process of the model's: the lock is read-only in its view, but `flock` needs no more), and
/// what no save writes is whole. Even a save caught in the middle leaves one of the store and
/// its copy whole.
const READ_WAIT: Duration = Duration::from_secs(2);

/// How long a save waits for the store's lock before it fails: a lock held that long is not
/// held by another save, and waiting on would hang the answer, and the run, for as long as
/// whatever holds it likes.
const SAVE_WAIT: Duration = Duration::from_secs(5);

/// Takes `lock` (shared or exclusive), waiting `within` at most: whether it was taken.
///
/// The wait is a blocking `flock` on a thread of its own (a clone of the same open file, which
/// the lock belongs to) rather than tries in a loop, which a run saving answer after answer
/// would win every time over another one sleeping between its tries. When the wait runs out
/// the thread is left to wait on, and lets the lock go as soon as it gets it, by closing its
/// clone once nobody takes its answer.
fn take(lock: &File, shared: bool, within: Duration) -> std::io::Result<bool> {
    let try_now = if shared {
        fs4::fs_std::FileExt::try_lock_shared(lock)?
    } else {
        fs4::fs_std::FileExt::try_lock_exclusive(lock)?
    };
    if try_now {
        return Ok(true);
    }
    let waiter = lock.try_clone()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("permission-store-lock".into())
        .spawn(move || {
            let taken = if shared {
                fs4::fs_std::FileExt::lock_shared(&waiter)
            } else {
                fs4::fs_std::FileExt::lock_exclusive(&waiter)
            };
            let _ = tx.send(taken);
            // `waiter` is closed here: the lock stays with `lock` when it was heard, and goes
            // with the last clone when it was not.
        })?;
    match rx.recv_timeout(within) {
        Ok(taken) => taken.map(|()| true),
        Err(_) => Ok(false),
    }
}

/// The rules kept in `path`, read under the store's lock taken shared (for [`READ_WAIT`] at
/// most) when the lock is there to take: a store never saved has none, and a lock that is no
/// plain file (a FIFO, a link) lets no save write (each refuses it), so there is nothing to
/// wait for.
fn load(path: &Path) -> Result<Vec<PermissionRule>, PermissionStoreError> {
    let lock = existing_lock(&lock_path(path));
    let locked = lock
        .as_ref()
        .is_some_and(|lock| take(lock, true, READ_WAIT).unwrap_or(false));
    // The shared lock, if taken, is released when `lock` is dropped, after the read.
    match read(path) {
        // Unlocked, the store may have been read half-written and its copy just emptied by the
        // same save, now over: the store is whole again.
        Err(_) if !locked => read(path),
        read => read,
    }
}

/// The rules kept in `path`; none when the file does not exist. A store whose text does not
/// read as rules gives way to its recovery copy when that holds a whole save.
fn read(path: &Path) -> Result<Vec<PermissionRule>, PermissionStoreError> {
    let broken = match read_rules(path, Links::Followed) {
        Ok(rules) => return Ok(rules),
        Err(Unread::Missing) => return Ok(Vec::new()),
        Err(Unread::Empty) => "it is empty".to_owned(),
        Err(Unread::Broken(why)) => why,
        Err(Unread::Failed(why)) => return Err(error(path, why)),
    };
    let next = next_path(path);
    let shown = agentloop::printable::path(&next);
    match read_rules(&next, Links::Refused) {
        Ok(rules) => Ok(rules),
        // No save was cut short: the store was broken some other way (by hand, say).
        Err(Unread::Missing) => Err(error(path, broken)),
        Err(Unread::Empty) => Err(error(
            path,
            format!("{broken} (its recovery copy {shown} is empty: no save was cut short)"),
        )),
        Err(Unread::Broken(why) | Unread::Failed(why)) => Err(error(
            path,
            format!("{broken}; its recovery copy {shown} does not read either: {why}"),
        )),
    }
}

/// Why a file of the store gave no rules.
enum Unread {
    /// It does not exist.
    Missing,
    /// It holds nothing: a recovery copy between saves, or a store a save cut short.
    Empty,
    /// Its text is not rules (or not text): what a save cut short may leave.
    Broken(String),
    /// It could not be read at all (not a plain file, a link where none may be, too large, ...).
    Failed(String),
}

/// Whether a file of the store is read through a link in its place.
#[derive(Clone, Copy)]
enum Links {
    /// The store itself: a person may link it to a store kept elsewhere (saves refuse it).
    Followed,
    /// The recovery copy: agentloop makes it and keeps it from the model's processes, so a link
    /// in its place is not agentloop's.
    Refused,
}

/// The rules in the plain file at `path`.
fn read_rules(path: &Path, links: Links) -> Result<Vec<PermissionRule>, Unread> {
    let mut options = File::options();
    options.read(true);
    let opened = match links {
        Links::Followed => open_plain_with(path, &mut options, libc::O_NONBLOCK),
        Links::Refused => open_plain(path, &mut options),
    };
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Unread::Missing),
        Err(e) => return Err(Unread::Failed(e.to_string())),
    };
    let text = match crate::text_file::read_bounded(file, MAX_AGENT_TEXT_BYTES) {
        Ok(text) => text,
        Err(TextFileError::NotUtf8) => {
            return Err(Unread::Broken(TextFileError::NotUtf8.to_string()));
        }
        Err(e) => return Err(Unread::Failed(e.to_string())),
    };
    if text.is_empty() {
        return Err(Unread::Empty);
    }
    serde_json::from_str::<SavedRules>(&text)
        .map(|s| s.rules)
        .map_err(|e| Unread::Broken(e.to_string()))
}

/// Opens `path` with `options`, refusing a link in its place (`O_NOFOLLOW`) and anything but a
/// plain file (`O_NONBLOCK`: a FIFO would otherwise block the open, and with it the run, for
/// ever).
fn open_plain(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<File> {
    open_plain_with(path, options, libc::O_NOFOLLOW | libc::O_NONBLOCK)
}

/// Opens `path` with `options` and these open flags, refusing anything but a plain file.
fn open_plain_with(
    path: &Path,
    options: &mut std::fs::OpenOptions,
    flags: i32,
) -> std::io::Result<File> {
    let file = options
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other(format!(
                "{} is a link: agentloop writes the permission store's files only where they \
                 are, never where a link leads",
                agentloop::printable::path(path)
            )),
            _ => e,
        })?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a plain file",
            agentloop::printable::path(path)
        )));
    }
    Ok(file)
}

/// Creates the store at `path` holding no rule (what a missing store means), its folders, its
/// lock and its empty recovery copy, each unless it exists: a process that may write where
/// they go could otherwise create the store or its copy with rules of its own, or put a FIFO or
/// a link where the lock goes, while an existing file can be kept read-only for it. Saves write
/// these same files in place, so what the processes' views keep stays the store.
pub fn create_empty(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if let Some(mut f) = create_new(path)? {
        let text =
            serde_json::to_string_pretty(&SavedRules::default()).map_err(std::io::Error::other)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    create_new(&next_path(path))?;
    create_new(&lock_path(path)).map(drop)
}

/// A new empty file at `path`, or none when something is there already (a link is never
/// followed: `create_new` refuses any).
fn create_new(path: &Path) -> std::io::Result<Option<File>> {
    match File::options().write(true).create_new(true).open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e),
    }
}

/// `<store><suffix>`: the store's lock and recovery copy sit beside it.
fn beside(store: &Path, suffix: &str) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The store's lock file: `<store>.lock`.
fn lock_path(store: &Path) -> PathBuf {
    beside(store, ".lock")
}

/// The store's recovery copy: `<store>.next`, whole while a save writes the store, else empty.
fn next_path(store: &Path) -> PathBuf {
    beside(store, ".next")
}

/// The files a store keeps beside it, as much the store as its own file (kept from the
/// processes alike): its lock (`<store>.lock`) and its recovery copy (`<store>.next`).
pub fn side_files(store: &Path) -> [PathBuf; 2] {
    [lock_path(store), next_path(store)]
}

/// Opens the lock file, creating it when missing. A link is refused, not followed (agentloop
/// would otherwise create or lock a file wherever it leads), and so is anything but a plain file:
/// a FIFO would block the open, and with it the answer and the run, for ever.
fn open_lock(path: &Path) -> std::io::Result<File> {
    open_plain(
        path,
        File::options().create(true).truncate(false).write(true),
    )
}

/// The lock file when it is there as a plain file, opened to be locked shared (as
/// [`open_lock`], created never).
fn existing_lock(path: &Path) -> Option<File> {
    open_plain(path, File::options().read(true)).ok()
}

/// Replaces the content of the plain file at `path` with `text`, in place (the same inode: the
/// processes' views bind it), and syncs it; the file is created when missing.
fn write_in_place(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let mut file = open_plain(
        path,
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600),
    )?;
    // Truncated only once known to be a plain file (opening with O_TRUNC would not wait).
    file.set_len(0)?;
    file.write_all(text)?;
    file.sync_all()
}

fn error(path: &Path, message: impl Into<String>) -> PermissionStoreError {
    PermissionStoreError {
        path: agentloop::printable::path(path),
        message: message.into(),
    }
}

/// `kept` with each of `answers` in it: an answer replaces the kept rule of the same tool and
/// arguments, in its place; a new one goes at the end.
fn merge(mut kept: Vec<PermissionRule>, answers: &[PermissionRule]) -> Vec<PermissionRule> {
    for answer in answers {
        let same = |r: &PermissionRule| r.tool == answer.tool && r.arguments == answer.arguments;
        match kept.iter_mut().find(|r| same(r)) {
            Some(r) => *r = answer.clone(),
            None => kept.push(answer.clone()),
        }
    }
    kept
}

impl SaveRules for RulesFile {
    fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError> {
        let path = &self.path;
        let io = |e: std::io::Error| error(path, e.to_string());
        let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => dir.to_path_buf(),
            None => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let lock_file = lock_path(path);
        let lock = open_lock(&lock_file).map_err(io)?;
        // Held until `lock` is dropped at the end of this function (closing the file releases it).
        if !take(&lock, false, SAVE_WAIT).map_err(io)? {
            return Err(error(
                path,
                format!(
                    "its lock {} has been held by another process for over {} s: the answer is \
                     not saved",
                    agentloop::printable::path(&lock_file),
                    SAVE_WAIT.as_secs()
                ),
            ));
        }
        let merged = merge(read(path)?, rules);
        let text = serde_json::to_string_pretty(&SavedRules { rules: merged })
            .map_err(|e| error(path, e.to_string()))?;
        // The copy whole first: a crash while the store is written leaves it to be read instead.
        let next = next_path(path);
        write_in_place(&next, text.as_bytes()).map_err(io)?;
        write_in_place(path, text.as_bytes()).map_err(io)?;
        // Emptied once the store is whole, so that a store broken later (by hand) is an error
        // rather than quietly replaced by this older copy.
        write_in_place(&next, b"").map_err(io)?;
        // A file created by this save is made durable by syncing the folder that holds it.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        drop(lock);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn answer(tool: &str, permission: Permission) -> PermissionRule {
        PermissionRule {
            tool: tool.into(),
            arguments: None,
            permission,
        }
    }

    #[test]
    fn a_save_merges_into_what_another_store_saved_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let mut first = open(&path, Permission::Ask).unwrap();
        let mut second = open(&path, Permission::Ask).unwrap();
        first.remember("a", Permission::Allow).unwrap();
        second.remember("b", Permission::Deny).unwrap();
        first.remember("a", Permission::Deny).unwrap();
        assert_eq!(
            open(&path, Permission::Ask).unwrap().rules(),
            &[answer("a", Permission::Deny), answer("b", Permission::Deny)]
        );
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.ends_with(".tmp")),
            "no temporary file is left: {names:?}"
        );
    }

    #[test]
    fn a_store_that_does_not_parse_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let mut store = open(&path, Permission::Ask).unwrap();
        std::fs::write(&path, "{ not json").unwrap();
        let err = store.remember("a", Permission::Allow).unwrap_err();
        assert!(err.message.contains("key must be a string"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    }

    /// A save writes the store in place: its inode (what a process's read-only bind holds) is
    /// the one made before the run, and so is its recovery copy's, left empty.
    #[test]
    fn a_save_keeps_the_store_and_its_copy_the_files_they_were() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        create_empty(&path).unwrap();
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let before = (inode(&path), inode(&next_path(&path)));
        let mut store = open(&path, Permission::Ask).unwrap();
        store.remember("a", Permission::Allow).unwrap();
        store.remember("b", Permission::Deny).unwrap();
        assert_eq!(before, (inode(&path), inode(&next_path(&path))));
        assert_eq!(std::fs::read(next_path(&path)).unwrap(), b"");
        assert_eq!(
            open(&path, Permission::Ask).unwrap().rules(),
            &[
                answer("a", Permission::Allow),
                answer("b", Permission::Deny)
            ]
        );
    }

    /// A save cut short while it wrote the store (the store half-written, the copy whole) loses
    /// no answer: the copy is read, and the next save mends the store from it. With the copy
    /// broken too, or empty (no save was cut short: a store broken by hand), the error names
    /// both files and nothing is overwritten.
    #[test]
    fn a_store_a_save_cut_short_is_read_from_its_copy_and_a_broken_pair_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let next = next_path(&path);
        create_empty(&path).unwrap();
        let mut store = open(&path, Permission::Ask).unwrap();
        store.remember("a", Permission::Allow).unwrap();
        let whole = serde_json::to_string_pretty(&SavedRules {
            rules: vec![
                answer("a", Permission::Allow),
                answer("b", Permission::Deny),
            ],
        })
        .unwrap();
        std::fs::write(&next, &whole).unwrap();
        std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
        let mut store = open(&path, Permission::Ask).unwrap();
        assert_eq!(
            store.rules(),
            &[
                answer("a", Permission::Allow),
                answer("b", Permission::Deny)
            ]
        );
        store.remember("c", Permission::Allow).unwrap();
        let mended: SavedRules =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(mended.rules.len(), 3, "{:?}", mended.rules);
        assert_eq!(std::fs::read(&next).unwrap(), b"");

        // Both broken: the error names the store and its copy, and neither is written.
        std::fs::write(&path, "{ not json").unwrap();
        std::fs::write(&next, "{\"rules\": [").unwrap();
        let err = open(&path, Permission::Ask).unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("permissions.json"), "{shown}");
        assert!(shown.contains("permissions.json.next"), "{shown}");
        assert!(shown.contains("key must be a string"), "{shown}");
        assert!(store.remember("d", Permission::Allow).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
        assert_eq!(std::fs::read_to_string(&next).unwrap(), "{\"rules\": [");

        // A store broken by hand, its copy empty: an error, not the copy's older rules.
        std::fs::write(&next, "").unwrap();
        let err = open(&path, Permission::Ask).unwrap_err().to_string();
        assert!(err.contains("permissions.json.next is empty"), "{err}");
    }

    /// A link where the recovery copy goes is never read, nor is any written through: a store
    /// that is a link is read where it leads (a person may keep it elsewhere) but a save
    /// refuses it, rather than truncate and write whatever file the link leads to.
    #[test]
    fn a_link_in_place_of_the_store_or_its_copy_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(
            &elsewhere,
            r#"{"rules": [{"tool": "*", "permission": "allow"}]}"#,
        )
        .unwrap();
        create_empty(&path).unwrap();
        std::fs::write(&path, "{ torn").unwrap();
        std::fs::remove_file(next_path(&path)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, next_path(&path)).unwrap();
        let err = open(&path, Permission::Ask).unwrap_err().to_string();
        assert!(err.contains("is a link"), "{err}");
        std::fs::remove_file(next_path(&path)).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let mut store = open(&path, Permission::Ask).unwrap();
        assert_eq!(store.rules(), &[answer("*", Permission::Allow)]);
        let err = store
            .remember("a", Permission::Deny)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a link"), "{err}");
        assert!(
            std::fs::read_to_string(&elsewhere).unwrap().contains("*"),
            "nothing written where the link leads"
        );
    }

    /// A lock another process holds for longer than a save takes (a process of the model's may
    /// open the lock, read-only in its view, and `flock` it) delays a reader a moment and fails
    /// a save after a while: neither hangs, and once it is let go a save goes through.
    #[test]
    fn a_lock_another_process_holds_delays_a_reader_and_fails_a_save_never_hangs() {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        create_empty(&path).unwrap();
        open(&path, Permission::Ask)
            .unwrap()
            .remember("a", Permission::Allow)
            .unwrap();
        let mut holder = std::process::Command::new("python3")
            .args(["-c", "import fcntl, sys, time\nf = open(sys.argv[1])\n\
                          fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n"])
            .arg(lock_path(&path))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut said)
            .unwrap();
        assert_eq!(said.trim(), "held");
        let started = std::time::Instant::now();
        let mut store = open(&path, Permission::Ask).unwrap();
        assert_eq!(store.rules(), &[answer("a", Permission::Allow)]);
        let waited = started.elapsed();
        assert!(waited >= READ_WAIT && waited < READ_WAIT * 5, "{waited:?}");
        let started = std::time::Instant::now();
        let err = store
            .remember("b", Permission::Deny)
            .unwrap_err()
            .to_string();
        let waited = started.elapsed();
        assert!(err.contains("held by another process"), "{err}");
        assert!(waited >= SAVE_WAIT && waited < SAVE_WAIT * 3, "{waited:?}");
        holder.kill().unwrap();
        holder.wait().unwrap();
        store.remember("b", Permission::Deny).unwrap();
        assert_eq!(
            open(&path, Permission::Ask).unwrap().rules(),
            &[
                answer("a", Permission::Allow),
                answer("b", Permission::Deny)
            ]
        );
    }

    /// A FIFO or a link put where the lock goes (by a process that could write the store's
    /// folder before the lock existed) makes the save fail at once: it neither blocks on the
    /// FIFO for ever (holding the run) nor creates a file where the link leads.
    #[test]
    fn a_lock_that_is_a_fifo_or_a_link_fails_the_save_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let lock = dir.path().join("permissions.json.lock");
        let made = std::process::Command::new("mkfifo")
            .arg(&lock)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let saving = path.clone();
        std::thread::spawn(move || {
            let mut store = open(&saving, Permission::Ask).unwrap();
            let _ = tx.send(store.remember("a", Permission::Allow));
        });
        let saved = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the save blocked on a FIFO");
        // Refused at the open (no reader: ENXIO) or after it (a reader: not a plain file).
        assert!(saved.is_err(), "{saved:?}");
        std::fs::remove_file(&lock).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, &lock).unwrap();
        let mut store = open(&path, Permission::Ask).unwrap();
        assert!(store.remember("a", Permission::Allow).is_err());
        assert!(!elsewhere.exists(), "created where the link leads");
        assert!(!path.exists(), "nothing saved without the lock");
    }

    /// Many writers at once, each its own store on the same file (as separate processes would
    /// be: the lock is taken on a file each opens itself), while a reader keeps reading as a
    /// run's start does (under the lock, shared): every answer is kept and the reader always
    /// finds whole rules.
    #[test]
    fn concurrent_writers_lose_no_answer_and_the_file_always_parses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("permissions.json");
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    load(&path).unwrap_or_else(|e| panic!("a torn store file: {e}"));
                    reads += 1;
                }
                reads
            })
        };
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut store = open(&path, Permission::Ask).unwrap();
                    for i in 0..10 {
                        store
                            .remember(&format!("tool_{w}_{i}"), Permission::Allow)
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        assert!(reader.join().unwrap() > 0, "the reader read the file");
        let rules = open(&path, Permission::Ask).unwrap().rules().to_vec();
        assert_eq!(rules.len(), 80, "{rules:?}");
        for w in 0..8 {
            for i in 0..10 {
                assert!(
                    rules.contains(&answer(&format!("tool_{w}_{i}"), Permission::Allow)),
                    "tool_{w}_{i} was lost"
                );
            }
        }
    }
}
