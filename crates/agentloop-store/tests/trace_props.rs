//! Property tests of reading an NDJSON trace file, over files made of real trace lines, pieces of
//! them and arbitrary bytes: see [`trace_reading`] for what must hold. CI runs these; the cargo
//! fuzz target (`fuzz/`, `trace_ndjson`) checks the same for longer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod trace_reading;

use proptest::prelude::*;

/// Lines of a trace (a run, a subagent's run under it, a turn, calls) and what corrupts one: the
/// ids repeat on purpose, so that random files have spans that name each other as parents.
const PIECES: &[&str] = &[
    r#"{"kind":"run","id":"a","run_id":"a","started_at_ms":1,"status":"running","agent":"x","model":"m"}"#,
    r#"{"kind":"run","id":"a","run_id":"a","started_at_ms":1,"status":"ok","agent":"x","model":"m","stop_reason":"finished","model_calls":1,"tool_calls":1}"#,
    r#"{"kind":"run","id":"b","parent_id":"a","parent_call_id":"c1","run_id":"b","started_at_ms":2,"status":"running","agent":"y","model":"m"}"#,
    r#"{"kind":"run","id":"a","parent_id":"a","run_id":"a","started_at_ms":1,"status":"running","agent":"x","model":"m"}"#,
    r#"{"kind":"run","id":"d","parent_id":"a","run_id":"d","started_at_ms":2,"status":"ok","agent":"y","model":"m"}"#,
    r#"{"kind":"run","id":"e","parent_id":"a","run_id":"e","started_at_ms":2,"status":"ok","agent":"y","model":"m"}"#,
    r#"{"kind":"run","id":"c","parent_id":"b","run_id":"c","started_at_ms":3,"status":"error","agent":"z","model":"m"}"#,
    r#"{"kind":"turn","id":"a:t1","parent_id":"a","run_id":"a","started_at_ms":1,"status":"running","turn":1}"#,
    r#"{"kind":"model_call","id":"a:t1:m1","parent_id":"a:t1","run_id":"a","started_at_ms":1,"status":"ok","model":"m","duration_ms":3.5}"#,
    r#"{"kind":"tool_call","id":"a:t1:c1","parent_id":"a:t1","run_id":"a","started_at_ms":1,"status":"error","tool":"t","call_id":"c1"}"#,
    "\n",
    "\n",
    "\r\n",
    "{",
    "}",
    "\"",
    ",",
    "null",
    "   ",
    "\u{0}",
    "é",
];

fn file() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            6 => prop::sample::select(PIECES).prop_map(|p| p.as_bytes().to_vec()),
            1 => prop::collection::vec(any::<u8>(), 1..4),
        ],
        0..24,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_trace_file_reads_and_renders(bytes in file()) {
        let dir = std::env::temp_dir().join(format!("agentloop-trace-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Err(broke) = trace_reading::read_and_render(&dir.join("t.ndjson"), &bytes) {
            prop_assert!(false, "{}", broke);
        }
    }
}
