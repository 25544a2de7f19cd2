//! The permission store's file: the "always" answers a person gave, kept as JSON
//! (`{"rules": [...]}`) so that later runs ask nobody again. The core's store decides; this file
//! only remembers.
//!
//! Two processes (two `agentloop` runs of one agent) may answer at once. A save therefore takes an
//! advisory lock on a file of its own beside the store (`<store>.lock`; the store itself is
//! replaced on every save, so a lock on it would not hold), reads the store again under the lock,
//! merges its answers into what it finds (an answer replaces the rule of the same tool and
//! arguments; every other rule stays), writes a uniquely named temporary file in the same folder,
//! syncs it to disk and renames it over the store. Neither process loses the other's answer, and a
//! reader never sees a half-written file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::permissions::{
    Permission, PermissionRule, PermissionStore, PermissionStoreError, SaveRules,
};
use serde::{Deserialize, Serialize};

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
    let rules = read(&path)?;
    Ok(PermissionStore::with_saved(
        rules,
        fallback,
        Arc::new(RulesFile { path }),
    ))
}

/// The rules kept in `path`; none when the file does not exist.
fn read(path: &Path) -> Result<Vec<PermissionRule>, PermissionStoreError> {
    match crate::text_file::read_text(path, crate::text_file::MAX_AGENT_TEXT_BYTES) {
        Ok(text) => serde_json::from_str::<SavedRules>(&text)
            .map(|s| s.rules)
            .map_err(|e| error(path, e.to_string())),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(error(path, e.to_string())),
    }
}

/// Creates the store at `path` holding no rule (what a missing store means), its folders and
/// its lock, each unless it exists: a process that may write where they go could otherwise
/// create the store with rules of its own, or put a FIFO or a link where the lock goes, while
/// an existing file can be kept read-only for it.
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

/// The store's lock file: `<store>.lock`.
fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Opens the lock file, creating it when missing. A link is refused, not followed (agentloop
/// would otherwise create or lock a file wherever it leads), and so is anything but a plain file:
/// a FIFO would block the open, and with it the answer and the run, for ever.
fn open_lock(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !lock.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "the lock {} is not a plain file",
            agentloop::printable::path(path)
        )));
    }
    Ok(lock)
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
        let lock = open_lock(&lock_path(path)).map_err(io)?;
        // Held until `lock` is dropped at the end of this function (closing the file releases it).
        fs4::fs_std::FileExt::lock_exclusive(&lock).map_err(io)?;
        let merged = merge(read(path)?, rules);
        let text = serde_json::to_string_pretty(&SavedRules { rules: merged })
            .map_err(|e| error(path, e.to_string()))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".permissions-")
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(io)?;
        tmp.write_all(text.as_bytes()).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        // On failure the temporary file is removed when `tmp` is dropped.
        tmp.persist(path).map_err(|e| io(e.error))?;
        // The rename itself is made durable by syncing the folder that holds it.
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
    /// be: the lock is taken on a file each opens itself), while a reader keeps reading: every
    /// answer is kept and the file always parses.
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
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        serde_json::from_str::<SavedRules>(&text)
                            .unwrap_or_else(|e| panic!("a torn store file: {e}: {text}"));
                        reads += 1;
                    }
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
