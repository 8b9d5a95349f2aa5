// train_config.h: the command line of both trainers. TrainConfig holds every setting the CPU
// and GPU trainers share; the GPU trainer registers its own flags on the same FlagParser
// (llmc/flags.h: add_train_flags, then its add_* calls) instead of copying these.
#pragma once
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>
#include "llmc/dist.h"
#include "llmc/flags.h"
#include "llmc/model_config.h"
#include "llmc/run_files.h"
#include "llmc/schedule.h"
#include "llmc/utils.h"

struct TrainConfig {
    std::string train_pattern;      // --train: glob of token shards (required)
    std::string val_pattern;        // --val: glob of validation shards ("" = no validation)
    std::string tokenizer_path;     // --tokenizer: GPTT file for printing samples ("" = print ids)
    std::string init;               // --init: a descriptor (fresh init: dN, gpt2*, llama:...) or a model file ("" = d12, or the checkpoint on --resume)
    std::string resume_dir;         // --resume: checkpoint directory to continue from
    std::string out_dir;            // --out-dir: where checkpoints go ("" = none)
    std::string log_path;           // --log: per-step log file ("" = none)
    int overwrite = 0;              // --overwrite: 1 = replace another run's checkpoints in --out-dir and its --log
    int kv_heads = -1;              // --kv-heads: NKV of a fresh model (0 = NH; -1 = not given)
    int window = -1;                // --window: attention window of a fresh model (0 = full; -1 = not given)
    int max_seq = -1;               // --max-seq: max_seq_len of a fresh model (-1 = not given: the descriptor's 1024)
    int B = 4;                      // --batch: micro-batch size
    int T = 64;                     // --seq: sequence length
    int64_t total_batch = 0;        // --total-batch: tokens per optimizer step (0 = B*T)
    int steps = -1;                 // --steps: optimizer steps (-1 = one epoch of --train)
    int data_vocab = 0;             // --data-vocab: the vocab_size the data files' headers record (0 = the model's)
    int doc_mask = 0;               // --doc-mask: 1 = a token attends only within its document
    std::string doc_positions = "continue";  // --doc-positions: continue | restart (at each document start)
    int doc_token = -1;             // --doc-token: the token that starts a document (-1 = the tokenizer's, else GPT-2's)
    LrSchedule schedule;            // --lr, --warmup, --schedule, --final-lr-frac, --cooldown-frac
    float weight_decay = 0.1f;      // --wd
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float grad_clip = 1.0f;         // --grad-clip (<= 0: off)
    // --optimizer muon: torch.optim.Muon on the blocks' matrices (model_param_muon), AdamW on the rest
    std::string optimizer = "adamw";          // --optimizer: adamw | muon
    float muon_lr = 0.02f;                    // --muon-lr: Muon's peak lr, scheduled as --lr is
    float muon_momentum = 0.95f;              // --muon-momentum
    float muon_wd = 0.0f;                     // --muon-wd: Muon's decoupled weight decay
    int muon_ns_steps = 5;                    // --muon-ns-steps: Newton-Schulz iterations
    std::string muon_adjust_lr = "original";  // --muon-adjust-lr: original | match_rms_adamw
    int val_every = 20;             // --val-every (0: never)
    int val_steps = 20;             // --val-steps: batches per validation
    std::string hellaswag_path;     // --hellaswag: multiple-choice eval file (GPTE) to score ("" = none)
    int hellaswag_every = 0;        // --hellaswag-every (0: only at the end)
    int sample_every = 0;           // --sample-every (0: never)
    int gen_tokens = 64;            // --gen-tokens
    int ckpt_every = 0;             // --ckpt-every (0: only at the end, when --out-dir is set)
    uint64_t seed = 1337;           // --seed: init, data order, sampling
    float temperature = 1.0f;       // --temperature for sampling
    DistSettings dist;              // --zero, --dist-init, --dist-timeout, --rank, --world-size (llmc/dist.h)
    // FP8 linear layers (GPU trainer, bf16 build; llmc/model_fp8.cuh, docs/numerics.md)
    int fp8 = 0;                    // --fp8: 1 = the blocks' linear layers' matmuls in FP8
    std::string fp8_scaling = "delayed";  // --fp8-scaling: delayed | current | rowwise
    std::string fp8_wgrad;          // --fp8-wgrad: fp8 | bf16 ("" = bf16 under rowwise scaling, else fp8)
    std::string fp8_grad = "e5m2";  // --fp8-grad: e5m2 | e4m3, the format of the gradients dY
    int fp8_history = 16;           // --fp8-history: delayed scaling's amax window (steps)
    int fp8_bf16_layers = 0;        // --fp8-bf16-layers: the first and last N blocks stay bf16
    int fp8_fast_accum = 1;         // --fp8-fast-accum: the forward matmuls' fast accumulation
    int fp8_linears = 15;           // --fp8-linears: bit k = linear k of a block in FP8 (qkv, attproj, fc, fcproj)
    int fp8_head = 0;               // --fp8-head: 1 = the output head's matmuls in FP8 too
    int grad_accum = 1;             // derived: total_batch / (B*T*world)
    bool total_batch_default = false;  // derived: --total-batch was not given (one micro-batch per rank)
};

// The --fp8 flags: the GPU trainer adds them after add_train_flags; the CPU trainer (fp32) has no FP8
// path, so they are not in its --help, and parse_train_args refuses them by name.
inline void add_fp8_flags(FlagParser& p, TrainConfig& cfg) {
    p.add_int("--fp8", &cfg.fp8, {0, 1}, "1 = the linear layers inside the blocks (qkv, attproj, fc, fcproj) run their "
              "forward, input- and weight-gradient matmuls in FP8 (E4M3 weights and activations, --fp8-grad "
              "gradients, per-tensor scales; fp32 accumulation, bf16 outputs); the embeddings, norms, attention, the "
              "output head and the optimizer stay bf16/fp32. GPU trainer, bf16 build only (docs/numerics.md)");
    p.add_choice("--fp8-scaling", "HOW", &cfg.fp8_scaling, {"current", "delayed", "rowwise"}, "scaling",
                 "--fp8's scales: per tensor, delayed (activations and gradients from the amaxes "
                 "of the last --fp8-history steps, recorded by the casts themselves, which can then run inside the kernels "
                 "that produce their tensors; weights current) or current (from each tensor's own amax: an "
                 "extra read of every tensor, the casts separate passes); or rowwise (one scale per row along each matmul's non-reduced "
                 "dimension: per token of X and dY, per output and input channel of W, per channel of dY and X for the "
                 "weight gradient; cuBLASLt's outer-vector scales, Hopper only) (default delayed)");
    p.add_choice("--fp8-wgrad", "PREC", &cfg.fp8_wgrad, {"fp8", "bf16"}, "precision",
                 "--fp8: the weight gradient's matmul dW += dY^T X in fp8 (from FP8 copies of dY^T "
                 "and X^T, X^T kept from the forward) or bf16 (the bf16 path's matmul on dY and X; no X^T kept) "
                 "(default bf16 with --fp8-scaling rowwise, else fp8)");
    p.add_choice("--fp8-grad", "FMT", &cfg.fp8_grad, {"e5m2", "e4m3"}, "format",
                 "--fp8's format of the gradients dY: e5m2 (range) or e4m3 (precision) (default e5m2)");
    p.add_int("--fp8-history", &cfg.fp8_history, {1, 1024}, "--fp8-scaling delayed: steps of amax history a scale "
              "is taken from");
    p.add_int("--fp8-bf16-layers", &cfg.fp8_bf16_layers, {0, 1024}, "--fp8: the first N and the last N blocks keep "
              "their linear layers in bf16 (0: every block in FP8)");
    p.add({"--fp8-linears", "LIST", "--fp8: which of a block's linear layers run in FP8, comma-separated from qkv, "
           "attproj, fc, fcproj (Llama: fc is SwiGLU's); the others stay bf16 (default all four)",
           [&cfg](const char* s) -> std::string {
               static const char* names[4] = {"qkv", "attproj", "fc", "fcproj"};
               int mask = 0;
               std::string list = s, item;
               for (size_t i = 0; i <= list.size(); i++) {
                   if (i < list.size() && list[i] != ',') { item += list[i]; continue; }
                   int k = 0;
                   while (k < 4 && item != names[k]) k++;
                   if (k == 4) return "unknown linear layer '" + item + "' (qkv, attproj, fc, fcproj)";
                   mask |= 1 << k;
                   item.clear();
               }
               cfg.fp8_linears = mask;
               return "";
           }});
    p.add_int("--fp8-fast-accum", &cfg.fp8_fast_accum, {0, 1}, "--fp8: 1 = the forward matmuls accumulate in the "
              "tensor cores' fast (narrower) mode, 0 = promoted to fp32 every few k-steps; the gradient matmuls "
              "never use it");
    p.add_int("--fp8-head", &cfg.fp8_head, {0, 1}, "--fp8: 1 = the output head (logits = lnf W^T, W = wte when "
              "tied) runs its forward, input- and weight-gradient matmuls in FP8 too: e4m3 X and W (current scales), "
              "the classifier writes the dlogits in --fp8-grad's format at a fixed power-of-two scale from the loss "
              "gradient, in place of the logits; 0 = the head stays bf16 (docs/numerics.md, \"The output "
              "head in FP8\")");
}

// --optimizer as an OptimizerKind (llmc/model_config.h).
inline int optimizer_kind(const TrainConfig& cfg) { return cfg.optimizer == "muon" ? OPTIMIZER_MUON : OPTIMIZER_ADAMW; }

// Registers the flags both trainers share, bound to the fields of `cfg` (which must outlive p).
inline void add_train_flags(FlagParser& p, TrainConfig& cfg) {
    constexpr double BIG = 1e9;
    p.add_string("--train", "GLOB", &cfg.train_pattern, "token shards to train on (required)");
    p.add_string("--val", "GLOB", &cfg.val_pattern, "token shards for the validation loss (default: none)");
    p.add_string("--tokenizer", "FILE", &cfg.tokenizer_path, "GPTT decode table for printing samples (default: print ids)");
    p.add_string("--init", "MODEL", &cfg.init, "a model .bin to start from, or a fresh model: dN = GPT-2 with N layers, 64N "
                 "channels, N heads (d12 = 124M; unlike llm.c's d24/d36/d48); gpt2, gpt2-medium, gpt2-large, gpt2-xl = "
                 "the GPT-2 family's shapes (12/768/12, 24/1024/16, 36/1280/20, 48/1600/25 layers/channels/heads); "
                 "llama:L12,C768,H12[,KV4][,F2048][,V50257][,theta10000][,eps1e-5][,untied] = a Llama-style model "
                 "(RMSNorm, RoPE, SwiGLU hidden F, no biases; KV defaults to H, F to 8C/3 rounded up to 64, the head "
                 "to tied) (default d12; with --resume it may only repeat the checkpoint's shape)");
    p.add_string("--resume", "DIR", &cfg.resume_dir, "continue from the newest checkpoint in DIR that verifies (a damaged newer "
                 "one is named and skipped), or from DIR itself");
    p.add_string("--out-dir", "DIR", &cfg.out_dir, "write checkpoints DIR/step_NNNNNNNN/ (default: none)");
    p.add_string("--log", "FILE", &cfg.log_path, "write `step n train_loss x lr x ms x tok_s x` and `step n val_loss x` lines "
                 "(--resume appends, after dropping the lines past the checkpoint's step)");
    p.add_int("--overwrite", &cfg.overwrite, {0, 1}, "1 = a fresh run may delete the checkpoints already in --out-dir and "
              "replace --log (a --resume from an older step: the newer checkpoints)");
    // -1 marks "not given": a model file keeps its own values unless the flag repeats them
    p.add_int_unset("--kv-heads", &cfg.kv_heads, {0, 1 << 24}, "key/value heads of a fresh --init model, dividing its "
                    "heads (grouped-query attention; overrides a llama descriptor's KV; default 0 = the descriptor's)");
    p.add_int_unset("--window", &cfg.window, {0, 1 << 24}, "attention window W of a fresh --init model: position t "
                    "sees t-W+1..t (default 0 = full causal)");
    p.add_int_unset("--max-seq", &cfg.max_seq, {1, 1 << 20}, "max_seq_len (context) of a fresh --init model, e.g. "
                    "4096 (default 1024)");
    p.add_int("--batch", &cfg.B, {1, 1 << 16}, "micro-batch size B");
    p.add_int("--seq", &cfg.T, {1, 1 << 20}, "sequence length T (at most the model's max_seq_len)");
    p.add_int64("--total-batch", &cfg.total_batch, {0, 1e15}, "tokens per optimizer step, a multiple of B*T (0 = B*T)");
    p.add({"--steps", "N", "optimizer steps in all (a resumed run counts the checkpoint's); -1 = one epoch of --train "
           "(default -1)", [&cfg](const char* s) -> std::string {
               int64_t v;
               if (!parse_int64(s, &v)) return std::string("'") + s + "' is not an integer";
               if (v == 0 || v < -1 || v > 1e9) return std::string("must be -1 (one epoch) or in [1, 1e9], got ") + s;
               cfg.steps = (int)v;
               return "";
           }});
    p.add_float("--lr", &cfg.schedule.lr, {0, 10}, "peak learning rate");
    p.add_int("--warmup", &cfg.schedule.warmup, {0, BIG}, "linear warmup steps");
    p.add({"--schedule", "NAME", "cosine | linear | constant | wsd, after the warmup (default cosine)",
           [&cfg](const char* s) -> std::string {
               if (!lr_schedule_from_name(s, &cfg.schedule.kind))
                   return std::string("unknown schedule '") + s + "' (cosine, linear, constant, wsd)";
               return "";
           }});
    p.add_float("--final-lr-frac", &cfg.schedule.final_lr_frac, {0, 1}, "final learning rate as a fraction of --lr");
    p.add_float("--cooldown-frac", &cfg.schedule.cooldown_frac, {0, 1}, "wsd: fraction of the steps spent cooling down");
    p.add_float("--wd", &cfg.weight_decay, {0, 10}, "AdamW weight decay (matrices and embeddings only)");
    p.add_float("--beta1", &cfg.beta1, {0, 1, true}, "AdamW beta1");
    p.add_float("--beta2", &cfg.beta2, {0, 1, true}, "AdamW beta2");
    p.add_float("--eps", &cfg.eps, {1e-30, 1}, "AdamW epsilon");
    p.add_float("--grad-clip", &cfg.grad_clip, {-1e30, 1e30}, "clip the global gradient norm to this; <= 0 disables");
    p.add_choice("--optimizer", "NAME", &cfg.optimizer, {"adamw", "muon"}, "optimizer",
                 "adamw, or muon: torch.optim.Muon (Nesterov) on each layer's Q, K and V, attention "
                 "projection, fc (SwiGLU's gate and up apart) and fc projection matrices, AdamW (--lr, --wd, --beta1, "
                 "--beta2, --eps) on the embeddings, the head, norms and biases; the GPU trainer at ZeRO 0 only, the CPU "
                 "trainer at ZeRO 1/2 too, each rank updating whole matrices (default adamw)");
    p.add_float("--muon-lr", &cfg.muon_lr, {1e-30, 10}, "Muon's peak lr, before --muon-adjust-lr's factor; the "
                "schedule scales it as it scales --lr");
    p.add_float("--muon-momentum", &cfg.muon_momentum, {0, 1, true}, "Muon's momentum");
    p.add_float("--muon-wd", &cfg.muon_wd, {0, 10}, "Muon's decoupled weight decay: w *= 1 - lr * wd");
    p.add_int("--muon-ns-steps", &cfg.muon_ns_steps, {1, 99}, "Muon's Newton-Schulz iterations");
    p.add_choice("--muon-adjust-lr", "HOW", &cfg.muon_adjust_lr, {"original", "match_rms_adamw"}, "adjustment",
                 "Muon's lr for a (rows, cols) matrix: original = lr sqrt(max(1, rows / cols)) "
                 "(torch's default), match_rms_adamw = lr 0.2 sqrt(max(rows, cols)) (an update RMS like AdamW's) "
                 "(default original)");
    p.add_int("--val-every", &cfg.val_every, {0, BIG}, "validate every N steps and at the end (0 = never)");
    p.add_int("--val-steps", &cfg.val_steps, {1, BIG}, "batches per validation");
    p.add_int("--data-vocab", &cfg.data_vocab, {0, 1 << 24}, "the vocab_size the headers of --train, --val and "
              "--hellaswag files must record (the tokenizer that wrote them): 0 = the model's; smaller for a model "
              "whose vocabulary pads its tokenizer's (Qwen2: 151665 ids, 151936 rows)");
    p.add_int("--doc-mask", &cfg.doc_mask, {0, 1}, "1 = document masking inside each packed row: a document starts "
              "at each --doc-token, and a token attends only to the tokens of its own document before it (and "
              "within --window); training and validation, not HellaSwag. GPU: not with --fp8 1 (docs/training.md)");
    p.add_choice("--doc-positions", "HOW", &cfg.doc_positions, {"continue", "restart"}, "position mode",
                 "with --doc-mask 1: continue = position t of a row is t (learned wpe row, RoPE angle), "
                 "restart = t minus its document's start, Hugging Face's position_ids of packed SFT (default continue)");
    p.add_int_unset("--doc-token", &cfg.doc_token, {0, 1 << 30}, "with --doc-mask 1: the id that starts a document "
                    "(default: the --tokenizer's document token, which scripts/data/ writes before every document; "
                    "without --tokenizer GPT-2's <|endoftext|> 50256 for a GPT-2 model)");
    p.add_string("--hellaswag", "FILE", &cfg.hellaswag_path, "multiple-choice eval file (GPTE, scripts/data/hellaswag.py) "
                 "whose accuracy (acc_norm) is printed and logged (default: none)");
    p.add_int("--hellaswag-every", &cfg.hellaswag_every, {0, BIG}, "score --hellaswag every N steps and at the end "
              "(0 = only at the end)");
    p.add_int("--sample-every", &cfg.sample_every, {0, BIG}, "print a sample every N steps and at the end (0 = never)");
    p.add_int("--gen-tokens", &cfg.gen_tokens, {1, BIG}, "tokens per sample");
    p.add_int("--ckpt-every", &cfg.ckpt_every, {0, BIG}, "checkpoint every N steps (0 = only at the end); needs --out-dir");
    p.add_uint64("--seed", &cfg.seed, "seed for init, data order and sampling");
    p.add_float("--temperature", &cfg.temperature, {1e-6, 100}, "sampling temperature");
    p.add_int("--zero", &cfg.dist.zero, {0, 2}, "data parallel: 0 = gradients all-reduced, every rank keeps the whole optimizer "
              "state; 1 = AdamW state sharded by rank, parameters all-gathered; 2 = gradients reduce-scattered as well");
    p.add({"--dist-init", "HOW", "how the ranks of a data-parallel run meet: mpi, tcp://HOST:PORT (rank 0's host), "
           "file:/shared/dir, env (MASTER_ADDR/MASTER_PORT) or none (default: mpi under mpirun in an MPI build, env "
           "when WORLD_SIZE > 1, else none)", [&cfg](const char* s) -> std::string {
               cfg.dist.how = s;
               return "";
           }});
    p.add_int("--dist-timeout", &cfg.dist.timeout_s, {1, 1e6}, "seconds a rank waits for another (rendezvous, every "
              "message) before failing");
    p.add_int("--rank", &cfg.dist.rank, {-1, 1 << 20}, "this process's rank for tcp/file (-1: RANK, SLURM_PROCID or "
              "OMPI_COMM_WORLD_RANK)");
    p.add_int("--world-size", &cfg.dist.world_size, {-1, 1 << 20}, "the number of ranks (-1: WORLD_SIZE, SLURM_STEP_NUM_TASKS or "
              "OMPI_COMM_WORLD_SIZE; under MPI it must equal mpirun's)");
}

// The run has `world` ranks, each taking --batch x --seq per micro-batch: a step is total_batch
// tokens = grad_accum micro-batches of every rank. Without --total-batch, one micro-batch each.
inline void set_world_size(TrainConfig& cfg, int world) {
    const int64_t BTW = (int64_t)cfg.B * cfg.T * world;
    if (cfg.total_batch_default) cfg.total_batch = BTW;
    if (cfg.total_batch % BTW != 0)
        fail("--total-batch: %" PRId64 " is not a multiple of --batch * --seq * ranks = %d * %d * %d = %" PRId64,
             cfg.total_batch, cfg.B, cfg.T, world, BTW);
    cfg.grad_accum = (int)(cfg.total_batch / BTW);
}

// Checks that need several flags at once; derives grad_accum. Call after FlagParser::parse. The GPU
// trainer (cpu_trainer false) refuses what only the CPU trainer implements: --doc-mask 1 with
// --fp8 1, --optimizer muon at --zero 1/2.
inline void validate_train_config(TrainConfig& cfg, bool cpu_trainer = false) {
    if (cfg.train_pattern.empty()) fail("--train: required (a glob of token shards, e.g. \"data/*_train.bin\")");
    const int64_t BT = (int64_t)cfg.B * cfg.T;
    cfg.total_batch_default = cfg.total_batch == 0;
    if (cfg.total_batch == 0) cfg.total_batch = BT;
    if (cfg.total_batch % BT != 0)
        fail("--total-batch: %" PRId64 " is not a multiple of --batch * --seq = %" PRId64, cfg.total_batch, BT);
    // micro-batches per step: at most 2^20 (an int, and a host buffer of B*T losses each on the GPU)
    constexpr int64_t MAX_GRAD_ACCUM = 1 << 20;
    if (cfg.total_batch / BT > MAX_GRAD_ACCUM)
        fail("--total-batch: %" PRId64 " tokens is %" PRId64 " micro-batches of --batch * --seq = %" PRId64
             " tokens; at most %" PRId64 " are supported", cfg.total_batch, cfg.total_batch / BT, BT, MAX_GRAD_ACCUM);
    cfg.grad_accum = (int)(cfg.total_batch / BT);
    if (cfg.ckpt_every > 0 && cfg.out_dir.empty() && cfg.resume_dir.empty())
        fail("--ckpt-every: needs --out-dir (where the checkpoints go)");
    if (cfg.hellaswag_every > 0 && cfg.hellaswag_path.empty())
        fail("--hellaswag-every: needs --hellaswag FILE (the eval file to score)");
    if (cfg.init.empty() && cfg.resume_dir.empty()) cfg.init = "d12";
    if (!cfg.fp8 && (cfg.fp8_scaling != "delayed" || cfg.fp8_grad != "e5m2" || cfg.fp8_history != 16 ||
                     cfg.fp8_bf16_layers != 0 || cfg.fp8_fast_accum != 1 || cfg.fp8_linears != 15 || !cfg.fp8_wgrad.empty() ||
                     cfg.fp8_head != 0))
        fail("--fp8-scaling, --fp8-wgrad, --fp8-grad, --fp8-history, --fp8-bf16-layers, --fp8-linears, --fp8-fast-accum, "
             "--fp8-head: only with --fp8 1");
    if (cfg.fp8_wgrad.empty()) cfg.fp8_wgrad = cfg.fp8_scaling == "rowwise" ? "bf16" : "fp8";
    // a --muon-* flag off its default needs --optimizer muon (scripts/train_gpt2.py's rule), the first one named
    const char* muon_given = cfg.muon_lr != 0.02f ? "--muon-lr" : cfg.muon_momentum != 0.95f ? "--muon-momentum"
                           : cfg.muon_wd != 0.0f ? "--muon-wd" : cfg.muon_ns_steps != 5 ? "--muon-ns-steps"
                           : cfg.muon_adjust_lr != "original" ? "--muon-adjust-lr" : nullptr;
    if (muon_given && cfg.optimizer != "muon") fail("%s: only with --optimizer muon", muon_given);
    const bool restart = cfg.doc_positions == "restart";
    if (!cpu_trainer && cfg.doc_mask && cfg.fp8)  // the FP8 attention path is the Hopper kernel's, unmasked
        fail("--doc-mask 1: not with --fp8 1 on the GPU yet; use --fp8 0 or train_gpt2_cpu");
    if (!cfg.doc_mask && restart)  // positions that restart while tokens attend across documents: no packing
        fail("--doc-positions restart: only with --doc-mask 1 (tokens would still attend across documents)");
    if (!cfg.doc_mask && cfg.doc_token >= 0) fail("--doc-token %d: only with --doc-mask 1", cfg.doc_token);
    if (!cpu_trainer && cfg.optimizer == "muon" && cfg.dist.zero != 0)
        fail("--zero %d: --optimizer muon runs at --zero 0 only on the GPU (its ZeRO 1/2 shard the optimizer state in "
             "flat slices, which cut Muon's matrices); train_gpt2_cpu runs it at --zero 1/2", cfg.dist.zero);
}

// --doc-mask 1's document token for model c: --doc-token, else the tokenizer's (tokenizer_doc: the token
// scripts/data/ writes before every document, -1 without one), else GPT-2's <|endoftext|> for a GPT-2
// model; prints the setting. -1 without --doc-mask.
inline int doc_mask_token(const TrainConfig& cfg, const ModelConfig& c, int tokenizer_doc) {
    if (!cfg.doc_mask) return -1;
    const int V = c.vocab_size;
    if (cfg.doc_token >= V) fail("--doc-token %d: out of range for the model's vocabulary of %d", cfg.doc_token, V);
    if (tokenizer_doc >= V)
        fail("--tokenizer %s: its document token %d is out of range for the model's vocabulary of %d; give "
             "--doc-token", cfg.tokenizer_path.c_str(), tokenizer_doc, V);
    int token = cfg.doc_token >= 0 ? cfg.doc_token : tokenizer_doc;
    if (token < 0 && c.architecture == ARCH_GPT2 && V > 50256) token = 50256;
    if (token < 0)
        fail("--doc-mask 1: no document token: give --doc-token ID or a --tokenizer that records one (GPT-2's "
             "50256 is the default only for a GPT-2 model whose vocabulary holds it)");
    printf("document masking: token %d starts a document; positions %s at each document\n", token,
           cfg.doc_positions.c_str());
    return token;
}

// Applies --kv-heads, --window and --max-seq to the model config `c` read from `source`: they shape
// a fresh model (`fresh`); with a model file (or a checkpoint to resume) they may only repeat its values.
inline void apply_shape_flags(ModelConfig& c, const TrainConfig& cfg, bool fresh, const char* source) {
    if (fresh) {
        if (cfg.kv_heads > 0 && (cfg.kv_heads > c.num_heads || c.num_heads % cfg.kv_heads != 0))
            fail("--kv-heads %d: must divide the %d heads of --init %s", cfg.kv_heads, c.num_heads, source);
        if (cfg.kv_heads > 0) c.num_kv_heads = cfg.kv_heads;
        if (cfg.window >= 0) c.window = cfg.window;
        if (cfg.max_seq > 0) c.max_seq_len = cfg.max_seq;
        model_validate_config(c, source);
        return;
    }
    const int kv_heads = cfg.kv_heads == 0 ? c.num_heads : cfg.kv_heads;
    if (cfg.kv_heads >= 0 && kv_heads != c.num_kv_heads)
        fail("--kv-heads %d: %s has num_kv_heads %d (the flag shapes only a fresh --init model)", cfg.kv_heads,
             source, c.num_kv_heads);
    if (cfg.window >= 0 && cfg.window != c.window)
        fail("--window %d: %s has window %d (the flag shapes only a fresh --init model)", cfg.window, source,
             c.window);
    if (cfg.max_seq > 0 && cfg.max_seq != c.max_seq_len)
        fail("--max-seq %d: %s has max_seq_len %d (the flag shapes only a fresh --init model)", cfg.max_seq, source,
             c.max_seq_len);
}

// Both trainers' samples (--sample-every) run through a KV cache of the model's context (model_infer_sample,
// llmc/model_infer.cuh and llmc/cpu/model_infer.h), so a sample ends there: refused at start, before any step.
inline void check_sample_length(const TrainConfig& cfg, const ModelConfig& c) {
    if (cfg.sample_every > 0 && cfg.gen_tokens > c.max_seq_len)
        fail("--gen-tokens %d: the trainer's samples end at the context, max_seq_len = %d tokens", cfg.gen_tokens,
             c.max_seq_len);
}

// The CPU trainer's whole command line: the shared flags, parsed and validated.
inline void parse_train_args(int argc, char** argv, TrainConfig& cfg, const char* program, const char* summary) {
    FlagParser p(program, summary);
    add_train_flags(p, cfg);
    for (int i = 1; i < argc; i++)  // the GPU trainer's --fp8 flags (add_fp8_flags), named rather than "unknown"
        if (strncmp(argv[i], "--fp8", 5) == 0)
            fail("%s%s%s: the CPU trainer runs in fp32; the FP8 matmuls are the GPU trainer's (build/train_gpt2cu)",
                 argv[i], i + 1 < argc ? " " : "", i + 1 < argc ? argv[i + 1] : "");
    p.parse(argc, argv);
    validate_train_config(cfg, true);
}

// The settings of the run's files (llmc/run_files.h) from the flags.
inline RunFileSettings run_file_settings(const TrainConfig& cfg) {
    return {cfg.init, cfg.resume_dir, cfg.out_dir, cfg.log_path, cfg.overwrite != 0, cfg.kv_heads >= 0, cfg.steps,
            optimizer_kind(cfg)};
}

// The optimizer step's settings at 0-based `step`: lr from the schedule, and with --optimizer muon
// muon_lr from the same schedule started at --muon-lr. cfg.schedule.total_steps must be set.
inline OptimizerSettings optimizer_settings_at(const TrainConfig& cfg, int64_t step) {
    OptimizerSettings o{lr_at_step(cfg.schedule, (int)step), cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                        cfg.grad_clip};
    o.optimizer = optimizer_kind(cfg);
    if (o.optimizer == OPTIMIZER_MUON) {
        LrSchedule muon = cfg.schedule;
        muon.lr = cfg.muon_lr;
        o.muon_lr = lr_at_step(muon, (int)step);
        o.muon_momentum = cfg.muon_momentum;
        o.muon_weight_decay = cfg.muon_wd;
        o.muon_ns_steps = cfg.muon_ns_steps;
        o.muon_match_rms_adamw = cfg.muon_adjust_lr == "match_rms_adamw";
    }
    return o;
}
