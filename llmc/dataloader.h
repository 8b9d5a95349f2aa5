// dataloader.h: feeds token shards (docs/formats.md, GPTD) to the trainers, and the HellaSwag eval
// file (GPTE) to the evaluation. C++17, no CUDA; the CPU and GPU trainers share it.
//
// DataLoader: the shards matching a glob(3) pattern (sorted by name) are cut into windows of
// B*T+1 tokens that overlap by one token: window w of a shard is tokens [w*B*T, w*B*T + B*T], its
// first B*T tokens are the inputs (B, T) and the last B*T the targets, and mask (B, T) is the
// shard's loss mask of the targets (mask[b, t] = 1: the loss at (b, t) counts; version-3 shards hold
// it, one value per token, token i's value masking token i as a target), all ones for shards
// without one. A pattern's shards all have a mask or none has. An epoch visits the
// shards in a seeded random order and each shard's windows in a seeded random order (both in
// file order when shuffle is off). Laid end to end, those windows form the epoch's list; rank r
// takes entries r, r + world_size, r + 2*world_size, ..., so ranks never share a window, stay in
// lockstep (each takes num_windows() = total / world_size per epoch) and at most world_size - 1
// windows of an epoch go unused. The position is (epoch, batches taken); every order is a pure
// function of (seed, epoch, shard), so save_state/load_state resume with exactly the next batch.
//
// Shards are memory-mapped one at a time (fineweb shards are 200 MB). At construction every shard's
// header, length, token ids (< vocab_size) and mask values (0 or 1) are checked, so a bad id in any
// shard stops the run before its first step: one sequential read of the data (a vectorized max over
// the ids), paid once per start. A shard holds uint16 or uint32 ids (its header says which; widths
// may be mixed); they become int as a batch is copied out. Every shard of a pattern must record the
// same vocab_size (one tokenizer); check_data_vocab checks it against the model's.
#pragma once
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "llmc/formats.h"
#include "llmc/rand.h"
#include "llmc/utils.h"

// A read-only memory map of a whole file; unmapped on destruction or when re-pointed.
class MappedFile {
  public:
    MappedFile() = default;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile() { unmap(); }
    void map(const char* path, int64_t size) {
        unmap();
        int fd = open(path, O_RDONLY);
        if (fd < 0) fail("%s: cannot open (%s)", path, strerror(errno));
        void* p = mmap(nullptr, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd);
        if (p == MAP_FAILED) fail("%s: cannot memory-map %lld bytes (%s)", path, (long long)size, strerror(e));
        data_ = (const unsigned char*)p;
        size_ = size;
    }
    void unmap() {
        if (data_) munmap((void*)data_, (size_t)size_);
        data_ = nullptr;
    }
    const unsigned char* data() const { return data_; }

  private:
    const unsigned char* data_ = nullptr;
    int64_t size_ = 0;
};

// Checks that tokens[0..n) (uint16_t or uint32_t) are all below `limit`; the error names the file
// and the offset of the bad id within the payload (`base` = offset of tokens[0]). The scan is a
// max (vectorized, no branch per id); the loop that finds the bad id runs only when there is one.
template <typename Id>
inline void check_token_ids(const Id* tokens, int64_t n, int64_t base, int64_t limit, const char* path,
                            const char* what) {
    Id most = 0;
    for (int64_t i = 0; i < n; i++) most = std::max(most, tokens[i]);
    if (n == 0 || (int64_t)most < limit) return;
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)tokens[i] >= limit)
            fail("%s: token id %llu at token offset %lld is >= vocab_size %lld (%s)", path,
                 (unsigned long long)tokens[i], (long long)(base + i), (long long)limit, what);
}

// dst[0..n) = the ids at src (uint16 or uint32 little-endian values, `width` bytes each) as int;
// the ids were checked against vocab_size (< 2^31) when the loader was built.
inline void copy_token_ids(int* dst, const unsigned char* src, int64_t n, int width) {
    if (width == 2) {
        const uint16_t* p = (const uint16_t*)src;
        for (int64_t j = 0; j < n; j++) dst[j] = p[j];
    } else {
        const uint32_t* p = (const uint32_t*)src;
        for (int64_t j = 0; j < n; j++) dst[j] = (int)p[j];
    }
}

// A shard of a tokenizer with more ids than the model has rows: refused (by its header) whatever its ids.
[[noreturn]] inline void fail_data_vocab_larger(const char* path, int64_t header_vocab, int model_vocab) {
    fail("%s: written by a tokenizer of vocab_size %lld (its header), larger than the model's vocab_size %d: tokenize "
         "the data with the model's tokenizer", path, (long long)header_vocab, model_vocab);
}

// The first shard matched by glob_pattern (in name order) whose header says it has a loss mask, or
// "" (none, or no match: the DataLoader reports that). Reads headers only, for a program that must
// decide before it starts a device whether it trains with a loss mask.
inline std::string first_masked_shard(const char* glob_pattern) {
    glob_t g;
    if (glob(glob_pattern, 0, nullptr, &g) != 0) return "";
    std::string found;
    for (size_t i = 0; i < g.gl_pathc && found.empty(); i++)
        if (shard_read_info(g.gl_pathv[i]).has_mask) found = g.gl_pathv[i];
    globfree(&g);
    return found;
}

class DataLoader {
  public:
    static constexpr int64_t STATE_VERSION = 1;

    DataLoader(const char* glob_pattern, int B, int T, int rank, int world_size, int vocab_size, uint64_t seed,
               bool shuffle)
        : B_(B), T_(T), rank_(rank), world_(world_size), seed_(seed), shuffle_(shuffle), pattern_(glob_pattern) {
        if (B < 1 || T < 1) fail("DataLoader: B = %d and T = %d must be positive", B, T);
        if (world_size < 1 || rank < 0 || rank >= world_size)
            fail("DataLoader: rank %d is not in [0, world_size = %d)", rank, world_size);
        if (vocab_size < 1) fail("DataLoader: vocab_size %d must be positive", vocab_size);
        glob_t g;
        int rc = glob(glob_pattern, 0, nullptr, &g);
        if (rc == GLOB_NOMATCH) fail("%s: no files match this pattern", glob_pattern);
        if (rc != 0) fail("%s: glob failed (code %d)", glob_pattern, rc);
        const std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + g.gl_pathc);
        globfree(&g);
        const int64_t BT = (int64_t)B * T;
        for (const std::string& path : paths) {
            const ShardInfo info = shard_read_info(path.c_str());
            Shard s{path, (info.num_tokens - 1) / BT, info};
            if (info.num_tokens < BT + 1)
                fail("%s: %lld tokens, fewer than one window of B*T+1 = %lld (B = %d, T = %d)", s.path.c_str(),
                     (long long)info.num_tokens, (long long)(BT + 1), B, T);
            if (!shards_.empty() && info.vocab_size != shards_[0].info.vocab_size)
                fail("%s: vocab_size %lld in its header, but %s (matched by the same pattern %s) has %lld: the shards "
                     "come from different tokenizers", s.path.c_str(), (long long)info.vocab_size,
                     shards_[0].path.c_str(), glob_pattern, (long long)shards_[0].info.vocab_size);
            if (!shards_.empty() && info.has_mask != shards_[0].info.has_mask)
                fail("%s: has %s loss mask, but %s (matched by the same pattern %s) %s: give a pattern of masked "
                     "shards or of unmasked ones", s.path.c_str(), info.has_mask ? "a" : "no",
                     shards_[0].path.c_str(), glob_pattern, shards_[0].info.has_mask ? "has one" : "has none");
            if (info.vocab_size > vocab_size) fail_data_vocab_larger(s.path.c_str(), info.vocab_size, vocab_size);
            check_shard_ids(s);
            total_windows_ += s.num_windows;
            shards_.push_back(s);
        }
        per_rank_ = total_windows_ / world_;
        if (per_rank_ == 0)
            fail("%s: %lld windows of B*T+1 tokens in all, fewer than world_size = %d", glob_pattern,
                 (long long)total_windows_, world_);
        inputs_.resize(BT);
        targets_.resize(BT);
        mask_.assign(BT, 1);
        start_epoch(0);
    }

    // Fills inputs()/targets()/mask() with the next window of this rank; after the last window of an
    // epoch the next epoch starts with new orders.
    void next_batch() {
        if (pos_ == per_rank_) start_epoch(epoch_ + 1);
        int64_t g = pos_ * world_ + rank_;  // index in the epoch's list of windows
        int i = (int)(std::upper_bound(prefix_.begin(), prefix_.end(), g) - prefix_.begin()) - 1;
        int64_t w = g - prefix_[i];
        use_shard(order_[i]);
        const int64_t BT = (int64_t)B_ * T_;
        const ShardInfo& in = shards_[mapped_].info;
        const int width = in.token_bytes;
        const int64_t first = (shuffle_ ? window_order_[w] : w) * BT;  // the window's first token
        const unsigned char* p = tokens_ + first * width;
        copy_token_ids(inputs_.data(), p, BT, width);
        copy_token_ids(targets_.data(), p + width, BT, width);
        if (in.has_mask) {
            const unsigned char* m = tokens_ + in.num_tokens * width + first + 1;
            for (int64_t j = 0; j < BT; j++) mask_[j] = m[j];
        }
        pos_++;
    }
    const int* inputs() const { return inputs_.data(); }    // (B, T)
    const int* targets() const { return targets_.data(); }  // (B, T)
    const int* mask() const { return mask_.data(); }        // (B, T), 1 = the target's loss counts
    bool has_mask() const { return shards_[0].info.has_mask; }  // the shards carry a loss mask (version 3)
    void reset() { start_epoch(0); }
    int64_t num_windows() const { return per_rank_; }  // per rank, per epoch
    int64_t epoch() const { return epoch_; }
    int64_t header_vocab() const { return shards_[0].info.vocab_size; }  // of every shard (the tokenizer's)
    const std::string& first_path() const { return shards_[0].path; }

    // The state is the same on every rank (they move in lockstep), so one saved copy resumes all.
    // Slots: 0 version, 1 epoch, 2 batches taken this epoch, then the settings the position is
    // only meaningful under, checked by load_state: 3 seed, 4 shuffle, 5 B, 6 T, 7 world_size,
    // 8 number of shards, 9 total windows.
    void save_state(int64_t out[16]) const {
        for (int i = 0; i < 16; i++) out[i] = 0;
        out[0] = STATE_VERSION;
        out[1] = epoch_;
        out[2] = pos_;
        memcpy(&out[3], &seed_, 8);
        out[4] = shuffle_;
        out[5] = B_;
        out[6] = T_;
        out[7] = world_;
        out[8] = (int64_t)shards_.size();
        out[9] = total_windows_;
    }
    void load_state(const int64_t in[16]) {
        if (in[0] != STATE_VERSION)
            fail("%s: data loader state has version %lld, this build reads %lld", pattern_.c_str(), (long long)in[0],
                 (long long)STATE_VERSION);
        int64_t now[16];
        save_state(now);
        static const char* const names[] = {"seed", "shuffle", "B", "T", "world_size", "number of shards",
                                            "total windows"};
        for (int i = 3; i <= 9; i++)
            if (in[i] != now[i])
                fail("%s: data loader state was saved with %s = %lld, this run has %lld; resume with the same "
                     "data, seed, shuffle, B, T and world size",
                     pattern_.c_str(), names[i - 3], (long long)in[i], (long long)now[i]);
        if (in[1] < 0 || in[2] < 0 || in[2] > per_rank_)
            fail("%s: data loader state position (epoch %lld, batch %lld) is out of range (%lld batches per epoch)",
                 pattern_.c_str(), (long long)in[1], (long long)in[2], (long long)per_rank_);
        start_epoch(in[1]);
        pos_ = in[2];
    }

  private:
    struct Shard {
        std::string path;
        int64_t num_windows;
        ShardInfo info;  // from its header
    };

    // Seed of one shuffle: a hash of (seed, epoch, stream) through two splitmix64 rounds, so
    // nearby epochs or shards give unrelated orders.
    uint64_t stream_seed(int64_t epoch, uint64_t stream) const {
        Rng a(seed_ ^ ((uint64_t)epoch * 0xD1B54A32D192ED03ull));
        Rng b(a.next_u64() ^ (stream * 0x8CB92BA72F3D8DD7ull));
        return b.next_u64();
    }

    void start_epoch(int64_t epoch) {
        epoch_ = epoch;
        pos_ = 0;
        int n = (int)shards_.size();
        order_.resize(n);
        for (int i = 0; i < n; i++) order_[i] = i;
        if (shuffle_) {
            Rng rng(stream_seed(epoch, ~0ull));
            rng_shuffle(rng, order_.data(), n);
        }
        prefix_.assign(1, 0);
        for (int i = 0; i < n; i++) prefix_.push_back(prefix_.back() + shards_[order_[i]].num_windows);
    }

    // Every id of shard `sh` below its header's vocab_size, which is at most the model's, and every
    // mask value 0 or 1 (one sequential read).
    void check_shard_ids(const Shard& sh) const {
        const int64_t size = file_size_or_fail(sh.path.c_str());
        MappedFile f;
        f.map(sh.path.c_str(), size);
        const unsigned char* ids = f.data() + HEADER_BYTES;
        const ShardInfo& in = sh.info;
        const int64_t all = in.num_tokens;
        const char* what = "the shard header's vocab_size, at most the model's";
        if (in.token_bytes == 2) check_token_ids((const uint16_t*)ids, all, 0, in.vocab_size, sh.path.c_str(), what);
        else check_token_ids((const uint32_t*)ids, all, 0, in.vocab_size, sh.path.c_str(), what);
        if (!in.has_mask) return;
        const unsigned char* m = ids + all * in.token_bytes;
        unsigned char most = 0;
        for (int64_t i = 0; i < all; i++) most = std::max(most, m[i]);
        if (most <= 1) return;
        for (int64_t i = 0; i < all; i++)
            if (m[i] > 1) fail("%s: loss mask value %u at token offset %lld is not 0 or 1", sh.path.c_str(), m[i], (long long)i);
    }

    // Maps shard s and builds its window order for this epoch.
    void use_shard(int s) {
        Shard& sh = shards_[s];
        if (s != mapped_) {
            int64_t size = file_size_or_fail(sh.path.c_str());
            file_.map(sh.path.c_str(), size);
            tokens_ = file_.data() + HEADER_BYTES;
            mapped_ = s;
            window_order_epoch_ = -1;
        }
        if (shuffle_ && window_order_epoch_ != epoch_) {
            window_order_.resize(sh.num_windows);
            for (int64_t w = 0; w < sh.num_windows; w++) window_order_[w] = w;
            Rng rng(stream_seed(epoch_, (uint64_t)s));
            rng_shuffle(rng, window_order_.data(), sh.num_windows);
            window_order_epoch_ = epoch_;
        }
    }

    int B_, T_, rank_, world_;
    uint64_t seed_;
    bool shuffle_;
    std::string pattern_;
    std::vector<Shard> shards_;
    int64_t total_windows_ = 0, per_rank_ = 0;
    int64_t epoch_ = 0, pos_ = 0;     // position: batches this rank has taken in this epoch
    std::vector<int> order_;          // shard order of this epoch
    std::vector<int64_t> prefix_;     // prefix_[i]: windows in order_[0..i)
    MappedFile file_;
    int mapped_ = -1;                 // index of the mapped shard
    const unsigned char* tokens_ = nullptr;  // the mapped shard's payload
    std::vector<int64_t> window_order_;  // of the mapped shard, for epoch window_order_epoch_
    int64_t window_order_epoch_ = -1;
    std::vector<int> inputs_, targets_, mask_;
};

// EvalLoader: a multiple-choice eval file (GPTE, docs/formats.md; HellaSwag from
// scripts/data/hellaswag.py). Each example becomes K rows (K = choices, 4 for HellaSwag) of
// context + one completion; a batch of B rows holds B / K examples. Row b of a batch:
// inputs[b, t] = row[t], targets[b, t] = row[t + 1], mask[b, t] = 1 where targets[b, t] is a
// completion token, so the model's choice for an example is the row with the lowest mean loss
// over its mask. Positions past a row's end hold token 0 with mask 0 (attention is causal, so
// they do not change the scored positions). Rank r takes examples r, r + world_size, ...; every
// rank runs the same num_batches(), an empty example slot has label -1 and an all-zero mask.
class EvalLoader {
  public:
    EvalLoader(const char* path, int B, int T, int rank, int world_size, int vocab_size)
        : B_(B), T_(T), rank_(rank), world_(world_size) {
        if (world_size < 1 || rank < 0 || rank >= world_size)
            fail("EvalLoader: rank %d is not in [0, world_size = %d)", rank, world_size);
        CheckedFile file = open_checked(path, MAGIC_EVAL);
        const int64_t* h = file.hd.h;
        check_range(path, "num_examples", h[2], 1, INT32_MAX);
        check_range(path, "vocab_size", h[3], 1, 65536);
        check_range(path, "num_choices", h[4], 2, 64);
        check_range(path, "max_row_tokens", h[5], 2, 65535);
        check_range(path, "payload_length", h[6], 1, INT64_MAX / 4);
        check_file_length(path, file.size, h[6] * 2);
        K_ = (int)h[4];
        header_vocab_ = h[3];
        if (B < K_ || B % K_ != 0) fail("EvalLoader: B = %d must be a positive multiple of %d choices (%s)", B, K_, path);
        if (T < h[5] - 1)
            fail("%s: the longest context + completion has %lld tokens, so T = %d must be at least %lld", path,
                 (long long)h[5], T, (long long)(h[5] - 1));
        data_.resize(h[6]);
        fread_or_fail(data_.data(), 2, h[6], file.f.get(), path);
        file.f.reset();
        // index the records: label, context length, K completion lengths, then the tokens
        const int64_t n = h[2], len = h[6], fields = 2 + K_;
        for (int64_t i = 0, pos = 0; i < n; i++) {
            if (pos + fields > len) fail("%s: the payload ends inside example %lld of %lld", path, (long long)i, (long long)n);
            const uint16_t* r = &data_[pos];
            int64_t toks = r[1], longest = 0;
            if (r[0] >= K_) fail("%s: example %lld has label %u, not in [0, %d)", path, (long long)i, r[0], K_);
            if (r[1] == 0) fail("%s: example %lld has an empty context", path, (long long)i);
            for (int k = 0; k < K_; k++) {
                if (r[2 + k] == 0) fail("%s: example %lld has an empty completion %d", path, (long long)i, k);
                toks += r[2 + k];
                longest = std::max<int64_t>(longest, r[2 + k]);
            }
            if (r[1] + longest > h[5])
                fail("%s: example %lld has %lld tokens, more than max_row_tokens = %lld in the header", path,
                     (long long)i, (long long)(r[1] + longest), (long long)h[5]);
            if (pos + fields + toks > len) fail("%s: truncated inside example %lld", path, (long long)i);
            check_token_ids(r + fields, toks, pos + fields, std::min<int64_t>(vocab_size, h[3]), path,
                            vocab_size <= h[3] ? "the model's vocab_size" : "the file header's vocab_size");
            offsets_.push_back(pos);
            pos += fields + toks;
            if (i == n - 1 && pos != len)
                fail("%s: %lld unexpected values after the last example", path, (long long)(len - pos));
        }
        const int64_t per_batch = B_ / K_, most = (n + world_ - 1) / world_;  // rank 0 has the most
        num_batches_ = (int)((most + per_batch - 1) / per_batch);
        inputs_.resize((size_t)B * T);
        targets_.resize((size_t)B * T);
        mask_.resize((size_t)B * T);
        labels_.resize(per_batch);
    }

    // Fills the next batch of this rank; after num_batches() calls it starts over.
    void next_batch() {
        if (batch_ == num_batches_) batch_ = 0;
        std::fill(inputs_.begin(), inputs_.end(), 0);
        std::fill(targets_.begin(), targets_.end(), 0);
        std::fill(mask_.begin(), mask_.end(), 0);
        const int64_t per_batch = B_ / K_, fields = 2 + K_;
        for (int64_t e = 0; e < per_batch; e++) {
            int64_t ex = ((int64_t)batch_ * per_batch + e) * world_ + rank_;
            labels_[e] = -1;
            if (ex >= (int64_t)offsets_.size()) continue;
            const uint16_t* r = &data_[offsets_[ex]];
            const uint16_t* ctx = r + fields;
            const uint16_t* comp = ctx + r[1];
            labels_[e] = r[0];
            for (int k = 0; k < K_; k++) {
                const int64_t row = e * K_ + k, nctx = r[1], ncomp = r[2 + k], n = nctx + ncomp;
                int* in = &inputs_[row * T_];
                int* tg = &targets_[row * T_];
                int* m = &mask_[row * T_];
                for (int64_t t = 0; t < n; t++) {
                    int tok = t < nctx ? ctx[t] : comp[t - nctx];
                    if (t < T_) in[t] = tok;
                    if (t > 0) tg[t - 1] = tok;
                }
                for (int64_t t = nctx - 1; t < n - 1; t++) m[t] = 1;
                comp += ncomp;
            }
        }
        batch_++;
    }
    void reset() { batch_ = 0; }
    const int* inputs() const { return inputs_.data(); }    // (B, T)
    const int* targets() const { return targets_.data(); }  // (B, T)
    const int* mask() const { return mask_.data(); }        // (B, T)
    const int* labels() const { return labels_.data(); }    // (B / K), -1 = empty slot
    int num_batches() const { return num_batches_; }        // per rank, the same on every rank
    int num_choices() const { return K_; }
    int64_t num_examples() const { return (int64_t)offsets_.size(); }  // on all ranks together
    int64_t header_vocab() const { return header_vocab_; }  // the vocab_size of the tokenizer that wrote it

  private:
    int B_, T_, rank_, world_, K_ = 0, num_batches_ = 0, batch_ = 0;
    int64_t header_vocab_ = 0;
    std::vector<uint16_t> data_;     // the payload
    std::vector<int64_t> offsets_;   // start of each example's record in data_
    std::vector<int> inputs_, targets_, mask_, labels_;
};

// The trainers' check of a data file (a token shard, first of its pattern, or an eval file) against
// the model: its header records the vocab_size of the tokenizer that wrote it, and that must be the
// model's vocab_size, or data_vocab (--data-vocab; 0 = not given), which may only be smaller (a model
// whose embedding rows pad its tokenizer's vocabulary, as Qwen2's 151936 rows for 151665 ids); a file
// of another tokenizer is refused even when its ids happen to fit, since they would stand for other tokens.
inline void check_data_vocab(const std::string& path, int64_t header_vocab, int data_vocab, int model_vocab) {
    if (data_vocab > model_vocab)
        fail("--data-vocab %d: above the model's vocab_size %d (every token id of the data must be a row of the model)",
             data_vocab, model_vocab);
    const int64_t expected = data_vocab ? data_vocab : model_vocab;
    if (header_vocab == expected) return;
    if (data_vocab)
        fail("%s: written by a tokenizer of vocab_size %lld (its header), but --data-vocab is %lld", path.c_str(),
             (long long)header_vocab, (long long)expected);
    if (header_vocab < model_vocab)
        fail("%s: written by a tokenizer of vocab_size %lld (its header), the model's vocab_size is %d: tokenize the "
             "data with the model's tokenizer (for a model whose vocabulary pads its tokenizer's, give --data-vocab "
             "%lld)", path.c_str(), (long long)header_vocab, model_vocab, (long long)header_vocab);
    fail_data_vocab_larger(path.c_str(), header_vocab, model_vocab);
}
inline void check_data_vocab(const DataLoader& dl, int data_vocab, int model_vocab) {
    check_data_vocab(dl.first_path(), dl.header_vocab(), data_vocab, model_vocab);
}
