// test_attention_cpu: checks the CPU reference attention (llmc/cpu/attention.h) against PyTorch.
// tests/fixture/attention.bin is written by tests/fixture/make_attention_fixture.py (float64 PyTorch: an
// explicit causal / sliding-window masked softmax and autograd; regenerate with
// `python3 tests/fixture/make_attention_fixture.py`). It holds MHA, GQA, MQA and a sliding-window case.
// For each case this runs cpu::attention_forward and cpu::attention_backward on the stored qkv and
// dout (outputs poisoned with NaN first, so an element left unwritten fails) and compares out, lse,
// dq, dk and dv: max |ours - ref| / max |ref| must be below 1e-5 (reference float64, ours fp32).
// Prints one line per tensor per case and `test_attention_cpu: PASSED (N checks)` or FAILED;
// exits 1 on failure.
// Usage: build/test_attention_cpu [fixture path]   (default tests/fixture/attention.bin)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "llmc/cpu/attention.h"
#include "tests/cpu/fixture_check.h"

static const int64_t MAGIC_ATTENTION = fourcc("GPTA");
static const double TOLERANCE = 1e-5;

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
    return tally.finish("test_attention_cpu");
}
