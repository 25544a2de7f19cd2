//! Accumulating the recorded Anthropic Messages and OpenAI Responses streams (SSE reader, event
//! parser, accumulator) against plain `serde_json` parsing every `data:` payload of the same bytes
//! into a `Value`. Only streams that end in a response are measured (the error fixtures stop early).
//! Run: `cargo bench -p agentloop-providers --bench anthropic_responses_stream`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::path::PathBuf;

use agentloop::{ModelError, ModelResponse};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

type Parse = fn(&[u8]) -> Result<ModelResponse, ModelError>;

fn streams(sub: &str, parse: Parse) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(sub);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "sse"))
        .map(|f| std::fs::read(f).unwrap())
        .filter(|bytes| parse(bytes).is_ok())
        .collect()
}

/// The `data:` payloads of a stream, split naively (the fixtures have one data line per event).
fn payloads(s: &[u8]) -> impl Iterator<Item = &str> {
    std::str::from_utf8(s)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
}

fn serde_json_values(streams: &[Vec<u8>]) {
    for s in streams {
        for data in payloads(std::hint::black_box(s)) {
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            std::hint::black_box(v);
        }
    }
}

/// The event parser alone, fed the payloads: no SSE reader, no accumulator.
fn anthropic_events(streams: &[Vec<u8>]) {
    for s in streams {
        let mut parser = agentloop_providers::anthropic::AnthropicStreamParser::new();
        let mut out = VecDeque::new();
        for data in payloads(std::hint::black_box(s)) {
            parser.push(data, &mut out).unwrap();
            std::hint::black_box(out.drain(..).count());
        }
    }
}

fn responses_events(streams: &[Vec<u8>]) {
    for s in streams {
        let mut parser = agentloop_providers::openai_responses::ResponsesStreamParser::new();
        let mut out = VecDeque::new();
        for data in payloads(std::hint::black_box(s)) {
            parser.push(data, &mut out).unwrap();
            std::hint::black_box(out.drain(..).count());
        }
    }
}

fn bench_api(c: &mut Criterion, name: &str, sub: &str, parse: Parse, events_only: fn(&[Vec<u8>])) {
    let streams = streams(sub, parse);
    assert!(!streams.is_empty(), "no {sub} streams to measure");
    let total: usize = streams.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Bytes(total as u64));
    group.bench_function("accumulate", |b| {
        b.iter(|| {
            for s in &streams {
                std::hint::black_box(parse(std::hint::black_box(s)).unwrap());
            }
        })
    });
    group.bench_function("serde_json_value", |b| {
        b.iter(|| serde_json_values(&streams))
    });
    group.bench_function("event_parser_only", |b| b.iter(|| events_only(&streams)));
    group.bench_function("sse_reader_only", |b| {
        b.iter(|| {
            for s in &streams {
                let mut sse = agentloop_providers::sse::SseStream::from_bytes(
                    bytes::Bytes::copy_from_slice(s),
                    "bench",
                );
                futures::executor::block_on(async {
                    while let Some(e) = futures::StreamExt::next(&mut sse).await {
                        std::hint::black_box(e.unwrap());
                    }
                });
            }
        })
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    bench_api(
        c,
        "anthropic_stream",
        "anthropic",
        agentloop_providers::anthropic::parse_stream_bytes,
        anthropic_events,
    );
    bench_api(
        c,
        "responses_stream",
        "openai_responses",
        agentloop_providers::openai_responses::parse_stream_bytes,
        responses_events,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
