"""One rank of the FSDP2 checkpoint test (test_fsdp2.py, issue 52):
    python fsdp2_checkpoint_worker.py RANK WORLD_SIZE INIT_FILE FOLDER
A tiny Llama patched by ``apply_osftrt(osft=True, projector=False)``,
``prepare_fsdp2``, ``fully_shard`` per decoder layer and the root, the
shard-aware projector attached, trains STEPS steps and saves a sharded
checkpoint with ``torch.distributed.checkpoint`` (model and optimizer, via
``get_model_state_dict`` / ``get_optimizer_state_dict``), then trains
RESUME more steps. Another model built the same way from other random
weights (other frozen subspaces) loads the checkpoint and trains the same
RESUME steps: its losses must equal the uninterrupted run's (<= 1e-6
relative) and orthogonality stay <= 1e-5. Then the plain readers: the full
state dict (``full_state_dict=True``) loaded into a plain
``LlamaForCausalLM``, and the sharded folder converted with
``dcp_to_torch_save`` and loaded the same way, give the patched model's
logits. Prints "rank R/W: OK"."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

import osftrt.transformers as otf
from fsdp2_worker import check, cpu_mesh, log
from osftrt.torch.distributed import prepare_fsdp2, shard_aware_projector
from osftrt.torch.linear_state import FACTORS
from worker_exit import finish

STEPS, RESUME, VOCAB = 3, 20, 50


def config():
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32,
                                   tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return cfg


def build(seed):
    import transformers
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config()).float()
    otf.apply_osftrt(model, osft=True, rank_ratio=0.5, projector=False, osft_factors=None)
    prepare_fsdp2(model)
    for layer in model.model.layers:
        fully_shard(layer, mesh=cpu_mesh())
    fully_shard(model, mesh=cpu_mesh())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    proj = shard_aware_projector(model).attach(opt)
    return model, opt, proj


def batch(step):
    """This rank's rows of step `step`."""
    g = torch.Generator().manual_seed(300 + 7 * step + dist.get_rank())
    return torch.randint(0, VOCAB, (3, 8), generator=g)


def train(model, opt, steps):
    losses = []
    for s in steps:
        ids = batch(s)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def plain_logits(state_dict, ids, what):
    """A plain LlamaForCausalLM (no osftrt class, no OSFT layer) given the
    dense weights of `state_dict`; the factors are the only keys it ignores."""
    import transformers

    plain = transformers.LlamaForCausalLM(config()).float()
    result = plain.load_state_dict(state_dict, strict=False)
    check(not result.missing_keys, "%s: plain model missing %s" % (what, result.missing_keys))
    odd = [k for k in result.unexpected_keys if k.rsplit(".", 1)[-1] not in FACTORS]
    check(not odd and result.unexpected_keys, "%s: unexpected keys %s" % (what, odd or "none"))
    return logits(plain, ids)


def main():
    rank, world, init, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    probe = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(9))

    model, opt, proj = build(0)
    train(model, opt, range(STEPS))
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=os.path.join(folder, "dcp"))
    at_save = logits(model, probe)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    uninterrupted = train(model, opt, range(STEPS, STEPS + RESUME))
    proj.close()

    other, opt2, proj2 = build(1)  # other weights, other subspaces: all that counts must come from the folder
    state = {"model": get_model_state_dict(other), "optim": get_optimizer_state_dict(other, opt2)}
    dcp.load(state, checkpoint_id=os.path.join(folder, "dcp"))
    set_model_state_dict(other, state["model"])
    set_optimizer_state_dict(other, opt2, state["optim"])
    err = (logits(other, probe) - at_save).abs().max().item()
    check(err <= 1e-6, "loaded model's logits off by %.3e" % err)
    resumed = train(other, opt2, range(STEPS, STEPS + RESUME))
    rel = max(abs(a - b) / abs(b) for a, b in zip(resumed, uninterrupted))
    check(rel <= 1e-6, "resumed losses off by %.3e (relative)\n%s\n%s" % (rel, resumed, uninterrupted))
    mu, mv = proj2.orthogonality()
    check(mu <= 1e-5 and mv <= 1e-5, "orthogonality %.3e %.3e" % (mu, mv))
    proj2.close()

    # the plain readers (on rank 0, which alone holds the full state dict with
    # cpu_offload): a full state dict, and the sharded folder as one file
    dist.barrier()
    err_full = 0.0
    if rank == 0:
        err_full = (plain_logits(full, probe, "full state dict") - at_save).abs().max().item()
        check(err_full <= 1e-5 * at_save.abs().max().item(), "full state dict: logits off by %.3e" % err_full)
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        one = os.path.join(folder, "consolidated.pt")
        dcp_to_torch_save(os.path.join(folder, "dcp"), one)
        sd = torch.load(one, weights_only=False)["model"]
        err_one = (plain_logits(sd, probe, "dcp_to_torch_save") - at_save).abs().max().item()
        check(err_one <= 1e-5 * at_save.abs().max().item(), "dcp_to_torch_save: logits off by %.3e" % err_one)
    log("dcp: resumed %d steps, losses within %.1e (relative), orthogonality %.1e %.1e; plain readers' logits "
        "within %.1e" % (RESUME, rel, mu, mv, err_full))
    finish(rank, world)


if __name__ == "__main__":
    main()
