// formats.h: validating readers and atomic writers for every file the project reads or writes.
// Layouts are in docs/formats.md (the Python side is scripts/llmc_formats.py). Every file starts
// with a 1024-byte header of 128 little-endian int64 values: h[0] magic, h[1] version.
// Readers check existence, length, magic, version, header sizes and the exact file length before
// touching the payload, and fail with one line naming the file and the problem.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "llmc/model_config.h"
#include "llmc/utils.h"

constexpr int HEADER_INTS = 128;
constexpr int64_t HEADER_BYTES = HEADER_INTS * 8;

constexpr int64_t fourcc(const char (&s)[5]) {
    return (int64_t)((uint32_t)(uint8_t)s[0] | (uint32_t)(uint8_t)s[1] << 8 | (uint32_t)(uint8_t)s[2] << 16 |
                     (uint32_t)(uint8_t)s[3] << 24);
}
constexpr int64_t MAGIC_MODEL = fourcc("GPTM");
constexpr int64_t MAGIC_STATE = fourcc("GPTS");
constexpr int64_t MAGIC_TOKENIZER = fourcc("GPTT");
constexpr int64_t MAGIC_SHARD = fourcc("GPTD");
constexpr int64_t MAGIC_DEBUG = fourcc("GPTX");
constexpr int64_t MAGIC_EVAL = fourcc("GPTE");
constexpr int64_t MAGIC_FP8 = fourcc("GPT8");
constexpr int64_t FORMAT_VERSION = 1;  // the first version of every format, and the only one of most
// Model files (GPTM) and debug states (GPTX) are at version 4: version 2 adds the model family's
// knobs, version 3 RoPE frequency scaling (Llama 3.x's llama3), version 4 a qkv bias apart from the
// other projections' (Qwen2's; docs/formats.md). Writers use the oldest version that holds the config
// (model_version_for); readers take all four.
constexpr int64_t MODEL_VERSION = 4;
constexpr int64_t DEBUG_VERSION = 4;
// Token shards (GPTD) are at version 3: version 2 adds uint32 tokens (vocabularies over 65,536 ids),
// version 3 a per-token loss mask after the ids. shard_write uses the oldest version that holds the
// shard, so unmasked shards stay byte-identical to earlier builds' files, which refuse a masked one.
constexpr int64_t SHARD_VERSION = 3;
inline int64_t newest_version(int64_t magic) {
    return magic == MAGIC_MODEL ? MODEL_VERSION : magic == MAGIC_DEBUG ? DEBUG_VERSION
           : magic == MAGIC_SHARD ? SHARD_VERSION : FORMAT_VERSION;
}

enum ModelDtype : int64_t { DTYPE_FP32 = 0, DTYPE_BF16 = 1 };

inline const char* magic_name(int64_t magic) {
    switch (magic) {
        case MAGIC_MODEL: return "a model checkpoint";
        case MAGIC_STATE: return "a training state file";
        case MAGIC_TOKENIZER: return "a tokenizer file";
        case MAGIC_SHARD: return "a token shard";
        case MAGIC_DEBUG: return "a debug state file";
        case MAGIC_EVAL: return "an eval file";
        case MAGIC_FP8: return "an FP8 scaling state file";
        default: return nullptr;
    }
}

struct FileHeader {
    int64_t h[HEADER_INTS];
};

// An open file positioned at its payload, its header and its length in bytes.
struct CheckedFile {
    UniqueFile f;
    FileHeader hd;
    int64_t size;
};

// Opens `path`, checks its length holds a header, reads it and checks magic and version.
inline CheckedFile open_checked(const char* path, int64_t magic) {
    const int64_t size = file_size_or_fail(path);
    if (size == 0) fail("%s: empty file (0 bytes), expected %s", path, magic_name(magic));
    if (size < HEADER_BYTES)
        fail("%s: %lld bytes is too short to hold the %lld-byte header of %s", path, (long long)size,
             (long long)HEADER_BYTES, magic_name(magic));
    CheckedFile file{UniqueFile(fopen_or_fail(path, "rb")), {}, size};
    const int64_t* h = file.hd.h;
    fread_or_fail(file.hd.h, sizeof(int64_t), HEADER_INTS, file.f.get(), path);
    if (h[0] != magic) {
        const char* other = magic_name(h[0]);
        if (other) fail("%s: this is %s, not %s", path, other, magic_name(magic));
        fail("%s: bad magic 0x%llx, not %s (expected 0x%llx)", path, (unsigned long long)h[0], magic_name(magic),
             (unsigned long long)magic);
    }
    const int64_t newest = newest_version(magic);
    if (h[1] < FORMAT_VERSION || h[1] > newest) {
        if (newest == FORMAT_VERSION)
            fail("%s: unsupported version %lld of %s (this build reads version %lld)", path, (long long)h[1],
                 magic_name(magic), (long long)FORMAT_VERSION);
        fail("%s: unsupported version %lld of %s (this build reads versions %lld to %lld)", path,
             (long long)h[1], magic_name(magic), (long long)FORMAT_VERSION, (long long)newest);
    }
    return file;
}

inline void check_file_length(const char* path, int64_t size, int64_t payload) {
    int64_t want = HEADER_BYTES + payload;
    if (size < want)
        fail("%s: truncated: %lld bytes, the header implies %lld", path, (long long)size, (long long)want);
    if (size > want)
        fail("%s: %lld unexpected extra bytes after the %lld the header implies", path, (long long)(size - want),
             (long long)want);
}

inline void check_range(const char* path, const char* field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        fail("%s: header field %s = %lld is out of range [%lld, %lld]", path, field, (long long)v, (long long)lo,
             (long long)hi);
}

// The bits of x as a To of the same size.
template <typename To, typename From>
inline To bits_as(From x) {
    static_assert(sizeof(To) == sizeof(From), "a reinterpretation of the same bytes");
    To t;
    memcpy(&t, &x, sizeof t);
    return t;
}

// ---- bf16 <-> fp32 on the host (bf16 = upper 16 bits of fp32, round to nearest even) ----
inline float bf16_to_float(uint16_t b) { return bits_as<float>((uint32_t)b << 16); }
inline uint16_t float_to_bf16(float f) {
    uint32_t u = bits_as<uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Fails if any of the n values is NaN or infinite: such a file comes from a diverged run (or is
// damaged), and training from it only spreads the NaN. `what` names the values ("AdamW m", ...);
// a model's parameters are checked with their config, so the message names the tensor.
inline void check_all_finite(const char* path, const char* what, const float* x, int64_t n,
                             const ModelConfig* params_of = nullptr) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!std::isfinite(x[i])) {
            if (first < 0) first = i;
            bad++;
        }
    if (bad == 0) return;
    std::string where;
    if (params_of) {
        size_t off[NUM_PARAM_TENSORS];
        model_param_offsets(*params_of, off);
        int t = 0;
        while (t + 1 < NUM_PARAM_TENSORS && (size_t)first >= off[t + 1]) t++;
        where = std::string(" (") + MODEL_PARAM_NAMES[t] + ")";
    }
    fail("%s: %lld of %lld %s values are not finite, the first at index %lld%s is %g: the file is from a diverged run "
         "or damaged", path, (long long)bad, (long long)n, what, (long long)first, where.c_str(), x[first]);
}

// ================================ model checkpoint (GPTM) ================================
struct ModelFileInfo {
    ModelConfig config;
    int64_t dtype;  // DTYPE_FP32 or DTYPE_BF16
    int64_t num_params;
};

// The model version a config needs: 1 for a plain GPT-2 (byte-identical to earlier builds' files), 4
// when qkv_bias differs from biases, 3 with RoPE scaling, else 2: a build that lacks the knob a file
// needs refuses the file instead of running without it.
inline int64_t model_version_for(const ModelConfig& c) {
    if (model_is_plain_gpt2(c)) return FORMAT_VERSION;
    if (c.qkv_bias != c.biases) return 4;
    return c.rope_scaling.type != ROPE_SCALING_NONE ? 3 : 2;
}

// Slots 12..20 of a version-2 model header: the family's knobs; slots 21..25 of a version-3 header:
// the RoPE scaling; slot 26 of a version-4 header: qkv_bias (earlier versions: qkv_bias = biases, the
// four projections together). eps, theta and the scaling's factors are the bit patterns of float64 values.
inline ModelFileInfo model_header_from(const FileHeader& hd, const char* path) {
    const int64_t* h = hd.h;
    check_range(path, "dtype", h[2], 0, 1);
    for (int i = 3; i <= 9; i++) check_range(path, "model shape", h[i], 1, 1 << 24);
    check_range(path, "window", h[10], 0, 1 << 24);
    ModelFileInfo info;
    ModelConfig& c = info.config;
    c.max_seq_len = (int)h[3];
    c.vocab_size = (int)h[4];
    c.padded_vocab_size = (int)h[5];
    c.num_layers = (int)h[6];
    c.num_heads = (int)h[7];
    c.num_kv_heads = (int)h[8];
    c.channels = (int)h[9];
    c.window = (int)h[10];
    c.mlp_hidden = 4 * c.channels;  // version 1: GPT-2, the defaults of ModelConfig
    if (h[1] >= 2) {
        check_range(path, "architecture", h[12], 0, 1);
        check_range(path, "norm", h[13], 0, 1);
        check_range(path, "position", h[15], 0, 1);
        check_range(path, "mlp", h[17], 0, 1);
        check_range(path, "mlp_hidden", h[18], 1, 1 << 20);
        check_range(path, "biases", h[19], 0, 1);
        check_range(path, "tied_head", h[20], 0, 1);
        c.architecture = (int)h[12];
        c.norm = (int)h[13];
        c.norm_eps = bits_as<double>(h[14]);
        c.position = (int)h[15];
        c.rope_theta = bits_as<double>(h[16]);
        c.mlp = (int)h[17];
        c.mlp_hidden = (int)h[18];
        c.qkv_bias = c.biases = (int)h[19];
        c.tied_head = (int)h[20];
    }
    if (h[1] >= 3) {  // version 2 files have no scaling: their slots 21..25 are not read
        check_range(path, "rope_scaling", h[21], 0, 1);
        check_range(path, "rope_original_max_position_embeddings", h[25], 0, 1 << 24);
        c.rope_scaling.type = (int)h[21];
        c.rope_scaling.factor = bits_as<double>(h[22]);
        c.rope_scaling.low_freq_factor = bits_as<double>(h[23]);
        c.rope_scaling.high_freq_factor = bits_as<double>(h[24]);
        c.rope_scaling.original_max_pos = (int)h[25];
    }
    if (h[1] >= 4) {
        check_range(path, "qkv_bias", h[26], 0, 1);
        c.qkv_bias = (int)h[26];
    }
    model_validate_config(c, path);
    info.dtype = h[2];
    info.num_params = h[11];
    if ((size_t)info.num_params != model_num_params(c))
        fail("%s: header says %lld parameters but its shape implies %zu", path, (long long)info.num_params,
             model_num_params(c));
    return info;
}

// Reads and validates the header and length only.
inline ModelFileInfo model_read_info(const char* path) {
    const CheckedFile file = open_checked(path, MAGIC_MODEL);
    ModelFileInfo info = model_header_from(file.hd, path);
    check_file_length(path, file.size, info.num_params * (info.dtype == DTYPE_BF16 ? 2 : 4));
    return info;
}

// Reads the parameters as fp32 (converting a bf16 file); `params` holds num_params floats.
inline ModelFileInfo model_read_fp32(const char* path, float* params) {
    ModelFileInfo info = model_read_info(path);
    UniqueFile f = open_checked(path, MAGIC_MODEL).f;
    if (info.dtype == DTYPE_FP32) {
        fread_or_fail(params, sizeof(float), info.num_params, f.get(), path);
    } else {
        std::vector<uint16_t> buf(1 << 20);
        for (int64_t done = 0; done < info.num_params;) {
            int64_t n = std::min<int64_t>((int64_t)buf.size(), info.num_params - done);
            fread_or_fail(buf.data(), 2, n, f.get(), path);
            for (int64_t i = 0; i < n; i++) params[done + i] = bf16_to_float(buf[i]);
            done += n;
        }
    }
    check_all_finite(path, "parameter", params, info.num_params, &info.config);
    return info;
}

inline FileHeader model_make_header(const ModelConfig& c, int64_t dtype) {
    FileHeader hd = {};
    int64_t* h = hd.h;
    h[0] = MAGIC_MODEL; h[1] = model_version_for(c); h[2] = dtype;
    h[3] = c.max_seq_len; h[4] = c.vocab_size; h[5] = c.padded_vocab_size; h[6] = c.num_layers;
    h[7] = c.num_heads; h[8] = c.num_kv_heads; h[9] = c.channels; h[10] = c.window;
    h[11] = (int64_t)model_num_params(c);
    if (h[1] >= 2) {
        h[12] = c.architecture; h[13] = c.norm; h[14] = bits_as<int64_t>(c.norm_eps); h[15] = c.position;
        h[16] = bits_as<int64_t>(c.rope_theta); h[17] = c.mlp; h[18] = model_mlp_hidden(c); h[19] = c.biases;
        h[20] = c.tied_head;
    }
    if (h[1] >= 3) {
        const RopeScaling& r = c.rope_scaling;
        h[21] = r.type; h[22] = bits_as<int64_t>(r.factor); h[23] = bits_as<int64_t>(r.low_freq_factor);
        h[24] = bits_as<int64_t>(r.high_freq_factor); h[25] = r.original_max_pos;
    }
    if (h[1] >= 4) h[26] = c.qkv_bias;
    return hd;
}

// Writes a checkpoint atomically (path.tmp, then rename): fp32 values, or bf16 bit patterns.
inline void model_write(const char* path, const ModelConfig& c, int64_t dtype, const void* params) {
    FileHeader hd = model_make_header(c, dtype);
    AtomicFileWriter w(path);
    w.write(hd.h, HEADER_BYTES);
    w.write(params, model_num_params(c) * (dtype == DTYPE_BF16 ? sizeof(uint16_t) : sizeof(float)));
    w.commit();
}
inline void model_write_fp32(const char* path, const ModelConfig& c, const float* params) {
    model_write(path, c, DTYPE_FP32, params);
}
inline void model_write_bf16(const char* path, const ModelConfig& c, const uint16_t* params) {
    model_write(path, c, DTYPE_BF16, params);
}

// ================================ training state (GPTS) ================================
struct TrainState {
    int64_t step = 0;
    int64_t num_params = 0;
    uint64_t rng_state = 0;
    int64_t has_master = 0;  // fp32 master weights follow m and v
    uint64_t sr_seed = 0;    // stochastic-rounding seed (GPU)
    int64_t loader[16] = {};
    // a shard of a data-parallel run's optimizer state (llmc/zero.h): the payload is elements
    // [shard_begin, shard_begin + num_params) of a model of total_params; 0, 0 for a whole state
    int64_t shard_begin = 0;
    int64_t total_params = 0;
    // the run's optimizer (OptimizerKind): with OPTIMIZER_MUON, m holds Muon's momentum on the
    // model_param_muon tensors (v zero there) and AdamW's moments elsewhere
    int64_t optimizer = OPTIMIZER_ADAMW;
};

inline void state_write(const char* path, const TrainState& s, const float* m, const float* v, const float* master) {
    FileHeader hd = {};
    int64_t* h = hd.h;
    h[0] = MAGIC_STATE; h[1] = FORMAT_VERSION; h[2] = s.step; h[3] = s.num_params;
    h[4] = bits_as<int64_t>(s.rng_state);
    h[5] = master ? 1 : 0;
    h[6] = bits_as<int64_t>(s.sr_seed);
    h[7] = s.shard_begin;
    h[8] = s.total_params;
    h[9] = s.optimizer;
    for (int i = 0; i < 16; i++) h[16 + i] = s.loader[i];
    AtomicFileWriter w(path);
    w.write(h, HEADER_BYTES);
    w.write(m, s.num_params * sizeof(float));
    w.write(v, s.num_params * sizeof(float));
    if (master) w.write(master, s.num_params * sizeof(float));
    w.commit();
}

// Reads and checks a state file's header (its length too); the payload is not read.
inline TrainState state_read_header(const char* path) {
    const CheckedFile file = open_checked(path, MAGIC_STATE);
    const int64_t* h = file.hd.h;
    TrainState s;
    check_range(path, "step", h[2], 0, INT64_MAX / 2);
    check_range(path, "num_params", h[3], 0, INT64_MAX / 64);
    check_range(path, "has_master", h[5], 0, 1);
    check_range(path, "total_params", h[8], 0, INT64_MAX / 64);
    check_range(path, "shard_begin", h[7], 0, h[8] ? h[8] - h[3] : 0);
    check_range(path, "optimizer", h[9], OPTIMIZER_ADAMW, OPTIMIZER_MUON);
    s.step = h[2];
    s.num_params = h[3];
    s.rng_state = bits_as<uint64_t>(h[4]);
    s.has_master = h[5];
    s.sr_seed = bits_as<uint64_t>(h[6]);
    s.shard_begin = h[7];
    s.total_params = h[8];
    s.optimizer = h[9];
    for (int i = 0; i < 16; i++) s.loader[i] = h[16 + i];
    check_file_length(path, file.size, s.num_params * 4 * (2 + s.has_master));
    return s;
}

// Reads a whole state; `expected_params` must match. m, v (and master if the file has it and master
// is non-null) receive num_params floats each. (A shard of a data-parallel run's state is read by
// zero_read_state, llmc/zero.h.)
inline TrainState state_read(const char* path, int64_t expected_params, float* m, float* v, float* master) {
    TrainState s = state_read_header(path);
    if (s.total_params != 0 && s.total_params != s.num_params)
        fail("%s: holds one shard (elements %lld..%lld of %lld) of a data-parallel run's optimizer state; resume the "
             "checkpoint directory with a trainer of this build (it reads the shards of any world size)", path,
             (long long)s.shard_begin, (long long)(s.shard_begin + s.num_params), (long long)s.total_params);
    if (s.num_params != expected_params)
        fail("%s: holds optimizer state for %lld parameters, the model has %lld", path, (long long)s.num_params,
             (long long)expected_params);
    UniqueFile f(fopen_or_fail(path, "rb"));
    fseek_or_fail(f.get(), (long)HEADER_BYTES, path);
    fread_or_fail(m, sizeof(float), s.num_params, f.get(), path);
    fread_or_fail(v, sizeof(float), s.num_params, f.get(), path);
    if (s.has_master && master) fread_or_fail(master, sizeof(float), s.num_params, f.get(), path);
    check_all_finite(path, "AdamW m", m, s.num_params);
    check_all_finite(path, "AdamW v", v, s.num_params);
    if (s.has_master && master) check_all_finite(path, "master weight", master, s.num_params);
    return s;
}

// ================================ tokenizer (GPTT) ================================
struct TokenizerFile {
    std::vector<std::string> tokens;  // decoded bytes of each token id
    int eot_token;                    // -1 if none
};

inline TokenizerFile tokenizer_read(const char* path) {
    CheckedFile file = open_checked(path, MAGIC_TOKENIZER);
    const int64_t* h = file.hd.h;
    check_range(path, "vocab_size", h[2], 1, 1 << 20);
    check_range(path, "eot_token", h[3], -1, h[2] - 1);
    TokenizerFile t;
    t.eot_token = (int)h[3];
    int64_t n = h[2], payload = file.size - HEADER_BYTES;
    std::vector<unsigned char> buf(payload);
    fread_or_fail(buf.data(), 1, payload, file.f.get(), path);
    file.f.reset();
    t.tokens.reserve(n);
    int64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (pos >= payload) fail("%s: truncated: entry %lld of %lld is missing", path, (long long)i, (long long)n);
        int len = buf[pos++];
        if (len == 0) fail("%s: entry %lld has length 0", path, (long long)i);
        if (pos + len > payload) fail("%s: truncated inside entry %lld", path, (long long)i);
        t.tokens.emplace_back((const char*)&buf[pos], len);
        pos += len;
    }
    if (pos != payload) fail("%s: %lld unexpected extra bytes after the last entry", path, (long long)(payload - pos));
    return t;
}

// ================================ token shard (GPTD) ================================
struct ShardInfo {
    int64_t num_tokens;
    int64_t vocab_size;   // every token id is below this
    int token_bytes;      // 2 (uint16) or 4 (uint32, version 2 or 3)
    bool has_mask;        // version 3: num_tokens uint8 loss-mask values (0 or 1) follow the ids
};

// Validates header and length; the payload (num_tokens ids of token_bytes each, little-endian, then
// for version 3 num_tokens mask bytes) starts at byte HEADER_BYTES. Version 1 holds uint16 ids only;
// versions 2 and 3 uint16 or uint32; version 3 records its mask in slot 5 (= 1).
inline ShardInfo shard_read_info(const char* path) {
    const CheckedFile file = open_checked(path, MAGIC_SHARD);
    const int64_t* h = file.hd.h;
    check_range(path, "num_tokens", h[2], 0, INT64_MAX / 8);
    if (h[1] == 1 && h[3] != 2)
        fail("%s: header field bytes_per_token = %lld, but a version-1 shard holds uint16 ids (2 bytes)", path,
             (long long)h[3]);
    if (h[3] != 2 && h[3] != 4)
        fail("%s: header field bytes_per_token = %lld, must be 2 (uint16) or 4 (uint32)", path, (long long)h[3]);
    // uint16 ids are below 65536; uint32 ids are read as int, so below 2^31
    check_range(path, "vocab_size", h[4], 1, h[3] == 2 ? 65536 : INT32_MAX);
    const bool has_mask = h[1] == 3;
    if (has_mask && h[5] != 1)
        fail("%s: header field loss_mask = %lld, but a version-3 shard holds a loss mask (1)", path, (long long)h[5]);
    check_file_length(path, file.size, h[2] * (h[3] + (has_mask ? 1 : 0)));
    return ShardInfo{h[2], h[4], (int)h[3], has_mask};
}

// The token width a shard of this vocabulary needs: 2 bytes while every id fits uint16, else 4.
inline int shard_token_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Writes a shard atomically: version 1 with uint16 ids when vocab_size <= 65536, else version 2
// with uint32 ids; with a loss mask (n values, 0 or 1; nullptr = none) version 3 with the ids'
// width and the mask after them. `tokens` are ints (each in [0, vocab_size), not checked here).
inline void shard_write(const char* path, const int* tokens, int64_t n, int64_t vocab_size,
                        const uint8_t* mask = nullptr) {
    const int width = shard_token_bytes(vocab_size);
    FileHeader hd = {};
    hd.h[0] = MAGIC_SHARD; hd.h[1] = mask ? 3 : width == 2 ? FORMAT_VERSION : 2; hd.h[2] = n;
    hd.h[3] = width; hd.h[4] = vocab_size; hd.h[5] = mask ? 1 : 0;
    AtomicFileWriter w(path);
    w.write(hd.h, HEADER_BYTES);
    if (width == 2) {
        std::vector<uint16_t> t(tokens, tokens + n);
        w.write(t.data(), n * 2);
    } else {
        std::vector<uint32_t> t(tokens, tokens + n);
        w.write(t.data(), n * 4);
    }
    if (mask) w.write(mask, n);
    w.commit();
}

// ================================ FP8 scaling state (GPT8) ================================
// The per-tensor scales of an --fp8 run (llmc/model_fp8.cuh), so that delayed scaling resumes with
// its amax histories: `records` records of `record_words` 32-bit words each (the trainer's Fp8Meta,
// copied as it is in device memory), and whether a backward had run (`warm`).
struct Fp8State {
    int64_t step = 0;
    int64_t records = 0;
    int64_t record_words = 0;
    int64_t warm = 0;
};

inline void fp8_state_write(const char* path, const Fp8State& s, const uint32_t* words) {
    FileHeader hd = {};
    int64_t* h = hd.h;
    h[0] = MAGIC_FP8; h[1] = FORMAT_VERSION; h[2] = s.step; h[3] = s.records; h[4] = s.record_words; h[5] = s.warm;
    AtomicFileWriter w(path);
    w.write(h, HEADER_BYTES);
    w.write(words, (size_t)(s.records * s.record_words) * sizeof(uint32_t));
    w.commit();
}

// Reads an FP8 scaling state; its records must be `records` x `record_words` (this model and build).
inline Fp8State fp8_state_read(const char* path, int64_t records, int64_t record_words, std::vector<uint32_t>* words) {
    const CheckedFile file = open_checked(path, MAGIC_FP8);
    const int64_t* h = file.hd.h;
    check_range(path, "step", h[2], 0, INT64_MAX / 2);
    check_range(path, "records", h[3], 0, 1 << 24);
    check_range(path, "record_words", h[4], 1, 1 << 16);
    check_range(path, "warm", h[5], 0, 1);
    const Fp8State s{h[2], h[3], h[4], h[5]};
    check_file_length(path, file.size, s.records * s.record_words * 4);
    if (s.records != records || s.record_words != record_words)
        fail("%s: holds %lld FP8 scales of %lld words each, this model and build have %lld of %lld", path,
             (long long)s.records, (long long)s.record_words, (long long)records, (long long)record_words);
    words->resize((size_t)(records * record_words));
    fread_or_fail(words->data(), sizeof(uint32_t), words->size(), file.f.get(), path);
    return s;
}

// ================================ debug state (GPTX) ================================
struct DebugState {
    int B, T, V, num_steps;
    int64_t num_params;
    std::vector<int> inputs, targets;  // (B, T)
    std::vector<float> logits;         // (B, T, V)
    float loss;
    std::vector<float> grads;   // (num_params), model layout
    std::vector<float> losses;  // (num_steps): loss before each AdamW step
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
};

// Reads a debug state and checks it belongs to a model of config `c`.
inline DebugState debug_state_read(const char* path, const ModelConfig& c) {
    CheckedFile file = open_checked(path, MAGIC_DEBUG);
    const int64_t* h = file.hd.h;
    check_range(path, "B", h[2], 1, 1 << 16);
    check_range(path, "T", h[3], 1, c.max_seq_len);
    check_range(path, "num_steps", h[6], 0, 1 << 20);
    // slots 7..14: the model's slots 3..10 (shape, num_kv_heads, window); version 2 adds 15..23, the
    // model's slots 12..20 (the family's knobs), all zero for a GPT-2 model (a version-1 model file);
    // version 3 adds 24..28, the model's slots 21..25 (the RoPE scaling), zero without scaling;
    // version 4 adds 29, the model's slot 26 (qkv_bias)
    FileHeader mh = model_make_header(c, 0);
    for (int i = 0; i < 23; i++) {
        const int model_slot = i < 8 ? 3 + i : 4 + i;
        const int64_t since = i < 8 ? 1 : i < 17 ? 2 : i < 22 ? 3 : 4;  // the debug state version that has slot 7 + i
        const int64_t have = h[1] >= since ? h[7 + i] : 0;
        if (have != mh.h[model_slot])
            fail("%s: written for a different model (model header slot %d is %lld, the model has %lld)", path,
                 model_slot, (long long)have, (long long)mh.h[model_slot]);
    }
    if (h[4] != c.vocab_size) fail("%s: vocab_size %lld != model's %d", path, (long long)h[4], c.vocab_size);
    if (h[5] != (int64_t)model_num_params(c))
        fail("%s: %lld parameters, the model has %zu", path, (long long)h[5], model_num_params(c));
    DebugState d;
    d.B = (int)h[2]; d.T = (int)h[3]; d.V = (int)h[4]; d.num_params = h[5]; d.num_steps = (int)h[6];
    int64_t BT = (int64_t)d.B * d.T;
    check_file_length(path, file.size, BT * 4 * 2 + BT * d.V * 4 + 4 + d.num_params * 4 + d.num_steps * 4 + 8 * 4);
    d.inputs.resize(BT); d.targets.resize(BT); d.logits.resize(BT * d.V);
    d.grads.resize(d.num_params); d.losses.resize(d.num_steps);
    fread_or_fail(d.inputs.data(), 4, BT, file.f.get(), path);
    fread_or_fail(d.targets.data(), 4, BT, file.f.get(), path);
    fread_or_fail(d.logits.data(), 4, BT * d.V, file.f.get(), path);
    fread_or_fail(&d.loss, 4, 1, file.f.get(), path);
    fread_or_fail(d.grads.data(), 4, d.num_params, file.f.get(), path);
    fread_or_fail(d.losses.data(), 4, d.num_steps, file.f.get(), path);
    float hp[8];
    fread_or_fail(hp, 4, 8, file.f.get(), path);
    file.f.reset();
    d.lr = hp[0]; d.beta1 = hp[1]; d.beta2 = hp[2]; d.eps = hp[3]; d.weight_decay = hp[4]; d.grad_clip = hp[5];
    for (int64_t i = 0; i < BT; i++)
        if (d.inputs[i] < 0 || d.inputs[i] >= d.V || d.targets[i] < 0 || d.targets[i] >= d.V)
            fail("%s: token id out of range [0, %d) at position %lld", path, d.V, (long long)i);
    return d;
}
