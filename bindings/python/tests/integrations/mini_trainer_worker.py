"""One rank of test_mini_trainer.py's distributed decomposition (gloo):
    python mini_trainer_worker.py RANK WORLD INIT_FILE OUT_DIR
Every rank builds the same tiny Llama, osftrt.integrations.mini_trainer.
decompose() splits the SVDs over the ranks (each rank decomposes its share,
the factors are broadcast from their owner), and rank 0 saves the factors
and how many SVDs each rank ran for the test to compare with one process."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from worker_exit import finish  # noqa: E402

rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)

import osftrt.integrations.mini_trainer as mt  # noqa: E402
from test_mini_trainer import tiny_llama  # noqa: E402

svds = []
real_svd = torch.linalg.svd


def counting_svd(*a, **k):
    svds.append(1)
    return real_svd(*a, **k)


torch.linalg.svd = counting_svd
model = tiny_llama(seed=3)
layers = mt.decompose(model, 0.37)
torch.linalg.svd = real_svd
counts = [None] * world
dist.all_gather_object(counts, len(svds))
if rank == 0:
    torch.save({"factors": {qn: {k: getattr(m, k).detach().clone() for k in mt.MINI_TRAINER_KEYS}
                            for qn, m in layers.items()}, "svds": counts}, os.path.join(out, "dist.pt"))
finish(rank, world)
