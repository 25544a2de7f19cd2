//! Call ids: every id of a response made unique within the run before the step is logged, so
//! that a replay renames alike.

use std::sync::Arc;

use super::{MAX_CALL_ID_LEN, RunMachine};
use crate::message::Message;
use crate::model::ModelResponse;

/// The run's call ids, looked up three times a call.
pub(super) type CallIds = std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>;

/// The names of the tools a run called, one shared copy each (see `RunMachine::tool_names`).
/// Only the catalog's tools are kept, so it holds at most as many as the catalog does; a run
/// calls a few, so they are looked up in order.
#[derive(Debug, Default)]
pub(super) struct ToolNames(Vec<Arc<str>>);

impl ToolNames {
    /// The run's copy of a catalog tool's name, made at the first call of the tool.
    pub(super) fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(kept) = self.0.iter().find(|kept| ***kept == *name) {
            return Arc::clone(kept);
        }
        let kept: Arc<str> = Arc::from(name);
        self.0.push(Arc::clone(&kept));
        kept
    }
}

impl RunMachine {
    /// Makes every call id of a response unique within the run: a blank id is drawn from the
    /// run's id source, and an id an earlier response of the run (or the transcript it
    /// continued) already used is renamed `ID_2` (`ID_3`, ... the first one free), the same new
    /// id for each call that repeats it. Providers reject a transcript with a repeated id, a
    /// stored session holding one reads as damaged, and an approval must never be found again
    /// under an old call's id. The rename depends only on the run's ids so far, so a replay
    /// renames alike; two calls of one response sharing an id keep sharing it (that decision is
    /// refused whole, as before). Ids too long to keep are left for that refusal too.
    pub(super) fn assign_call_ids(&self, response: &mut ModelResponse) {
        let calls = || {
            response
                .message
                .tool_calls
                .iter()
                .chain(&response.cut_calls)
        };
        let blank = calls().any(|c| c.call_id.trim().is_empty());
        let repeated = calls().any(|c| self.call_ids.contains(&*c.call_id));
        if !blank && !repeated {
            return;
        }
        let all = response
            .message
            .tool_calls
            .iter_mut()
            .chain(response.cut_calls.iter_mut());
        let mut calls: Vec<&mut crate::message::ToolCall> = all.collect();
        for call in calls.iter_mut() {
            if call.call_id.trim().is_empty() {
                call.call_id = self.ids.call_id().into();
            }
        }
        let mut taken: std::collections::HashSet<Arc<str>> =
            calls.iter().map(|c| Arc::clone(&c.call_id)).collect();
        let mut renamed: std::collections::HashMap<Arc<str>, Arc<str>> =
            std::collections::HashMap::new();
        for call in calls {
            if call.call_id.len() > MAX_CALL_ID_LEN || !self.call_ids.contains(&*call.call_id) {
                continue;
            }
            let new = match renamed.get(&call.call_id) {
                Some(new) => new.clone(),
                None => {
                    let new: Arc<str> = fresh_call_id(&call.call_id, |id| {
                        self.call_ids.contains(id) || taken.contains(id)
                    })
                    .into();
                    taken.insert(Arc::clone(&new));
                    renamed.insert(Arc::clone(&call.call_id), Arc::clone(&new));
                    new
                }
            };
            call.call_id = new;
        }
    }

    /// Notes the call ids of a response the machine took, after [`RunMachine::assign_call_ids`].
    pub(super) fn note_call_ids(&mut self, response: &ModelResponse) {
        if self.call_ids.capacity() == 0 && !response.message.tool_calls.is_empty() {
            // A run that calls tools calls several: room for 14 at the first call, where the
            // set grown from empty took five allocations for 30 calls (capacities 3, 7, 14, 28,
            // 56) and three now.
            self.call_ids.reserve(FIRST_CALL_IDS);
        }
        for call in response
            .message
            .tool_calls
            .iter()
            .chain(&response.cut_calls)
        {
            if !self.call_ids.contains(&call.call_id) {
                self.call_ids.insert(Arc::clone(&call.call_id));
            }
        }
    }
}

/// The room the run's set of call ids takes at its first call: what 16 buckets hold.
const FIRST_CALL_IDS: usize = 14;

/// The call ids a transcript holds: its calls' and its results'.
pub(super) fn transcript_call_ids(transcript: &[Message]) -> CallIds {
    let mut ids = CallIds::default();
    for message in transcript {
        match message {
            Message::Assistant(a) => {
                ids.extend(a.tool_calls.iter().map(|c| Arc::clone(&c.call_id)))
            }
            Message::Tool(r) => {
                ids.insert(Arc::clone(&r.call_id));
            }
            Message::User { .. } => {}
        }
    }
    ids
}

/// `id_2`, `id_3`, ...: the first one not `taken`, at most [`MAX_CALL_ID_LEN`] bytes long (the
/// original shortened at a character boundary so that the suffix fits). The characters added
/// are ones every provider accepts in an id (Anthropic allows `[a-zA-Z0-9_-]`).
pub(super) fn fresh_call_id(id: &str, taken: impl Fn(&str) -> bool) -> String {
    (2u64..)
        .map(|n| {
            let suffix = format!("_{n}");
            let mut keep = MAX_CALL_ID_LEN.saturating_sub(suffix.len()).min(id.len());
            while !id.is_char_boundary(keep) {
                keep -= 1;
            }
            format!("{}{suffix}", id.get(..keep).unwrap_or_default())
        })
        .find(|candidate| !taken(candidate))
        .unwrap_or_default()
}
