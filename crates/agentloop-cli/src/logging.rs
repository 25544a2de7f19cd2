//! The process's `tracing` subscriber. The libraries log what a person at the terminal should
//! hear of (a model call retried, an MCP server that exited or whose tools collide, a run's
//! news not sent); without a subscriber it reaches nobody. Each event becomes
//! one line on stderr, `agentloop: warning: …`, never on stdout, which holds the answer and
//! `--json`'s one document.
//!
//! `AGENTLOOP_LOG` (an `EnvFilter` directive string) sets what is shown; by default agentloop's
//! own crates' warnings and errors, and nothing of its dependencies'. Every line is redacted as
//! the trace's payloads are, and shows its invisible characters as escapes: a field may quote a
//! server's stderr or an error a server sent.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::{Arc, Mutex, Weak};

use agentloop_cli::render::Progress;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// The variable that sets what the log shows: an `EnvFilter` directive string.
pub(crate) const LOG_ENV: &str = "AGENTLOOP_LOG";

/// What the log shows when `AGENTLOOP_LOG` is unset, empty or invalid: warnings and errors of
/// agentloop's crates (a target prefix: `agentloop_providers`, `agentloop_mcp`, … match it).
/// Dependencies' own lines (rmcp, hyper, reqwest, h2, restate-sdk) are off: they are written
/// for those crates' developers, and what matters of them reaches the user as agentloop's own
/// errors.
const DEFAULT_FILTER: &str = "agentloop=warn";

/// The progress the log's lines are written clear of (`Progress::interrupt`): the current
/// command's, when it shows one.
static PROGRESS: Mutex<Weak<Progress>> = Mutex::new(Weak::new());

/// A run's progress on stderr, which the log's lines interrupt cleanly.
pub(crate) fn progress() -> Arc<Progress> {
    let progress = Arc::new(Progress::new());
    if let Ok(mut slot) = PROGRESS.lock() {
        *slot = Arc::downgrade(&progress);
    }
    progress
}

/// Installs the subscriber for the process, with the filter `AGENTLOOP_LOG` gives. A filter
/// that cannot be read is said on stderr, and the default is used: a typo in a variable never
/// stops a run.
pub(crate) fn install() {
    let colour = colour();
    let (filter, problem) = filter_from(std::env::var_os(LOG_ENV));
    let subscriber =
        tracing_subscriber::registry().with(StderrLines { colour }.with_filter(filter));
    // Set already (never, in this binary): the first one stays.
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        return;
    }
    if let Some(problem) = problem {
        write_line(&format!(
            "{}{}",
            label(Level::WARN, colour),
            shown(&problem)
        ));
    }
}

/// The filter `AGENTLOOP_LOG` gives, and what is wrong with its value when it has to be set
/// aside (or read in a way its writer may not mean).
fn filter_from(value: Option<std::ffi::OsString>) -> (EnvFilter, Option<String>) {
    let default = || parse(DEFAULT_FILTER).unwrap_or_else(|_| EnvFilter::default());
    let Some(value) = value else {
        return (default(), None);
    };
    let Some(text) = value.to_str() else {
        return (
            default(),
            Some(format!("{LOG_ENV} is not UTF-8; it is ignored")),
        );
    };
    if text.trim().is_empty() {
        return (default(), None);
    }
    match parse(text) {
        Ok(filter) => (filter, bare_target(text)),
        Err(e) => (
            default(),
            Some(format!(
                "{LOG_ENV}={text:?} is not a valid filter ({e}); it is ignored, and warnings are \
                 shown (a filter is a level, `off`, `error`, `warn`, `info`, `debug` or `trace`, \
                 or TARGET=LEVEL, comma-separated)"
            )),
        ),
    }
}

/// An `EnvFilter` of the directives, field values matched literally (no regular expressions).
fn parse(directives: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    EnvFilter::builder().with_regex(false).parse(directives)
}

/// A bare word that is no level is a target (`AGENTLOOP_LOG=wran` shows only a crate or module
/// so named, most likely nothing): valid, so it is used, but said.
fn bare_target(text: &str) -> Option<String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let word = text.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains(['=', '['])
            && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d))
            && d.parse::<u8>().is_err()
    })?;
    Some(format!(
        "{LOG_ENV}: {word:?} is read as a target, not a level: only a crate or module so named, at every level, \
         is shown (the levels are off, error, warn, info, debug and trace)"
    ))
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything but the empty
/// string (no-color.org), as other command-line tools decide.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `agentloop: warning: `, the level's word in its colour when colour is on.
fn label(level: Level, colour: bool) -> String {
    let (word, paint) = match level {
        Level::ERROR => ("error", "\u{1b}[1;31m"),
        Level::WARN => ("warning", "\u{1b}[1;33m"),
        Level::INFO => ("info", "\u{1b}[1;32m"),
        Level::DEBUG => ("debug", "\u{1b}[1;34m"),
        Level::TRACE => ("trace", "\u{1b}[1;35m"),
    };
    if colour {
        format!("agentloop: {paint}{word}:\u{1b}[0m ")
    } else {
        format!("agentloop: {word}: ")
    }
}

/// Text from an event as its line shows it: credentials redacted, on one line, every invisible
/// character (a line break, a terminal's escape sequence) written as `\u{…}`.
fn shown(text: &str) -> String {
    let redacted = agentloop_observe::redact_text(text.trim_end());
    agentloop::printable::escape_invisible(&redacted)
}

/// Writes each event it is given as one line on stderr.
struct StderrLines {
    colour: bool,
}

impl<S: Subscriber> Layer<S> for StderrLines {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        write_line(&render(event, self.colour));
    }
}

/// The line of an event: `agentloop: LEVEL: MESSAGE (FIELD=VALUE, …)`. The target is named
/// when the line is not one of agentloop's warnings or errors (a dependency's, or a debug
/// line), so the reader knows where it comes from.
fn render(event: &Event<'_>, colour: bool) -> String {
    let meta = event.metadata();
    let mut fields = Fields::default();
    event.record(&mut fields);
    let mut line = label(*meta.level(), colour);
    let ours = meta.target().starts_with("agentloop");
    if !ours || *meta.level() > Level::WARN {
        let _ = write!(line, "{}: ", shown(meta.target()));
    }
    line.push_str(&shown(&fields.message));
    if !fields.rest.is_empty() {
        line.push_str(" (");
        for (i, (name, value)) in fields.rest.iter().enumerate() {
            if i > 0 {
                line.push_str(", ");
            }
            let _ = write!(line, "{name}={}", shown(value));
        }
        line.push(')');
    }
    line
}

/// Writes a line on stderr, clear of the progress shown there; a closed stderr loses it.
fn write_line(line: &str) {
    let write = || {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(format!("{line}\n").as_bytes());
        let _ = err.flush();
    };
    match PROGRESS.lock().ok().and_then(|p| p.upgrade()) {
        Some(progress) => progress.interrupt(write),
        None => write(),
    }
}

/// An event's message and its other fields, in the order given.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Fields {
    fn push(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else if agentloop_observe::redact::is_secret_key(field.name()) {
            // A field named for a credential never shows its value, whatever it looks like.
            self.rest
                .push((field.name(), agentloop_observe::redact::REDACTED.to_owned()));
        } else {
            self.rest.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.push(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_filter_is_set_aside_for_the_default_and_said() {
        let (filter, problem) = filter_from(Some("agentloop=loud".into()));
        assert_eq!(filter.to_string(), DEFAULT_FILTER);
        let problem = problem.unwrap_or_default();
        assert!(problem.starts_with("AGENTLOOP_LOG=\"agentloop=loud\" is not a valid filter"));
        assert!(filter_from(Some("".into())).1.is_none());
        assert_eq!(filter_from(None).0.to_string(), DEFAULT_FILTER);
    }

    #[test]
    fn a_bare_word_that_is_no_level_is_used_as_a_target_and_said() {
        let (filter, problem) = filter_from(Some("wran".into()));
        assert_eq!(filter.to_string(), "wran=trace");
        assert!(
            problem
                .unwrap_or_default()
                .contains("\"wran\" is read as a target")
        );
        for fine in [
            "debug",
            "agentloop_providers=debug,warn",
            "OFF",
            "agentloop[run]=info",
        ] {
            assert!(filter_from(Some(fine.into())).1.is_none(), "{fine}");
        }
    }

    #[test]
    fn a_line_is_redacted_and_kept_to_one_line() {
        assert_eq!(
            shown("exited:\nAuthorization: Bearer abc\n\u{1b}[2Jbye\n"),
            "exited:\\u{a}Authorization: [redacted]\\u{a}\\u{1b}[2Jbye"
        );
        assert_eq!(label(Level::WARN, false), "agentloop: warning: ");
    }
}
