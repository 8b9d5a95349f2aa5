// zero.h: how the ranks of a data-parallel run split the optimizer (ZeRO stages), independent of
// the backend (MPI on the CPU, NCCL on the GPU) and of the device. docs/distributed.md.
//
//   stage 0: every rank keeps the whole AdamW state and updates every parameter (gradients all-reduced);
//   stage 1: rank r keeps the AdamW state (m, v, the GPU's fp32 master weights) of its shard only,
//            updates that slice of the parameters, and the ranks all-gather the result;
//   stage 2: as 1, and rank r keeps the gradients of its shard only: each complete bucket (below)
//            is reduced piece by piece into its owners' shards, every micro-batch.
// A shard is a slice of the one contiguous parameter buffer (llmc/model_config.h): rank r owns
// [r*S, (r+1)*S) clipped to the buffer, where S = ceil(n / world) rounded up to `align` elements,
// so every shard starts on an aligned element (the last one may be shorter, or empty).
//
// Checkpoints: each rank writes its shard of the optimizer state as a state file (the GPTS
// format, llmc/formats.h, whose header records the slice: first element and the model's total),
// named state.bin for a whole state (world size 1 or stage 0) and state_RRRRR.bin for rank R's
// shard. zero_read_state reads any slice out of any such set, so a run resumes at another world
// size or stage (resharding), and zero_loader_state_for_world moves the data position across.
#pragma once
#include <dirent.h>
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "llmc/formats.h"
#include "llmc/model_config.h"
#include "llmc/utils.h"

constexpr int64_t ZERO_ALIGN = 128;  // elements: 256 bytes of bf16, the GPU buffers' alignment

struct ZeroPlan {
    int stage = 0;
    int rank = 0, world = 1;
    int64_t n = 0;      // parameters
    int64_t shard = 0;  // elements per shard (a multiple of the alignment)

    int64_t shard_begin(int r) const { return std::min(n, (int64_t)r * shard); }
    int64_t shard_end(int r) const { return std::min(n, (int64_t)(r + 1) * shard); }
    // The slice whose optimizer state this rank keeps and whose parameters it updates.
    int64_t opt_begin() const { return stage == 0 ? 0 : shard_begin(rank); }
    int64_t opt_end() const { return stage == 0 ? n : shard_end(rank); }
    int64_t opt_count() const { return opt_end() - opt_begin(); }
};

inline ZeroPlan zero_plan(int64_t n, int stage, int rank, int world, int64_t align = ZERO_ALIGN) {
    if (stage < 0 || stage > 2) fail("--zero %d: must be 0, 1 or 2", stage);
    if (world < 1 || rank < 0 || rank >= world) fail("internal: rank %d of world size %d", rank, world);
    const int64_t per_rank = (n + world - 1) / world;
    return ZeroPlan{stage, rank, world, n, std::max<int64_t>(align, (per_rank + align - 1) / align * align)};
}

// Calls fn(r, lo, hi) for every rank r whose shard meets [begin, end), with [lo, hi) the common part.
template <class Fn>
inline void zero_for_each_piece(const ZeroPlan& p, int64_t begin, int64_t end, Fn&& fn) {
    for (int r = 0; r < p.world; r++) {
        const int64_t lo = std::max(begin, p.shard_begin(r)), hi = std::min(end, p.shard_end(r));
        if (lo < hi) fn(r, lo, hi);
    }
}

// The data loader's position (DataLoader::save_state) saved by a run of another world size,
// moved to `world` ranks: the epoch is the same, and the windows the old ranks took together
// (batches * old world) must be a whole number of batches of the new one. Fails naming `what`.
inline void zero_loader_state_for_world(int64_t state[16], int world, const char* what) {
    const int64_t old_world = state[7], batches = state[2];
    if (old_world == world || old_world <= 0) return;
    const int64_t windows = batches * old_world;
    if (windows % world != 0)
        fail("%s: its data position was saved by %lld rank(s) after %lld batches each (%lld windows of epoch %lld); "
             "%lld is not a multiple of this run's world size %d, so the ranks cannot continue from the same place: "
             "resume with a world size dividing %lld", what, (long long)old_world, (long long)batches, (long long)windows, (long long)state[1],
             (long long)windows, world, (long long)windows);
    state[2] = windows / world;
    state[7] = world;
}

// -------------------------------------------------------------------------------------- buckets
// The gradients travel in buckets (docs/distributed.md). Bucket 0 holds the tensors outside the
// layers (wte, wpe, lnfw, lnfb, lm_head), written by the backward at both of its ends (the head
// first; the embedding last, into wte again when tied); the others groups of consecutive layers,
// each its layers' slice of every per-layer tensor, complete once the backward has done the group's
// lowest layer. At ZeRO-2 a bucket's buffer packs its ranges one after the other, each at an offset
// congruent to its parameter-buffer offset modulo the alignment, so every gradient kernel sees the
// alignment it sees in the whole buffer (same kernels, same bits).
struct ZeroRange {
    int tensor = 0;               // index in MODEL_PARAMETER_TABLE
    int64_t begin = 0, end = 0;   // elements [begin, end) of the parameter buffer
    int64_t packed = 0;           // where element `begin` sits in the bucket's buffer
    int64_t layer_elems = 0;      // one layer's slice of a per-layer tensor; 0 outside the layers
};

struct ZeroBucket {
    std::vector<ZeroRange> ranges;          // ascending in the parameter buffer
    int first_layer = -1, last_layer = -1;  // its layers [first_layer, last_layer]; -1: bucket 0
    int64_t elems = 0;                      // the length of its packed buffer
};

// Bucket 0, then the layer groups in ascending order, as many layers per group as fit in
// `max_elems` gradient elements (at least one).
inline std::vector<ZeroBucket> zero_buckets(const ModelConfig& c, int64_t max_elems, int64_t align = ZERO_ALIGN) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, offsets);
    const int L = c.num_layers;
    auto add = [align](ZeroBucket& b, int tensor, int64_t begin, int64_t end, int64_t layer_elems) {
        const int64_t at = (b.elems + align - 1) / align * align + begin % align;
        b.ranges.push_back({tensor, begin, end, at, layer_elems});
        b.elems = at + (end - begin);
    };
    std::vector<ZeroBucket> buckets(1);
    int64_t layer_elems = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (sizes[i] == 0) continue;
        if (!model_param_per_layer(i)) add(buckets[0], i, (int64_t)offsets[i], (int64_t)(offsets[i] + sizes[i]), 0);
        else if (sizes[i] % L != 0) fail("internal: tensor %s is not %d equal layer slices", MODEL_PARAM_NAMES[i], L);
        else layer_elems += (int64_t)(sizes[i] / L);
    }
    const int per_bucket = (int)std::max<int64_t>(1, max_elems / std::max<int64_t>(1, layer_elems));
    for (int l0 = 0; l0 < L; l0 += per_bucket) {
        ZeroBucket b;
        b.first_layer = l0;
        b.last_layer = std::min(L, l0 + per_bucket) - 1;
        for (int i = 0; i < NUM_PARAM_TENSORS; i++)
            if (model_param_per_layer(i) && sizes[i] > 0) {
                const int64_t slice = (int64_t)(sizes[i] / L);
                add(b, i, (int64_t)offsets[i] + l0 * slice, (int64_t)offsets[i] + (b.last_layer + 1) * slice, slice);
            }
        buckets.push_back(b);
    }
    return buckets;
}

// For each layer, the index of the bucket holding it.
inline std::vector<int> zero_bucket_of_layer(const std::vector<ZeroBucket>& buckets, int L) {
    std::vector<int> of(L, 0);
    for (size_t k = 1; k < buckets.size(); k++)
        for (int l = buckets[k].first_layer; l <= buckets[k].last_layer; l++) of[l] = (int)k;
    return of;
}

// Calls fn(owner, lo, hi, at) for every piece of bucket b's ranges that one rank's shard holds:
// elements [lo, hi) of the parameter buffer, at `at` in the bucket's buffer. At ZeRO-2 each piece
// is reduced to its owner, into its shard at lo - shard_begin(owner).
template <class Fn>
inline void zero_for_each_bucket_piece(const ZeroPlan& p, const ZeroBucket& b, Fn&& fn) {
    for (const ZeroRange& r : b.ranges)
        zero_for_each_piece(p, r.begin, r.end,
                            [&](int owner, int64_t lo, int64_t hi) { fn(owner, lo, hi, r.packed + (lo - r.begin)); });
}

// Where the backward writes layer l's gradients (l in [first_layer, last_layer]; -1 for bucket 0)
// when bucket b's buffer is `buffer`: the tensors of b point into it (a per-layer one at layer l's
// slice), every other tensor is nullptr.
template <typename T>
inline ModelTensors<T> zero_bucket_grads(T* buffer, const ZeroBucket& b, int l) {
    ModelTensors<T> t{};
    for (const ZeroRange& r : b.ranges)
        model_tensor(t, r.tensor) = buffer + r.packed + (r.layer_elems ? (int64_t)(l - b.first_layer) * r.layer_elems : 0);
    return t;
}

// ---------------------------------------------------------------------------------------- state
// The state file of this rank's slice: state.bin when the slice is the whole buffer.
inline std::string zero_state_file_name(const ZeroPlan& p) {
    if (p.opt_begin() == 0 && p.opt_end() == p.n) return "state.bin";
    char name[32];
    snprintf(name, sizeof name, "state_%05d.bin", p.rank);
    return name;
}

// Whether this rank writes a state file: every rank of a sharded state, rank 0 of a whole one.
inline bool zero_writes_state(const ZeroPlan& p) { return p.stage > 0 || p.rank == 0; }

// True for the names zero_state_file_name gives.
inline bool zero_is_state_file(const char* name) {
    if (strcmp(name, "state.bin") == 0) return true;
    int digits = 0;
    if (strncmp(name, "state_", 6) != 0) return false;
    for (const char* c = name + 6; *c >= '0' && *c <= '9'; c++) digits++;
    return digits >= 5 && strcmp(name + 6 + digits, ".bin") == 0;
}

// The state files of checkpoint `dir` (or the files `match` accepts), sorted by name.
inline std::vector<std::string> zero_list_state_files(const std::string& dir,
                                                      bool (*match)(const char*) = zero_is_state_file) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (!d) fail("%s: cannot open the checkpoint directory (%s)", dir.c_str(), strerror(errno));
    while (dirent* e = readdir(d))
        if (match(e->d_name)) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

// Reads elements [begin, end) of the AdamW moments (and master weights, when `master` is not null
// and the files have them) from the state files of checkpoint `dir`, a whole state.bin or the
// shards of any world size, into m, v, master (end - begin floats each; m[0] is element begin's).
// Checks that the files tile the model's `total` parameters exactly. Returns the training state
// of the file holding element 0 (step, data position, RNGs), with num_params = total.
inline TrainState zero_read_state(const std::string& dir, int64_t total, int64_t begin, int64_t end, float* m, float* v,
                                  float* master) {
    struct Piece {
        std::string path;
        TrainState st;
        int64_t first, count;
    };
    std::vector<Piece> pieces;
    for (const std::string& name : zero_list_state_files(dir)) {
        Piece p;
        p.path = dir + "/" + name;
        p.st = state_read_header(p.path.c_str());
        p.first = p.st.shard_begin;
        p.count = p.st.num_params;
        const int64_t file_total = p.st.total_params ? p.st.total_params : p.count;
        if (file_total != total)
            fail("%s: holds optimizer state of a model with %lld parameters, this model has %lld", p.path.c_str(),
                 (long long)file_total, (long long)total);
        pieces.push_back(p);
    }
    if (pieces.empty()) fail("%s: no optimizer state (state.bin or state_RRRRR.bin) in the checkpoint", dir.c_str());
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.first < b.first; });
    int64_t covered = 0;
    for (const Piece& p : pieces) {
        if (p.first != covered)
            fail("%s: its optimizer state files do not tile the %lld parameters: %s starts at element %lld, the files "
                 "before it end at %lld (a shard is missing or from another run)", dir.c_str(), (long long)total,
                 p.path.c_str(), (long long)p.first, (long long)covered);
        covered += p.count;
    }
    if (covered != total)
        fail("%s: its optimizer state files cover %lld of the %lld parameters (a shard is missing)", dir.c_str(),
             (long long)covered, (long long)total);
    if (master && !pieces[0].st.has_master) master = nullptr;
    for (const Piece& p : pieces) {
        const int64_t lo = std::max(begin, p.first), hi = std::min(end, p.first + p.count);
        if (lo >= hi) continue;
        if (master && !p.st.has_master) fail("%s: has no master weights, unlike %s", p.path.c_str(), pieces[0].path.c_str());
        UniqueFile f(fopen_or_fail(p.path.c_str(), "rb"));
        float* dst[3] = {m, v, master};
        for (int k = 0; k < 3 && dst[k]; k++) {
            fseek_or_fail(f.get(), (long)(HEADER_BYTES + ((int64_t)k * p.count + (lo - p.first)) * 4), p.path.c_str());
            fread_or_fail(dst[k] + (lo - begin), sizeof(float), (size_t)(hi - lo), f.get(), p.path.c_str());
            static const char* const what[3] = {"AdamW m", "AdamW v", "master weight"};
            check_all_finite(p.path.c_str(), what[k], dst[k] + (lo - begin), hi - lo);
        }
    }
    TrainState st = pieces[0].st;
    st.num_params = total;
    st.shard_begin = 0;
    return st;
}
