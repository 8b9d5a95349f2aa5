// llmc/model_graph.cuh: one training step of the GPU model (llmc/model_train.cuh) as one CUDA graph, on one
// GPU (the data-parallel step of llmc/model_dist.cuh stays eager): captured once, replayed every step,
// no launch gap and no host wait inside it. Per step the host only stages the next step's
// micro-batches (tokens, targets, EncoderBuckets::fill's buckets) into pinned memory while the GPU
// runs this one (model_graph_stage), writes the optimizer's scalars (AdamW's, and Muon's with
// --optimizer muon, whose update is captured too: llmc/muon.cuh) and launches (model_graph_launch), and
// synchronizes once at the end to read the losses and the norm (model_update_norm).
// The graph, in stream order: zero the gradients; per micro-batch: copy its tokens, targets and
// buckets (and a masked_loss model's dloss_rows) from the staging slot, forward, classifier (the
// losses into the caller's pinned (grad_accum, N) buffer), backward; then model_update_enqueue. Two
// staging slots, each with its own graph (a copy node reads a fixed address); everything else a step
// touches has a fixed address and shape, so the graphs are captured once, after one eager step has
// loaded every kernel and set every kernel attribute. They run the eager step's kernels in the same
// order with the same arguments (but the dwte backward's grid covers any batch, its extra blocks exit,
// llmc/encoder.cuh): bit-identical losses, norms and parameters wherever the eager step is
// reproducible (--deterministic 1 in the bf16 build). dev/bench/graph.sh checks that, GPT-2 and
// Llama, bf16 and fp32, with accumulation; tests/gpu/test_loss_mask_gpu.sh with a loss mask.
#pragma once
#include "llmc/model_train.cuh"

struct ModelGraph {
    int B = 0, T = 0, grad_accum = 0;
    size_t micro_ints = 0;     // one micro-batch in a slot: inputs (N) | targets (N) | buckets (layout_ints)
                               // | masked_loss: dloss_rows (N floats)
    int* staging = nullptr;    // pinned (2 slots, grad_accum, micro_ints)
    cudaGraphExec_t exec[2] = {nullptr, nullptr};
    size_t nodes = 0;          // kernels, copies and memsets in one graph
};

inline int* model_graph_slot(const ModelGraph& g, int slot, int micro) {
    return g.staging + ((size_t)slot * g.grad_accum + micro) * g.micro_ints;
}

// Host: checks micro-batch `micro` of the step that slot `slot` feeds and writes it, with its
// buckets, into the slot; dloss_rows (N): its per-row loss gradients, given exactly for a masked_loss
// model (model_upload_batch's). The slot's graph must not be running (its step has been synchronized).
inline void model_graph_stage(ModelGraph& g, Model& model, int slot, int micro, const int* inputs, const int* targets,
                              const float* dloss_rows = nullptr) {
    const int N = g.B * g.T;
    model_check_batch(model, inputs, targets, g.B, g.T);
    if (!dloss_rows != !model.masked_loss) fail("internal: model_graph_stage: dloss_rows exactly for masked_loss");
    int* dst = model_graph_slot(g, slot, micro);
    memcpy(dst, inputs, sizeof(int) * N);
    memcpy(dst + N, targets, sizeof(int) * N);
    model.buckets.fill(dst + 2 * N, inputs, N);
    if (dloss_rows) memcpy(dst + 2 * N + model.buckets.layout_ints(), dloss_rows, sizeof(float) * N);
}

// Captures the step of grad_accum micro-batches of (B, T) = the model's shape, once per slot.
// dloss: the classifier's gradient scale (masked_loss: the staged dloss_rows instead); host_losses:
// pinned (grad_accum, B*T), where micro-batch m's losses land at m * B*T. Needs the single-GPU model
// (no data-parallel hooks) and one eager step run before (lazy kernel loading, cuBLASLt and attention
// set-up happen outside the capture).
inline void model_graph_build(ModelGraph& g, Model& model, int grad_accum, float dloss, float grad_clip,
                             float* host_losses, const CudaContext& ctx) {
    if (model.before_layer_forward || model.after_layer_backward || model.grads_of)
        fail("internal: model_graph_build needs the single-GPU model (data-parallel hooks are set)");
    g.B = model.B;
    g.T = model.T;
    g.grad_accum = grad_accum;
    const int N = g.B * g.T;
    const size_t rows_at = 2 * (size_t)N + model.buckets.layout_ints();  // dloss_rows in a micro-batch's slot
    g.micro_ints = rows_at + (model.masked_loss ? N : 0);
    cudaCheck(cudaMallocHost(&g.staging, sizeof(int) * 2 * grad_accum * g.micro_ints));
    Activations& a = model.acts;
    cudaStream_t s = ctx.stream;
    for (int slot = 0; slot < 2; slot++) {
        // --fp8: model_forward casts the FP8 weight copies when weights_step is behind model.step, a
        // host decision a capture freezes; every replay follows an update, so each slot's graph must
        // hold the cast (else slot 1's would see slot 0's bookkeeping and run on stale weights)
        model.fp8.weights_step = -1;
        cudaGraph_t graph;
        cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        model_zero_grads(model, ctx);
        for (int micro = 0; micro < grad_accum; micro++) {
            const int* src = model_graph_slot(g, slot, micro);
            cudaCheck(cudaMemcpyAsync(a.inputs, src, sizeof(int) * N, cudaMemcpyHostToDevice, s));
            cudaCheck(cudaMemcpyAsync(a.targets, src + N, sizeof(int) * N, cudaMemcpyHostToDevice, s));
            cudaCheck(cudaMemcpyAsync(model.buckets.device, src + 2 * N, sizeof(int) * model.buckets.layout_ints(),
                                      cudaMemcpyHostToDevice, s));
            if (model.masked_loss)
                cudaCheck(cudaMemcpyAsync(a.dloss_rows, src + rows_at, sizeof(float) * N, cudaMemcpyHostToDevice, s));
            model_forward(model, g.B, g.T, ctx);
            model_classifier(model, g.B, g.T, dloss, true, host_losses + (size_t)micro * N, ctx);
            model_backward(model, g.B, g.T, ctx);
        }
        model_update_enqueue(model, grad_clip, ctx);
        cudaCheck(cudaStreamEndCapture(s, &graph));
        cudaCheck(cudaGraphGetNodes(graph, nullptr, &g.nodes));
        cudaCheck(cudaGraphInstantiate(&g.exec[slot], graph, 0));
        cudaCheck(cudaGraphDestroy(graph));
        cudaCheck(cudaGraphUpload(g.exec[slot], s));
    }
    model.fp8.weights_step = -1;  // replays do not move the host's bookkeeping: an eager forward (validation) recasts
}

// Host: the step's optimizer scalars (model.step += 1), then the graph of `slot` (staged before). The
// previous step must have been synchronized (the pinned scalars are rewritten).
inline void model_graph_launch(ModelGraph& g, Model& model, int slot, const OptimizerSettings& o, const CudaContext& ctx) {
    model_update_args(model, o);
    cudaCheck(cudaGraphLaunch(g.exec[slot], ctx.stream));
}

inline void model_graph_free(ModelGraph& g) {
    for (cudaGraphExec_t& e : g.exec)
        if (e) cudaCheck(cudaGraphExecDestroy(e));
    if (g.staging) cudaCheck(cudaFreeHost(g.staging));
    g = ModelGraph();
}
