// fixture_check.h: what the CPU op tests share to check an op against a PyTorch fixture
// (tests/make_*_fixture.py write them in the docs/formats.md header convention):
//   open_fixture   opens the file and checks its length, magic and version; returns the header
//   FixtureReader  sequential reads of the payload, each checked against the file length
//   rel_err        max |ours - ref| / max |ref| over a (strided) block of elements, NaN if ours has one
//   CheckTally     one `ok`/`FAIL` line per compared tensor, and the final PASSED / FAILED line
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include "llmc/formats.h"
#include "llmc/utils.h"

struct FixtureReader {
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
    // Call after the last case: the payload must end exactly there.
    void finish() {
        fclose(f);
        check_file_length(path, size, pos - HEADER_BYTES);
    }
};

// Reads the header of the fixture at `path` (`what` names it in messages, magic its fourcc) into hd
// and returns a reader positioned at the payload.
inline FixtureReader open_fixture(const char* path, int64_t magic, const char* what, FileHeader* hd) {
    const int64_t size = file_size_or_fail(path);
    if (size < HEADER_BYTES)
        fail("%s: %lld bytes is too short to hold the %lld-byte header", path, (long long)size,
             (long long)HEADER_BYTES);
    FILE* f = fopen_or_fail(path, "rb");
    fread_or_fail(hd->h, sizeof(int64_t), HEADER_INTS, f, path);
    if (hd->h[0] != magic)
        fail("%s: bad magic 0x%llx, not %s (expected 0x%llx)", path, (unsigned long long)hd->h[0], what,
             (unsigned long long)magic);
    if (hd->h[1] != FORMAT_VERSION)
        fail("%s: unsupported version %lld (this build reads version %lld)", path, (long long)hd->h[1],
             (long long)FORMAT_VERSION);
    return FixtureReader{f, path, HEADER_BYTES, size};
}

// max |a - ref| / max |ref| over `width` elements at offset `off` of each of `rows` rows of
// `row_stride` elements (a slice of a wider tensor; rows = 1, width = n for a whole one).
// NaN anywhere in the slice of `a` gives NaN, which fails every check.
inline double rel_err(const float* a, const float* ref, int64_t rows, int64_t row_stride, int64_t off, int64_t width,
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

struct CheckTally {
    int passed = 0, failed = 0;
    void report(const char* case_name, const char* tensor, double err, double max_ref, double tolerance) {
        const bool ok = err < tolerance;  // false for NaN
        printf("%s %-40s %-10s max|err|/max|ref| = %.3e  (max|ref| %.3g)\n", ok ? "ok  " : "FAIL", case_name, tensor,
               err, max_ref);
        (ok ? passed : failed)++;
    }
    // A check that is exact or not (bitwise equalities), printed the same way.
    void expect(const char* case_name, const char* what, bool ok) {
        printf("%s %-40s %s\n", ok ? "ok  " : "FAIL", case_name, what);
        (ok ? passed : failed)++;
    }
    // Prints `<test>: PASSED (N checks)` or `FAILED (n of N checks)`; returns the exit status.
    int finish(const char* test) const {
        if (failed) {
            printf("%s: FAILED (%d of %d checks)\n", test, failed, passed + failed);
            return 1;
        }
        printf("%s: PASSED (%d checks)\n", test, passed);
        return 0;
    }
};
