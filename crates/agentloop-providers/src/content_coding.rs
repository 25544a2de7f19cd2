//! A response body compressed though the client asked for none. Every request says
//! `accept-encoding: identity`, yet some proxies and servers compress anyway (aiohttp's forced
//! compression, a gateway's blanket gzip): such a body is decoded here, before the event-stream
//! reader or the JSON parser sees it, rather than failing every call as undecodable.
//!
//! The bytes decide, not the label alone: a body labelled `gzip` that does not open with gzip's
//! magic number (a proxy that decompressed it and kept the header) is read as it is. `gzip` and
//! `deflate` are decoded; a body labelled with another coding (`br`, `zstd`) is read as it is
//! when it opens as plain text does, and is otherwise a `model.decode` error naming the coding.
//! Decoding is pulled a bounded piece at a time, so the response budgets count the decoded bytes
//! and a small body that inflates without end fails at its budget, never held whole.

use std::io::Write;

use agentloop::{ModelError, model::ModelErrorKind};
use bytes::Bytes;
use flate2::write::{MultiGzDecoder, ZlibDecoder};
use futures::{Stream, StreamExt, stream};

/// The most compressed bytes fed to the decoder at once: with deflate's ratio of about 1,000 to
/// one at most, a piece inflates to about a MiB at most before a budget sees it.
const PIECE: usize = 1024;

/// What the `content-encoding` header says the body is, as far as reading it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Coding {
    /// No coding (or `identity`).
    Identity,
    /// `gzip` or `x-gzip`.
    Gzip,
    /// `deflate` (zlib-wrapped, as RFC 9110 defines it).
    Deflate,
    /// A coding this client does not decode, by its name.
    Other(String),
}

/// The body's content coding, from the response's headers.
pub(crate) fn coding_of(headers: &reqwest::header::HeaderMap) -> Coding {
    let Some(value) = headers
        .get(reqwest::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return Coding::Identity;
    };
    // Several codings stacked (`gzip, br`) are undone last first; only one is read here, and a
    // stack is reported under its last name.
    let last = value
        .rsplit(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match last.as_str() {
        "" | "identity" => Coding::Identity,
        "gzip" | "x-gzip" => Coding::Gzip,
        "deflate" => Coding::Deflate,
        _ => Coding::Other(last),
    }
}

/// The inflater a body's first bytes call for.
enum Inflater {
    Gzip(MultiGzDecoder<Vec<u8>>),
    Zlib(ZlibDecoder<Vec<u8>>),
}

impl Inflater {
    /// Feeds `input`, returning how much was taken and all it decodes to. The decoder keeps the
    /// output of a write until the next one: flushed, the event a compressing proxy flushed
    /// comes now, not with the next bytes (which a server that holds the stream open after
    /// its answer never sends). The flush drains only what the input taken holds.
    fn feed(&mut self, input: &[u8]) -> std::io::Result<(usize, Vec<u8>)> {
        match self {
            Inflater::Gzip(d) => {
                let n = d.write(input)?;
                d.flush()?;
                Ok((n, std::mem::take(d.get_mut())))
            }
            Inflater::Zlib(d) => {
                let n = d.write(input)?;
                d.flush()?;
                Ok((n, std::mem::take(d.get_mut())))
            }
        }
    }

    /// The input ended: the output still held, or an error when the compressed body is cut.
    fn finish(&mut self) -> std::io::Result<Vec<u8>> {
        match self {
            Inflater::Gzip(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Inflater::Zlib(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

/// True when `head` opens with the magic number of gzip.
fn is_gzip(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b])
}

/// True when `head` opens with a zlib header (method 8, a check that divides by 31): plain JSON
/// or an event stream never does (`{` is 0x7b, a letter or blank is no method 8).
fn is_zlib(head: &[u8]) -> bool {
    match head {
        [cmf, flg, ..] => cmf & 0x0f == 8 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0,
        _ => false,
    }
}

/// True when `head` opens (after blanks) as a JSON document, an HTML page or an event stream.
fn opens_as_text(head: &[u8]) -> bool {
    matches!(
        head.iter().find(|b| !b.is_ascii_whitespace()),
        None | Some(b'{' | b'[' | b'<' | b':' | b'd' | b'e' | b'i' | b'r')
    )
}

struct Inflating<S> {
    chunks: S,
    inflater: Inflater,
    pending: Bytes,
    ended: bool,
}

/// `chunks` decoded as `coding` says, when their first bytes agree; as they are otherwise.
pub(crate) fn decoded<S>(
    chunks: S,
    coding: Coding,
    provider: String,
) -> impl Stream<Item = Result<Bytes, ModelError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, ModelError>> + Send + Unpin + 'static,
{
    let start = async move {
        let mut chunks = chunks;
        let mut head = Vec::new();
        // Two bytes tell gzip and zlib; a body that ends sooner is read as it is.
        while head.len() < 2 {
            match chunks.next().await {
                Some(Ok(chunk)) => head.extend_from_slice(&chunk),
                Some(Err(e)) => return stream::iter([Err(e)]).left_stream().left_stream(),
                None => break,
            }
        }
        let inflater = match &coding {
            Coding::Gzip if is_gzip(&head) => Inflater::Gzip(MultiGzDecoder::new(Vec::new())),
            Coding::Deflate if is_zlib(&head) => Inflater::Zlib(ZlibDecoder::new(Vec::new())),
            Coding::Other(name) if !opens_as_text(&head) => {
                let error = ModelError::new(
                    ModelErrorKind::Decode,
                    format!(
                        "the server compressed the body with `{name}`, though asked for none; \
                         this client decodes gzip and deflate only"
                    ),
                )
                .with_provider(provider);
                return stream::iter([Err(error)]).left_stream().left_stream();
            }
            _ => {
                let head = stream::iter([Ok(Bytes::from(head))]);
                return head.chain(chunks).right_stream().left_stream();
            }
        };
        let state = Inflating {
            chunks,
            inflater,
            pending: Bytes::from(head),
            ended: false,
        };
        stream::unfold(state, move |st| inflate_step(st, provider.clone())).right_stream()
    };
    stream::once(start).flatten()
}

/// The next decoded piece: feeds what is pending a piece at a time, reading on when it is spent.
async fn inflate_step<S>(
    mut st: Inflating<S>,
    provider: String,
) -> Option<(Result<Bytes, ModelError>, Inflating<S>)>
where
    S: Stream<Item = Result<Bytes, ModelError>> + Unpin,
{
    let corrupt = |e: std::io::Error| {
        ModelError::new(
            ModelErrorKind::Decode,
            format!("the compressed response body is corrupt or cut short: {e}"),
        )
        .with_provider(provider.clone())
    };
    loop {
        if st.ended {
            return None;
        }
        if st.pending.is_empty() {
            match st.chunks.next().await {
                Some(Ok(chunk)) => st.pending = chunk,
                Some(Err(e)) => {
                    st.ended = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.ended = true;
                    let rest = st.inflater.finish().map_err(corrupt);
                    return match rest {
                        Ok(rest) if rest.is_empty() => None,
                        rest => Some((rest.map(Bytes::from), st)),
                    };
                }
            }
            continue;
        }
        let piece = st.pending.len().min(PIECE);
        let fed = st.pending.get(..piece).unwrap_or_default();
        match st.inflater.feed(fed) {
            // Taking nothing of a non-empty piece: bytes after the compressed body's end.
            Ok((0, _)) => {
                st.ended = true;
                let e = std::io::Error::other("bytes after the end of the compressed data");
                return Some((Err(corrupt(e)), st));
            }
            Ok((taken, out)) => {
                let _ = st.pending.split_to(taken.min(st.pending.len()));
                if !out.is_empty() {
                    return Some((Ok(Bytes::from(out)), st));
                }
            }
            Err(e) => {
                st.ended = true;
                return Some((Err(corrupt(e)), st));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_never_looks_compressed() {
        for text in [&b"{\"a\""[..], b"data: x", b"[1]", b"  {", b"<html"] {
            assert!(!is_gzip(text) && !is_zlib(text), "{text:?}");
            assert!(opens_as_text(text), "{text:?}");
        }
        assert!(is_zlib(&[0x78, 0x9c]) && is_zlib(&[0x78, 0x01]));
        assert!(!opens_as_text(&[0x1f, 0x8b]));
    }
}
