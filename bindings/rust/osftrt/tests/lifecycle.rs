//! Drop order, allocator accounting, threads and communicator callbacks.
#![deny(unsafe_op_in_unsafe_fn)]
mod common;
use common::*;
use osftrt::*;
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

/// A host allocator that counts the bytes the library holds.
struct Counting(Arc<(AtomicI64, AtomicI64)>, Mutex<HashMap<usize, Layout>>);

// SAFETY: alloc returns NULL or a fresh std::alloc block of the requested
// size and alignment, freed only through free.
unsafe impl HostAllocator for Counting {
    fn alloc(&self, bytes: usize, alignment: usize) -> *mut u8 {
        assert!(
            bytes > 0,
            "host_alloc of 0 bytes (the allocator contract excludes it)"
        );
        let layout = Layout::from_size_align(bytes, alignment)
            .unwrap_or_else(|e| panic!("host_alloc({bytes}, alignment {alignment}): {e}"));
        // SAFETY: bytes > 0 and a valid layout (checked above).
        let p = unsafe { alloc(layout) };
        if !p.is_null() {
            self.0 .0.fetch_add(bytes as i64, Ordering::SeqCst);
            self.0 .1.fetch_add(1, Ordering::SeqCst);
            self.blocks().insert(p as usize, layout);
        }
        p
    }
    unsafe fn free(&self, ptr: *mut u8, bytes: usize) {
        let layout = self.blocks().remove(&(ptr as usize));
        let layout = layout.unwrap_or_else(|| {
            panic!("host_free({ptr:?}, {bytes}): not a live block of this allocator")
        });
        assert_eq!(
            layout.size(),
            bytes,
            "host_free({ptr:?}) with another size than allocated"
        );
        self.0 .0.fetch_sub(bytes as i64, Ordering::SeqCst);
        // SAFETY: `ptr` came from alloc with this layout and is freed once.
        unsafe { dealloc(ptr, layout) }
    }
}

impl Counting {
    fn blocks(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Layout>> {
        self.1.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[test]
fn handles_drop_before_their_context_and_return_all_memory() {
    let counters = Arc::new((AtomicI64::new(0), AtomicI64::new(0)));
    {
        let ctx = Context::with_allocator(
            &Default::default(),
            Box::new(Counting(counters.clone(), Mutex::new(HashMap::new()))),
        )
        .unwrap();
        let mut rng = Rng::new(91);
        let w = rng.vec_f32(16 * 8, 1.0);
        let layer = FLinear::from_weight(
            &ctx,
            &Tensor::new(&w, &[16, 8]).unwrap(),
            &Default::default(),
        )
        .unwrap();
        let comm = Comm::new_self(&ctx, &Default::default()).unwrap();
        let ce = Flce::with_comm(&ctx, &comm, &Default::default()).unwrap();
        let mut p = Projector::new(&ctx, Some(&comm), &Default::default()).unwrap();
        p.add_layer(&layer).unwrap();
        ctx.reserve_workspace(1 << 16).unwrap();
        let stats = ctx.memory_stats().unwrap();
        assert!(stats.host_in_use >= 1 << 16 && stats.workspace_bytes >= 1 << 16);
        assert_eq!(
            stats.host_in_use as i64,
            counters.0.load(Ordering::SeqCst),
            "stats count the allocator's bytes"
        );
        ctx.release_workspace().unwrap();
        assert_eq!(ctx.workspace_size().unwrap(), 0);
        ctx.reset_peak_memory().unwrap();
        // Drop order: the compiler allows only handles before what they
        // borrow; C would refuse to destroy a comm a projector still uses.
        drop(p);
        drop(ce);
        drop(comm);
        drop(layer);
        assert!(
            counters.0.load(Ordering::SeqCst) > 0,
            "the context's own bookkeeping"
        );
    }
    assert!(
        counters.1.load(Ordering::SeqCst) > 0,
        "the allocator was used"
    );
    assert_eq!(counters.0.load(Ordering::SeqCst), 0, "every block returned");
}

#[test]
fn a_context_moves_to_another_thread() {
    let ctx = Context::cpu().unwrap();
    let h = std::thread::spawn(move || {
        let a = [2.0f32, 0.0, 0.0, 3.0];
        let mut q = [0.0f32; 4];
        ctx.qr_batch(
            &Default::default(),
            &[Tensor::new(&a, &[2, 2]).unwrap()],
            &mut [TensorMut::new(&mut q, &[2, 2]).unwrap()],
            None,
        )
        .unwrap();
        q
    });
    assert_eq!(h.join().unwrap(), [1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn errors_are_thread_local() {
    let ctx = Context::cpu().unwrap();
    let _ = Flce::new(
        &ctx,
        &FlceOptions {
            softcap: -1.0,
            ..Default::default()
        },
    );
    let here = last_error_message();
    assert!(here.contains("softcap"), "{here}");
    let there = std::thread::spawn(last_error_message).join().unwrap();
    assert_eq!(there, "");
}

/// Two "ranks" in one process: threads exchanging through shared slots.
struct Exchange {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f32>>>,
}

struct Rank {
    rank: usize,
    x: Arc<Exchange>,
}

impl Rank {
    fn exchange(&mut self, mine: Vec<f32>) -> Vec<Vec<f32>> {
        self.x.slots.lock().unwrap()[self.rank] = mine;
        self.x.barrier.wait();
        let all = self.x.slots.lock().unwrap().clone();
        self.x.barrier.wait();
        all
    }
}

fn read(b: &CommBuf<'_>) -> Vec<f32> {
    match b {
        CommBuf::F32(s) => s.to_vec(),
        CommBuf::Bf16(s) => s.iter().map(|v| v.to_f32()).collect(),
    }
}

fn write(b: CommBuf<'_>, v: &[f32]) {
    match b {
        CommBuf::F32(s) => s.copy_from_slice(v),
        CommBuf::Bf16(s) => s
            .iter_mut()
            .zip(v)
            .for_each(|(d, &x)| *d = Bf16::from_f32(x)),
    }
}

impl CommCallbacks for Rank {
    fn allreduce_sum(&mut self, buf: CommBuf<'_>) -> Result<()> {
        let all = self.exchange(read(&buf));
        let sum: Vec<f32> = (0..all[0].len())
            .map(|i| all.iter().map(|a| a[i]).sum())
            .collect();
        write(buf, &sum);
        Ok(())
    }
    fn allgather(&mut self, send: CommSlice<'_>, recv: CommBuf<'_>, counts: &[i64]) -> Result<()> {
        let mine = match send {
            CommSlice::F32(s) => s.to_vec(),
            CommSlice::Bf16(s) => s.iter().map(|v| v.to_f32()).collect(),
        };
        assert_eq!(mine.len() as i64, counts[self.rank]);
        let all = self.exchange(mine);
        write(recv, &all.concat());
        Ok(())
    }
}

#[test]
fn callback_communicator_and_vocab_parallel_flce_over_two_threads() {
    let (m, h, v) = (5usize, 6usize, 9usize);
    let shards = [(0usize, 4usize), (4, 5)]; // uneven vocab shards
    let mut rng = Rng::new(93);
    let x = rng.vec_f32(m * h, 1.0);
    let w = rng.vec_f32(v * h, 1.0);
    let targets: Vec<i64> = (0..m).map(|_| rng.below(v as u64) as i64).collect();
    // Single-rank result as the reference for the sharded one (itself
    // checked against float64 in tests/flce.rs).
    let ctx = Context::cpu().unwrap();
    let (mut loss1, mut gx1, mut gw1) = (0.0f32, vec![0.0f32; m * h], vec![0.0f32; v * h]);
    Flce::new(&ctx, &Default::default())
        .unwrap()
        .compute(
            &FlceInputs::new(
                Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
                Tensor::new(&w, &[v as i64, h as i64]).unwrap(),
                Tensor::vector(&targets),
            ),
            &mut FlceOutputs {
                loss: Some(TensorMut::scalar(&mut loss1)),
                grad_x: Some(TensorMut::new(&mut gx1, &[m as i64, h as i64]).unwrap()),
                grad_weight: Some(TensorMut::new(&mut gw1, &[v as i64, h as i64]).unwrap()),
                ..Default::default()
            },
        )
        .unwrap();

    let ex = Arc::new(Exchange {
        barrier: Barrier::new(2),
        slots: Mutex::new(vec![vec![]; 2]),
    });
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let (ex, x, w, targets) = (ex.clone(), x.clone(), w.clone(), targets.clone());
            std::thread::spawn(move || {
                let ctx = Context::cpu().unwrap();
                let comm = Comm::with_callbacks(
                    &ctx,
                    rank as i32,
                    2,
                    Box::new(Rank { rank, x: ex }),
                    &CommOptions {
                        timeout_seconds: 30.0,
                    },
                )
                .unwrap();
                assert_eq!(
                    comm.info().unwrap(),
                    CommInfo {
                        rank: rank as i32,
                        size: 2,
                        engine: Engine::Callbacks
                    }
                );
                // The collectives themselves.
                let mut buf = [rank as f32 + 1.0, 10.0];
                comm.allreduce_sum(&mut TensorMut::vector(&mut buf))
                    .unwrap();
                assert_eq!(buf, [3.0, 20.0]);
                let send = vec![rank as f32; rank + 1];
                let mut recv = [f32::NAN; 3];
                comm.allgather(
                    &Tensor::vector(&send),
                    &mut TensorMut::vector(&mut recv),
                    &[1, 2],
                )
                .unwrap();
                assert_eq!(recv, [0.0, 1.0, 1.0]);
                comm.barrier().unwrap();
                let st = comm.stats().unwrap();
                assert_eq!(
                    (st.allreduce_calls, st.allgather_calls, st.barrier_calls),
                    (1, 1, 1)
                );
                comm.reset_stats().unwrap();
                // Vocab-parallel FLCE: this rank holds rows [off, off + n) of W.
                let (off, n) = shards[rank];
                let ce = Flce::with_comm(
                    &ctx,
                    &comm,
                    &FlceOptions {
                        vocab_offset: off as i64,
                        vocab_size_global: v as i64,
                        ..Default::default()
                    },
                )
                .unwrap();
                let (mut loss, mut gx, mut gw) =
                    (f32::NAN, vec![f32::NAN; m * h], vec![f32::NAN; n * h]);
                ce.compute(
                    &FlceInputs::new(
                        Tensor::new(&x, &[m as i64, h as i64]).unwrap(),
                        Tensor::new(&w[off * h..(off + n) * h], &[n as i64, h as i64]).unwrap(),
                        Tensor::vector(&targets),
                    ),
                    &mut FlceOutputs {
                        loss: Some(TensorMut::scalar(&mut loss)),
                        grad_x: Some(TensorMut::new(&mut gx, &[m as i64, h as i64]).unwrap()),
                        grad_weight: Some(TensorMut::new(&mut gw, &[n as i64, h as i64]).unwrap()),
                        ..Default::default()
                    },
                )
                .unwrap();
                assert!(comm.stats().unwrap().allgather_calls >= 1);
                (loss, gx, gw)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (rank, (loss, gx, gw)) in results.iter().enumerate() {
        let (off, n) = shards[rank];
        assert_close(
            &format!("rank {rank} loss"),
            &[*loss],
            &[loss1 as f64],
            1e-5,
            1e-6,
        );
        assert_close(
            &format!("rank {rank} grad_x"),
            gx,
            &to_f64(&gx1),
            1e-4,
            1e-6,
        );
        assert_close(
            &format!("rank {rank} grad_weight shard"),
            gw,
            &to_f64(&gw1[off * h..(off + n) * h]),
            1e-4,
            1e-6,
        );
    }
}

#[test]
fn log_callback_receives_failures() {
    let seen = Arc::new(Mutex::new(Vec::<(LogLevel, String)>::new()));
    let s = seen.clone();
    set_log_callback(
        Some(Box::new(move |l, m| {
            s.lock().unwrap().push((l, m.to_string()))
        })),
        LogLevel::Error,
    )
    .unwrap();
    let ctx = Context::cpu().unwrap();
    let _ = Flce::new(
        &ctx,
        &FlceOptions {
            z_loss_scale: -2.0,
            ..Default::default()
        },
    );
    set_log_callback(None, LogLevel::Off).unwrap();
    let _ = Flce::new(
        &ctx,
        &FlceOptions {
            z_loss_scale: -3.0,
            ..Default::default()
        },
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter()
            .any(|(l, m)| *l == LogLevel::Error && m.contains("z_loss_scale")),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|(_, m)| m.contains("-3")),
        "a removed sink was called"
    );
}

#[test]
fn a_leaked_handle_leaks_its_context_instead_of_freeing_it() {
    let ctx = Context::cpu().unwrap();
    let comm = Comm::new_self(&ctx, &Default::default()).unwrap();
    let p = Projector::new(&ctx, Some(&comm), &Default::default()).unwrap();
    // Safe Rust may leak: the library then refuses to destroy the
    // communicator and the context (they are still in use), and the drops
    // below must neither crash nor free what the library still holds.
    std::mem::forget(p);
    drop(comm);
    drop(ctx);
}

#[test]
fn u_rows_sharded_projection_over_two_threads() {
    let (n, r, l) = (10usize, 3usize, 2usize);
    let rows = [(0usize, 6usize), (6, 4)]; // uneven shards of U's rows
    let mut rng = Rng::new(95);
    let (u, _) = gram_schmidt(&rng.vec_f64(n * r, 1.0), n, r);
    let uh: Vec<f32> = u.iter().map(|&v| v as f32).collect();
    let ul = rng.vec_f32(n * l, 1.0);
    let g = rng.vec_f32(n * l, 1.0);
    // f64 reference on the whole matrices: g - Uh (Uh^T g), using the
    // fp32-rounded Uh the ranks hold.
    let uhd = to_f64(&uh);
    let c = matmul(&transpose(&uhd, n, r), &to_f64(&g), r, n, l);
    let want: Vec<f64> = to_f64(&g)
        .iter()
        .zip(matmul(&uhd, &c, n, r, l))
        .map(|(a, b)| a - b)
        .collect();

    let ex = Arc::new(Exchange {
        barrier: Barrier::new(2),
        slots: Mutex::new(vec![vec![]; 2]),
    });
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let (ex, uh, mut ul, mut g) = (ex.clone(), uh.clone(), ul.clone(), g.clone());
            std::thread::spawn(move || {
                let (r0, nr) = rows[rank];
                let ctx = Context::cpu().unwrap();
                let comm = Comm::with_callbacks(
                    &ctx,
                    rank as i32,
                    2,
                    Box::new(Rank { rank, x: ex }),
                    &Default::default(),
                )
                .unwrap();
                let mut p = Projector::new(&ctx, Some(&comm), &Default::default()).unwrap();
                let ul_rows = &mut ul[r0 * l..(r0 + nr) * l];
                let t = p
                    .add_target(Target {
                        u: Some(PartTarget {
                            high: Tensor::new(&uh[r0 * r..(r0 + nr) * r], &[nr as i64, r as i64])
                                .unwrap(),
                            low: TensorMut::new(ul_rows, &[nr as i64, l as i64]).unwrap(),
                            layout: ShardLayout::URows,
                            shards: rows.iter().map(|&(_, m)| m as i64).collect(),
                        }),
                        v: None,
                    })
                    .unwrap();
                let g_rows = &mut g[r0 * l..(r0 + nr) * l];
                p.project(&mut [ProjectionGrads {
                    target: t,
                    grad_u_low: Some(TensorMut::new(g_rows, &[nr as i64, l as i64]).unwrap()),
                    grad_v_low: None,
                }])
                .unwrap();
                let info = p.info().unwrap();
                // One all-reduce per step, of the r x l coefficients (the
                // buffer may be padded).
                assert_eq!(info.collectives_per_project, 1);
                assert!(info.reduced_elements >= (r * l) as i64, "{info:?}");
                comm.reset_stats().unwrap();
                p.project_params().unwrap();
                assert_eq!(
                    comm.stats().unwrap().allreduce_calls,
                    1,
                    "one all-reduce for project_params"
                );
                let (ou, ov) = p.orthogonality().unwrap();
                assert!(ou <= 1e-5 && ov == 0.0, "orthogonality {ou} {ov}");
                drop(p);
                g[r0 * l..(r0 + nr) * l].to_vec()
            })
        })
        .collect();
    let got: Vec<f32> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_close(
        "U_ROWS projected gradient (both ranks)",
        &got,
        &want,
        1e-5,
        1e-6,
    );
}
