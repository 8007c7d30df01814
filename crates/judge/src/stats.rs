//! Statistics behind rules R2–R4, as docs/statistics.md explains them (measured by a
//! simulation study; do not "improve" them without re-running it):
//!
//! - one-sided Clopper–Pearson bounds on (possibly non-integer) effective counts;
//! - the ANOVA intra-cluster correlation and the size-weighted design effect
//!   DEFF = 1 + (m_w − 1)·ρ̂, or the two-way cluster-robust variance ratio;
//! - the one-sided sign-flip permutation test on per-cluster net discordance (R4);
//! - McNemar's discordant counts (description only), Holm's correction, and the minimum
//!   detectable difference of a plan (does `voll` decide what `schnell` could not?);
//! - the one-sided betting test (aGRAPA, Waudby-Smith & Ramdas) and its confidence
//!   sequence on the mean of bounded observations, for early stopping.
//!
//! Pure functions on counts; nothing here knows about cases or rules.

use std::collections::HashMap;
use std::hash::Hash;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{Beta, ContinuousCDF, Normal, StudentsT};

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
pub(crate) fn icc_anova(clusters: &[Cluster]) -> f64 {
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
    /// One-way ANOVA ρ̂ (floored at 0), reported even when another variant is used.
    pub rho: f64,
    /// Size-weighted mean cluster size Σm²/N.
    pub m_w: f64,
    pub deff: f64,
    pub n_eff: f64,
    pub x_eff: f64,
    /// Degrees of freedom of the variance estimate, when the bounds carry a
    /// small-sample correction (crossed clustering); None: no correction.
    pub df: Option<f64>,
    /// Crossed clustering: ρ̂ and Σm²/N of the second grouping (injection task).
    pub rho_b: Option<f64>,
    pub m_w_b: Option<f64>,
}

impl Adjusted {
    pub fn rate(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.x as f64 / self.n as f64 }
    }
    /// The effective sample size the bounds at α use: n_eff, shrunk by (z₁₋α / t₁₋α,df)²
    /// when the variance was estimated from few clusters, so that the bound is as wide
    /// as a t interval with `df` degrees of freedom.
    pub(crate) fn n_eff_at(&self, alpha: f64) -> f64 {
        match self.df {
            Some(df) if df.is_finite() && df > 0.0 => self.n_eff * t_shrink(df, alpha),
            _ => self.n_eff,
        }
    }
    pub fn upper(&self, alpha: f64) -> f64 {
        let n = self.n_eff_at(alpha);
        cp_upper(self.rate() * n, n, alpha)
    }
    /// One-sided normal margin for the spread of the second grouping's clusters
    /// (crossed clustering: the injection tasks), z₁₋α·√(p(1 − p)·ρ̂_B·(m_wB − 1)/N):
    /// the part of the estimate's variance that more first-grouping clusters (user
    /// tasks) do not shrink, for a test against `threshold`, its binomial part taken
    /// where [`spread_at`] says. 0 without a second grouping.
    pub(crate) fn margin_b(&self, alpha: f64, threshold: f64) -> f64 {
        let (Some(rho), Some(m_w)) = (self.rho_b, self.m_w_b) else { return 0.0 };
        if self.n == 0 || rho <= 0.0 {
            return 0.0;
        }
        let p = spread_at(self.rate(), threshold);
        let z = Normal::standard().inverse_cdf(1.0 - alpha);
        z * (p * (1.0 - p) * rho * (m_w - 1.0).max(0.0) / self.n as f64).sqrt()
    }
    pub fn lower(&self, alpha: f64) -> f64 {
        let n = self.n_eff_at(alpha);
        cp_lower(self.rate() * n, n, alpha)
    }
}

/// The proportion at which [`Adjusted::margin_b`] takes its binomial part p(1 − p):
/// of the estimate p̂ and the threshold, the one further from ½, whose spread is the
/// smaller. A wrong decision needs the truth at the threshold: a version measured at ASR
/// 0.30 against a threshold of 0.10, brought back to the threshold with the same
/// correlation, would spread less than it shows, so it is not charged for more. A
/// version measured further from ½ than the threshold (ASR 0.01) keeps its own spread:
/// carried to the threshold it would be charged for landings it never showed (measured:
/// up to 5 points more of `voll` at ASR 0.01; the errors at the threshold the same
/// either way).
pub(crate) fn spread_at(estimate: f64, threshold: f64) -> f64 {
    if (estimate - 0.5).abs() >= (threshold - 0.5).abs() { estimate } else { threshold }
}

/// (z₁₋α / t₁₋α,df)²: how much a t quantile with `df` degrees of freedom shrinks an
/// effective sample size compared with the normal quantile.
pub(crate) fn t_shrink(df: f64, alpha: f64) -> f64 {
    // Beyond a few thousand degrees of freedom t is normal to four digits (and statrs'
    // quantile slows down for huge shapes).
    if !df.is_finite() || df > 5000.0 {
        return 1.0;
    }
    let z = Normal::standard().inverse_cdf(1.0 - alpha);
    let t = StudentsT::new(0.0, 1.0, df.max(0.5)).expect("df > 0").inverse_cdf(1.0 - alpha);
    (z / t).powi(2).min(1.0)
}

/// Size-weighted mean cluster size m_w = Σ m_c² / N (1 when there is nothing).
pub(crate) fn weighted_cluster_size(sizes: impl IntoIterator<Item = u64>) -> f64 {
    let (mut n, mut sq) = (0.0, 0.0);
    for m in sizes {
        n += m as f64;
        sq += (m as f64).powi(2);
    }
    if n == 0.0 { 1.0 } else { sq / n }
}

/// One-way adjustment: DEFF = 1 + (m_w − 1)·ρ̂, n_eff = N/DEFF, x_eff = p̂·n_eff.
pub(crate) fn adjust_one_way(clusters: &[Cluster]) -> Adjusted {
    let rho = icc_anova(clusters);
    let m_w = weighted_cluster_size(clusters.iter().map(|c| c.m));
    with_deff(clusters, rho, m_w, 1.0 + (m_w - 1.0) * rho, None)
}

/// Two-way adjustment (user task × injection task) with the Cameron–Gelbach–Miller
/// variance; see [`Design::two_way`]. `obs` are (cluster A, cluster B, outcome).
pub(crate) fn adjust_two_way<A: Hash + Eq + Clone, B: Hash + Eq + Clone>(obs: &[(A, B, bool)]) -> Adjusted {
    let (design, y) = Design::of(obs);
    design.two_way(&y)
}

/// Observations grouped two ways, A (user task) and B (injection task), as dense
/// indices: built once from the keys, then any number of outcome vectors are adjusted
/// against it (the study judges thousands on one plan's shape).
#[derive(Clone, Debug)]
pub struct Design {
    a: Vec<usize>,
    b: Vec<usize>,
    /// The (A, B) cell: cases that share both (the same pair under several attacks).
    cell: Vec<usize>,
    n_a: usize,
    n_b: usize,
    n_cell: usize,
}

/// Per-group counts of one grouping: (sum of y, size).
fn group_counts(index: &[usize], groups: usize, y: &[bool]) -> Vec<Cluster> {
    let mut out = vec![Cluster { x: 0, m: 0 }; groups];
    for (&g, &v) in index.iter().zip(y) {
        out[g].m += 1;
        out[g].x += v as u64;
    }
    out
}

impl Design {
    pub fn new<A: Hash + Eq, B: Hash + Eq>(keys: impl IntoIterator<Item = (A, B)>) -> Design {
        fn dense<K: Hash + Eq>(map: &mut HashMap<K, usize>, k: K) -> usize {
            let next = map.len();
            *map.entry(k).or_insert(next)
        }
        let (mut ia, mut ib, mut icell) = (HashMap::new(), HashMap::new(), HashMap::new());
        let (mut a, mut b, mut cell) = (Vec::new(), Vec::new(), Vec::new());
        for (ka, kb) in keys {
            let (x, y) = (dense(&mut ia, ka), dense(&mut ib, kb));
            a.push(x);
            b.push(y);
            cell.push(dense(&mut icell, (x, y)));
        }
        Design { a, b, cell, n_a: ia.len(), n_b: ib.len(), n_cell: icell.len() }
    }

    /// The design of `obs` and its outcomes.
    pub fn of<A: Hash + Eq + Clone, B: Hash + Eq + Clone>(obs: &[(A, B, bool)]) -> (Design, Vec<bool>) {
        let design = Design::new(obs.iter().map(|(a, b, _)| (a.clone(), b.clone())));
        (design, obs.iter().map(|o| o.2).collect())
    }

    pub(crate) fn clusters_a(&self, y: &[bool]) -> Vec<Cluster> {
        group_counts(&self.a, self.n_a, y)
    }

    pub(crate) fn clusters_b(&self, y: &[bool]) -> Vec<Cluster> {
        group_counts(&self.b, self.n_b, y)
    }

    /// One-way by A: [`adjust_one_way`].
    pub fn one_way(&self, y: &[bool]) -> Adjusted {
        adjust_one_way(&self.clusters_a(y))
    }

    /// Two-way (Cameron–Gelbach–Miller): the design effect is the ratio of the two-way
    /// cluster-robust variance of the mean, V_A + V_B − V_AB, to the i.i.d. variance,
    /// floored at 1; then the same effective-n route.
    pub fn two_way(&self, y: &[bool]) -> Adjusted {
        let clusters = self.clusters_a(y);
        let rho = icc_anova(&clusters);
        let m_w = weighted_cluster_size(clusters.iter().map(|c| c.m));
        with_deff(&clusters, rho, m_w, self.cr_ratio(y, false), None)
    }

    /// var_cr / var_iid of the mean, floored at 1; `cr2` divides each cluster's squared
    /// residual sum by 1 − m_g/N (the CR2 leverage correction of an intercept-only model).
    pub(crate) fn cr_ratio(&self, y: &[bool], cr2: bool) -> f64 {
        let n = y.len() as f64;
        if n == 0.0 {
            return 1.0;
        }
        let p = y.iter().filter(|v| **v).count() as f64 / n;
        let var_iid: f64 = y.iter().map(|&v| (v as u8 as f64 - p).powi(2)).sum::<f64>();
        if var_iid <= 0.0 {
            return 1.0;
        }
        let grouped = |index: &[usize], groups: usize| -> f64 {
            let mut sums = vec![(0.0f64, 0.0f64); groups];
            for (&g, &v) in index.iter().zip(y) {
                sums[g].0 += v as u8 as f64 - p;
                sums[g].1 += 1.0;
            }
            sums.iter().map(|(s, m)| if cr2 && *m < n { s * s / (1.0 - m / n) } else { s * s }).sum()
        };
        let v = grouped(&self.a, self.n_a) + grouped(&self.b, self.n_b) - grouped(&self.cell, self.n_cell);
        (v / var_iid).max(1.0)
    }

    /// Crossed: DEFF = 1 + (m_wA − 1)·ρ̂_A + (m_wB − 1)·ρ̂_B, each ρ̂ the one-way ANOVA
    /// estimate of its grouping (floored at 0), with Satterthwaite degrees of freedom
    /// from Kish's effective number of clusters of each grouping.
    pub fn crossed(&self, y: &[bool]) -> Adjusted {
        let ca = self.clusters_a(y);
        let cb = self.clusters_b(y);
        let (rho_a, rho_b) = (icc_anova(&ca), icc_anova(&cb));
        let m_a = weighted_cluster_size(ca.iter().map(|c| c.m));
        let m_b = weighted_cluster_size(cb.iter().map(|c| c.m));
        let (part_a, part_b) = ((m_a - 1.0) * rho_a, (m_b - 1.0) * rho_b);
        let deff = 1.0 + part_a + part_b;
        let n = y.len() as f64;
        let df = satterthwaite(deff, &[(part_a, n / m_a), (part_b, n / m_b)]);
        Adjusted { rho_b: Some(rho_b), m_w_b: Some(m_b), ..with_deff(&ca, rho_a, m_a, deff, df) }
    }
}

/// Satterthwaite degrees of freedom of a variance 1 + Σ part (the 1, the binomial part,
/// counted as known): (Σ)² / Σ part²/(g − 1) with g the effective number of clusters a
/// part was estimated from. None when no part is positive (nothing was estimated).
pub(crate) fn satterthwaite(total: f64, parts: &[(f64, f64)]) -> Option<f64> {
    let denom: f64 = parts.iter().filter(|(v, _)| *v > 0.0).map(|(v, g)| v * v / (g - 1.0).max(1.0)).sum();
    (denom > 0.0).then(|| total * total / denom)
}

fn with_deff(clusters: &[Cluster], rho: f64, m_w: f64, deff: f64, df: Option<f64>) -> Adjusted {
    let x: u64 = clusters.iter().map(|c| c.x).sum();
    let n: u64 = clusters.iter().map(|c| c.m).sum();
    let deff = deff.max(1.0);
    let n_eff = n as f64 / deff;
    let p = if n == 0 { 0.0 } else { x as f64 / n as f64 };
    Adjusted {
        x,
        n,
        clusters: clusters.iter().filter(|c| c.m > 0).count(),
        rho,
        m_w,
        deff,
        n_eff,
        x_eff: p * n_eff,
        df,
        rho_b: None,
        m_w_b: None,
    }
}

/// Result of the one-sided sign-flip permutation test.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub(crate) struct SignFlip {
    /// Σ d_c over clusters.
    pub t_obs: i64,
    pub p_value: f64,
    /// Clusters with d_c ≠ 0 (the others cannot change T).
    pub nonzero_clusters: usize,
    /// True when all 2^k flips were enumerated.
    pub exact: bool,
}

/// Enumerate exactly up to this many non-zero clusters (2^16 sign patterns).
pub(crate) const EXACT_MAX_CLUSTERS: usize = 16;

/// One-sided sign-flip test of H₀ "no systematic difference" against "Σ d_c is large"
/// on per-cluster net discordance d_c = b_c − c_c. Exact for ≤ 16 non-zero clusters
/// (p = share of sign patterns with T* ≥ T_obs), else `permutations` random flips from
/// a ChaCha20 RNG seeded with `seed`: p = (1 + #{T* ≥ T_obs}) / (1 + B).
pub(crate) fn sign_flip_test(d: &[i64], permutations: u64, seed: u64) -> SignFlip {
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
pub(crate) fn mcnemar_counts(pairs: impl IntoIterator<Item = (bool, bool)>) -> (u64, u64) {
    pairs.into_iter().fold((0, 0), |(b, c), (cand, refr)| match (cand, refr) {
        (true, false) => (b + 1, c),
        (false, true) => (b, c + 1),
        _ => (b, c),
    })
}

/// Holm's step-down adjusted p-values, in the input order:
/// adj_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)) over the ascending order.
pub(crate) fn holm(p: &[f64]) -> Vec<f64> {
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
pub(crate) fn min_detectable_difference(p0: f64, n: f64, deff: f64, alpha: f64, power: f64) -> f64 {
    if n <= 0.0 {
        return f64::INFINITY;
    }
    let z = Normal::standard();
    let zsum = z.inverse_cdf(1.0 - alpha) + z.inverse_cdf(power);
    zsum * (p0 * (1.0 - p0) * deff.max(1.0) / n).sqrt()
}

/// Which way a one-sided betting test bets against its threshold m.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// H₀: mean ≥ m; the capital grows when observations fall below m (an upper
    /// confidence bound below m rejects it).
    Below,
    /// H₀: mean ≤ m; the capital grows when observations lie above m.
    Above,
}

/// Share of the largest bet that keeps the capital positive: 1 could lose everything on
/// one observation at the far end of [0, 1] (and never recover); 0.95 keeps a twentieth.
/// The cap sets how fast the capital can grow where observations sit at the near end (a
/// clean user task multiplies it by at most 1 + 0.95·m/(1 − m) on the pass side): 0.9
/// cost a clean version two points more of `voll` before it was approved.
pub(crate) const BET_CAP: f64 = 0.95;

/// The capital of the one-sided aGRAPA betting test after each observation
/// (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by
/// betting"): K_t = Π (1 + λ_i·s·(x_i − m)), s = +1 above, −1 below, with the predictable
/// bet λ_i = (s·(μ̂ − m)) / (σ̂² + (μ̂ − m)²) from the observations before i, clipped to
/// [0, BET_CAP / (largest loss per unit bet)]. Under H₀ K is a nonnegative
/// supermartingale whatever the bets, so by Ville's inequality P(sup K_t ≥ 1/α) ≤ α: the
/// test may be looked at after every observation and stopped at any time.
///
/// Observations must lie in [0, 1]. The running estimates start at [`betting_prior`]
/// with variance 1/4, weighing as one observation, so the test bets from the first
/// observation on; any predictable bet keeps the guarantee, the prior only decides how
/// soon a clear alternative pays.
pub(crate) fn betting_capital(xs: &[f64], m: f64, side: Side) -> Vec<f64> {
    let sign = match side {
        Side::Above => 1.0,
        Side::Below => -1.0,
    };
    // The largest loss per unit bet: x − m ≥ −m above, m − x ≥ −(1 − m) below.
    let cap = BET_CAP / if side == Side::Above { m } else { 1.0 - m }.max(1e-12);
    let (mut sum, mut sum_sq_dev, mut capital) = (betting_prior(m, side), 0.25, 1.0);
    let mut out = Vec::with_capacity(xs.len());
    for (i, &x) in xs.iter().enumerate() {
        let t = i as f64 + 1.0;
        let mean = sum / t;
        let var = sum_sq_dev / t;
        let edge = sign * (mean - m);
        let lambda = if edge > 0.0 { (edge / (var + edge * edge)).min(cap) } else { 0.0 };
        capital *= 1.0 + lambda * sign * (x - m);
        out.push(capital);
        sum += x;
        sum_sq_dev += (x - sum / (t + 1.0)).powi(2);
    }
    out
}

/// Where the betting test's running mean starts: halfway between m and the end of [0, 1]
/// the alternative points to. Starting at m (no edge, so no bet) wasted the first
/// observations: on `voll`'s shape the study measured 2–3 points more of the plan run
/// before a version at ASR 0.3 was rejected, and no change where the mean sits near m.
pub(crate) fn betting_prior(m: f64, side: Side) -> f64 {
    match side {
        Side::Above => (m + 1.0) / 2.0,
        Side::Below => m / 2.0,
    }
}

/// The first observation (1-based count) after which the betting test rejects H₀ at
/// level α, or None: anytime-valid, so the first crossing is the decision.
pub(crate) fn betting_rejects_at(xs: &[f64], m: f64, side: Side, alpha: f64) -> Option<usize> {
    betting_capital(xs, m, side).iter().position(|k| *k >= 1.0 / alpha).map(|i| i + 1)
}

/// The one-sided confidence sequence's bound after all of `xs` (running intersection):
/// the upper bound (side Below: the smallest m the test still cannot reject, i.e. every
/// m above it was rejected at some time) or the lower bound (side Above). Bisection on
/// m to 1e-4; monotone in m up to the bets' dependence on m, which is the CS's own
/// definition (Waudby-Smith & Ramdas compute it on a grid the same way).
pub(crate) fn betting_bound(xs: &[f64], side: Side, alpha: f64) -> f64 {
    let rejected = |m: f64| betting_rejects_at(xs, m, side, alpha).is_some();
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..14 {
        let mid = 0.5 * (lo + hi);
        match (side, rejected(mid)) {
            // Below: large m are rejected; the bound is the edge between.
            (Side::Below, true) | (Side::Above, false) => hi = mid,
            (Side::Below, false) | (Side::Above, true) => lo = mid,
        }
    }
    match side {
        Side::Below => hi,
        Side::Above => lo,
    }
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
        assert_eq!(adjust_two_way(&[(1, 1, false), (2, 2, false)]).deff, 1.0);
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

    /// All-zero observations against m: the pass side's capital grows by the capped bet
    /// 1 + 0.9·m/(1 − m) per observation once the estimate sits below m, so at m = 0.1
    /// and α = 0.03 it needs a few dozen (the floor the docs give), never a handful.
    #[test]
    fn betting_on_zeros_rejects_after_a_floor() {
        let zeros = vec![0.0; 102];
        let at = betting_rejects_at(&zeros, 0.1, Side::Below, 0.03).unwrap();
        assert!((30..=45).contains(&at), "{at}");
        // The bet is capped: no run of zeros rejects faster than (1 + 0.9·m/(1 − m))^t.
        let fastest = ((1.0f64 / 0.03).ln() / (1.0f64 + 0.9 * 0.1 / 0.9).ln()).ceil() as usize;
        assert!(at >= fastest, "{at} < {fastest}");
        assert_eq!(betting_rejects_at(&zeros, 0.1, Side::Above, 0.05), None);
    }

    /// Clearly above the threshold: the fail side rejects within a few observations.
    #[test]
    fn betting_on_high_values_rejects_fast() {
        let xs = vec![0.3, 0.35, 0.25, 0.4, 0.3, 0.28, 0.33, 0.31, 0.29, 0.36, 0.3, 0.3];
        let at = betting_rejects_at(&xs, 0.1, Side::Above, 0.05).unwrap();
        assert!(at <= 10, "{at}");
        assert_eq!(betting_rejects_at(&xs, 0.1, Side::Below, 0.03), None);
    }

    /// Ville's inequality, checked by simulation: at the null's edge (mean exactly m),
    /// observed over 100 steps, the test rejects in at most about α of the sequences.
    #[test]
    fn betting_keeps_its_level_under_continuous_monitoring() {
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let (runs, alpha) = (2000, 0.05);
        let mut rejections = [0u32; 2];
        for _ in 0..runs {
            // Mean 0.1: a user task's rate over 20 cases with a Beta(0.5, 4.5) latent rate.
            let xs: Vec<f64> = (0..100)
                .map(|_| {
                    let p: f64 = Beta::new(0.5, 4.5).unwrap().inverse_cdf(rng.random::<f64>());
                    (0..20).filter(|_| rng.random::<f64>() < p).count() as f64 / 20.0
                })
                .collect();
            rejections[0] += u32::from(betting_rejects_at(&xs, 0.1, Side::Below, alpha).is_some());
            rejections[1] += u32::from(betting_rejects_at(&xs, 0.1, Side::Above, alpha).is_some());
        }
        for r in rejections {
            assert!(f64::from(r) / f64::from(runs) <= alpha + 0.015, "{rejections:?}");
        }
    }

    #[test]
    fn betting_bounds_bracket_the_mean_and_shrink() {
        let xs: Vec<f64> = (0..200).map(|i| if i % 5 == 0 { 0.5 } else { 0.0 }).collect(); // mean 0.1
        let (lo, hi) = (betting_bound(&xs, Side::Above, 0.05), betting_bound(&xs, Side::Below, 0.05));
        assert!(lo < 0.1 && 0.1 < hi, "{lo} {hi}");
        let (lo_few, hi_few) =
            (betting_bound(&xs[..40], Side::Above, 0.05), betting_bound(&xs[..40], Side::Below, 0.05));
        assert!(hi - lo < hi_few - lo_few, "{lo_few} {hi_few} → {lo} {hi}");
        // The bound and the test agree: the test at the bound's far side rejects.
        assert!(betting_rejects_at(&xs, hi + 0.01, Side::Below, 0.05).is_some());
        assert!(betting_rejects_at(&xs, hi - 0.01, Side::Below, 0.05).is_none());
    }

    #[test]
    fn the_margin_spread_is_the_smaller_of_the_estimates_and_the_thresholds() {
        // ASR: above the threshold (nearer ½) the threshold's; below it p̂'s.
        assert_eq!(spread_at(0.30, 0.10), 0.10);
        assert_eq!(spread_at(0.02, 0.10), 0.02);
        // Utility: whichever is further from ½.
        assert_eq!(spread_at(0.80, 0.50), 0.80);
        assert_eq!(spread_at(0.45, 0.40), 0.40);
        assert_eq!(spread_at(0.30, 0.40), 0.30);
        for (p, t) in [(0.3, 0.1), (0.02, 0.1), (0.8, 0.5), (0.45, 0.4)] {
            let at = spread_at(p, t);
            assert!(at * (1.0 - at) <= p * (1.0 - p) + 1e-12 && at * (1.0 - at) <= t * (1.0 - t) + 1e-12);
        }
    }

    /// The injection-task margin: z·√(p(1 − p)·ρ̂_B·(m_wB − 1)/N) by hand; none without
    /// a second grouping or without its correlation.
    #[test]
    fn margin_b_by_hand() {
        let base = Adjusted {
            x: 100,
            n: 1000,
            clusters: 50,
            rho: 0.1,
            m_w: 20.0,
            deff: 3.0,
            n_eff: 333.3,
            x_eff: 33.3,
            df: Some(30.0),
            rho_b: Some(0.05),
            m_w_b: Some(41.0),
        };
        let z = Normal::standard().inverse_cdf(0.99);
        close(base.margin_b(0.01, 0.1), z * (0.1f64 * 0.9 * 0.05 * 40.0 / 1000.0).sqrt(), 1e-12);
        // Against a threshold nearer ½ than p̂ = 0.1 the spread stays p̂'s; against one
        // further from ½ it is the threshold's.
        close(base.margin_b(0.01, 0.3), base.margin_b(0.01, 0.1), 1e-12);
        close(base.margin_b(0.01, 0.05), z * (0.05f64 * 0.95 * 0.05 * 40.0 / 1000.0).sqrt(), 1e-12);
        assert_eq!(Adjusted { rho_b: None, m_w_b: None, ..base }.margin_b(0.01, 0.1), 0.0);
        assert_eq!(Adjusted { rho_b: Some(0.0), ..base }.margin_b(0.01, 0.1), 0.0);
    }
}
