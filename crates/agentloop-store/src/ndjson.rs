//! NDJSON traces: one record per line, appended and written whole per record, so a crash loses
//! at most the line being written. A reader skips (and reports) lines it cannot read, such as a
//! last line cut off mid-write.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::TraceError;
use crate::format::TraceWriter;
use crate::record::TraceRecord;

/// Appends records to an NDJSON file.
#[derive(Debug)]
pub struct NdjsonWriter {
    path: PathBuf,
    file: File,
}

/// The longest line a reader keeps: a trace's records are a run's events, each far shorter; a
/// longer line (a file that is no trace, `/dev/zero` behind a link) is skipped, not held whole.
const MAX_LINE_BYTES: u64 = 16 * 1024 * 1024;

/// How much of an existing file's first line is read to tell whether it is a trace.
const FIRST_LINE_BYTES: u64 = 1024 * 1024;

/// Refuses a file the writer would append to that is no trace (an image, a log, a journal given
/// by mistake), before anything is written: its first line must be a JSON object, or the start of
/// one cut off by a crash. An empty file is a new trace.
fn refuse_other_files(file: &mut File, path: &Path) -> Result<(), TraceError> {
    let not_a_trace = |reason: &str| TraceError::NotATrace {
        path: agentloop::printable::path(path),
        reason: reason.to_owned(),
    };
    let meta = file.metadata().map_err(|e| TraceError::io(path, e))?;
    if !meta.is_file() {
        return Err(not_a_trace("it is not a regular file"));
    }
    if meta.len() == 0 {
        return Ok(());
    }
    let mut first = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| {
            BufReader::new(&mut *file)
                .take(FIRST_LINE_BYTES)
                .read_until(b'\n', &mut first)
        })
        .map_err(|e| TraceError::io(path, e))?;
    let opens_an_object = first
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    let whole_object =
        || serde_json::from_slice::<serde_json::Value>(&first).is_ok_and(|v| v.is_object());
    // A first line cut off by a crash (no newline yet) is judged by how it opens.
    let terminated = first.last() == Some(&b'\n');
    if opens_an_object && (!terminated || whole_object()) {
        Ok(())
    } else {
        Err(not_a_trace(
            "its first line is not a trace record (a JSON object); nothing was written to it",
        ))
    }
}

impl NdjsonWriter {
    /// Opens (or creates) the file for appending. A last line left unterminated by an earlier
    /// crash is closed first, so the next record starts on a line of its own. A file that holds
    /// something else is refused ([`TraceError::NotATrace`]) and left as it was.
    pub fn open(path: &Path) -> Result<NdjsonWriter, TraceError> {
        let err = |e| TraceError::io(path, e);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(crate::PRIVATE_MODE)
            // A link put in the trace's place (by a process that may write its folder) is
            // refused, never appended to where it leads. (A FIFO opened to read and write does
            // not block, and is refused below.)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(err)?;
        refuse_other_files(&mut file, path)?;
        let len = file.metadata().map_err(err)?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1)).map_err(err)?;
            file.read_exact(&mut last).map_err(err)?;
            if last[0] != b'\n' {
                file.write_all(b"\n").map_err(err)?;
            }
        }
        Ok(NdjsonWriter {
            path: path.to_owned(),
            file,
        })
    }
}

impl TraceWriter for NdjsonWriter {
    fn write(&mut self, record: &TraceRecord) -> Result<(), TraceError> {
        let mut line = serde_json::to_vec(record).map_err(|e| TraceError::json(&self.path, e))?;
        line.push(b'\n');
        // One write per record: the line reaches the kernel whole or not at all (short of a crash
        // inside the call).
        self.file
            .write_all(&line)
            .map_err(|e| TraceError::io(&self.path, e))
    }

    fn flush(&mut self) -> Result<(), TraceError> {
        self.file
            .flush()
            .map_err(|e| TraceError::io(&self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| TraceError::io(&self.path, e))
    }
}

/// Reads every readable record of an NDJSON trace, in file order, with a warning for each line
/// that could not be read.
pub(crate) fn read(path: &Path) -> Result<(Vec<TraceRecord>, Vec<String>), TraceError> {
    // Judged before opening: a named pipe would block the open, `/dev/zero` never end.
    if !std::fs::metadata(path)
        .map_err(|e| TraceError::io(path, e))?
        .is_file()
    {
        return Err(TraceError::NotATrace {
            path: agentloop::printable::path(path),
            reason: "it is not a regular file".into(),
        });
    }
    let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
            .map_err(|e| TraceError::io(path, e))?;
        if n == 0 {
            break;
        }
        number += 1;
        if n as u64 == MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            skip_line(&mut reader).map_err(|e| TraceError::io(path, e))?;
            warnings.push(format!(
                "{}: line {number} is longer than {MAX_LINE_BYTES} bytes (no trace record is) and \
                 was skipped",
                agentloop::printable::path(path)
            ));
            continue;
        }
        let terminated = buf.last() == Some(&b'\n');
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<TraceRecord>(line) {
            Ok(r) => records.push(r),
            Err(e) if !terminated => warnings.push(format!(
                "{}: line {number} is cut off (the writer stopped mid-line) and was skipped: {e}",
                agentloop::printable::path(path)
            )),
            Err(e) => warnings.push(format!(
                "{}: line {number} is not a trace record and was skipped: {e}",
                agentloop::printable::path(path)
            )),
        }
    }
    Ok((records, warnings))
}

/// Reads past the rest of a line without keeping it.
fn skip_line(reader: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let chunk = reader.fill_buf()?;
        if chunk.is_empty() {
            return Ok(());
        }
        match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = chunk.len();
                reader.consume(n);
            }
        }
    }
}
