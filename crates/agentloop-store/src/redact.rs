//! Defensive redaction of recorded payloads. Events carry no secrets by design; still, a tool may
//! echo a header or a key in its arguments or output, so every object key that looks like a
//! credential has its value replaced, and so has any string that is a bearer credential. Text
//! (a tool's text output, strings inside JSON) has header-like lines (`Authorization: ...`,
//! `OPENAI_API_KEY=...`) cut after the key, and text that is itself JSON is redacted as JSON.

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

/// Redacts text: JSON text as JSON; otherwise every line that reads `KEY: value` or `KEY=value`
/// with a credential-like key keeps only its key, and bearer strings go whole. The credentials of
/// a URL (`https://user:token@host`) go in any text.
pub fn redact_text(text: &str) -> String {
    match strip_url_credentials(text) {
        Some(stripped) => redact_lines(&stripped),
        None => redact_lines(text),
    }
}

/// The text with the user and password of every URL in it replaced, or `None` when it has none.
fn strip_url_credentials(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends where the path, query, fragment or the URL itself does.
        let end = tail
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>') || c.is_whitespace()
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(userinfo) if userinfo > 0 => {
                out.push_str(REDACTED);
                out.push_str(&authority[userinfo..]);
                changed = true;
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

fn redact_lines(text: &str) -> String {
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Ok(v) = serde_json::from_str::<Value>(trimmed)
    {
        let r = redact(&v);
        return if r == v {
            text.to_owned()
        } else {
            r.to_string()
        };
    }
    if is_secret_string(text) {
        return REDACTED.into();
    }
    let mut changed = false;
    let lines: Vec<String> = text
        .split('\n')
        .map(|line| match line.find([':', '=']) {
            Some(at)
                if is_secret_key(
                    line[..at]
                        .trim()
                        .trim_matches(['"', '\''])
                        .trim_start_matches("export "),
                ) =>
            {
                changed = true;
                format!("{}{} {REDACTED}", &line[..at], &line[at..=at])
            }
            _ => line.to_owned(),
        })
        .collect();
    if changed {
        lines.join("\n")
    } else {
        text.to_owned()
    }
}

/// Returns the value with every secret-looking key's value, and every bearer string, replaced by
/// [`REDACTED`], at any depth; strings are redacted as text (see [`redact_text`]).
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
        Value::String(s) => Value::String(redact_text(s)),
        other => other.clone(),
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn the_credentials_of_a_url_go_wherever_it_stands() {
        assert_eq!(
            redact_text("connect to https://bob:s3cret@collector.example:4318/v1/traces failed"),
            format!("connect to https://{REDACTED}@collector.example:4318/v1/traces failed")
        );
        assert_eq!(
            redact_text("at http://token@127.0.0.1:8080 and http://127.0.0.1:9070/x@y"),
            format!("at http://{REDACTED}@127.0.0.1:8080 and http://127.0.0.1:9070/x@y")
        );
        let plain = "mail me@example.com or see https://example.com/a?b=c";
        assert_eq!(redact_text(plain), plain);
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
    fn header_like_lines_in_text_keep_only_their_key() {
        let text = "HTTP/1.1 200 OK\nAuthorization: Bearer sk-1\nContent-Type: text/plain\nexport OPENAI_API_KEY=sk-2\nratio: 3=4";
        let r = redact_text(text);
        assert_eq!(
            r,
            "HTTP/1.1 200 OK\nAuthorization: [redacted]\nContent-Type: text/plain\nexport OPENAI_API_KEY= [redacted]\nratio: 3=4"
        );
        assert_eq!(
            redact_text("all fine: nothing to hide"),
            "all fine: nothing to hide"
        );
        assert_eq!(
            redact_text(r#"{"api_key": "sk-3", "n": 1}"#),
            r#"{"api_key":"[redacted]","n":1}"#
        );
        assert_eq!(redact_text(r#"{"n": 1}"#), r#"{"n": 1}"#);
        let nested = redact(&serde_json::json!({"stdout": "x-api-key: k\nok"}));
        assert_eq!(nested["stdout"], "x-api-key: [redacted]\nok");
    }

    #[test]
    fn bearer_strings_are_redacted_wherever_they_are() {
        let r = redact(&json!({"h": ["bearer abc.def"], "note": "a Bearer token is needed"}));
        assert_eq!(r["h"][0], REDACTED);
        assert_eq!(r["note"], "a Bearer token is needed");
    }
}
