// generate_cpu.cpp: text generation on the CPU with a KV cache (llmc/cpu/model_infer.h), GPT-2 and
// Llama-style models, the CPU twin of generate.cu: the same flags, prompts, errors and output
// (llmc/generate_args.h, one copy for both), the same sampling rule and RNG stream (llmc/sampler.h)
// and cache layout. fp32, OpenMP.
//   make build/generate_cpu
//   build/generate_cpu --model out/d12/ --tokenizer data/gpt2_tokenizer.bin --prompt "To be, or not"
//       --max-new 64 --temperature 0.8 --top-k 40
// A batch of right-padded prompts (up to --batch at once), each sequence at its own position; a
// sequence stops at end-of-text (not printed), after --max-new tokens, or when --max-seq is full.
// Stdout: text with --tokenizer, else token ids; one prompt streams, a batch prints `[i] completion`
// lines when done. Timings go to stderr.
#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>
#include "llmc/bpe.h"
#include "llmc/cpu/model_infer.h"
#include "llmc/formats.h"
#include "llmc/generate_args.h"
#include "llmc/model_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

// ------------------------------------------------------------------------------------------------
// generation
struct Sampling {
    float temperature, top_p;
    int top_k, eot;
    int max_new;
    const std::vector<int>* force;  // teacher forcing: these tokens instead of the sampled ones
    FILE* dump;                     // the logits of each step (sequence 0), or nullptr
};

// Generates after prompts[0..B) at once; each sequence b draws from rngs[b]. With `stream` (B = 1)
// each token is printed as it comes, else the completions are returned for the caller to print.
static std::vector<std::vector<int>> generate(ModelInfer& m, const std::vector<const Prompt*>& prompts, const Sampling& s,
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
    const float* logits = model_prefill(m, tokens.data(), lengths.data(), B, T);
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
        logits = model_decode_step(m, next.data(), pos.data(), B);
        tm.decode_s += seconds_now() - t0;
        tm.decode_steps++;
    }
    if (stream) printf("\n");
    for (std::vector<int>& o : out)
        if (!o.empty() && o.back() == s.eot) o.pop_back();
    return out;
}

int main(int argc, char** argv) {
    GenConfig g;
    parse_gen_args(argc, argv, g, "generate_cpu", false);
    const std::string model_file = resolve_model_path(g.model_path);
    const ModelConfig c = model_read_info(model_file.c_str()).config;
    const int V = c.vocab_size, max_seq = resolve_max_seq(g, c, model_file);
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<BpeEncoder> bpe;
    open_tokenizer(g, V, &tok, &bpe);
    const int eot = resolve_eot(g, tok.get(), c);

    const PromptReader reader(bpe.get(), V, max_seq);
    const std::vector<Prompt> prompts = reader.read_all(g.prompts);
    const std::vector<int> force = read_force_ids(g, V, prompts.size());

    std::vector<float> params(model_num_params(c));
    model_read_fp32(model_file.c_str(), params.data());
    const int B = std::min<int>(g.batch, std::max<int>(1, (int)prompts.size()));
    ModelInfer m;
    model_infer_build(m, c, params.data(), B, max_seq);
    fprintf(stderr, "model %s: %s L=%d C=%d NH=%d NKV=%d W=%d V=%d; KV cache %d x %d slots (%.1f MiB), batch %d\n",
            model_file.c_str(), c.architecture == ARCH_LLAMA ? "Llama-style" : "GPT-2", c.num_layers, c.channels,
            c.num_heads, c.num_kv_heads, c.window, V, B, m.cache.S,
            2.0 * m.cache.k.size() * sizeof(float) / 1048576.0, B);

    FILE* dump = g.dump_logits.empty() ? nullptr : fopen_or_fail(g.dump_logits.c_str(), "wb");
    const Sampling s{g.temperature, g.top_p, g.top_k, eot, g.max_new, force.empty() ? nullptr : &force, dump};
    Timings tm;
    const int status = run_prompts(g, prompts, B, reader, bpe != nullptr, tok.get(),
                [&](const std::vector<const Prompt*>& batch, std::vector<Rng>& rngs, bool stream) {
                    return generate(m, batch, s, rngs, tok.get(), stream, tm);
                });
    if (dump) fclose_or_fail(dump, g.dump_logits.c_str());
    print_timings(tm);
    return status;
}
