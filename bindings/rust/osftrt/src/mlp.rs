//! Tiled MLP (SwiGLU, GeGLU, GELU, SiLU, ReLU) with exact fp32 gradient
//! accumulation over tiles (`osftrt/mlp.h`).
use std::ptr;

use osftrt_sys as sys;

use crate::context::Context;
use crate::error::{check, Result};
use crate::flinear::{FLinear, FactorGrads, RawGrads};
use crate::tensor::{opt_dl_mut, opt_ptr, opt_ptr_mut, DType, Tensor, TensorMut};

/// The MLP's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MlpVariant {
    /// down(silu(gate x) * up x): Llama, Mistral, Qwen.
    SwiGlu,
    /// down(gelu_tanh(gate x) * up x): Gemma.
    GeGluTanh,
    /// down(gelu_erf(gate x) * up x).
    GeGluErf,
    /// down(gelu_tanh(up x)): GPT-2.
    GeluTanh,
    /// down(gelu_erf(up x)): BERT, ViT.
    GeluErf,
    /// down(silu(up x)).
    Silu,
    /// down(relu(up x)): OPT, T5.
    Relu,
}

impl MlpVariant {
    fn raw(self) -> sys::osft_mlp_variant_t {
        match self {
            MlpVariant::SwiGlu => sys::OSFT_MLP_SWIGLU,
            MlpVariant::GeGluTanh => sys::OSFT_MLP_GEGLU_TANH,
            MlpVariant::GeGluErf => sys::OSFT_MLP_GEGLU_ERF,
            MlpVariant::GeluTanh => sys::OSFT_MLP_GELU_TANH,
            MlpVariant::GeluErf => sys::OSFT_MLP_GELU_ERF,
            MlpVariant::Silu => sys::OSFT_MLP_SILU,
            MlpVariant::Relu => sys::OSFT_MLP_RELU,
        }
    }
}

/// How the tile size is chosen for calls with `num_tiles == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tiling {
    /// Tiles of at most H tokens.
    Auto,
    /// Tiles of at most this many tokens.
    Tokens(i64),
    /// The largest tiles whose intermediates fit in this many bytes.
    Budget(usize),
}

/// Options of an MLP; `Default` is the library's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpOptions {
    /// The tiling rule.
    pub tiling: Tiling,
    /// The compute dtype (F32 or Bf16); `None`: the dense weights'.
    pub dtype: Option<DType>,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions {
            tiling: Tiling::Auto,
            dtype: None,
        }
    }
}

/// How calls over a number of tokens are carried out ([`Mlp::plan`],
/// library 1.3.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpPlan {
    /// Tiles of the calls.
    pub num_tiles: i64,
    /// The most tokens in one tile.
    pub tile_tokens: i64,
    /// The backward recomputes each tile's forward (gate and up); `false`:
    /// the forward keeps them for the backward ([`Tiling::Budget`] with a
    /// budget that holds every tile's intermediates).
    pub recompute: bool,
    /// Bytes the forward keeps for the backward (0 where it recomputes).
    pub kept_bytes: usize,
}

/// One projection of an MLP: a dense weight (out x in) or an OSFT layer.
pub enum Projection<'a> {
    /// A dense weight, borrowed for the MLP's life (reach it for an
    /// optimizer step through [`Mlp::weights_mut`]).
    Dense(TensorMut<'a>),
    /// A factorized layer of the same context.
    Layer(&'a FLinear<'a>),
}

/// The projections and biases of an MLP.
pub struct MlpWeights<'a> {
    /// I x H; gated variants only.
    pub gate: Option<Projection<'a>>,
    /// I x H.
    pub up: Projection<'a>,
    /// H x I.
    pub down: Projection<'a>,
    /// I, optional.
    pub gate_bias: Option<TensorMut<'a>>,
    /// I, optional.
    pub up_bias: Option<TensorMut<'a>>,
    /// H, optional.
    pub down_bias: Option<TensorMut<'a>>,
}

/// Gradient outputs of [`Mlp::backward`]; `None` is not computed.
#[derive(Default)]
pub struct MlpGrads<'g> {
    /// (..., H), x's dtype.
    pub grad_x: Option<TensorMut<'g>>,
    /// Dense gate weight's gradient.
    pub grad_gate: Option<TensorMut<'g>>,
    /// Dense up weight's gradient.
    pub grad_up: Option<TensorMut<'g>>,
    /// Dense down weight's gradient.
    pub grad_down: Option<TensorMut<'g>>,
    /// Gate bias gradient.
    pub grad_gate_bias: Option<TensorMut<'g>>,
    /// Up bias gradient.
    pub grad_up_bias: Option<TensorMut<'g>>,
    /// Down bias gradient.
    pub grad_down_bias: Option<TensorMut<'g>>,
    /// Factor gradients of a gate layer.
    pub gate_factors: Option<FactorGrads<'g>>,
    /// Factor gradients of an up layer.
    pub up_factors: Option<FactorGrads<'g>>,
    /// Factor gradients of a down layer.
    pub down_factors: Option<FactorGrads<'g>>,
    /// OR of `Mlp::ACCUMULATE_*`.
    pub accumulate: u32,
}

/// A tiled MLP on a context.
pub struct Mlp<'a> {
    raw: sys::osft_mlp_t,
    weights: MlpWeights<'a>,
    _ctx: std::marker::PhantomData<&'a Context>,
}

fn layer_of<'a>(p: &Option<&Projection<'a>>) -> Option<&'a FLinear<'a>> {
    match p {
        Some(Projection::Layer(l)) => Some(*l),
        _ => None,
    }
}

impl<'a> Mlp<'a> {
    /// Add into `grad_x`.
    pub const ACCUMULATE_GRAD_X: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_X;
    /// Add into `grad_gate`.
    pub const ACCUMULATE_GRAD_GATE: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_GATE;
    /// Add into `grad_up`.
    pub const ACCUMULATE_GRAD_UP: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_UP;
    /// Add into `grad_down`.
    pub const ACCUMULATE_GRAD_DOWN: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_DOWN;
    /// Add into `grad_gate_bias`.
    pub const ACCUMULATE_GRAD_GATE_BIAS: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_GATE_BIAS;
    /// Add into `grad_up_bias`.
    pub const ACCUMULATE_GRAD_UP_BIAS: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_UP_BIAS;
    /// Add into `grad_down_bias`.
    pub const ACCUMULATE_GRAD_DOWN_BIAS: u32 = sys::OSFT_MLP_ACCUMULATE_GRAD_DOWN_BIAS;
    /// Add into every gradient.
    pub const ACCUMULATE_ALL: u32 = sys::OSFT_MLP_ACCUMULATE_ALL;

    /// An MLP of `variant` with hidden size `hidden` and intermediate size
    /// `intermediate` over `weights`, which it borrows for its life.
    pub fn new(
        ctx: &'a Context,
        variant: MlpVariant,
        hidden: i64,
        intermediate: i64,
        weights: MlpWeights<'a>,
        opts: &MlpOptions,
    ) -> Result<Mlp<'a>> {
        let mut w = weights;
        let dense = |p: &mut Option<&mut Projection<'a>>| match p {
            Some(Projection::Dense(t)) => Some(t.dl()),
            _ => None,
        };
        let dg = dense(&mut w.gate.as_mut());
        let du = dense(&mut Some(&mut w.up));
        let dd = dense(&mut Some(&mut w.down));
        let (bg, bu, bd) = (
            opt_dl_mut(w.gate_bias.as_mut()),
            opt_dl_mut(w.up_bias.as_mut()),
            opt_dl_mut(w.down_bias.as_mut()),
        );
        let lr = |l: Option<&FLinear<'_>>| l.map_or(ptr::null_mut(), |l| l.as_raw());
        let raw_w = sys::osft_mlp_weights_t {
            struct_size: std::mem::size_of::<sys::osft_mlp_weights_t>(),
            gate: opt_ptr(&dg),
            up: opt_ptr(&du),
            down: opt_ptr(&dd),
            gate_layer: lr(layer_of(&w.gate.as_ref())),
            up_layer: lr(layer_of(&Some(&w.up))),
            down_layer: lr(layer_of(&Some(&w.down))),
            gate_bias: opt_ptr(&bg),
            up_bias: opt_ptr(&bu),
            down_bias: opt_ptr(&bd),
        };
        // SAFETY: all-zero is a valid options struct; init writes exactly
        // the size it is given.
        let mut o: sys::osft_mlp_options_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check(unsafe { sys::osft_mlp_options_init(&mut o, std::mem::size_of_val(&o)) })?;
        match opts.tiling {
            Tiling::Auto => o.tiling = sys::OSFT_MLP_TILING_AUTO,
            Tiling::Tokens(t) => {
                o.tiling = sys::OSFT_MLP_TILING_TOKENS;
                o.tile_tokens = t;
            }
            Tiling::Budget(b) => {
                o.tiling = sys::OSFT_MLP_TILING_BUDGET;
                o.memory_budget = b;
            }
        }
        if let Some(d) = opts.dtype {
            o.dtype = d.to_dl();
        }
        let mut raw = ptr::null_mut();
        // SAFETY: a live context; the descriptors are copied; the weights'
        // memory and the layers are borrowed for 'a (kept in the Mlp).
        check(unsafe {
            sys::osft_mlp_create(
                ctx.as_raw(),
                variant.raw(),
                hidden,
                intermediate,
                &raw_w,
                &o,
                &mut raw,
            )
        })?;
        Ok(Mlp {
            raw,
            weights: w,
            _ctx: std::marker::PhantomData,
        })
    }

    /// The raw handle (owned by `self`).
    pub fn as_raw(&self) -> sys::osft_mlp_t {
        self.raw
    }

    /// The weights, e.g. for an optimizer step on the dense ones (use
    /// [`TensorMut::as_mut_slice`]). Replacing a tensor here does not
    /// rebind the MLP: it keeps the one it was created with.
    pub fn weights_mut(&mut self) -> &mut MlpWeights<'a> {
        &mut self.weights
    }

    fn check_layers(&self) -> Result<()> {
        for l in [
            layer_of(&self.weights.gate.as_ref()),
            layer_of(&Some(&self.weights.up)),
            layer_of(&Some(&self.weights.down)),
        ]
        .into_iter()
        .flatten()
        {
            l.check_readable()?;
        }
        Ok(())
    }

    /// `(tiles, largest tile)` for a call over `tokens` rows with
    /// `num_tiles == 0`.
    pub fn tile_count(&self, tokens: i64) -> Result<(i64, i64)> {
        let (mut n, mut t) = (0, 0);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::osft_mlp_get_tile_count(self.raw, tokens, &mut n, &mut t) })?;
        Ok((n, t))
    }

    /// How a forward and backward over `tokens` rows with `num_tiles`
    /// tiles (0: the MLP's rule, as [`tile_count`](Self::tile_count)) are
    /// carried out (library 1.3.0).
    pub fn plan(&self, tokens: i64, num_tiles: i64) -> Result<MlpPlan> {
        // SAFETY: all-zero is a valid osft_mlp_plan_t; the library fills it
        // (osft_mlp_plan_init's zeros and struct_size).
        let mut p: sys::osft_mlp_plan_t = unsafe { std::mem::zeroed() };
        p.struct_size = std::mem::size_of_val(&p);
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_mlp_get_plan(self.raw, tokens, num_tiles, &mut p) })?;
        Ok(MlpPlan {
            num_tiles: p.num_tiles,
            tile_tokens: p.tile_tokens,
            recompute: p.recompute != 0,
            kept_bytes: p.kept_bytes,
        })
    }

    /// `y = MLP(x)`; `num_tiles` 0: the MLP's rule.
    pub fn forward(&self, x: &Tensor<'_>, y: &mut TensorMut<'_>, num_tiles: i64) -> Result<()> {
        self.check_layers()?;
        let (xd, mut yd) = (x.dl(), y.dl());
        // SAFETY: a live handle; x read, y borrowed exclusively for the call;
        // the weights are borrowed by the MLP and not lent out.
        check(unsafe { sys::osft_mlp_forward(self.raw, &xd, &mut yd, num_tiles) })
    }

    /// The backward for one forward.
    pub fn backward(
        &self,
        x: &Tensor<'_>,
        grad_y: &Tensor<'_>,
        grads: &mut MlpGrads<'_>,
        num_tiles: i64,
    ) -> Result<()> {
        self.check_layers()?;
        let (xd, gd) = (x.dl(), grad_y.dl());
        let mut d = [
            opt_dl_mut(grads.grad_x.as_mut()),
            opt_dl_mut(grads.grad_gate.as_mut()),
            opt_dl_mut(grads.grad_up.as_mut()),
            opt_dl_mut(grads.grad_down.as_mut()),
            opt_dl_mut(grads.grad_gate_bias.as_mut()),
            opt_dl_mut(grads.grad_up_bias.as_mut()),
            opt_dl_mut(grads.grad_down_bias.as_mut()),
        ];
        let mut fg = [
            grads.gate_factors.as_mut().map(RawGrads::of),
            grads.up_factors.as_mut().map(RawGrads::of),
            grads.down_factors.as_mut().map(RawGrads::of),
        ];
        let fr: Vec<Option<sys::osft_flinear_grads_t>> = fg
            .iter_mut()
            .map(|g| g.as_mut().map(|g| g.build()))
            .collect();
        let fp = |i: usize| fr[i].as_ref().map_or(ptr::null(), |g| g as *const _);
        let [d0, d1, d2, d3, d4, d5, d6] = &mut d;
        let g = sys::osft_mlp_grads_t {
            struct_size: std::mem::size_of::<sys::osft_mlp_grads_t>(),
            grad_x: opt_ptr_mut(d0),
            grad_gate: opt_ptr_mut(d1),
            grad_up: opt_ptr_mut(d2),
            grad_down: opt_ptr_mut(d3),
            grad_gate_bias: opt_ptr_mut(d4),
            grad_up_bias: opt_ptr_mut(d5),
            grad_down_bias: opt_ptr_mut(d6),
            gate_factors: fp(0),
            up_factors: fp(1),
            down_factors: fp(2),
            accumulate: grads.accumulate,
        };
        // SAFETY: a live handle; every gradient is borrowed exclusively by
        // `grads` for the call, the descriptors and structs live until it
        // returns.
        check(unsafe { sys::osft_mlp_backward(self.raw, &xd, &gd, &g, num_tiles) })
    }
}

impl Drop for Mlp<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned; destroyed before the weights and
        // layers it borrows are released.
        let st = unsafe { sys::osft_mlp_destroy(self.raw) };
        debug_assert_eq!(st, sys::OSFT_STATUS_SUCCESS);
    }
}
