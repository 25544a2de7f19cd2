//! The native part of the `agentloop` Python package: the Rust runtime (the loop, providers,
//! limits, permissions, journal, sessions, traces) driven from Python. Python holds the tools and
//! the callbacks; this module runs every agent on one tokio runtime of its own (a run of
//! `run_async` or `stream` polled on its event loop's thread, with the runtime's context entered:
//! the `drive` module) and takes the GIL only to call them, so a waiting run never holds it.
//!
//! The Python side (`python/agentloop/`) is the API users see; what it calls here is small and
//! untyped on purpose: JSON across the boundary, the same JSON the CLI prints (the outcome and a
//! call's arguments as the dicts and lists `json.loads` would give, built here: no text between).

mod agent;
mod drive;
mod exit;
mod model;
mod otel;
mod outbox;
mod protect;
mod tool;
mod value;

use std::sync::OnceLock;

use pyo3::prelude::*;

/// The runtime every run of the process shares. Two workers: a run waiting on a Python tool or
/// callback never stops another run.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("agentloop")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| error("runtime.start", e))
}

/// An `agentloop.AgentloopError` with a stable code, as the Python package defines it.
pub(crate) fn error(code: &str, message: impl std::fmt::Display) -> PyErr {
    let message = message.to_string();
    // Made only on a thread of Python's that holds the GIL (a method called from Python): a
    // failure on the runtime's threads travels as a code and a message until it reaches one.
    Python::attach(|py| {
        let made = py
            .import("agentloop.errors")
            .and_then(|m| m.getattr("AgentloopError"))
            .and_then(|cls| cls.call1((code, message.as_str())));
        match made {
            Ok(value) => PyErr::from_value(value),
            Err(e) => e,
        }
    })
}

/// The module `agentloop._agentloop`.
#[pymodule]
fn _agentloop(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<agent::NativeAgent>()?;
    m.add_class::<agent::RunHandle>()?;
    m.add_class::<outbox::ToolReply>()?;
    // `outbox::Drain`, `drive::Poll` and `model::Settled` are callbacks the module hands the event
    // loop, made with `Py::new`: not part of the package's surface, so not exported (nor stubbed).
    m.add_function(wrap_pyfunction!(agent::answer, m)?)?;
    m.add_function(wrap_pyfunction!(agent::reply, m)?)?;
    m.add_function(wrap_pyfunction!(protect::protect_process, m)?)?;
    m.add_function(wrap_pyfunction!(exit::before_exit, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
