//! Tools that may change while an agent runs ([`ToolSource`]): an MCP server's, which says so
//! with `tools/list_changed`. The core knows only this trait; the machine asks for the source's
//! tools at each turn boundary ([`crate::machine::Action::ListTools`]) and the driver answers
//! with their specs, so a run sees a new list from its next turn on and a replay reproduces it.

use std::future::Future;
use std::pin::Pin;

use super::Tool;
use crate::message::Message;

/// What [`ToolSource::refresh`] returns.
pub type RefreshFuture<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// A source of tools that may change between turns of a run. The agent registers its tools as
/// it is built ([`crate::AgentBuilder::tool_source`]); before each turn the driver asks it to
/// [`refresh`](ToolSource::refresh) and hands the machine the specs of its
/// [`tools`](ToolSource::tools) when they differ from the run's.
pub trait ToolSource: Send + Sync {
    /// The tools as last listed. No I/O: it is asked while the agent is built, too.
    fn tools(&self) -> Vec<Tool>;

    /// The tools a run with this transcript has: [`tools`](ToolSource::tools) unless the
    /// source keeps some back until the run finds them (deferred tools, found by a search whose
    /// results are in the transcript). Deriving them from the transcript makes them part of
    /// the run's state: a resumed run has the same ones, and two runs never share them. No I/O.
    fn tools_for(&self, transcript: &[Message]) -> Vec<Tool> {
        let _ = transcript;
        self.tools()
    }

    /// Lists the tools again where the source learned they changed; true when it did. Called
    /// before each turn of a run, so it must be cheap when nothing changed.
    fn refresh(&self) -> RefreshFuture<'_>;

    /// What the source wrote for the operator since it was last asked (a server's stderr
    /// outside any call), by origin: it goes to the run's events, never to the model.
    fn take_output(&self) -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
}

// A source is held behind an `Arc<dyn ToolSource>`: the trait must stay object-safe.
const _: Option<&dyn ToolSource> = None;
