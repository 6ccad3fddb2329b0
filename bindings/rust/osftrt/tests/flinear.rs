//! The OSFT layer (forward, backward, merge, caller-owned factors) and the
//! gradient projection, against float64 references written here.
mod common;
use common::*;
use osftrt::*;

fn diag_scale_cols(a: &[f64], m: usize, n: usize, s: &[f64]) -> Vec<f64> {
    (0..m * n).map(|i| a[i] * s[i % n]).collect()
}

/// f64 reference of the backward from the layer's own factors.
#[allow(clippy::type_complexity)]
fn backward_ref(
    layer: &FLinear<'_>,
    x: &[f64],
    gy: &[f64],
    m: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = layer.dims().unwrap();
    let (n, k, r, l) = (
        d.out_features as usize,
        d.in_features as usize,
        d.frozen_rank as usize,
        d.trainable_rank as usize,
    );
    let f = |w| to_f64(&layer.factor_to_vec::<f32>(w).unwrap());
    let (uh, sh, vh, ul, sl, vl) = (
        f(Factor::UHigh),
        f(Factor::SHigh),
        f(Factor::VHigh),
        f(Factor::ULow),
        f(Factor::SLow),
        f(Factor::VLow),
    );
    let wmat = {
        let a = matmul(&diag_scale_cols(&uh, n, r, &sh), &vh, n, r, k);
        let b = matmul(&diag_scale_cols(&ul, n, l, &sl), &vl, n, l, k);
        a.iter().zip(&b).map(|(p, q)| p + q).collect::<Vec<_>>()
    };
    let g = matmul(&transpose(gy, m, n), x, n, m, k); // N x K
    let gvt = matmul(&g, &transpose(&vl, l, k), n, k, l); // N x l
    let du = diag_scale_cols(&gvt, n, l, &sl);
    let utg = matmul(&transpose(&ul, n, l), &g, l, n, k); // l x K
    let dv: Vec<f64> = (0..l * k).map(|i| utg[i] * sl[i / k]).collect();
    let ds: Vec<f64> = (0..l)
        .map(|j| (0..n).map(|i| ul[i * l + j] * gvt[i * l + j]).sum())
        .collect();
    let dx = matmul(gy, &wmat, m, n, k);
    let db: Vec<f64> = (0..n)
        .map(|j| (0..m).map(|i| gy[i * n + j]).sum())
        .collect();
    (dx, du, ds, dv, db)
}

#[test]
fn flinear_from_weight_forward_backward_merge() {
    let (n, k, m) = (12usize, 8usize, 5usize);
    let mut rng = Rng::new(11);
    let w = rng.vec_f32(n * k, 1.0);
    let x = rng.vec_f32(m * k, 1.0);
    let bias = rng.vec_f32(n, 0.5);
    let gy = rng.vec_f32(m * n, 1.0);
    let ctx = Context::cpu().unwrap();
    let layer = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[n as i64, k as i64]).unwrap(),
        &FlinearOptions {
            rank_ratio: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    let d = layer.dims().unwrap();
    assert_eq!(
        (
            d.out_features,
            d.in_features,
            d.frozen_rank,
            d.trainable_rank
        ),
        (12, 8, 4, 4)
    );

    // The factors are an SVD: orthonormal U columns and V rows.
    let (uh, ul) = (
        layer.factor_to_vec::<f32>(Factor::UHigh).unwrap(),
        layer.factor_to_vec::<f32>(Factor::ULow).unwrap(),
    );
    let u: Vec<f64> = (0..n)
        .flat_map(|i| {
            uh[i * 4..i * 4 + 4]
                .iter()
                .chain(&ul[i * 4..i * 4 + 4])
                .map(|&v| v as f64)
        })
        .collect();
    assert!(orthogonality_error(&u, n, 8) < 1e-5, "U not orthonormal");

    // merge reproduces W.
    let mut merged = vec![f32::NAN; n * k];
    layer
        .merge(&mut TensorMut::new(&mut merged, &[n as i64, k as i64]).unwrap())
        .unwrap();
    assert_close("merge", &merged, &to_f64(&w), 1e-5, 2e-6);

    let (xd, gyd, wd) = (to_f64(&x), to_f64(&gy), to_f64(&w));
    for strategy in [Strategy::Factorized, Strategy::Dense] {
        layer.set_strategy(strategy).unwrap();
        assert_eq!(
            layer.choose_strategy(m as i64, Pass::Forward).unwrap(),
            strategy
        );
        let mut y = vec![f32::NAN; m * n];
        layer
            .forward(
                &Tensor::new(&x, &[m as i64, k as i64]).unwrap(),
                Some(&Tensor::vector(&bias)),
                &mut TensorMut::new(&mut y, &[m as i64, n as i64]).unwrap(),
            )
            .unwrap();
        let mut want = matmul(&xd, &transpose(&wd, n, k), m, k, n);
        for (i, v) in want.iter_mut().enumerate() {
            *v += bias[i % n] as f64;
        }
        assert_close(&format!("{strategy:?} forward"), &y, &want, 1e-5, 1e-5);

        let (dx, du, ds, dv, db) = backward_ref(&layer, &xd, &gyd, m);
        let (mut gx, mut gu, mut gs, mut gv, mut gb) = (
            vec![f32::NAN; m * k],
            vec![f32::NAN; n * 4],
            vec![f32::NAN; 4],
            vec![f32::NAN; 4 * k],
            vec![f32::NAN; n],
        );
        layer
            .backward(
                &Tensor::new(&x, &[m as i64, k as i64]).unwrap(),
                &Tensor::new(&gy, &[m as i64, n as i64]).unwrap(),
                &mut FlinearGrads {
                    grad_x: Some(TensorMut::new(&mut gx, &[m as i64, k as i64]).unwrap()),
                    grad_u_low: Some(TensorMut::new(&mut gu, &[n as i64, 4]).unwrap()),
                    grad_s_low: Some(TensorMut::vector(&mut gs)),
                    grad_v_low: Some(TensorMut::new(&mut gv, &[4, k as i64]).unwrap()),
                    grad_bias: Some(TensorMut::vector(&mut gb)),
                    accumulate: 0,
                },
            )
            .unwrap();
        let tag = format!("{strategy:?}");
        assert_close(&format!("{tag} grad_x"), &gx, &dx, 1e-4, 1e-5);
        assert_close(&format!("{tag} grad_u_low"), &gu, &du, 1e-4, 1e-5);
        assert_close(&format!("{tag} grad_s_low"), &gs, &ds, 1e-4, 1e-5);
        assert_close(&format!("{tag} grad_v_low"), &gv, &dv, 1e-4, 1e-5);
        assert_close(&format!("{tag} grad_bias"), &gb, &db, 1e-5, 1e-6);
    }
}

/// Orthonormal factors made here: U (n x k), V rows (k x kk), S.
fn make_factors(rng: &mut Rng, n: usize, kk: usize, rank: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (u, _) = gram_schmidt(&rng.vec_f64(n * rank, 1.0), n, rank);
    let (v, _) = gram_schmidt(&rng.vec_f64(kk * rank, 1.0), kk, rank); // K x rank
    let s: Vec<f64> = (0..rank).map(|i| 3.0 - i as f64 * 0.3).collect();
    (u, transpose(&v, kk, rank), s)
}

fn cols(a: &[f64], m: usize, n: usize, c0: usize, c1: usize) -> Vec<f32> {
    (0..m)
        .flat_map(|i| (c0..c1).map(move |j| (i, j)))
        .map(|(i, j)| a[i * n + j] as f32)
        .collect()
}

#[test]
fn flinear_caller_owned_factors_and_in_place_update() {
    let (n, k, r, l, m) = (10usize, 7usize, 3usize, 4usize, 3usize);
    let mut rng = Rng::new(21);
    let (u, vt, s) = make_factors(&mut rng, n, k, r + l);
    let (mut uh, mut ul) = (cols(&u, n, r + l, 0, r), cols(&u, n, r + l, r, r + l));
    let (mut vh, mut vl): (Vec<f32>, Vec<f32>) = (
        vt[..r * k].iter().map(|&v| v as f32).collect(),
        vt[r * k..].iter().map(|&v| v as f32).collect(),
    );
    let (mut sh, mut sl): (Vec<f32>, Vec<f32>) = (
        s[..r].iter().map(|&v| v as f32).collect(),
        s[r..].iter().map(|&v| v as f32).collect(),
    );
    let x = rng.vec_f32(m * k, 1.0);
    let ctx = Context::cpu().unwrap();
    let layer = FLinear::from_factors(
        &ctx,
        Factors {
            u_high: TensorMut::new(&mut uh, &[n as i64, r as i64]).unwrap(),
            s_high: TensorMut::vector(&mut sh),
            v_high: TensorMut::new(&mut vh, &[r as i64, k as i64]).unwrap(),
            u_low: TensorMut::new(&mut ul, &[n as i64, l as i64]).unwrap(),
            s_low: TensorMut::vector(&mut sl),
            v_low: TensorMut::new(&mut vl, &[l as i64, k as i64]).unwrap(),
        },
        &Default::default(),
    )
    .unwrap();
    let forward = |layer: &FLinear<'_>, s: &[f64]| {
        let mut y = vec![f32::NAN; m * n];
        layer
            .forward(
                &Tensor::new(&x, &[m as i64, k as i64]).unwrap(),
                None,
                &mut TensorMut::new(&mut y, &[m as i64, n as i64]).unwrap(),
            )
            .unwrap();
        let w = matmul(&diag_scale_cols(&u, n, r + l, s), &vt, n, r + l, k);
        (y, matmul(&to_f64(&x), &transpose(&w, n, k), m, k, n))
    };
    let (y, want) = forward(&layer, &s);
    assert_close("forward over caller-owned factors", &y, &want, 1e-5, 1e-5);

    // An optimizer step on S_low, in place, through the layer.
    layer
        .with_factor_mut(Factor::SLow, |mut f| {
            for v in f.as_mut_slice::<f32>().unwrap() {
                *v *= 2.0;
            }
        })
        .unwrap();
    let s2: Vec<f64> = s
        .iter()
        .enumerate()
        .map(|(i, &v)| if i >= r { (v as f32 * 2.0) as f64 } else { v })
        .collect();
    let (y, want) = forward(&layer, &s2);
    assert_close("forward after the in-place step", &y, &want, 1e-5, 1e-5);

    // While a factor is lent mutably, the layer refuses to run.
    let inner = layer
        .with_factor_mut(Factor::ULow, |_| {
            let mut y = vec![0.0f32; m * n];
            layer.forward(
                &Tensor::new(&x, &[m as i64, k as i64]).unwrap(),
                None,
                &mut TensorMut::new(&mut y, &[m as i64, n as i64]).unwrap(),
            )
        })
        .unwrap();
    assert_eq!(inner.unwrap_err().status(), Status::InvalidArgument);
    // A read view shows the caller's data.
    let got = layer
        .with_factor(Factor::SHigh, |f| f.as_slice::<f32>().unwrap().to_vec())
        .unwrap();
    assert_close("s_high view", &got, &s[..r], 1e-7, 0.0);
    drop(layer);
    // The buffers are the caller's again, with the step applied.
    assert_close("s_low after the layer", &sl, &s2[r..], 1e-7, 0.0);
}

#[test]
fn projection_of_layer_gradients_and_parameters() {
    let (n, k) = (9usize, 6usize);
    let mut rng = Rng::new(31);
    let w = rng.vec_f32(n * k, 1.0);
    let ctx = Context::cpu().unwrap();
    let layer = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[n as i64, k as i64]).unwrap(),
        &FlinearOptions {
            rank_ratio: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    let d = layer.dims().unwrap();
    let (r, l) = (d.frozen_rank as usize, d.trainable_rank as usize);
    let comm = Comm::new_self(&ctx, &Default::default()).unwrap();
    assert_eq!(
        comm.info().unwrap(),
        CommInfo {
            rank: 0,
            size: 1,
            engine: Engine::SelfRank
        }
    );
    let mut p = Projector::new(&ctx, Some(&comm), &Default::default()).unwrap();
    let t = p.add_layer(&layer).unwrap();
    assert_eq!(t, 0);
    let mut gu = rng.vec_f32(n * l, 1.0);
    let mut gv = rng.vec_f32(l * k, 1.0);
    let uh = to_f64(&layer.factor_to_vec::<f32>(Factor::UHigh).unwrap());
    let vh = to_f64(&layer.factor_to_vec::<f32>(Factor::VHigh).unwrap());
    // f64 reference: dU -= Uh (Uh^T dU), dV -= (dV Vh^T) Vh.
    let (gud, gvd) = (to_f64(&gu), to_f64(&gv));
    let cu = matmul(&transpose(&uh, n, r), &gud, r, n, l);
    let want_u: Vec<f64> = gud
        .iter()
        .zip(matmul(&uh, &cu, n, r, l))
        .map(|(a, b)| a - b)
        .collect();
    let cv = matmul(&gvd, &transpose(&vh, r, k), l, k, r);
    let want_v: Vec<f64> = gvd
        .iter()
        .zip(matmul(&cv, &vh, l, r, k))
        .map(|(a, b)| a - b)
        .collect();
    p.project(&mut [ProjectionGrads {
        target: t,
        grad_u_low: Some(TensorMut::new(&mut gu, &[n as i64, l as i64]).unwrap()),
        grad_v_low: Some(TensorMut::new(&mut gv, &[l as i64, k as i64]).unwrap()),
    }])
    .unwrap();
    assert_close("projected grad_u_low", &gu, &want_u, 1e-5, 1e-6);
    assert_close("projected grad_v_low", &gv, &want_v, 1e-5, 1e-6);
    let info = p.info().unwrap();
    assert_eq!(info.targets, 1);
    assert_eq!(info.collectives_per_project, 0); // replicated: no collective

    // Push U_low into the frozen subspace, then project the parameters back.
    layer
        .with_factor_mut(Factor::ULow, |mut f| {
            let strides = f.strides();
            let data = f.as_mut_slice::<f32>().unwrap();
            for i in 0..n {
                for j in 0..l {
                    data[i * strides[0] as usize + j] += 0.3 * uh[i * r + j % r] as f32;
                }
            }
        })
        .unwrap();
    let (before, _) = p.orthogonality().unwrap();
    assert!(before > 0.1, "the perturbation should be visible: {before}");
    p.project_params().unwrap();
    let (after_u, after_v) = p.orthogonality().unwrap();
    assert!(
        after_u <= 1e-5 && after_v <= 1e-5,
        "orthogonality {after_u} {after_v}"
    );

    // Unknown or repeated targets are refused before anything is written.
    let mut g2 = vec![1.0f32; n * l];
    let e = p
        .project(&mut [ProjectionGrads {
            target: 5,
            grad_u_low: Some(TensorMut::new(&mut g2, &[n as i64, l as i64]).unwrap()),
            grad_v_low: None,
        }])
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(g2.iter().all(|&v| v == 1.0));
}

#[test]
fn projection_of_framework_targets() {
    let (n, r, l) = (8usize, 3usize, 2usize);
    let mut rng = Rng::new(41);
    let (u, _) = gram_schmidt(&rng.vec_f64(n * r, 1.0), n, r);
    let uh: Vec<f32> = u.iter().map(|&v| v as f32).collect();
    let mut ul = rng.vec_f32(n * l, 1.0);
    let ctx = Context::cpu().unwrap();
    let mut p = Projector::new(
        &ctx,
        None,
        &ProjectorOptions {
            check_consistency: true,
            ..Default::default()
        },
    )
    .unwrap();
    let idx = p
        .add_target(Target {
            u: Some(PartTarget {
                high: Tensor::new(&uh, &[n as i64, r as i64]).unwrap(),
                low: TensorMut::new(&mut ul, &[n as i64, l as i64]).unwrap(),
                layout: ShardLayout::Replicated,
                shards: vec![],
            }),
            v: None,
        })
        .unwrap();
    p.prepare().unwrap();
    p.invalidate().unwrap();
    let mut g = rng.vec_f32(n * l, 1.0);
    let gd = to_f64(&g);
    let c = matmul(&transpose(&u, n, r), &gd, r, n, l);
    let want: Vec<f64> = gd
        .iter()
        .zip(matmul(&u, &c, n, r, l))
        .map(|(a, b)| a - b)
        .collect();
    p.project(&mut [ProjectionGrads {
        target: idx,
        grad_u_low: Some(TensorMut::new(&mut g, &[n as i64, l as i64]).unwrap()),
        grad_v_low: None,
    }])
    .unwrap();
    assert_close("target grad", &g, &want, 1e-5, 1e-6);
    // An optimizer step on the borrowed U_low, then the parameter projection.
    {
        let (ulv, vlv) = p.trainable_mut(idx).unwrap();
        assert!(vlv.is_none());
        let mut ulv = ulv.unwrap();
        for v in ulv.as_mut_slice::<f32>().unwrap() {
            *v += 0.1;
        }
    }
    let uld = to_f64(
        p.trainable_mut(idx)
            .unwrap()
            .0
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
    );
    let c = matmul(&transpose(&u, n, r), &uld, r, n, l);
    let want: Vec<f64> = uld
        .iter()
        .zip(matmul(&u, &c, n, r, l))
        .map(|(a, b)| a - b)
        .collect();
    p.project_params().unwrap();
    let (ou, _) = p.orthogonality().unwrap();
    assert!(ou <= 1e-5, "orthogonality {ou}");
    drop(p);
    assert_close("projected U_low", &ul, &want, 1e-5, 1e-6);
}

fn replicated<'a>(high: &'a [f32], low: TensorMut<'a>, rows: usize, cols: usize) -> PartTarget<'a> {
    PartTarget {
        high: Tensor::new(high, &[rows as i64, cols as i64]).unwrap(),
        low,
        layout: ShardLayout::Replicated,
        shards: vec![],
    }
}

/// Every arithmetic projects fp32 gradients of a U and a V part as the
/// float64 reference does (fp32 parts take the fp32 update under each), and
/// the info counts what the last call did.
#[test]
fn projection_arithmetics_and_last_call_counters() {
    let (n, k, r, l) = (9usize, 7usize, 3usize, 2usize);
    let mut rng = Rng::new(43);
    let (u, _) = gram_schmidt(&rng.vec_f64(n * r, 1.0), n, r);
    let (vt, _) = gram_schmidt(&rng.vec_f64(k * r, 1.0), k, r); // V_high^T: k x r
    let uh: Vec<f32> = u.iter().map(|&x| x as f32).collect();
    let vh: Vec<f32> = transpose(&vt, k, r).iter().map(|&x| x as f32).collect(); // r x k
    let (u64h, v64h) = (to_f64(&uh), to_f64(&vh));
    let gu0 = rng.vec_f32(n * l, 1.0);
    let gv0 = rng.vec_f32(l * k, 1.0);
    // dU - U_high (U_high^T dU) and dV - (dV V_high^T) V_high
    let (gu, gv) = (to_f64(&gu0), to_f64(&gv0));
    let pu = matmul(
        &u64h,
        &matmul(&transpose(&u64h, n, r), &gu, r, n, l),
        n,
        r,
        l,
    );
    let pv = matmul(
        &matmul(&gv, &transpose(&v64h, r, k), l, k, r),
        &v64h,
        l,
        r,
        k,
    );
    let want_u: Vec<f64> = gu.iter().zip(&pu).map(|(a, b)| a - b).collect();
    let want_v: Vec<f64> = gv.iter().zip(&pv).map(|(a, b)| a - b).collect();
    assert_eq!(ProjectorOptions::default().arithmetic, Arithmetic::Auto);
    let ctx = Context::cpu().unwrap();
    for arithmetic in [
        Arithmetic::Auto,
        Arithmetic::Exact,
        Arithmetic::Fp32,
        Arithmetic::Bf16,
    ] {
        let mut ul = rng.vec_f32(n * l, 1.0);
        let mut vl = rng.vec_f32(l * k, 1.0);
        let mut p = Projector::new(
            &ctx,
            None,
            &ProjectorOptions {
                arithmetic,
                ..Default::default()
            },
        )
        .unwrap();
        let idx = p
            .add_target(Target {
                u: Some(replicated(
                    &uh,
                    TensorMut::new(&mut ul, &[n as i64, l as i64]).unwrap(),
                    n,
                    r,
                )),
                v: Some(replicated(
                    &vh,
                    TensorMut::new(&mut vl, &[l as i64, k as i64]).unwrap(),
                    r,
                    k,
                )),
            })
            .unwrap();
        let before = p.info().unwrap();
        assert_eq!(
            (
                before.last_gemms,
                before.last_gemm_calls,
                before.last_elementwise_calls,
                before.last_collectives,
                before.last_host_waits
            ),
            (0, 0, 0, 0, 0),
            "{arithmetic:?}: {before:?}"
        );
        let (mut g_u, mut g_v) = (gu0.clone(), gv0.clone());
        p.project(&mut [ProjectionGrads {
            target: idx,
            grad_u_low: Some(TensorMut::new(&mut g_u, &[n as i64, l as i64]).unwrap()),
            grad_v_low: Some(TensorMut::new(&mut g_v, &[l as i64, k as i64]).unwrap()),
        }])
        .unwrap();
        assert_close(
            &format!("{arithmetic:?} grad_u_low"),
            &g_u,
            &want_u,
            1e-5,
            1e-6,
        );
        assert_close(
            &format!("{arithmetic:?} grad_v_low"),
            &g_v,
            &want_v,
            1e-5,
            1e-6,
        );
        // two parts, each C and the update: at least 4 GEMMs, no collective
        // (one rank), no wait on the CPU
        let i = p.info().unwrap();
        assert!(i.last_gemms >= 4, "{arithmetic:?}: {i:?}");
        assert!(
            i.last_gemm_calls >= 1 && i.last_gemm_calls <= i.last_gemms,
            "{arithmetic:?}: {i:?}"
        );
        assert_eq!(
            (i.last_collectives, i.last_host_waits),
            (0, 0),
            "{arithmetic:?}: {i:?}"
        );
    }
}

#[test]
fn redecompose_refresh_and_bf16_factors() {
    let (n, k) = (8usize, 6usize);
    let mut rng = Rng::new(33);
    let w = rng.vec_f32(n * k, 1.0);
    let w2 = rng.vec_f32(n * k, 1.0);
    let ctx = Context::cpu().unwrap();
    let layer = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[n as i64, k as i64]).unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        layer.choose_strategy(1, Pass::Backward).unwrap(),
        Strategy::Factorized
    );
    // A new task: re-decompose from another dense weight, in place.
    layer
        .redecompose(Some(&Tensor::new(&w2, &[n as i64, k as i64]).unwrap()))
        .unwrap();
    let mut merged = vec![f32::NAN; n * k];
    layer
        .merge(&mut TensorMut::new(&mut merged, &[n as i64, k as i64]).unwrap())
        .unwrap();
    assert_close("merge after redecompose", &merged, &to_f64(&w2), 1e-5, 2e-6);
    // Scaling the frozen S through the layer (with_factor_mut refreshes the caches).
    layer.set_strategy(Strategy::Dense).unwrap();
    let x = rng.vec_f32(k, 1.0);
    let mut y0 = vec![0.0f32; n];
    layer
        .forward(
            &Tensor::new(&x, &[1, k as i64]).unwrap(),
            None,
            &mut TensorMut::new(&mut y0, &[1, n as i64]).unwrap(),
        )
        .unwrap();
    layer
        .with_factor_mut(Factor::SHigh, |mut s| {
            s.as_mut_slice::<f32>()
                .unwrap()
                .iter_mut()
                .for_each(|v| *v = 0.0)
        })
        .unwrap();
    layer
        .with_factor_mut(Factor::SLow, |mut s| {
            s.as_mut_slice::<f32>()
                .unwrap()
                .iter_mut()
                .for_each(|v| *v = 0.0)
        })
        .unwrap();
    let mut y1 = vec![f32::NAN; n];
    layer
        .forward(
            &Tensor::new(&x, &[1, k as i64]).unwrap(),
            None,
            &mut TensorMut::new(&mut y1, &[1, n as i64]).unwrap(),
        )
        .unwrap();
    assert!(y0.iter().any(|&v| v != 0.0));
    assert!(
        y1.iter().all(|&v| v == 0.0),
        "the dense cache was not refreshed: {y1:?}"
    );
    // bf16 runtime-owned factors from an fp32 weight.
    let lb = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[n as i64, k as i64]).unwrap(),
        &FlinearOptions {
            factor_dtype: Some(DType::Bf16),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        lb.with_factor(Factor::UHigh, |f| f.dtype()).unwrap(),
        Some(DType::Bf16)
    );
    assert!(lb.factor_to_vec::<f32>(Factor::UHigh).is_err());
    let s: Vec<f32> = lb
        .factor_to_vec::<Bf16>(Factor::SHigh)
        .unwrap()
        .iter()
        .map(|b| b.to_f32())
        .collect();
    let mut merged = vec![f32::NAN; n * k];
    lb.merge(&mut TensorMut::new(&mut merged, &[n as i64, k as i64]).unwrap())
        .unwrap();
    assert!(
        s.windows(2).all(|p| p[0] >= p[1]) && s[0] > 0.0,
        "singular values, descending: {s:?}"
    );
    assert_close("bf16 factors merge", &merged, &to_f64(&w), 2e-2, 2e-2);
}
