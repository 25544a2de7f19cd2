//! Accumulating the recorded Chat Completions streams (SSE reader, chunk parser, accumulator)
//! against plain `serde_json` parsing every `data:` payload of the same bytes into a `Value`.
//! Run: `cargo bench -p agentloop-providers --bench chat_stream`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn streams() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for sub in ["openai_chat", "openai_compatible"] {
        let mut files: Vec<_> = std::fs::read_dir(dir.join(sub))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            if f.extension().is_some_and(|e| e == "sse") {
                out.push(std::fs::read(f).unwrap());
            }
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let streams = streams();
    let total: usize = streams.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group("chat_stream");
    group.throughput(Throughput::Bytes(total as u64));
    group.bench_function("accumulate", |b| {
        b.iter(|| {
            for s in &streams {
                let r =
                    agentloop_providers::openai_chat::parse_stream_bytes(std::hint::black_box(s))
                        .unwrap();
                std::hint::black_box(r);
            }
        })
    });
    group.bench_function("serde_json_value", |b| {
        b.iter(|| {
            for s in &streams {
                let text = std::str::from_utf8(std::hint::black_box(s)).unwrap();
                for line in text.lines() {
                    if let Some(data) = line.strip_prefix("data: ")
                        && data.trim() != "[DONE]"
                    {
                        let v: serde_json::Value = serde_json::from_str(data).unwrap();
                        std::hint::black_box(v);
                    }
                }
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
