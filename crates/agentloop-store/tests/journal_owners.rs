#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One owner per run: handles of one journal file (as separate processes would hold them) take a
//! run in turn, never two at once, while each one that lets it go deletes its lock file; and a
//! journal whose runs are all let go leaves no owners' folder behind.

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
    assert!(
        !owners.exists(),
        "{:?}",
        std::fs::read_dir(&owners).map(|d| d.count())
    );

    // Owned and not let go: the file is there while the handle lives, gone when it is dropped.
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-2").unwrap();
    assert!(owners.join("run-2.lock").is_file());
    let other = SqliteJournal::open(&path).unwrap();
    assert!(matches!(other.own("run-2"), Err(JournalError::Busy { .. })));
    drop(journal);
    assert!(!owners.exists());
    other.own("run-2").unwrap();
    drop(other);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_owners_folder_lives_with_the_handle_and_comes_back_when_another_takes_it() {
    let dir = std::env::temp_dir().join(format!("agentloop-owners-keep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runs.db");
    let owners = dir.join("runs.db.owners");
    let journal = SqliteJournal::open(&path).unwrap();
    journal.own("run-a").unwrap();
    journal.release("run-a");
    // The run's lock file goes with the run; the folder stays for the next run.
    assert!(owners.is_dir());
    assert_eq!(std::fs::read_dir(&owners).unwrap().count(), 0);

    // Another handle (as another process would) that finds the folder empty takes it away: this
    // handle's next run makes it again, instead of failing on the folder it thought was there.
    drop(SqliteJournal::open(&path).unwrap());
    assert!(!owners.exists());
    journal.own("run-b").unwrap();
    assert!(owners.join("run-b.lock").is_file());
    let other = SqliteJournal::open(&path).unwrap();
    assert!(matches!(other.own("run-b"), Err(JournalError::Busy { .. })));
    // A handle dropped while another's run is in the folder leaves both alone.
    drop(other);
    assert!(owners.join("run-b.lock").is_file());
    drop(journal);
    assert!(!owners.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
