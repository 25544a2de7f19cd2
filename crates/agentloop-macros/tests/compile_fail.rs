//! Misuses of `#[tool]` are compile errors that point at the offending token, never a panic of
//! the macro. Each file under `tests/ui/` is one misuse; its `.stderr` is the expected message.
//! Regenerate the expectations with `TRYBUILD=overwrite cargo test -p agentloop-macros`.

#[test]
fn misuses_of_tool_are_compile_errors_with_spans() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
