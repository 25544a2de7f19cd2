//! Text a model or a tool chose, made safe to show on a terminal. Two needs, two functions:
//!
//! - what a person must read exactly (an approval prompt) shows every invisible character as a
//!   visible escape ([`escape_invisible`]): control characters (Unicode general category Cc) and
//!   format characters (Cf: bidi overrides and isolates, zero-width characters, ...), which can
//!   hide or reorder what a line seems to say;
//! - text streamed as it comes (the model's answer, progress lines) loses its terminal escape
//!   sequences ([`EscapeFilter`]): ANSI CSI (`ESC [`), OSC (`ESC ]`, which can set the title,
//!   write the clipboard or make links), the other `ESC` sequences, their 8-bit C1 forms, and the
//!   other control characters but line breaks and tabs. A sequence may be split across the
//!   pieces of a stream, so the filter keeps its state between them.

pub use agentloop::printable::escape_invisible;

/// The text with every control character but line breaks and tabs written as `\u{…}`: what the
/// command prints to the operator of its own (its messages, errors and warnings) may quote a
/// name it was given or found (a file's, a run's), and a name can hold a terminal's escape
/// sequences (`ESC ] 0 ; … BEL` sets the window title; others rewrite the screen). Unlike
/// [`escape_invisible`] it keeps a message's own lines.
pub fn escape_controls(text: &str) -> String {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A path as a message shows it: every invisible character (a line break too, which would
/// forge a line of the message) written as `\u{…}` (see [`escape_invisible`]); as the store's
/// and eval's errors show it ([`agentloop::printable::path`]).
pub fn shown_path(path: &std::path::Path) -> String {
    agentloop::printable::path(path)
}

/// Where an [`EscapeFilter`] is within a sequence.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Plain text.
    #[default]
    Text,
    /// After `ESC`.
    Escape,
    /// Inside a control sequence (CSI), until its final byte.
    Control,
    /// Inside a string (OSC, DCS, SOS, PM, APC), until BEL or the string terminator.
    String,
    /// Inside a string, after an `ESC` (which `\` turns into the terminator).
    StringEscape,
    /// After `ESC` and an intermediate byte (`ESC ( B`): one more character ends it.
    Intermediate,
}

/// Removes terminal escape sequences and control characters (but `\n` and `\t`) from text that
/// comes in pieces. Printable text, Unicode included, passes unchanged.
#[derive(Debug, Default, Clone)]
pub struct EscapeFilter {
    state: State,
}

impl EscapeFilter {
    /// The printable part of the next piece.
    pub fn push(&mut self, piece: &str) -> String {
        let mut out = String::with_capacity(piece.len());
        for c in piece.chars() {
            self.state = match (self.state, c) {
                (State::Text, '\u{1b}') => State::Escape,
                (State::Text, '\u{9b}') => State::Control,
                (State::Text, '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}') => {
                    State::String
                }
                (State::Text, '\n' | '\t') => {
                    out.push(c);
                    State::Text
                }
                (State::Text, c) if c.is_control() => State::Text,
                (State::Text, c) => {
                    out.push(c);
                    State::Text
                }
                (State::Escape, '[') => State::Control,
                (State::Escape, ']' | 'P' | 'X' | '^' | '_') => State::String,
                (State::Escape, '\u{20}'..='\u{2f}') => State::Intermediate,
                // Any other character ends a two-character sequence (`ESC 7`, `ESC c`, ...).
                (State::Escape, _) | (State::Intermediate, _) => State::Text,
                (State::Control, '\u{40}'..='\u{7e}') => State::Text,
                (State::Control, _) => State::Control,
                (State::String | State::StringEscape, '\u{7}' | '\u{9c}') => State::Text,
                (State::String | State::StringEscape, '\u{1b}') => State::StringEscape,
                (State::StringEscape, '\\') => State::Text,
                (State::String | State::StringEscape, _) => State::String,
            };
        }
        out
    }
}

/// [`EscapeFilter`] over a whole text.
pub fn strip_escapes(text: &str) -> String {
    EscapeFilter::default().push(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_characters_are_shown_as_escapes() {
        assert_eq!(
            escape_invisible("ls \u{202e}txt.hs\u{202c} \u{2066}x\u{2069}"),
            "ls \\u{202e}txt.hs\\u{202c} \\u{2066}x\\u{2069}"
        );
        assert_eq!(
            escape_invisible("a\u{200b}b\u{feff}c\u{1b}[31m\u{9b}\u{7f}\u{2028}"),
            "a\\u{200b}b\\u{feff}c\\u{1b}[31m\\u{9b}\\u{7f}\\u{2028}"
        );
        assert_eq!(escape_invisible("naïve 日本 ✓"), "naïve 日本 ✓");
    }

    #[test]
    fn controls_but_line_breaks_and_tabs_are_shown_as_escapes_in_messages() {
        assert_eq!(
            escape_controls("cannot read a\u{1b}]0;pwned\u{7}.toml:\n\tno\r\u{9b}2J"),
            "cannot read a\\u{1b}]0;pwned\\u{7}.toml:\n\tno\\u{d}\\u{9b}2J"
        );
        assert_eq!(escape_controls("naïve ✓\n"), "naïve ✓\n");
        assert_eq!(
            shown_path(std::path::Path::new("a\u{1b}[2J\nb\u{202e}.toml")),
            "a\\u{1b}[2J\\u{a}b\\u{202e}.toml"
        );
    }

    #[test]
    fn escape_sequences_and_controls_are_removed_from_streamed_text() {
        let cases = [
            ("\u{1b}[2J\u{1b}[1;31mred\u{1b}[0m", "red"),
            ("a\u{1b}]0;title\u{7}b", "ab"),
            (
                "a\u{1b}]8;;http://x\u{1b}\\link\u{1b}]8;;\u{1b}\\b",
                "alinkb",
            ),
            ("a\u{1b}P1$r\u{1b}\\b", "ab"),
            ("a\u{1b}7b\u{1b}(Bc", "abc"),
            ("a\u{9b}31mb\u{9d}0;t\u{9c}c", "abc"),
            ("line\r\nnext\ttab\u{8}\u{7}", "line\nnext\ttab"),
            ("naïve 日本 ✓ \u{202e}", "naïve 日本 ✓ \u{202e}"),
        ];
        for (given, shown) in cases {
            assert_eq!(strip_escapes(given), shown, "{given:?}");
        }
    }

    #[test]
    fn a_sequence_split_across_pieces_is_still_removed() {
        let mut filter = EscapeFilter::default();
        let pieces = [
            "one \u{1b}",
            "[3",
            "1mtwo\u{1b}]0;",
            "evil",
            "\u{1b}",
            "\\ three",
        ];
        let shown: String = pieces.iter().map(|p| filter.push(p)).collect();
        assert_eq!(shown, "one two three");
    }
}
