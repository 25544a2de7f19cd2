//! agentloop's runs driven by [Restate](https://restate.dev), a durable-execution engine, so that
//! a run survives any worker process and runs spread over several.
//!
//! Nothing here decides what a run does: the core's machine and its local driver do, exactly as
//! in one process. What this crate changes is where a durable run's journal lives. A local
//! durable run writes each step's result to a [`agentloop::journal::Journal`] before its machine
//! moves on; here that journal is the Restate invocation's own journal: each step's result is
//! one `ctx.run` entry. When a worker dies, Restate invokes the handler again (on the same
//! endpoint address, served by whichever worker process answers there); the handler reads the
//! entries back and hands them to [`agentloop::Agent::resume`], which replays them into a fresh machine and
//! goes on. So a model call or a tool call whose result was journaled is never made again, and a
//! call that was running at the crash follows the local journal's rule: it runs again when its
//! tool is idempotent, and is answered `interrupted` otherwise.
//!
//! - A conversation is a virtual object, [`SESSION_SERVICE`], keyed by the session key: its
//!   exclusive `run` handler takes one [`RunRequest`] at a time, so two runs of one session are
//!   serialized; the transcript is the object's state.
//! - A gate that asks a human suspends the run as locally; here each asked call becomes an
//!   awakeable. The invocation waits on them without holding a worker; the awakeables' ids are
//!   published on the run's [`RUNS_SERVICE`] object, where `agentloop approve --restate` finds
//!   them. The model's questions (`ask_user`) wait the same way: a question's awakeable takes
//!   its answer ([`Resolution::Reply`]), checked against the question's schema by
//!   [`Ingress::reply`] before it resolves anything.
//! - The run's events go to the worker's own sinks (a trace file) and to the run's
//!   [`RUNS_SERVICE`] object through the ingress, where `agentloop attach` follows them.
//!
//! A worker of one's own, serving one agent (the `agentloop serve` command does this for agent
//! files):
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use agentloop::{Agent, ModelResponse, testing::ScriptedModel};
//! use agentloop_restate::{Agents, EndpointOptions, Ingress, RestateError};
//!
//! struct Hello;
//!
//! impl Agents for Hello {
//!     fn agent(&self, name: &str) -> Result<Agent, String> {
//!         if name != "hello" {
//!             return Err(format!("no agent named {name}"));
//!         }
//!         // A resumed run's script goes on where its journal left it (`Model::resumed`).
//!         let model = ScriptedModel::new([ModelResponse::text("Hello!")]);
//!         Agent::builder()
//!             .name("hello")
//!             .model(model)
//!             .build()
//!             .map_err(|e| e.to_string())
//!     }
//! }
//!
//! # async fn worker() -> Result<(), RestateError> {
//! let mut options = EndpointOptions::default();
//! options.ingress = Some(Ingress::new("http://127.0.0.1:8080")?);
//! let endpoint = agentloop_restate::endpoint(Arc::new(Hello), options)?;
//! let addr = "127.0.0.1:9080".parse().expect("an address");
//! let listener = agentloop_restate::listener(addr)?;
//! // Restate discovers the services at the endpoint's address: serve, then register.
//! tokio::spawn(agentloop_restate::register("http://127.0.0.1:9070", "http://127.0.0.1:9080"));
//! agentloop_restate::serve(endpoint, listener, tokio::signal::ctrl_c()).await;
//! # Ok(())
//! # }
//! ```
//!
//! | code | meaning |
//! |---|---|
//! | `restate.ingress` | the Restate ingress could not be reached or refused the request |
//! | `restate.admin` | the Restate admin API could not be reached or refused the request |
//! | `restate.response` | an answer from Restate could not be read |
//! | `restate.endpoint` | the service endpoint could not listen on its address |
//! | `restate.identity_key` | an identity key given to the endpoint is not a Restate public key |
//! | `restate.no_such_call` | the run waits on no approval or question of this call |
//! | `restate.question` | the call is a question: it takes an answer, not an approval |
//! | `restate.not_a_question` | the call waits for approval, not for an answer |
//! | `answer.invalid`, `answer.bad_schema` | the answer does not fit the question (nothing was resolved) |

mod error;
pub mod ingress;
mod journal;
mod news;
mod service;

pub use error::RestateError;
pub use ingress::{Ingress, News, PendingApproval, Resolution, RunRequest};
pub use restate_sdk::endpoint::Endpoint;
pub use service::{Agents, EndpointOptions, endpoint, listener, register, serve};

/// The virtual object of conversations: key = session key, handler `run` (exclusive).
pub const SESSION_SERVICE: &str = "AgentSession";

/// The virtual object of a run's news (events and approvals): key = the run's invocation id.
pub const RUNS_SERVICE: &str = "AgentRuns";
