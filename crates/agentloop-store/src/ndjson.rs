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

impl NdjsonWriter {
    /// Opens (or creates) the file for appending. A last line left unterminated by an earlier
    /// crash is closed first, so the next record starts on a line of its own.
    pub fn open(path: &Path) -> Result<NdjsonWriter, TraceError> {
        let err = |e| TraceError::io(path, e);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(crate::PRIVATE_MODE)
            .open(path)
            .map_err(err)?;
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
    let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| TraceError::io(path, e))?;
        if n == 0 {
            break;
        }
        number += 1;
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
                path.display()
            )),
            Err(e) => warnings.push(format!(
                "{}: line {number} is not a trace record and was skipped: {e}",
                path.display()
            )),
        }
    }
    Ok((records, warnings))
}
