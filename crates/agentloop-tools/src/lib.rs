//! Built-in tools for agentloop. Today: [`CommandTool`], a tool that runs a program with its
//! arguments as one JSON document on stdin and hands its stdout to the model.
#![forbid(unsafe_code)]

pub mod command;

pub use command::{
    CommandTool, CommandToolError, DEFAULT_MAX_ERROR_BYTES, DEFAULT_MAX_OUTPUT_BYTES, is_secret_env,
};
