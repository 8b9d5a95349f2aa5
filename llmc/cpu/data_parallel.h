// llmc/cpu/data_parallel.h: data-parallel training of the CPU model (llmc/cpu/model.h) over a
// process group (llmc/dist.h) with the ZeRO stages of llmc/zero.h; the CPU reference of the GPU's
// distributed step, and what `make test` runs with real processes (docs/distributed.md).
//
// One step, on every rank: dp_zero_grads; per micro-batch model_forward, model_loss,
// dp_before_backward and model_backward with grad_scale 1 / (micro-batches * ranks); then
// dp_reduce_grads and dp_update (the norm over the ranks, clipping, AdamW over the rank's slice, at
// stage 1/2 the all-gather). One rank at stage 0 computes exactly what model_update does.
// --optimizer muon at stage 1/2: AdamW keeps the flat slices; Muon's matrices (llmc/cpu/muon.h,
// muon_matrices) are dealt out whole (muon_assign_owners), and each rank keeps the momentum of its
// own, runs Newton-Schulz on them and broadcasts the updated matrices, so every rank computes what
// stage 0 computes, bit for bit, from the same summed gradients.
//  - stage 0/1: the backward accumulates the whole gradient buffer; dp_reduce_grads all-reduces it
//    after the last micro-batch;
//  - stage 2: grads_memory is this rank's shard. The GPU's buckets, pieces and order
//    (llmc/model_dist.cuh), but synchronous, one bucket per layer: the backward writes a bucket into
//    a buffer of zeros but for this rank's own pieces, which start from its shard's sums so far (+=
//    accumulates the micro-batches), and each complete bucket's pieces are reduced to their owners'
//    shards (Comm::reduce_sum), replacing the values; a step's first micro-batch starts its pieces
//    from zero, so the shard is never zeroed. One buffer serves the layer buckets in turn; bucket 0
//    has its own (the backward writes it at both ends). With Muon, a Muon tensor's range is reduced
//    matrix by matrix to the matrices' owners instead.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/global_norm.h"
#include "llmc/cpu/model.h"
#include "llmc/dist.h"
#include "llmc/formats.h"
#include "llmc/zero.h"

struct DataParallel {
    Comm* comm = nullptr;
    ZeroPlan plan;
    int optimizer = OPTIMIZER_ADAMW;  // the run's (OptimizerKind), recorded in the checkpoints' state
    // stage 2: the buckets, and the buffers the backward writes them into
    std::vector<ZeroBucket> buckets;  // [0]: the tensors outside the layers; then one layer each
    std::vector<int> bucket_of_layer;
    std::vector<float> outside;       // (buckets[0].elems)
    std::vector<float> layer;         // (the largest layer bucket's elems), each layer bucket in turn
    bool first_micro = false;         // the backward being run is its step's first (dp_before_backward)
    // --optimizer muon at stage 1/2 (else empty): every Muon matrix with its owner; the owned ones
    // packed in order in muon_momentum and (stage 2) muon_grads, matrix k at muon_at[k] (-1: another's)
    std::vector<cpu::MuonMatrix> muon;
    std::vector<int64_t> muon_at;
    std::vector<float> muon_momentum;  // (owned elements)
    std::vector<float> muon_grads;     // (owned elements), stage 2: the matrices' sums over the ranks
};

namespace dp_detail {
// Calls fn(owner, at, n, mine) for each piece of bucket b that goes to one rank: elements [at, at + n)
// of the bucket's buffer, kept by rank `owner` at `mine` (nullptr on the other ranks). The pieces of
// the flat shards (llmc/zero.h) go to grads_memory; with Muon a Muon tensor's range goes matrix by
// matrix to muon_grads, so grads_memory's Muon elements stay zero.
template <class Fn>
inline void for_each_piece(DataParallel& dp, Model& m, const ZeroBucket& b, Fn&& fn) {
    const int64_t first = dp.plan.shard_begin(dp.plan.rank);
    for (const ZeroRange& r : b.ranges) {
        if (dp.muon.empty() || !model_param_muon(r.tensor)) {
            zero_for_each_piece(dp.plan, r.begin, r.end, [&](int owner, int64_t lo, int64_t hi) {
                float* mine = owner == dp.plan.rank ? &m.grads_memory[lo - first] : nullptr;
                fn(owner, r.packed + (lo - r.begin), hi - lo, mine);
            });
            continue;
        }
        for (size_t k = 0; k < dp.muon.size(); k++) {
            const cpu::MuonMatrix& x = dp.muon[k];
            if ((int64_t)x.offset >= r.begin && (int64_t)x.offset < r.end)
                fn(x.owner, r.packed + ((int64_t)x.offset - r.begin), (int64_t)x.size(),
                   dp.muon_at[k] < 0 ? nullptr : &dp.muon_grads[(size_t)dp.muon_at[k]]);
        }
    }
}

// Bucket b's buffer before the backward writes it: zeros, and (after the step's first micro-batch)
// this rank's pieces from its shard and its Muon matrices.
inline void fill_bucket(DataParallel& dp, Model& m, const ZeroBucket& b, float* buffer) {
    std::fill(buffer, buffer + b.elems, 0.0f);
    if (dp.first_micro) return;
    for_each_piece(dp, m, b, [&](int, int64_t at, int64_t n, const float* mine) {
        if (mine) std::copy(mine, mine + n, buffer + at);
    });
}

// Bucket b complete: each piece's sum over the ranks replaces its owner's values.
inline void reduce_bucket(DataParallel& dp, Model& m, const ZeroBucket& b, const float* buffer) {
    for_each_piece(dp, m, b, [&](int owner, int64_t at, int64_t n, float* mine) {
        dp.comm->reduce_sum(buffer + at, mine, n, owner);
    });
}

// Muon at stage 1/2, after the AdamW all-gather (which carries the Muon tensors' old values): each
// rank's matrices, whole, then every matrix broadcast from its owner.
inline void muon_step(Model& m, DataParallel& dp, const OptimizerSettings& o, float grad_scale) {
    const cpu::MuonSettings s = model_muon_settings(o);
    std::vector<float> scratch(cpu::muon_scratch_floats(dp.muon));
    float* params = m.params_memory.data();
    for (size_t k = 0; k < dp.muon.size(); k++) {
        const cpu::MuonMatrix& x = dp.muon[k];
        const int64_t at = dp.muon_at[k];
        if (at < 0) continue;
        const float* grads = dp.plan.stage == 2 ? &dp.muon_grads[(size_t)at] : &m.grads_memory[x.offset];
        cpu::muon_update(params + x.offset, grads, &dp.muon_momentum[(size_t)at], x.rows, x.cols, s, grad_scale,
                         scratch.data());
    }
    for (const cpu::MuonMatrix& x : dp.muon)
        dp.comm->broadcast(params + x.offset, (int64_t)(x.size() * sizeof(float)), x.owner);
}

// Muon at stage 1/2, before a checkpoint: each matrix's momentum from its owner into m's elements
// of it in the flat slices, so the state files keep stage 0's layout (Muon's momentum in m) and read
// back at any world size and stage.
inline void muon_momentum_to_slices(Model& m, DataParallel& dp) {
    const ZeroPlan& p = dp.plan;
    std::vector<float> buf;
    for (size_t k = 0; k < dp.muon.size(); k++) {
        const cpu::MuonMatrix& x = dp.muon[k];
        buf.resize(x.size());
        if (dp.muon_at[k] >= 0) std::copy_n(&dp.muon_momentum[(size_t)dp.muon_at[k]], x.size(), buf.data());
        dp.comm->broadcast(buf.data(), (int64_t)(x.size() * sizeof(float)), x.owner);
        const int64_t lo = std::max((int64_t)x.offset, p.opt_begin());
        const int64_t hi = std::min((int64_t)(x.offset + x.size()), p.opt_end());
        if (lo < hi) std::copy(&buf[lo - x.offset], &buf[hi - x.offset], &m.m_memory[lo - p.opt_begin()]);
    }
}
}  // namespace dp_detail

// Plans the shards and sizes the AdamW moments to this rank's slice; with Muon at stage 1/2 deals out
// the Muon matrices and sizes their momentum (and at stage 2 gradients) to this rank's; at stage 2
// also the gradients, and points the backward at the bucket buffers (the model's hooks keep a
// pointer to dp). optimizer: the run's OptimizerKind.
inline void dp_setup(DataParallel& dp, Model& m, Comm& comm, int zero_stage, int optimizer) {
    dp.comm = &comm;
    dp.optimizer = optimizer;
    dp.plan = zero_plan((int64_t)m.num_params, zero_stage, comm.rank, comm.world);
    dist_check_same(comm, (int64_t)m.num_params, "the number of parameters (--init, --resume)");
    dist_check_same(comm, zero_stage, "--zero");
    dist_check_same(comm, optimizer, "--optimizer");
    m.m_memory.assign((size_t)dp.plan.opt_count(), 0.0f);  // Muon at stage 1/2: m's Muon elements are
    m.v_memory.assign((size_t)dp.plan.opt_count(), 0.0f);  // used only to write and read checkpoints
    if (optimizer == OPTIMIZER_MUON && zero_stage > 0) {
        dp.muon = cpu::muon_matrices(m.config);
        cpu::muon_assign_owners(dp.muon, comm.world);
        int64_t owned = 0;
        for (const cpu::MuonMatrix& x : dp.muon) {
            dp.muon_at.push_back(x.owner == comm.rank ? owned : -1);
            if (x.owner == comm.rank) owned += (int64_t)x.size();
        }
        dp.muon_momentum.assign((size_t)owned, 0.0f);
        if (zero_stage == 2) dp.muon_grads.assign((size_t)owned, 0.0f);
    }
    if (zero_stage != 2) return;
    // one layer per bucket: the CPU reduces in the hook, so bucket size buys no overlap, and the
    // tests' 2-layer models then cross a bucket boundary
    dp.buckets = zero_buckets(m.config, 1);
    dp.bucket_of_layer = zero_bucket_of_layer(dp.buckets, m.config.num_layers);
    int64_t largest = 0;
    for (size_t k = 1; k < dp.buckets.size(); k++) largest = std::max(largest, dp.buckets[k].elems);
    dp.outside.assign((size_t)dp.buckets[0].elems, 0.0f);
    dp.layer.assign((size_t)largest, 0.0f);
    m.grads_memory.assign((size_t)dp.plan.opt_count(), 0.0f);
    m.grads = ModelTensors<float>{};  // no whole gradient buffer: a path that still expects one crashes
    DataParallel* d = &dp;
    Model* model = &m;
    auto bucket_of = [d](int l) -> const ZeroBucket& { return d->buckets[l < 0 ? 0 : d->bucket_of_layer[l]]; };
    auto buffer_of = [d](int l) { return l < 0 ? d->outside.data() : d->layer.data(); };
    m.grads_of = [d, model, bucket_of, buffer_of](int l) {
        const ZeroBucket& b = bucket_of(l);
        if (l < 0 || l == b.last_layer) dp_detail::fill_bucket(*d, *model, b, buffer_of(l));  // its first layer down
        return zero_bucket_grads(buffer_of(l), b, l);
    };
    m.after_layer_backward = [d, model, bucket_of, buffer_of](int l) {
        const ZeroBucket& b = bucket_of(l);
        if (l < 0 || l == b.first_layer) dp_detail::reduce_bucket(*d, *model, b, buffer_of(l));
    };
}

// At a step's start, in place of model_zero_grads: the gradients zeroed, except stage 2's shard, which
// the first micro-batch's reductions replace.
inline void dp_zero_grads(Model& m, const DataParallel& dp) {
    if (dp.plan.stage != 2) model_zero_grads(m);
}

// Before each micro-batch's backward: whether it is the step's first.
inline void dp_before_backward(DataParallel& dp, bool first_micro) { dp.first_micro = first_micro; }

// After the last micro-batch, stage 0/1: the whole gradient summed over the ranks (stage 2 has
// reduced its buckets during the backward).
inline void dp_reduce_grads(Model& m, DataParallel& dp) {
    if (dp.comm->world == 1 || dp.plan.stage == 2) return;
    dp.comm->allreduce_sum(m.grads_memory.data(), (int64_t)m.num_params);
}

// Clip by the global gradient norm (over every rank's slice, and with Muon at stage 2 its matrices),
// one AdamW step over this rank's slice, and at stage 1/2 the all-gather of the updated parameters;
// with OPTIMIZER_MUON at stage 0 model_step_optimizer's step on the whole buffers, at stage 1/2 AdamW
// on the slice's other tensors, then dp_detail::muon_step. Returns the norm before clipping.
inline float dp_update(Model& m, DataParallel& dp, const OptimizerSettings& o) {
    const ZeroPlan& p = dp.plan;
    const bool muon = o.optimizer == OPTIMIZER_MUON;
    if (muon != (dp.optimizer == OPTIMIZER_MUON))
        fail("internal: a %s step, set up for %s", optimizer_name(o.optimizer), optimizer_name(dp.optimizer));
    const int64_t b = p.opt_begin(), e = p.opt_end();
    const float* grads = m.grads_memory.data() + (p.stage == 2 ? 0 : b);  // the slice's gradients
    double sq = cpu::global_norm_squared(grads, (size_t)(e - b)) +
                cpu::global_norm_squared(dp.muon_grads.data(), dp.muon_grads.size());
    if (p.stage > 0) sq = dp.comm->allreduce_sum(sq);
    const float norm = (float)std::sqrt(sq), scale = cpu::grad_clip_scale(norm, o.grad_clip);
    m.step++;
    if (muon && p.stage == 0) {
        model_step_optimizer(m, o, scale);
        return norm;
    }
    cpu::adamw_update_model_range(m.params_memory.data(), m.m_memory.data(), m.v_memory.data(), grads, m.config, (size_t)b,
                                 (size_t)e, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, scale, m.step, muon);
    if (p.stage > 0) dp.comm->allgather(m.params_memory.data(), p);
    if (muon) dp_detail::muon_step(m, dp, o, scale);
    return norm;
}

// Checkpoint DIR/step_NNNNNNNN/: rank 0 starts the .tmp directory and writes model.bin, each rank
// its slice of the optimizer state (llmc/zero.h: state.bin, or state_RRRRR.bin per rank; with Muon
// at stage 1/2 the slice's Muon momentum gathered from the matrices' owners first); once
// every rank has written (barrier), rank 0 writes DONE and renames, so the checkpoint appears
// whole or not at all.
inline void dp_save_checkpoint(Model& m, DataParallel& dp, const std::string& out_dir,
                               const int64_t loader_state[16], uint64_t rng_state) {
    Comm& comm = *dp.comm;
    const ZeroPlan& p = dp.plan;
    if (!dp.muon.empty()) dp_detail::muon_momentum_to_slices(m, dp);
    std::string dir;
    if (comm.primary()) dir = checkpoint_begin(out_dir, m.step);
    comm.broadcast(dir, 0);  // the others wait for the directory
    if (comm.primary()) model_write_fp32((dir + "/model.bin").c_str(), m.config, m.params_memory.data());
    if (zero_writes_state(p)) {
        TrainState st;
        st.step = m.step;
        st.num_params = p.opt_count();
        st.rng_state = rng_state;
        for (int i = 0; i < 16; i++) st.loader[i] = loader_state[i];
        const bool whole = p.opt_count() == p.n;
        st.shard_begin = whole ? 0 : p.opt_begin();
        st.total_params = whole ? 0 : p.n;
        st.optimizer = dp.optimizer;
        state_write((dir + "/" + zero_state_file_name(p)).c_str(), st, m.m_memory.data(), m.v_memory.data(), nullptr);
    }
    comm.barrier();
    if (comm.primary()) checkpoint_finish(dir);
    comm.barrier();
}

// Reads checkpoint `dir` (written at any world size and stage) into the built model: the
// parameters, this rank's slice of the optimizer state (with Muon at stage 1/2 also its matrices'
// momentum), the step; returns the training state with the data position moved to this run's world
// size.
inline TrainState dp_load_checkpoint(Model& m, DataParallel& dp, const std::string& dir) {
    const std::string model_path = dir + "/model.bin";
    ModelFileInfo info = model_read_info(model_path.c_str());
    if (!model_same_config(info.config, m.config))
        fail("%s: the checkpoint's model shape differs from this run's", model_path.c_str());
    model_read_fp32(model_path.c_str(), m.params_memory.data());
    const ZeroPlan& p = dp.plan;
    TrainState st = zero_read_state(dir, p.n, p.opt_begin(), p.opt_end(), m.m_memory.data(), m.v_memory.data(), nullptr);
    std::vector<float> v;  // Muon's v elements: zero
    for (size_t k = 0; k < dp.muon.size(); k++) {
        const cpu::MuonMatrix& x = dp.muon[k];
        if (dp.muon_at[k] < 0) continue;
        v.resize(x.size());
        zero_read_state(dir, p.n, (int64_t)x.offset, (int64_t)(x.offset + x.size()), &dp.muon_momentum[(size_t)dp.muon_at[k]],
                        v.data(), nullptr);
    }
    m.step = st.step;
    zero_loader_state_for_world(st.loader, dp.comm->world, ("--resume " + dir).c_str());
    return st;
}
