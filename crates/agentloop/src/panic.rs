//! The message of a caught panic, for the operator: a panic in a tool, hook, gate, guardrail or
//! sink is isolated and reported with it, never a failure of the process.

use std::any::Any;

/// The text a panic was raised with, or a stand-in when its payload is not text.
pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a tool handler panicked".to_owned()
    }
}
