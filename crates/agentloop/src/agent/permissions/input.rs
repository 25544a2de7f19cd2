//! What a program takes as commands from its input, as deny and ask command prefixes read it:
//! a shell given no script (`… | sh`, `sh < x.sh`, `bash <(…)`), `.` or `source` of a process
//! substitution or of `/dev/stdin`, and `xargs` whose program comes from its input (`xargs
//! -I@ @`, `xargs sh -c`). Text written out as it is (`echo 'rm x' | sh`, a here-document) is
//! read with the chain's words, a file (`sh < x.sh`, `cat x.sh | sh`) as a script; text a
//! program builds (`printf 'r\x6d'`, `rev`, `base64 -d`, `echo $X`) no prefix can read, and it
//! matches every deny or ask prefix.

use super::command::{
    CONTAINER_LAUNCHERS, MAX_STEPS, Programs, Segment, is_launcher, is_shell, launches_nothing,
    led_by_redirection, program_name, program_positions, segments, shell_option_letters,
};

/// True when a program of `command` takes commands from its input and that input runs the
/// prefix's words, or is text no prefix can read.
pub(super) fn fed_commands_run(command: &str, wanted: &[&str], programs: Programs<'_>) -> bool {
    let steps = programs.reading.steps.get().saturating_add(1);
    programs.reading.steps.set(steps);
    if steps > MAX_STEPS {
        return true;
    }
    let segments = segments(command);
    // `sh -c "printf 'r\155 x' | sh"`: a quoted word a launcher runs as a command line.
    let quoted_line =
        |w: &String| w.contains(['|', '<', '>']) && fed_commands_run(w, wanted, programs);
    if segments.iter().any(|s| s.words.iter().any(quoted_line)) {
        return true;
    }
    let built = built_files(&segments, wanted, programs);
    if runs_a_file_of(&segments, &built) {
        return true;
    }
    // `exec < <(printf …); sh`: the shell's own input, which every later command reads.
    let input_replaced = segments.windows(2).any(|pair| {
        matches!(pair, [exec, next] if exec.words.iter().map(String::as_str).eq(["exec"])
            && next.before.starts_with('<'))
    });
    segments.iter().enumerate().any(|(i, segment)| {
        let next = segments.get(i + 1);
        let redirected = next.map(|n| n.before.as_str()).unwrap_or_default();
        // `| >/dev/null sh`: a redirection before the program, whose file is no word of it.
        let led = led_by_redirection(segment);
        let own = segment.words.get(usize::from(led)..).unwrap_or_default();
        // `sh 0< x.sh`: the descriptor a redirection names is no word of the command.
        let words = match own.split_last() {
            Some((last, words))
                if redirected.starts_with(['<', '>'])
                    && last.chars().all(|c| c.is_ascii_digit()) =>
            {
                words
            }
            _ => own,
        };
        if !takes_commands_from_input(words) {
            return false;
        }
        // A here-document's or here-string's text: its lines are parts of the chain, read so.
        let fed = if redirected.ends_with("<(") {
            // `sh < <(printf …)` too, whose operators run together as `<<(`.
            next.is_some_and(|n| builds_or_reads_commands(n, wanted, programs))
        } else if redirected.starts_with("<<") {
            false
        } else if redirected.starts_with('<') && redirected.contains('&') {
            // `sh <&3`: another descriptor, opened on what no word here says.
            true
        } else if redirected.starts_with('<') {
            next.and_then(|n| n.words.first()).is_some_and(|file| {
                built.contains(&program_name(file)) || file_runs(file, wanted, programs)
            })
        } else {
            false
        };
        // The operators before a redirection that leads the command (`|>`) say how it began.
        let began = if led {
            segment.before.trim_end_matches(['<', '>', '&'])
        } else {
            segment.before.as_str()
        };
        let piped = began.ends_with('|') && !began.ends_with("||");
        let previous = i.checked_sub(1).and_then(|k| segments.get(k));
        // `… | tee >(sh)`: fed what a program writes into the substitution.
        fed || input_replaced
            || segment.before.ends_with(">(")
            || (piped && previous.is_some_and(|p| builds_or_reads_commands(p, wanted, programs)))
    })
}

/// The file names (`t.sh` of `./t.sh`) of the files the chain writes with text a program
/// builds (`printf 'r\x6d x' > t.sh`, `… | tee t.sh`): missing when the rules read them, and
/// no prefix reads what the builder writes.
fn built_files<'s>(
    segments: &'s [Segment],
    wanted: &[&str],
    programs: Programs<'_>,
) -> Vec<&'s str> {
    let mut written: Vec<&str> = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let next = segments.get(i + 1);
        let redirected = next.map(|n| n.before.as_str()).unwrap_or_default();
        if redirected.starts_with('>') && builds_or_reads_commands(segment, wanted, programs) {
            written.extend(next.and_then(|n| n.words.first()).map(|w| program_name(w)));
        }
        let piped = segment.before.ends_with('|') && !segment.before.ends_with("||");
        let previous = i.checked_sub(1).and_then(|k| segments.get(k));
        if let Some(("tee", files)) = segment
            .words
            .split_first()
            .map(|(first, rest)| (program_name(first), rest))
            && piped
            && previous.is_some_and(|p| builds_or_reads_commands(p, wanted, programs))
        {
            written.extend(
                files
                    .iter()
                    .filter(|f| !f.starts_with('-'))
                    .map(|f| program_name(f)),
            );
        }
    }
    written
}

/// True when the chain names one of the files `built` where it runs commands from it: as a
/// program (`./t.sh`), or among the words of a launcher (`sh t.sh`, `. t.sh`, `xargs -a t`).
fn runs_a_file_of(segments: &[Segment], built: &[&str]) -> bool {
    if built.is_empty() {
        return false;
    }
    let names_built = |w: &String| built.contains(&program_name(w));
    segments.iter().any(|segment| {
        let launches = program_positions(&segment.words)
            .into_iter()
            .filter_map(|at| segment.words.get(at))
            .any(|w| is_launcher(program_name(w)));
        // A redirection's file (`> t.sh`) is no program.
        let redirected = segment.before.contains(['<', '>']);
        (!redirected && segment.words.first().is_some_and(names_built))
            || (launches && segment.words.iter().skip(1).any(names_built))
    })
}

/// True when the file a shell reads its commands from (`sh < FILE`) runs the prefix's words:
/// a device or a process's file (`/dev/tcp/…`, `/dev/stdin`) is nothing a prefix can read.
fn file_runs(file: &str, wanted: &[&str], programs: Programs<'_>) -> bool {
    file.starts_with("/dev/")
        || file.starts_with("/proc/")
        || programs
            .reading
            .files
            .script_runs(file, wanted, programs, false)
}

/// True when the command of `segment`, feeding another its commands, writes text no prefix
/// reads (anything but `echo` or `printf` of plain words, or a here-document's or here-string's
/// text, which the chain's words hold), or `cat`s a file that runs the prefix's words.
fn builds_or_reads_commands(segment: &Segment, wanted: &[&str], programs: Programs<'_>) -> bool {
    if segment.before.starts_with("<<") && !segment.before.ends_with('(') {
        return false;
    }
    let Some((first, args)) = segment.words.split_first() else {
        return true;
    };
    // What the shell would expand or the program would turn into other text: `$X`, a glob
    // (`/bin/r?`), braces, `~`, an escape (`r\x6d`), printf's `%s`.
    let expands = segment
        .raw
        .contains(['$', '`', '\\', '*', '?', '[', '{', '~']);
    match program_name(first) {
        "echo" => expands || args.iter().any(|a| a.starts_with('-') && a.contains('e')),
        "printf" => expands || segment.raw.contains('%'),
        "cat" => {
            let files: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
            files.is_empty() || files.iter().any(|f| file_runs(f, wanted, programs))
        }
        _ => true,
    }
}

/// True when the command `words` runs a program that takes its commands from its input: a
/// shell given no script and no command (`sh`, `bash -s`, `sh -c` whose command `xargs`
/// appends; in a container too: `docker exec -i c sh`), `.` or `source` of nothing named
/// (`. <(…)`) or of a device (`/dev/stdin`), `xargs` whose program is its replace-string
/// (`xargs -I@ @ x`), a launcher given no program (`ssh host`, `su`, `unshare -r`, `script`:
/// each runs a shell), a scheduler (`at now`, `batch`, `crontab -`) or GNU `parallel` given
/// no command.
fn takes_commands_from_input(words: &[String]) -> bool {
    if xargs_program_from_input(words) || launches_nothing(words) {
        return true;
    }
    let first = words.first().map(|w| program_name(w)).unwrap_or_default();
    let contained = CONTAINER_LAUNCHERS
        .iter()
        .any(|(name, _, _)| *name == first);
    let positions: Vec<usize> = if contained {
        (1..words.len()).collect()
    } else {
        program_positions(words)
    };
    positions.into_iter().any(|at| {
        let (Some(program), Some(args)) = (words.get(at), words.get(at + 1..)) else {
            return false;
        };
        let operands = || args.iter().filter(|a| !a.starts_with('-')).count();
        match program_name(program) {
            "." | "source" => args
                .first()
                .is_none_or(|f| f.starts_with("/dev/") || f.starts_with("/proc/")),
            "at" | "batch" => !args.iter().any(|a| a.starts_with("-f")),
            "crontab" => operands() == 0 || args.iter().any(|a| a == "-"),
            "parallel" | "sem" => operands() == 0,
            name => is_shell(name) && shell_reads_input(args),
        }
    })
}

/// True when a shell given `args` reads its commands from its input: no script named, `-s`,
/// `-c` with no command after it (`xargs sh -c` hands it one from its input), or a script
/// that is its input (`sh -`, `bash /dev/stdin`).
fn shell_reads_input(args: &[String]) -> bool {
    let mut k = 0;
    while let Some(word) = args.get(k) {
        if word == "-" || word.starts_with("/dev/") || word.starts_with("/proc/") {
            return true;
        }
        if word == "--" {
            return args.get(k + 1).is_none();
        }
        if word.starts_with("--") {
            k += 1;
            continue;
        }
        let Some(cluster) = shell_option_letters(word) else {
            return false;
        };
        if cluster.contains('s') {
            return true;
        }
        if cluster.contains('c') {
            return args.get(k + 1).is_none();
        }
        k += if cluster.contains(['o', 'O']) { 2 } else { 1 };
    }
    true
}

/// xargs's options that take the next word as their value.
const XARGS_VALUED: &[&str] = &["-n", "-L", "-l", "-P", "-s", "-d", "-a", "-E", "-e"];

/// True when `words` run `xargs` with a replace-string (`-I R`, `-IR`, `-i`, `--replace`) that
/// its program's word holds: the program comes from its input.
fn xargs_program_from_input(words: &[String]) -> bool {
    let Some(at) = words
        .iter()
        .position(|w| program_name(w).eq_ignore_ascii_case("xargs"))
    else {
        return false;
    };
    let mut replace: Option<String> = None;
    let mut k = at + 1;
    while let Some(word) = words.get(k) {
        if word == "-I" {
            replace = words.get(k + 1).cloned();
            k += 2;
        } else if let Some(r) = word.strip_prefix("-I").or_else(|| word.strip_prefix("-i")) {
            replace = Some(if r.is_empty() {
                "{}".to_owned()
            } else {
                r.to_owned()
            });
            k += 1;
        } else if let Some(r) = word.strip_prefix("--replace") {
            let r = r.strip_prefix('=').unwrap_or("{}");
            replace = Some(r.to_owned());
            k += 1;
        } else if XARGS_VALUED.contains(&word.as_str()) {
            k += 2;
        } else if word.starts_with('-') {
            k += 1;
        } else {
            return replace.is_some_and(|r| !r.is_empty() && word.contains(r.as_str()));
        }
    }
    false
}
