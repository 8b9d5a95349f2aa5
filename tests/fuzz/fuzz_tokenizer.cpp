// fuzz_tokenizer: the tokenizer reader (GPTT, llmc/formats.h) through Tokenizer (llmc/tokenizer.h),
// then every token printed as a sample would be.
// Invariants: every entry of an accepted file is 1..255 bytes, eot_token is -1 or a valid id, and
// an id outside the vocabulary is refused by fail(), never read.
#include "llmc/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("tokenizer.bin");
    static FILE* sink = fopen("/dev/null", "w");
    const char* path = file.set(data, size);
    try {
        Tokenizer tok(path);
        FUZZ_CHECK(tok.vocab_size() >= 1);
        FUZZ_CHECK(tok.eot_token() >= -1 && tok.eot_token() < tok.vocab_size());
        for (int id = 0; id < tok.vocab_size(); id++) {
            const size_t n = tok.decode(id).size();
            FUZZ_CHECK(n >= 1 && n <= 255);
            tok.print_token(id, sink);
        }
        for (int id : {-1, tok.vocab_size()}) {
            bool refused = false;
            try {
                tok.decode(id);
            } catch (const FailError&) {
                refused = true;
            }
            FUZZ_CHECK(refused);
        }
    } catch (const FailError&) {
    }
    return 0;
}
