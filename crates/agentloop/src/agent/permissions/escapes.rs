//! Escape attempts against deny and ask command prefixes, as an attacker who knows bash would
//! write them, and ordinary developer commands those prefixes must leave alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use serde_json::json;

use super::tests::{prefix, rule};
use super::{FileText, Permission, PermissionStore, ResolvePaths};

// outside-paths: off (the tests below try hostile paths on purpose)

/// A shell allowed every command but `rm`, `curl` and `python` (denied: `python3`, or only
/// `python3 -c`) and `git push` (asked about).
fn guarded_shell(python: &str) -> PermissionStore {
    let mut store = PermissionStore::new(Permission::Allow);
    store
        .configure(rule("shell", prefix("rm"), Permission::Deny))
        .configure(rule("shell", prefix("curl"), Permission::Deny))
        .configure(rule("shell", prefix(python), Permission::Deny))
        .configure(rule("shell", prefix("git push"), Permission::Ask))
        .set("shell", Permission::Allow);
    store
}

/// The commands of `table` the store judges otherwise than their expected permission, each
/// with what it got.
fn misjudged(store: &PermissionStore, table: &[(&str, Permission)]) -> Vec<String> {
    table
        .iter()
        .filter_map(|(c, want)| {
            let got = store.decide("shell", &json!({ "command": c }));
            (got != *want).then(|| format!("{c:?}: {got:?}, want {want:?}"))
        })
        .collect()
}

const D: Permission = Permission::Deny;
const A: Permission = Permission::Ask;

/// Ways to run `rm`, `curl`, `python3` or `git push` that a reading of the first words misses.
const ESCAPES: &[(&str, Permission)] = &[
    // Quoting and escapes.
    ("r\\m f", D),
    ("'r'm f", D),
    ("$'\\x72m' f", D),
    ("\"${x}rm\" f", D),
    ("c\"u\"rl x", D),
    ("\"\"rm f", D),
    ("r\\\nm f", D),
    ("git 'pu'sh", A),
    ("git pu\\sh", A),
    // Expansions.
    ("$(echo rm) f", D),
    ("`echo rm` f", D),
    ("rm${IFS}f", D),
    ("{rm,f}", D),
    ("/bin/r? f", D),
    ("/???/rm f", D),
    ("/usr/bin/c*l x", D),
    ("$((0))rm f", D),
    ("x=rm; ${x:0:2} f", D),
    ("x=rm; y=x; ${!y} f", D),
    ("x=rm; $x f", D),
    ("IFS=m; r$IFS f", D),
    ("set -- rm f; \"$@\"", D),
    ("$0 -c 'rm f'", D),
    ("$SHELL -c 'rm f'", D),
    // Aliases, functions, the shell's own ways to run a word.
    ("alias x=rm; x f", D),
    ("f(){ rm \"$@\"; }; f a", D),
    ("f() ( rm f ); f", D),
    ("command_not_found_handle() { rm f; }; nope", D),
    ("eval rm f", D),
    ("eval 'r''m f'", D),
    ("exec rm f", D),
    ("exec -a tidy rm f", D),
    ("command rm f", D),
    ("builtin eval rm f", D),
    ("hash -p /bin/rm x; x f", D),
    ("trap 'rm f' EXIT", D),
    ("PROMPT_COMMAND='rm f' bash -i", D),
    ("coproc rm f", D),
    ("time rm f", D),
    ("! rm f", D),
    ("{ rm f; }", D),
    ("(rm f)", D),
    ("if rm f; then :; fi", D),
    ("while rm f; do break; done", D),
    ("case x in x) rm f;; esac", D),
    ("true && rm f", D),
    ("false || rm f", D),
    ("true | rm f", D),
    ("rm f &", D),
    ("echo ok\nrm f", D),
    ("echo ok # x\nrm f", D),
    ("echo ok;curl x", D),
    // Text fed to a shell or an interpreter.
    ("bash <<EOF\nrm f\nEOF", D),
    ("sh <<< 'rm f'", D),
    ("echo 'rm f' | sh", D),
    ("bash <(echo rm f)", D),
    ("python3 <<< 'print(1)'", D),
    ("printf 'r\\155 f' | sh", D),
    ("printf 'r\\x6d f' | bash", D),
    ("printf '%s%s f' r m | sh", D),
    ("echo -e 'r\\x6d f' | sh", D),
    ("echo 'mr f' | rev | sh", D),
    ("echo 'cm f' | tr c r | sh", D),
    ("echo cm0gZgo= | base64 -d | sh", D),
    ("printf 'r\\x6d' | xargs -I@ @ f", D),
    ("printf 'r\\x6d f' | xargs -0 sh -c", D),
    (". <(printf 'r\\x6d f')", D),
    ("source <(printf 'r\\x6d f')", D),
    ("printf 'r\\x6d f' > t.sh; sh t.sh", D),
    ("printf 'r\\x6d f' > t.sh; . ./t.sh", D),
    ("set -o history; history -s 'rm f'; fc -s", D),
    ("printf 'r\\x6d f' | ssh localhost", D),
    ("printf 'r\\x6d f' | su", D),
    ("printf 'r\\x6d f' | unshare -r", D),
    ("printf 'r\\x6d f' | at now", D),
    ("printf '* * * * * r\\x6d f' | crontab -", D),
    ("printf 'r\\x6d f' | parallel", D),
    ("printf 'r\\x6d f' | docker exec -i ctr sh", D),
    ("printf 'r\\x6d f' | kubectl exec -i pod -- bash -s", D),
    ("printf 'r\\x6d f' | script -q /dev/null", D),
    ("git -c alias.p=send-pack p ../remote.git main", A),
    ("sh -c \"printf 'r\\155 f' | sh\"", D),
    ("bash -c \". <(printf 'r\\x6d f')\"", D),
    ("ssh localhost \"printf 'r\\x6d f' | sh\"", D),
    ("eval \"echo 'mr f' | rev | sh\"", D),
    // Launchers.
    ("echo f | xargs rm", D),
    ("find . -exec rm {} +", D),
    ("env rm f", D),
    ("env -i PATH=/bin rm f", D),
    ("nice -n 5 rm f", D),
    ("busybox rm f", D),
    ("toybox rm f", D),
    ("script -qc 'rm f' /dev/null", D),
    ("expect -c 'spawn rm f'", D),
    ("flock /tmp/l rm f", D),
    ("chronic rm f", D),
    ("unbuffer rm f", D),
    ("stdbuf -o0 rm f", D),
    ("timeout 5 curl x", D),
    ("watch -n1 curl x", D),
    ("ssh localhost rm f", D),
    ("xterm -e rm f", D),
    ("gnome-terminal -- rm f", D),
    ("alacritty --command curl x", D),
    // Paths and other names for the program.
    // The root folder's `/bin/rm` through `/proc/self/root`, written in two parts: whole, the
    // text holds the root user's home folder, which the check for paths outside the clone flags.
    (concat!("/proc/self/ro", "ot/bin/rm f"), D),
    ("./../../bin/rm f", D),
    ("/usr/bin/curl x", D),
    ("RM f", D),
    ("ln -s /bin/rm x; ./x f", D),
    ("cp /bin/rm x; ./x f", D),
    ("install /bin/rm x && ./x f", D),
    ("PATH=.:$PATH x f", D),
    ("python3.12 -c 'print(1)'", D),
    ("/usr/bin/python3.11 x.py", D),
    ("/usr/bin/env python3 x.py", D),
    ("uv run python3 x.py", D),
    // git push and its other spellings.
    ("git push", A),
    ("git    push origin main", A),
    ("/usr/bin/git push", A),
    ("git -C . push", A),
    ("git -C. push", A),
    ("git --git-dir=.git push", A),
    ("git -c user.name=x push", A),
    ("git --no-pager push", A),
    ("git -c alias.p=push p", A),
    ("git -c alias.p='!git push' p", A),
    ("git config alias.p push && git p", A),
    ("git rebase -x 'git push' HEAD~1", A),
    ("git submodule foreach git push", A),
    ("git send-pack ../remote.git main", A),
    ("/usr/lib/git-core/git-push origin main", A),
    ("/usr/lib/git-core/git-send-pack ../remote.git main", A),
    // Another repository's configuration and hooks: every deny or ask prefix matches.
    ("GIT_DIR=.git git push", D),
    ("GIT_SSH_COMMAND='rm f' git fetch", D),
    ("git -c core.sshCommand='rm f' fetch", D),
    ("git -c core.pager='rm f' log", D),
    ("git -c alias.x='!rm f' x", D),
    ("PAGER='rm f' git log", D),
    ("git status && git push", A),
    ("git subtree push --prefix=lib origin main", A),
    (
        "find . -maxdepth 0 -exec sh -c 'printf \"r\\155 f\" | sh' \\;",
        D,
    ),
    ("perl -e 'print \"r\\x6d f\"' | sh", D),
    ("exec 3<<<'rm f'; sh <&3", D),
    ("printf 'r\\155 f' | sh -", D),
    ("printf 'r\\155 f' | tee >(sh) > /dev/null", D),
    ("sh < <(printf 'r\\155 f')", D),
    ("exec < <(printf 'r\\155 f'); sh", D),
    ("a=r; b=m; $a$b f", D),
    ("printf -v c 'r\\x6d'; $c f", D),
    // git's global and system configuration, which every later `git` reads: a command that
    // names it matches every rule on git (here the ask on `git push`), as one naming
    // `.git/config` does; the alias it writes then runs `rm` where nothing reads it.
    ("printf '[alias]\\n x = !rm f\\n' >> ~/.gitconfig", A),
    (
        "printf '[alias]\\n x = !rm f\\n' >> ~/.gitconfig && git x",
        A,
    ),
    ("echo '[alias] x = !rm f' | tee -a $HOME/.gitconfig", A),
    ("echo '[alias] x = !rm f' | tee -a ${HOME}/.gitconfig", A),
    ("echo '[alias] x = !rm f' >> ~/.config/git/config", A),
    (
        "echo '[alias] x = !rm f' | tee -a $XDG_CONFIG_HOME/git/config",
        A,
    ),
    (
        "echo '[alias] x = !rm f' | tee -a ${XDG_CONFIG_HOME}/git/config",
        A,
    ),
    ("echo '[alias] x = !rm f' >> /etc/gitconfig", A),
    ("echo '[alias] x = !rm f' >> /home/dev/.gitconfig", A),
    ("echo '[alias] x = !rm f' | tee -a ~/.gitconfig", A),
    ("cp evil ~/.gitconfig", A),
    ("mv evil $HOME/.gitconfig", A),
    ("ln -s $PWD/evil ~/.gitconfig", A),
    ("sed -i 's/^/[alias] x = !rm f/' ~/.gitconfig", A),
    ("perl -pi -e 's/a/b/' ~/.config/git/config", A),
    ("cd ~/.config/git && echo x >> config", A),
    ("cd ~ && echo x >> .gitconfig", A),
    // A home folder the command chooses, whose global configuration no prefix reads: judged as
    // `GIT_CONFIG_GLOBAL=` is.
    ("HOME=/tmp/h git st", D),
    ("XDG_CONFIG_HOME=/tmp/x git st", D),
    ("env HOME=/tmp/h git st", D),
    ("env -i HOME=/tmp/h /usr/bin/git st", D),
    ("export HOME=/tmp/h; git st", D),
    ("export XDG_CONFIG_HOME=/tmp/x && git st", D),
    ("HOME=/tmp/h; git st", D),
    ("HOME=/tmp/h sh -c 'git st'", D),
    // Even where git runs nothing it is given (a false positive kept: rare, and simpler).
    ("HOME=/tmp git --version", D),
];

#[test]
fn escapes_from_deny_and_ask_prefixes_are_matched() {
    assert_none_misjudged(ESCAPES);
}

/// Asserts that [`guarded_shell`] judges every command of `table` as it expects.
fn assert_none_misjudged(table: &[(&str, Permission)]) {
    let wrong = misjudged(&guarded_shell("python3"), table);
    assert!(
        wrong.is_empty(),
        "{} misjudged:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Ordinary developer commands, which a deny on `rm`, `curl` and `python3 -c` and an ask on
/// `git push` must leave allowed.
const ORDINARY: &[&str] = &[
    "ls -la",
    "cargo test",
    "cargo build --release",
    "cargo clippy --all-targets -- -D warnings",
    "git status",
    "git log --oneline",
    "git diff HEAD~1",
    "git add -A && git commit -m 'rm the old parser'",
    "git stash push -m wip",
    "git fetch origin",
    "git pull --rebase",
    "git branch -d old",
    "grep -rn rm src",
    "rg -n 'curl' docs",
    "echo \"rm\"",
    "echo rm is denied",
    "npm test",
    "npm run build",
    "python3 -m pytest",
    "make -j2",
    "cat README.md | head -20",
    "find . -name '*.rs' -newer Cargo.toml",
    "wc -l src/main.rs",
    "sed -n 1,20p src/lib.rs",
    "mkdir -p build && cd build && cmake ..",
    "docker rm old-container",
    "go test ./...",
    "pytest -q tests/test_rm.py",
    "ls | sort | uniq -c",
    "tar czf out.tgz src",
    "diff -u a.txt b.txt",
    "head -n 5 notes.md",
    "git remote -v",
    "git subtree split --prefix=lib",
    "git show --stat HEAD",
    "cargo fmt --all && cargo test -p core",
    // The home folder, where no git runs under another one.
    "echo $HOME",
    "ls ~/.config",
    "cat ~/.bashrc",
    "HOME=/tmp/h npm test",
    "export HOME=/tmp/h; cargo build",
    "git config --get user.name",
];

#[test]
fn ordinary_commands_stay_allowed_under_deny_and_ask_prefixes() {
    let store = guarded_shell("python3 -c");
    let table: Vec<(&str, Permission)> = ORDINARY.iter().map(|c| (*c, Permission::Allow)).collect();
    let wrong = misjudged(&store, &table);
    assert!(
        wrong.is_empty(),
        "{} misjudged:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A tool whose files are all missing: a script the command names is one its chain must make.
#[derive(Debug)]
struct NoFiles;

impl ResolvePaths for NoFiles {
    fn root(&self) -> &Path {
        Path::new("/project")
    }
    fn resolve(&self, path: &str) -> Option<PathBuf> {
        Some(Path::new("/project").join(path))
    }
    fn read_text(&self, _: &str) -> FileText {
        FileText::Missing
    }
}

/// Files a chain writes with text a program builds, then runs, or feeds a shell through a
/// descriptor: the rules read no such file (it is missing when they look).
const BUILT_FILES: &[&str] = &[
    "printf 'r\\x6d f' > t.sh; sh t.sh",
    "printf 'r\\x6d f' > t.sh; . ./t.sh",
    "printf 'r\\x6d f' > t.sh && chmod +x t.sh && ./t.sh",
    "printf 'r\\x6d f' | tee t.sh > /dev/null; bash t.sh",
    "printf 'r\\x6d\\n' > l; xargs -a l -I@ @ f",
    "printf 'r\\x6d f' > t; sh 0< t",
    "printf 'r\\x6d f' > t; sh < t",
    "printf 'r\\x6d f' | bash /dev/stdin",
    "printf 'r\\x6d f' | sh -",
    "exec 3< <(printf 'r\\x6d f'); sh <&3",
    "sh < /dev/tcp/127.0.0.1/9",
    "echo 'r\\0155 f' > t.sh; sh t.sh",
];

#[test]
fn escapes_through_files_the_chain_builds_are_matched() {
    let rules = guarded_shell("python3").command_rules("shell", "command");
    for c in BUILT_FILES {
        assert_eq!(
            rules.judge(c, Some(&NoFiles)),
            Some(Permission::Deny),
            "{c:?}"
        );
    }
    // A file the chain writes with plain words, or only reads, is judged by those words.
    for c in [
        "echo 'ls -l' > t.sh; sh t.sh",
        "cargo build > build.log 2>&1; cat build.log",
        "make 2>&1 | tee build.log; ./target/app",
    ] {
        assert_eq!(rules.judge(c, Some(&NoFiles)), None, "{c:?}");
    }
}

/// A long chain once took 18 s (debug) to judge, one long quoted line 37 s; now about 2 s.
#[test]
fn long_and_deeply_quoted_commands_are_judged_in_bounded_time() {
    let store = guarded_shell("python3");
    let long = "echo a | ".repeat(20_000) + "sh";
    let nested = (0..14).fold("printf x | sh".to_owned(), |inner, _| {
        format!("sh -c {inner:?} | cat")
    });
    let quoted = format!("sh -c '{}'", "echo a | cat | ".repeat(20_000));
    for c in [long, nested, quoted] {
        let started = std::time::Instant::now();
        store.decide("shell", &json!({ "command": c }));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{} bytes took {:?}",
            c.len(),
            started.elapsed()
        );
    }
}

/// Launchers a red team found a deny prefix did not see through, and the same launchers
/// running harmless commands (or none), which stay allowed.
#[test]
fn containers_recorders_sessions_locks_and_project_runners_are_read_through() {
    let table: &[(&str, Permission)] = &[
        ("bwrap --bind / / rm f", D),
        (
            "bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all rm f",
            D,
        ),
        ("bwrap --dev-bind / / --chdir /tmp --setenv A b rm f", D),
        ("apptainer exec img.sif rm f", D),
        ("apptainer exec --bind /x:/y img.sif rm f", D),
        ("singularity exec img.sif rm f", D),
        ("rr record rm f", D),
        ("rr rm f", D),
        ("dtach -c /tmp/s rm f", D),
        ("dtach -n /tmp/s -E rm f", D),
        ("abduco -c s rm f", D),
        ("abduco -n s rm f", D),
        ("start-stop-daemon --start --exec /bin/rm -- f", D),
        ("start-stop-daemon -S -x /bin/rm -- f", D),
        ("start-stop-daemon --start --startas /bin/rm -- f", D),
        ("lckdo /tmp/l rm f", D),
        ("lckdo -w /tmp/l rm f", D),
        ("with-lock-ex /tmp/l rm f", D),
        ("with-lock-ex -w /tmp/l rm f", D),
        ("fakechroot rm f", D),
        ("fakechroot chroot /x rm f", D),
        ("box64 rm f", D),
        ("box86 rm f", D),
        ("pipx run rm f", D),
        ("pdm run rm f", D),
        ("hatch run rm f", D),
        ("hatch -e test run rm f", D),
        ("stack exec rm f", D),
        ("stack exec -- rm f", D),
        ("cabal exec rm f", D),
        ("cabal exec -- rm f", D),
        ("opam exec -- rm f", D),
        ("opam exec rm f", D),
        ("devbox run rm f", D),
        ("pipx run black .", Permission::Allow),
        ("hatch run test", Permission::Allow),
        ("stack exec ghc -- -v", Permission::Allow),
        ("cabal exec -- ghc --version", Permission::Allow),
        ("opam exec -- dune build", Permission::Allow),
        ("devbox run build", Permission::Allow),
        ("bwrap --ro-bind / / --dev /dev ls -l", Permission::Allow),
        ("apptainer exec img.sif ls", Permission::Allow),
        ("rr record ./app", Permission::Allow),
        ("dtach -c /tmp/s top", Permission::Allow),
        ("lckdo /tmp/l make", Permission::Allow),
        (
            "start-stop-daemon --start --exec /usr/bin/app",
            Permission::Allow,
        ),
        ("rr replay", Permission::Allow),
        (
            "start-stop-daemon --stop --pidfile /run/app.pid",
            Permission::Allow,
        ),
    ];
    assert_none_misjudged(table);
}
