//! Seeded randomness for the suites that choose at random, and the environment variables
//! that replay a run or scale it up.

use std::collections::BTreeSet;

/// SplitMix64: small, seedable, good enough to choose operations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// Between `min` and `max` distinct items, in their original order.
    pub fn subset(&mut self, items: &[&str], min: usize, max: usize) -> Vec<String> {
        let wanted = min + self.below(max - min + 1);
        let mut chosen = BTreeSet::new();
        while chosen.len() < wanted.min(items.len()) {
            chosen.insert(self.below(items.len()));
        }
        chosen.into_iter().map(|i| items[i].to_owned()).collect()
    }
}

/// The seed from `var` if set (to replay a failure), else a fresh one; printed either way.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    println!("seed {seed} (rerun with {var}={seed})");
    seed
}

/// A count from the environment variable `var` (soak runs raise the CI defaults), else
/// `default`; printed when set.
pub fn scale(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(value) => {
            let n = value
                .parse()
                .unwrap_or_else(|_| panic!("{var}={value} is not a count"));
            println!("{var}={n}");
            n
        }
        Err(_) => default,
    }
}
