//! The 1.3.0 queries: a layer's counters (`FLinear::info`,
//! `FLinear::mark_updated`, the hybrid strategy) and an MLP's plan
//! (`Mlp::plan`), with every forward checked against float64.
mod common;
use common::*;
use osftrt::*;

#[test]
fn flinear_info_counts_rebuilds_and_reports() {
    let (m, n, k) = (6usize, 10usize, 14usize);
    let mut rng = Rng::new(131);
    let w = rng.vec_f32(n * k, 1.0);
    let x = rng.vec_f32(m * k, 1.0);
    let want = matmul(&to_f64(&x), &transpose(&to_f64(&w), n, k), m, k, n);
    assert_eq!(
        FlinearOptions::default().trainable_updates,
        Updates::Detected
    );
    let ctx = Context::cpu().unwrap();
    let layer = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[n as i64, k as i64]).unwrap(),
        &FlinearOptions {
            strategy: Strategy::Dense,
            trainable_updates: Updates::Reported,
            ..Default::default()
        },
    )
    .unwrap();
    let forward = |what: &str| {
        let mut y = vec![f32::NAN; m * n];
        layer
            .forward(
                &Tensor::new(&x, &[m as i64, k as i64]).unwrap(),
                None,
                &mut TensorMut::new(&mut y, &[m as i64, n as i64]).unwrap(),
            )
            .unwrap();
        assert_close(what, &y, &want, 1e-4, 1e-5);
        y
    };
    let zero = FlinearInfo {
        rebuilds: 0,
        frozen_builds: 0,
        trainable_version: 0,
        weight_kept: false,
    };
    assert_eq!(layer.info().unwrap(), zero, "a new layer");
    let y_dense = forward("dense forward");
    let i1 = layer.info().unwrap();
    assert_eq!(
        i1,
        FlinearInfo {
            rebuilds: 1,
            frozen_builds: 1,
            weight_kept: true,
            ..zero
        },
        "after one dense forward"
    );
    forward("dense forward on the kept W");
    assert_eq!(layer.info().unwrap(), i1, "unchanged factors: no rebuild");
    layer.mark_updated().unwrap();
    let i2 = layer.info().unwrap();
    assert_eq!(i2.trainable_version, i1.trainable_version + 1, "{i2:?}");
    forward("dense forward after mark_updated");
    let i3 = layer.info().unwrap();
    assert_eq!(i3.rebuilds, i1.rebuilds + 1, "{i3:?}");
    // a view of a trainable factor counts as a report too
    layer
        .with_factor(Factor::SLow, |v| assert!(!v.shape().is_empty()))
        .unwrap();
    assert_eq!(
        layer.info().unwrap().trainable_version,
        i3.trainable_version + 1
    );
    // hybrid: the dense forward
    layer.set_strategy(Strategy::Hybrid).unwrap();
    assert_eq!(
        layer.choose_strategy(m as i64, Pass::Backward).unwrap(),
        Strategy::Hybrid
    );
    let y_hybrid = forward("hybrid forward");
    assert_close("hybrid vs dense", &y_hybrid, &to_f64(&y_dense), 1e-6, 1e-7);
}

#[test]
fn mlp_plan_reports_tiling_and_recompute() {
    let (m, h, i_) = (29usize, 16usize, 24usize);
    let mut rng = Rng::new(137);
    let (mut gate, mut up, mut down) = (
        rng.vec_f32(i_ * h, 0.3),
        rng.vec_f32(i_ * h, 0.3),
        rng.vec_f32(h * i_, 0.3),
    );
    let ctx = Context::cpu().unwrap();
    let kept = m * i_ * 4 * 2; // the gate and up outputs, f32
    for (tiling, keeps) in [
        (Tiling::Tokens(8), false),
        (Tiling::Budget(1 << 26), true),
        (Tiling::Budget(kept / 4), false),
    ] {
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
                down_bias: None,
            },
            &MlpOptions {
                tiling,
                dtype: None,
            },
        )
        .unwrap();
        let p = mlp.plan(m as i64, 0).unwrap();
        let (tiles, tile_tokens) = mlp.tile_count(m as i64).unwrap();
        assert_eq!(
            (p.num_tiles, p.tile_tokens),
            (tiles, tile_tokens),
            "{tiling:?}: {p:?}"
        );
        assert!(
            p.num_tiles >= 1 && p.num_tiles * p.tile_tokens >= m as i64,
            "{p:?}"
        );
        assert_eq!(p.recompute, !keeps, "{tiling:?}: {p:?}");
        assert_eq!(
            p.kept_bytes,
            if keeps { kept } else { 0 },
            "{tiling:?}: {p:?}"
        );
        if let Tiling::Tokens(t) = tiling {
            assert_eq!((p.num_tiles, p.tile_tokens), (4, t), "{p:?}");
        }
        let p3 = mlp.plan(m as i64, 3).unwrap();
        assert_eq!(
            (p3.num_tiles, p3.tile_tokens),
            (3, 10),
            "forced 3 tiles: {p3:?}"
        );
        for (tokens, tiles) in [(-1, 0), (m as i64, -1)] {
            let e = mlp.plan(tokens, tiles).unwrap_err();
            assert_eq!(
                e.status(),
                Status::InvalidArgument,
                "plan({tokens}, {tiles}): {e}"
            );
        }
    }
}
