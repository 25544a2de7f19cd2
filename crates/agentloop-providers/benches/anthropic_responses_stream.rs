//! Accumulating the recorded Anthropic Messages and OpenAI Responses streams (SSE reader, event
//! parser, accumulator) against plain `serde_json` parsing every `data:` payload of the same bytes
//! into a `Value`. Only streams that end in a response are measured (the error fixtures stop early).
//! Run: `cargo bench -p agentloop-providers --bench anthropic_responses_stream`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use agentloop::{ModelError, ModelResponse};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

type Parse = fn(&[u8]) -> Result<ModelResponse, ModelError>;

fn streams(sub: &str, parse: Parse) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/providers")
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

fn serde_json_values(streams: &[Vec<u8>]) {
    for s in streams {
        let text = std::str::from_utf8(std::hint::black_box(s)).unwrap();
        for line in text.lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                let v: serde_json::Value = serde_json::from_str(data).unwrap();
                std::hint::black_box(v);
            }
        }
    }
}

fn bench_api(c: &mut Criterion, name: &str, sub: &str, parse: Parse) {
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
    group.bench_function("sse_reader_only", |b| {
        b.iter(|| {
            for s in &streams {
                let mut sse = agentloop_providers::http::SseStream::from_bytes(
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
    );
    bench_api(
        c,
        "responses_stream",
        "openai_responses",
        agentloop_providers::openai_responses::parse_stream_bytes,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
