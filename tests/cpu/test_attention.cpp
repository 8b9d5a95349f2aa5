// test_attention_cpu: checks the CPU reference attention (llmc/cpu/attention.h) against PyTorch.
// tests/fixture/attention.bin is written by tests/fixture/make_attention_fixture.py (float64 PyTorch: an
// explicit causal / sliding-window masked softmax and autograd; regenerate with
// `python3 tests/fixture/make_attention_fixture.py`). It holds MHA, GQA, MQA and a sliding-window case.
// For each case this runs cpu::attention_forward and cpu::attention_backward on the stored qkv and
// dout (outputs poisoned with NaN first, so an element left unwritten fails) and compares out, lse,
// dq, dk and dv: max |ours - ref| / max |ref| must be below 1e-5 (reference float64, ours fp32).
// Document masking (doc_start, cpu::doc_starts): packed rows (a row starting inside a document, one-token
// documents) with and without a window, against a naive float64 attention whose mask is built from the
// tokens by its definition (key j visible to query t iff j <= t, no document token in j+1..t, and
// j > t - W with a window), forward and backward, same tolerance; a doc_start of zeros gives the bits of
// doc_start = nullptr.
// Prints one line per tensor per case and `test_attention_cpu: PASSED (N checks)` or FAILED;
// exits 1 on failure.
// Usage: build/test_attention_cpu [fixture path]   (default tests/fixture/attention.bin)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "llmc/cpu/attention.h"
#include "tests/cpu/fixture_check.h"

static const int64_t MAGIC_ATTENTION = fourcc("GPTA");
static const double TOLERANCE = 1e-5;

// The naive reference of a document-masked case: out, lse and dqkv (stored as fp32) from float64 sums
// over an explicit (T, T) visibility mask per row.
static void naive_doc_attention(std::vector<float>& out, std::vector<float>& lse, std::vector<float>& dqkv,
                                const std::vector<float>& qkv, const std::vector<float>& dout,
                                const std::vector<int>& tokens, int doc, int B, int T, int NH, int NKV, int HD, int W) {
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HD, C = (int64_t)NH * HD;
    const double scale = 1.0 / std::sqrt((double)HD);
    std::vector<double> dacc(dqkv.size(), 0.0), p(T), dp(T);
    for (int b = 0; b < B; b++) {
        std::vector<char> visible((size_t)T * T, 0);  // [t][j]
        for (int t = 0; t < T; t++) {
            for (int j = t; j >= 0 && (W == 0 || j > t - W); j--) {
                visible[(size_t)t * T + j] = 1;
                if (tokens[(size_t)b * T + j] == doc) break;  // j opens t's document: nothing before it
            }
        }
        for (int h = 0; h < NH; h++) {
            const int64_t q_off = (int64_t)h * HD, k_off = C + (int64_t)(h / (NH / NKV)) * HD, v_off = k_off + NKV * HD;
            auto at = [&](int t, int64_t off) { return &qkv[((size_t)b * T + t) * QKV + off]; };
            for (int t = 0; t < T; t++) {
                double maxs = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    if (!visible[(size_t)t * T + j]) continue;
                    double s = 0.0;
                    for (int d = 0; d < HD; d++) s += (double)at(t, q_off)[d] * at(j, k_off)[d];
                    p[j] = s * scale;
                    maxs = std::fmax(maxs, p[j]);
                }
                for (int j = 0; j <= t; j++)
                    if (visible[(size_t)t * T + j]) sum += std::exp(p[j] - maxs);
                const float* go = &dout[((size_t)b * T + t) * C + q_off];
                double D = 0.0;
                for (int d = 0; d < HD; d++) {
                    double o = 0.0;
                    for (int j = 0; j <= t; j++)
                        if (visible[(size_t)t * T + j]) o += std::exp(p[j] - maxs) / sum * at(j, v_off)[d];
                    out[((size_t)b * T + t) * C + q_off + d] = (float)o;
                    D += o * go[d];
                }
                lse[((size_t)b * NH + h) * T + t] = (float)(maxs + std::log(sum));
                for (int j = 0; j <= t; j++) {
                    if (!visible[(size_t)t * T + j]) continue;
                    const double pj = std::exp(p[j] - maxs) / sum;
                    dp[j] = 0.0;
                    for (int d = 0; d < HD; d++) dp[j] += (double)go[d] * at(j, v_off)[d];
                    const double ds = pj * (dp[j] - D) * scale;
                    double* dq = &dacc[((size_t)b * T + t) * QKV + q_off];
                    double* dk = &dacc[((size_t)b * T + j) * QKV + k_off];
                    double* dv = &dacc[((size_t)b * T + j) * QKV + v_off];
                    for (int d = 0; d < HD; d++) {
                        dq[d] += ds * at(j, k_off)[d];
                        dk[d] += ds * at(t, q_off)[d];
                        dv[d] += pj * go[d];
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < dqkv.size(); i++) dqkv[i] = (float)dacc[i];
}

// Document-masked attention against naive_doc_attention; doc_start all zeros against nullptr, bitwise.
static void check_doc_masking(CheckTally& tally) {
    const int B = 2, T = 13, NH = 4, NKV = 2, HD = 8, doc = 7;
    const int64_t QKV = (NH + 2 * NKV) * HD, C = NH * HD, BT = B * T;
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qkv(BT * QKV), dout(BT * C);
    for (float& x : qkv) x = normal(gen);
    for (float& x : dout) x = normal(gen);
    // row 0: documents at 0, 4, 5 (one token), 9; row 1 starts inside a document and opens one at 6
    std::vector<int> tokens(BT, 1);
    for (int pos : {0, 4, 5, 9, T + 6}) tokens[pos] = doc;
    std::vector<int> doc_start(BT), zeros(BT, 0);
    cpu::doc_starts(doc_start.data(), tokens.data(), B, T, doc);
    for (int W : {0, 3}) {
        std::vector<float> out(BT * C, NAN), lse(B * NH * T, NAN), dqkv(BT * QKV, NAN);
        std::vector<float> ref_out(out.size()), ref_lse(lse.size()), ref_dqkv(dqkv.size());
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, HD, W, doc_start.data());
        cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, HD, W,
                                doc_start.data());
        naive_doc_attention(ref_out, ref_lse, ref_dqkv, qkv, dout, tokens, doc, B, T, NH, NKV, HD, W);
        char case_name[96];
        snprintf(case_name, sizeof case_name, "documents B=%d T=%d NH=%d NKV=%d HD=%d W=%d", B, T, NH, NKV, HD, W);
        double mr, e;
        e = rel_err(out.data(), ref_out.data(), 1, 0, 0, BT * C, &mr);
        tally.report(case_name, "out", e, mr, TOLERANCE);
        e = rel_err(lse.data(), ref_lse.data(), 1, 0, 0, B * NH * T, &mr);
        tally.report(case_name, "lse", e, mr, TOLERANCE);
        e = rel_err(dqkv.data(), ref_dqkv.data(), 1, 0, 0, BT * QKV, &mr);
        tally.report(case_name, "dqkv", e, mr, TOLERANCE);

        std::vector<float> out0(out.size()), lse0(lse.size()), dqkv0(dqkv.size());
        std::vector<float> out1(out.size()), lse1(lse.size()), dqkv1(dqkv.size());
        cpu::attention_forward(out0.data(), lse0.data(), qkv.data(), B, T, NH, NKV, HD, W, zeros.data());
        cpu::attention_backward(dqkv0.data(), dout.data(), qkv.data(), out0.data(), lse0.data(), B, T, NH, NKV, HD, W,
                                zeros.data());
        cpu::attention_forward(out1.data(), lse1.data(), qkv.data(), B, T, NH, NKV, HD, W);
        cpu::attention_backward(dqkv1.data(), dout.data(), qkv.data(), out1.data(), lse1.data(), B, T, NH, NKV, HD, W);
        const bool same = memcmp(out0.data(), out1.data(), out0.size() * 4) == 0 &&
                          memcmp(lse0.data(), lse1.data(), lse0.size() * 4) == 0 &&
                          memcmp(dqkv0.data(), dqkv1.data(), dqkv0.size() * 4) == 0;
        tally.expect(case_name, "doc_start of zeros = nullptr, bit for bit", same);
    }
}

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "tests/fixture/attention.bin";
    FileHeader hd;
    FixtureReader rd = open_fixture(path, MAGIC_ATTENTION, "an attention fixture (\"GPTA\")", &hd);
    check_range(path, "num_cases", hd.h[2], 1, 64);
    const int num_cases = (int)hd.h[2];
    CheckTally tally;

    for (int c = 0; c < num_cases; c++) {
        int64_t dims[6];
        rd.take(dims, sizeof(int64_t), 6, "case dimensions");
        const char* names[6] = {"B", "T", "NH", "NKV", "HD", "window"};
        for (int i = 0; i < 5; i++) check_range(path, names[i], dims[i], 1, 4096);
        check_range(path, names[5], dims[5], 0, 4096);
        const int B = (int)dims[0], T = (int)dims[1], NH = (int)dims[2], NKV = (int)dims[3], HD = (int)dims[4],
                  W = (int)dims[5];
        if (NH % NKV != 0) fail("%s: case %d: NH %d is not a multiple of NKV %d", path, c, NH, NKV);
        const int64_t QKV = (int64_t)(NH + 2 * NKV) * HD, C = (int64_t)NH * HD, BT = (int64_t)B * T;
        std::vector<float> qkv(BT * QKV), dout(BT * C), ref_out(BT * C), ref_lse((int64_t)B * NH * T),
            ref_dqkv(BT * QKV);
        rd.take(qkv.data(), 4, qkv.size(), "qkv");
        rd.take(dout.data(), 4, dout.size(), "dout");
        rd.take(ref_out.data(), 4, ref_out.size(), "out");
        rd.take(ref_lse.data(), 4, ref_lse.size(), "lse");
        rd.take(ref_dqkv.data(), 4, ref_dqkv.size(), "dqkv");

        std::vector<float> out(ref_out.size(), NAN), lse(ref_lse.size(), NAN), dqkv(ref_dqkv.size(), NAN);
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, HD, W);
        cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, HD, W);

        char case_name[96];
        snprintf(case_name, sizeof case_name, "B=%d T=%d NH=%d NKV=%d HD=%d W=%d", B, T, NH, NKV, HD, W);
        double mr, e;
        e = rel_err(out.data(), ref_out.data(), BT, C, 0, C, &mr);
        tally.report(case_name, "out", e, mr, TOLERANCE);
        e = rel_err(lse.data(), ref_lse.data(), (int64_t)B * NH, T, 0, T, &mr);
        tally.report(case_name, "lse", e, mr, TOLERANCE);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, 0, C, &mr);
        tally.report(case_name, "dq", e, mr, TOLERANCE);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, C, (int64_t)NKV * HD, &mr);
        tally.report(case_name, "dk", e, mr, TOLERANCE);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, C + (int64_t)NKV * HD, (int64_t)NKV * HD, &mr);
        tally.report(case_name, "dv", e, mr, TOLERANCE);
    }
    rd.finish();  // no bytes after the last case
    check_doc_masking(tally);
    return tally.finish("test_attention_cpu");
}
