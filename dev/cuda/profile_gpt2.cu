// profile_gpt2.cu: where one training step of the GPU trainer spends its time, kernel by kernel.
//   dev/cuda/build/profile_gpt2 [--model d12] [--batch 64] [--seq 1024] [--max-seq 1024] [--steps 3] [--recompute 0] [--graph 0]
//                               [--fp8 0] [--fp8-scaling delayed] [--fp8-fused 1] [--fp8-head 0]
//                               [--stochastic-rounding 1] [--deterministic 0] [--optimizer adamw] [--write-model FILE]
// Includes the trainer's model (llmc/model_train.cuh) and runs its step functions on random tokens:
// upload, zero grads, forward, loss, backward, update; with --graph 1 the trainer's CUDA-graph step
// (llmc/model_graph.cuh: the same kernels, captured once, one launch a step; the batch is staged on
// the host before the launch, as the trainer does while the previous step runs). After
// two warm-up steps and one more once CUPTI is on, CUPTI's activity API records the device
// start/end of every kernel, memset and memcpy of `--steps` steps; the report, per step:
//   1. phases (CUDA events around each trainer call; includes the gaps where the host waits; with
//      --graph 1 the step alone: a graph has no events inside),
//   2. every kernel: calls, ms, % of kernel time, mean us; sorted by time,
//   3. kernel families (matmul, attention, layernorm, ...) summed, so the next target is visible,
//   4. kernel time against step time: the rest is launch gaps and host synchronization.
// --optimizer muon profiles the trainer's --optimizer muon update (llmc/muon.cuh, the trainer's defaults):
// the update phase is then the norm, AdamW on the other tensors and the Muon step, whose
// Newton-Schulz GEMMs count as the family "matmul (cuBLASLt)" and its own kernels as "muon".
// --fp8 1 profiles the trainer's FP8 step (llmc/model_fp8.cuh) with the trainer's FP8 defaults and the
// given scaling recipe; its casts, amax passes and scale updates are the family "fp8 casts + scales"
// (the fused GELU casts of llmc/fp8_fused.cuh included), its matmuls are cuBLASLt's as the bf16 ones.
// Kernel timestamps need no instrumentation of the trainer, and cuBLASLt's own kernels show up too.
// The numerics switches the trainer does not ship live here: --fp8-fused 0 (delayed scaling's casts
// as separate passes) and --stochastic-rounding 0 (AdamW's bf16 write-back to nearest). With
// --write-model FILE the run also prints every step's loss and writes its final parameters, so two
// runs that differ in a switch compare bit for bit (dev/bench/fp8_same.sh: fused casts = separate).
// Built with NCCL (dev/cuda/Makefile does where NCCL is installed), --zero Z runs the trainer's
// data-parallel step at world size 1 (llmc/model_dist.cuh: the gradient buckets, the communication
// stream, ZeRO stage Z); every NCCL kernel runs on that stream and is listed as "[comm stream] ...",
// its family "communication (comm stream)", so the report shows what the stream costs.
// --timeline FILE writes every kernel, memset and memcpy of the profiled steps (device start/end in
// ns, CUDA stream id, short name) as CSV, to see where streams overlap and where the GPU idles: at
// world size 1 NCCL's reductions are device copies, "[memcpy other]" on the communication stream's id.
#include "llmc/model_train.cuh"
#include "llmc/model_dist.cuh"
#include "llmc/model_graph.cuh"
#include "llmc/flags.h"

#include <cupti.h>
#include <cxxabi.h>
#include <map>
#include <mutex>

#define cuptiCheck(stmt)                                                                               \
    do {                                                                                                \
        CUptiResult r_ = (stmt);                                                                        \
        if (r_ != CUPTI_SUCCESS) {                                                                      \
            const char* s_ = nullptr;                                                                   \
            cuptiGetResultString(r_, &s_);                                                              \
            fail("CUPTI: %s\n  in %s at %s:%d (activity tracing needs libcupti from the CUDA toolkit)", \
                 s_ ? s_ : "?", #stmt, __FILE__, __LINE__);                                             \
        }                                                                                               \
    } while (0)

namespace prof {

struct Stat {
    double ns = 0;
    int64_t calls = 0;
};
std::map<std::string, Stat> kernels;  // short kernel name -> totals over the profiled steps
std::mutex kernels_mutex;             // CUPTI may deliver a full buffer from its own thread
// --timeline FILE: every record of the profiled steps, for a look at the streams' gaps and overlaps
struct Record {
    uint64_t start, end;
    uint32_t stream;
    std::string what;
};
bool keep_timeline = false;
std::vector<Record> timeline;

// "void layernorm_forward_warp_per_row<true>(__nv_bfloat16*, ...)" -> "layernorm_forward_warp_per_row<true>"
std::string short_name(const char* mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : mangled;
    free(d);
    if (s.compare(0, 5, "void ") == 0) s = s.substr(5);
    int depth = 0;  // cut the parameter list: the first '(' outside template brackets
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        else if (s[i] == '>') depth--;
        else if (s[i] == '(' && depth == 0) { s.resize(i); break; }
    }
    if (s.size() > 90) s = s.substr(0, 87) + "...";
    return s;
}

// Families by name: the shipped kernels are named for their op, cuBLASLt's contain gemm/xmma.
// Attention is matched first: cuDNN's fused attention kernels (USE_CUDNN=1 builds) carry names such
// as cudnn_generated_fort_native_sdpa_sm90_flash_..., which can also contain the matmul markers, and
// its backward's helpers are cudnn::fusion::compute_dot_do_o_specialized (the dO.O row sums) and
// cudnn::fusion::convert_dq_to_16bits (seen on an H200 with cuDNN 9, 2026-12-03).
const char* family(const std::string& n) {
    auto has = [&](const char* k) { return n.find(k) != std::string::npos; };
    if (has("[comm stream]")) return "communication (comm stream)";
    if (has("attention") || has("sdpa") || has("flash") || has("fmha") || has("cudnn::fusion")) return "attention";
    if (has("gemm") || has("xmma") || has("cutlass") || has("sm90_") || has("splitK") || has("Kernel2")) return "matmul (cuBLASLt)";
    if (has("fp8_")) return "fp8 casts + scales";  // the fused ones too: FP8 LayerNorm, GELU casts (llmc/fp8_fused.cuh)
    if (has("layernorm")) return "layernorm";
    if (has("rmsnorm")) return "rmsnorm";
    if (has("rope_")) return "rope";
    if (has("swiglu")) return "swiglu";
    if (has("classifier")) return "fused classifier";
    if (has("encoder")) return "encoder";
    if (has("gelu")) return "gelu";
    if (has("bias_backward") || has("column_partials")) return "bias / column sums";
    if (has("muon_")) return "muon";
    if (has("adamw")) return "adamw";
    if (has("global_norm")) return "global norm";
    if (has("[memset")) return "memset";
    if (has("[memcpy")) return "memcpy";
    return "other";
}

// CUPTI fills kernel and memcpy records in the newest layout its headers declare: Kernel10 from
// CUDA 13, Kernel9 in CUDA 12; Memcpy6 from CUDA 12.8 (CUPTI API 26), Memcpy5 before. The fields read
// here (name, start, end, copyKind) sit at the same offsets in all of them.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
#else
using KernelRecord = CUpti_ActivityKernel9;
#endif
#if CUPTI_API_VERSION >= 26
using MemcpyRecord = CUpti_ActivityMemcpy6;
#else
using MemcpyRecord = CUpti_ActivityMemcpy5;
#endif

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 16u << 20;
    *buffer = (uint8_t*)aligned_alloc(8, *size);
    if (!*buffer) fail("out of host memory for the CUPTI activity buffer");
    *max_records = 0;
}

// One record (kernels_mutex held): into its name's totals, and with --timeline into the timeline.
void add(const std::string& name, uint64_t start, uint64_t end, uint32_t stream) {
    Stat& s = kernels[name];
    s.ns += (double)(end - start);
    s.calls++;
    if (keep_timeline) timeline.push_back({start, end, stream, name});
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(kernels_mutex);
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            auto* k = (KernelRecord*)rec;
            std::string name = short_name(k->name);
            if (name.find("nccl") != std::string::npos) name = "[comm stream] " + name;  // llmc/model_dist.cuh
            add(name, k->start, k->end, k->streamId);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            auto* m = (CUpti_ActivityMemset4*)rec;
            add("[memset]", m->start, m->end, m->streamId);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            auto* m = (MemcpyRecord*)rec;
            const char* kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "[memcpy HtoD]"
                               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "[memcpy DtoH]"
                                                                                : "[memcpy other]";
            add(kind, m->start, m->end, m->streamId);
        }
    }
    free(buffer);
}

}  // namespace prof

int main(int argc, char** argv) {
    std::string model_desc = "d12";
    int B = 64, T = 1024, max_seq = 0, steps = 3, recompute = 0, zero = -1, use_graph = 0, fp8 = 0, fp8_fused = 1, fp8_head = 0;
    int stochastic_rounding = 1, deterministic = 0;
    std::string fp8_scaling = "delayed", timeline_path, model_path, optimizer = "adamw";
    FlagParser parser("profile_gpt2", "Per-kernel time breakdown of one GPU training step on random tokens. Example:\n"
                      "  dev/cuda/build/profile_gpt2 --batch 64 --seq 1024");
    parser.add_string("--model", "MODEL", &model_desc, "model shape: dN = N layers, 64*N channels (d12 = GPT-2 124M), "
                      "gpt2*, or a llama:L..,C..,H.. descriptor as the trainer's --init");
    parser.add_int("--batch", &B, {1, 4096}, "micro-batch size B");
    parser.add_int("--seq", &T, {1, 1 << 20}, "sequence length T (<= the model's max_seq_len)");
    parser.add_int("--max-seq", &max_seq, {0, 1 << 20}, "max_seq_len of the model, as the trainer's --max-seq "
                   "(0 = the descriptor's, 1024; e.g. --seq 4096 --max-seq 4096)");
    parser.add_int("--steps", &steps, {1, 100}, "profiled steps, after 3 warm-up steps; the report is per step");
    parser.add_int("--recompute", &recompute, {0, 1}, "1 = the trainer's --recompute memory mode");
    parser.add_int("--graph", &use_graph, {0, 1}, "1 = the trainer's --graph 1 step: one CUDA graph launch a step "
                   "(captured after the warm-up steps)");
    parser.add_int("--fp8", &fp8, {0, 1}, "1 = the trainer's --fp8 1 step (bf16 build)");
    parser.add_string("--fp8-scaling", "HOW", &fp8_scaling, "with --fp8 1: delayed | current | rowwise (the trainer's flag; default delayed)");
    parser.add_int("--fp8-fused", &fp8_fused, {0, 1}, "with --fp8 1 --fp8-scaling delayed: 1 = the casts run inside "
                   "the kernels that produce their tensors (the trainer's path: the LayerNorms write qkv's and fc's "
                   "FP8 inputs, GELU and its backward run inside the casts of fcproj's input and fc's dY, every dY cast "
                   "sums its bias gradient), 0 = separate passes");
    parser.add_int("--fp8-head", &fp8_head, {0, 1}, "with --fp8 1: the trainer's --fp8-head (the output head in FP8)");
    parser.add_int("--stochastic-rounding", &stochastic_rounding, {0, 1}, "bf16 build: 1 = AdamW writes the updated "
                   "bf16 parameters with stochastic rounding (unbiased; the trainer's), 0 = to nearest (small updates "
                   "are lost; docs/numerics.md)");
    parser.add_int("--deterministic", &deterministic, {0, 1}, "1 = the trainer's --deterministic 1 (the attention "
                   "backward sums dQ in a fixed order)");
    parser.add_choice("--optimizer", "NAME", &optimizer, {"adamw", "muon"}, "optimizer", "the trainer's --optimizer: "
                      "adamw, or muon (Muon on the blocks' matrices, AdamW on the rest; at --zero 0 only)");
    parser.add_string("--write-model", "FILE", &model_path, "after the run, write the parameters to FILE (a model "
                      ".bin) and print every step's loss (a `losses:` line), to compare two runs bit for bit");
    parser.add_string("--timeline", "FILE", &timeline_path, "also write every kernel, memset and memcpy of the profiled "
                      "steps to FILE as CSV (start_ns,end_ns,stream,name; device timestamps)");
#ifdef LLMC_NCCL
    parser.add_int("--zero", &zero, {-1, 2}, "0|1|2: the NCCL data-parallel step at world size 1 at this ZeRO stage, "
                   "its communication stream's kernels listed as [comm stream]; -1: the single-GPU step");
#endif
    parser.parse(argc, argv);
    const bool muon = optimizer == "muon";
    if (muon && zero > 0) fail("--optimizer muon with --zero %d: Muon runs at --zero 0 only (as in the trainer)", zero);
    if (use_graph && zero >= 0) fail("--graph 1 with --zero %d: the data-parallel step stays eager (as in the trainer)", zero);

    CudaContext ctx;
    ctx.init(0);
    ModelConfig config = model_config_from_descriptor(model_desc.c_str());
    if (max_seq > 0) config.max_seq_len = max_seq;
    printf("device: %s, %d SMs; precision %s\n", ctx.props.name, ctx.props.multiProcessorCount, PRECISION_NAME);
    model_print_config(config);
    Model model;
    if (fp8) {
        if (fp8_scaling != "current" && fp8_scaling != "delayed" && fp8_scaling != "rowwise")
            fail("--fp8-scaling %s: expected current, delayed or rowwise", fp8_scaling.c_str());
        Fp8Settings& f = model.fp8.set;  // the trainer's defaults (train_gpt2.cu's fp8_settings) but the recipe
        f.enabled = true;
        f.scaling = fp8_scaling == "delayed" ? Fp8Scaling::DELAYED
                  : fp8_scaling == "rowwise" ? Fp8Scaling::ROWWISE : Fp8Scaling::CURRENT;
        f.wgrad_bf16 = f.scaling == Fp8Scaling::ROWWISE;
        f.fused = fp8_fused != 0;
        f.head = fp8_head != 0;
        printf("fp8: %s scaling%s%s\n", fp8_scaling.c_str(),
               f.scaling == Fp8Scaling::DELAYED ? (fp8_fused ? ", fused casts" : ", separate casts") : "",
               fp8_head ? ", head in FP8" : "");
    } else if (fp8_head) {
        fail("--fp8-head 1: only with --fp8 1");
    }
    LocalComm comm;  // world size 1
    DistSettings dist;
    dist.zero = std::max(zero, 0);
    GpuDataParallel dp;
    if (zero >= 0) dp = gpu_dp_plan(model, config, comm, dist);
    model.optimizer = muon ? OPTIMIZER_MUON : OPTIMIZER_ADAMW;  // muon: its scratch allocated by model_build
    model_build(model, config, B, T, recompute != 0, ctx);
    if (zero >= 0) gpu_dp_start(dp, model, ctx);
    model.stochastic_rounding = stochastic_rounding != 0;
    model.deterministic = deterministic != 0;
    {
        std::vector<float> host(model.num_params);
        model_init_params(host.data(), config, 1337);
        model_set_params(model, host.data());
    }
    const int N = B * T, V = config.vocab_size;
    std::vector<int> inputs(N), targets(N);
    Rng data_rng(42);
    OptimizerSettings opt{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    opt.optimizer = model.optimizer;
    opt.muon_lr = 0.02f;  // the trainer's --muon-lr; the other Muon settings are its defaults too

    // One training step; events[0..5] bracket upload+zero, forward, loss, backward, update.
    constexpr int PHASES = 5;
    const char* phase_names[PHASES] = {"upload + zero grads", "forward", "loss (fused classifier)", "backward",
                                       muon ? "update (norm, adamw + muon)" : "update (norm + adamw)"};
    cudaEvent_t ev[PHASES + 1];
    for (auto& e : ev) cudaCheck(cudaEventCreate(&e));
    double phase_ms[PHASES] = {}, step_ms = 0;
    float loss = 0;
    std::vector<float> losses;  // every step's, for --write-model
    ModelGraph graph;
    auto step = [&](bool record) {
        for (int i = 0; i < N; i++) {
            inputs[i] = (int)data_rng.below(V);
            targets[i] = (int)data_rng.below(V);
        }
        if (graph.exec[0]) {  // --graph 1 after the warm-up: slot 0 every step (each step is waited for)
            model_graph_stage(graph, model, 0, 0, inputs.data(), targets.data());
            cudaCheck(cudaEventRecord(ev[0], ctx.stream));
            model_graph_launch(graph, model, 0, opt, ctx);
            cudaCheck(cudaEventRecord(ev[PHASES], ctx.stream));
            cudaCheck(cudaEventSynchronize(ev[PHASES]));
            loss = (float)mean_of(model.host_losses, N);
            losses.push_back(loss);
            if (!record) return;
            float ms;
            cudaCheck(cudaEventElapsedTime(&ms, ev[0], ev[PHASES]));
            step_ms += ms;
            return;
        }
        cudaCheck(cudaEventRecord(ev[0], ctx.stream));
        model_upload_batch(model, inputs.data(), targets.data(), B, T, true, ctx);
        gpu_dp_zero_grads(dp, model, ctx);  // without --zero: model_zero_grads
        cudaCheck(cudaEventRecord(ev[1], ctx.stream));
        model_forward(model, B, T, ctx);
        cudaCheck(cudaEventRecord(ev[2], ctx.stream));
        loss = model_loss(model, B, T, 1.0f / N, true, ctx);
        losses.push_back(loss);
        cudaCheck(cudaEventRecord(ev[3], ctx.stream));
        if (zero >= 0) gpu_dp_before_backward(dp, true, true);
        model_backward(model, B, T, ctx);
        if (zero >= 0) gpu_dp_wait_grads(dp, ctx);
        cudaCheck(cudaEventRecord(ev[4], ctx.stream));
        if (zero >= 0) gpu_dp_update(dp, model, opt, ctx);
        else model_update(model, opt, ctx);
        cudaCheck(cudaEventRecord(ev[5], ctx.stream));
        cudaCheck(cudaEventSynchronize(ev[5]));
        if (!record) return;
        for (int p = 0; p < PHASES; p++) {
            float ms;
            cudaCheck(cudaEventElapsedTime(&ms, ev[p], ev[p + 1]));
            phase_ms[p] += ms;
        }
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, ev[0], ev[PHASES]));
        step_ms += ms;
    };
    for (int i = 0; i < 2; i++) step(false);  // cuBLASLt heuristics, lazy module loading
    if (use_graph) model_graph_build(graph, model, 1, 1.0f / N, opt.grad_clip, model.host_losses, ctx);

    cuptiCheck(cuptiActivityRegisterCallbacks(prof::buffer_requested, prof::buffer_completed));
    cuptiCheck(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    cuptiCheck(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    cuptiCheck(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    // CUPTI sets itself up on the first API calls after enabling: keep that step out of the report
    // (the first run, without this, showed 4.4 ms/step in the upload phase, averaged over 3 steps)
    step(false);
    cudaCheck(cudaDeviceSynchronize());
    cuptiCheck(cuptiActivityFlushAll(1));
    {
        std::lock_guard<std::mutex> lock(prof::kernels_mutex);
        prof::kernels.clear();
        prof::keep_timeline = !timeline_path.empty();
    }
    for (int i = 0; i < steps; i++) step(true);
    cudaCheck(cudaDeviceSynchronize());
    cuptiCheck(cuptiActivityFlushAll(1));
    size_t dropped = 0;
    cuptiCheck(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
    if (!timeline_path.empty()) {
        std::sort(prof::timeline.begin(), prof::timeline.end(),
                  [](const prof::Record& a, const prof::Record& b) { return a.start < b.start; });
        const std::string tmp = timeline_path + ".tmp";
        FILE* f = fopen(tmp.c_str(), "w");
        if (!f) fail("--timeline %s: cannot write %s", timeline_path.c_str(), tmp.c_str());
        fprintf(f, "start_ns,end_ns,stream,name\n");
        for (const prof::Record& r : prof::timeline)
            fprintf(f, "%llu,%llu,%u,\"%s\"\n", (unsigned long long)r.start, (unsigned long long)r.end, r.stream,
                    r.what.c_str());
        const bool write_failed = ferror(f) != 0;
        if (fclose(f) != 0 || write_failed || rename(tmp.c_str(), timeline_path.c_str()) != 0)
            fail("--timeline %s: writing it failed (disk full?)", timeline_path.c_str());
        printf("timeline: %zu records of %d steps in %s\n", prof::timeline.size(), steps, timeline_path.c_str());
    }

    // ---- report, per step
    const double tok_s = (double)N / (step_ms / steps / 1e3);
    const double tflops = flops_per_token(config, T) * N / (step_ms / steps / 1e3) / 1e12;
    printf("\n%s%s%s, B=%d T=%d%s%s, %d profiled steps: %.2f ms/step (GPU, events), %.0f tok/s, %.0f TFLOP/s "
           "(%.1f%% of the 989 bf16 peak), last loss %.4f\n",
           model_desc.c_str(), muon ? " --optimizer muon" : "", fp8 ? (" --fp8 1 " + fp8_scaling + (fp8_scaling == "delayed" && !fp8_fused ? " unfused" : "") + (fp8_head ? " head" : "")).c_str() : "",
           B, T, zero >= 0 ? (", NCCL data parallel at world size 1, zero " + std::to_string(zero)).c_str()
                                               : "", use_graph ? ", one CUDA graph a step" : "", steps, step_ms / steps,
           tok_s, tflops, 100.0 * tflops / 989.0, loss);
    printf("\n%-28s %10s %7s\n", "phase", "ms/step", "%");
    if (use_graph) printf("%-28s %10.3f %6.1f%%\n", "graph launch (whole step)", step_ms / steps, 100.0);
    else
        for (int p = 0; p < PHASES; p++)
            printf("%-28s %10.3f %6.1f%%\n", phase_names[p], phase_ms[p] / steps, 100.0 * phase_ms[p] / step_ms);

    std::vector<std::pair<std::string, prof::Stat>> rows(prof::kernels.begin(), prof::kernels.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ns > b.second.ns; });
    double kernel_ns = 0;
    std::map<std::string, prof::Stat> families;
    for (auto& r : rows) {
        kernel_ns += r.second.ns;
        prof::Stat& f = families[prof::family(r.first)];
        f.ns += r.second.ns;
        f.calls += r.second.calls;
    }
    printf("\n%-90s %9s %10s %7s %10s\n", "kernel", "calls", "ms/step", "%", "mean us");
    for (auto& r : rows)
        printf("%-90s %9.1f %10.3f %6.1f%% %10.1f\n", r.first.c_str(), (double)r.second.calls / steps,
               r.second.ns / 1e6 / steps, 100.0 * r.second.ns / kernel_ns, r.second.ns / 1e3 / r.second.calls);
    std::vector<std::pair<std::string, prof::Stat>> fams(families.begin(), families.end());
    std::sort(fams.begin(), fams.end(), [](auto& a, auto& b) { return a.second.ns > b.second.ns; });
    printf("\n%-28s %9s %10s %7s\n", "family", "calls", "ms/step", "%");
    for (auto& f : fams)
        printf("%-28s %9.1f %10.3f %6.1f%%\n", f.first.c_str(), (double)f.second.calls / steps, f.second.ns / 1e6 / steps,
               100.0 * f.second.ns / kernel_ns);
    printf("\nkernel + copy time %.3f ms/step of %.3f ms/step: %.1f%% busy, the rest is launch gaps and host syncs%s\n",
           kernel_ns / 1e6 / steps, step_ms / steps, 100.0 * kernel_ns / 1e6 / step_ms,
           dropped ? " (CUPTI DROPPED RECORDS: totals are low)" : "");
    if (rows.empty()) fail("CUPTI recorded no kernels: activity tracing does not work on this machine");
    cudaCheck(cudaDeviceSynchronize());
    if (!model_path.empty()) {
        printf("\nlosses:");
        for (float l : losses) printf(" %.6f", l);
        printf("\n");
        model_write_model(model, model_path);
        printf("model: wrote %s\n", model_path.c_str());
    }
    if (zero >= 0) gpu_dp_finish(dp);
    model_graph_free(graph);
    model_free(model);
    ctx.destroy();
    return 0;
}
