//! agentloop's side of the side-by-side benchmark (`bench/run.sh` drives it). Each subcommand
//! measures one thing in a fresh process and prints one JSON object per line, which the runner
//! checks (every run did its N×T×K tool calls) and tabulates:
//!
//! - `loop`: N runs, one after another, of T tool turns × K parallel no-op calls, then a final text
//!   turn; wall and CPU time per model call, peak RSS.
//! - `scale`: N runs at once, each T turns of a model that takes `model-ms` and K tools that take
//!   `tool-ms` (tokio timers); wall time against the ideal, RSS per concurrent run. `--polls true`
//!   also counts how often the runtime polled each run (a diagnostic: the count is one atomic
//!   shared by both cores, so its times are not comparable with a plain run's). `--runtime
//!   per-core`: one current-thread runtime a core, each with its share of the runs, in place of
//!   one multi-thread runtime (`multi`, the default) or one thread (`current`); `pinned`: the runs
//!   handed to `tokio_util`'s `LocalPoolHandle`, a thread a core.
//! - `journal`: the `loop` workload, 1, 10 and 100 runs at once, plain and journaled into one
//!   SQLite file at each durability level; steps per second and CPU per step.
//! - `allocs`: heap allocations (a counting global allocator) per turn, per tool call, per event
//!   and per journaled step on the `loop` workload.
//! - `streams`: each provider's SSE parser and the shared accumulator over the fixture streams,
//!   MB/s, beside `serde_json` over the same bytes.

mod alloc;
mod streams;
mod sys;
mod workload;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::workload::Workload;

#[global_allocator]
static COUNTING: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprintln!("usage: agentloop-bench loop|scale|journal|streams [--name value]...");
        return ExitCode::from(2);
    };
    let opts = match parse_opts(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = match command.as_str() {
        "loop" => bench_loop(&opts),
        "scale" => bench_scale(&opts),
        "streams" => streams::bench_streams(&opts),
        "journal" => bench_journal(&opts),
        "allocs" => bench_allocs(&opts),
        other => Err(format!("unknown command {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentloop-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--name value` pairs.
pub(crate) struct Opts(HashMap<String, String>);

impl Opts {
    pub(crate) fn num(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name} wants a number, got {v}")),
        }
    }

    pub(crate) fn text(&self, name: &str, default: &str) -> String {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }
}

fn parse_opts(rest: &[String]) -> Result<Opts, String> {
    let mut map = HashMap::new();
    let mut it = rest.iter();
    while let Some(key) = it.next() {
        let Some(name) = key.strip_prefix("--") else {
            return Err(format!("unexpected argument {key}"));
        };
        let Some(value) = it.next() else {
            return Err(format!("--{name} needs a value"));
        };
        map.insert(name.to_owned(), value.clone());
    }
    Ok(Opts(map))
}

fn u32_opt(opts: &Opts, name: &str, default: u32) -> Result<u32, String> {
    u32::try_from(opts.num(name, u64::from(default))?).map_err(|_| format!("--{name} is too large"))
}

fn bench_loop(opts: &Opts) -> Result<(), String> {
    let runs = u32_opt(opts, "runs", 200)?;
    let turns = u32_opt(opts, "turns", 10)?;
    let calls = u32_opt(opts, "calls", 3)?;
    let warmup = u32_opt(opts, "warmup", 20)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let work = Workload::new(turns, calls, None, None)?;
    rt.block_on(async {
        for _ in 0..warmup {
            work.run_once(turns, calls).await?;
        }
        Ok::<_, String>(())
    })?;
    work.reset();
    let cpu0 = sys::cpu_time();
    let t0 = Instant::now();
    rt.block_on(async {
        for _ in 0..runs {
            work.run_once(turns, calls).await?;
        }
        Ok::<_, String>(())
    })?;
    let wall = t0.elapsed();
    let cpu = sys::cpu_time().saturating_sub(cpu0);
    let line = json!({
        "system": "agentloop",
        "bench": "loop",
        "runs": runs, "turns": turns, "calls": calls,
        "model_calls": work.model_calls.load(Ordering::Relaxed),
        "tool_executions": work.tool_executions.load(Ordering::Relaxed),
        "wall_s": wall.as_secs_f64(),
        "cpu_s": cpu.as_secs_f64(),
        "peak_rss_kb": sys::peak_rss_kb(),
    });
    println!("{line}");
    Ok(())
}

/// `journal`: for each number of concurrent runs (`--concurrent 1,10,100`) and each durability
/// level (`--levels process,power`), `--rounds` rounds of that many runs at once of the `loop`
/// workload, journaled into one fresh SQLite file through one handle; beside them, the same
/// rounds plain. One line a (concurrency, level): steps per second, and wall and CPU time (all
/// threads, the journal's writer too) per step, the plain figures per the same step count.
fn bench_journal(opts: &Opts) -> Result<(), String> {
    let rounds = u32_opt(opts, "rounds", 3)?;
    let turns = u32_opt(opts, "turns", 10)?;
    let calls = u32_opt(opts, "calls", 3)?;
    let list = |name: &str, default: &str| -> Vec<String> {
        opts.text(name, default)
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let concurrency: Vec<usize> = list("concurrent", "1,10,100")
        .iter()
        .map(|c| {
            c.parse()
                .map_err(|_| format!("--concurrent: {c} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    let levels: Vec<agentloop_store::Durability> = list("levels", "process,power")
        .iter()
        .map(|l| l.parse())
        .collect::<Result<_, _>>()?;
    let dir = std::env::temp_dir().join(format!("agentloop-bench-journal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let work = Workload::new(turns, calls, None, None)?;
    // Runs `rounds` rounds of `c` runs at once; the wall and CPU time they took.
    let timed = |c: usize, journal: Option<std::sync::Arc<agentloop_store::SqliteJournal>>| {
        rt.block_on(async {
            let (c0, t0) = (sys::cpu_time(), Instant::now());
            for _ in 0..rounds {
                let runs = (0..c).map(|_| {
                    let options = agentloop::RunOptions {
                        journal: journal
                            .clone()
                            .map(|j| j as std::sync::Arc<dyn agentloop::journal::Journal>),
                        ..Default::default()
                    };
                    work.run_once_with(turns, calls, options)
                });
                for outcome in futures::future::join_all(runs).await {
                    outcome?;
                }
            }
            Ok::<_, String>((t0.elapsed(), sys::cpu_time().saturating_sub(c0)))
        })
    };
    for &c in &concurrency {
        let (plain, plain_cpu) = timed(c, None)?;
        for (i, &level) in levels.iter().enumerate() {
            let path = dir.join(format!("runs-{c}-{i}.db"));
            let journal = std::sync::Arc::new(
                agentloop_store::SqliteJournal::open(&path)
                    .map_err(|e| e.to_string())?
                    .with_durability(level),
            );
            let (wall, cpu) = timed(c, Some(journal.clone()))?;
            drop(journal);
            let entries = agentloop_store::JournalReader::open(&path)
                .and_then(|r| r.runs())
                .map_err(|e| e.to_string())?;
            let steps: u64 = entries.iter().map(|r| r.steps).sum();
            let per_step = |d: Duration| d.as_secs_f64() * 1e6 / steps.max(1) as f64;
            let line = json!({
                "system": "agentloop",
                "bench": "journal",
                "concurrent": c,
                "durability": level.as_str(),
                "rounds": rounds, "turns": turns, "calls": calls,
                "runs": entries.len(),
                "steps": steps,
                "steps_per_s": steps as f64 / wall.as_secs_f64().max(1e-9),
                "wall_us_per_step": per_step(wall),
                "cpu_us_per_step": per_step(cpu),
                "plain_steps_per_s": steps as f64 / plain.as_secs_f64().max(1e-9),
                "plain_wall_us_per_step": per_step(plain),
                "plain_cpu_us_per_step": per_step(plain_cpu),
                "wall_ratio": wall.as_secs_f64() / plain.as_secs_f64().max(1e-9),
            });
            println!("{line}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `allocs`: the heap allocations of the `loop` workload (N runs one after another, after a
/// warm-up), counted by the bench's global allocator over the timed runs only:
/// - per turn (model call) and per run, at K calls a tool turn;
/// - per tool call: the same runs at K and at K=1, the difference over the calls between them;
/// - per event: the same runs with an event sink that only counts, the difference over the events;
/// - per journaled step: the same runs journaled (SQLite, `process` durability, its writer thread
///   counted too), the difference over the steps the journal holds.
fn bench_allocs(opts: &Opts) -> Result<(), String> {
    let runs = u32_opt(opts, "runs", 200)?;
    let turns = u32_opt(opts, "turns", 10)?;
    let calls = u32_opt(opts, "calls", 3)?;
    let warmup = u32_opt(opts, "warmup", 20)?;
    if calls < 2 {
        return Err(
            "--calls must be at least 2 (a call's cost is the K against K=1 difference)".into(),
        );
    }
    alloc::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // The allocations of `runs` runs of `work` (after `warmup` runs), each with `options()`.
    let count = |work: &Workload, k: u32, options: &dyn Fn() -> agentloop::RunOptions| {
        rt.block_on(async {
            for _ in 0..warmup {
                work.run_once_with(turns, k, options()).await?;
            }
            let before = alloc::counts();
            for _ in 0..runs {
                work.run_once_with(turns, k, options()).await?;
            }
            Ok::<_, String>(alloc::counts().since(before))
        })
    };
    let plain = agentloop::RunOptions::default;
    let work = Workload::new(turns, calls, None, None)?;
    let base = count(&work, calls, &plain)?;
    let one = count(&Workload::new(turns, 1, None, None)?, 1, &plain)?;
    let events = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let observed_work = Workload::observed(turns, calls, events.clone())?;
    // The warm-up's events are not the timed runs'.
    let observed = rt.block_on(async {
        for _ in 0..warmup {
            observed_work.run_once(turns, calls).await?;
        }
        events.store(0, Ordering::Relaxed);
        let before = alloc::counts();
        for _ in 0..runs {
            observed_work.run_once(turns, calls).await?;
        }
        Ok::<_, String>(alloc::counts().since(before))
    })?;
    let event_count = events.load(Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("agentloop-bench-allocs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("runs.db");
    let journal = std::sync::Arc::new(
        agentloop_store::SqliteJournal::open(&path)
            .map_err(|e| e.to_string())?
            .with_durability(agentloop_store::Durability::Process),
    );
    let journaled_opts = || agentloop::RunOptions {
        journal: Some(journal.clone() as std::sync::Arc<dyn agentloop::journal::Journal>),
        ..Default::default()
    };
    let journaled = count(&work, calls, &journaled_opts)?;
    drop(journal);
    let entries = agentloop_store::JournalReader::open(&path)
        .and_then(|r| r.runs())
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    // Only the timed runs' steps: every run journals the same number.
    let steps_per_run = entries.first().map_or(0, |r| r.steps);
    let steps = steps_per_run * u64::from(runs);
    let model_calls = u64::from(runs) * u64::from(turns + 1);
    let extra_calls = u64::from(runs) * u64::from(turns) * u64::from(calls - 1);
    let per = |n: u64, d: u64| n as f64 / d.max(1) as f64;
    let diff = |a: alloc::Counts, b: alloc::Counts| a.total().saturating_sub(b.total());
    let line = json!({
        "system": "agentloop",
        "bench": "allocs",
        "runs": runs, "turns": turns, "calls": calls,
        "allocs_per_turn": per(base.total(), model_calls),
        "reallocs_per_turn": per(base.reallocs, model_calls),
        "bytes_per_turn": per(base.bytes, model_calls),
        "allocs_per_run": per(base.total(), u64::from(runs)),
        "allocs_per_call": per(diff(base, one), extra_calls),
        "events": event_count,
        "allocs_per_event": per(diff(observed, base), event_count),
        "journaled_steps": steps,
        "allocs_per_journaled_step": per(diff(journaled, base), steps),
    });
    println!("{line}");
    Ok(())
}

fn bench_scale(opts: &Opts) -> Result<(), String> {
    let runs = u32_opt(opts, "runs", 10_000)?;
    let turns = u32_opt(opts, "turns", 5)?;
    let calls = u32_opt(opts, "calls", 3)?;
    let model_ms = opts.num("model-ms", 20)?;
    let tool_ms = opts.num("tool-ms", 5)?;
    let threads = usize::try_from(opts.num("threads", 0)?).map_err(|e| e.to_string())?;
    let runtime = opts.text("runtime", "multi");
    // `per-core`: one current-thread runtime on a thread of its own per core (`--threads`, else
    // every core), each running its share of the runs: no run's state ever crosses a core.
    let cores = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let runtimes = match runtime.as_str() {
        "multi" => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if threads > 0 {
                builder.worker_threads(threads);
            }
            vec![builder.enable_all().build().map_err(|e| e.to_string())?]
        }
        "current" => vec![current_thread_runtime()?],
        "per-core" => (0..cores)
            .map(|_| current_thread_runtime())
            .collect::<Result<_, _>>()?,
        // The runs are handed to `tokio_util`'s pool from this thread's runtime.
        "pinned" => vec![current_thread_runtime()?],
        other => {
            return Err(format!(
                "--runtime is multi, current, per-core or pinned, not {other}"
            ));
        }
    };
    // Every model call waits `model-ms`, the final text answer's too: the ideal is
    // `turns` × (model + tool latency) + one more model latency.
    let work = Workload::new(
        turns,
        calls,
        Some(Duration::from_millis(model_ms)),
        Some(Duration::from_millis(tool_ms)),
    )?;
    let model_delay = Duration::from_millis(model_ms);
    let baseline_kb = sys::current_rss_kb();
    let bare = opts.text("bare", "false") == "true";
    let count_polls = opts.text("polls", "false") == "true";
    let tool_delay = Duration::from_millis(tool_ms);
    // `--rounds 2`: the runs again in the same process, timed alone, on a heap the first round
    // grew (a serving process's state); the default times a fresh process's first round.
    let rounds = u32_opt(opts, "rounds", 1)?.max(1);
    let (mut wall, mut cpu) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        // The counters and the clocks are the last round's.
        work.reset();
        let cpu0 = sys::cpu_time();
        let t0 = Instant::now();
        POLLS.store(0, Ordering::Relaxed);
        let pool = (runtime == "pinned").then(|| tokio_util::task::LocalPoolHandle::new(cores));
        let round = |rt: &tokio::runtime::Runtime, share: u32| {
            if let Some(pool) = &pool {
                return rt.block_on(pinned_round(
                    pool,
                    &work,
                    share,
                    bare,
                    (turns, calls),
                    (model_delay, tool_delay),
                ));
            }
            rt.block_on(scale_round(
                &work,
                share,
                bare,
                count_polls,
                (turns, calls),
                (model_delay, tool_delay),
            ))
        };
        let failures: Vec<String> = match runtimes.as_slice() {
            [rt] => round(rt, runs),
            _ => std::thread::scope(|scope| {
                let rounds: Vec<_> = runtimes
                    .iter()
                    .zip(split(runs, runtimes.len()))
                    .map(|(rt, share)| scope.spawn(move || round(rt, share)))
                    .collect();
                rounds
                    .into_iter()
                    .flat_map(|r| {
                        r.join()
                            .unwrap_or_else(|_| vec!["a runtime's thread panicked".into()])
                    })
                    .collect()
            }),
        };
        wall = t0.elapsed();
        cpu = sys::cpu_time().saturating_sub(cpu0);
        if let Some(first) = failures.first() {
            return Err(format!(
                "{} runs failed; the first: {first}",
                failures.len()
            ));
        }
    }
    let peak_kb = sys::peak_rss_kb();
    // What each spawned run holds inline, whatever it waits on: the run's future.
    let future_bytes = std::mem::size_of_val(&work.run_once(turns, calls));
    let ideal = (model_delay + Duration::from_millis(tool_ms)) * turns + model_delay;
    let mut line = json!({
        "system": if bare { "tokio alone (no agent loop)" } else { "agentloop" },
        "bench": "scale",
        "runs": runs, "turns": turns, "calls": calls,
        "model_ms": model_ms, "tool_ms": tool_ms, "runtime": runtime, "runtimes": runtimes.len(), "rounds": rounds,
        "allocator": alloc::NAME,
        "model_calls": work.model_calls.load(Ordering::Relaxed),
        "tool_executions": work.tool_executions.load(Ordering::Relaxed),
        "wall_s": wall.as_secs_f64(),
        "cpu_s": cpu.as_secs_f64(),
        "ideal_s": ideal.as_secs_f64(),
        "baseline_rss_kb": baseline_kb,
        "peak_rss_kb": peak_kb,
        "rss_per_run_kb": peak_kb.saturating_sub(baseline_kb) as f64 / f64::from(runs.max(1)),
        "run_future_bytes": if bare { 0 } else { future_bytes },
    });
    if count_polls {
        line["polls_per_run"] =
            json!(POLLS.load(Ordering::Relaxed) as f64 / f64::from(runs.max(1)));
    }
    println!("{line}");
    Ok(())
}

/// A current-thread runtime with timers.
fn current_thread_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// `runs` split as evenly as can be into `parts` shares.
fn split(runs: u32, parts: usize) -> Vec<u32> {
    let parts = u32::try_from(parts.max(1)).unwrap_or(u32::MAX);
    (0..parts)
        .map(|i| runs / parts + u32::from(i < runs % parts))
        .collect()
}

/// One round of the scale test: `runs` runs at once, each its own task; the failures.
async fn scale_round(
    work: &Workload,
    runs: u32,
    bare: bool,
    count_polls: bool,
    (turns, calls): (u32, u32),
    (model_delay, tool_delay): (Duration, Duration),
) -> Vec<String> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..runs {
        let work = work.clone();
        if bare {
            let run = async move {
                bare_run(&work, turns, calls, model_delay, tool_delay).await;
                Ok(())
            };
            spawn(&mut set, run, count_polls);
        } else {
            let run = async move { work.run_once(turns, calls).await.map(|_| ()) };
            spawn(&mut set, run, count_polls);
        }
    }
    let mut failures = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    failures
}

/// One round on `tokio_util`'s pool of threads, each run kept on the thread it started on.
async fn pinned_round(
    pool: &tokio_util::task::LocalPoolHandle,
    work: &Workload,
    runs: u32,
    bare: bool,
    (turns, calls): (u32, u32),
    (model_delay, tool_delay): (Duration, Duration),
) -> Vec<String> {
    let handles: Vec<_> = (0..runs)
        .map(|_| {
            let work = work.clone();
            pool.spawn_pinned(move || async move {
                if bare {
                    bare_run(&work, turns, calls, model_delay, tool_delay).await;
                    Ok(())
                } else {
                    work.run_once(turns, calls).await.map(|_| ())
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for handle in handles {
        match handle.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    failures
}

/// Spawns a run, counting its polls when asked (boxed then: the count is a diagnostic, and a
/// plain run's task is left as it was).
fn spawn<F>(set: &mut tokio::task::JoinSet<Result<(), String>>, run: F, count_polls: bool)
where
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    if count_polls {
        set.spawn(Counted(Box::pin(run)));
    } else {
        set.spawn(run);
    }
}

/// Polls of the runs, summed over the round (`scale --polls true`).
static POLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A run whose polls are counted in [`POLLS`]: a run that the loop wakes more often than its
/// timers would (a spurious or repeated wake) shows as more polls a run than the floor's.
struct Counted<F>(F);

impl<F: Future + Unpin> Future for Counted<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        POLLS.fetch_add(1, Ordering::Relaxed);
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// The scale test's floor: the same timers in the same shape (a model wait, then the calls' waits
/// joined, per turn, then the final answer's wait), with no agent loop around them. What a run
/// costs above this is the loop's own.
async fn bare_run(
    work: &Workload,
    turns: u32,
    calls: u32,
    model_delay: Duration,
    tool_delay: Duration,
) {
    for _ in 0..turns {
        tokio::time::sleep(model_delay).await;
        work.model_calls.fetch_add(1, Ordering::Relaxed);
        futures::future::join_all((0..calls).map(|_| async {
            tokio::time::sleep(tool_delay).await;
            work.tool_executions.fetch_add(1, Ordering::Relaxed);
        }))
        .await;
    }
    tokio::time::sleep(model_delay).await;
    work.model_calls.fetch_add(1, Ordering::Relaxed);
}
