//! What a server on this machine lets in: a request that names the server by a loopback name or
//! by the address it listens on, in its `Host`. The check is every agentloop server's, so it
//! lives in `agentloop-serve`; it is named here too, where it was first.

pub use agentloop_serve::{allowed_hosts, host_checked};
