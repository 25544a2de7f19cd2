//! The report as JUnit XML for CI systems: the suite a test suite, each case a test case that
//! fails when any of its runs failed, its message the failed checks and their reasons.

use std::time::Duration;

use quick_junit::{NonSuccessKind, Property, TestCase, TestCaseStatus, TestSuite};

use crate::error::EvalError;
use crate::report::Report;

impl Report {
    /// The report as JUnit XML.
    pub fn to_junit(&self) -> Result<String, EvalError> {
        let mut suite = TestSuite::new(self.suite.clone());
        let mut total = 0.0;
        for c in &self.cases {
            let failures: Vec<String> = c
                .runs
                .iter()
                .filter(|r| !r.passed)
                .flat_map(|r| {
                    r.failures()
                        .into_iter()
                        .map(move |f| format!("run {}: {f}", r.repeat))
                })
                .collect();
            let status = if failures.is_empty() {
                TestCaseStatus::success()
            } else {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(format!("{} of {} runs passed", c.passed_runs, c.runs.len()));
                s.set_type("eval");
                s.set_description(failures.join("\n"));
                s
            };
            let mut case = TestCase::new(c.name.clone(), status);
            case.set_classname(self.suite.clone());
            case.set_assertions(c.checks.len());
            let seconds: f64 = c.runs.iter().map(|r| r.seconds).sum();
            total += seconds;
            case.set_time(Duration::try_from_secs_f64(seconds).unwrap_or_default());
            case.add_property(Property::new("pass_rate", format!("{:.4}", c.pass_rate)));
            case.add_property(Property::new("cost_usd", format!("{:.6}", c.cost_usd.mean)));
            suite.add_test_case(case);
        }
        suite.set_time(Duration::try_from_secs_f64(total).unwrap_or_default());
        let mut report = quick_junit::Report::new("agentloop eval");
        report.add_test_suite(suite);
        report.to_string().map_err(|e| EvalError::Report {
            message: e.to_string(),
        })
    }
}
