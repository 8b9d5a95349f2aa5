// fuzz_bpe: the GPT-2 BPE encoder (llmc/bpe.h) on arbitrary bytes, most of them not UTF-8.
// The first input byte chooses allow_eot (bit 0); the rest is the text. The vocabulary, built
// here, is every byte, then pairs and longer strings over bytes that the fuzzer can reach
// (ASCII, UTF-8 lead and continuation bytes), so merges nest several levels deep, and eot.
// Invariants: the pre-tokenizer's pieces are non-empty and tile the text; every id is in the
// vocabulary; the ids decode to the text; and they equal a plain BPE written here (rescan every
// pair, merge the lowest rank, the leftmost of equal ones; a piece that is a token is that token),
// which checks the heap and linked list of the encoder's O(n log n) merge.
#include <map>
#include "llmc/bpe.h"
#include "tests/fuzz/fuzz_common.h"

static TokenizerFile make_vocabulary() {
    TokenizerFile v;
    for (int b = 0; b < 256; b++) v.tokens.push_back(std::string(1, (char)b));
    const std::string alphabet = std::string("ab '!\n") + "\xc3\xa4\xe4\xb8\x80\xf0\x9f\x98";
    for (char x : alphabet)
        for (char y : alphabet) v.tokens.push_back(std::string{x, y});
    for (const char* s : {"aaa", "aaaa", "aba", "bab", " ab", " a", "''", "!!!", "\n\n", "\xc3\xa4\xc3\xa4",
                          "\xe4\xb8\x80", "\xf0\x9f\x98\x80", "ab'"})
        v.tokens.push_back(s);
    v.eot_token = (int)v.tokens.size();
    v.tokens.push_back("<|endoftext|>");
    return v;
}

// The reference: the same pieces, each merged by rescanning all pairs.
static void plain_bpe(const std::map<std::string, int>& ranks, std::string_view piece, std::vector<int>* out) {
    auto rank = [&](std::string_view s) {
        auto it = ranks.find(std::string(s));
        return it == ranks.end() ? -1 : it->second;
    };
    if (rank(piece) >= 0) return out->push_back(rank(piece));
    std::vector<std::string> parts;
    for (char c : piece) parts.push_back(std::string(1, c));
    for (;;) {
        int best = -1, best_rank = -1;
        for (size_t i = 0; i + 1 < parts.size(); i++) {
            int r = rank(parts[i] + parts[i + 1]);
            if (r >= 0 && (best_rank < 0 || r < best_rank)) best = (int)i, best_rank = r;
        }
        if (best < 0) break;
        parts[best] += parts[best + 1];
        parts.erase(parts.begin() + best + 1);
    }
    for (const std::string& p : parts) out->push_back(rank(p));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const TokenizerFile vocab = make_vocabulary();
    static BpeEncoder enc(vocab, "fuzz vocabulary");
    static const std::map<std::string, int> ranks = [] {
        std::map<std::string, int> m;
        for (int id = 0; id < (int)vocab.tokens.size(); id++)
            if (id != vocab.eot_token) m.emplace(vocab.tokens[id], id);
        return m;
    }();
    if (size == 0) return 0;
    const bool allow_eot = data[0] & 1;
    const std::string text((const char*)data + 1, size - 1);

    std::string joined;
    gpt2_pretokenize(text, [&](std::string_view piece) {
        FUZZ_CHECK(!piece.empty());
        joined += piece;
    });
    FUZZ_CHECK(joined == text);

    std::vector<int> ids = enc.encode(text, allow_eot);
    std::string decoded;
    for (int id : ids) {
        FUZZ_CHECK(id >= 0 && id < (int)vocab.tokens.size());
        decoded += vocab.tokens[id];
    }
    FUZZ_CHECK(decoded == text);

    std::vector<int> want;
    const std::string& eot = vocab.tokens[vocab.eot_token];
    for (size_t pos = 0;;) {
        size_t hit = allow_eot ? text.find(eot, pos) : std::string::npos;
        std::string_view segment = std::string_view(text).substr(pos, hit == std::string::npos ? hit : hit - pos);
        gpt2_pretokenize(segment, [&](std::string_view piece) { plain_bpe(ranks, piece, &want); });
        if (hit == std::string::npos) break;
        want.push_back(vocab.eot_token);
        pos = hit + eot.size();
    }
    FUZZ_CHECK(ids == want);
    return 0;
}
