// cudnn_attention.cuh: the same two functions as llmc/attention.cuh, through cuDNN's fused attention
// (the cudnn_frontend graph API): the kernel lab's comparison, built only by make -C dev/cuda USE_CUDNN=1
// (bf16 only); the product never links cuDNN.
// Shapes and conventions are attention.cuh's: qkv (B, T, (NH + 2*NKV) * HD), out (B, T, NH*HD),
// lse (B, NH, T) fp32 natural-log softmax statistics (cuDNN's "Stats" are exactly this, so a forward
// from either implementation feeds a backward from the other), dqkv written with `=`. Causal, scale
// 1/sqrt(HD), optional sliding window W (cuDNN's left diagonal bound: query t sees keys t-W+1..t).
// cuDNN reads Q, K and V in place through strides: no transposes, no copies.
// Document masking (AttnShape::doc_start) has no cuDNN mask; a row of documents is the same
// computation as each document its own causal sequence, so the *_docs functions run the batch's
// documents as one packed ("THD", ragged) batch of sequences (CudnnDocs): ragged offsets into qkv /
// out / dqkv (elements), a padding mask with seq_len_q = seq_len_kv = each document's length. Their
// stats are cuDNN's padded (n, NH, max_len) fp32 (non-ragged stats must be packed BHSD before cuDNN
// 9.12); CudnnDocs::scatter_stats / gather_stats move them to and from the lab's lse (B, NH, T).
//
// The headers come from the nvidia-cudnn-frontend wheel (its include/ folder, e.g. unpacked into
// build/cudnn_frontend/include, dev/cuda/Makefile's default CUDNN_FRONTEND_PATH); the library is libcudnn 9.
//
// One graph per (direction, shape) is built on first use and cached for the process, with its
// workspace; the cuDNN handle is created once. This is the one place in the GPU code with
// process-wide state: CudaContext (llmc/cuda_common.cuh) is shared by every program and knows no
// cuDNN, so the handle and the plans live here.
#pragma once
#if !defined(USE_CUDNN)
#error "dev/cuda/cudnn_attention.cuh needs USE_CUDNN=1 (make -C dev/cuda USE_CUDNN=1)"
#endif
#if defined(PRECISION_FP32)
#error "cuDNN's fused attention takes bf16: build with PRECISION=BF16 when USE_CUDNN=1"
#endif
#include <cudnn_frontend.h>
#include <cmath>
#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

namespace cudnn_attention_detail {
namespace fe = cudnn_frontend;

inline void cudnn_check_impl(cudnnStatus_t st, const char* stmt, const char* file, int line) {
    if (st != CUDNN_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuDNN: %s\n  in %s at %s:%d\n", cudnnGetErrorString(st), stmt, file, line);
        exit(1);
    }
}
inline void fe_check_impl(fe::error_object e, const char* stmt, const char* file, int line) {
    if (e.is_bad()) {
        fprintf(stderr, "error: cuDNN frontend: %s\n  in %s at %s:%d\n", e.get_message().c_str(), stmt, file, line);
        exit(1);
    }
}
#define cudnnCheck(stmt) cudnn_attention_detail::cudnn_check_impl((stmt), #stmt, __FILE__, __LINE__)
#define cudnnFeCheck(stmt) cudnn_attention_detail::fe_check_impl((stmt), #stmt, __FILE__, __LINE__)

// Tensor ids in the variant pack.
enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID, SEQ_LEN_UID, QKV_OFF_UID,
                 O_OFF_UID };

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN cannot run this shape (see error)
    void* workspace = nullptr;
    std::string error;
};

inline cudnnHandle_t handle() {
    static cudnnHandle_t h = [] {
        cudnnHandle_t x;
        cudnnCheck(cudnnCreate(&x));
        return x;
    }();
    return h;
}

// The documents of a document-masked batch as cuDNN sequences: document i is tokens first[i] ..
// first[i] + len[i] - 1 of the (B * T) token stream (a row's documents, rows in order). Device: len
// (n), then the ragged offsets of qkv/dqkv (token * row) and of out/dout (token * NH * HD), n + 1 each.
struct CudnnDocs {
    int n = 0, max_len = 0;
    std::vector<int> first, len;
    int* dev = nullptr;
    CudnnDocs(const std::vector<int>& doc_start, const AttnShape& s) {
        for (int b = 0; b < s.B; b++)
            for (int t = 0; t < s.T; t++)
                if (t == 0 || doc_start[(size_t)b * s.T + t] != doc_start[(size_t)b * s.T + t - 1]) {
                    first.push_back(b * s.T + t);
                    len.push_back(0);
                }
        for (size_t i = 0; i < first.size(); i++) {
            len[i] = (i + 1 < first.size() ? first[i + 1] : s.B * s.T) - first[i];
            max_len = std::max(max_len, len[i]);
        }
        n = (int)first.size();
        const int64_t row = (int64_t)(s.NH + 2 * s.NKV) * s.HD, C = (int64_t)s.NH * s.HD;
        if ((int64_t)s.B * s.T * row >= INT32_MAX) fail("cuDNN documents: qkv offsets exceed int32");
        std::vector<int> h(len);
        for (int64_t unit : {row, C}) {
            for (int i = 0; i < n; i++) h.push_back((int)(first[i] * unit));
            h.push_back((int)((int64_t)s.B * s.T * unit));
        }
        cudaCheck(cudaMalloc(&dev, h.size() * sizeof(int)));
        cudaCheck(cudaMemcpy(dev, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    CudnnDocs(const CudnnDocs&) = delete;
    ~CudnnDocs() { cudaFree(dev); }
    int* seq_len() const { return dev; }
    int* qkv_offsets() const { return dev + n; }
    int* out_offsets() const { return dev + 2 * n + 1; }
    size_t stats_size(const AttnShape& s) const { return (size_t)n * s.NH * max_len; }
    // lse (B, NH, T) from cuDNN's stats (n, NH, max_len), and back; host vectors.
    void gather_stats(std::vector<float>& lse, const std::vector<float>& stats, const AttnShape& s) const {
        for_each_stat(s, [&](size_t l, size_t st) { lse[l] = stats[st]; });
    }
    void scatter_stats(std::vector<float>& stats, const std::vector<float>& lse, const AttnShape& s) const {
        for_each_stat(s, [&](size_t l, size_t st) { stats[st] = lse[l]; });
    }

  private:
    template <class F>
    void for_each_stat(const AttnShape& s, F&& f) const {
        for (int i = 0; i < n; i++)
            for (int h = 0; h < s.NH; h++)
                for (int t = 0; t < len[i]; t++) {
                    const int b = first[i] / s.T, pos = first[i] % s.T + t;
                    f(((size_t)b * s.NH + h) * s.T + pos, ((size_t)i * s.NH + h) * max_len + t);
                }
    }
};

// H heads of HD channels inside the (B, T, row) tensor, seen as cuDNN's (B, H, T, HD); the pointer
// passed at execution points at the first head. With docs: (n, H, max_len, HD), each sequence at its
// ragged offset (`offsets`, elements).
inline std::shared_ptr<fe::graph::Tensor_attributes> heads(fe::graph::Graph& g, const char* name, int64_t uid, int B,
                                                           int H, int T, int HD, int64_t row,
                                                           const std::shared_ptr<fe::graph::Tensor_attributes>& offsets = nullptr) {
    auto t = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({B, H, T, HD}).set_stride(
        {(int64_t)T * row, HD, row, 1});
    if (offsets) t.set_ragged_offset(offsets);
    return g.tensor(t);
}
inline void as_heads(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int B, int H, int T, int HD,
                     int64_t row, const std::shared_ptr<fe::graph::Tensor_attributes>& offsets = nullptr) {
    t->set_output(true).set_uid(uid).set_dim({B, H, T, HD}).set_stride({(int64_t)T * row, HD, row, 1});
    if (offsets) t->set_ragged_offset(offsets);
}
inline std::shared_ptr<fe::graph::Tensor_attributes> int_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                                int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_data_type(fe::DataType_t::INT32)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1}));
}

// The cached plan for a shape (with docs: for its count and longest document), built on first use. A
// shape cuDNN rejects gets a plan with no graph and the frontend's message, so a caller can ask first
// (cudnn_attention_supported) instead of exiting.
inline Plan& plan_for(bool backward, const AttnShape& s, const CudnnDocs* docs = nullptr) {
    const int NH = s.NH, NKV = s.NKV, HD = s.HD, window = s.window;
    const int B = docs ? docs->n : s.B, T = docs ? docs->max_len : s.T;  // cuDNN's batch and sequence length
    static std::map<std::tuple<bool, int, int, int, int, int, int, bool>, Plan> cache;
    const auto key = std::make_tuple(backward, B, T, NH, NKV, HD, window, docs != nullptr);
    if (auto it = cache.find(key); it != cache.end()) return it->second;

    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t row = (int64_t)(NH + 2 * NKV) * HD, C = (int64_t)NH * HD;
    const float scale = 1.0f / sqrtf((float)HD);
    std::shared_ptr<fe::graph::Tensor_attributes> seq_len, qkv_off, o_off;
    if (docs) {
        seq_len = int_tensor(*g, "seq_len", SEQ_LEN_UID, B);
        qkv_off = int_tensor(*g, "qkv_offsets", QKV_OFF_UID, B + 1);
        o_off = int_tensor(*g, "out_offsets", O_OFF_UID, B + 1);
    }
    auto masks = [&](auto& opts) {
        opts.set_attn_scale(scale).set_causal_mask(true);
        if (window > 0) opts.set_diagonal_band_left_bound(window);
        if (docs) opts.set_padding_mask(true).set_seq_len_q(seq_len).set_seq_len_kv(seq_len);
    };
    auto Q = heads(*g, "Q", Q_UID, B, NH, T, HD, row, qkv_off);
    auto K = heads(*g, "K", K_UID, B, NKV, T, HD, row, qkv_off);
    auto V = heads(*g, "V", V_UID, B, NKV, T, HD, row, qkv_off);
    const std::vector<int64_t> lse_dim = {B, NH, T, 1}, lse_stride = {(int64_t)NH * T, T, 1, 1};  // (B, NH, T)
    if (!backward) {
        auto opts = fe::graph::SDPA_attributes().set_name("attention_forward").set_generate_stats(true);
        masks(opts);
        auto [O, stats] = g->sdpa(Q, K, V, opts);
        as_heads(O, O_UID, B, NH, T, HD, C, o_off);
        stats->set_output(true).set_uid(STATS_UID).set_data_type(fe::DataType_t::FLOAT).set_dim(lse_dim).set_stride(
            lse_stride);
    } else {
        auto O = heads(*g, "O", O_UID, B, NH, T, HD, C, o_off);
        auto dO = heads(*g, "dO", DO_UID, B, NH, T, HD, C, o_off);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(STATS_UID)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim(lse_dim)
                                   .set_stride(lse_stride));
        auto opts = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
        masks(opts);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
        as_heads(dQ, DQ_UID, B, NH, T, HD, row, qkv_off);
        as_heads(dK, DK_UID, B, NKV, T, HD, row, qkv_off);
        as_heads(dV, DV_UID, B, NKV, T, HD, row, qkv_off);
    }
    Plan p;
    fe::error_object e = g->validate();
    if (e.is_good()) e = g->build_operation_graph(handle());
    if (e.is_good()) e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_good()) e = g->check_support(handle());
    if (e.is_good()) e = g->build_plans(handle());
    int64_t ws = 0;
    if (e.is_good()) e = g->get_workspace_size(ws);
    if (e.is_good()) {
        p.graph = g;
        if (ws > 0) cudaCheck(cudaMalloc(&p.workspace, ws));
    } else {
        p.error = e.get_message();
    }
    return cache.emplace(key, p).first->second;
}

inline void execute(Plan& p, const char* what, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
    if (!p.graph) fail("%s: cuDNN cannot run this shape: %s", what, p.error.c_str());
    cudnnCheck(cudnnSetStream(handle(), stream));
    cudnnFeCheck(p.graph->execute(handle(), pack, p.workspace));
}

// The variant pack's entries for the three head groups of a (B, T, (NH + 2*NKV) * HD) tensor (qkv or
// dqkv): pointers to its first query, key and value head, read or written through the graph's strides.
inline void add_heads(std::unordered_map<int64_t, void*>& pack, const floatX* t, const AttnShape& s, int64_t q_uid,
                      int64_t k_uid, int64_t v_uid) {
    floatX* base = const_cast<floatX*>(t);
    pack[q_uid] = base;
    pack[k_uid] = base + (size_t)s.NH * s.HD;
    pack[v_uid] = base + (size_t)(s.NH + s.NKV) * s.HD;
}

// The sizes cuDNN's SDPA takes (any HD a multiple of 8); a bad one is a caller bug.
inline void check_sizes(const char* what, const AttnShape& s) {
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.NH % s.NKV != 0 || s.HD <= 0 || s.HD % 8 != 0 ||
        s.window < 0)
        fail("%s: bad sizes B=%d T=%d NH=%d NKV=%d HD=%d window=%d", what, s.B, s.T, s.NH, s.NKV, s.HD, s.window);
}
}  // namespace cudnn_attention_detail
using cudnn_attention_detail::CudnnDocs;

// Whether cuDNN runs this shape (builds and caches the plan); prints cuDNN's reason when it does not.
inline bool cudnn_attention_supported(bool backward, const AttnShape& s) {
    auto& p = cudnn_attention_detail::plan_for(backward, s);
    if (!p.graph) fprintf(stderr, "cuDNN attention %s does not run B=%d T=%d NH=%d NKV=%d HD=%d window=%d: %s\n",
                         backward ? "backward" : "forward", s.B, s.T, s.NH, s.NKV, s.HD, s.window, p.error.c_str());
    return p.graph != nullptr;
}

inline void cudnn_attention_forward(floatX* out, float* lse, const floatX* qkv, const AttnShape& s,
                                    const CudaContext& ctx) {
    using namespace cudnn_attention_detail;
    check_sizes("cudnn_attention_forward", s);
    std::unordered_map<int64_t, void*> pack = {{O_UID, out}, {STATS_UID, lse}};
    add_heads(pack, qkv, s, Q_UID, K_UID, V_UID);
    execute(plan_for(false, s), "cudnn_attention_forward", pack, ctx.stream);
}

inline void cudnn_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, const AttnShape& s, const CudaContext& ctx) {
    using namespace cudnn_attention_detail;
    check_sizes("cudnn_attention_backward", s);
    std::unordered_map<int64_t, void*> pack = {{O_UID, const_cast<floatX*>(out)},
                                               {DO_UID, const_cast<floatX*>(dout)},
                                               {STATS_UID, const_cast<float*>(lse)}};
    add_heads(pack, qkv, s, Q_UID, K_UID, V_UID);
    add_heads(pack, dqkv, s, DQ_UID, DK_UID, DV_UID);
    execute(plan_for(true, s), "cudnn_attention_backward", pack, ctx.stream);
}

// Document masking through cuDNN (the header says how): the same calls on the batch's documents as
// packed sequences. stats: docs.stats_size(s) floats, cuDNN's padded layout (written by the forward,
// read by the backward). s.doc_start is not read: docs carries the documents.
inline bool cudnn_attention_docs_supported(bool backward, const AttnShape& s, const CudnnDocs& docs) {
    auto& p = cudnn_attention_detail::plan_for(backward, s, &docs);
    if (!p.graph) fprintf(stderr, "cuDNN attention %s does not run %d documents (longest %d) of B=%d T=%d: %s\n",
                         backward ? "backward" : "forward", docs.n, docs.max_len, s.B, s.T, p.error.c_str());
    return p.graph != nullptr;
}

inline void cudnn_attention_forward_docs(floatX* out, float* stats, const floatX* qkv, const AttnShape& s,
                                         const CudnnDocs& docs, const CudaContext& ctx) {
    using namespace cudnn_attention_detail;
    check_sizes("cudnn_attention_forward_docs", s);
    std::unordered_map<int64_t, void*> pack = {{O_UID, out}, {STATS_UID, stats}, {SEQ_LEN_UID, docs.seq_len()},
                                               {QKV_OFF_UID, docs.qkv_offsets()}, {O_OFF_UID, docs.out_offsets()}};
    add_heads(pack, qkv, s, Q_UID, K_UID, V_UID);
    execute(plan_for(false, s, &docs), "cudnn_attention_forward_docs", pack, ctx.stream);
}

inline void cudnn_attention_backward_docs(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                          const float* stats, const AttnShape& s, const CudnnDocs& docs,
                                          const CudaContext& ctx) {
    using namespace cudnn_attention_detail;
    check_sizes("cudnn_attention_backward_docs", s);
    std::unordered_map<int64_t, void*> pack = {{O_UID, const_cast<floatX*>(out)},
                                               {DO_UID, const_cast<floatX*>(dout)},
                                               {STATS_UID, const_cast<float*>(stats)},
                                               {SEQ_LEN_UID, docs.seq_len()},
                                               {QKV_OFF_UID, docs.qkv_offsets()},
                                               {O_OFF_UID, docs.out_offsets()}};
    add_heads(pack, qkv, s, Q_UID, K_UID, V_UID);
    add_heads(pack, dqkv, s, DQ_UID, DK_UID, DV_UID);
    execute(plan_for(true, s, &docs), "cudnn_attention_backward_docs", pack, ctx.stream);
}
