//! The errors of an evaluation, each with a stable code: a dataset that cannot be read or is
//! wrong, a check that cannot be built, a baseline that cannot be read, a report that cannot be
//! written.

/// What stops an evaluation before or after its runs (a case that fails is not an error: it is
/// in the report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// The dataset could not be read.
    #[error("cannot read the cases {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The dataset is not valid: bad TOML or JSON, an unknown key, no cases, a repeated name.
    #[error("the cases {path} are invalid: {message}")]
    Dataset {
        /// The file (or `<memory>`).
        path: String,
        /// What is wrong, with the line where known.
        message: String,
    },
    /// A check could not be built (a regex or schema that does not compile, an unknown judge).
    #[error("case {case}: the check {check} is invalid: {message}")]
    Check {
        /// The case.
        case: String,
        /// The check's label.
        check: String,
        /// What is wrong.
        message: String,
    },
    /// The baseline report could not be read.
    #[error("cannot read the baseline {path}: {message}")]
    Baseline {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The report could not be written.
    #[error("cannot write the report: {message}")]
    Report {
        /// What went wrong.
        message: String,
    },
}

impl EvalError {
    /// The stable code: `eval.read`, `eval.dataset`, `eval.check`, `eval.baseline`,
    /// `eval.report`.
    pub fn code(&self) -> &'static str {
        match self {
            EvalError::Read { .. } => "eval.read",
            EvalError::Dataset { .. } => "eval.dataset",
            EvalError::Check { .. } => "eval.check",
            EvalError::Baseline { .. } => "eval.baseline",
            EvalError::Report { .. } => "eval.report",
        }
    }
}
