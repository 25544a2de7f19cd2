#![allow(clippy::unwrap_used)]
//! A response cache under a retry or a fallback still names each model call of a run: the
//! driver asks the outermost model whether it keeps answers (`Model::keeps_answers`), and a
//! layer that did not forward the question would leave a cache inside it unable to tell a
//! resumed run's own paid answer from another run's (its spend lost on resume).

use std::sync::Arc;
use std::time::Duration;

use agentloop::model::cache::{CachedModel, ResponseCache};
use agentloop::testing::ScriptedModel;
use agentloop::{Model, ModelResponse};
use agentloop_providers::{Fallback, Retry};

/// A cache that keeps nothing: what is asked here is only whether the layers say one is there.
struct Nothing;

impl ResponseCache for Nothing {
    fn get(&self, _key: &str) -> Result<Option<ModelResponse>, String> {
        Ok(None)
    }
    fn put(&self, _key: &str, _response: &ModelResponse, _ttl: Duration) -> Result<(), String> {
        Ok(())
    }
}

fn plain() -> Arc<dyn Model> {
    Arc::new(ScriptedModel::new([ModelResponse::text("ok")]))
}

fn cached() -> Arc<dyn Model> {
    Arc::new(CachedModel::new(
        plain(),
        Arc::new(Nothing),
        Duration::from_secs(60),
    ))
}

#[test]
fn retry_and_fallback_say_whether_a_model_inside_them_keeps_answers() {
    assert!(!plain().keeps_answers());
    assert!(cached().keeps_answers());
    assert!(!Retry::new(plain()).keeps_answers());
    assert!(Retry::new(cached()).keeps_answers());
    assert!(!Fallback::new(vec![Box::new(plain()), Box::new(plain())]).keeps_answers());
    assert!(Fallback::new(vec![Box::new(plain()), Box::new(Retry::new(cached()))]).keeps_answers());
}
