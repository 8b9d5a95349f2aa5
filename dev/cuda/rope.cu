// rope.cu: rotary position embeddings (llmc/rope.cuh), forward and backward in place on the fused
// QKV activation, against cpu::rope_forward / cpu::rope_backward (llmc/cpu/rope.h), with the tables
// of cpu::rope_tables (theta 10000) uploaded as the shipped launcher expects them.
//   ./rope [variant ...] [--check-only] [--reps N]
// Shapes: the 124M Llama-style model (B=64 T=1024, 12 query / 4 KV heads of 64), a Llama-3-8B-like
// attention (B=4 T=4096, 32 / 8 heads of 128), and the awkward B=3 T=217, 6 / 2 heads of 48 at
// position offset 37 (a KV cache's continuation). The whole qkv buffer is compared, so the V heads
// are checked untouched; the guard region after it is checked too.
// Bytes counted: the Q and K heads read and written once, B*T*(NH+NKV)*HD each way, plus one read of
// the T rows of the tables. FLOPs: 3 per rotated element.
// Standalone, this pass is memory-bound; fusing it into the QKV matmul's epilogue or the attention
// kernels' Q/K loads removes its traffic (the issue's preferred place, once the GPU model exists).
//
// Variants (measured on the H200 at commit 5abe2b8: docs/perf.md, "Llama-family kernels"):
//   forward   0 shipped: rope_rotate_packed, thread = a pack and its partner pack, 16-byte loads
//   forward   1 scalar: thread = one channel pair (i, i + HD/2), 2-byte loads (baseline)
//   forward   2 table in registers: thread = one pack index of a row, looping over its Q and K
//             heads, so cos/sin are loaded once a row instead of once a head
//   backward  0 shipped: the same kernel turning by -angle
//   forward_at 0 shipped: the same kernel with one position per row read on the device (a decode
//             step's rows at random positions, every 5th row idle at -1 and checked untouched),
//             against cpu::rope_forward row by row at pos_offset = pos[b]
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/rope.h"
#include "llmc/rope.cuh"

constexpr float THETA = 10000.0f;

// Variant 1: one thread per channel pair.
static __global__ void rope_forward_scalar(floatX* qkv, const float* cos, const float* sin, int BT, int T, int NH,
                                           int NKV, int HD, int pos_offset) {
    const int half = HD / 2, heads = NH + NKV;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)BT * heads * half) return;
    const int i = (int)(idx % half), h = (int)(idx / half % heads);
    const int64_t row = idx / half / heads;
    const int pos = pos_offset + (int)(row % T);
    floatX* x = qkv + row * (NH + 2 * NKV) * HD + h * HD;
    const float a = to_float(x[i]), b = to_float(x[i + half]);
    const float c = cos[(int64_t)pos * half + i], s = sin[(int64_t)pos * half + i];
    x[i] = from_float<floatX>(a * c - b * s);
    x[i + half] = from_float<floatX>(b * c + a * s);
}

// Variant 2: thread = (row, pack index j of the half head); cos/sin of (pos, j) held in registers
// while the thread walks the row's NH + NKV heads. A warp covers 32 pack indices: several rows when
// HD/2 / x128::size < 32, so its accesses per head are as many runs of HD/2 * sizeof(floatX) bytes.
static __global__ void rope_forward_table_registers(floatX* qkv, const float* cos, const float* sin, int BT, int T,
                                                    int NH, int NKV, int HD, int pos_offset) {
    const int half = HD / 2, packs_per_head = half / x128::size;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= BT * packs_per_head) return;
    const int j = idx % packs_per_head * x128::size, row = idx / packs_per_head;
    const int pos = pos_offset + row % T;
    float c[x128::size], s[x128::size];
    for (int k0 = 0; k0 < x128::size; k0 += f128::size) {
        const f128 ck = load128(cos + (int64_t)pos * half + j + k0), sk = load128(sin + (int64_t)pos * half + j + k0);
        for (int k = 0; k < f128::size; k++) { c[k0 + k] = ck[k]; s[k0 + k] = sk[k]; }
    }
    floatX* x = qkv + (int64_t)row * (NH + 2 * NKV) * HD + j;
    for (int h = 0; h < NH + NKV; h++, x += HD) {
        const x128 x1 = load128cs(x), x2 = load128cs(x + half);
        x128 y1, y2;
        for (int k = 0; k < x128::size; k++) {
            const float a = to_float(x1[k]), b = to_float(x2[k]);
            y1[k] = from_float<floatX>(a * c[k] - b * s[k]);
            y2[k] = from_float<floatX>(b * c[k] + a * s[k]);
        }
        store128(x, y1);
        store128(x + half, y2);
    }
}

static void run_shape(lab::Lab& L, int B, int T, int NH, int NKV, int HD, int pos_offset) {
    const std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                              " NKV=" + std::to_string(NKV) + " HD=" + std::to_string(HD) +
                              (pos_offset ? " pos+" + std::to_string(pos_offset) : "");
    const int max_pos = pos_offset + T, half = HD / 2, BT = B * T;
    const size_t n = (size_t)BT * (NH + 2 * NKV) * HD;  // qkv elements
    std::vector<float> cos((size_t)max_pos * half), sin((size_t)max_pos * half);
    cpu::rope_tables(cos.data(), sin.data(), max_pos, HD, THETA);
    std::vector<float> qkv = lab::rand_uniform(n, 51, -2.0f, 2.0f);   // (B, T, (NH + 2 NKV) HD)
    std::vector<float> dqkv = lab::rand_uniform(n, 52);               // (B, T, (NH + 2 NKV) HD)
    std::vector<float> ref_fwd = qkv, ref_bwd = dqkv;
    cpu::rope_forward(ref_fwd.data(), cos.data(), sin.data(), B, T, NH, NKV, HD, pos_offset);
    cpu::rope_backward(ref_bwd.data(), cos.data(), sin.data(), B, T, NH, NKV, HD, pos_offset);

    lab::DevBuf<float> d_cos(cos.size(), "cos"), d_sin(sin.size(), "sin");
    lab::DevBuf<floatX> d_qkv(n, "qkv");
    d_cos.upload(cos);
    d_sin.upload(sin);
    const size_t rotated = (size_t)BT * (NH + NKV) * HD;
    const double bytes = 2.0 * rotated * sizeof(floatX) + 2.0 * T * half * sizeof(float), flops = 3.0 * rotated;
    auto reset_fwd = [&] { d_qkv.upload(qkv); };
    auto check_fwd = [&] { return L.check(d_qkv, ref_fwd); };
    const int block = 256;
    L.run("rope_forward" + shape, 0, "shipped", bytes, flops, lab::Bound::Memory, reset_fwd,
          [&] { rope_forward(d_qkv, d_cos, d_sin, B, T, NH, NKV, HD, pos_offset, L.stream()); }, check_fwd);
    L.run("rope_forward" + shape, 1, "scalar", bytes, flops, lab::Bound::Memory, reset_fwd, [&] {
        const int64_t threads = (int64_t)BT * (NH + NKV) * half;
        rope_forward_scalar<<<(unsigned)ceil_div<int64_t>(threads, block), block, 0, L.stream()>>>(
            d_qkv, d_cos, d_sin, BT, T, NH, NKV, HD, pos_offset);
    }, check_fwd);
    L.run("rope_forward" + shape, 2, "table in registers", bytes, flops, lab::Bound::Memory, reset_fwd, [&] {
        const int threads = BT * (half / x128::size);
        rope_forward_table_registers<<<ceil_div(threads, block), block, 0, L.stream()>>>(d_qkv, d_cos, d_sin, BT, T, NH,
                                                                                       NKV, HD, pos_offset);
    }, check_fwd);

    L.run("rope_backward" + shape, 0, "shipped", bytes, flops, lab::Bound::Memory, [&] { d_qkv.upload(dqkv); },
          [&] { rope_backward(d_qkv, d_cos, d_sin, B, T, NH, NKV, HD, pos_offset, L.stream()); },
          [&] { return L.check(d_qkv, ref_bwd); });
}

// A decode step: B rows, row b at position pos[b] in [0, max_pos), or -1 (idle: left as it is).
static void run_at(lab::Lab& L, int B, int NH, int NKV, int HD, int max_pos) {
    const std::string shape = " B=" + std::to_string(B) + " NH=" + std::to_string(NH) + " NKV=" +
                              std::to_string(NKV) + " HD=" + std::to_string(HD) + " max_pos=" + std::to_string(max_pos);
    const int half = HD / 2, row = (NH + 2 * NKV) * HD;
    const size_t n = (size_t)B * row;
    std::vector<float> cos((size_t)max_pos * half), sin((size_t)max_pos * half);
    cpu::rope_tables(cos.data(), sin.data(), max_pos, HD, THETA);
    const std::vector<float> qkv = lab::rand_uniform(n, 61, -2.0f, 2.0f), u = lab::rand_uniform(B, 62, 0.0f, 1.0f);
    std::vector<int> pos(B);
    for (int b = 0; b < B; b++) pos[b] = b % 5 == 4 ? -1 : std::min(max_pos - 1, (int)(u[b] * max_pos));
    std::vector<float> ref = qkv;
    for (int b = 0; b < B; b++)
        if (pos[b] >= 0) cpu::rope_forward(ref.data() + (size_t)b * row, cos.data(), sin.data(), 1, 1, NH, NKV, HD, pos[b]);
    lab::DevBuf<float> d_cos(cos.size(), "cos"), d_sin(sin.size(), "sin");
    lab::DevBuf<floatX> d_qkv(n, "qkv");
    lab::DevBuf<int> d_pos(B, "pos");
    d_cos.upload(cos);
    d_sin.upload(sin);
    cudaCheck(cudaMemcpy(d_pos.get(), pos.data(), sizeof(int) * B, cudaMemcpyHostToDevice));
    const size_t rotated = (size_t)B * (NH + NKV) * HD;
    const double bytes = 2.0 * rotated * sizeof(floatX) + 2.0 * B * half * sizeof(float), flops = 3.0 * rotated;
    L.run("rope_forward_at" + shape, 0, "shipped", bytes, flops, lab::Bound::Memory, [&] { d_qkv.upload(qkv); },
          [&] { rope_forward_at(d_qkv, d_cos, d_sin, d_pos, B, NH, NKV, HD, L.stream()); },
          [&] { return L.check(d_qkv, ref); });
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "rope.cu");
    run_at(L, 64, 12, 4, 64, 1024);
    run_at(L, 3, 6, 2, 48, 300);
    run_shape(L, lab::GPT2_B, lab::GPT2_T, 12, 4, 64, 0);
    run_shape(L, 4, 4096, 32, 8, 128, 0);
    run_shape(L, lab::ODD_B, lab::ODD_T, 6, 2, 48, 37);
    return L.finish();
}
