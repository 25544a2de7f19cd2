#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! With an identity key, the endpoint answers only requests its Restate server signed: an
//! unsigned request (from whoever else reaches the address) is refused before any service code
//! runs. Without one, the same request reaches the endpoint.

use std::sync::Arc;

use agentloop::Agent;
use agentloop_restate::{Agents, EndpointOptions};

struct NoAgents;

impl Agents for NoAgents {
    fn agent(&self, name: &str) -> Result<Agent, String> {
        Err(format!("no agent {name}"))
    }
}

/// The status of an unsigned discovery request (HTTP/2, as Restate speaks) to an endpoint
/// served with `keys`.
async fn unsigned_discovery(keys: Vec<String>) -> u16 {
    let mut options = EndpointOptions::default();
    options.identity_keys = keys;
    let endpoint = agentloop_restate::endpoint(Arc::new(NoAgents), options).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(agentloop_restate::serve(endpoint, listener, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let status = client
        .get(format!("http://{addr}/discover"))
        .header("accept", "application/vnd.restate.endpointmanifest.v1+json")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    let _ = stop.send(());
    let _ = server.await;
    status
}

/// A public key in Restate's form (the SDK's documentation's example).
const KEY: &str = "publickeyv1_ChjENKeMvCtRnqG2mrBK1HmPKufgFUc98K8B3ononQvp";

#[tokio::test(flavor = "multi_thread")]
async fn an_unsigned_request_is_refused_only_where_a_key_is_set() {
    assert_eq!(unsigned_discovery(vec![KEY.to_owned()]).await, 401);
    assert_ne!(unsigned_discovery(Vec::new()).await, 401);
}

#[test]
fn a_key_that_is_not_one_is_refused_with_its_code() {
    let mut options = EndpointOptions::default();
    options.identity_keys = vec!["publickeyv1_not-base58!".to_owned()];
    let err = agentloop_restate::endpoint(Arc::new(NoAgents), options)
        .err()
        .expect("a bad key is refused");
    assert_eq!(err.code(), "restate.identity_key");
}
