//! Owning a run: the operating system's lock on its file in the `<journal>.owners` folder (a
//! pool of such files kept for runs to come), taking a run over from an owner that died, and
//! at `process` the run's step log in the same file, folded into the SQLite file when the run
//! is let go. Apart from the journal's writes, which only call into it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use agentloop::RunOutcome;
use agentloop::journal::JournalError;
use futures::future::BoxFuture;

use super::writer::{Command, Fault, hang};
use super::{SqliteJournal, io, log};

/// A run this journal drives: its lock file, locked, which is also its step log at `process`.
pub(super) struct Owned {
    file: std::fs::File,
    log: Mutex<LogState>,
}

/// How far a run's step log has come.
#[derive(Default)]
struct LogState {
    /// Bytes written (none yet: the first write puts the header first).
    len: u64,
    /// The sequence number the next step must have, once known.
    next: Option<u64>,
    /// It holds steps the file does not.
    steps: bool,
}

impl SqliteJournal {
    /// Takes the run for this process: while this journal lives, another process's
    /// [`SqliteJournal::own`] of the same run fails with [`JournalError::Busy`] instead of
    /// racing it step for step. The lock is the operating system's (an advisory lock on a file
    /// in the `<journal>.owners` folder), so an owner that died leaves nothing that blocks the
    /// next one; the steps its step log holds (at `process`) are folded into the file first. A
    /// new run is owned when it begins; a resumed one must be owned first.
    pub fn own(&self, run_id: &str) -> Result<(), JournalError> {
        self.owned_run(run_id).map(drop)
    }

    /// [`SqliteJournal::own`], and the run's lock and log.
    fn owned_run(&self, run_id: &str) -> Result<Arc<Owned>, JournalError> {
        let mut owned = lock(&self.owned);
        if let Some(run) = owned.get(run_id) {
            return Ok(Arc::clone(run));
        }
        let path = log::file_of(&self.path, run_id);
        // A pooled file goes to the run's place when nothing is there (a hard link fails on an
        // existing name: never over a live owner's file or a dead one's log).
        let pooled = lock(&self.pool).pop();
        if let Some((at, file)) = pooled {
            match std::fs::hard_link(&at, &path) {
                // Linked from the file this handle holds (not one that took its name since).
                Ok(()) if is_at(&file, &path) => {
                    let _ = std::fs::remove_file(&at);
                    let run = Arc::new(Owned {
                        file,
                        log: Mutex::new(LogState::default()),
                    });
                    owned.insert(run_id.to_owned(), Arc::clone(&run));
                    return Ok(run);
                }
                // Another owner's file is at the run's place: the pooled one waits for the next.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    lock(&self.pool).push((at, file));
                }
                // Linked from another file at the pooled name: the link goes, and so does the
                // pooled file, whose name is no longer its own.
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                }
                // Gone (its folder deleted under this handle, say): it is let go.
                Err(_) => {}
            }
        }
        // An owner that lets a run go deletes its file while still holding the lock; whoever
        // opened that file before and locks it after holds a lock on a file no longer there,
        // and must take the one at the path instead. A few rounds settle any such race.
        for _ in 0..32 {
            if !self.folder_made.load(Ordering::Relaxed)
                && let Some(folder) = path.parent()
            {
                match std::fs::create_dir_all(folder) {
                    Ok(()) => {
                        self.folder_made.store(true, Ordering::Relaxed);
                        sweep(folder);
                    }
                    // Made and removed again between two looks (a file there is another
                    // matter: said with its name).
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AlreadyExists && !folder.is_file() =>
                    {
                        continue;
                    }
                    Err(e) => {
                        return Err(io(format!(
                            "cannot make the folder of the journal's run locks {}: {e}",
                            agentloop::printable::path(folder)
                        )));
                    }
                }
            }
            let file = {
                use std::os::unix::fs::OpenOptionsExt;
                match std::fs::OpenOptions::new()
                    .create(true)
                    .read(true)
                    .append(true)
                    .mode(crate::PRIVATE_MODE)
                    .open(&path)
                {
                    Ok(file) => file,
                    // The folder was deleted under this handle (by a person, or by an older
                    // agentloop with its last file): make it again.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        self.folder_made.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(io(e)),
                }
            };
            match fs4::fs_std::FileExt::try_lock_exclusive(&file) {
                Ok(true) if is_at(&file, &path) => {
                    self.take_over(&file, run_id)?;
                    if let Err(e) = self.take_over_former(run_id) {
                        // Not this handle's run after all: its file goes, as on release.
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                    let run = Arc::new(Owned {
                        file,
                        log: Mutex::new(LogState::default()),
                    });
                    owned.insert(run_id.to_owned(), Arc::clone(&run));
                    return Ok(run);
                }
                // Locked by an owner that has let the run go since this opened it (its file
                // was deleted or pooled): the file at the path now is the one to take.
                Ok(true) => continue,
                Ok(false) if !is_at(&file, &path) => continue,
                Ok(false) => {
                    return Err(JournalError::Busy {
                        run_id: run_id.to_owned(),
                    });
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(io(format!(
            "{} kept changing while it was being locked",
            agentloop::printable::path(&path)
        )))
    }

    /// Folds what a dead owner's step log holds (the run it names may be another whose id
    /// shares the file's name) into the file, then empties the log for this owner. Waits for
    /// the file as the writer thread does: this only happens to a run taken after a crash.
    ///
    /// A log damaged after it was written (a frame that fails its check with more after it, or
    /// bytes that are no log) is refused as [`JournalError::Damaged`] and left as it is: taking
    /// its intact part as the whole would run the lost steps' tool calls again.
    fn take_over(&self, file: &std::fs::File, run_id: &str) -> Result<(), JournalError> {
        let bytes = read_log(file, None)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let shown = || agentloop::printable::path(&log::file_of(&self.path, run_id));
        match log::parse(&bytes) {
            Some(log::Read {
                run_id: logged_run,
                steps,
                damage: Some(damage),
            }) => {
                // Only to number the first lost step: a file that cannot say counts none.
                let stored = self.writer.stored(&logged_run).unwrap_or(0);
                return Err(JournalError::Damaged {
                    step: Some(log::count(stored, &steps)),
                    run_id: logged_run,
                    reason: format!(
                        "its step log {} is damaged ({damage}): the steps from there on cannot \
                         be read; the log is left as it was",
                        shown()
                    ),
                });
            }
            Some(read) => self.fold(read.run_id, read.steps)?,
            None if log::is_foreign(&bytes) => {
                let what = if log::is_other_version(&bytes) {
                    "a step log in a format this version does not read (a newer agentloop's)"
                        .to_owned()
                } else {
                    format!("{} bytes that are no step log", bytes.len())
                };
                return Err(JournalError::Damaged {
                    run_id: run_id.to_owned(),
                    step: None,
                    reason: format!(
                        "its lock file {} holds {what}; it is left as it was",
                        shown()
                    ),
                });
            }
            None => {}
        }
        file.set_len(0).map_err(io)
    }

    /// Takes the log the version before digested file names left for run `run_id` under its
    /// former name ([`log::former_file_of`]), as a dead owner's is taken: folded, then deleted
    /// while locked. A live owner of the same run there (that version, still running it) makes
    /// the run [`JournalError::Busy`]; another run's file, live, is left alone.
    fn take_over_former(&self, run_id: &str) -> Result<(), JournalError> {
        let Some(former) = log::former_file_of(&self.path, run_id) else {
            return Ok(());
        };
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&former)
        else {
            return Ok(());
        };
        match fs4::fs_std::FileExt::try_lock_exclusive(&file) {
            Ok(true) if is_at(&file, &former) => {
                self.take_over(&file, run_id)?;
                let _ = std::fs::remove_file(&former);
                Ok(())
            }
            Ok(false) if log::run_of(&former).as_deref() == Some(run_id) => {
                Err(JournalError::Busy {
                    run_id: run_id.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Lets run `run_id` go (done by itself when the run finishes or suspends): the steps its
    /// step log holds that the file does not are folded into the file first (when that fails,
    /// they stay in the log, which is unlocked for the next owner); then its lock file is
    /// deleted, then unlocked, so that a journal of many runs leaves no file per run behind.
    /// The owners' folder stays (the next run's lock goes in it; making and removing it with
    /// each run was 7% of a journaled run's CPU), also after the handle is dropped.
    ///
    /// The file is kept for the next run this handle takes instead when it can be: emptied,
    /// still locked, and renamed out of the run's place (see the `pool` field).
    pub fn release(&self, run_id: &str) {
        let unfolded = lock(&self.owned)
            .get(run_id)
            .is_some_and(|run| lock(&run.log).steps);
        if unfolded && self.fold_now(run_id).is_err() {
            drop(lock(&self.owned).remove(run_id));
            return;
        }
        let Some(run) = lock(&self.owned).remove(run_id) else {
            return;
        };
        // Another process may take the run on from here: what the writer knew of it is stale.
        self.writer.forget(run_id);
        let path = log::file_of(&self.path, run_id);
        if let Ok(run) = Arc::try_unwrap(run) {
            let written = lock(&run.log).len;
            let mut pool = lock(&self.pool);
            if pool.len() < POOL_MOST && (written == 0 || run.file.set_len(0).is_ok()) {
                let at = pool_name(&self.path);
                if std::fs::rename(&path, &at).is_ok() {
                    pool.push((at, run.file));
                    return;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    /// Writes `steps` (numbered from `seq`) to run `run_id`'s step log in one frame: one
    /// `write`, after which a kill of the process loses none of them (the `process` level).
    pub(super) fn log(&self, run_id: &str, seq: u64, steps: &[String]) -> Result<(), JournalError> {
        let run = self.owned_run(run_id)?;
        let mut state = lock(&run.log);
        let expected = match state.next {
            Some(next) => next,
            None => self.writer.take_on(run_id, self.durability)?,
        };
        if seq != expected {
            return Err(io(format!(
                "run {run_id}: step {seq} written out of order (expected step {expected})"
            )));
        }
        let mut bytes = Vec::with_capacity(64 + steps.iter().map(|s| s.len() + 12).sum::<usize>());
        if state.len == 0 {
            log::header(run_id, &mut bytes).map_err(io)?;
        }
        let mut cuts = Vec::new();
        log::frame(
            (seq..).zip(steps.iter().map(String::as_str)),
            &mut bytes,
            self.fault.is_some().then_some(&mut cuts),
        )
        .map_err(io)?;
        // The steps' places among the writer's appends, taken at once (runs log from several
        // threads).
        let nth = self
            .fault
            .map(|_| self.writer.count_logged(steps.len() as u64));
        if let Some(nth) = nth {
            self.fault_in(seq, nth, &run.file, &bytes, &cuts);
        }
        if let Err(e) = (&run.file).write_all(&bytes) {
            // A write cut short (a full disk) leaves no torn frame for the next one to follow.
            let _ = run.file.set_len(state.len);
            return Err(io(e));
        }
        state.len += bytes.len() as u64;
        state.next = Some(seq + steps.len() as u64);
        state.steps = true;
        if let (Some(fault), Some(nth)) = (self.fault, nth) {
            for i in 0..steps.len() as u64 {
                match fault {
                    Fault::AfterStep(n) if n == seq + i => hang(&format!("after step {n}")),
                    Fault::AfterWrite(n) if n == nth + i => hang(&format!("after write {n}")),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The crash tests' faults inside a step log's write: the frame is cut short inside the
    /// step, and the process waits to be killed.
    fn fault_in(&self, seq: u64, nth: u64, file: &std::fs::File, bytes: &[u8], cuts: &[usize]) {
        for (i, cut) in (0u64..).zip(cuts) {
            let inside = match self.fault {
                Some(Fault::InStep(s)) => s == seq + i,
                Some(Fault::InWrite(w)) => w == nth + i,
                _ => false,
            };
            if inside {
                let _ = (&*file).write_all(bytes.get(..cut + 6).unwrap_or(bytes));
                hang(&format!("in the write of step {}", seq + i));
            }
        }
    }

    /// The steps run `run_id`'s step log holds that the file may not, for the write that folds
    /// them in.
    /// The run is taken first ([`SqliteJournal::own`]) when it is not this journal's yet, as
    /// `append` takes it.
    pub(super) fn logged(&self, run_id: &str) -> Result<log::Logged, JournalError> {
        let run = self.owned_run(run_id)?;
        let state = lock(&run.log);
        if !state.steps {
            return Ok(Vec::new());
        }
        let bytes = read_log(&run.file, Some(state.len))?;
        Ok(log::parse(&bytes).map(|r| r.steps).unwrap_or_default())
    }

    /// Runs `done` (a write that ends this process's part in run `run_id`, with the steps of
    /// its step log), then lets the run go when it was written.
    pub(super) fn then_release<'a>(
        &'a self,
        run_id: &'a str,
        done: BoxFuture<'a, Result<(), JournalError>>,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async move {
            done.await?;
            if let Some(run) = lock(&self.owned).get(run_id) {
                lock(&run.log).steps = false;
            }
            self.release(run_id);
            Ok(())
        })
    }

    /// Ends run `run_id` with `outcome` in one write: its logged steps, `last` (the step that
    /// ended it, when one did) and the end are committed all or none; then the run is let go.
    pub(super) fn end_run<'a>(
        &'a self,
        run_id: &'a str,
        outcome: &'a RunOutcome,
        last: Option<(u64, String)>,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let logged = match self.logged(run_id) {
            Ok(logged) => logged,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        self.then_release(
            run_id,
            self.send(Command::Finish {
                run_id: run_id.to_owned(),
                stop_reason: outcome.stop_reason.as_str().to_owned(),
                logged,
                last,
            }),
        )
    }

    /// Folds the steps of run `run_id`'s step log into the file now, on this thread (waiting
    /// for the file as the writer thread does): for a run let go unfinished.
    fn fold_now(&self, run_id: &str) -> Result<(), JournalError> {
        self.fold(run_id.to_owned(), self.logged(run_id)?)?;
        if let Some(run) = lock(&self.owned).get(run_id) {
            lock(&run.log).steps = false;
        }
        Ok(())
    }

    /// Commits `logged`, steps of run `run_id` read from a step log, into the file on this
    /// thread: waiting for the file as the writer thread does (a fold answers no run's step).
    fn fold(&self, run_id: String, logged: log::Logged) -> Result<(), JournalError> {
        if logged.is_empty() {
            return Ok(());
        }
        self.writer
            .commit_now(Command::Fold { run_id, logged }, self.durability)
    }
}

/// The most lock files a handle keeps for runs to come: as many as the runs it drives at once,
/// within reason.
const POOL_MOST: usize = 256;

/// A new name for a pooled lock file in the owners' folder of the journal at `journal`: unique
/// in the process, and never a run's (run files' names have no leading dot).
fn pool_name(journal: &Path) -> PathBuf {
    // Unique across processes too: two of them may share a process id (containers sharing the
    // journal's volume), and a rename onto another's pooled file would take its name.
    log::folder(journal).join(format!(".pool-{}.lock", agentloop::ids::run_id()))
}

/// Deletes the pooled lock files that no live handle holds (a process that died with some).
pub(super) fn sweep(folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with(".pool-") {
            continue;
        }
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path)
            && matches!(fs4::fs_std::FileExt::try_lock_exclusive(&file), Ok(true))
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A step log's bytes (its first `len`, when known).
fn read_log(file: &std::fs::File, len: Option<u64>) -> Result<Vec<u8>, JournalError> {
    use std::os::unix::fs::FileExt;
    let len = match len {
        Some(len) => len,
        None => file.metadata().map_err(io)?.len(),
    };
    let mut bytes = vec![0; usize::try_from(len).map_err(io)?];
    file.read_exact_at(&mut bytes, 0).map_err(io)?;
    Ok(bytes)
}

/// The name of the lock file of `id` (a run's, a session's): the id itself when it is safe in
/// a file name, else a bounded digest of it.
pub(crate) fn lock_name(id: &str) -> String {
    log::name_of(id)
}

/// True when `file` is the file at `path` now (not one deleted or replaced since it was opened).
pub(crate) fn is_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(there)) => open.dev() == there.dev() && open.ino() == there.ino(),
        _ => false,
    }
}
