//! Datasets: the cases of an evaluation, each an input (or a conversation), optional metadata and
//! its checks, read from TOML (`[[cases]]`, with `checks` every case shares) or JSON Lines (one
//! case a line), or built in code.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use agentloop::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::EvalError;
use crate::spec::CheckSpec;

/// One case: what the agent is given, and what its run must show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// The case's name, unique in its dataset: what the report, the JUnit XML and a baseline
    /// know it by.
    pub name: String,
    /// The input text (the last user message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The conversation before the input, as the core's messages (`{role = "user", content =
    /// [{type = "text", text = "..."}]}`, assistant messages and tool results alike).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<Message>,
    /// Free metadata, carried into the report.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// For an agent on the scripted model: the case's own script (the model's responses), relative
    /// to the dataset's file. Without it the agent file's script is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// What the run must show. A case left with none (and no shared `checks` in its dataset)
    /// gets `{ stop_reason = "finished" }` ([`DEFAULT_STOP_REASON`]) when its dataset is read or built.
    #[serde(default)]
    pub checks: Vec<CheckSpec>,
}

impl Case {
    /// A case with this name and input and no checks yet.
    pub fn new(name: impl Into<String>, input: impl Into<String>) -> Case {
        Case {
            name: name.into(),
            input: Some(input.into()),
            conversation: Vec::new(),
            metadata: Map::new(),
            script: None,
            checks: Vec::new(),
        }
    }

    /// Adds a check.
    #[must_use]
    pub fn check(mut self, check: CheckSpec) -> Case {
        self.checks.push(check);
        self
    }

    /// The input as the run's last message, when there is one.
    pub fn input_message(&self) -> Option<Message> {
        self.input.as_ref().map(Message::user)
    }

    /// The input as text, for a judge and the report: the input, or the conversation's last
    /// user text.
    pub fn input_text(&self) -> String {
        match &self.input {
            Some(text) => text.clone(),
            None => self
                .conversation
                .iter()
                .rev()
                .find(|m| matches!(m, Message::User { .. }))
                .map(Message::text)
                .unwrap_or_default(),
        }
    }
}

/// The cases of an evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// The dataset's name: the file's stem, or its `name`.
    pub name: String,
    /// The folder a case's relative paths (its `script`, a judge's agent file) start from.
    pub dir: PathBuf,
    /// The cases, in order.
    pub cases: Vec<Case>,
}

/// The stop reason a case with no checks must show: `{ stop_reason = "finished" }`, so that a
/// dataset of inputs alone still fails the runs that failed, hit a limit or looped.
pub const DEFAULT_STOP_REASON: &str = "finished";

fn default_check() -> CheckSpec {
    CheckSpec::StopReason(DEFAULT_STOP_REASON.into())
}

/// A TOML dataset as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlDataset {
    #[serde(default)]
    name: Option<String>,
    /// Checks every case gets before its own.
    #[serde(default)]
    checks: Vec<CheckSpec>,
    #[serde(default)]
    cases: Vec<Case>,
}

/// The largest dataset read: thousands of cases are a few MiB; past this it is a mistake.
pub const MAX_DATASET_BYTES: u64 = 256 * 1024 * 1024;

/// The text of a dataset file, from a regular file of at most [`MAX_DATASET_BYTES`]: a path
/// given by mistake that names a named pipe (whose open waits for a writer) or `/dev/zero`
/// (which never ends) gets an error, not a hang.
fn read_cases(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let not_a_file = || "it is not a regular file".to_owned();
    if !std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .is_file()
    {
        return Err(not_a_file());
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_DATASET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_DATASET_BYTES {
        return Err(format!(
            "it is larger than {MAX_DATASET_BYTES} bytes, the most read"
        ));
    }
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())
}

impl Dataset {
    /// Reads a dataset: `.jsonl` (or `.ndjson`) as JSON Lines, anything else as TOML.
    pub fn load(path: &Path) -> Result<Dataset, EvalError> {
        let text = read_cases(path).map_err(|message| EvalError::Read {
            path: agentloop::printable::path(path),
            message,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "evals".into());
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let where_ = agentloop::printable::path(path);
        let lines = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("jsonl" | "ndjson")
        );
        let mut dataset = if lines {
            Dataset::from_jsonl(&text, &where_)?
        } else {
            Dataset::from_toml(&text, &where_)?
        };
        if dataset.name.is_empty() {
            dataset.name = stem;
        }
        dataset.dir = dir;
        Ok(dataset)
    }

    /// Reads a TOML dataset; `path` only names it in errors.
    pub fn from_toml(text: &str, path: &str) -> Result<Dataset, EvalError> {
        let parsed: TomlDataset = toml::from_str(text).map_err(|e| EvalError::Dataset {
            path: path.into(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let cases = parsed
            .cases
            .into_iter()
            .map(|mut c| {
                let mut checks = parsed.checks.clone();
                checks.append(&mut c.checks);
                c.checks = checks;
                c
            })
            .collect();
        Dataset::checked(parsed.name.unwrap_or_default(), cases, path)
    }

    /// Reads a JSON Lines dataset (blank lines and lines starting with `//` are skipped); `path`
    /// only names it in errors.
    pub fn from_jsonl(text: &str, path: &str) -> Result<Dataset, EvalError> {
        let mut cases = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            let case: Case = serde_json::from_str(line).map_err(|e| EvalError::Dataset {
                path: path.into(),
                message: format!("line {}: {e}", i + 1),
            })?;
            cases.push(case);
        }
        Dataset::checked(String::new(), cases, path)
    }

    /// A dataset built in code.
    pub fn new(name: impl Into<String>, cases: Vec<Case>) -> Result<Dataset, EvalError> {
        let mut d = Dataset::checked(name.into(), cases, "<memory>")?;
        d.dir = PathBuf::from(".");
        Ok(d)
    }

    /// Checks the cases, and gives a case with no checks (its own or the dataset's shared ones)
    /// [`DEFAULT_STOP_REASON`]: a case with nothing to check would pass every run, failed ones too.
    fn checked(name: String, mut cases: Vec<Case>, path: &str) -> Result<Dataset, EvalError> {
        let invalid = |message: String| EvalError::Dataset {
            path: path.into(),
            message,
        };
        if cases.is_empty() {
            return Err(invalid("there are no cases".into()));
        }
        for c in &mut cases {
            if c.checks.is_empty() {
                c.checks.push(default_check());
            }
        }
        let mut seen = HashSet::new();
        for c in &cases {
            if c.name.trim().is_empty() {
                return Err(invalid("a case has an empty name".into()));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(invalid(format!("two cases are named {:?}", c.name)));
            }
            if c.input.is_none() && c.conversation.is_empty() {
                return Err(invalid(format!(
                    "case {:?} has neither an input nor a conversation",
                    c.name
                )));
            }
        }
        Ok(Dataset {
            name,
            dir: PathBuf::new(),
            cases,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_dataset_path_that_names_no_regular_file_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("agentloop-eval-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("cases.toml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Neither waits: the pipe for a writer, the device for an end.
        for path in [fifo.as_path(), Path::new("/dev/zero")] {
            let e = Dataset::load(path).unwrap_err();
            assert_eq!(e.code(), "eval.read");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_toml_dataset_gives_every_case_the_shared_checks_first() {
        let d = Dataset::from_toml(
            r#"
            name = "weather"
            checks = [{ stop_reason = "finished" }]
            [[cases]]
            name = "paris"
            input = "Weather in Paris?"
            metadata = { topic = "weather" }
            checks = [{ contains = "Paris" }, { called = { tool = "get_weather", args = { city = "Paris" } } }]
            "#,
            "t.toml",
        )
        .unwrap();
        assert_eq!(d.name, "weather");
        let c = &d.cases[0];
        assert_eq!(c.checks.len(), 3);
        assert_eq!(c.checks[0], CheckSpec::StopReason("finished".into()));
        assert_eq!(c.metadata["topic"], "weather");
    }

    #[test]
    fn a_bad_dataset_is_refused_with_what_is_wrong() {
        let unknown = Dataset::from_toml(
            "[[cases]]\nname = \"a\"\ninput = \"x\"\nchecks = [{ containz = \"y\" }]\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(unknown.code(), "eval.dataset");
        assert!(unknown.to_string().contains("containz"), "{unknown}");
        let twice = Dataset::from_jsonl(
            "{\"name\": \"a\", \"input\": \"x\"}\n{\"name\": \"a\", \"input\": \"y\"}\n",
            "t.jsonl",
        )
        .unwrap_err();
        assert!(
            twice.to_string().contains("two cases are named \"a\""),
            "{twice}"
        );
        let bad_line =
            Dataset::from_jsonl("{\"name\": \"a\", \"input\": \"x\"}\n{oops\n", "t.jsonl")
                .unwrap_err();
        assert!(bad_line.to_string().contains("line 2"), "{bad_line}");
        let empty = Dataset::from_toml("", "t.toml").unwrap_err();
        assert!(empty.to_string().contains("no cases"), "{empty}");
    }
}
