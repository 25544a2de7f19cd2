//! Arbitrary command text through the permission gate's reading of a `shell` call, by the public
//! entries the gate and the shell tool judge it by: never a panic, never slow (the reading has a
//! step cap), and what holds of the rules (`tests/shell_rules`, shared with the property test).
//!
//! Input: the command text, then, after a NUL byte, the text of every file the resolver serves
//! (a repository's `.git/config`, a hook, a script); without one, a small `.git/config` with an
//! alias that runs `rm` and a hooks folder.
#![no_main]

#[path = "../../tests/shell_rules/mod.rs"]
mod shell_rules;

use libfuzzer_sys::fuzz_target;

/// The files' text when the input gives none.
const GIT_CONFIG: &str = "[alias]\n\tst = !rm f\n\tpu = push\n[core]\n\thooksPath = hooks\n";

fuzz_target!(|data: &[u8]| {
    let (command, files) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], data.get(at + 1..).map(String::from_utf8_lossy)),
        None => (data, None),
    };
    let command = String::from_utf8_lossy(command);
    let files = files.map_or_else(|| GIT_CONFIG.to_owned(), |f| f.into_owned());
    if let Err(broke) = shell_rules::judge_every_way(&command, &files) {
        panic!("{broke}");
    }
});
