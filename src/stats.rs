//! Statistics behind rules R2–R4, as docs/statistics.md explains them (measured by a
//! simulation study; do not "improve" them without re-running it):
//!
//! - one-sided Clopper–Pearson bounds on (possibly non-integer) effective counts;
//! - the ANOVA intra-cluster correlation and the size-weighted design effect
//!   DEFF = 1 + (m_w − 1)·ρ̂, or the two-way cluster-robust variance ratio;
//! - the one-sided sign-flip permutation test on per-cluster net discordance (R4);
//! - McNemar's discordant counts (description only), Holm's correction, and the minimum
//!   detectable difference of a plan (does `voll` decide what `schnell` could not?).
//!
//! Pure functions on counts; nothing here knows about cases or rules.

use std::collections::HashMap;
use std::hash::Hash;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{Beta, ContinuousCDF, Normal};

/// Upper one-sided Clopper–Pearson bound at confidence 1 − α: the largest p that still
/// gives P(X ≤ x) ≥ α, i.e. the (1 − α) quantile of Beta(x + 1, n − x).
/// Real-valued x and n are allowed (effective counts). n ≤ 0 says nothing: 1.
pub fn cp_upper(x: f64, n: f64, alpha: f64) -> f64 {
    if n <= 0.0 || x >= n {
        return 1.0;
    }
    let x = x.max(0.0);
    beta_quantile(x + 1.0, n - x, 1.0 - alpha)
}

/// Lower one-sided Clopper–Pearson bound at confidence 1 − α: the α quantile of
/// Beta(x, n − x + 1); 0 when nothing was observed.
pub fn cp_lower(x: f64, n: f64, alpha: f64) -> f64 {
    if n <= 0.0 || x <= 0.0 {
        return 0.0;
    }
    let x = x.min(n);
    beta_quantile(x, n - x + 1.0, alpha)
}

fn beta_quantile(a: f64, b: f64, q: f64) -> f64 {
    // Shapes are > 0 by construction above; a failure here is a programming error.
    Beta::new(a, b).expect("Beta shapes are positive").inverse_cdf(q.clamp(0.0, 1.0))
}

/// One cluster of binary outcomes: `x` successes out of `m`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cluster {
    pub x: u64,
    pub m: u64,
}

/// ANOVA estimator of the intra-cluster correlation for binary outcomes with unequal
/// cluster sizes, floored at 0 (a negative estimate means "no clustering visible").
/// ρ̂ = (MSB − MSW) / (MSB + (m₀ − 1)·MSW), m₀ = (N − Σm²/N)/(k − 1).
pub fn icc_anova(clusters: &[Cluster]) -> f64 {
    let clusters: Vec<Cluster> = clusters.iter().copied().filter(|c| c.m > 0).collect();
    let k = clusters.len() as f64;
    let n: f64 = clusters.iter().map(|c| c.m as f64).sum();
    if k < 2.0 || n - k < 1.0 {
        return 0.0;
    }
    let p = clusters.iter().map(|c| c.x as f64).sum::<f64>() / n;
    let ssb: f64 = clusters.iter().map(|c| c.m as f64 * (c.x as f64 / c.m as f64 - p).powi(2)).sum();
    // Within-cluster sum of squares of 0/1 data: x − x²/m per cluster.
    let ssw: f64 = clusters.iter().map(|c| c.x as f64 - (c.x as f64).powi(2) / c.m as f64).sum();
    let msb = ssb / (k - 1.0);
    let msw = ssw / (n - k);
    let m0 = (n - clusters.iter().map(|c| (c.m as f64).powi(2)).sum::<f64>() / n) / (k - 1.0);
    let denom = msb + (m0 - 1.0) * msw;
    if denom <= 0.0 {
        return 0.0;
    }
    ((msb - msw) / denom).max(0.0)
}

/// The cluster adjustment of a proportion: design effect and effective counts.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Adjusted {
    pub x: u64,
    pub n: u64,
    pub clusters: usize,
    /// One-way ANOVA ρ̂ (floored at 0), reported even when the two-way variant is used.
    pub rho: f64,
    /// Size-weighted mean cluster size Σm²/N.
    pub m_w: f64,
    pub deff: f64,
    pub n_eff: f64,
    pub x_eff: f64,
}

impl Adjusted {
    pub fn rate(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.x as f64 / self.n as f64 }
    }
    pub fn upper(&self, alpha: f64) -> f64 {
        cp_upper(self.x_eff, self.n_eff, alpha)
    }
    pub fn lower(&self, alpha: f64) -> f64 {
        cp_lower(self.x_eff, self.n_eff, alpha)
    }
}

/// Size-weighted mean cluster size m_w = Σ m_c² / N (1 when there is nothing).
pub fn weighted_cluster_size(sizes: impl IntoIterator<Item = u64>) -> f64 {
    let (mut n, mut sq) = (0.0, 0.0);
    for m in sizes {
        n += m as f64;
        sq += (m as f64).powi(2);
    }
    if n == 0.0 { 1.0 } else { sq / n }
}

/// One-way adjustment: DEFF = 1 + (m_w − 1)·ρ̂, n_eff = N/DEFF, x_eff = p̂·n_eff.
pub fn adjust_one_way(clusters: &[Cluster]) -> Adjusted {
    let rho = icc_anova(clusters);
    let m_w = weighted_cluster_size(clusters.iter().map(|c| c.m));
    with_deff(clusters, rho, m_w, 1.0 + (m_w - 1.0) * rho)
}

/// Two-way adjustment (user task × injection task): the design effect is the ratio of
/// the two-way cluster-robust variance of the mean (Cameron–Gelbach–Miller:
/// V_A + V_B − V_AB) to the i.i.d. variance, floored at 1; then the same effective-n
/// route. `obs` are (cluster A, cluster B, outcome).
pub fn adjust_two_way<A: Hash + Eq + Clone, B: Hash + Eq + Clone>(obs: &[(A, B, bool)]) -> Adjusted {
    let mut by_a: HashMap<A, Cluster> = HashMap::new();
    for (a, _, y) in obs {
        let c = by_a.entry(a.clone()).or_insert(Cluster { x: 0, m: 0 });
        c.m += 1;
        c.x += *y as u64;
    }
    let clusters: Vec<Cluster> = by_a.into_values().collect();
    let rho = icc_anova(&clusters);
    let m_w = weighted_cluster_size(clusters.iter().map(|c| c.m));
    with_deff(&clusters, rho, m_w, two_way_deff(obs))
}

/// var_cr / var_iid for the mean of `obs`, floored at 1 (1 when the data have no
/// variance at all: all 0 or all 1).
pub fn two_way_deff<A: Hash + Eq + Clone, B: Hash + Eq + Clone>(obs: &[(A, B, bool)]) -> f64 {
    let n = obs.len() as f64;
    if n == 0.0 {
        return 1.0;
    }
    let p = obs.iter().filter(|o| o.2).count() as f64 / n;
    let resid = |y: bool| y as u8 as f64 - p;
    let var_iid: f64 = obs.iter().map(|o| resid(o.2).powi(2)).sum::<f64>() / (n * n);
    if var_iid <= 0.0 {
        return 1.0;
    }
    // Σ_g (Σ_{i∈g} e_i)² / N² for a grouping g.
    fn grouped<K: Hash + Eq>(keys: impl Iterator<Item = (K, f64)>, n: f64) -> f64 {
        let mut sums: HashMap<K, f64> = HashMap::new();
        for (k, e) in keys {
            *sums.entry(k).or_default() += e;
        }
        sums.values().map(|s| s * s).sum::<f64>() / (n * n)
    }
    let v_a = grouped(obs.iter().map(|o| (&o.0, resid(o.2))), n);
    let v_b = grouped(obs.iter().map(|o| (&o.1, resid(o.2))), n);
    let v_ab = grouped(obs.iter().map(|o| ((&o.0, &o.1), resid(o.2))), n);
    ((v_a + v_b - v_ab) / var_iid).max(1.0)
}

fn with_deff(clusters: &[Cluster], rho: f64, m_w: f64, deff: f64) -> Adjusted {
    let x: u64 = clusters.iter().map(|c| c.x).sum();
    let n: u64 = clusters.iter().map(|c| c.m).sum();
    let deff = deff.max(1.0);
    let n_eff = n as f64 / deff;
    let p = if n == 0 { 0.0 } else { x as f64 / n as f64 };
    Adjusted { x, n, clusters: clusters.iter().filter(|c| c.m > 0).count(), rho, m_w, deff, n_eff, x_eff: p * n_eff }
}

/// Result of the one-sided sign-flip permutation test.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SignFlip {
    /// Σ d_c over clusters.
    pub t_obs: i64,
    pub p_value: f64,
    /// Clusters with d_c ≠ 0 (the others cannot change T).
    pub nonzero_clusters: usize,
    /// True when all 2^k flips were enumerated.
    pub exact: bool,
}

/// Enumerate exactly up to this many non-zero clusters (2^16 sign patterns).
pub const EXACT_MAX_CLUSTERS: usize = 16;

/// One-sided sign-flip test of H₀ "no systematic difference" against "Σ d_c is large"
/// on per-cluster net discordance d_c = b_c − c_c. Exact for ≤ 16 non-zero clusters
/// (p = share of sign patterns with T* ≥ T_obs), else `permutations` random flips from
/// a ChaCha20 RNG seeded with `seed`: p = (1 + #{T* ≥ T_obs}) / (1 + B).
pub fn sign_flip_test(d: &[i64], permutations: u64, seed: u64) -> SignFlip {
    let nz: Vec<i64> = d.iter().copied().filter(|&v| v != 0).collect();
    let t_obs: i64 = nz.iter().sum();
    let k = nz.len();
    if k == 0 {
        return SignFlip { t_obs, p_value: 1.0, nonzero_clusters: 0, exact: true };
    }
    if k <= EXACT_MAX_CLUSTERS {
        let total = 1u64 << k;
        let hits = (0..total)
            .filter(|mask| {
                let t: i64 = nz.iter().enumerate().map(|(i, &v)| if mask >> i & 1 == 1 { -v } else { v }).sum();
                t >= t_obs
            })
            .count() as f64;
        return SignFlip { t_obs, p_value: hits / total as f64, nonzero_clusters: k, exact: true };
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let hits = (0..permutations)
        .filter(|_| {
            let t: i64 = nz.iter().map(|&v| if rng.random::<bool>() { -v } else { v }).sum();
            t >= t_obs
        })
        .count() as f64;
    SignFlip { t_obs, p_value: (1.0 + hits) / (1.0 + permutations as f64), nonzero_clusters: k, exact: false }
}

/// McNemar's discordant counts over pairs (candidate_bad, reference_bad):
/// b = candidate bad where the reference was not, c = the reverse. Description only —
/// the test is [`sign_flip_test`].
pub fn mcnemar_counts(pairs: impl IntoIterator<Item = (bool, bool)>) -> (u64, u64) {
    pairs.into_iter().fold((0, 0), |(b, c), (cand, refr)| match (cand, refr) {
        (true, false) => (b + 1, c),
        (false, true) => (b, c + 1),
        _ => (b, c),
    })
}

/// Holm's step-down adjusted p-values, in the input order:
/// adj_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)) over the ascending order.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adj = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        adj[i] = running;
    }
    adj
}

/// Smallest |p − p₀| a one-sided test at level α detects with the given power, for a
/// proportion near p₀ measured on n cases with design effect `deff` (normal
/// approximation: (z₁₋α + z_power)·√(p₀(1 − p₀)·deff/n)). Used to say whether a larger
/// plan would decide an inconclusive rule.
pub fn min_detectable_difference(p0: f64, n: f64, deff: f64, alpha: f64, power: f64) -> f64 {
    if n <= 0.0 {
        return f64::INFINITY;
    }
    let z = Normal::standard();
    let zsum = z.inverse_cdf(1.0 - alpha) + z.inverse_cdf(power);
    zsum * (p0 * (1.0 - p0) * deff.max(1.0) / n).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b}");
    }

    /// P(X ≤ x) for X ~ Bin(n, p), summed directly (independent of the Beta route).
    fn binom_cdf(x: u64, n: u64, p: f64) -> f64 {
        let mut sum = 0.0;
        let mut coef = 1.0f64; // C(n, k)
        for k in 0..=x {
            if k > 0 {
                coef *= (n - k + 1) as f64 / k as f64;
            }
            sum += coef * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32);
        }
        sum
    }

    #[test]
    fn clopper_pearson_edges_match_closed_forms() {
        close(cp_upper(0.0, 60.0, 0.05), 1.0 - 0.05f64.powf(1.0 / 60.0), 1e-9);
        close(cp_lower(60.0, 60.0, 0.05), 0.05f64.powf(1.0 / 60.0), 1e-9);
        assert_eq!(cp_lower(0.0, 60.0, 0.05), 0.0);
        assert_eq!(cp_upper(60.0, 60.0, 0.05), 1.0);
        assert_eq!(cp_upper(0.0, 0.0, 0.05), 1.0);
        // Non-integer effective counts stay between their integer neighbours.
        let (u0, u1) = (cp_upper(1.0, 50.0, 0.05), cp_upper(2.0, 50.0, 0.05));
        let u = cp_upper(1.5, 50.0, 0.05);
        assert!(u0 < u && u < u1);
    }

    #[test]
    fn clopper_pearson_matches_binomial_sums() {
        for &(x, n, alpha) in &[(1u64, 60u64, 0.04), (5, 60, 0.05), (11, 60, 0.05), (3, 20, 0.025)] {
            // Upper bound p_U solves P(X ≤ x; p_U) = α; lower p_L solves P(X ≥ x; p_L) = α.
            let up = cp_upper(x as f64, n as f64, alpha);
            close(binom_cdf(x, n, up), alpha, 1e-7);
            let lo = cp_lower(x as f64, n as f64, alpha);
            close(1.0 - binom_cdf(x - 1, n, lo), alpha, 1e-7);
        }
        // Published two-sided 95 % value (e.g. Newcombe 1998): 5/20 → [0.0866, 0.4910].
        close(cp_lower(5.0, 20.0, 0.025), 0.0866, 1e-4);
        close(cp_upper(5.0, 20.0, 0.025), 0.4910, 1e-4);
    }

    #[test]
    fn icc_on_constructed_data() {
        // Perfect clustering: clusters all-0 or all-1 → ρ̂ = 1.
        let c = [Cluster { x: 0, m: 4 }, Cluster { x: 4, m: 4 }, Cluster { x: 0, m: 4 }, Cluster { x: 4, m: 4 }];
        close(icc_anova(&c), 1.0, 1e-12);
        // Identical cluster means → MSB = 0 → negative estimate, floored at 0.
        let c = [Cluster { x: 2, m: 4 }, Cluster { x: 2, m: 4 }, Cluster { x: 2, m: 4 }];
        assert_eq!(icc_anova(&c), 0.0);
        // Hand computation: clusters (3 of 4), (1 of 4): p = .5, MSB = 4·(.25²)·2/1 = .5,
        // MSW = (3 − 9/4 + 1 − 1/4)/6 = 1.5/6 = .25, m0 = 4 → ρ̂ = .25/(.5 + 3·.25) = .2.
        close(icc_anova(&[Cluster { x: 3, m: 4 }, Cluster { x: 1, m: 4 }]), 0.2, 1e-12);
        // No variation at all.
        assert_eq!(icc_anova(&[Cluster { x: 0, m: 3 }, Cluster { x: 0, m: 2 }]), 0.0);
    }

    #[test]
    fn design_effect_uses_size_weighted_cluster_size() {
        close(weighted_cluster_size([2, 4]), (4.0 + 16.0) / 6.0, 1e-12);
        let c = [Cluster { x: 3, m: 4 }, Cluster { x: 1, m: 4 }];
        let a = adjust_one_way(&c);
        close(a.deff, 1.0 + 3.0 * 0.2, 1e-12);
        close(a.n_eff, 8.0 / 1.6, 1e-12);
        close(a.x_eff, 0.5 * 5.0, 1e-12);
    }

    #[test]
    fn two_way_deff_sees_injection_task_clustering() {
        // Outcome depends only on the injection task (B), each user task (A) sees every
        // injection task: one-way ρ̂ on A is 0, the two-way variance sees it.
        let mut obs = Vec::new();
        for a in 0..10 {
            for b in 0..4 {
                obs.push((a, b, b == 0));
            }
        }
        assert_eq!(adjust_one_way(&[Cluster { x: 1, m: 4 }; 10]).deff, 1.0);
        let two = adjust_two_way(&obs);
        // V_B = Σ_b (10·e_b)² / 40², V_A = 0, V_AB = Σ 10·4 cells... computed: ratio 10.
        // e = .75 for b=0 (10 obs), −.25 otherwise: V_B = (7.5² + 3·2.5²)/1600 = 75/1600;
        // V_AB = 40 cells of one obs = Σe²/1600 = 7.5/1600 = var_iid; V_A = 0.
        close(two.deff, (75.0 - 7.5) / 7.5, 1e-9);
        // No variance → no adjustment.
        assert_eq!(two_way_deff(&[(1, 1, false), (2, 2, false)]), 1.0);
    }

    #[test]
    fn sign_flip_exact_by_hand() {
        // d = [2, 1, -1]: T = 2. Patterns (±2 ±1 ±1): sums 2+1-1=2, 2+1+1=4, 2-1-1=0,
        // 2-1+1=2, -2+1-1=-2, -2+1+1=0, -2-1-1=-4, -2-1+1=-2 → T* ≥ 2 in 3 of 8.
        let r = sign_flip_test(&[2, 1, 0, -1], 0, 1);
        assert_eq!(r.t_obs, 2);
        assert_eq!(r.nonzero_clusters, 3);
        assert!(r.exact);
        close(r.p_value, 3.0 / 8.0, 1e-12);
        assert_eq!(sign_flip_test(&[0, 0], 100, 1).p_value, 1.0);
        // All worse in 5 clusters: only the identity pattern reaches T → 1/32.
        close(sign_flip_test(&[1; 5], 0, 1).p_value, 1.0 / 32.0, 1e-12);
    }

    #[test]
    fn sign_flip_random_is_seeded_and_sensible() {
        let d: Vec<i64> = (0..30).map(|i| if i % 3 == 0 { -1 } else { 1 }).collect();
        let a = sign_flip_test(&d, 2000, 7);
        assert!(!a.exact);
        assert_eq!(a, sign_flip_test(&d, 2000, 7));
        // T = 10 of 30 unit flips: P(Bin(30,.5) ≥ 20) ≈ 0.049.
        close(a.p_value, 0.0494, 0.015);
        // The smallest attainable p is 1/(1+B).
        close(sign_flip_test(&[1; 40], 999, 1).p_value, 1.0 / 1000.0, 1e-12);
    }

    #[test]
    fn mcnemar_counts_discordant_pairs() {
        assert_eq!(mcnemar_counts([(true, false), (true, false), (false, true), (true, true), (false, false)]), (2, 1));
    }

    #[test]
    fn holm_textbook_example() {
        // p = .01, .04, .03, .005 (m = 4): sorted .005·4 = .02, .01·3 = .03, .03·2 = .06,
        // .04·1 = .04 → monotone .06.
        let adj = holm(&[0.01, 0.04, 0.03, 0.005]);
        for (a, b) in adj.iter().zip([0.03, 0.06, 0.06, 0.02]) {
            close(*a, b, 1e-12);
        }
        assert_eq!(holm(&[0.2, 0.02]), vec![0.2, 0.04]);
        assert_eq!(holm(&[0.6, 0.7]), vec![1.0, 1.0]);
    }

    #[test]
    fn mdd_shrinks_with_n_and_grows_with_deff() {
        // (1.6449 + 0.8416)·√(.09/1000) ≈ 0.02359.
        close(min_detectable_difference(0.1, 1000.0, 1.0, 0.05, 0.8), 0.02359, 1e-4);
        assert!(min_detectable_difference(0.1, 1000.0, 3.0, 0.05, 0.8) > 0.04);
        assert!(min_detectable_difference(0.1, 0.0, 1.0, 0.05, 0.8).is_infinite());
    }
}
