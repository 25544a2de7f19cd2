//! The model's questions to the user (the `ask_user` built-in): asked at the terminal in `run`
//! and `chat`, each answer checked against the question's schema and asked again until it
//! matches; listed (`agentloop questions list`) and answered (`agentloop answer`) from any
//! process when a journaled run suspended on them.

use std::io::Write;

use agentloop::ask::check_answer;
use agentloop::gate::Question;
use agentloop::permissions::ApprovalRequest;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::approval::AnswerLines;
use crate::durable::JournalArg;
use crate::error::CliError;

/// The reason a question is refused when the person at the terminal ends the input.
pub const END_OF_INPUT_REASON: &str = "the user gave no answer (end of input)";

/// `agentloop questions`.
#[derive(Debug, Subcommand)]
pub enum QuestionsCommand {
    /// Lists the questions suspended runs wait on, with the answers recorded so far.
    List {
        #[command(flatten)]
        journal: JournalArg,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `agentloop answer`.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The run's id (or a unique prefix of it).
    run_id: String,
    /// The question's call.
    #[arg(long = "call", value_name = "ID")]
    call_id: String,
    /// The answer, as JSON (`'"red"'`, `42`, `'{"name": "Ada"}'`): checked against the
    /// question's schema before it is recorded.
    #[arg(long = "json", value_name = "JSON")]
    answer: String,
    #[command(flatten)]
    journal: JournalArg,
}

/// How the answer to `question` is asked for: its kind, from its schema.
fn hint(question: &Question) -> String {
    let Some(schema) = &question.schema else {
        return "your answer".into();
    };
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        let shown: Vec<String> = choices
            .iter()
            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_owned))
            .collect();
        return format!("one of: {}", shown.join(" · "));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("number") => "a number".into(),
        Some("integer") => "a whole number".into(),
        Some("boolean") => "true or false".into(),
        Some("object") => format!(
            "a JSON object on one line, matching {}",
            crate::terminal::escape_invisible(&schema.to_string())
        ),
        _ => format!(
            "an answer matching {}",
            crate::terminal::escape_invisible(&schema.to_string())
        ),
    }
}

/// A typed line as the answer to `question`: the line as JSON when it parses and matches the
/// schema, else the line as text when that matches (so `red` answers a choice of strings); the
/// schema's complaint otherwise. Without a schema the answer is the line, as text.
pub fn parse_reply(question: &Question, line: &str) -> Result<Value, String> {
    let line = line.trim_end_matches(['\n', '\r']);
    let text = Value::String(line.trim().to_owned());
    if question.schema.is_none() {
        return Ok(text);
    }
    let as_json = serde_json::from_str::<Value>(line.trim()).ok();
    let mut complaint = None;
    for candidate in as_json.into_iter().chain([text]) {
        match check_answer(question, &candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) => {
                complaint.get_or_insert(e.to_string());
            }
        }
    }
    Err(complaint.unwrap_or_default())
}

/// Asks every question, in order, and returns one answer each; an answer that does not match
/// its schema asks again. `None` when the input ends first.
pub async fn ask_questions(
    lines: &mut dyn AnswerLines,
    out: &mut (dyn Write + Send),
    requests: &[ApprovalRequest],
) -> Option<Vec<Value>> {
    let n = requests.len();
    let mut answers = Vec::with_capacity(n);
    for (i, request) in requests.iter().enumerate() {
        let Some(question) = &request.question else {
            answers.push(Value::Null);
            continue;
        };
        let _ = writeln!(
            out,
            "? [{}/{n}] the agent asks [{}]: {}",
            i + 1,
            crate::terminal::escape_invisible(&request.call_id),
            crate::terminal::escape_invisible(&question.text)
        );
        loop {
            let _ = write!(out, "  {} > ", hint(question));
            let _ = out.flush();
            let Some(line) = lines.next_line().await else {
                let _ = writeln!(out, "\n  (end of input: no answer)");
                return None;
            };
            match parse_reply(question, &line) {
                Ok(answer) => {
                    answers.push(answer);
                    break;
                }
                Err(why) => {
                    let _ = writeln!(
                        out,
                        "  not an answer: {}",
                        crate::terminal::escape_invisible(&why)
                    );
                }
            }
        }
    }
    let _ = out.flush();
    Some(answers)
}

/// `agentloop questions list`.
pub fn list(cmd: QuestionsCommand) -> Result<i32, CliError> {
    let QuestionsCommand::List { journal, json } = cmd;
    let waiting: Vec<_> = journal
        .reader()?
        .pending()?
        .into_iter()
        .filter(|w| w.request.question.is_some())
        .collect();
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&waiting).unwrap_or_default()
        );
        return Ok(crate::error::code::OK);
    }
    if waiting.is_empty() {
        out!("no run waits for an answer");
    }
    for w in &waiting {
        out!("{}", shown(&w.run_id, &w.request, w.reply.as_ref()));
    }
    Ok(crate::error::code::OK)
}

/// One question as `questions list` and `approvals list` show it.
pub fn shown(run_id: &str, request: &ApprovalRequest, reply: Option<&Value>) -> String {
    let text = request.question.as_ref().map_or("", |q| q.text.as_str());
    let schema = request
        .question
        .as_ref()
        .and_then(|q| q.schema.as_ref())
        .map(|s| format!("  schema {s}"))
        .unwrap_or_default();
    let answer = reply.map_or_else(|| "waiting".to_owned(), |r| format!("answered {r}"));
    format!(
        "{run_id}  {}  {answer}  question {:?}{schema}",
        request.call_id, text
    )
}

/// `agentloop answer`: the answer is checked against the question's schema; a wrong one is an
/// error and records nothing.
pub fn answer(args: &AnswerArgs) -> Result<i32, CliError> {
    let reader = args.journal.reader()?;
    let run_id = reader.find(&args.run_id)?;
    let run = reader.load(&run_id)?;
    let usage = |message: String| CliError::Usage { message };
    let request = run
        .approvals
        .iter()
        .map(|a| &a.request)
        .find(|r| r.call_id == args.call_id)
        .ok_or_else(|| {
            usage(format!(
                "run {run_id} waits on no question {}",
                args.call_id
            ))
        })?;
    let question = request.question.as_ref().ok_or_else(|| {
        usage(format!(
            "call {} of run {run_id} waits for approval, not an answer: use `agentloop approve`",
            args.call_id
        ))
    })?;
    let value: Value = serde_json::from_str(&args.answer).map_err(|e| {
        usage(format!(
            "--json is not JSON ({e}); a text answer is quoted: '\"yes\"'"
        ))
    })?;
    check_answer(question, &value).map_err(|e| usage(format!("{e} ({})", e.code())))?;
    reader.reply(&run_id, &args.call_id, &value)?;
    crate::durable::what_is_left(&reader, &run_id, &args.journal.path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Cursor;

    use serde_json::json;

    use super::*;
    use crate::approval::ReaderLines;

    fn question(schema: Option<Value>) -> ApprovalRequest {
        ApprovalRequest {
            call_id: "q1".into(),
            tool: "ask_user".into(),
            arguments: json!({}),
            agent: String::new(),
            question: Some(Question {
                text: "Which?".into(),
                schema,
            }),
        }
    }

    #[tokio::test]
    async fn a_wrong_answer_asks_again_and_text_answers_a_choice() {
        let requests = [
            question(Some(json!({"enum": ["red", "green"]}))),
            question(Some(json!({"type": "number"}))),
            question(None),
        ];
        let mut lines = ReaderLines(Cursor::new("blue\ngreen\nmany\n42\nas you like\n"));
        let mut screen = Vec::new();
        let got = ask_questions(&mut lines, &mut screen, &requests)
            .await
            .unwrap();
        assert_eq!(got, [json!("green"), json!(42), json!("as you like")]);
        let screen = String::from_utf8(screen).unwrap();
        assert_eq!(screen.matches("not an answer").count(), 2, "{screen}");
        assert!(screen.contains("one of: red · green"), "{screen}");
    }

    #[tokio::test]
    async fn the_end_of_input_gives_no_answers() {
        let requests = [question(Some(json!({"type": "number"})))];
        let mut lines = ReaderLines(Cursor::new("x\n"));
        let mut screen = Vec::new();
        assert_eq!(
            ask_questions(&mut lines, &mut screen, &requests).await,
            None
        );
    }
}
