"""One rank of the FSDP2 / DDP tests, run by test_fsdp2.py:
    python fsdp2_worker.py RANK WORLD_SIZE INIT_FILE CASE[,CASE...]
Every case trains a model with OSFT on `WORLD_SIZE` gloo processes (each
rank its slice of the batch) and, on every rank, the same model in one
process on the whole batch (the reference, OSFTProjector attached), from the
same seed, and checks: the losses of every step, the merged weights at the
end (gathered from the shards), orthogonality <= 1e-5 on every rank, and
the collectives of one training step (counted by the communicator).

Cases:
  fsdp          a stack of OSFTLinear, prepare_fsdp2 (frozen factors
                sharded too), fully_shard per layer + root; projections in
                the optimizer hooks (gradients="step"); uneven shards, and
                empty ones on 3 ranks
  fsdp_buffers  the same without prepare_fsdp2 (frozen factors replicated
                buffers), gradients="backward" (end-of-backward callback)
  fsdp_bf16     MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
                against the fp32 reference (bf16 tolerance)
  meshes        every layer's factors Shard(0) DTensors on a mesh of its
                own, each over a new process group of all ranks: equal
                groups, different objects, as a machine with a GPU and a
                gloo default group gives fully_shard's default meshes
                (issue 25); one projection of the gradients and of the
                parameters against OSFTProjector on the whole model
  ddp           DistributedDataParallel, replicated factors: no collective
                of the projector per step
  llama         a tiny random Llama patched by osftrt.transformers
                (OSFT + fused cross-entropy + tiled MLP), FSDP2 per decoder
                layer + root, against the patched model in one process
Prints "rank R/W: OK" when everything matches."""
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import osftrt.torch as ot
from osftrt.torch.distributed import prepare_fsdp2, shard_aware_projector
from worker_exit import finish

STEPS = 3
BATCH = 6  # divisible by 2 and 3: every rank the same number of rows


def log(msg):
    print("rank %d: %s" % (dist.get_rank(), msg), flush=True)


def check(ok, what):
    if not ok:
        raise AssertionError("rank %d: %s" % (dist.get_rank(), what))


def close(got, want, tol, what):
    err = (torch.as_tensor(got).double() - torch.as_tensor(want).double()).abs().max().item()
    check(err <= tol, "%s: max err %.3e > %.1e" % (what, err, tol))
    return err


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@torch.no_grad()
def merged(m):
    """W = U_high S_high V_high + U_low S_low V_low from the (gathered) factors."""
    f = [full(getattr(m, n)).double() for n in ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low")]
    return f[0] @ torch.diag(f[1]) @ f[2] + f[3] @ torch.diag(f[4]) @ f[5]


def stack():
    torch.manual_seed(0)
    # N x K per layer: 10x16 (r 5, l 5), 9x10 (r 4, l 5), 4x9 (r 2, l 2): rows
    # that 2 and 3 ranks split unevenly, and empty shards on 3 ranks (4 rows
    # of U and 2 rows of V_low of the last layer, 4 rows of V_high of the
    # second)
    model = nn.Sequential(nn.Linear(16, 10), nn.Tanh(), nn.Linear(10, 9), nn.Tanh(), nn.Linear(9, 4))
    ot.convert_linear_layers(model, lambda qn, m: True, 0.5)
    return model


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def local_rows(t):
    w, r = dist.get_world_size(), dist.get_rank()
    n = t.shape[0] // w
    return t[r * n : (r + 1) * n]


def reference(model, steps, batch_fn, loss_fn):
    """The same model in this process on the whole batch; OSFTProjector attached."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    proj = ot.OSFTProjector(ref).attach(opt)
    losses = []
    for s in range(steps):
        loss = loss_fn(ref, batch_fn(s))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    check(max(proj.orthogonality()) <= 1e-5, "reference orthogonality")
    proj.close()
    return ref, losses


def mse(model, batch):
    x, y = batch
    return (model(x).float() - y).square().mean()


def train(model, proj, opt, steps, batch_fn, loss_fn):
    """The distributed run: every rank its rows of the batch; returns the
    global losses and the collectives of the last step."""
    losses = []
    for s in range(steps):
        before = proj.stats()
        loss = loss_fn(model, tuple(local_rows(t) for t in batch_fn(s)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        after = proj.stats()
        g = loss.detach().clone()
        dist.all_reduce(g)
        losses.append(g.item() / dist.get_world_size())
    step = {k: after[k] - before[k] for k in after}
    return losses, step


def osft_modules(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, ot.OSFTLinear)]


def compare(name, model, ref, losses, ref_losses, proj, step, *, loss_tol, weight_tol, per_step):
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        check(abs(a - b) <= loss_tol * max(1.0, abs(b)), "%s: step %d loss %.8f vs %.8f" % (name, i, a, b))
    werr = 0.0
    refmods = dict(osft_modules(ref))
    for n, m in osft_modules(model):
        n = n.replace("module.", "", 1) if n not in refmods else n
        werr = max(werr, close(merged(m), merged(refmods[n]), weight_tol, "%s: merged weight of %s" % (name, n)))
    mu, mv = proj.orthogonality()
    check(mu <= 1e-5 and mv <= 1e-5, "%s: orthogonality %.3e %.3e" % (name, mu, mv))
    check(step["allreduce_calls"] == per_step and step["allgather_calls"] == 0 and step["failures"] == 0,
          "%s: collectives of one step %s, want %d all-reduce(s)" % (name, step, per_step))
    info = proj.info()
    log("%s: losses %s (ref %s), merged max err %.2e, orthogonality %.1e %.1e, one step: %d all-reduce(s) "
        "(%d B), %d all-gathers for %d layers; layouts %s"
        % (name, ["%.6f" % v for v in losses], ["%.6f" % v for v in ref_losses], werr, mu, mv,
           step["allreduce_calls"], step["allreduce_bytes"], step["allgather_calls"], info["layers"], info["layouts"]))


def cpu_mesh():
    """The gloo ranks' CPU mesh: fully_shard's default mesh is a CUDA one (its
    parameters moved to the GPU) wherever CUDA is available."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def case_fsdp(kind):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = stack()
    ref, ref_losses = reference(model, STEPS, data, mse)
    if kind != "fsdp_buffers":
        prepare_fsdp2(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if kind == "fsdp_bf16" else MixedPrecisionPolicy()
    for m in model:
        if isinstance(m, ot.OSFTLinear):
            fully_shard(m, mp_policy=mp, mesh=cpu_mesh())
    fully_shard(model, mp_policy=mp, mesh=cpu_mesh())
    u = model[0].u_low
    check(type(u).__name__ == "DTensor" and u.placements[0].is_shard(0), "u_low is not a Shard(0) DTensor")
    check((type(model[0].u_high).__name__ == "DTensor") == (kind != "fsdp_buffers"), "frozen factors' sharding")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    proj = shard_aware_projector(model).attach(opt, gradients="backward" if kind == "fsdp_buffers" else "step")
    losses, step = train(model, proj, opt, STEPS, data, mse)
    bf16 = kind == "fsdp_bf16"
    # one all-reduce for the gradients of all 3 layers, one for the parameters
    compare(kind, model, ref, losses, ref_losses, proj, step, loss_tol=3e-2 if bf16 else 1e-5,
            weight_tol=3e-2 if bf16 else 2e-5, per_step=2)
    check(proj.info()["collectives_per_project"] == 1, "collectives_per_project")
    # no re-registration per step: the FSDP2 of torch 2.11 and 2.15 keeps
    # the shards' storage, 2.7's gives a rank's shards new storage once (the
    # projector notices and registers them again; the results above match)
    rebuilds = proj.rebuilds
    check(rebuilds <= 1, "%s: the projector was rebuilt %d time(s) in %d steps" % (kind, rebuilds, STEPS))
    train(model, proj, opt, 2, data, mse)
    check(proj.rebuilds == rebuilds, "%s: the projector was rebuilt in the steady state" % kind)
    proj.close()


def case_meshes():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    from osftrt.torch.distributed import shard_sizes

    world, rank = dist.get_world_size(), dist.get_rank()
    model = stack()
    prepare_fsdp2(model)
    layers = [m for m in model if isinstance(m, ot.OSFTLinear)]
    with torch.no_grad():  # parameters off the orthogonal complement: the parameter projection has work to do
        g = torch.Generator().manual_seed(7)
        for m in layers:
            m.u_low.add_(m.u_high @ torch.randn(m.u_high.shape[1], m.u_low.shape[1], generator=g), alpha=0.1)
            m.v_low.add_(torch.randn(m.v_low.shape[0], m.v_high.shape[0], generator=g) @ m.v_high, alpha=0.1)
    ref = copy.deepcopy(model)
    for m in (model, ref):
        mse(m, data(0)).backward()  # every rank the whole batch: the same full gradients
    rproj = ot.OSFTProjector(ref)
    rproj.project_gradients()
    rproj.project_parameters()
    rproj.close()

    def shard(t, mesh):
        sizes = shard_sizes(t.shape[0], world)
        off = sum(sizes[:rank])
        local = t.detach()[off : off + sizes[rank]].clone()
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())

    for m in layers:
        mesh = DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu")
        for name in ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low"):
            full = m._parameters[name]
            p = nn.Parameter(shard(full, mesh), requires_grad=full.requires_grad)
            if full.grad is not None:
                p.grad = shard(full.grad, mesh)
            for t in (p, p.grad):
                # nn.Parameter's detach() goes through DTensor's sharding
                # propagation, whose cache compares meshes by ranks and
                # device (not groups) and may answer with an earlier mesh:
                # put this layer's back, as FSDP2 gives each parameter its
                # own module's mesh
                if t is not None and t.device_mesh is not mesh:
                    t._spec = copy.copy(t._spec)
                    t._spec.mesh = mesh
            m._parameters[name] = p
    groups = {id(p.device_mesh.get_group()) for m in layers for p in (m.u_high, m.u_low, m.v_high, m.v_low)}
    check(len(groups) == len(layers), "meshes: %d group objects for %d layers" % (len(groups), len(layers)))
    proj = shard_aware_projector(model)
    before = proj.stats()
    proj.project_gradients()
    proj.project_parameters()
    after = proj.stats()
    mu, mv = proj.orthogonality()
    check(mu <= 1e-5 and mv <= 1e-5, "meshes: orthogonality %.3e %.3e" % (mu, mv))
    check(after["allreduce_calls"] - before["allreduce_calls"] == 2, "meshes: one all-reduce per projection")
    check(proj.info()["layouts"] == {"u_rows": 3, "v_rows": 3}, "meshes: layouts %s" % proj.info()["layouts"])
    err = 0.0
    for m, r in zip(layers, (m for m in ref if isinstance(m, ot.OSFTLinear))):
        for name in ("u_low", "v_low"):
            for what, got, want in ((name, getattr(m, name), getattr(r, name)),
                                    ("grad " + name, getattr(m, name).grad, getattr(r, name).grad)):
                want = shard(want, m.u_low.device_mesh)._local_tensor
                check(got._local_tensor.shape == want.shape, "meshes: %s: shard shape" % what)
                if want.numel():  # the last rank's shard may be empty
                    err = max(err, close(got._local_tensor, want, 1e-6, "meshes: " + what))
    proj.close()
    log("meshes: %d layers, factors on %d process group objects of the same ranks, max err %.1e against "
        "OSFTProjector, orthogonality %.1e %.1e" % (len(layers), len(groups), err, mu, mv))


def case_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = stack()
    ref, ref_losses = reference(model, STEPS, data, mse)
    ddp = DDP(model)
    opt = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    proj = shard_aware_projector(ddp).attach(opt)
    losses, step = train(ddp, proj, opt, STEPS, data, mse)
    compare("ddp", ddp, ref, losses, ref_losses, proj, step, loss_tol=1e-5, weight_tol=2e-5, per_step=0)
    check(set(proj.info()["layouts"]) == {"u_replicated", "v_replicated"}, "ddp layouts")
    proj.close()


def case_llama(name="llama", **knob):
    """`knob`: apply_osftrt's long-context options for the sharded model
    only (the reference stays unpatched by them: same losses, same weights)."""
    import transformers
    from torch.distributed.fsdp import fully_shard

    import osftrt.transformers as otf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=50, max_position_embeddings=32,
                                   tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    base = transformers.LlamaForCausalLM(cfg).float()
    model = copy.deepcopy(base)
    otf.apply_osftrt(base, osft=True, rank_ratio=0.5)  # the reference: projector attached

    def batch(step):
        g = torch.Generator().manual_seed(200 + step)
        return (torch.randint(0, 50, (BATCH, 8), generator=g),)

    def lm_loss(m, b):
        return m(input_ids=b[0], labels=b[0]).loss

    ref_losses = []
    opt_r = torch.optim.AdamW([p for p in base.parameters() if p.requires_grad], lr=1e-2)
    for s in range(STEPS):
        loss = lm_loss(base, batch(s))
        loss.backward()
        opt_r.step()
        opt_r.zero_grad()
        ref_losses.append(loss.item())
    info = otf.apply_osftrt(model, osft=True, rank_ratio=0.5, projector=False, **knob)  # the projector after sharding
    model.train()
    check(all(m.gradient_checkpointing for m in model.model.layers) == bool(knob), "%s: checkpointing" % name)
    prepare_fsdp2(model)
    for layer in model.model.layers:
        fully_shard(layer, mesh=cpu_mesh())
    fully_shard(model, mesh=cpu_mesh())  # embeddings, norm and lm_head (the fused CE reads lm_head.weight unsharded)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    proj = shard_aware_projector(model).attach(opt)
    losses, step = train(model, proj, opt, STEPS, batch, lm_loss)
    n = len(osft_modules(model))
    compare(name, model, base, losses, ref_losses, proj, step, loss_tol=1e-5, weight_tol=2e-5, per_step=2)
    check(n == 14 and step["allreduce_calls"] < n, "%s: %d OSFT layers" % (name, n))
    if knob:
        check(info.long_context.loss_memory_budget > 0, "%s: the loss's budget" % name)
    proj.close()


def main():
    rank, world, init, cases = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    for c in cases:
        if c.startswith("fsdp"):
            case_fsdp(c)
        elif c == "meshes":
            case_meshes()
        elif c == "ddp":
            case_ddp()
        elif c == "llama":
            case_llama()
        elif c == "llama_long":  # apply_osftrt(activation_memory="min"): checkpointing under FSDP2
            case_llama("llama_long", activation_memory="min")
        else:
            raise ValueError(c)
    finish(rank, world)


if __name__ == "__main__":
    main()
