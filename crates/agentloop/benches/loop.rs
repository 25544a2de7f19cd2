//! The loop's own cost: N runs × T tool turns × K parallel no-op calls, then a final text turn,
//! with a stateless scripted model whose calls carry raw JSON argument strings (so parsing and
//! validation are measured). The reported time is per turn (per model call): each criterion
//! iteration is N runs, and the time returned is divided by N × (T + 1).
//!
//! `t10` against `t50` shows whether a turn's cost grows with the transcript.
//! Run: `cargo bench -p agentloop --bench loop`. The side-by-side comparison with other agent
//! frameworks is `bench/run.sh` (see BENCHMARKS.md).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[allow(dead_code)]
#[path = "../../../bench/agentloop-bench/src/workload.rs"]
mod workload;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

use workload::Workload;

fn per_turn(c: &mut Criterion, name: &str, runs: u32, turns: u32, calls: u32) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let work = Workload::new(turns, calls, None, None).unwrap();
    let model_calls = u64::from(runs) * u64::from(turns + 1);
    let mut group = c.benchmark_group("loop_per_turn");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..iters {
                    for _ in 0..runs {
                        work.run_once(turns, calls).await.unwrap();
                    }
                }
            });
            let elapsed = start.elapsed();
            // One iteration is `runs` runs; report the time of one model call.
            elapsed / u32::try_from(model_calls).unwrap()
        });
    });
    group.finish();
}

fn loop_benches(c: &mut Criterion) {
    per_turn(c, "n200_t10_k3", 200, 10, 3);
    per_turn(c, "n200_t10_k1", 200, 10, 1);
    per_turn(c, "n40_t50_k3", 40, 50, 3);
}

criterion_group!(benches, loop_benches);
criterion_main!(benches);
