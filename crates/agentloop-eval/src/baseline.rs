//! A report against a baseline (an earlier report's JSON): what got worse is named, the suite's
//! pass rate, a case's, a check's within a case, and a case the baseline had that is gone. A
//! fall within the [`Tolerance`] is not counted, so a suite on a real model, whose runs spread,
//! can be compared without failing on noise: a fixed margin, and a number of standard errors of
//! the difference of two pass rates (each a share of its report's runs), which is wide for a case
//! of three runs and narrow for a suite of thirty.

use crate::report::{CheckRate, Regression, Report};

/// How far a pass rate may fall before it counts as worse.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tolerance {
    /// A fall of at most this much (0 to 1) is not counted.
    pub margin: f64,
    /// Nor a fall of at most this many standard errors of the difference of the two rates
    /// (`sqrt(p1(1-p1)/n1 + p2(1-p2)/n2)`): 2 lets through what two samples of the same model
    /// would differ by about one time in twenty.
    pub sigmas: f64,
}

impl Tolerance {
    /// True when the fall from `was` (over `n_was` runs) to `now` (over `n_now`) is beyond the
    /// tolerance.
    pub fn worse(&self, was: f64, n_was: usize, now: f64, n_now: usize) -> bool {
        let var = |p: f64, n: usize| {
            if n == 0 {
                0.0
            } else {
                p * (1.0 - p) / n as f64
            }
        };
        let spread = self.sigmas * (var(was, n_was) + var(now, n_now)).sqrt();
        was - now > self.margin.max(spread) + 1e-9
    }
}

/// Compares `current` with `baseline`: each pass rate (the suite's, each case's, each check's
/// within a case) that fell beyond the tolerance, and each case of the baseline that `current`
/// lacks.
pub fn compare(current: &Report, baseline: &Report, tolerance: Tolerance) -> Vec<Regression> {
    let pct = |v: f64| format!("{:.0}%", 100.0 * v);
    let mut out = Vec::new();
    let (was, now) = (baseline.summary.pass_rate, current.summary.pass_rate);
    if tolerance.worse(was, baseline.summary.runs, now, current.summary.runs) {
        out.push(Regression {
            case: None,
            check: None,
            baseline: was,
            current: now,
            message: format!(
                "the suite's pass rate fell from {} to {}",
                pct(was),
                pct(now)
            ),
        });
    }
    for b in &baseline.cases {
        let Some(c) = current.cases.iter().find(|c| c.name == b.name) else {
            out.push(Regression {
                case: Some(b.name.clone()),
                check: None,
                baseline: b.pass_rate,
                current: 0.0,
                message: format!("case {} is gone", b.name),
            });
            continue;
        };
        let (n_was, n_now) = (b.runs.len(), c.runs.len());
        if tolerance.worse(b.pass_rate, n_was, c.pass_rate, n_now) {
            out.push(Regression {
                case: Some(b.name.clone()),
                check: None,
                baseline: b.pass_rate,
                current: c.pass_rate,
                message: format!(
                    "case {}: its pass rate fell from {} to {}",
                    b.name,
                    pct(b.pass_rate),
                    pct(c.pass_rate)
                ),
            });
        }
        for (j, bc) in b.checks.iter().enumerate() {
            let Some(cc) = counterpart(&b.checks, j, &c.checks) else {
                continue;
            };
            if tolerance.worse(bc.pass_rate, n_was, cc.pass_rate, n_now) {
                out.push(Regression {
                    case: Some(b.name.clone()),
                    check: Some(bc.check.clone()),
                    baseline: bc.pass_rate,
                    current: cc.pass_rate,
                    message: format!(
                        "case {}, check {}: passed {} of runs, {} before",
                        b.name,
                        bc.check,
                        pct(cc.pass_rate),
                        pct(bc.pass_rate)
                    ),
                });
            }
        }
    }
    out
}

/// The check of `now` that is the `j`th of `was`: the one with the same key (its label, in a
/// baseline that kept none), and among checks that share it the one in the same place (the
/// second such now for the second such before).
fn counterpart<'a>(was: &[CheckRate], j: usize, now: &'a [CheckRate]) -> Option<&'a CheckRate> {
    let bc = was.get(j)?;
    let same = |a: &CheckRate, b: &CheckRate| {
        if a.key.is_empty() || b.key.is_empty() {
            a.check == b.check
        } else {
            a.key == b.key
        }
    };
    let nth = was.iter().take(j).filter(|x| same(x, bc)).count();
    now.iter().filter(|x| same(x, bc)).nth(nth)
}

#[cfg(test)]
mod tests {
    use super::Tolerance;

    #[test]
    fn a_fall_within_the_spread_of_few_runs_is_tolerated_and_a_larger_one_is_not() {
        let exact = Tolerance::default();
        assert!(exact.worse(1.0, 3, 2.0 / 3.0, 3));
        assert!(!exact.worse(2.0 / 3.0, 3, 1.0, 3));
        let two = Tolerance {
            margin: 0.0,
            sigmas: 2.0,
        };
        // 3 of 3 to 2 of 3: the spread of three runs covers it; 3 of 3 to 1 of 3 it does not.
        assert!(!two.worse(1.0, 3, 2.0 / 3.0, 3));
        assert!(two.worse(1.0, 3, 1.0 / 3.0, 3));
        // Over thirty runs the same fall of a third is beyond two standard errors.
        assert!(two.worse(0.9, 30, 0.6, 30));
        assert!(!two.worse(0.9, 30, 0.8, 30));
        let margin = Tolerance {
            margin: 0.1,
            sigmas: 0.0,
        };
        assert!(!margin.worse(1.0, 10, 0.9, 10));
        assert!(margin.worse(1.0, 10, 0.8, 10));
    }
}
