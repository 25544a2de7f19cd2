//! Delta strings whose JSON escapes split a UTF-16 surrogate pair between two events.
//!
//! JSON spells a character outside the Basic Multilingual Plane as two `\u` escapes, a high and a
//! low surrogate. A server that cuts its output by UTF-16 code units (a JavaScript gateway's
//! `slice`, a relay that re-chunks) can end one delta with `\ud83d` and begin the next with
//! `\ude00`: each event alone is then JSON that no UTF-8 string holds, and a strict reader fails
//! the whole stream on it. [`WireText`] reads such a string with its lone surrogates at either end
//! kept apart, and [`Pairs`] joins the high surrogate that ends one delta to the low one that
//! begins the next delta of the same [`Channel`]: the same text the accumulator concatenates.
//! A surrogate without its partner (in the middle of a string, or still waiting when its channel
//! ends) becomes U+FFFD, never an error.
//!
//! Only the escapes of the event's own JSON need this. A tool call's arguments are JSON text
//! inside that JSON string: an escape of theirs split between deltas (`"\\ud83d"`, then
//! `"\\ude00"`) is plain ASCII here, and the concatenated arguments parse whole.

use std::borrow::Cow;
use std::collections::BTreeMap;

use agentloop::model::ModelEvent;
use serde::Deserialize;

/// The text a lone surrogate stands for.
const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// A delta string as the event's JSON spells it: its text, and the lone surrogates at its ends,
/// which may be halves of a character split with the delta before or after it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct WireText<'a> {
    /// A low surrogate that opens the string: the second half of a character the last delta
    /// began.
    lead: Option<u16>,
    /// The text between (any lone surrogate inside it replaced).
    text: Cow<'a, str>,
    /// A high surrogate that closes the string: the first half of a character the next delta
    /// ends.
    trail: Option<u16>,
}

impl<'a> WireText<'a> {
    /// Text with no surrogate at either end.
    pub(crate) fn plain(text: impl Into<Cow<'a, str>>) -> Self {
        WireText {
            lead: None,
            text: text.into(),
            trail: None,
        }
    }

    /// True when the string is empty (no text, no half of a character).
    pub(crate) fn is_empty(&self) -> bool {
        self.text.is_empty() && self.lead.is_none() && self.trail.is_none()
    }

    /// Reads a JSON string's bytes as serde_json gives them when asked for bytes: UTF-8, but
    /// with each lone surrogate of an escape encoded as UTF-8 would encode its code point
    /// (WTF-8). `None` when the bytes are neither.
    fn from_wtf8(bytes: Cow<'a, [u8]>) -> Option<Self> {
        let bytes = match bytes {
            Cow::Borrowed(b) => match std::str::from_utf8(b) {
                Ok(text) => return Some(WireText::plain(text)),
                Err(_) => Cow::Borrowed(b),
            },
            Cow::Owned(b) => match String::from_utf8(b) {
                Ok(text) => return Some(WireText::plain(text)),
                Err(e) => Cow::Owned(e.into_bytes()),
            },
        };
        // Text and surrogates, in order.
        let mut pieces: Vec<Piece<'_>> = Vec::new();
        let mut rest: &[u8] = &bytes;
        while !rest.is_empty() {
            let valid = match std::str::from_utf8(rest) {
                Ok(text) => {
                    pieces.push(Piece::Text(text));
                    break;
                }
                Err(e) => e.valid_up_to(),
            };
            let (text, after) = rest.split_at(valid);
            if let Ok(text) = std::str::from_utf8(text)
                && !text.is_empty()
            {
                pieces.push(Piece::Text(text));
            }
            let unit = surrogate(after)?;
            pieces.push(Piece::Unit(unit));
            rest = after.get(3..).unwrap_or_default();
        }
        let mut out = WireText::default();
        let mut text = String::with_capacity(bytes.len());
        let last = pieces.len().saturating_sub(1);
        let mut i = 0;
        while let Some(piece) = pieces.get(i) {
            match *piece {
                Piece::Text(t) => text.push_str(t),
                Piece::Unit(high @ 0xD800..=0xDBFF) => {
                    if let Some(&Piece::Unit(low @ 0xDC00..=0xDFFF)) = pieces.get(i + 1) {
                        text.push(pair(high, low));
                        i += 1;
                    } else if i == last {
                        out.trail = Some(high);
                    } else {
                        text.push(REPLACEMENT);
                    }
                }
                Piece::Unit(low) => {
                    if i == 0 {
                        out.lead = Some(low);
                    } else {
                        text.push(REPLACEMENT);
                    }
                }
            }
            i += 1;
        }
        out.text = Cow::Owned(text);
        Some(out)
    }
}

enum Piece<'b> {
    Text(&'b str),
    Unit(u16),
}

/// The surrogate code unit whose WTF-8 encoding opens `bytes` (`ED A0..BF 80..BF`), if any.
fn surrogate(bytes: &[u8]) -> Option<u16> {
    match *bytes.get(..3)? {
        [0xED, b1 @ 0xA0..=0xBF, b2 @ 0x80..=0xBF] => {
            Some(0xD000 | (u16::from(b1 & 0x3F) << 6) | u16::from(b2 & 0x3F))
        }
        _ => None,
    }
}

/// The character a high and a low surrogate make.
fn pair(high: u16, low: u16) -> char {
    let code = 0x1_0000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
    char::from_u32(code).unwrap_or(REPLACEMENT)
}

impl<'de: 'a, 'a> Deserialize<'de> for WireText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = WireText<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(WireText::plain(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(WireText::plain(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(WireText::plain(v))
            }
            fn visit_borrowed_bytes<E: serde::de::Error>(
                self,
                v: &'de [u8],
            ) -> Result<Self::Value, E> {
                WireText::from_wtf8(Cow::Borrowed(v)).ok_or_else(not_text)
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                WireText::from_wtf8(Cow::Owned(v.to_vec())).ok_or_else(not_text)
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
                WireText::from_wtf8(Cow::Owned(v)).ok_or_else(not_text)
            }
        }
        // serde_json hands a string over as bytes without requiring its surrogates paired
        // (as a string, a lone one fails the whole event).
        deserializer.deserialize_bytes(Visit)
    }
}

fn not_text<E: serde::de::Error>() -> E {
    E::custom("a string that is not UTF-8")
}

/// Reads a JSON string (the raw JSON of one, quotes included) as a [`WireText`].
#[cfg(feature = "openai")]
pub(crate) fn wire_text_of(
    raw: &serde_json::value::RawValue,
) -> Result<WireText<'_>, serde_json::Error> {
    WireText::deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
}

/// What a delta's text is joined to: the text the accumulator concatenates it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Channel {
    /// The answer's text.
    Text,
    /// The reasoning streamed since the last reasoning block.
    Reasoning,
    /// The arguments of the tool call at this index.
    Arguments(u32),
}

impl Channel {
    /// The event that adds `text` to this channel.
    pub(crate) fn event(self, text: String) -> ModelEvent {
        match self {
            Channel::Text => ModelEvent::TextDelta(text),
            Channel::Reasoning => ModelEvent::ReasoningDelta(text),
            Channel::Arguments(index) => ModelEvent::ToolCallDelta {
                index,
                arguments: text,
            },
        }
    }
}

/// The high surrogates that ended a channel's last delta, each waiting for its low half.
#[derive(Debug, Default)]
pub(crate) struct Pairs {
    waiting: BTreeMap<Channel, u16>,
}

impl Pairs {
    /// The text `delta` adds to `channel`: a high surrogate waiting there joined to the low one
    /// that opens it (else each half becomes U+FFFD), and a high surrogate that closes it kept
    /// for the next delta. Empty while all it holds is a half.
    pub(crate) fn join(&mut self, channel: Channel, delta: WireText<'_>) -> String {
        let waiting = if delta.is_empty() {
            // An empty delta splits nothing: the half waits on.
            None
        } else {
            self.waiting.remove(&channel)
        };
        if let Some(high) = delta.trail {
            self.waiting.insert(channel, high);
        }
        match (waiting, delta.lead) {
            (None, None) => delta.text.into_owned(),
            (waiting, lead) => {
                let mut text = String::with_capacity(delta.text.len() + 4);
                match (waiting, lead) {
                    (Some(high), Some(low)) => text.push(pair(high, low)),
                    (Some(_), None) | (None, Some(_)) => text.push(REPLACEMENT),
                    (None, None) => {}
                }
                text.push_str(&delta.text);
                text
            }
        }
    }

    /// The channel ended: what it still waits for will never come, so its half is U+FFFD.
    #[cfg(any(feature = "anthropic", feature = "openai-responses"))]
    pub(crate) fn flush(&mut self, channel: Channel) -> Option<String> {
        self.waiting
            .remove(&channel)
            .map(|_| REPLACEMENT.to_string())
    }

    /// Every channel ended (the response did): the events that replace their waiting halves,
    /// in channel order.
    pub(crate) fn flush_all(&mut self) -> impl Iterator<Item = ModelEvent> + use<> {
        std::mem::take(&mut self.waiting)
            .into_keys()
            .map(|channel| channel.event(REPLACEMENT.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn read(json: &str) -> WireText<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_pair_split_between_deltas_is_one_character_and_lone_halves_are_replaced() {
        let mut pairs = Pairs::default();
        assert_eq!(pairs.join(Channel::Text, read(r#""a\ud83d""#)), "a");
        // Another channel, and an empty delta, between the halves split nothing.
        assert_eq!(pairs.join(Channel::Reasoning, read(r#""r""#)), "r");
        assert_eq!(pairs.join(Channel::Text, read(r#""""#)), "");
        assert_eq!(pairs.join(Channel::Text, read(r#""\ude00b""#)), "😀b");
        // A pair whole inside one delta, and lone halves inside a delta.
        assert_eq!(
            pairs.join(Channel::Text, read(r#""\ud83d\ude00 \ude00x\ud83dy""#)),
            "😀 \u{fffd}x\u{fffd}y"
        );
        // A delta that is only a half.
        assert_eq!(pairs.join(Channel::Arguments(3), read(r#""\ud83d""#)), "");
        assert_eq!(pairs.join(Channel::Arguments(3), read(r#""\ude00""#)), "😀");
        // A high half followed by no low one, and a low half with no high one before it.
        assert_eq!(pairs.join(Channel::Text, read(r#""\ud83d""#)), "");
        assert_eq!(pairs.join(Channel::Text, read(r#""x""#)), "\u{fffd}x");
        assert_eq!(pairs.join(Channel::Text, read(r#""\ude00""#)), "\u{fffd}");
        // A half still waiting when the response ends.
        assert_eq!(pairs.join(Channel::Arguments(1), read(r#""{\ud83d""#)), "{");
        assert_eq!(
            pairs.flush_all().collect::<Vec<_>>(),
            [ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "\u{fffd}".into()
            }]
        );
        assert_eq!(pairs.flush(Channel::Arguments(1)), None);
    }

    #[test]
    fn a_string_without_lone_halves_is_borrowed_and_bytes_that_are_not_text_fail() {
        assert!(matches!(read(r#""plain""#).text, Cow::Borrowed("plain")));
        assert_eq!(read(r#""\u00e9\ud83d\ude00""#), WireText::plain("é😀"));
        assert!(serde_json::from_slice::<WireText<'_>>(b"\"\xff\"").is_err());
        assert!(serde_json::from_str::<WireText<'_>>("[1]").is_err());
        assert!(serde_json::from_str::<WireText<'_>>("{}").is_err());
        // A lone half inside the string, not at an end, is no half of a split character.
        assert_eq!(read(r#""\ud83dz""#), WireText::plain("\u{fffd}z"));
        assert_eq!(read(r#""z\ude00""#), WireText::plain("z\u{fffd}"));
    }
}
