//! Defensive redaction of recorded payloads. Events carry no secrets by design; still, a tool may
//! echo a header or a key in its arguments or output, so every object key that looks like a
//! credential has its value replaced, and so has any string that is a bearer credential. Text
//! (a tool's text output, strings inside JSON) has header-like lines (`Authorization: ...`,
//! `OPENAI_API_KEY=...`) cut after the key, and text that is itself JSON is redacted as JSON.
//! Inside a line (a command string, a log line), an assignment to a credential-like name
//! (`GITHUB_TOKEN=... gh pr list`), a credential-like long option's value (`--token ...`), a
//! client's `-u user:password`, a bearer credential, and tokens of the well-known shapes
//! (`sk-...`, `ghp_...`, `github_pat_...`, `xoxb-...`, AWS access key ids) go wherever they stand.

use std::sync::LazyLock;

use regex::Regex;

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

/// Key endings that mark a secret (`openai_api_key`, `access_token`, `db_password`,
/// `aws_secret_access_key`, `github_pat`).
const SECRET_SUFFIXES: &[&str] = &[
    "_key",
    "_apikey",
    "_token",
    "_secret",
    "_password",
    "_passwd",
    "_pat",
    "_credentials",
];

/// True when an object key names a credential.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase().replace('-', "_");
    SECRET_KEYS.contains(&k.as_str()) || SECRET_SUFFIXES.iter().any(|s| k.ends_with(s))
}

/// A credential-like key standing alone (no white space in it).
fn is_header_key(key: &str) -> bool {
    !key.contains(char::is_whitespace) && is_secret_key(key)
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
/// a URL (`https://user:token@host`), assignments to credential-like names, bearer credentials and
/// well-known token shapes go in any text, wherever they stand in a line.
pub fn redact_text(text: &str) -> String {
    let text = strip_url_credentials(text).map_or(std::borrow::Cow::Borrowed(text), Into::into);
    if let Some(json) = redact_json_text(&text) {
        return json;
    }
    let lines = redact_lines(&text);
    redact_inline(&lines).unwrap_or(lines)
}

/// What the core's error for a refused, filtered or schema-failing answer says before it quotes
/// the answer (`agentloop`'s `machine/admit.rs` writes them): what follows each is the model's
/// words, or the answer's values that a schema violation names.
const QUOTES_THE_ANSWER: &[&str] = &[
    "the model refused to answer",
    "the model was stopped by a content filter",
    "the final answer does not match the output schema",
];

/// What stands in for the answer's words that [`error_text`] cut.
pub const ANSWER_CUT: &str = "[the answer's words are recorded only with payloads]";

/// A run's or a call's error text as a trace or a span keeps it. It is redacted always: it can
/// quote what a tool read (a fatal tool's diagnostic, a subagent's error). Without `payloads`
/// it is also cut where it starts quoting the model's answer (a refused or filtered answer's
/// words, the values a schema violation names, at any depth of a subagent's error), which only
/// payloads may record; the provider's finish reason in parentheses after the phrase stays.
pub fn error_text(message: &str, payloads: bool) -> String {
    if payloads {
        return redact_text(message);
    }
    let cut = QUOTES_THE_ANSWER
        .iter()
        .filter_map(|p| message.find(p).map(|at| at + p.len()))
        .min();
    let Some(end) = cut else {
        return redact_text(message);
    };
    let rest = message.get(end..).unwrap_or_default();
    let reason = match rest.strip_prefix(" (") {
        Some(r) => r.find(')').map_or(0, |i| i + 3),
        None => 0,
    };
    let head = message.get(..end + reason).unwrap_or(message);
    if head.len() == message.len() {
        return redact_text(message);
    }
    redact_text(&format!("{head}: {ANSWER_CUT}"))
}

/// Text that is itself JSON, redacted as JSON (its strings as text); `None` for other text.
fn redact_json_text(text: &str) -> Option<String> {
    let trimmed = text.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return None;
    }
    let v = serde_json::from_str::<Value>(trimmed).ok()?;
    let r = redact(&v);
    Some(if r == v {
        text.to_owned()
    } else {
        r.to_string()
    })
}

/// Tokens whose shape alone says they are credentials: OpenAI and Anthropic keys (`sk-`),
/// GitHub's (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`), Slack's (`xoxb-`...), AWS
/// access key ids.
static TOKEN_SHAPES: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16})",
    )
    .ok()
});

/// `Bearer <credential>` anywhere in a line.
static BEARER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}").ok());

/// `NAME=value` and `NAME: value` inside a line: the name is checked with [`is_secret_key`]; the
/// value (after an optional `Bearer `/`Basic `/`token ` scheme) ends at white space or a shell
/// separator, or is a quoted string.
static ASSIGNMENT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"([A-Za-z_][A-Za-z0-9_.-]*)(["']?\s*[=:]\s*)((?i:(?:bearer|basic|token)\s+)?(?:"[^"]*"|'[^']*'|[^\s"'&;|,)}]+))"#,
    )
    .ok()
});

/// A long option and the word after it (`--token abc`, `--api-key "x y"`): the option's name
/// is checked with [`is_secret_key`]. The `--name=value` form is an [`ASSIGNMENT`].
static OPTION_VALUE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"(--[A-Za-z][A-Za-z0-9_-]*)(\s+)("[^"]*"|'[^']*'|[^\s"'&;|=-][^\s"'&;|]*)"#).ok()
});

/// A user and password given to a client (`curl -u user:secret`, `--user user:secret`,
/// `--proxy-user`): the password goes.
static USER_PASSWORD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"((?:^|\s)(?:-u|-U|--user|--proxy-user)\s*["']?[^\s:"']+:)([^\s"'&;|]+)"#).ok()
});

/// Replaces in `out` what `re` matches with what `with` makes of it.
fn replace_in(
    out: &mut std::borrow::Cow<'_, str>,
    re: Option<&Regex>,
    with: impl FnMut(&regex::Captures<'_>) -> String,
) {
    let Some(re) = re else {
        return;
    };
    let replaced = match re.replace_all(out, with) {
        std::borrow::Cow::Owned(s) => Some(s),
        std::borrow::Cow::Borrowed(_) => None,
    };
    if let Some(s) = replaced {
        *out = std::borrow::Cow::Owned(s);
    }
}

/// The text with inline credentials replaced, or `None` when it has none.
fn redact_inline(text: &str) -> Option<String> {
    let mut out = std::borrow::Cow::Borrowed(text);
    replace_in(&mut out, OPTION_VALUE.as_ref(), |c| {
        let (option, gap, value) = (&c[1], &c[2], &c[3]);
        if is_secret_key(option.trim_start_matches('-'))
            && value.trim_matches(['"', '\'']) != REDACTED
        {
            format!("{option}{gap}{REDACTED}")
        } else {
            c[0].to_owned()
        }
    });
    replace_in(&mut out, USER_PASSWORD.as_ref(), |c| {
        format!("{}{REDACTED}", &c[1])
    });
    replace_in(&mut out, ASSIGNMENT.as_ref(), |c| {
        let (name, sep, value) = (&c[1], &c[2], &c[3]);
        if is_secret_key(name) && value.trim_matches(['"', '\'']) != REDACTED {
            format!("{name}{sep}{REDACTED}")
        } else {
            c[0].to_owned()
        }
    });
    replace_in(&mut out, BEARER.as_ref(), |c| {
        format!("{} {REDACTED}", &c[1])
    });
    replace_in(&mut out, TOKEN_SHAPES.as_ref(), |_| REDACTED.to_owned());
    match out {
        std::borrow::Cow::Owned(s) if s != text => Some(s),
        _ => None,
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
    if is_secret_string(text) {
        return REDACTED.into();
    }
    let mut changed = false;
    let lines: Vec<String> = text
        .split('\n')
        .map(|line| match line.find([':', '=']) {
            // A line that *is* a header or an assignment: one key before the separator (words
            // before it make it a command line, which the inline pass redacts precisely).
            Some(at)
                if is_header_key(
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
    fn error_text_cuts_the_quoted_answer_without_payloads_and_redacts_always() {
        let refused = "model error: the model refused to answer (refusal): I will not say sk-abcdefghijklmnopqrstuvwx";
        let kept = error_text(refused, false);
        assert_eq!(
            kept,
            format!("model error: the model refused to answer (refusal): {ANSWER_CUT}")
        );
        let with = error_text(refused, true);
        assert!(with.contains("I will not say"), "{with}");
        assert!(!with.contains("sk-abcdefghijklmnopqrstuvwx"), "{with}");
        // Nested in a subagent's error, without a finish reason, and a schema's quoted values.
        let nested = "tool ask (call c1) failed fatally: the subagent w stopped: model.content_filter: \
                      model error: the model was stopped by a content filter: the filtered words";
        assert!(!error_text(nested, false).contains("filtered words"));
        let schema = "the final answer does not match the output schema: \"forty\" is not of type \"integer\"";
        assert_eq!(
            error_text(schema, false),
            format!("the final answer does not match the output schema: {ANSWER_CUT}")
        );
        // Nothing quoted: only redacted, payloads or not.
        let fatal = "tool t (call c) failed fatally: OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx";
        for payloads in [false, true] {
            let shown = error_text(fatal, payloads);
            assert!(
                shown.starts_with("tool t (call c) failed fatally"),
                "{shown}"
            );
            assert!(!shown.contains("sk-abcdefghijklmnopqrstuvwx"), "{shown}");
        }
        let bare = "model error: the model refused to answer (refusal)";
        assert_eq!(error_text(bare, false), bare);
    }

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
    fn credentials_inside_a_line_go_wherever_they_stand() {
        let cases = [
            (
                "cd repo; gh pr list --token=abc123 -R x",
                "cd repo; gh pr list --token=[redacted] -R x",
            ),
            (
                "echo ok && GITHUB_TOKEN=abc123 gh pr list",
                "echo ok && GITHUB_TOKEN=[redacted] gh pr list",
            ),
            (
                r#"curl -H "Authorization: Bearer eyJhbGciOi.J9" https://x"#,
                r#"curl -H "Authorization: [redacted]" https://x"#,
            ),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG",
                "aws_secret_access_key = [redacted]",
            ),
            (
                "use key sk-proj-AbCdEfGhIjKlMnOpQrSt and ghp_0123456789abcdefghijABCD now",
                "use key [redacted] and [redacted] now",
            ),
            ("export MY_PAT='x y'; run", "export MY_PAT= [redacted]"),
            ("run it; MY_PAT='x y' go", "run it; MY_PAT=[redacted] go"),
            ("x-api-key: k1 and more", "x-api-key: [redacted]"),
            ("slack xoxb-1234-5678-abcdef ok", "slack [redacted] ok"),
            ("id AKIAIOSFODNN7EXAMPLE used", "id [redacted] used"),
            // A secret option's value after a space, and a client's user:password.
            (
                "gh pr list --token abc123 -R x",
                "gh pr list --token [redacted] -R x",
            ),
            (
                r#"tool --api-key "k 1" --password hunter2; ls"#,
                "tool --api-key [redacted] --password [redacted]; ls",
            ),
            (
                "curl -u alice:s3cret https://x && curl --user bob:pw2 y",
                "curl -u alice:[redacted] https://x && curl --user bob:[redacted] y",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(redact_text(text), want, "{text}");
        }
        for plain in [
            "max_tokens=5 temperature: 0.2 ratio: 3=4",
            "a Bearer token is needed; sk-short",
            "the task-list has 3 items",
            "llm --max-tokens 5 --sort key --token-file t.txt -u 3",
            "git log --author alice --since 2.weeks",
        ] {
            assert_eq!(redact_text(plain), plain);
        }
        let r = redact(&json!({"aws_secret_access_key": "k", "github_pat": "p", "sort": "key"}));
        assert_eq!(r["aws_secret_access_key"], REDACTED);
        assert_eq!(r["github_pat"], REDACTED);
        assert_eq!(r["sort"], "key");
    }

    #[test]
    fn bearer_strings_are_redacted_wherever_they_are() {
        let r = redact(&json!({"h": ["bearer abc.def"], "note": "a Bearer token is needed"}));
        assert_eq!(r["h"][0], REDACTED);
        assert_eq!(r["note"], "a Bearer token is needed");
    }
}
