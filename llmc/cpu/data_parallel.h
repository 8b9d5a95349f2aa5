// llmc/cpu/data_parallel.h: data-parallel training of the CPU model (llmc/cpu/gpt2.h) over a
// process group (llmc/dist.h) with the ZeRO stages of llmc/zero.h; the CPU reference of the GPU's
// distributed step, and what `make test` runs with real processes (docs/distributed.md).
//
// One step, on every rank: gpt2_zero_grads; per micro-batch gpt2_forward, gpt2_loss and
// gpt2_backward with grad_scale 1 / (micro-batches * ranks), without communication; then
// dp_reduce_grads (stage 0/1: all-reduce; stage 2: reduce-scatter, each rank gets its shard) and
// dp_update (the gradient norm over the ranks, clipping, AdamW over the rank's slice, and at stage
// 1/2 the all-gather of the updated parameters). A world of one rank at stage 0 computes exactly
// what gpt2_update does.
#pragma once
#include <cmath>
#include <string>
#include "llmc/checkpoint.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/global_norm.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/dist.h"
#include "llmc/formats.h"
#include "llmc/zero.h"

struct DataParallel {
    Comm* comm = nullptr;
    ZeroPlan plan;
};

// Plans the shards and sizes the AdamW moments to this rank's slice.
inline DataParallel dp_setup(GPT2& m, Comm& comm, int zero_stage) {
    DataParallel dp;
    dp.comm = &comm;
    dp.plan = zero_plan((int64_t)m.num_params, zero_stage, comm.rank, comm.world);
    dist_check_same(comm, (int64_t)m.num_params, "the number of parameters (--init, --resume)");
    dist_check_same(comm, zero_stage, "--zero");
    m.m_memory.assign((size_t)dp.plan.opt_count(), 0.0f);
    m.v_memory.assign((size_t)dp.plan.opt_count(), 0.0f);
    return dp;
}

// After the last micro-batch: the gradients summed over the ranks (all of them at stage 0 and 1,
// this rank's shard at stage 2).
inline void dp_reduce_grads(GPT2& m, DataParallel& dp) {
    if (dp.comm->world == 1) return;
    if (dp.plan.stage == 2) dp.comm->reduce_scatter_sum(m.grads_memory.data(), dp.plan);
    else dp.comm->allreduce_sum(m.grads_memory.data(), (int64_t)m.num_params);
}

// Clip by the global gradient norm (over every rank's slice), one AdamW step over this rank's
// slice, and at stage 1/2 the all-gather of the updated parameters. Returns the norm before clipping.
inline float dp_update(GPT2& m, DataParallel& dp, const OptimizerSettings& o) {
    const ZeroPlan& p = dp.plan;
    const int64_t b = p.opt_begin(), e = p.opt_end();
    double sq = cpu::global_norm_squared(m.grads_memory.data() + b, (size_t)(e - b));
    if (p.stage > 0) sq = dp.comm->allreduce_sum(sq);
    const float norm = (float)std::sqrt(sq);
    m.step++;
    cpu::adamw_update_gpt2_range(m.params_memory.data(), m.m_memory.data(), m.v_memory.data(), m.grads_memory.data(),
                                 m.config, (size_t)b, (size_t)e, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
                                 cpu::grad_clip_scale(norm, o.grad_clip), m.step);
    if (p.stage > 0) dp.comm->allgather(m.params_memory.data(), p);
    return norm;
}

// Checkpoint DIR/step_NNNNNNNN/: rank 0 starts the .tmp directory and writes model.bin, each rank
// its slice of the optimizer state (llmc/zero.h: state.bin, or state_RRRRR.bin per rank); once
// every rank has written (barrier), rank 0 writes DONE and renames, so the checkpoint appears
// whole or not at all.
inline void dp_save_checkpoint(const GPT2& m, DataParallel& dp, const std::string& out_dir,
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
        state_write((dir + "/" + zero_state_file_name(p)).c_str(), st, m.m_memory.data(), m.v_memory.data(), nullptr);
    }
    comm.barrier();
    if (comm.primary()) checkpoint_finish(dir);
    comm.barrier();
}

// Reads checkpoint `dir` (written at any world size and stage) into the built model: the
// parameters, this rank's slice of the optimizer state, the step; returns the training state with
// the data position moved to this run's world size.
inline TrainState dp_load_checkpoint(GPT2& m, DataParallel& dp, const std::string& dir) {
    const std::string model_path = dir + "/model.bin";
    ModelFileInfo info = model_read_info(model_path.c_str());
    if (!gpt2_same_config(info.config, m.config))
        fail("%s: the checkpoint's model shape differs from this run's", model_path.c_str());
    model_read_fp32(model_path.c_str(), m.params_memory.data());
    const ZeroPlan& p = dp.plan;
    TrainState st = zero_read_state(dir, p.n, p.opt_begin(), p.opt_end(), m.m_memory.data(), m.v_memory.data(), nullptr);
    m.step = st.step;
    zero_loader_state_for_world(st.loader, dp.comm->world, ("--resume " + dir).c_str());
    return st;
}
