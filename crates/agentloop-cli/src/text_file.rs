//! Reading the text files a command is pointed at (an agent file, its instructions and script,
//! the permission store, `--input-file`) within a bound, and only from regular files.
//!
//! `std::fs::read_to_string` reads whatever the path names until it ends: `/dev/zero` or
//! `/dev/urandom` never end (the process grows until the system kills it), and opening a FIFO
//! waits for a writer that may never come. Each of those is a path a user can give by mistake
//! (a typo, a link that points elsewhere), so it must get an error, not a hang.

use std::io::Read;
use std::path::Path;

/// The largest agent file, instructions file, script or permission store read: far beyond any
/// real one (the quickstart's are under 2 KiB), and small enough to read and check promptly.
pub const MAX_AGENT_TEXT_BYTES: u64 = 16 * 1024 * 1024;

/// The largest input read from `--input-file` or stdin: a model's whole context window is a few
/// MiB of text at most, so an input past this is a mistake (`/dev/zero`, a wrong file).
pub const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// The largest evaluation report read (`eval --baseline`, the viewer's `--eval`): a report of
/// thousands of cases and runs is a few MiB.
pub const MAX_REPORT_BYTES: u64 = 256 * 1024 * 1024;

/// Why a text file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TextFileError {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The path names something that is not a regular file (a folder, a FIFO, a device).
    #[error("it is {kind}, not a regular file")]
    NotAFile {
        /// What it is.
        kind: &'static str,
    },
    /// The file holds more than the bound.
    #[error("it is larger than {max} bytes, the most read")]
    TooLarge {
        /// The bound, in bytes.
        max: u64,
    },
    /// The file is not UTF-8 text.
    #[error("it is not UTF-8 text")]
    NotUtf8,
}

impl TextFileError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            TextFileError::Io(_) => "file.io",
            TextFileError::NotAFile { .. } => "file.not_regular",
            TextFileError::TooLarge { .. } => "file.too_large",
            TextFileError::NotUtf8 => "file.not_utf8",
        }
    }

    /// True when the file does not exist (some callers take that as "nothing saved yet").
    pub fn is_not_found(&self) -> bool {
        matches!(self, TextFileError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Reads the regular file at `path` (links followed) as UTF-8 text of at most `max` bytes.
///
/// The kind is checked before the file is opened, so that a device is not even opened; then the
/// file is opened without waiting and checked again by the open handle: the path may have been
/// replaced by a FIFO between the two (a process sharing the folder), whose open would
/// otherwise wait for a writer forever. What is read is the file checked last. The read itself
/// stops one byte past `max` whatever the file's size claims (a file in `/proc` says 0).
pub fn read_text(path: &Path, max: u64) -> Result<String, TextFileError> {
    regular(&std::fs::metadata(path)?)?;
    let file = open_without_waiting(path)?;
    regular(&file.metadata()?)?;
    read_bounded(file, max)
}

/// Opens `path` to read without waiting for a writer (`O_NONBLOCK`, which changes nothing for
/// a regular file's reads).
#[cfg(unix)]
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// Reads the file at `path` as UTF-8 text of at most `max` bytes, whatever kind of file it is
/// but a folder: for `--input-file`, where a pipe is a fair input (`--input-file <(make_prompt)`)
/// and `/dev/zero` ends at the bound.
pub fn read_text_or_pipe(path: &Path, max: u64) -> Result<String, TextFileError> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(TextFileError::NotAFile { kind: "a folder" });
    }
    read_bounded(file, max)
}

/// Reads at most `max` bytes of UTF-8 text from `reader` (stdin), or says it holds more.
pub fn read_bounded(reader: impl Read, max: u64) -> Result<String, TextFileError> {
    let mut bytes = Vec::new();
    reader.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(TextFileError::TooLarge { max });
    }
    String::from_utf8(bytes).map_err(|_| TextFileError::NotUtf8)
}

fn regular(meta: &std::fs::Metadata) -> Result<(), TextFileError> {
    if meta.is_file() {
        return Ok(());
    }
    let kind = if meta.is_dir() {
        "a folder"
    } else {
        kind_of_special(meta)
    };
    Err(TextFileError::NotAFile { kind })
}

#[cfg(unix)]
fn kind_of_special(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(not(unix))]
fn kind_of_special(_meta: &std::fs::Metadata) -> &'static str {
    "not a file"
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_regular_file_within_the_bound_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "hello").unwrap();
        assert_eq!(read_text(&path, 5).unwrap(), "hello");
        assert!(matches!(
            read_text(&path, 4),
            Err(TextFileError::TooLarge { max: 4 })
        ));
    }

    #[test]
    fn devices_folders_and_fifos_are_refused_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        for path in [Path::new("/dev/zero"), dir.path()] {
            let e = read_text(path, 1024).unwrap_err();
            assert_eq!(e.code(), "file.not_regular", "{path:?}: {e}");
        }
        #[cfg(unix)]
        {
            let fifo = dir.path().join("fifo");
            let made = std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .is_ok_and(|s| s.success());
            if made {
                // Opening it would wait for a writer forever.
                let e = read_text(&fifo, 1024).unwrap_err();
                assert!(e.to_string().contains("FIFO"), "{e}");
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_file_swapped_for_a_fifo_between_the_check_and_the_open_is_refused_not_waited_on() {
        // A thread swaps the path between a regular file and a FIFO as fast as it can, as a
        // process sharing the folder could while an agent file or its instructions are read:
        // every read answers at once (the text, or "not a regular file"), none waits for a
        // writer of the FIFO.
        use std::sync::atomic::{AtomicBool, Ordering};
        const FIFOS: usize = 4000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompt.md");
        std::fs::write(&path, "Be brief.").unwrap();
        let fifos: Vec<PathBuf> = (0..FIFOS)
            .map(|i| dir.path().join(format!("f{i}")))
            .collect();
        let made = std::process::Command::new("mkfifo")
            .args(&fifos)
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            return;
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let swapper = {
            let (file, path, stop) = (dir.path().join("file"), path.clone(), stop.clone());
            std::thread::spawn(move || {
                for fifo in &fifos {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let _ = std::fs::rename(fifo, &path);
                    let _ = std::fs::write(&file, "Be brief.");
                    let _ = std::fs::rename(&file, &path);
                }
            })
        };
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let path = path.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                while started.elapsed() < std::time::Duration::from_secs(3) {
                    match read_text(&path, 1024) {
                        Ok(text) => assert_eq!(text, "Be brief."),
                        Err(e) => {
                            assert!(matches!(e.code(), "file.not_regular" | "file.io"), "{e}")
                        }
                    }
                }
                let _ = tx.send(());
            });
        }
        let answered = rx.recv_timeout(std::time::Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(
            answered.is_ok(),
            "a read waited on a FIFO put in the file's place after its check"
        );
    }

    #[test]
    fn a_reader_that_never_ends_stops_at_the_bound() {
        let e = read_bounded(std::io::repeat(b'a'), 1000).unwrap_err();
        assert!(matches!(e, TextFileError::TooLarge { max: 1000 }));
        let e = read_bounded(&[0xff, 0xfe][..], 10).unwrap_err();
        assert_eq!(e.code(), "file.not_utf8");
    }
}
