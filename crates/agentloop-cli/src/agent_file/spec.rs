//! The agent file's shape: one struct a table, declared with [`section!`] so that each is both the
//! serde type the file is read into (`deny_unknown_fields` everywhere) and the key-by-key check of
//! its keys, from the same list of fields.

use std::collections::BTreeMap;

use agentloop::{OnLimit, handoff::HandoffHistory, permissions::Permission, tool::ExecutionMode};
use agentloop_store::Durability;
use agentloop_tools::{SandboxMode, SandboxPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toml::Spanned;

use super::check::{leaf, section};

// The file's own enums and bounds: each is checked whole, by deserializing it.
leaf!(
    ExecutionMode,
    Provider,
    Permission,
    Bound<u32>,
    Bound<u64>,
    OnLimit,
    CompactionSpec,
    ToolSearchSpec,
    RestartSpec,
    SandboxMode,
    Durability,
    HandoffHistory,
    BTreeMap<String, String>
);

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
        /// The agent's version, as you number it: part of its definition's fingerprint, so a
        /// journaled run started under another version is not resumed unawares.
        version: Option<String>,
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
        /// The tools: command tools, subagents and built-in tools.
        tools: Option<Vec<ToolFileSpec>>,
        /// MCP servers whose tools the agent gets, named `SERVER__TOOL`.
        mcp: Option<Vec<McpFileSpec>>,
        /// Agents this one may pass the conversation to (`transfer_to_<name>` tools): the other
        /// agent goes on with its own instructions, model, tools and permissions, under this
        /// run's limits, and its answer is the run's.
        handoffs: Option<Vec<HandoffSpec>>,
        /// Which tool calls run, which need approval, which never run.
        permissions: Option<PermissionsSpec>,
        /// Export every run as OpenTelemetry spans (as `--otel`).
        otel: Option<bool>,
        /// The sandbox of every process the agent's tools start (the shell, command tools, stdio
        /// MCP servers) unless an entry says otherwise: `workspace-write` (the default),
        /// `read-only`, `off` or `best-effort`.
        sandbox: Option<SandboxMode>,
        /// What each step of a journaled run (`run --journal`, `resume`, `journal fork`)
        /// survives before the run moves on: `process` (any kill of the process) or `power` (a
        /// power cut too: fsync'd; the default). `--durability` overrides it.
        durability: Option<Durability>,
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
        /// How the model must choose tools: `"auto"` (the model decides; the default),
        /// `"required"` (it must call some tool), `"none"` (it must not) or a tool's name (it must
        /// call that one). A forced choice holds until the model has called a tool, then the
        /// model decides, so that it can still give its answer.
        tool_choice: Option<Spanned<String>>,
        /// The model's price, USD per million tokens (the built-in table's otherwise).
        price: Option<Spanned<PriceSpec>>,
        /// Keeps the model's answers and answers an identical request from them (a response
        /// cache, in `responses.db` beside the agent file, or `$AGENTLOOP_RESPONSE_CACHE`).
        cache: Option<bool>,
        /// How long a cached answer is kept, in seconds (default a day).
        cache_ttl_secs: Option<Spanned<f64>>,
        /// The model's context window in tokens: older turns are compacted before a request and
        /// the room for its answer would pass it. Known for the common models; for any other,
        /// conversations are compacted only when this is set.
        context_tokens: Option<Spanned<u64>>,
        /// How: `summarize` (the default: the model summarizes the older turns),
        /// `drop_tool_results` (the oldest tool results' bodies are dropped) or `off`.
        compaction: Option<CompactionSpec>,
        /// How many of the latest turns compaction keeps whole (default 2).
        compaction_keep_turns: Option<Spanned<u32>>,
        /// The longest silence from the server, in seconds, while waiting for an answer or
        /// inside a streamed one (default 300: reasoning models can think for minutes without a
        /// byte).
        idle_timeout_secs: Option<Spanned<f64>>,
        /// The longest time, in seconds, keep-alives alone may hold a call: comment lines in a
        /// stream, spaces before a whole body (default 1800: a gateway sends them while a model
        /// thinks for many minutes, or while a request waits in a queue).
        keepalive_timeout_secs: Option<Spanned<f64>>,
        /// `openai` only: send earlier reasoning back as `reasoning_content` (DeepSeek's thinking
        /// mode needs it; by default on for DeepSeek models and hosts, off elsewhere).
        reasoning_content: Option<Spanned<bool>>,
        /// `openai` only: send a tool call's `extra_content` (Gemini's thought signatures) back on
        /// it (default true).
        tool_call_extra: Option<Spanned<bool>>,
        /// `openai` only: the `prompt_cache_key`: `"auto"` (derived from the agent; the default on
        /// api.openai.com), `"off"` (the default elsewhere) or a key of your own.
        prompt_cache_key: Option<Spanned<String>>,
        /// `anthropic` only: `cache_control` breakpoints on the instructions, the tools and the
        /// latest turn (default true).
        prompt_caching: Option<Spanned<bool>>,
        /// `openai` only: tool calls in plain text for a model served without a tool-call
        /// parser: `"auto"` (every common shape, where it names a tool), `"hermes"`, `"mistral"`
        /// or `"llama3-json"` (the tools go in the prompt).
        tool_dialect: Option<Spanned<String>>,
        /// How the model finds deferred tools (`defer = true`): `"native"` (the provider's own
        /// tool search: Anthropic's and OpenAI Responses'; every tool is sent each turn, the
        /// deferred ones marked),
        /// `"local"` (the built-in `search_tools`) or `"auto"` (native where the provider has
        /// it, local elsewhere; the default).
        tool_search: Option<Spanned<ToolSearchSpec>>,
    }
}

/// `[model] tool_search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSearchSpec {
    /// The provider's own tool search.
    Native,
    /// The built-in `search_tools`.
    Local,
    /// Native where the provider has it, local elsewhere.
    Auto,
}

impl ToolSearchSpec {
    /// True when deferred tools are found by `provider`'s own search under this setting.
    pub fn native_for(self, provider: Provider) -> bool {
        let has = matches!(provider, Provider::Anthropic | Provider::OpenAiResponses);
        match self {
            ToolSearchSpec::Native | ToolSearchSpec::Auto => has,
            ToolSearchSpec::Local => false,
        }
    }
}

/// `[model] compaction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionSpec {
    /// The model summarizes the older turns.
    Summarize,
    /// The oldest tool results' bodies are dropped.
    DropToolResults,
    /// Never compact.
    Off,
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

/// A bound written as a number, as the core takes it: 0 lifts it, as for every `[limits]` bound
/// (and as the Python package's `Limits` does), never "none at all" (a budget of $0 would stop a
/// run before its first model call).
fn lifted_at_zero<T: Copy + PartialEq + Default>(v: Option<&Spanned<T>>) -> Option<T> {
    v.map(|v| *v.get_ref()).filter(|v| *v != T::default())
}

/// Seconds as a deadline: 0 lifts it.
fn deadline_of(secs: Option<&Spanned<f64>>) -> Option<std::time::Duration> {
    lifted_at_zero(secs).and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
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
        /// Wall-clock deadline in seconds (0: none).
        timeout_secs: Option<Spanned<f64>>,
        /// The most USD the run may spend (0: no bound).
        max_cost_usd: Option<Spanned<f64>>,
        /// The most tokens (input plus output) over the run (0: no bound).
        max_tokens: Option<Bound<u64>>,
        /// How many times a turn may come back the same before the run stops as stuck (0
        /// disables the rule; 1 is refused).
        stuck_loop_threshold: Option<Spanned<u32>>,
        /// What a limit does: `stop` (the default) or `answer` (one last model call without
        /// tools, for a final answer from the partial work).
        on_limit: Option<OnLimit>,
        /// How deep the tree of subagents (`agent` tools) may grow (default 3).
        max_depth: Option<Spanned<u32>>,
    }
}

impl LimitsSpec {
    /// The cost budget in force: `max_cost_usd`, `None` when left out or 0.
    pub fn cost_bound(&self) -> Option<f64> {
        lifted_at_zero(self.max_cost_usd.as_ref())
    }

    /// The run's deadline: `timeout_secs`, `None` when left out or 0.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        deadline_of(self.timeout_secs.as_ref())
    }
}

section! {
    /// One `[[tools]]` entry: a command tool (`command`), another agent as a subagent (`agent`),
    /// a built-in tool (`builtin`), or a remote agent over A2A (`a2a`).
    ToolFileSpec {
        /// The name the model calls it by (for a built-in tool, its own name by default).
        name: Option<Spanned<String>>,
        /// A built-in tool: `read_file`, `write_file`, `edit_file`, `list_dir`, `glob`, `grep`,
        /// `shell` or `web_fetch` ([`agentloop_tools::Builtin`]).
        builtin: Option<Spanned<String>>,
        /// Built-in file tools and `shell`: the workspace folder they may not leave; command tools:
        /// the folder their processes may write under `workspace-write` (default: the agent
        /// file's folder, where they run). Relative to the agent file.
        root: Option<Spanned<String>>,
        /// Built-in tools but `write_file` and `edit_file`: the most bytes a call reads (files:
        /// text answered; shell: each stream, head and tail; web_fetch: the body); `a2a` tools:
        /// the most bytes of the remote agent's answer the model reads (default 65536, head and
        /// tail kept, the cut said).
        max_bytes: Option<Spanned<usize>>,
        /// `list_dir`, `glob`, `grep`: the most entries or matches a call answers.
        max_results: Option<Spanned<usize>>,
        /// `web_fetch`: hosts, addresses or networks it may reach although they are not public
        /// (`["127.0.0.1", "10.1.0.0/16", "intranet.example"]`).
        allow_private: Option<Vec<Spanned<String>>>,
        /// `shell` and command tools: variables passed to their processes besides PATH, HOME,
        /// LANG, LC_ALL, TERM, TMPDIR and USER (never a secret such as `*_API_KEY`).
        env: Option<Vec<Spanned<String>>>,
        /// `shell` and command tools: the sandbox of their processes (`workspace-write`,
        /// `read-only`, `off`, `best-effort`; the file's `sandbox` by default).
        sandbox: Option<SandboxMode>,
        /// `shell` and command tools: their processes may open network connections (default
        /// false).
        network: Option<Spanned<bool>>,
        /// `shell` and command tools: their processes may connect to the system's UNIX sockets
        /// (a Docker daemon's, an SSH agent's, D-Bus; default false).
        unix_sockets: Option<Spanned<bool>>,
        /// `shell` and command tools: the most each of their processes may use.
        resources: Option<Spanned<ResourcesSpec>>,
        /// What it does, for the model.
        description: Option<String>,
        /// The program and its arguments; a relative program path starts at the agent file's
        /// directory.
        command: Option<Spanned<Vec<String>>>,
        /// Another agent file (relative to this one): the tool runs that agent on the `task` the
        /// model gives, with its own model, tools, limits and permissions, drawing on this
        /// agent's budget.
        agent: Option<Spanned<String>>,
        /// `agent` tools: a subagent that does not finish fails this run (by default the model
        /// reads an error result with its partial output).
        fatal: Option<bool>,
        /// `agent` tools: the most turns one call may take, whatever this agent has left.
        max_turns: Option<Spanned<u32>>,
        /// `agent` tools: the most tool calls one call may run.
        max_tool_calls: Option<Spanned<u32>>,
        /// `agent` tools: the most tokens one call may spend.
        max_tokens: Option<Spanned<u64>>,
        /// `agent` tools: the most USD one call may spend.
        max_cost_usd: Option<Spanned<f64>>,
        /// The JSON Schema of its arguments (default: an object with no properties).
        input_schema: Option<Spanned<Value>>,
        /// `parallel` (default) or `sequential`.
        mode: Option<ExecutionMode>,
        /// Per-call timeout in seconds (`shell`: default 120; `web_fetch`: default 30; `a2a`:
        /// default 600).
        timeout_secs: Option<Spanned<f64>>,
        /// How many times a failed call (non-zero exit, timeout) runs again before the model
        /// sees the failure (default 0, at most
        /// [`MAX_TOOL_RETRIES`](super::rules::MAX_TOOL_RETRIES)); more than 0 without
        /// `idempotent = true` is warned of at load, since a failed command may have done its
        /// work already.
        retries: Option<Spanned<u32>>,
        /// The tool polls something that changes on its own: the stuck-loop rule judges its
        /// repeated calls by their results alone.
        poller: Option<bool>,
        /// Running it twice does no more harm than once: a call of it that was running when a
        /// journaled run's process died runs again on `resume` (otherwise the model reads that
        /// its effect is unknown).
        idempotent: Option<bool>,
        /// A remote agent served over A2A (`http://host:port/path`, where its agent card is at
        /// `/.well-known/agent-card.json` below): the tool hands it the model's `task` and
        /// answers with the task's artifacts. Its card is read when the agent starts.
        a2a: Option<Spanned<String>>,
        /// Kept out of the model's request until the model finds it with the built-in
        /// `search_tools` (by keywords in its name and description); from the turn after, it is
        /// in the request like any other (default false).
        defer: Option<bool>,
    }
}

section! {
    /// One `[[handoffs]]` entry: another agent file (relative to this one) the model may pass
    /// the conversation to.
    HandoffSpec {
        /// The agent file.
        agent: Spanned<String>,
        /// The tool's name (default `transfer_to_<its agent's name>`).
        name: Option<Spanned<String>>,
        /// When to hand off, for the model (default: the other agent's `description`).
        description: Option<String>,
        /// What the other agent sees of the conversation: `all` (the default), `no_tools` (what
        /// was said, without tool calls and results), `last_user` (the user's last message),
        /// `none` (the model writes it a `task`).
        history: Option<HandoffHistory>,
    }
}

section! {
    /// One `[[mcp]]` entry: an MCP server, started with the agent, whose tools become the agent's
    /// (`NAME__TOOL` unless `prefix` or `rename` say otherwise).
    McpFileSpec {
        /// The server's name: its tools' prefix, and how messages and `plan` name it.
        name: Spanned<String>,
        /// A stdio server: the program and its arguments (a relative program path starts at the
        /// agent file's folder, where it runs).
        command: Option<Spanned<Vec<String>>>,
        /// A stdio server's variables besides PATH, HOME, LANG, LC_ALL, TERM, TMPDIR and USER:
        /// templates over this process's environment (`{ TOKEN = "${GITHUB_TOKEN}" }`).
        env: Option<Spanned<BTreeMap<String, String>>>,
        /// Believe the server's `readOnlyHint`/`idempotentHint`: its tools that claim them run
        /// again on `resume` after a crash (default false: each is taken as mutating and not
        /// idempotent, and answered "interrupted" instead).
        trust_hints: Option<bool>,
        /// A streamable HTTP server: its URL.
        url: Option<Spanned<String>>,
        /// HTTP headers, as templates over the environment
        /// (`{ Authorization = "Bearer ${MY_TOKEN}" }`): values never appear in the file.
        headers: Option<Spanned<BTreeMap<String, String>>>,
        /// `never` (the default) or `on-failure`: a server that died is started again on the
        /// next call.
        restart: Option<RestartSpec>,
        /// How long a call, and the server's start, may take, in seconds (default 60).
        timeout_secs: Option<Spanned<f64>>,
        /// The most bytes of a call's result the model reads (default 65536, 64 KiB; at least
        /// 1): longer text keeps its head and tail, saying what was cut; structured content past
        /// it is read as its JSON text, so cut; an image that does not fit is named, not sent.
        max_output_bytes: Option<Spanned<usize>>,
        /// Put before each tool's name instead of `NAME__` (`""` keeps the server's names).
        prefix: Option<Spanned<String>>,
        /// Names for some of its tools, by the server's name for them, used as they are.
        rename: Option<Spanned<BTreeMap<String, String>>>,
        /// A stdio server: the sandbox of its process (the file's `sandbox` by default); it may
        /// write its working folder, the agent file's.
        sandbox: Option<SandboxMode>,
        /// A stdio server: its process may open network connections (default false).
        network: Option<Spanned<bool>>,
        /// Its tools are kept out of the model's request until the model finds them with the
        /// built-in `search_tools`: for servers of many tools (default false).
        defer: Option<bool>,
        /// A stdio server: its process may connect to the system's UNIX sockets (default false).
        unix_sockets: Option<Spanned<bool>>,
        /// A stdio server: the most its process may use.
        resources: Option<Spanned<ResourcesSpec>>,
        /// The MCP version spoken with the server: `"2026-07-28"` (stateless), or one with the
        /// `initialize` handshake (`"2025-11-25"`, `"2025-06-18"`, `"2025-03-26"`,
        /// `"2024-11-05"`). Unset (the default), 2026-07-28 is offered and a server without
        /// it is spoken to at 2025-11-25 or older; pin one for a server that stalls on the
        /// offer.
        protocol_version: Option<Spanned<String>>,
    }
}

section! {
    /// `resources = { memory_mb = 512, cpu_secs = 30, processes = 64, file_size_mb = 100,
    /// open_files = 256 }`: the most each process may use, all optional (`setrlimit`; inherited
    /// by the processes it starts).
    ResourcesSpec {
        /// Address space, in MiB: past it, allocations fail.
        memory_mb: Option<Spanned<u64>>,
        /// CPU time, in seconds: past it, the process is killed.
        cpu_secs: Option<Spanned<u64>>,
        /// Processes and threads of the user: past it, new ones fail (not applied to root).
        processes: Option<Spanned<u64>>,
        /// The size of each file it writes, in MiB.
        file_size_mb: Option<Spanned<u64>>,
        /// Open file descriptors.
        open_files: Option<Spanned<u64>>,
    }
}

impl ResourcesSpec {
    /// The limits it gives.
    pub fn resources(&self) -> agentloop_tools::Resources {
        let get = |v: &Option<Spanned<u64>>| v.as_ref().map(|v| *v.get_ref());
        let mib = |v: &Option<Spanned<u64>>| get(v).map(|n| n.saturating_mul(1024 * 1024));
        agentloop_tools::Resources {
            memory_bytes: mib(&self.memory_mb),
            cpu_secs: get(&self.cpu_secs),
            processes: get(&self.processes),
            file_size_bytes: mib(&self.file_size_mb),
            open_files: get(&self.open_files),
        }
    }

    /// Each key given, with its value, for the check that none is 0.
    pub fn given(&self) -> impl Iterator<Item = (&'static str, &Spanned<u64>)> {
        [
            ("memory_mb", &self.memory_mb),
            ("cpu_secs", &self.cpu_secs),
            ("processes", &self.processes),
            ("file_size_mb", &self.file_size_mb),
            ("open_files", &self.open_files),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    }
}

/// `[[mcp]] restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum RestartSpec {
    /// Never: its tools answer with an error once it died.
    #[serde(rename = "never")]
    Never,
    /// Started again on the next call after it died.
    #[serde(rename = "on-failure")]
    OnFailure,
}

impl McpFileSpec {
    /// The sandbox of its process, over the file's default `sandbox`.
    pub fn sandbox(&self, default: SandboxMode) -> SandboxPolicy {
        sandbox_policy(
            self.sandbox,
            self.network.as_ref(),
            self.unix_sockets.as_ref(),
            self.resources.as_ref(),
            default,
        )
    }

    /// The server's config, its paths resolved against the agent file's folder `dir` (its
    /// sandbox over the default mode: see [`McpFileSpec::server_config`]).
    pub fn config(&self, dir: &std::path::Path) -> agentloop_mcp::ServerConfig {
        self.server_config(dir, SandboxMode::default())
    }

    /// The server's config, its paths resolved against the agent file's folder `dir`, its
    /// sandbox over the file's default `sandbox`.
    pub fn server_config(
        &self,
        dir: &std::path::Path,
        default_sandbox: SandboxMode,
    ) -> agentloop_mcp::ServerConfig {
        let name = self.name.get_ref().clone();
        let mut config = match (&self.command, &self.url) {
            (Some(command), _) => {
                let mut command = command.get_ref().clone();
                if let Some(program) = command.first_mut()
                    && program.contains('/')
                {
                    *program = dir.join(&*program).display().to_string();
                }
                let mut c = agentloop_mcp::ServerConfig::stdio(name, command);
                if let agentloop_mcp::Transport::Stdio {
                    env, cwd, sandbox, ..
                } = &mut c.transport
                {
                    *env = self
                        .env
                        .as_ref()
                        .map(|e| e.get_ref().clone())
                        .unwrap_or_default();
                    *cwd = Some(dir.to_path_buf());
                    *sandbox = self.sandbox(default_sandbox);
                }
                c
            }
            (None, url) => {
                let url = url
                    .as_ref()
                    .map(|u| u.get_ref().clone())
                    .unwrap_or_default();
                let mut c = agentloop_mcp::ServerConfig::http(name, url);
                if let agentloop_mcp::Transport::Http { headers, .. } = &mut c.transport {
                    *headers = self
                        .headers
                        .as_ref()
                        .map(|h| h.get_ref().clone())
                        .unwrap_or_default();
                }
                c
            }
        };
        config.restart = match self.restart {
            Some(RestartSpec::OnFailure) => agentloop_mcp::Restart::OnFailure,
            Some(RestartSpec::Never) | None => agentloop_mcp::Restart::Never,
        };
        if let Some(t) = self
            .timeout_secs
            .as_ref()
            .and_then(|s| std::time::Duration::try_from_secs_f64(*s.get_ref()).ok())
        {
            config.timeout = t;
        }
        if let Some(max) = &self.max_output_bytes {
            config.max_output_bytes = *max.get_ref();
        }
        config.prefix = self.prefix.as_ref().map(|p| p.get_ref().clone());
        config.trust_hints = self.trust_hints.unwrap_or(false);
        config.protocol_version = self.protocol_version.as_ref().map(|v| v.get_ref().clone());
        config.rename = self
            .rename
            .as_ref()
            .map(|r| r.get_ref().clone())
            .unwrap_or_default();
        config
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
        /// The argument holding the command (an argument of the tool's input schema).
        field: Spanned<String>,
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
        /// The argument holding the path (an argument of the tool's input schema).
        field: Spanned<String>,
        /// The glob: `*` within a path segment, `**` across segments.
        glob: Spanned<String>,
    }
}

/// An entry's sandbox: its `sandbox` (else the file's default), `network`, `unix_sockets` and
/// `resources`.
fn sandbox_policy(
    mode: Option<SandboxMode>,
    network: Option<&Spanned<bool>>,
    unix_sockets: Option<&Spanned<bool>>,
    resources: Option<&Spanned<ResourcesSpec>>,
    default: SandboxMode,
) -> SandboxPolicy {
    let on = |flag: Option<&Spanned<bool>>| flag.is_some_and(|n| *n.get_ref());
    SandboxPolicy::new(mode.unwrap_or(default))
        .network(on(network))
        .unix_sockets(on(unix_sockets))
        .resources(
            resources
                .map(|r| r.get_ref().resources())
                .unwrap_or_default(),
        )
}

impl ToolFileSpec {
    /// An `agent` tool's caps on what one call may draw from the parent's budget: its
    /// `max_turns`, `max_tool_calls`, `max_tokens`, `max_cost_usd` and `timeout_secs`, each
    /// lifted by 0 as in `[limits]` (the call then takes its share of what is left), the rest
    /// unbounded.
    pub fn cap(&self) -> agentloop::Limits {
        agentloop::Limits {
            max_turns: lifted_at_zero(self.max_turns.as_ref()),
            max_tool_calls: lifted_at_zero(self.max_tool_calls.as_ref()),
            max_model_calls: None,
            max_tokens: lifted_at_zero(self.max_tokens.as_ref()),
            max_cost_usd: lifted_at_zero(self.max_cost_usd.as_ref()),
            timeout: deadline_of(self.timeout_secs.as_ref()),
            ..agentloop::Limits::unlimited()
        }
    }

    /// The sandbox of a shell's or command tool's processes, over the file's default `sandbox`.
    pub fn sandbox(&self, default: SandboxMode) -> SandboxPolicy {
        sandbox_policy(
            self.sandbox,
            self.network.as_ref(),
            self.unix_sockets.as_ref(),
            self.resources.as_ref(),
            default,
        )
    }

    /// The name the model calls the tool by: its `name`, or a built-in tool's own name.
    pub fn name(&self) -> &str {
        match (&self.name, &self.builtin) {
            (Some(name), _) => name.get_ref(),
            (None, Some(builtin)) => builtin.get_ref(),
            (None, None) => "",
        }
    }

    /// Where the name is written (a built-in tool's `builtin` when it has no `name`).
    pub fn name_span(&self) -> Option<std::ops::Range<usize>> {
        self.name
            .as_ref()
            .or(self.builtin.as_ref())
            .map(Spanned::span)
    }
}
