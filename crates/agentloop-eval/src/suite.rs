//! A suite: the cases of a dataset with their checks built, ready to run.

use crate::dataset::Case;
use crate::score::Check;

/// A case with its built checks.
pub struct SuiteCase {
    /// The case.
    pub case: Case,
    /// Its checks, built once.
    pub checks: Vec<Box<dyn Check>>,
}

/// The cases of an evaluation, ready to run.
pub struct Suite {
    /// The suite's name (the dataset's).
    pub name: String,
    /// The cases.
    pub cases: Vec<SuiteCase>,
}
