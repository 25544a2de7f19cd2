//! A running digest of a tool call's arguments, so that a stream parser can tell whether text
//! the server sends again (a restated fragment, a `done` event's whole arguments) begins with,
//! or is, what it already passed on, without keeping a copy of every call's arguments.

/// The length and FNV-1a digest of a call's arguments so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest {
    /// How many bytes went in.
    pub(crate) len: usize,
    hash: u64,
}

impl Default for Digest {
    fn default() -> Self {
        Digest {
            len: 0,
            hash: 0xcbf2_9ce4_8422_2325,
        }
    }
}

impl Digest {
    /// Takes in these bytes after those before.
    pub(crate) fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.len = self.len.saturating_add(bytes.len());
    }

    /// The digest of these bytes alone.
    pub(crate) fn of(bytes: &[u8]) -> Self {
        let mut digest = Digest::default();
        digest.add(bytes);
        digest
    }
}
