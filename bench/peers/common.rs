//! What the Rust peers' harnesses share (each includes this file): their `--name value` options,
//! the process's CPU time and its peak RSS, measured the way `agentloop-bench` measures them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The loop's shape and warm-up runs from the command line's `--name number` pairs (`--runs`,
/// `--turns`, `--calls`, `--warmup`; 200, 10, 3 and 20 when not given).
pub fn shape() -> Result<(Shape, u32), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut map = HashMap::new();
    for pair in args.chunks(2) {
        let [key, value] = pair else {
            return Err(format!("{} needs a value", pair[0]));
        };
        let name = key
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {key}"))?;
        map.insert(
            name.to_owned(),
            value
                .parse()
                .map_err(|_| format!("--{name} wants a number"))?,
        );
    }
    let get = |name: &str, default: u32| map.get(name).copied().unwrap_or(default);
    let shape = Shape {
        runs: get("runs", 200),
        turns: get("turns", 10),
        calls: get("calls", 3),
    };
    Ok((shape, get("warmup", 20)))
}

/// CPU time (user + system) of the whole process so far, in seconds.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The process's peak resident set so far, in KiB (`ru_maxrss`).
pub fn peak_rss_kb() -> i64 {
    // SAFETY: an all-zero rusage is valid; getrusage only writes to it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss
}

/// Model calls answered, over all runs (the harness counts them).
pub static MODEL_CALLS: AtomicU64 = AtomicU64::new(0);
/// Tool executions, over all runs (the harness counts them).
pub static TOOL_EXECUTIONS: AtomicU64 = AtomicU64::new(0);

/// The loop's shape.
pub struct Shape {
    /// Runs.
    pub runs: u32,
    /// Tool turns a run.
    pub turns: u32,
    /// Calls a tool turn.
    pub calls: u32,
}

/// When the timed runs started: wall clock and CPU time.
pub struct Started(Instant, f64);

/// Zeroes the counters (the warm-up's calls are not the timed runs') and starts the clocks.
pub fn start_timing() -> Started {
    MODEL_CALLS.store(0, Ordering::Relaxed);
    TOOL_EXECUTIONS.store(0, Ordering::Relaxed);
    Started(Instant::now(), cpu_seconds())
}

/// Prints the one JSON line of the timed runs since `started`.
pub fn print_loop(system: &str, version: &str, shape: &Shape, started: Started) {
    let Started(t0, cpu0) = started;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let line = serde_json::json!({
        "system": system,
        "version": version,
        "bench": "loop",
        "runs": shape.runs, "turns": shape.turns, "calls": shape.calls,
        "model_calls": MODEL_CALLS.load(Ordering::Relaxed),
        "tool_executions": TOOL_EXECUTIONS.load(Ordering::Relaxed),
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_kb": peak_rss_kb(),
    });
    println!("{line}");
}
