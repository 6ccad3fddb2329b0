//! Safe Rust API for **libosftrt**, the OSFT fine-tuning runtime: the
//! factorized (OSFT) linear layer, gradient projection with batched
//! collectives, tiled MLPs, fused linear cross-entropy and batched QR,
//! behind one stable C ABI (raw bindings: the `osftrt-sys` crate).
//!
//! * Every fallible call returns [`Result<T>`] with an [`Error`] carrying a
//!   [`Status`] and the library's message naming the argument and the
//!   reason. On failure nothing the caller passed is modified.
//! * Handles ([`Context`], [`FLinear`], [`Comm`], [`Projector`], [`Mlp`],
//!   [`Flce`]) are destroyed when dropped. Every handle borrows its
//!   context, and everything the library reads after the call that
//!   registered it (caller-owned factors, MLP weights, projector targets)
//!   stays borrowed as long as the handle lives, so a dangling buffer is a
//!   compile error, not a crash.
//! * Tensors are borrowed slices with shapes: [`Tensor`] for inputs
//!   (`&[T]`), [`TensorMut`] for outputs (`&mut [T]`); bfloat16 is [`Bf16`].
//! * Threads: a [`Context`] is [`Send`] but not [`Sync`] (the C API lets one
//!   thread at a time use a context); the handles that borrow it stay on
//!   its thread.
//!
//! The fused cross-entropy of 4 tokens over 8 classes, with the gradient of
//! the hidden states:
//!
//! ```
//! use osftrt::{Context, Flce, FlceInputs, FlceOptions, FlceOutputs, Tensor, TensorMut};
//! let ctx = Context::cpu()?;
//! let ce = Flce::new(&ctx, &FlceOptions::default())?;        // mean reduction
//! let (m, h, v) = (4, 16, 8);
//! let x: Vec<f32> = (0..m * h).map(|i| (i as f32 * 0.37).sin()).collect();
//! let w: Vec<f32> = (0..v * h).map(|i| (i as f32 * 0.11).cos()).collect();
//! let targets = [1i64, 7, 0, 3];
//! let (mut loss, mut grad_x) = (0.0f32, vec![0.0f32; m * h]);
//! ce.compute(
//!     &FlceInputs::new(Tensor::new(&x, &[4, 16])?, Tensor::new(&w, &[8, 16])?,
//!                      Tensor::vector(&targets)),
//!     &mut FlceOutputs { loss: Some(TensorMut::scalar(&mut loss)),
//!                        grad_x: Some(TensorMut::new(&mut grad_x, &[4, 16])?),
//!                        ..Default::default() },
//! )?;
//! assert!(loss > 0.0 && grad_x.iter().any(|&g| g != 0.0));
//! # Ok::<(), osftrt::Error>(())
//! ```
//!
//! The same call as in the repository's README, with label smoothing and a
//! check for a bad label (nothing is written then):
//!
//! ```
//! # let (m, h, v) = (3i64, 8i64, 5i64);
//! # let x: Vec<f32> = (0..m * h).map(|i| (i as f32 * 0.3).sin()).collect();
//! # let w: Vec<f32> = (0..v * h).map(|i| (i as f32 * 0.7).cos()).collect();
//! # let y = [4i64, 0, 2];
//! use osftrt::{Context, Flce, FlceInputs, FlceOptions, FlceOutputs, Status, Tensor, TensorMut};
//! let ctx = Context::cpu()?;
//! let ce = Flce::new(&ctx, &FlceOptions { label_smoothing: 0.1, ..Default::default() })?;
//! let (mut loss, mut gx) = (0.0f32, vec![0.0f32; x.len()]);   // m, h, v: i64
//! let r = ce.compute(
//!     &FlceInputs::new(Tensor::new(&x, &[m, h])?, Tensor::new(&w, &[v, h])?, Tensor::vector(&y)),
//!     &mut FlceOutputs { loss: Some(TensorMut::scalar(&mut loss)),
//!                        grad_x: Some(TensorMut::new(&mut gx, &[m, h])?), ..Default::default() });
//! if let Err(e) = &r { if e.status() == Status::IndexOutOfRange { /* bad label; nothing written */ } }
//! # r?;
//! # assert!(loss > 0.0);
//! # Ok::<(), osftrt::Error>(())
//! ```
//!
//! A layer cannot outlive the factor buffers it reads:
//!
//! ```compile_fail,E0597
//! use osftrt::{Context, FLinear, Factors, TensorMut};
//! let ctx = Context::cpu().unwrap();
//! let layer = {
//!     let mut buf = vec![0.5f32; 64];
//!     let (uh, rest) = buf.split_at_mut(8);
//!     let (sh, rest) = rest.split_at_mut(2);
//!     let (vh, rest) = rest.split_at_mut(8);
//!     let (ul, rest) = rest.split_at_mut(8);
//!     let (sl, rest) = rest.split_at_mut(2);
//!     let vl = &mut rest[..8];
//!     FLinear::from_factors(&ctx, Factors {
//!         u_high: TensorMut::new(uh, &[4, 2]).unwrap(), s_high: TensorMut::vector(sh),
//!         v_high: TensorMut::new(vh, &[2, 4]).unwrap(), u_low: TensorMut::new(ul, &[4, 2]).unwrap(),
//!         s_low: TensorMut::vector(sl), v_low: TensorMut::new(vl, &[2, 4]).unwrap(),
//!     }, &Default::default()).unwrap()
//! }; // error: `buf` does not live long enough
//! drop(layer);
//! ```
//!
//! and no handle can outlive its context:
//!
//! ```compile_fail,E0597
//! let ce = {
//!     let ctx = osftrt::Context::cpu().unwrap();
//!     osftrt::Flce::new(&ctx, &Default::default()).unwrap()
//! }; // error: `ctx` does not live long enough
//! drop(ce);
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod comm;
mod context;
mod error;
mod flce;
mod flinear;
mod mlp;
mod projection;
mod qr;
mod tensor;
mod version;

pub use comm::{
    Comm, CommBuf, CommCallbacks, CommInfo, CommOptions, CommSlice, CommStats, Engine, NcclUniqueId,
};
pub use context::{
    device_count, num_threads, set_num_threads, Context, ContextOptions, DeviceType, HostAllocator,
    MemoryStats,
};
pub use error::{clear_last_error, last_error_message, Error, Result, Status};
pub use flce::{
    Accumulator, Chunking, Flce, FlceInputs, FlceOptions, FlceOutputs, FlcePlan, Reduction,
};
pub use flinear::{
    FLinear, Factor, FactorGrads, FactorMut, FactorRef, Factors, FlinearDims, FlinearGrads,
    FlinearInfo, FlinearOptions, Pass, Strategy, Updates,
};
pub use mlp::{Mlp, MlpGrads, MlpOptions, MlpPlan, MlpVariant, MlpWeights, Projection, Tiling};
pub use projection::{
    Arithmetic, PartTarget, ProjectionGrads, Projector, ProjectorInfo, ProjectorOptions,
    ShardLayout, Target,
};
pub use qr::{QrMethod, QrOptions, QrReport, RankDeficient};
pub use tensor::{Bf16, DType, Device, Element, Tensor, TensorMut, MAX_DIMS};
pub use version::{
    build_info, check_library_version, has_feature, set_log_callback, version, version_string,
    Feature, LogLevel, HEADER_VERSION,
};

/// The raw FFI (`osftrt-sys`), for what the safe API does not cover.
pub use osftrt_sys as sys;
