//! What a model's answers depend on beyond the request itself: the server it asks and how it
//! encodes the request ([`CacheIdentity`], from [`super::Model::cache_identity`]). A response
//! cache keys by it, so two servers answering to one model name never share answers. It holds
//! a digest only: a URL with a key in it, or a header carrying a token, is never kept in clear.

use serde_json::Value;

/// A digest of what decides a model's answer to a request besides the request: the server's
/// URL, the headers sent, the encoded body (a tool dialect, reasoning sent back or not). Only
/// the digest is kept, so whatever secret went into it cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheIdentity(String);

impl CacheIdentity {
    /// The identity of `what` (any JSON: a URL, headers, a body), as the digest of its
    /// canonical form.
    pub fn of(what: &Value) -> CacheIdentity {
        CacheIdentity(crate::fingerprint::fingerprint(what))
    }

    /// The identity of a model made of several (a fallback chain): every one of them, in order;
    /// `None` when any one cannot say, since its answers could then be another server's.
    pub fn all(parts: impl IntoIterator<Item = Option<CacheIdentity>>) -> Option<CacheIdentity> {
        let parts: Option<Vec<Value>> = parts
            .into_iter()
            .map(|p| p.map(|p| Value::String(p.0)))
            .collect();
        Some(CacheIdentity::of(&Value::Array(parts?)))
    }

    /// The digest (`sha256:…`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
