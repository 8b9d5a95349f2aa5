// test_muon_cpu: checks the CPU Muon step (llmc/cpu/muon.h) against torch.optim.Muon.
// The fixture is written by tests/python/test_muon.py (which builds and runs this test): float64
// torch.optim.Muon with its Newton-Schulz in float64 (scripts/train_gpt2.py's newton_schulz, the same
// function as torch's without the cast to bf16), from fp32 inputs and fp32-exact hyperparameters.
//   newton_schulz5  one orthogonalisation per case: square, wide, tall, shapes that are no multiple of
//                   the GEMM tiles, 3 and 5 steps, and a zero matrix (the eps clamp: zeros out)
//   muon_update     3 steps per case from our own previous step, fresh gradients each step:
//                   square, wide, tall, both lr adjustments, weight decay, Nesterov on and off,
//                   momentum above and below 0.5 (the two branches of torch's lerp), a clipping
//                   factor (grad_scale) below 1
// Outputs are poisoned with NaN first; the scratch and the output have a guard region after them that
// must stay untouched (scratch: exactly the size muon_scratch_floats states); newton_schulz5 in place
// (out = G) must equal the out-of-place result bitwise.
// Tolerances (reference float64, ours fp32): newton_schulz5's output and the momentum buffer
// max |ours - ref| / max |ref| below 1e-5; the weights max |ours - ref| below 1e-5 of the step's
// update, max |w_t - w_{t-1}| of the reference.
// Prints one line per check and `test_muon_cpu: PASSED (N checks)` or FAILED; exits 1 on failure.
// Usage: test_muon_cpu FIXTURE
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "llmc/cpu/muon.h"
#include "tests/cpu/fixture_check.h"

static const int64_t MAGIC_MUON = fourcc("GPTO");
static const double TOLERANCE = 1e-5;
static const int GUARD = 64;  // floats after each buffer that must keep their sentinel
static const float SENTINEL = -12345.0f;

static CheckTally g_tally;
using Vec = std::vector<float>;

static Vec take(FixtureReader& rd, int64_t n, const char* what) {
    Vec v(n);
    rd.take(v.data(), sizeof(float), n, what);
    return v;
}

// A buffer of n floats followed by GUARD sentinels.
static Vec guarded(size_t n, float fill) {
    Vec v(n + GUARD, SENTINEL);
    for (size_t i = 0; i < n; i++) v[i] = fill;
    return v;
}

static bool guard_intact(const Vec& v, size_t n) {
    for (size_t i = n; i < n + GUARD; i++)
        if (v[i] != SENTINEL) return false;
    return true;
}

static void check_newton_schulz(FixtureReader& rd, int index) {
    int64_t dims[3];
    float eps;
    rd.take(dims, sizeof(int64_t), 3, "newton_schulz sizes");
    rd.take(&eps, sizeof(float), 1, "newton_schulz eps");
    for (int k = 0; k < 2; k++) check_range(rd.path, "newton_schulz size", dims[k], 1, 1 << 14);
    check_range(rd.path, "newton_schulz steps", dims[2], 0, 99);
    const int rows = (int)dims[0], cols = (int)dims[1], steps = (int)dims[2];
    const size_t N = (size_t)rows * cols;
    const Vec G = take(rd, (int64_t)N, "newton_schulz input");
    const Vec ref = take(rd, (int64_t)N, "newton_schulz output");
    char name[96];
    snprintf(name, sizeof(name), "newton_schulz5 #%d %dx%d steps %d", index, rows, cols, steps);

    Vec out = guarded(N, NAN), scratch = guarded(cpu::newton_schulz_scratch_floats(rows, cols), NAN);
    cpu::newton_schulz5(out.data(), G.data(), rows, cols, steps, eps, scratch.data());
    double max_ref;
    const double err = rel_err(out.data(), ref.data(), 1, 0, 0, (int64_t)N, &max_ref);
    g_tally.report(name, "out", err, max_ref, TOLERANCE);
    g_tally.expect(name, "guards after out and scratch untouched",
                   guard_intact(out, N) && guard_intact(scratch, cpu::newton_schulz_scratch_floats(rows, cols)));
    Vec in_place(G);
    cpu::newton_schulz5(in_place.data(), in_place.data(), rows, cols, steps, eps, scratch.data());
    g_tally.expect(name, "in place (out = G) = out of place, bitwise",
                   memcmp(in_place.data(), out.data(), N * sizeof(float)) == 0);
}

static void check_muon(FixtureReader& rd, int index) {
    int64_t dims[6];
    float hyper[5];
    rd.take(dims, sizeof(int64_t), 6, "muon sizes");
    rd.take(hyper, sizeof(float), 5, "muon hyperparameters");
    for (int k = 0; k < 2; k++) check_range(rd.path, "muon size", dims[k], 1, 1 << 14);
    check_range(rd.path, "muon steps", dims[2], 1, 100);
    check_range(rd.path, "muon ns_steps", dims[3], 0, 99);
    check_range(rd.path, "muon adjust_lr", dims[4], 0, 1);
    check_range(rd.path, "muon nesterov", dims[5], 0, 1);
    const int rows = (int)dims[0], cols = (int)dims[1], steps = (int)dims[2];
    cpu::MuonSettings s;
    s.ns_steps = (int)dims[3];
    s.adjust_lr = dims[4] ? cpu::MuonAdjustLr::MATCH_RMS_ADAMW : cpu::MuonAdjustLr::ORIGINAL;
    s.nesterov = dims[5] != 0;
    s.lr = hyper[0], s.momentum = hyper[1], s.weight_decay = hyper[2], s.eps = hyper[3];
    const float grad_scale = hyper[4];
    const size_t N = (size_t)rows * cols, S = cpu::muon_scratch_floats(rows, cols);

    Vec w = guarded(N, 0.0f), buf = guarded(N, 0.0f), scratch = guarded(S, NAN);
    const Vec w0 = take(rd, (int64_t)N, "muon initial weights");
    memcpy(w.data(), w0.data(), N * sizeof(float));
    Vec ref_prev = w0;
    for (int t = 1; t <= steps; t++) {
        const Vec grad = take(rd, (int64_t)N, "muon gradient");
        const Vec ref_w = take(rd, (int64_t)N, "muon reference weights");
        const Vec ref_buf = take(rd, (int64_t)N, "muon reference momentum");
        cpu::muon_update(w.data(), grad.data(), buf.data(), rows, cols, s, grad_scale, scratch.data());
        char name[128];
        snprintf(name, sizeof(name), "muon #%d %dx%d %s mu %.2f%s scale %.2f step %d", index, rows, cols,
                 dims[4] ? "match_rms_adamw" : "original", s.momentum, s.nesterov ? "" : " no-nesterov", grad_scale, t);
        double max_ref;
        const double buf_err = rel_err(buf.data(), ref_buf.data(), 1, 0, 0, (int64_t)N, &max_ref);
        g_tally.report(name, "momentum", buf_err, max_ref, TOLERANCE);
        double max_err = 0.0, max_update = 0.0;
        bool nan = false;
        for (size_t i = 0; i < N; i++) {
            nan |= std::isnan(w[i]);
            max_err = std::fmax(max_err, std::fabs((double)w[i] - ref_w[i]));
            max_update = std::fmax(max_update, std::fabs((double)ref_w[i] - ref_prev[i]));
        }
        g_tally.report(name, "weights", nan ? NAN : max_err / max_update, max_update, TOLERANCE);
        g_tally.expect(name, "guards after w, momentum and scratch untouched",
                       guard_intact(w, N) && guard_intact(buf, N) && guard_intact(scratch, S));
        ref_prev = ref_w;
    }
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE   (tests/python/test_muon.py writes it)\n", argv[0]);
        return 2;
    }
    FileHeader hd;
    FixtureReader rd = open_fixture(argv[1], MAGIC_MUON, "a Muon fixture", &hd);
    const int64_t ns_cases = hd.h[2], muon_cases = hd.h[3];
    check_range(argv[1], "newton_schulz cases", ns_cases, 1, 1000);
    check_range(argv[1], "muon cases", muon_cases, 1, 1000);
    for (int i = 0; i < ns_cases; i++) check_newton_schulz(rd, i);
    for (int i = 0; i < muon_cases; i++) check_muon(rd, i);
    rd.finish();
    return g_tally.finish("test_muon_cpu");
}
