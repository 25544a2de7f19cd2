//! The agent file: a TOML description of an agent (instructions, model, limits, command tools),
//! and its validation. A file is checked whole before anything runs: every problem is collected
//! with its key path (`tools[1].command`) and line, then all are reported at once.
//!
//! The shape is the serde structs below (`deny_unknown_fields` everywhere). Checking walks the
//! parsed document with spans, key by key, against those same structs (the [`Check`] trait), so an
//! unknown key, a wrong type or a missing key anywhere is one problem each instead of the first
//! error only. Rules that no type can say (a tool name, a schema, a script file, what belongs to
//! which provider) are checked afterwards on the typed file, still with spans; when some sections
//! have shape problems, the rules still run on every section whose shape is right.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use agentloop::{permissions::Permission, tool::ExecutionMode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
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
    fn new(file: &Path, text: &str) -> Self {
        Problems {
            file: file.display().to_string(),
            text: text.to_owned(),
            list: Vec::new(),
        }
    }

    /// Records a problem at a byte span of the file.
    fn at(&mut self, path: &str, span: Option<Range<usize>>, message: impl Into<String>) {
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

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn sorted(mut self) -> Self {
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

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks a parsed TOML value against a type, recording every problem.
trait Check {
    /// True when the key may be left out.
    const OPTIONAL: bool = false;
    /// Records every problem of `value` at `path`.
    fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems);
}

/// A leaf: checked by deserializing it.
fn check_leaf<T: DeserializeOwned>(
    value: &Spanned<DeValue<'_>>,
    path: &str,
    problems: &mut Problems,
) {
    let span = value.span();
    if let Err(e) = T::deserialize(ValueDeserializer::from(value.clone())) {
        problems.at(path, e.span().or(Some(span)), e.message().trim().to_owned());
    }
}

macro_rules! leaf {
    ($($t:ty),*) => {$(
        impl Check for $t {
            fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
                check_leaf::<$t>(value, path, problems)
            }
        }
    )*};
}
leaf!(
    String,
    bool,
    u32,
    u64,
    usize,
    i64,
    f64,
    Value,
    ExecutionMode,
    Provider,
    Permission,
    Bound<u32>,
    Bound<u64>,
    agentloop::OnLimit,
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
trait Section {
    /// Its keys, in declaration order.
    const KEYS: &'static [&'static str];
    /// Checks one known key.
    fn check_key(key: &str, value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems);
    /// Whether a key may be left out.
    fn optional(key: &str) -> bool;
}

fn check_table<T: Section>(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
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

fn check_keys<T: Section>(
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
    for key in T::KEYS {
        if !T::optional(key) && !table.keys().any(|k| k.get_ref().as_ref() == *key) {
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
        #[derive(Debug, Clone, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name { $( $(#[$fmeta])* pub $field: $ty, )* }

        impl Section for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn check_key(key: &str, value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
                match key {
                    $( stringify!($field) => <$ty as Check>::check(value, path, problems), )*
                    _ => {}
                }
            }
            fn optional(key: &str) -> bool {
                match key {
                    $( stringify!($field) => <$ty as Check>::OPTIONAL, )*
                    _ => true,
                }
            }
        }

        impl Check for $name {
            fn check(value: &Spanned<DeValue<'_>>, path: &str, problems: &mut Problems) {
                check_table::<$name>(value, path, problems)
            }
        }
    };
}

/// Which provider serves the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Provider {
    /// OpenAI Chat Completions, and any server that speaks it.
    #[serde(rename = "openai")]
    OpenAi,
    /// The OpenAI Responses API.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic Messages.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// Responses from a script file, in order: no network, no credentials.
    #[serde(rename = "scripted")]
    Scripted,
}

impl Provider {
    /// The word used in agent files.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::OpenAiResponses => "openai-responses",
            Provider::Anthropic => "anthropic",
            Provider::Scripted => "scripted",
        }
    }

    /// The environment variable that holds the key when the file names none.
    pub fn default_key_env(self) -> Option<&'static str> {
        match self {
            Provider::OpenAi | Provider::OpenAiResponses => {
                Some(agentloop_providers::OPENAI_API_KEY_ENV)
            }
            Provider::Anthropic => Some(agentloop_providers::ANTHROPIC_API_KEY_ENV),
            Provider::Scripted => None,
        }
    }
}

section! {
    /// The whole agent file.
    AgentFileSpec {
        /// The agent's name.
        name: Spanned<String>,
        /// A one-line description, for `plan`.
        description: Option<String>,
        /// The system instructions.
        instructions: Option<Spanned<String>>,
        /// A file holding the instructions (relative to the agent file).
        instructions_file: Option<Spanned<String>>,
        /// The JSON Schema the final answer must match.
        output_schema: Option<Spanned<Value>>,
        /// The model.
        model: Spanned<ModelSpec>,
        /// The limits.
        limits: Option<LimitsSpec>,
        /// Command tools.
        tools: Option<Vec<ToolFileSpec>>,
        /// Which tool calls run, which need approval, which never run.
        permissions: Option<PermissionsSpec>,
    }
}

section! {
    /// `[model]`.
    ModelSpec {
        /// `openai`, `openai-responses`, `anthropic` or `scripted`.
        provider: Spanned<Provider>,
        /// The model's name (required except for `scripted`).
        name: Option<Spanned<String>>,
        /// The provider's base URL (its default otherwise).
        base_url: Option<Spanned<String>>,
        /// The environment variable holding the API key (the provider's usual one otherwise).
        api_key_env: Option<Spanned<String>>,
        /// Stream responses (default true).
        stream: Option<bool>,
        /// `scripted` only: the JSON file of responses, in order.
        script: Option<Spanned<String>>,
        /// Sampling temperature.
        temperature: Option<Spanned<f64>>,
        /// Sampling seed, for providers that support it.
        seed: Option<i64>,
        /// The most tokens one response may hold.
        max_tokens: Option<Spanned<u32>>,
        /// The model's price, USD per million tokens (the built-in table's otherwise).
        price: Option<Spanned<PriceSpec>>,
    }
}

section! {
    /// `price = { input = 0.15, output = 0.60, cached_input = 0.075, cache_write = 0.1875 }`: USD
    /// per million tokens; cached input and cache writes cost the input price when not given.
    PriceSpec {
        /// Per million input tokens.
        input: Spanned<f64>,
        /// Per million output tokens.
        output: Spanned<f64>,
        /// Per million input tokens read from the provider's cache.
        cached_input: Option<Spanned<f64>>,
        /// Per million input tokens written to the provider's cache.
        cache_write: Option<Spanned<f64>>,
    }
}

impl PriceSpec {
    /// The price it gives.
    pub fn price(&self) -> agentloop::Price {
        agentloop::Price {
            input: *self.input.get_ref(),
            output: *self.output.get_ref(),
            cached_input: self.cached_input.as_ref().map(|v| *v.get_ref()),
            cache_write: self.cache_write.as_ref().map(|v| *v.get_ref()),
        }
    }
}

/// A bound in `[limits]`: a number, or `"unlimited"` (as is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound<T> {
    /// At most this many (0: no bound).
    At(T),
    /// No bound.
    Unlimited,
}

impl<T: Copy + PartialEq + Default> Bound<T> {
    /// The bound in force: `None` for `"unlimited"` and 0.
    pub fn get(self) -> Option<T> {
        match self {
            Bound::At(n) if n != T::default() => Some(n),
            _ => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bound<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw<T> {
            At(T),
            Word(String),
        }
        match Raw::<T>::deserialize(d) {
            Ok(Raw::At(n)) => Ok(Bound::At(n)),
            Ok(Raw::Word(w)) if w == "unlimited" => Ok(Bound::Unlimited),
            _ => Err(serde::de::Error::custom(
                "expected a whole number of at least 0, or \"unlimited\"",
            )),
        }
    }
}

section! {
    /// `[limits]`: all optional.
    LimitsSpec {
        /// The most turns (`"unlimited"` or 0: no bound).
        max_turns: Option<Spanned<Bound<u32>>>,
        /// The most tool calls.
        max_tool_calls: Option<Bound<u32>>,
        /// The most model calls.
        max_model_calls: Option<Bound<u32>>,
        /// The most tool calls running at once.
        max_concurrency: Option<Spanned<usize>>,
        /// Wall-clock deadline in seconds.
        timeout_secs: Option<Spanned<f64>>,
        /// The most USD the run may spend.
        max_cost_usd: Option<Spanned<f64>>,
        /// The most tokens (input plus output) over the run.
        max_tokens: Option<Bound<u64>>,
        /// How many times a turn may come back the same before the run stops as stuck (0
        /// disables the rule; 1 is refused).
        stuck_loop_threshold: Option<Spanned<u32>>,
        /// What a limit does: `stop` (the default) or `answer` (one last model call without
        /// tools, for a final answer from the partial work).
        on_limit: Option<agentloop::OnLimit>,
    }
}

section! {
    /// One `[[tools]]` entry: a command tool.
    ToolFileSpec {
        /// The name the model calls it by.
        name: Spanned<String>,
        /// What it does, for the model.
        description: Option<String>,
        /// The program and its arguments; a relative program path starts at the agent file's
        /// directory.
        command: Spanned<Vec<String>>,
        /// The JSON Schema of its arguments (default: an object with no properties).
        input_schema: Option<Spanned<Value>>,
        /// `parallel` (default) or `sequential`.
        mode: Option<ExecutionMode>,
        /// Per-call timeout in seconds.
        timeout_secs: Option<Spanned<f64>>,
        /// How many times a failed call (non-zero exit, timeout) runs again before the model
        /// sees the failure (default 0, at most [`MAX_TOOL_RETRIES`]).
        retries: Option<Spanned<u32>>,
        /// The tool polls something that changes on its own: the stuck-loop rule judges its
        /// repeated calls by their results alone.
        poller: Option<bool>,
    }
}

section! {
    /// `[permissions]`: which tool calls run, which need a human's approval, which never run.
    PermissionsSpec {
        /// What happens to a call no list or rule covers: `allow` (the default), `ask` or `deny`.
        default: Option<Permission>,
        /// Tools whose calls run without asking.
        allow: Option<Vec<Spanned<String>>>,
        /// Tools whose calls need approval.
        ask: Option<Vec<Spanned<String>>>,
        /// Tools whose calls never run.
        deny: Option<Vec<Spanned<String>>>,
        /// A JSON file (relative to the agent file) where "always" answers are kept across runs.
        store: Option<Spanned<String>>,
        /// Rules on the arguments of a call.
        rules: Option<Vec<PermissionRuleSpec>>,
    }
}

section! {
    /// One `[[permissions.rules]]` entry: a tool (or `*`), an optional match on its arguments, and
    /// what to do.
    PermissionRuleSpec {
        /// A declared tool, or `*` for any.
        tool: Spanned<String>,
        /// `allow`, `ask` or `deny`.
        permission: Permission,
        /// Matches when an argument (a string, or an array of strings joined by spaces) starts
        /// with a prefix's words; an `allow` never admits a chained command unless the rule says
        /// `allow_chaining = true`.
        command_prefix: Option<CommandPrefixSpec>,
        /// Matches when an argument (a path) matches a glob.
        path_glob: Option<Spanned<PathGlobSpec>>,
    }
}

section! {
    /// `command_prefix = { field = "command", prefix = "git status" }`.
    CommandPrefixSpec {
        /// The argument holding the command.
        field: String,
        /// The prefix.
        prefix: Spanned<String>,
        /// An `allow` rule also admits the command chained with others (`;`, `&&`, `|`, ...);
        /// default false.
        allow_chaining: Option<bool>,
    }
}

section! {
    /// `path_glob = { field = "path", glob = "src/**" }`.
    PathGlobSpec {
        /// The argument holding the path.
        field: String,
        /// The glob: `*` within a path segment, `**` across segments.
        glob: Spanned<String>,
    }
}

/// A checked agent file, with the directory its paths are relative to.
#[derive(Debug, Clone)]
pub struct AgentFile {
    /// The file's path.
    pub path: PathBuf,
    /// The directory relative paths start from.
    pub dir: PathBuf,
    /// What the file says.
    pub spec: AgentFileSpec,
    /// The instructions, read from `instructions` or `instructions_file`.
    pub instructions: Option<String>,
}

impl AgentFile {
    /// Reads and checks an agent file. Every problem is reported, or none.
    pub fn load(path: &Path) -> Result<AgentFile, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::parse(path, &text).map_err(LoadError::Invalid)
    }

    /// Checks agent file text; `path` locates relative paths and names the file in messages.
    pub fn parse(path: &Path, text: &str) -> Result<AgentFile, Problems> {
        let mut problems = Problems::new(path, text);
        let (root, syntax) = DeTable::parse_recoverable(text);
        if !syntax.is_empty() {
            for e in syntax {
                problems.at("", e.span(), e.message().trim().to_owned());
            }
            return Err(problems.sorted());
        }
        check_keys::<AgentFileSpec>(root.get_ref(), root.span(), "", &mut problems);
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        if !problems.is_empty() {
            check_clean_sections(root.get_ref(), &dir, &mut problems);
            return Err(problems.sorted());
        }
        let spec: AgentFileSpec = match toml::from_str(text) {
            Ok(spec) => spec,
            Err(e) => {
                problems.at("", e.span(), e.message().trim().to_owned());
                return Err(problems.sorted());
            }
        };
        let instructions = check_rules(&spec, &dir, &mut problems);
        if !problems.is_empty() {
            return Err(problems.sorted());
        }
        Ok(AgentFile {
            path: path.to_path_buf(),
            dir,
            spec,
            instructions,
        })
    }

    /// The tools, or none.
    pub fn tools(&self) -> &[ToolFileSpec] {
        self.spec.tools.as_deref().unwrap_or_default()
    }

    /// The `[permissions]` table, when the file has one.
    pub fn permissions(&self) -> Option<&PermissionsSpec> {
        self.spec.permissions.as_ref()
    }

    /// The model section.
    pub fn model(&self) -> &ModelSpec {
        self.spec.model.get_ref()
    }

    /// The environment variable holding the API key, for a live provider.
    pub fn api_key_env(&self) -> Option<String> {
        let m = self.model();
        m.api_key_env
            .as_ref()
            .map(|s| s.get_ref().clone())
            .or_else(|| m.provider.get_ref().default_key_env().map(str::to_owned))
    }

    /// A path named in the file, resolved against its directory.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
}

/// Why an agent file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read agent file {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The file has problems.
    #[error("{0}")]
    Invalid(Problems),
}

fn span_of<T>(s: &Spanned<T>) -> Option<Range<usize>> {
    Some(s.span())
}

/// The rules no type says. Returns the instructions text when it could be read.
fn check_rules(spec: &AgentFileSpec, dir: &Path, problems: &mut Problems) -> Option<String> {
    let name = &spec.name;
    if name.get_ref().trim().is_empty() {
        problems.at("name", span_of(name), "the agent's name is empty");
    }
    let instructions = match (&spec.instructions, &spec.instructions_file) {
        (Some(_), Some(file)) => {
            problems.at(
                "instructions_file",
                span_of(file),
                "give `instructions` or `instructions_file`, not both",
            );
            None
        }
        (Some(text), None) => Some(text.get_ref().clone()),
        (None, Some(file)) => match std::fs::read_to_string(dir.join(file.get_ref())) {
            Ok(text) => Some(text),
            Err(e) => {
                problems.at(
                    "instructions_file",
                    span_of(file),
                    format!("cannot read {}: {e}", dir.join(file.get_ref()).display()),
                );
                None
            }
        },
        (None, None) => None,
    };
    if let Some(schema) = &spec.output_schema
        && let Err(e) = agentloop::tool::compile_schema(schema.get_ref())
    {
        problems.at(
            "output_schema",
            span_of(schema),
            format!("not a valid JSON Schema: {e}"),
        );
    }
    check_model(spec.model.get_ref(), dir, problems);
    if let Some(limits) = &spec.limits {
        check_limits(limits, problems);
        check_budget_priced(limits, spec.model.get_ref(), problems);
    }
    let tools: Vec<(String, &ToolFileSpec)> = spec
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("tools[{i}]"), t))
        .collect();
    check_tools(&tools, dir, problems);
    if let Some(permissions) = &spec.permissions {
        let names: Vec<&str> = tools
            .iter()
            .map(|(_, t)| t.name.get_ref().as_str())
            .collect();
        check_permissions(permissions, &names, dir, problems);
    }
    instructions
}

/// The tool names of a file whose shape may be wrong: every `[[tools]]` entry's `name` that is a
/// string.
fn raw_tool_names(root: &DeTable<'_>) -> Vec<String> {
    fn named<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t DeValue<'i>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.get_ref())
    }
    let Some(DeValue::Array(items)) = named(root, "tools") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| item.get_ref().as_table())
        .filter_map(|t| named(t, "name"))
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

/// `[permissions]`: every listed tool is declared and listed once, rules name declared tools (or
/// `*`) with at most one argument match each, globs compile, and the store file, when it exists,
/// reads.
fn check_permissions(
    permissions: &PermissionsSpec,
    tools: &[&str],
    dir: &Path,
    problems: &mut Problems,
) {
    let declared = if tools.is_empty() {
        "the file declares no tools".to_owned()
    } else {
        format!("declared: {}", tools.join(", "))
    };
    let mut listed: Vec<(&str, &str)> = Vec::new();
    for (list, names) in [
        ("allow", &permissions.allow),
        ("ask", &permissions.ask),
        ("deny", &permissions.deny),
    ] {
        for (i, name) in names.as_deref().unwrap_or_default().iter().enumerate() {
            let path = format!("permissions.{list}[{i}]");
            let n = name.get_ref().as_str();
            if !tools.contains(&n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("no tool named {n:?} ({declared})"),
                );
            } else if let Some((_, first)) = listed.iter().find(|(t, _)| *t == n) {
                problems.at(
                    &path,
                    span_of(name),
                    format!("the tool {n:?} is already listed in `{first}`"),
                );
            }
            listed.push((n, list));
        }
    }
    let rules = permissions.rules.as_deref().unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("permissions.rules[{i}]");
        let n = rule.tool.get_ref().as_str();
        if n != "*" && !tools.contains(&n) {
            problems.at(
                &join(&path, "tool"),
                span_of(&rule.tool),
                format!("no tool named {n:?} ({declared}; `*` means any tool)"),
            );
        }
        if let Some(prefix) = &rule.command_prefix
            && prefix.prefix.get_ref().trim().is_empty()
        {
            problems.at(
                &join(&path, "command_prefix.prefix"),
                span_of(&prefix.prefix),
                "the prefix is empty",
            );
        }
        if let Some(glob) = &rule.path_glob {
            if rule.command_prefix.is_some() {
                problems.at(
                    &join(&path, "path_glob"),
                    span_of(glob),
                    "give `command_prefix` or `path_glob`, not both",
                );
            }
            let g = &glob.get_ref().glob;
            if let Err(e) = globset::GlobBuilder::new(g.get_ref())
                .literal_separator(true)
                .build()
            {
                problems.at(
                    &join(&path, "path_glob.glob"),
                    span_of(g),
                    format!("not a valid glob: {}", e.kind()),
                );
            }
        }
    }
    if let Some(store) = &permissions.store {
        if store.get_ref().trim().is_empty() {
            problems.at(
                "permissions.store",
                span_of(store),
                "the store path is empty",
            );
        } else if let Err(e) =
            crate::permission_file::open(dir.join(store.get_ref()), Permission::Allow)
        {
            problems.at("permissions.store", span_of(store), e.to_string());
        }
    }
}

/// Tool names (valid, unique) and each tool's own rules; `tools` pairs each with its key path.
fn check_tools(tools: &[(String, &ToolFileSpec)], dir: &Path, problems: &mut Problems) {
    let mut seen: Vec<&str> = Vec::new();
    for (path, tool) in tools {
        let name = tool.name.get_ref().as_str();
        if let Err(reason) = agentloop::tool::check_tool_name(name) {
            problems.at(
                &join(path, "name"),
                span_of(&tool.name),
                format!("invalid tool name {name:?}: {reason}"),
            );
        } else if seen.contains(&name) {
            problems.at(
                &join(path, "name"),
                span_of(&tool.name),
                format!("the tool name {name:?} is used twice"),
            );
        }
        seen.push(name);
        check_tool(tool, path, dir, problems);
    }
}

/// When the file's shape has problems, the rules still run on every section whose shape is
/// right, so that one pass reports all it can.
fn check_clean_sections(root: &DeTable<'_>, dir: &Path, problems: &mut Problems) {
    let dirty = |problems: &Problems, prefix: &str| {
        problems.list.iter().any(|p| {
            p.path == prefix
                || p.path.starts_with(&format!("{prefix}."))
                || p.path.starts_with(&format!("{prefix}["))
        })
    };
    let get = |key: &str| {
        root.iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v.clone())
    };
    if let Some(v) = get("model")
        && !dirty(problems, "model")
        && let Ok(model) = ModelSpec::deserialize(ValueDeserializer::from(v))
    {
        check_model(&model, dir, problems);
    }
    if let Some(v) = get("limits")
        && !dirty(problems, "limits")
        && let Ok(limits) = LimitsSpec::deserialize(ValueDeserializer::from(v))
    {
        check_limits(&limits, problems);
    }
    if let Some(v) = get("permissions")
        && !dirty(problems, "permissions")
        && let Ok(permissions) = PermissionsSpec::deserialize(ValueDeserializer::from(v))
    {
        let names = raw_tool_names(root);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        check_permissions(&permissions, &names, dir, problems);
    }
    let Some(items) = get("tools") else { return };
    let Some(items) = items.get_ref().as_array() else {
        return;
    };
    let parsed: Vec<(String, ToolFileSpec)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| (format!("tools[{i}]"), item))
        .filter(|(path, _)| !dirty(problems, path))
        .filter_map(|(path, item)| {
            ToolFileSpec::deserialize(ValueDeserializer::from(item.clone()))
                .ok()
                .map(|t| (path, t))
        })
        .collect();
    let tools: Vec<(String, &ToolFileSpec)> = parsed.iter().map(|(p, t)| (p.clone(), t)).collect();
    check_tools(&tools, dir, problems);
}

fn check_model(model: &ModelSpec, dir: &Path, problems: &mut Problems) {
    let provider = *model.provider.get_ref();
    let live_only = |problems: &mut Problems, key: &str, span: Option<Range<usize>>| {
        problems.at(
            &join("model", key),
            span,
            format!("`{key}` does not apply to the scripted provider"),
        );
    };
    if provider == Provider::Scripted {
        match &model.script {
            None => problems.at(
                "model.script",
                span_of(&model.provider),
                "the scripted provider needs `script`: a JSON file of responses, in order",
            ),
            Some(script) => {
                let path = dir.join(script.get_ref());
                if let Err(e) = crate::assemble::read_script(&path) {
                    problems.at("model.script", span_of(script), e.to_string());
                }
            }
        }
        if let Some(v) = &model.base_url {
            live_only(problems, "base_url", span_of(v));
        }
        if let Some(v) = &model.api_key_env {
            live_only(problems, "api_key_env", span_of(v));
        }
    } else {
        if let Some(script) = &model.script {
            problems.at(
                "model.script",
                span_of(script),
                format!(
                    "`script` is for the scripted provider only, not {}",
                    provider.as_str()
                ),
            );
        }
        match &model.name {
            None => problems.at(
                "model.name",
                span_of(&model.provider),
                format!("the {} provider needs a model `name`", provider.as_str()),
            ),
            Some(n) if n.get_ref().trim().is_empty() => {
                problems.at("model.name", span_of(n), "the model name is empty")
            }
            Some(_) => {}
        }
        if let Some(url) = &model.base_url {
            let u = url.get_ref();
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                problems.at(
                    "model.base_url",
                    span_of(url),
                    format!("{u:?} is not an http:// or https:// URL"),
                );
            }
        }
        if let Some(env) = &model.api_key_env {
            let e = env.get_ref();
            if e.is_empty() || !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                problems.at(
                    "model.api_key_env",
                    span_of(env),
                    format!("{e:?} is not an environment variable name"),
                );
            }
        }
    }
    if let Some(t) = &model.temperature
        && !(0.0..=2.0).contains(t.get_ref())
    {
        problems.at(
            "model.temperature",
            span_of(t),
            "the temperature must be between 0 and 2",
        );
    }
    if let Some(price) = &model.price {
        let p = price.get_ref();
        let parts = [
            ("input", Some(&p.input)),
            ("output", Some(&p.output)),
            ("cached_input", p.cached_input.as_ref()),
            ("cache_write", p.cache_write.as_ref()),
        ];
        for (key, value) in parts {
            if let Some(v) = value
                && !(v.get_ref().is_finite() && *v.get_ref() >= 0.0)
            {
                problems.at(
                    &format!("model.price.{key}"),
                    span_of(v),
                    "a price must be a number of USD per million tokens, zero or more",
                );
            }
        }
    }
    if let Some(m) = &model.max_tokens
        && *m.get_ref() == 0
    {
        problems.at(
            "model.max_tokens",
            span_of(m),
            "max_tokens must be at least 1",
        );
    }
}

fn check_limits(limits: &LimitsSpec, problems: &mut Problems) {
    if let Some(c) = &limits.max_concurrency
        && *c.get_ref() == 0
    {
        problems.at(
            "limits.max_concurrency",
            span_of(c),
            "max_concurrency must be at least 1",
        );
    }
    if let Some(t) = &limits.stuck_loop_threshold
        && *t.get_ref() == 1
    {
        problems.at(
            "limits.stuck_loop_threshold",
            span_of(t),
            "stuck_loop_threshold must be at least 2 (or 0 to turn the rule off): at 1 every call would be a loop",
        );
    }
    if let Some(t) = &limits.timeout_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            "limits.timeout_secs",
            span_of(t),
            "timeout_secs must be a positive number of seconds, at most a year",
        );
    }
    if let Some(c) = &limits.max_cost_usd
        && !(c.get_ref().is_finite() && *c.get_ref() >= 0.0)
    {
        problems.at(
            "limits.max_cost_usd",
            span_of(c),
            "max_cost_usd must be zero or more",
        );
    }
}

/// A cost budget needs a price for the model, or it could never hold: the file's
/// `[model] price`, or the built-in table's for a live model it knows.
fn check_budget_priced(limits: &LimitsSpec, model: &ModelSpec, problems: &mut Problems) {
    let Some(budget) = &limits.max_cost_usd else {
        return;
    };
    if crate::assemble::price(model).is_some() {
        return;
    }
    let which = match (model.provider.get_ref(), &model.name) {
        (Provider::Scripted, _) => "the scripted model has no price".to_owned(),
        (_, Some(name)) => format!(
            "the model {:?} is not in the built-in price table",
            name.get_ref()
        ),
        (_, None) => "the model has no price".to_owned(),
    };
    problems.at(
        "limits.max_cost_usd",
        span_of(budget),
        format!(
            "max_cost_usd needs a price for the model, and {which}: give it in [model] as \
             `price = {{ input = 0.40, output = 1.60 }}` (USD per million tokens; optional \
             `cached_input`, `cache_write`)"
        ),
    );
}

fn check_tool(tool: &ToolFileSpec, path: &str, dir: &Path, problems: &mut Problems) {
    let command = tool.command.get_ref();
    match command.first() {
        None => problems.at(
            &join(path, "command"),
            span_of(&tool.command),
            "the command is empty: give the program, then its arguments",
        ),
        Some(program) if program.is_empty() => problems.at(
            &join(path, "command"),
            span_of(&tool.command),
            "the program (the command's first item) is empty",
        ),
        Some(program) if program.contains('/') && !dir.join(program).exists() => problems.at(
            &join(path, "command"),
            span_of(&tool.command),
            format!(
                "the program {program} does not exist (looked at {})",
                dir.join(program).display()
            ),
        ),
        Some(_) => {}
    }
    if let Some(schema) = &tool.input_schema {
        let key = join(path, "input_schema");
        match schema.get_ref() {
            Value::Object(map) => {
                if map.get("type").is_some_and(|t| t != "object") {
                    problems.at(
                        &key,
                        span_of(schema),
                        "the input schema must describe an object (`type = \"object\"`)",
                    );
                } else if let Err(e) = agentloop::tool::compile_schema(schema.get_ref()) {
                    problems.at(
                        &key,
                        span_of(schema),
                        format!("not a valid JSON Schema: {e}"),
                    );
                }
            }
            other => problems.at(
                &key,
                span_of(schema),
                format!("the input schema must be a table, not {other}"),
            ),
        }
    }
    if let Some(t) = &tool.timeout_secs
        && !valid_seconds(*t.get_ref())
    {
        problems.at(
            &join(path, "timeout_secs"),
            span_of(t),
            "timeout_secs must be a positive number of seconds, at most a year",
        );
    }
    if let Some(r) = &tool.retries
        && *r.get_ref() > MAX_TOOL_RETRIES
    {
        problems.at(
            &join(path, "retries"),
            span_of(r),
            format!("retries is at most {MAX_TOOL_RETRIES}"),
        );
    }
}

/// The longest timeout an agent file may set: a year, in seconds.
pub const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// A timeout an agent file may set: positive and at most [`MAX_TIMEOUT_SECS`].
fn valid_seconds(secs: f64) -> bool {
    secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS
}

/// The most retries an agent file may give a tool: beyond that a failing tool would only keep a
/// run waiting.
pub const MAX_TOOL_RETRIES: u32 = 10;

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        AgentFile::parse(Path::new("agent.toml"), text)
            .unwrap_err()
            .list()
            .to_vec()
    }

    #[test]
    fn a_timeout_too_large_for_a_duration_is_a_problem_not_a_panic() {
        for (key, line) in [("limits", 5), ("tools", 8)] {
            let text = if key == "limits" {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n[limits]\ntimeout_secs = 1e300\n".to_owned()
            } else {
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\ntimeout_secs = 1e300\n".to_owned()
            };
            let found = problems(&text);
            let p = found
                .iter()
                .find(|p| p.path.ends_with("timeout_secs"))
                .expect("a timeout_secs problem");
            assert_eq!(p.line, line, "{key}");
            assert!(p.message.contains("at most a year"), "{}", p.message);
        }
    }

    #[test]
    fn a_tool_may_have_up_to_ten_retries() {
        let file = |n: u32| {
            format!(
                "[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n\n[[tools]]\nname = \"t\"\ncommand = [\"true\"]\nretries = {n}\n"
            )
        };
        let found = located(&file(11));
        assert!(
            found.contains(&("tools[0].retries".to_owned(), 8)),
            "{found:?}"
        );
        let too_many = problems(&file(11));
        let retries = too_many
            .iter()
            .find(|p| p.path == "tools[0].retries")
            .unwrap();
        assert!(
            retries.message.contains("at most 10"),
            "{}",
            retries.message
        );
        // Ten is fine (the file's other problems aside).
        assert!(
            problems(&file(10))
                .iter()
                .all(|p| !p.path.ends_with("retries"))
        );
    }

    /// Each problem's key path and line.
    fn located(text: &str) -> Vec<(String, usize)> {
        problems(text)
            .into_iter()
            .map(|p| (p.path, p.line))
            .collect()
    }

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
    fn rule_problems_are_all_reported_after_the_shape_is_right() {
        let text = r#"name = "x"
[model]
provider = "openai"
script = "s.json"

[[tools]]
name = "bad name"
command = []

[[tools]]
name = "t2"
command = ["echo"]
input_schema = { type = "string" }
"#;
        let got = located(text);
        assert!(got.contains(&("model.name".into(), 3)), "{got:?}");
        assert!(got.contains(&("model.script".into(), 4)), "{got:?}");
        assert!(got.contains(&("tools[0].name".into(), 7)), "{got:?}");
        assert!(got.contains(&("tools[0].command".into(), 8)), "{got:?}");
        assert!(
            got.contains(&("tools[1].input_schema".into(), 13)),
            "{got:?}"
        );
    }

    #[test]
    fn rules_run_on_sections_whose_shape_is_right_even_when_others_are_wrong() {
        let text = r#"name = "x"
colour = "blue"
[model]
provider = "openai"
[[tools]]
name = "bad name"
command = ["echo"]
[[tools]]
name = "t"
command = 5
"#;
        let got = located(text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 2),
                ("model.name".to_owned(), 4),
                ("tools[0].name".to_owned(), 6),
                ("tools[1].command".to_owned(), 10)
            ]
        );
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
    }

    #[test]
    fn a_syntax_error_has_a_line() {
        let got = problems("name = \"x\"\n[model\nprovider = 1\n");
        assert_eq!(got.first().map(|p| p.line), Some(2));
    }

    #[test]
    fn a_scripted_agent_needs_an_existing_script() {
        let got = problems(
            "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"nope.json\"\nbase_url = \"http://x\"\n",
        );
        let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["model.script", "model.base_url"]);
    }

    /// An agent file with two tools, `shell` and `write`, and no permissions.
    pub(crate) const TWO_TOOLS: &str = r#"name = "x"
[model]
provider = "openai"
name = "m"
[[tools]]
name = "shell"
command = ["sh"]
[[tools]]
name = "write"
command = ["sh"]
"#;

    #[test]
    fn permission_lists_and_rules_name_declared_tools_once() {
        let text = format!(
            r#"{TWO_TOOLS}
[permissions]
default = "ask"
allow = ["shell", "nope"]
deny = ["write", "shell"]
store = ""

[[permissions.rules]]
tool = "*"
permission = "deny"
path_glob = {{ field = "path", glob = "**/.env" }}

[[permissions.rules]]
tool = "wirte"
permission = "allow"
command_prefix = {{ field = "command", prefix = " " }}
path_glob = {{ field = "path", glob = "src/[" }}
"#
        );
        let got: Vec<(String, usize, String)> = problems(&text)
            .into_iter()
            .map(|p| (p.path, p.line, p.message))
            .collect();
        let paths: Vec<(&str, usize)> = got.iter().map(|(p, l, _)| (p.as_str(), *l)).collect();
        assert_eq!(
            paths,
            [
                ("permissions.allow[1]", 14),
                ("permissions.deny[1]", 15),
                ("permissions.store", 16),
                ("permissions.rules[1].tool", 24),
                ("permissions.rules[1].command_prefix.prefix", 26),
                ("permissions.rules[1].path_glob", 27),
                ("permissions.rules[1].path_glob.glob", 27),
            ]
        );
        assert!(
            got[0]
                .2
                .contains("no tool named \"nope\" (declared: shell, write)"),
            "{got:?}"
        );
        assert!(got[1].2.contains("already listed in `allow`"), "{got:?}");
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

    #[test]
    fn an_unknown_tool_in_a_list_is_reported_even_when_other_sections_are_wrong() {
        let text = format!("colour = 1\n{TWO_TOOLS}\n[permissions]\ndeny = [\"shel\"]\n");
        let got = located(&text);
        assert_eq!(
            got,
            [
                ("colour".to_owned(), 1),
                ("permissions.deny[0]".to_owned(), 14)
            ]
        );
    }

    #[test]
    fn an_unreadable_permission_store_is_a_problem_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.json"), "{ not json").unwrap();
        let text = format!("{TWO_TOOLS}\n[permissions]\nstore = \"p.json\"\n");
        let got = AgentFile::parse(&dir.path().join("agent.toml"), &text)
            .unwrap_err()
            .list()
            .to_vec();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].path.as_str(), got[0].line),
            ("permissions.store", 13)
        );
        assert!(got[0].message.contains("permission store"), "{got:?}");
    }

    #[test]
    fn a_good_file_loads() {
        let text = r#"name = "weather"
instructions = "Be brief."
[model]
provider = "openai"
name = "gpt-4.1-mini"
temperature = 0
seed = 7
[limits]
max_turns = 6
max_cost_usd = 1
[[tools]]
name = "get_weather"
command = ["python3", "-c", "print(1)"]
input_schema = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
mode = "sequential"
timeout_secs = 10
"#;
        let file = AgentFile::parse(Path::new("agent.toml"), text).unwrap();
        assert_eq!(file.tools().len(), 1);
        assert_eq!(
            file.model().temperature.as_ref().map(|t| *t.get_ref()),
            Some(0.0)
        );
        assert_eq!(file.api_key_env().as_deref(), Some("OPENAI_API_KEY"));
    }
}
