//! Defensive redaction of recorded JSON payloads. Events carry no secrets by design; still, a tool
//! may echo a header or a key in its arguments or output, so every object key that looks like a
//! credential has its value replaced, and so has any string that is a bearer credential.

use serde_json::Value;

/// What a redacted value becomes.
pub const REDACTED: &str = "[redacted]";

/// Key names (lowercase, `-` read as `_`) whose values are always secret.
const SECRET_KEYS: &[&str] = &[
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "x_api_key",
    "x_goog_api_key",
    "private_key",
    "client_secret",
    "bearer",
];

/// Key endings that mark a secret (`openai_api_key`, `access_token`, `db_password`).
const SECRET_SUFFIXES: &[&str] = &[
    "_api_key",
    "_apikey",
    "_token",
    "_secret",
    "_password",
    "_private_key",
];

/// True when an object key names a credential.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase().replace('-', "_");
    SECRET_KEYS.contains(&k.as_str()) || SECRET_SUFFIXES.iter().any(|s| k.ends_with(s))
}

/// True when a string is itself a credential (`Bearer ...`).
fn is_secret_string(s: &str) -> bool {
    let t = s.trim_start();
    t.len() > 7
        && t.get(..7)
            .is_some_and(|p| p.eq_ignore_ascii_case("bearer "))
}

/// Returns the value with every secret-looking key's value, and every bearer string, replaced by
/// [`REDACTED`], at any depth.
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !v.is_null() {
                        Value::String(REDACTED.into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::String(s) if is_secret_string(s) => Value::String(REDACTED.into()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credential_keys_are_redacted_at_any_depth() {
        let v = json!({
            "city": "Paris",
            "api_key": "sk-live-123",
            "headers": {"Authorization": "Basic abc", "X-Api-Key": "k", "Content-Type": "application/json"},
            "nested": [{"OPENAI_API_KEY": "sk-x", "access_token": "t", "max_tokens": 5, "input_tokens": 7}],
            "db-password": "hunter2"
        });
        let r = redact(&v);
        assert_eq!(r["city"], "Paris");
        assert_eq!(r["api_key"], REDACTED);
        assert_eq!(r["headers"]["Authorization"], REDACTED);
        assert_eq!(r["headers"]["X-Api-Key"], REDACTED);
        assert_eq!(r["headers"]["Content-Type"], "application/json");
        assert_eq!(r["nested"][0]["OPENAI_API_KEY"], REDACTED);
        assert_eq!(r["nested"][0]["access_token"], REDACTED);
        assert_eq!(r["nested"][0]["max_tokens"], 5);
        assert_eq!(r["nested"][0]["input_tokens"], 7);
        assert_eq!(r["db-password"], REDACTED);
        assert!(!r.to_string().contains("sk-"));
        assert!(!r.to_string().contains("hunter2"));
    }

    #[test]
    fn bearer_strings_are_redacted_wherever_they_are() {
        let r = redact(&json!({"h": ["bearer abc.def"], "note": "a Bearer token is needed"}));
        assert_eq!(r["h"][0], REDACTED);
        assert_eq!(r["note"], "a Bearer token is needed");
    }
}
