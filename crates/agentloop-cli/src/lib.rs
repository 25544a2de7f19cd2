//! The agent files of the `agentloop` command, as a library: what loads and checks an agent file
//! ([`agent_file::AgentFile::load`]), what assembles it into a runnable [`agentloop::Agent`]
//! ([`assemble::model`], [`assemble::StartedMcp::start`], [`assemble::agent`]), and the `--json`
//! object of a run ([`render::outcome_json`]). The binary uses these modules, and so does the
//! Python package, so that an agent file means the same thing wherever it is run; the rest of the
//! command line stays in the binary.
#![forbid(unsafe_code)]
// The modules were written as the binary's, whose docs link their private parts freely (the
// binary's docs are never built); those links stay, for whoever reads the source.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent_file;
pub mod assemble;
pub mod deferred;
pub mod error;
pub mod handoff;
pub mod live;
pub mod permission_file;
pub mod permission_paths;
pub mod render;
pub mod terminal;
pub mod text_file;
