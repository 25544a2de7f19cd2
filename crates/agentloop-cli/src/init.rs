//! `agentloop init [DIR]`: writes a starter agent that runs at once, with no key and no network (a
//! scripted model and one command tool), and says how to point it at a real model.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::{CliError, code};

/// Where `init` writes, and whether it may replace files already there.
#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// The folder to write the agent into (created if missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Replaces the starter files if they already exist (other files are left alone).
    #[arg(long)]
    force: bool,
}

/// The input the printed command gives the starter agent; its script answers it.
const INPUT: &str = "How many words are in: agentloop runs tools for models";

const AGENT_TOML: &str = r#"# A starter agent written by `agentloop init`. Run it from this folder (paths in this file are
# relative to it):
#   agentloop run agent.toml --input "How many words are in: agentloop runs tools for models"
name = "starter"
description = "Counts the words of a text with a command tool."
instructions = "You answer questions about texts. Use the tools, then answer in one sentence."

# A scripted model: the responses in script.json, in order. It needs no key and no network, so the
# agent runs as soon as it is written; it always makes the same call and gives the same answer.
[model]
provider = "scripted"
script = "script.json"

# For a real model, replace the [model] table above with one of these:
#
# [model]
# provider = "openai"               # the key is read from OPENAI_API_KEY
# name = "gpt-4.1-mini"
#
# [model]
# provider = "anthropic"            # the key is read from ANTHROPIC_API_KEY
# name = "claude-sonnet-4-5"
#
# [model]                           # any OpenAI-compatible server on your machine (llama.cpp,
# provider = "openai"               # Ollama, vLLM): no key is sent unless api_key_env names one
# name = "local"
# base_url = "http://127.0.0.1:8080/v1"
# temperature = 0.0

[limits]
max_turns = 4
max_tool_calls = 4
timeout_secs = 60

# A command tool: the call's arguments arrive as JSON on stdin, stdout is the result.
[[tools]]
name = "count_words"
description = "Counts the words of a text."
command = ["python3", "tools/count_words.py"]
input_schema = { type = "object", properties = { text = { type = "string" } }, required = ["text"], additionalProperties = false }
timeout_secs = 10
"#;

const SCRIPT_JSON: &str = r#"[
  {
    "text": "Let me count them.",
    "tool_calls": [
      {"id": "call_1", "name": "count_words", "arguments": {"text": "agentloop runs tools for models"}}
    ],
    "usage": {"input_tokens": 120, "output_tokens": 24}
  },
  {
    "text": "That text has 5 words.",
    "usage": {"input_tokens": 160, "output_tokens": 9}
  }
]
"#;

const COUNT_WORDS_PY: &str = r#""""count_words: reads {"text": ...} as JSON on stdin and prints {"words": N}.

A missing text is an error: a message on stderr and exit status 1, which the model reads.
"""
import json
import sys

args = json.load(sys.stdin)
text = args.get("text")
if not isinstance(text, str):
    print("give the text to count as a string: {\"text\": \"...\"}", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"words": len(text.split())}))
"#;

/// The starter files, relative to the target folder.
const FILES: [(&str, &str); 3] = [
    ("agent.toml", AGENT_TOML),
    ("script.json", SCRIPT_JSON),
    ("tools/count_words.py", COUNT_WORDS_PY),
];

/// Writes the starter agent and prints what it wrote and the command that runs it.
pub(crate) fn init(args: &InitArgs) -> Result<i32, CliError> {
    let existing: Vec<&str> = FILES
        .iter()
        .map(|(rel, _)| *rel)
        .filter(|rel| args.dir.join(rel).exists())
        .collect();
    if !existing.is_empty() && !args.force {
        return Err(CliError::Usage {
            message: format!(
                "{} already holds {}: choose another folder, or pass --force to replace them",
                crate::terminal::shown_path(&args.dir),
                existing.join(", ")
            ),
        });
    }
    for (rel, text) in FILES {
        write(&args.dir.join(rel), text)?;
    }
    let agent = args.dir.join("agent.toml");
    err!(
        "wrote {}: an agent with a scripted model and one command tool (needs python3)",
        FILES
            .iter()
            .map(|(rel, _)| args.dir.join(rel).display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    err!("run it with:");
    out!(
        "agentloop run {} --input {}",
        shell_quote(&agent.display().to_string()),
        shell_quote(INPUT)
    );
    err!(
        "then edit the [model] table in {} for a real model",
        agent.display()
    );
    Ok(code::OK)
}

fn write(path: &Path, text: &str) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::Io {
        message: format!("cannot write {}: {e}", crate::terminal::shown_path(path)),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}

/// Quotes a word for a POSIX shell when it needs it, so the printed command can be pasted as is.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn words_that_need_it_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("my-agent/agent.toml"), "my-agent/agent.toml");
        assert_eq!(shell_quote("my agent/agent.toml"), "'my agent/agent.toml'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
