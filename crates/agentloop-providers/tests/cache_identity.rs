//! The response cache as a library caller builds it, `CachedModel::new(provider, store, ttl)`
//! with nothing more: two servers on loopback answering differently under one model name, one
//! SQLite cache file. Each model gets its own server's answer, whether the provider is bare or
//! behind retry or fallback, and the cache file holds no secret of the URL or headers.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::Arc;
use std::time::Duration;

use agentloop::Model;
use agentloop::model::cache::{CachedModel, ResponseCache};
use agentloop_providers::{Fallback, OpenAiChat, Retry};
use agentloop_store::SqliteResponseCache;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

mod support;
use support::ask;

const SECRET: &str = "sk-cache-secret-0123456789";

/// A server that answers `text` once to a whole (not streamed) chat completion request.
async fn server(text: &str) -> MockServer {
    let server = MockServer::start().await;
    let body = json!({
        "id": "c", "object": "chat.completion", "created": 0, "model": "local",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    });
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(1)
        .mount(&server)
        .await;
    server
}

/// The chat model named `local` at `server`, a secret in its URL's query and in a header.
fn chat(server: &MockServer) -> OpenAiChat {
    OpenAiChat::compatible(
        "local",
        format!("{}/v1?key={SECRET}", server.uri()),
        "local",
    )
    .header("x-gateway-token", SECRET)
    .stream(false)
    .build()
    .unwrap()
}

/// How a provider is wrapped before the cache wraps it.
type Wrap = fn(OpenAiChat) -> Arc<dyn Model>;

#[tokio::test]
async fn honest5_two_servers_of_one_model_name_never_share_a_cache_file_s_answers() {
    let wraps: [(&str, Wrap); 3] = [
        ("bare", |m| Arc::new(m)),
        ("retry", |m| Arc::new(Retry::new(m))),
        ("fallback", |m| {
            Arc::new(Fallback::new(vec![Box::new(Retry::new(m))]))
        }),
    ];
    for (wrap, wrapped) in wraps {
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cache-identity-{wrap}-{}.db", std::process::id()));
        let _ = std::fs::remove_file(&file);
        let store: Arc<dyn ResponseCache> = Arc::new(SqliteResponseCache::open(&file).unwrap());
        let (a, b) = (server("from A").await, server("from B").await);
        let ttl = Duration::from_secs(600);
        let model_a = CachedModel::new(wrapped(chat(&a)), Arc::clone(&store), ttl);
        let model_b = CachedModel::new(wrapped(chat(&b)), Arc::clone(&store), ttl);

        let first_a = ask(&model_a).await.unwrap();
        assert_eq!(first_a.message.text, "from A", "{wrap}");
        assert!(!first_a.cached, "{wrap}");
        let first_b = ask(&model_b).await.unwrap();
        assert_eq!(
            first_b.message.text, "from B",
            "{wrap}: server B's model was given server A's answer"
        );
        assert!(!first_b.cached, "{wrap}");
        // Each server is asked once: the second asks come from the one file, each its own.
        let again_a = ask(&model_a).await.unwrap();
        let again_b = ask(&model_b).await.unwrap();
        assert_eq!(
            (again_a.message.text.as_str(), again_a.cached),
            ("from A", true),
            "{wrap}"
        );
        assert_eq!(
            (again_b.message.text.as_str(), again_b.cached),
            ("from B", true),
            "{wrap}"
        );
        a.verify().await;
        b.verify().await;

        drop((model_a, model_b, store));
        let kept = std::fs::read(&file).unwrap();
        let wal = std::fs::read(file.with_extension("db-wal")).unwrap_or_default();
        for bytes in [&kept, &wal] {
            assert!(
                !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "{wrap}: the cache file holds the secret"
            );
        }
        let _ = std::fs::remove_file(&file);
    }
}
