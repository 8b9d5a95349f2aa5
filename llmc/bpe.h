// bpe.h: GPT-2's byte-level BPE encoder, text -> token ids, giving the ids of tiktoken's "gpt2"
// encoding (tests/cpu/test_bpe.cpp checks a fixture of tiktoken's ids, tests/python/test_bpe.py all of tiny
// Shakespeare). The decoder is llmc/tokenizer.h.
//
// The vocabulary is the GPTT tokenizer file (docs/formats.md) that the trainers already read to
// print samples: no merges file is needed, because in byte-level BPE as tiktoken runs it the
// priority of merging two adjacent tokens is the rank of the concatenated bytes, and a token's
// rank is its id. So every token but end-of-text is a merge rule, and lower ids merge first.
//
// Encoding, as tiktoken does it:
// 1. Special tokens: only with allow_eot, each occurrence of the end-of-text token's text
//    ("<|endoftext|>") becomes its id and the text between is encoded on its own (tiktoken's
//    allowed_special); without it that text is ordinary text (tiktoken's encode_ordinary).
// 2. Pre-tokenization with GPT-2's pattern, implemented by hand in gpt2_pretokenize (below):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    over UTF-8, with the character classes of llmc/unicode_tables.h (Unicode 16.0, as tiktoken).
//    Invalid UTF-8 (tiktoken only takes valid text) is defined here: each byte that does not
//    start a valid sequence is a character of its own, neither letter, number nor space, so it
//    joins a run of punctuation; the bytes still round-trip, as every byte is a token.
// 3. Each piece that is itself a token is that token. Otherwise its bytes merge, lowest rank
//    first and the leftmost of equal ranks, until no adjacent pair is a token: a heap of
//    candidate pairs over a linked list of tokens, O(n log n) in the piece's length n (a long
//    run of one letter is not quadratic). The ids of pieces up to 64 bytes are cached.
// An encoder is not thread-safe (the cache and scratch buffers); use one per thread.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include "llmc/formats.h"
#include "llmc/unicode_tables.h"

// ================================ UTF-8 and character classes ================================
enum class CharClass : uint8_t { Letter, Number, Space, Other };

template <size_t N>
inline bool in_unicode_ranges(uint32_t cp, const UnicodeRange (&ranges)[N]) {
    size_t lo = 0, hi = N;  // the first range whose last code point is >= cp
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ranges[mid].last < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < N && ranges[lo].first <= cp;
}

inline CharClass unicode_char_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::Letter;
        if (cp >= '0' && cp <= '9') return CharClass::Number;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return CharClass::Space;
        return CharClass::Other;
    }
    if (in_unicode_ranges(cp, UNICODE_LETTERS)) return CharClass::Letter;
    if (in_unicode_ranges(cp, UNICODE_NUMBERS)) return CharClass::Number;
    if (in_unicode_ranges(cp, UNICODE_WHITE_SPACE)) return CharClass::Space;
    return CharClass::Other;
}

// The length in bytes (1..4) of the valid UTF-8 sequence at s[0..n), n >= 1, with its code point
// in *cp; or 0 if s[0] does not start one (a stray continuation byte, a truncated or overlong
// sequence, a surrogate, or beyond U+10FFFF: the well-formed table of the Unicode standard, 3-7).
inline int utf8_sequence(const unsigned char* s, size_t n, uint32_t* cp) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (n < (size_t)len || s[1] < lo || s[1] > hi) return 0;
    uint32_t c = b & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[k] & 0x3F);
    }
    *cp = c;
    return len;
}

// The offset of the first byte of `text` that is not part of a valid UTF-8 sequence (utf8_sequence's
// rules), or std::string::npos when all of it is UTF-8 text. Prompts are checked with it before
// encoding, since the encoder takes invalid bytes one by one and would run on any binary input.
inline size_t utf8_invalid_offset(std::string_view text) {
    uint32_t cp;
    for (size_t i = 0; i < text.size();) {
        const int len = utf8_sequence((const unsigned char*)text.data() + i, text.size() - i, &cp);
        if (len == 0) return i;
        i += len;
    }
    return std::string::npos;
}

// The class and byte length of the character at text[i]; an invalid byte is Other, of length 1.
struct TextChar {
    CharClass cls;
    int len;
};
inline TextChar text_char_at(std::string_view text, size_t i) {
    uint32_t cp;
    int len = utf8_sequence((const unsigned char*)text.data() + i, text.size() - i, &cp);
    if (len == 0) return {CharClass::Other, 1};
    return {unicode_char_class(cp), len};
}

// ================================ pre-tokenization ================================
// The end of the match of GPT-2's pattern that starts at text[i] (i < text.size()). Some
// alternative always matches at i, so the matches tile the text. The alternatives in order:
//   contractions 's 't 're 've 'm 'll 'd (ASCII, lower case);
//   ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020 space, then a run of one
//   class; the three classes are disjoint, so the class of the first non-space character decides;
//   '\s+(?!\S)': a whitespace run up to the end of the text, or else all but its last character
//   (which then leads the next match: " hello" keeps its space); '\s+': a single whitespace
//   character before a non-space (the lookahead left nothing).
inline size_t gpt2_pretoken_end(std::string_view text, size_t i) {
    const size_t n = text.size();
    if (text[i] == '\'' && i + 1 < n) {
        char a = text[i + 1], b = i + 2 < n ? text[i + 2] : '\0';
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    TextChar c = text_char_at(text, i);
    size_t run = i;  // where the run of one class starts
    if (text[i] == ' ' && i + 1 < n) {
        TextChar next = text_char_at(text, i + 1);
        if (next.cls != CharClass::Space) c = next, run = i + 1;
    }
    size_t end = run + c.len;
    if (c.cls != CharClass::Space) {
        while (end < n) {
            TextChar d = text_char_at(text, end);
            if (d.cls != c.cls) break;
            end += d.len;
        }
        return end;
    }
    size_t last = run;  // start of the last whitespace character of the run
    while (end < n) {
        TextChar d = text_char_at(text, end);
        if (d.cls != CharClass::Space) break;
        last = end;
        end += d.len;
    }
    if (end == n || last == run) return end;
    return last;
}

// Calls piece(std::string_view) for each pre-token of text, in order.
template <typename F>
inline void gpt2_pretokenize(std::string_view text, F&& piece) {
    for (size_t i = 0; i < text.size();) {
        size_t end = gpt2_pretoken_end(text, i);
        piece(text.substr(i, end - i));
        i = end;
    }
}

// ================================ the encoder ================================
class BpeEncoder {
  public:
    // Reads a GPTT tokenizer file (data/gpt2_tokenizer.bin).
    explicit BpeEncoder(const char* path) : BpeEncoder(tokenizer_read(path), path) {}

    // tokens[id] = the bytes of token id; an empty entry is no token (a GPTT file has none; a
    // test may pass only the tokens its texts need). Every single byte must be a token.
    BpeEncoder(TokenizerFile file, const char* name) : tokens_(std::move(file.tokens)), eot_(file.eot_token) {
        ranks_.reserve(tokens_.size());
        for (int id = 0; id < (int)tokens_.size(); id++)
            if (id != eot_ && !tokens_[id].empty()) ranks_.emplace(tokens_[id], id);  // the lowest id wins a tie
        for (int b = 0; b < 256; b++)
            if (rank_of(std::string(1, (char)b)) < 0)
                fail("%s: no token for the byte 0x%02x, so this is not a byte-level BPE vocabulary", name, b);
    }

    // ranks_ views the strings of tokens_: a copy would view the original's. A move keeps them.
    BpeEncoder(const BpeEncoder&) = delete;
    BpeEncoder& operator=(const BpeEncoder&) = delete;
    BpeEncoder(BpeEncoder&&) = default;
    BpeEncoder& operator=(BpeEncoder&&) = default;

    int vocab_size() const { return (int)tokens_.size(); }
    int eot_token() const { return eot_; }

    // Appends the ids of text to *out. allow_eot: "<|endoftext|>" (the eot token's text) in text
    // becomes the eot id, as tiktoken's allowed_special; else it is ordinary text.
    void encode(std::string_view text, std::vector<int>* out, bool allow_eot = false) {
        if (!allow_eot || eot_ < 0 || tokens_[eot_].empty()) return encode_ordinary(text, out);
        const std::string& special = tokens_[eot_];
        for (size_t pos = 0;;) {
            size_t hit = text.find(special, pos);
            encode_ordinary(text.substr(pos, hit == std::string_view::npos ? std::string_view::npos : hit - pos), out);
            if (hit == std::string_view::npos) return;
            out->push_back(eot_);
            pos = hit + special.size();
        }
    }
    std::vector<int> encode(std::string_view text, bool allow_eot = false) {
        std::vector<int> ids;
        encode(text, &ids, allow_eot);
        return ids;
    }

  private:
    static constexpr size_t CACHE_MAX_PIECE_BYTES = 64;
    static constexpr size_t CACHE_MAX_ENTRIES = 1 << 17;  // then it starts over: memory stays bounded
    static constexpr int NOT_A_START = -2;                // prev_ of a byte inside a token
    struct CachedIds {
        uint32_t offset, count;  // into cache_ids_
    };
    struct Candidate {  // merging the two tokens that cover piece[left, end) makes token `rank`
        int rank, left, end;
        bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };

    int rank_of(std::string_view bytes) const {
        auto it = ranks_.find(bytes);
        return it == ranks_.end() ? -1 : it->second;
    }

    void encode_ordinary(std::string_view text, std::vector<int>* out) {
        gpt2_pretokenize(text, [&](std::string_view piece) { encode_piece(piece, out); });
    }

    void encode_piece(std::string_view piece, std::vector<int>* out) {
        int whole = rank_of(piece);
        if (whole >= 0) return out->push_back(whole);
        if (piece.size() > CACHE_MAX_PIECE_BYTES) return merge(piece, out);
        cache_key_.assign(piece);
        auto it = cache_.find(cache_key_);
        if (it != cache_.end()) {
            const int* ids = cache_ids_.data() + it->second.offset;
            out->insert(out->end(), ids, ids + it->second.count);
            return;
        }
        size_t first = out->size();
        merge(piece, out);
        if (cache_.size() >= CACHE_MAX_ENTRIES) cache_.clear(), cache_ids_.clear();
        cache_.emplace(cache_key_, CachedIds{(uint32_t)cache_ids_.size(), (uint32_t)(out->size() - first)});
        cache_ids_.insert(cache_ids_.end(), out->begin() + first, out->end());
    }

    // The token of piece[left, end) if the two tokens starting at `left` (its successor ending at
    // `end`) would merge into one: pushed on the heap as a candidate.
    void push_candidate(std::string_view piece, int left, int end) {
        int rank = rank_of(piece.substr(left, end - left));
        if (rank < 0) return;
        heap_.push_back({rank, left, end});
        std::push_heap(heap_.begin(), heap_.end(), std::greater<Candidate>());
    }

    // BPE of one piece: the tokens are a linked list over the piece's byte offsets (next_[p] is
    // where the token starting at p ends, prev_[p] where the token before starts, -1 for none,
    // NOT_A_START if p is inside a token).
    // A heap entry is current if its left token still has a successor ending where it did: the
    // pair's bytes, and so its rank, are then unchanged.
    void merge(std::string_view piece, std::vector<int>* out) {
        if (piece.size() > (size_t)INT32_MAX)
            fail("a %zu-byte word is too long to encode (2 GB at most)", piece.size());
        const int n = (int)piece.size();
        next_.resize(n);
        prev_.resize(n);
        for (int p = 0; p < n; p++) next_[p] = p + 1, prev_[p] = p - 1;
        heap_.clear();
        for (int p = 0; p + 1 < n; p++) push_candidate(piece, p, p + 2);
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<Candidate>());
            Candidate c = heap_.back();
            heap_.pop_back();
            if (prev_[c.left] == NOT_A_START) continue;  // stale: merged into the token before it
            int right = next_[c.left];
            if (right >= n || next_[right] != c.end) continue;  // stale: a neighbour changed
            next_[c.left] = c.end;
            if (c.end < n) prev_[c.end] = c.left;
            prev_[right] = NOT_A_START;
            if (prev_[c.left] >= 0) push_candidate(piece, prev_[c.left], c.end);
            if (c.end < n) push_candidate(piece, c.left, next_[c.end]);
        }
        for (int p = 0; p < n; p = next_[p]) out->push_back(rank_of(piece.substr(p, next_[p] - p)));
    }

    std::vector<std::string> tokens_;                   // id -> bytes; ranks_ points into these strings
    int eot_;                                           // -1 if the vocabulary has none
    std::unordered_map<std::string_view, int> ranks_;  // bytes -> id (= merge rank), all but eot
    std::unordered_map<std::string, CachedIds> cache_;  // piece -> its ids in cache_ids_
    std::vector<int> cache_ids_;
    std::string cache_key_;
    std::vector<Candidate> heap_;
    std::vector<int> next_, prev_;
};
