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
