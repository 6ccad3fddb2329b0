"""OSFTProjector and vocab-parallel cross-entropy over torch.distributed
(gloo) with 2 and 3 real processes (see dist_worker.py)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("world", [2, 3])
def test_torch_distributed_gloo(tmp_path, world):
    init = str(tmp_path / "init")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), str(r), str(world), init],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(world)
    ]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    for r, (rc, out) in enumerate(outs):
        assert rc == 0, "rank %d failed (exit %d):\n%s" % (r, rc, out)
        assert "rank %d/%d: OK" % (r, world) in out
