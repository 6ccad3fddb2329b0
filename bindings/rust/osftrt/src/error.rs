//! Errors: the library's status codes and its thread-local message.
use std::ffi::CStr;
use std::fmt;

use osftrt_sys as sys;

/// Why a call failed: one value per `osft_status_t` error code
/// (`include/osftrt/status.h` documents each).
///
/// The library may return codes newer than these bindings; they arrive as
/// [`Status::Unknown`] with the raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A NULL pointer where one is required, or a scalar out of range.
    InvalidArgument,
    /// A handle that is not (or no longer) live.
    InvalidHandle,
    /// An options struct of a size this library does not accept.
    InvalidStructSize,
    /// A tensor of a dtype the call does not accept.
    DtypeMismatch,
    /// A tensor of the wrong rank or shape.
    ShapeMismatch,
    /// A tensor whose strides (or data length) describe a layout the call
    /// does not accept.
    BadLayout,
    /// A tensor on another device than the context's.
    DeviceMismatch,
    /// An output that overlaps an input or another output.
    Aliasing,
    /// A value inside a tensor out of range (e.g. a class target).
    IndexOutOfRange,
    /// An allocation failed or a memory limit was hit.
    OutOfMemory,
    /// The requested device is not present.
    NoDevice,
    /// Not available in this build or for this combination.
    NotSupported,
    /// BLAS/LAPACK/CUDA failed.
    BackendError,
    /// A collective failed.
    CommError,
    /// An operation timed out.
    Timeout,
    /// Non-finite or rank-deficient input.
    NumericalError,
    /// A bug in libosftrt.
    InternalError,
    /// A code these bindings do not know (from a newer library).
    Unknown(u32),
}

impl Status {
    /// The status for a raw code, `None` for `OSFT_STATUS_SUCCESS`.
    pub fn from_raw(code: sys::osft_status_t) -> Option<Status> {
        Some(match code {
            sys::OSFT_STATUS_SUCCESS => return None,
            sys::OSFT_STATUS_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::OSFT_STATUS_INVALID_HANDLE => Status::InvalidHandle,
            sys::OSFT_STATUS_INVALID_STRUCT_SIZE => Status::InvalidStructSize,
            sys::OSFT_STATUS_DTYPE_MISMATCH => Status::DtypeMismatch,
            sys::OSFT_STATUS_SHAPE_MISMATCH => Status::ShapeMismatch,
            sys::OSFT_STATUS_BAD_LAYOUT => Status::BadLayout,
            sys::OSFT_STATUS_DEVICE_MISMATCH => Status::DeviceMismatch,
            sys::OSFT_STATUS_ALIASING => Status::Aliasing,
            sys::OSFT_STATUS_INDEX_OUT_OF_RANGE => Status::IndexOutOfRange,
            sys::OSFT_STATUS_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::OSFT_STATUS_NO_DEVICE => Status::NoDevice,
            sys::OSFT_STATUS_NOT_SUPPORTED => Status::NotSupported,
            sys::OSFT_STATUS_BACKEND_ERROR => Status::BackendError,
            sys::OSFT_STATUS_COMM_ERROR => Status::CommError,
            sys::OSFT_STATUS_TIMEOUT => Status::Timeout,
            sys::OSFT_STATUS_NUMERICAL_ERROR => Status::NumericalError,
            sys::OSFT_STATUS_INTERNAL_ERROR => Status::InternalError,
            other => Status::Unknown(other),
        })
    }

    /// The raw `osft_status_t` value.
    pub fn code(self) -> sys::osft_status_t {
        match self {
            Status::InvalidArgument => sys::OSFT_STATUS_INVALID_ARGUMENT,
            Status::InvalidHandle => sys::OSFT_STATUS_INVALID_HANDLE,
            Status::InvalidStructSize => sys::OSFT_STATUS_INVALID_STRUCT_SIZE,
            Status::DtypeMismatch => sys::OSFT_STATUS_DTYPE_MISMATCH,
            Status::ShapeMismatch => sys::OSFT_STATUS_SHAPE_MISMATCH,
            Status::BadLayout => sys::OSFT_STATUS_BAD_LAYOUT,
            Status::DeviceMismatch => sys::OSFT_STATUS_DEVICE_MISMATCH,
            Status::Aliasing => sys::OSFT_STATUS_ALIASING,
            Status::IndexOutOfRange => sys::OSFT_STATUS_INDEX_OUT_OF_RANGE,
            Status::OutOfMemory => sys::OSFT_STATUS_OUT_OF_MEMORY,
            Status::NoDevice => sys::OSFT_STATUS_NO_DEVICE,
            Status::NotSupported => sys::OSFT_STATUS_NOT_SUPPORTED,
            Status::BackendError => sys::OSFT_STATUS_BACKEND_ERROR,
            Status::CommError => sys::OSFT_STATUS_COMM_ERROR,
            Status::Timeout => sys::OSFT_STATUS_TIMEOUT,
            Status::NumericalError => sys::OSFT_STATUS_NUMERICAL_ERROR,
            Status::InternalError => sys::OSFT_STATUS_INTERNAL_ERROR,
            Status::Unknown(code) => code,
        }
    }

    /// The library's short English name, e.g. "shape mismatch".
    pub fn name(self) -> &'static str {
        // SAFETY: osft_status_string accepts any value and returns a static,
        // NUL-terminated string owned by the library, never NULL.
        let s = unsafe { CStr::from_ptr(sys::osft_status_string(self.code())) };
        s.to_str().unwrap_or("unknown status")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: its [`Status`] and the message that names the argument
/// and the reason (`osft_last_error()` for failures inside the library; a
/// message from the bindings for arguments they reject before calling it,
/// such as a slice shorter than its shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(Box<Inner>);

// Boxed so that `Result<T, Error>` stays small on the success path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    status: Status,
    message: String,
    failed: Vec<usize>,
    rank_deficient: Vec<usize>,
}

impl Error {
    /// An error with the given status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error(Box::new(Inner {
            status,
            message: message.into(),
            failed: Vec::new(),
            rank_deficient: Vec::new(),
        }))
    }

    /// The error the library just reported with `code` on this thread.
    pub(crate) fn last(code: sys::osft_status_t) -> Error {
        // SAFETY: osft_last_error never returns NULL; the string is
        // thread-local and valid until the next failing call on this
        // thread, and it is copied before anything else runs.
        let msg = unsafe { CStr::from_ptr(sys::osft_last_error()) };
        Error::new(
            Status::from_raw(code).unwrap_or(Status::InternalError),
            msg.to_string_lossy().into_owned(),
        )
    }

    pub(crate) fn with_failed(mut self, failed: Vec<usize>) -> Error {
        self.0.failed = failed;
        self
    }

    pub(crate) fn with_rank_deficient(mut self, rank_deficient: Vec<usize>) -> Error {
        self.0.rank_deficient = rank_deficient;
        self
    }

    /// Why the call failed.
    pub fn status(&self) -> Status {
        self.0.status
    }

    /// The message naming the argument and the reason.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// For batched QR calls that returned [`Status::NumericalError`]: the
    /// indices of the matrices that failed (the others were computed).
    pub fn failed_indices(&self) -> &[usize] {
        &self.0.failed
    }

    /// For batched QR calls with [`crate::RankDeficient::Factor`] that
    /// returned [`Status::NumericalError`]: the indices of the matrices
    /// that were rank-deficient and factored anyway (written, not failed),
    /// as [`crate::QrReport::rank_deficient`] gives them on success.
    pub fn rank_deficient_indices(&self) -> &[usize] {
        &self.0.rank_deficient
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0.status, self.0.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Maps a returned status to `Ok(())` or the thread's last error.
#[inline]
pub(crate) fn check(code: sys::osft_status_t) -> Result<()> {
    if code == sys::OSFT_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}

/// The calling thread's last error message (`osft_last_error()`), "" if none.
pub fn last_error_message() -> String {
    // SAFETY: as in Error::last; the string is copied at once.
    unsafe { CStr::from_ptr(sys::osft_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Forgets the calling thread's last error message.
pub fn clear_last_error() {
    // SAFETY: takes no arguments and cannot fail.
    unsafe { sys::osft_clear_last_error() }
}
