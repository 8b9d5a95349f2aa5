// generate_args.h: what the two generators (generate.cu on the GPU, generate_cpu.cpp on the CPU)
// share: their flags, the model path, the prompts (text through the BPE encoder, ids, files), the
// end-of-text default and the output of a finished batch, so they take the same command lines and
// give the same errors. The GPU-only flags (--graph, --check-full, --bench, --bench-prompt, --init,
// --matmul-autotune) are registered only for it; the decode step's kernels are the policy's
// (model_infer.cuh, decode_step_plan), and their alternatives are timed in dev/cuda/decode_step.cu.
#pragma once
#include <sys/stat.h>
#include <unistd.h>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "llmc/bpe.h"
#include "llmc/checkpoint_read.h"
#include "llmc/model_config.h"
#include "llmc/rand.h"
#include "llmc/tokenizer.h"
#include "llmc/flags.h"
#include "llmc/utils.h"

struct PromptSource {
    enum Kind { Text, Ids, TextFile, IdsFile } kind;
    std::string value;
};

struct GenConfig {
    std::string model_path;             // --model: a model file or a checkpoint directory
    std::string tokenizer_path;         // --tokenizer: GPTT file: text prompts in, text out ("" = ids)
    std::vector<PromptSource> prompts;  // --prompt, --prompt-ids, --prompt-file, --prompt-ids-file, in order
    int interactive = 0;                // --interactive 1: prompts from stdin, one a line
    int max_new = 128;                  // --max-new: tokens generated per prompt at most
    int max_seq = 0;                    // --max-seq: positions per sequence, prompt included (0 = the model's)
    int batch = 8;                      // --batch: prompts run at once
    float temperature = 1.0f;           // --temperature (0 = greedy)
    int top_k = 0;                      // --top-k (0 = off)
    float top_p = 1.0f;                 // --top-p (1 = off)
    uint64_t seed = 1337;               // --seed
    int eot = -2;                       // --eot: the stop token (-1 = none; -2 = the tokenizer's, else GPT-2's 50256)
    std::string force_ids;              // --force-ids: teacher forcing, the tokens fed after the prompt
    std::string dump_logits;            // --dump-logits: fp32 (steps, V) of the logits each token came from
    // GPU only
    int graph = 1;                      // --graph: the decode step as one CUDA graph (0 = plain launches)
    int check_full = 0;                 // --check-full 1: each step's logits against a full forward
    int bench = 0;                      // --bench 1: time prefill and decode, print one BENCH_GEN line
    int bench_prompt = 64;              // --bench-prompt: prompt tokens per sequence of --bench
    int matmul_autotune = 1;            // --matmul-autotune: time cuBLASLt's algorithms for the step's matmuls once
    std::string init;                   // --init dN: a fresh random model instead of --model
};

inline void parse_gen_args(int argc, char** argv, GenConfig& g, const char* program, bool gpu) {
    const std::string example = std::string("  build/") + program +
                                " --model out/d12/ --tokenizer data/gpt2_tokenizer.bin --prompt \"To be, or not\"\n"
                                "      --max-new 64 --temperature 0.8 --top-k 40";
    FlagParser p(program, std::string("Generates text from a model ") +
                              (gpu ? "on the GPU with a KV cache (floatX) and a CUDA graph per decode step"
                                   : "on the CPU with a KV cache (fp32)") + ". Example:\n" + example);
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
               float v = 0.0f;
               const std::string why = parse_float(s, &v);
               if (!why.empty()) return why;
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
    if (gpu) {
        p.add_int("--graph", &g.graph, {0, 1}, "1 = capture the decode step once as a CUDA graph and replay it per "
                  "token; 0 = launch its kernels one by one (same tokens)");
        p.add_int("--check-full", &g.check_full, {0, 1}, "1 = debug: compare each step's cached logits with a full "
                  "forward over the same tokens (prints the largest difference, fails past the tolerance)");
        p.add_int("--bench", &g.bench, {0, 1}, "1 = time a batch of --batch random prompts of --bench-prompt tokens "
                  "and --max-new new tokens (no end-of-text stop); prints one BENCH_GEN line");
        p.add_int("--bench-prompt", &g.bench_prompt, {1, 1 << 20}, "prompt tokens per sequence for --bench");
        p.add_int("--matmul-autotune", &g.matmul_autotune, {0, 1}, "1 = before the first prompt, time up to ~28 "
                  "cuBLASLt algorithms (the heuristic's list and split-K versions) for each matmul of a decode step "
                  "that goes through cuBLASLt (more than 8 sequences) and keep the fastest (timed: two "
                  "runs may keep different ones); 0 = the heuristic's first pick, the same every run (same tokens "
                  "up to rounding)");
        p.add_string("--init", "dN", &g.init, "a fresh model from a descriptor (dN: a GPT-2 of N layers, d12 = "
                     "124M; llama:L12,C768,H12,KV4,F2048 a Llama-style one; the trainer's init from --seed) instead "
                     "of --model: --bench and tests need no file");
    }
    p.parse(argc, argv);
    if (g.model_path.empty() && g.init.empty())
        fail("--model: required (a model .bin or a checkpoint directory)");
    if (!g.model_path.empty() && !g.init.empty()) fail("--init: give either --model or --init, not both");
    if (g.prompts.empty() && !g.interactive && !g.bench)
        fail("no prompt: give --prompt, --prompt-ids, --prompt-file, --prompt-ids-file or --interactive 1");
    if (g.bench && (!g.prompts.empty() || g.interactive))
        fail("--bench: makes its own random prompts; give no prompt and no --interactive");
}

// A model file, or the model.bin of the newest complete checkpoint in a directory. A checkpoint's
// model.bin named directly is checked against its DONE (check_checkpoint_model).
inline std::string resolve_model_path(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) fail("--model %s: cannot open (%s)", path.c_str(), strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        check_checkpoint_model(path, "--model");
        return path;
    }
    if (!file_exists((path + "/DONE").c_str()) && list_checkpoints(path).empty())
        fail("--model %s: a directory without a complete checkpoint (step_NNNNNNNN/ with DONE) in it", path.c_str());
    return checkpoint_find(path, "--model") + "/model.bin";
}

// The ids of "1,2,3", "1, 2, 3" or "1 2 3" into *out; returns why not ("" on success). A comma needs an
// id on each side: "1,,2" or a leading or trailing comma is an empty id, not skipped.
inline std::string parse_ids(const std::string& s, std::vector<int>* out) {
    out->clear();
    size_t i = 0;
    bool after_comma = false;  // a comma was the last separator: an id must come next
    int commas = 0;
    while (i < s.size()) {
        if (isspace((unsigned char)s[i])) { i++; continue; }
        if (s[i] == ',') {
            commas++;
            if (out->empty() || after_comma)
                return out->empty() ? "an empty token id before the first comma"
                                    : "an empty token id between commas " + std::to_string(commas - 1) + " and " +
                                          std::to_string(commas);
            after_comma = true;
            i++;
            continue;
        }
        size_t j = i;
        while (j < s.size() && s[j] != ',' && !isspace((unsigned char)s[j])) j++;
        const std::string word = s.substr(i, j - i);
        int64_t v;
        if (!parse_int64(word.c_str(), &v) || v < 0 || v >= (1 << 24)) return "'" + word + "' is not a token id";
        out->push_back((int)v);
        after_comma = false;
        i = j;
    }
    if (after_comma) return "an empty token id after the last comma";
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
    // `offset`: where the line starts in `within` (its file, stdin), to place a byte that is not UTF-8.
    std::string make(const std::string& line, bool as_ids, const std::string& origin, Prompt* out,
                     uint64_t offset = 0, const char* within = "the prompt") const {
        out->origin = origin;
        const size_t bad = as_ids ? std::string::npos : utf8_invalid_offset(line);
        if (bad != std::string::npos) {
            char why[96];
            snprintf(why, sizeof why, ": not UTF-8 text: byte 0x%02x at offset %llu of %s", (unsigned char)line[bad],
                     (unsigned long long)(offset + bad), within);
            return origin + why;
        }
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
            uint64_t line_start = 0;  // the line's byte offset in the file
            for (int lineno = 1, ch = 0; ch != EOF; lineno++, line_start += line.size() + 1) {
                line.clear();
                while ((ch = fgetc(f.get())) != EOF && ch != '\n') line += (char)ch;
                if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
                all.emplace_back();
                const std::string origin = std::string(flag) + " " + s.value + " line " + std::to_string(lineno);
                std::string why =
                    make(line, s.kind == PromptSource::IdsFile, origin, &all.back(), line_start, "the file");
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

// The positions a sequence may use: --max-seq, at most the model's max_seq_len (0 = all of them);
// `source` names the model in the message.
inline int resolve_max_seq(const GenConfig& g, const ModelConfig& c, const std::string& source) {
    if (g.max_seq > c.max_seq_len)
        fail("--max-seq %d: longer than the %d positions of %s (its max_seq_len)", g.max_seq, c.max_seq_len,
             source.c_str());
    return g.max_seq ? g.max_seq : c.max_seq_len;
}

// --tokenizer: its decode table and GPT-2's BPE encoder over the same file (both null without the
// flag); a tokenizer smaller than the model's vocabulary V is refused.
inline void open_tokenizer(const GenConfig& g, int V, std::unique_ptr<Tokenizer>* tok,
                           std::unique_ptr<BpeEncoder>* bpe) {
    if (g.tokenizer_path.empty()) return;
    tok->reset(open_model_tokenizer(g.tokenizer_path, V));
    bpe->reset(new BpeEncoder(g.tokenizer_path.c_str()));
}

// The end-of-text token that stops a sequence: --eot, else the tokenizer's where the model can
// produce it, else GPT-2's 50256 for a GPT-2 whose V has it, else none (-1).
inline int resolve_eot(const GenConfig& g, const Tokenizer* tok, const ModelConfig& c) {
    const int V = c.vocab_size;
    if (g.eot >= V) fail("--eot %d: out of range for the model's vocabulary of %d", g.eot, V);
    const int tok_eot = tok && tok->eot_token() < V ? tok->eot_token() : -1;
    const int gpt2_eot = c.architecture == ARCH_GPT2 && V > 50256 ? 50256 : -1;
    return g.eot != -2 ? g.eot : tok_eot >= 0 ? tok_eot : gpt2_eot;
}

// --force-ids parsed and checked against the vocabulary (empty when not given).
inline std::vector<int> read_force_ids(const GenConfig& g, int V, size_t num_prompts) {
    std::vector<int> force;
    if (!g.force_ids.empty()) {
        const std::string why = parse_ids(g.force_ids, &force);
        if (!why.empty()) fail("--force-ids: %s", why.c_str());
        for (int id : force)
            if (id >= V) fail("--force-ids: token id %d is out of range for the model's vocabulary of %d", id, V);
        if (force.empty()) fail("--force-ids: no token ids in '%s'", g.force_ids.c_str());
    }
    if ((!force.empty() || !g.dump_logits.empty()) && (num_prompts != 1 || g.interactive))
        fail("%s: works with exactly one prompt and without --interactive", force.empty() ? "--dump-logits" : "--force-ids");
    return force;
}

inline double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prints token ids or text; `first` says whether a separator goes before an id.
inline void print_token(const Tokenizer* tok, int id, bool first) {
    if (tok) tok->print_token(id);
    else printf(first ? "%d" : " %d", id);
}

// Prints completions[i] of a batch as `[number] completion` lines.
inline void print_batch(const Tokenizer* tok, const std::vector<std::vector<int>>& completions, size_t first_number) {
    for (size_t i = 0; i < completions.size(); i++) {
        printf("[%zu] ", first_number + i);
        for (size_t j = 0; j < completions[i].size(); j++) print_token(tok, completions[i][j], j == 0);
        printf("\n");
    }
    fflush(stdout);
}

// What both programs time; printed to stderr at the end by print_timings.
struct Timings {
    double prefill_s = 0, decode_s = 0;
    long prefill_tokens = 0, decode_steps = 0, new_tokens = 0;
};

inline void print_timings(const Timings& tm) {
    fprintf(stderr, "prefill: %ld tokens in %.1f ms; decode: %ld steps in %.1f ms (%.2f ms a step), %ld new tokens\n",
            tm.prefill_tokens, tm.prefill_s * 1e3, tm.decode_steps, tm.decode_s * 1e3,
            tm.decode_steps ? tm.decode_s * 1e3 / tm.decode_steps : 0.0, tm.new_tokens);
}

// The prompt loop of both programs: the prompts in batches of B (one prompt alone streams its text, a
// batch prints its completions when done), then (--interactive 1) one streamed prompt a line from
// stdin, a bad line reported and skipped. Prompt i draws from the seed's stream skipped 2^32 draws per
// prompt: its text does not depend on its batch. run(batch, rngs, stream) generates after `batch` and
// returns the completions. Returns the exit status: 1 when every stdin line was refused and nothing
// else ran, else 0.
template <class Run>
inline int run_prompts(const GenConfig& g, const std::vector<Prompt>& prompts, int B, const PromptReader& reader,
                        bool text_prompts, const Tokenizer* tok, Run&& run) {
    auto rng_of = [&](size_t i) { return Rng::skip(g.seed, (uint64_t)i << 32); };
    for (size_t first = 0; first < prompts.size(); first += B) {
        std::vector<const Prompt*> batch;
        std::vector<Rng> rngs;
        for (size_t i = first; i < prompts.size() && i < first + B; i++) {
            batch.push_back(&prompts[i]);
            rngs.push_back(rng_of(i));
        }
        const bool stream = prompts.size() == 1;
        std::vector<std::vector<int>> done = run(batch, rngs, stream);
        if (!stream) print_batch(tok, done, first + 1);
    }
    if (!g.interactive) return 0;
    std::vector<Rng> rngs{rng_of(prompts.size())};
    long skipped = 0, ran = 0;
    const bool tty = isatty(STDIN_FILENO);
    std::string line;
    uint64_t line_start = 0;  // the line's byte offset in stdin
    for (long lineno = 1;; lineno++, line_start += line.size() + 1) {
        if (tty) fprintf(stderr, "> ");
        line.clear();
        int ch;
        while ((ch = getchar()) != EOF && ch != '\n') line += (char)ch;
        if (ch == EOF && line.empty()) break;
        Prompt p;
        const std::string why =
            reader.make(line, !text_prompts, "stdin line " + std::to_string(lineno), &p, line_start, "stdin");
        if (!why.empty()) {
            fprintf(stderr, "error: %s (skipped)\n", why.c_str());
            skipped++;
            continue;
        }
        run(std::vector<const Prompt*>{&p}, rngs, true);
        ran++;
    }
    if (skipped > 0 && ran == 0 && prompts.empty()) {
        fprintf(stderr, "error: no stdin line was a usable prompt (%ld skipped): nothing generated\n", skipped);
        return 1;
    }
    return 0;
}
