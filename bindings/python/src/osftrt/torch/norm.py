"""RMSNorm that keeps only its input and one float per row for the backward,
and works over chunks of rows, so that no full-size temporary exists.

Hugging Face's RMSNorm is a chain of elementwise ops: autograd keeps the
normalized rows (x times 1/rms) beside the input, and its backward makes two
or three temporaries the size of the input. In a checkpointed layer that is
about three of the eleven or so rows of hidden size each token holds at the
peak of a step (bench/results/long_context_cpu.md). Here the forward keeps x
(which its producer keeps anyway: the layer input or the residual sum) and
1/rms; the backward recomputes the normalized rows chunk by chunk.

Two forms cover the supported families (``weight_first``):

* Llama, Mistral, Qwen2, Qwen3: ``weight * (x * r).to(x.dtype)``;
* Gemma 2 (``offset=1``, ``weight_first=False``) and OLMo 2
  (``weight_first=False``): ``((x * r) * (offset + weight)).to(x.dtype)``,
  the product in fp32,

with ``r = rsqrt(mean(x^2) + eps)`` in fp32. Outputs equal the module's
bit for bit (the same ops on each row); gradients agree to rounding (the
weight's gradient is summed in fp32 over chunks)."""
from __future__ import annotations

import torch

# Rows per chunk: enough for full-speed elementwise kernels, and at most
# 16 chunks so that a GPU sees few launches at long sequences.
MIN_CHUNK_ROWS = 1024
MAX_CHUNKS = 16


def _chunk_rows(rows):
    return max(MIN_CHUNK_ROWS, -(-rows // MAX_CHUNKS))


def _normed(x, r):
    return x.float() * r


def _scale_into(out, xhat, weight, offset, weight_first, dtype):
    """out = the module's output rows from the normalized rows (fp32), in
    the module's order of operations and roundings."""
    if weight_first:  # weight * xhat.to(dtype), in the promoted dtype
        torch.mul(weight + offset if offset else weight, xhat.to(dtype), out=out)
    elif out.dtype == torch.float32:
        torch.mul(xhat, weight.float() + offset, out=out)
    else:  # (xhat * (offset + weight)) in fp32, then rounded
        out.copy_(xhat * (weight.float() + offset))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, weight_first):
        rows = x.reshape(-1, x.shape[-1])
        step = _chunk_rows(rows.shape[0])
        r = torch.empty(rows.shape[0], 1, dtype=torch.float32, device=x.device)
        dtype = torch.promote_types(weight.dtype, x.dtype) if weight_first else x.dtype  # the module's output
        y = torch.empty(rows.shape[0], rows.shape[1], dtype=dtype, device=x.device)
        widened = x.dtype != torch.float32  # then each chunk's fp32 copy is ours to scale in place
        for lo in range(0, rows.shape[0], step):
            xc = rows[lo:lo + step].float()
            rc = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
            xhat = xc.mul_(rc) if widened else xc * rc
            _scale_into(y[lo:lo + step], xhat, weight, offset, weight_first, x.dtype)
            r[lo:lo + step] = rc
            del xc, xhat
        ctx.save_for_backward(x, weight, r)
        ctx.offset, ctx.weight_first = offset, weight_first
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, gy):
        x, weight, r = ctx.saved_tensors
        rows, g = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
        step = _chunk_rows(rows.shape[0])
        scale = (weight.float() + ctx.offset) if ctx.offset else weight.float()
        gx = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        # per chunk, three temporaries: xhat, gc * xhat (the weight's gradient
        # terms, and times the scale the row dots as one GEMV), gc * scale
        # (then gx in place)
        for lo in range(0, rows.shape[0], step):
            rc, gc = r[lo:lo + step], g[lo:lo + step].float()
            xhat = _normed(rows[lo:lo + step], rc)
            prod = gc * xhat
            if gw is not None:  # the module's weight sees the (rounded, in Llama's form) normalized rows
                rounded = ctx.weight_first and x.dtype != torch.float32
                gw += (gc * xhat.to(x.dtype).float()).sum(0) if rounded else prod.sum(0)
            if gx is not None:
                dot = torch.mv(prod, scale).div_(xhat.shape[-1]).unsqueeze(-1)  # mean(gc * scale * xhat)
                del prod
                gxhat = gc * scale
                gxhat.sub_(xhat.mul_(dot)).mul_(rc)
                gx[lo:lo + step] = gxhat
        gx = gx.reshape(x.shape) if gx is not None else None
        return gx, (gw.to(weight.dtype) if gw is not None else None), None, None, None


def rms_norm(x, weight, eps, *, offset=0.0, weight_first=True):
    """RMSNorm over the last dimension of x (see the module doc for the two
    forms); its backward keeps x and one float per row, nothing else."""
    return _RMSNorm.apply(x, weight, float(eps), float(offset), bool(weight_first))
