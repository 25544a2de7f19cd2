//! JSON whose string escapes hold a lone UTF-16 surrogate, read with each lone half as U+FFFD.
//!
//! JSON spells a character outside the Basic Multilingual Plane as two `\u` escapes. A model's
//! output cut at its token limit, or a server that slices text by UTF-16 code units, can send
//! one half without the other (`"\ud83d"` and nothing after it). serde_json refuses such a
//! string, so one damaged character would fail a whole response body, an event, or a tool call's
//! arguments. The strict parse runs first, as before; only when it fails and the text holds a
//! lone half is the text repaired (the half's four hex digits become `fffd`, so every byte offset
//! stays where it was) and parsed once more. A string without a lone half is never touched, and
//! the repair works on the escapes of string literals only (`\\ud83d`, an escaped backslash
//! before `ud83d`, is no escape).
//!
//! The failed parse is not asked why it failed: serde_json's error says so only in its message,
//! which is not a contract, and a lone half can fail a field that a custom reader re-parses
//! (a list of content parts), where the error is no longer serde_json's own. The scan decides.
//!
//! A tool call's arguments repaired this way still run, with U+FFFD in the string where the half
//! was (the providers repair the response fields they read whole; the core repairs the
//! arguments' own JSON text, which the model wrote). The character was lost before the text
//! reached this process (no reading brings it back); the rest of the call is what the model
//! wrote; and U+FFFD is the mark every Unicode reader leaves for a lost character, so the tool,
//! the record and the model's next turn (which shows it the arguments it sent) all see the loss
//! instead of having it hidden. Failing the call, or the response, would throw away everything
//! the model got right for one character it may not need; a tool that does need it (a path, an
//! exact match) fails on it and says so to the model.

use serde::Deserialize;

/// The escape's hex digits a lone half is replaced by: U+FFFD, the replacement character.
const REPLACEMENT_HEX: &[u8; 4] = b"fffd";

/// `json` with each lone surrogate escape inside its string literals replaced by `\ufffd`, at the
/// same length; `None` when it holds none. A high half directly followed by a low half's escape
/// is a pair and is kept; a high half followed by anything else, and a low half not preceded by a
/// high one, are lone (as [`char::decode_utf16`] reads them).
pub fn replace_lone(json: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for at in lone_escapes(json) {
        replace_escape_at(out.get_or_insert_with(|| json.to_vec()), at);
    }
    out
}

/// Where each lone surrogate escape inside the string literals of `json` begins (the offset of
/// its backslash), in order: the escapes [`replace_lone`] replaces.
pub fn lone_escapes(json: &[u8]) -> LoneEscapes<'_> {
    LoneEscapes {
        json,
        at: 0,
        in_string: false,
    }
}

/// Replaces the escape at `at` (a `\uXXXX` that [`lone_escapes`] found) by `\ufffd`, at the same
/// length. False, and nothing changed, when `json` holds no `\u` escape of four hex digits there.
pub fn replace_escape_at(json: &mut [u8], at: usize) -> bool {
    if json.get(at..at + 2) != Some(b"\\u".as_slice()) || unit_at(json, at + 2).is_none() {
        return false;
    }
    match json.get_mut(at + 2..at + 6) {
        Some(hex) => {
            hex.copy_from_slice(REPLACEMENT_HEX);
            true
        }
        None => false,
    }
}

/// The iterator of [`lone_escapes`].
#[derive(Debug, Clone)]
pub struct LoneEscapes<'a> {
    json: &'a [u8],
    at: usize,
    in_string: bool,
}

impl Iterator for LoneEscapes<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let json = self.json;
        while let Some(found) = json
            .get(self.at..)
            .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
        {
            let i = self.at + found;
            if json.get(i) == Some(&b'"') {
                self.in_string = !self.in_string;
                self.at = i + 1;
                continue;
            }
            // A backslash outside a string is no escape (and no JSON): skip it.
            if !self.in_string || json.get(i + 1) != Some(&b'u') {
                // The escaped byte (a quote or a backslash included) ends nothing.
                self.at = i + 2;
                continue;
            }
            match unit_at(json, i + 2) {
                Some(0xD800..=0xDBFF)
                    if json.get(i + 6..i + 8) == Some(b"\\u".as_slice())
                        && matches!(unit_at(json, i + 8), Some(0xDC00..=0xDFFF)) =>
                {
                    self.at = i + 12;
                }
                Some(0xD800..=0xDFFF) => {
                    self.at = i + 6;
                    return Some(i);
                }
                Some(_) => self.at = i + 6,
                // Not four hex digits: an invalid escape, which the parse reports as it did.
                None => self.at = i + 2,
            }
        }
        self.at = json.len();
        None
    }
}

/// [`replace_lone`] of a `str`: the repair changes ASCII digits only, so the text stays UTF-8.
pub fn replace_lone_str(json: &str) -> Option<String> {
    replace_lone(json.as_bytes()).and_then(|bytes| String::from_utf8(bytes).ok())
}

/// The code unit that the four hex digits at `at` spell, if they are four hex digits.
fn unit_at(json: &[u8], at: usize) -> Option<u16> {
    json.get(at..at + 4)?.iter().try_fold(0u16, |unit, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some((unit << 4) | u16::try_from(digit).ok()?)
    })
}

/// Parses `json` as `T`, as `serde_json::from_slice` does; when that fails and `json` holds a
/// lone surrogate escape, parses it again with the halves replaced (see [`replace_lone`]). The
/// repaired copy is kept in `repaired`, for what the value borrows. The error is the first
/// parse's when there was nothing to repair, else the second's.
pub fn from_slice<'a, T: Deserialize<'a>>(
    json: &'a [u8],
    repaired: &'a mut Option<Vec<u8>>,
) -> serde_json::Result<T> {
    match serde_json::from_slice(json) {
        Ok(value) => Ok(value),
        Err(e) => match replace_lone(json) {
            Some(fixed) => serde_json::from_slice(repaired.insert(fixed)),
            None => Err(e),
        },
    }
}

/// [`from_slice`] of a `str`.
pub fn from_str<'a, T: Deserialize<'a>>(
    json: &'a str,
    repaired: &'a mut Option<String>,
) -> serde_json::Result<T> {
    match serde_json::from_str(json) {
        Ok(value) => Ok(value),
        Err(e) => match replace_lone_str(json) {
            Some(fixed) => serde_json::from_str(repaired.insert(fixed)),
            None => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn fixed(json: &str) -> Option<String> {
        replace_lone_str(json)
    }

    #[test]
    fn a_lone_surrogate_in_a_string_is_replaced_and_everything_else_is_kept() {
        // High half alone (at the end, before text, before another escape, before a high half
        // that has its low one), low half alone, in keys and in nested strings.
        assert_eq!(fixed(r#""a\ud83d""#).unwrap(), r#""a\ufffd""#);
        assert_eq!(fixed(r#""\uD83Dx""#).unwrap(), r#""\ufffdx""#);
        assert_eq!(fixed(r#""\ud83d\n""#).unwrap(), r#""\ufffd\n""#);
        assert_eq!(
            fixed(r#""\ud83d\ud83d\ude00""#).unwrap(),
            r#""\ufffd\ud83d\ude00""#
        );
        assert_eq!(fixed(r#""\ude00\ud83d""#).unwrap(), r#""\ufffd\ufffd""#);
        assert_eq!(
            fixed(r#"{"k\udc00":["x",{"y":"\ud800"}]}"#).unwrap(),
            r#"{"k\ufffd":["x",{"y":"\ufffd"}]}"#
        );
        // A pair, an escaped backslash before `u`, an escaped quote, other escapes, and a
        // backslash outside any string are not lone halves.
        for kept in [
            r#""\ud83d\ude00""#,
            r#""\\ud83d""#,
            r#""\\\ud83d\ude00""#,
            r#""\"\ud83d\udE00\"""#,
            r#"{"a":"\u00e9\t\/"}"#,
            r#"\ud83d"#,
            r#""\u12""#,
        ] {
            assert_eq!(fixed(kept), None, "{kept}");
        }
    }

    #[test]
    fn a_repaired_text_parses_and_a_failure_of_another_kind_stays_the_first_error() {
        let mut repaired = None;
        let v: Vec<String> = from_str(r#"["\ud83d!", "\ud83d\ude00"]"#, &mut repaired).unwrap();
        assert_eq!(v, ["\u{fffd}!", "\u{1F600}"]);
        let mut repaired = None;
        let e = from_slice::<Vec<String>>(br#"["x",]"#, &mut repaired).unwrap_err();
        assert!(e.to_string().contains("trailing comma"), "{e}");
        assert!(repaired.is_none());
    }

    /// A JSON string literal of `text`: each character written as itself, as a `\u` escape (a
    /// pair of them outside the BMP), or as a short escape, as `how` picks.
    fn literal(text: &str, how: &[u8]) -> String {
        let mut out = String::from("\"");
        for (c, pick) in text.chars().zip(how.iter().cycle()) {
            let mut units = [0u16; 2];
            match (c, pick % 4) {
                ('"', _) => out.push_str("\\\""),
                ('\\', _) => out.push_str("\\\\"),
                ('\n', 0) => out.push_str("\\n"),
                (c, 1 | 2) => {
                    for unit in c.encode_utf16(&mut units).iter() {
                        if pick % 4 == 1 {
                            out.push_str(&format!("\\u{unit:04x}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                }
                (c, _) if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                (c, _) => out.push(c),
            }
        }
        out.push('"');
        out
    }

    proptest! {
        #[test]
        fn a_document_without_lone_surrogates_is_never_changed(
            texts in proptest::collection::vec(any::<String>(), 1..4),
            how in proptest::collection::vec(any::<u8>(), 1..8),
            tricky in proptest::collection::vec(
                // Escapes that are no lone half, and text that names one without being one.
                prop::sample::select(vec![
                    r"\\ud83d", r"\\\ud83d\ude00", r"\ud83d\ude00", r#"\""#, r"\\",
                    "\u{1F600}", r#"\\\""#, "ud83d",
                ]),
                0..6,
            ),
        ) {
            let mut members: Vec<String> = texts.iter().map(|t| literal(t, &how)).collect();
            members.push(format!("\"{}\"", tricky.concat()));
            let doc = format!("{{\"k\\ud83d\\ude00\":[{}], \"n\": 1}}", members.join(","));
            prop_assert_eq!(replace_lone(doc.as_bytes()), None, "{}", doc);
            // The generator writes valid JSON of the same texts.
            let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
            for (i, text) in texts.iter().enumerate() {
                prop_assert_eq!(v["k\u{1F600}"][i].as_str(), Some(text.as_str()));
            }
        }

        #[test]
        fn lone_halves_read_as_utf16_decoding_reads_them(
            units in proptest::collection::vec(
                prop_oneof![
                    0xD800u16..0xE000,
                    Just(0xD83D),
                    Just(0xDE00),
                    0x20u16..0x7F,
                    any::<u16>(),
                ],
                0..16,
            ),
        ) {
            let mut doc = String::from("[\"");
            for unit in &units {
                match *unit {
                    u @ 0x20..=0x7E if u != 0x22 && u != 0x5C => {
                        doc.push(char::from(u8::try_from(u).unwrap()));
                    }
                    u => doc.push_str(&format!("\\u{u:04x}")),
                }
            }
            doc.push_str("\"]");
            let expected: String = char::decode_utf16(units.iter().copied())
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect();
            let mut repaired = None;
            let read: Vec<String> = from_str(&doc, &mut repaired).unwrap();
            prop_assert_eq!(&read[0], &expected);
            // Only the hex digits of lone halves changed.
            if let Some(r) = &repaired {
                prop_assert_eq!(r.len(), doc.len());
            }
            let lone = char::decode_utf16(units.iter().copied()).any(|c| c.is_err());
            prop_assert_eq!(repaired.is_some(), lone);
        }
    }
}
