// llmc/cpu/data_parallel.h: data-parallel training of the CPU model (llmc/cpu/model.h) over a
// process group (llmc/dist.h) with the ZeRO stages of llmc/zero.h; the CPU reference of the GPU's
// distributed step, and what `make test` runs with real processes (docs/distributed.md).
//
// One step, on every rank: dp_zero_grads; per micro-batch model_forward, model_loss,
// dp_before_backward and model_backward with grad_scale 1 / (micro-batches * ranks); then
// dp_reduce_grads and dp_update (the norm over the ranks, clipping, AdamW over the rank's slice, at
// stage 1/2 the all-gather). One rank at stage 0 computes exactly what model_update does.
// --optimizer muon runs at stage 0 only (Muon orthogonalises whole matrices; ZeRO slices cut them).
//  - stage 0/1: the backward accumulates the whole gradient buffer; dp_reduce_grads all-reduces it
//    after the last micro-batch;
//  - stage 2: grads_memory is this rank's shard. The GPU's buckets, pieces and order
//    (llmc/model_dist.cuh), but synchronous, one bucket per layer: the backward writes a bucket into
//    a buffer of zeros but for this rank's own pieces, which start from its shard's sums so far (+=
//    accumulates the micro-batches), and each complete bucket's pieces are reduced to their owners'
//    shards (Comm::reduce_sum), replacing the values; a step's first micro-batch starts its pieces
//    from zero, so the shard is never zeroed. One buffer serves the layer buckets in turn; bucket 0
//    has its own (the backward writes it at both ends).
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
};

namespace dp_detail {
// Bucket b's buffer before the backward writes it: zeros, and (after the step's first micro-batch)
// this rank's pieces from its shard.
inline void fill_bucket(const DataParallel& dp, const Model& m, const ZeroBucket& b, float* buffer) {
    std::fill(buffer, buffer + b.elems, 0.0f);
    if (dp.first_micro) return;
    const int64_t first = dp.plan.shard_begin(dp.plan.rank);
    zero_for_each_bucket_piece(dp.plan, b, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
        if (owner == dp.plan.rank) std::copy(&m.grads_memory[lo - first], &m.grads_memory[hi - first], buffer + at);
    });
}

// Bucket b complete: each piece's sum over the ranks replaces its owner's shard values.
inline void reduce_bucket(DataParallel& dp, Model& m, const ZeroBucket& b, const float* buffer) {
    const int64_t first = dp.plan.shard_begin(dp.plan.rank);
    zero_for_each_bucket_piece(dp.plan, b, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
        dp.comm->reduce_sum(buffer + at, owner == dp.plan.rank ? &m.grads_memory[lo - first] : nullptr, hi - lo, owner);
    });
}
}  // namespace dp_detail

// Plans the shards and sizes the AdamW moments to this rank's slice; at stage 2 also the gradients,
// and points the backward at the bucket buffers (the model's hooks keep a pointer to dp). optimizer:
// the run's OptimizerKind; OPTIMIZER_MUON only at stage 0 (validate_train_config refuses the others).
inline void dp_setup(DataParallel& dp, Model& m, Comm& comm, int zero_stage, int optimizer) {
    dp.comm = &comm;
    dp.optimizer = optimizer;
    dp.plan = zero_plan((int64_t)m.num_params, zero_stage, comm.rank, comm.world);
    dist_check_same(comm, (int64_t)m.num_params, "the number of parameters (--init, --resume)");
    dist_check_same(comm, zero_stage, "--zero");
    m.m_memory.assign((size_t)dp.plan.opt_count(), 0.0f);
    m.v_memory.assign((size_t)dp.plan.opt_count(), 0.0f);
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

// Clip by the global gradient norm (over every rank's slice), one AdamW step over this rank's
// slice, and at stage 1/2 the all-gather of the updated parameters; with OPTIMIZER_MUON (stage 0)
// model_step_optimizer's step on the whole buffers. Returns the norm before clipping.
inline float dp_update(Model& m, DataParallel& dp, const OptimizerSettings& o) {
    const ZeroPlan& p = dp.plan;
    const int64_t b = p.opt_begin(), e = p.opt_end();
    const float* grads = m.grads_memory.data() + (p.stage == 2 ? 0 : b);  // the slice's gradients
    double sq = cpu::global_norm_squared(grads, (size_t)(e - b));
    if (p.stage > 0) sq = dp.comm->allreduce_sum(sq);
    const float norm = (float)std::sqrt(sq);
    m.step++;
    if (o.optimizer == OPTIMIZER_MUON) {
        if (p.stage != 0 || dp.optimizer != OPTIMIZER_MUON) fail("internal: a Muon step at ZeRO stage %d, set up for %s",
                                                                 p.stage, optimizer_name(dp.optimizer));
        model_step_optimizer(m, o, cpu::grad_clip_scale(norm, o.grad_clip));
        return norm;
    }
    cpu::adamw_update_model_range(m.params_memory.data(), m.m_memory.data(), m.v_memory.data(), grads, m.config, (size_t)b,
                                 (size_t)e, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
                                 cpu::grad_clip_scale(norm, o.grad_clip), m.step);
    if (p.stage > 0) dp.comm->allgather(m.params_memory.data(), p);
    return norm;
}

// Checkpoint DIR/step_NNNNNNNN/: rank 0 starts the .tmp directory and writes model.bin, each rank
// its slice of the optimizer state (llmc/zero.h: state.bin, or state_RRRRR.bin per rank); once
// every rank has written (barrier), rank 0 writes DONE and renames, so the checkpoint appears
// whole or not at all.
inline void dp_save_checkpoint(const Model& m, DataParallel& dp, const std::string& out_dir,
                               const int64_t loader_state[16], uint64_t rng_state) {
    Comm& comm = *dp.comm;
    const ZeroPlan& p = dp.plan;
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
// parameters, this rank's slice of the optimizer state, the step; returns the training state with
// the data position moved to this run's world size.
inline TrainState dp_load_checkpoint(Model& m, DataParallel& dp, const std::string& dir) {
    const std::string model_path = dir + "/model.bin";
    ModelFileInfo info = model_read_info(model_path.c_str());
    if (!model_same_config(info.config, m.config))
        fail("%s: the checkpoint's model shape differs from this run's", model_path.c_str());
    model_read_fp32(model_path.c_str(), m.params_memory.data());
    const ZeroPlan& p = dp.plan;
    TrainState st = zero_read_state(dir, p.n, p.opt_begin(), p.opt_end(), m.m_memory.data(), m.v_memory.data(), nullptr);
    m.step = st.step;
    zero_loader_state_for_world(st.loader, dp.comm->world, ("--resume " + dir).c_str());
    return st;
}
