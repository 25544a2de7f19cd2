//! Whether a call's streamed arguments stop inside a JSON value (a string or a bracket left
//! open): the mark of a stream cut short, told apart from closed JSON that does not parse, which
//! is what the model wrote. Counted as the fragments pass, without a copy of the arguments.

/// The open strings and brackets of a call's arguments so far.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OpenJson {
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl OpenJson {
    /// Takes in these bytes after those before.
    pub(super) fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
    }

    /// True when the arguments so far end inside a string or an unclosed bracket.
    pub(super) fn is_open(&self) -> bool {
        self.in_string || self.depth > 0
    }
}

#[cfg(test)]
mod tests {
    use super::OpenJson;

    fn open(pieces: &[&str]) -> bool {
        let mut json = OpenJson::default();
        for p in pieces {
            json.add(p.as_bytes());
        }
        json.is_open()
    }

    #[test]
    fn only_text_that_stops_inside_a_value_is_open() {
        for cut in [
            &["{\"a\""][..],
            &["{\"a\":\"x"],
            &["{\"a\":\"x\\"],
            &["[1,", "{"],
            &["\"ab"],
        ] {
            assert!(open(cut), "{cut:?}");
        }
        for closed in [
            &[""][..],
            &["{}"],
            &["{\"a\":1,}"],
            &["{\"a\":\"}{\\\"\"}"],
            &["{\"a\"", ":1}"],
        ] {
            assert!(!open(closed), "{closed:?}");
        }
    }
}
