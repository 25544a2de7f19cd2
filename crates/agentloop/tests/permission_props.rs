//! Property tests of the permission gate's reading of a `shell` command, through the public
//! store, over text made of the pieces shell commands and git configurations are made of: see
//! [`shell_rules`] for what must hold. CI runs these; the cargo fuzz target (`fuzz/`,
//! `shell_permission`) checks the same for longer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod shell_rules;

use proptest::prelude::*;

/// The pieces shell commands and git configurations are made of, so that random text often
/// reaches the readers of launchers, options, scripts and aliases.
const PIECES: &[&str] = &[
    "rm",
    "git",
    "status",
    "push",
    "ls",
    "sh",
    "bash",
    "-c",
    "-e",
    "env",
    "xargs",
    "find",
    "-exec",
    "{}",
    "\\;",
    "sudo",
    "python3",
    "x.sh",
    "./x.sh",
    ".",
    "source",
    "BASH_ENV=x.sh",
    "alias.st=!rm",
    "st",
    "-C",
    "..",
    "/bin/rm",
    "$(",
    "`",
    ")",
    "(",
    "'",
    "\"",
    "\\",
    "\n",
    ";",
    "&&",
    "|",
    "||",
    "<",
    ">",
    ">>",
    "$",
    "{",
    "}",
    "=",
    " ",
    " ",
    " ",
    "[alias]",
    "[core]",
    "[include]",
    "\tpath = ",
    "hooksPath = hooks",
    "st = !",
    "pager = ",
    "#!/bin/sh",
    "docker",
    "exec",
    "timeout",
    "1",
    "nice",
    "--",
    "-x",
    "eval",
    "xargs -I{}",
    "~",
    "*",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(PIECES).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..24,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_shell_command_is_judged_promptly_and_a_deny_rule_never_loosens(
        command in text(),
        files in text(),
    ) {
        if let Err(broke) = shell_rules::judge_every_way(&command, &files) {
            prop_assert!(false, "{}", broke);
        }
    }
}
