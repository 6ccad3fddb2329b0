"""OSFTProjector and vocab-parallel cross-entropy over torch.distributed
(gloo) with 2 and 3 real processes (see dist_worker.py)."""
import pytest

from conftest import run_ranks


@pytest.mark.parametrize("world", [2, 3])
def test_torch_distributed_gloo(tmp_path, world):
    run_ranks("dist_worker.py", world, tmp_path)
