//! A 20-step OSFT fine-tuning loop in Rust: an OSFT layer (frozen high
//! singular subspace, trainable low one) under a fused cross-entropy head.
//! Each step: layer forward, loss and dL/dy in one FLCE call, layer
//! backward, gradient projection out of the frozen subspace, an SGD step on
//! the trainable factors in place, and the parameter projection.
//!
//! It checks what a trainer relies on and exits non-zero otherwise: the
//! loss falls, and the trainable factors stay orthogonal to the frozen ones
//! (max |U_high^T U_low|, |V_low V_high^T| <= 1e-5) at every step.
//!
//! Run: `cargo run --offline --example train_osft` in bindings/rust
//! (`cargo test --offline` runs it too).
use osftrt::{
    Context, FLinear, Factor, Flce, FlceInputs, FlceOutputs, FlinearGrads, FlinearOptions,
    ProjectionGrads, Projector, Result, Tensor, TensorMut,
};

/// A small deterministic generator (the example has no dependencies).
fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// SGD on one factor: p -= lr * g, where the factor view may have padded
/// rows (runtime-owned factors live in one U and one V^T matrix).
fn sgd(layer: &FLinear<'_>, which: Factor, grad: &[f32], cols: usize, lr: f32) -> Result<()> {
    layer.with_factor_mut(which, |mut f| {
        let row_stride = f.strides()[0] as usize;
        let data = f.as_mut_slice::<f32>().expect("fp32 factors");
        for (i, g) in grad.iter().enumerate() {
            let (r, c) = (i / cols, i % cols);
            data[r * row_stride + c] -= lr * g;
        }
    })
}

fn main() -> Result<()> {
    let (tokens, d_in, d_model, vocab) = (64usize, 32usize, 24usize, 16usize);
    let (steps, lr) = (20, 0.5f32);
    let mut seed = 2026u64;
    let x: Vec<f32> = (0..tokens * d_in).map(|_| lcg(&mut seed)).collect();
    let w0: Vec<f32> = (0..d_model * d_in).map(|_| lcg(&mut seed) * 0.3).collect();
    let head: Vec<f32> = (0..vocab * d_model).map(|_| lcg(&mut seed) * 0.5).collect();
    let targets: Vec<i64> = (0..tokens)
        .map(|i| ((i * 7 + i / 3) % vocab) as i64)
        .collect();

    let ctx = Context::cpu()?;
    println!(
        "libosftrt {} ({})",
        osftrt::version_string(),
        osftrt::build_info()
    );
    let layer = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w0, &[d_model as i64, d_in as i64])?,
        &FlinearOptions {
            rank_ratio: 0.5,
            ..Default::default()
        },
    )?;
    let dims = layer.dims()?;
    let (n, k, l) = (
        dims.out_features as usize,
        dims.in_features as usize,
        dims.trainable_rank as usize,
    );
    let ce = Flce::new(&ctx, &Default::default())?;
    let mut projector = Projector::new(&ctx, None, &Default::default())?;
    let target = projector.add_layer(&layer)?;

    let xt = Tensor::new(&x, &[tokens as i64, k as i64])?;
    let (mut y, mut gy) = (vec![0.0f32; tokens * n], vec![0.0f32; tokens * n]);
    let (mut gu, mut gs, mut gv) = (vec![0.0f32; n * l], vec![0.0f32; l], vec![0.0f32; l * k]);
    let mut losses = Vec::new();
    for step in 0..steps {
        layer.forward(
            &xt,
            None,
            &mut TensorMut::new(&mut y, &[tokens as i64, n as i64])?,
        )?;
        let mut loss = 0.0f32;
        ce.compute(
            &FlceInputs::new(
                Tensor::new(&y, &[tokens as i64, n as i64])?,
                Tensor::new(&head, &[vocab as i64, n as i64])?,
                Tensor::vector(&targets),
            ),
            &mut FlceOutputs {
                loss: Some(TensorMut::scalar(&mut loss)),
                grad_x: Some(TensorMut::new(&mut gy, &[tokens as i64, n as i64])?),
                ..Default::default()
            },
        )?;
        layer.backward(
            &xt,
            &Tensor::new(&gy, &[tokens as i64, n as i64])?,
            &mut FlinearGrads {
                grad_u_low: Some(TensorMut::new(&mut gu, &[n as i64, l as i64])?),
                grad_s_low: Some(TensorMut::vector(&mut gs)),
                grad_v_low: Some(TensorMut::new(&mut gv, &[l as i64, k as i64])?),
                ..Default::default()
            },
        )?;
        projector.project(&mut [ProjectionGrads {
            target,
            grad_u_low: Some(TensorMut::new(&mut gu, &[n as i64, l as i64])?),
            grad_v_low: Some(TensorMut::new(&mut gv, &[l as i64, k as i64])?),
        }])?;
        sgd(&layer, Factor::ULow, &gu, l, lr)?;
        sgd(&layer, Factor::SLow, &gs, l, lr)?;
        sgd(&layer, Factor::VLow, &gv, k, lr)?;
        projector.project_params()?;
        let (ou, ov) = projector.orthogonality()?;
        println!("step {step:2}: loss {loss:.5}  orthogonality U {ou:.2e} V {ov:.2e}");
        if ou > 1e-5 || ov > 1e-5 {
            eprintln!("FAIL: orthogonality {ou:.3e} / {ov:.3e} above 1e-5 at step {step}");
            std::process::exit(1);
        }
        losses.push(loss);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    let fell = last < 0.9 * first && losses.iter().all(|l| l.is_finite());
    if !fell {
        eprintln!("FAIL: the loss did not fall by 10%: {first} -> {last}");
        std::process::exit(1);
    }
    println!("OK: loss {first:.5} -> {last:.5} in {steps} steps");
    Ok(())
}
