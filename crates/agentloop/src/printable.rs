//! Names from outside (a file's above all) as a message shows them: every character a terminal
//! does not show as itself is written as a visible escape, so that a name can neither drive the
//! terminal (an escape sequence) nor forge a line of the message (a line break), nor hide or
//! reorder what it says (a bidi override, a zero-width character). The CLI's own messages and
//! the errors of the crates that name files (the store, eval) show paths through it alike.

use std::path::Path;

use unicode_general_category::{GeneralCategory, get_general_category};

/// True for a character a terminal does not show as itself: a control (Cc), a format
/// character (Cf), or a line or paragraph separator (Zl, Zp).
fn invisible(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// The text with every invisible character written as `\u{…}` (its code point in hex), so that
/// what a person reads is what the text holds.
pub fn escape_invisible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if invisible(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A path as a message shows it: every invisible character (a line break too) written as
/// `\u{…}` (see [`escape_invisible`]).
pub fn path(path: &Path) -> String {
    escape_invisible(&path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_shown_with_its_invisible_characters_escaped() {
        assert_eq!(
            path(Path::new("a\u{1b}[2J\nb\u{202e}\u{200b}.toml")),
            "a\\u{1b}[2J\\u{a}b\\u{202e}\\u{200b}.toml"
        );
        assert_eq!(path(Path::new("naïve/日本 ✓.db")), "naïve/日本 ✓.db");
    }
}
