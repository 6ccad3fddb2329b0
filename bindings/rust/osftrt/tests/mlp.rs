//! Tiled MLP against an untiled float64 computation written here.
mod common;
use common::*;
use osftrt::*;

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}
fn dsilu(z: f64) -> f64 {
    let s = 1.0 / (1.0 + (-z).exp());
    s * (1.0 + z * (1.0 - s))
}

struct Grads {
    y: Vec<f64>,
    dx: Vec<f64>,
    dgate: Vec<f64>,
    dup: Vec<f64>,
    ddown: Vec<f64>,
    ddown_b: Vec<f64>,
}

/// SwiGLU over all M tokens at once: y = down(silu(gate x) * up x) + b_down.
#[allow(clippy::too_many_arguments)]
fn swiglu_ref(
    x: &[f64],
    g: &[f64],
    u: &[f64],
    d: &[f64],
    bd: &[f64],
    gy: &[f64],
    m: usize,
    h: usize,
    i_: usize,
) -> Grads {
    let zg = matmul(x, &transpose(g, i_, h), m, h, i_);
    let zu = matmul(x, &transpose(u, i_, h), m, h, i_);
    let a: Vec<f64> = (0..m * i_).map(|t| silu(zg[t]) * zu[t]).collect();
    let mut y = matmul(&a, &transpose(d, h, i_), m, i_, h);
    for (t, v) in y.iter_mut().enumerate() {
        *v += bd[t % h];
    }
    let da = matmul(gy, d, m, h, i_);
    let ddown = matmul(&transpose(gy, m, h), &a, h, m, i_);
    let ddown_b = (0..h)
        .map(|j| (0..m).map(|t| gy[t * h + j]).sum())
        .collect();
    let dzg: Vec<f64> = (0..m * i_).map(|t| da[t] * zu[t] * dsilu(zg[t])).collect();
    let dzu: Vec<f64> = (0..m * i_).map(|t| da[t] * silu(zg[t])).collect();
    let dgate = matmul(&transpose(&dzg, m, i_), x, i_, m, h);
    let dup = matmul(&transpose(&dzu, m, i_), x, i_, m, h);
    let dx: Vec<f64> = matmul(&dzg, g, m, i_, h)
        .iter()
        .zip(matmul(&dzu, u, m, i_, h))
        .map(|(p, q)| p + q)
        .collect();
    Grads {
        y,
        dx,
        dgate,
        dup,
        ddown,
        ddown_b,
    }
}

#[test]
fn tiled_swiglu_matches_untiled_reference() {
    let (b, s, h, i_) = (2usize, 5usize, 8usize, 12usize);
    let m = b * s;
    let mut rng = Rng::new(51);
    let x = rng.vec_f32(m * h, 1.0);
    let mut gate = rng.vec_f32(i_ * h, 0.4);
    let mut up = rng.vec_f32(i_ * h, 0.4);
    let mut down = rng.vec_f32(h * i_, 0.4);
    let mut down_b = rng.vec_f32(h, 0.2);
    let gy = rng.vec_f32(m * h, 1.0);
    let want = swiglu_ref(
        &to_f64(&x),
        &to_f64(&gate),
        &to_f64(&up),
        &to_f64(&down),
        &to_f64(&down_b),
        &to_f64(&gy),
        m,
        h,
        i_,
    );

    let ctx = Context::cpu().unwrap();
    let mlp = Mlp::new(
        &ctx,
        MlpVariant::SwiGlu,
        h as i64,
        i_ as i64,
        MlpWeights {
            gate: Some(Projection::Dense(
                TensorMut::new(&mut gate, &[i_ as i64, h as i64]).unwrap(),
            )),
            up: Projection::Dense(TensorMut::new(&mut up, &[i_ as i64, h as i64]).unwrap()),
            down: Projection::Dense(TensorMut::new(&mut down, &[h as i64, i_ as i64]).unwrap()),
            gate_bias: None,
            up_bias: None,
            down_bias: Some(TensorMut::vector(&mut down_b)),
        },
        &MlpOptions {
            tiling: Tiling::Tokens(4),
            dtype: None,
        },
    )
    .unwrap();
    assert_eq!(mlp.tile_count(m as i64).unwrap(), (3, 4));
    let shape = [b as i64, s as i64, h as i64]; // leading dims flattened into tokens
    for tiles in [0i64, 1, 3, 7] {
        let mut y = vec![f32::NAN; m * h];
        mlp.forward(
            &Tensor::new(&x, &shape).unwrap(),
            &mut TensorMut::new(&mut y, &shape).unwrap(),
            tiles,
        )
        .unwrap();
        assert_close(&format!("y ({tiles} tiles)"), &y, &want.y, 1e-5, 1e-6);
        let (mut dx, mut dg, mut du, mut dd, mut db) = (
            vec![f32::NAN; m * h],
            vec![f32::NAN; i_ * h],
            vec![f32::NAN; i_ * h],
            vec![f32::NAN; h * i_],
            vec![f32::NAN; h],
        );
        mlp.backward(
            &Tensor::new(&x, &shape).unwrap(),
            &Tensor::new(&gy, &shape).unwrap(),
            &mut MlpGrads {
                grad_x: Some(TensorMut::new(&mut dx, &shape).unwrap()),
                grad_gate: Some(TensorMut::new(&mut dg, &[i_ as i64, h as i64]).unwrap()),
                grad_up: Some(TensorMut::new(&mut du, &[i_ as i64, h as i64]).unwrap()),
                grad_down: Some(TensorMut::new(&mut dd, &[h as i64, i_ as i64]).unwrap()),
                grad_down_bias: Some(TensorMut::vector(&mut db)),
                ..Default::default()
            },
            tiles,
        )
        .unwrap();
        assert_close(
            &format!("grad_x ({tiles} tiles)"),
            &dx,
            &want.dx,
            1e-4,
            1e-6,
        );
        assert_close(
            &format!("grad_gate ({tiles} tiles)"),
            &dg,
            &want.dgate,
            1e-4,
            1e-6,
        );
        assert_close(
            &format!("grad_up ({tiles} tiles)"),
            &du,
            &want.dup,
            1e-4,
            1e-6,
        );
        assert_close(
            &format!("grad_down ({tiles} tiles)"),
            &dd,
            &want.ddown,
            1e-4,
            1e-6,
        );
        assert_close(
            &format!("grad_down_bias ({tiles} tiles)"),
            &db,
            &want.ddown_b,
            1e-5,
            1e-6,
        );
    }
}

#[test]
fn mlp_with_an_osft_projection_and_a_weight_update() {
    let (m, h, i_) = (6usize, 6usize, 10usize);
    let mut rng = Rng::new(61);
    let x = rng.vec_f32(m * h, 1.0);
    let mut up = rng.vec_f32(i_ * h, 0.5);
    let down_w = rng.vec_f32(h * i_, 0.5);
    let ctx = Context::cpu().unwrap();
    // down is an OSFT layer; compare with its merged weight.
    let down = FLinear::from_weight(
        &ctx,
        &Tensor::new(&down_w, &[h as i64, i_ as i64]).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let mut merged = vec![0.0f32; h * i_];
    down.merge(&mut TensorMut::new(&mut merged, &[h as i64, i_ as i64]).unwrap())
        .unwrap();
    let mut mlp = Mlp::new(
        &ctx,
        MlpVariant::Relu,
        h as i64,
        i_ as i64,
        MlpWeights {
            gate: None,
            up: Projection::Dense(TensorMut::new(&mut up, &[i_ as i64, h as i64]).unwrap()),
            down: Projection::Layer(&down),
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        },
        &MlpOptions {
            tiling: Tiling::Budget(1 << 12),
            dtype: Some(DType::F32),
        },
    )
    .unwrap();
    let reference = |up: &[f32]| {
        let z = matmul(&to_f64(&x), &transpose(&to_f64(up), i_, h), m, h, i_);
        let a: Vec<f64> = z.iter().map(|&v| v.max(0.0)).collect();
        matmul(&a, &transpose(&to_f64(&merged), h, i_), m, i_, h)
    };
    let mut up_copy = {
        let w = mlp.weights_mut();
        match &w.up {
            Projection::Dense(t) => t.as_slice::<f32>().unwrap().to_vec(),
            Projection::Layer(_) => unreachable!(),
        }
    };
    let mut y = vec![f32::NAN; m * h];
    mlp.forward(
        &Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
        &mut TensorMut::new(&mut y, &[m as i64, h as i64]).unwrap(),
        0,
    )
    .unwrap();
    assert_close(
        "relu mlp with OSFT down",
        &y,
        &reference(&up_copy),
        1e-5,
        1e-5,
    );
    // An optimizer step on the borrowed dense weight, seen by the next call.
    if let Projection::Dense(t) = &mut mlp.weights_mut().up {
        for v in t.as_mut_slice::<f32>().unwrap() {
            *v *= -1.5;
        }
    }
    for v in up_copy.iter_mut() {
        *v *= -1.5;
    }
    mlp.forward(
        &Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
        &mut TensorMut::new(&mut y, &[m as i64, h as i64]).unwrap(),
        0,
    )
    .unwrap();
    assert_close(
        "after the weight update",
        &y,
        &reference(&up_copy),
        1e-5,
        1e-5,
    );
    // Factor gradients of the OSFT projection are produced.
    let l = down.dims().unwrap().trainable_rank as usize;
    let mut gs = vec![f32::NAN; l];
    let gy = rng.vec_f32(m * h, 1.0);
    mlp.backward(
        &Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
        &Tensor::new(&gy, &[m as i64, h as i64]).unwrap(),
        &mut MlpGrads {
            down_factors: Some(FactorGrads {
                grad_s_low: Some(TensorMut::vector(&mut gs)),
                ..Default::default()
            }),
            ..Default::default()
        },
        2,
    )
    .unwrap();
    assert!(gs.iter().all(|g| g.is_finite()));
    drop(mlp);
}
