"""Writers and readers for the project's file formats (docs/formats.md), the Python twin of
llmc/formats.h. Every file: a 1024-byte header of 128 little-endian int64 (h[0] magic, h[1]
version), then the payload. Writers are atomic (path.tmp, fsync, rename); readers validate magic,
version, sizes and the exact file length and raise FormatError naming the file.
Needs only numpy."""
import os

import numpy as np

HEADER_INTS = 128
HEADER_BYTES = HEADER_INTS * 8
VERSION = 1  # the first version of every format, and the only one of most
# Model files and debug states are at version 4: version 2 adds the model family's knobs, version 3
# RoPE scaling (Llama 3.x's llama3), version 4 a qkv bias apart from the other projections' (Qwen2's).
# Their writers use the oldest version that holds the config (model_version), so files without the newer
# knobs are byte-identical to earlier files and a reader that lacks a knob refuses a file that needs it;
# the readers take all four.
MODEL_VERSION = 4
DEBUG_VERSION = 4
# Token shards are at version 3: version 2 adds uint32 ids (vocabularies over 65,536), version 3 a
# per-token loss mask after the ids. Writers use the oldest version that holds the shard (1: uint16 ids,
# 2: uint32 ids, 3: with a mask), so unmasked shards are byte-identical to earlier files; readers take all three.
SHARD_VERSION = 3


def fourcc(s):
    return int.from_bytes(s.encode("ascii"), "little")


MAGIC_MODEL = fourcc("GPTM")
MAGIC_STATE = fourcc("GPTS")
MAGIC_TOKENIZER = fourcc("GPTT")
MAGIC_SHARD = fourcc("GPTD")
MAGIC_DEBUG = fourcc("GPTX")
MAGIC_EVAL = fourcc("GPTE")
MAGIC_FP8 = fourcc("GPT8")
MAGIC_NAMES = {MAGIC_MODEL: "a model checkpoint", MAGIC_STATE: "a training state file",
               MAGIC_TOKENIZER: "a tokenizer file", MAGIC_SHARD: "a token shard",
               MAGIC_DEBUG: "a debug state file", MAGIC_EVAL: "an eval file",
               MAGIC_FP8: "an FP8 scaling state file"}
DTYPE_FP32, DTYPE_BF16 = 0, 1

PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb", "lm_head"]
# model header slots 3..10 (every version)
CONFIG_KEYS = ["max_seq_len", "vocab_size", "padded_vocab_size", "num_layers", "num_heads",
               "num_kv_heads", "channels", "window"]
# model header slots 12..20 (version 2): the family's knobs, GPT-2's values by default (llmc/model_config.h).
# architecture 0 gpt2 / 1 llama; norm 0 LayerNorm / 1 RMSNorm; position 0 learned / 1 RoPE; mlp 0 GELU / 1 SwiGLU;
# norm_eps and rope_theta are float64 bit patterns; mlp_hidden is H (GPT-2: 4C); biases 1: attproj, fc and
# fcproj have biases
FAMILY_KEYS = ["architecture", "norm", "norm_eps", "position", "rope_theta", "mlp", "mlp_hidden", "biases",
               "tied_head"]
# model header slots 21..25 (version 3): the RoPE scaling (llmc/model_config.h RopeScaling). rope_scaling
# 0 none / 1 llama3; its factors are float64 bit patterns; all 0 without scaling
SCALING_KEYS = ["rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_max_pos"]
# model header slot 26 (version 4): qkv_bias 1: the qkv projection has a bias. Earlier versions, and a
# config without the key, mean qkv_bias = biases (the four projections together).
BIAS_KEYS = ["qkv_bias"]
FLOAT_KEYS = {"norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"}
ARCH_GPT2, ARCH_LLAMA = 0, 1
NORM_LAYERNORM, NORM_RMSNORM = 0, 1
POS_LEARNED, POS_ROPE = 0, 1
MLP_GELU, MLP_SWIGLU = 0, 1
ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3 = 0, 1


class FormatError(ValueError):
    pass


def pad_vocab(v, multiple=128):
    return (v + multiple - 1) // multiple * multiple


def gpt2_defaults(cfg):
    """The family knobs of a plain GPT-2 of cfg's shape (what a version-1 file implies)."""
    return dict(architecture=ARCH_GPT2, norm=NORM_LAYERNORM, norm_eps=1e-5, position=POS_LEARNED, rope_theta=0.0,
                mlp=MLP_GELU, mlp_hidden=4 * cfg["channels"], qkv_bias=1, biases=1, tied_head=1, **no_rope_scaling())


def no_rope_scaling():
    """The scaling keys of a config without RoPE scaling (every model before version 3)."""
    return dict(rope_scaling=ROPE_SCALING_NONE, rope_factor=0.0, rope_low_freq_factor=0.0, rope_high_freq_factor=0.0,
                rope_original_max_pos=0)


def full_config(cfg):
    """cfg with every family knob present (GPT-2's value where cfg has none; qkv_bias: cfg's biases)."""
    return {**gpt2_defaults(cfg), "qkv_bias": cfg.get("biases", 1), **cfg}


def model_version(cfg):
    """1 for a plain GPT-2 config, 4 when qkv_bias differs from biases, 3 with RoPE scaling, else 2 (the
    writers' rule; llmc/formats.h model_version_for)."""
    cfg = full_config(cfg)
    if all(cfg[k] == v for k, v in gpt2_defaults(cfg).items()):
        return VERSION
    if cfg["qkv_bias"] != cfg["biases"]:
        return 4
    return 3 if cfg["rope_scaling"] != ROPE_SCALING_NONE else 2


def param_shapes(cfg):
    """Shapes of the 17 parameter tensors in layout order (docs/design.md); a tensor the config lacks
    has a 0 in its shape."""
    cfg = full_config(cfg)
    Vp, C, L, maxT = cfg["padded_vocab_size"], cfg["channels"], cfg["num_layers"], cfg["max_seq_len"]
    hd = C // cfg["num_heads"]
    qkv = (cfg["num_heads"] + 2 * cfg["num_kv_heads"]) * hd
    H = cfg["mlp_hidden"]
    FC = 2 * H if cfg["mlp"] == MLP_SWIGLU else H
    learned, ln_bias = int(cfg["position"] == POS_LEARNED), int(cfg["norm"] == NORM_LAYERNORM)
    qkv_bias, bias, untied = int(cfg["qkv_bias"] != 0), int(cfg["biases"] != 0), int(cfg["tied_head"] == 0)
    return [(Vp, C), (learned * maxT, C), (L, C), (L, ln_bias * C), (L, qkv, C), (L, qkv_bias * qkv), (L, C, C),
            (L, bias * C), (L, C), (L, ln_bias * C), (L, FC, C), (L, bias * FC), (L, C, H), (L, bias * C), (C,),
            (ln_bias * C,), (untied * Vp, C)]


def num_params(cfg):
    return int(sum(np.prod(s) for s in param_shapes(cfg)))


def atomic_write(path, chunks):
    """Writes the byte chunks to path.tmp, fsyncs and renames; a failure leaves path untouched. An
    OSError names `path` (a write to a full disk raises one without a file name)."""
    tmp = str(path) + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c if isinstance(c, (bytes, bytearray, memoryview)) else np.ascontiguousarray(c).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno is not None:
            raise OSError(e.errno, f"cannot write it ({e.strerror})", str(path)) from e
        raise


def make_header(magic, fields):
    h = np.zeros(HEADER_INTS, dtype="<i8")
    h[0], h[1] = magic, VERSION
    for slot, v in fields.items():
        h[slot] = v
    return h


def newest_version(magic):
    return {MAGIC_MODEL: MODEL_VERSION, MAGIC_DEBUG: DEBUG_VERSION, MAGIC_SHARD: SHARD_VERSION}.get(magic, VERSION)


def read_header(path, magic):
    """Returns (header int64 array, file size); checks length, magic and version (1 .. the newest)."""
    path = str(path)
    if not os.path.isfile(path):
        raise FormatError(f"{path}: no such file")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise FormatError(f"{path}: {size} bytes is too short to hold the {HEADER_BYTES}-byte header")
    h = np.fromfile(path, dtype="<i8", count=HEADER_INTS)
    if h[0] != magic:
        other = MAGIC_NAMES.get(int(h[0]))
        raise FormatError(f"{path}: this is {other}, not {MAGIC_NAMES[magic]}" if other
                          else f"{path}: bad magic {int(h[0]):#x}, not {MAGIC_NAMES[magic]}")
    if not VERSION <= h[1] <= newest_version(magic):
        raise FormatError(f"{path}: unsupported version {int(h[1])}")
    return h, size


def check_length(path, size, payload):
    if size != HEADER_BYTES + payload:
        raise FormatError(f"{path}: {size} bytes, the header implies {HEADER_BYTES + payload}"
                          + (" (truncated)" if size < HEADER_BYTES + payload else " (extra bytes)"))


# ---------------------------------------------------------------- bf16
def fp32_to_bf16_bits(x):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def bf16_bits_to_fp32(b):
    return (np.asarray(b, dtype="<u2").astype("<u4") << 16).view("<f4")


# ---------------------------------------------------------------- model
def _slot(cfg, k):
    return int(np.float64(cfg[k]).view(np.int64)) if k in FLOAT_KEYS else int(cfg[k])


def knob_keys(version):
    """The config keys of model header slots 12.. in a file of this version: 12..20 from version 2,
    21..25 from 3, 26 from 4."""
    return (FAMILY_KEYS if version >= 2 else []) + (SCALING_KEYS if version >= 3 else []) + \
        (BIAS_KEYS if version >= 4 else [])


def knob_slots(cfg):
    """The int64 values of model header slots 12.. of cfg's file (model_version)."""
    cfg = full_config(cfg)
    return [_slot(cfg, k) for k in knob_keys(model_version(cfg))]


def config_from_header(h, version, path="model header"):
    """The config of a model header (h[3..10], then knob_keys(version) from h[12])."""
    cfg = {k: int(h[3 + i]) for i, k in enumerate(CONFIG_KEYS)}
    for i, k in enumerate(knob_keys(version)):
        cfg[k] = float(np.int64(h[12 + i]).view(np.float64)) if k in FLOAT_KEYS else int(h[12 + i])
    if cfg.get("qkv_bias", 0) not in (0, 1):
        raise FormatError(f"{path}: header field qkv_bias = {cfg['qkv_bias']} is out of range [0, 1]")
    return full_config(cfg)


def model_header(cfg, dtype):
    fields = {2: dtype, **{3 + i: cfg[k] for i, k in enumerate(CONFIG_KEYS)}, 11: num_params(cfg)}
    fields.update({12 + i: v for i, v in enumerate(knob_slots(cfg))})
    h = make_header(MAGIC_MODEL, fields)
    h[1] = model_version(cfg)
    return h


def write_model(path, cfg, params, dtype=DTYPE_FP32):
    """params: flat float array of num_params(cfg) values in layout order."""
    params = np.asarray(params, dtype="<f4").reshape(-1)
    if params.size != num_params(cfg):
        raise ValueError(f"{path}: {params.size} parameters given, config implies {num_params(cfg)}")
    payload = params if dtype == DTYPE_FP32 else fp32_to_bf16_bits(params)
    atomic_write(path, [model_header(cfg, dtype), payload])


def read_model(path):
    """Returns (cfg dict, flat fp32 params)."""
    h, size = read_header(path, MAGIC_MODEL)
    cfg = config_from_header(h, int(h[1]), path)
    dtype = int(h[2])
    if dtype not in (DTYPE_FP32, DTYPE_BF16):
        raise FormatError(f"{path}: unknown dtype {dtype}")
    n = num_params(cfg)
    if int(h[11]) != n:
        raise FormatError(f"{path}: header says {int(h[11])} parameters, shape implies {n}")
    check_length(path, size, n * (4 if dtype == DTYPE_FP32 else 2))
    if dtype == DTYPE_FP32:
        params = np.fromfile(path, dtype="<f4", count=n, offset=HEADER_BYTES)
    else:
        params = bf16_bits_to_fp32(np.fromfile(path, dtype="<u2", count=n, offset=HEADER_BYTES))
    bad, first = count_nonfinite(params)
    if bad:
        raise FormatError(f"{path}: {bad} of {n} parameter values are not finite, the first at index "
                          f"{first}: the file is from a diverged run or damaged")
    return cfg, params


def count_nonfinite(values):
    """(how many NaN / inf values, the flat index of the first) of an array; (0, -1) when all are finite."""
    bad = ~np.isfinite(np.asarray(values).reshape(-1))
    return (int(bad.sum()), int(np.argmax(bad))) if bad.any() else (0, -1)


def split_params(cfg, flat):
    """Views of the flat buffer as the 17 named tensors (empty where the config lacks one)."""
    out, off = {}, 0
    for name, shape in zip(PARAM_NAMES, param_shapes(cfg)):
        n = int(np.prod(shape))
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    return out


# ---------------------------------------------------------------- debug state
def write_debug_state(path, cfg, inputs, targets, logits, loss, grads, losses, hparams):
    """inputs/targets (B,T) int; logits (B,T,V); grads flat (num_params); losses (n,);
    hparams: dict lr, beta1, beta2, eps, weight_decay, grad_clip."""
    inputs = np.asarray(inputs, dtype="<i4")
    B, T = inputs.shape
    V = cfg["vocab_size"]
    logits = np.asarray(logits, dtype="<f4").reshape(B, T, -1)
    assert logits.shape[2] == V, "write the first V logit columns only"
    grads = np.asarray(grads, dtype="<f4").reshape(-1)
    assert grads.size == num_params(cfg)
    losses = np.asarray(losses, dtype="<f4").reshape(-1)
    hp = np.zeros(8, dtype="<f4")
    hp[:6] = [hparams[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")]
    fields = {2: B, 3: T, 4: V, 5: grads.size, 6: losses.size}
    fields.update({7 + i: cfg[k] for i, k in enumerate(CONFIG_KEYS)})  # the model's slots 3..10
    fields.update({15 + i: v for i, v in enumerate(knob_slots(cfg))})  # the model's slots 12..
    header = make_header(MAGIC_DEBUG, fields)
    header[1] = model_version(cfg)  # a debug state has the version of its model's file
    atomic_write(path, [header, inputs, np.asarray(targets, dtype="<i4"), logits,
                        np.asarray([loss], dtype="<f4"), grads, losses, hp])


def read_debug_state(path):
    h, size = read_header(path, MAGIC_DEBUG)
    B, T, V, n, steps = (int(x) for x in h[2:7])
    BT = B * T
    check_length(path, size, BT * 8 + BT * V * 4 + 4 + n * 4 + steps * 4 + 32)
    a = np.fromfile(path, dtype="<u1", offset=HEADER_BYTES)
    off = 0

    def take(dtype, count):
        nonlocal off
        x = a[off:off + count * 4].view(dtype)
        off += count * 4
        return x

    model_h = np.zeros(HEADER_INTS, dtype="<i8")  # the model header's slots 3..10 and 12..
    model_h[3:11] = h[7:15]
    model_h[12:27] = h[15:30]
    d = {"B": B, "T": T, "V": V, "config": config_from_header(model_h, int(h[1]), path)}
    d["inputs"] = take("<i4", BT).reshape(B, T)
    d["targets"] = take("<i4", BT).reshape(B, T)
    d["logits"] = take("<f4", BT * V).reshape(B, T, V)
    d["loss"] = float(take("<f4", 1)[0])
    d["grads"] = take("<f4", n)
    d["losses"] = take("<f4", steps)
    hp = take("<f4", 8)
    d["hparams"] = dict(zip(("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"), hp[:6].tolist()))
    return d


# ---------------------------------------------------------------- token shards
def shard_token_bytes(vocab_size):
    """The token width a shard of this vocabulary needs: 2 (uint16) while every id fits, else 4 (uint32)."""
    return 2 if vocab_size <= 65536 else 4


def write_shard(path, tokens, vocab_size, mask=None):
    """Token ids (each in [0, vocab_size)) as a shard: version 1 with uint16 ids when vocab_size <=
    65536, else version 2 with uint32 ids; with a loss mask (one 0 or 1 per token: 1 = the token's loss
    counts where it is a target), version 3 with the ids' width (llmc/formats.h shard_write)."""
    tokens = np.asarray(tokens)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != tokens.shape or (mask.size and not np.isin(mask, (0, 1)).all()):
            raise ValueError(f"{path}: the loss mask must hold one 0 or 1 per token ({tokens.size})")
    if not 1 <= vocab_size < 2 ** 31:
        raise ValueError(f"{path}: vocab_size {vocab_size} is not in [1, 2^31)")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"{path}: token ids must be in [0, {vocab_size})")
    width = shard_token_bytes(vocab_size)
    h = make_header(MAGIC_SHARD, {2: tokens.size, 3: width, 4: vocab_size, 5: 0 if mask is None else 1})
    h[1] = 3 if mask is not None else VERSION if width == 2 else 2
    parts = [h, tokens.astype("<u2" if width == 2 else "<u4")]
    atomic_write(path, parts if mask is None else parts + [mask.astype(np.uint8)])


def read_shard(path, with_mask=False):
    """Returns (tokens: a uint16 or uint32 array, memory-mapped; vocab_size), and with with_mask a third
    item: the loss mask (a uint8 array of 0/1 per token, memory-mapped) or None for a shard without one."""
    h, size = read_header(path, MAGIC_SHARD)
    n, width, vocab = int(h[2]), int(h[3]), int(h[4])
    if h[1] == 1 and width != 2:
        raise FormatError(f"{path}: header field bytes_per_token = {width}, but a version-1 shard holds uint16 ids "
                          "(2 bytes)")
    if width not in (2, 4):
        raise FormatError(f"{path}: header field bytes_per_token = {width}, must be 2 (uint16) or 4 (uint32)")
    if not 1 <= vocab <= (65536 if width == 2 else 2 ** 31 - 1):
        raise FormatError(f"{path}: header field vocab_size = {vocab} is out of range for {8 * width}-bit ids")
    if n < 0:
        raise FormatError(f"{path}: header field num_tokens = {n} is negative")
    has_mask = h[1] == 3
    if has_mask and h[5] != 1:
        raise FormatError(f"{path}: header field loss_mask = {h[5]}, but a version-3 shard holds a loss mask (1)")
    check_length(path, size, n * (width + has_mask))
    dtype = "<u2" if width == 2 else "<u4"
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,)) if n else np.zeros(0, dtype)
    if not with_mask:
        return tokens, vocab
    mask = None
    if has_mask:
        mask = (np.memmap(path, dtype=np.uint8, mode="r", offset=HEADER_BYTES + n * width, shape=(n,)) if n
                else np.zeros(0, np.uint8))
        if mask.size and mask.max() > 1:
            raise FormatError(f"{path}: loss mask value {int(mask.max())} at token offset "
                              f"{int(np.argmax(mask > 1))} is not 0 or 1")
    return tokens, vocab, mask


# ---------------------------------------------------------------- tokenizer decode table
def write_tokenizer(path, token_bytes, eot_token=-1):
    """token_bytes: list of bytes, one per token id (each 1..255 bytes)."""
    body = bytearray()
    for i, b in enumerate(token_bytes):
        if not 1 <= len(b) <= 255:
            raise ValueError(f"{path}: token {i} has {len(b)} bytes, must be 1..255")
        body.append(len(b))
        body += b
    atomic_write(path, [make_header(MAGIC_TOKENIZER, {2: len(token_bytes), 3: eot_token}), bytes(body)])


def read_tokenizer(path):
    """Returns (list of bytes, eot_token)."""
    h, size = read_header(path, MAGIC_TOKENIZER)
    n, eot = int(h[2]), int(h[3])
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        body = f.read()
    out, pos = [], 0
    for i in range(n):
        if pos >= len(body):
            raise FormatError(f"{path}: truncated at entry {i} of {n}")
        ln = body[pos]
        if ln == 0 or pos + 1 + ln > len(body):
            raise FormatError(f"{path}: bad or truncated entry {i}")
        out.append(bytes(body[pos + 1:pos + 1 + ln]))
        pos += 1 + ln
    if pos != len(body):
        raise FormatError(f"{path}: {len(body) - pos} extra bytes after the last entry")
    return out, eot


# ---------------------------------------------------------------- training state
def write_state(path, step, m, v, master=None, rng_state=0, sr_seed=0, loader=None):
    """AdamW moments m, v (and fp32 master weights) of a checkpoint; loader: 16 int64 or None."""
    m = np.asarray(m, dtype="<f4").reshape(-1)
    fields = {2: step, 3: m.size, 4: np.uint64(rng_state).view(np.int64), 5: 0 if master is None else 1,
              6: np.uint64(sr_seed).view(np.int64)}
    for i, x in enumerate(loader if loader is not None else []):
        fields[16 + i] = x
    chunks = [make_header(MAGIC_STATE, fields), m, np.asarray(v, dtype="<f4")]
    if master is not None:
        chunks.append(np.asarray(master, dtype="<f4"))
    atomic_write(path, chunks)


# ---------------------------------------------------------------- checksum64 and checkpoint directories
_K_INDEX = np.uint64(0x9E3779B97F4A7C15)


def _mix(z):
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def file_checksum64(path, chunk=1 << 24):
    """checksum64 of a file's bytes (docs/formats.md; llmc/utils.h Checksum64): returns (size, checksum)."""
    total, words, size = np.uint64(0), 0, 0
    with np.errstate(over="ignore"), open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            size += len(b)
            if len(b) % 8:
                b += bytes(8 - len(b) % 8)
            w = np.frombuffer(b, dtype="<u8")
            idx = np.arange(words + 1, words + 1 + w.size, dtype=np.uint64)
            total = total + np.sum(_mix(w + idx * _K_INDEX), dtype=np.uint64)
            words += w.size
        return size, int(_mix(np.uint64(total) + np.uint64(size)))


CHECKPOINT_MANIFEST = "llmc-checkpoint 1"
CHECKPOINT_FILES = ("model.bin", "state.bin")


def is_state_file(name):
    """state.bin, or a data-parallel rank's shard state_RRRRR.bin (llmc/zero.h)."""
    digits = name[6:-4]
    return name == "state.bin" or (name.startswith("state_") and name.endswith(".bin") and len(digits) >= 5
                                   and digits.isdigit())


def is_fp8_state_file(name):
    """An --fp8 run's scales: fp8.bin, or a data-parallel rank's fp8_RRRRR.bin (llmc/checkpoint.h)."""
    digits = name[4:-4]
    return name == "fp8.bin" or (name.startswith("fp8_") and name.endswith(".bin") and len(digits) >= 5
                                 and digits.isdigit())


def checkpoint_manifest(directory, step):
    """The DONE text of a checkpoint directory: model.bin, then state.bin or the ranks' state shards,
    then an --fp8 run's fp8.bin or fp8_RRRRR.bin files."""
    lines = [CHECKPOINT_MANIFEST, f"step {step}"]
    names = os.listdir(directory)
    for name in ["model.bin"] + sorted(n for n in names if is_state_file(n)) + sorted(n for n in names if is_fp8_state_file(n)):
        size, checksum = file_checksum64(os.path.join(directory, name))
        lines.append(f"{name} {size} {checksum:016x}")
    return "\n".join(lines) + "\n"


def write_checkpoint(out_dir, step, cfg, params, m, v, dtype=DTYPE_FP32, **state):
    """Writes out_dir/step_NNNNNNNN/ as the trainers do: into step_NNNNNNNN.tmp/, DONE last, then renamed."""
    final = os.path.join(out_dir, f"step_{step:08d}")
    tmp = final + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    write_model(os.path.join(tmp, "model.bin"), cfg, params, dtype)
    write_state(os.path.join(tmp, "state.bin"), step, m, v, **state)
    atomic_write(os.path.join(tmp, "DONE"), [checkpoint_manifest(tmp, step).encode()])
    os.replace(tmp, final)
    return final


def _step_of(name):
    """The step of a checkpoint directory's name step_NNNNNNNN, else None."""
    digits = name[5:]
    return int(digits) if name.startswith("step_") and digits.isdigit() and len(digits) <= 18 else None


def checkpoint_problem(directory, only=None):
    """Why the checkpoint directory cannot be resumed from, or None if it verifies (llmc/checkpoint.h).
    With `only` (a file name), the manifest is checked whole but only that file is read and checksummed
    (a model.bin loaded for its weights alone)."""
    done = os.path.join(directory, "DONE")
    if not os.path.isfile(done):
        return "no DONE (an interrupted save)"
    text = open(done, "rb").read().decode("ascii", "replace")
    if text == "ok\n":  # from before checksums: accepted unverified
        missing = [n for n in CHECKPOINT_FILES if only in (None, n) and not os.path.isfile(os.path.join(directory, n))]
        return f"{missing[0]} is missing" if missing else None
    lines = text.split("\n")
    name = os.path.basename(os.path.normpath(directory))
    if len(lines) < 5 or lines[0] != CHECKPOINT_MANIFEST or lines[-1] != "":
        return "DONE is not a checkpoint manifest"
    if not lines[1].startswith("step ") or not lines[1][5:].isdigit():
        return "DONE has no step"
    if _step_of(name) is not None and lines[1] != f"step {_step_of(name)}":
        return f"DONE is for {lines[1]}, not the directory's"
    states = 0
    for i, line in enumerate(lines[2:-1]):
        parts = line.split(" ")
        fname = parts[0] if len(parts) == 3 else ""
        states += i > 0 and is_state_file(fname)
        if (fname != "model.bin") if i == 0 else not (is_state_file(fname) or (states and is_fp8_state_file(fname))):
            return f"DONE has no entry for {CHECKPOINT_FILES[min(i, 1)]}"
        _, size, checksum = parts
        if only is not None and fname != only:
            continue
        path = os.path.join(directory, fname)
        if not os.path.isfile(path):
            return f"{fname} is missing"
        got_size, got = file_checksum64(path)
        if got_size != int(size):
            return f"{fname} has {got_size} bytes, DONE says {size}"
        if got != int(checksum, 16):
            return f"{fname} does not match the checksum in DONE"
    return None


def list_checkpoints(out_dir):
    """The complete checkpoints (step_NNNNNNNN directories holding DONE) of out_dir as (step, path),
    oldest first (llmc/checkpoint.h list_checkpoints)."""
    found = []
    for name in os.listdir(out_dir):
        step, path = _step_of(name), os.path.join(out_dir, name)
        if step is not None and os.path.isfile(os.path.join(path, "DONE")):
            found.append((step, path))
    return sorted(found)


def check_checkpoint_model(path):
    """A model file named directly: the model.bin of a checkpoint directory (one holding DONE) is
    checked against DONE (only model.bin is read: its weights are all that is loaded), as llmc/checkpoint.h
    check_checkpoint_model does for generate's --model and the trainers' --init. Raises FormatError."""
    path = str(path)
    directory = os.path.dirname(path) or "."
    if os.path.basename(path) == CHECKPOINT_FILES[0] and os.path.isfile(os.path.join(directory, "DONE")):
        why = checkpoint_problem(directory, CHECKPOINT_FILES[0])
        if why:
            raise FormatError(f"{path}: damaged checkpoint {directory}: {why}")


def find_checkpoint(path, note=print):
    """The checkpoint directory that `path` names, verified (its DONE manifest: sizes and checksums):
    `path` itself if it holds DONE, else the newest step_NNNNNNNN in it that verifies, each newer
    damaged one named through note() (as llmc/checkpoint.h checkpoint_find, which generate's --model
    uses). Returns None for a directory that is no checkpoint and holds none; raises FormatError for
    a damaged checkpoint, or a folder whose checkpoints are all damaged."""
    path = str(path)
    if os.path.isfile(os.path.join(path, "DONE")):
        why = checkpoint_problem(path)
        if why:
            raise FormatError(f"{path}: damaged checkpoint: {why}")
        return path
    named_step = _step_of(os.path.basename(os.path.normpath(path)))
    if named_step is not None and os.path.isfile(os.path.join(path, "model.bin")):
        raise FormatError(f"{path}: no DONE (an interrupted save: its files may be incomplete)")
    found = list_checkpoints(path)
    for _, ck in reversed(found):
        why = checkpoint_problem(ck)
        if why is None:
            return ck
        note(f"checkpoint: {ck} is damaged ({why}); trying the next older one")
    if found:
        raise FormatError(f"{path}: all {len(found)} checkpoints in it are damaged (see above)")
    return None
