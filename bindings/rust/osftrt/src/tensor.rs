//! Tensors: borrowed slices with a shape (and optional strides), handed to
//! the library as DLPack `DLTensor`s for the duration of one call.
//!
//! [`Tensor`] borrows a `&[T]` (an input), [`TensorMut`] a `&mut [T]` (an
//! output). The borrow checker then guarantees what the C API checks at run
//! time: an output cannot overlap an input or another output, and no buffer
//! is freed while the library may read it. Shapes and strides are in
//! elements; no strides means compact row-major. The constructors check
//! that the slice holds every element the shape and strides reach.
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::error::{Error, Result, Status};

/// The most dimensions a tensor of these bindings may have.
pub const MAX_DIMS: usize = 6;

/// `len` of a tensor made by `from_raw`: its extent is the caller's
/// promise, not a slice, so it has no slice view.
const RAW: usize = usize::MAX;

/// Element types the library accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// bfloat16, stored as [`Bf16`].
    Bf16,
    /// 32-bit signed integer (class targets, argmax).
    I32,
    /// 64-bit signed integer (class targets, argmax).
    I64,
}

impl DType {
    pub(crate) fn to_dl(self) -> sys::DLDataType {
        let (code, bits) = match self {
            DType::F32 => (sys::kDLFloat, 32),
            DType::F64 => (sys::kDLFloat, 64),
            DType::Bf16 => (sys::kDLBfloat, 16),
            DType::I32 => (sys::kDLInt, 32),
            DType::I64 => (sys::kDLInt, 64),
        };
        sys::DLDataType {
            code: code as u8,
            bits,
            lanes: 1,
        }
    }

    pub(crate) fn from_dl(t: sys::DLDataType) -> Option<DType> {
        if t.lanes != 1 {
            return None;
        }
        match (t.code as sys::DLDataTypeCode, t.bits) {
            (sys::kDLFloat, 32) => Some(DType::F32),
            (sys::kDLFloat, 64) => Some(DType::F64),
            (sys::kDLBfloat, 16) => Some(DType::Bf16),
            (sys::kDLInt, 32) => Some(DType::I32),
            (sys::kDLInt, 64) => Some(DType::I64),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }
}

/// A bfloat16 value: the upper 16 bits of an `f32`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds to the nearest bfloat16 (ties to even); NaN stays NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16(((b >> 16) as u16) | 0x40);
        }
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is one of the library's element types.
///
/// Implemented for `f32`, `f64`, [`Bf16`], `i32` and `i64` only (sealed).
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The library's dtype of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
        }
    };
}
element!(f32, DType::F32);
element!(f64, DType::F64);
element!(Bf16, DType::Bf16);
element!(i32, DType::I32);
element!(i64, DType::I64);

/// Where a tensor's memory lives. Slices are always [`Device::Cpu`]; device
/// memory comes in through the `unsafe` raw constructors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// Memory of CUDA device `n`.
    Cuda(i32),
}

#[derive(Clone, Copy)]
struct Layout {
    ndim: usize,
    shape: [i64; MAX_DIMS],
    strides: [i64; MAX_DIMS],
    strided: bool,
    dtype: DType,
    device: Device,
}

impl Layout {
    /// Checks the shape and strides against a buffer of `len` elements.
    /// (The per-call cost of the bindings is mostly this: it is kept to
    /// integer checks, with the error messages built out of line.)
    #[inline]
    fn new(dtype: DType, len: usize, shape: &[i64], strides: Option<&[i64]>) -> Result<Layout> {
        let ndim = shape.len();
        if ndim > MAX_DIMS {
            return Err(layout_error(Status::ShapeMismatch, shape, strides, len));
        }
        let mut l = Layout {
            ndim,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            strided: strides.is_some(),
            dtype,
            device: Device::Cpu,
        };
        l.shape[..ndim].copy_from_slice(shape);
        // Elements the shape (and strides) reach; None: negative or overflow.
        let mut needed: Option<u64> = Some(1);
        let mut empty = false;
        for &d in shape {
            empty |= d == 0;
            needed = needed.and_then(|n| u64::try_from(d).ok().and_then(|d| n.checked_mul(d)));
        }
        if let Some(s) = strides {
            if s.len() != ndim || s.iter().any(|&x| x < 0) {
                return Err(layout_error(Status::BadLayout, shape, strides, len));
            }
            l.strides[..ndim].copy_from_slice(s);
            // 1 + sum (d - 1) * stride: the last element reached, plus one.
            let mut last: Option<u64> = Some(0);
            for (&d, &x) in shape.iter().zip(s) {
                last = last.and_then(|t| {
                    let step = u64::try_from(d.max(1) - 1).ok()?.checked_mul(x as u64)?;
                    t.checked_add(step)
                });
            }
            needed = needed.and(last.and_then(|t| t.checked_add(1)));
        }
        match needed {
            _ if empty && shape.iter().all(|&d| d >= 0) => Ok(l),
            Some(n) if n <= len as u64 => Ok(l),
            _ => Err(layout_error(Status::ShapeMismatch, shape, strides, len)),
        }
    }

    #[inline]
    fn dl(&self, data: *mut c_void) -> sys::DLTensor {
        let (device_type, device_id) = match self.device {
            Device::Cpu => (sys::kDLCPU, 0),
            Device::Cuda(n) => (sys::kDLCUDA, n),
        };
        sys::DLTensor {
            data,
            device: sys::DLDevice {
                device_type,
                device_id,
            },
            ndim: self.ndim as i32,
            dtype: self.dtype.to_dl(),
            // The library only reads the shape and strides arrays, for the
            // duration of the call; they live in the tensor that `&self`
            // borrows.
            shape: self.shape.as_ptr() as *mut i64,
            strides: if self.strided {
                self.strides.as_ptr() as *mut i64
            } else {
                ptr::null_mut()
            },
            byte_offset: 0,
        }
    }
}

/// The error of a shape/strides/slice mismatch, built out of line.
#[cold]
#[inline(never)]
fn layout_error(status: Status, shape: &[i64], strides: Option<&[i64]>, len: usize) -> Error {
    let with = strides
        .map(|s| format!(" with strides {s:?}"))
        .unwrap_or_default();
    let msg = if shape.len() > MAX_DIMS {
        format!(
            "tensor: {} dimensions, at most {MAX_DIMS} supported",
            shape.len()
        )
    } else if let Some(d) = shape.iter().find(|&&d| d < 0) {
        format!("tensor: negative dimension {d} in shape {shape:?}")
    } else if strides.map_or(false, |s| s.len() != shape.len()) {
        format!(
            "tensor: {} strides for {} dimensions",
            strides.map_or(0, |s| s.len()),
            shape.len()
        )
    } else if let Some(x) = strides.and_then(|s| s.iter().find(|&&x| x < 0)) {
        format!("tensor: negative stride {x}")
    } else {
        // Dimensions and strides are non-negative here; saturate on overflow.
        let (mut n, mut last) = (1i128, 0i128);
        for (i, &d) in shape.iter().enumerate() {
            n = n.saturating_mul(d as i128);
            let step = (d as i128 - 1)
                .max(0)
                .saturating_mul(strides.map_or(0, |s| s[i]) as i128);
            last = last.saturating_add(step);
        }
        let needed = if strides.is_some() {
            last.saturating_add(1)
        } else {
            n
        };
        format!("tensor: shape {shape:?}{with} needs {needed} elements, the slice has {len}")
    };
    // A negative dimension is a shape error; everything about strides a layout error.
    let status = if status == Status::BadLayout {
        Status::BadLayout
    } else {
        Status::ShapeMismatch
    };
    Error::new(status, msg)
}

/// A read-only tensor borrowed from a slice (an input of a call).
///
/// ```
/// use osftrt::Tensor;
/// let x = vec![1.0f32; 6];
/// let t = Tensor::new(&x, &[2, 3])?;
/// assert_eq!(t.shape(), &[2, 3]);
/// assert!(Tensor::new(&x, &[4, 2]).is_err()); // 8 elements do not fit in 6
/// # Ok::<(), osftrt::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    data: *const c_void,
    len: usize,
    layout: Layout,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable tensor borrowed from a mutable slice (an output of a call).
pub struct TensorMut<'a> {
    data: *mut c_void,
    len: usize,
    layout: Layout,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Tensor<'a> {
    /// A compact row-major tensor of `shape` over `data` (which may be
    /// longer than the shape needs).
    #[inline]
    pub fn new<T: Element>(data: &'a [T], shape: &[i64]) -> Result<Tensor<'a>> {
        let layout = Layout::new(T::DTYPE, data.len(), shape, None)?;
        Ok(Tensor {
            data: data.as_ptr().cast(),
            len: data.len(),
            layout,
            _borrow: PhantomData,
        })
    }

    /// A tensor with explicit strides (in elements), e.g. padded rows.
    pub fn with_strides<T: Element>(
        data: &'a [T],
        shape: &[i64],
        strides: &[i64],
    ) -> Result<Tensor<'a>> {
        let layout = Layout::new(T::DTYPE, data.len(), shape, Some(strides))?;
        Ok(Tensor {
            data: data.as_ptr().cast(),
            len: data.len(),
            layout,
            _borrow: PhantomData,
        })
    }

    /// A 1-D tensor of the whole slice.
    pub fn vector<T: Element>(data: &'a [T]) -> Tensor<'a> {
        Tensor::new(data, &[data.len() as i64]).expect("a slice always fits its own length")
    }

    /// A 0-d tensor (one element).
    pub fn scalar<T: Element>(value: &'a T) -> Tensor<'a> {
        Tensor::new(std::slice::from_ref(value), &[]).expect("one element fits a 0-d shape")
    }

    /// A tensor over memory the bindings cannot check (e.g. CUDA memory).
    ///
    /// # Safety
    /// `data` must point to memory of `device` that holds every element the
    /// shape and strides reach, of type `dtype`, valid for reads and not
    /// written by anyone else during `'a`.
    pub unsafe fn from_raw(
        data: *const c_void,
        dtype: DType,
        device: Device,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Result<Tensor<'a>> {
        let mut layout = Layout::new(dtype, usize::MAX, shape, strides)?;
        layout.device = device;
        Ok(Tensor {
            data,
            len: RAW,
            layout,
            _borrow: PhantomData,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.layout.shape[..self.layout.ndim]
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }

    /// The data as a typed slice (`None` for another type, or a tensor made
    /// by `from_raw`).
    pub fn as_slice<T: Element>(&self) -> Option<&'a [T]> {
        if T::DTYPE != self.layout.dtype || self.layout.device != Device::Cpu || self.len == RAW {
            return None;
        }
        // SAFETY: the tensor was made from a `&'a [T]` of `len` elements
        // (dtype checked above), which it still borrows.
        Some(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), self.len) })
    }

    /// The `DLTensor` descriptor; it points into `self`, so it is valid
    /// while `self` is borrowed.
    #[inline]
    pub(crate) fn dl(&self) -> sys::DLTensor {
        self.layout.dl(self.data as *mut c_void)
    }
}

impl<'a> TensorMut<'a> {
    /// A compact row-major tensor of `shape` over `data`.
    #[inline]
    pub fn new<T: Element>(data: &'a mut [T], shape: &[i64]) -> Result<TensorMut<'a>> {
        let layout = Layout::new(T::DTYPE, data.len(), shape, None)?;
        Ok(TensorMut {
            data: data.as_mut_ptr().cast(),
            len: data.len(),
            layout,
            _borrow: PhantomData,
        })
    }

    /// A tensor with explicit strides (in elements), e.g. padded rows.
    pub fn with_strides<T: Element>(
        data: &'a mut [T],
        shape: &[i64],
        strides: &[i64],
    ) -> Result<TensorMut<'a>> {
        let layout = Layout::new(T::DTYPE, data.len(), shape, Some(strides))?;
        Ok(TensorMut {
            data: data.as_mut_ptr().cast(),
            len: data.len(),
            layout,
            _borrow: PhantomData,
        })
    }

    /// A 1-D tensor of the whole slice.
    pub fn vector<T: Element>(data: &'a mut [T]) -> TensorMut<'a> {
        let n = data.len() as i64;
        TensorMut::new(data, &[n]).expect("a slice always fits its own length")
    }

    /// A 0-d tensor (one element).
    pub fn scalar<T: Element>(value: &'a mut T) -> TensorMut<'a> {
        TensorMut::new(std::slice::from_mut(value), &[]).expect("one element fits a 0-d shape")
    }

    /// A tensor over memory the bindings cannot check (e.g. CUDA memory).
    ///
    /// # Safety
    /// `data` must point to memory of `device` that holds every element the
    /// shape and strides reach, of type `dtype`, valid for reads and writes
    /// and not accessed by anyone else during `'a`.
    pub unsafe fn from_raw(
        data: *mut c_void,
        dtype: DType,
        device: Device,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Result<TensorMut<'a>> {
        let mut layout = Layout::new(dtype, usize::MAX, shape, strides)?;
        layout.device = device;
        Ok(TensorMut {
            data,
            len: RAW,
            layout,
            _borrow: PhantomData,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.layout.shape[..self.layout.ndim]
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }

    /// A shorter-lived read-only view of the same memory.
    pub fn as_tensor(&self) -> Tensor<'_> {
        Tensor {
            data: self.data,
            len: self.len,
            layout: self.layout,
            _borrow: PhantomData,
        }
    }

    /// A shorter-lived writable view of the same memory (to pass the tensor
    /// to a call and keep it).
    pub fn reborrow(&mut self) -> TensorMut<'_> {
        TensorMut {
            data: self.data,
            len: self.len,
            layout: self.layout,
            _borrow: PhantomData,
        }
    }

    /// The data as a typed slice (`None` for another type, or a tensor made
    /// by `from_raw`).
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.layout.dtype || self.layout.device != Device::Cpu || self.len == RAW {
            return None;
        }
        // SAFETY: made from a `&'a mut [T]` of `len` elements (dtype
        // checked); `&self` keeps it from being written meanwhile.
        Some(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), self.len) })
    }

    /// The data as a mutable typed slice (`None` for another type, or a
    /// tensor made by `from_raw`), e.g. for an optimizer step on a weight an
    /// MLP borrows.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        if T::DTYPE != self.layout.dtype || self.layout.device != Device::Cpu || self.len == RAW {
            return None;
        }
        // SAFETY: made from a `&'a mut [T]` of `len` elements (dtype
        // checked); `&mut self` makes this the only access.
        Some(unsafe { std::slice::from_raw_parts_mut(self.data.cast::<T>(), self.len) })
    }

    /// The `DLTensor` descriptor; it points into `self`, so it is valid
    /// while `self` is borrowed.
    #[inline]
    pub(crate) fn dl(&mut self) -> sys::DLTensor {
        self.layout.dl(self.data)
    }
}

/// A `DLTensor` for an optional input (the null descriptor is never passed:
/// see [`opt_ptr`]).
#[inline]
pub(crate) fn opt_dl(t: Option<&Tensor<'_>>) -> Option<sys::DLTensor> {
    t.map(|t| t.dl())
}

/// A `DLTensor` for an optional output.
#[inline]
pub(crate) fn opt_dl_mut(t: Option<&mut TensorMut<'_>>) -> Option<sys::DLTensor> {
    t.map(|t| t.dl())
}

/// A pointer to an optional descriptor, NULL for `None`.
#[inline]
pub(crate) fn opt_ptr(t: &Option<sys::DLTensor>) -> *const sys::DLTensor {
    t.as_ref().map_or(ptr::null(), |d| d as *const _)
}

/// A mutable pointer to an optional descriptor, NULL for `None`.
#[inline]
pub(crate) fn opt_ptr_mut(t: &mut Option<sys::DLTensor>) -> *mut sys::DLTensor {
    t.as_mut().map_or(ptr::null_mut(), |d| d as *mut _)
}
