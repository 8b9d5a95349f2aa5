// encoder.cuh: token + position embedding, forward and backward (floatX, fp32 accumulation).
//   forward   out (B, T, C) = wte[inp[b, t]] + wpe[t]                              (=)
//   decode    out (B, C) = wte[tokens[b]] + wpe[pos[b]], each sequence at its own position (=)
//   backward  dwte[tok] += sum of dout over the positions holding tok;  dwpe[t] += sum_b dout[b, t]  (+=)
// With RoPE (Llama-style models) there is no position table: wpe and dwpe are nullptr, the forwards
// copy the token's row (out = wte[token]) and the backward skips dwpe.
// With doc_start (B, T) (--doc-positions restart, llmc/attention_layout.cuh) position t of row b is
// t - doc_start[b, t] in the forward and in dwpe.
// The backward is deterministic: positions are bucketed by token on the host (counting sort, in
// position order) and each bucket is summed by one thread block in that order, so two runs, or a
// run and its resumed copy, produce bit-identical gradients. Atomics would not.
// C must be a multiple of x128::size (8 in bf16) so every row starts on a 16-byte boundary.
#pragma once
#include <vector>
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// The pack at column c of output row `row`: wte[tok] + wpe[t], or wte[tok] alone without wpe (RoPE).
__device__ inline void embed_pack(floatX* out, const floatX* wte, const floatX* wpe, int row, int c, int tok, int t,
                                  int C) {
    const x128 a = load128(wte + (int64_t)tok * C + c);
    if (wpe == nullptr) {
        store128(out + (int64_t)row * C + c, a);
        return;
    }
    const x128 b = load128(wpe + (int64_t)t * C + c);
    x128 o;
    for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(to_float(a[k]) + to_float(b[k]));
    store128(out + (int64_t)row * C + c, o);
}

// One thread per 16-byte pack of one output row: reads 2 packs, writes 1 -> 3 * N * C * sizeof(floatX)
// bytes, no math to speak of: memory-bound. Measured: docs/perf.md, "Memory-bound kernels".
// doc_start (N) or nullptr: positions restart at each document (row t - doc_start[row]; llmc/attention_layout.cuh).
static __global__ void encoder_forward_packed(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                              const int* doc_start, int N, int T, int C) {
    const int packs_per_row = C / x128::size;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)N * packs_per_row) return;
    const int row = (int)(idx / packs_per_row), c = (int)(idx % packs_per_row) * x128::size;
    embed_pack(out, wte, wpe, row, c, inp[row], row % T - (doc_start ? doc_start[row] : 0), C);
}

// doc_start (B, T) device or nullptr: the position of (b, t) is t - doc_start[b, t] (--doc-positions restart).
inline void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream, const int* doc_start = nullptr) {
    if (C % x128::size != 0) fail("encoder_forward: C = %d is not a multiple of %d", C, x128::size);
    const int64_t total = (int64_t)B * T * (C / x128::size);
    const int block = 256;
    encoder_forward_packed<<<(unsigned)ceil_div<int64_t>(total, block), block, 0, stream>>>(out, inp, wte, wpe,
                                                                                             doc_start, B * T, T, C);
    cudaCheckLaunch();
}

// Decode: one token per sequence at its own position, out (B, C) = wte[tokens[b]] + wpe[pos[b]]; an
// idle sequence (pos[b] < 0) gets token 0 at position 0 (a row computed and never used). Tokens and
// positions are read on the device, so a captured CUDA graph replays it for every step. One thread
// per 16-byte pack, 3 * B * C * sizeof(floatX) bytes. pdl: launched as a programmatic dependent
// (cuda_common.cuh), it waits for the sampler that wrote tokens and pos.
__device__ inline void encode_pack(floatX* out, const floatX* wte, const floatX* wpe, int b, int c, int tok, int p,
                                   int C) {
    embed_pack(out, wte, wpe, b, c, p < 0 ? 0 : tok, p < 0 ? 0 : p, C);
}

static __global__ void encoder_forward_at_packed(floatX* out, const int* tokens, const int* pos, const floatX* wte,
                                                 const floatX* wpe, int B, int C) {
    pdl_wait();
    pdl_launch_dependents();
    const int packs_per_row = C / x128::size;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * packs_per_row) {
        const int b = idx / packs_per_row, c = (idx % packs_per_row) * x128::size;
        const int p = pos[b];
        encode_pack(out, wte, wpe, b, c, p < 0 ? 0 : tokens[b], p, C);
    }
}

// Returns the blocks of its grid.
inline int encoder_forward_at(floatX* out, const int* tokens, const int* pos, const floatX* wte, const floatX* wpe,
                              int B, int C, cudaStream_t stream, bool pdl = false) {
    if (C % x128::size != 0) fail("encoder_forward_at: C = %d is not a multiple of %d", C, x128::size);
    const int block = 256, blocks = ceil_div(B * (C / x128::size), block);
    launch_kernel(encoder_forward_at_packed, dim3(blocks), dim3(block), 0, stream, pdl, out, tokens, pos, wte, wpe, B,
                  C);
    cudaCheckLaunch();
    return blocks;
}

// dwpe: one thread per (t, pack); it walks the B rows of column t in order. Reads B*T*C, read-modify-
// writes T*C: memory-bound and tiny next to the matmuls.
// With doc_start (positions restart), thread (p, pack) walks each row's documents in order and adds the
// token at position p of each one long enough: from t = p, a token at position p is added and the walk
// jumps to the next document's start + p (doc_query_end), one short of p jumps to its own document's
// start + p. O(documents) a row; the order is fixed, so the sum is deterministic.
static __global__ void encoder_backward_wpe(floatX* dwpe, const floatX* dout, const int* doc_start, int B, int T,
                                            int C) {
    const int packs_per_row = C / x128::size;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * packs_per_row) return;
    const int t = idx / packs_per_row, c = (idx % packs_per_row) * x128::size;
    float acc[x128::size] = {};
    for (int b = 0; b < B; b++) {
        if (doc_start == nullptr) {
            const x128 d = load128(dout + ((int64_t)b * T + t) * C + c);
            for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[k]);
            continue;
        }
        const int* row_start = doc_start + (int64_t)b * T;
        for (int u = t; u < T;) {
            const int start = row_start[u];
            if (u - start < t) {  // this document is shorter than t + 1: its own position t comes later
                u = start + t;
                continue;
            }
            const x128 d = load128(dout + ((int64_t)b * T + u) * C + c);
            for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[k]);
            u = attention_detail::doc_query_end(row_start, u, T) + t;  // the next document's position t
        }
    }
    floatX* dst = dwpe + (int64_t)t * C + c;
    x128 g = load128(dst);
    for (int k = 0; k < x128::size; k++) g[k] = from_float<floatX>(to_float(g[k]) + acc[k]);
    store128(dst, g);
}

// dwte: one block per distinct token of the batch, one thread per pack of C; each thread sums the
// bucket's rows in position order in fp32 and adds once into dwte. Reads N*C, writes (distinct
// tokens)*C. A frequent token (end-of-text) makes one long block; ~10^4 others keep the SMs busy.
// The bucket count is read on the device (blocks past it exit), so a captured CUDA graph replays the
// launch for any batch (encoder_backward).
static __global__ void encoder_backward_wte_buckets(floatX* dwte, const floatX* dout, const int* bucket_token,
                                                    const int* bucket_start, const int* positions,
                                                    const int* num_buckets, int C) {
    const int bucket = blockIdx.x;
    if (bucket >= *num_buckets) return;
    const int tok = bucket_token[bucket], begin = bucket_start[bucket], end = bucket_start[bucket + 1];
    for (int c = threadIdx.x * x128::size; c < C; c += blockDim.x * x128::size) {
        float acc[x128::size] = {};
        for (int i = begin; i < end; i++) {
            const x128 d = load128(dout + (int64_t)positions[i] * C + c);
            for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[k]);
        }
        floatX* dst = dwte + (int64_t)tok * C + c;
        x128 g = load128(dst);
        for (int k = 0; k < x128::size; k++) g[k] = from_float<floatX>(to_float(g[k]) + acc[k]);
        store128(dst, g);
    }
}

// The host side of the dwte backward: the token buckets of the current batch, built from the host
// copy of the inputs while the GPU runs the forward pass, uploaded through pinned memory.
// Layout (layout_ints() ints, host and device): [bucket_token (N) | bucket_start (N+1) | positions (N) | count (1)].
struct EncoderBuckets {
    int N = 0, V = 0, num_buckets = 0;
    int* host = nullptr;          // pinned, the layout above
    int* device = nullptr;        // same layout on the GPU
    std::vector<int> count;       // (V) scratch for the counting sort
    cudaEvent_t uploaded = nullptr;

    size_t layout_ints() const { return 3 * (size_t)N + 2; }
    void init(int max_N, int vocab) {
        N = max_N; V = vocab;
        cudaCheck(cudaMallocHost(&host, sizeof(int) * layout_ints()));
        cudaCheck(cudaMalloc(&device, sizeof(int) * layout_ints()));
        cudaCheck(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
        count.assign(V, 0);
    }
    void destroy() {
        if (host) cudaCheck(cudaFreeHost(host));
        if (device) cudaCheck(cudaFree(device));
        if (uploaded) cudaCheck(cudaEventDestroy(uploaded));
        host = nullptr; device = nullptr; uploaded = nullptr;
    }
    // Counting sort of the n positions by token id into `dst` (the layout above); stable, so each
    // bucket lists positions in order. Returns the number of buckets (also stored in the layout).
    int fill(int* dst, const int* tokens, int n) {
        if (n > N) fail("EncoderBuckets: %d positions exceed the %d it was sized for", n, N);
        int* bucket_token = dst;
        int* bucket_start = dst + N;
        int* positions = dst + 2 * N + 1;
        for (int i = 0; i < n; i++) count[tokens[i]]++;
        int buckets = 0, offset = 0;
        for (int v = 0; v < V; v++) {
            if (!count[v]) continue;
            bucket_token[buckets] = v;
            bucket_start[buckets] = offset;
            buckets++;
            offset += count[v];
            count[v] = offset - count[v];  // becomes the write cursor of bucket v
        }
        bucket_start[buckets] = offset;
        for (int i = 0; i < n; i++) positions[count[tokens[i]]++] = i;
        for (int i = 0; i < n; i++) count[tokens[i]] = 0;
        dst[3 * N + 1] = buckets;
        return buckets;
    }
    // fill into the pinned buffer, then the upload, enqueued on `stream`.
    void build(const int* tokens, int n, cudaStream_t stream) {
        cudaCheck(cudaEventSynchronize(uploaded));  // the previous upload has left the pinned buffer
        num_buckets = fill(host, tokens, n);
        cudaCheck(cudaMemcpyAsync(device, host, sizeof(int) * layout_ints(), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaEventRecord(uploaded, stream));
    }
};

// `buckets` must have been built from the same inputs (EncoderBuckets::build) on this stream.
// doc_start (B, T) device or nullptr: dwpe by the restarted positions, as encoder_forward.
inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const EncoderBuckets& buckets, int B,
                             int T, int C, cudaStream_t stream, const int* doc_start = nullptr) {
    const int block = 256;
    if (dwpe) {
        encoder_backward_wpe<<<ceil_div(T * (C / x128::size), block), block, 0, stream>>>(dwpe, dout, doc_start,
                                                                                              B, T, C);
        cudaCheckLaunch();
    }
    // Captured into a CUDA graph, the launch must fit any later batch: one block per possible bucket
    // (min(N, V)); the blocks past the batch's count exit at once. Launched directly: exactly this
    // batch's buckets.
    cudaStreamCaptureStatus capture;
    cudaCheck(cudaStreamIsCapturing(stream, &capture));
    const int grid = capture == cudaStreamCaptureStatusNone ? buckets.num_buckets : std::min(buckets.N, buckets.V);
    if (grid == 0) return;
    const int N = buckets.N;
    const int threads = std::min(1024, ceil_div(C / x128::size, WARP_SIZE) * WARP_SIZE);
    encoder_backward_wte_buckets<<<grid, threads, 0, stream>>>(dwte, dout, buckets.device, buckets.device + N,
                                                               buckets.device + 2 * N + 1, buckets.device + 3 * N + 1, C);
    cudaCheckLaunch();
}
