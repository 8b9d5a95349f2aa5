// generate_cpu.cpp: text generation on the CPU with a KV cache (llmc/cpu/gpt2_infer.h), GPT-2 and
// Llama-style models, the CPU twin of the GPU generate: flags, the model, the prompts, the
// generation loop, the output.
// fp32, OpenMP; the same sampling (llmc/sampler.h) and cache layout the GPU version will use.
//
//   make build/generate_cpu
//   build/generate_cpu --model out/d12/ --tokenizer data/gpt2_tokenizer.bin --prompt "To be, or not"
//       --max-new 64 --temperature 0.8 --top-k 40
//
// Prompts: --prompt TEXT (through the GPT-2 BPE encoder of llmc/bpe.h, which reads --tokenizer),
// --prompt-ids 1,2,3, --prompt-file / --prompt-ids-file (one prompt a line), or --interactive 1
// (one prompt a line from stdin). Several prompts run as a batch of right-padded prompts (up to
// --batch at once), each sequence at its own position. A sequence stops at end-of-text (not
// printed), after --max-new tokens, or when its context (--max-seq) is full.
// Output on stdout: with --tokenizer the text, else the token ids separated by spaces. A single
// prompt (and each interactive one) streams token by token; a batch prints `[i] completion`
// lines in prompt order when the batch is done. Timings go to stderr.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>
#include "llmc/bpe.h"
#include "llmc/checkpoint.h"
#include "llmc/cpu/gpt2_infer.h"
#include "llmc/formats.h"
#include "llmc/gpt2_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"
#include "llmc/utils.h"

// ------------------------------------------------------------------------------------------------
// flags
struct PromptSource {
    enum Kind { Text, Ids, TextFile, IdsFile } kind;
    std::string value;
};

struct GenConfig {
    std::string model_path;          // --model: a model file or a checkpoint directory (required)
    std::string tokenizer_path;      // --tokenizer: GPTT file: text prompts in, text out ("" = ids)
    std::vector<PromptSource> prompts;  // --prompt, --prompt-ids, --prompt-file, --prompt-ids-file, in order
    int interactive = 0;             // --interactive 1: prompts from stdin, one a line
    int max_new = 128;               // --max-new: tokens generated per prompt at most
    int max_seq = 0;                 // --max-seq: positions per sequence, prompt included (0 = the model's)
    int batch = 8;                   // --batch: prompts run at once
    float temperature = 1.0f;        // --temperature (0 = greedy)
    int top_k = 0;                   // --top-k (0 = off)
    float top_p = 1.0f;              // --top-p (1 = off)
    uint64_t seed = 1337;            // --seed
    int eot = -2;                    // --eot: the stop token (-1 = none; -2 = the tokenizer's, else GPT-2's 50256)
    std::string force_ids;           // --force-ids: teacher forcing, the tokens fed after the prompt
    std::string dump_logits;         // --dump-logits: fp32 (steps, V) of the logits each token came from
};

static void parse_gen_args(int argc, char** argv, GenConfig& g) {
    FlagParser p("generate_cpu",
                 "Generates text from a model on the CPU with a KV cache (fp32). Example:\n"
                 "  build/generate_cpu --model out/d12/ --tokenizer data/gpt2_tokenizer.bin --prompt \"To be, or not\"\n"
                 "      --max-new 64 --temperature 0.8 --top-k 40");
    p.add_string("--model", "PATH", &g.model_path, "a model .bin, or a checkpoint directory (its newest complete "
                 "checkpoint's model.bin) (required)");
    p.add_string("--tokenizer", "FILE", &g.tokenizer_path, "GPTT tokenizer (data/gpt2_tokenizer.bin): encodes --prompt "
                 "text with GPT-2's BPE and prints text (default: print token ids)");
    auto add_prompt = [&](const char* name, const char* metavar, PromptSource::Kind kind, const char* help) {
        p.add({name, metavar, help, [&g, kind](const char* s) -> std::string {
                   g.prompts.push_back({kind, s});
                   return "";
               }});
    };
    add_prompt("--prompt", "TEXT", PromptSource::Text, "a text prompt (needs --tokenizer; \"<|endoftext|>\" in it is the "
               "end-of-text token); repeat for a batch");
    add_prompt("--prompt-ids", "IDS", PromptSource::Ids, "a prompt as token ids, separated by commas or spaces; repeat "
               "for a batch");
    add_prompt("--prompt-file", "FILE", PromptSource::TextFile, "text prompts, one a line (blank lines skipped)");
    add_prompt("--prompt-ids-file", "FILE", PromptSource::IdsFile, "prompts as token ids, one prompt a line (blank "
               "lines skipped)");
    p.add_int("--interactive", &g.interactive, {0, 1}, "1 = after any prompts above, read prompts from stdin, one a "
              "line (text with --tokenizer, else ids), until end of input");
    p.add_int("--max-new", &g.max_new, {1, 1e9}, "new tokens per prompt at most");
    p.add_int("--max-seq", &g.max_seq, {0, 1 << 24}, "positions per sequence, prompt included: sizes the KV cache "
              "(0 = the model's max_seq_len)");
    p.add_int("--batch", &g.batch, {1, 1 << 16}, "prompts generated at once");
    p.add_float("--temperature", &g.temperature, {0, 100}, "sampling temperature; 0 = greedy");
    p.add_int("--top-k", &g.top_k, {0, 1e6}, "sample from the k most likely tokens only (0 = all)");
    p.add({"--top-p", "X", "sample from the most likely tokens that hold mass p (nucleus), p in (0, 1] (default 1 = all)",
           [&g](const char* s) -> std::string {
               float v;
               if (!parse_float(s, &v)) return std::string("'") + s + "' is not a number";
               if (!(v > 0.0f && v <= 1.0f)) return std::string("must be in (0, 1], got ") + s;
               g.top_p = v;
               return "";
           }});
    p.add_uint64("--seed", &g.seed, "seed of the sampling (prompt i of a batch draws from its own stream)");
    p.add({"--eot", "ID", "the end-of-text token that stops a sequence; -1 = none (default: the tokenizer's, else "
           "50256 for a GPT-2 whose vocabulary has it, else none)", [&g](const char* s) -> std::string {
               int64_t v;
               if (!parse_int64(s, &v) || v < -1 || v >= (1 << 24)) return std::string("'") + s + "' is not -1 or a token id";
               g.eot = (int)v;
               return "";
           }});
    p.add_string("--force-ids", "IDS", &g.force_ids, "teacher forcing (one prompt): feed these tokens after the prompt "
                 "instead of the sampled ones, and stop after them");
    p.add_string("--dump-logits", "FILE", &g.dump_logits, "write the fp32 logits (steps, V) each new token was drawn "
                 "from (one prompt)");
    p.parse(argc, argv);
    if (g.model_path.empty()) fail("--model: required (a model .bin or a checkpoint directory)");
    if (g.prompts.empty() && !g.interactive)
        fail("no prompt: give --prompt, --prompt-ids, --prompt-file, --prompt-ids-file or --interactive 1");
}

// ------------------------------------------------------------------------------------------------
// the model and the prompts
// A model file, or the model.bin of the newest complete checkpoint in a directory.
static std::string resolve_model_path(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) fail("--model %s: cannot open (%s)", path.c_str(), strerror(errno));
    if (!S_ISDIR(st.st_mode)) return path;
    if (!file_exists((path + "/DONE").c_str()) && list_checkpoints(path).empty())
        fail("--model %s: a directory without a complete checkpoint (step_NNNNNNNN/ with DONE) in it", path.c_str());
    return checkpoint_find(path) + "/model.bin";
}

// The ids of "1,2,3" or "1 2 3" into *out; returns why not ("" on success).
static std::string parse_ids(const std::string& s, std::vector<int>* out) {
    out->clear();
    size_t i = 0;
    while (i < s.size()) {
        if (s[i] == ',' || isspace((unsigned char)s[i])) { i++; continue; }
        size_t j = i;
        while (j < s.size() && s[j] != ',' && !isspace((unsigned char)s[j])) j++;
        const std::string word = s.substr(i, j - i);
        int64_t v;
        if (!parse_int64(word.c_str(), &v) || v < 0 || v >= (1 << 24)) return "'" + word + "' is not a token id";
        out->push_back((int)v);
        i = j;
    }
    return "";
}

struct Prompt {
    std::vector<int> ids;
    std::string origin;  // where it came from, for messages: "--prompt-ids 1,2", "FILE line 3"
};

class PromptReader {
  public:
    PromptReader(BpeEncoder* bpe, int V, int max_seq) : bpe_(bpe), V_(V), max_seq_(max_seq) {}

    // The ids of one prompt (text, or ids when `as_ids`), checked; "" on success, else why not.
    std::string make(const std::string& line, bool as_ids, const std::string& origin, Prompt* out) const {
        out->origin = origin;
        if (as_ids) {
            std::string why = parse_ids(line, &out->ids);
            if (!why.empty()) return origin + ": " + why;
        } else {
            if (!bpe_) return origin + ": a text prompt needs --tokenizer (the BPE encoder reads its vocabulary); "
                              "or give token ids with --prompt-ids";
            out->ids = bpe_->encode(line, true);
        }
        if (out->ids.empty()) return origin + ": empty prompt";
        for (int id : out->ids)
            if (id >= V_)
                return origin + ": token id " + std::to_string(id) + " is out of range for the model's vocabulary of " +
                       std::to_string(V_);
        if ((int)out->ids.size() > max_seq_)
            return origin + ": " + std::to_string(out->ids.size()) + " tokens, longer than the context of " +
                   std::to_string(max_seq_) + " positions (--max-seq, at most the model's max_seq_len)";
        return "";
    }

    // Every prompt of the command line, in order; fails on the first bad one.
    std::vector<Prompt> read_all(const std::vector<PromptSource>& sources) const {
        std::vector<Prompt> all;
        for (const PromptSource& s : sources) {
            if (s.kind == PromptSource::Text || s.kind == PromptSource::Ids) {
                const bool ids = s.kind == PromptSource::Ids;
                all.emplace_back();
                // the flag and its value (cut at 40 bytes) name the prompt in messages
                const std::string shown = s.value.size() > 40 ? s.value.substr(0, 40) + "..." : s.value;
                const std::string origin = std::string(ids ? "--prompt-ids" : "--prompt") + " \"" + shown + "\"";
                std::string why = make(s.value, ids, origin, &all.back());
                if (!why.empty()) fail("%s", why.c_str());
                continue;
            }
            const char* flag = s.kind == PromptSource::TextFile ? "--prompt-file" : "--prompt-ids-file";
            UniqueFile f(fopen(s.value.c_str(), "rb"));
            if (!f) fail("%s %s: cannot open (%s)", flag, s.value.c_str(), strerror(errno));
            std::string line;
            size_t before = all.size();
            for (int lineno = 1, ch = 0; ch != EOF; lineno++) {
                line.clear();
                while ((ch = fgetc(f.get())) != EOF && ch != '\n') line += (char)ch;
                if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
                all.emplace_back();
                const std::string origin = std::string(flag) + " " + s.value + " line " + std::to_string(lineno);
                std::string why = make(line, s.kind == PromptSource::IdsFile, origin, &all.back());
                if (!why.empty()) fail("%s", why.c_str());
            }
            if (all.size() == before) fail("%s %s: no prompt in it (every line is blank)", flag, s.value.c_str());
        }
        return all;
    }

  private:
    BpeEncoder* bpe_;
    int V_, max_seq_;
};

// ------------------------------------------------------------------------------------------------
// generation
double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Sampling {
    float temperature, top_p;
    int top_k, eot;
    int max_new;
    const std::vector<int>* force;  // teacher forcing: these tokens instead of the sampled ones
    FILE* dump;                     // the logits of each step (sequence 0), or nullptr
};

struct Timings {
    double prefill_s = 0, decode_s = 0;
    long prefill_tokens = 0, decode_steps = 0, new_tokens = 0;
};

// Prints token ids or text; `first` says whether a separator goes before an id.
static void print_token(const Tokenizer* tok, int id, bool first) {
    if (tok) tok->print_token(id);
    else printf(first ? "%d" : " %d", id);
}

// Generates after prompts[0..B) at once; each sequence b draws from rngs[b]. With `stream` (B = 1)
// each token is printed as it comes, else the completions are returned for the caller to print.
static std::vector<std::vector<int>> generate(GPT2Infer& m, const std::vector<const Prompt*>& prompts, const Sampling& s,
                                              std::vector<Rng>& rngs, const Tokenizer* tok, bool stream, Timings& tm) {
    const int B = (int)prompts.size(), V = m.config.vocab_size, Vp = m.config.padded_vocab_size;
    int T = 0;
    for (const Prompt* p : prompts) T = std::max(T, (int)p->ids.size());
    std::vector<int> tokens((size_t)B * T, 0), lengths(B);
    for (int b = 0; b < B; b++) {
        lengths[b] = (int)prompts[b]->ids.size();
        std::copy(prompts[b]->ids.begin(), prompts[b]->ids.end(), tokens.begin() + (size_t)b * T);
    }
    double t0 = seconds_now();
    const float* logits = gpt2_prefill(m, tokens.data(), lengths.data(), B, T);
    tm.prefill_s += seconds_now() - t0;
    for (int len : lengths) tm.prefill_tokens += len;

    std::vector<std::vector<int>> out(B);
    std::vector<char> done(B, 0);
    std::vector<int> next(B), pos(B);
    for (;;) {
        bool any = false;
        for (int b = 0; b < B; b++) {
            pos[b] = -1;  // finished sequences stay idle while the others decode
            if (done[b]) continue;
            const float* row = logits + (size_t)b * Vp;  // the logits after its last position
            const int n = (int)out[b].size(), at = lengths[b] + n;  // the new token's position
            const int id = s.force ? (*s.force)[n] : sample_token(row, V, s.temperature, rngs[b], s.top_k, s.top_p);
            if (s.dump && b == 0) fwrite_or_fail(row, sizeof(float), V, s.dump, "--dump-logits");
            out[b].push_back(id);
            tm.new_tokens++;
            if (stream && id != s.eot) {
                print_token(tok, id, n == 0);
                fflush(stdout);
            }
            done[b] = id == s.eot || n + 1 == s.max_new || (s.force && n + 1 == (int)s.force->size()) ||
                      at >= m.max_seq;  // the context is full: the token is output, never fed
            if (!done[b]) {
                next[b] = id;
                pos[b] = at;
                any = true;
            }
        }
        if (!any) break;
        t0 = seconds_now();
        logits = gpt2_decode_step(m, next.data(), pos.data(), B);
        tm.decode_s += seconds_now() - t0;
        tm.decode_steps++;
    }
    if (stream) printf("\n");
    for (std::vector<int>& o : out)
        if (!o.empty() && o.back() == s.eot) o.pop_back();
    return out;
}

// Prints completions[i] of a batch as `[number] completion` lines.
static void print_batch(const Tokenizer* tok, const std::vector<std::vector<int>>& completions, size_t first_number) {
    for (size_t i = 0; i < completions.size(); i++) {
        printf("[%zu] ", first_number + i);
        for (size_t j = 0; j < completions[i].size(); j++) print_token(tok, completions[i][j], j == 0);
        printf("\n");
    }
    fflush(stdout);
}

int main(int argc, char** argv) {
    GenConfig g;
    parse_gen_args(argc, argv, g);
    const std::string model_file = resolve_model_path(g.model_path);
    const GPT2Config c = model_read_info(model_file.c_str()).config;
    const int V = c.vocab_size;
    if (g.max_seq > c.max_seq_len)
        fail("--max-seq %d: longer than the %d positions of %s (its max_seq_len)", g.max_seq, c.max_seq_len,
             model_file.c_str());
    const int max_seq = g.max_seq ? g.max_seq : c.max_seq_len;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<BpeEncoder> bpe;
    if (!g.tokenizer_path.empty()) {
        tok.reset(new Tokenizer(g.tokenizer_path.c_str()));
        if (tok->vocab_size() < V)
            fail("--tokenizer %s: %d tokens, the model's vocabulary has %d", g.tokenizer_path.c_str(),
                 tok->vocab_size(), V);
        bpe.reset(new BpeEncoder(g.tokenizer_path.c_str()));
    }
    if (g.eot >= V) fail("--eot %d: out of range for the model's vocabulary of %d", g.eot, V);
    // the default: the tokenizer's end-of-text where the model can produce it, else GPT-2's 50256
    const int tok_eot = tok && tok->eot_token() < V ? tok->eot_token() : -1;
    const int gpt2_eot = c.architecture == ARCH_GPT2 && V > 50256 ? 50256 : -1;
    const int eot = g.eot != -2 ? g.eot : tok_eot >= 0 ? tok_eot : gpt2_eot;

    const PromptReader reader(bpe.get(), V, max_seq);
    const std::vector<Prompt> prompts = reader.read_all(g.prompts);
    std::vector<int> force;
    if (!g.force_ids.empty()) {
        const std::string why = parse_ids(g.force_ids, &force);
        if (!why.empty()) fail("--force-ids: %s", why.c_str());
        for (int id : force)
            if (id >= V) fail("--force-ids: token id %d is out of range for the model's vocabulary of %d", id, V);
        if (force.empty()) fail("--force-ids: no token ids in '%s'", g.force_ids.c_str());
    }
    if ((!force.empty() || !g.dump_logits.empty()) && (prompts.size() != 1 || g.interactive))
        fail("%s: works with exactly one prompt and without --interactive", force.empty() ? "--dump-logits" : "--force-ids");

    std::vector<float> params(gpt2_num_params(c));
    model_read_fp32(model_file.c_str(), params.data());
    const int B = std::min<int>(g.batch, std::max<int>(1, (int)prompts.size()));
    GPT2Infer m;
    gpt2_infer_build(m, c, params.data(), B, max_seq);
    fprintf(stderr, "model %s: %s L=%d C=%d NH=%d NKV=%d W=%d V=%d; KV cache %d x %d slots (%.1f MiB), batch %d\n",
            model_file.c_str(), c.architecture == ARCH_LLAMA ? "Llama-style" : "GPT-2", c.num_layers, c.channels,
            c.num_heads, c.num_kv_heads, c.window, V, B, m.cache.S,
            2.0 * m.cache.k.size() * sizeof(float) / 1048576.0, B);

    FILE* dump = g.dump_logits.empty() ? nullptr : fopen_or_fail(g.dump_logits.c_str(), "wb");
    const Sampling s{g.temperature, g.top_p, g.top_k, eot, g.max_new, force.empty() ? nullptr : &force, dump};
    Timings tm;
    // prompt i draws from the seed's stream skipped 2^32 draws per prompt: its text does not depend on
    // the batch it runs in
    auto rng_of = [&](size_t i) { return Rng::skip(g.seed, (uint64_t)i << 32); };
    for (size_t first = 0; first < prompts.size(); first += B) {
        std::vector<const Prompt*> batch;
        std::vector<Rng> rngs;
        for (size_t i = first; i < prompts.size() && i < first + B; i++) {
            batch.push_back(&prompts[i]);
            rngs.push_back(rng_of(i));
        }
        const bool stream = prompts.size() == 1;
        std::vector<std::vector<int>> done = generate(m, batch, s, rngs, tok.get(), stream, tm);
        if (!stream) print_batch(tok.get(), done, first + 1);
    }
    if (dump) fclose_or_fail(dump, g.dump_logits.c_str());
    if (g.interactive) {
        // one prompt a line, each streamed; a bad line is reported and skipped
        std::vector<Rng> rngs{rng_of(prompts.size())};
        const bool tty = isatty(STDIN_FILENO);
        std::string line;
        for (long lineno = 1;; lineno++) {
            if (tty) fprintf(stderr, "> ");
            line.clear();
            int ch;
            while ((ch = getchar()) != EOF && ch != '\n') line += (char)ch;
            if (ch == EOF && line.empty()) break;
            Prompt p;
            const std::string why = reader.make(line, !bpe, "stdin line " + std::to_string(lineno), &p);
            if (!why.empty()) {
                fprintf(stderr, "error: %s (skipped)\n", why.c_str());
                continue;
            }
            generate(m, {&p}, s, rngs, tok.get(), true, tm);
        }
    }
    fprintf(stderr, "prefill: %ld tokens in %.1f ms; decode: %ld steps in %.1f ms (%.2f ms a step), %ld new tokens\n",
            tm.prefill_tokens, tm.prefill_s * 1e3, tm.decode_steps, tm.decode_s * 1e3,
            tm.decode_steps ? tm.decode_s * 1e3 / tm.decode_steps : 0.0, tm.new_tokens);
    return 0;
}
