//! Summaries of repeated measurements: the median with the min–max spread
//! (never the best run alone), and whether two summaries differ by more
//! than their spread.

use serde::{Deserialize, Serialize};

/// Repeated samples of one measure, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// Every sample, in the order measured.
    pub samples: Vec<f64>,
}

impl Summary {
    /// The summary of `samples`; `None` when there are none (or one is not
    /// a number, which would make the order meaningless).
    pub(crate) fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            samples: samples.to_vec(),
        })
    }

    /// Whether the two spreads overlap: then the difference between the
    /// medians is within what repeating the measurement shows, i.e. noise.
    pub(crate) fn overlaps(&self, other: &Summary) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

/// How a change between two summaries reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Change {
    /// Within the measured spread of either run.
    Noise,
    /// Better beyond the spread (faster, smaller).
    Better,
    /// Worse beyond the spread.
    Worse,
}

/// Whether a larger value of a measure is better (tokens/s) or worse
/// (seconds, bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Tokens per second.
    HigherIsBetter,
    /// Seconds, bytes.
    LowerIsBetter,
}

/// The change from `before` to `after`: noise when their spreads overlap.
pub(crate) fn change(before: &Summary, after: &Summary, direction: Direction) -> Change {
    if before.overlaps(after) {
        return Change::Noise;
    }
    let up = after.median > before.median;
    match (up, direction) {
        (true, Direction::HigherIsBetter) | (false, Direction::LowerIsBetter) => Change::Better,
        _ => Change::Worse,
    }
}

/// The relative change of the medians in percent (`None` from zero).
pub(crate) fn percent(before: &Summary, after: &Summary) -> Option<f64> {
    (before.median != 0.0).then(|| (after.median - before.median) / before.median * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(samples: &[f64], expected: Expect) {
        let actual = match Summary::of(samples) {
            Some(s) => format!("median {} min {} max {}", s.median, s.min, s.max),
            None => "none".to_string(),
        };
        expected.assert_eq(&actual);
    }

    #[test]
    fn summaries() {
        check(&[], expect!["none"]);
        check(&[f64::NAN, 1.0], expect!["none"]);
        check(&[3.0], expect!["median 3 min 3 max 3"]);
        check(&[5.0, 1.0, 3.0], expect!["median 3 min 1 max 5"]);
        check(&[4.0, 1.0, 3.0, 2.0], expect!["median 2.5 min 1 max 4"]);
        check(&[2.0, 2.0, 9.0], expect!["median 2 min 2 max 9"]);
    }

    fn check_change(before: &[f64], after: &[f64], direction: Direction, expected: Expect) {
        let (b, a) = (Summary::of(before).unwrap(), Summary::of(after).unwrap());
        let pct = percent(&b, &a).map_or("-".into(), |p| format!("{p:+.1}%"));
        expected.assert_eq(&format!("{:?} {pct}", change(&b, &a, direction)));
    }

    #[test]
    fn changes_inside_the_spread_are_noise() {
        use Direction::*;
        // Overlapping spreads: noise, whatever the medians say.
        check_change(
            &[10.0, 12.0, 14.0],
            &[13.0, 15.0, 16.0],
            HigherIsBetter,
            expect!["Noise +25.0%"],
        );
        // Touching at one end still overlaps.
        check_change(
            &[1.0, 2.0],
            &[2.0, 3.0],
            LowerIsBetter,
            expect!["Noise +66.7%"],
        );
        check_change(
            &[10.0, 11.0],
            &[20.0, 21.0],
            HigherIsBetter,
            expect!["Better +95.2%"],
        );
        check_change(
            &[10.0, 11.0],
            &[20.0, 21.0],
            LowerIsBetter,
            expect!["Worse +95.2%"],
        );
        check_change(
            &[0.5, 0.6],
            &[0.2, 0.3],
            LowerIsBetter,
            expect!["Better -54.5%"],
        );
        check_change(
            &[0.0, 0.0],
            &[1.0, 1.0],
            HigherIsBetter,
            expect!["Better -"],
        );
    }
}
