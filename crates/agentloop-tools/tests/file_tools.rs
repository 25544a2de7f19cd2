#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The file tools through the public API, as an agent file builds them: `Builtin` over a real
//! folder.

use agentloop::{Tool, ToolContext, ToolError};
use agentloop_tools::{Builtin, BuiltinOptions};
use serde_json::{Value, json};

/// A tool of the built-in set, rooted in `root`.
fn tool(builtin: Builtin, root: &std::path::Path) -> Tool {
    builtin.tool(&BuiltinOptions::rooted(root)).unwrap()
}

async fn call(tool: &Tool, args: Value) -> Result<String, ToolError> {
    tool.call(args, ToolContext::detached("call_1", tool.name()))
        .await
        .map(|o| o.content.to_text())
}

fn recoverable(e: ToolError) -> (String, String) {
    match e {
        ToolError::Recoverable { code, message, .. } => (code.to_string(), message.to_string()),
        other => panic!("expected a recoverable error, got {other:?}"),
    }
}

/// What every answer below must be: short, naming the pattern by its first characters and its
/// length, never holding it whole.
fn assert_echoed_short(text: &str, head: &str) {
    assert!(text.len() < 600, "{} bytes: {text:.600}", text.len());
    assert!(text.contains("(10000 characters)"), "{text}");
    assert!(text.contains(&format!("\"{head}…\"")), "{text}");
}

#[tokio::test]
async fn a_long_pattern_is_echoed_by_its_first_characters_and_its_length() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
    let glob = tool(Builtin::Glob, dir.path());
    let grep = tool(Builtin::Grep, dir.path());
    let long = "a".repeat(10_000);
    let head = "a".repeat(200);

    // Valid, matching nothing: the answer names the pattern.
    let answer = call(&glob, json!({"pattern": long})).await.unwrap();
    assert!(answer.starts_with("no files match \""), "{answer:.300}");
    assert_echoed_short(&answer, &head);
    let answer = call(&grep, json!({"pattern": long})).await.unwrap();
    assert!(answer.starts_with("no lines match \""), "{answer:.300}");
    assert_echoed_short(&answer, &head);

    // Invalid: the error names it, with the same code as a short one.
    let bad_glob = format!("[{}", "a".repeat(9_999));
    let (code, message) = recoverable(call(&glob, json!({"pattern": bad_glob})).await.unwrap_err());
    assert_eq!(code, "invalid_pattern");
    assert!(message.contains("is not a valid glob"), "{message:.300}");
    assert_echoed_short(&message, &format!("[{}", "a".repeat(199)));

    let (code, message) = recoverable(
        call(&grep, json!({"pattern": "hello", "glob": bad_glob}))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "invalid_pattern");
    assert_echoed_short(&message, &format!("[{}", "a".repeat(199)));

    let bad_regex = format!("({}", "a".repeat(9_999));
    let (code, message) = recoverable(
        call(&grep, json!({"pattern": bad_regex}))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "invalid_pattern");
    assert!(
        message.starts_with("not a valid regular expression: \""),
        "{message:.300}"
    );
    assert!(
        message.ends_with("unclosed group at character 1"),
        "{message:.300}"
    );
    assert_echoed_short(&message, &format!("({}", "a".repeat(199)));
}

#[tokio::test]
async fn a_short_pattern_is_still_echoed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let glob = tool(Builtin::Glob, dir.path());
    let grep = tool(Builtin::Grep, dir.path());
    let answer = call(&glob, json!({"pattern": "*.zz"})).await.unwrap();
    assert_eq!(answer, "no files match \"*.zz\" under .");
    let answer = call(&grep, json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(answer, "no lines match \"needle\"");
    let (code, message) = recoverable(call(&grep, json!({"pattern": "a("})).await.unwrap_err());
    assert_eq!(code, "invalid_pattern");
    // The regex crate's own message, the pattern drawn under a caret.
    assert!(message.contains("a(\n"), "{message}");
    assert!(message.ends_with("error: unclosed group"), "{message}");
}
