"""One rank of test_axolotl.py's FSDP2 case (gloo):
    python axolotl_fsdp2_worker.py RANK WORLD INIT_FILE
OsftrtPlugin's FSDP2 path, driven through its own hooks the way axolotl and
accelerate run them with fsdp_version 2 and cpu_ram_efficient_loading: rank
0 holds the loaded weights, the other ranks build the model on the meta
device; post_model_build converts the OSFT targets (meta layers of the same
shapes and frozen ranks where the weights are meta) and prepares them for
sharding; fully_shard per decoder layer and root; rank 0's full state dict
broadcast into the shards (accelerate's fsdp2_load_full_state_dict); the
plugin's callback attaches the shard-aware projector on train begin. Every
rank trains on the same batch, so the losses must equal the same plugin's
single-process run (no FSDP) on every rank, and the projection keeps
orthogonality <= 1e-5."""
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from worker_exit import finish  # noqa: E402

rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)

import transformers  # noqa: E402
from axolotl.utils.dict import DictDefault  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import fixtures  # noqa: E402
from osftrt.integrations.axolotl import PLUGIN_NAME, OsftrtArgs, OsftrtPlugin  # noqa: E402

STEPS = 4
IDS = torch.randint(4, 64, (4, 32), generator=torch.Generator().manual_seed(5))


def cfg(fsdp):
    c = OsftrtArgs.model_validate({"plugins": [PLUGIN_NAME], "osftrt_osft": True}).model_dump()
    c.update(plugins=[PLUGIN_NAME])
    if fsdp:
        c.update(fsdp_version=2, fsdp_config={"cpu_ram_efficient_loading": True})
    return DictDefault(c)


def train(model, opt):
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# the reference: the plugin without FSDP, one process
ref = fixtures.tiny_llama()
OsftrtPlugin().post_model_build(cfg(False), ref)
want = train(ref, torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-3))

if rank == 0:
    model = fixtures.tiny_llama()
else:
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fixtures.LLAMA))
plugin = OsftrtPlugin()
plugin.post_model_build(cfg(True), model)
full = {k: v.detach().clone() for k, v in model.state_dict().items()} if rank == 0 else {}
buffers = {k: b.detach().clone() for k, b in model.named_buffers()} if rank == 0 else None
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
if rank != 0:
    model.to_empty(device="cpu")
set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
box = [buffers]
dist.broadcast_object_list(box, src=0)  # the non-persistent buffers (rotary tables), as accelerate restores them
for name, b in model.named_buffers():
    if name in box[0] and not hasattr(b, "placements"):
        b.copy_(box[0][name])
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
callbacks = plugin.add_callbacks_pre_trainer(cfg(True), model)
assert len(callbacks) == 1, callbacks
callbacks[0].on_train_begin(None, None, None, model=model, optimizer=opt)
got = train(model, opt)
err = max(abs(a - b) / abs(a) for a, b in zip(want, got))
u, v = callbacks[0].projector.orthogonality()
print("rank %d: losses %s vs one process %s, max rel %.2e, orthogonality %.1e %.1e" % (rank, got, want, err, u, v),
      flush=True)
assert err <= 1e-5, (got, want)
assert u <= 1e-5 and v <= 1e-5, (u, v)
assert got[-1] < got[0]
finish(rank, world)
