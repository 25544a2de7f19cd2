//! What can go wrong between agentloop and Restate (the codes are in the crate's table).

/// An error of the Restate side: the ingress, the admin API, the endpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestateError {
    /// A Restate identity key that is not one (`publickeyv1_` and the key).
    #[error("not a Restate identity key: {message}")]
    IdentityKey {
        /// Why.
        message: String,
    },
    /// The ingress could not be reached, or refused the request.
    #[error("the Restate ingress at {url}: {message}")]
    Ingress {
        /// The ingress's base URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The admin API could not be reached, or refused the request.
    #[error("the Restate admin API at {url}: {message}")]
    Admin {
        /// The admin API's base URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// An answer could not be read.
    #[error("an answer from Restate could not be read: {message}")]
    Response {
        /// What went wrong.
        message: String,
    },
    /// The endpoint could not listen.
    #[error("the service endpoint cannot listen on {addr}: {message}")]
    Endpoint {
        /// The address.
        addr: String,
        /// Why.
        message: String,
    },
    /// The run waits on no approval or question of this call.
    #[error("run {run} waits on no approval or question of call {call}")]
    NoSuchCall {
        /// The run (its invocation id).
        run: String,
        /// The call id asked for.
        call: String,
    },
    /// The call is a question: it takes an answer (`Ingress::reply`), not an approval.
    #[error("call {call} of run {run} is a question: answer it with `agentloop answer`")]
    Question {
        /// The run (its invocation id).
        run: String,
        /// The call id.
        call: String,
    },
    /// The call waits for approval, not for an answer.
    #[error("call {call} of run {run} waits for approval, not an answer: use `agentloop approve`")]
    NotAQuestion {
        /// The run (its invocation id).
        run: String,
        /// The call id.
        call: String,
    },
    /// The answer does not fit its question (its code is the core's: `answer.invalid`, ...).
    #[error(transparent)]
    Answer(#[from] agentloop::ask::AnswerError),
}

impl RestateError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RestateError::Ingress { .. } => "restate.ingress",
            RestateError::Admin { .. } => "restate.admin",
            RestateError::Response { .. } => "restate.response",
            RestateError::Endpoint { .. } => "restate.endpoint",
            RestateError::IdentityKey { .. } => "restate.identity_key",
            RestateError::NoSuchCall { .. } => "restate.no_such_call",
            RestateError::Question { .. } => "restate.question",
            RestateError::NotAQuestion { .. } => "restate.not_a_question",
            RestateError::Answer(e) => e.code(),
        }
    }
}
