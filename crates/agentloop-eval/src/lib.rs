//! Evals on agentloop runs: know whether an agent got better or worse.
//!
//! A [`Dataset`] holds cases (an input or a conversation, metadata, checks), read from TOML or
//! JSON Lines or built in code. Each case runs as an ordinary run of the agent ([`evaluate`],
//! [`evaluate_agent`]), `repeat` times, `concurrency` at a time, and each run is scored by its
//! checks: the built-in ones ([`CheckSpec`]: the output, the stop reason, the tools called and
//! their order, the turns, tool calls, tokens, dollars and seconds, a [`Judge`] agent's verdict)
//! and a user's own ([`Check`]). The [`Report`] gives pass rates per case and per check, pass@k
//! and pass^k, the mean and spread of cost, tokens, turns and time, as a table, JSON or JUnit
//! XML; [`compare`] names what got worse against a baseline report.
//!
//! ```no_run
//! # async fn demo(agent: agentloop::Agent) -> Result<(), agentloop_eval::EvalError> {
//! use std::collections::HashMap;
//! use agentloop_eval::{Case, CheckSpec, Dataset, EvalOptions, Suite, SuiteCase};
//!
//! let dataset = Dataset::new("weather", vec![
//!     Case::new("paris", "The weather in Paris?")
//!         .check(CheckSpec::StopReason("finished".into()))
//!         .check(CheckSpec::Contains("Paris".into())),
//! ])?;
//! let cases = dataset.cases.iter().map(|case| {
//!     Ok(SuiteCase { case: case.clone(), checks: agentloop_eval::build_checks(case, &HashMap::new())? })
//! }).collect::<Result<_, agentloop_eval::EvalError>>()?;
//! let suite = Suite { name: dataset.name, cases };
//! let options = EvalOptions { repeat: 3, concurrency: 2 };
//! let report = agentloop_eval::evaluate_agent(&agent, &suite, options, |_| Default::default()).await;
//! print!("{}", report.render_table());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod baseline;
pub mod check;
pub mod dataset;
pub mod error;
pub mod judge;
mod junit;
pub mod report;
pub mod run;
pub mod score;
pub mod spec;
pub mod suite;

pub use baseline::{Tolerance, compare};
pub use check::build_checks;
pub use dataset::{Case, Dataset};
pub use error::EvalError;
pub use judge::{Judge, VERDICT_SCHEMA};
pub use report::{
    CaseReport, CheckRate, CheckResult, Regression, Report, RunReport, Stat, Summary,
};
pub use run::{EvalOptions, RunRequest, evaluate, evaluate_agent};
pub use score::{Check, Score};
pub use spec::{CheckSpec, JudgeSpec, Order, ToolMatch, Trajectory};
pub use suite::{Suite, SuiteCase};
