//! Bad input gives the right `Error` variant with the library's message,
//! and outputs stay untouched.
mod common;
use common::*;
use osftrt::*;

fn poison(n: usize) -> Vec<f32> {
    vec![f32::from_bits(0x7fc0_1234); n] // a NaN with a payload: compared bitwise
}

fn untouched(v: &[f32]) -> bool {
    v.iter().all(|x| x.to_bits() == 0x7fc0_1234)
}

#[test]
fn flce_errors_map_to_status_and_write_nothing() {
    let (m, h, v) = (4usize, 8usize, 5usize);
    let mut rng = Rng::new(81);
    let x = rng.vec_f32(m * h, 1.0);
    let w = rng.vec_f32(v * h, 1.0);
    let w_bad = rng.vec_f32(v * (h + 1), 1.0);
    let targets = [0i64, 4, 2, 1];
    let bad_targets = [0i64, 4, 9, 1];
    let ctx = Context::cpu().unwrap();
    let ce = Flce::new(&ctx, &Default::default()).unwrap();
    let mut loss = poison(1);
    let mut gx = poison(m * h);
    let mut run = |w: Tensor<'_>, t: &[i64]| {
        clear_last_error();
        let e = ce
            .compute(
                &FlceInputs::new(
                    Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
                    w,
                    Tensor::vector(t),
                ),
                &mut FlceOutputs {
                    loss: Some(TensorMut::new(&mut loss, &[]).unwrap()),
                    grad_x: Some(TensorMut::new(&mut gx, &[m as i64, h as i64]).unwrap()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        // The message is the library's thread-local one.
        assert_eq!(e.message(), last_error_message());
        e
    };
    // The weight's H disagrees with x's.
    let e = run(
        Tensor::new(&w_bad, &[v as i64, h as i64 + 1]).unwrap(),
        &targets,
    );
    assert_eq!(e.status(), Status::ShapeMismatch, "{e}");
    assert!(e.message().contains("weight"), "{e}");
    // A target outside [0, V).
    let e = run(
        Tensor::new(&w, &[v as i64, h as i64]).unwrap(),
        &bad_targets,
    );
    assert_eq!(e.status(), Status::IndexOutOfRange, "{e}");
    assert!(
        e.message().contains('9'),
        "the message names the value: {e}"
    );
    // x is f32 but the weight f64.
    let w64: Vec<f64> = to_f64(&w);
    let e = run(Tensor::new(&w64, &[v as i64, h as i64]).unwrap(), &targets);
    assert_eq!(e.status(), Status::DtypeMismatch, "{e}");
    assert!(
        untouched(&loss) && untouched(&gx),
        "a failed call wrote its outputs"
    );
    // Display: "<status name>: <message>".
    assert!(e
        .to_string()
        .starts_with(&format!("{}: ", Status::DtypeMismatch.name())));
    assert_eq!(
        Status::from_raw(Status::Aliasing.code()),
        Some(Status::Aliasing)
    );
    assert_eq!(Status::from_raw(0), None);
    assert_eq!(Status::from_raw(999), Some(Status::Unknown(999)));
}

#[test]
fn invalid_options_are_refused() {
    let ctx = Context::cpu().unwrap();
    let e = Flce::new(
        &ctx,
        &FlceOptions {
            label_smoothing: 1.5,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("label_smoothing"), "{e}");
    let e = Flce::new(
        &ctx,
        &FlceOptions {
            slice_cols: -1,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("slice_cols"), "{e}");
    let e = Comm::new_self(
        &ctx,
        &CommOptions {
            timeout_seconds: -1.0,
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    let w = vec![1.0f32; 12];
    let e = FLinear::from_weight(
        &ctx,
        &Tensor::new(&w, &[3, 4]).unwrap(),
        &FlinearOptions {
            rank_ratio: 1.5,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = Context::new(&ContextOptions {
        device_id: 3,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument); // device_id on a CPU context
    let cuda = Context::new(&ContextOptions {
        device_type: DeviceType::Cuda,
        ..Default::default()
    });
    if device_count(DeviceType::Cuda).unwrap() == 0 {
        let s = cuda.unwrap_err().status();
        assert!(s == Status::NotSupported || s == Status::NoDevice, "{s:?}");
    }
}

#[test]
fn shape_checks_of_the_bindings() {
    let x = vec![0.5f32; 10];
    let e = Tensor::new(&x, &[3, 4]).err().unwrap();
    assert_eq!(e.status(), Status::ShapeMismatch);
    assert!(e.message().contains("12"), "{e}");
    assert!(Tensor::with_strides(&x, &[3, 2], &[4, 1]).is_ok()); // reaches element 9
    assert_eq!(
        Tensor::with_strides(&x, &[3, 3], &[4, 1])
            .err()
            .unwrap()
            .status(),
        Status::ShapeMismatch
    );
    assert_eq!(
        Tensor::with_strides(&x, &[3, 3], &[4])
            .err()
            .unwrap()
            .status(),
        Status::BadLayout
    );
    assert!(Tensor::new(&x, &[0, 99]).is_ok()); // empty tensors need no data
}

#[test]
fn qr_errors() {
    let ctx = Context::cpu().unwrap();
    let a = vec![1.0f64; 6];
    let mut q = vec![f64::NAN; 6];
    // m < n
    let e = ctx
        .qr_batch(
            &Default::default(),
            &[Tensor::new(&a, &[2, 3]).unwrap()],
            &mut [TensorMut::new(&mut q, &[2, 3]).unwrap()],
            None,
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::ShapeMismatch, "{e}");
    assert!(e.message().contains("a[0]"), "{e}");
    // Q of another shape.
    let e = ctx
        .qr_batch(
            &Default::default(),
            &[Tensor::new(&a, &[3, 2]).unwrap()],
            &mut [TensorMut::new(&mut q, &[2, 3]).unwrap()],
            None,
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::ShapeMismatch, "{e}");
    assert!(e.message().contains("q[0]"), "{e}");
    assert!(q.iter().all(|v| v.is_nan()));
    // Bad options.
    let e = ctx
        .qr_batch(
            &QrOptions {
                max_concurrency: -1,
                ..Default::default()
            },
            &[Tensor::new(&a, &[3, 2]).unwrap()],
            &mut [TensorMut::new(&mut q, &[3, 2]).unwrap()],
            None,
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(q.iter().all(|v| v.is_nan()));
}

#[test]
fn mpi_without_mpi_init_is_an_error_not_a_crash() {
    let ctx = Context::cpu().unwrap();
    let e = Comm::from_mpi(&ctx, 0, &Default::default()).err().unwrap();
    let want = if has_feature(Feature::Mpi) {
        Status::InvalidArgument
    } else {
        Status::NotSupported
    };
    assert_eq!(e.status(), want, "{e}");
}

#[test]
fn version_and_build_info() {
    assert!(version() >= HEADER_VERSION);
    assert_eq!(version() / 10000, HEADER_VERSION / 10000);
    check_library_version().unwrap();
    let s = version_string();
    assert_eq!(s.split('.').count(), 3, "{s}");
    assert!(build_info().contains(s), "{}", build_info());
    assert_eq!(device_count(DeviceType::Cpu).unwrap(), 1);
    let _ = has_feature(Feature::Cuda);
    assert_eq!(Status::ShapeMismatch.name(), "shape mismatch");
}

#[test]
fn thread_count() {
    // The count is process-wide and the other tests run beside this one:
    // set it to what it is (explicit from now on), never to another value.
    let n = num_threads().unwrap();
    assert!(n >= 1);
    set_num_threads(n).unwrap();
    assert_eq!(num_threads().unwrap(), n);
    let e = set_num_threads(-1).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("n: -1"), "{}", e.message());
    assert_eq!(
        set_num_threads(1025).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(num_threads().unwrap(), n);
}

#[test]
fn raw_tensors_have_no_slice_view_and_device_memory_is_refused() {
    let x = [1.0f32; 4];
    // SAFETY: the pointer and shape describe `x`, which outlives the tensor.
    let t = unsafe { Tensor::from_raw(x.as_ptr().cast(), DType::F32, Device::Cpu, &[2, 2], None) }
        .unwrap();
    assert!(t.as_slice::<f32>().is_none());
    assert_eq!(t.shape(), &[2, 2]);
    // A "CUDA" tensor handed to a CPU context: the library refuses it
    // before touching the memory (so the dangling address is never read).
    // SAFETY: never dereferenced: the device check fails first.
    let d = unsafe {
        Tensor::from_raw(
            0x1000 as *const _,
            DType::F64,
            Device::Cuda(0),
            &[3, 2],
            None,
        )
    }
    .unwrap();
    let mut q = vec![f64::NAN; 6];
    let ctx = Context::cpu().unwrap();
    let e = ctx
        .qr_batch(
            &Default::default(),
            &[d],
            &mut [TensorMut::new(&mut q, &[3, 2]).unwrap()],
            None,
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::DeviceMismatch, "{e}");
    assert!(q.iter().all(|v| v.is_nan()));
}

#[test]
fn deferred_target_check_reports_later() {
    let (m, h, v) = (3usize, 4usize, 5usize);
    let mut rng = Rng::new(83);
    let x = rng.vec_f32(m * h, 1.0);
    let w = rng.vec_f32(v * h, 1.0);
    let bad = [1i64, 7, 2];
    let ctx = Context::cpu().unwrap();
    let ce = Flce::new(
        &ctx,
        &FlceOptions {
            device_target_check: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(ce.options().unwrap().device_target_check);
    ce.check_targets().unwrap(); // nothing recorded yet
    let mut loss = 0.0f32;
    ce.compute(
        &FlceInputs::new(
            Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
            Tensor::new(&w, &[v as i64, h as i64]).unwrap(),
            Tensor::vector(&bad),
        ),
        &mut FlceOutputs {
            loss: Some(TensorMut::scalar(&mut loss)),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        loss.is_nan(),
        "an out-of-range target makes the loss NaN: {loss}"
    );
    let e = ce.check_targets().unwrap_err();
    assert_eq!(e.status(), Status::IndexOutOfRange, "{e}");
    assert!(e.message().contains('7'), "{e}");
    ce.check_targets().unwrap(); // the record was cleared
}

#[test]
fn context_stream_and_nccl_on_a_cpu_build() {
    let ctx = Context::cpu().unwrap();
    assert!(ctx.stream().unwrap().is_null());
    ctx.synchronize().unwrap();
    // SAFETY: a non-NULL stream on a CPU context is refused before use.
    let e = unsafe { ctx.set_stream(8 as *mut std::ffi::c_void) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    if !has_feature(Feature::Nccl) {
        assert_eq!(
            NcclUniqueId::new().err().unwrap().status(),
            Status::NotSupported
        );
        let id = NcclUniqueId([0u8; 128]);
        let e = Comm::nccl_from_id(&ctx, &id, 1, 0, &Default::default())
            .err()
            .unwrap();
        assert_eq!(e.status(), Status::NotSupported, "{e}");
    }
    let limited = Context::new(&ContextOptions {
        workspace_limit: 1024,
        ..Default::default()
    })
    .unwrap();
    let e = limited.reserve_workspace(4096).unwrap_err();
    assert_eq!(e.status(), Status::OutOfMemory, "{e}");
    assert_eq!(limited.workspace_size().unwrap(), 0);
}

#[test]
fn huge_shapes_are_errors_not_overflows() {
    let x = [0.0f32; 4];
    let e = Tensor::new(&x, &[i64::MAX, i64::MAX, 4]).err().unwrap();
    assert_eq!(e.status(), Status::ShapeMismatch, "{e}");
    let e = Tensor::with_strides(&x, &[2, 2], &[i64::MAX, 1])
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::ShapeMismatch, "{e}");
    let e = Tensor::new(&x, &[2, -2]).err().unwrap();
    assert!(e.message().contains("negative"), "{e}");
    assert_eq!(
        Tensor::with_strides(&x, &[2, 2], &[-1, 1])
            .err()
            .unwrap()
            .status(),
        Status::BadLayout
    );
    assert_eq!(
        Tensor::new(&x, &[1, 1, 1, 1, 1, 1, 1])
            .err()
            .unwrap()
            .status(),
        Status::ShapeMismatch
    );
}
