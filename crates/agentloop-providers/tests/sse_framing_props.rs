//! The server-sent-events reader frames events exactly as the `eventsource-stream` crate does
//! (the reader it replaced, kept here as the reference): for any valid UTF-8 text cut into any
//! chunks, both give the same events in the same order. Invalid UTF-8 and the event budget are
//! errors of ours, pinned by the unit tests in `src/sse.rs`. One difference is on purpose: the
//! crate panics on a stream that opens with a byte-order mark (it slices the 3-byte mark at byte
//! 1); ours drops the mark, as the format says, so the reference is only given streams without one.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use agentloop::ModelError;
use agentloop_providers::sse::{SseEvent, SseStream};
use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use proptest::prelude::*;

/// Pieces of event streams, line ends of every kind and characters of several byte lengths, so
/// that random texts hit every rule of the format.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("data".to_owned()),
        Just("data:".to_owned()),
        Just("data: ".to_owned()),
        Just("event: ".to_owned()),
        Just("event:x".to_owned()),
        Just("id: 7".to_owned()),
        Just("retry: 10".to_owned()),
        Just(":".to_owned()),
        Just(": comment".to_owned()),
        Just(" ".to_owned()),
        Just("\n".to_owned()),
        Just("\r".to_owned()),
        Just("\r\n".to_owned()),
        Just("\n\n".to_owned()),
        Just("\u{feff}".to_owned()),
        Just("é€😀".to_owned()),
        Just(r#"{"type":"content_block_delta","delta":{"text":"hi"}}"#.to_owned()),
        "[ -~]{0,8}",
    ]
}

/// A text, and where to cut its bytes into chunks.
fn text_and_cuts() -> impl Strategy<Value = (String, Vec<usize>)> {
    proptest::collection::vec(fragment(), 0..30).prop_flat_map(|pieces| {
        // The reference waits after a final CR for a possible LF; a closing LF settles it.
        let text = pieces.concat().trim_start_matches('\u{feff}').to_owned() + "\n";
        let len = text.len();
        (
            Just(text),
            proptest::collection::vec(0..=len, 0..8).prop_map(|mut cuts| {
                cuts.sort_unstable();
                cuts
            }),
        )
    })
}

fn chunks(text: &str, cuts: &[usize]) -> Vec<Bytes> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        out.push(Bytes::copy_from_slice(&bytes[start..cut]));
        start = cut;
    }
    out
}

fn ours(chunks: Vec<Bytes>) -> Vec<(String, String)> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, ModelError>));
    let events = SseStream::new(stream, "p", None, usize::MAX).map(|e| {
        let e: SseEvent = e.unwrap();
        (e.event, e.data)
    });
    futures::executor::block_on(events.collect())
}

fn reference(chunks: Vec<Bytes>) -> Vec<(String, String)> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    let events = stream.eventsource().map(|e| {
        let e = e.unwrap();
        (e.event, e.data)
    });
    futures::executor::block_on(events.collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn events_match_the_eventsource_stream_crate_for_any_text_and_chunking(
        (text, cuts) in text_and_cuts()
    ) {
        prop_assert_eq!(ours(chunks(&text, &cuts)), reference(chunks(&text, &cuts)));
    }
}

#[test]
fn line_end_kinds_comments_and_a_leading_bom_frame_like_the_reference() {
    let text =
        "\u{feff}event: a\r\ndata: 1\rdata:2\n\n: note\ndata\n\nevent: gone\n\ndata:  x\r\n\r\n";
    let expected = vec![
        ("a".to_owned(), "1\n2".to_owned()),
        ("message".to_owned(), String::new()),
        ("message".to_owned(), " x".to_owned()),
    ];
    assert_eq!(ours(vec![Bytes::from(text)]), expected);
    let without_bom = text.trim_start_matches('\u{feff}');
    assert_eq!(reference(vec![Bytes::from(without_bom)]), expected);
    // Cut at every byte (inside the BOM, between CR and LF): the same events.
    let bytewise: Vec<Bytes> = text
        .as_bytes()
        .iter()
        .map(|b| Bytes::copy_from_slice(&[*b]))
        .collect();
    assert_eq!(ours(bytewise), expected);
}
