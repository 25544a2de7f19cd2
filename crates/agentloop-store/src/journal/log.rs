//! The `process` level's step log: a run's steps, appended to its owner's lock file (in the
//! journal's `<journal>.owners` folder) with one `write` a commit, and folded into the SQLite
//! file when the run finishes or suspends, or by the next owner after a crash.
//!
//! Why: a SQLite commit in a file other processes read is a transaction (the WAL's locks, its
//! frames, its checkpoints): about ten system calls, where a killed process only needs the
//! bytes handed to the operating system. A frame appended here is in the operating system's
//! hands once `write` returns, so it survives any kill of the process, as the `process` level
//! promises; a power cut may lose the last frames, never tear one into a step.
//!
//! The file: a header (the line `agentloop-steps 1`, then the run's id after its length), then
//! frames. A frame is one
//! commit: its payload's length (`u32`, little-endian), the first 16 bytes of the payload's
//! SHA-256, then the payload, the frame's steps one after another (each its sequence number,
//! `u64`, its text's length, `u32`, and its text). A reader takes the frames in order and stops
//! at the first that is short or whose check fails (a write cut short, as the WAL stops at a
//! frame whose checksum fails): a frame is kept or dropped whole, as a commit is. The steps'
//! chained sums are computed when they are folded into the file, and checked by every reader as
//! it reads them on from the file's own.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first line of a step log.
const MAGIC: &[u8] = b"agentloop-steps 1\n";

/// A frame's length and check.
const FRAME_HEAD: usize = 4 + 16;

/// The steps a log holds, in the order they were written: `(seq, text)`.
pub(crate) type Logged = Vec<(u64, String)>;

/// The folder of a journal's owners and step logs: `<journal>.owners`.
pub(crate) fn folder(journal: &Path) -> PathBuf {
    let mut folder = journal.as_os_str().to_owned();
    folder.push(".owners");
    PathBuf::from(folder)
}

/// The lock file and step log of run `run_id`, in [`folder`]: named by the id itself when it is
/// short and made only of characters safe in a file name (`[A-Za-z0-9_-]`); otherwise by its
/// first characters made safe and a digest of the whole id, so that no two ids share a file
/// (a subagent's id holds the model's call id, any text) and no name passes the file system's
/// limit (nested subagents' ids grow with each level).
pub(crate) fn file_of(journal: &Path, run_id: &str) -> PathBuf {
    folder(journal).join(name_of(run_id))
}

/// Ids this long or shorter that need no change are their own file's name.
const PLAIN_MOST: usize = 128;

/// The characters of an id a digested name keeps, for a person listing the folder.
const HEAD: usize = 48;

fn safe(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
        c
    } else {
        '_'
    }
}

pub(super) fn name_of(run_id: &str) -> String {
    if !run_id.is_empty() && run_id.len() <= PLAIN_MOST && run_id.chars().all(|c| safe(c) == c) {
        return format!("{run_id}.lock");
    }
    // A plain name never holds a `.`, so no id's plain name is another's digested one.
    let mut name: String = run_id.chars().take(HEAD).map(safe).collect();
    // Never a leading dot: those are the pooled files' (`.pool-…`).
    if name.is_empty() {
        name.push('_');
    }
    name.push('.');
    for byte in Sha256::digest(run_id.as_bytes()).iter().take(8) {
        let _ = write!(name, "{byte:02x}");
    }
    name.push_str(".lock");
    name
}

/// Where the version before [`file_of`]'s digested names kept run `run_id`'s log, when that is
/// another place: the whole id made safe, a name other ids could share (the header says whose
/// steps the file holds).
pub(crate) fn former_file_of(journal: &Path, run_id: &str) -> Option<PathBuf> {
    let former: String = run_id.chars().map(safe).chain(".lock".chars()).collect();
    // A name past the file system's limit was never made.
    (former != name_of(run_id) && former.len() <= 255).then(|| folder(journal).join(former))
}

/// The header of run `run_id`'s log, for a log's first write: its id's length (`u32`), then the
/// id (any text: a subagent's id holds the model's call id).
pub(crate) fn header(run_id: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let len = u32::try_from(run_id.len()).map_err(|_| "a run id too long for the step log")?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(run_id.as_bytes());
    Ok(())
}

/// Appends one frame holding `steps` to `out`; into `cuts`, when given, where each step's
/// record starts, so that a test fault can cut the write inside a given step.
pub(crate) fn frame<'a>(
    steps: impl IntoIterator<Item = (u64, &'a str)>,
    out: &mut Vec<u8>,
    mut cuts: Option<&mut Vec<usize>>,
) -> Result<(), String> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEAD]);
    for (seq, text) in steps {
        if let Some(cuts) = cuts.as_deref_mut() {
            cuts.push(out.len());
        }
        let len = u32::try_from(text.len())
            .map_err(|_| format!("step {seq} is too large for the step log"))?;
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    let payload = out.get(start + FRAME_HEAD..).unwrap_or_default();
    let len = u32::try_from(payload.len()).map_err(|_| "a frame too large for the step log")?;
    let check = Sha256::digest(payload);
    if let Some(head) = out.get_mut(start..start + FRAME_HEAD) {
        let (l, c) = head.split_at_mut(4);
        l.copy_from_slice(&len.to_le_bytes());
        c.copy_from_slice(check.get(..16).unwrap_or_default());
    }
    Ok(())
}

/// What a log's bytes hold: whose steps, the steps of its whole frames, and whether what
/// follows them is a write cut short (nothing to keep) or damage.
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub(crate) run_id: String,
    pub(crate) steps: Logged,
    /// Why the frames stop before the log's end other than at a write cut short: a frame that
    /// fails its check with more bytes after it. Only the last write can be cut short (a kill
    /// stops the log's one writer, and the next owner empties the log before it writes), so
    /// such a frame was changed after it was written, and the steps after it are lost: the log
    /// is not to be taken as if it ended there.
    pub(crate) damage: Option<String>,
}

/// Reads a log's bytes: `None` when they are not a step log (or hold no header yet).
pub(crate) fn parse(bytes: &[u8]) -> Option<Read> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let run_id = std::str::from_utf8(rest.get(4..4 + len)?).ok()?.to_owned();
    let mut at = MAGIC.len() + 4 + len;
    let mut steps = Vec::new();
    let mut damage = None;
    while let Some(head) = bytes.get(at..at + FRAME_HEAD) {
        let (len, check) = head.split_at(4);
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        let end = at + FRAME_HEAD + len;
        let Some(payload) = bytes.get(at + FRAME_HEAD..end) else {
            break;
        };
        let frame = (Sha256::digest(payload).get(..16) == Some(check))
            .then(|| records(payload))
            .flatten();
        let Some(frame) = frame else {
            // The last frame, whole in length but not in content, is a write a power cut tore.
            if end < bytes.len() {
                damage = Some(format!(
                    "the frame at byte {at} fails its check and {} bytes follow it",
                    bytes.len() - end
                ));
            }
            break;
        };
        steps.extend(frame);
        at = end;
    }
    Some(Read {
        run_id,
        steps,
        damage,
    })
}

/// True when `bytes` open as a step log of another format version than this one's.
pub(crate) fn is_other_version(bytes: &[u8]) -> bool {
    let family = MAGIC.strip_suffix(b"1\n").unwrap_or(MAGIC);
    bytes.starts_with(family) && !bytes.starts_with(MAGIC)
}

/// True when `bytes` (a lock file's, not empty) are no step log and not the start of one
/// either: not a first write cut short, so a log changed after it was written.
pub(crate) fn is_foreign(bytes: &[u8]) -> bool {
    if bytes.len() < MAGIC.len() {
        return !MAGIC.starts_with(bytes);
    }
    let Some(rest) = bytes.strip_prefix(MAGIC) else {
        return true;
    };
    // A header whose id is whole but not text.
    rest.get(..4)
        .and_then(|l| l.try_into().ok())
        .map(|l| u32::from_le_bytes(l) as usize)
        .and_then(|len| rest.get(4..4 + len))
        .is_some_and(|id| std::str::from_utf8(id).is_err())
}

/// The steps of a frame's payload (whose check held): `None` when it does not divide into
/// records.
fn records(mut payload: &[u8]) -> Option<Logged> {
    let mut out = Vec::new();
    while !payload.is_empty() {
        let seq = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(payload.get(8..12)?.try_into().ok()?) as usize;
        let text = std::str::from_utf8(payload.get(12..12 + len)?).ok()?;
        out.push((seq, text.to_owned()));
        payload = payload.get(12 + len..)?;
    }
    Some(out)
}

/// The steps run `run_id`'s log holds (none when it has no log, or the file at its place is
/// another run's), and the damage that ends them early, if any ([`Read::damage`]).
pub(crate) fn read_run(journal: &Path, run_id: &str) -> (Logged, Option<String>) {
    let read = |path: PathBuf| {
        let bytes = std::fs::read(&path).ok()?;
        parse(&bytes).filter(|r| r.run_id == run_id).map(|r| {
            let damage = r
                .damage
                .map(|d| format!("its step log {}: {d}", agentloop::printable::path(&path)));
            (r.steps, damage)
        })
    };
    read(file_of(journal, run_id))
        .or_else(|| former_file_of(journal, run_id).and_then(read))
        .unwrap_or_default()
}

/// The id of the run whose steps the log at `path` holds, when it is a log.
pub(crate) fn run_of(path: &Path) -> Option<String> {
    parse(&std::fs::read(path).ok()?).map(|r| r.run_id)
}

/// Every step log in the journal's folder: each run's logged steps, and when its log was
/// last written (ms since the Unix epoch).
pub(crate) fn read_all(journal: &Path) -> std::collections::HashMap<String, (Logged, i64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(folder(journal)) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let (Ok(bytes), Ok(meta)) = (std::fs::read(&path), entry.metadata()) else {
            continue;
        };
        let Some(read) = parse(&bytes) else { continue };
        if read.steps.is_empty() {
            continue;
        }
        let written = meta
            .modified()
            .ok()
            .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        out.insert(read.run_id, (read.steps, written));
    }
    out
}

/// How many steps a run has, when its file holds `stored` (steps `0..stored`) and its log
/// `logged`: the file's, then the logged ones that follow on from them without a gap.
pub(crate) fn count(stored: u64, logged: &[(u64, String)]) -> u64 {
    let mut next = stored;
    for (seq, _) in logged {
        if *seq == next {
            next += 1;
        }
    }
    next
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn log_of(frames: &[&[(u64, &str)]]) -> Vec<u8> {
        log_of_run("run-1", frames)
    }

    fn log_of_run(run_id: &str, frames: &[&[(u64, &str)]]) -> Vec<u8> {
        let mut out = Vec::new();
        header(run_id, &mut out).unwrap();
        for f in frames {
            frame(f.iter().copied(), &mut out, None).unwrap();
        }
        out
    }

    #[test]
    fn frames_read_back_whole_and_a_frame_cut_short_or_changed_is_dropped_whole() {
        let bytes = log_of(&[&[(0, "a"), (1, "b")], &[(2, "c")], &[(3, "d"), (4, "e")]]);
        let read = parse(&bytes).unwrap();
        assert_eq!(read.run_id, "run-1");
        let seqs: Vec<u64> = read.steps.iter().map(|s| s.0).collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4]);
        assert_eq!(read.steps[2].1, "c");
        // Cut anywhere inside the last frame: the frames before it, whole, and nothing of it.
        let last = log_of(&[&[(0, "a"), (1, "b")], &[(2, "c")]]).len();
        for cut in last..bytes.len() {
            let read = parse(&bytes[..cut]).unwrap();
            assert_eq!(read.steps.len(), 3, "cut at {cut}");
        }
        // A changed byte in a frame ends the log there.
        let mut changed = bytes.clone();
        let at = changed.len() - 1;
        changed[at] ^= 1;
        let read = parse(&changed).unwrap();
        assert_eq!(read.steps.len(), 3);
        assert!(read.damage.is_none(), "the last frame may be torn");
        // A changed frame with frames after it was not cut short: it is damage.
        let mut changed = bytes.clone();
        let at = last - 1;
        changed[at] ^= 1;
        let read = parse(&changed).unwrap();
        assert_eq!(read.steps.len(), 2);
        assert!(read.damage.is_some_and(|d| d.contains("bytes follow")));
        // Not a log at all; the start of one is a first write cut short.
        assert!(parse(b"something else").is_none());
        assert!(parse(b"").is_none());
        assert!(is_foreign(b"something else"));
        assert!(is_foreign(b"agentloop-steps 2\n") && is_other_version(b"agentloop-steps 2\n"));
        assert!(!is_other_version(&bytes));
        for cut in 1..MAGIC.len() + 8 {
            assert!(!is_foreign(&bytes[..cut]), "cut at {cut}");
        }
    }

    #[test]
    fn any_run_id_is_read_back_whole() {
        for id in ["lead.call\n7", "", "é\u{0}x", "a b\r\nc"] {
            let read = parse(&log_of_run(id, &[&[(0, "s")]])).unwrap();
            assert_eq!(read.run_id, id);
            assert_eq!(read.steps.len(), 1);
        }
    }

    #[test]
    fn a_run_has_its_files_steps_then_the_logged_ones_that_follow_without_a_gap() {
        let logged: Logged = [(2, "c"), (3, "d"), (5, "f")]
            .iter()
            .map(|(s, t)| (*s, (*t).to_owned()))
            .collect();
        assert_eq!(count(2, &logged), 4);
        assert_eq!(count(4, &logged), 4);
        assert_eq!(count(1, &logged), 1);
        // Steps already folded into the file are not counted twice.
        assert_eq!(count(3, &logged), 4);
    }

    #[test]
    fn file_names_are_the_plain_ids_own_and_distinct_bounded_digests_for_the_rest() {
        let long = "r.".repeat(400);
        let ids = [
            "run-1_A",
            "p.c1",
            "p:c1",
            "p_c1",
            "p/c1",
            "",
            "é",
            long.as_str(),
        ];
        let names: Vec<String> = ids.iter().map(|id| name_of(id)).collect();
        assert_eq!(names[0], "run-1_A.lock");
        assert_eq!(names[3], "p_c1.lock");
        for (id, name) in ids.iter().zip(&names) {
            assert!(name.len() <= 255, "{id:?}: {name}");
            assert!(!name.starts_with('.'), "{id:?}: {name}");
            assert!(name.ends_with(".lock"), "{id:?}: {name}");
            assert!(
                name.chars().all(|c| safe(c) == c || c == '.'),
                "{id:?}: {name}"
            );
        }
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        // The same id, the same name, wherever it is asked for.
        assert_eq!(name_of("p.c1"), names[1]);
        // The former name of an id with a digested one is its id made safe; a plain id has none.
        let journal = Path::new("j.db");
        assert_eq!(
            former_file_of(journal, "p.c1"),
            Some(folder(journal).join("p_c1.lock"))
        );
        assert_eq!(former_file_of(journal, "p_c1"), None);
        assert_eq!(former_file_of(journal, &long), None);
    }
}
