//! The file tools: `read_file`, `write_file`, `edit_file`, `list_dir`, `glob` and `grep`, each
//! confined to a [`Workspace`] (every path goes through [`Workspace::resolve`]) and bounded (a
//! size cap on what the model reads, a cap on listed entries and matches). Writes are atomic: a
//! temporary file in the target's folder, synced, then renamed over the target, so a reader never
//! sees half a file and a crash leaves the old one. The tools that walk a folder (`list_dir`,
//! `glob`, `grep`) leave out what the workspace's permission rules deny or ask about for them
//! ([`Workspace::withhold`]): a rule on a call's `path` also holds for the files a walk meets.
//!
//! The file system is used from blocking tasks (`spawn_blocking`), so a large folder never stalls
//! the runtime that drives the run.

use std::fmt::Write as _;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentloop::permissions::{PathRules, Permission};
use agentloop::{CancellationToken, Tool, ToolContext, ToolError, ToolOutput, tool::ExecutionMode};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::workspace::{Echoed, PathError, Workspace};

/// The most bytes of text one call hands the model by default (64 KiB).
pub const DEFAULT_MAX_READ_BYTES: usize = 64 * 1024;
/// The most entries, paths or matching lines one call lists by default.
pub const DEFAULT_MAX_RESULTS: usize = 200;
/// Files larger than this are not edited, nor searched by `grep` (16 MiB).
const MAX_WHOLE_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// How much of a file's start is looked at for a NUL byte, the mark of a binary file.
const SNIFF_BYTES: usize = 8192;
/// The longest line `grep` (a matching line) and `edit_file` (a line of its diff) show, in
/// characters.
const MAX_GREP_LINE_CHARS: usize = 300;

/// What the file tools share: the workspace and the caps.
#[derive(Debug, Clone)]
pub(crate) struct FileLimits {
    pub(crate) workspace: Workspace,
    pub(crate) max_bytes: usize,
    pub(crate) max_results: usize,
    /// The most entries of folders `list_dir` reads, and a walk holds at once
    /// ([`crate::beneath::MAX_ENTRIES_READ`]).
    pub(crate) max_entries_read: usize,
    /// The tool's path rules that `list_dir`, `glob` and `grep` leave out what they match by,
    /// and that every file tool judges the path it is given by again when it runs
    /// ([`refused_now`], [`refused_base_now`]), compiled once when the tool is made ([`file_tool`]).
    pub(crate) withheld: Option<Arc<PathRules>>,
}

/// Refuses `path` when a path rule of the tool that the gate would not have let pass matches it
/// as the call runs: a `deny` rule always, an `ask` rule unless a person approved this very
/// call (`approved`, [`ToolContext::approved`]). The gate judged the call before its batch ran;
/// another call of the batch (a shell's `ln -s secrets/key.pem notes.txt` beside `read_file
/// notes.txt`) may since have made the path lead to a file a rule covers, and the link is
/// followed again here as the gate follows it. Calling again gets the call judged with the
/// link in place, so an `ask` rule is then asked about.
///
/// `resolved` is the file the call goes on to open, as the workspace resolved it: judged too,
/// by its own name, so that what is judged is what is opened. A process running beside the
/// call (a subagent's shell) could otherwise swap a link between the judging and the resolving
/// (the open then refuses any link put on the resolved path since).
fn refused_now(
    limits: &FileLimits,
    path: &str,
    resolved: &Path,
    approved: bool,
) -> Result<(), PathError> {
    let Some(rules) = &limits.withheld else {
        return Ok(());
    };
    let opened = limits.workspace.display(resolved);
    let verdicts = [rules.judge(path), rules.judge(&opened)];
    if verdicts.contains(&Some(Permission::Deny)) {
        return Err(PathError::Denied {
            path: path.to_owned(),
        });
    }
    if verdicts.contains(&Some(Permission::Ask)) && !approved {
        return Err(PathError::Unapproved {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// [`refused_now`] for the folder (or file) a tool that walks is given, when it is given one: the
/// walk judges each entry it meets below it, never the path it starts from, which a link made by
/// another call of the batch may have turned into a folder (or a file, for `grep`) a rule covers
/// whole. Without a path the call names no path the gate could have judged: nothing is judged.
fn refused_base_now(
    limits: &FileLimits,
    path: Option<&str>,
    resolved: &Path,
    approved: bool,
) -> Result<(), PathError> {
    path.map_or(Ok(()), |path| refused_now(limits, path, resolved, approved))
}

/// What a tool that walks folders leaves out: the entries its workspace's path rules deny or ask
/// about ([`Workspace::withhold`]), counted for the note the model reads.
struct Withheld<'a> {
    rules: Option<&'a PathRules>,
    workspace: &'a Workspace,
    count: std::cell::Cell<usize>,
}

impl<'a> Withheld<'a> {
    fn new(rules: Option<&'a PathRules>, workspace: &'a Workspace) -> Self {
        Withheld {
            rules,
            workspace,
            count: std::cell::Cell::new(0),
        }
    }

    /// True (and counted) when the entry at `path` (resolved, under the root) is left out: a
    /// rule judges it as it judges a call whose `path` is its path relative to the root.
    fn skips(&self, path: &Path) -> bool {
        let Some(rules) = self.rules else {
            return false;
        };
        let left_out = rules.judge(&self.workspace.display(path)).is_some();
        if left_out {
            self.count.set(self.count.get() + 1);
        }
        left_out
    }

    /// The note that ends an answer when entries were left out: how many, never which.
    fn note(&self) -> Option<String> {
        match self.count.get() {
            0 => None,
            1 => Some("[1 entry left out by the permission rules]".to_owned()),
            n => Some(format!("[{n} entries left out by the permission rules]")),
        }
    }
}

/// Runs file-system work on a blocking task, for the call `ctx` serves.
async fn blocking<T: Send + 'static>(
    ctx: ToolContext,
    f: impl FnOnce(&Wanted) -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    let wanted = Wanted {
        dropped: Arc::new(AtomicBool::new(false)),
        approved: ctx.approved(),
        cancel: ctx.cancel,
    };
    let _dropped = DropFlag(wanted.dropped.clone());
    tokio::task::spawn_blocking(move || f(&wanted))
        .await
        .map_err(|e| ToolError::new("internal", format!("the file operation failed: {e}")))?
}

/// Whether the call a blocking body serves is still wanted: its run goes on, and its future was
/// not dropped (a call's timeout drops it). A blocking thread cannot be stopped from outside, so
/// a walk of a large tree asks between entries rather than go on for nobody. It also carries
/// whether a person approved the call ([`ToolContext::approved`]), which [`refused_now`] weighs.
struct Wanted {
    dropped: Arc<AtomicBool>,
    cancel: CancellationToken,
    approved: bool,
}

impl Wanted {
    fn check(&self) -> Result<(), ToolError> {
        if self.dropped.load(Ordering::Relaxed) || self.cancel.is_cancelled() {
            return Err(ToolError::new(
                "cancelled",
                "the call was cancelled or timed out before it ended",
            ));
        }
        Ok(())
    }
}

/// Raises its flag when the call's future goes, whether it ended or was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// An I/O error on `shown` (the path as the model knows it), as the model reads it.
fn io_error(shown: &str, e: &std::io::Error) -> ToolError {
    use std::io::ErrorKind;
    if crate::beneath::is_link_on_the_way(e) {
        return ToolError::new(
            "path_changed",
            format!(
                "{shown}: a link appeared on the path after it was checked (another process \
                 changed the folder): nothing was read or written"
            ),
        );
    }
    match e.kind() {
        ErrorKind::NotFound => {
            ToolError::new("not_found", format!("{shown}: no such file or folder")).permanent()
        }
        ErrorKind::PermissionDenied => {
            ToolError::new("permission_denied", format!("{shown}: permission denied")).permanent()
        }
        _ => ToolError::new("io_error", format!("{shown}: {e}")),
    }
}

/// Opens a file to read, refusing what is not a regular file: a named pipe would hold the open
/// (and the call, and a blocking thread) until a writer came, a device would never end. Opened
/// without waiting, then judged by the open handle, so a file swapped for a pipe after a check by
/// name is refused too.
fn open_regular(
    root: &Path,
    path: &Path,
    shown: &str,
) -> Result<(std::fs::File, std::fs::Metadata), ToolError> {
    let file = crate::beneath::open_read(root, path).map_err(|e| io_error(shown, &e))?;
    let meta = file.metadata().map_err(|e| io_error(shown, &e))?;
    if meta.is_dir() {
        return Err(ToolError::new(
            "is_a_folder",
            format!("{shown} is a folder: use list_dir to see what it holds"),
        )
        .permanent());
    }
    if !meta.is_file() {
        return Err(ToolError::new(
            "not_a_file",
            format!(
                "{shown} is not a regular file (a pipe, a device or a socket): it cannot be read"
            ),
        )
        .permanent());
    }
    Ok((file, meta))
}

fn binary_error(shown: &str) -> ToolError {
    ToolError::new(
        "binary_file",
        format!(
            "{shown} is a binary file (not UTF-8 text): the file tools read and edit text only"
        ),
    )
    .permanent()
}

fn looks_binary(bytes: &[u8]) -> bool {
    bytes
        .get(..bytes.len().min(SNIFF_BYTES))
        .unwrap_or_default()
        .contains(&0)
}

/// A tool of the crate's shape: a typed argument (its schema from `A`) and a blocking body.
fn file_tool<A>(
    name: &str,
    description: &str,
    limits: &FileLimits,
    shape: impl FnOnce(agentloop::tool::ToolBuilder) -> agentloop::tool::ToolBuilder,
    body: fn(&FileLimits, A, &Wanted) -> Result<ToolOutput, ToolError>,
) -> Tool
where
    A: serde::de::DeserializeOwned + JsonSchema + Send + 'static,
{
    // The rules name the tool as the model calls it, on its `path` argument.
    let limits = Arc::new(FileLimits {
        withheld: limits.workspace.withheld(name, "path").map(Arc::new),
        ..limits.clone()
    });
    shape(Tool::builder(name).description(description)).handler(move |args: A, ctx: ToolContext| {
        let limits = limits.clone();
        blocking(ctx, move |wanted| body(&limits, args, wanted))
    })
}

// `read_file`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileArgs {
    /// The file, relative to the workspace root.
    path: String,
    /// The first line to read, counting from 1 (default 1).
    #[serde(default)]
    offset: Option<usize>,
    /// The most lines to read (default: as many as fit in the size cap).
    #[serde(default)]
    limit: Option<usize>,
}

pub(crate) fn read_file(name: &str, limits: &FileLimits) -> Tool {
    let description = format!(
        "Reads a text file of the workspace. Each line comes back prefixed by its number and a \
         tab (the prefix is not part of the file). At most {} bytes come back per call: read a \
         long file in parts with `offset` (first line, from 1) and `limit` (line count). Binary \
         files are refused. Example: {{\"path\": \"src/main.rs\", \"offset\": 40, \"limit\": 20}}",
        limits.max_bytes
    );
    file_tool(
        name,
        &description,
        limits,
        |b| b.idempotent(true),
        read_file_body,
    )
}

fn read_file_body(
    limits: &FileLimits,
    args: ReadFileArgs,
    call: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let path = limits.workspace.resolve(&args.path)?;
    refused_now(limits, &args.path, &path, call.approved)?;
    let shown = limits.workspace.shown(&path);
    let (file, _) = open_regular(limits.workspace.root(), &path, &shown)?;
    let mut reader = std::io::BufReader::new(file);
    if looks_binary(reader.fill_buf().map_err(|e| io_error(&shown, &e))?) {
        return Err(binary_error(&shown));
    }
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(usize::MAX);
    let mut out = String::new();
    let mut line_no = 0usize;
    let mut shown_lines = 0usize;
    let mut line = Vec::new();
    let mut cut_note = None;
    // No line is taken into memory past the cap (a file of one line of gigabytes): the lines
    // before `offset` are skipped unread, and of a longer line only the cap and a byte are read,
    // which the cap below cuts.
    let cap = limits.max_bytes.saturating_add(1) as u64;
    loop {
        if line_no + 1 < first {
            if !skip_line(&mut reader, call).map_err(|e| e.on(&shown))? {
                break;
            }
            line_no += 1;
            continue;
        }
        line.clear();
        let n = (&mut reader)
            .take(cap)
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error(&shown, &e))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if !line.ends_with(b"\n") && n as u64 == cap {
            // Cut inside the line, perhaps inside a character: its whole characters are kept.
            if let Err(e) = std::str::from_utf8(&line)
                && e.error_len().is_none()
            {
                line.truncate(e.valid_up_to());
            }
        }
        if shown_lines == limit {
            cut_note = Some(format!(
                "[more lines follow: call again with offset={line_no}]"
            ));
            break;
        }
        let text = std::str::from_utf8(&line).map_err(|_| binary_error(&shown))?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let entry = format!("{line_no:>6}\t{text}\n");
        if out.len() + entry.len() > limits.max_bytes {
            if shown_lines == 0 {
                // One line longer than the cap: show its start rather than nothing.
                let room = limits.max_bytes.saturating_sub(16);
                let mut end = room.min(entry.len());
                while !entry.is_char_boundary(end) {
                    end -= 1;
                }
                out.push_str(entry.get(..end).unwrap_or_default());
                out.push('\n');
                cut_note = Some(format!(
                    "[line {line_no} is longer than the {} byte cap and was cut; read on with offset={}]",
                    limits.max_bytes,
                    line_no + 1
                ));
            } else {
                cut_note = Some(format!(
                    "[cut at the {} byte cap: call again with offset={line_no}]",
                    limits.max_bytes
                ));
            }
            break;
        }
        out.push_str(&entry);
        shown_lines += 1;
    }
    if out.is_empty() && cut_note.is_none() {
        let text = if line_no == 0 {
            format!("({shown} is empty)")
        } else {
            format!("({shown} has {line_no} lines: none from line {first})")
        };
        return Ok(ToolOutput::text(text));
    }
    if let Some(note) = cut_note {
        out.push_str(&note);
    }
    Ok(ToolOutput::text(out))
}

/// Why [`skip_line`] stopped short: the file could not be read, or the call is no longer wanted.
enum SkipError {
    Io(std::io::Error),
    Unwanted(ToolError),
}

impl SkipError {
    /// As the model reads it, for the file shown as `shown`.
    fn on(self, shown: &str) -> ToolError {
        match self {
            SkipError::Io(e) => io_error(shown, &e),
            SkipError::Unwanted(e) => e,
        }
    }
}

/// Reads past the next line break, one buffer at a time, asking between buffers whether the
/// call is still wanted; false when the file ended first. A line has no bound on its length: a
/// sparse file of terabytes of zeros (`truncate -s 16T`, from the model's shell) past a first
/// line of text would otherwise be read to its end on a blocking thread, at full speed, long
/// after the call's timeout or cancellation answered it.
fn skip_line(reader: &mut impl BufRead, call: &Wanted) -> Result<bool, SkipError> {
    let mut read_any = false;
    loop {
        call.check().map_err(SkipError::Unwanted)?;
        let buf = reader.fill_buf().map_err(SkipError::Io)?;
        if buf.is_empty() {
            return Ok(read_any);
        }
        read_any = true;
        let (used, ended) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        reader.consume(used);
        if ended {
            return Ok(true);
        }
    }
}

// `write_file`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileArgs {
    /// The file, relative to the workspace root; missing folders are created.
    path: String,
    /// The whole new content of the file.
    content: String,
}

pub(crate) fn write_file(name: &str, limits: &FileLimits) -> Tool {
    file_tool(
        name,
        "Writes a whole text file of the workspace, creating it (and its folders) or replacing \
         it. To change part of a file, prefer edit_file. Example: {\"path\": \"notes/todo.md\", \
         \"content\": \"# To do\\n- write tests\\n\"}",
        limits,
        |b| {
            b.mutating(true)
                .idempotent(true)
                .mode(ExecutionMode::Sequential)
        },
        write_file_body,
    )
}

fn write_file_body(
    limits: &FileLimits,
    args: WriteFileArgs,
    call: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let path = limits.workspace.resolve_for_write(&args.path)?;
    refused_now(limits, &args.path, &path, call.approved)?;
    let shown = limits.workspace.shown(&path);
    if path.is_dir() {
        return Err(
            ToolError::new("is_a_folder", format!("{shown} is a folder, not a file")).permanent(),
        );
    }
    let existed = path.exists();
    crate::beneath::replace(limits.workspace.root(), &path, args.content.as_bytes())
        .map_err(|e| io_error(&shown, &e))?;
    Ok(ToolOutput::text(format!(
        "{} {shown} ({} bytes, {} lines)",
        if existed { "replaced" } else { "created" },
        args.content.len(),
        args.content.lines().count()
    )))
}

/// A whole text file, refused when binary or too large to edit.
fn read_text(root: &Path, path: &Path, shown: &str) -> Result<String, ToolError> {
    let (file, meta) = open_regular(root, path, shown)?;
    if meta.len() > MAX_WHOLE_FILE_BYTES {
        return Err(ToolError::new(
            "file_too_large",
            format!(
                "{shown} has {} bytes, more than the {MAX_WHOLE_FILE_BYTES} this tool takes",
                meta.len()
            ),
        )
        .permanent());
    }
    let mut bytes = Vec::new();
    // Bounded again as it is read: the file may have grown since its size was taken.
    file.take(MAX_WHOLE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(shown, &e))?;
    if bytes.len() as u64 > MAX_WHOLE_FILE_BYTES {
        return Err(ToolError::new(
            "file_too_large",
            format!("{shown} has more than the {MAX_WHOLE_FILE_BYTES} bytes this tool takes"),
        )
        .permanent());
    }
    if looks_binary(&bytes) {
        return Err(binary_error(shown));
    }
    String::from_utf8(bytes).map_err(|_| binary_error(shown))
}

// `edit_file`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditFileArgs {
    /// The file, relative to the workspace root.
    path: String,
    /// The exact text to replace, whitespace and indentation included (no line-number prefixes).
    old_string: String,
    /// The text to put in its place.
    new_string: String,
    /// Replace every occurrence; otherwise `old_string` must occur exactly once (default false).
    #[serde(default)]
    replace_all: bool,
}

pub(crate) fn edit_file(name: &str, limits: &FileLimits) -> Tool {
    file_tool(
        name,
        "Replaces exact text in a file of the workspace. `old_string` must occur exactly once \
         (include a few surrounding lines to make it unique) unless `replace_all` is true. \
         Answers with the changed lines as a diff. Example: {\"path\": \"src/lib.rs\", \
         \"old_string\": \"let x = 1;\", \"new_string\": \"let x = 2;\"}",
        limits,
        |b| b.mutating(true).mode(ExecutionMode::Sequential),
        edit_file_body,
    )
}

fn edit_file_body(
    limits: &FileLimits,
    args: EditFileArgs,
    call: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let path = limits.workspace.resolve_for_write(&args.path)?;
    refused_now(limits, &args.path, &path, call.approved)?;
    let shown = limits.workspace.shown(&path);
    if args.old_string.is_empty() {
        return Err(ToolError::new(
            "invalid_arguments",
            "old_string is empty: give the text to replace (to create a file, use write_file)",
        )
        .permanent());
    }
    if args.old_string == args.new_string {
        return Err(ToolError::new(
            "invalid_arguments",
            "old_string and new_string are the same: nothing would change",
        )
        .permanent());
    }
    let text = read_text(limits.workspace.root(), &path, &shown)?;
    let positions: Vec<usize> = text
        .match_indices(args.old_string.as_str())
        .map(|(at, _)| at)
        .collect();
    match positions.len() {
        0 => {
            return Err(ToolError::new(
                "no_match",
                format!(
                    "old_string does not occur in {shown}: the match is exact (whitespace and \
                     indentation count, line-number prefixes are not part of the file); read \
                     the file again and copy the text"
                ),
            )
            .permanent());
        }
        n if n > 1 && !args.replace_all => {
            let lines: Vec<String> = positions
                .iter()
                .take(10)
                .map(|at| line_of(&text, *at).to_string())
                .collect();
            return Err(ToolError::new(
                "ambiguous_match",
                format!(
                    "old_string occurs {n} times in {shown} (lines {}): include more \
                     surrounding text to make it unique, or set replace_all to true",
                    lines.join(", ")
                ),
            )
            .permanent());
        }
        _ => {}
    }
    // Sized before it is built: every one of up to 16 Mi one-byte matches replaced by a long
    // `new_string` would ask for terabytes, and a failed allocation aborts the whole process.
    let grown = (args.new_string.len() as u64)
        .saturating_mul(positions.len() as u64)
        .saturating_add(text.len() as u64)
        .saturating_sub(args.old_string.len() as u64 * positions.len() as u64);
    if grown > MAX_WHOLE_FILE_BYTES {
        return Err(ToolError::new(
            "file_too_large",
            format!(
                "the edit would make {shown} {grown} bytes, more than the \
                 {MAX_WHOLE_FILE_BYTES} this tool writes: replace fewer occurrences at a time"
            ),
        )
        .permanent());
    }
    let new_text = text.replace(args.old_string.as_str(), &args.new_string);
    crate::beneath::replace(limits.workspace.root(), &path, new_text.as_bytes())
        .map_err(|e| io_error(&shown, &e))?;
    let n = positions.len();
    let diff = edit_diff(&text, &positions, &args.old_string, &args.new_string);
    Ok(ToolOutput::text(format!(
        "edited {shown}: {n} replacement{}\n{diff}",
        if n == 1 { "" } else { "s" }
    )))
}

/// A line as a search or a diff shows it: its first [`MAX_GREP_LINE_CHARS`] characters, and `…`
/// when it goes on.
fn cut_line(line: &str) -> std::borrow::Cow<'_, str> {
    match line.char_indices().nth(MAX_GREP_LINE_CHARS) {
        Some((at, _)) => format!("{}…", line.get(..at).unwrap_or_default()).into(),
        None => line.into(),
    }
}

/// The 1-based line of a byte offset.
fn line_of(text: &str, at: usize) -> usize {
    text.get(..at).map_or(0, |t| t.matches('\n').count()) + 1
}

/// The most lines an edit's diff shows.
const MAX_DIFF_LINES: usize = 200;

/// A small unified diff of replacing `old` by `new` at `positions` (ascending, not
/// overlapping) in `text`: one hunk per run of touching lines, no context lines, each line cut
/// at [`MAX_GREP_LINE_CHARS`]. Linear in the text: the hunks are found in one pass, each
/// holding the number of its first line, as a file of one long line with millions of matches
/// would make a search from each match (back to its line's start, forward to its end, or from
/// the file's start for its number) take hours of a blocking thread no cancellation stops.
fn edit_diff(text: &str, positions: &[usize], old: &str, new: &str) -> String {
    let bytes = text.as_bytes();
    // Each hunk: the byte range of whole old lines it covers, the number of its first line,
    // and the matches inside it.
    let mut hunks: Vec<(usize, usize, usize, Vec<usize>)> = Vec::new();
    // The text before `scanned` has been read: it holds `breaks` line breaks, and the line
    // holding `scanned` starts at `line_start`.
    let (mut scanned, mut breaks, mut line_start) = (0usize, 0usize, 0usize);
    // The first line break at or after some offset (or the text's end), kept while the matches
    // still end before it.
    let mut next_break: Option<usize> = None;
    for &at in positions {
        let seen = bytes.get(scanned..at).unwrap_or_default();
        breaks += seen.iter().filter(|b| **b == b'\n').count();
        if let Some(i) = seen.iter().rposition(|b| *b == b'\n') {
            line_start = scanned + i + 1;
        }
        scanned = at.max(scanned);
        let end = at + old.len();
        let line_end = if old.ends_with('\n') {
            end
        } else {
            let at_break = match next_break {
                Some(b) if b >= end => b,
                _ => {
                    let rest = bytes.get(end..).unwrap_or_default();
                    let b = rest
                        .iter()
                        .position(|c| *c == b'\n')
                        .map_or(text.len(), |i| end + i);
                    next_break = Some(b);
                    b
                }
            };
            (at_break + 1).min(text.len())
        };
        match hunks.last_mut() {
            Some((_, last_end, _, matches)) if line_start <= *last_end => {
                *last_end = line_end.max(*last_end);
                matches.push(at);
            }
            _ => hunks.push((line_start, line_end, breaks + 1, vec![at])),
        }
    }
    let mut out = String::new();
    let mut shown = 0usize;
    let mut line_shift: isize = 0;
    for (i, (start, end, old_first, matches)) in hunks.iter().enumerate() {
        let old_region = text.get(*start..*end).unwrap_or_default();
        let mut new_region = String::new();
        let mut cursor = *start;
        for &at in matches {
            new_region.push_str(text.get(cursor..at).unwrap_or_default());
            new_region.push_str(new);
            cursor = at + old.len();
        }
        new_region.push_str(text.get(cursor..*end).unwrap_or_default());
        let old_first = *old_first;
        let old_count = old_region.lines().count();
        let new_count = new_region.lines().count();
        let new_first = old_first.saturating_add_signed(line_shift);
        let _ = writeln!(
            out,
            "@@ -{old_first},{old_count} +{new_first},{new_count} @@"
        );
        for (sign, region) in [('-', old_region), ('+', new_region.as_str())] {
            for l in region.lines() {
                if shown == MAX_DIFF_LINES {
                    let _ = write!(
                        out,
                        "[... the diff goes on: {} more hunks]",
                        hunks.len() - i
                    );
                    return out;
                }
                let _ = writeln!(out, "{sign}{}", cut_line(l));
                shown += 1;
            }
        }
        line_shift += new_count as isize - old_count as isize;
    }
    out
}

// `list_dir`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListDirArgs {
    /// The folder, relative to the workspace root (default: the root).
    #[serde(default)]
    path: Option<String>,
}

pub(crate) fn list_dir(name: &str, limits: &FileLimits) -> Tool {
    file_tool(
        name,
        "Lists a folder of the workspace, sorted by name: folders end with `/`, symbolic links \
         with `@`, files show their size. Example: {\"path\": \"src\"}",
        limits,
        |b| b.idempotent(true),
        list_dir_body,
    )
}

fn list_dir_body(
    limits: &FileLimits,
    args: ListDirArgs,
    call: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let path = limits
        .workspace
        .resolve(args.path.as_deref().unwrap_or("."))?;
    refused_base_now(limits, args.path.as_deref(), &path, call.approved)?;
    let shown = limits.workspace.shown(&path);
    // Opened from the root one folder at a time, links refused: a folder swapped for a link
    // since the check is not listed.
    let dir = crate::beneath::open_folder(limits.workspace.root(), &path)
        .map_err(|e| io_error(&shown, &e))?;
    let withheld = Withheld::new(limits.withheld.as_deref(), &limits.workspace);
    // Read as a stream up to the bound, asking between entries whether the call is still
    // wanted: a folder of millions of entries, or one a process keeps filling, is not read
    // whole before the answer.
    let read = crate::beneath::entries(&dir, limits.max_entries_read, &|| call.check().is_err())
        .map_err(|e| call.check().err().unwrap_or_else(|| io_error(&shown, &e)))?;
    let entries: Vec<(String, String)> = read
        .names
        .into_iter()
        .filter(|(name, _)| !withheld.skips(&path.join(name)))
        .map(|(name, kind)| {
            let text = name.to_string_lossy().into_owned();
            let line = match kind {
                rustix::fs::FileType::Symlink => format!("{text}@"),
                rustix::fs::FileType::Directory => format!("{text}/"),
                _ => match crate::beneath::size_of(&dir, &name) {
                    Some(size) => format!("{text} ({size} bytes)"),
                    None => text.clone(),
                },
            };
            (text, line)
        })
        .collect();
    let total = entries.len();
    let cut = read.cut.then(|| {
        format!(
            "[{shown} holds more than {} entries: only that many were read, as the file system \
             gave them, so this list is not whole and not the first by name: list a folder \
             below it, or find files with glob]",
            limits.max_entries_read
        )
    });
    if total == 0 {
        let text = match withheld
            .note()
            .into_iter()
            .chain(cut)
            .reduce(|a, b| a + "\n" + &b)
        {
            Some(note) => format!("(nothing in {shown} to show)\n{note}"),
            None => format!("({shown} is empty)"),
        };
        return Ok(ToolOutput::text(text));
    }
    let mut out: Vec<String> = entries
        .into_iter()
        .take(limits.max_results)
        .map(|(_, line)| line)
        .collect();
    if total > limits.max_results {
        let in_all = if cut.is_some() { "read" } else { "in all" };
        out.push(format!(
            "[{} more entries not shown: {total} {in_all}]",
            total - limits.max_results
        ));
    }
    out.extend(cut);
    out.extend(withheld.note());
    Ok(ToolOutput::text(out.join("\n")))
}

// `glob`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GlobArgs {
    /// The pattern, relative to `path`: `*` matches within a folder name, `**` across folders,
    /// `{a,b}` either.
    pattern: String,
    /// The folder to search from, relative to the workspace root (default: the root).
    #[serde(default)]
    path: Option<String>,
}

pub(crate) fn glob(name: &str, limits: &FileLimits) -> Tool {
    file_tool(
        name,
        "Finds files of the workspace whose path matches a glob pattern, sorted. `*` matches \
         within one folder name, `**` across folders. Folders named .git are skipped. Example: \
         {\"pattern\": \"**/*.rs\", \"path\": \"crates\"}",
        limits,
        |b| b.idempotent(true),
        glob_body,
    )
}

fn compile_glob(pattern: &str) -> Result<globset::GlobMatcher, ToolError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| {
            ToolError::new(
                "invalid_pattern",
                format!(
                    "{} is not a valid glob: {}",
                    Echoed(pattern).quoted(),
                    e.kind()
                ),
            )
            .permanent()
        })
}

/// What a walk says when its answer is not whole: the folders it did not enter for their depth,
/// and those it walked in part for their size.
#[derive(Default)]
struct Unwalked {
    too_deep: std::cell::Cell<usize>,
    cut: std::cell::Cell<usize>,
}

/// The entries under `base` (a folder the workspace resolved), links not followed, `.git` folders
/// and the entries `skip` is true for left out, in name order; every folder opened from the root
/// down, links refused; the folders too deep to enter, or walked in part, counted in `unwalked`
/// ([`unwalked_notes`]); stopped when the call is no longer `wanted`.
fn walk<'a>(
    limits: &FileLimits,
    base: &Path,
    shown: &str,
    skip: &'a dyn Fn(&Path) -> bool,
    unwalked: &'a Unwalked,
    stop: &'a dyn Fn() -> bool,
) -> Result<crate::beneath::Walk<'a>, ToolError> {
    crate::beneath::Walk::new(limits.workspace.root(), base, limits.max_entries_read, stop)
        .map(|w| {
            w.skipping(skip)
                .counting_too_deep(&unwalked.too_deep)
                .counting_cut(&unwalked.cut)
        })
        .map_err(|e| io_error(shown, &e))
}

/// The notes that end a walk's answer when it left folders unentered for their depth, or
/// walked some in part for their size.
fn unwalked_notes(unwalked: &Unwalked, most: usize) -> Vec<String> {
    let depth = crate::beneath::MAX_WALK_DEPTH;
    let deep = match unwalked.too_deep.get() {
        0 => None,
        1 => Some(format!(
            "[1 folder more than {depth} levels down was not entered: search from a deeper path]"
        )),
        n => Some(format!(
            "[{n} folders more than {depth} levels down were not entered: search from a deeper path]"
        )),
    };
    let cut = match unwalked.cut.get() {
        0 => None,
        n => Some(format!(
            "[{n} folder{} held more entries than the {most} a search holds at once: only part \
             of {} was searched, so the answer is not whole: search from a narrower path]",
            if n == 1 { "" } else { "s" },
            if n == 1 { "it" } else { "each" },
        )),
    };
    deep.into_iter().chain(cut).collect()
}

fn glob_body(
    limits: &FileLimits,
    args: GlobArgs,
    wanted: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let matcher = compile_glob(&args.pattern)?;
    let base = limits
        .workspace
        .resolve(args.path.as_deref().unwrap_or("."))?;
    refused_base_now(limits, args.path.as_deref(), &base, wanted.approved)?;
    let shown_base = limits.workspace.shown(&base);
    if !base.is_dir() {
        return Err(
            ToolError::new("not_a_folder", format!("{shown_base} is not a folder")).permanent(),
        );
    }
    let withheld = Withheld::new(limits.withheld.as_deref(), &limits.workspace);
    let skip = |path: &Path| withheld.skips(path);
    let unwalked = Unwalked::default();
    let stop = || wanted.check().is_err();
    let mut found = Vec::new();
    let mut more = 0usize;
    for entry in walk(limits, &base, &shown_base, &skip, &unwalked, &stop)? {
        wanted.check()?;
        if entry.kind == rustix::fs::FileType::Directory {
            continue;
        }
        let Ok(rel) = entry.path.strip_prefix(&base) else {
            continue;
        };
        if matcher.is_match(rel) {
            if found.len() < limits.max_results {
                found.push(limits.workspace.display(&entry.path));
            } else {
                more += 1;
            }
        }
    }
    let mut text = if found.is_empty() {
        format!(
            "no files match {} under {shown_base}",
            Echoed(&args.pattern).quoted()
        )
    } else {
        found.join("\n")
    };
    if more > 0 {
        let _ = write!(
            text,
            "\n[{more} more matches not shown: narrow the pattern]"
        );
    }
    let notes = unwalked_notes(&unwalked, limits.max_entries_read);
    for note in notes.into_iter().chain(withheld.note()) {
        let _ = write!(text, "\n{note}");
    }
    Ok(ToolOutput::text(text))
}

// `grep`'s arguments (a plain comment: a doc comment would become the schema's description).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrepArgs {
    /// A regular expression (Rust `regex` syntax), matched against each line.
    pattern: String,
    /// The file or folder to search, relative to the workspace root (default: the root).
    #[serde(default)]
    path: Option<String>,
    /// Only files whose path (relative to `path`) matches this glob, such as `**/*.rs`.
    #[serde(default)]
    glob: Option<String>,
    /// Ignore case (default false).
    #[serde(default)]
    case_insensitive: bool,
}

pub(crate) fn grep(name: &str, limits: &FileLimits) -> Tool {
    let description = format!(
        "Searches the text files of the workspace for lines matching a regular expression \
         (Rust regex syntax). Answers `path:line: text` per match, at most {} matches; binary \
         files and .git folders are skipped. Example: {{\"pattern\": \"fn \\\\w+_test\", \
         \"path\": \"src\", \"glob\": \"**/*.rs\"}}",
        limits.max_results
    );
    file_tool(
        name,
        &description,
        limits,
        |b| b.idempotent(true),
        grep_body,
    )
}

/// A file's text as `grep` searches it (invalid UTF-8 read lossily), or why it cannot be: not
/// a regular file, unreadable, too large, or binary.
fn searched_text(limits: &FileLimits, file: &Path) -> Result<String, ToolError> {
    let shown = limits.workspace.shown(file);
    let (opened, meta) = open_regular(limits.workspace.root(), file, &shown)?;
    let too_large = || {
        ToolError::new(
            "file_too_large",
            format!("{shown} has more than the {MAX_WHOLE_FILE_BYTES} bytes this tool searches"),
        )
        .permanent()
    };
    if meta.len() > MAX_WHOLE_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // Bounded again as it is read: the file may have grown since its size was taken.
    opened
        .take(MAX_WHOLE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(&shown, &e))?;
    if bytes.len() as u64 > MAX_WHOLE_FILE_BYTES {
        return Err(too_large());
    }
    if looks_binary(&bytes) {
        return Err(binary_error(&shown));
    }
    Ok(String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// Why `grep` refuses a regular expression. A short one reads as the `regex` crate writes it,
/// drawn whole under a caret; a long one is named by its first characters and its length
/// ([`Echoed`]), and the reason is taken from the parser itself, since the `regex` crate's
/// message would draw it whole (twice its length, with the caret's line).
fn invalid_regex(pattern: &str, case_insensitive: bool, e: &regex::Error) -> ToolError {
    let echoed = Echoed(pattern);
    let message = if echoed.is_whole() {
        format!("not a valid regular expression: {e}")
    } else {
        let why = match e {
            regex::Error::Syntax(_) => regex_syntax::ParserBuilder::new()
                .case_insensitive(case_insensitive)
                .build()
                .parse(pattern)
                .err()
                .and_then(|syntax| regex_syntax_reason(pattern, &syntax)),
            // Its size past the limit, which does not name the pattern.
            other => Some(other.to_string()),
        };
        let quoted = echoed.quoted();
        match why {
            Some(why) => format!("not a valid regular expression: {quoted}: {why}"),
            None => format!("not a valid regular expression: {quoted}"),
        }
    };
    ToolError::new("invalid_pattern", message).permanent()
}

/// A syntax error's kind and where it starts, counted in characters from 1 (none for a kind of
/// error this version does not know, whose message would draw the pattern whole).
fn regex_syntax_reason(pattern: &str, error: &regex_syntax::Error) -> Option<String> {
    let (kind, offset) = match error {
        regex_syntax::Error::Parse(e) => (e.kind().to_string(), e.span().start.offset),
        regex_syntax::Error::Translate(e) => (e.kind().to_string(), e.span().start.offset),
        _ => return None,
    };
    let at = pattern.get(..offset).map_or(0, |s| s.chars().count()) + 1;
    Some(format!("{kind} at character {at}"))
}

fn grep_body(
    limits: &FileLimits,
    args: GrepArgs,
    wanted: &Wanted,
) -> Result<ToolOutput, ToolError> {
    let regex = regex::RegexBuilder::new(&args.pattern)
        .case_insensitive(args.case_insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| invalid_regex(&args.pattern, args.case_insensitive, &e))?;
    let filter = args.glob.as_deref().map(compile_glob).transpose()?;
    let base = limits
        .workspace
        .resolve(args.path.as_deref().unwrap_or("."))?;
    refused_base_now(limits, args.path.as_deref(), &base, wanted.approved)?;
    let mut out = String::new();
    let mut count = 0usize;
    let mut stopped = None;
    let withheld = Withheld::new(limits.withheld.as_deref(), &limits.workspace);
    let skip = |path: &Path| withheld.skips(path);
    let unwalked = Unwalked::default();
    let stop = || wanted.check().is_err();
    // A single file was judged with the call itself (by the gate, and again above): only a
    // walk leaves out.
    let single = !base.is_dir();
    let files: Box<dyn Iterator<Item = PathBuf> + '_> = if !single {
        Box::new(
            walk(
                limits,
                &base,
                &limits.workspace.shown(&base),
                &skip,
                &unwalked,
                &stop,
            )?
            .filter(|e| e.kind == rustix::fs::FileType::RegularFile)
            .map(|e| e.path),
        )
    } else {
        Box::new(std::iter::once(base.clone()))
    };
    'files: for file in files {
        wanted.check()?;
        if let (Some(filter), Ok(rel)) = (&filter, file.strip_prefix(&base))
            && !filter.is_match(rel)
        {
            continue;
        }
        let text = match searched_text(limits, &file) {
            Ok(text) => text,
            // A walk passes over what it cannot search; a file named alone is the whole
            // search, and "no lines match" would say it was searched.
            Err(e) if single => return Err(e),
            Err(_) => continue,
        };
        let shown = limits.workspace.display(&file);
        for (i, line) in text.lines().enumerate() {
            if !regex.is_match(line) {
                continue;
            }
            if count == limits.max_results {
                stopped = Some(format!(
                    "[stopped at {count} matches: narrow the pattern, the path or the glob]"
                ));
                break 'files;
            }
            let entry = format!("{shown}:{}: {}\n", i + 1, cut_line(line));
            if out.len() + entry.len() > limits.max_bytes {
                stopped = Some(format!(
                    "[stopped at the {} byte cap after {count} matches: narrow the search]",
                    limits.max_bytes
                ));
                break 'files;
            }
            out.push_str(&entry);
            count += 1;
        }
    }
    if count == 0 && stopped.is_none() {
        let _ = writeln!(out, "no lines match {}", Echoed(&args.pattern).quoted());
    }
    if let Some(note) = stopped {
        out.push_str(&note);
        out.push('\n');
    }
    let notes = unwalked_notes(&unwalked, limits.max_entries_read);
    for note in notes.into_iter().chain(withheld.note()) {
        out.push_str(&note);
        out.push('\n');
    }
    Ok(ToolOutput::text(out.trim_end().to_owned()))
}

// outside-paths: off (the tests below try hostile paths on purpose)
#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )]
    use super::*;
    use crate::testing::{call, code};
    use agentloop::permissions::{ArgumentMatch, PermissionRule, PermissionStore};
    use serde_json::{Value, json};
    use std::os::unix::fs::symlink;

    struct Fixture {
        dir: tempfile::TempDir,
        limits: FileLimits,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("root/src")).unwrap();
            std::fs::create_dir_all(dir.path().join("outside")).unwrap();
            std::fs::write(dir.path().join("outside/secret.txt"), "top secret\n").unwrap();
            std::fs::write(
                dir.path().join("root/src/main.rs"),
                "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\n",
            )
            .unwrap();
            let limits = FileLimits {
                workspace: Workspace::new(dir.path().join("root")).unwrap(),
                max_bytes: DEFAULT_MAX_READ_BYTES,
                max_results: DEFAULT_MAX_RESULTS,
                max_entries_read: crate::beneath::MAX_ENTRIES_READ,
                withheld: None,
            };
            Fixture { dir, limits }
        }

        fn root(&self) -> PathBuf {
            self.limits.workspace.root().to_path_buf()
        }

        fn outside(&self) -> PathBuf {
            self.dir.path().join("outside")
        }

        async fn call(
            &self,
            make: fn(&str, &FileLimits) -> Tool,
            args: Value,
        ) -> Result<String, ToolError> {
            call(&make("t", &self.limits), args)
                .await
                .map(|(text, _)| text)
        }
    }

    #[tokio::test]
    async fn read_file_numbers_lines_and_reads_ranges() {
        let f = Fixture::new();
        let all = f
            .call(read_file, json!({"path": "src/main.rs"}))
            .await
            .unwrap();
        assert_eq!(all.lines().count(), 4);
        assert!(all.starts_with("     1\tfn main() {\n"), "{all}");
        let part = f
            .call(
                read_file,
                json!({"path": "src/main.rs", "offset": 2, "limit": 1}),
            )
            .await
            .unwrap();
        assert_eq!(
            part,
            "     2\t    let x = 1;\n[more lines follow: call again with offset=3]"
        );
        let past = f
            .call(read_file, json!({"path": "src/main.rs", "offset": 9}))
            .await
            .unwrap();
        assert!(past.contains("has 4 lines"), "{past}");
    }

    #[tokio::test]
    async fn read_file_stops_at_the_size_cap_and_says_where_to_go_on() {
        let mut f = Fixture::new();
        f.limits.max_bytes = 40;
        let text: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        std::fs::write(f.root().join("long.txt"), text).unwrap();
        let got = f
            .call(read_file, json!({"path": "long.txt"}))
            .await
            .unwrap();
        assert!(got.len() < 120, "{got}");
        assert!(
            got.contains("[cut at the 40 byte cap: call again with offset=3]"),
            "{got}"
        );
        std::fs::write(f.root().join("wide.txt"), "x".repeat(500)).unwrap();
        let wide = f
            .call(read_file, json!({"path": "wide.txt"}))
            .await
            .unwrap();
        assert!(wide.contains("longer than the 40 byte cap"), "{wide}");
        // Read only to the cap, a line of two-byte characters is cut between two of them, not
        // taken for a binary file.
        std::fs::write(f.root().join("accents.txt"), "é".repeat(500)).unwrap();
        let cut = f
            .call(read_file, json!({"path": "accents.txt"}))
            .await
            .unwrap();
        assert!(cut.contains("longer than the 40 byte cap"), "{cut}");
        assert!(cut.contains("éé"), "{cut}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_named_pipe_is_refused_at_once_not_waited_on() {
        let f = Fixture::new();
        let fifo = f.root().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Were the open to wait for a writer, this one comes after 3 s and lets it go on, so the
        // test fails rather than hangs (without a reader waiting, its own open fails at once).
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                use std::os::unix::fs::OpenOptionsExt;
                std::thread::sleep(std::time::Duration::from_secs(3));
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(fifo);
            })
        };
        let started = std::time::Instant::now();
        let read = f
            .call(read_file, json!({"path": "pipe"}))
            .await
            .unwrap_err();
        assert_eq!(code(&read), "not_a_file", "{read}");
        let grep = f
            .call(grep, json!({"pattern": "x", "path": "pipe"}))
            .await
            .unwrap_err();
        assert_eq!(code(&grep), "not_a_file", "{grep}");
        let edit = f
            .call(
                edit_file,
                json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&edit), "not_a_file", "{edit}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        writer.join().unwrap();
    }

    #[tokio::test]
    async fn binary_files_are_refused_clearly() {
        let f = Fixture::new();
        std::fs::write(f.root().join("image.png"), b"\x89PNG\r\n\x1a\n\0\0\0rest").unwrap();
        std::fs::write(f.root().join("latin1.txt"), b"caf\xe9\n").unwrap();
        for path in ["image.png", "latin1.txt"] {
            let e = f.call(read_file, json!({"path": path})).await.unwrap_err();
            assert_eq!(code(&e), "binary_file", "{path}");
            assert!(e.to_string().contains("binary file"), "{e}");
        }
        let e = f
            .call(
                edit_file,
                json!({"path": "image.png", "old_string": "PNG", "new_string": "GIF"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "binary_file");
    }

    #[tokio::test]
    async fn every_escape_is_refused_by_every_file_tool() {
        let f = Fixture::new();
        symlink(f.outside().join("secret.txt"), f.root().join("file_link")).unwrap();
        symlink(f.outside(), f.root().join("dir_link")).unwrap();
        let secret = f.outside().join("secret.txt").display().to_string();
        let escapes = [
            ("file_link", "path_outside_root"),
            ("dir_link/secret.txt", "path_outside_root"),
            ("../outside/secret.txt", "path_parent_dir"),
            (secret.as_str(), "path_absolute"),
        ];
        for (path, want) in escapes {
            let e = f.call(read_file, json!({"path": path})).await.unwrap_err();
            assert_eq!(code(&e), want, "read_file {path}");
            let e = f
                .call(write_file, json!({"path": path, "content": "pwned"}))
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "write_file {path}");
            let e = f
                .call(
                    edit_file,
                    json!({"path": path, "old_string": "top", "new_string": "no"}),
                )
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "edit_file {path}");
            let e = f
                .call(grep, json!({"pattern": "secret", "path": path}))
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "grep {path}");
        }
        for (path, want) in [
            ("dir_link", "path_outside_root"),
            ("..", "path_parent_dir"),
            ("/", "path_absolute"),
        ] {
            let e = f.call(list_dir, json!({"path": path})).await.unwrap_err();
            assert_eq!(code(&e), want, "list_dir {path}");
            let e = f
                .call(glob, json!({"pattern": "*", "path": path}))
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "glob {path}");
        }
        // A linked folder used as the parent of a new file: nothing is created outside.
        let e = f
            .call(
                write_file,
                json!({"path": "dir_link/new/planted.txt", "content": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "path_outside_root");
        assert!(!f.outside().join("new").exists());
        assert_eq!(
            std::fs::read_to_string(f.outside().join("secret.txt")).unwrap(),
            "top secret\n"
        );
        // Searching the root never follows the links out.
        let found = f.call(grep, json!({"pattern": "secret"})).await.unwrap();
        assert!(found.starts_with("no lines match"), "{found}");
        let listed = f.call(glob, json!({"pattern": "**"})).await.unwrap();
        assert!(!listed.contains("secret"), "{listed}");
    }

    /// A folder `d` that another process keeps swapping with a link to a folder outside (one
    /// atomic rename each time), as the model's own shell could: listing, globbing and grepping
    /// it never show what is outside, whenever the swap falls.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_folder_swapped_for_a_link_while_listed_or_walked_shows_nothing_outside() {
        let f = Fixture::new();
        std::fs::create_dir_all(f.root().join("d/sub")).unwrap();
        std::fs::write(f.root().join("d/sub/inside.txt"), "inside\n").unwrap();
        std::fs::create_dir_all(f.outside().join("sub")).unwrap();
        std::fs::write(f.outside().join("sub/secret.txt"), "top secret\n").unwrap();
        symlink(f.outside(), f.root().join("swap")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, root) = (stop.clone(), f.root());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        root.join("d"),
                        rustix::fs::CWD,
                        root.join("swap"),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let mut leaks = Vec::new();
        for _ in 0..300 {
            for (tool, args) in [
                (
                    list_dir as fn(&str, &FileLimits) -> Tool,
                    json!({"path": "d"}),
                ),
                (list_dir, json!({"path": "d/sub"})),
                (glob, json!({"pattern": "**", "path": "d"})),
                (glob, json!({"pattern": "**"})),
                (grep, json!({"pattern": "secret"})),
                (grep, json!({"pattern": "secret", "path": "d"})),
            ] {
                if let Ok(text) = f.call(tool, args.clone()).await
                    && (text.contains("secret.txt") || text.contains("top secret"))
                {
                    leaks.push(format!("{args}: {text}"));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(
            leaks.is_empty(),
            "{} leaks, first: {:?}",
            leaks.len(),
            leaks.first()
        );
    }

    #[tokio::test]
    async fn write_file_creates_folders_replaces_atomically_and_keeps_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let f = Fixture::new();
        let got = f
            .call(
                write_file,
                json!({"path": "a/b/new.txt", "content": "one\ntwo\n"}),
            )
            .await
            .unwrap();
        assert_eq!(got, "created a/b/new.txt (8 bytes, 2 lines)");
        let script = f.root().join("run.sh");
        std::fs::write(&script, "old").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
        let got = f
            .call(
                write_file,
                json!({"path": "run.sh", "content": "echo hi\n"}),
            )
            .await
            .unwrap();
        assert!(got.starts_with("replaced run.sh"), "{got}");
        assert_eq!(std::fs::read_to_string(&script).unwrap(), "echo hi\n");
        let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(f.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".agentloop")),
            "{names:?}"
        );
    }

    #[tokio::test]
    async fn edit_file_needs_a_unique_match_unless_replace_all() {
        let f = Fixture::new();
        std::fs::write(f.root().join("c.txt"), "a = 1\nb = 1\nc = 2\n").unwrap();
        let e = f
            .call(
                edit_file,
                json!({"path": "c.txt", "old_string": "= 1", "new_string": "= 9"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "ambiguous_match");
        assert!(
            e.to_string()
                .contains("occurs 2 times in c.txt (lines 1, 2)"),
            "{e}"
        );
        let e = f
            .call(
                edit_file,
                json!({"path": "c.txt", "old_string": "d = 4", "new_string": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "no_match");
        assert_eq!(
            std::fs::read_to_string(f.root().join("c.txt")).unwrap(),
            "a = 1\nb = 1\nc = 2\n",
            "a refused edit changes nothing"
        );
        let got = f
            .call(
                edit_file,
                json!({"path": "c.txt", "old_string": "= 1", "new_string": "= 9", "replace_all": true}),
            )
            .await
            .unwrap();
        assert_eq!(
            got,
            "edited c.txt: 2 replacements\n@@ -1,2 +1,2 @@\n-a = 1\n-b = 1\n+a = 9\n+b = 9\n"
        );
        assert_eq!(
            std::fs::read_to_string(f.root().join("c.txt")).unwrap(),
            "a = 9\nb = 9\nc = 2\n"
        );
    }

    #[tokio::test]
    async fn edit_file_shows_the_changed_lines_with_their_numbers() {
        let f = Fixture::new();
        let got = f
            .call(
                edit_file,
                json!({"path": "src/main.rs", "old_string": "    let x = 1;\n", "new_string": "    let x = 2;\n    let y = 3;\n"}),
            )
            .await
            .unwrap();
        assert_eq!(
            got,
            "edited src/main.rs: 1 replacement\n@@ -2,1 +2,2 @@\n-    let x = 1;\n+    let x = 2;\n+    let y = 3;\n"
        );
        let got = f
            .call(
                edit_file,
                json!({"path": "src/main.rs", "old_string": "    let y = 3;\n", "new_string": ""}),
            )
            .await
            .unwrap();
        assert_eq!(
            got,
            "edited src/main.rs: 1 replacement\n@@ -3,1 +3,0 @@\n-    let y = 3;\n"
        );
        let got = f
            .call(
                edit_file,
                json!({"path": "src/main.rs", "old_string": "println", "new_string": "eprintln"}),
            )
            .await
            .unwrap();
        assert!(
            got.ends_with("@@ -3,1 +3,1 @@\n-    println!(\"{x}\");\n+    eprintln!(\"{x}\");\n"),
            "{got}"
        );
    }

    #[tokio::test]
    async fn a_search_whose_run_was_cancelled_stops_walking() {
        let f = Fixture::new();
        let ctx = ToolContext::detached("c", "t");
        ctx.cancel.cancel();
        for (make, args) in [
            (
                glob as fn(&str, &FileLimits) -> Tool,
                json!({"pattern": "**/*.rs"}),
            ),
            (grep, json!({"pattern": "main"})),
        ] {
            let e = make("t", &f.limits)
                .call(args, ctx.clone())
                .await
                .unwrap_err();
            assert_eq!(code(&e), "cancelled", "{e}");
        }
        // Not cancelled, the same searches find the file.
        let found = f.call(glob, json!({"pattern": "**/*.rs"})).await.unwrap();
        assert_eq!(found, "src/main.rs");
    }

    #[tokio::test]
    async fn a_body_whose_call_was_dropped_is_told_to_stop() {
        // A timeout drops the call's future; the blocking thread is told, and stops.
        let (tx, rx) = std::sync::mpsc::channel();
        let call = blocking(ToolContext::detached("c", "t"), move |wanted| {
            let start = std::time::Instant::now();
            while wanted.check().is_ok() {
                if start.elapsed() > std::time::Duration::from_secs(20) {
                    let _ = tx.send(false);
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let _ = tx.send(true);
            Ok(())
        });
        let dropped = tokio::time::timeout(std::time::Duration::from_millis(50), call).await;
        assert!(dropped.is_err(), "the body ended on its own");
        let stopped = tokio::task::spawn_blocking(move || {
            rx.recv_timeout(std::time::Duration::from_secs(30))
        })
        .await
        .unwrap()
        .unwrap();
        assert!(stopped, "the body was never told its call was dropped");
    }

    #[tokio::test]
    async fn list_dir_glob_and_grep_find_what_is_there_within_caps() {
        let mut f = Fixture::new();
        std::fs::write(f.root().join("src/lib.rs"), "pub fn lib() {}\n").unwrap();
        std::fs::create_dir_all(f.root().join(".git")).unwrap();
        std::fs::write(f.root().join(".git/config"), "fn hidden\n").unwrap();
        std::fs::write(f.root().join("notes.md"), "no code\n").unwrap();
        let listed = f.call(list_dir, json!({})).await.unwrap();
        assert_eq!(listed, ".git/\nnotes.md (8 bytes)\nsrc/");
        let found = f.call(glob, json!({"pattern": "**/*.rs"})).await.unwrap();
        assert_eq!(found, "src/lib.rs\nsrc/main.rs");
        let found = f
            .call(glob, json!({"pattern": "*.rs", "path": "src"}))
            .await
            .unwrap();
        assert_eq!(found, "src/lib.rs\nsrc/main.rs");
        let hits = f.call(grep, json!({"pattern": r"fn \w+"})).await.unwrap();
        assert_eq!(
            hits,
            "src/lib.rs:1: pub fn lib() {}\nsrc/main.rs:1: fn main() {"
        );
        let hits = f
            .call(
                grep,
                json!({"pattern": "FN MAIN", "case_insensitive": true, "glob": "**/main.rs"}),
            )
            .await
            .unwrap();
        assert_eq!(hits, "src/main.rs:1: fn main() {");
        let e = f.call(grep, json!({"pattern": "("})).await.unwrap_err();
        assert_eq!(code(&e), "invalid_pattern");
        f.limits.max_results = 1;
        let hits = f.call(grep, json!({"pattern": "fn"})).await.unwrap();
        assert!(
            hits.ends_with("[stopped at 1 matches: narrow the pattern, the path or the glob]"),
            "{hits}"
        );
        let listed = f.call(list_dir, json!({})).await.unwrap();
        assert!(
            listed.ends_with("[2 more entries not shown: 3 in all]"),
            "{listed}"
        );
    }

    #[tokio::test]
    async fn grep_on_one_file_says_why_it_could_not_search_it_where_a_walk_passes_over_it() {
        let f = Fixture::new();
        std::fs::write(f.root().join("image.bin"), b"fn\0\x01binary").unwrap();
        let big = usize::try_from(MAX_WHOLE_FILE_BYTES).unwrap() + 1;
        std::fs::write(f.root().join("big.txt"), "fn x\n".repeat(big / 5 + 1)).unwrap();
        for (path, want) in [
            ("missing.rs", "not_found"),
            ("image.bin", "binary_file"),
            ("big.txt", "file_too_large"),
        ] {
            let e = f
                .call(grep, json!({"pattern": "fn", "path": path}))
                .await
                .unwrap_err();
            assert_eq!(code(&e), want, "grep {path}");
        }
        // Walked, they are passed over: the folder's text files are searched.
        let hits = f.call(grep, json!({"pattern": "fn"})).await.unwrap();
        assert_eq!(hits, "src/main.rs:1: fn main() {");
        // One file of text that is not UTF-8 is still searched, read lossily.
        std::fs::write(f.root().join("latin1.txt"), b"caf\xe9 fn\n").unwrap();
        let hits = f
            .call(grep, json!({"pattern": "fn", "path": "latin1.txt"}))
            .await
            .unwrap();
        assert_eq!(hits, "latin1.txt:1: caf\u{fffd} fn");
    }

    #[tokio::test]
    async fn a_write_to_a_hard_link_of_a_file_outside_the_root_leaves_that_file_as_it_was() {
        // `notes.txt` in the root and `outside/secret.txt` are one file by two names (as `ln`
        // makes). A write replaces the name in the root with a new file (rename), so the other
        // name keeps the old one: writing through it would change a file outside the root.
        let f = Fixture::new();
        let outside = f.outside().join("secret.txt");
        std::fs::hard_link(&outside, f.root().join("notes.txt")).unwrap();
        f.call(
            write_file,
            json!({"path": "notes.txt", "content": "overwritten\n"}),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "top secret\n");
        assert_eq!(
            std::fs::read_to_string(f.root().join("notes.txt")).unwrap(),
            "overwritten\n"
        );
        std::fs::remove_file(f.root().join("notes.txt")).unwrap();
        std::fs::hard_link(&outside, f.root().join("notes.txt")).unwrap();
        f.call(
            edit_file,
            json!({"path": "notes.txt", "old_string": "top", "new_string": "no"}),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "top secret\n");
        assert_eq!(
            std::fs::read_to_string(f.root().join("notes.txt")).unwrap(),
            "no secret\n"
        );
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&outside).unwrap().nlink(), 1);
    }

    /// A folder `big` of `n` empty files, `f00000` on.
    fn big_folder(f: &Fixture, n: usize) -> PathBuf {
        let big = f.root().join("big");
        std::fs::create_dir_all(&big).unwrap();
        for i in 0..n {
            std::fs::File::create(big.join(format!("f{i:05}"))).unwrap();
        }
        big
    }

    #[tokio::test]
    async fn a_folder_of_more_entries_than_the_bound_is_read_in_part_and_says_so() {
        let mut f = Fixture::new();
        big_folder(&f, 250);
        f.limits.max_entries_read = 100;
        f.limits.max_results = 10;
        let listed = f.call(list_dir, json!({"path": "big"})).await.unwrap();
        let lines: Vec<&str> = listed.lines().collect();
        assert_eq!(lines.len(), 12, "{listed}");
        assert_eq!(
            lines[10], "[90 more entries not shown: 100 read]",
            "{listed}"
        );
        assert!(
            lines[11].starts_with("[big holds more than 100 entries: only that many were read"),
            "{listed}"
        );
        // A walk holds no more either: a search finds what it read, and says it is not whole.
        f.limits.max_results = 1000;
        let found = f.call(glob, json!({"pattern": "**/f*"})).await.unwrap();
        let (files, notes): (Vec<&str>, Vec<&str>) =
            found.lines().partition(|l| !l.starts_with('['));
        assert!(files.len() < 100, "{} files found", files.len());
        assert_eq!(notes.len(), 1, "{found}");
        assert!(
            notes[0].starts_with("[1 folder held more entries than the 100 a search holds"),
            "{found}"
        );
        let hits = f.call(grep, json!({"pattern": "x"})).await.unwrap();
        assert!(hits.contains("[1 folder held more entries"), "{hits}");
        // Within the bound, nothing is said.
        (f.limits.max_entries_read, f.limits.max_results) = (1000, 10);
        let listed = f.call(list_dir, json!({"path": "big"})).await.unwrap();
        assert!(
            listed.ends_with("[240 more entries not shown: 250 in all]"),
            "{listed}"
        );
    }

    #[tokio::test]
    async fn a_listing_of_a_large_folder_stops_when_its_call_is_cancelled() {
        let f = Fixture::new();
        big_folder(&f, 3000);
        let ctx = ToolContext::detached("c", "t");
        ctx.cancel.cancel();
        let e = list_dir("t", &f.limits)
            .call(json!({"path": "big"}), ctx)
            .await
            .unwrap_err();
        assert_eq!(code(&e), "cancelled", "{e}");
        let listed = f.call(list_dir, json!({"path": "big"})).await.unwrap();
        assert!(
            listed.ends_with("[2800 more entries not shown: 3000 in all]"),
            "{listed}"
        );
    }

    /// Paths as the workspace resolves them, as the CLI gives its store for a built-in tool.
    #[derive(Debug)]
    struct Resolver(Workspace);

    impl agentloop::permissions::ResolvePaths for Resolver {
        fn root(&self) -> &Path {
            self.0.root()
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            self.0.resolve(path).ok()
        }
    }

    impl Fixture {
        /// Has the tools leave out and refuse what these path rules (for every tool) cover,
        /// resolved as the tools resolve; the store the gate would decide with.
        fn withhold(&mut self, rules: &[(&str, Permission)]) -> PermissionStore {
            let mut store = PermissionStore::new(Permission::Allow);
            store.resolve_paths("*", Arc::new(Resolver(self.limits.workspace.clone())));
            for (glob, permission) in rules {
                store.configure(path_rule("*", glob, *permission));
            }
            self.limits.workspace = self.limits.workspace.clone().withhold(&store);
            store
        }
    }

    fn path_rule(tool: &str, glob: &str, permission: Permission) -> PermissionRule {
        PermissionRule {
            tool: tool.into(),
            arguments: Some(ArgumentMatch::PathGlob {
                field: "path".into(),
                glob: glob.into(),
            }),
            permission,
        }
    }

    #[tokio::test]
    async fn an_edit_that_would_grow_the_file_past_the_cap_is_refused_before_it_is_built() {
        // A megabyte of one letter, each replaced by 32 bytes: 32 MiB, past the 16 MiB an edit
        // takes (a longer `new_string` would ask for terabytes).
        let f = Fixture::new();
        let path = f.root().join("x.txt");
        std::fs::write(&path, "x".repeat(1 << 20)).unwrap();
        let args = json!({
            "path": "x.txt",
            "old_string": "x",
            "new_string": "y".repeat(32),
            "replace_all": true,
        });
        let e = f.call(edit_file, args).await.unwrap_err();
        assert_eq!(code(&e), "file_too_large");
        assert!(e.to_string().contains("33554432 bytes"), "{e:?}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            1 << 20,
            "left as it was"
        );
        // Up to the cap, the edit is made.
        let args = json!({
            "path": "x.txt",
            "old_string": "x",
            "new_string": "y".repeat(16),
            "replace_all": true,
        });
        f.call(edit_file, args).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 << 20);
    }

    #[test]
    fn reading_past_an_endless_line_stops_when_the_call_is_cancelled() {
        // A line of text, then a terabyte of zeros with no line break (sparse: no disk used):
        // reading from line 3 skips line 2, which would take the blocking thread the whole
        // terabyte, long past any timeout.
        let f = Fixture::new();
        let path = f.root().join("sparse.txt");
        let file = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, &[b'x'; SNIFF_BYTES]).unwrap();
        std::io::Write::write_all(&mut &file, b"\n").unwrap();
        file.set_len(1 << 40).unwrap();
        let ctx = ToolContext::detached("c", "t");
        let cancel = ctx.cancel.clone();
        let call = read_file("t", &f.limits).call(json!({"path": "sparse.txt", "offset": 3}), ctx);
        let answered = within_seconds(20, async {
            let call = tokio::spawn(call);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            cancel.cancel();
            call.await.unwrap()
        })
        .expect("the read stops within seconds of its cancellation");
        assert_eq!(code(&answered.unwrap_err()), "cancelled");
    }

    /// What `work` gives, on a runtime of its own, if it ends within `secs`. The runtime is left
    /// without waiting for its blocking threads: a blocking body that goes on fails the test
    /// rather than hold it for as long as the body would run.
    fn within_seconds<T>(secs: u64, work: impl std::future::Future<Output = T>) -> Option<T> {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let done = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(secs), work).await
        });
        runtime.shutdown_background();
        done.ok()
    }

    #[test]
    fn an_edit_of_millions_of_matches_on_one_line_answers_in_time_with_its_lines_cut() {
        // 4 MiB of one letter, no line break, each replaced: a diff that looked for each
        // match's line (back to its start, forward to its end) read the text millions of times.
        let f = Fixture::new();
        std::fs::write(f.root().join("x.txt"), "x".repeat(4 << 20)).unwrap();
        let args =
            json!({"path": "x.txt", "old_string": "x", "new_string": "y", "replace_all": true});
        let edit = edit_file("t", &f.limits).call(args, ToolContext::detached("c", "t"));
        let answer = within_seconds(20, edit)
            .expect("the edit answers within seconds")
            .unwrap();
        let agentloop::message::ToolContent::Text(text) = answer.content else {
            panic!("not text: {answer:?}");
        };
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"edited x.txt: 4194304 replacements"));
        assert_eq!(lines.get(1), Some(&"@@ -1,1 +1,1 @@"));
        let cut = |sign: &str, letter: &str| format!("{sign}{}…", letter.repeat(300));
        let (removed, added) = (cut("-", "x"), cut("+", "y"));
        assert_eq!(lines[2..], [removed.as_str(), added.as_str()]);
        assert_eq!(
            std::fs::read_to_string(f.root().join("x.txt")).unwrap(),
            "y".repeat(4 << 20)
        );
    }

    #[tokio::test]
    async fn a_search_says_which_folders_were_too_deep_to_enter() {
        // `a.txt` holding "needle" at each of 100 levels: the walk from `deep` holds at most
        // MAX_WALK_DEPTH folders open, `deep` and those below it down to the cap, whose `a.txt`
        // are found (one line each, and the note), and says that it left the rest.
        let f = Fixture::new();
        let mut folder = f.root().join("deep");
        for _ in 0..100 {
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join("a.txt"), "needle\n").unwrap();
            folder.push("d");
        }
        let note = "[1 folder more than 64 levels down was not entered: search from a deeper path]";
        for (make, args) in [
            (
                glob as fn(&str, &FileLimits) -> Tool,
                json!({"pattern": "**/a.txt", "path": "deep"}),
            ),
            (grep, json!({"pattern": "needle", "path": "deep"})),
        ] {
            let answer = f.call(make, args).await.unwrap();
            let lines = answer.lines().count();
            assert_eq!(lines, crate::beneath::MAX_WALK_DEPTH + 1, "{answer}");
            assert!(answer.ends_with(note), "{answer}");
        }
        // Searched from a deeper folder, the rest is found.
        let deeper = ["deep"]
            .into_iter()
            .chain(["d"; 60])
            .collect::<Vec<_>>()
            .join("/");
        let found = f
            .call(glob, json!({"pattern": "**/a.txt", "path": deeper}))
            .await
            .unwrap();
        assert_eq!(found.lines().count(), 40, "{found}");
    }

    #[tokio::test]
    async fn a_path_that_leads_to_a_denied_file_when_the_call_runs_is_refused() {
        let mut f = Fixture::new();
        for folder in ["secrets", "drafts"] {
            std::fs::create_dir_all(f.root().join(folder)).unwrap();
        }
        std::fs::write(f.root().join("secrets/key.pem"), "PRIVATE KEY\n").unwrap();
        std::fs::write(f.root().join("drafts/plan.txt"), "a plan\n").unwrap();
        let store = f.withhold(&[
            ("secrets/**", Permission::Deny),
            ("drafts/**", Permission::Ask),
        ]);
        // The gate allowed `notes.txt` (nothing there yet); then another call of the batch made
        // it a link to the key.
        assert_eq!(
            store.decide("t", &json!({"path": "notes.txt"})),
            Permission::Allow
        );
        symlink("secrets/key.pem", f.root().join("notes.txt")).unwrap();
        let read = f.call(read_file, json!({"path": "notes.txt"})).await;
        assert_eq!(code(&read.unwrap_err()), "path_denied");
        let written = f
            .call(write_file, json!({"path": "notes.txt", "content": "x"}))
            .await;
        assert_eq!(code(&written.unwrap_err()), "path_denied");
        let edited = f
            .call(
                edit_file,
                json!({"path": "notes.txt", "old_string": "PRIVATE", "new_string": "x"}),
            )
            .await;
        assert_eq!(code(&edited.unwrap_err()), "path_denied");
        // A search of the file by that name too: a walk judges what it meets below its path,
        // and the path itself is judged as the other tools judge theirs.
        let searched = f
            .call(grep, json!({"pattern": ".", "path": "notes.txt"}))
            .await;
        assert_eq!(code(&searched.unwrap_err()), "path_denied");
        assert_eq!(
            std::fs::read_to_string(f.root().join("secrets/key.pem")).unwrap(),
            "PRIVATE KEY\n"
        );
        // A path no rule matches is read as before.
        let plain = f.call(read_file, json!({"path": "src/main.rs"})).await;
        assert!(plain.unwrap().contains("fn main"));
    }

    #[test]
    fn a_link_swapped_while_the_call_runs_never_lets_a_denied_file_be_read() {
        // Another process (a subagent's shell, run beside this call) swaps `notes.txt` between
        // a link to a plain file and a link to the key, as fast as it can: whenever the call
        // reads, what it read was judged, never a file that changed between judging and
        // opening.
        let mut f = Fixture::new();
        std::fs::create_dir_all(f.root().join("secrets")).unwrap();
        std::fs::write(f.root().join("secrets/key.pem"), "PRIVATE KEY\n").unwrap();
        std::fs::write(f.root().join("plain.txt"), "plain\n").unwrap();
        f.withhold(&[("secrets/**", Permission::Deny)]);
        let root = f.root();
        symlink("secrets/key.pem", root.join("to-key")).unwrap();
        symlink("plain.txt", root.join("to-plain")).unwrap();
        symlink("plain.txt", root.join("notes.txt")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (root, stop) = (root.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for target in ["to-key", "to-plain"] {
                        // A copy of the prepared link, renamed over the name: always a link.
                        let _ = std::fs::remove_file(root.join("next"));
                        if let Ok(to) = std::fs::read_link(root.join(target)) {
                            let _ = symlink(to, root.join("next"));
                            let _ = std::fs::rename(root.join("next"), root.join("notes.txt"));
                        }
                    }
                }
            })
        };
        let tool = read_file("t", &f.limits);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let mut read = 0;
        for _ in 0..3000 {
            let got = runtime.block_on(tool.call(
                json!({"path": "notes.txt"}),
                ToolContext::detached("c", "t"),
            ));
            if let Ok(out) = got {
                let text = format!("{:?}", out.content);
                assert!(!text.contains("PRIVATE"), "the key was read: {text}");
                read += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(read > 0, "some reads found the plain file");
    }

    #[tokio::test]
    async fn a_path_that_leads_to_an_asked_file_when_the_call_runs_needs_a_person_s_approval() {
        let mut f = Fixture::new();
        std::fs::create_dir_all(f.root().join("drafts")).unwrap();
        std::fs::write(f.root().join("drafts/plan.txt"), "a plan\n").unwrap();
        let store = f.withhold(&[("drafts/**", Permission::Ask)]);
        // The gate let `notes.txt` run unasked; then a sibling call made it a link to the draft.
        assert_eq!(
            store.decide("t", &json!({"path": "notes.txt"})),
            Permission::Allow
        );
        symlink("drafts/plan.txt", f.root().join("notes.txt")).unwrap();
        let unasked = ToolContext::detached("c", "t");
        let approved = ToolContext::detached("c", "t").approved_by_a_person();
        let with = |make: fn(&str, &FileLimits) -> Tool, args: Value, ctx: &ToolContext| {
            make("t", &f.limits).call(args, ctx.clone())
        };
        let edit = json!({"path": "notes.txt", "old_string": "a plan", "new_string": "b plan"});
        let write = json!({"path": "notes.txt", "content": "overwritten\n"});
        for (make, args) in [
            (
                read_file as fn(&str, &FileLimits) -> Tool,
                json!({"path": "notes.txt"}),
            ),
            (edit_file, edit.clone()),
            (write_file, write.clone()),
        ] {
            let e = with(make, args, &unasked).await.unwrap_err();
            assert_eq!(code(&e), "path_not_approved");
            assert!(e.to_string().contains("call again to be asked"), "{e:?}");
            assert!(
                matches!(
                    e,
                    ToolError::Recoverable {
                        permanent: true,
                        ..
                    }
                ),
                "no retry of the same call gets it asked: {e:?}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(f.root().join("drafts/plan.txt")).unwrap(),
            "a plan\n"
        );
        // A person allowed this very call: what it finds now is theirs to have allowed.
        let read = with(read_file, json!({"path": "notes.txt"}), &approved).await;
        assert!(format!("{:?}", read.unwrap()).contains("a plan"));
        with(edit_file, edit, &approved).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(f.root().join("drafts/plan.txt")).unwrap(),
            "b plan\n"
        );
        with(write_file, write, &approved).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(f.root().join("drafts/plan.txt")).unwrap(),
            "overwritten\n"
        );
    }

    #[tokio::test]
    async fn walks_leave_out_what_the_deny_and_ask_path_rules_match_for_the_tool() {
        let mut f = Fixture::new();
        for folder in ["sub", "secrets", "drafts", "private"] {
            std::fs::create_dir_all(f.root().join(folder)).unwrap();
        }
        for (file, text) in [
            (".env", "KEY=root-secret\n"),
            ("sub/.env", "KEY=sub-secret\n"),
            ("sub/ok.txt", "KEY=fine\n"),
            ("secrets/key.txt", "KEY=pem-secret\n"),
            ("drafts/plan.txt", "KEY=draft-secret\n"),
            ("private/x.txt", "KEY=private-secret\n"),
        ] {
            std::fs::write(f.root().join(file), text).unwrap();
        }
        symlink(".env", f.root().join("alias")).unwrap();
        let mut store = PermissionStore::new(Permission::Allow);
        store
            .resolve_paths("*", Arc::new(Resolver(f.limits.workspace.clone())))
            .configure(path_rule("*", "**/.env", Permission::Deny))
            .configure(path_rule("t", "secrets/**", Permission::Deny))
            .configure(path_rule("t", "drafts/**", Permission::Ask))
            // The folder itself: it is not entered, so nothing below it is met.
            .configure(path_rule("t", "private", Permission::Deny))
            .configure(path_rule("t", "**", Permission::Allow))
            .configure(path_rule("other", "**/ok.txt", Permission::Deny));
        // Without the rules the walks find everything: what the rules must hide is there.
        let open = f.call(grep, json!({"pattern": "KEY"})).await.unwrap();
        for secret in ["root-secret", "sub-secret", "pem-secret", "draft-secret"] {
            assert!(open.contains(secret), "{open}");
        }
        f.limits.workspace = f.limits.workspace.clone().withhold(&store);

        let hits = f
            .call(grep, json!({"pattern": "KEY", "path": "."}))
            .await
            .unwrap();
        assert_eq!(
            hits,
            "sub/ok.txt:1: KEY=fine\n[6 entries left out by the permission rules]"
        );
        let found = f.call(glob, json!({"pattern": "**/*"})).await.unwrap();
        assert_eq!(
            found,
            "src/main.rs\nsub/ok.txt\n[6 entries left out by the permission rules]"
        );
        let listed = f.call(list_dir, json!({"path": "."})).await.unwrap();
        assert_eq!(
            listed, "drafts/\nsecrets/\nsrc/\nsub/\n[3 entries left out by the permission rules]",
            "neither the file nor a link to it, nor the denied folder"
        );
        let listed = f.call(list_dir, json!({"path": "secrets"})).await.unwrap();
        assert_eq!(
            listed,
            "(nothing in secrets to show)\n[1 entry left out by the permission rules]"
        );
        let found = f
            .call(glob, json!({"pattern": "*.txt", "path": "sub"}))
            .await
            .unwrap();
        assert_eq!(
            found,
            "sub/ok.txt\n[1 entry left out by the permission rules]"
        );
        let found = f
            .call(glob, json!({"pattern": "*.rs", "path": "src"}))
            .await
            .unwrap();
        assert_eq!(found, "src/main.rs", "nothing left out: no note");

        // The rules of another tool name are that tool's: `*` still holds for it.
        let other = call(
            &grep("other", &f.limits),
            json!({"pattern": "KEY", "glob": "**/*.txt"}),
        )
        .await
        .unwrap()
        .0;
        assert!(
            !other.contains("fine") && !other.contains("-secret\n.env"),
            "{other}"
        );
        assert!(
            other.contains("pem-secret") && other.contains("draft-secret"),
            "{other}"
        );
        assert!(
            !other.contains("root-secret") && !other.contains("sub-secret"),
            "{other}"
        );

        // A single file named by the call is the gate's to judge, not the walk's.
        let one = f
            .call(grep, json!({"pattern": "KEY", "path": "sub/ok.txt"}))
            .await
            .unwrap();
        assert_eq!(one, "sub/ok.txt:1: KEY=fine");
    }

    #[test]
    fn schemas_are_objects_with_their_fields_described() {
        let f = Fixture::new();
        for make in [read_file, write_file, edit_file, list_dir, glob, grep] {
            let tool = make("t", &f.limits);
            let schema = &tool.spec().input_schema;
            assert_eq!(schema["type"], "object", "{schema}");
            assert_eq!(schema["additionalProperties"], false, "{schema}");
            assert!(schema.get("description").is_none(), "{schema}");
            for (_, p) in schema["properties"].as_object().unwrap() {
                assert!(p["description"].is_string(), "{schema}");
            }
            assert!(tool.spec().description.contains("Example:"));
        }
    }
}
