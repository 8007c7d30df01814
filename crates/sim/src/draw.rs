//! The simulator's only source of randomness: `u(seed, keys)` ∈ [0, 1), a pure function
//! of the seed and named keys (suite, task, …, purpose). Not for anything else.
//!
//! The keys never include the served model name, so versions with different settings
//! are coupled on the same cases: a case is followed iff `u < susceptibility`, hence a
//! higher susceptibility lands on a superset of the cases a lower one does (the same
//! holds for skill and error_rate). That coupling is what makes paired comparisons of
//! two simulated versions behave like comparisons of real, similar models.

use sha2::{Digest, Sha256};

/// Uniform draw in [0, 1) from sha256("pruefstand-sim/1", seed, keys…). Every part is
/// NUL-terminated so ("ab","c") and ("a","bc") hash differently.
pub fn u(seed: u64, keys: &[&str]) -> f64 {
    let mut h = Sha256::new();
    h.update(b"pruefstand-sim/1\0");
    h.update(seed.to_string().as_bytes());
    h.update(b"\0");
    for key in keys {
        h.update(key.as_bytes());
        h.update(b"\0");
    }
    let digest = h.finalize();
    let bits = u64::from_be_bytes(digest[..8].try_into().expect("sha256 has 32 bytes"));
    // 53 bits: every value exactly representable, strictly below 1.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_in_range_and_key_sensitive() {
        let a = u(7, &["banking", "user_task_0", "skill"]);
        assert_eq!(a, u(7, &["banking", "user_task_0", "skill"]));
        assert!((0.0..1.0).contains(&a));
        assert_ne!(a, u(8, &["banking", "user_task_0", "skill"]));
        assert_ne!(u(7, &["ab", "c"]), u(7, &["a", "bc"]));
    }

    #[test]
    fn roughly_uniform() {
        let n = 4000;
        let below = (0..n).filter(|i| u(1, &[&i.to_string()]) < 0.25).count();
        assert!((800..1200).contains(&below), "{below}");
    }
}
