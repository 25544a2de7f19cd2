//! Canonical JSON and its sha256 fingerprint: equal for equal values whatever order their keys
//! were written in. A durable run's agent [`Definition`], an approval's arguments and the
//! response cache's keys are matched by it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What an agent is, as far as a resumed run must find it unchanged: the model, instructions,
/// tools with their schemas, limits, and what the application adds (permissions, a version).
/// Its [`Definition::fingerprint`] is journaled with each run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Definition {
    parts: BTreeMap<String, Value>,
}

impl Definition {
    /// An empty definition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one part (replacing a part of the same name).
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.parts.insert(key.into(), value);
        self
    }

    /// One part.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.parts.get(key)
    }

    /// The parts, by name.
    pub fn parts(&self) -> &BTreeMap<String, Value> {
        &self.parts
    }

    /// `sha256:` and the hex digest of the definition's canonical JSON (keys sorted at every
    /// level), so the same definition has the same fingerprint whatever order it was built in.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (key, value) in &self.parts {
            canonical(&Value::String(key.clone()), &mut text);
            text.push(':');
            canonical(value, &mut text);
            text.push('\n');
        }
        sha256(&text)
    }

    /// What differs from `other`, as paths into the definition (`/tools/search/input_schema`,
    /// `/version`), at most `max` of them.
    pub fn changes(&self, other: &Definition, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&String> =
            self.parts.keys().chain(other.parts.keys()).collect();
        for key in keys {
            let path = format!("/{}", escape(key));
            diff(
                self.parts.get(key),
                other.parts.get(key),
                &path,
                &mut out,
                max,
            );
        }
        out
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn diff(a: Option<&Value>, b: Option<&Value>, path: &str, out: &mut Vec<String>, max: usize) {
    if out.len() >= max || a == b {
        return;
    }
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let sub = format!("{path}/{}", escape(key));
                diff(x.get(key), y.get(key), &sub, out, max);
            }
        }
        (None, Some(_)) => out.push(format!("{path} (added)")),
        (Some(_), None) => out.push(format!("{path} (removed)")),
        _ => out.push(path.to_owned()),
    }
}

/// `sha256:` and the hex digest of a value's canonical JSON (object keys sorted at every level):
/// equal for equal values, whatever order their keys were written in. An approval is matched to
/// a call by its arguments' fingerprint.
pub fn fingerprint(value: &Value) -> String {
    let mut text = String::new();
    canonical(value, &mut text);
    sha256(&text)
}

fn sha256(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::from("sha256:");
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// JSON with object keys sorted at every level.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(&Value::String(k.clone()), out);
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_ignore_key_order_and_see_every_change() {
        let mut a = Definition::new();
        a.set("tools", json!({"t": {"a": 1, "b": [1, 2]}}))
            .set("version", json!("1"));
        let mut b = Definition::new();
        b.set("version", json!("1"))
            .set("tools", json!({"t": {"b": [1, 2], "a": 1}}));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert!(a.changes(&b, 10).is_empty());
        b.set("tools", json!({"t": {"b": [2, 1], "a": 1}, "u": {}}));
        b.set("limits", json!({}));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.changes(&b, 10),
            vec!["/limits (added)", "/tools/t/b", "/tools/u (added)"]
        );
        assert_eq!(a.changes(&b, 1).len(), 1);
    }
}
