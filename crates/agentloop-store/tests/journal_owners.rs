#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One owner per run: handles of one journal file (as separate processes would hold them) take a
//! run in turn, never two at once, while each one that lets it go moves its lock file out of the
//! run's place (to keep it for its next run); a journal whose handles are all dropped leaves no
//! lock file behind, and its owners' folder stays for the handles still open elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use agentloop::journal::JournalError;
use agentloop_store::SqliteJournal;

#[test]
fn handles_take_a_run_in_turn_and_leave_no_lock_file_behind() {
    let dir = std::env::temp_dir().join(format!("agentloop-owners-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let holders = Arc::new(AtomicU32::new(0));
    let taken = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (path, holders, taken) = (path.clone(), holders.clone(), taken.clone());
            std::thread::spawn(move || {
                let journal = SqliteJournal::open(&path).unwrap();
                for _ in 0..200 {
                    match journal.own("run-1") {
                        Ok(()) => {
                            assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two owners");
                            taken.fetch_add(1, Ordering::SeqCst);
                            std::thread::yield_now();
                            holders.fetch_sub(1, Ordering::SeqCst);
                            journal.release("run-1");
                        }
                        Err(JournalError::Busy { .. }) => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(taken.load(Ordering::SeqCst) > 0);
    let owners = dir.join("runs.db.owners");
    assert_eq!(
        std::fs::read_dir(&owners).map(|d| d.count()).ok(),
        Some(0),
        "the folder stays, empty"
    );

    // Owned and not let go: the file is there while the handle lives, gone when it is dropped.
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-2").unwrap();
    assert!(owners.join("run-2.lock").is_file());
    let other = SqliteJournal::open(&path).unwrap();
    assert!(matches!(other.own("run-2"), Err(JournalError::Busy { .. })));
    drop(journal);
    assert!(!owners.join("run-2.lock").exists());
    other.own("run-2").unwrap();
    drop(other);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The names in the owners' folder: the runs' lock files, and how many pooled ones.
fn listed(owners: &std::path::Path) -> (Vec<String>, usize) {
    let mut runs = Vec::new();
    let mut pooled = 0;
    for entry in std::fs::read_dir(owners).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with(".pool-") {
            pooled += 1;
        } else {
            runs.push(name);
        }
    }
    runs.sort();
    (runs, pooled)
}

#[test]
fn a_run_let_go_leaves_its_lock_file_to_the_handles_next_run_and_nothing_when_it_is_dropped() {
    let dir = std::env::temp_dir().join(format!("agentloop-owners-keep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let owners = dir.join("runs.db.owners");
    // What a process that died with pooled files leaves: no live handle holds them.
    std::fs::create_dir_all(&owners).unwrap();
    std::fs::write(owners.join(".pool-4000000-7.lock"), "").unwrap();
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-a").unwrap();
    assert_eq!(listed(&owners), (vec!["run-a.lock".to_owned()], 0));
    journal.release("run-a");
    // The run's lock file leaves the run's place, still locked, for this handle's next run.
    assert_eq!(listed(&owners), (Vec::new(), 1));
    // Another handle (as another process would) neither takes nor deletes it.
    let other = SqliteJournal::open(&path).unwrap();
    other.own("run-x").unwrap();
    other.release("run-x");
    drop(other);
    assert_eq!(listed(&owners), (Vec::new(), 1));
    journal.own("run-b").unwrap();
    assert_eq!(listed(&owners), (vec!["run-b.lock".to_owned()], 0));
    let other = SqliteJournal::open(&path).unwrap();
    assert!(matches!(other.own("run-b"), Err(JournalError::Busy { .. })));
    // A handle dropped while another's run is in the folder leaves both alone.
    drop(other);
    assert!(owners.join("run-b.lock").is_file());
    journal.release("run-b");
    drop(journal);
    assert_eq!(listed(&owners), (Vec::new(), 0));

    // A folder taken away under a handle (deleted by hand while a run was owned) is made again
    // by its next run.
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-c").unwrap();
    std::fs::remove_dir_all(&owners).unwrap();
    journal.release("run-c");
    journal.own("run-d").unwrap();
    assert_eq!(listed(&owners), (vec!["run-d.lock".to_owned()], 0));
    // And so is a folder taken away with a pooled file in it.
    journal.release("run-d");
    assert_eq!(listed(&owners), (Vec::new(), 1));
    std::fs::remove_dir_all(&owners).unwrap();
    journal.own("run-e").unwrap();
    assert_eq!(listed(&owners), (vec!["run-e.lock".to_owned()], 0));
    drop(journal);
    assert_eq!(listed(&owners), (Vec::new(), 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pooled_name_another_process_took_over_is_never_linked_to_a_run() {
    let dir = std::env::temp_dir().join(format!("agentloop-owners-pool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let owners = dir.join("runs.db.owners");
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-a").unwrap();
    journal.release("run-a");
    // Another process renames a file of its own onto this handle's pooled name (as one with
    // the same process id, in another container sharing the folder, could).
    let pooled = std::fs::read_dir(&owners)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".pool-")
        })
        .unwrap();
    let theirs = owners.join("theirs.tmp");
    std::fs::write(&theirs, "theirs").unwrap();
    std::fs::rename(&theirs, &pooled).unwrap();
    // The next run gets a lock file of its own, locked by this handle, and theirs is left be.
    journal.own("run-c").unwrap();
    assert_eq!(std::fs::read(owners.join("run-c.lock")).unwrap(), b"");
    assert_eq!(std::fs::read(&pooled).unwrap(), b"theirs");
    let other = SqliteJournal::open(&path).unwrap();
    assert!(matches!(other.own("run-c"), Err(JournalError::Busy { .. })));
    drop((other, journal));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handle's owners' folder is made when it opens, before its process starts any tool, whose
/// view keeps it read-only only if it is there then: another handle of the file (another
/// process's) dropped in between must not take it away, or the folder made again at the first
/// run owned would be the tools' to write (a planted step log is folded into the journal).
#[test]
fn a_dropped_handle_leaves_the_folder_another_handle_made() {
    let dir = std::env::temp_dir().join(format!("agentloop-owners-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let owners = dir.join("runs.db.owners");
    let ours = SqliteJournal::open(&path).unwrap();
    assert!(owners.is_dir());
    let theirs = SqliteJournal::open(&path).unwrap();
    theirs.own("their-run").unwrap();
    theirs.release("their-run");
    drop(theirs);
    assert!(
        owners.is_dir(),
        "the owners' folder went with another handle"
    );
    ours.own("our-run").unwrap();
    assert!(owners.join("our-run.lock").is_file());
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}
