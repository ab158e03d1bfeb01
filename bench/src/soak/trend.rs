//! Whether a series is flat: after the warm-up (the first fifth of the samples, left out), the
//! least-squares slope and the spread (max − min) of what is left.

use serde::Serialize;

/// The fraction of samples left out at the start: the server filling its caches and pools.
pub const WARMUP_FRACTION: f64 = 0.2;

/// One measure's behaviour after the warm-up.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Trend {
    /// Samples after the warm-up.
    pub samples: usize,
    /// The first of them.
    pub first: f64,
    /// The last of them.
    pub last: f64,
    /// Their least.
    pub min: f64,
    /// Their greatest.
    pub max: f64,
    /// Their mean.
    pub mean: f64,
    /// The least-squares slope, per minute.
    pub slope_per_min: f64,
    /// The slope over the window's length: how much the fitted line rises from its first
    /// sample to its last.
    pub drift: f64,
    /// Whether |drift| is within the tolerance: `tolerance_fraction` of the mean, but never
    /// less than `tolerance_floor` (a few descriptors or connections come and go with the
    /// load; they are no leak).
    pub flat: bool,
}

/// The trend of `(seconds, value)` points after the warm-up; flat when the drift is within
/// `max(fraction × mean, floor)`. `None` with fewer than three points after the warm-up.
pub fn trend(points: &[(f64, f64)], fraction: f64, floor: f64) -> Option<Trend> {
    let skip = (points.len() as f64 * WARMUP_FRACTION).ceil() as usize;
    let window = points.get(skip..).filter(|w| w.len() >= 3)?;
    let n = window.len() as f64;
    let mean_t = window.iter().map(|p| p.0).sum::<f64>() / n;
    let mean = window.iter().map(|p| p.1).sum::<f64>() / n;
    let var_t: f64 = window.iter().map(|p| (p.0 - mean_t).powi(2)).sum();
    let cov: f64 = window.iter().map(|p| (p.0 - mean_t) * (p.1 - mean)).sum();
    let slope = if var_t > 0.0 { cov / var_t } else { 0.0 };
    let span = window[window.len() - 1].0 - window[0].0;
    let drift = slope * span;
    let (min, max) = window
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    Some(Trend {
        samples: window.len(),
        first: window[0].1,
        last: window[window.len() - 1].1,
        min,
        max,
        mean,
        slope_per_min: slope * 60.0,
        drift,
        flat: drift.abs() <= (fraction * mean.abs()).max(floor),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(f: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
        (0..120)
            .map(|i| (i as f64 * 5.0, f(i as f64 * 5.0)))
            .collect()
    }

    #[test]
    fn a_level_series_with_noise_after_a_warm_up_climb_is_flat() {
        // Climbs for the first minute (the warm-up), then wobbles by ±1 around 100.
        let points = series(|t| {
            if t < 60.0 {
                50.0 + t
            } else {
                100.0 + (t / 5.0 % 3.0) - 1.0
            }
        });
        let trend = trend(&points, 0.05, 2.0).expect("enough points");
        assert!(trend.flat, "{trend:?}");
        assert_eq!(trend.samples, 96);
        assert!(trend.max - trend.min <= 2.0);
    }

    #[test]
    fn a_steady_leak_is_not_flat_and_its_slope_is_measured() {
        // One unit every ten seconds: six a minute, about 47 over the window.
        let points = series(|t| 100.0 + t / 10.0);
        let trend = trend(&points, 0.05, 2.0).expect("enough points");
        assert!(!trend.flat, "{trend:?}");
        assert!((trend.slope_per_min - 6.0).abs() < 1e-9);
        assert!((trend.drift - 47.5).abs() < 1e-9);
    }

    #[test]
    fn too_few_samples_have_no_trend() {
        assert_eq!(
            trend(&[(0.0, 1.0), (5.0, 1.0), (10.0, 1.0)], 0.05, 1.0),
            None
        );
    }
}
