//! What a command has a program read from files and then run, as deny and ask command prefixes
//! read it: the script a shell is given (`sh x.sh`, `. ./env`, `BASH_ENV=f`, `--rcfile f`, a
//! `./x.sh` with a shell's `#!`), and a repository's git configuration (its aliases, pager,
//! hooks folder, included files) and hooks. The files are read through the tool's own
//! [`ResolvePaths::read_text`], bounded; one that cannot be read matches whatever is wanted.
//! A command that names a git folder's own files (`echo … >> .git/config`) matches any rule
//! on git: what it writes there, a later `git` runs.

use std::cell::Cell;
use std::path::{Component, Path, PathBuf};

use super::command::{
    EDITORS, MAX_DEPTH, MAX_READS, Programs, Reading, ReadsFiles, chain_runs, from_home, is_shell,
    program_name, shell_option_letters, shell_words, words_run,
};
use super::input::fed_commands_run;
use super::resolve::{FileText, ResolvePaths};

/// True when some part of `command` runs the prefix's words, read as a deny or ask rule must
/// (see [`super::command::runs_with_words`]), with the files its programs read (this module).
/// A backslash before a line break joins the lines (`r\` then `m` is `rm` to a shell), so it
/// is taken out before the command is split. When the command is a chain and a part of it runs
/// a launcher (`… | sh`, `… | xargs env`), what that launcher runs comes from another part,
/// which no reading of one part sees: then any word of the whole command that runs the
/// prefix's words matches.
pub(super) fn chain_runs_with_words(
    command: &str,
    prefix: &str,
    resolver: Option<&dyn ResolvePaths>,
) -> bool {
    let (reads, steps) = (Cell::new(0), Cell::new(0));
    let reading = Reading {
        files: &Reads,
        reads: &reads,
        steps: &steps,
        git_config: true,
        script: false,
        home: true,
        depth: 0,
    };
    chain_runs(command, prefix, resolver, reading)
}

/// The reading of files this module does, for [`super::command`].
struct Reads;

impl ReadsFiles for Reads {
    fn script_runs(
        &self,
        path: &str,
        wanted: &[&str],
        programs: Programs<'_>,
        shebang: bool,
    ) -> bool {
        script_runs(path, wanted, programs, shebang)
    }

    fn shell_reads_run(&self, words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
        shell_reads_run(words, wanted, programs)
    }

    fn repository_runs(&self, words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
        repository_runs(words, wanted, programs)
    }

    fn writes_git_own_files(&self, command: &str, prefix: &str) -> bool {
        writes_git_own_files(command, prefix)
    }

    fn fed_commands_run(&self, command: &str, wanted: &[&str], programs: Programs<'_>) -> bool {
        fed_commands_run(command, wanted, programs)
    }
}

/// What reading a file named in a command found, in every folder it may be read from.
enum Found {
    /// Nowhere.
    Missing,
    /// The texts found.
    Texts(Vec<String>),
    /// Somewhere, a file that cannot be read (or no way to read one, or too many read).
    Unreadable,
}

/// Reads `path` as the command would open it: from the tool's folder and from each folder
/// the command moves to (`cd sub && sh x.sh`), through the tool's [`ResolvePaths`].
///
/// [`ResolvePaths`]: super::ResolvePaths
fn read(programs: Programs<'_>, path: &str) -> Found {
    let Some(resolver) = programs.resolver else {
        return Found::Unreadable;
    };
    // outside-paths: off (`~` is the tool's home folder: this reads it)
    // A path from the home folder (`sh ~/x.sh`), read there when the tool's is known; quoted,
    // `~` is a folder of that name, read too. Another's (`~bob/x.sh`), the working folder's
    // (`~+/x.sh`), the last one's (`~-/x.sh`) cannot be named.
    let homed = if path.starts_with('~') {
        match from_home(path, programs.home) {
            Some(file) => Some(file),
            None => return Found::Unreadable,
        }
    } else {
        None
    };
    // outside-paths: on
    let relative = !path.starts_with('/');
    if relative && programs.unnamed_folder {
        // `cd - && sh x.sh`: which `x.sh` that is, the folder the command moved to says.
        return Found::Unreadable;
    }
    let candidates = homed
        .into_iter()
        .chain(std::iter::once(path.to_owned()))
        .chain(
            programs
                .folders
                .iter()
                .filter(|_| relative)
                .map(|folder| format!("{folder}/{path}")),
        );
    let mut texts = Vec::new();
    for candidate in candidates {
        let count = programs.reading.reads.get() + 1;
        programs.reading.reads.set(count);
        if count > MAX_READS || programs.reading.depth > MAX_DEPTH {
            return Found::Unreadable;
        }
        match resolver.read_text(&candidate) {
            FileText::Missing => {}
            FileText::Text(text) => texts.push(text),
            FileText::Unreadable | FileText::NotRead => return Found::Unreadable,
        }
    }
    if texts.is_empty() {
        Found::Missing
    } else {
        Found::Texts(texts)
    }
}

/// The lines of a shell script but its comment lines: those whose first word starts with `#`
/// where the shell reads a new command. A line that starts so inside a quoted string (`x='` on
/// the line before) or after a line continued by a backslash (`echo \`, whose next line the
/// shell joins to it, the `#` then ending that line) is kept: the shell may run what follows
/// its `#`, or join the next line to the one before, which dropping the line would hide. So is
/// every such line after what this reading does not follow: a here-document or here-string
/// (`<<`), a backtick, a substitution inside double quotes (`"$(echo "`), whose quotes nest.
fn without_comment_lines(text: &str) -> String {
    // The quote the text so far leaves open: `'`, `"`, or `$` for `$'…'`.
    let mut open: Option<char> = None;
    let mut continued = false;
    let mut unsure = false;
    let mut kept: Vec<&str> = Vec::new();
    // Cut at line feeds alone: a carriage return stays in its line, as it does for the shell,
    // where a backslash before it continues nothing.
    for line in text.split('\n') {
        // Only a blank or a tab comes before the word (`\u{a0}#;rm x` runs `rm`).
        let first = line.trim_start_matches([' ', '\t']);
        if open.is_none() && !continued && !unsure && first.starts_with('#') {
            continue;
        }
        kept.push(line);
        let mut chars = line.chars().peekable();
        // A line joined to the one before goes on with its last word.
        let mut word_start = !continued;
        while let Some(c) = chars.next() {
            match (open, c) {
                (Some('\''), '\'') | (Some('"'), '"') | (Some('$'), '\'') => open = None,
                (Some('"' | '$') | None, '\\') => {
                    chars.next();
                }
                (Some('"'), '$') if matches!(chars.peek(), Some('(' | '{')) => unsure = true,
                (Some('"') | None, '`') => unsure = true,
                (None, '<') if chars.peek() == Some(&'<') => unsure = true,
                (Some(_), _) => {}
                (None, '\'') => open = Some('\''),
                (None, '"') => open = Some('"'),
                (None, '$') if chars.peek() == Some(&'\'') => {
                    chars.next();
                    open = Some('$');
                }
                // A comment to the end of the line: no quote in it opens anything.
                (None, '#') if word_start => break,
                _ => {}
            }
            word_start = open.is_none() && " \t;&|()<>".contains(c);
        }
        continued = line.ends_with('\\');
    }
    kept.join("\n")
}

/// True when a shell's script `text` runs the prefix's words: each of its lines that is not a
/// comment ([`without_comment_lines`]), read as one command line (a chain of the script's lines).
fn text_runs(text: &str, wanted: &[&str], programs: Programs<'_>) -> bool {
    let commands = without_comment_lines(text);
    let prefix = wanted.join(" ");
    let reading = Reading {
        script: true,
        depth: programs.reading.depth + 1,
        ..programs.reading
    };
    chain_runs(&commands, &prefix, programs.resolver, reading)
}

/// True when the shell script at `path` runs the prefix's words. A script that cannot be read
/// matches. A missing one runs nothing (the shell fails to open it), unless another part of the
/// chain makes it: then it is judged by each file the chain names, any of which it may be made
/// of (`cp x.sh y.sh && sh y.sh`); what the chain writes into it itself (`echo … > y.sh; sh
/// y.sh`) is read with the chain's words, as a launcher's input is. With `shebang`, the file is
/// a program run by its path (`./x.sh`), judged only when its `#!` names a shell: another
/// interpreter's script is not read, and a program that is no text is what it is.
fn script_runs(path: &str, wanted: &[&str], programs: Programs<'_>, shebang: bool) -> bool {
    match read(programs, path) {
        Found::Missing => {
            !shebang
                && programs.chain.iter().any(|word| {
                    word != path
                        && !word.starts_with('-')
                        && matches!(read(programs, word), Found::Texts(texts)
                            if texts.iter().any(|text| text_runs(text, wanted, programs)))
                })
        }
        Found::Unreadable => !shebang,
        Found::Texts(texts) => texts.iter().any(|text| {
            (!shebang || starts_with_shell_shebang(text)) && text_runs(text, wanted, programs)
        }),
    }
}

/// True when `text` begins with a `#!` line that runs a shell (`#!/bin/sh`, `#!/usr/bin/env
/// bash`).
fn starts_with_shell_shebang(text: &str) -> bool {
    let Some(line) = text.lines().next().and_then(|l| l.strip_prefix("#!")) else {
        return false;
    };
    let mut words = line.split_whitespace();
    let first = words.next().map(program_name).unwrap_or_default();
    let interpreter = if first == "env" {
        words.find(|w| !w.starts_with('-') && !w.contains('='))
    } else {
        Some(first)
    };
    interpreter.is_some_and(is_shell)
}

/// True when `words`, from a shell or `.`/`source` on, have it read a file of commands that
/// runs the prefix's words: the script after its options (`bash -x x.sh`), the file of a `.`
/// or `source`, an `--rcfile`/`--init-file`. An interactive or login shell (`-i`, `-l`,
/// `--login`) reads its start-up files from the home folder, which the command does not say:
/// it matches. A shell given its commands (`-c`, `-s`) reads no script.
fn shell_reads_run(words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    let Some(first) = words.first() else {
        return false;
    };
    let sources = matches!(first.as_str(), "." | "source");
    if !sources && !is_shell(first) {
        return false;
    }
    let mut k = 1;
    while let Some(word) = words.get(k).filter(|_| !sources) {
        if word == "--" {
            k += 1;
            break;
        }
        if let Some(long) = word.strip_prefix("--") {
            let (name, value) = long.split_once('=').unwrap_or((long, ""));
            match name {
                "login" | "interactive" => return true,
                "rcfile" | "init-file" => {
                    let file = if value.is_empty() {
                        k += 1;
                        words.get(k).map(String::as_str).unwrap_or_default()
                    } else {
                        value
                    };
                    if script_runs(file, wanted, programs, false) {
                        return true;
                    }
                }
                _ => {}
            }
            k += 1;
            continue;
        }
        let Some(cluster) = shell_option_letters(word) else {
            break;
        };
        if word.starts_with('-') && cluster.contains(['i', 'l']) {
            return true;
        }
        if cluster.contains(['c', 's']) {
            return false;
        }
        // `-o pipefail`, `+O extglob`: an option's name.
        k += if cluster.contains(['o', 'O']) { 2 } else { 1 };
    }
    words
        .get(k)
        .is_some_and(|script| script_runs(script, wanted, programs, false))
}

/// The hooks git runs, by their names in a hooks folder (githooks(5)): between them, nearly
/// every command runs one (`reference-transaction`, `post-index-change`, `pre-auto-gc`).
const HOOKS: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// git's subcommands that only read, and run no hook of the repository they read.
const RUNS_NO_HOOK: &[&str] = &[
    "log",
    "show",
    "diff",
    "blame",
    "grep",
    "ls-files",
    "ls-tree",
    "rev-parse",
    "rev-list",
    "cat-file",
    "describe",
    "shortlog",
    "for-each-ref",
    "show-ref",
    "config",
    "help",
    "version",
    "var",
    "whatchanged",
    "name-rev",
    "cherry",
    "count-objects",
    "check-ignore",
    "check-attr",
    "format-patch",
];

/// The hooks a git subcommand (in lower case) may run: none for one that only reads
/// ([`RUNS_NO_HOOK`]), the index's for `status` (which may write the index), and every one for
/// any other (which hook a command runs is git's to say, and a command that updates a
/// reference runs `reference-transaction`).
fn hooks_of(subcommand: Option<&str>) -> &'static [&'static str] {
    match subcommand {
        None => &[],
        Some(sub) if RUNS_NO_HOOK.contains(&sub) => &[],
        Some("status") => &["post-index-change"],
        Some(_) => HOOKS,
    }
}

/// A lexical join: `path` from `base` (as it is when absolute), `.` and `..` taken out.
fn join(base: &Path, path: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for component in base.join(path).components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The folder a git command runs in and the repository folder it names, from the options
/// before its subcommand (`-C DIR`, repeated, each from the last; `--git-dir DIR`), and the
/// subcommand.
struct GitPlace {
    /// `-C` folders, in order.
    moves: Vec<String>,
    git_dir: Option<String>,
    subcommand: Option<usize>,
}

/// Reads the options of a git command (its words after `git`) up to its subcommand.
fn git_place(words: &[String]) -> GitPlace {
    let mut place = GitPlace {
        moves: Vec::new(),
        git_dir: None,
        subcommand: None,
    };
    let mut i = 0;
    while let Some(word) = words.get(i) {
        let next = words.get(i + 1).cloned();
        match word.as_str() {
            "-C" => place.moves.extend(next),
            "--git-dir" => place.git_dir = next,
            w if w.starts_with("--git-dir=") => {
                place.git_dir = w.strip_prefix("--git-dir=").map(str::to_owned);
            }
            w if w.starts_with('-') => {}
            _ => {
                place.subcommand = Some(i);
                break;
            }
        }
        let valued = super::command::GIT_VALUED_OPTIONS.contains(&word.as_str()) || word == "-c";
        i += if valued { 2 } else { 1 };
    }
    place
}

/// True when the git command whose words after `git` are `words` runs the prefix's words by
/// what its repository's own files say, found as git finds them from where it runs (the tool's
/// folder, a `cd` of the chain, `-C`, `--git-dir`; a `.git` file's `gitdir:`): its
/// configuration (`config`, `config.worktree`, the main repository's for a worktree, the files
/// they include), each key read as a `-c KEY=VALUE` of the command is (see
/// [`super::command::git_runs`]), but an alias only when the command runs it; and its hooks
/// (the hooks folder, or `core.hooksPath`), each read as a shell script. A file that cannot be
/// read matches; a missing one says nothing. Folders above the tool's count too: a repository
/// the agent's folder lies in is the one git uses. git's system and global configuration
/// ([`global_config_files`]) is read alike, in a repository or out of one.
fn repository_runs(words: &[String], wanted: &[&str], programs: Programs<'_>) -> bool {
    let Some(resolver) = programs.resolver else {
        return false;
    };
    if programs.unnamed_folder {
        // `cd - && git push`: the repository, so its configuration and hooks, is the one of a
        // folder this reading cannot name.
        return true;
    }
    let place = git_place(words);
    let (subcommand, after) = match place.subcommand {
        Some(at) => (
            words.get(at).map(|w| w.to_ascii_lowercase()),
            words.get(at + 1..).unwrap_or_default(),
        ),
        None => (None, &[][..]),
    };
    let root = resolver.root();
    let bases = std::iter::once(root.to_path_buf())
        .chain(programs.folders.iter().map(|folder| join(root, folder)));
    let judged = Judged {
        wanted,
        programs,
        subcommand: subcommand.as_deref(),
        after,
    };
    // `git x` runs a global alias `x` wherever it runs; a global `core.hooksPath` is the
    // hooks folder of every repository.
    let mut global = Vec::new();
    for file in global_config_files(resolver) {
        if judged.config_file(&file, &mut global, 0).is_err() {
            return true;
        }
    }
    if global
        .iter()
        .any(|(key, value)| judged.entry_runs(key, value))
    {
        return true;
    }
    for base in bases {
        let here = place.moves.iter().fold(base, |at, dir| join(&at, dir));
        let repository = match &place.git_dir {
            Some(dir) => Some(Ok(Repository::at(join(&here, dir), here.clone()))),
            None => discover(&here, programs),
        };
        let repository = match repository {
            Some(Ok(repository)) => repository,
            Some(Err(Unreadable)) => return true,
            None => continue,
        };
        if judged.repository(&repository, &global) {
            return true;
        }
    }
    false
}

/// A file of a repository could not be read.
struct Unreadable;

/// A repository git would use: its folder (`.git`), the main one's for a worktree, and the
/// top of its working tree (where a relative `core.hooksPath` starts).
struct Repository {
    git_dir: PathBuf,
    common_dir: PathBuf,
    top: PathBuf,
}

impl Repository {
    /// The repository whose folder is `git_dir`, worked on at `top`.
    fn at(git_dir: PathBuf, top: PathBuf) -> Repository {
        Repository {
            common_dir: git_dir.clone(),
            git_dir,
            top,
        }
    }
}

/// The text of one file of a repository: `None` when there is none.
fn read_one(programs: Programs<'_>, path: &Path) -> Result<Option<String>, Unreadable> {
    let Some(path) = path.to_str() else {
        return Err(Unreadable);
    };
    match read(
        Programs {
            folders: &[],
            ..programs
        },
        path,
    ) {
        Found::Missing => Ok(None),
        Found::Texts(texts) => Ok(texts.into_iter().next()),
        Found::Unreadable => Err(Unreadable),
    }
}

/// The repository git finds from `here`: the first folder, from `here` up, that holds a
/// `.git` folder with a `config`, or a `.git` file naming one (`gitdir: …`, and its
/// `commondir`).
fn discover(here: &Path, programs: Programs<'_>) -> Option<Result<Repository, Unreadable>> {
    for folder in here.ancestors() {
        let dot_git = folder.join(".git");
        match read_one(programs, &dot_git.join("config")) {
            Ok(Some(_)) => return Some(Ok(Repository::at(dot_git, folder.to_path_buf()))),
            Err(e) => return Some(Err(e)),
            Ok(None) => {}
        }
        // A `.git` that is a folder without a config is not read as text: read past it.
        let Ok(Some(file)) = read_one(programs, &dot_git) else {
            continue;
        };
        let Some(git_dir) = file.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
            continue;
        };
        let git_dir = join(folder, git_dir.trim());
        let common_dir = match read_one(programs, &git_dir.join("commondir")) {
            Ok(Some(common)) => join(&git_dir, common.trim()),
            Ok(None) => git_dir.clone(),
            Err(e) => return Some(Err(e)),
        };
        return Some(Ok(Repository {
            git_dir,
            common_dir,
            top: folder.to_path_buf(),
        }));
    }
    None
}

/// One git command, as its repository's files are judged for it.
struct Judged<'a, 'p> {
    wanted: &'a [&'a str],
    programs: Programs<'p>,
    /// The subcommand, in lower case: an alias of that name is what runs.
    subcommand: Option<&'a str>,
    /// The words after the subcommand.
    after: &'a [String],
}

impl Judged<'_, '_> {
    /// True when the repository's configuration or hooks run the prefix's words, with `global`
    /// the entries of git's system and global configuration, read before the repository's.
    fn repository(&self, repository: &Repository, global: &[(String, String)]) -> bool {
        let mut entries = global.to_vec();
        for file in [
            repository.common_dir.join("config"),
            repository.git_dir.join("config.worktree"),
        ] {
            if self.config_file(&file, &mut entries, 0).is_err() {
                return true;
            }
        }
        let hooks_path = entries
            .iter()
            .rev()
            .find(|(key, _)| key == "core.hookspath")
            .map(|(_, value)| value.clone());
        let hooks = match hooks_path.map(|path| self.in_home(&path)) {
            Some(Err(Unreadable)) => return true,
            Some(Ok(path)) => join(&repository.top, &path),
            None => repository.common_dir.join("hooks"),
        };
        entries
            .iter()
            .any(|(key, value)| self.entry_runs(key, value))
            || hooks_of(self.subcommand)
                .iter()
                .any(|hook| self.hook_runs(&hooks.join(hook)))
    }

    /// Adds the entries of the configuration file `file` (and of the files it includes, up to
    /// a depth git itself stops at) to `entries`.
    fn config_file(
        &self,
        file: &Path,
        entries: &mut Vec<(String, String)>,
        depth: usize,
    ) -> Result<(), Unreadable> {
        if depth > 10 {
            return Err(Unreadable);
        }
        let Some(text) = read_one(self.programs, file)? else {
            return Ok(());
        };
        for (key, value) in config_entries(&text) {
            if includes(&key) {
                let path = self.in_home(&value)?;
                let folder = file.parent().unwrap_or(Path::new("/"));
                self.config_file(&join(folder, &path), entries, depth + 1)?;
            }
            entries.push((key, value));
        }
        Ok(())
    }

    // outside-paths: off (git's global configuration is in the home folder: this names it)
    /// A path of a configuration value as git opens it: `~/…` in the tool's home folder (see
    /// [`ResolvePaths::home`]). Another user's (`~bob/…`), or any with no home known, cannot
    /// be read.
    fn in_home(&self, path: &str) -> Result<String, Unreadable> {
        if !path.starts_with('~') {
            return Ok(path.to_owned());
        }
        let home = self.programs.resolver.and_then(ResolvePaths::home);
        let rest = path.strip_prefix("~/").or((path == "~").then_some(""));
        match (home, rest) {
            (Some(home), Some(rest)) => home
                .join(rest)
                .to_str()
                .map(str::to_owned)
                .ok_or(Unreadable),
            _ => Err(Unreadable),
        }
    }

    /// True when the hook at `path` runs the prefix's words: a shell script (or one with no
    /// `#!`, which git runs with `sh`) by its commands; any other program matches.
    fn hook_runs(&self, path: &Path) -> bool {
        // outside-paths: on
        match read_one(self.programs, path) {
            Ok(None) => false,
            Ok(Some(text)) => {
                let shell = !text.starts_with("#!") || starts_with_shell_shebang(&text);
                !shell || text_runs(&text, self.wanted, self.programs)
            }
            Err(Unreadable) => true,
        }
    }

    /// True when one configuration entry runs the prefix's words, read as the value of a
    /// `-c KEY=VALUE` is: an alias (when it is the one run) as its shell command (`!…`) or its
    /// git command, the value of a key git runs ([`runs_value`]) as a shell command line with
    /// the command's words after it, and a remote's `ext::` URL as its command.
    fn entry_runs(&self, key: &str, value: &str) -> bool {
        // outside-paths: off (git's global configuration is in the home folder: this names it)
        // Files git reads, not programs: followed where they are read (`~/.gitconfig.local`
        // read as a command would name git's global configuration, and match).
        if includes(key) || key == "core.hookspath" {
            return false;
            // outside-paths: on
        }
        let quiet = Reading {
            git_config: false,
            ..self.programs.reading
        };
        let line = |command: &str| {
            let text = std::iter::once(command.to_owned())
                .chain(self.after.iter().cloned())
                .collect::<Vec<_>>()
                .join(" ");
            chain_runs(&text, &self.wanted.join(" "), self.programs.resolver, quiet)
        };
        if let Some(alias) = key.strip_prefix("alias.") {
            if self.subcommand != Some(alias) {
                return false;
            }
            if let Some(command) = value.strip_prefix('!') {
                return line(command);
            }
            // An alias of a git command may name another alias: read with the configuration
            // still on.
            let run: Vec<String> = std::iter::once("git".to_owned())
                .chain(shell_words(value))
                .chain(self.after.iter().cloned())
                .collect();
            let deeper = Programs {
                reading: Reading {
                    depth: self.programs.reading.depth + 1,
                    ..self.programs.reading
                },
                ..self.programs
            };
            return words_run(&run, self.wanted, deeper);
        }
        if let Some(command) = value
            .get(..5)
            .filter(|p| p.eq_ignore_ascii_case("ext::"))
            .and(value.get(5..))
        {
            return line(command);
        }
        if key.ends_with("editor") && plain_editor(value) {
            return false;
        }
        runs_value(key) && line(value.trim_start_matches('!'))
    }
}

/// True when an editor git is told to run (`core.editor = vim`) is one of [`EDITORS`] with no
/// words of its own but a few that give it no commands (`-f`, `-nw`, `--wait`): git gives it a
/// file to edit and nothing else, so it runs no command that its words do not name (nobody
/// types into it from a tool). Read as a command line, it would match every rule (see
/// [`super::command::runs_unread_commands`]), and every git command of a vim user with it.
fn plain_editor(value: &str) -> bool {
    const QUIET: &[&str] = &[
        "-f",
        "--nofork",
        "-nw",
        "--no-window-system",
        "-w",
        "--wait",
    ];
    let words = shell_words(value);
    words.split_first().is_some_and(|(first, rest)| {
        EDITORS.contains(&program_name(first).to_ascii_lowercase().as_str())
            && rest.iter().all(|w| QUIET.contains(&w.as_str()))
    })
}

/// True when the configuration key `key` (lower case) includes another file.
fn includes(key: &str) -> bool {
    key == "include.path" || (key.starts_with("includeif.") && key.ends_with(".path"))
}

/// git's configuration files outside any repository, as the tool's processes find them
/// (git-config(1)): the system's (`/etc/gitconfig`), and in the tool's home folder
/// `.config/git/config` (or `$XDG_CONFIG_HOME/git/config`) and `.gitconfig`. Both of the XDG
/// ones are read when both may be the one git reads: more reading only matches more.
fn global_config_files(resolver: &dyn ResolvePaths) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/etc/gitconfig")];
    files.extend(
        resolver
            .config_home()
            .map(|config| config.join("git/config")),
    );
    if let Some(home) = resolver.home() {
        files.push(home.join(".config/git/config"));
        files.push(home.join(".gitconfig"));
    }
    files
}

/// True when git runs the value of the configuration key `key` (lower case) as a command or a
/// program (git-config(1)): a pager, an editor, a helper, a driver, a filter, a tool's command
/// or path, a hook command, and the like, by the ending of the key's name, and every key of
/// `pager.*`. The other keys' values (a remote's refspec, a user's name) are data.
fn runs_value(key: &str) -> bool {
    const RUN: &[&str] = &[
        "command",
        "cmd",
        "pager",
        "editor",
        "program",
        "helper",
        "driver",
        "textconv",
        "clean",
        "smudge",
        "process",
        "external",
        "askpass",
        "proxy",
        "fsmonitor",
        "receivepack",
        "uploadpack",
        "browser",
        "filter",
        "update",
        "path",
        "hook",
        "smtpserver",
        "vcs",
    ];
    let name = key.rsplit('.').next().unwrap_or(key);
    key.starts_with("pager.") || RUN.iter().any(|ending| name.ends_with(ending))
}

/// The entries of a git configuration file, as `section.subsection.key` (section and key in
/// lower case, as git compares them) and value: quotes and escapes taken out, comments (`#`,
/// `;` outside quotes) dropped, a line ending in `\` joined to the next. A key without `=` is
/// `true`.
fn config_entries(text: &str) -> Vec<(String, String)> {
    let joined = text.replace("\\\r\n", "").replace("\\\n", "");
    let mut section = String::new();
    let mut entries = Vec::new();
    for line in joined.lines() {
        let mut line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            let Some((inside, rest)) = header.split_once(']') else {
                continue;
            };
            section = match inside.split_once(char::is_whitespace) {
                Some((name, sub)) => format!(
                    "{}.{}",
                    name.to_ascii_lowercase(),
                    sub.trim().trim_matches('"').replace("\\\"", "\"")
                ),
                None => inside.to_ascii_lowercase(),
            };
            line = rest.trim();
        }
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let (name, value) = line.split_once('=').unwrap_or((line, "true"));
        entries.push((
            format!("{section}.{}", name.trim().to_ascii_lowercase()),
            config_value(value),
        ));
    }
    entries
}

/// A configuration value as git reads it: quotes taken out, `\"`, `\\`, `\n`, `\t` undone, a
/// comment outside quotes dropped, blanks around it trimmed.
fn config_value(raw: &str) -> String {
    let mut value = String::new();
    let mut quoted = false;
    let mut chars = raw.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => match chars.next() {
                Some('n') => value.push('\n'),
                Some('t') => value.push('\t'),
                Some(other) => value.push(other),
                None => {}
            },
            '#' | ';' if !quoted => break,
            c => value.push(c),
        }
    }
    value.trim().to_owned()
}

// outside-paths: off (git's global configuration is in the home folder: this names it)
/// True when the command names a git folder's own files, which git reads its commands from
/// (`.git/config`, `.git/hooks/…`, a submodule's or a worktree's under `.git/modules` and
/// `.git/worktrees`, `.git/commondir`), or moves into a `.git` folder (`cd .git && echo … >>
/// config`), and the prefix's program is git: what such a command writes there, a later `git`
/// runs (in the same chain, or in a call of the same batch the gate judged before this one
/// ran), so it is judged as running anything a rule on git names. So is a command that names
/// git's global or system configuration ([`names_global_config`]: `printf … >> ~/.gitconfig`),
/// which every later `git` reads. Reading those files (`cat .git/config`, `cat ~/.gitconfig`)
/// is judged alike: which of a command's programs only reads a file and which writes it
/// (`sed -i`, `tee`, `cp`, a redirection) no reading of its words can tell for sure.
fn writes_git_own_files(command: &str, prefix: &str) -> bool {
    // outside-paths: on
    let Some(program) = prefix.split_whitespace().next() else {
        return false;
    };
    if !program_name(program).eq_ignore_ascii_case("git") {
        return false;
    }
    let words = shell_words(&command.replace(|c: char| ";&|()<>`\n\r".contains(c), " "));
    let own = ["config", "hooks", "modules", "worktrees", "commondir"];
    words.iter().enumerate().any(|(i, word)| {
        let lower = word.to_ascii_lowercase();
        let into_git = lower.split('/').collect::<Vec<_>>();
        let names_own = into_git
            .windows(2)
            .any(|pair| matches!(pair, [dot, part] if *dot == ".git" && own.iter().any(|o| part.starts_with(o))));
        let moves_in = into_git.last().is_some_and(|last| *last == ".git")
            && i.checked_sub(1)
                .and_then(|b| words.get(b))
                .is_some_and(|before| matches!(before.as_str(), "cd" | "pushd"));
        names_own || moves_in || names_global_config(&lower)
    })
}

// outside-paths: off (git's global configuration is in the home folder: this names it)
/// True when the word (in lower case) names git's global or system configuration, or the
/// folder of the XDG one, however the home folder is spelled (`~`, `$HOME`, `${HOME}`,
/// `/home/me`): a file named `.gitconfig…` (`~/.gitconfig`, the `~/.gitconfig.local` one may
/// include), `gitconfig` (`/etc/gitconfig`), or a `git` folder in `.config` or in
/// `$XDG_CONFIG_HOME` (`~/.config/git/config`).
fn names_global_config(word: &str) -> bool {
    // outside-paths: on
    let parts: Vec<&str> = word.split('/').collect();
    let named = parts
        .last()
        .is_some_and(|last| last.starts_with(".gitconfig") || *last == "gitconfig");
    named
        || parts.windows(2).any(|pair| {
            matches!(pair, [folder, git] if *git == "git"
                && (*folder == ".config" || folder.trim_end_matches('}').ends_with("xdg_config_home")))
        })
}

// outside-paths: off (the tests below name the files of a made-up root, `/project`)
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use std::sync::Arc;

    use super::super::tests::{decides, denying_rm, prefix, rule};
    use super::super::{Permission, PermissionStore, ResolvePaths};
    use super::*;

    #[test]
    fn a_script_line_starting_with_a_hash_is_dropped_only_where_the_shell_reads_a_comment() {
        let dropped = |text: &str| !without_comment_lines(text).contains("# x");
        for comment in [
            "# x\nrm",
            "echo 'a'\n  # x\nrm",
            "echo \"it's\" # it's\n# x\nrm",
            "x=$'\\''\n# x\nrm",
            // A backslash before a carriage return continues nothing; the line keeps it.
            "echo a \\\r\n# x\r\nrm",
        ] {
            assert!(dropped(comment), "{comment:?}");
        }
        assert!(without_comment_lines("echo a \\\r\n# x\r\nrm").contains("\\\r\nrm"));
        for code in [
            "echo hi \\\n# x\nrm",
            "x='\n# x'; rm",
            "x=\"\n# x\"; rm",
            "x=$'\\'\n# x'; rm",
            "x=\"$(echo \"\n# x\")\"; rm",
            "a=`'`\nb='\n# x'; rm",
            "cat <<EOF\n'\nEOF\nx='\n# x'; rm",
            "echo a\\\n#'\n# x'; rm",
            "\u{a0}# x;rm",
        ] {
            assert!(!dropped(code), "{code:?}");
        }
    }

    /// Files as a tool reads them under the root `/project` (stands in for the CLI's file system
    /// reads): each a path and its text; `None`, one that cannot be read.
    #[derive(Debug)]
    struct Files(Vec<(&'static str, Option<&'static str>)>);

    impl ResolvePaths for Files {
        fn root(&self) -> &Path {
            Path::new("/project")
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            Some(join(Path::new("/project"), path))
        }
        fn read_text(&self, path: &str) -> FileText {
            let wanted = join(Path::new("/project"), path);
            match self.0.iter().find(|(p, _)| Path::new(p) == wanted) {
                Some((_, Some(text))) => FileText::Text((*text).to_owned()),
                Some((_, None)) => FileText::Unreadable,
                None => FileText::Missing,
            }
        }
    }

    /// [`denying_rm`], plus an ask on `git push`, reading `files`.
    fn store_reading(files: Files) -> PermissionStore {
        let mut store = denying_rm();
        store
            .configure(rule("shell", prefix("git push"), Permission::Ask))
            .resolve_paths("shell", Arc::new(files));
        store
    }

    /// What a Python venv's `activate` is made of: tests, defaults, functions, exports.
    const ACTIVATE: &str = r#"# This file must be used with "source bin/activate" *from bash*
deactivate () {
    if [ -n "${_OLD_VIRTUAL_PATH:-}" ] ; then
        PATH="${_OLD_VIRTUAL_PATH:-}"
        export PATH
        unset _OLD_VIRTUAL_PATH
    fi
    hash -r 2> /dev/null
    if [ ! "${1:-}" = "nondestructive" ] ; then
        unset -f deactivate
    fi
}
deactivate nondestructive
VIRTUAL_ENV="/project/venv"
export VIRTUAL_ENV
_OLD_VIRTUAL_PATH="$PATH"
PATH="$VIRTUAL_ENV/bin:$PATH"
export PATH
"#;

    #[test]
    fn a_deny_prefix_reads_the_script_a_shell_is_given() {
        let store = store_reading(Files(vec![
            (
                "/project/clean.sh",
                Some("#!/bin/sh\n# tidy up\nrm -rf build\n"),
            ),
            ("/project/ok.sh", Some("#!/bin/sh\necho hi\n")),
            ("/project/env.sh", Some("export X=1\nrm -f x\n")),
            ("/project/nested.sh", Some("sh ./clean.sh\n")),
            ("/project/self.sh", Some(". ./self.sh\n")),
            ("/project/venv/bin/activate", Some(ACTIVATE)),
            ("/project/blob.sh", None),
            ("/project/tool.py", Some("#!/usr/bin/env python3\nrm = 1\n")),
            ("/project/sub/in.sh", Some("rm x\n")),
        ]));
        decides(
            &store,
            &[
                "sh clean.sh",
                "bash -x clean.sh",
                "bash -o pipefail ./clean.sh arg",
                "sudo bash clean.sh",
                "env -i sh clean.sh",
                ". ./clean.sh",
                "source clean.sh",
                "./clean.sh",
                "sh nested.sh",
                "cd sub && sh in.sh",
                "BASH_ENV=env.sh bash -c ls",
                "ENV=env.sh sh -c ls",
                "export BASH_ENV=env.sh; bash -c ls",
                "bash --rcfile env.sh",
                "bash --init-file=env.sh",
                // Start-up files in the home folder, which the command does not name.
                "bash -i",
                "bash -lc 'make test'",
                "sh --login",
                // A file that cannot be read, one that reads itself, one the chain may make.
                "sh blob.sh",
                "sh self.sh",
                "cp clean.sh new.sh && sh new.sh",
                "PROMPT_COMMAND='rm -f x' bash -i",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "sh ok.sh",
                "./ok.sh",
                ". venv/bin/activate && pytest",
                "source venv/bin/activate",
                "sh missing.sh",
                "cp ok.sh new.sh && sh new.sh",
                "echo 'touch made' > h; . ./h",
                "bash -c 'echo hi'",
                "./tool.py",
                "python3 tool.py",
            ],
            Permission::Allow,
        );
        // With no way to read the script, it is judged as one that may run anything.
        // (Until this reading, `. venv/bin/activate && pytest` was let through unread here.)
        decides(
            &denying_rm(),
            &["sh ok.sh", ". ./ok.sh", ". venv/bin/activate && pytest"],
            Permission::Deny,
        );
    }

    /// A repository at `/project` with aliases, a submodule and a remote; one in `sub` whose pager
    /// is `rm`; one named by `--git-dir`; one with a hook, one with `core.hooksPath`, one that
    /// includes a file, and a worktree of `main`.
    fn repositories() -> Files {
        Files(vec![
            (
                "/project/.git/config",
                Some(
                    "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\
                     [remote \"origin\"]\n\turl = https://example.com/x.git\n\
                     \tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                     [submodule \"v\"]\n\tpath = vendor/v\n\
                     [alias]\n\tp = push\n\tst = status\n\tpp = p\n\
                     \tnuke = \"!f() { rm -rf \\\"$1\\\"; }; f\"\n",
                ),
            ),
            (
                "/project/sub/.git/config",
                Some("[core]\n\tpager = rm -f\n"),
            ),
            (
                "/project/other.git/config",
                Some("[core]\nsshCommand = rm x\n"),
            ),
            ("/project/h/.git/config", Some("[core]\n")),
            (
                "/project/h/.git/hooks/pre-commit",
                Some("#!/bin/sh\nrm -rf x\n"),
            ),
            ("/project/py/.git/config", Some("[core]\n")),
            (
                "/project/py/.git/hooks/pre-commit",
                Some("#!/usr/bin/env python3\nprint(1)\n"),
            ),
            (
                "/project/hp/.git/config",
                Some("[core]\n\thooksPath = .husky\n"),
            ),
            ("/project/hp/.husky/pre-push", Some("rm -f x\n")),
            (
                "/project/inc/.git/config",
                Some("[include]\n\tpath = extra\n"),
            ),
            ("/project/inc/.git/extra", Some("[alias]\n\tx = !rm y\n")),
            (
                "/project/wt/.git",
                Some("gitdir: ../main/.git/worktrees/wt\n"),
            ),
            ("/project/main/.git/worktrees/wt/commondir", Some("../..\n")),
            (
                "/project/main/.git/config",
                Some("[alias]\n\tgo = !rm -rf .\n"),
            ),
            ("/project/bad/.git/config", None),
        ])
    }

    #[test]
    fn a_deny_or_ask_prefix_reads_the_repository_s_git_configuration_and_hooks() {
        let store = store_reading(repositories());
        decides(
            &store,
            &[
                "git nuke x",
                "git -C sub log",
                "cd sub && git log",
                "git --git-dir=other.git fetch",
                "git --git-dir other.git fetch",
                "git -C h commit -m x",
                "git -C py commit",
                "git -C hp push",
                "git -C inc x",
                "git -C wt go",
                "git -C bad status",
                "GIT_DIR=elsewhere git status",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &["git p origin main", "git pp", "git push"],
            Permission::Ask,
        );
        decides(
            &store,
            &[
                "git st",
                "git status",
                "git log --oneline",
                "git -C sub/deeper/../.. status",
                "git fetch origin",
                // A command that runs no hook the repository has.
                "git -C h log",
                "git -C h status",
            ],
            Permission::Allow,
        );
    }

    /// [`Files`] read by a tool whose processes' home folder is `/home/me` and whose
    /// `XDG_CONFIG_HOME` is `/xdg`.
    #[derive(Debug)]
    struct AtHome(Files);

    impl ResolvePaths for AtHome {
        fn root(&self) -> &Path {
            self.0.root()
        }
        fn resolve(&self, path: &str) -> Option<PathBuf> {
            self.0.resolve(path)
        }
        fn read_text(&self, path: &str) -> FileText {
            self.0.read_text(path)
        }
        fn home(&self) -> Option<&Path> {
            Some(Path::new("/home/me"))
        }
        fn config_home(&self) -> Option<&Path> {
            Some(Path::new("/xdg"))
        }
    }

    /// A global configuration with aliases (one in a file it includes from `~`), an XDG one, a
    /// system one, and a repository at the root; with `hooks`, a hooks folder in the home.
    fn global_configuration(hooks: bool) -> Files {
        let hooks_path = if hooks {
            "[core]\n\thooksPath = ~/hooks\n"
        } else {
            ""
        };
        Files(vec![
            (
                "/home/me/.gitconfig",
                Some(
                    "[alias]\n\tst = !rm f\n\tlg = log --oneline\n\tpu = push\n\
                     [include]\n\tpath = ~/.gitconfig.local\n",
                ),
            ),
            (
                "/home/me/.gitconfig.local",
                Some("[alias]\n\tgone = !rm -rf .\n"),
            ),
            ("/home/me/.config/git/config", Some(hooks_path)),
            ("/home/me/hooks/pre-commit", Some("rm -f x\n")),
            ("/xdg/git/config", Some("[alias]\n\txd = !rm f\n")),
            ("/etc/gitconfig", Some("[alias]\n\tsys = !rm f\n")),
            ("/project/.git/config", Some("[core]\n")),
        ])
    }

    /// A global configuration as developers keep one: an editor, a pager, helpers, LFS's
    /// filter, tools, an include from the home folder that is not there, aliases.
    const USUAL_GLOBAL: &str = "[user]\n\tname = Me\n\temail = me@example.com\n\
        [core]\n\teditor = vim\n\tpager = less -R\n\texcludesfile = ~/.gitignore_global\n\
        [credential]\n\thelper = store\n\
        [credential \"https://github.com\"]\n\thelper = !gh auth git-credential\n\
        [filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n\tsmudge = git-lfs smudge -- %f\n\
        \tprocess = git-lfs filter-process\n\trequired = true\n\
        [diff]\n\ttool = vimdiff\n[merge]\n\ttool = vimdiff\n[init]\n\tdefaultBranch = main\n\
        [pull]\n\trebase = true\n[gpg]\n\tprogram = gpg\n[commit]\n\tgpgsign = true\n\
        [include]\n\tpath = ~/.gitconfig.local\n\
        [alias]\n\tco = checkout\n\tlg = log --graph --oneline\n";

    #[test]
    fn a_deny_or_ask_prefix_reads_git_s_global_configuration() {
        let mut store = denying_rm();
        store
            .configure(rule("shell", prefix("git push"), Permission::Ask))
            .resolve_paths("shell", Arc::new(AtHome(global_configuration(false))));
        decides(
            &store,
            &[
                "git st",
                "git st --short",
                "git gone",
                "git xd",
                "git sys",
                // Out of any repository, a global alias still runs.
                "git -C /elsewhere st",
            ],
            Permission::Deny,
        );
        decides(&store, &["git pu", "git push"], Permission::Ask);
        decides(
            &store,
            &["git lg", "git log", "git status", "git -C /elsewhere lg"],
            Permission::Allow,
        );
        // A developer's usual global configuration runs nothing a rule names.
        let usual = Files(vec![
            ("/home/me/.gitconfig", Some(USUAL_GLOBAL)),
            ("/project/.git/config", Some("[core]\n")),
        ]);
        let mut usual_store = denying_rm();
        usual_store
            .configure(rule("shell", prefix("git push"), Permission::Ask))
            .resolve_paths("shell", Arc::new(AtHome(usual)));
        decides(
            &usual_store,
            &[
                "git status",
                "git commit -m x",
                "git log --oneline",
                "git fetch origin",
                "git co main",
                "git diff HEAD~1",
            ],
            Permission::Allow,
        );
        decides(&usual_store, &["git push"], Permission::Ask);
        // An editor given commands of its own is read as any command line is.
        let mut commanding = denying_rm();
        commanding.resolve_paths(
            "shell",
            Arc::new(AtHome(Files(vec![(
                "/home/me/.gitconfig",
                Some("[core]\n\teditor = vim -c '!rm f'\n"),
            )]))),
        );
        decides(&commanding, &["git commit"], Permission::Deny);
        // A global hooks folder is every repository's.
        let mut hooked = denying_rm();
        hooked.resolve_paths("shell", Arc::new(AtHome(global_configuration(true))));
        decides(&hooked, &["git commit -m x"], Permission::Deny);
        decides(
            &hooked,
            &["git log", "git -C /elsewhere commit"],
            Permission::Allow,
        );
        // A tool that says no home folder reads only the system's.
        let no_home = store_reading(global_configuration(false));
        decides(&no_home, &["git sys"], Permission::Deny);
        decides(&no_home, &["git st", "git gone"], Permission::Allow);
    }

    #[test]
    fn a_command_naming_a_git_folder_s_own_files_matches_a_rule_on_git() {
        let store = store_reading(Files(Vec::new()));
        decides(
            &store,
            &[
                "printf '[alias]\\n\\tp = push\\n' >> .git/config && git p",
                "echo '[alias] p = push' | tee -a .git/config",
                "cp pre-push .git/hooks/pre-push",
                "cd .git && echo x >> config",
                "git config alias.p push && git p",
                "mv x sub/.git/modules/v/config",
            ],
            Permission::Ask,
        );
        // Under a rule on another program, a git folder's files are only files.
        decides(&denying_rm(), &["echo x >> .git/config"], Permission::Allow);
        decides(&store, &["cat .gitignore", "ls .github"], Permission::Allow);
    }

    #[test]
    fn a_deny_prefix_sees_the_command_a_container_pod_or_host_launcher_runs() {
        let store = denying_rm();
        decides(
            &store,
            &[
                "docker exec -it ctr rm -rf /",
                "docker exec --user root -w /app ctr rm x",
                "docker run --rm -v /x:/x -e A=1 alpine rm -rf /x",
                "docker run --entrypoint rm alpine -rf /x",
                "docker run --entrypoint=rm alpine x",
                "docker container exec ctr rm x",
                "docker compose exec web rm x",
                "docker --context remote exec ctr rm x",
                "docker exec ctr git -c alias.x='!rm x' x",
                "docker exec ctr sh -c 'rm x'",
                "podman run --rm img rm x",
                "nerdctl exec ctr rm x",
                "kubectl exec -it pod -c app -- rm -rf /data",
                "kubectl -n ns exec pod -- rm x",
                "kubectl run tmp --image=busybox -- rm x",
                "lxc exec box -- rm x",
                "nsenter -t 1 -m -u -i -n -p rm x",
                "nsenter --target 1 --mount rm x",
                "chroot /srv rm x",
                "chroot --userspec=u:g /srv rm x",
                "unshare -r rm x",
                "unshare --map-root-user --mount rm x",
                "systemd-run --user --scope rm x",
                "systemd-run -p MemoryMax=1G --unit tidy rm x",
                "flatpak-spawn --host rm x",
                "ssh host rm x",
                "ssh -p 2222 -i key user@host rm x",
                "ssh host 'rm -rf /tmp/x'",
                "sudo -u root rm x",
                "doas -u root rm x",
                "su -c 'rm x' root",
                "su root -c 'rm x'",
                "setsid -f rm x",
                "nohup rm x",
                "timeout -k 5 10 rm x",
                "timeout --signal=KILL 10 rm x",
                "nice -n 10 rm x",
                "ionice -c 2 -n 7 rm x",
                "stdbuf -oL rm x",
                "stdbuf -o L rm x",
                "ls | xargs -n 1 rm",
                "xargs -a list rm",
                "find . -name '*.o' -exec rm {} +",
                "find . -execdir rm {} ;",
                "find . -ok rm {} ;",
                "watch -n 1 rm x",
                "watch rm x",
            ],
            Permission::Deny,
        );
        decides(
            &store,
            &[
                "docker rm ctr",
                "docker ps -a",
                "docker run --rm alpine ls",
                "kubectl get pods",
                "kubectl exec pod -- ls",
                "podman image rm img",
            ],
            Permission::Allow,
        );
    }

    #[test]
    fn commands_nested_in_commands_are_judged_in_bounded_time_and_fail_closed() {
        // Each `-exec` (each `-c`) is read with all that follows it: 24 deep took a minute,
        // 40 deep hours, holding the gate.
        let store = denying_rm();
        for unit in ["find . -exec ", "git -c alias.x=!", "docker run img "] {
            let command = format!("{}ls", unit.repeat(24));
            let started = std::time::Instant::now();
            let decided = store.decide("shell", &serde_json::json!({ "command": command }));
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "{unit:?}: {:?}",
                started.elapsed()
            );
            if unit.starts_with("docker") {
                assert_eq!(decided, Permission::Allow, "read through, nothing denied");
            } else {
                assert_eq!(
                    decided,
                    Permission::Deny,
                    "{unit:?}: too deep to read whole"
                );
            }
        }
    }
}
