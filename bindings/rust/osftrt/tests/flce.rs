//! Fused linear cross-entropy against a float64 reference written here.
mod common;
use common::*;
use osftrt::*;

struct Ref {
    loss: f64,
    z_loss: f64,
    token_loss: Vec<f64>,
    argmax: Vec<i64>,
    accuracy: f64,
    grad_x: Vec<f64>,
    grad_w: Vec<f64>,
    grad_b: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    w: &[f64],
    b: &[f64],
    cw: Option<&[f64]>,
    targets: &[i64],
    (m, h, v): (usize, usize, usize),
    o: &FlceOptions,
    grad_loss: f64,
) -> Ref {
    let a = o.label_smoothing;
    let eps = a / v as f64;
    let lam = o.z_loss_scale;
    let s = o.softcap;
    let wts: Vec<f64> = cw.map_or(vec![1.0; v], |c| c.to_vec());
    let wsum: f64 = wts.iter().sum();
    let mut r = Ref {
        loss: 0.0,
        z_loss: 0.0,
        token_loss: vec![0.0; m],
        argmax: vec![0; m],
        accuracy: 0.0,
        grad_x: vec![0.0; m * h],
        grad_w: vec![0.0; v * h],
        grad_b: vec![0.0; v],
    };
    let mut dz_all = vec![0.0; m * v];
    let (mut denom, mut kept, mut hits) = (0.0, 0usize, 0usize);
    for i in 0..m {
        let mut z: Vec<f64> = (0..v)
            .map(|j| (0..h).map(|k| x[i * h + k] * w[j * h + k]).sum::<f64>() + b[j])
            .collect();
        let mut chain = vec![1.0; v];
        if s > 0.0 {
            for j in 0..v {
                let t = (z[j] / s).tanh();
                z[j] = s * t;
                chain[j] = 1.0 - t * t;
            }
        }
        let mut am = 0;
        for j in 1..v {
            if z[j] > z[am] {
                am = j;
            }
        }
        r.argmax[i] = am as i64;
        let y = targets[i];
        if y == o.ignore_index {
            continue;
        }
        let y = y as usize;
        kept += 1;
        hits += (am == y) as usize;
        let zmax = z.iter().cloned().fold(f64::MIN, f64::max);
        let lse = zmax + z.iter().map(|&zj| (zj - zmax).exp()).sum::<f64>().ln();
        let wy = wts[y];
        denom += wy;
        let smooth: f64 = (0..v).map(|j| wts[j] * z[j]).sum();
        let li = (1.0 - a) * wy * (lse - z[y]) + eps * (lse * wsum - smooth) + lam * lse * lse;
        r.token_loss[i] = li;
        r.loss += li;
        r.z_loss += lam * lse * lse;
        for j in 0..v {
            let p = (z[j] - lse).exp();
            let mut d = ((1.0 - a) * wy + eps * wsum + 2.0 * lam * lse) * p - eps * wts[j];
            if j == y {
                d -= (1.0 - a) * wy;
            }
            dz_all[i * v + j] = d * chain[j];
        }
    }
    r.accuracy = if kept > 0 {
        hits as f64 / kept as f64
    } else {
        0.0
    };
    let scale = match o.reduction {
        Reduction::Mean => {
            let s = if denom > 0.0 { 1.0 / denom } else { 0.0 };
            r.loss *= s;
            r.z_loss *= s;
            s
        }
        _ => 1.0,
    } * grad_loss;
    for i in 0..m {
        for j in 0..v {
            let d = dz_all[i * v + j] * scale;
            r.grad_b[j] += d;
            for k in 0..h {
                r.grad_x[i * h + k] += d * w[j * h + k];
                r.grad_w[j * h + k] += d * x[i * h + k];
            }
        }
    }
    r
}

fn run_f32(opts: FlceOptions, seed: u64) {
    let (m, h, v) = (9usize, 12usize, 11usize);
    let mut rng = Rng::new(seed);
    let x = rng.vec_f32(m * h, 1.0);
    let w = rng.vec_f32(v * h, 0.7);
    let b = rng.vec_f32(v, 0.3);
    let cw: Vec<f32> = (0..v).map(|_| 0.5 + rng.val(0.5).abs() as f32).collect();
    let mut targets: Vec<i64> = (0..m).map(|_| rng.below(v as u64) as i64).collect();
    targets[3] = opts.ignore_index;
    let grad_loss = 0.75f32;
    let want = reference(
        &to_f64(&x),
        &to_f64(&w),
        &to_f64(&b),
        Some(&to_f64(&cw)),
        &targets,
        (m, h, v),
        &opts,
        grad_loss as f64,
    );

    let ctx = Context::cpu().unwrap();
    let ce = Flce::new(&ctx, &opts).unwrap();
    let nan = f32::NAN;
    let (mut loss, mut zl, mut acc) = (nan, nan, nan);
    let mut tl = vec![nan; m];
    let mut am = vec![-7i64; m];
    let mut gx = vec![nan; m * h];
    let mut gw = vec![nan; v * h];
    let mut gb = vec![nan; v];
    let inputs = FlceInputs {
        bias: Some(Tensor::vector(&b)),
        class_weight: Some(Tensor::vector(&cw)),
        grad_loss: Some(Tensor::scalar(&grad_loss)),
        ..FlceInputs::new(
            Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
            Tensor::new(&w, &[v as i64, h as i64]).unwrap(),
            Tensor::vector(&targets),
        )
    };
    let mut out = FlceOutputs {
        loss: Some(TensorMut::scalar(&mut loss)),
        z_loss: Some(TensorMut::scalar(&mut zl)),
        accuracy: Some(TensorMut::scalar(&mut acc)),
        token_loss: Some(TensorMut::vector(&mut tl)),
        argmax: Some(TensorMut::vector(&mut am)),
        grad_x: Some(TensorMut::new(&mut gx, &[m as i64, h as i64]).unwrap()),
        grad_weight: Some(TensorMut::new(&mut gw, &[v as i64, h as i64]).unwrap()),
        grad_bias: Some(TensorMut::vector(&mut gb)),
        accumulate: 0,
    };
    let plan = ce.plan(&inputs, &mut out).unwrap();
    assert_eq!(plan.tokens, m as i64);
    assert!(plan.chunks >= 1 && plan.chunk_rows >= 1);
    let ceil = |a: i64, b: i64| (a + b - 1) / b;
    if opts.chunk_rows > 0 {
        assert_eq!(plan.chunks, ceil(m as i64, opts.chunk_rows), "{plan:?}");
    }
    if opts.chunking != Chunking::Auto {
        assert_eq!(plan.chunking, opts.chunking, "{plan:?}");
    }
    match plan.chunking {
        Chunking::Vocab => {
            if opts.slice_cols > 0 {
                assert_eq!(plan.slice_cols, opts.slice_cols, "{plan:?}");
            }
            assert_eq!(plan.slices, ceil(v as i64, plan.slice_cols), "{plan:?}");
        }
        Chunking::Tokens => {
            assert_eq!((plan.slices, plan.slice_cols), (1, v as i64), "{plan:?}")
        }
        Chunking::Auto => panic!("the plan reports Auto: {plan:?}"),
    }
    ce.compute(&inputs, &mut out).unwrap();
    assert_close("loss", &[loss], &[want.loss], 2e-5, 1e-6);
    assert_close("z_loss", &[zl], &[want.z_loss], 2e-5, 1e-7);
    assert_close("accuracy", &[acc], &[want.accuracy], 0.0, 1e-6);
    assert_close("token_loss", &tl, &want.token_loss, 2e-5, 1e-6);
    assert_eq!(am, want.argmax, "argmax");
    assert_close("grad_x", &gx, &want.grad_x, 1e-4, 1e-6);
    assert_close("grad_weight", &gw, &want.grad_w, 1e-4, 1e-6);
    assert_close("grad_bias", &gb, &want.grad_b, 1e-4, 1e-6);

    // Accumulation over two micro-batches doubles the gradients.
    let mut out2 = FlceOutputs {
        grad_weight: Some(TensorMut::new(&mut gw, &[v as i64, h as i64]).unwrap()),
        accumulate: Flce::ACCUMULATE_GRAD_WEIGHT,
        ..Default::default()
    };
    ce.compute(&inputs, &mut out2).unwrap();
    let twice: Vec<f64> = want.grad_w.iter().map(|g| 2.0 * g).collect();
    assert_close("accumulated grad_weight", &gw, &twice, 1e-4, 2e-6);
}

#[test]
fn flce_mean_with_bias_class_weights_and_ignore() {
    run_f32(FlceOptions::default(), 1);
}

/// Label smoothing, z-loss, softcap, a sum, an ignore index that is a
/// class, and several token chunks (of 4, 4 and 1 rows).
fn smoothing_zloss_softcap_sum() -> FlceOptions {
    FlceOptions {
        label_smoothing: 0.1,
        z_loss_scale: 1e-3,
        softcap: 3.0,
        reduction: Reduction::Sum,
        chunk_rows: 4,
        ignore_index: 5,
        ..Default::default()
    }
}

#[test]
fn flce_smoothing_zloss_softcap_sum() {
    run_f32(smoothing_zloss_softcap_sum(), 2);
}

/// The vocabulary plan (tiles of tokens x vocabulary slices) with every
/// option and output, and the token plan forced: the same float64
/// reference. (Library 1.2.)
#[test]
fn flce_vocab_plan_with_every_option() {
    let vocab = |slice_cols, base| FlceOptions {
        chunking: Chunking::Vocab,
        slice_cols,
        ..base
    };
    // 3 slices of 4, 4 and 3 classes, one token tile
    run_f32(vocab(4, FlceOptions::default()), 4);
    // 3 slices of 5, 5 and 1 classes per token tile of 4, 4 and 1 rows
    run_f32(vocab(5, smoothing_zloss_softcap_sum()), 5);
    run_f32(
        FlceOptions {
            chunking: Chunking::Tokens,
            chunk_rows: 2,
            ..Default::default()
        },
        6,
    );
}

#[test]
fn flce_options_round_trip() {
    let ctx = Context::cpu().unwrap();
    let o = FlceOptions {
        label_smoothing: 0.2,
        chunk_rows: 3,
        reduction: Reduction::None,
        chunking: Chunking::Vocab,
        slice_cols: 7,
        ..Default::default()
    };
    let ce = Flce::new(&ctx, &o).unwrap();
    assert_eq!(ce.options().unwrap(), o);
    let d = FlceOptions::default();
    assert_eq!(d.ignore_index, -100);
    assert_eq!((d.chunking, d.slice_cols), (Chunking::Auto, 0));
}

#[test]
fn flce_bf16_forward_and_grad_x() {
    let (m, h, v) = (6usize, 16usize, 9usize);
    let mut rng = Rng::new(3);
    let x: Vec<Bf16> = rng
        .vec_f32(m * h, 1.0)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    let w: Vec<Bf16> = rng
        .vec_f32(v * h, 0.5)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    let targets: Vec<i32> = (0..m).map(|_| rng.below(v as u64) as i32).collect();
    let xf: Vec<f64> = x.iter().map(|b| b.to_f32() as f64).collect();
    let wf: Vec<f64> = w.iter().map(|b| b.to_f32() as f64).collect();
    let t64: Vec<i64> = targets.iter().map(|&t| t as i64).collect();
    let opts = FlceOptions::default();
    let want = reference(&xf, &wf, &vec![0.0; v], None, &t64, (m, h, v), &opts, 1.0);

    let ctx = Context::cpu().unwrap();
    let ce = Flce::new(&ctx, &opts).unwrap();
    let mut loss = f32::NAN;
    let mut gx = vec![Bf16::from_f32(f32::NAN); m * h];
    let mut gw = vec![f32::NAN; v * h]; // fp32 gradient of a bf16 weight
    ce.compute(
        &FlceInputs::new(
            Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
            Tensor::new(&w, &[v as i64, h as i64]).unwrap(),
            Tensor::vector(&targets),
        ),
        &mut FlceOutputs {
            loss: Some(TensorMut::scalar(&mut loss)),
            grad_x: Some(TensorMut::new(&mut gx, &[m as i64, h as i64]).unwrap()),
            grad_weight: Some(TensorMut::new(&mut gw, &[v as i64, h as i64]).unwrap()),
            ..Default::default()
        },
    )
    .unwrap();
    // Inputs are exact in bf16; the logits accumulate in fp32.
    assert_close("bf16 loss", &[loss], &[want.loss], 1e-4, 1e-5);
    let gxf: Vec<f32> = gx.iter().map(|b| b.to_f32()).collect();
    // bf16 output: one rounding (8 bits of mantissa).
    assert_close("bf16 grad_x", &gxf, &want.grad_x, 8e-3, 1e-4);
    assert_close("fp32 grad_weight", &gw, &want.grad_w, 1e-4, 1e-6);
}

#[test]
fn bf16_conversion_rounds_to_nearest_even() {
    assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
    assert_eq!(Bf16::from_f32(1.0).to_f32(), 1.0);
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
    // Just above the tie rounds up.
    assert_eq!(
        Bf16::from_f32(1.0 + 1.0 / 256.0 + 1.0 / 65536.0).to_f32(),
        1.0 + 1.0 / 128.0
    );
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    assert_eq!(Bf16::from_f32(-3.5).to_f32(), -3.5);
}
