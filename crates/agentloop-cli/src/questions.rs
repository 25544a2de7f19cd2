//! The model's questions to the user (the `ask_user` built-in): asked at the terminal in `run`
//! and `chat`, each answer checked against the question's schema and asked again until it
//! matches; listed (`agentloop questions list`) and answered (`agentloop answer`) from any
//! process when a journaled run suspended on them.

use std::io::Write;

use agentloop::ask::check_answer;
use agentloop::gate::Question;
use agentloop::permissions::ApprovalRequest;
use agentloop_store::WaitingCall;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::approval::AnswerLines;
use crate::durable::{JournalArg, WaitingArgs};
use crate::error::CliError;

/// The reason a question is refused when the person at the terminal ends the input.
pub(crate) const END_OF_INPUT_REASON: &str = "the user gave no answer (end of input)";

/// `agentloop questions`.
#[derive(Debug, Subcommand)]
pub(crate) enum QuestionsCommand {
    /// Lists the questions suspended runs wait on, with the answers recorded so far.
    List(#[command(flatten)] WaitingArgs),
}

/// `agentloop answer`.
#[derive(Debug, Args)]
pub(crate) struct AnswerArgs {
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
    /// Answers a run started with `agentloop submit` (its full id), through the Restate ingress
    /// at this URL (without one: $AGENTLOOP_RESTATE, else http://127.0.0.1:8080), instead of one
    /// in a journal.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    restate: Option<String>,
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
        Some("string") => "text".into(),
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
pub(crate) fn parse_reply(question: &Question, line: &str) -> Result<Value, String> {
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
/// its schema asks again. A form (an object schema with properties) is asked field by field.
/// `None` when the input ends first.
pub(crate) async fn ask_questions(
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
        let answer = match form_fields(question) {
            Some(fields) => ask_form(lines, out, question, &fields).await,
            None => ask_value(lines, out, "", question, false)
                .await
                .map(Option::unwrap_or_default),
        };
        let Some(answer) = answer else {
            let _ = writeln!(out, "\n  (end of input: no answer)");
            return None;
        };
        answers.push(answer);
    }
    let _ = out.flush();
    Some(answers)
}

/// One field of a form: its name, its schema, and whether it is required.
type Field = (String, Value, bool);

/// The fields of a form question (an object schema with properties): the required ones in the
/// order `required` names them, then the others by name. `None` for any other question.
fn form_fields(question: &Question) -> Option<Vec<Field>> {
    let schema = question.schema.as_ref()?;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    let properties = schema.get("properties")?.as_object()?;
    if properties.is_empty() {
        return None;
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields: Vec<Field> = required
        .iter()
        .filter_map(|name| {
            let field = properties.get(*name)?;
            Some(((*name).to_owned(), field.clone(), true))
        })
        .collect();
    fields.extend(
        properties
            .iter()
            .filter(|(name, _)| !required.contains(&name.as_str()))
            .map(|(name, field)| (name.clone(), field.clone(), false)),
    );
    Some(fields)
}

/// Asks a form field by field, each checked against its own schema; the whole answer is then
/// checked against the form's, and when it fails the form is asked again. `None` at the end of
/// the input.
async fn ask_form(
    lines: &mut dyn AnswerLines,
    out: &mut (dyn Write + Send),
    question: &Question,
    fields: &[Field],
) -> Option<Value> {
    loop {
        let mut answer = serde_json::Map::new();
        for (name, schema, required) in fields {
            let field = Question {
                text: name.clone(),
                schema: Some(schema.clone()),
            };
            let label = format!("{}: ", crate::terminal::escape_invisible(name));
            if let Some(value) = ask_value(lines, out, &label, &field, !required).await? {
                answer.insert(name.clone(), value);
            }
        }
        let answer = Value::Object(answer);
        match check_answer(question, &answer) {
            Ok(()) => return Some(answer),
            Err(e) => {
                let _ = writeln!(
                    out,
                    "  not an answer: {}; the form again",
                    crate::terminal::escape_invisible(&e.to_string())
                );
            }
        }
    }
}

/// Asks for one value until a line matches `question`'s schema; an optional one is skipped by
/// an empty line (`Some(None)`). `None` at the end of the input.
async fn ask_value(
    lines: &mut dyn AnswerLines,
    out: &mut (dyn Write + Send),
    label: &str,
    question: &Question,
    optional: bool,
) -> Option<Option<Value>> {
    let skip = if optional { ", empty to skip" } else { "" };
    loop {
        let _ = write!(out, "  {label}{}{skip} > ", hint(question));
        let _ = out.flush();
        let line = lines.next_line().await?;
        if optional && line.trim().is_empty() {
            return Some(None);
        }
        match parse_reply(question, &line) {
            Ok(answer) => return Some(Some(answer)),
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

/// `agentloop questions list`.
pub(crate) async fn list(cmd: QuestionsCommand) -> Result<i32, CliError> {
    let QuestionsCommand::List(list) = cmd;
    list.print(
        |w| w.request.question.is_some(),
        "no run waits for an answer",
        shown,
    )
    .await
}

/// One question as `questions list` and `approvals list` show it.
pub(crate) fn shown(w: &WaitingCall) -> String {
    let request = &w.request;
    let text = request.question.as_ref().map_or("", |q| q.text.as_str());
    let schema = request
        .question
        .as_ref()
        .and_then(|q| q.schema.as_ref())
        .map(|s| format!("  schema {s}"))
        .unwrap_or_default();
    let answer = w
        .reply
        .as_ref()
        .map_or_else(|| "waiting".to_owned(), |r| format!("answered {r}"));
    format!(
        "{}  {}  {answer}  question {:?}{schema}{}",
        w.run_id,
        request.call_id,
        text,
        place(w)
    )
}

/// A subagent's call names its place in the tree (`  (lead/worker)`); the top agent's, nothing.
pub(crate) fn place(w: &WaitingCall) -> String {
    Some(&w.request.agent)
        .filter(|a| !a.is_empty() && **a != w.agent)
        .map(|a| format!("  ({a})"))
        .unwrap_or_default()
}

/// `agentloop answer`: the answer is checked against the question's schema; a wrong one is an
/// error and records nothing.
pub(crate) async fn answer(args: &AnswerArgs) -> Result<i32, CliError> {
    let usage = |message: String| CliError::Usage { message };
    let value: Value = serde_json::from_str(&args.answer).map_err(|e| {
        usage(format!(
            "--json is not JSON ({e}); a text answer is quoted: '\"yes\"'"
        ))
    })?;
    if let Some(url) = &args.restate {
        return crate::restate::answer(&args.run_id, &args.call_id, &value, url).await;
    }
    let reader = args.journal.reader()?;
    let run_id = reader.find(&args.run_id)?;
    let run = reader.load(&run_id)?;
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
    async fn a_form_is_asked_field_by_field_and_again_when_the_whole_fails() {
        let form = json!({
            "type": "object",
            "properties": {
                "pet": {"enum": ["cat", "dog"]},
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0}
            },
            "required": ["name", "age"],
            "minProperties": 3
        });
        let requests = [question(Some(form))];
        // The pet skipped: the whole fails `minProperties`, and the form is asked again.
        let mut lines = ReaderLines(Cursor::new("Ada\nold\n36\n\nBob\n7\nbird\ncat\n"));
        let mut screen = Vec::new();
        let got = ask_questions(&mut lines, &mut screen, &requests)
            .await
            .unwrap();
        assert_eq!(got, [json!({"name": "Bob", "age": 7, "pet": "cat"})]);
        let screen = String::from_utf8(screen).unwrap();
        assert_eq!(screen.matches("not an answer").count(), 3, "{screen}");
        assert_eq!(screen.matches("the form again").count(), 1, "{screen}");
        assert_eq!(screen.matches("name: text > ").count(), 2, "{screen}");
        assert!(screen.contains("age: a whole number > "), "{screen}");
        assert!(
            screen.contains("pet: one of: cat · dog, empty to skip > "),
            "{screen}"
        );
        let name = screen.find("name: ").unwrap();
        assert!(
            name < screen.find("age: ").unwrap(),
            "required first: {screen}"
        );
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
