//! Policies that wrap any [`agentloop::Model`]: [`Retry`](retry::Retry) re-asks one model after
//! a retryable failure, [`Fallback`](fallback::Fallback) moves on to the next model. Both share one
//! attempt loop, which starts over before the first byte or part-way through a stream, and then
//! tells the caller to discard what it received ([`agentloop::model::ModelEvent::Retrying`]).

pub(crate) mod fallback;
pub(crate) mod retry;
