//! The chained SHA-256 sums of a journal's rows: a run's header's, each step's over the one
//! before it, and their hex text. Apart because the writer (which makes them) and the reader
//! (which checks them) share them.

use sha2::{Digest, Sha256};

/// A chained SHA-256 sum, as `step_log` holds it.
pub(crate) type Sum = [u8; 32];

/// The header's sum: `runs.header_sum` holds its hex text, which the first step chains from.
pub(super) fn header_sum(header: &str) -> Sum {
    Sha256::digest(header.as_bytes()).into()
}

/// A sum as lowercase hex digits, without allocating.
pub(crate) fn hex(sum: &Sum) -> [u8; 64] {
    let digit = |n: u8| if n < 10 { b'0' + n } else { b'a' + n - 10 };
    let mut out = [0u8; 64];
    for (pair, byte) in out.chunks_exact_mut(2).zip(sum) {
        if let [high, low] = pair {
            *high = digit(byte >> 4);
            *low = digit(byte & 0x0f);
        }
    }
    out
}

/// A sum's hex text, as `runs.header_sum` holds it.
pub(super) fn hex_text(sum: &Sum) -> String {
    hex(sum).iter().map(|&b| char::from(b)).collect()
}

/// The sum whose hex text is `text` (64 lowercase digits), if it is one.
pub(crate) fn parse_sum(text: &str) -> Option<Sum> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut sum = [0u8; 32];
    for (out, pair) in sum.iter_mut().zip(bytes.chunks_exact(2)) {
        let [high, low] = pair else { return None };
        *out = (digit(*high)? << 4) | digit(*low)?;
    }
    Some(sum)
}

/// The sum of a run's header, when `stored` (its `header_sum`) is that sum's hex text.
pub(crate) fn checked_header(header: &str, stored: &str) -> Option<Sum> {
    let sum = header_sum(header);
    (hex(&sum).as_slice() == stored.as_bytes()).then_some(sum)
}

/// The chained sum of a step: over the previous sum's hex text (as version 1 chained it, so
/// that its sums hold as they are), the sequence number and the step's text.
pub(super) fn step_sum(previous: &Sum, seq: u64, step: &str) -> Sum {
    let mut h = Sha256::new();
    h.update(hex(previous));
    h.update(seq.to_le_bytes());
    h.update(step.as_bytes());
    h.finalize().into()
}
