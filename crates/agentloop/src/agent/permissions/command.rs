//! What a shell command runs, as deny and ask command prefixes read it: its chained parts, the
//! programs behind launchers (a container's and a pod's too: `docker exec`, `kubectl exec`),
//! the commands programs run by their own means (`find -exec`, `git -c alias.x='!…'`, `tar
//! --checkpoint-action`), the programs whose language runs commands, the files program words
//! lead to, and the files programs read their commands from (see [`super::reads`]). Reading
//! errs towards matching: a word that may run a program is read as running it, and a command
//! too deep to read whole ([`MAX_STEPS`]) matches.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::path::Path;

use super::resolve::ResolvePaths;

/// True when the command's first words are the prefix's words (whitespace between them does not
/// count). An empty prefix matches nothing.
pub(super) fn starts_with_words(command: &str, prefix: &str) -> bool {
    let mut words = command.split_whitespace();
    let mut wanted = prefix.split_whitespace().peekable();
    wanted.peek().is_some() && wanted.all(|w| words.next() == Some(w))
}

/// What splits a command into the parts of a chain (see [`CHAINING`](super::CHAINING)), and a
/// subshell's or a substitution's parentheses.
pub(super) const CHAIN_SPLIT: &str = ";&|`()<>\n\r";

/// How a command is being read: the count of files read so far in judging it (a script read
/// may name another: past [`MAX_READS`] a file is taken as one that cannot be read, so that a
/// script that reads itself ends, as it does past [`MAX_DEPTH`] files deep), whether git's configuration is read (not while what one
/// says is judged, so that judging it reads it no more), and whether the command is a
/// script's text.
#[derive(Clone, Copy)]
pub(super) struct Reading<'a> {
    /// What reads the files a command has programs read.
    pub(super) files: &'a dyn ReadsFiles,
    pub(super) reads: &'a Cell<u32>,
    /// How many runs of words judging the command has read ([`words_run_from`]): past
    /// [`MAX_STEPS`] the command matches, so that commands nested in commands (`find -exec
    /// find -exec …`, each read from each of its options) cannot hold the gate for hours.
    pub(super) steps: &'a Cell<u32>,
    pub(super) git_config: bool,
    pub(super) script: bool,
    /// Whether a `~` may be read as the tool's home folder ([`ResolvePaths::home`]): not once
    /// a command read on the way may change `HOME` (`HOME=x sh go.sh`, whose `cd ~` goes to
    /// `x`), see [`may_change_home`].
    pub(super) home: bool,
    /// How many files deep the reading is (a script that a script runs): past
    /// [`MAX_DEPTH`] a file is taken as one that cannot be read.
    pub(super) depth: u32,
}

/// The reading of the files a command has programs read and run ([`super::reads`]): a seam, so
/// that the reading of files (which reads the commands in them) and the reading of commands
/// (which finds the files) keep to a file each.
pub(super) trait ReadsFiles {
    /// True when the shell script at `path` runs the prefix's words; with `shebang`, a program
    /// run by its path, read only when its `#!` names a shell.
    fn script_runs(
        &self,
        path: &str,
        wanted: &[&str],
        programs: Programs<'_>,
        shebang: bool,
    ) -> bool;
    /// True when `words`, from a shell or `.`/`source` on, have it read a file of commands that
    /// runs the prefix's words.
    fn shell_reads_run(&self, words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool;
    /// True when the git command whose words after `git` are `words` runs the prefix's words by
    /// what its repository's files say.
    fn repository_runs(&self, words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool;
    /// True when the command names a git folder's own files and the prefix's program is git.
    fn writes_git_own_files(&self, command: &str, prefix: &str) -> bool;
    /// True when a program of `command` takes commands from its input (`… | sh`, `sh < x.sh`)
    /// and they run the prefix's words, or are text no prefix can read.
    fn fed_commands_run(&self, command: &str, wanted: &[&str], programs: Programs<'_>) -> bool;
}

/// The most runs of words one command's judging reads ([`Reading::steps`]).
pub(super) const MAX_STEPS: u32 = 100_000;

/// The most files deep one command's judging reads.
pub(super) const MAX_DEPTH: u32 = 8;

/// True when some part of `command` runs the prefix's words, read as `reading` says (see
/// [`super::reads::chain_runs_with_words`]).
pub(super) fn chain_runs(
    command: &str,
    prefix: &str,
    resolver: Option<&dyn ResolvePaths>,
    reading: Reading<'_>,
) -> bool {
    let hidden = if reading.script {
        script_runs_hidden_code(command)
    } else {
        runs_hidden_code(command)
    };
    if hidden {
        // What such an expansion runs is built when the shell runs it (`${x@P}` of a value
        // made of `\x24\x28rm…`): no reading of the text sees it, so a deny or ask rule fails
        // closed, as it does for a program the shell expands.
        return true;
    }
    let Some(command) = backticks_as_dollar_parens(command) else {
        // Which backtick opens a substitution and which closes it then hangs on reading the
        // shell's quoting exactly; a reading one backtick off sees `` `echo rm` `` as text.
        return true;
    };
    // Only a backslash before a line feed joins lines: before a carriage return it keeps that
    // in the word (`echo a \<CR><LF>rm x` runs `rm`, in bash and dash alike).
    let joined = command.replace("\\\n", "");
    if runs_unread_commands(&joined) {
        // A program whose command is in a language no prefix reads (an awk program that calls
        // `system`, sed's `e`, a vim command line): whatever it runs may be the denied one.
        return true;
    }
    let parts: Vec<&str> = joined.split(|c: char| CHAIN_SPLIT.contains(c)).collect();
    let redirected = redirected_commands(&joined);
    // Only a tool that knows its home folder has one to keep.
    let known = resolver.and_then(|r| r.home());
    let reading = Reading {
        home: reading.home && known.is_some() && !may_change_home(&joined, &parts, &redirected),
        ..reading
    };
    let home = known.filter(|_| reading.home);
    // `cd sub && ./tidy`: a program word may be looked up in a folder the chain moves to, by a
    // `cd` wherever a program may stand (`command cd sub`, `X=1 cd sub`, `2>/dev/null cd sub`).
    let written: Vec<String> = parts
        .iter()
        .copied()
        .chain(redirected.iter().map(String::as_str))
        .flat_map(|part| folders_moved_to(&shell_words(part)))
        .collect();
    let folders = folders_reached(&written, home);
    let unnamed_folder = moves_to_an_unnamed_folder(&joined, &parts, &redirected, home.is_some());
    let chained = parts.iter().filter(|p| !p.trim().is_empty()).count() > 1;
    let words: Vec<String> = parts.iter().flat_map(|part| shell_words(part)).collect();
    let programs = Programs {
        resolver,
        folders: &folders,
        unnamed_folder,
        home,
        chain: if chained { &words } else { &[] },
        reading,
    };
    if reading.files.writes_git_own_files(&joined, prefix) {
        return true;
    }
    let wanted: Vec<&str> = prefix.split_whitespace().collect();
    // `printf 'r\x6d x' | sh`, `sh < x.sh`, `. <(…)`: commands a program takes from its input.
    if reading.files.fed_commands_run(&joined, &wanted, programs) {
        return true;
    }
    if parts
        .iter()
        .any(|part| runs_with_words(part, prefix, programs))
    {
        return true;
    }
    // `>/dev/null rm x`, `x='a;b' rm x`: the parts above are cut at every operator, in quotes
    // too, and take a redirection's file, or the quoted tail of a word, for the program.
    if redirected
        .iter()
        .any(|text| runs_with_words(text, prefix, programs))
    {
        return true;
    }
    let launches = |part: &str| {
        shell_words(part)
            .first()
            .is_some_and(|w| is_launcher(program_name(w)))
    };
    // `echo 'rm x' | >/dev/null sh`: a launcher behind a redirection launches as well.
    let any_launches = parts.iter().any(|p| launches(p)) || redirected.iter().any(|t| launches(t));
    if parts.len() < 2 || !any_launches {
        return false;
    }
    (0..words.len()).any(|i| word_runs(&words, i, &wanted, programs))
}

/// `command` with each backtick substitution spelled `$(…)`, so that it is read as that one is:
/// split at its parentheses, with the `$` left beside the text before it (`` `echo rm` -rf . ``
/// is `$(echo rm) -rf .`, whose program `$` may expand to anything). `None` when a backtick in
/// it may be literal, where a backslash (`` \` ``), a single quote, a comment (`#`) or a
/// here-document (`<<`) could put it: the backticks cannot then be paired by counting. Outside
/// those, the shell opens and closes substitutions at alternate backticks, in double quotes too.
pub(super) fn backticks_as_dollar_parens(command: &str) -> Option<Cow<'_, str>> {
    if !command.contains('`') {
        return Some(Cow::Borrowed(command));
    }
    if command.contains(['\\', '\'', '#']) || command.contains("<<") {
        return None;
    }
    let mut opens = true;
    let mut spelled = String::with_capacity(command.len() + command.len() / 4);
    for c in command.chars() {
        if c == '`' {
            spelled.push_str(if opens { "$(" } else { ")" });
            opens = !opens;
        } else {
            spelled.push(c);
        }
    }
    Some(Cow::Owned(spelled))
}

/// True when `command` holds an expansion that can run code in bash (the `sh` of some systems),
/// though no `$(` or backtick appears in it: a `${…}` that is more than a plain name (`${x@P}`
/// expands a prompt, which runs the command substitutions in `x`'s value; `${!x}` and `${a[…]}`
/// evaluate subscripts; `${x:=…}` assigns what a later word expands), arithmetic (`$((…))`,
/// `$[…]`: a variable named in it is evaluated as an expression, subscripts included). `$x` and
/// `${x}` only substitute a value and run nothing.
pub(super) fn runs_hidden_code(command: &str) -> bool {
    if command.contains("$((") || command.contains("$[") {
        return true;
    }
    command.match_indices("${").any(|(at, _)| {
        let rest = command.get(at + 2..).unwrap_or_default();
        let name = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        !(name > 0 && rest.get(name..name + 1) == Some("}"))
    })
}

/// [`runs_hidden_code`] for a script's text, which a deny or ask rule reads only to see more
/// (an allow rule never reads one): a `${NAME…}` that only substitutes, tests or trims a
/// value (`${x:-y}`, `${x:+y}`, `${x-y}`, `${#x}`, `${x%y}`, `${x#y}`, `${x/y/z}`) runs
/// nothing of its own, and scripts are full of them. A substring's `${x:offset}` evaluates
/// its offset, an indirection (`${!x}`), a subscript or a transformation (`${x@P}`) may run
/// code: those still fail closed.
pub(super) fn script_runs_hidden_code(text: &str) -> bool {
    if text.contains("$((") || text.contains("$[") {
        return true;
    }
    text.match_indices("${").any(|(at, _)| {
        let rest = text.get(at + 2..).unwrap_or_default();
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        let name = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let after = rest.get(name..).unwrap_or_default();
        let plain = ["}", ":-", ":+", ":?", "-", "+", "?", "%", "#", "/"]
            .iter()
            .any(|op| after.starts_with(op));
        !(name > 0 && plain)
    })
}

/// The words of a part of a command, quotes and backslashes taken out.
pub(super) fn shell_words(part: &str) -> Vec<String> {
    part.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| !matches!(c, '\\' | '\'' | '"'))
                .collect()
        })
        .filter(|w: &String| !w.is_empty())
        .collect()
}

/// True when `program` is one of the [`LAUNCHERS`] or [`SHELL_KEYWORDS`], in any case, or the dynamic loader
/// (`/lib64/ld-linux-x86-64.so.2 /bin/rm`) or a user-mode emulator (`qemu-x86_64 /bin/rm`),
/// which run the program they are given.
pub(super) fn is_launcher(program: &str) -> bool {
    let lower = program.to_ascii_lowercase();
    LAUNCHERS
        .iter()
        .chain(SHELL_KEYWORDS)
        .any(|l| l.eq_ignore_ascii_case(program))
        || ["ld-linux", "ld-musl", "qemu-"]
            .iter()
            .any(|p| lower.starts_with(p))
        || lower == "ld.so"
}

/// A program's file name: `rm` of `/bin/rm`. Compared with a rule's program in any case: on a
/// file system that ignores case (macOS's by default), `RM` and `/BIN/RM` run `/bin/rm`.
pub(super) fn program_name(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// How a deny or ask rule finds the file a program word runs: the tool's own [`ResolvePaths`]
/// ([`ResolvePaths::programs`]), when it has one, from its folder and from each folder the
/// command moves to (`cd sub && ./tidy`).
#[derive(Clone, Copy)]
pub(super) struct Programs<'a> {
    pub(super) resolver: Option<&'a dyn ResolvePaths>,
    /// The folders the command's `cd` and `pushd` name, as written.
    pub(super) folders: &'a [String],
    /// True when the command may move to a folder no reading of its words names (`cd -`,
    /// `popd`, `cd "$D"`, a `cd` under `CDPATH`): a file it then names by a relative path may
    /// be any file of that folder.
    pub(super) unnamed_folder: bool,
    // outside-paths: off (`~` is the tool's home folder: this reads it)
    /// The tool's home folder, when it is known and the command cannot change `HOME` (see
    /// [`Reading::home`]): where `~` and `~/…` lead.
    pub(super) home: Option<&'a Path>,
    // outside-paths: on
    /// The words of the whole command when it is a chain of more than one part (else none): a
    /// file one part reads may be one another part makes of a file it names (`cp x.sh y.sh &&
    /// sh y.sh`).
    pub(super) chain: &'a [String],
    /// How the command is being read.
    pub(super) reading: Reading<'a>,
}

/// The most files one command's judging reads (scripts, git configurations and hooks).
pub(super) const MAX_READS: u32 = 1024;

/// True when `word`, in a program's place, runs the program `wanted`: by its file name in any
/// case (`/BIN/RM`), or by the file name of what it resolves to for the tool (`./tidy`, a link
/// to `/bin/rm`).
pub(super) fn names_program(wanted: &str, word: &str, programs: Programs<'_>) -> bool {
    if same_program(wanted, program_name(word)) {
        return true;
    }
    if word.is_empty() || word.starts_with('-') || word.contains('=') {
        return false;
    }
    let Some(resolver) = programs.resolver else {
        return false;
    };
    let named = |candidate: &str| {
        resolver.programs(candidate).iter().any(|file| {
            file.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| same_program(wanted, n))
        })
    };
    // outside-paths: off (`~` is the tool's home folder: this reads it)
    // `~/bin/tidy`: a file of the home folder. Quoted, `~` is a folder of that name: both
    // are looked at. Another's home (`~bob/x`), the working folder (`~+/x`), the last one
    // (`~-/x`) or a home folder not known lead where this reading cannot say.
    if word.starts_with('~') {
        match from_home(word, programs.home) {
            Some(file) if named(&file) => return true,
            Some(_) => {}
            None => return true,
        }
    }
    // outside-paths: on
    // A relative path is also looked up from each folder the command moves to; a bare name
    // is looked up on `PATH`, wherever the command is.
    let relative = word.contains('/') && !word.starts_with('/');
    if relative && programs.unnamed_folder {
        // `cd - && ./tidy`: the file it runs is in a folder this reading cannot name.
        return true;
    }
    named(word)
        || (relative
            && programs
                .folders
                .iter()
                .any(|folder| named(&format!("{folder}/{word}"))))
}

/// True when the file name `name` is the program `wanted`, in any case, or a version of it
/// (`python3.12`, `python3-12` and `python312` of `python3`; `gcc-13` of `gcc`): the same
/// program under the name its package gives each version.
pub(super) fn same_program(wanted: &str, name: &str) -> bool {
    if wanted.eq_ignore_ascii_case(name) {
        return true;
    }
    let (Some(head), Some(version)) = (name.get(..wanted.len()), name.get(wanted.len()..)) else {
        return false;
    };
    let version = version.strip_prefix(['.', '-']).unwrap_or(version);
    !wanted.is_empty()
        && head.eq_ignore_ascii_case(wanted)
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// The words after `git` as git runs them: `send-pack` and `http-push` are what `push` runs
/// (a deny or ask on `git push` matches them), `fetch-pack` what `fetch` runs, and `subtree
/// push` pushes as `push` does.
fn git_plumbing_as_porcelain(rest: &[String]) -> Vec<String> {
    rest.iter()
        .filter(|w| !w.eq_ignore_ascii_case("subtree"))
        .map(|w| match w.to_ascii_lowercase().as_str() {
            "send-pack" | "http-push" => "push".to_owned(),
            "fetch-pack" => "fetch".to_owned(),
            _ => w.clone(),
        })
        .collect()
}

/// True when the program word `candidate` is git, or one of git's own programs by its file
/// name (`/usr/lib/git-core/git-push`, which is `git push`), and with the words after it
/// (`rest`) runs the prefix's words.
fn git_runs_as(candidate: &str, rest: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    let (Some(first), after) = (wanted.first(), wanted.get(1..).unwrap_or_default()) else {
        return false;
    };
    if !first.eq_ignore_ascii_case("git") {
        return false;
    }
    let name = program_name(candidate).to_ascii_lowercase();
    match name.strip_prefix("git-") {
        Some(subcommand) => {
            let run: Vec<String> = std::iter::once(subcommand.to_owned())
                .chain(rest.iter().cloned())
                .collect();
            rest_runs_with(after, &git_plumbing_as_porcelain(&run))
        }
        None => {
            names_program(first, candidate, programs)
                && rest_runs_with(after, &git_plumbing_as_porcelain(rest))
        }
    }
}

/// True when the variable `name` has git read its configuration or its programs from
/// elsewhere (a file, a folder, more variables), which no prefix reads: `GIT_CONFIG_GLOBAL`,
/// `GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_KEY_0`, `GIT_EXEC_PATH`, `GIT_TEMPLATE_DIR` (hooks),
/// `GIT_DIR` and `GIT_COMMON_DIR` (another repository's configuration and hooks).
pub(super) fn git_reads_elsewhere(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    (name.starts_with("GIT_CONFIG") && name != "GIT_CONFIG_NOSYSTEM" && name != "GIT_CONFIG_COUNT")
        || name == "GIT_EXEC_PATH"
        || name == "GIT_TEMPLATE_DIR"
        // Another repository's configuration and hooks, wherever they are.
        || name == "GIT_DIR"
        || name == "GIT_COMMON_DIR"
}

/// True when the variable `name` moves where git finds its global configuration (`HOME`,
/// `XDG_CONFIG_HOME`): set for a `git`, it is judged as `GIT_CONFIG_GLOBAL` is (see
/// [`git_reads_elsewhere`]), since no prefix reads the file it leads to.
pub(super) fn moves_git_home(name: &str) -> bool {
    matches!(name, "HOME" | "XDG_CONFIG_HOME")
}

/// True when one of `words` may run git: a word, or a word of its text (`sh -c 'git x'`), that
/// names `git` or one of its programs (`/usr/bin/git`, `git-upload-pack`).
pub(super) fn may_run_git(words: &[String]) -> bool {
    words.iter().any(|word| {
        word.split(|c: char| c.is_whitespace() || ";&|()`'\"".contains(c))
            .map(|piece| program_name(piece).to_ascii_lowercase())
            .any(|name| name == "git" || name.starts_with("git-"))
    })
}

/// True when `name` is a shell variable's name (`LESSOPEN`, `_x1`).
pub(super) fn is_variable_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// True when the word at `i` (or the value of its `--option=`, of its `NAME=`, or of its
/// `NAME=` after an `alias`) runs the prefix's words.
pub(super) fn word_runs(
    words: &[String],
    i: usize,
    wanted: &[&str],
    programs: Programs<'_>,
) -> bool {
    let Some(word) = words.get(i) else {
        return false;
    };
    let rest = words.get(i + 1..).unwrap_or_default();
    let runs = |candidate: &str| {
        (wanted
            .first()
            .is_some_and(|w| names_program(w, candidate, programs))
            && rest_runs_with(wanted.get(1..).unwrap_or_default(), rest))
            || git_runs_as(candidate, rest, wanted, programs)
    };
    // `env --split-string=rm …`: a launcher's option whose value is the program.
    let option_runs = word.starts_with('-') && word.split_once('=').is_some_and(|(_, v)| runs(v));
    // `LESSOPEN='|rm %s' less f`, `PAGER=rm git log`, `GIT_EXTERNAL_DIFF=rm git diff`: programs
    // run the commands their environment names, and which variable a program reads is its own
    // to say, so any variable's value is read as a program.
    // A value may itself be git's `KEY=!COMMAND` (`GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_VALUE_0`).
    let variable_runs = word.split_once('=').is_some_and(|(name, v)| {
        is_variable_name(name)
            && (git_reads_elsewhere(name)
                // `HOME=/tmp/h git x`, `export HOME=…; git x`: git reads a global configuration
                // the command chose.
                || (moves_git_home(name) && (may_run_git(rest) || may_run_git(programs.chain)))
                // `BASH_ENV=f bash -c …`, `ENV=f sh -i`: the shell first runs the file's commands.
                || (matches!(name, "BASH_ENV" | "ENV") && programs.reading.files.script_runs(v, wanted, programs, false))
                || runs(v)
                || runs(v.trim_start_matches('!'))
                || v.rsplit_once('=')
                    .is_some_and(|(_, last)| runs(last.trim_start_matches('!'))))
    });
    // `alias x=rm`: the name runs the value's words from the next line on (dash expands aliases
    // in `sh -c` too); read as if the value ran where it is defined.
    // The value first: looking back for the `alias` at each word of a long chain took time
    // growing with the square of its words (20 000 parts held the gate for seconds).
    let alias_runs = word.split_once('=').is_some_and(|(_, v)| runs(v))
        && words
            .get(..i)
            .is_some_and(|before| before.iter().any(|w| w == "alias"));
    runs(word) || option_runs || variable_runs || alias_runs
}

/// True when the command a shell would run for `part` starts with the prefix's words, seen the
/// way a deny or ask rule must see them: quotes and backslashes gone (`\\rm`, `'rm'`), the
/// program by its file name (`/bin/rm`) and by the file it resolves to, behind what only starts
/// another program or sets its environment (`command rm`, `env X=1 rm`, `sudo -n rm`, `sh -c
/// 'rm …'`, `xargs rm`, `timeout 5 rm`, `then rm`), and in what the program runs by its own
/// means ([`runs_by_own_means`]: `git -c alias.x='!rm' x`, `find -exec rm`). An allow rule
/// never gets this reading: it admits by the first words as written, and anything else falls
/// through.
pub(super) fn runs_with_words(part: &str, prefix: &str, programs: Programs<'_>) -> bool {
    let wanted: Vec<&str> = prefix.split_whitespace().collect();
    !wanted.is_empty() && words_run(&shell_words(part), &wanted, programs)
}

/// [`runs_with_words`] on the words of a part.
pub(super) fn words_run(words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    words_run_from(LauncherWalk::default(), words, wanted, programs)
}

/// [`words_run`] with the walk begun as `walk` says: after a launcher's own words (`docker
/// exec`'s container) are still to come.
pub(super) fn words_run_from(
    mut walk: LauncherWalk,
    words: &[String],
    wanted: &[&str],
    programs: Programs<'_>,
) -> bool {
    let steps = programs.reading.steps.get().saturating_add(1);
    programs.reading.steps.set(steps);
    if steps > MAX_STEPS {
        return true;
    }
    for (i, word) in words.iter().enumerate() {
        // In a script's text, `PATH="$X/bin:$PATH"` only sets a variable: its value is not
        // split into words, and a substitution in it is a part of the chain of its own.
        let assigns = programs.reading.script
            && word
                .split_once('=')
                .is_some_and(|(name, _)| is_variable_name(name));
        if may_expand(word) && !assigns {
            // `$x`, `/bin/r[m]`, `{rm,ls}`: the shell makes the program (and maybe more words)
            // of it, which no reading of the text can know. A deny or ask rule fails closed.
            return true;
        }
        let place = walk.step(word);
        if place != Place::Own && word_runs(words, i, wanted, programs) {
            return true;
        }
        let from_here = words.get(i..).unwrap_or_default();
        // `sh x.sh`, `. ./env`, `bash --rcfile f`: the commands of a file the shell reads.
        if programs
            .reading
            .files
            .shell_reads_run(from_here, wanted, programs)
        {
            return true;
        }
        match place {
            Place::Own => {}
            Place::Past => {
                // `env -S'rm -rf .'`, `env -iSrm`: an option's value written onto it.
                let rest = words.get(i + 1..).unwrap_or_default();
                if attached_value_runs(word, rest, wanted, programs) {
                    return true;
                }
            }
            // Taken as a launcher's value (`env -i git …` reads `git` so); were it the program,
            // what it runs by its own means must still be seen.
            Place::Value => {
                if runs_by_own_means(from_here, wanted, programs) {
                    return true;
                }
            }
            // The program: what it runs by its own means (`find -exec`, `git -c alias.x=!…`),
            // and, when it is a shell script named by its path (`./x.sh`), its commands.
            Place::Program => {
                return runs_by_own_means(from_here, wanted, programs)
                    || (word.contains('/')
                        && programs
                            .reading
                            .files
                            .script_runs(word, wanted, programs, true));
            }
        }
    }
    false
}

/// Where a word of a command stands, read from its start: see [`LauncherWalk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// A launcher, an option, an assignment: read past it.
    Past,
    /// A launcher's option value or own word (`sudo -u root`, `chroot DIR`), which may also
    /// be the program when the launcher takes none there.
    Value,
    /// The program the command runs.
    Program,
    /// A launcher's own subcommand that runs no program ([`RUNNERS_OWN_SUBCOMMANDS`]): no
    /// program, read past.
    Own,
}

/// A walk over a command's words from its start to its program, past launchers, their
/// options, the values those take (`sudo -u root`, `timeout -s KILL`, `env -C /`) and their
/// own words (`chroot DIR`, `flock FILE`).
#[derive(Debug, Default)]
pub(super) struct LauncherWalk {
    /// The values the last option takes that are still to come.
    values: usize,
    positional: usize,
    /// The subcommands of the last launcher that are its own and run no program
    /// ([`RUNNERS_OWN_SUBCOMMANDS`]).
    own: &'static [&'static str],
}

/// Project runners' subcommands of their own that their launching subcommands (`npm exec rm`)
/// share a place with, and that run no program of that name: `npm rm lodash` uninstalls
/// `lodash`. Without them, the word would be read as the program (`rm`).
const RUNNERS_OWN_SUBCOMMANDS: &[(&str, &[&str])] = &[
    ("npm", &["rm", "r", "remove", "uninstall", "un", "unlink"]),
    ("pnpm", &["rm", "remove", "uninstall", "un", "unlink"]),
];

impl LauncherWalk {
    /// A walk that reads `positional` words of a launcher's own (`docker exec`'s container)
    /// before the program.
    pub(super) fn taking(positional: usize) -> Self {
        LauncherWalk {
            values: 0,
            positional,
            own: &[],
        }
    }

    /// Where the next word stands.
    fn step(&mut self, word: &str) -> Place {
        // Only the first word after the launcher and its options may be its own subcommand.
        let own = if word.starts_with('-') {
            self.own
        } else {
            std::mem::take(&mut self.own)
        };
        // An option or an assignment is read whole, though its value has a `/`: the file name
        // of `--chdir=/tmp` or `D=sub/dir` (`tmp`, `dir`) is no program's.
        let program = if word.starts_with('-') || is_assignment(word) {
            word
        } else {
            program_name(word)
        };
        if is_assignment(word) {
            Place::Past
        } else if let Some(takes) = LAUNCHER_POSITIONALS
            .iter()
            .find_map(|(name, n)| name.eq_ignore_ascii_case(program).then_some(*n))
        {
            (self.positional, self.values) = (takes, 0);
            self.own = RUNNERS_OWN_SUBCOMMANDS
                .iter()
                .find_map(|(name, own)| name.eq_ignore_ascii_case(program).then_some(*own))
                .unwrap_or_default();
            Place::Past
        } else if starts_another(program) {
            self.values = if program.starts_with('-') && !program.contains('=') {
                option_values(program)
            } else {
                0
            };
            Place::Past
        } else if self.values > 0 {
            self.values -= 1;
            Place::Value
        } else if self.positional > 0 {
            self.positional -= 1;
            if own.contains(&word) {
                Place::Own
            } else {
                Place::Value
            }
        } else {
            Place::Program
        }
    }
}

/// Launchers' options that take more than one value: bwrap's (`--bind SRC DEST`, `--setenv
/// VAR VALUE`, `--overlay RWSRC WORKDIR DEST`). Read after any launcher: a word taken for a
/// value is still read as the program too, so counting too many only makes a rule match more.
pub(super) const MULTI_VALUED_OPTIONS: &[(&str, usize)] = &[
    ("--bind", 2),
    ("--bind-try", 2),
    ("--dev-bind", 2),
    ("--dev-bind-try", 2),
    ("--ro-bind", 2),
    ("--ro-bind-try", 2),
    ("--bind-fd", 2),
    ("--ro-bind-fd", 2),
    ("--symlink", 2),
    ("--setenv", 2),
    ("--chmod", 2),
    ("--file", 2),
    ("--bind-data", 2),
    ("--ro-bind-data", 2),
    ("--overlay", 3),
    ("--tmp-overlay", 1),
    ("--ro-overlay", 1),
];

/// How many of the next words the option `word` takes as its values: one unless
/// [`MULTI_VALUED_OPTIONS`] says more.
fn option_values(word: &str) -> usize {
    MULTI_VALUED_OPTIONS
        .iter()
        .find_map(|(option, n)| (*option == word).then_some(*n))
        .unwrap_or(1)
}

/// True when `words` start with a launcher and name no program for it to run (`ssh host`,
/// `su`, `unshare -r`, `chroot /x`): such a launcher runs a shell, which reads its commands
/// from its input.
pub(super) fn launches_nothing(words: &[String]) -> bool {
    let mut walk = LauncherWalk::default();
    words.first().is_some_and(|w| is_launcher(program_name(w)))
        && words.iter().all(|w| walk.step(w) != Place::Program)
}

/// True when the one-letter option cluster `word` (`-S'rm x'`, `-iSrm`) carries, from its
/// second letter on, a value that runs the prefix's words: which letter takes a value is the
/// launcher's to say, so every tail of the cluster is read as one.
pub(super) fn attached_value_runs(
    word: &str,
    rest: &[String],
    wanted: &[&str],
    programs: Programs<'_>,
) -> bool {
    let Some(cluster) = word.strip_prefix('-').filter(|c| !c.starts_with('-')) else {
        return false;
    };
    if cluster.contains('=') {
        return false;
    }
    cluster.char_indices().skip(1).any(|(at, _)| {
        cluster.get(at..).is_some_and(|value| {
            let run: Vec<String> = std::iter::once(value.to_owned())
                .chain(rest.iter().cloned())
                .collect();
            word_runs(&run, 0, wanted, programs)
        })
    })
}

/// True when the program `words[0]`, given the words after it, runs the prefix's words by its
/// own means: a program it is given in an option's value ([`RUNS_AFTER_OPTION`]: `find -exec`,
/// `tar --checkpoint-action=exec=`, `man -P`), git's (see [`git_runs`]), a variable a shell
/// builtin sets (`export PAGER=rm`) or make is given (`CC=rm`); or another name it makes for the
/// program (`ln -s /bin/rm tidy`, `cp`, `install`, `dd if=`).
pub(super) fn runs_by_own_means(words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    let Some(first) = words.first() else {
        return false;
    };
    let program = program_name(first).to_ascii_lowercase();
    if let Some(options) = runs_after(&program) {
        // `find . -name x -exec rm {} ;`: its paths and tests come first, and only what follows
        // an `-exec` is a program.
        return (1..words.len()).any(|i| option_runs(words, i, options, wanted, programs));
    }
    let rest = words.get(1..).unwrap_or_default();
    if let Some((_, subcommands, positional)) = CONTAINER_LAUNCHERS
        .iter()
        .find(|(name, _, _)| *name == program)
    {
        return launched_runs(rest, subcommands, *positional, wanted, programs);
    }
    match program.as_str() {
        "git" => git_runs(rest, wanted, programs),
        // `export PAGER=rm; git log`: each value is read as a program (see `word_runs`).
        "export" | "declare" | "typeset" | "local" | "readonly" | "make" | "gmake" => {
            (1..words.len()).any(|i| word_runs(words, i, wanted, programs))
        }
        // `ln -s /bin/rm tidy`, `cp /bin/rm tidy`: another name for the program, which a later
        // part of the chain (`&& ./tidy`) runs before any look-up could see it: made, it is as
        // the program is. A file named like the program (`cp rm rm.bak`) errs towards matching.
        "ln" | "link" | "cp" | "mv" | "install" | "rsync" | "gln" | "gcp" | "gmv" | "ginstall" => {
            wanted.first().is_some_and(|w| {
                rest.iter()
                    .any(|word| !word.starts_with('-') && names_program(w, word, programs))
            })
        }
        // `socat - EXEC:'rm x',pty`: an address that runs a program.
        "socat" => (1..words.len()).any(|i| {
            let Some(word) = words.get(i) else {
                return false;
            };
            let lower = word.to_ascii_lowercase();
            let Some(value) = ["exec:", "system:"]
                .iter()
                .find_map(|p| lower.starts_with(p).then(|| word.get(p.len()..)))
                .flatten()
            else {
                return false;
            };
            let value = value.split(',').next().unwrap_or_default();
            let run: Vec<String> = std::iter::once(value.to_owned())
                .chain(words.get(i + 1..).unwrap_or_default().iter().cloned())
                .collect();
            words_run(&run, wanted, programs)
        }),
        "dd" => wanted.first().is_some_and(|w| {
            rest.iter().any(|word| {
                word.strip_prefix("if=")
                    .is_some_and(|file| names_program(w, file, programs))
            })
        }),
        _ => false,
    }
}

/// Programs that run a command inside a container, a pod or another machine when given one
/// of their subcommands (`docker exec CONTAINER rm`, `kubectl exec POD -- rm`), and how many
/// words of their own (the container, the image) come before that command. Their other
/// subcommands (`docker rm CONTAINER`) run nothing of the caller's.
pub(super) const CONTAINER_LAUNCHERS: &[(&str, &[&str], usize)] = &[
    ("docker", &["exec", "run", "create"], 1),
    ("podman", &["exec", "run", "create"], 1),
    ("podman-remote", &["exec", "run", "create"], 1),
    ("nerdctl", &["exec", "run", "create"], 1),
    ("docker-compose", &["exec", "run"], 1),
    ("kubectl", &["exec", "run", "debug"], 1),
    ("oc", &["exec", "run", "debug", "rsh"], 1),
    ("lxc", &["exec"], 1),
    ("incus", &["exec"], 1),
    ("distrobox", &["enter", "ephemeral"], 1),
    ("machinectl", &["shell"], 1),
    ("vagrant", &["ssh"], 1),
];

/// True when the words after a [`CONTAINER_LAUNCHERS`] program run the prefix's words: from
/// the first of its `subcommands` on (`docker compose exec` and `docker container run` come to
/// one), read as a launcher's words are ([`LauncherWalk`]: options, their values, `positional`
/// words of its own, then the program; a word that may be an option's value or the program is
/// read as both). Every word after the subcommand is also read as the program, so that an
/// option of theirs read wrongly as taking no value (or one) hides nothing.
pub(super) fn launched_runs(
    rest: &[String],
    subcommands: &[&str],
    positional: usize,
    wanted: &[&str],
    programs: Programs<'_>,
) -> bool {
    let Some(at) = rest
        .iter()
        .position(|w| subcommands.iter().any(|s| s.eq_ignore_ascii_case(w)))
    else {
        return false;
    };
    let after = rest.get(at + 1..).unwrap_or_default();
    words_run_from(LauncherWalk::taking(positional), after, wanted, programs)
        || (0..after.len()).any(|i| word_runs(after, i, wanted, programs))
}

/// git's options before its subcommand that take the next word as their value.
pub(super) const GIT_VALUED_OPTIONS: &[&str] = &[
    "-C",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--super-prefix",
    "--attr-source",
    "--list-cmds",
];

/// git's subcommands and their options whose value (and, for `bisect run` and `submodule
/// foreach`, the words after them) git hands to a shell or runs as a program.
pub(super) const GIT_RUNS_AFTER_OPTION: &[(&str, &[&str])] = &[
    ("rebase", &["-x", "--exec"]),
    ("bisect", &["run"]),
    ("submodule", &["foreach"]),
    ("difftool", &["-x", "--extcmd"]),
    ("clone", &["-u", "--upload-pack"]),
    ("fetch", &["--upload-pack"]),
    ("pull", &["--upload-pack"]),
    ("ls-remote", &["--upload-pack"]),
    ("fetch-pack", &["--upload-pack", "--exec"]),
    ("archive", &["--exec"]),
    ("push", &["--receive-pack", "--exec"]),
    ("send-pack", &["--receive-pack", "--exec"]),
    (
        "filter-branch",
        &[
            "--setup",
            "--env-filter",
            "--tree-filter",
            "--index-filter",
            "--parent-filter",
            "--msg-filter",
            "--commit-filter",
            "--tag-name-filter",
        ],
    ),
    (
        "send-email",
        &[
            "--to-cmd",
            "--cc-cmd",
            "--header-cmd",
            "--sendmail-cmd",
            "--smtp-server",
        ],
    ),
];

/// True when the git command whose words after `git` are `words` runs the prefix's words by
/// git's own means: the value of a `-c KEY=VALUE` (an alias's `!…`, `core.pager`,
/// `core.sshCommand`, `diff.external`, `filter.*.clean`, … : git runs many keys' values, and
/// which it runs is git's to say, so every value is read as a program), a value `git config`
/// is given to keep for later, or a subcommand's option ([`GIT_RUNS_AFTER_OPTION`]). What
/// cannot be read matches whatever is wanted: a key that names a file or folder git reads
/// commands from (`core.hooksPath`, `include.path`, `includeIf.….path`), a value git takes
/// from the environment (`--config-env`), a folder of git's own programs (`--exec-path=`) or
/// of hooks (`--template`). An `ext::` URL is a command; so is `git grep -O`'s pager.
pub(super) fn git_runs(words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    if programs.reading.git_config
        && programs
            .reading
            .files
            .repository_runs(words, wanted, programs)
    {
        return true;
    }
    let names_a_file = |key: &str| {
        let key = key.to_ascii_lowercase();
        key.ends_with("path") || key.starts_with("include")
    };
    // `-c KEY=VALUE`: VALUE (an alias's `!` taken off) and the words after it, as a program.
    // An alias's value without `!` is a git command of its own (`alias.p=push`: `git p` is
    // `git push`), so it is read after `git` too.
    let value_runs = |key: &str, value: &str, after: &[String]| {
        let alias = key.to_ascii_lowercase().starts_with("alias.") && !value.starts_with('!');
        let run: Vec<String> = alias
            .then(|| "git".to_owned())
            .into_iter()
            .chain(std::iter::once(value.trim_start_matches('!').to_owned()))
            .chain(after.iter().cloned())
            .collect();
        words_run(&run, wanted, programs)
    };
    let config_runs = |pair: &str, after: &[String]| {
        let Some((key, value)) = pair.split_once('=') else {
            return false;
        };
        names_a_file(key) || value_runs(key, value, after)
    };
    // `git clone 'ext::rm -rf .'`: the ext transport runs its URL as a command.
    let ext_runs = (0..words.len()).any(|i| {
        words
            .get(i)
            .and_then(|w| {
                w.get(..5)
                    .filter(|p| p.eq_ignore_ascii_case("ext::"))
                    .and(w.get(5..))
            })
            .is_some_and(|command| {
                let run: Vec<String> = std::iter::once(command.to_owned())
                    .chain(words.get(i + 1..).unwrap_or_default().iter().cloned())
                    .collect();
                words_run(&run, wanted, programs)
            })
    });
    // `git init --template=dir`, `git clone --template dir`: hooks from a folder.
    if ext_runs || words.iter().any(|w| w.starts_with("--template")) {
        return true;
    }
    let mut i = 0;
    while let Some(word) = words.get(i) {
        let lower = word.to_ascii_lowercase();
        if lower == "--config-env" || lower.starts_with("--config-env=") {
            return true;
        }
        if lower.starts_with("--exec-path=") {
            return true;
        }
        if word == "-c" {
            let after = words.get(i + 2..).unwrap_or_default();
            if words
                .get(i + 1)
                .is_some_and(|pair| config_runs(pair, after))
            {
                return true;
            }
            i += 2;
            continue;
        }
        if let Some(pair) = word.strip_prefix("-c").filter(|p| p.contains('=')) {
            if config_runs(pair, words.get(i + 1..).unwrap_or_default()) {
                return true;
            }
            i += 1;
            continue;
        }
        if word.starts_with('-') {
            let takes_value = GIT_VALUED_OPTIONS.iter().any(|o| o == word);
            i += if takes_value { 2 } else { 1 };
            continue;
        }
        // The subcommand.
        let rest = words.get(i..).unwrap_or_default();
        if lower == "config" {
            // `git config alias.x '!rm -rf .'`, `git config core.hooksPath hooks`: what it
            // keeps, a later `git` runs.
            return rest
                .iter()
                .skip(1)
                .any(|w| !w.starts_with('-') && names_a_file(w))
                || (1..rest.len()).any(|k| {
                    let (Some(key), Some(after)) = (rest.get(k), rest.get(k + 1..)) else {
                        return false;
                    };
                    after
                        .split_first()
                        .is_some_and(|(value, after)| value_runs(key, value, after))
                })
                || (1..rest.len()).any(|k| {
                    let value: Vec<String> = rest
                        .get(k..)
                        .unwrap_or_default()
                        .iter()
                        .map(|w| w.trim_start_matches('!').to_owned())
                        .collect();
                    word_runs(&value, 0, wanted, programs)
                });
        }
        if lower == "grep" {
            // `git grep -Orm x`, `--open-files-in-pager=rm`: its value is run on the matches.
            let pager = rest.iter().skip(1).enumerate().find_map(|(k, w)| {
                let value = w
                    .strip_prefix("--open-files-in-pager=")
                    .or_else(|| w.strip_prefix("-O").filter(|v| !v.is_empty()))?;
                Some((k + 2, value))
            });
            if let Some((after, value)) = pager {
                let run: Vec<String> = std::iter::once(value.to_owned())
                    .chain(rest.get(after..).unwrap_or_default().iter().cloned())
                    .collect();
                if words_run(&run, wanted, programs) {
                    return true;
                }
            }
        }
        return GIT_RUNS_AFTER_OPTION
            .iter()
            .find(|(sub, _)| *sub == lower)
            .is_some_and(|(_, options)| {
                (1..rest.len()).any(|k| option_runs(rest, k, options, wanted, programs))
            });
    }
    false
}

/// True when the words after a program (`rest`) begin as the prefix's words after it
/// (`wanted`) do, read as a deny or ask rule must: a word the shell expands matches whatever is
/// left, and a one-letter option (`-c`) matches it inside a cluster (`-Ic`), with its value
/// attached (`-cprint(1)`) or after other options and their values (`-I -W ignore -c`). Which
/// option takes a value is the program's to say: any may here, so a deny rule errs towards
/// matching (`python3 -I script.py -c x` is denied by `python3 -c`). A word that is not an
/// option (a subcommand: `push` of `git push`) is found after the program's own options and
/// their values too (`git -C . push`, `git -c a=b push`, `git --no-pager push`).
pub(super) fn rest_runs_with(wanted: &[&str], rest: &[String]) -> bool {
    let mut words = rest.iter();
    for w in wanted {
        let letter = short_option(w);
        let subcommand = !w.starts_with('-');
        // True right after another option, whose value the next word may be (`-W ignore`).
        let mut after_option = false;
        loop {
            let Some(word) = words.next() else {
                return false;
            };
            if may_expand(word) {
                return true;
            }
            // A word that is no option may name a file (`cat .env`): on a file system that
            // ignores case, `cat .ENV` reads the same one. Options keep their case (`-r` and
            // `-R` are different options to many programs).
            if word == w || (subcommand && super::fold_name(word) == super::fold_name(w)) {
                break;
            }
            if subcommand {
                match word.strip_prefix('-') {
                    // `-C`, `--git-dir`: an option, whose value the next word may be.
                    Some(o) if !o.is_empty() && !o.contains('=') => after_option = true,
                    // `--git-dir=x`, `-cx=y`: an option with its value.
                    Some(o) if !o.is_empty() => after_option = false,
                    _ if after_option => after_option = false,
                    _ => return false,
                }
                continue;
            }
            let Some(letter) = letter else {
                return false;
            };
            let cluster = word
                .strip_prefix('-')
                .filter(|c| !c.is_empty() && !c.starts_with('-'));
            match cluster {
                Some(c) if c.contains(letter) => break,
                // Another option before the one wanted: read on.
                Some(_) => after_option = true,
                None if word.starts_with("--") => after_option = true,
                None if after_option => after_option = false,
                None => return false,
            }
        }
    }
    true
}

/// The letter of a one-letter option (`-c`), which a shell command may write in a cluster.
pub(super) fn short_option(word: &str) -> Option<char> {
    let mut chars = word.strip_prefix('-')?.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_alphanumeric() => Some(c),
        _ => None,
    }
}

/// True when a shell would expand the word into something else: a parameter (`$x`, `${x}`), a
/// glob (`*`, `?`, `[…]`) or braces (`{a,b}`; a lone `{` opens a group).
pub(super) fn may_expand(word: &str) -> bool {
    // A lone `[` (or `[[`) is the test command: with no `]` in it, no glob.
    let test = word == "[" || word == "[[";
    (word.contains(['$', '*', '?', '[']) && !test) || (word.contains('{') && word != "{")
}

/// The editors whose command lines and the commands they read run programs (`vim -c '!rm x'`,
/// `ed <<< '!rm x'`): [`runs_unread_commands`] matches each wherever it runs.
pub(super) const EDITORS: &[&str] = &[
    "vi",
    "vim",
    "nvim",
    "gvim",
    "vimx",
    "view",
    "gview",
    "vimdiff",
    "nvi",
    "rvim",
    "rview",
    "evim",
    "ex",
    "ed",
    "emacs",
    "emacsclient",
];

/// True when `command` runs a program whose own language can run a command that no prefix
/// reads, so that a deny or ask rule on any program must match it (the sandbox stays the
/// boundary): an awk program that calls `system`, prints to or reads from a command (`|`),
/// calls a function by name (`@f()`) or comes from a file or extension (`-f`, `-i`, `-l`,
/// `-E`, `-W exec`); a sed script with the `e` command or the `s///e` flag, or from a file
/// (`-f`), unless `--sandbox`; vi, vim, ex, ed and emacs (their command lines and the commands
/// they read run programs: `vim -c '!rm x'`, `ed <<< '!rm x'`); gdb and lldb given commands
/// (`-ex '!rm x'`); perl's `rename`, m4's `syscmd`, dc's `!`, sqlite3's `.shell` and
/// `.system`, psql's and mysql's `\\!` and `system`; less or more with an initial
/// command that runs one (`+!…`, `+|…`) or a lesskey file (`-k`); make with `--eval` or a
/// makefile on its standard input; and inline code of an interpreter (python's `-c`, perl's,
/// ruby's and node's `-e`, php's `-r`, code fed on standard input) that names a way to start a
/// process (`system`, `subprocess`, `popen`, `exec`, `spawn`, …). That last one is a tripwire:
/// code can build such a name at run time, and a script file is not read at all.
///
/// Each program is judged where a command of `command` starts (a shell's quoting taken into
/// account) or behind a launcher there.
pub(super) fn runs_unread_commands(command: &str) -> bool {
    let commands = quoted_commands(command);
    commands.iter().any(|words| {
        program_positions(words).into_iter().any(|at| {
            let (Some(program), Some(args)) = (words.get(at), words.get(at + 1..)) else {
                return false;
            };
            let name = program_name(program).to_ascii_lowercase();
            match name.as_str() {
                "awk" | "gawk" | "mawk" | "nawk" | "goawk" | "original-awk" => awk_runs(args),
                "sed" | "gsed" => sed_runs(args),
                editor if EDITORS.contains(&editor) => true,
                "less" | "more" => args.iter().any(|a| {
                    (a.starts_with('+') && a.contains(['!', '|']))
                        || a.starts_with("-k")
                        || a.starts_with("--lesskey")
                }),
                // gdb's and lldb's command lines run shells (`!`, `shell`, `python`).
                // Perl's rename runs its first argument as Perl.
                "rename" | "prename" | "file-rename" | "perl-rename" => {
                    args.iter().any(|a| names_a_process(a))
                }
                // m4's `syscmd`, dc's `!`, the database shells' `.shell`, `\!` and `system`.
                "m4" | "gm4" => command.contains("syscmd"),
                "dc" => {
                    args.iter().any(|a| a.contains('!') || a == "-f")
                        || (args.is_empty() && command.contains('!'))
                }
                "sqlite3" => {
                    args.iter()
                        .any(|a| a == "-cmd" || a == "-init" || a.trim_start().starts_with('.'))
                        || (args.iter().filter(|a| !a.starts_with('-')).count() < 2
                            && [".sh", ".sy", ".once", ".output", ".read", ".import"]
                                .iter()
                                .any(|c| command.contains(c)))
                }
                "psql" | "mysql" | "mariadb" => {
                    let lower = command.to_ascii_lowercase();
                    lower.contains("\\!")
                        || lower.contains("system")
                        || lower.contains("program")
                        || args.iter().any(|a| a == "-f" || a.starts_with("--file"))
                }
                "gdb" | "cgdb" | "lldb" => args.iter().any(|a| {
                    let option = a.trim_start_matches('-');
                    a.starts_with('-')
                        && (["ex", "iex", "x", "ix", "o", "O", "s", "S", "k", "K"]
                            .contains(&option)
                            || ["command", "eval-command", "init-", "one-line", "source"]
                                .iter()
                                .any(|o| option.starts_with(o)))
                }),
                "make" | "gmake" => args
                    .iter()
                    .any(|a| a == "-E" || a.starts_with("--eval") || a == "-" || a == "/dev/stdin"),
                _ if is_interpreter(&name) => interpreter_runs(args, command),
                _ => false,
            }
        })
    })
}

/// True when the awk call with `args` runs a command its program builds (see
/// [`runs_unread_commands`]).
pub(super) fn awk_runs(args: &[String]) -> bool {
    let mut after_value_option = false;
    args.iter().any(|a| {
        if std::mem::take(&mut after_value_option) {
            return false;
        }
        if let Some(option) = a.strip_prefix('-').filter(|o| !o.is_empty()) {
            // `-F SEP` and `-v NAME=VALUE` take a value that is not code.
            after_value_option = option == "F" || option == "v";
            let long = option.strip_prefix('-').unwrap_or_default();
            return option.starts_with(['f', 'i', 'l', 'E', 'W'])
                || ["file", "include", "load", "exec"]
                    .iter()
                    .any(|o| long.starts_with(o));
        }
        // `||` is a logical or; a lone `|` a pipe to or from a command.
        a.contains("system") || a.replace("||", "").contains('|') || a.contains('@')
    })
}

/// True when the sed call with `args` may run a command (see [`runs_unread_commands`]).
pub(super) fn sed_runs(args: &[String]) -> bool {
    if args.iter().any(|a| a == "--sandbox") {
        return false;
    }
    args.iter().any(|a| {
        if let Some(long) = a.strip_prefix("--") {
            return long.starts_with("file")
                || long
                    .strip_prefix("expression=")
                    .is_some_and(sed_script_runs);
        }
        match a.strip_prefix('-').filter(|o| !o.is_empty()) {
            Some(cluster) => {
                // `-n`, `-E` and the like stand alone; `-i` and `-l` take the rest of the word;
                // `-e` takes it as a script, `-f` as a file of one.
                for (at, letter) in cluster.char_indices() {
                    match letter {
                        'f' => return true,
                        'e' => {
                            return cluster.get(at + 1..).is_some_and(sed_script_runs);
                        }
                        'i' | 'l' => return false,
                        _ => {}
                    }
                }
                false
            }
            None => sed_script_runs(a),
        }
    })
}

/// True when a sed script may hold the `e` command (`1e rm x`, `$e`, `/x/e`) or an `s` command
/// with the `e` flag (`s/x/rm/e`, `s/x/y/ge`): an `e` with nothing but blanks, `s` flags and
/// numbers between it and the script's start or a character that is not a letter or a digit.
/// Errs towards matching (`s/ e/x/` too). The text of a regular expression an address gives
/// (`/start/,/end/p`) is no command, and is left out first ([`without_addresses`]) when no
/// `s` or `y` command is left, whose own slashes that reading would take for an address's.
pub(super) fn sed_script_runs(script: &str) -> bool {
    let stripped = without_addresses(script);
    let chars: Vec<char> = if stripped.iter().any(|c| matches!(c, 's' | 'y')) {
        script.chars().collect()
    } else {
        stripped
    };
    chars.iter().enumerate().any(|(at, &c)| {
        if c != 'e' {
            return false;
        }
        let before = chars.get(..at).unwrap_or_default();
        let mut back = before
            .iter()
            .rev()
            .skip_while(|c| c.is_whitespace())
            .skip_while(|c| "gpiImMw0123456789".contains(**c));
        back.next().is_none_or(|c| !c.is_ascii_alphanumeric())
    })
}

/// The characters of a sed script without the text of its regular-expression addresses: a
/// `/…/` where a command or its second address starts (at the start, after `;`, a line break,
/// `{`, `!`, or a `,` after an address), closed by a `/` no backslash escapes. The slashes stay,
/// so that what follows reads as it did (`/x/e` keeps its `e` command). One left open is kept.
fn without_addresses(script: &str) -> Vec<char> {
    let chars: Vec<char> = script.chars().collect();
    let mut out = Vec::with_capacity(chars.len());
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        let before = out.iter().rev().find(|c: &&char| !c.is_whitespace());
        let starts = match before {
            None => true,
            Some(';' | '\n' | '{' | '!') => true,
            Some(',') => out
                .iter()
                .rev()
                .filter(|c: &&char| !c.is_whitespace())
                .nth(1)
                .is_some_and(|c| c.is_ascii_digit() || *c == '$' || *c == '/'),
            Some(_) => false,
        };
        if c == '/' && starts {
            let mut end = at + 1;
            while let Some(&d) = chars.get(end) {
                match d {
                    '\\' => end += 2,
                    '/' => break,
                    _ => end += 1,
                }
            }
            if chars.get(end) == Some(&'/') {
                out.extend(['/', '/']);
                at = end + 1;
                continue;
            }
        }
        out.push(c);
        at += 1;
    }
    out
}

/// True when `name` (lower case) is an interpreter whose inline code [`interpreter_runs`]
/// reads.
pub(super) fn is_interpreter(name: &str) -> bool {
    name.starts_with("python")
        || name.starts_with("pypy")
        || name.starts_with("perl")
        || name.starts_with("ruby")
        || name.starts_with("php")
        || name.starts_with("lua")
        || matches!(
            name,
            "node" | "nodejs" | "deno" | "bun" | "rscript" | "tclsh" | "wish" | "expect" | "jruby"
        )
}

/// What inline code that starts a process is called in the interpreters' languages.
pub(super) const STARTS_A_PROCESS: &[&str] = &[
    "system",
    "exec",
    "spawn",
    "popen",
    "subprocess",
    "child_process",
    "fork",
    "pty",
    "ctypes",
    "os.",
    "posix",
    "readpipe",
    "qx",
    "%x",
    "`",
    "Open3",
    "IO.",
    "Process",
    "shell",
    "passthru",
    "proc_open",
    "pcntl",
    "eval",
    "__import__",
    "importlib",
    "getattr",
    "Command",
];

/// True when `code` names a way to start a process ([`STARTS_A_PROCESS`]).
pub(super) fn names_a_process(code: &str) -> bool {
    STARTS_A_PROCESS.iter().any(|n| code.contains(n))
}

/// True when an interpreter called with `args` is given inline code (an option's value, or
/// its standard input: no script named, or `-`) that names a way to start a process
/// ([`STARTS_A_PROCESS`]). Code on standard input comes from elsewhere in the `command` (a
/// pipe, a here-document), so the whole command is read then.
pub(super) fn interpreter_runs(args: &[String], command: &str) -> bool {
    if args.iter().all(|a| a.starts_with('-')) {
        return names_a_process(command);
    }
    // `-c` (python), `-e`, `-E` (perl, ruby, node, lua, Rscript), `-p` (node), `-r` (php), in
    // a cluster too (`-Ic`, `-ne`); `--eval`, `--print`, deno's `eval`.
    let carries_code = |a: &String| match a.strip_prefix('-') {
        Some(long) if long.starts_with('-') => ["-eval", "-print", "-command"]
            .iter()
            .any(|o| long.starts_with(o)),
        Some(cluster) => cluster.contains(['c', 'e', 'E', 'p', 'r']),
        None => a == "eval",
    };
    args.iter()
        .position(carries_code)
        .is_some_and(|at| args.iter().skip(at).any(|a| names_a_process(a)))
}

/// The folders a `cd` or `pushd` in `words` (one command) names, wherever a program may stand
/// ([`program_positions`]): the first word after it that is no option.
fn folders_moved_to(words: &[String]) -> Vec<String> {
    program_positions(words)
        .into_iter()
        .filter(|&at| {
            words
                .get(at)
                .is_some_and(|w| matches!(program_name(w), "cd" | "pushd"))
        })
        .filter_map(|at| {
            let rest = words.get(at + 1..)?;
            rest.iter().find(|w| !w.starts_with('-')).cloned()
        })
        .collect()
}

// outside-paths: off (`~` is the tool's home folder: this reads it)
/// The folders a command's moves may reach, from the folders its `cd`s and `pushd`s name as
/// written (`written`): those, the ones consecutive moves reach together, and, with the tool's
/// home folder known, the same with `~` and `~/…` read as the home folder's (`cd ~/repo`).
/// A quoted `~` is a folder of that name, so both readings are kept: more folders read only
/// match more.
fn folders_reached(written: &[String], home: Option<&Path>) -> Vec<String> {
    let mut folders = written.to_vec();
    folders.extend(folders_taken_together(written));
    let homed: Vec<String> = written
        .iter()
        .map(|folder| from_home(folder, home).unwrap_or_else(|| folder.clone()))
        .collect();
    if homed != written {
        folders.extend(folders_taken_together(&homed));
        folders.extend(homed);
    }
    folders
}

/// The path `word` names when it is `~` or starts with `~/`, from the tool's home folder
/// `home`; `None` for any other word (`~bob`, `~+`, `~-`, `x`) or with no home known.
pub(super) fn from_home(word: &str, home: Option<&Path>) -> Option<String> {
    let rest = if word == "~" {
        ""
    } else {
        word.strip_prefix("~/")?
    };
    let home = home?.to_str()?;
    Some(if rest.is_empty() {
        home.to_owned()
    } else {
        format!("{}/{rest}", home.trim_end_matches('/'))
    })
}
// outside-paths: on

/// Launchers ([`LAUNCHERS`]) that run their program with the caller's own `HOME`: any other
/// may run it as another user, in another root or environment (`sudo -u bob sh -c 'cd ~ &&
/// …'`, `env -i`, `direnv exec`, `nix develop`), where `~` is another folder.
const KEEP_HOME: &[&str] = &[
    "command",
    "builtin",
    "time",
    "nice",
    "ionice",
    "nohup",
    "timeout",
    "stdbuf",
    "setsid",
    "xargs",
    "watch",
    "flock",
    "hyperfine",
    "taskset",
    "chrt",
    "strace",
    "ltrace",
    "valgrind",
    "eatmydata",
    "nocache",
    "chronic",
    "ifne",
    "unbuffer",
    "parallel",
    "numactl",
    "entr",
    "watchexec",
    "env",
    "npm",
    "npx",
    "pnpm",
    "yarn",
    "uv",
    "uvx",
    "poetry",
    "pipenv",
    "bundle",
];

/// True when the command may set `HOME`, so that a `~` in it, or in a file it has read, may
/// not be the tool's home folder: it names `HOME` however quoted (`HO\ME=x`); it builds a
/// variable's name from an expansion where a name is set (`declare "${n}ME=x"`, `read "$n"`,
/// `(( $n = 1 ))`, a program in a `$`); it has the shell run commands from elsewhere (`eval`,
/// `.`, `source`, `trap`, `alias`); or it runs a launcher that may start its program with
/// another `HOME` ([`KEEP_HOME`]; `env -i`). A `$` elsewhere (`echo $PATH`, `export
/// PATH=$PATH:x`, `$(git rev-parse HEAD)`) sets no variable whose name no reading sees.
fn may_change_home(command: &str, parts: &[&str], redirected: &[String]) -> bool {
    let bare: String = command
        .chars()
        .filter(|c| !matches!(c, '\\' | '\'' | '"'))
        .collect();
    let expands = command.contains(['$', '`']);
    // `${!n}`, `${a[$n=1]}`, `$(( $n = 1 ))`, `[[ $n -eq 1 ]]`: arithmetic and indirection,
    // where an expanded name may be assigned.
    if bare.contains("HOME") || (expands && ["${", "((", "[["].iter().any(|s| command.contains(s)))
    {
        return true;
    }
    // Each program once: a long chain names few (`echo a | echo a | … | sh`).
    let mut programs: BTreeSet<String> = BTreeSet::new();
    for part in parts
        .iter()
        .copied()
        .chain(redirected.iter().map(String::as_str))
    {
        let words = shell_words(part);
        if words
            .iter()
            .any(|w| matches!(w.as_str(), "eval" | "source" | "trap" | "alias"))
        {
            return true;
        }
        let named: Vec<&str> = program_positions(&words)
            .into_iter()
            .filter_map(|at| words.get(at))
            .map(|word| program_name(word))
            .collect();
        // `env -i`, `env -`: a program started with no `HOME` finds another home folder.
        let emptied = named.contains(&"env")
            && words.iter().any(|w| {
                w == "-"
                    || w == "--ignore-environment"
                    || shell_option_letters(w).is_some_and(|letters| letters.contains('i'))
            });
        if emptied || (expands && sets_an_expanded_name(&words, &named)) {
            return true;
        }
        programs.extend(named.into_iter().map(str::to_owned));
    }
    programs.iter().any(|name| {
        name == "."
            || (is_launcher(name)
                && !KEEP_HOME.contains(&name.as_str())
                && !SHELL_KEYWORDS.contains(&name.as_str())
                && !is_shell(name))
    })
}

/// True when one command (its `words`, the programs `named` at its program places) may set a
/// variable whose name an expansion makes: a program that is itself an expansion (`$p`, which
/// may be `eval`), a builtin that sets the variables its words name (`read "$n"`, `printf -v
/// "$n"`, `unset "$n"`) with any `$` in its words, a declaring one (`export`, `declare`) with
/// a `$` in a name it sets (`declare "${n}ME=x"`, not `export PATH=$PATH:x`).
fn sets_an_expanded_name(words: &[String], named: &[&str]) -> bool {
    const SETS_NAMED: &[&str] = &[
        "read",
        "mapfile",
        "readarray",
        "getopts",
        "printf",
        "unset",
        "let",
    ];
    const DECLARES: &[&str] = &["declare", "typeset", "export", "local", "readonly"];
    named.iter().any(|name| {
        name.starts_with('$')
            || (SETS_NAMED.contains(name) && words.iter().any(|w| w.contains('$')))
            || (DECLARES.contains(name)
                && words
                    .iter()
                    .any(|w| w.split('=').next().is_some_and(|n| n.contains('$'))))
    })
}

/// The folders consecutive moves reach together (`cd a; cd b` is in `a/b`): each relative
/// folder joined to the ones before it, back to the last absolute one.
fn folders_taken_together(folders: &[String]) -> Vec<String> {
    let mut reached = String::new();
    let mut together = Vec::new();
    for folder in folders {
        if folder.starts_with('/') || reached.is_empty() {
            reached.clone_from(folder);
        } else {
            reached = format!("{reached}/{folder}");
            together.push(reached.clone());
        }
    }
    together
}

/// True when a `cd`, `pushd` or `popd` of `command` (its `parts` and `redirected` commands)
/// moves to a folder its words do not name: `cd` alone or `cd -` (the home folder, the last
/// one), `popd` and `pushd` alone or `pushd +1` (the folder stack), a folder an expansion names
/// (`cd "$D"`, `cd ~+/sub`, `cd s*`), or any move when the command sets `CDPATH` (`CDPATH=sub
/// cd inner` enters `sub/inner`).
fn moves_to_an_unnamed_folder(
    command: &str,
    parts: &[&str],
    redirected: &[String],
    home: bool,
) -> bool {
    let moves = |words: &[String]| -> Vec<(String, Option<String>)> {
        program_positions(words)
            .into_iter()
            .filter_map(|at| {
                let name = program_name(words.get(at)?);
                matches!(name, "cd" | "pushd" | "popd").then(|| {
                    let rest = words.get(at + 1..).unwrap_or_default();
                    let target = rest.iter().find(|w| *w == "-" || !w.starts_with('-'));
                    (name.to_owned(), target.cloned())
                })
            })
            .collect()
    };
    let all: Vec<(String, Option<String>)> = parts
        .iter()
        .copied()
        .chain(redirected.iter().map(String::as_str))
        .flat_map(|part| moves(&shell_words(part)))
        .collect();
    if !all.is_empty() && command.contains("CDPATH") {
        return true;
    }
    all.iter().any(|(name, target)| match target.as_deref() {
        _ if name == "popd" => true,
        None | Some("-") => true,
        Some(t) if name == "pushd" && t.starts_with('+') => true,
        // outside-paths: off (`~` is the tool's home folder: this reads it)
        // `~` and `~/x` are the home folder's when it is known ([`folders_reached`]).
        Some(t) => {
            (t.starts_with('~') && !(home && (t == "~" || t.starts_with("~/"))))
                || t.contains(['$', '*', '?', '[', '{'])
        } // outside-paths: on
    })
}

/// Where in `words` (one command) a program may stand: the first word, and past launchers,
/// their options and values, assignments and the like (as [`words_run`] walks them), each word
/// that may be the program run.
pub(super) fn program_positions(words: &[String]) -> Vec<usize> {
    let mut walk = LauncherWalk::default();
    let mut at = Vec::new();
    for (i, word) in words.iter().enumerate() {
        match walk.step(word) {
            // A launcher may run commands of its own (gdb's `-ex`).
            Place::Past if is_launcher(program_name(word)) => at.push(i),
            Place::Past | Place::Own => {}
            Place::Value => at.push(i),
            Place::Program => {
                at.push(i);
                break;
            }
        }
    }
    at
}

/// The simple commands of `command` as a shell splits them (at `;`, `&`, `|`, parentheses,
/// backticks, redirections and line breaks outside quotes), each as its words with quotes and
/// backslashes taken out and what they held kept in one word (`awk '{print | "sh"}'` is two
/// words). An unclosed quote runs to the end.
pub(super) fn quoted_commands(command: &str) -> Vec<Vec<String>> {
    segments(command)
        .into_iter()
        .map(|s| s.words)
        .filter(|words| !words.is_empty())
        .collect()
}

/// The simple commands of `command` as the shell runs them, as text: cut at its operators
/// outside quotes ([`segments`]), each redirection's file (the word after `>`, `2>`, `<`, `<<`,
/// `>&`, `>|`) taken out, so that the program is the first word left (`>out rm x` and
/// `2>/dev/null rm x` run `rm`; `x='a;b' rm x` too, its `;` quoted). The text after such a file
/// is also a command of its own, as the operators before the redirection may have ended the
/// one before (`a & >out rm x`): this errs towards matching.
pub(super) fn redirected_commands(command: &str) -> Vec<String> {
    let mut commands: Vec<String> = Vec::new();
    let mut current = String::new();
    for segment in segments(command) {
        if led_by_redirection(&segment) {
            let rest = after_first_word(&segment.raw);
            current.push(' ');
            current.push_str(rest);
            commands.push(rest.to_owned());
        } else {
            commands.push(std::mem::replace(&mut current, segment.raw));
        }
    }
    commands.push(current);
    // In double quotes a substitution's operators are quoted to `segments` (`"$(2>/dev/null rm
    // x)"`): cut at every operator, as the parts of a chain are, the text after a redirection's
    // file there too.
    let mut operators = String::new();
    let mut rest = command;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| CHAIN_SPLIT.contains(c))
            .unwrap_or(rest.len());
        let (part, tail) = rest.split_at(end);
        if !part.trim().is_empty() {
            if operators.contains(['<', '>']) && !operators.ends_with('(') {
                commands.push(after_first_word(part).to_owned());
            }
            operators.clear();
        }
        let mut tail = tail.chars();
        operators.extend(tail.next());
        rest = tail.as_str();
    }
    commands.retain(|text| !text.trim().is_empty());
    commands
}

/// True when `segment` follows a redirection (`>`, `2>`, `<<`, `>&`, `|>` after a pipe): its
/// first word is the redirection's file, not a program. `<(…)` and `>(…)` open a command.
pub(super) fn led_by_redirection(segment: &Segment) -> bool {
    segment.before.contains(['<', '>']) && !segment.before.ends_with('(')
}

/// `raw` after its first word, read as the shell reads it: quotes and backslashes keep blanks
/// in the word (`"a b" rm` is `rm` after `a b`).
fn after_first_word(raw: &str) -> &str {
    let text = raw.trim_start();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match (quote, c) {
            _ if escaped => escaped = false,
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('"') | None, '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c.is_whitespace() => return text.get(at..).unwrap_or_default(),
            _ => {}
        }
    }
    ""
}

/// A stretch of a command between two of the shell's operators (see [`segments`]).
#[derive(Debug, Default)]
pub(super) struct Segment {
    /// The operator characters before it, outside quotes (`|`, `<(`, `<<`, `;`), blanks
    /// between them dropped; empty at the start.
    pub(super) before: String,
    /// Its words, quotes and backslashes taken out.
    pub(super) words: Vec<String>,
    /// Its text as written.
    pub(super) raw: String,
}

/// `command` cut at each run of the shell's operators outside quotes (`;`, `&`, `|`,
/// parentheses, backticks, redirections, line breaks), each stretch with the operators before
/// it: `. <(printf x)` is `.`, then `printf x` after `<(`. An unclosed quote runs to the end.
pub(super) fn segments(command: &str) -> Vec<Segment> {
    let mut done = Vec::new();
    let mut current = Segment::default();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = command.chars();
    let end_word = |current: &mut Segment, word: &mut String, in_word: &mut bool| {
        if std::mem::take(in_word) {
            current.words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        let operator = quote.is_none() && ";&|()`<>\n\r".contains(c);
        if operator {
            end_word(&mut current, &mut word, &mut in_word);
            if !current.words.is_empty() || !current.raw.trim().is_empty() {
                done.push(std::mem::take(&mut current));
            }
            current.before.push(c);
            continue;
        }
        current.raw.push(c);
        match (quote, c) {
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    current.raw.push(next);
                    if !matches!(next, '"' | '\\' | '$' | '`' | '\n') {
                        word.push('\\');
                    }
                    if next != '\n' {
                        word.push(next);
                    }
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    current.raw.push(next);
                    if next != '\n' {
                        word.push(next);
                        in_word = true;
                    }
                }
            }
            (None, c) if c.is_whitespace() => end_word(&mut current, &mut word, &mut in_word),
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut current, &mut word, &mut in_word);
    done.push(current);
    done
}

/// True when `name` is a shell that reads a script file given after its options.
pub(super) fn is_shell(name: &str) -> bool {
    let name = program_name(name).to_ascii_lowercase();
    matches!(
        name.as_str(),
        "sh" | "bash"
            | "dash"
            | "zsh"
            | "ksh"
            | "ash"
            | "hush"
            | "mksh"
            | "lksh"
            | "pdksh"
            | "oksh"
            | "loksh"
            | "rbash"
            | "yash"
            | "posh"
            | "csh"
            | "tcsh"
            | "fish"
    )
}

/// The letters of a shell's one-letter option word (`-xe`, `+o`), or `None` for a word that
/// is no such option (a script, a command).
pub(super) fn shell_option_letters(word: &str) -> Option<&str> {
    word.strip_prefix('-')
        .or_else(|| word.strip_prefix('+'))
        .filter(|c| !c.is_empty())
}

/// The shell's keywords after which a program comes (`then rm x`, `! rm x`): launchers
/// ([`is_launcher`]) that keep the caller's `HOME`.
const SHELL_KEYWORDS: &[&str] = &[
    "then", "else", "elif", "do", "if", "while", "until", "!", "{", "}",
];

/// Programs and shell words that run the program that comes after them (with their options, see
/// [`starts_another`]): launchers, tracers, privilege and namespace changers, shells (the
/// shell's keywords are [`SHELL_KEYWORDS`]), `trap` and `coproc`, whose words the shell runs,
/// and `.` and `source`, which have the shell run the commands of a file (one another part of
/// the chain may write: `echo 'rm -rf .' > f; . ./f` is `… | sh` by another name).
pub(super) const LAUNCHERS: &[&str] = &[
    "command",
    "builtin",
    "exec",
    "eval",
    ".",
    "source",
    "env",
    "nohup",
    "sudo",
    "doas",
    "time",
    "nice",
    "ionice",
    "timeout",
    "xargs",
    "stdbuf",
    "setsid",
    "chroot",
    "busybox",
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "fish",
    "ash",
    "hush",
    "mksh",
    "lksh",
    "pdksh",
    "oksh",
    "loksh",
    "rbash",
    "yash",
    "posh",
    "csh",
    "tcsh",
    "osh",
    "ysh",
    "rc",
    "nu",
    "pwsh",
    "elvish",
    "xonsh",
    "trap",
    "coproc",
    "watch",
    "hyperfine",
    "lockf",
    "winpty",
    "entr",
    "watchexec",
    "flock",
    "strace",
    "ltrace",
    "unshare",
    "nsenter",
    "setpriv",
    "runuser",
    "su",
    "script",
    "taskset",
    "chrt",
    "fakeroot",
    "parallel",
    "unbuffer",
    "pkexec",
    "systemd-run",
    "firejail",
    "bwrap",
    "proot",
    "faketime",
    "numactl",
    "catchsegv",
    "caffeinate",
    "toybox",
    "valgrind",
    "torsocks",
    "torify",
    "proxychains",
    "proxychains4",
    "tsocks",
    "eatmydata",
    "nocache",
    "chronic",
    "ifne",
    "rlwrap",
    "xvfb-run",
    "dbus-run-session",
    "prlimit",
    "cpulimit",
    "sem",
    "sg",
    "newgrp",
    // Changers of the personality, the control group, the network namespace, the security
    // context, the capabilities and the limits a program runs with.
    "setarch",
    "linux32",
    "linux64",
    "i386",
    "x86_64",
    "cgexec",
    "ip",
    "runcon",
    "aa-exec",
    "capsh",
    "sandbox-exec",
    "systemd-inhibit",
    // Programs that start a program under themselves: a daemon, a session bus, an agent, a
    // debugger, a profiler, an init.
    "daemonize",
    "dbus-launch",
    "ssh-agent",
    "gdb",
    "perf",
    "tini",
    "dumb-init",
    "sshpass",
    // daemontools, runit and s6, whose tools each set one thing and run the rest of their words.
    "chpst",
    "softlimit",
    "envdir",
    "envuidgid",
    "setuidgid",
    "setlock",
    "pgrphack",
    "fghack",
    "s6-envdir",
    "s6-envuidgid",
    "s6-setuidgid",
    "s6-applyuidgid",
    "s6-setlock",
    "s6-softlimit",
    "s6-setsid",
    "s6-fghack",
    // Words that make a name run a program: an alias, a hashed path (`hash -p /bin/rm x`), a
    // function (`function x { rm …; }`). The name is then run in another part of the chain,
    // which only a reading of every word of the chain sees.
    "alias",
    "hash",
    "function",
    // `history -s 'rm x'; fc -s`: the shell runs again what its history holds.
    "fc",
    // Runners of a project's or environment's commands (`uv run rm`, `npm exec -- rm`,
    // `nix develop -c rm`), of a command on another host or outside a container (`ssh localhost
    // rm`, `flatpak-spawn --host rm`), as another user (`run0`, `gosu`, `su-exec`), in a
    // terminal multiplexer, or later (`at`, `batch`, fed by another part of the chain).
    "uv",
    "uvx",
    "poetry",
    "pipenv",
    "bundle",
    "npm",
    "npx",
    "pnpm",
    "yarn",
    "conda",
    "mamba",
    "micromamba",
    "pixi",
    "direnv",
    "mise",
    "asdf",
    "rbenv",
    "pyenv",
    "nix",
    "nix-shell",
    "ssh",
    "flatpak-spawn",
    "host-spawn",
    "distrobox-host-exec",
    "toolbox",
    "schroot",
    "run0",
    "gosu",
    "su-exec",
    "tmux",
    "screen",
    "at",
    "batch",
    // Containers of HPC (`apptainer exec IMAGE rm`), a recorder (`rr record rm`), detached
    // sessions (`dtach -c SOCKET rm`, `abduco -c NAME rm`), a daemon starter
    // (`start-stop-daemon --exec /bin/rm`), lock holders (`lckdo LOCK rm`, `with-lock-ex LOCK
    // rm`), a fake chroot, emulators of another architecture (`box64 rm`), and runners of a
    // project's or a package's commands (`pipx run`, `pdm run`, `hatch run`, `stack exec`,
    // `cabal exec`, `opam exec --`, `devbox run`).
    "apptainer",
    "singularity",
    "rr",
    "dtach",
    "abduco",
    "start-stop-daemon",
    "lckdo",
    "with-lock-ex",
    "fakechroot",
    "box64",
    "box86",
    "pipx",
    "pdm",
    "hatch",
    "stack",
    "cabal",
    "opam",
    "devbox",
    // GNU coreutils under their `g` names (Homebrew's).
    "gstdbuf",
    "gtimeout",
    "genv",
    "gnice",
    "gnohup",
    "gchroot",
];

/// Launchers that take words of their own before the program they run, and how many: `chroot
/// DIR rm`, `flock FILE rm`, `taskset MASK rm`, `chrt PRIORITY rm`, `su USER -c rm`,
/// `setarch ARCH rm`, `runcon CONTEXT rm`, `perf stat rm`, `envdir DIR rm`, `ip netns exec NAME
/// rm` (its `exec` is a launcher word of its own, so three words are read past: `netns`, the
/// name, and one more, which only makes a deny rule match more often).
pub(super) const LAUNCHER_POSITIONALS: &[(&str, usize)] = &[
    ("setarch", 1),
    ("function", 1),
    ("uv", 1),
    ("poetry", 1),
    ("pipenv", 1),
    ("bundle", 1),
    ("npm", 1),
    ("pnpm", 1),
    ("yarn", 1),
    ("conda", 1),
    ("mamba", 1),
    ("micromamba", 1),
    ("pixi", 1),
    ("direnv", 2),
    ("mise", 1),
    ("asdf", 1),
    ("rbenv", 1),
    ("pyenv", 1),
    ("nix", 2),
    ("ssh", 1),
    ("toolbox", 1),
    ("gosu", 1),
    ("su-exec", 1),
    ("tmux", 1),
    ("runcon", 1),
    ("perf", 1),
    ("ip", 3),
    ("envdir", 1),
    ("envuidgid", 1),
    ("setuidgid", 1),
    ("setlock", 1),
    ("s6-envdir", 1),
    ("s6-envuidgid", 1),
    ("s6-setuidgid", 1),
    ("s6-setlock", 1),
    ("gchroot", 1),
    ("chroot", 1),
    ("flock", 1),
    ("lockf", 1),
    ("taskset", 1),
    ("chrt", 1),
    ("su", 1),
    ("sg", 1),
    // `exec IMAGE`, `record`, the lock file, the subcommand (hatch's may be `env run`).
    ("apptainer", 2),
    ("singularity", 2),
    ("rr", 1),
    ("lckdo", 1),
    ("with-lock-ex", 1),
    ("pipx", 1),
    ("pdm", 1),
    ("hatch", 2),
    ("stack", 1),
    ("cabal", 1),
    ("opam", 1),
    ("devbox", 1),
];

/// Programs that run a program given as the value of one of their options, with those options:
/// `find -exec`, `fd -x` (`fdfind` on Debian), `rg --pre`, `tar -I` (and its other scripts),
/// `rsync -e`, `tar --checkpoint-action=exec=…`, `man -P`, `nc -e`, `zip -TT`, `sort
/// --compress-program`, `scp -S`, a terminal emulator's `-e`. What follows such an option, or its
/// `=` value and what follows, is a program and its arguments; the program's other words are
/// its own (paths, tests, patterns).
pub(super) const RUNS_AFTER_OPTION: &[(&str, &[&str])] = &[
    ("find", &["-exec", "-execdir", "-ok", "-okdir"]),
    ("fd", &["-x", "--exec", "-X", "--exec-batch"]),
    ("fdfind", &["-x", "--exec", "-X", "--exec-batch"]),
    ("rg", &["--pre"]),
    (
        "tar",
        &[
            "-I",
            "--use-compress-program",
            "--to-command",
            "-F",
            "--info-script",
            "--new-volume-script",
            "--checkpoint-action",
            "--rsh-command",
            "--rmt-command",
        ],
    ),
    ("rsync", &["-e", "--rsh", "--rsync-path"]),
    ("man", &["-P", "--pager", "--html"]),
    ("nc", &["-e", "-c"]),
    ("netcat", &["-e", "-c"]),
    ("ncat", &["-e", "--exec", "-c", "--sh-exec", "--lua-exec"]),
    ("zip", &["-TT", "--unzip-command"]),
    ("sort", &["--compress-program"]),
    ("scp", &["-S", "-o"]),
    ("sftp", &["-S", "-o"]),
    ("mapfile", &["-C"]),
    ("readarray", &["-C"]),
    // Terminal emulators run the program after their option (on a display, where there is one).
    ("xterm", &["-e"]),
    ("uxterm", &["-e"]),
    ("urxvt", &["-e"]),
    ("konsole", &["-e"]),
    ("alacritty", &["-e", "--command"]),
    ("xfce4-terminal", &["-e", "-x", "--execute"]),
    ("gnome-terminal", &["--", "-e", "-x"]),
    ("kitty", &["--"]),
];

/// The options of `program` after which a program comes ([`RUNS_AFTER_OPTION`]), in any case.
pub(super) fn runs_after(program: &str) -> Option<&'static [&'static str]> {
    RUNS_AFTER_OPTION
        .iter()
        .find_map(|(name, options)| name.eq_ignore_ascii_case(program).then_some(*options))
}

/// True when the word at `i` is one of `options` and what follows it runs the prefix's words
/// (`-exec rm …`), or is `OPTION=VALUE` and the value with what follows does (`--pre=rm`). A
/// value `exec=COMMAND` (tar's `--checkpoint-action`) runs COMMAND.
pub(super) fn option_runs(
    words: &[String],
    i: usize,
    options: &[&str],
    wanted: &[&str],
    programs: Programs<'_>,
) -> bool {
    let Some(word) = words.get(i) else {
        return false;
    };
    let rest = words.get(i + 1..).unwrap_or_default();
    let value_runs = |value: &str, rest: &[String]| {
        let value = value.strip_prefix("exec=").unwrap_or(value);
        let run: Vec<String> = std::iter::once(value.to_owned())
            .chain(rest.iter().cloned())
            .collect();
        words_run(&run, wanted, programs)
    };
    if options.contains(&word.as_str()) {
        return match rest.split_first() {
            Some((value, after)) => value_runs(value, after),
            None => false,
        };
    }
    word.split_once('=')
        .filter(|(option, _)| options.contains(option))
        .is_some_and(|(_, value)| value_runs(value, rest))
}

/// True when `word` is a shell variable assignment (`NAME=value`, `NAME+=value`).
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        let name = name.strip_suffix('+').unwrap_or(name);
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// A word a shell command can begin with that runs what comes after it rather than being the
/// program itself: a launcher, a shell keyword, an option or argument of one (`-n`, `5s`), or an
/// environment assignment (`X=1`). Reading past one of them can only make a deny or ask rule
/// match more often.
pub(super) fn starts_another(word: &str) -> bool {
    is_launcher(word)
        || word.starts_with('-')
        // GNU parallel's `:::` (and `::::`): the commands or arguments that follow.
        || word.starts_with(":::")
        || word.contains('=')
        || (word.starts_with(|c: char| c.is_ascii_digit())
            && word
                .chars()
                .all(|c| c.is_ascii_digit() || ".smhd".contains(c)))
}
