// llmc/model_dist.cuh: data-parallel training of the GPU model (llmc/model_train.cuh) with NCCL and the
// ZeRO stages of llmc/zero.h; the CPU reference of the same logic is llmc/cpu/data_parallel.h.
// docs/distributed.md. Built into build/train_gpt2cu_nccl (-DLLMC_NCCL, make); without LLMC_NCCL
// (build/train_gpt2cu) only one process runs and every function below is the single-GPU one.
//
// The process group (llmc/dist.h) carries only control messages (the NCCL id, checkpoint barriers,
// the step's mean loss). The tensors go over NCCL on one communication stream, ordered against the
// compute stream by events (no host waits):
//  - the gradients are reduced in buckets while the backward goes on (zero_buckets): bucket 0 holds
//    the tensors outside the layers, the others groups of consecutive layers (~DP_BUCKET_BYTES).
//    after_layer_backward(l) on the group's lowest layer records an event that releases the group's
//    reduction on the communication stream; bucket 0's follows the embedding's backward (l = -1).
//    Stage 0 and 1: the backward accumulates the whole gradient buffer; the step's last micro-batch
//    all-reduces each bucket in place.
//    Stage 2: grads_memory is this rank's shard. The backward writes bucket 0 into a buffer of its
//    own and the layer buckets into a pool of DP_POOL buffers in turn (model.grads_of), each prepared
//    by fill_bucket so that += accumulates the micro-batches as on one GPU; each complete bucket's
//    pieces are reduced to their owners' shards (grouped ncclReduce), every micro-batch. A reduction
//    replaces the shard's values and every piece is in one bucket, so the shard is never zeroed.
//  - the update: the squared norm of this rank's slice (stage 1/2: all-reduced, one float),
//    clipping, AdamW over the slice (adamw_update_range); --optimizer muon (stage 0 only, refused by
//    validate_train_config otherwise): every rank the same whole update (llmc/muon.cuh).
//  - stage 1/2: the updated slices are broadcast from their owners (grouped ncclBroadcast) bucket by
//    bucket in the next forward's order; before_layer_forward(l) makes the compute stream wait only
//    for the buckets layer l (and the next layer's norm, which layer l's last kernel applies) needs.
// The one host wait of a step (after the update, for the gradient norm) has a deadline,
// --dist-timeout: a dead or stuck rank stops the run with an error (the communicator is aborted).
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/cuda_common.cuh"
#include "llmc/dist.h"
#include "llmc/formats.h"
#include "llmc/model_train.cuh"
#include "llmc/zero.h"
#ifdef LLMC_NCCL
#include <nccl.h>
#define ncclCheck(call)                                                                                   \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) fail("NCCL: %s (%s:%d): %s", #call, __FILE__, __LINE__, ncclGetErrorString(r_)); \
    } while (0)
#endif

constexpr int64_t DP_BUCKET_BYTES = 32 << 20;  // gradient bytes per bucket of layers (at least one layer)
// ZeRO-2: buffers for the layer buckets: one being reduced while the backward writes the next
constexpr int DP_POOL = 2;

struct DpBucket {
    ZeroBucket plan;                 // its ranges and layers (llmc/zero.h)
    cudaEvent_t ready = nullptr;     // compute stream: its gradients are complete
    cudaEvent_t gathered = nullptr;  // communication stream: its updated parameters arrived
    int slot = 0;                    // stage 2: its buffer, buffers[slot] (DP_POOL: bucket 0's own)
};

struct GpuDataParallel {
    Comm* comm = nullptr;
    ZeroPlan plan;
    bool nccl_on = false;  // the NCCL build: every path below runs, at any world size
    int timeout_s = 600;
#ifdef LLMC_NCCL
    ncclComm_t nccl = nullptr;
#endif
    cudaStream_t stream = nullptr;  // the communication stream
    std::vector<DpBucket> buckets;  // [0]: the tensors outside the layers; then groups of layers, ascending
    std::vector<int> bucket_of_layer;
    bool armed = false;      // the backward being enqueued reduces its buckets (the last micro-batch; stage 2: all)
    bool gathering = false;  // parameters are being all-gathered (the forward waits per bucket)
    bool first_micro = false;  // stage 2: the backward being enqueued is its step's first (it overwrites the shard)
    cudaEvent_t main_ready = nullptr, comm_done = nullptr;
    // stage 2: the bucket buffers, one allocation: [0, DP_POOL) the layer buckets' pool (the largest
    // layer bucket each, at most one per layer bucket), [DP_POOL] bucket 0's; buffer_free[i]: the end
    // of the last reduction that read buffer i (communication stream)
    floatX* buffers[DP_POOL + 1] = {};
    int pool = 0;  // layer-bucket buffers allocated
    cudaEvent_t buffer_free[DP_POOL + 1] = {};
    void* buffer_allocation = nullptr;
    size_t allocated_bytes = 0;  // what this cudaMalloc'ed (the bench's peak_gib adds it to the model's)
};

// The GPU of this rank: its local rank on the node (LOCAL_RANK, SLURM_LOCALID, MPI's node rank).
inline int gpu_dp_device(const Comm& comm) {
    int count = 0;
    cudaCheck(cudaGetDeviceCount(&count));
    if (comm.local_rank >= count)
        fail("this rank's local rank is %d, but its node has %d GPU(s): one process per GPU (set LOCAL_RANK, or start "
             "at most %d ranks per node)", comm.local_rank, count, count);
    return comm.local_rank;
}

// Before model_build: plans the ZeRO shards for the model of `config` and tells the model which slice
// of the optimizer state (and at stage 2 of the gradients) to allocate.
inline GpuDataParallel gpu_dp_plan(Model& model, const ModelConfig& config, Comm& comm, const DistSettings& dist) {
    GpuDataParallel dp;
    dp.comm = &comm;
    dp.timeout_s = dist.timeout_s;
    dp.plan = zero_plan((int64_t)model_num_params(config), dist.zero, comm.rank, comm.world);
#ifdef LLMC_NCCL
    dp.nccl_on = true;
#else
    if (comm.world > 1 || dist.zero > 0)
        fail("--zero %d with %d rank(s): data parallel on the GPU needs the NCCL build, build/train_gpt2cu_nccl "
             "(make builds it where NCCL is installed)", dist.zero, comm.world);
#endif
    dist_check_same(comm, dp.plan.n, "the number of parameters (--init, --resume)");
    dist_check_same(comm, dist.zero, "--zero");
    model.opt_begin = dp.plan.opt_begin();
    model.opt_end = dp.plan.opt_end();
    if (dp.plan.stage == 2) model.grad_begin = dp.plan.opt_begin(), model.grad_end = dp.plan.opt_end();
    return dp;
}

#ifdef LLMC_NCCL
namespace gpu_dp_detail {
constexpr ncclDataType_t NCCL_X = std::is_same<floatX, float>::value ? ncclFloat32 : ncclBfloat16;

// Waits for everything enqueued on `s` so far, with the --dist-timeout deadline.
inline void wait_stream(GpuDataParallel& dp, cudaStream_t s, const char* doing) {
    cudaEvent_t ev;
    cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(ev, s));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0;; i++) {
        const cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) cudaCheck(e);
        if (i % 1024 == 1023) {
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(dp.nccl, &async);
            if (async != ncclSuccess && async != ncclInProgress)
                fail("NCCL: %s while %s", ncclGetErrorString(async), doing);
            if (std::chrono::steady_clock::now() - start > std::chrono::seconds(dp.timeout_s)) {
                ncclCommAbort(dp.nccl);
                fail("no progress for %d s while %s (--dist-timeout): a rank died or is stuck", dp.timeout_s, doing);
            }
        }
        std::this_thread::yield();
    }
    cudaCheck(cudaEventDestroy(ev));
}

// The compute stream's work so far before the communication stream's next work.
inline void comm_after_main(GpuDataParallel& dp, cudaStream_t main, cudaEvent_t ev) {
    cudaCheck(cudaEventRecord(ev, main));
    cudaCheck(cudaStreamWaitEvent(dp.stream, ev, 0));
}

// Stage 2, before the backward writes bucket b (compute stream): its buffer once free, zeroed, and
// after the step's first micro-batch with this rank's pieces copied in from the shard (the wait
// also covers b's reduction of the previous micro-batch, which wrote them: the communication stream
// runs in order). A step's first micro-batch starts from zero: its reductions replace the shard.
inline void fill_bucket(GpuDataParallel& dp, const DpBucket& b, const Model& model, cudaStream_t main) {
    floatX* buffer = dp.buffers[b.slot];
    cudaCheck(cudaStreamWaitEvent(main, dp.buffer_free[b.slot], 0));
    cudaCheck(cudaMemsetAsync(buffer, 0, b.plan.elems * sizeof(floatX), main));
    if (dp.first_micro) return;
    const int64_t first = dp.plan.shard_begin(dp.plan.rank);
    zero_for_each_bucket_piece(dp.plan, b.plan, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
        if (owner == dp.plan.rank)
            cudaCheck(cudaMemcpyAsync(buffer + at, model.grads_memory + (lo - first), (hi - lo) * sizeof(floatX),
                                      cudaMemcpyDeviceToDevice, main));
    });
}

// Bucket b is complete on the compute stream: stage 0/1 all-reduce its ranges of the whole gradient
// buffer in place; stage 2 reduces each piece of its buffer to the piece's owner, into its shard.
inline void reduce_bucket(GpuDataParallel& dp, DpBucket& b, Model& model, cudaStream_t main) {
    comm_after_main(dp, main, b.ready);
    floatX* grads = model.grads_memory;
    ncclCheck(ncclGroupStart());
    if (dp.plan.stage == 2) {
        const int64_t first = dp.plan.shard_begin(dp.plan.rank);
        zero_for_each_bucket_piece(dp.plan, b.plan, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
            floatX* send = dp.buffers[b.slot] + at;
            floatX* recv = owner == dp.plan.rank ? grads + (lo - first) : send;  // only the owner's is written
            ncclCheck(ncclReduce(send, recv, (size_t)(hi - lo), NCCL_X, ncclSum, owner, dp.nccl, dp.stream));
        });
    } else {
        for (const ZeroRange& r : b.plan.ranges)
            ncclCheck(ncclAllReduce(grads + r.begin, grads + r.begin, (size_t)(r.end - r.begin), NCCL_X, ncclSum, dp.nccl,
                                    dp.stream));
    }
    ncclCheck(ncclGroupEnd());
    if (dp.plan.stage == 2) cudaCheck(cudaEventRecord(dp.buffer_free[b.slot], dp.stream));
}

inline void gather_bucket(GpuDataParallel& dp, DpBucket& b, floatX* params) {
    ncclCheck(ncclGroupStart());
    zero_for_each_bucket_piece(dp.plan, b.plan, [&](int owner, int64_t lo, int64_t hi, int64_t) {
        ncclCheck(ncclBroadcast(params + lo, params + lo, (size_t)(hi - lo), NCCL_X, owner, dp.nccl, dp.stream));
    });
    ncclCheck(ncclGroupEnd());
    cudaCheck(cudaEventRecord(b.gathered, dp.stream));
}

// The buckets (llmc/zero.h) with their events, and at stage 2 their buffers.
inline void plan_buckets(GpuDataParallel& dp, const ModelConfig& c) {
    const std::vector<ZeroBucket> plans = zero_buckets(c, DP_BUCKET_BYTES / (int64_t)sizeof(floatX));
    dp.bucket_of_layer = zero_bucket_of_layer(plans, c.num_layers);
    int64_t largest = 0;
    for (size_t k = 0; k < plans.size(); k++) {
        DpBucket b;
        b.plan = plans[k];
        b.slot = k == 0 ? DP_POOL : (int)((k - 1) % DP_POOL);
        cudaCheck(cudaEventCreateWithFlags(&b.ready, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&b.gathered, cudaEventDisableTiming));
        if (k > 0) largest = std::max(largest, b.plan.elems);
        dp.buckets.push_back(b);
    }
    if (dp.plan.stage != 2) return;
    dp.pool = (int)std::min<size_t>(DP_POOL, plans.size() - 1);
    std::vector<BufferSpec> specs = {{(void**)&dp.buffers[DP_POOL], (size_t)plans[0].elems, sizeof(floatX)}};
    for (int i = 0; i < dp.pool; i++) specs.push_back({(void**)&dp.buffers[i], (size_t)largest, sizeof(floatX)});
    dp.buffer_allocation = specs_allocate(specs, "the ZeRO-2 gradient bucket buffers");
    dp.allocated_bytes = specs_bytes(specs);
    for (cudaEvent_t& e : dp.buffer_free) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}
}  // namespace gpu_dp_detail
#endif

// After model_build: the NCCL communicator (its id from rank 0 over the process group), the
// communication stream, the buckets, and the model's hooks.
inline void gpu_dp_start([[maybe_unused]] GpuDataParallel& dp, [[maybe_unused]] Model& model,
                         [[maybe_unused]] const CudaContext& ctx) {
#ifdef LLMC_NCCL
    using namespace gpu_dp_detail;
    Comm& comm = *dp.comm;
    ncclUniqueId id;
    if (comm.primary()) ncclCheck(ncclGetUniqueId(&id));
    comm.broadcast(&id, sizeof id, 0);
    ncclCheck(ncclCommInitRank(&dp.nccl, comm.world, id, comm.rank));
    cudaCheck(cudaStreamCreateWithFlags(&dp.stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&dp.main_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&dp.comm_done, cudaEventDisableTiming));
    plan_buckets(dp, model.config);
    cudaStream_t main = ctx.stream;
    GpuDataParallel* d = &dp;
    Model* m = &model;
    auto bucket_of = [d](int l) -> DpBucket& { return d->buckets[l < 0 ? 0 : d->bucket_of_layer[l]]; };
    model.after_layer_backward = [d, m, main, bucket_of](int l) {
        if (!d->armed) return;
        DpBucket& b = bucket_of(l);
        if (l < 0 || l == b.plan.first_layer) reduce_bucket(*d, b, *m, main);  // the backward walks down
    };
    if (dp.plan.stage == 2)
        model.grads_of = [d, m, main, bucket_of](int l) {
            DpBucket& b = bucket_of(l);
            if (l < 0 || l == b.plan.last_layer) fill_bucket(*d, b, *m, main);  // its first layer going down
            return zero_bucket_grads(d->buffers[b.slot], b.plan, l);
        };
    model.before_layer_forward = [d, main](int l) {
        if (!d->gathering) return;
        const int L = (int)d->bucket_of_layer.size();
        auto wait = [&](int bucket) { cudaCheck(cudaStreamWaitEvent(main, d->buckets[bucket].gathered, 0)); };
        if (l < 0) wait(0);  // the embedding now, lnf and the classifier at the end
        if (l < 0 && L > 0) wait(d->bucket_of_layer[0]);
        if (l >= 0 && l + 1 < L && d->bucket_of_layer[l + 1] != d->bucket_of_layer[l]) wait(d->bucket_of_layer[l + 1]);
    };
    printf("data parallel: %d rank(s) (%s), NCCL %d.%d, zero %d, %zu buckets of <= %lld MiB; this rank keeps the "
           "optimizer state of %lld of %lld parameters\n", comm.world, comm.how.c_str(), NCCL_MAJOR, NCCL_MINOR,
           dp.plan.stage, dp.buckets.size(), (long long)(DP_BUCKET_BYTES >> 20), (long long)dp.plan.opt_count(),
           (long long)dp.plan.n);
    const double MiB = 1048576.0, whole = aligned_size(dp.plan.n * sizeof(floatX)) / MiB;
    if (dp.plan.stage == 2) {
        const double shard = aligned_size(dp.plan.opt_count() * sizeof(floatX)) / MiB, buffers = dp.allocated_bytes / MiB;
        const double outside = aligned_size(dp.buckets[0].plan.elems * sizeof(floatX)) / MiB;
        printf("gradients: %.1f MiB a rank = shard %.1f MiB + bucket buffers %.1f MiB (outside the layers %.1f MiB, pool "
               "%d x %.1f MiB); the whole buffer is %.1f MiB\n", shard + buffers, shard, buffers, outside, dp.pool,
               dp.pool ? (buffers - outside) / dp.pool : 0.0, whole);
    } else {
        printf("gradients: %.1f MiB a rank (the whole buffer)\n", whole);
    }
#endif
}

// At a step's start, in place of model_zero_grads: the gradients zeroed, except stage 2's shard,
// which the first micro-batch's reductions overwrite (fill_bucket).
inline void gpu_dp_zero_grads(const GpuDataParallel& dp, Model& model, const CudaContext& ctx) {
    if (dp.plan.stage != 2) model_zero_grads(model, ctx);  // stage 2 needs NCCL (gpu_dp_plan)
}

// Before each micro-batch's backward: whether its buckets reduce as they complete (the step's last
// micro-batch; at stage 2 every one), and whether it is the step's first (stage 2: its bucket
// buffers start from zero and its reductions replace the shard).
inline void gpu_dp_before_backward(GpuDataParallel& dp, bool first_micro, bool last_micro) {
    dp.armed = dp.nccl_on && (last_micro || dp.plan.stage == 2);
    dp.first_micro = first_micro;
}

// After the step's last backward: the compute stream waits for every reduction (they were enqueued
// by the backward's hooks).
inline void gpu_dp_wait_grads(GpuDataParallel& dp, const CudaContext& ctx) {
    if (!dp.armed) return;  // always without NCCL
    cudaCheck(cudaEventRecord(dp.comm_done, dp.stream));
    cudaCheck(cudaStreamWaitEvent(ctx.stream, dp.comm_done, 0));
    dp.armed = false;
}

// model_update over this rank's slice (the squared norm summed over the ranks on the device), then
// at stage 1/2 the all-gather of the updated parameters (left running: the next forward waits bucket
// by bucket). Returns the gradient norm before clipping, after the one host wait (--dist-timeout),
// with the compute stream idle as model_update leaves it.
inline float gpu_dp_update(GpuDataParallel& dp, Model& model, const OptimizerSettings& o, const CudaContext& ctx) {
#ifdef LLMC_NCCL
    using namespace gpu_dp_detail;
    model_update_args(model, o);  // the pinned buffer's last copy ran before the last step's wait
    std::function<void(float*)> sum_norm;  // stage 1/2: the slices' squared norms summed over the ranks
    if (dp.plan.stage > 0)
        sum_norm = [&](float* norm_sq) {
            comm_after_main(dp, ctx.stream, dp.main_ready);
            ncclCheck(ncclAllReduce(norm_sq, norm_sq, 1, ncclFloat32, ncclSum, dp.nccl, dp.stream));
            cudaCheck(cudaEventRecord(dp.comm_done, dp.stream));
            cudaCheck(cudaStreamWaitEvent(ctx.stream, dp.comm_done, 0));
        };
    model_update_enqueue(model, o.grad_clip, ctx, sum_norm);  // over this rank's slice [opt_begin, opt_end)
    if (dp.plan.stage > 0) {
        comm_after_main(dp, ctx.stream, dp.main_ready);
        for (DpBucket& bk : dp.buckets) gather_bucket(dp, bk, model.params_memory);
        dp.gathering = true;
    }
    wait_stream(dp, ctx.stream, "waiting for the update (the gradient norm over the ranks)");
    return model_update_norm(model);
#else
    (void)dp;
    return model_update(model, o, ctx);
#endif
}

// Checkpoint DIR/step_NNNNNNNN/ (llmc/zero.h): rank 0 writes model.bin, every rank its slice of
// the optimizer state (m, v, master), then rank 0 writes DONE and renames once all have (barrier).
inline void gpu_dp_save_checkpoint(GpuDataParallel& dp, const Model& model, const std::string& out_dir,
                                   const int64_t loader_state[16], uint64_t rng_state) {
    if (!dp.nccl_on) return model_save_checkpoint(model, out_dir, loader_state, rng_state);
    Comm& comm = *dp.comm;
    const ZeroPlan& p = dp.plan;
    cudaCheck(cudaDeviceSynchronize());  // the update and the all-gather are done
    std::string dir;
    if (comm.primary()) dir = checkpoint_begin(out_dir, model.step);
    comm.broadcast(dir, 0);
    if (comm.primary()) model_write_model(model, dir + "/model.bin");
    if (zero_writes_state(p)) model_write_state(model, dir + "/" + zero_state_file_name(p), loader_state, rng_state);
    if (model.fp8.metas) fp8_write_state(model.fp8, model.step, dir + "/" + fp8_state_file_name(comm.rank, comm.world));
    comm.barrier();
    if (comm.primary()) checkpoint_finish(dir);
    comm.barrier();
}

// Reads checkpoint `dir` (any world size and stage) into the built model: parameters, this rank's
// slice of m, v and master, step and rounding seed; returns the state with the data position moved
// to this run's world size.
inline TrainState gpu_dp_load_checkpoint(GpuDataParallel& dp, Model& model, const std::string& dir) {
    if (!dp.nccl_on) return model_load_checkpoint(model, dir);
    model_load_params(model, dir + "/model.bin");
    const ZeroPlan& p = dp.plan;
    const size_t k = (size_t)p.opt_count();
    std::vector<float> m(k), v(k), master(k);
    TrainState st = zero_read_state(dir, p.n, p.opt_begin(), p.opt_end(), m.data(), v.data(), master.data());
    model_set_state(model, st, m.data(), v.data(), master.data());
    if (model.fp8.metas) fp8_read_state(model.fp8, st.step, fp8_state_file_to_read(dir, dp.comm->rank));
    zero_loader_state_for_world(st.loader, dp.comm->world, ("--resume " + dir).c_str());
    return st;
}

inline void gpu_dp_finish(GpuDataParallel& dp) {
#ifdef LLMC_NCCL
    if (!dp.nccl_on) return;
    cudaCheck(cudaStreamSynchronize(dp.stream));
    for (DpBucket& b : dp.buckets) {
        cudaCheck(cudaEventDestroy(b.ready));
        cudaCheck(cudaEventDestroy(b.gathered));
    }
    cudaCheck(cudaEventDestroy(dp.main_ready));
    cudaCheck(cudaEventDestroy(dp.comm_done));
    if (dp.buffer_allocation) {
        cudaCheck(cudaFree(dp.buffer_allocation));
        for (cudaEvent_t e : dp.buffer_free) cudaCheck(cudaEventDestroy(e));
    }
    ncclCheck(ncclCommDestroy(dp.nccl));
    cudaCheck(cudaStreamDestroy(dp.stream));
#endif
    dp.nccl_on = false;
}
