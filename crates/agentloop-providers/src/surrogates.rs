//! Bodies and events whose string escapes hold a lone UTF-16 surrogate, read with each lone half
//! as U+FFFD instead of failing: the core's repair ([`agentloop::surrogates`], which says why
//! U+FFFD is the honest reading), applied to the fields a response carries whole.
//!
//! Delta strings split between two events are not read here: [`crate::wire_text`] joins their
//! halves across events, and its readers never fail on a lone half, so their events reach this
//! path only when another field of the same event holds one.

pub(crate) use agentloop::surrogates::{from_slice, from_str, replace_lone_str};
