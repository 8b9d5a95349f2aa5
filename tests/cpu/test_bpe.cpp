// test_bpe: checks the GPT-2 BPE encoder (llmc/bpe.h) against tiktoken.
//   build/test_bpe [FIXTURE]
//       the cases of tests/fixture/bpe_cases.bin (written by tests/fixture/make_bpe_fixture.py from
//       tiktoken, with the part of GPT-2's vocabulary they need): the pre-tokenizer's pieces and
//       the ids must equal tiktoken's exactly, and decoding the ids must give the text back; so
//       must a second pass, from the cache. Then text that is not valid UTF-8, which tiktoken
//       cannot take, against the behaviour bpe.h defines: an invalid byte is a character of its
//       own that joins punctuation, nothing crashes, the bytes round-trip; and random bytes.
//       Prints `test_bpe: PASSED (N checks)` or FAILED; exits 1 on failure.
//   build/test_bpe --encode TEXT --tokenizer TOKENIZER --out IDS
//       encodes the file TEXT with a GPTT tokenizer file and writes its ids to IDS as int32
//       little-endian, timed (tests/python/test_bpe.py compares them with tiktoken's).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "llmc/bpe.h"
#include "llmc/formats.h"
#include "llmc/rand.h"
#include "llmc/utils.h"

static const int64_t MAGIC_BPE_CASES = fourcc("GPTB");
static const int ALLOW_EOT = 1;

static std::string read_whole_file(const char* path) {
    std::string data(file_size_or_fail(path), '\0');
    UniqueFile f(fopen_or_fail(path, "rb"));
    if (!data.empty()) fread_or_fail(&data[0], 1, data.size(), f.get(), path);
    return data;
}

struct Reader {  // sequential little-endian reads of the fixture, each checked against its length
    const std::string& data;
    const char* path;
    size_t pos;
    const char* take(size_t n, const char* what) {
        if (n > data.size() - pos)
            fail("%s: truncated: %s needs %zu bytes at offset %zu, the file has %zu", path, what, n, pos, data.size());
        pos += n;
        return data.data() + pos - n;
    }
    int32_t i32(const char* what) {
        int32_t v;
        memcpy(&v, take(4, what), 4);
        return v;
    }
    std::string bytes(size_t n, const char* what) { return std::string(take(n, what), n); }
};

struct Case {
    int flags;
    std::string text;
    std::vector<int> ids;
    std::vector<int> piece_lengths;  // in bytes, of the text as ordinary text
};

// The fixture's vocabulary as a TokenizerFile (ids it does not hold are empty, i.e. no token).
static TokenizerFile read_fixture(const char* path, std::vector<Case>* cases) {
    std::string data = read_whole_file(path);
    if ((int64_t)data.size() < HEADER_BYTES) fail("%s: too short to hold the 1024-byte header", path);
    FileHeader hd;
    memcpy(hd.h, data.data(), HEADER_BYTES);
    if (hd.h[0] != MAGIC_BPE_CASES)
        fail("%s: bad magic 0x%llx, not a BPE case fixture (\"GPTB\")", path, (unsigned long long)hd.h[0]);
    if (hd.h[1] != FORMAT_VERSION) fail("%s: unsupported version %lld", path, (long long)hd.h[1]);
    check_range(path, "vocab_size", hd.h[2], 256, 1 << 20);
    check_range(path, "eot", hd.h[3], 0, hd.h[2] - 1);
    check_range(path, "tokens", hd.h[4], 256, hd.h[2]);
    check_range(path, "cases", hd.h[5], 1, 1 << 20);
    TokenizerFile vocab{std::vector<std::string>(hd.h[2]), (int)hd.h[3]};
    Reader rd{data, path, (size_t)HEADER_BYTES};
    for (int64_t k = 0; k < hd.h[4]; k++) {
        int32_t id = rd.i32("token id");
        if (id < 0 || id >= hd.h[2] || !vocab.tokens[id].empty())
            fail("%s: token %lld: bad or repeated id %d", path, (long long)k, id);
        int len = (unsigned char)*rd.take(1, "token length");
        if (len == 0) fail("%s: token %d has no bytes", path, id);
        vocab.tokens[id] = rd.bytes(len, "token bytes");
    }
    for (int64_t k = 0; k < hd.h[5]; k++) {
        Case c;
        c.flags = rd.i32("case flags");
        int32_t len = rd.i32("text length");
        if (len < 0) fail("%s: case %lld: negative text length", path, (long long)k);
        c.text = rd.bytes(len, "case text");
        int32_t n = rd.i32("id count");
        if (n < 0) fail("%s: case %lld: negative id count", path, (long long)k);
        for (int32_t i = 0; i < n; i++) c.ids.push_back(rd.i32("case id"));
        n = rd.i32("piece count");
        if (n < 0) fail("%s: case %lld: negative piece count", path, (long long)k);
        for (int32_t i = 0; i < n; i++) c.piece_lengths.push_back(rd.i32("piece length"));
        cases->push_back(std::move(c));
    }
    if (rd.pos != data.size()) fail("%s: %zu unexpected bytes after the last case", path, data.size() - rd.pos);
    return vocab;
}

static int g_passed = 0, g_failed = 0;

static void check(bool ok, const char* what, const std::string& text) {
    (ok ? g_passed : g_failed)++;
    if (ok) return;
    std::string shown;  // the text with escapes, at most 60 bytes of it
    for (size_t i = 0; i < text.size() && i < 60; i++) {
        unsigned char ch = text[i];
        char buf[8];
        if (ch < 0x20 || ch == 0x7f || ch == '\\') snprintf(buf, sizeof buf, "\\x%02x", ch);
        else snprintf(buf, sizeof buf, "%c", ch);
        shown += buf;
    }
    printf("FAIL %s: \"%s\"%s\n", what, shown.c_str(), text.size() > 60 ? "..." : "");
}

static std::string ids_string(const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
    return s;
}

static std::string decode(const TokenizerFile& vocab, const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += id >= 0 && id < (int)vocab.tokens.size() ? vocab.tokens[id] : "<bad id>";
    return s;
}

static std::vector<std::string> pieces_of(const std::string& text) {
    std::vector<std::string> pieces;
    gpt2_pretokenize(text, [&](std::string_view p) { pieces.emplace_back(p); });
    return pieces;
}

static void check_fixture(const char* path) {
    std::vector<Case> cases;
    TokenizerFile vocab = read_fixture(path, &cases);
    BpeEncoder enc(vocab, path);
    int exact = 0, same_pieces = 0;
    for (const Case& c : cases) {
        std::vector<int> lengths;
        for (const std::string& p : pieces_of(c.text)) lengths.push_back((int)p.size());
        bool cut_ok = lengths == c.piece_lengths;
        check(cut_ok, "pieces differ from tiktoken's regex", c.text);
        if (!cut_ok) printf("     tiktoken %s\n     ours     %s  (byte lengths)\n", ids_string(c.piece_lengths).c_str(),
                            ids_string(lengths).c_str());
        same_pieces += cut_ok;

        std::vector<int> got = enc.encode(c.text, (c.flags & ALLOW_EOT) != 0);
        bool ok = got == c.ids;
        const char* what = c.flags & ALLOW_EOT ? "ids differ from tiktoken's (<|endoftext|> allowed)"
                                               : "ids differ from tiktoken's";
        check(ok, what, c.text);
        if (!ok) printf("     tiktoken %s\n     ours     %s\n", ids_string(c.ids).c_str(), ids_string(got).c_str());
        exact += ok;
        check(decode(vocab, got) == c.text, "decode(encode(text)) is not the text", c.text);
    }
    // A second pass, now from the cache, must give the same ids.
    for (const Case& c : cases)
        check(enc.encode(c.text, (c.flags & ALLOW_EOT) != 0) == c.ids, "ids differ on a second (cached) pass", c.text);
    printf("%zu fixture cases: %d cut into tiktoken's pieces, %d give its ids exactly and decode back\n", cases.size(),
           same_pieces, exact);

    // Invalid UTF-8: each invalid byte is a non-letter, non-number character.
    struct Split {
        std::string text;
        std::vector<std::string> pieces;
    };
    const Split splits[] = {
        {"a\xff" "b", {"a", "\xff", "b"}},
        {"caf\xc3", {"caf", "\xc3"}},                                // truncated 2-byte sequence at the end
        {"\xe4\xb8" "abc", {"\xe4\xb8", "abc"}},                     // truncated 3-byte sequence
        {"x\xc0\xaf" "y", {"x", "\xc0\xaf", "y"}},                   // overlong '/'
        {"\xed\xa0\x80!", {"\xed\xa0\x80!"}},                        // a surrogate, with punctuation
        {"\xf4\x90\x80\x80 1", {"\xf4\x90\x80\x80", " 1"}},          // beyond U+10FFFF
        {" \xff\xfe", {" \xff\xfe"}},                                // a leading space joins them
        {"it\x80's", {"it", "\x80'", "s"}},                          // not a contraction after the byte
        {"\xe6\x97\xa5\xff\xe6\x9c\xac", {"\xe6\x97\xa5", "\xff", "\xe6\x9c\xac"}},  // between CJK letters
    };
    for (const Split& s : splits) {
        check(pieces_of(s.text) == s.pieces, "invalid UTF-8 splits differently from the rule", s.text);
        check(decode(vocab, enc.encode(s.text)) == s.text, "invalid UTF-8 does not round-trip", s.text);
    }
    // Random bytes, and random mixes of the fixture's texts with invalid bytes: the pieces tile
    // the text and the ids decode back to it (fixed seed).
    Rng rng(1337);
    for (int k = 0; k < 2000; k++) {
        std::string text;
        int len = (int)rng.below(64);
        for (int i = 0; i < len; i++) {
            if (rng.below(4) == 0) text += cases[rng.below(cases.size())].text.substr(0, 12);
            else text += (char)rng.below(256);
        }
        std::string joined;
        for (const std::string& p : pieces_of(text)) joined += p;
        check(joined == text, "random bytes: the pieces do not tile the text", text);
        check(decode(vocab, enc.encode(text)) == text, "random bytes do not round-trip", text);
    }
    // A 1 MB run of one letter is one piece: the merge must stay O(n log n).
    auto t0 = std::chrono::steady_clock::now();
    std::string run(1 << 20, 'a');
    check(decode(vocab, enc.encode(run)) == run, "a 1 MB word does not round-trip", "aaaa...");
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    check(ms < 5000, "a 1 MB word took over 5 s", "aaaa...");
    printf("a 1 MB word encodes in %.0f ms\n", ms);
}

static void encode_file(const char* text_path, const char* tokenizer_path, const char* out_path) {
    auto t0 = std::chrono::steady_clock::now();
    BpeEncoder enc(tokenizer_path);
    auto t1 = std::chrono::steady_clock::now();
    std::string text = read_whole_file(text_path);
    auto t2 = std::chrono::steady_clock::now();
    std::vector<int> ids = enc.encode(text);
    auto t3 = std::chrono::steady_clock::now();
    UniqueFile f(fopen_or_fail(out_path, "wb"));
    std::vector<int32_t> out(ids.begin(), ids.end());
    if (!out.empty()) fwrite_or_fail(out.data(), sizeof(int32_t), out.size(), f.get(), out_path);
    fclose_or_fail(f.release(), out_path);
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    printf("encoded %s: %zu bytes into %zu tokens in %.1f ms (%.1f MB/s); loading %s took %.1f ms\n", text_path,
           text.size(), ids.size(), ms(t2, t3), text.size() / 1e3 / ms(t2, t3), tokenizer_path, ms(t0, t1));
}

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--encode") {
        if (argc != 7 || std::string(argv[3]) != "--tokenizer" || std::string(argv[5]) != "--out")
            fail("usage: test_bpe --encode TEXT --tokenizer TOKENIZER --out IDS");
        encode_file(argv[2], argv[4], argv[6]);
        return 0;
    }
    if (argc > 2) fail("usage: test_bpe [FIXTURE]  or  test_bpe --encode TEXT --tokenizer TOKENIZER --out IDS");
    check_fixture(argc > 1 ? argv[1] : "tests/fixture/bpe_cases.bin");
    if (g_failed) {
        printf("test_bpe: FAILED (%d of %d checks)\n", g_failed, g_passed + g_failed);
        return 1;
    }
    printf("test_bpe: PASSED (%d checks)\n", g_passed);
    return 0;
}
