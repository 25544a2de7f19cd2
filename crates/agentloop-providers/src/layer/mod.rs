//! Policies that wrap any [`agentloop::Model`]: [`Retry`](retry::Retry) re-asks one model after
//! a retryable failure, [`Fallback`](fallback::Fallback) moves on to the next model. Both share one
//! attempt loop, which only starts over while nothing of the response has reached the caller.

pub mod fallback;
pub mod retry;
