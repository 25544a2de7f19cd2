//! Listing a server's tools, page by page within bounds, and hearing that the list changed
//! (the `subscriptions/listen` stream of 2026-07-28, or the connection's own notification).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rmcp::Peer;
use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::{RoleClient, ServiceError};

use crate::McpError;
use crate::config::ServerConfig;

use super::{McpServer, scrubbed};

impl McpServer {
    /// At 2026-07-28 a server announces a change of its tools only on a `subscriptions/listen`
    /// stream: one is kept open while the connection lives, when the server says its list can
    /// change. Before that wire the announcement comes on the connection itself.
    pub(super) fn listen(&self, peer: &Peer<RoleClient>) -> Option<Listener> {
        let info = peer.peer_info()?;
        let announces = info
            .capabilities
            .tools
            .as_ref()
            .is_some_and(|t| t.list_changed == Some(true));
        if info.protocol_version.has_initialize() || !announces {
            return None;
        }
        let task = tokio::spawn(listen_for_tool_changes(
            peer.clone(),
            self.inner.changed.clone(),
            self.inner.config.clone(),
        ));
        Some(Listener(task))
    }

    /// Lists the tools. The flag is cleared first: a change announced while the list is under
    /// way is listed again next time rather than lost. A listing that fails, times out or is
    /// dropped (a run's deadline) sets it again: the change is still to be listed.
    pub(super) async fn list(&self, peer: &Peer<RoleClient>) -> Result<bool, McpError> {
        self.inner.changed.store(false, Ordering::Release);
        let mut unlisted = StillChanged(Some(&self.inner.changed));
        let timeout = self.inner.config.timeout;
        let listed = tokio::time::timeout(timeout, self.list_pages(peer))
            .await
            .map_err(|_| McpError::Timeout {
                server: self.name().to_owned(),
                what: "tools/list",
                secs: timeout.as_secs_f64(),
            })?
            .map_err(|e| McpError::Request {
                server: self.name().to_owned(),
                what: "tools/list",
                reason: scrubbed(&self.inner.config, &e.to_string()),
            })?;
        let mut kept = self
            .inner
            .listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let differs = *kept != listed;
        *kept = listed;
        unlisted.0 = None;
        Ok(differs)
    }

    /// Follows `nextCursor` page by page, within bounds: a server may page forever, repeat a
    /// cursor (which rmcp's response cache may then answer with no I/O at all) or list tools
    /// without end. Past [`MAX_LIST_PAGES`] pages or [`MAX_TOOLS`] tools, or at a cursor seen
    /// before, the listing ends there with a warning, keeping what came; a tool listed twice
    /// keeps its first entry; each tool is bounded by [`bounded_tool`].
    async fn list_pages(
        &self,
        peer: &Peer<RoleClient>,
    ) -> Result<Vec<rmcp::model::Tool>, ServiceError> {
        let server = self.name();
        let mut tools: Vec<rmcp::model::Tool> = Vec::new();
        let mut names = std::collections::HashSet::new();
        let mut cursors = std::collections::HashSet::new();
        let mut cursor = None;
        for page in 1..=MAX_LIST_PAGES {
            let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor.take());
            let listed = peer.list_tools(Some(params)).await?;
            for tool in listed.tools {
                if tools.len() == MAX_TOOLS {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server lists more than {MAX_TOOLS} tools: the rest are left out");
                    return Ok(tools);
                }
                if !names.insert(tool.name.clone()) {
                    tracing::warn!(target: "agentloop_mcp", server = %server, tool = %tool.name, "the server lists a tool twice: its first entry is kept");
                    continue;
                }
                if let Some(tool) = bounded_tool(server, tool) {
                    tools.push(tool);
                }
            }
            match listed.next_cursor {
                None => return Ok(tools),
                Some(next) if !cursors.insert(next.clone()) => {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server's tools/list repeats a cursor: the listing ends there");
                    return Ok(tools);
                }
                Some(_) if page == MAX_LIST_PAGES => {
                    tracing::warn!(target: "agentloop_mcp", server = %server, "the server's tools/list goes past {MAX_LIST_PAGES} pages: the rest are left out");
                }
                Some(next) => cursor = Some(next),
            }
        }
        Ok(tools)
    }
}

/// Marks the tool list stale again when dropped armed: a listing that did not complete.
struct StillChanged<'a>(Option<&'a AtomicBool>);

impl Drop for StillChanged<'_> {
    fn drop(&mut self) {
        if let Some(changed) = self.0 {
            changed.store(true, Ordering::Release);
        }
    }
}

/// The most pages one `tools/list` follows.
const MAX_LIST_PAGES: usize = 100;
/// The most tools one server lists.
const MAX_TOOLS: usize = 1000;
/// The longest tool description kept whole (longer ones keep their head and tail): the model
/// reads every description at every turn.
const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// The largest input and output schemas of one tool together, as JSON: a tool past it is left
/// out (a schema cut short would not be one).
const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// `tool` with its description (and title) cut to [`MAX_DESCRIPTION_BYTES`], or `None`, with a
/// warning, when its schemas are past [`MAX_SCHEMA_BYTES`].
fn bounded_tool(server: &str, mut tool: rmcp::model::Tool) -> Option<rmcp::model::Tool> {
    let schemas = serde_json::to_string(&tool.input_schema).map_or(0, |s| s.len())
        + tool
            .output_schema
            .as_ref()
            .and_then(|s| serde_json::to_string(s).ok())
            .map_or(0, |s| s.len());
    if schemas > MAX_SCHEMA_BYTES {
        tracing::warn!(target: "agentloop_mcp", server = %server, tool = %tool.name, "the tool's schemas are {schemas} bytes, past {MAX_SCHEMA_BYTES}: it is left out");
        return None;
    }
    let cut = |text: String| agentloop::tool::bounded_text(text, MAX_DESCRIPTION_BYTES);
    tool.description = tool.description.map(|d| cut(d.into_owned()).into());
    tool.title = tool.title.map(cut);
    Some(tool)
}

/// The task that holds a connection's `subscriptions/listen` stream; dropped with the
/// connection, it ends.
pub(super) struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How many times in a row a subscription may fail to open before the server's announcements
/// are given up (its tools are then listed once, as at a server that announces nothing).
const LISTEN_ATTEMPTS: u32 = 3;

/// The wait before a subscription that ended is opened again: doubled at each one that ends
/// early (before [`LISTEN_HEALTHY`]), up to [`LISTEN_REOPEN_MAX`]; a server that acknowledges
/// and ends its stream at once is asked again at most once a minute, not ten times a second
/// (each reopening marks the list stale, a listing the next turn).
const LISTEN_REOPEN_FIRST: Duration = Duration::from_millis(100);
const LISTEN_REOPEN_MAX: Duration = Duration::from_secs(60);
/// A subscription that lasted this long was a good one: the next reopening waits the least.
const LISTEN_HEALTHY: Duration = Duration::from_secs(60);

/// Keeps a `subscriptions/listen` stream for `notifications/tools/list_changed` open on `peer`,
/// marking the list stale at each. A stream that ends while the connection lives is opened
/// again, and the list is marked stale, since a change may have come between the two.
async fn listen_for_tool_changes(
    peer: Peer<RoleClient>,
    changed: Arc<AtomicBool>,
    config: ServerConfig,
) {
    let server = &config.name;
    let mut failures = 0;
    let mut reopen = LISTEN_REOPEN_FIRST;
    while !peer.is_transport_closed() && failures < LISTEN_ATTEMPTS {
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let mut subscription = match peer.listen(filter).await {
            Ok(s) if s.acknowledged().tools_list_changed == Some(true) => s,
            Ok(_) => {
                tracing::debug!(target: "agentloop_mcp", server = %server, "the server does not announce tool changes on a subscription");
                return;
            }
            Err(e) => {
                failures += 1;
                let error = scrubbed(&config, &e.to_string());
                tracing::warn!(target: "agentloop_mcp", server = %server, error = %error, "cannot listen for tool changes");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        failures = 0;
        let opened = std::time::Instant::now();
        loop {
            match subscription.next().await {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    tracing::debug!(target: "agentloop_mcp", server = %server, "tools/list_changed");
                    changed.store(true, Ordering::Release);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        changed.store(true, Ordering::Release);
        reopen = if opened.elapsed() >= LISTEN_HEALTHY {
            LISTEN_REOPEN_FIRST
        } else {
            (reopen * 2).min(LISTEN_REOPEN_MAX)
        };
        tracing::debug!(target: "agentloop_mcp", server = %server, "the tool-change subscription ended; opened again in {:.1} s", reopen.as_secs_f64());
        tokio::time::sleep(reopen).await;
    }
}
