//! Fallback over an ordered list of models: when one fails with a transient or context-length
//! error, the next one is tried, whether or not events of the failed response had reached the
//! caller (they are then discarded, as a [`agentloop::model::ModelEvent::Retrying`] says).
//!
//! Put each model's own [`Retry`](crate::Retry) inside the fallback (`Fallback::new(vec![
//! Box::new(Retry::new(primary)), Box::new(Retry::new(backup))])`), so a model is abandoned only
//! after its retries. The fallback itself never waits and never retries a model.

use agentloop::{
    Model, ModelError,
    model::{CacheIdentity, ModelRequest, ModelStream},
};

use super::retry::{NextAttempt, with_attempts};

/// Tries models in order until one answers.
pub struct Fallback {
    models: Vec<Box<dyn Model>>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.models.iter().map(|m| m.id()))
            .finish()
    }
}

impl Fallback {
    /// A fallback over `models`, the first being the primary. An empty list is allowed; its
    /// calls fail with [`agentloop::model::ModelErrorKind::Exhausted`].
    pub fn new(models: Vec<Box<dyn Model>>) -> Self {
        Fallback { models }
    }

    /// Adds a model at the end of the list.
    #[must_use]
    pub fn then(mut self, model: impl Model + 'static) -> Self {
        self.models.push(Box::new(model));
        self
    }

    /// The models, in order.
    pub fn models(&self) -> &[Box<dyn Model>] {
        &self.models
    }

    /// True when an error of one model should send the call to the next: a transient or
    /// context-length one, even part-way through the response (what streamed is discarded).
    pub fn falls_through(error: &ModelError) -> bool {
        error.is_transient() || error.is_context_length()
    }
}

impl Model for Fallback {
    /// The primary model's id (a response names the model that actually answered).
    fn id(&self) -> &str {
        self.models.first().map_or("fallback", |m| m.id())
    }

    fn provider(&self) -> &str {
        self.models.first().map_or("fallback", |m| m.provider())
    }

    /// Every model's in order (any of them may answer); `None` when one cannot say.
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        CacheIdentity::all(self.models.iter().map(|m| m.cache_identity(request)))
    }

    /// Whether any of its models keeps answers (any of them may answer).
    fn keeps_answers(&self) -> bool {
        self.models.iter().any(|m| m.keeps_answers())
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let Some(first) = self.models.first() else {
            let error = ModelError::new(
                agentloop::model::ModelErrorKind::Exhausted,
                "the fallback list holds no model",
            );
            return Box::pin(futures::stream::iter([Err(error)]));
        };
        let mut index = 0usize;
        with_attempts(first.stream(request), move |error| {
            if !Self::falls_through(error) {
                return None;
            }
            let next = self.models.get(index + 1)?;
            tracing::warn!(
                from = self.models.get(index).map(|m| m.id()),
                to = next.id(),
                code = error.code(),
                "model failed; falling back"
            );
            index += 1;
            Some(NextAttempt {
                wait: std::time::Duration::ZERO,
                stream: next.stream(request),
                retry: u32::try_from(index).unwrap_or(u32::MAX),
                model: next.id(),
            })
        })
    }
}
