//! A response cache: [`CachedModel`] wraps a model and answers a request it has answered before
//! from a [`ResponseCache`], keyed by the exact request (the provider and model, instructions,
//! messages, tools, output schema and settings) and by what the request is on the wire: the
//! server it goes to and the body it encodes to, so that two servers answering to one model
//! name, or two encodings of one request (a tool dialect, reasoning sent back or not, a prompt
//! cache key), never share answers. The wrapped model says what that is
//! ([`Model::cache_identity`]: every provider of `agentloop-providers` does, and retry and
//! fallback pass theirs on); a builder that knows better gives it instead
//! ([`CachedModel::keyed_by_wire`]). A model that can say neither is keyed by its names alone,
//! and the cache warns of it once. Only digests go into a key: a key in a URL or a header is
//! never kept in clear. Concurrent identical requests are sent once and
//! share the answer (single flight). An answer that did not come from the model this time is
//! marked: [`ModelResponse::cached`] (priced at zero, its input tokens reported as cached), and
//! it streams as deltas like a fresh one. Failed, refused, filtered and cut-off answers are
//! never kept.
//!
//! An answer is kept with the model call that paid for it (its run's id and the call's number
//! in the run, when a driver says so: [`as_call`]). A durable run killed after the model
//! answered and before its journal kept the answer asks that call again when it resumes; the
//! cache holds the answer the killed process paid for, whose spend no journal counted. Served
//! to that same call, it is that call's own answer, not a free one: it is not marked cached, and
//! its tokens and cost count as they would have, as in the run that was never killed. Served to
//! any other call, it is free.
//!
//! `agentloop-store` has a SQLite cache with a time to live.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream;
use tokio::sync::OnceCell;

use super::{
    CacheIdentity, FinishReason, Model, ModelError, ModelEvent, ModelRequest, ModelResponse,
    ModelStream, ResponseAccumulator,
};

/// Where cached answers are kept. A failing store never fails a model call: the call goes to
/// the model.
pub trait ResponseCache: Send + Sync {
    /// The answer kept under `key`, unless it expired.
    fn get(&self, key: &str) -> Result<Option<ModelResponse>, String>;
    /// Keeps `response` under `key` for `ttl`.
    fn put(&self, key: &str, response: &ModelResponse, ttl: Duration) -> Result<(), String>;

    /// [`ResponseCache::get`], with the model call that paid for the answer when the store
    /// keeps it ([`ResponseCache::put_paid`]). By default none is kept.
    fn get_paid(&self, key: &str) -> Result<Option<(ModelResponse, Option<String>)>, String> {
        Ok(self.get(key)?.map(|response| (response, None)))
    }

    /// [`ResponseCache::put`], with the model call that paid for the answer (see the module's
    /// docs): a store that keeps it gives it back with [`ResponseCache::get_paid`]. By default
    /// it is not kept.
    fn put_paid(
        &self,
        key: &str,
        response: &ModelResponse,
        paid_by: Option<&str>,
        ttl: Duration,
    ) -> Result<(), String> {
        let _ = paid_by;
        self.put(key, response, ttl)
    }
}

tokio::task_local! {
    /// The model call being made on this task ([`as_call`]).
    static CALL: Arc<str>;
}

/// Runs `call_future` as model call `call` (a run's id and the call's number in it, the same
/// when a resumed run makes that call again): an answer the cache keeps for it says so, so
/// that the call made again counts the spend its first making paid (see the module's docs).
pub async fn as_call<F: std::future::Future>(call: Arc<str>, call_future: F) -> F::Output {
    CALL.scope(call, call_future).await
}

/// The model call being made on this task, when its driver said so.
fn current_call() -> Option<Arc<str>> {
    CALL.try_with(Arc::clone).ok()
}

type Flight = Arc<OnceCell<Result<ModelResponse, ModelError>>>;

/// What a request is on the wire, for the cache key: the server it is sent to and its encoded
/// body (see [`CachedModel::keyed_by_wire`]). `None` when it cannot be told (the key is then
/// the request's alone).
pub type WireKey = Arc<dyn Fn(&ModelRequest<'_>) -> Option<serde_json::Value> + Send + Sync>;

/// A model whose answers are cached (see the module's docs).
pub struct CachedModel {
    inner: Arc<dyn Model>,
    cache: Arc<dyn ResponseCache>,
    ttl: Duration,
    flights: Mutex<HashMap<String, Flight>>,
    wire: Option<WireKey>,
    /// Whether keying by names alone was warned of (once a cache).
    warned: AtomicBool,
}

impl std::fmt::Debug for CachedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedModel")
            .field("model", &self.inner.id())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl CachedModel {
    /// `inner`, its answers kept in `cache` for `ttl`.
    pub fn new(inner: Arc<dyn Model>, cache: Arc<dyn ResponseCache>, ttl: Duration) -> Self {
        CachedModel {
            inner,
            cache,
            ttl,
            flights: Mutex::new(HashMap::new()),
            wire: None,
            warned: AtomicBool::new(false),
        }
    }

    /// Keys answers by what each request is on the wire as `wire` tells it (the server a
    /// request goes to and the body it encodes to), instead of the model's own
    /// [`Model::cache_identity`]. Options that change the request on the wire without changing
    /// the [`ModelRequest`] (a base URL, a tool dialect, reasoning fields, a prompt cache key)
    /// then keep their answers apart. `wire`'s value is hashed into the key, never kept.
    #[must_use]
    pub fn keyed_by_wire(mut self, wire: WireKey) -> Self {
        self.wire = Some(wire);
        self
    }

    /// The key of `request`: the request's own, and what it is on the wire: as the builder's
    /// `wire` tells it, else as the model does. Keyed by names alone, the cache says so once.
    fn key(&self, request: &ModelRequest<'_>) -> String {
        let key = request_key(self.inner.provider(), self.inner.id(), request);
        let (part, value) = match &self.wire {
            Some(wire) => ("wire", wire(request)),
            None => (
                "identity",
                self.inner
                    .cache_identity(request)
                    .map(|i| serde_json::Value::String(i.as_str().to_owned())),
            ),
        };
        let Some(value) = value else {
            if self.wire.is_none() && !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    model = self.inner.id(),
                    provider = self.inner.provider(),
                    "the response cache keys this model by its name alone: it does not say \
                     which server it asks, so another model of that name sharing the store \
                     could be given its answers"
                );
            }
            return key;
        };
        let mut d = crate::fingerprint::Definition::new();
        d.set("request", serde_json::Value::String(key));
        d.set(part, value);
        d.fingerprint()
    }

    async fn answer(&self, request: ModelRequest<'_>) -> Vec<Result<ModelEvent, ModelError>> {
        let key = self.key(&request);
        let call = current_call();
        if let Ok(Some((response, paid_by))) = self.cache.get_paid(&key) {
            // This very call's answer, paid for by a process that died before its journal
            // counted it: its spend is this call's own.
            let own = call.is_some() && paid_by.as_deref() == call.as_deref();
            return replay(response, !own);
        }
        let flight: Flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(flights.entry(key.clone()).or_default())
        };
        let led = AtomicBool::new(false);
        let result = flight
            .get_or_init(|| {
                led.store(true, Ordering::Relaxed);
                self.ask(request)
            })
            .await
            .clone();
        let led = led.load(Ordering::Relaxed);
        if led {
            self.flights
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            if let Ok(response) = &result
                && keepable(response)
            {
                // A cache that cannot keep it costs a later call, never this one.
                let _ = self
                    .cache
                    .put_paid(&key, response, call.as_deref(), self.ttl);
            }
        }
        match result {
            Ok(response) => replay(response, !led),
            Err(e) => vec![Err(e)],
        }
    }

    async fn ask(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let mut stream = self.inner.stream(request);
        let mut acc = ResponseAccumulator::new();
        while let Some(event) = stream.next().await {
            acc.push(event?)?;
        }
        acc.finish()
    }
}

impl Model for CachedModel {
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// The same cache over the model as resumed.
    fn resumed(&self, model_calls: usize) -> Option<Arc<dyn Model>> {
        let inner = self.inner.resumed(model_calls)?;
        Some(Arc::new(CachedModel {
            inner,
            cache: Arc::clone(&self.cache),
            ttl: self.ttl,
            flights: Mutex::default(),
            wire: self.wire.clone(),
            warned: AtomicBool::new(self.warned.load(Ordering::Relaxed)),
        }))
    }

    /// The wrapped model's: a cache over a cache asks what the inner one asks.
    fn cache_identity(&self, request: &ModelRequest<'_>) -> Option<CacheIdentity> {
        self.inner.cache_identity(request)
    }

    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn keeps_answers(&self) -> bool {
        true
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        Box::pin(stream::once(self.answer(request)).flat_map(stream::iter))
    }
}

/// Only a complete answer is kept.
fn keepable(r: &ModelResponse) -> bool {
    !r.truncated
        && r.cut_calls.is_empty()
        && matches!(
            r.finish_reason,
            FinishReason::Stop | FinishReason::ToolCalls
        )
}

/// A kept answer as stream events, marked as not coming from the model this time.
fn replay(mut response: ModelResponse, cached: bool) -> Vec<Result<ModelEvent, ModelError>> {
    if cached {
        response.usage.cached_input_tokens = response.usage.input_tokens;
    }
    let mut events = super::replay_events(&response);
    if cached {
        events.insert(0, Ok(ModelEvent::Cached));
    }
    events
}

/// The key of a request: `sha256:` and the digest of its canonical JSON.
pub fn request_key(provider: &str, model: &str, request: &ModelRequest<'_>) -> String {
    let value = serde_json::json!({
        "provider": provider,
        "model": model,
        "instructions": request.instructions,
        "messages": request.messages,
        "tools": request.tools,
        "output_schema": request.output_schema,
        "settings": request.settings,
    });
    let mut d = crate::fingerprint::Definition::new();
    d.set("request", value);
    d.fingerprint()
}
