"""Hugging Face checkpoints <-> our model files (docs/formats.md, GPTM), with numpy only: no torch, no
transformers, no hub. The one copy of the mapping between transformers' tensor names and our 17
parameter tensors (docs/design.md), used in both directions: scripts/import_hf.py and
scripts/export_hf.py call it, and so does scripts/train_gpt2.py's from_hf (which takes a
transformers model object).

A Hugging Face directory is config.json + model.safetensors (or shards listed in
model.safetensors.index.json). Safetensors are read and written here by hand (an 8-byte header
length, a JSON header, the raw little-endian tensors), since numpy has no bfloat16.

Supported (anything else is refused with an error naming the config key):
  GPT2LMHeadModel (model_type gpt2)  <-> our GPT-2: LayerNorm eps 1e-5, learned positions, tanh GELU
      (gelu_new / gelu_pytorch_tanh), n_inner = our mlp_hidden, biases, multi-head, full causal attention; a tied
      or untied lm_head (tie_word_embeddings). Conv1D weights are stored (in, out): transposed.
  LlamaForCausalLM (model_type llama) <-> our Llama: RMSNorm, RoPE (rotate_half, the same pairing as
      ours: no permutation), SwiGLU (fcw = [gate_proj; up_proj]), grouped-query attention, no biases,
      tied or untied head; rope_theta, rms_norm_eps, intermediate_size, num_key_value_heads; RoPE
      scaling of rope_type "llama3" (Llama 3.1 / 3.2: factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings, in rope_scaling or transformers 5's rope_parameters), exported
      back as rope_scaling.
  MistralForCausalLM (model_type mistral): a Llama whose sliding_window W is ours (both attend to
      positions t-W+1..t); our Llama with a window exports as Mistral.
  Qwen2ForCausalLM (model_type qwen2) <-> our Llama with qkv_bias = 1 and biases = 0: q/k/v biases and
      none on attproj, fc, fcproj, so an imported Qwen2 trains only its own biases and exports back.
  Our Llama with biases = 1 (attproj, fc, fcproj; an old file's biases = 1 is all four) exports only
      while those three biases are zero, without them (no Llama-family class has them), as the class
      its other knobs pick: qkv_bias = 1 Qwen2 (no window), a window Mistral, else Llama.
Refused: rope scaling other than llama3 (rope_type linear, dynamic, yarn, longrope, ...), partial_rotary_factor
other than 1 (top level, rope_scaling or rope_parameters, any rope_type), head_dim != hidden_size /
num_attention_heads, hidden_act other than silu, attention_bias / mlp_bias on Llama (q/k/v/o and
gate/up/down biases: neither is one of our bias sets), per-layer sliding windows (Qwen2's
use_sliding_window, layer_types), and GPT-2 variants (cross-attention, other activations, eps).
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmc_formats as fmt  # noqa: E402


class HFError(ValueError):
    """A config or checkpoint this mapping cannot convert exactly; the message names the file and key."""


# ---------------------------------------------------------------- the mapping table
# Per-layer tensors: ours -> (the transformers names under the layer prefix whose rows are stacked,
# in order, into ours; True where transformers stores the matrix (in, out)). A tensor the config
# lacks (a bias of a bias-free model) is skipped in both directions.
GPT2_LAYER = {
    "ln1w": (["ln_1.weight"], False), "ln1b": (["ln_1.bias"], False),
    "qkvw": (["attn.c_attn.weight"], True), "qkvb": (["attn.c_attn.bias"], False),
    "attprojw": (["attn.c_proj.weight"], True), "attprojb": (["attn.c_proj.bias"], False),
    "ln2w": (["ln_2.weight"], False), "ln2b": (["ln_2.bias"], False),
    "fcw": (["mlp.c_fc.weight"], True), "fcb": (["mlp.c_fc.bias"], False),
    "fcprojw": (["mlp.c_proj.weight"], True), "fcprojb": (["mlp.c_proj.bias"], False),
}
LLAMA_LAYER = {
    "ln1w": (["input_layernorm.weight"], False),
    # our qkvw rows: all query heads, then the key heads, then the value heads = [q; k; v]
    "qkvw": (["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], False),
    "qkvb": (["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"], False),  # Qwen2
    "attprojw": (["self_attn.o_proj.weight"], False),
    "ln2w": (["post_attention_layernorm.weight"], False),
    "fcw": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], False),  # SwiGLU rows [gate | up]
    "fcprojw": (["mlp.down_proj.weight"], False),
}
# Whole-model tensors: ours -> transformers name (wte and lm_head hold vocab_size rows there, our
# padded_vocab_size rows here; the padding rows are zero).
GPT2_GLOBAL = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight", "lnfw": "transformer.ln_f.weight",
               "lnfb": "transformer.ln_f.bias", "lm_head": "lm_head.weight"}
LLAMA_GLOBAL = {"wte": "model.embed_tokens.weight", "lnfw": "model.norm.weight", "lm_head": "lm_head.weight"}
GPT2_LAYER_PREFIX, LLAMA_LAYER_PREFIX = "transformer.h.{}.", "model.layers.{}."
# The biases of our biases knob, which no Llama-family class has: an export needs them zero and drops them
LLAMA_ABSENT_BIASES = ("attprojb", "fcb", "fcprojb")
# buffers some checkpoints carry that are no parameters (GPT-2's causal masks, old Llamas' RoPE table)
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
LLAMA_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def is_gpt2(cfg):
    return cfg["mlp"] == fmt.MLP_GELU


def layer_table(cfg):
    return (GPT2_LAYER, GPT2_LAYER_PREFIX) if is_gpt2(cfg) else (LLAMA_LAYER, LLAMA_LAYER_PREFIX)


def part_rows(cfg, ours):
    """Rows of each transformers tensor stacked into our per-layer tensor `ours` (the split sizes)."""
    C, NH, NKV, H = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"], cfg["mlp_hidden"]
    kv = NKV * (C // NH)
    if not is_gpt2(cfg) and ours in ("qkvw", "qkvb"):
        return [C, kv, kv]
    if not is_gpt2(cfg) and ours == "fcw":
        return [H, H]
    return None  # one tensor


def hf_tensors_from_params(cfg, params):
    """transformers' tensors (name -> fp32 numpy array) of our parameters (name -> array, fmt.split_params).
    A tied head has no lm_head.weight (transformers ties it to the embedding when loading)."""
    cfg = fmt.full_config(cfg)
    V = cfg["vocab_size"]
    table, prefix = layer_table(cfg)
    glob = GPT2_GLOBAL if is_gpt2(cfg) else LLAMA_GLOBAL
    out = {}
    for ours, name in glob.items():
        x = params[ours]
        if x.size == 0:
            continue
        out[name] = x[:V] if ours in ("wte", "lm_head") else x
    for ours, (names, transposed) in table.items():
        x = params[ours]
        if x.size == 0:
            continue
        for l in range(cfg["num_layers"]):
            parts = np.split(x[l], np.cumsum(part_rows(cfg, ours))[:-1]) if part_rows(cfg, ours) else [x[l]]
            for name, part in zip(names, parts):
                out[prefix.format(l) + name] = part.T if transposed else part
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def params_from_hf_tensors(cfg, tensors, what):
    """Our flat fp32 parameter vector (layout order) from transformers' tensors (name -> array).
    Every tensor the config needs must be there with its shape; a tensor left over (one this mapping
    does not place, e.g. a bias our config lacks) is an error, so nothing is silently dropped."""
    cfg = fmt.full_config(cfg)
    V = cfg["vocab_size"]
    table, prefix = layer_table(cfg)
    glob = GPT2_GLOBAL if is_gpt2(cfg) else LLAMA_GLOBAL
    used = set()

    def take(name, shape):
        if name not in tensors:
            raise HFError(f"{what}: tensor {name} is missing")
        x = np.asarray(tensors[name], dtype=np.float32)
        if tuple(x.shape) != tuple(shape):
            raise HFError(f"{what}: tensor {name} has shape {tuple(x.shape)}, the config implies {tuple(shape)}")
        bad, first = fmt.count_nonfinite(x)
        if bad:
            raise HFError(f"{what}: tensor {name} holds {bad} values that are not finite (NaN or inf), the first "
                          f"at flat index {first}")
        used.add(name)
        return x

    flat = np.zeros(fmt.num_params(cfg), dtype=np.float32)
    P = fmt.split_params(cfg, flat)  # views into flat
    for ours, name in glob.items():
        if P[ours].size == 0:
            continue
        if ours in ("wte", "lm_head"):
            P[ours][:V] = take(name, (V, cfg["channels"]))
        else:
            P[ours][...] = take(name, P[ours].shape)
    for ours, (names, transposed) in table.items():
        if P[ours].size == 0:
            continue
        rows = part_rows(cfg, ours) or [P[ours].shape[1]]
        for l in range(cfg["num_layers"]):
            parts = []
            for name, n in zip(names, rows):
                shape = (n,) + P[ours].shape[2:]
                parts.append(take(prefix.format(l) + name, shape[::-1] if transposed else shape))
            P[ours][l] = np.concatenate([p.T if transposed else p for p in parts])
    if cfg["tied_head"] and "lm_head.weight" in tensors:  # a tied head saved anyway: must be the embedding
        if not np.array_equal(np.asarray(tensors["lm_head.weight"], dtype=np.float32), P["wte"][:V]):
            raise HFError(f"{what}: lm_head.weight differs from the embedding, but tie_word_embeddings is true")
        used.add("lm_head.weight")
    left = sorted(k for k in tensors if k not in used and not k.endswith(IGNORED_SUFFIXES))
    if left:
        raise HFError(f"{what}: {len(left)} tensors this mapping does not place, e.g. {left[0]} "
                      "(a feature our model lacks)")
    return flat


# ---------------------------------------------------------------- configs
def _get(hc, key, default=None):
    v = hc.get(key, default)
    return default if v is None else v


# The keys of a llama3 rope_scaling / rope_parameters dict: the four parameters (each required) and
# the ones that say nothing more (the type, and theta where transformers 5 keeps it)
LLAMA3_ROPE_KEYS = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
                    "high_freq_factor": "rope_high_freq_factor",
                    "original_max_position_embeddings": "rope_original_max_pos"}
ROPE_NEUTRAL_KEYS = {"rope_type", "type", "rope_theta"}


def rope_from_hf(hc, what):
    """(rope_theta, our RoPE scaling keys) of a Llama-family config (transformers 4: rope_theta +
    rope_scaling; 5: rope_parameters). Only rope_type default and llama3 are computed exactly."""
    key = "rope_parameters" if hc.get("rope_parameters") else "rope_scaling"
    rope = hc.get(key) or {}
    if not isinstance(rope, dict):
        raise HFError(f"{what}: {key} = {rope!r} is not a dict")
    kind = rope.get("rope_type", rope.get("type", "default"))
    for where, d in ((key, rope), ("config", hc)):  # transformers moves a top-level one into rope_parameters
        if _get(d, "partial_rotary_factor", 1.0) != 1.0:
            raise HFError(f"{what}: {where} partial_rotary_factor = {d['partial_rotary_factor']!r} is not supported "
                          "(RoPE on every channel only)")
    theta = rope.get("rope_theta") or _get(hc, "rope_theta", 10000.0)
    if not is_number(theta):
        raise HFError(f"{what}: {key} rope_theta = {theta!r} is not a finite number")
    theta = float(theta)
    if kind == "default":
        return theta, fmt.no_rope_scaling()
    if kind != "llama3":
        raise HFError(f"{what}: {key} rope_type {kind!r} is not supported (only the default RoPE and llama3)")
    other = sorted(k for k in rope if k not in LLAMA3_ROPE_KEYS and k not in ROPE_NEUTRAL_KEYS
                   and k != "partial_rotary_factor")
    if other:
        raise HFError(f"{what}: {key} key {other[0]!r} is not part of the llama3 scaling (factor, low_freq_factor, "
                      "high_freq_factor, original_max_position_embeddings)")
    for k in LLAMA3_ROPE_KEYS:
        v = rope.get(k)
        if v is None:
            raise HFError(f"{what}: {key} rope_type 'llama3' needs {k!r}, which is missing")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise HFError(f"{what}: {key} {k} = {v!r} is not a number")
    factor, low, high = (float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = rope["original_max_position_embeddings"]
    checks = [("factor", 1.0 <= factor <= 1e6, "must be in [1, 1e6]"),
              ("low_freq_factor", 0.0 < low <= 1e6, "must be in (0, 1e6]"),
              ("high_freq_factor", low < high <= 1e6, f"must be greater than low_freq_factor {low:g} (and <= 1e6)"),
              ("original_max_position_embeddings", float(original).is_integer() and 1 <= original <= 1 << 24,
               "must be a whole number in [1, 2^24]")]
    for k, ok, need in checks:
        if not ok:
            raise HFError(f"{what}: {key} {k} = {rope[k]!r} {need}")
    return theta, dict(rope_scaling=fmt.ROPE_SCALING_LLAMA3, rope_factor=factor, rope_low_freq_factor=low,
                       rope_high_freq_factor=high, rope_original_max_pos=int(original))


def hf_rope_scaling(cfg, what):
    """config.json's rope_scaling for our config: None, or llama3's dict in the form the hub's Llama 3.1 /
    3.2 configs have it (transformers 4 and 5 both read it, 5 beside a top-level rope_theta)."""
    cfg = fmt.full_config(cfg)
    if cfg["rope_scaling"] == fmt.ROPE_SCALING_NONE:
        return None
    if cfg["rope_scaling"] != fmt.ROPE_SCALING_LLAMA3:
        raise HFError(f"{what}: rope_scaling {cfg['rope_scaling']} is not 0 (none) or 1 (llama3)")
    return dict(rope_type="llama3", factor=cfg["rope_factor"], low_freq_factor=cfg["rope_low_freq_factor"],
                high_freq_factor=cfg["rope_high_freq_factor"],
                original_max_position_embeddings=int(cfg["rope_original_max_pos"]))


# The config.json keys read here, by the JSON type each must have when present and not null
INT_KEYS = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "hidden_size",
            "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers", "intermediate_size",
            "max_position_embeddings", "sliding_window")
NUMBER_KEYS = ("layer_norm_epsilon", "rms_norm_eps", "rope_theta")
BOOL_KEYS = ("tie_word_embeddings", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention",
             "attention_bias", "mlp_bias", "use_sliding_window")
STRING_KEYS = ("model_type", "activation_function", "hidden_act")


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_types(hc, what):
    """Refuses a config.json key of the wrong JSON type (a size given as a string, a flag as a number)."""
    for key in INT_KEYS:
        v = hc.get(key)
        low = 0 if key == "sliding_window" else 1  # Mistral's sliding_window 0 means none
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and low <= v < 1 << 31):
            raise HFError(f"{what}: {key} = {v!r} is not an integer in [{low}, 2^31)")
    for keys, ok, need in ((NUMBER_KEYS, is_number, "a finite number"), (BOOL_KEYS, lambda v: isinstance(v, bool),
                           "true or false"), (STRING_KEYS, lambda v: isinstance(v, str), "a string")):
        for key in keys:
            if hc.get(key) is not None and not ok(hc[key]):
                raise HFError(f"{what}: {key} = {hc[key]!r} is not {need}")
    layer_types = hc.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        raise HFError(f"{what}: layer_types = {layer_types!r} is not a list of strings")


def check_shape(cfg, what):
    """The checks of llmc/model_config.h gpt2_validate_config that a config.json could fail."""
    C, NH, NKV = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"]
    limits = dict(num_layers=1024, num_heads=1 << 20, num_kv_heads=1 << 20, channels=65536, max_seq_len=1 << 20,
                  vocab_size=1 << 20, mlp_hidden=1 << 20)
    for key, most in limits.items():
        if not isinstance(cfg[key], int) or not 1 <= cfg[key] <= most:
            raise HFError(f"{what}: {key} {cfg[key]!r} must be an integer in [1, {most}]")
    if C % NH or NH % NKV:
        raise HFError(f"{what}: hidden size {C}, {NH} heads and {NKV} key/value heads: the heads must divide the "
                      "hidden size and the key/value heads the heads")
    if cfg["position"] == fmt.POS_ROPE and (C // NH) % 2:
        raise HFError(f"{what}: RoPE needs an even head dim, this one is {C // NH}")
    if cfg["position"] == fmt.POS_ROPE and not 1.0 < cfg["rope_theta"] < 1e12:
        raise HFError(f"{what}: RoPE needs theta in (1, 1e12), this one is {cfg['rope_theta']!r}")
    if cfg["norm"] == fmt.NORM_RMSNORM and not 0.0 < cfg["norm_eps"] < 1.0:
        raise HFError(f"{what}: rms_norm_eps {cfg['norm_eps']!r} must be in (0, 1)")
    return cfg


def config_from_hf(hc, what):
    """Our config (fmt keys) from a transformers config.json dict; refuses what we cannot express exactly."""
    try:
        return check_shape(_config_from_hf(hc, what), what)
    except KeyError as e:
        raise HFError(f"{what}: no {e.args[0]!r}, a key this model_type needs")


def _config_from_hf(hc, what):
    check_types(hc, what)
    # null is the key's default, so a required key given as null is missing; Mistral's sliding_window
    # null means no window (an absent one means its default 4096)
    hc = {k: v for k, v in hc.items() if v is not None or k == "sliding_window"}
    mt = hc.get("model_type")
    V = hc["vocab_size"]
    if mt == "gpt2":
        C, NH = hc["n_embd"], hc["n_head"]
        act = _get(hc, "activation_function", "gelu_new")
        checks = [("activation_function", act in ("gelu_new", "gelu_pytorch_tanh"),
                   "must be gelu_new (tanh GELU)"),
                  ("layer_norm_epsilon", abs(_get(hc, "layer_norm_epsilon", 1e-5) - 1e-5) < 1e-12, "must be 1e-5"),
                  ("scale_attn_weights", _get(hc, "scale_attn_weights", True), "must be true"),
                  ("scale_attn_by_inverse_layer_idx", not _get(hc, "scale_attn_by_inverse_layer_idx", False),
                   "must be false"),
                  ("add_cross_attention", not _get(hc, "add_cross_attention", False), "must be false")]
        for key, ok, need in checks:
            if not ok:
                raise HFError(f"{what}: {key} = {hc.get(key)!r} is not supported ({need})")
        cfg = dict(max_seq_len=hc["n_positions"], vocab_size=V, padded_vocab_size=fmt.pad_vocab(V),
                   num_layers=hc["n_layer"], num_heads=NH, num_kv_heads=NH, channels=C, window=0)
        cfg.update(mlp_hidden=int(_get(hc, "n_inner", 4 * C)), tied_head=int(_get(hc, "tie_word_embeddings", True)))
        return fmt.full_config(cfg)
    if mt not in LLAMA_TYPES:
        raise HFError(f"{what}: model_type {mt!r} is not supported (gpt2, llama, mistral, qwen2)")
    C, NH = hc["hidden_size"], hc["num_attention_heads"]
    NKV = _get(hc, "num_key_value_heads", NH)
    if _get(hc, "hidden_act", "silu") != "silu":
        raise HFError(f"{what}: hidden_act = {hc['hidden_act']!r} is not supported (only silu: SwiGLU)")
    if _get(hc, "head_dim", C // NH) != C // NH:
        raise HFError(f"{what}: head_dim = {hc['head_dim']} != hidden_size / num_attention_heads = {C // NH}")
    for key in ("attention_bias", "mlp_bias"):
        if _get(hc, key, False):
            raise HFError(f"{what}: {key} = true is not supported (our bias knobs: qkv_bias for q/k/v, biases for "
                          "attproj, fc and fcproj together)")
    window = 0
    if mt == "mistral" and hc.get("sliding_window", 4096):  # MistralConfig's default is 4096, null = none
        window = int(hc.get("sliding_window", 4096))
        if window >= hc["max_position_embeddings"]:
            window = 0  # no position sees past it: plain causal
    if mt == "qwen2" and (_get(hc, "use_sliding_window", False)
                          or any(t != "full_attention" for t in _get(hc, "layer_types", []))):
        raise HFError(f"{what}: use_sliding_window / layer_types: per-layer sliding windows are not supported")
    theta, scaling = rope_from_hf(hc, what)
    cfg = dict(max_seq_len=hc["max_position_embeddings"], vocab_size=V, padded_vocab_size=fmt.pad_vocab(V),
               num_layers=hc["num_hidden_layers"], num_heads=NH, num_kv_heads=NKV, channels=C, window=window,
               architecture=fmt.ARCH_LLAMA, norm=fmt.NORM_RMSNORM, norm_eps=float(_get(hc, "rms_norm_eps", 1e-6)),
               position=fmt.POS_ROPE, rope_theta=theta, mlp=fmt.MLP_SWIGLU, mlp_hidden=hc["intermediate_size"],
               qkv_bias=int(mt == "qwen2"), biases=0,
               tied_head=int(_get(hc, "tie_word_embeddings", False)), **scaling)  # (their default)
    return cfg


def hf_config_from(cfg, params, what, bos_id=None, eos_id=None, dtype="float32"):
    """(config.json dict, model_type) for our config; refuses a model no transformers class computes
    exactly, naming the knob. `params`: the split parameters (a Llama's attproj/fc/fcproj biases, where it
    has them, must be zero)."""
    cfg = fmt.full_config(cfg)
    C, NH, NKV, W = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"], cfg["window"]
    gpt2 = dict(norm=fmt.NORM_LAYERNORM, position=fmt.POS_LEARNED, mlp=fmt.MLP_GELU, qkv_bias=1, biases=1)
    llama = dict(norm=fmt.NORM_RMSNORM, position=fmt.POS_ROPE, mlp=fmt.MLP_SWIGLU)
    common = dict(vocab_size=cfg["vocab_size"], bos_token_id=bos_id, eos_token_id=eos_id,
                  tie_word_embeddings=bool(cfg["tied_head"]), torch_dtype=dtype, use_cache=True)
    if cfg["mlp"] == fmt.MLP_GELU:
        for k, v in gpt2.items():
            if cfg[k] != v:
                raise HFError(f"{what}: a GELU model with {k} = {cfg[k]} is neither GPT-2 (LayerNorm, learned "
                              "positions, biases) nor Llama: no transformers class computes it")
        if NKV != NH:
            raise HFError(f"{what}: num_kv_heads {NKV} != num_heads {NH}: transformers' GPT-2 has no "
                          "grouped-query attention")
        if W:
            raise HFError(f"{what}: attention window {W}: transformers' GPT-2 has no sliding window")
        hc = dict(common, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_positions=cfg["max_seq_len"],
                  n_embd=C, n_layer=cfg["num_layers"], n_head=NH, n_inner=cfg["mlp_hidden"],
                  activation_function="gelu_new",
                  layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
        return hc, "gpt2"
    for k, v in llama.items():
        if cfg[k] != v:
            raise HFError(f"{what}: a SwiGLU model with {k} = {cfg[k]} is not a Llama (RMSNorm, RoPE): "
                          "no transformers class computes it")
    nonzero = [b for b in LLAMA_ABSENT_BIASES if cfg["biases"] and np.any(params[b] != 0)]
    if nonzero:
        raise HFError(f"{what}: biases = 1 with nonzero {nonzero[0]}: transformers' Llama has no biases and "
                      "Qwen2 has only the q/k/v ones")
    if cfg["qkv_bias"] and W:
        raise HFError(f"{what}: q/k/v biases (Qwen2) with an attention window {W}: no transformers class has both")
    mt = "qwen2" if cfg["qkv_bias"] else "mistral" if W else "llama"  # Mistral's sliding_window W: t sees t-W+1..t
    hc = dict(common, architectures=[LLAMA_TYPES[mt]], model_type=mt, hidden_size=C,
              intermediate_size=cfg["mlp_hidden"], num_hidden_layers=cfg["num_layers"], num_attention_heads=NH,
              num_key_value_heads=NKV, head_dim=C // NH, hidden_act="silu",
              max_position_embeddings=cfg["max_seq_len"], rms_norm_eps=cfg["norm_eps"], rope_theta=cfg["rope_theta"],
              rope_scaling=hf_rope_scaling(cfg, what), attention_dropout=0.0)
    if mt == "llama":
        hc.update(attention_bias=False, mlp_bias=False)
    if mt == "mistral":
        hc.update(sliding_window=W)
    if mt == "qwen2":
        hc.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg["num_layers"])
    return hc, mt


# ---------------------------------------------------------------- safetensors, by hand
ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}


def read_safetensors(path):
    """name -> fp32 numpy array (F32, F16, F64 or BF16 tensors; BF16 widened exactly)."""
    path = str(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise HFError(f"{path}: not a safetensors file (header length {n}, file {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise HFError(f"{path}: not a safetensors file (bad JSON header: {e})")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    if not isinstance(header, dict):
        raise HFError(f"{path}: not a safetensors file (its JSON header is not an object)")
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if (not isinstance(t, dict) or not isinstance(t.get("dtype"), str) or not isinstance(t.get("shape"), list)
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in t["shape"])
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(k, int) and not isinstance(k, bool) for k in offsets)):
            raise HFError(f"{path}: tensor {name}: its header entry is not {{dtype, shape: [sizes], "
                          "data_offsets: [start, end]}")
        if t["dtype"] not in ST_DTYPES:
            raise HFError(f"{path}: tensor {name} has dtype {t['dtype']}; only F32, F16, BF16, F64 are read")
        start, end = t["data_offsets"]
        dt = np.dtype(ST_DTYPES[t["dtype"]])
        count = int(np.prod(t["shape"], dtype=np.int64))
        if not 0 <= start <= end:
            raise HFError(f"{path}: tensor {name}: data_offsets {start}..{end} are not a range of the data")
        if end - start != count * dt.itemsize:
            raise HFError(f"{path}: tensor {name}: data_offsets {start}..{end} hold {end - start} bytes, but shape "
                          f"{t['shape']} of {t['dtype']} needs {count * dt.itemsize}")
        if end > data.size:
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
                    and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2
                    and isinstance(v["data_offsets"][1], int)]
            need = 8 + n + max(ends + [end])
            raise HFError(f"{path}: truncated: {size} bytes, its header describes {need} (tensor {name}, "
                          f"data_offsets {start}..{end}, ends at byte {8 + n + end})")
        x = data[start:end].view(dt).reshape(t["shape"])
        out[name] = fmt.bf16_bits_to_fp32(x).reshape(t["shape"]) if t["dtype"] == "BF16" else x.astype(np.float32)
    return out


def write_safetensors(path, tensors, dtype="float32"):
    """Writes name -> fp32 array as F32, or as BF16 (round to nearest even), atomically."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, x in tensors.items():
        b = (np.ascontiguousarray(x, dtype="<f4") if dtype == "float32" else fmt.fp32_to_bf16_bits(x)).tobytes()
        header[name] = {"dtype": "F32" if dtype == "float32" else "BF16", "shape": list(x.shape),
                        "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    fmt.atomic_write(str(path), [len(h).to_bytes(8, "little"), h] + chunks)


# ---------------------------------------------------------------- directories
def read_json_object(path):
    """The dict a JSON file holds; anything else (not JSON, not UTF-8, a list) is an HFError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except ValueError as e:  # a JSON or UTF-8 decoding error
        raise HFError(f"{path}: not JSON ({e})")
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(obj), "a number")
        raise HFError(f"{path}: holds {kind}, not a JSON object of keys and values")
    return obj


def read_hf_dir(directory):
    """(config dict, tensors) of a local Hugging Face model directory: config.json and model.safetensors
    or the shards named by model.safetensors.index.json."""
    d = str(directory)
    cpath = os.path.join(d, "config.json")
    if not os.path.isdir(d):
        raise HFError(f"{d}: not a directory (expected a Hugging Face model folder with config.json)")
    if not os.path.isfile(cpath):
        raise HFError(f"{d}: no config.json (expected a Hugging Face model folder)")
    hc = read_json_object(cpath)
    index = os.path.join(d, "model.safetensors.index.json")
    single = os.path.join(d, "model.safetensors")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(n, str) and n for n in weight_map.values()):
            raise HFError(f"{index}: no weight_map object of tensor name -> file name")
        files = [os.path.join(d, n) for n in sorted(set(weight_map.values()))]
    else:
        others = [n for n in os.listdir(d) if n.endswith((".bin", ".pt", ".pth"))]
        raise HFError(f"{d}: no model.safetensors or model.safetensors.index.json"
                      + (f" (found {others[0]}: convert it with transformers' save_pretrained(..., "
                         "safe_serialization=True))" if others else ""))
    tensors = {}
    for p in files:
        if not os.path.isfile(p):
            raise HFError(f"{index}: names {os.path.basename(p)}, which is missing")
        tensors.update(read_safetensors(p))
    if tensors and not any(k.startswith(("transformer.", "model.", "lm_head.")) for k in tensors):
        tensors = {"transformer." + k: v for k, v in tensors.items()}  # GPT-2 hub files: GPT2Model names
    return hc, tensors


def import_hf_dir(directory):
    """(our config, flat fp32 parameters) of a local Hugging Face model directory."""
    hc, tensors = read_hf_dir(directory)
    what = os.path.join(str(directory), "config.json")
    cfg = config_from_hf(hc, what)
    return cfg, params_from_hf_tensors(cfg, tensors, str(directory))


def export_hf_dir(directory, cfg, flat, dtype="float32", bos_id=None, eos_id=None, what="model"):
    """Writes config.json, generation_config.json and model.safetensors of our model to `directory`."""
    params = fmt.split_params(fmt.full_config(cfg), np.asarray(flat, dtype=np.float32))
    hc, mt = hf_config_from(cfg, params, what, bos_id, eos_id, dtype)
    tensors = hf_tensors_from_params(cfg, params)
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors, dtype)
    gen = {"bos_token_id": bos_id, "eos_token_id": eos_id}
    for name, obj in (("config.json", hc), ("generation_config.json", gen)):
        fmt.atomic_write(os.path.join(directory, name), [(json.dumps(obj, indent=2) + "\n").encode()])
    return hc, mt
