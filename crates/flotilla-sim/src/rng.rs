//! The simulator's randomness: one seed, split into independent streams by key.
//!
//! A small PRNG written here instead of `rand`: the simulator's promise is that a
//! seed replays the same run on every machine and every future build, and `rand`
//! does not promise stable output of its distributions across versions. This is
//! SplitMix64 (to derive keyed seeds) feeding xoshiro256** (the stream), with the
//! few distributions the simulator needs written out below.
//!
//! Keyed streams matter for determinism under concurrency: a replica's start
//! latency is drawn from `key(seed, [app, deployment, n])` (its deployment's n-th
//! constructor call), not from a shared stream whose order would depend on how
//! concurrent tasks interleave.

/// SplitMix64's step: a well-mixed 64-bit value from `x`.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from `seed` and a path of keys: the same inputs give the same
/// seed, different ones independent seeds.
pub fn key(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(splitmix(seed), |acc, p| splitmix(acc ^ splitmix(*p)))
}

/// A stable 64-bit key for a label (FNV-1a), to name streams by text.
pub fn label(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// A seeded xoshiro256** generator.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut s = [0; 4];
        for v in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *v = splitmix(x);
        }
        Rng { s }
    }

    /// A generator for the stream named by `parts` under `seed`.
    pub fn keyed(seed: u64, parts: &[u64]) -> Self {
        Rng::new(key(seed, parts))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n) (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for simulation and stable.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p` (clamped to [0, 1]).
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p.clamp(0.0, 1.0)
    }

    /// A standard normal draw (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln is finite
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A log-normal draw with the given median and shape `sigma`.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// An exponential draw with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// `k` distinct indices out of `0..n`, in increasing order (all if `k >= n`).
    pub fn sample(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..n).collect();
        let k = k.min(n);
        for i in 0..k {
            let j = i + self.below((n - i) as u64) as usize;
            idx.swap(i, j);
        }
        idx.truncate(k);
        idx.sort_unstable();
        idx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_keys_separate_streams() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(key(7, &[1, 2]), key(7, &[2, 1]));
        assert_ne!(key(7, &[1]), key(8, &[1]));
    }

    /// The module's promise: a seed gives the same streams on every machine and
    /// every future build. The values were computed once, from this code.
    #[test]
    fn the_streams_of_a_seed_are_pinned() {
        let mut r = Rng::new(0);
        let first: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(
            first,
            [
                0x422E_A740_D097_7210,
                0xE062_B061_B42E_2928,
                0x5A07_1FC5_9308_41B6,
                0x0133_4EF8_ED3C_C2BD
            ]
        );
        assert_eq!(splitmix(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(key(7, &[1, 2]), 0xF239_3773_88B0_1D44);
        assert_eq!(label("request"), 0x6F47_43B8_BC5B_4EB2);
        assert_eq!(
            Rng::keyed(1, &[label("request"), 0]).next_u64(),
            0x3DFC_7903_6ABE_2373
        );
        let mut d = Rng::new(3);
        assert_eq!(d.below(1000), 734);
        assert_eq!(d.unit(), 0.457_129_929_048_856_5);
        assert_eq!(d.sample(10, 3), [2, 3, 4]);
    }

    #[test]
    fn distributions_stay_in_range() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!(r.below(10) < 10);
            assert!(r.lognormal(1.0, 0.5) > 0.0);
            assert!(r.exponential(2.0) >= 0.0);
        }
        let s = r.sample(10, 4);
        assert_eq!(s.len(), 4);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(r.sample(3, 10), vec![0, 1, 2]);
        let mean: f64 = (0..20_000).map(|_| r.normal()).sum::<f64>() / 20_000.0;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
