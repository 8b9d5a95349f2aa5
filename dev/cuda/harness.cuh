// harness.cuh: the kernel lab's one driver, shared by every dev/cuda/<op>.cu file.
//
// A lab file builds its inputs and the CPU reference (llmc/cpu/*.h), then hands each variant to
// Lab::run, which
//   1. puts the outputs in their pre-run state: poisoned with NaN bytes (outputs written with `=`)
//      or filled with the reference's starting values (gradients accumulated with `+=`),
//   2. launches the variant once and checks it: every element written, the guard region after each
//      output untouched, and each output within tolerance of the CPU reference,
//   3. times it: warm-up, then many repeats, each after an L2 flush, timed with CUDA events; median,
//   4. prints one fixed-format line, the same in every lab file (run_all.sh collects them):
//        name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
//      GB/s and TFLOP/s come from the bytes and FLOPs the lab file states for the op (the fewest
//      bytes an implementation must move: each input read once, each output written once); the
//      ceiling is the 4.0 TB/s device copy for memory-bound ops and the 710 TFLOP/s cuBLAS bf16 GEMM
//      for compute-bound ones (both measured on the H200: docs/h200.md).
// A failed check skips the timing, prints `FAIL`, and makes the binary exit 1.
//
// Command line of every lab binary: `./<op> [variant ...] [--check-only] [--reps N]`; no variant
// runs them all.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/cuda_common.cuh"
#include "llmc/rand.h"
#include "llmc/utils.h"

namespace lab {

// ---------------------------------------------------------------- H200 ceilings (docs/h200.md)
constexpr double H200_COPY_GBPS = 4000.0;    // device-to-device copy, bytes read + written
constexpr double H200_GEMM_TFLOPS = 710.0;  // cuBLAS bf16 GEMM at 8192^3
enum class Bound { Memory, Compute };

// ---------------------------------------------------------------- GPT-2 124M shapes used by the lab
constexpr int GPT2_B = 64, GPT2_T = 1024, GPT2_C = 768, GPT2_NH = 12, GPT2_V = 50257, GPT2_VP = 50304;
// The awkward shape: 651 rows (3 x 217) is a multiple of no block or tile size; lab files also use
// awkward channel counts where the shipped launcher allows them.
constexpr int ODD_B = 3, ODD_T = 217;

// ---------------------------------------------------------------- host data
// Random inputs are counter-based: element i of a tensor drawn with `seed` is the (i+1)-th number of
// Rng(seed)'s stream (Rng::skip jumps straight there), so filling 3G values runs on every core
// and a reference can recompute any element without a host copy of the tensor.
inline float uniform_at(uint64_t seed, size_t i, float lo, float hi) {
    Rng rng = Rng::skip(seed, (uint64_t)i);
    return lo + (hi - lo) * rng.uniform();
}

// Rounds every value to what a T holds, so the CPU reference sees exactly the values the GPU reads.
template <typename T>
inline void round_to(std::vector<float>& v) {
    if constexpr (!std::is_same_v<T, float>) {
#pragma omp parallel for
        for (size_t i = 0; i < v.size(); i++) v[i] = to_float(from_float<T>(v[i]));
    }
}

// Uniform in [lo, hi), rounded to floatX.
inline std::vector<float> rand_uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) v[i] = uniform_at(seed, i, lo, hi);
    round_to<floatX>(v);
    return v;
}

// Integers in [0, below), e.g. token ids.
inline std::vector<int> rand_ints(size_t n, uint64_t seed, int below) {
    std::vector<int> v(n);
    Rng rng(seed);
    for (auto& x : v) x = (int)rng.below((uint64_t)below);
    return v;
}

// k distinct sorted indices in [0, n), always including the first and the last: the rows a lab file
// checks when the CPU reference of the whole output would take minutes (matmuls, the classifier).
inline std::vector<int> sample_rows(int n, int k, uint64_t seed) {
    std::vector<int> rows = {0, n - 1};
    Rng rng(seed);
    while ((int)rows.size() < std::min(k, n)) {
        int r = (int)rng.below((uint64_t)n);
        if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
    }
    std::sort(rows.begin(), rows.end());
    return rows;
}

// Gathers rows `rows` of a (n, width) row-major matrix into a (rows.size(), width) one.
inline std::vector<float> gather_rows(const std::vector<float>& m, const std::vector<int>& rows, size_t width) {
    std::vector<float> out(rows.size() * width);
    for (size_t r = 0; r < rows.size(); r++)
        std::memcpy(&out[r * width], &m[(size_t)rows[r] * width], width * sizeof(float));
    return out;
}

// ---------------------------------------------------------------- device buffers
// GUARD_BYTES after every buffer hold GUARD_BYTE; a kernel that writes past its output changes them.
constexpr size_t GUARD_BYTES = 4096;
constexpr unsigned char GUARD_BYTE = 0xA5;
// Poison: all bits set, a NaN in fp32 and bf16 that no kernel computes from finite inputs here.
constexpr unsigned char POISON_BYTE = 0xFF;

template <typename T>
static __global__ void count_poison_kernel(const T* p, size_t n, unsigned long long* count) {
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const unsigned char* b = reinterpret_cast<const unsigned char*>(p + i);
        bool all = true;
        for (size_t k = 0; k < sizeof(T); k++) all &= b[k] == POISON_BYTE;
        c += all;
    }
    const unsigned warp_count = __reduce_add_sync(0xffffffffu, (unsigned)c);  // per thread < n / 2^18
    if (threadIdx.x % WARP_SIZE == 0 && warp_count) atomicAdd(count, (unsigned long long)warp_count);
}

// Bytes of a and b that differ, in columns [lo, hi) of `rows` rows of `pitch` bytes (rows 1, pitch
// and hi the size: a whole buffer): their count, and the offset of the first (~0 when none).
struct ByteDiff {
    unsigned long long count = 0, first = ~0ull;
};
static __global__ void diff_bytes_kernel(const uint8_t* a, const uint8_t* b, int64_t rows, int64_t pitch, int64_t lo,
                                         int64_t hi, ByteDiff* out) {
    unsigned long long c = 0, f = ~0ull;
    const int64_t w = hi - lo, n = rows * w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t at = (i / w) * pitch + lo + i % w;
        if (a[at] != b[at]) {
            c++;
            f = min(f, (unsigned long long)at);
        }
    }
    if (c) {
        atomicAdd(&out->count, c);
        atomicMin(&out->first, f);
    }
}
inline ByteDiff diff_bytes(const void* a, const void* b, int64_t rows, int64_t pitch, int64_t lo, int64_t hi) {
    ByteDiff h, *d;
    cudaCheck(cudaMalloc(&d, sizeof(*d)));
    cudaCheck(cudaMemcpy(d, &h, sizeof(h), cudaMemcpyHostToDevice));
    diff_bytes_kernel<<<1024, 256>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), rows, pitch, lo,
                                     hi, d);
    cudaCheckLaunch();
    cudaCheck(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d));
    return h;
}

template <typename T>
class DevBuf {
  public:
    explicit DevBuf(size_t n, const char* name = "buffer") : n_(n), name_(name) {
        cudaCheck(cudaMalloc(&ptr_, n * sizeof(T) + GUARD_BYTES));
        cudaCheck(cudaMemset(reinterpret_cast<char*>(ptr_) + n * sizeof(T), GUARD_BYTE, GUARD_BYTES));
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    ~DevBuf() { cudaFree(ptr_); }

    T* get() const { return ptr_; }
    operator T*() const { return ptr_; }
    size_t size() const { return n_; }
    const char* name() const { return name_; }

    // Host values converted to T (float -> bf16 rounds to nearest even; ints are copied as they are).
    template <typename H>
    void upload(const std::vector<H>& h) {
        if (h.size() != n_) fail("lab: uploading %zu values into %s of %zu", h.size(), name_, n_);
        std::vector<T> t(n_);
#pragma omp parallel for
        for (size_t i = 0; i < n_; i++) {
            if constexpr (std::is_same_v<T, H>) t[i] = h[i];
            else t[i] = from_float<T>((float)h[i]);
        }
        cudaCheck(cudaMemcpy(ptr_, t.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
    // Uniform random values straight into the buffer (the values of rand_uniform(n, seed, lo, hi)),
    // through a host staging chunk: for outputs too large to keep a host copy of (the logits).
    void fill_uniform(uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
        constexpr size_t CHUNK = 1 << 24;
        std::vector<T> t(std::min(n_, CHUNK));
        for (size_t first = 0; first < n_; first += CHUNK) {
            const size_t count = std::min(CHUNK, n_ - first);
#pragma omp parallel for
            for (size_t i = 0; i < count; i++) t[i] = from_float<T>(uniform_at(seed, first + i, lo, hi));
            cudaCheck(cudaMemcpy(ptr_ + first, t.data(), count * sizeof(T), cudaMemcpyHostToDevice));
        }
    }
    void poison(cudaStream_t s) { cudaCheck(cudaMemsetAsync(ptr_, POISON_BYTE, n_ * sizeof(T), s)); }

    // Elements [first, first + count) as floats.
    std::vector<float> download(size_t first = 0, size_t count = SIZE_MAX) const {
        count = std::min(count, n_ - first);
        std::vector<T> t(count);
        cudaCheck(cudaMemcpy(t.data(), ptr_ + first, count * sizeof(T), cudaMemcpyDeviceToHost));
        std::vector<float> f(count);
        for (size_t i = 0; i < count; i++) f[i] = to_float(t[i]);
        return f;
    }
    // Rows `rows` of this buffer seen as (n / width, width).
    std::vector<float> download_rows(const std::vector<int>& rows, size_t width) const {
        std::vector<float> f;
        f.reserve(rows.size() * width);
        for (int r : rows) {
            auto row = download((size_t)r * width, width);
            f.insert(f.end(), row.begin(), row.end());
        }
        return f;
    }
    // Columns `cols` of this buffer seen as (n / width, width), as a (n / width, cols.size()) matrix.
    std::vector<float> download_cols(const std::vector<int>& cols, size_t width) const {
        const size_t rows = n_ / width, k = cols.size();
        std::vector<T> col(rows);
        std::vector<float> f(rows * k);
        for (size_t j = 0; j < k; j++) {
            cudaCheck(cudaMemcpy2D(col.data(), sizeof(T), ptr_ + cols[j], width * sizeof(T), sizeof(T), rows,
                                   cudaMemcpyDeviceToHost));
            for (size_t r = 0; r < rows; r++) f[r * k + j] = to_float(col[r]);
        }
        return f;
    }
    size_t count_unwritten() const {
        unsigned long long* d;
        unsigned long long h = 0;
        cudaCheck(cudaMalloc(&d, sizeof(*d)));
        cudaCheck(cudaMemset(d, 0, sizeof(*d)));
        count_poison_kernel<<<1024, 256>>>(ptr_, n_, d);
        cudaCheckLaunch();
        cudaCheck(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(d));
        return (size_t)h;
    }
    bool guard_intact() const {
        unsigned char g[GUARD_BYTES];
        cudaCheck(cudaMemcpy(g, reinterpret_cast<const char*>(ptr_) + n_ * sizeof(T), GUARD_BYTES, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < GUARD_BYTES; i++)
            if (g[i] != GUARD_BYTE) return false;
        return true;
    }

  private:
    T* ptr_ = nullptr;
    size_t n_;
    const char* name_;
};

// ---------------------------------------------------------------- comparison
// An element passes when |got - ref| <= rel * |ref| + abs * rms(ref): the absolute part scales with
// the output so values near zero (cancellation) are judged against the output's typical size.
struct Tol {
    double rel, abs;
};
// By the precision the output is stored in and the kernels read: fp32 ~1e-5 relative with room for
// a different summation order; bf16 outputs carry 2^-9 relative rounding, bf16 operands ~1e-3..1e-2.
inline Tol default_tol() {
#if defined(PRECISION_FP32)
    return {2e-5, 2e-5};
#else
    return {1.6e-2, 1e-2};
#endif
}

struct Errors {
    double max_abs = 0, max_rel = 0, nmse = 0;
    size_t bad = 0, nan = 0, first_bad = SIZE_MAX;
};
inline Errors measure(const std::vector<float>& got, const std::vector<float>& ref, Tol tol) {
    Errors e;
    double sq_err = 0, sq_ref = 0;
    for (size_t i = 0; i < ref.size(); i++) sq_ref += (double)ref[i] * ref[i];
    const double abs_tol = tol.abs * std::sqrt(sq_ref / std::max<size_t>(ref.size(), 1));
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = std::fabs((double)got[i] - ref[i]), r = std::fabs((double)ref[i]);
        if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
            e.nan++;
            if (e.first_bad == SIZE_MAX) e.first_bad = i;
            continue;
        }
        sq_err += d * d;
        e.max_abs = std::max(e.max_abs, d);
        if (r > abs_tol) e.max_rel = std::max(e.max_rel, d / r);
        if (d > tol.rel * r + abs_tol) {
            e.bad++;
            if (e.first_bad == SIZE_MAX) e.first_bad = i;
        }
    }
    e.nmse = sq_ref > 0 ? sq_err / sq_ref : sq_err;
    return e;
}

// ---------------------------------------------------------------- the driver
class Lab {
  public:
    CudaContext ctx;

    // `file` names the lab file in the usage text; argv: [variant ...] [--check-only] [--reps N].
    Lab(int argc, char** argv, const char* file) : file_(file) {
        for (int i = 1; i < argc; i++) {
            int64_t v;
            if (!strcmp(argv[i], "--check-only")) {
                check_only_ = true;
            } else if (!strcmp(argv[i], "--reps")) {
                if (i + 1 >= argc || !parse_int64(argv[i + 1], &v) || v < 1 || v > 10000)
                    fail("%s: --reps needs a count in 1..10000", file);
                reps_ = (int)v;
                i++;
            } else if (parse_int64(argv[i], &v) && v >= 0 && v < 1000) {
                variants_.push_back((int)v);
            } else {
                fail("%s: unknown argument '%s' (usage: %s [variant ...] [--check-only] [--reps N])", file, argv[i],
                     argv[0]);
            }
        }
        ctx.init(0);
        // Twice the reported L2 (50 MB on the H200, 60 MB as the driver reports it) and at least 256 MB.
        flush_bytes_ = std::max<size_t>(256u << 20, 2 * (size_t)ctx.props.l2CacheSize);
        cudaCheck(cudaMalloc(&flush_, flush_bytes_));
        printf("# %s on %s (%d SMs, %d MB L2), %s build\n", file, ctx.props.name, ctx.props.multiProcessorCount,
               ctx.props.l2CacheSize >> 20, PRECISION_NAME);
    }
    ~Lab() {
        cudaFree(flush_);
        ctx.destroy();
    }
    cudaStream_t stream() const { return ctx.stream; }
    // The median of the last run() in ms; -1 when it was not selected, failed or ran --check-only
    // (for lab files that print ratios of their own lines, e.g. matmul_fp8.cu's FP8 / bf16 summary).
    double last_ms() const { return last_ms_; }
    bool check_only() const { return check_only_; }
    bool selected(int variant) const {
        return variants_.empty() || std::find(variants_.begin(), variants_.end(), variant) != variants_.end();
    }

    // Compares `got` (already downloaded) with `ref`; prints one line; false on any failure.
    bool compare(const char* what, const std::vector<float>& got, const std::vector<float>& ref, Tol tol) {
        if (got.size() != ref.size()) fail("lab: %s: comparing %zu values with %zu", what, got.size(), ref.size());
        Errors e = measure(got, ref, tol);
        bool ok = e.bad == 0 && e.nan == 0;
        printf("    %-10s max_abs %.2e  max_rel %.2e  nmse %.2e  (tol %.0e rel + %.0e rms)", what, e.max_abs, e.max_rel,
               e.nmse, tol.rel, tol.abs);
        if (ok) printf("  ok\n");
        else printf("  FAIL: %zu out of tolerance, %zu non-finite; first at %zu: got %g want %g\n", e.bad, e.nan,
                    e.first_bad, got[e.first_bad], ref[e.first_bad]);
        return ok;
    }
    // Whole device output against the reference, plus the written and guard checks. With `rows`, only
    // those rows of a (n / width, width) output are compared (the written and guard checks stay whole).
    template <typename T>
    bool check(const DevBuf<T>& out, const std::vector<float>& ref, Tol tol = default_tol(),
               const std::vector<int>& rows = {}, size_t width = 0) {
        cudaCheck(cudaDeviceSynchronize());
        bool ok = true;
        if (size_t unwritten = out.count_unwritten()) {
            printf("    %-10s FAIL: %zu of %zu elements never written\n", out.name(), unwritten, out.size());
            ok = false;
        }
        if (!out.guard_intact()) {
            printf("    %-10s FAIL: the kernel wrote into the guard region after the output\n", out.name());
            ok = false;
        }
        auto got = rows.empty() ? out.download() : out.download_rows(rows, width);
        return compare(out.name(), got, ref, tol) && ok;
    }

    // One variant of one op at one shape: reset, launch, check, time, report. `op` names the op and
    // shape ("layernorm_forward B=64 T=1024 C=768"); `variant` is its number, `what` a short name.
    void run(const std::string& op, int variant, const char* what, double bytes, double flops, Bound bound,
             const std::function<void()>& reset, const std::function<void()>& launch,
             const std::function<bool()>& check_outputs) {
        last_ms_ = -1.0;
        if (!selected(variant)) return;
        printf("  %s | %d %s: moves %.1f MB, %.3f GFLOP\n", op.c_str(), variant, what, bytes / 1e6, flops / 1e9);
        reset();
        launch();
        cudaCheckLaunch();
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        if (!check_outputs()) {
            printf("FAIL %s | %d %s\n", op.c_str(), variant, what);
            failures_++;
            return;
        }
        if (check_only_) return;
        const double ms = time_median_ms(launch);
        last_ms_ = ms;
        const double gbps = bytes / (ms * 1e-3) / 1e9, tflops = flops / (ms * 1e-3) / 1e12;
        const double pct = bound == Bound::Memory ? 100.0 * gbps / H200_COPY_GBPS : 100.0 * tflops / H200_GEMM_TFLOPS;
        lines_.push_back(strprintf("%s | %d %s | %.4f | %.1f | %.2f | %.1f%% %s", op.c_str(), variant, what, ms, gbps,
                                   tflops, pct, bound == Bound::Memory ? "of copy" : "of GEMM"));
        printf("%s\n", lines_.back().c_str());
    }

    // Median time of `launch` in ms: 3 warm-ups, then repeats (enough for ~0.5 s, at least 10, at most
    // --reps or 100), each after writing a buffer larger than L2 so no input is served from cache.
    double time_median_ms(const std::function<void()>& launch) {
        cudaEvent_t t0, t1;
        cudaCheck(cudaEventCreate(&t0));
        cudaCheck(cudaEventCreate(&t1));
        for (int i = 0; i < 3; i++) launch();
        cudaCheck(cudaEventRecord(t0, ctx.stream));
        launch();
        cudaCheck(cudaEventRecord(t1, ctx.stream));
        cudaCheck(cudaEventSynchronize(t1));
        float first;
        cudaCheck(cudaEventElapsedTime(&first, t0, t1));
        int reps = reps_ > 0 ? reps_ : std::clamp((int)(500.0 / std::max(first, 1e-3f)), 10, 100);
        std::vector<cudaEvent_t> ev(2 * reps);
        for (auto& e : ev) cudaCheck(cudaEventCreate(&e));
        for (int r = 0; r < reps; r++) {
            cudaCheck(cudaMemsetAsync(flush_, r & 0xFF, flush_bytes_, ctx.stream));
            cudaCheck(cudaEventRecord(ev[2 * r], ctx.stream));
            launch();
            cudaCheck(cudaEventRecord(ev[2 * r + 1], ctx.stream));
        }
        cudaCheckLaunch();
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        std::vector<float> ms(reps);
        for (int r = 0; r < reps; r++) cudaCheck(cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]));
        for (auto& e : ev) cudaCheck(cudaEventDestroy(e));
        cudaCheck(cudaEventDestroy(t0));
        cudaCheck(cudaEventDestroy(t1));
        std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
        return ms[reps / 2];
    }

    // Prints the table of this binary's lines and returns the exit status: 1 if any check failed.
    int finish() {
        printf("\n# name | variant | ms | GB/s | TFLOP/s | %% of H200 ceiling\n");
        for (auto& l : lines_) printf("%s\n", l.c_str());
        printf("# %s: %d check(s) failed\n", file_, failures_);
        return failures_ ? 1 : 0;
    }

    __attribute__((format(printf, 1, 2))) static std::string strprintf(const char* fmt, ...) {
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        return buf;
    }

  private:
    const char* file_;
    std::vector<int> variants_;
    bool check_only_ = false;
    int reps_ = 0;
    void* flush_ = nullptr;
    size_t flush_bytes_ = 0;
    int failures_ = 0;
    double last_ms_ = -1.0;
    std::vector<std::string> lines_;
};

}  // namespace lab
