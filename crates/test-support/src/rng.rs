//! One small PRNG (splitmix64) for every random decision of a test run,
//! so that a run is replayed by giving it the same seed. Not for anything
//! that needs real randomness: keys and names that must be unique across
//! runs come from UUIDs.

/// A seeded splitmix64 generator: the same seed gives the same numbers, on
/// every machine.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function: a well-mixed 64-bit value of `z`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// The generator of `seed`.
    pub fn from_seed(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for one user of a run's seed (a task, a
    /// buyer): the same `(seed, stream)` gives the same numbers, and the
    /// streams of one seed do not follow each other.
    pub fn stream(seed: u64, stream: u64) -> Self {
        Self::from_seed(mix(seed ^ mix(stream.wrapping_add(GOLDEN_GAMMA))))
    }

    /// A seed that differs from run to run (a v4 UUID's random bits), for a
    /// run that was not given one; print it, so that the run can be replayed.
    pub fn fresh_seed() -> u64 {
        uuid::Uuid::new_v4().as_u64_pair().0
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// An index into something `len` long, uniform (`0` when it is empty).
    pub fn pick(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn one_seed_one_sequence() {
        let a: Vec<u64> = (0..8)
            .scan(Rng::from_seed(42), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..8)
            .scan(Rng::from_seed(42), |r, _| Some(r.next_u64()))
            .collect();
        let c: Vec<u64> = (0..8)
            .scan(Rng::from_seed(43), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn splitmix64_of_zero_gives_the_reference_values() {
        // The first outputs of splitmix64 seeded with 0 (Vigna's reference).
        let mut rng = Rng::from_seed(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn streams_of_one_seed_differ_and_repeat() {
        let first = |seed, stream| Rng::stream(seed, stream).next_u64();
        assert_eq!(first(7, 1), first(7, 1));
        assert_ne!(first(7, 1), first(7, 2));
        assert_ne!(first(7, 1), first(8, 1));
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = Rng::from_seed(1);
        for _ in 0..10_000 {
            assert!(rng.below(7) < 7);
            assert!((3..=6).contains(&rng.range(3, 6)));
            assert!(rng.pick(5) < 5);
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.pick(0), 0);
        assert!(!rng.chance(0.0));
        assert!(rng.chance(1.0));
    }
}
