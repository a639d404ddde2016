//! The seed of the property tests' cases, one rule for the domain's and the store's suites
//! (the store's includes this file by path).

/// `PROPERTY_SEED` to replay a run or try others, else a fixed one, so that every run draws
/// the same cases and the branch counts of a property say the same thing each time. Printed
/// either way.
pub fn property_seed() -> u64 {
    let seed = match std::env::var("PROPERTY_SEED") {
        Ok(text) => text.parse().expect("PROPERTY_SEED is a whole number"),
        Err(_) => DEFAULT_PROPERTY_SEED,
    };
    println!("PROPERTY_SEED={seed}");
    seed
}

const DEFAULT_PROPERTY_SEED: u64 = 20_260_101;
