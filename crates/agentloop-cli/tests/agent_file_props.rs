//! Property tests of the agent file checker over text built from the pieces agent files are
//! made of: see [`agent_file_check`] for what must hold. CI runs these; the cargo fuzz target
//! (`fuzz/`, `agent_file`) checks the same for longer.

mod agent_file_check;

use proptest::prelude::*;

/// Lines and parts of lines of real agent files, and TOML's own punctuation.
const PIECES: &[&str] = &[
    "name = \"weather\"\n",
    "description = \"d\"\n",
    "instructions = \"i\"\n",
    "instructions_file = \"missing.md\"\n",
    "[model]\n",
    "provider = \"scripted\"\n",
    "provider = \"openai\"\n",
    "model = \"gpt\"\n",
    "script = \"script.json\"\n",
    "[limits]\n",
    "max_turns = 6\n",
    "max_tool_calls = -1\n",
    "timeout_secs = 1e400\n",
    "[[tools]]\n",
    "command = [\"python3\", \"t.py\"]\n",
    "input_schema = { type = \"object\", properties = { city = { type = \"string\" } } }\n",
    "mode = \"sequential\"\n",
    "[permissions]\n",
    "allow = [\"shell\"]\n",
    "deny = [{ tool = \"shell\", prefix = \"rm\" }]\n",
    "[[mcp]]\n",
    "output_schema = { type = \"nope\" }\n",
    "[",
    "]",
    "{",
    "}",
    "=",
    "\"",
    "'",
    "\"\"\"",
    "\n",
    ".",
    ",",
    "#",
    "\\u00e9",
    "é",
    " ",
    "tools",
    "model",
    "x",
    "1",
    "true",
    "[[",
    "]]",
    "\r\n",
    "\t",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            6 => prop::sample::select(PIECES).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..40,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn any_text_checks_to_a_file_or_problems_never_a_panic(text in text()) {
        if let Err(broke) = agent_file_check::check(&text) {
            prop_assert!(false, "{}: {:?}", broke, text);
        }
    }
}
