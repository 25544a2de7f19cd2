//! The credentials a URL may carry, and the URL as errors, plans and records show it.
//!
//! A URL the user configures (a provider's `base_url`, an MCP server's, a remote A2A agent's)
//! can hold a credential in its user info (`https://user:pass@host`) or its query
//! (`?key=...`, `?token=...`). HTTP clients print the whole URL in their errors (reqwest does), a
//! server may echo the URL back in an error body, and a definition written to a journal or shown
//! by `plan` would hold it whole. An HTTP client also sends the user info on as an
//! `Authorization: Basic base64(user:password)` header (reqwest does), which a server may echo
//! back in turn. [`shown`] is the URL with those parts replaced; [`secrets`] are the parts
//! themselves, and the Basic credentials made of them, which [`scrub`] removes from any text.
//!
//! The parsing is by hand and never fails: a string that is not a URL has no secrets found in it
//! and is shown as it is (it was refused or will be refused elsewhere). A URL parser (the `url`
//! crate) would not do: it refuses some of what must still be shown, it rewrites what it shows
//! (a `/` added, a host lowercased, characters escaped), which would change what `plan` and the
//! journal's definitions hold, and it would bring its IDNA tables into the core.

/// What a credential of a URL becomes when shown.
pub const REDACTED: &str = "[redacted]";

/// The shortest value [`scrub`] replaces: a shorter one would replace common words and digits
/// in a message while protecting nothing worth the name.
const MIN_SECRET_LEN: usize = 4;

/// The parts of a URL: `(scheme and "://", user info, host and the rest of the authority, path,
/// query without its `?`, fragment with its `#`)`.
type Parts<'a> = (
    &'a str,
    Option<&'a str>,
    &'a str,
    &'a str,
    Option<&'a str>,
    &'a str,
);

/// Splits a URL into its [`Parts`]; `None` for a string without `://`.
fn parts(url: &str) -> Option<Parts<'_>> {
    let at = url.find("://")?;
    let (scheme, rest) = url.split_at(at + 3);
    let (before_fragment, fragment) = match rest.find('#') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (before_query, query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let (userinfo, host) = match authority.rfind('@') {
        Some(i) => (
            authority.get(..i),
            authority.get(i + 1..).unwrap_or_default(),
        ),
        None => (None, authority),
    };
    Some((scheme, userinfo, host, path, query, fragment))
}

/// The URL with its user info and the value of every query parameter replaced by
/// `[redacted]` (`https://[redacted]@host/v1?key=[redacted]`); any other URL as it is. Every
/// value goes, not only those of credential-like names: a gateway's key is named as it likes
/// (`key`, `code`, `sig`), and what is left (scheme, host, path, parameter names) says which
/// server it is.
pub fn shown(url: &str) -> String {
    let Some((scheme, userinfo, host, path, query, fragment)) = parts(url) else {
        return url.to_owned();
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    if userinfo.is_some() {
        out.push_str(REDACTED);
        out.push('@');
    }
    out.push_str(host);
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((name, _)) => format!("{name}={REDACTED}"),
                None => p.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out.push_str(fragment);
    out
}

/// The credentials a URL carries: its user name and password, and its query parameters'
/// values, each as written and percent-decoded (a client or server may print either); and the
/// user name and password as an HTTP client sends them in a Basic `Authorization` header,
/// `base64(user:password)`, with and without its padding. Values shorter than four characters
/// are left out (see [`scrub`]).
pub fn secrets(url: &str) -> Vec<String> {
    let Some((_, userinfo, _, _, query, _)) = parts(url) else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    if let Some(info) = userinfo {
        let (user, password) = match info.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (info, None),
        };
        for part in [Some(user), password].into_iter().flatten() {
            found.extend([part.to_owned(), percent_decoded(part)]);
        }
        found.extend(basic_credentials(user, password));
    }
    if let Some(query) = query {
        for value in query
            .split('&')
            .filter_map(|p| p.split_once('=').map(|(_, v)| v))
        {
            // A query writes a space as `+`; user info does not.
            found.extend([value.to_owned(), percent_decoded(&value.replace('+', " "))]);
        }
    }
    let mut out: Vec<String> = Vec::new();
    for v in found {
        if v.chars().count() >= MIN_SECRET_LEN && !out.contains(&v) {
            out.push(v);
        }
    }
    // Longest first: a secret that holds another is replaced whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// What a client sends for this user info in a Basic `Authorization` header: `user:password`
/// (`user:` without a password), percent-decoded as reqwest does it, in base64 with and without
/// its padding; and the same of the user info as written, should a client not decode it.
fn basic_credentials(user: &str, password: Option<&str>) -> Vec<String> {
    let pair = |user: &str, password: Option<&str>| format!("{user}:{}", password.unwrap_or(""));
    let decoded = pair(
        &percent_decoded(user),
        password.map(percent_decoded).as_deref(),
    );
    let written = pair(user, password);
    let mut out = Vec::new();
    for plain in [decoded, written] {
        for encoding in [&data_encoding::BASE64, &data_encoding::BASE64_NOPAD] {
            out.push(encoding.encode(plain.as_bytes()));
        }
    }
    out
}

/// `text` with every one of `secrets` replaced by `[redacted]`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        if s.chars().count() >= MIN_SECRET_LEN && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    out
}

/// Replaces each of `secrets` (as [`scrub`] does) in every string of `value`, and in every
/// object key; true when one was found. For what a server answers as JSON (a tool's structured
/// result, a remote agent's data), which may quote the request it was sent.
pub fn scrub_json(value: &mut serde_json::Value, secrets: &[String]) -> bool {
    use serde_json::Value;
    let scrub_string = |s: &mut String| {
        let clean = scrub(s, secrets);
        let found = clean != *s;
        *s = clean;
        found
    };
    match value {
        Value::String(s) => scrub_string(s),
        Value::Array(items) => {
            // Every item, not only up to the first that held one.
            let mut found = false;
            for v in items {
                found |= scrub_json(v, secrets);
            }
            found
        }
        Value::Object(map) => {
            let mut found = false;
            for (mut key, mut v) in std::mem::take(map) {
                found |= scrub_json(&mut v, secrets);
                found |= scrub_string(&mut key);
                map.insert(key, v);
            }
            found
        }
        _ => false,
    }
}

/// `%XX` sequences decoded; an invalid sequence is kept as written, and a result that is not
/// UTF-8 is the string as written.
fn percent_decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map_or_else(|_| s.to_owned(), std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_user_info_and_query_values() {
        assert_eq!(
            shown("https://user:pa%40ss@host:8443/v1?key=abc123&api-version=2024#top"),
            "https://[redacted]@host:8443/v1?key=[redacted]&api-version=[redacted]#top"
        );
        assert_eq!(
            shown("http://127.0.0.1:8080/v1"),
            "http://127.0.0.1:8080/v1"
        );
        assert_eq!(shown("http://h/a@b?flag"), "http://h/a@b?flag");
        assert_eq!(shown("not a url"), "not a url");
    }

    #[test]
    fn the_secrets_of_a_url_are_scrubbed_from_text_as_written_and_decoded() {
        let s = secrets("https://bob:pa%40ss-word@host/v1?key=Q-1234567&x=1");
        for want in ["pa%40ss-word", "pa@ss-word", "Q-1234567"] {
            assert!(s.iter().any(|v| v == want), "{s:?}");
        }
        assert!(!s.iter().any(|v| v == "bob" || v == "1"), "{s:?}");
        assert_eq!(
            scrub("sent pa@ss-word and ?key=Q-1234567 to bob", &s),
            "sent [redacted] and ?key=[redacted] to bob"
        );
        assert!(secrets("http://127.0.0.1:8080/v1").is_empty());
        // A query's `+` is a space.
        assert!(secrets("http://h/?q=a+secret").contains(&"a secret".to_owned()));
    }

    #[test]
    fn the_basic_credentials_a_client_sends_for_the_user_info_are_secrets_too() {
        // reqwest sends `Authorization: Basic base64("bob:pa@ss-word")`, the user info decoded.
        let s = secrets("https://bob:pa%40ss-word@host/v1");
        for want in ["Ym9iOnBhQHNzLXdvcmQ=", "Ym9iOnBhQHNzLXdvcmQ"] {
            assert!(s.iter().any(|v| v == want), "{want} not in {s:?}");
        }
        assert_eq!(
            scrub("echo: Authorization: Basic Ym9iOnBhQHNzLXdvcmQ=", &s),
            "echo: Authorization: Basic [redacted]"
        );
        // A user without a password is sent as `user:`.
        let s = secrets("https://token-1234@host/");
        assert!(s.iter().any(|v| v == "dG9rZW4tMTIzNDo="), "{s:?}");
    }
}
