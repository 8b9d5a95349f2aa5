// tokenizer.h: token id -> bytes, for printing samples. Reads the GPTT decode table
// (docs/formats.md) through formats.h, which validates it.
// Tokens are byte strings, and a multi-byte UTF-8 character can be split across tokens, so
// print_token writes bytes as they are except control characters (other than newline and tab),
// which become \xNN so a sample can never corrupt the terminal. The end-of-text token, a break
// between documents, prints as a blank line ("\n\n"), not as its text <|endoftext|>.
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include "llmc/formats.h"

class Tokenizer {
  public:
    explicit Tokenizer(const char* path) : file_(tokenizer_read(path)), path_(path) {}

    int vocab_size() const { return (int)file_.tokens.size(); }
    int eot_token() const { return file_.eot_token; }
    const std::string& decode(int id) const {
        if (id < 0 || id >= vocab_size())
            fail("%s: token id %d is outside this tokenizer's vocabulary of %d", path_.c_str(), id, vocab_size());
        return file_.tokens[id];
    }
    void print_token(int id, FILE* out = stdout) const {
        const std::string& bytes = decode(id);
        if (id == eot_token()) {
            fputs("\n\n", out);
            return;
        }
        for (unsigned char ch : bytes) {
            if ((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f) fprintf(out, "\\x%02x", ch);
            else fputc(ch, out);
        }
    }

  private:
    TokenizerFile file_;
    std::string path_;
};

// --tokenizer FILE for a model of vocab_size V (both trainers' samples, generate): the decode table
// must cover every id the model can produce, so a table of another, smaller tokenizer is refused at
// start instead of failing at the first sampled id it lacks. nullptr when path is empty.
inline Tokenizer* open_model_tokenizer(const std::string& path, int V) {
    if (path.empty()) return nullptr;
    std::unique_ptr<Tokenizer> tok(new Tokenizer(path.c_str()));
    if (tok->vocab_size() < V)
        fail("--tokenizer %s: %d tokens, the model's vocabulary has %d (a decode table of another tokenizer?)",
             path.c_str(), tok->vocab_size(), V);
    return tok.release();
}
