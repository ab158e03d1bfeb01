//! SplitMix64: a tiny, seedable generator wherever randomness needs no cryptographic quality.
//! In the server: the jitter of retry pauses ([`jitter`]), the write probe's 64 KiB of filler
//! (random so that no compression shrinks it), and the span ids of calls. Outside it: the
//! benchmark's key picks and the tests' random requests and fault schedules, where
//! reproducibility from a seed matters. Never for anything a caller could exploit by guessing
//! it (claim tokens come from the operating system's generator).

/// SplitMix64 over its 64-bit state; the state is the seed.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits. (Not an `Iterator`: the sequence never ends and callers
    /// want draws, not iteration.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0; the modulo bias is negligible for the small `n`
    /// used here).
    pub fn below_u64(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// [`SplitMix64::below_u64`] for indexes.
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.below_u64(n as u64)).unwrap_or(0)
    }

    /// True once in `n` draws on average.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items`, uniformly (`items` must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Puts `items` in a random order (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// A number in `0..max` from one process-wide sequence: jitter for retry pauses, so that two
/// writers that conflicted do not try again in step. Not seeded per run; it needs only to
/// differ between callers.
pub fn jitter(max: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0x243F_6A88_85A3_08D3);
    let state = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    SplitMix64(state).next() % max.max(1)
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_sequence_is_splitmix64_and_draws_stay_in_range() {
        // The reference outputs of SplitMix64 seeded with 0.
        let mut r = SplitMix64(0);
        assert_eq!(r.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64(7);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            assert!(r.below_u64(3) < 3);
        }
        assert_eq!(r.below(0), 0);
    }
}
