//! Batched QR and power iteration against float64 checks written here.
mod common;
use common::*;
use osftrt::*;

fn check_qr(what: &str, a: &[f64], q: &[f64], r: &[f64], m: usize, n: usize, tol: f64) {
    let e = orthogonality_error(q, m, n);
    assert!(e <= tol, "{what}: |Q^T Q - I| = {e}");
    let qr = matmul(q, r, m, n, n);
    let scale = a.iter().fold(0.0f64, |s, v| s.max(v.abs()));
    for (i, (x, y)) in qr.iter().zip(a).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale * n as f64,
            "{what}: (QR - A)[{i}] = {}",
            x - y
        );
    }
    for i in 0..n {
        assert!(r[i * n + i] >= 0.0, "{what}: diag(R)[{i}] < 0");
        for j in 0..i {
            assert_eq!(r[i * n + j], 0.0, "{what}: R[{i},{j}] below the diagonal");
        }
    }
}

#[test]
fn qr_batch_mixed_shapes_and_dtypes() {
    let mut rng = Rng::new(71);
    let (a0, a1, a2) = (
        rng.vec_f32(9 * 4, 1.0),
        rng.vec_f64(6 * 6, 1.0),
        rng.vec_f32(16 * 3, 1.0),
    );
    let (mut q0, mut q1, mut q2) = (vec![f32::NAN; 36], vec![f64::NAN; 36], vec![f32::NAN; 48]);
    let (mut r0, mut r1) = (vec![f32::NAN; 16], vec![f64::NAN; 36]);
    let ctx = Context::cpu().unwrap();
    // CholeskyTf32 factors the fp32 matrices with TF32 Gram matrices (the
    // CPU truncates the operands to TF32) and the fp64 one as CholeskyQr2.
    for method in [
        QrMethod::Householder,
        QrMethod::CholeskyQr2,
        QrMethod::CholeskyTf32,
    ] {
        let opts = QrOptions {
            method,
            ..Default::default()
        };
        ctx.qr_batch(
            &opts,
            &[
                Tensor::new(&a0, &[9, 4]).unwrap(),
                Tensor::new(&a1, &[6, 6]).unwrap(),
                Tensor::new(&a2, &[16, 3]).unwrap(),
            ],
            &mut [
                TensorMut::new(&mut q0, &[9, 4]).unwrap(),
                TensorMut::new(&mut q1, &[6, 6]).unwrap(),
                TensorMut::new(&mut q2, &[16, 3]).unwrap(),
            ],
            Some(&mut [
                Some(TensorMut::new(&mut r0, &[4, 4]).unwrap()),
                Some(TensorMut::new(&mut r1, &[6, 6]).unwrap()),
                None,
            ]),
        )
        .unwrap();
        check_qr(
            &format!("{method:?} f32 9x4"),
            &to_f64(&a0),
            &to_f64(&q0),
            &to_f64(&r0),
            9,
            4,
            2e-6,
        );
        check_qr(&format!("{method:?} f64 6x6"), &a1, &q1, &r1, 6, 6, 1e-13);
        // The thin QR with diag(R) >= 0 is unique: compare with Gram-Schmidt.
        let (qref, _) = gram_schmidt(&to_f64(&a2), 16, 3);
        assert_close(&format!("{method:?} f32 16x3 Q"), &q2, &qref, 1e-5, 1e-6);
    }
}

#[test]
fn qr_in_place_padded_rows_and_per_matrix_failure() {
    let mut rng = Rng::new(72);
    let (m, n, ld) = (7usize, 3usize, 5usize); // rows padded to 5
    let mut a = rng.vec_f64(m * ld, 1.0);
    let a_dense: Vec<f64> = (0..m)
        .flat_map(|i| a[i * ld..i * ld + n].to_vec())
        .collect();
    let pad: Vec<f64> = (0..m)
        .flat_map(|i| a[i * ld + n..i * ld + ld].to_vec())
        .collect();
    let mut bad = rng.vec_f64(4 * 2, 1.0);
    bad[3] = f64::NAN;
    let bad_before = bad.clone();
    let ctx = Context::cpu().unwrap();
    let e = ctx
        .qr_batch_in_place(
            &Default::default(),
            &mut [
                TensorMut::with_strides(&mut a, &[m as i64, n as i64], &[ld as i64, 1]).unwrap(),
                TensorMut::new(&mut bad, &[4, 2]).unwrap(),
            ],
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::NumericalError);
    assert_eq!(e.failed_indices(), &[1]);
    assert!(e.message().contains("[1]"), "{}", e.message());
    // The failed matrix is untouched (NaN compared bitwise), the other one written.
    assert!(bad
        .iter()
        .zip(&bad_before)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    let q: Vec<f64> = (0..m)
        .flat_map(|i| a[i * ld..i * ld + n].to_vec())
        .collect();
    let (qref, _) = gram_schmidt(&a_dense, m, n);
    assert_close("in-place Q", &q, &qref, 1e-12, 1e-13);
    let pad_after: Vec<f64> = (0..m)
        .flat_map(|i| a[i * ld + n..i * ld + ld].to_vec())
        .collect();
    assert_eq!(pad, pad_after, "padding must not be written");
}

#[test]
fn qr_power_iteration() {
    let mut rng = Rng::new(73);
    let (m, n, iters) = (6usize, 2usize, 3);
    let b = rng.vec_f64(m * m, 1.0);
    let a = matmul(&transpose(&b, m, m), &b, m, m, m); // symmetric PSD, like a preconditioner
    let q0 = rng.vec_f64(m * n, 1.0);
    let mut q = q0.clone();
    let ctx = Context::cpu().unwrap();
    ctx.qr_power_iteration(
        &Default::default(),
        &[Tensor::new(&a, &[m as i64, m as i64]).unwrap()],
        &mut [TensorMut::new(&mut q, &[m as i64, n as i64]).unwrap()],
        iters,
    )
    .unwrap();
    let mut want = q0;
    for _ in 0..iters {
        want = gram_schmidt(&matmul(&a, &want, m, m, n), m, n).0;
    }
    assert_close("power iteration Q", &q, &want, 1e-10, 1e-11);
}

/// An m x n matrix B C (B m x k, C k x n random, k < n): rank k in float64
/// arithmetic, so rank-deficient to working precision; rounded to f32 when
/// `f32` (still rank-deficient to f32's precision).
fn low_rank(rng: &mut Rng, m: usize, n: usize, k: usize, f32: bool) -> Vec<f64> {
    let (b, c) = (rng.vec_f64(m * k, 1.0), rng.vec_f64(k * n, 1.0));
    let p = matmul(&b, &c, m, k, n);
    if f32 {
        p.iter().map(|&x| x as f32 as f64).collect()
    } else {
        p
    }
}

/// Q of a power-iteration step from Q0: orthonormal, and its columns span
/// A Q0 (Q Q^T A Q0 = A Q0), in float64.
fn check_spans(what: &str, a: &[f64], q0: &[f64], q: &[f64], m: usize, n: usize) {
    let e = orthogonality_error(q, m, n);
    assert!(e <= 1e-12, "{what}: |Q^T Q - I| = {e}");
    let aq = matmul(a, q0, m, m, n);
    let proj = matmul(q, &matmul(&transpose(q, m, n), &aq, n, m, n), m, n, n);
    let scale = aq.iter().fold(0.0f64, |s, v| s.max(v.abs()));
    for (i, (x, y)) in proj.iter().zip(&aq).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * scale,
            "{what}: (Q Q^T A Q0 - A Q0)[{i}] = {}",
            x - y
        );
    }
}

/// RankDeficient::Factor: rank-deficient matrices among full-rank ones (f32
/// and f64, every method) are factored (Q orthonormal, Q R = A in float64),
/// reported alone and not failures; RankDeficient::Fail (the default) keeps
/// the failure with untouched outputs. NaN beside them still fails; power
/// iteration on a singular factor and the in-place call likewise.
#[test]
fn rank_deficient_matrices_factored_and_reported() {
    let mut rng = Rng::new(74);
    assert_eq!(QrOptions::default().rank_deficient, RankDeficient::Fail);
    // (m, n, rank (0: full), f32)
    let list = [
        (12usize, 5usize, 0usize, false),
        (10, 6, 2, false),
        (9, 4, 0, true),
        (8, 8, 3, true),
        (7, 3, 0, false),
    ];
    let deficient: Vec<usize> = (0..list.len()).filter(|&i| list[i].2 > 0).collect();
    for method in [
        QrMethod::Householder,
        QrMethod::CholeskyQr2,
        QrMethod::CholeskyTf32,
    ] {
        for policy in [RankDeficient::Factor, RankDeficient::Fail] {
            let a64: Vec<Vec<f64>> = list
                .iter()
                .map(|&(m, n, k, f)| {
                    if k > 0 {
                        low_rank(&mut rng, m, n, k, f)
                    } else {
                        rng.vec_f64(m * n, 1.0)
                    }
                })
                .collect();
            let a32: Vec<Vec<f32>> = a64
                .iter()
                .map(|v| v.iter().map(|&x| x as f32).collect())
                .collect();
            let mut q64: Vec<Vec<f64>> = list
                .iter()
                .map(|&(m, n, ..)| vec![f64::NAN; m * n])
                .collect();
            let mut r64: Vec<Vec<f64>> = list
                .iter()
                .map(|&(_, n, ..)| vec![f64::NAN; n * n])
                .collect();
            let mut q32: Vec<Vec<f32>> = list
                .iter()
                .map(|&(m, n, ..)| vec![f32::NAN; m * n])
                .collect();
            let mut r32: Vec<Vec<f32>> = list
                .iter()
                .map(|&(_, n, ..)| vec![f32::NAN; n * n])
                .collect();
            let sh = |i: usize| [list[i].0 as i64, list[i].1 as i64];
            let shr = |i: usize| [list[i].1 as i64, list[i].1 as i64];
            let a: Vec<Tensor> = (0..list.len())
                .map(|i| {
                    if list[i].3 {
                        Tensor::new(&a32[i], &sh(i)).unwrap()
                    } else {
                        Tensor::new(&a64[i], &sh(i)).unwrap()
                    }
                })
                .collect();
            let mut q: Vec<TensorMut> = Vec::new();
            let mut r: Vec<Option<TensorMut>> = Vec::new();
            for (i, (((q64, r64), q32), r32)) in q64
                .iter_mut()
                .zip(r64.iter_mut())
                .zip(q32.iter_mut())
                .zip(r32.iter_mut())
                .enumerate()
            {
                if list[i].3 {
                    q.push(TensorMut::new(q32, &sh(i)).unwrap());
                    r.push(Some(TensorMut::new(r32, &shr(i)).unwrap()));
                } else {
                    q.push(TensorMut::new(q64, &sh(i)).unwrap());
                    r.push(Some(TensorMut::new(r64, &shr(i)).unwrap()));
                }
            }
            let opts = QrOptions {
                method,
                rank_deficient: policy,
                ..Default::default()
            };
            let res = ctx().qr_batch(&opts, &a, &mut q, Some(&mut r));
            drop((q, r));
            let what = format!("{method:?} {policy:?}");
            match policy {
                RankDeficient::Factor => {
                    let report = res.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(report.rank_deficient, deficient, "{what}");
                }
                RankDeficient::Fail => {
                    let e = res.unwrap_err();
                    assert_eq!(e.status(), Status::NumericalError, "{what}: {e}");
                    assert_eq!(e.failed_indices(), &deficient[..], "{what}");
                    assert!(e.rank_deficient_indices().is_empty(), "{what}");
                }
            }
            for (i, &(m, n, k, f)) in list.iter().enumerate() {
                let what = format!("{what} matrix {i} ({m}x{n}, rank {k}, f32 {f})");
                if k > 0 && policy == RankDeficient::Fail {
                    let untouched = if f {
                        q32[i].iter().chain(&r32[i]).all(|v| v.is_nan())
                    } else {
                        q64[i].iter().chain(&r64[i]).all(|v| v.is_nan())
                    };
                    assert!(untouched, "{what}: a failed matrix's outputs were written");
                } else if f {
                    check_qr(
                        &what,
                        &a64[i],
                        &to_f64(&q32[i]),
                        &to_f64(&r32[i]),
                        m,
                        n,
                        1e-5,
                    );
                } else {
                    check_qr(&what, &a64[i], &q64[i], &r64[i], m, n, 1e-12);
                }
            }
        }
    }

    // NaN beside a rank-deficient matrix: the NaN one still fails, the
    // other is written and reported in the error.
    let mut nan = rng.vec_f64(12, 1.0);
    nan[5] = f64::NAN;
    let nan_before = nan.clone();
    let sing = low_rank(&mut rng, 4, 3, 1, false);
    let mut qs = sing.clone();
    let e = ctx()
        .qr_batch_in_place(
            &QrOptions {
                rank_deficient: RankDeficient::Factor,
                ..Default::default()
            },
            &mut [
                TensorMut::new(&mut nan, &[4, 3]).unwrap(),
                TensorMut::new(&mut qs, &[4, 3]).unwrap(),
            ],
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::NumericalError, "{e}");
    assert_eq!(e.failed_indices(), &[0]);
    assert_eq!(e.rank_deficient_indices(), &[1]);
    assert!(nan
        .iter()
        .zip(&nan_before)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    let r = matmul(&transpose(&qs, 4, 3), &sing, 3, 4, 3); // R = Q^T A
    let qr = matmul(&qs, &r, 4, 3, 3);
    assert!(orthogonality_error(&qs, 4, 3) <= 1e-12);
    assert_close("in place beside NaN: Q Q^T A", &qr, &sing, 0.0, 1e-12);

    // Power iteration on a singular factor (rank 2, 6 x 6, Q 6 x 3) beside
    // a full-rank one.
    let (m, n) = (6usize, 3usize);
    let sq = low_rank(&mut rng, m, m, 2, false);
    let full = rng.vec_f64(m * m, 1.0);
    let (q0, qf0) = (rng.vec_f64(m * n, 1.0), rng.vec_f64(m * n, 1.0));
    for policy in [RankDeficient::Fail, RankDeficient::Factor] {
        let (mut qv, mut qf) = (q0.clone(), qf0.clone());
        let res = ctx().qr_power_iteration(
            &QrOptions {
                rank_deficient: policy,
                ..Default::default()
            },
            &[
                Tensor::new(&sq, &[m as i64, m as i64]).unwrap(),
                Tensor::new(&full, &[m as i64, m as i64]).unwrap(),
            ],
            &mut [
                TensorMut::new(&mut qv, &[m as i64, n as i64]).unwrap(),
                TensorMut::new(&mut qf, &[m as i64, n as i64]).unwrap(),
            ],
            1,
        );
        match policy {
            RankDeficient::Fail => {
                let e = res.unwrap_err();
                assert_eq!(e.status(), Status::NumericalError, "{e}");
                assert_eq!(e.failed_indices(), &[0]);
                assert_eq!(qv, q0, "a failed pair's Q was written");
            }
            RankDeficient::Factor => {
                assert_eq!(res.unwrap().rank_deficient, [0]);
                check_spans("power iteration, singular", &sq, &q0, &qv, m, n);
            }
        }
        check_spans("power iteration, full rank", &full, &qf0, &qf, m, n);
    }
}

fn ctx() -> Context {
    Context::cpu().unwrap()
}
