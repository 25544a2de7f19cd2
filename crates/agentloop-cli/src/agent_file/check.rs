//! The generic checker behind the agent file: it walks a parsed TOML document with its spans,
//! key by key, against the types of the file's shape (the [`Check`] trait, and [`Section`] for
//! tables), so that an unknown key, a wrong type or a missing key anywhere is one [`Problem`] each
//! instead of the first error only.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

/// One problem in an agent file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The key path (`model.provider`, `tools[1].command`); empty for the whole file.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Every problem found in an agent file.
#[derive(Debug, Clone, Default)]
pub struct Problems {
    file: String,
    text: String,
    list: Vec<Problem>,
}

impl Problems {
    pub(super) fn new(file: &Path, text: &str) -> Self {
        Problems {
            file: crate::terminal::shown_path(file),
            text: text.to_owned(),
            list: Vec::new(),
        }
    }

    /// Records a problem at a byte span of the file.
    pub(super) fn at(
        &mut self,
        path: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) {
        let (line, column) = span.map_or((1, 1), |s| line_col(&self.text, s.start));
        self.list.push(Problem {
            path: path.to_owned(),
            line,
            column,
            message: message.into(),
        });
    }

    /// The problems, in file order.
    pub fn list(&self) -> &[Problem] {
        &self.list
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(super) fn sorted(mut self) -> Self {
        self.list.sort_by_key(|p| (p.line, p.column));
        self.list.dedup();
        self
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.list.len();
        writeln!(
            f,
            "{}: {n} problem{} in the agent file:",
            self.file,
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.list {
            let path = if p.path.is_empty() {
                String::new()
            } else {
                format!("{}: ", p.path)
            };
            writeln!(
                f,
                "  {}:{}:{}: {path}{}",
                self.file, p.line, p.column, p.message
            )?;
        }
        Ok(())
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let upto = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = upto.matches('\n').count() + 1;
    let column = upto.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks a parsed TOML value against a type, recording every problem.
pub(super) trait Check {
    /// True when the key may be left out.
    const OPTIONAL: bool = false;
    /// Records every problem of `value` at `path`.
    fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems);
}

/// A leaf: checked by deserializing it.
pub(super) fn check_leaf<T: DeserializeOwned>(
    value: &Spanned<DeValue<'_>>,
    path: &str,
    problems: &mut Problems,
) {
    let span = value.span();
    if let Err(e) = T::deserialize(ValueDeserializer::from(value.clone())) {
        problems.at(path, e.span().or(Some(span)), e.message().trim().to_owned());
    }
}

/// Declares types checked whole, by deserializing them.
macro_rules! leaf {
    ($($t:ty),*) => {$(
        impl $crate::agent_file::check::Check for $t {
            fn check(
                value: &::toml::Spanned<::toml::de::DeValue<'_>>,
                path: &str,
                problems: &mut $crate::agent_file::check::Problems,
            ) {
                $crate::agent_file::check::check_leaf::<$t>(value, path, problems)
            }
        }
    )*};
}
pub(super) use leaf;

leaf!(
    String,
    bool,
    u32,
    u64,
    usize,
    i64,
    f64,
    Value,
    Vec<String>,
    Vec<Spanned<String>>
);

impl<T: Check> Check for Option<T> {
    const OPTIONAL: bool = true;
    fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
        T::check(value, path, problems)
    }
}

impl<T: Check> Check for Spanned<T> {
    const OPTIONAL: bool = T::OPTIONAL;
    fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
        T::check(value, path, problems)
    }
}

/// An array of tables (`[[tools]]`): each element checked at `path[i]`.
impl<T: Check + Section> Check for Vec<T> {
    fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
        let Some(items) = value.get_ref().as_array() else {
            problems.at(
                path,
                Some(value.span()),
                format!(
                    "expected an array of tables, found {}",
                    value.get_ref().type_str()
                ),
            );
            return;
        };
        for (i, item) in items.iter().enumerate() {
            T::check(item, &format!("{path}[{i}]"), problems);
        }
    }
}

/// A table type whose keys are checked one by one.
pub(super) trait Section {
    /// Its keys, in declaration order.
    const KEYS: &'static [&'static str];
    /// Checks one known key.
    fn check_key(key: &str, value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems);
    /// Whether a key may be left out.
    fn optional(key: &str) -> bool;
}

pub(super) fn check_table<T: Section>(
    value: &Spanned<DeValue<'_>>,
    path: &str,
    problems: &mut Problems,
) {
    let Some(table) = value.get_ref().as_table() else {
        problems.at(
            path,
            Some(value.span()),
            format!("expected a table, found {}", value.get_ref().type_str()),
        );
        return;
    };
    check_keys::<T>(table, value.span(), path, problems);
}

pub(super) fn check_keys<T: Section>(
    table: &DeTable<'_>,
    span: Range<usize>,
    path: &str,
    problems: &mut Problems,
) {
    for (key, v) in table {
        let name = key.get_ref().as_ref();
        let key_path = join(path, name);
        if T::KEYS.contains(&name) {
            T::check_key(name, v, &key_path, problems);
        } else {
            problems.at(
                &key_path,
                Some(key.span()),
                format!("unknown key `{name}` (known here: {})", T::KEYS.join(", ")),
            );
        }
    }
    let has = |key: &str| table.keys().any(|k| k.get_ref().as_ref() == key);
    // A tool is a command, an agent, a built-in tool or a remote agent: each key is optional, one
    // of the four is required; only a built-in tool has a name of its own.
    if T::KEYS.contains(&"command") && T::KEYS.contains(&"builtin") {
        if !has("command") && !has("agent") && !has("builtin") && !has("a2a") {
            problems.at(
                &join(path, "command"),
                Some(span.clone()),
                format!(
                    "missing required key `command` in [{path}] (or `agent`: another agent \
                     file, run as a subagent; or `builtin`: a built-in tool such as read_file; \
                     or `a2a`: a remote agent's URL)"
                ),
            );
        }
        if !has("name") && !has("builtin") {
            problems.at(
                &join(path, "name"),
                Some(span.clone()),
                format!("missing required key `name` in [{path}]"),
            );
        }
    }
    for key in T::KEYS {
        if !T::optional(key) && !has(key) {
            let at = if path.is_empty() {
                "the file".to_owned()
            } else {
                format!("[{path}]")
            };
            problems.at(
                &join(path, key),
                Some(span.clone()),
                format!("missing required key `{key}` in {at}"),
            );
        }
    }
}

/// Declares a table of the agent file: the serde struct and its key-by-key check.
macro_rules! section {
    ($(#[$meta:meta])* $name:ident { $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, ::serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name { $( $(#[$fmeta])* pub $field: $ty, )* }

        impl $crate::agent_file::check::Section for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn check_key(
                key: &str,
                value: &::toml::Spanned<::toml::de::DeValue<'_>>,
                path: &str,
                problems: &mut $crate::agent_file::check::Problems,
            ) {
                use $crate::agent_file::check::Check;
                match key {
                    $( stringify!($field) => <$ty as Check>::check(value, path, problems), )*
                    _ => {}
                }
            }
            fn optional(key: &str) -> bool {
                use $crate::agent_file::check::Check;
                match key {
                    $( stringify!($field) => <$ty as Check>::OPTIONAL, )*
                    _ => true,
                }
            }
        }

        impl $crate::agent_file::check::Check for $name {
            fn check(
                value: &::toml::Spanned<::toml::de::DeValue<'_>>,
                path: &str,
                problems: &mut $crate::agent_file::check::Problems,
            ) {
                $crate::agent_file::check::check_table::<$name>(value, path, problems)
            }
        }
    };
}
pub(super) use section;

#[cfg(test)]
mod tests {
    use super::super::tests::{TWO_TOOLS, located, problems};

    #[test]
    fn every_problem_is_reported_with_its_key_path_and_line() {
        let text = r#"name = "x"
colour = "blue"

[model]
provider = "openai"
name = 5
stream = "yes"

[limits]
max_turns = -1
max_turnz = 3

[[tools]]
name = "ok_tool"
command = ["echo"]

[[tools]]
name = "bad name"
command = []
mode = "sideways"
"#;
        let got = located(text);
        let want: Vec<(String, usize)> = [
            ("colour", 2),
            ("model.name", 6),
            ("model.stream", 7),
            ("limits.max_turns", 10),
            ("limits.max_turnz", 11),
            ("tools[1].mode", 20),
        ]
        .into_iter()
        .map(|(p, l)| (p.to_owned(), l))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn missing_required_keys_are_named() {
        let got = problems("[[tools]]\ndescription = \"d\"\n");
        let mut paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            ["model", "name", "tools[0].command", "tools[0].name"]
        );
        // A tool is a command or an agent: one of the two keys, once the shape is right.
        let got = problems(
            "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n[[tools]]\nname = \"t\"\n",
        );
        assert!(
            got.iter()
                .any(|p| p.path == "tools[0].command" && p.message.contains("`agent`")),
            "{got:?}"
        );
    }

    #[test]
    fn permission_shapes_are_checked_key_by_key() {
        let text = format!(
            "{TWO_TOOLS}\n[permissions]\ndefault = \"maybe\"\nask = \"shell\"\nsave = true\n[[permissions.rules]]\npermission = \"allow\"\ncommand_prefix = {{ field = \"command\" }}\n"
        );
        let got = located(&text);
        assert_eq!(
            got,
            [
                ("permissions.default".to_owned(), 13),
                ("permissions.ask".to_owned(), 14),
                ("permissions.save".to_owned(), 15),
                ("permissions.rules[0].tool".to_owned(), 16),
                ("permissions.rules[0].command_prefix.prefix".to_owned(), 18),
            ]
        );
    }
}
