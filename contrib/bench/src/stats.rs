//! Samples of one side of a comparison, in milliseconds.

use std::time::Duration;

#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1000.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The middle sample (the mean of the two middle ones for an even count); NaN when empty.
    pub fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// The nearest-rank percentile `p` (0–100).
    pub fn percentile(&self, p: f64) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    pub fn min(&self) -> f64 {
        self.0.iter().copied().fold(f64::NAN, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.0.iter().copied().fold(f64::NAN, f64::max)
    }
}

/// A duration in milliseconds, readably: `0.84 ms`, `12.3 ms`, `4.52 s`.
pub fn ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".to_owned()
    } else if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

/// `median (min–max)`.
pub fn spread(s: &Samples) -> String {
    format!("{} ({}–{})", ms(s.median()), ms(s.min()), ms(s.max()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(values: &[u64]) -> Samples {
        let mut s = Samples::default();
        for v in values {
            s.push(Duration::from_millis(*v));
        }
        s
    }

    #[test]
    fn median_percentile_min_max() {
        let s = of(&[5, 1, 3, 2, 4]);
        assert_eq!(s.median(), 3.0);
        assert_eq!(s.min(), 1.0);
        assert_eq!(s.max(), 5.0);
        assert_eq!(s.percentile(99.0), 5.0);
        assert_eq!(of(&[1, 2, 3, 4]).median(), 2.5);
        let hundred = of(&(1..=100).collect::<Vec<_>>());
        assert_eq!(hundred.percentile(99.0), 99.0);
        assert!(Samples::default().median().is_nan());
    }
}
