//! Arbitrary bytes as an NDJSON trace file, read and rendered as `agentloop trace` does: never a
//! panic or a hang, and what holds of the reading (`tests/trace_reading`, shared with the
//! property test).
#![no_main]

#[path = "../../tests/trace_reading/mod.rs"]
mod trace_reading;

use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

/// The one file this process writes each input to.
static FILE: LazyLock<PathBuf> = LazyLock::new(|| {
    std::env::temp_dir().join(format!("agentloop-fuzz-{}.ndjson", std::process::id()))
});

fuzz_target!(|data: &[u8]| {
    if let Err(broke) = trace_reading::read_and_render(&FILE, data) {
        panic!("{broke}");
    }
});
