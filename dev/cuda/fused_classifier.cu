// fused_classifier.cu: softmax + cross-entropy + its gradient in one pass per row, written in place
// over the logits (llmc/fused_classifier.cuh), against cpu::softmax_crossentropy_forward and
// cpu::crossentropy_softmax_backward (llmc/cpu/crossentropy.h).
//   ./fused_classifier [variant ...] [--check-only] [--reps N]
// Shapes: GPT-2 124M, N = B*T = 65536 rows of Vp = 50304 (V = 50257 real), and the awkward N = 651,
// V = 1003, Vp = 1008. The logits are 6.6 GB, so the check compares 16 sampled rows (first and last
// included) of the gradient and of the losses; the written and guard checks cover every element.
// Bytes: the logits read once and the gradient written once (N*Vp each), targets and losses.
// FLOPs: ~6 per element (max, subtract, exp counted as 1, sum, scale, subtract).
//
// Variants (H200, bf16, N=65536 Vp=50304; % of the 4.0 TB/s copy):
//   0 shipped: fused_classifier_block_per_row, 1024 threads per row, two passes over global memory
//     (the second from L2), 2026-12-02:                                            4.26 ms, 77%
//     loss only (write_dlogits false, validation):                                 2.20 ms, 75%
//   1 fused_classifier_rows_in_smem (shipped 2026-12-03, branch s7/membound, then taken back for
//     the bf16 gradient; llmc keeps it for the FP8 head's in-place FP8 gradient): one
//     persistent block a SM, each row brought into shared memory by one bulk copy while the block
//     works on the previous row, read from DRAM once; sm_90 and two rows within the opt-in shared
//     memory (bf16 up to Vp ~ 58K), else skipped. 2026-12-03, beside variant 0 (4.2592 ms, 77.4%;
//     loss only 2.2006, 74.8%):                                   4.2891 ms, 76.9%; loss only 2.3188 ms, 71.0%
//     Reading DRAM once bought nothing: variant 0's second pass already comes from L2.
// Rejected (2026-12-02): variant 0 with 512 threads per row 4.75 ms, 69%; with 256, 4.77 ms, 69%
// (more rows in flight than L2 holds between the two passes). At the awkward N=651, Vp=1008 the
// small blocks won, 0.007 vs 0.011 ms: irrelevant in training.
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/crossentropy.h"
#include "llmc/fused_classifier.cuh"

constexpr int SAMPLES = 16;

// Variant 1 is llmc/fused_classifier.cuh's fused_classifier_rows_in_smem (the FP8 head's classifier
// there, --fp8-head 1) with the bf16 gradient: fused_classifier_rows_in_smem_forward.

static void run_shape(lab::Lab& L, int N, int V, int Vp) {
    const std::string shape = lab::Lab::strprintf(" N=%d V=%d Vp=%d", N, V, Vp);
    const size_t NV = (size_t)N * Vp;
    const float dloss = 1.0f / N;  // mean over the batch, no accumulation
    lab::DevBuf<floatX> d_logits0(NV, "logits0"), d_logits(NV, "dlogits");
    lab::DevBuf<float> d_losses(N, "losses");
    lab::DevBuf<int> d_targets(N, "targets");
    d_logits0.fill_uniform(61, -5.0f, 5.0f);  // (N, Vp); the padded columns hold junk too: it must be ignored
    const std::vector<int> targets = lab::rand_ints(N, 62, V);
    d_targets.upload(targets);

    const std::vector<int> rows = lab::sample_rows(N, SAMPLES, 63);
    const int k = (int)rows.size();
    std::vector<int> row_targets(k);
    for (int i = 0; i < k; i++) row_targets[i] = targets[rows[i]];
    const std::vector<float> logits_rows = d_logits0.download_rows(rows, Vp);
    std::vector<float> probs((size_t)k * Vp), ref_losses(k), ref_dlogits((size_t)k * Vp);
    cpu::softmax_crossentropy_forward(probs.data(), ref_losses.data(), logits_rows.data(), row_targets.data(), 1, k, V,
                                      Vp);
    // the reference divides by its own row count k; scaling by k * dloss gives dloss per row
    cpu::crossentropy_softmax_backward(ref_dlogits.data(), probs.data(), row_targets.data(), 1, k, V, Vp, k * dloss);

    auto reset = [&] {
        cudaCheck(cudaMemcpyAsync(d_logits, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice, L.stream()));
        d_losses.poison(L.stream());
    };
    // fp32 losses from the same bf16 logits: only the order of the sums differs
    const lab::Tol loss_tol = {1e-4, 1e-4};
    // Every row's loss, besides the sampled rows' against the CPU: the shipped kernel's losses over all
    // N rows (its loss-only run, checked against the CPU below), as a GPU reference for the others
    reset();
    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp, false, L.stream());
    const std::vector<float> all_losses = d_losses.download();
    auto check_losses = [&] {
        bool ok = L.check(d_losses, ref_losses, loss_tol, rows, 1);
        return L.compare("all losses", d_losses.download(), all_losses, lab::Tol{1e-5, 1e-6}) && ok;
    };
    auto check = [&] {
        const bool ok = check_losses();
        return L.check(d_logits, ref_dlogits, lab::default_tol(), rows, Vp) && ok;
    };
    const double bytes = 2.0 * NV * sizeof(floatX) + 8.0 * N, flops = 6.0 * N * V;
    const std::string op = "fused_classifier" + shape;
    // variant 1 only where two rows fit in shared memory (sm_90, bf16 up to Vp ~ 58K)
    const int variants = classifier_rows_fit_smem(Vp) ? 2 : 1;
    auto launch = [&](int variant, bool write_dlogits) {
        if (variant == 0) fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp, write_dlogits, L.stream());
        else fused_classifier_rows_in_smem_forward(d_logits, d_losses, d_targets, dloss, N, V, Vp, write_dlogits,
                                                   L.stream());
    };
    const char* names[] = {"shipped (block per row)", "rows in smem"};
    if (variants < 2 && L.selected(1))
        printf("  %s | 1 %s: skipped, two rows of %zu bytes do not fit in this device's shared memory\n", op.c_str(),
               names[1], classifier_smem_bytes(Vp) / 2);
    for (int variant = 0; variant < variants; variant++)
        L.run(op, variant, names[variant], bytes, flops, lab::Bound::Memory, reset, [&] { launch(variant, true); },
              check);
    // validation: losses only, the logits must stay as they were
    const std::vector<float> logits_as_read = logits_rows;
    for (int variant = 0; variant < variants; variant++)
        L.run("fused_classifier(loss only)" + shape, variant, names[variant], (double)N * V * sizeof(floatX) + 8.0 * N,
              4.0 * N * V, lab::Bound::Memory, reset, [&] { launch(variant, false); },
              [&] {
                  const bool ok = check_losses();
                  return L.check(d_logits, logits_as_read, lab::Tol{0, 0}, rows, Vp) && ok;
              });
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "fused_classifier.cu");
    run_shape(L, lab::GPT2_B * lab::GPT2_T, lab::GPT2_V, lab::GPT2_VP);
    run_shape(L, lab::ODD_B * lab::ODD_T, 1003, 1008);
    return L.finish();
}
