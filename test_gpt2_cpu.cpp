// test_gpt2_cpu.cpp: the CPU reference model (llmc/cpu/model.h) against PyTorch, GPT-2 and Llama-style.
// Loads a model checkpoint and the debug state scripts/train_gpt2.py wrote for it (docs/formats.md,
// GPTX: one batch, the logits, loss and every parameter gradient computed in float64, and the loss
// before each of n AdamW steps on that batch), then checks ours: logits, loss, every gradient tensor the
// config has, the logits of a shorter row run as sampling runs it, the same gradient accumulated over
// two half-weighted micro-batches, and the loss trajectory of n AdamW steps with the same hyperparameters.
//
//   build/test_gpt2_cpu [model.bin debug.bin]     (default: the committed fixtures in tests/fixture, see main)
//
// Tolerances. The reference is float64, so every difference is our fp32 rounding. One fp32 operation
// errs by at most 2^-24 = 6e-8 relative; a dot product of length K (<= 4C and B*T here) accumulates
// errors that grow like sqrt(K), and a pass chains a few dozen such ops: we expect ~1e-6 of a tensor's
// scale (the fixture shows 2e-7..5e-7) and allow 1e-5 (TOL_SCALED), room for any sane summation order,
// while a wrong term (a missing factor, a dropped row) shows as 1e-2..1e0. Errors are measured against
// the tensor's largest magnitude, as elementwise relative error is meaningless for entries zero up to
// rounding (it is printed too, over entries above 1e-3 of the scale). Adam divides by sqrt(v), which
// amplifies the rounding of tiny gradients (the fixture: up to 5e-7 relative after 10 steps), so each
// trajectory loss is held to 2e-5 relative; a real bug moves it by 1e-3 or more within a few steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include "llmc/cpu/model.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"

constexpr double TOL_SCALED = 1e-5;   // max |ours - ref| / max |ref|, per tensor
constexpr double TOL_LOSS = 1e-5;     // relative, the loss of the reference batch
constexpr double TOL_TRAJECTORY = 2e-5;  // relative, each loss of the AdamW trajectory

struct Comparison {
    double max_abs_err = 0, max_ref = 0, max_rel_err = 0;
    double scaled() const { return max_ref > 0 ? max_abs_err / max_ref : max_abs_err; }
};

// Compares n values; ours and ref may have different row strides (logits are padded to Vp).
Comparison compare(const float* ours, const float* ref, size_t rows, size_t cols, size_t ours_stride) {
    Comparison c;
    for (size_t i = 0; i < rows * cols; i++) c.max_ref = std::max(c.max_ref, (double)std::fabs(ref[i]));
    for (size_t r = 0; r < rows; r++) {
        for (size_t j = 0; j < cols; j++) {
            const double a = ours[r * ours_stride + j], b = ref[r * cols + j];
            const double err = std::isfinite(a) ? std::fabs(a - b) : INFINITY;
            c.max_abs_err = std::max(c.max_abs_err, err);
            if (std::fabs(b) > 1e-3 * c.max_ref) c.max_rel_err = std::max(c.max_rel_err, err / std::fabs(b));
        }
    }
    return c;
}

int failures = 0;

void report(const char* what, const Comparison& c, double tol) {
    const bool ok = c.scaled() <= tol;
    if (!ok) failures++;
    printf("%-10s max_abs_err %.3e  max|ref| %.3e  scaled %.3e  max_rel_err %.3e  %s\n", what, c.max_abs_err,
           c.max_ref, c.scaled(), c.max_rel_err, ok ? "ok" : "FAIL");
}

void check_scalar(const char* what, double ours, double ref, double tol) {
    const double rel = std::fabs(ours - ref) / std::max(std::fabs(ref), 1e-12);
    const bool ok = std::isfinite(ours) && rel <= tol;
    if (!ok) failures++;
    printf("%-10s ours %.8f  ref %.8f  rel_err %.3e  %s\n", what, ours, ref, rel, ok ? "ok" : "FAIL");
}

// Runs every check on one model + debug state pair; returns the number of checks.
int check_fixture(const char* model_path, const char* debug_path) {
    printf("== %s, %s\n", model_path, debug_path);
    const ModelConfig c = model_read_info(model_path).config;
    model_print_config(c);
    DebugState ref = debug_state_read(debug_path, c);
    const int B = ref.B, T = ref.T, V = c.vocab_size, Vp = c.padded_vocab_size;
    printf("debug state: B=%d T=%d, %d AdamW steps, lr %g betas (%g, %g) eps %g wd %g clip %g\n", B, T,
           ref.num_steps, ref.lr, ref.beta1, ref.beta2, ref.eps, ref.weight_decay, ref.grad_clip);
    Model model;
    model_build(model, c, B, T);
    {
        std::vector<float> host(model.num_params);
        model_read_fp32(model_path, host.data());
        model_set_params(model, host.data());
    }

    // forward and backward on the reference batch
    model_forward(model, ref.inputs.data(), B, T);
    const float loss = model_loss(model, ref.targets.data());
    report("logits", compare(model.acts.logits.data(), ref.logits.data(), (size_t)B * T, V, Vp), TOL_SCALED);
    check_scalar("loss", loss, ref.loss, TOL_LOSS);
    model_zero_grads(model);
    model_backward(model, ref.inputs.data(), ref.targets.data(), 1.0f);
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, offsets);
    int checks = 4 + ref.num_steps;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (sizes[i] == 0) continue;  // a tensor this config lacks
        checks++;
        const float* ours = model.grads_memory.data() + offsets[i];
        const float* theirs = ref.grads.data() + offsets[i];
        report(MODEL_PARAM_NAMES[i], compare(ours, theirs, 1, sizes[i], sizes[i]), TOL_SCALED);
    }

    // a shorter row without targets, as sampling runs it: the first n positions of row 0 must not
    // depend on the later ones (causal mask, and the window counted from position 0 of the row)
    const int n = T / 2 + 1;
    model_forward(model, ref.inputs.data(), 1, n);
    report("prefix", compare(model.acts.logits.data(), ref.logits.data(), n, V, Vp), TOL_SCALED);

    // gradient accumulation: two micro-batches with grad_scale 1/2 each must give the same
    // gradient, i.e. backward adds into the parameter gradients and zeroes nothing it should not
    model_zero_grads(model);
    for (int micro = 0; micro < 2; micro++) {
        model_forward(model, ref.inputs.data(), B, T);
        model_loss(model, ref.targets.data());
        model_backward(model, ref.inputs.data(), ref.targets.data(), 0.5f);
    }
    report("accum 2x", compare(model.grads_memory.data(), ref.grads.data(), 1, model.num_params, model.num_params),
           TOL_SCALED);

    // the AdamW trajectory: loss before each step, on the same batch, from the same start
    const OptimizerSettings opt{ref.lr, ref.beta1, ref.beta2, ref.eps, ref.weight_decay, ref.grad_clip};
    for (int step = 0; step < ref.num_steps; step++) {
        model_zero_grads(model);
        model_forward(model, ref.inputs.data(), B, T);
        const float l = model_loss(model, ref.targets.data());
        model_backward(model, ref.inputs.data(), ref.targets.data(), 1.0f);
        model_update(model, opt);  // AdamW step model.step = step + 1
        char what[32];
        snprintf(what, sizeof what, "step %d", step);
        check_scalar(what, l, ref.losses[step], TOL_TRAJECTORY);
    }

    return checks;
}

int main(int argc, char** argv) {
    if (argc != 1 && argc != 3) fail("usage: %s [model.bin debug.bin]", argv[0]);
    int checks = 0;
    if (argc == 3) {
        checks += check_fixture(argv[1], argv[2]);
    } else {  // the committed fixtures (scripts/train_gpt2.py FIXTURES): GPT-2 multi-head full causal
              // and grouped-query with a window (version-1 files, as earlier builds wrote them); Llama
              // multi-head with a tied head, grouped-query untied, grouped-query with a window
        for (const char* prefix : {"", "gqa_", "llama_", "llama_gqa_", "llama_window_"}) {
            const std::string dir = "tests/fixture/" + std::string(prefix);
            checks += check_fixture((dir + "model.bin").c_str(), (dir + "debug.bin").c_str());
        }
    }
    printf("test_gpt2_cpu: %s (%d checks, %d failed)\n", failures ? "FAILED" : "PASSED", checks, failures);
    return failures ? 1 : 0;
}
