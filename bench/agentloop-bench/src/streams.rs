//! Stream parsing throughput: each provider's `parse_stream_bytes` (its SSE reader, its event
//! decoder and the shared `ResponseAccumulator`, minus the socket) over the recorded fixture
//! streams, in MB/s, beside plain `serde_json` parsing every `data:` payload of the same bytes.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentloop::{ModelError, ModelResponse};
use agentloop_providers::{anthropic, openai_chat, openai_responses};
use serde_json::{Value, json};

use crate::Opts;

/// The providers crate's recorded corpus, found from this crate's own folder so that the default
/// works wherever the repository is cloned (`--fixtures DIR` reads another one).
const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../crates/agentloop-providers/tests/fixtures"
);

type Parser = fn(&[u8]) -> Result<ModelResponse, ModelError>;

/// Which parser reads the streams of each fixture folder.
const PROVIDERS: &[(&str, &str, Parser)] = &[
    (
        "openai_chat",
        "openai_chat",
        openai_chat::parse_stream_bytes,
    ),
    (
        "openai_compatible",
        "openai_chat",
        openai_chat::parse_stream_bytes,
    ),
    (
        "openai_responses",
        "openai_responses",
        openai_responses::parse_stream_bytes,
    ),
    ("anthropic", "anthropic", anthropic::parse_stream_bytes),
];

/// The baseline: every `data:` payload of an event stream parsed into a `serde_json::Value`.
fn serde_json_baseline(bytes: &[u8]) -> usize {
    let mut values = 0;
    for line in bytes.split(|b| *b == b'\n') {
        let Some(data) = line.strip_prefix(b"data:") else {
            continue;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        let data = data.strip_suffix(b"\r").unwrap_or(data);
        if data == b"[DONE]" {
            continue;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            black_box(&v);
            values += 1;
        }
    }
    values
}

fn sse_files(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "sse") {
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push((path, bytes));
        }
    }
    files.sort();
    Ok(files)
}

/// Repeats `f` over all `files` for at least `budget`; returns MB/s (10^6 bytes per second).
fn throughput(files: &[(PathBuf, Vec<u8>)], budget: Duration, mut f: impl FnMut(&[u8])) -> f64 {
    let bytes_per_pass: usize = files.iter().map(|(_, b)| b.len()).sum();
    // Warm the caches and the allocator.
    for (_, b) in files {
        f(b);
    }
    let start = Instant::now();
    let mut passes = 0u64;
    while start.elapsed() < budget {
        for (_, b) in files {
            f(b);
        }
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    (bytes_per_pass as f64 * passes as f64) / secs / 1e6
}

/// Measures every provider's parser and the baseline; prints one JSON line per fixture folder.
pub fn bench_streams(opts: &Opts) -> Result<(), String> {
    let root = PathBuf::from(opts.text("fixtures", FIXTURES));
    let budget = Duration::from_millis(opts.num("ms", 1000)?);
    for (folder, parser_name, parser) in PROVIDERS {
        let files = sse_files(&root.join(folder))?;
        if files.is_empty() {
            continue;
        }
        let bytes: usize = files.iter().map(|(_, b)| b.len()).sum();
        let mut parsed_ok = 0usize;
        let mut failed = Vec::new();
        for (path, b) in &files {
            match parser(b) {
                Ok(_) => parsed_ok += 1,
                Err(e) => failed.push(format!(
                    "{}: {}",
                    path.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    e.code()
                )),
            }
        }
        let accumulator_mbs = throughput(&files, budget, |b| {
            let _ = black_box(parser(black_box(b)));
        });
        let serde_mbs = throughput(&files, budget, |b| {
            black_box(serde_json_baseline(black_box(b)));
        });
        let line = json!({
            "system": "agentloop",
            "bench": "streams",
            "fixtures": folder,
            "parser": format!("{parser_name}::parse_stream_bytes"),
            "files": files.len(),
            "bytes": bytes,
            "parsed_ok": parsed_ok,
            "failed": failed,
            "accumulator_mb_s": accumulator_mbs,
            "serde_json_mb_s": serde_mbs,
            "ratio": accumulator_mbs / serde_mbs,
        });
        println!("{line}");
    }
    Ok(())
}
