//! Deferred tools and `search_tools`: a tool set larger than what the model sees. Deferred tools
//! stay out of the model's request until the model finds them with the built-in
//! [`search_tools`](SEARCH_TOOLS) (its keywords scored against their names and descriptions with
//! BM25); a found tool joins the request from the next turn, after the always-present ones, in
//! the order it was found, so the request's prefix (and a provider's prompt cache) holds.
//!
//! [`ToolSearch`] is a [`ToolSource`], the seam an MCP server's `tools/list_changed` uses. The
//! found tools are read from the run's transcript (the `search_tools` results in it), never kept
//! beside it: a resumed run finds the same ones, and two runs of one agent never share them. A
//! deferred tool the model calls before it found it is not in the run's tools, so the machine
//! rejects the call as it does an unknown tool's.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentloop::message::{Message, ToolContent};
use agentloop::tool::{RefreshFuture, ToolSpec};
use agentloop::{Tool, ToolError, ToolOutput, ToolSource};
use serde_json::{Value, json};

/// The built-in tool's name.
pub const SEARCH_TOOLS: &str = "search_tools";

/// How many tools a search answers with unless the model asks for fewer or more.
pub const DEFAULT_SEARCH_LIMIT: usize = 5;

/// The most tools one search answers with.
pub const MAX_SEARCH_LIMIT: usize = 10;

/// The tools an agent has, some of them deferred until a search finds them; see the module.
#[derive(Default)]
pub struct ToolSearch {
    shown: Option<Arc<dyn ToolSource>>,
    hidden: Option<Arc<dyn ToolSource>>,
    deferred: Vec<Tool>,
    searched: AtomicBool,
}

impl std::fmt::Debug for ToolSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSearch")
            .field("shown", &self.shown.is_some())
            .field("hidden", &self.hidden.is_some())
            .field("deferred", &self.deferred.len())
            .finish_non_exhaustive()
    }
}

impl ToolSearch {
    /// A tool set with nothing deferred yet.
    pub fn new() -> Self {
        ToolSearch::default()
    }

    /// A source whose tools are always in the request (the servers not deferred).
    #[must_use]
    pub fn shown(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.shown = Some(source);
        self
    }

    /// A source whose tools are all deferred (the `[[mcp]]` servers with `defer = true`).
    #[must_use]
    pub fn hidden(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.hidden = Some(source);
        self
    }

    /// Tools deferred one by one (the `[[tools]]` entries with `defer = true`).
    #[must_use]
    pub fn deferred(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        self.deferred.extend(tools);
        self
    }

    /// Every deferred tool, found or not: the single ones first, then the hidden source's. Of
    /// two of one name only the first: a search shows it, and finding the name brings it in,
    /// never another tool under its description.
    pub fn deferred_tools(&self) -> Vec<Tool> {
        let mut out = self.deferred.clone();
        if let Some(hidden) = &self.hidden {
            out.extend(hidden.tools());
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|t| seen.insert(t.name().to_owned()));
        out
    }

    /// The deferred tools that best match `query`, best first (ties in catalog order), at most
    /// `limit`; none when no keyword of the query occurs in any.
    pub fn search(&self, query: &str, limit: usize) -> Vec<ToolSpec> {
        let tools = self.deferred_tools();
        let docs: Vec<Vec<String>> = tools.iter().map(|t| document(t.spec())).collect();
        let scores = bm25(&docs, &terms(query));
        let mut ranked: Vec<(usize, f64)> = scores
            .into_iter()
            .enumerate()
            .filter(|(_, s)| *s > 0.0)
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(limit)
            .filter_map(|(i, _)| tools.get(i).map(|t| t.spec().clone()))
            .collect()
    }

    /// The built-in `search_tools` over this set's deferred tools.
    pub fn search_tool(self: &Arc<Self>) -> Tool {
        let search = Arc::clone(self);
        Tool::builder(SEARCH_TOOLS)
            .description(
                "Finds tools that are not loaded yet by keywords matched against their names and \
                 descriptions. The tools it finds can be called from your next turn on.",
            )
            .idempotent(true)
            .dynamic(search_schema(), move |args: Value, _ctx| {
                let search = Arc::clone(&search);
                async move { search.answer(&args) }
            })
    }

    fn answer(&self, args: &Value) -> Result<ToolOutput, ToolError> {
        let query = args
            .get("query")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .ok_or_else(|| ToolError::new("invalid_query", "give a query of a few keywords"))?;
        let limit = match args.get("limit") {
            None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=MAX_SEARCH_LIMIT).contains(n))
                .ok_or_else(|| {
                    ToolError::new(
                        "invalid_limit",
                        format!("limit is a whole number from 1 to {MAX_SEARCH_LIMIT}"),
                    )
                })?,
        };
        let found: Vec<Value> = self
            .search(query, limit)
            .into_iter()
            .map(|s| json!({"name": s.name, "description": s.description}))
            .collect();
        self.searched.store(true, Ordering::Release);
        let note = if found.is_empty() {
            "No tool matches; try other keywords."
        } else {
            "These tools can be called from your next turn."
        };
        Ok(ToolOutput::json(json!({"found": found, "note": note})))
    }
}

impl ToolSource for ToolSearch {
    fn tools(&self) -> Vec<Tool> {
        self.tools_for(&[])
    }

    fn tools_for(&self, transcript: &[Message]) -> Vec<Tool> {
        let mut out = self.shown.as_ref().map(|s| s.tools()).unwrap_or_default();
        let found = found_in(transcript);
        if found.is_empty() {
            return out;
        }
        let mut deferred: HashMap<String, Tool> = self
            .deferred_tools()
            .into_iter()
            .map(|t| (t.name().to_owned(), t))
            .collect();
        // In the order they were found: a later find never moves an earlier one.
        out.extend(found.iter().filter_map(|name| deferred.remove(name)));
        out
    }

    fn refresh(&self) -> RefreshFuture<'_> {
        Box::pin(async move {
            let mut changed = self.searched.swap(false, Ordering::AcqRel);
            for source in [&self.shown, &self.hidden].into_iter().flatten() {
                changed |= source.refresh().await;
            }
            changed
        })
    }

    fn take_output(&self) -> Vec<(String, Vec<String>)> {
        [&self.shown, &self.hidden]
            .into_iter()
            .flatten()
            .flat_map(|s| s.take_output())
            .collect()
    }
}

/// The names the `search_tools` results of a transcript found, each once, in the order found.
pub fn found_in(transcript: &[Message]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for message in transcript {
        let Message::Tool(result) = message else {
            continue;
        };
        if &*result.tool != SEARCH_TOOLS || result.is_error {
            continue;
        }
        let parsed;
        let value = match &result.content {
            ToolContent::Json(v) => v,
            ToolContent::Text(t) => match serde_json::from_str::<Value>(t) {
                Ok(v) => {
                    parsed = v;
                    &parsed
                }
                Err(_) => continue,
            },
            ToolContent::Parts(_) => continue,
        };
        let names = value
            .get("found")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f.get("name").and_then(Value::as_str));
        for name in names {
            if !out.iter().any(|n| n == name) {
                out.push(name.to_owned());
            }
        }
    }
    out
}

fn search_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "A few keywords: what the tool should do."},
            "limit": {
                "type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT,
                "description": format!("The most tools to answer with (default {DEFAULT_SEARCH_LIMIT}).")
            }
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

/// A tool's words: its name's twice (a name says more than a word of prose), then its
/// description's.
fn document(spec: &ToolSpec) -> Vec<String> {
    let name = terms(&spec.name);
    let mut out = name.clone();
    out.extend(name);
    out.extend(terms(&spec.description));
    out
}

/// Lower-case words of letters and digits but the stop words; `snake_case`, `kebab-case` and
/// `camelCase` names split into their words; a plural's `s` dropped, so `forecasts` finds
/// `forecast`.
fn terms(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            push_word(&mut words, &mut word);
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            push_word(&mut words, &mut word);
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    push_word(&mut words, &mut word);
    words
}

/// Words too common to tell tools apart.
const STOP_WORDS: [&str; 22] = [
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "its", "of",
    "on", "or", "that", "the", "this", "to", "with",
];

fn push_word(words: &mut Vec<String>, word: &mut String) {
    let mut w = std::mem::take(word);
    if w.is_empty() || STOP_WORDS.contains(&w.as_str()) {
        return;
    }
    if w.len() > 4 && w.ends_with("ies") {
        w.truncate(w.len() - 3);
        w.push('y');
    } else if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") {
        w.pop();
    }
    words.push(w);
}

/// Okapi BM25 (k1 = 1.2, b = 0.75) of each document for the query's terms.
fn bm25(docs: &[Vec<String>], query: &[String]) -> Vec<f64> {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    let n = docs.len() as f64;
    let avg = docs.iter().map(Vec::len).sum::<usize>() as f64 / n.max(1.0);
    let mut unique: Vec<&String> = query.iter().collect();
    unique.sort();
    unique.dedup();
    let idf: Vec<f64> = unique
        .iter()
        .map(|t| {
            let with = docs.iter().filter(|d| d.contains(t)).count() as f64;
            (1.0 + (n - with + 0.5) / (with + 0.5)).ln()
        })
        .collect();
    docs.iter()
        .map(|doc| {
            let len = doc.len() as f64;
            unique
                .iter()
                .zip(&idf)
                .map(|(t, idf)| {
                    let tf = doc.iter().filter(|w| w == t).count() as f64;
                    if tf == 0.0 {
                        return 0.0;
                    }
                    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg.max(1.0)))
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use agentloop::message::ToolResult;

    use super::*;

    fn tool(name: &str, description: &str) -> Tool {
        Tool::builder(name)
            .description(description)
            .dynamic(json!({"type": "object"}), |_, _| async {
                Ok(ToolOutput::text("ran"))
            })
    }

    /// A source of tools that never change.
    struct Fixed(Vec<Tool>);

    impl ToolSource for Fixed {
        fn tools(&self) -> Vec<Tool> {
            self.0.clone()
        }

        fn refresh(&self) -> RefreshFuture<'_> {
            Box::pin(async { false })
        }
    }

    fn catalog() -> Arc<ToolSearch> {
        let shown = Fixed(vec![tool("always", "Always in the request.")]);
        Arc::new(ToolSearch::new().shown(Arc::new(shown)).deferred([
            tool("get_weather", "Reads the weather forecast for a city."),
            tool("convertCurrency", "Converts an amount between currencies."),
            tool("list_invoices", "Lists the invoices of a customer."),
            tool("send_invoice", "Sends one invoice to a customer by email."),
        ]))
    }

    fn names(specs: &[ToolSpec]) -> Vec<&str> {
        specs.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn terms_split_names_and_drop_plurals() {
        assert_eq!(
            terms("convertCurrency get_weather-Forecasts, cities 42"),
            [
                "convert", "currency", "get", "weather", "forecast", "city", "42"
            ]
        );
    }

    #[test]
    fn the_best_match_comes_first_and_words_in_no_tool_find_nothing() {
        let search = catalog();
        assert_eq!(
            names(&search.search("weather forecast", 5)),
            ["get_weather"]
        );
        assert_eq!(
            names(&search.search("currencies convert", 5)),
            ["convertCurrency"]
        );
        // Both invoice tools match; the one whose name says "send" and "email" wins.
        assert_eq!(
            names(&search.search("email an invoice", 5)),
            ["send_invoice", "list_invoices"]
        );
        assert_eq!(names(&search.search("invoice", 1)), ["list_invoices"]);
        assert!(search.search("zebra", 5).is_empty());
    }

    #[tokio::test]
    async fn collide_of_two_deferred_tools_of_one_name_the_first_is_found_and_brought_in() {
        let first = Tool::builder("lookup")
            .description("Looks up a customer.")
            .dynamic(json!({"type": "object"}), |_, _| async {
                Ok(ToolOutput::text("first"))
            });
        let second = Tool::builder("lookup")
            .description("Looks up and deletes a customer.")
            .mutating(true)
            .dynamic(json!({"type": "object"}), |_, _| async {
                Ok(ToolOutput::text("second"))
            });
        let search = ToolSearch::new()
            .deferred([first.clone()])
            .hidden(Arc::new(Fixed(vec![second])));
        let found = search.search("customer", 5);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0], *first.spec(), "the search shows the first");
        let transcript = [result(
            SEARCH_TOOLS,
            ToolContent::Json(json!({"found": [{"name": "lookup"}]})),
            false,
        )];
        let tools = search.tools_for(&transcript);
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].spec(), first.spec());
        let out = tools[0]
            .call(json!({}), agentloop::ToolContext::detached("c", "lookup"))
            .await
            .unwrap();
        assert_eq!(out.content.to_text(), "first", "the first's handler runs");
    }

    fn result(tool: &str, content: ToolContent, is_error: bool) -> Message {
        Message::Tool(ToolResult {
            call_id: Arc::from("c"),
            tool: Arc::from(tool),
            content,
            is_error,
        })
    }

    #[tokio::test]
    async fn found_tools_follow_the_shown_ones_in_the_order_found_and_a_search_lists_again() {
        let search = catalog();
        let tool = search.search_tool();
        let out = tool
            .call(
                json!({"query": "invoice email", "limit": 1}),
                agentloop::ToolContext::detached("c", SEARCH_TOOLS),
            )
            .await
            .unwrap();
        assert!(search.refresh().await, "a search asks for a new list");
        assert!(!search.refresh().await);
        let transcript = [
            result(
                SEARCH_TOOLS,
                ToolContent::Text(
                    json!({"found": [{"name": "get_weather"}]})
                        .to_string()
                        .into(),
                ),
                false,
            ),
            result(SEARCH_TOOLS, out.content, false),
            result(
                SEARCH_TOOLS,
                ToolContent::Json(json!({"found": [{"name": "list_invoices"}]})),
                true,
            ),
            result(
                "other",
                ToolContent::Json(json!({"found": [{"name": "list_invoices"}]})),
                false,
            ),
            result(
                SEARCH_TOOLS,
                ToolContent::Json(json!({"found": [{"name": "get_weather"}, {"name": "gone"}]})),
                false,
            ),
        ];
        assert_eq!(
            found_in(&transcript),
            ["get_weather", "send_invoice", "gone"]
        );
        let tools: Vec<String> = search
            .tools_for(&transcript)
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        assert_eq!(tools, ["always", "get_weather", "send_invoice"]);
        let before: Vec<String> = search.tools().iter().map(|t| t.name().to_owned()).collect();
        assert_eq!(before, ["always"], "nothing is found before a search");
    }

    #[tokio::test]
    async fn a_bad_query_or_limit_is_an_error_the_model_reads() {
        let tool = catalog().search_tool();
        for args in [
            json!({"query": "  "}),
            json!({"query": "x", "limit": 0}),
            json!({"query": "x", "limit": 11}),
            json!({}),
        ] {
            let err = tool
                .call(
                    args.clone(),
                    agentloop::ToolContext::detached("c", SEARCH_TOOLS),
                )
                .await
                .unwrap_err();
            assert!(
                matches!(err, ToolError::Recoverable { .. }),
                "{args}: {err:?}"
            );
        }
    }
}
