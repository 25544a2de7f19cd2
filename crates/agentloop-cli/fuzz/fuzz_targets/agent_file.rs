//! Arbitrary text through the agent file checker, as `agentloop check` and every command that
//! loads a file read it: never a panic or a hang, and what holds of its answer
//! (`tests/agent_file_check`, shared with the property test).
#![no_main]

#[path = "../../tests/agent_file_check/mod.rs"]
mod agent_file_check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Err(broke) = agent_file_check::check(text)
    {
        panic!("{broke}: {text:?}");
    }
});
