//! Shared helpers of the integration tests: a seeded RNG, float64
//! reference arithmetic and comparison with a tolerance.
#![allow(dead_code)]

/// xorshift64*: reproducible, dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-scale, scale], never (close to) zero.
    pub fn val(&mut self, scale: f64) -> f64 {
        loop {
            let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            if u.abs() > 1e-3 {
                return u * scale;
            }
        }
    }
    pub fn vec_f32(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| self.val(scale) as f32).collect()
    }
    pub fn vec_f64(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.val(scale)).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// C = A (m x k) * B (k x n), row-major, f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += aip * b[p * n + j];
            }
        }
    }
    c
}

/// A^T for A (m x n).
pub fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

/// Orthonormal columns (m x n, m >= n) by modified Gram-Schmidt in f64,
/// with a positive diagonal of R (the unique thin QR).
pub fn gram_schmidt(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut q = a.to_vec();
    let mut r = vec![0.0; n * n];
    for j in 0..n {
        for p in 0..j {
            let d: f64 = (0..m).map(|i| q[i * n + p] * q[i * n + j]).sum();
            r[p * n + j] += d;
            for i in 0..m {
                q[i * n + j] -= d * q[i * n + p];
            }
        }
        // Re-orthogonalize once (MGS twice is orthogonal to rounding).
        for p in 0..j {
            let d: f64 = (0..m).map(|i| q[i * n + p] * q[i * n + j]).sum();
            r[p * n + j] += d;
            for i in 0..m {
                q[i * n + j] -= d * q[i * n + p];
            }
        }
        let norm = (0..m)
            .map(|i| q[i * n + j] * q[i * n + j])
            .sum::<f64>()
            .sqrt();
        r[j * n + j] = norm;
        for i in 0..m {
            q[i * n + j] /= norm;
        }
    }
    (q, r)
}

/// Asserts |got - want| <= atol + rtol |want| elementwise, naming `what`.
pub fn assert_close<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    want: &[f64],
    rtol: f64,
    atol: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g: f64 = g.into();
        assert!(g.is_finite(), "{what}[{i}] = {g} (not written?)");
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    assert!(
        worst.1 <= 0.0,
        "{what}[{}]: got {}, want {} (rtol {rtol}, atol {atol})",
        worst.0,
        Into::<f64>::into(got[worst.0]),
        want[worst.0]
    );
}

/// max |Q^T Q - I| for Q (m x n).
pub fn orthogonality_error(q: &[f64], m: usize, n: usize) -> f64 {
    let qtq = matmul(&transpose(q, m, n), q, n, m, n);
    let mut e: f64 = 0.0;
    for i in 0..n {
        for j in 0..n {
            let want = if i == j { 1.0 } else { 0.0 };
            e = e.max((qtq[i * n + j] - want).abs());
        }
    }
    e
}
