//! Per-call cost of two tiny libosftrt calls through the Rust bindings: the
//! safe API (`osftrt`) and the raw FFI (`osftrt-sys`, what C does), timed
//! interleaved in one process; bench/rust/overhead_c.c times the same calls
//! from C. Prints CSV lines
//! `case,impl,wall_ns_min,wall_ns_median,cpu_ns_min,cpu_ns_median` (ns per
//! call; cpu = the calling thread's CPU time).
//!
//! Run with bench/rust/run_overhead.sh (or `cargo bench --offline --bench
//! overhead` in bindings/rust).
use std::ptr;
use std::time::Instant;

use osftrt::sys;
use osftrt::{Context, Flce, FlceInputs, FlceOutputs, QrOptions, Tensor, TensorMut};

const REPEATS: usize = 31;
// The shapes, shared with overhead_c.c.
const FM: usize = 4;
const FH: usize = 16;
const FV: usize = 32;
const QN: usize = 4;
const QR: usize = 8;
const QC: usize = 8;

fn fill(n: usize, mut seed: u32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            ((seed >> 8) & 0xffff) as f32 / 65536.0 - 0.5
        })
        .collect()
}

fn check(st: sys::osft_status_t) {
    assert_eq!(
        st,
        sys::OSFT_STATUS_SUCCESS,
        "{}",
        osftrt::last_error_message()
    );
}

fn dl(data: *mut f32, shape: &mut [i64], code: u32, bits: u8) -> sys::DLTensor {
    sys::DLTensor {
        data: data.cast(),
        device: sys::DLDevice {
            device_type: sys::kDLCPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: sys::DLDataType {
            code: code as u8,
            bits,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    }
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    // From the C library (always linked); std has no thread CPU clock.
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// CPU time of the calling thread in ns (CLOCK_THREAD_CPUTIME_ID = 3 on
/// Linux): what the calls cost, without the time the thread waited for a
/// core on a loaded machine (every call here runs on the calling thread).
fn cpu_ns() -> f64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a struct of the C layout (x86_64 and
    // aarch64 Linux: two 64-bit fields).
    let rc = unsafe { clock_gettime(3, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// (wall, thread CPU) ns per call of `n` calls of `f`.
fn time<F: FnMut()>(f: &mut F, n: usize) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_ns());
    for _ in 0..n {
        f();
    }
    let cpu = (cpu_ns() - c) / n as f64;
    (t.elapsed().as_nanos() as f64 / n as f64, cpu)
}

/// Times `a` and `b` interleaved: REPEATS rounds of n calls each.
fn bench(name: &str, mut a: impl FnMut(), mut b: impl FnMut()) {
    for _ in 0..1000 {
        a();
        b();
    }
    let t = Instant::now();
    for _ in 0..1000 {
        a();
    }
    let per = t.elapsed().as_nanos() as f64 / 1000.0;
    let n = ((1e7 / per) as usize).max(100);
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        ra.push(time(&mut a, n));
        rb.push(time(&mut b, n));
    }
    for (label, r) in [("rust-sys", ra), ("rust-safe", rb)] {
        let mut wall: Vec<f64> = r.iter().map(|x| x.0).collect();
        let mut cpu: Vec<f64> = r.iter().map(|x| x.1).collect();
        wall.sort_by(|x, y| x.partial_cmp(y).unwrap());
        cpu.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!(
            "{name},{label},{:.1},{:.1},{:.1},{:.1}",
            wall[0],
            wall[REPEATS / 2],
            cpu[0],
            cpu[REPEATS / 2]
        );
    }
}

fn main() {
    let ctx = Context::cpu().unwrap();
    let ce = Flce::new(&ctx, &Default::default()).unwrap();
    let x = fill(FM * FH, 1);
    let w = fill(FV * FH, 2);
    let targets: Vec<i64> = (0..FM).map(|i| ((i * 7) % FV) as i64).collect();
    let (mut loss, mut gx) = (0.0f32, vec![0.0f32; FM * FH]);

    // FLCE, raw FFI: descriptors built once, structs per call (as C does).
    let (mut sx, mut sw, mut st) = ([FM as i64, FH as i64], [FV as i64, FH as i64], [FM as i64]);
    let (mut sx2, mut s0) = ([FM as i64, FH as i64], [0i64; 0]);
    let xd = dl(x.as_ptr() as *mut f32, &mut sx, sys::kDLFloat, 32);
    let wd = dl(w.as_ptr() as *mut f32, &mut sw, sys::kDLFloat, 32);
    let td = dl(targets.as_ptr() as *mut f32, &mut st, sys::kDLInt, 64);
    let mut gx_raw = vec![0.0f32; FM * FH];
    let mut loss_raw = 0.0f32;
    let mut ld = dl(&mut loss_raw, &mut s0, sys::kDLFloat, 32);
    let mut gd = dl(gx_raw.as_mut_ptr(), &mut sx2, sys::kDLFloat, 32);
    let raw_ce = ce.as_raw();
    bench(
        "flce_tiny",
        || {
            // SAFETY: every descriptor points at live buffers of its shape.
            unsafe {
                let mut inp: sys::osft_flce_inputs_t = std::mem::zeroed();
                sys::osft_flce_inputs_init(&mut inp, std::mem::size_of_val(&inp));
                inp.x = &xd;
                inp.weight = &wd;
                inp.targets = &td;
                let mut out: sys::osft_flce_outputs_t = std::mem::zeroed();
                sys::osft_flce_outputs_init(&mut out, std::mem::size_of_val(&out));
                out.loss = &mut ld;
                out.grad_x = &mut gd;
                check(sys::osft_flce_compute(raw_ce, &inp, &out));
            }
        },
        || {
            ce.compute(
                &FlceInputs::new(
                    Tensor::new(&x, &[FM as i64, FH as i64]).unwrap(),
                    Tensor::new(&w, &[FV as i64, FH as i64]).unwrap(),
                    Tensor::vector(&targets),
                ),
                &mut FlceOutputs {
                    loss: Some(TensorMut::scalar(&mut loss)),
                    grad_x: Some(TensorMut::new(&mut gx, &[FM as i64, FH as i64]).unwrap()),
                    ..Default::default()
                },
            )
            .unwrap();
        },
    );
    assert_eq!(loss, loss_raw, "the two paths computed different losses");

    // Validation only (osft_flce_get_plan): almost no library work, so the
    // difference is the bindings' own cost.
    bench(
        "flce_plan",
        || {
            // SAFETY: as above; `plan` is a struct of struct_size bytes.
            unsafe {
                let mut inp: sys::osft_flce_inputs_t = std::mem::zeroed();
                sys::osft_flce_inputs_init(&mut inp, std::mem::size_of_val(&inp));
                inp.x = &xd;
                inp.weight = &wd;
                inp.targets = &td;
                let mut out: sys::osft_flce_outputs_t = std::mem::zeroed();
                sys::osft_flce_outputs_init(&mut out, std::mem::size_of_val(&out));
                out.loss = &mut ld;
                out.grad_x = &mut gd;
                let mut plan: sys::osft_flce_plan_t = std::mem::zeroed();
                plan.struct_size = std::mem::size_of_val(&plan);
                check(sys::osft_flce_get_plan(raw_ce, &inp, &out, &mut plan));
            }
        },
        || {
            ce.plan(
                &FlceInputs::new(
                    Tensor::new(&x, &[FM as i64, FH as i64]).unwrap(),
                    Tensor::new(&w, &[FV as i64, FH as i64]).unwrap(),
                    Tensor::vector(&targets),
                ),
                &mut FlceOutputs {
                    loss: Some(TensorMut::scalar(&mut loss)),
                    grad_x: Some(TensorMut::new(&mut gx, &[FM as i64, FH as i64]).unwrap()),
                    ..Default::default()
                },
            )
            .unwrap();
        },
    );

    // Batched QR of QN small matrices, Q only, one worker.
    let a: Vec<Vec<f32>> = (0..QN).map(|i| fill(QR * QC, 10 + i as u32)).collect();
    let mut q: Vec<Vec<f32>> = vec![vec![0.0f32; QR * QC]; QN];
    let mut q_raw: Vec<Vec<f32>> = vec![vec![0.0f32; QR * QC]; QN];
    let mut shapes = [[QR as i64, QC as i64]; 2 * QN];
    let (sa, sq) = shapes.split_at_mut(QN);
    let ad: Vec<sys::DLTensor> = a
        .iter()
        .zip(sa.iter_mut())
        .map(|(m, s)| dl(m.as_ptr() as *mut f32, s, sys::kDLFloat, 32))
        .collect();
    let mut qd: Vec<sys::DLTensor> = q_raw
        .iter_mut()
        .zip(sq.iter_mut())
        .map(|(m, s)| dl(m.as_mut_ptr(), s, sys::kDLFloat, 32))
        .collect();
    let ap: Vec<*const sys::DLTensor> = ad.iter().map(|d| d as *const _).collect();
    let qp: Vec<*mut sys::DLTensor> = qd.iter_mut().map(|d| d as *mut _).collect();
    let opts = QrOptions {
        max_concurrency: 1,
        ..Default::default()
    };
    let ctx_raw = ctx.as_raw();
    bench(
        "qr_batch_small",
        || {
            // SAFETY: QN live descriptors in each array; options valid.
            unsafe {
                let mut o: sys::osft_qr_options_t = std::mem::zeroed();
                sys::osft_qr_options_init(&mut o, std::mem::size_of_val(&o));
                o.max_concurrency = 1;
                check(sys::osft_qr_batch(
                    ctx_raw,
                    &o,
                    QN,
                    ap.as_ptr(),
                    qp.as_ptr(),
                    ptr::null(),
                    ptr::null_mut(),
                ));
            }
        },
        || {
            let at: [Tensor<'_>; QN] =
                std::array::from_fn(|i| Tensor::new(&a[i], &[QR as i64, QC as i64]).unwrap());
            let mut it = q.iter_mut();
            let mut qt: [TensorMut<'_>; QN] = std::array::from_fn(|_| {
                TensorMut::new(it.next().unwrap(), &[QR as i64, QC as i64]).unwrap()
            });
            ctx.qr_batch(&opts, &at, &mut qt, None).unwrap();
        },
    );
    assert_eq!(q, q_raw, "the two paths computed different Q");

    // QN matrices of QR x 0: validated, nothing to factor.
    let mut es = [[QR as i64, 0i64]; 2 * QN];
    let (sa, sq) = es.split_at_mut(QN);
    let ed: Vec<sys::DLTensor> = a
        .iter()
        .zip(sa.iter_mut())
        .map(|(m, s)| dl(m.as_ptr() as *mut f32, s, sys::kDLFloat, 32))
        .collect();
    let mut eqd: Vec<sys::DLTensor> = q_raw
        .iter_mut()
        .zip(sq.iter_mut())
        .map(|(m, s)| dl(m.as_mut_ptr(), s, sys::kDLFloat, 32))
        .collect();
    let ep: Vec<*const sys::DLTensor> = ed.iter().map(|d| d as *const _).collect();
    let eqp: Vec<*mut sys::DLTensor> = eqd.iter_mut().map(|d| d as *mut _).collect();
    bench(
        "qr_batch_empty",
        || {
            // SAFETY: QN live descriptors in each array; options valid.
            unsafe {
                let mut o: sys::osft_qr_options_t = std::mem::zeroed();
                sys::osft_qr_options_init(&mut o, std::mem::size_of_val(&o));
                o.max_concurrency = 1;
                check(sys::osft_qr_batch(
                    ctx_raw,
                    &o,
                    QN,
                    ep.as_ptr(),
                    eqp.as_ptr(),
                    ptr::null(),
                    ptr::null_mut(),
                ));
            }
        },
        || {
            let at: [Tensor<'_>; QN] =
                std::array::from_fn(|i| Tensor::new(&a[i], &[QR as i64, 0]).unwrap());
            let mut it = q.iter_mut();
            let mut qt: [TensorMut<'_>; QN] = std::array::from_fn(|_| {
                TensorMut::new(it.next().unwrap(), &[QR as i64, 0]).unwrap()
            });
            ctx.qr_batch(&opts, &at, &mut qt, None).unwrap();
        },
    );
}
