//! Bodies and events whose string escapes hold a lone UTF-16 surrogate, read with each lone half
//! as U+FFFD instead of failing: the core's repair ([`agentloop::surrogates`], which says why
//! U+FFFD is the honest reading), applied to the fields a response carries whole.
//!
//! Delta strings split between two events are read by [`crate::wire_text`], which joins their
//! halves across events and never fails on a lone half. An event whose delta ends with the first
//! half of a character can still fail its strict parse, when another field of it (an id, a
//! name, a whole text) holds a lone half of its own; repairing every half of that event would
//! turn the delta's half into U+FFFD too, and the next delta's low half into a second one, where
//! the two make one character. [`event_from_str`] therefore repairs only the halves a strict
//! field refuses, one at a time, as the parse's error points at them, and leaves the halves the
//! delta readers took.

use serde::Deserialize;
use serde_json::error::Category;

pub(crate) use agentloop::surrogates::from_slice;
// Each reader is kept where a provider built in reads with it (a feature of one provider alone
// would otherwise build with dead code).
#[cfg(any(feature = "openai", feature = "openai-responses"))]
pub(crate) use agentloop::surrogates::from_str;
#[cfg(feature = "openai")]
pub(crate) use agentloop::surrogates::replace_lone_str;
use agentloop::surrogates::{lone_escapes, replace_escape_at};

/// How many halves are repaired one by one, each with a parse of the event to find the next,
/// before the rest are repaired at once: a field that holds more is damaged text, not a delta's
/// edge, and an event of many must not cost a parse for each.
const ONE_BY_ONE: usize = 8;

/// Parses a stream event's `data` as `T`, as [`from_str`] does, except that a lone half that no
/// strict field refuses (one a delta reader took, at a delta's end or start) is kept for that
/// reader. `probe` parses its text as `T` and drops the result: the event's type, at a borrow of
/// the attempt's own text.
///
/// A strict reader's error on a lone half is a syntax error at most 12 bytes after the escape
/// begins (after the half itself, the byte after it, or the escape after it), so the half the
/// error points at is found among the lone ones. An error that points at none (a custom reader
/// that re-parses a field, where the position is no longer the event's) repairs every half left,
/// as [`from_str`] would.
pub(crate) fn event_from_str<'a, T: Deserialize<'a>>(
    data: &'a str,
    repaired: &'a mut Option<String>,
    probe: impl Fn(&str) -> serde_json::Result<()>,
) -> serde_json::Result<T> {
    let mut error = match serde_json::from_str(data) {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    let mut lone: Vec<usize> = lone_escapes(data.as_bytes()).collect();
    if lone.is_empty() {
        return Err(error);
    }
    let mut text = data.as_bytes().to_vec();
    for _ in 0..ONE_BY_ONE {
        let Some(i) = refused(&text, &lone, &error) else {
            break;
        };
        let at = lone.remove(i);
        replace_escape_at(&mut text, at);
        // Only ASCII digits changed: the text is still UTF-8.
        let Ok(attempt) = std::str::from_utf8(&text) else {
            break;
        };
        match probe(attempt) {
            // The halves left are the delta readers'.
            Ok(()) => {
                lone.clear();
                break;
            }
            Err(e) => error = e,
        }
    }
    for at in lone {
        replace_escape_at(&mut text, at);
    }
    let text = String::from_utf8(text)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    serde_json::from_str(repaired.insert(text))
}

/// Which of the `lone` halves (offsets of their escapes in `text`) `error` is a strict reader's
/// refusal of, if any.
fn refused(text: &[u8], lone: &[usize], error: &serde_json::Error) -> Option<usize> {
    if error.classify() != Category::Syntax {
        return None;
    }
    // serde_json's column counts the bytes read on the error's line: with the line's start, it
    // is the offset the parse stopped at.
    let line_start = match error.line() {
        0 => return None,
        1 => 0,
        line => memchr::memchr_iter(b'\n', text).nth(line - 2)? + 1,
    };
    let stopped = line_start + error.column();
    // The first: a high half refused at the escape after it (12 bytes on) can have a lone half
    // of its own there.
    lone.iter()
        .position(|&at| at + 6 <= stopped && stopped <= at + 12)
}

#[cfg(all(
    test,
    any(
        feature = "openai",
        feature = "anthropic",
        feature = "openai-responses"
    )
))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::borrow::Cow;

    use super::*;
    use crate::wire_text::{Channel, Pairs, WireText};

    /// An event with strict fields before and after a delta read as [`WireText`].
    #[derive(Deserialize, Debug)]
    struct Event<'a> {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        delta: WireText<'a>,
        #[serde(default, borrow)]
        name: Option<Cow<'a, str>>,
        #[serde(default)]
        extra: Option<serde_json::Value>,
    }

    fn parse(
        data: &str,
    ) -> serde_json::Result<(String, String, Option<String>, Option<serde_json::Value>)> {
        let mut repaired = None;
        let event: Event<'_> = event_from_str(data, &mut repaired, |t| {
            serde_json::from_str::<Event<'_>>(t).map(drop)
        })?;
        // The delta between one that ends with a high half and one that begins with a low half.
        let mut pairs = Pairs::default();
        let before: WireText<'_> = serde_json::from_str(r#""z\ud83d""#)?;
        let after: WireText<'_> = serde_json::from_str(r#""\ude00b""#)?;
        let mut text = pairs.join(Channel::Text, before);
        text.push_str(&pairs.join(Channel::Text, event.delta));
        text.push_str(&pairs.join(Channel::Text, after));
        Ok((
            event.id.into_owned(),
            text,
            event.name.map(Cow::into_owned),
            event.extra,
        ))
    }

    #[test]
    fn a_deltas_split_pairs_join_where_a_strict_field_of_its_event_holds_a_lone_half() {
        let cases = [
            // A high half at the id's end, before and after the delta; a low half; both.
            (r#"{"id":"x\ud800","delta":"\ude00a\ud83d"}"#, "x\u{fffd}"),
            (r#"{"delta":"\ude00a\ud83d","id":"x\ud800"}"#, "x\u{fffd}"),
            (
                r#"{"id":"\ud800x\udc00","delta":"\ude00a\ud83d"}"#,
                "\u{fffd}x\u{fffd}",
            ),
            // A high half followed by another escape, by a lone high half, by a pair.
            (r#"{"id":"\ud800\n","delta":"\ude00a\ud83d"}"#, "\u{fffd}\n"),
            (
                r#"{"id":"\ud800\ud801","delta":"\ude00a\ud83d"}"#,
                "\u{fffd}\u{fffd}",
            ),
            (
                r#"{"id":"\ud800\ud801\udc00","delta":"\ude00a\ud83d"}"#,
                "\u{fffd}\u{10400}",
            ),
            // Across lines, as a pretty-printed event would be.
            (
                "{\n \"id\": \"x\\ud800\",\n \"delta\": \"\\ude00a\\ud83d\"\n}",
                "x\u{fffd}",
            ),
        ];
        for (data, id) in cases {
            let (read_id, text, _, _) = parse(data).unwrap();
            assert_eq!(read_id, id, "{data}");
            assert_eq!(text, "z\u{1F600}a\u{1F600}b", "{data}");
        }
        // A name after the delta and a value read whole are repaired too.
        let data =
            r#"{"id":"i","delta":"\ude00a\ud83d","name":"\udc00n","extra":{"k":["\ud800"]}}"#;
        let (_, text, name, extra) = parse(data).unwrap();
        assert_eq!(text, "z\u{1F600}a\u{1F600}b");
        assert_eq!(name.as_deref(), Some("\u{fffd}n"));
        assert_eq!(extra, Some(serde_json::json!({"k": ["\u{fffd}"]})));
    }

    #[test]
    fn more_refused_halves_than_one_by_one_are_repaired_at_once_and_other_errors_stay() {
        let id = "\\ud800".repeat(ONE_BY_ONE + 3);
        let (read_id, _, _, _) = parse(&format!(r#"{{"id":"{id}","delta":"a"}}"#)).unwrap();
        assert_eq!(read_id, "\u{fffd}".repeat(ONE_BY_ONE + 3));
        // Not JSON for another reason: the error is the repaired text's.
        let e = parse(r#"{"id":"\ud800","delta":"a",}"#).unwrap_err();
        assert!(e.to_string().contains("trailing comma"), "{e}");
    }
}
