"""One rank of the torch.distributed (gloo) tests, run by test_distributed.py:
    python dist_worker.py RANK WORLD_SIZE INIT_FILE
Checks, against a float64 single-process reference computed on every rank
from the same seed:
  * OSFTProjector over the torch.distributed host-callback communicator with
    V sharded by rows (uneven shards, a rank may hold none) and U sharded by
    rows (uneven): gradients, parameters, orthogonality;
  * the fused linear cross-entropy in vocab-parallel mode (W rows sharded
    unevenly): loss, grad_x, this rank's grad_weight rows.
Exit status 0 when everything matches."""
import sys

import torch
import torch.distributed as dist

import osftrt
import osftrt.torch as ot
from worker_exit import finish


def split(n, parts, rank, sizes):
    off = sum(sizes[:rank])
    return slice(off, off + sizes[rank])


def close(got, want, tol, what):
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    if not err <= tol:
        raise AssertionError("rank %d: %s: max err %.3e" % (dist.get_rank(), what, err))


def main():
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(1234)  # the same full data on every rank
    N, K, r, l = 11, 13, 5, 4
    u, _, vt = torch.linalg.svd(torch.randn(N, K, generator=g, dtype=torch.float64), full_matrices=False)
    uh, ul = u[:, :r].contiguous(), u[:, r : r + l].contiguous()
    vh, vl = vt[:r].contiguous(), vt[r : r + l].contiguous()
    gu = torch.randn(N, l, generator=g, dtype=torch.float64)
    gv = torch.randn(l, K, generator=g, dtype=torch.float64)
    # perturb the trainable factors off the subspace, to test project_params
    ul_p = ul + 0.1 * uh[:, :l]
    vl_p = vl + 0.1 * vh[:l]
    want_gu = gu - uh @ (uh.T @ gu)
    want_gv = gv - (gv @ vh.T) @ vh
    want_ul = ul_p - uh @ (uh.T @ ul_p)
    want_vl = vl_p - (vl_p @ vh.T) @ vh

    vh_sizes = {2: [3, 2], 3: [2, 0, 3]}[world]  # rows of V_high per rank (sum r)
    vl_sizes = {2: [1, 3], 3: [2, 2, 0]}[world]  # rows of V_low per rank (sum l)
    uh_sizes = {2: [7, 4], 3: [5, 0, 6]}[world]  # rows of U per rank (sum N)
    f = lambda t: t.float().contiguous()
    sv, sl, su = split(r, world, rank, vh_sizes), split(l, world, rank, vl_sizes), split(N, world, rank, uh_sizes)
    t_vh, t_vl, t_gv = f(vh[sv]), f(vl_p[sl]), f(gv[sl])
    t_uh, t_ul, t_gu = f(uh[su]), f(ul_p[su]), f(gu[su])
    ctx = osftrt.Context("cpu")
    comm = osftrt.Communicator.torch_distributed(ctx)
    assert (comm.rank, comm.size) == (rank, world)
    proj = ot.OSFTProjector(comm=comm, context=ctx)
    # target 0: U replicated, V sharded by rows; target 1: U sharded by rows
    r_uh, r_ul, r_gu = f(uh), f(ul_p), f(gu)
    proj.add_target(u_high=r_uh, u_low=r_ul, grad_u_low=r_gu, v_high=t_vh, v_low=t_vl, grad_v_low=t_gv,
                    v_layout="rows", v_shards=vh_sizes)
    proj.add_target(u_high=t_uh, u_low=t_ul, grad_u_low=t_gu, u_layout="rows", u_shards=uh_sizes)
    proj.project_gradients()
    info = proj.info()
    assert info["collectives_per_project"] == 1, info  # the U_ROWS coefficients: one all-reduce
    close(r_gu, want_gu, 1e-5, "replicated dU")
    close(t_gv, want_gv[sl], 1e-5, "V-rows dV")
    close(t_gu, want_gu[su], 1e-5, "U-rows dU")
    mu, mv = proj.orthogonality()
    assert mu > 1e-3 and mv > 1e-3, (mu, mv)
    proj.project_parameters()
    close(r_ul, want_ul, 1e-5, "replicated U_low")
    close(t_vl, want_vl[sl], 1e-5, "V-rows V_low")
    close(t_ul, want_ul[su], 1e-5, "U-rows U_low")
    mu, mv = proj.orthogonality()
    assert mu <= 1e-5 and mv <= 1e-5, (mu, mv)
    proj.close()

    # vocab-parallel fused cross-entropy
    M, H, V = 9, 8, 23
    x = torch.randn(M, H, generator=g)
    w = torch.randn(V, H, generator=g) * 0.5
    t = torch.randint(0, V, (M,), generator=g)
    t[3] = -100
    xs = x.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xs.double() @ w.double().T, t, label_smoothing=0.1)
    ref.backward()
    wr = w.double().requires_grad_()
    torch.nn.functional.cross_entropy(x.double() @ wr.T, t, label_smoothing=0.1).backward()
    vs = {2: [10, 13], 3: [8, 1, 14]}[world]
    vsl = split(V, world, rank, vs)
    w_loc = w[vsl].clone().requires_grad_()
    x_loc = x.clone().requires_grad_()
    loss = ot.fused_linear_cross_entropy(x_loc, w_loc, t, label_smoothing=0.1, comm=comm,
                                         vocab_offset=vsl.start, vocab_size_global=V, context=ctx)
    loss.backward()
    close(loss, ref, 1e-5, "vocab-parallel loss")
    close(x_loc.grad, xs.grad, 1e-5, "vocab-parallel grad_x")
    close(w_loc.grad, wr.grad[vsl], 1e-5, "vocab-parallel grad_weight")
    del loss  # its autograd node holds the flce handle, which holds the communicator
    ot.cross_entropy._flce_cache.clear()
    comm.close()
    ctx.close()
    finish(rank, world)


if __name__ == "__main__":
    main()
