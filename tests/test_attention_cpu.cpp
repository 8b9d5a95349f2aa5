// test_attention_cpu: checks the CPU reference attention (llmc/cpu/attention.h) against PyTorch.
// tests/fixture/attention.bin is written by tests/make_attention_fixture.py (float64 PyTorch: an
// explicit causal / sliding-window masked softmax and autograd; regenerate with
// `python3 tests/make_attention_fixture.py`). It holds MHA, GQA, MQA and a sliding-window case.
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
#include "llmc/formats.h"
#include "llmc/utils.h"

static const int64_t MAGIC_ATTENTION = fourcc("GPTA");
static const double TOLERANCE = 1e-5;

struct Reader {  // sequential reads of the payload, each checked against the file length
    FILE* f;
    const char* path;
    int64_t pos, size;
    void take(void* dst, size_t elem, int64_t n, const char* what) {
        if (pos + (int64_t)elem * n > size)
            fail("%s: truncated: %s needs %lld bytes at offset %lld, the file has %lld", path, what,
                 (long long)(elem * n), (long long)pos, (long long)size);
        fread_or_fail(dst, elem, (size_t)n, f, path);
        pos += (int64_t)elem * n;
    }
};

// max |a - ref| / max |ref| over n elements at stride apart in `rows` rows (for dq/dk/dv slices
// of dqkv). NaN anywhere in `a` gives NaN, which fails the check.
static double rel_err(const float* a, const float* ref, int64_t rows, int64_t row_stride, int64_t off, int64_t width,
                      double* max_ref_out) {
    double max_err = 0.0, max_ref = 0.0;
    bool nan = false;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < width; c++) {
            const int64_t i = r * row_stride + off + c;
            if (std::isnan(a[i])) nan = true;
            max_err = std::fmax(max_err, std::fabs((double)a[i] - (double)ref[i]));
            max_ref = std::fmax(max_ref, std::fabs((double)ref[i]));
        }
    *max_ref_out = max_ref;
    if (nan) return NAN;
    return max_ref > 0.0 ? max_err / max_ref : max_err;
}

static int g_passed = 0, g_failed = 0;

static void report(const char* case_name, const char* tensor, double err, double max_ref) {
    const bool ok = err < TOLERANCE;  // false for NaN
    printf("%s %-30s %-4s max|err|/max|ref| = %.3e  (max|ref| %.3g)\n", ok ? "ok  " : "FAIL", case_name, tensor, err,
           max_ref);
    (ok ? g_passed : g_failed)++;
}

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "tests/fixture/attention.bin";
    const int64_t size = file_size_or_fail(path);
    if (size < HEADER_BYTES)
        fail("%s: %lld bytes is too short to hold the %lld-byte header", path, (long long)size,
             (long long)HEADER_BYTES);
    FileHeader hd;
    FILE* f = fopen_or_fail(path, "rb");
    fread_or_fail(hd.h, sizeof(int64_t), HEADER_INTS, f, path);
    if (hd.h[0] != MAGIC_ATTENTION)
        fail("%s: bad magic 0x%llx, not an attention fixture (expected 0x%llx \"GPTA\")", path,
             (unsigned long long)hd.h[0], (unsigned long long)MAGIC_ATTENTION);
    if (hd.h[1] != FORMAT_VERSION)
        fail("%s: unsupported version %lld (this build reads version %lld)", path, (long long)hd.h[1],
             (long long)FORMAT_VERSION);
    check_range(path, "num_cases", hd.h[2], 1, 64);
    const int num_cases = (int)hd.h[2];
    Reader rd{f, path, HEADER_BYTES, size};

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
        report(case_name, "out", e, mr);
        e = rel_err(lse.data(), ref_lse.data(), (int64_t)B * NH, T, 0, T, &mr);
        report(case_name, "lse", e, mr);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, 0, C, &mr);
        report(case_name, "dq", e, mr);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, C, (int64_t)NKV * HD, &mr);
        report(case_name, "dk", e, mr);
        e = rel_err(dqkv.data(), ref_dqkv.data(), BT, QKV, C + (int64_t)NKV * HD, (int64_t)NKV * HD, &mr);
        report(case_name, "dv", e, mr);
    }
    fclose(f);
    check_file_length(path, size, rd.pos - HEADER_BYTES);  // no bytes after the last case

    if (g_failed) {
        printf("test_attention_cpu: FAILED (%d of %d checks)\n", g_failed, g_passed + g_failed);
        return 1;
    }
    printf("test_attention_cpu: PASSED (%d checks)\n", g_passed);
    return 0;
}
