//! Bounding the text a tool hands the model: what a tool's author (built-in, command or MCP)
//! and the core's own error path share, so that a cut reads the same wherever it is made.

/// Cuts `text` to at most `max` bytes, keeping its head and its tail (at character boundaries)
/// and saying how much of the middle went: a failing test run or build says what it ran first and
/// its verdict last, and both matter to the model. Text within the bound is returned as it is. A
/// bound smaller than the note itself leaves only the note.
pub fn bounded_text(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let note = |cut: usize| {
        format!("\n[... {cut} bytes cut from the middle ({total} bytes in all) ...]\n")
    };
    // The cut is never more than the whole, so the note is never longer than this.
    let room = max.saturating_sub(note(total).len());
    let mut head_end = room / 2;
    while head_end > 0 && !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = total - (room - room / 2);
    while tail_start < total && !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}{}{}",
        text.get(..head_end).unwrap_or_default(),
        note(tail_start - head_end),
        text.get(tail_start..).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_keeps_its_head_and_tail_on_char_boundaries_within_the_bound() {
        let text = format!("head é{}é tail", "ü".repeat(5000));
        let shown = bounded_text(text.clone(), 300);
        assert!(shown.len() <= 300, "{}", shown.len());
        assert!(shown.starts_with("head é"), "{shown}");
        assert!(shown.ends_with("é tail"), "{shown}");
        assert!(
            shown.contains(&format!(
                "bytes cut from the middle ({} bytes in all)",
                text.len()
            )),
            "{shown}"
        );
        assert_eq!(bounded_text("short".into(), 5), "short");
    }
}
