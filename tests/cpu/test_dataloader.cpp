// test_dataloader: checks llmc/dataloader.h on small shards written to a temp folder.
//   - ranks 0..3 of 4 together take every window of an epoch exactly once, in lockstep;
//   - without shuffle the windows come in file order; inputs/targets are the right tokens;
//   - the shuffle is a function of the seed: same seed same batches, another seed other batches,
//     and each epoch has a new order;
//   - save_state/load_state resume with exactly the next batch, across epoch boundaries too;
//   - token widths: a uint32 shard (ids over 65535) gives the same batches as a uint16 one, the two
//     widths mix in one loader, a hand-built version-1 shard and a version-2 uint16 shard read;
//   - vocabularies: shards of two in one pattern are refused; check_data_vocab (the trainers' rule)
//     refuses a shard whose header's vocab_size is not the model's (or --data-vocab's);
//   - each bad input (truncated shard, wrong magic, too few tokens, a token id >= vocab, a bad
//     bytes_per_token field, no file matching, mismatched resume state, bad eval file) exits 1 with a
//     message naming the file:
//     those run in a forked child whose stderr and exit status the parent checks;
//   - EvalLoader rows, masks, labels and rank slicing on a hand-built eval file.
// With --eval-rows FILE B T it instead prints an eval file's rows as JSON lines, for the Python
// test that checks C++ reads what scripts/data/hellaswag.py writes.
// Prints one line per check; exits 1 if any failed.
#include <sys/wait.h>
#include <unistd.h>
#include <functional>
#include <map>
#include <set>
#include "llmc/dataloader.h"

static int g_failed = 0, g_passed = 0;

static void check(bool ok, const std::string& what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    fflush(stdout);  // a later crash keeps the lines so far
    (ok ? g_passed : g_failed)++;
}

// Runs `body` in a child; passes if it exits 1 and its stderr holds every string of `want`.
static void check_fails(const std::string& what, const std::function<void()>& body,
                        const std::vector<std::string>& want) {
    int fds[2];
    if (pipe(fds) != 0) fail("pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        body();
        _exit(0);  // no error: the parent reports the check as failed
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, n);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    for (const std::string& w : want) ok = ok && err.find(w) != std::string::npos;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    check(ok, what + "  [" + err + "]");
}

static std::string g_dir;
static std::string path_in(const std::string& name) { return g_dir + "/" + name; }

static void write_raw(const std::string& path, const void* data, size_t n) {
    FILE* f = fopen_or_fail(path.c_str(), "wb");
    fwrite_or_fail(data, 1, n, f, path.c_str());
    fclose_or_fail(f, path.c_str());
}

static std::string read_raw(const std::string& path) {
    FILE* f = fopen_or_fail(path.c_str(), "rb");
    std::string s(file_size_or_fail(path.c_str()), '\0');
    fread_or_fail(&s[0], 1, s.size(), f, path.c_str());
    fclose(f);
    return s;
}

// ---------------------------------------------------------------- shard fixture
// Shards whose tokens count up through the whole set (token at global position p is p), so a
// batch's first input names the shard and window it came from. Vocab 65536 keeps every id valid.
constexpr int B = 2, T = 8, BT = B * T, VOCAB = 65536;
// windows per shard: 5 + 3 + 7 + 1 = 16 = 4 ranks x 4; +1 for the target, + a tail that no whole
// window covers (it must never show up)
static const int WINDOWS[] = {5, 3, 7, 1};
static const int TAILS[] = {1, 9, 0, 15};
constexpr int NSHARDS = 4, TOTAL_WINDOWS = 16;
static std::map<int, std::pair<int, int>> g_window_of_first_token;  // first token -> (shard, window)

static void write_fixture_shards() {
    int next = 0;
    for (int s = 0; s < NSHARDS; s++) {
        int n = WINDOWS[s] * BT + 1 + TAILS[s];
        std::vector<int> tok(n);
        for (int i = 0; i < n; i++) tok[i] = next + i;
        for (int w = 0; w < WINDOWS[s]; w++) g_window_of_first_token[next + w * BT] = {s, w};
        next += n;
        char name[64];
        snprintf(name, sizeof name, "good_%03d.bin", s);
        shard_write(path_in(name).c_str(), tok.data(), n, VOCAB);
    }
}
static const std::string GOOD = "good_*.bin";

// The windows (by first token) a loader yields over `n` batches; -1 marks a malformed batch.
static std::vector<int> take(DataLoader& dl, int64_t n) {
    std::vector<int> firsts;
    for (int64_t i = 0; i < n; i++) {
        dl.next_batch();
        const int* in = dl.inputs();
        const int* tg = dl.targets();
        bool ok = g_window_of_first_token.count(in[0]) > 0;
        for (int j = 0; j < BT; j++) ok = ok && in[j] == in[0] + j && tg[j] == in[0] + j + 1;
        firsts.push_back(ok ? in[0] : -1);
    }
    return firsts;
}

static void test_rank_coverage() {
    for (bool shuffle : {false, true}) {
        const char* mode = shuffle ? "shuffled" : "in order";
        std::vector<DataLoader*> ranks;
        for (int r = 0; r < 4; r++) ranks.push_back(new DataLoader(path_in(GOOD).c_str(), B, T, r, 4, VOCAB, 7, shuffle));
        check(ranks[0]->num_windows() == TOTAL_WINDOWS / 4 && ranks[3]->num_windows() == TOTAL_WINDOWS / 4,
              std::string(mode) + ": 4 ranks take 16/4 = 4 windows each per epoch");
        std::vector<std::vector<int>> epoch_orders;
        for (int epoch = 0; epoch < 3; epoch++) {
            std::multiset<int> seen;
            std::vector<int> order;  // interleaved as the ranks walk the epoch's list
            std::vector<std::vector<int>> per_rank;
            for (int r = 0; r < 4; r++) per_rank.push_back(take(*ranks[r], 4));
            for (int i = 0; i < 4; i++)
                for (int r = 0; r < 4; r++) {
                    seen.insert(per_rank[r][i]);
                    order.push_back(per_rank[r][i]);
                }
            bool exact = seen.size() == TOTAL_WINDOWS && !seen.count(-1);
            for (auto& kv : g_window_of_first_token) exact = exact && seen.count(kv.first) == 1;
            check(exact, std::string(mode) + ": epoch " + std::to_string(epoch) +
                             ": ranks 0..3 together cover all 16 windows exactly once, with correct tokens");
            epoch_orders.push_back(order);
        }
        if (!shuffle) {
            std::vector<int> file_order;
            for (auto& kv : g_window_of_first_token) file_order.push_back(kv.first);  // map: ascending
            check(epoch_orders[0] == file_order && epoch_orders[1] == file_order,
                  "in order: every epoch walks the windows in file order");
        } else {
            check(epoch_orders[0] != epoch_orders[1] && epoch_orders[1] != epoch_orders[2],
                  "shuffled: each epoch has a different window order");
            // shard order is shuffled too: the shard of the first window is not always shard 0
            std::set<int> first_shards;
            for (uint64_t seed = 0; seed < 16; seed++) {
                DataLoader dl(path_in(GOOD).c_str(), B, T, 0, 1, VOCAB, seed, true);
                first_shards.insert(g_window_of_first_token[take(dl, 1)[0]].first);
            }
            check(first_shards.size() > 1, "shuffled: the first shard of epoch 0 varies with the seed");
            // both levels reshuffle each epoch: the shard order, and the window order within a shard
            DataLoader one(path_in(GOOD).c_str(), B, T, 0, 1, VOCAB, 3, true);
            std::set<std::vector<int>> shard_orders, shard2_orders;
            for (int epoch = 0; epoch < 6; epoch++) {
                std::vector<int> shards, shard2;
                for (int f : take(one, TOTAL_WINDOWS)) {
                    auto sw = g_window_of_first_token[f];
                    if (shards.empty() || shards.back() != sw.first) shards.push_back(sw.first);
                    if (sw.first == 2) shard2.push_back(sw.second);
                }
                shard_orders.insert(shards);
                shard2_orders.insert(shard2);
            }
            check(shard_orders.size() > 1 && shard2_orders.size() > 1,
                  "shuffled: over 6 epochs both the shard order and shard 2's window order change");
        }
        for (DataLoader* d : ranks) delete d;
    }
    // a world size that does not divide the windows: 16 / 3 = 5 per rank, 15 distinct windows used
    std::set<int> seen;
    bool distinct = true;
    for (int r = 0; r < 3; r++) {
        DataLoader dl(path_in(GOOD).c_str(), B, T, r, 3, VOCAB, 1, true);
        for (int f : take(dl, dl.num_windows())) distinct = distinct && f >= 0 && seen.insert(f).second;
    }
    check(distinct && seen.size() == 15, "3 ranks: 5 windows each, 15 distinct, at most world_size-1 unused");
}

static void test_seed_determinism() {
    DataLoader a(path_in(GOOD).c_str(), B, T, 1, 2, VOCAB, 1234, true);
    DataLoader b(path_in(GOOD).c_str(), B, T, 1, 2, VOCAB, 1234, true);
    DataLoader c(path_in(GOOD).c_str(), B, T, 1, 2, VOCAB, 1235, true);
    std::vector<int> sa = take(a, 40), sb = take(b, 40), sc = take(c, 40);
    check(sa == sb, "same seed: identical batches over 5 epochs");
    check(sa != sc, "seed 1234 vs 1235: different batches");
    a.reset();
    check(take(a, 40) == sa, "reset(): the same batches again from epoch 0");
}

static void test_resume() {
    for (int stop : {0, 3, 8, 11}) {  // 8 = the boundary between epochs 1 and 2 (4 batches per epoch)
        DataLoader a(path_in(GOOD).c_str(), B, T, 2, 4, VOCAB, 99, true);
        take(a, stop);
        int64_t state[16];
        a.save_state(state);
        std::vector<int> want = take(a, 10);
        DataLoader b(path_in(GOOD).c_str(), B, T, 2, 4, VOCAB, 99, true);
        take(b, 5);  // a used loader must jump, too
        b.load_state(state);
        check(take(b, 10) == want, "resume after " + std::to_string(stop) + " batches: the next 10 batches match");
    }
    // no state hides outside save_state (e.g. a cached order surviving an epoch change): one loader
    // run for 6 epochs matches, batch for batch, a fresh loader resumed before every batch
    {
        DataLoader run(path_in(GOOD).c_str(), B, T, 0, 1, VOCAB, 3, true);
        bool same = true;
        for (int i = 0; i < 6 * TOTAL_WINDOWS; i++) {
            int64_t st[16];
            run.save_state(st);
            DataLoader fresh(path_in(GOOD).c_str(), B, T, 0, 1, VOCAB, 3, true);
            fresh.load_state(st);
            same = same && take(fresh, 1) == take(run, 1);
        }
        check(same, "6 epochs: a running loader and a fresh one resumed before each batch agree");
    }
    // the state is rank-independent: rank 0 saves, rank 3 resumes where rank 3 would be
    DataLoader r0(path_in(GOOD).c_str(), B, T, 0, 4, VOCAB, 5, true), r3(path_in(GOOD).c_str(), B, T, 3, 4, VOCAB, 5, true);
    take(r0, 6);
    take(r3, 6);
    int64_t state[16];
    r0.save_state(state);
    DataLoader r3b(path_in(GOOD).c_str(), B, T, 3, 4, VOCAB, 5, true);
    r3b.load_state(state);
    check(take(r3b, 6) == take(r3, 6), "rank 3 resumes from rank 0's saved state");
    check_fails("resume with another B is refused",
                [&] {
                    DataLoader d(path_in(GOOD).c_str(), 1, T, 0, 4, VOCAB, 5, true);
                    d.load_state(state);
                },
                {GOOD, "B = 2", "this run has 1"});
    int64_t bad[16];
    memcpy(bad, state, sizeof bad);
    bad[2] = 1000;
    check_fails("resume state with an impossible position is refused",
                [&] {
                    DataLoader d(path_in(GOOD).c_str(), B, T, 0, 4, VOCAB, 5, true);
                    d.load_state(bad);
                },
                {GOOD, "out of range"});
}

// ---------------------------------------------------------------- bad shards
static void test_bad_shards() {
    std::string good = read_raw(path_in("good_000.bin"));  // 5 windows, 82 tokens
    auto loader = [](const std::string& pattern, int vocab) {
        return [pattern, vocab] {
            DataLoader d(path_in(pattern).c_str(), B, T, 0, 1, vocab, 0, false);
            d.next_batch();
        };
    };
    std::string s = good.substr(0, good.size() - 2);
    write_raw(path_in("truncated.bin"), s.data(), s.size());
    check_fails("truncated shard", loader("truncated.bin", VOCAB), {"truncated.bin", "truncated"});
    s = good;
    memcpy(&s[0], "GPTM", 4);
    write_raw(path_in("magic.bin"), s.data(), s.size());
    check_fails("shard with a model's magic", loader("magic.bin", VOCAB), {"magic.bin", "model checkpoint, not a token shard"});
    memcpy(&s[0], "ABCD", 4);
    write_raw(path_in("magic2.bin"), s.data(), s.size());
    check_fails("shard with an unknown magic", loader("magic2.bin", VOCAB), {"magic2.bin", "bad magic"});
    std::vector<int> tok(BT, 1);  // one token short of a window
    shard_write(path_in("short.bin").c_str(), tok.data(), BT, VOCAB);
    check_fails("shard with fewer tokens than one window", loader("short.bin", VOCAB),
                {"short.bin", "16 tokens, fewer than one window of B*T+1 = 17"});
    tok.assign(3 * BT + 1, 5);
    tok[2 * BT + 3] = 50257;
    shard_write(path_in("badid.bin").c_str(), tok.data(), tok.size(), 50257);
    check_fails("token id >= the model's and the header's vocab_size", loader("badid.bin", 50257),
                {"badid.bin", "token id 50257 at token offset 35 is >= vocab_size 50257"});
    shard_write(path_in("badid2.bin").c_str(), tok.data(), tok.size(), 1000);  // header says ids < 1000
    check_fails("token id >= the shard header's vocab_size", loader("badid2.bin", 50257),
                {"badid2.bin", "token id 50257 at token offset 35 is >= vocab_size 1000", "header"});
    shard_write(path_in("bigvocab.bin").c_str(), tok.data(), tok.size(), VOCAB);  // header 65536 > the model's
    check_fails("a shard of a larger vocabulary than the model's", loader("bigvocab.bin", 50257),
                {"bigvocab.bin", "vocab_size 65536 (its header), larger than the model's vocab_size 50257"});
    // a bad id in the second shard of a pattern is found when the loader is built, not when a batch reaches it
    std::vector<int> fine(3 * BT + 1, 5);
    shard_write(path_in("twoid_000.bin").c_str(), fine.data(), fine.size(), 50257);
    shard_write(path_in("twoid_001.bin").c_str(), tok.data(), tok.size(), 50257);
    check_fails("token id >= vocab_size in the second shard, found at construction",
                [] { DataLoader d(path_in("twoid_*.bin").c_str(), B, T, 0, 1, 50257, 0, false); },
                {"twoid_001.bin", "token id 50257 at token offset 35 is >= vocab_size 50257"});
    check_fails("no file matches the pattern", loader("nothing_*.bin", VOCAB), {"nothing_*.bin", "no files match"});
    check_fails("bad rank", [] { DataLoader d(path_in(GOOD).c_str(), B, T, 4, 4, VOCAB, 0, false); },
                {"rank 4", "world_size = 4"});
    check_fails("more ranks than windows",
                [] { DataLoader d(path_in(GOOD).c_str(), B, T, 0, 17, VOCAB, 0, false); },
                {GOOD, "16 windows", "world_size = 17"});
}

// ---------------------------------------------------------------- token widths
// A shard of `tok` with a hand-made header: any version and bytes_per_token (payload in that width).
static void write_shard_raw(const std::string& path, int64_t version, int64_t width, int64_t vocab,
                            const std::vector<int>& tok) {
    FileHeader hd = {};
    hd.h[0] = MAGIC_SHARD; hd.h[1] = version; hd.h[2] = (int64_t)tok.size(); hd.h[3] = width; hd.h[4] = vocab;
    std::string bytes((const char*)hd.h, HEADER_BYTES);
    for (int t : tok) {
        uint32_t v = (uint32_t)t;
        bytes.append((const char*)&v, width == 4 ? 4 : 2);  // little-endian host
    }
    write_raw(path, bytes.data(), bytes.size());
}

static int64_t header_slot_of(const std::string& path, int slot) {
    std::string s = read_raw(path);
    int64_t v;
    memcpy(&v, s.data() + 8 * slot, 8);
    return v;
}

// Version-3 shards: each batch's mask is the mask of its targets (token i's value, i = the target's
// offset in the shard), in shuffled order, for uint16 and uint32 ids; unmasked shards give all ones.
static void test_loss_mask() {
    bool ok = true;
    int ones = 0;
    for (int s = 0; s < 2; s++) {
        const int n = (5 + s) * BT + 1 + s, vocab = s ? 200000 : VOCAB;
        std::vector<int> tok(n);
        std::vector<uint8_t> mask(n);
        for (int i = 0; i < n; i++) {
            tok[i] = (int)(((int64_t)i * 7919 + s * 100003) % vocab);
            mask[i] = (uint8_t)(tok[i] % 3 == 0);
        }
        const std::string name = path_in(s ? "masked32.bin" : "masked16.bin");
        shard_write(name.c_str(), tok.data(), n, vocab, mask.data());
        ok = ok && header_slot_of(name, 1) == 3 && header_slot_of(name, 3) == (s ? 4 : 2) && header_slot_of(name, 5) == 1;
        DataLoader dl(name.c_str(), B, T, 0, 1, vocab, 7, true);
        ok = ok && dl.has_mask();
        for (int b = 0; b < 12; b++) {
            dl.next_batch();
            for (int j = 0; j < BT; j++) {
                ok = ok && dl.mask()[j] == (dl.targets()[j] % 3 == 0);
                ones += dl.mask()[j];
            }
        }
    }
    check(ok && ones > 0 && ones < 24 * BT, "masked shards: each batch's mask is its targets' (shuffled, uint16 and uint32)");
    DataLoader plain(path_in(GOOD).c_str(), B, T, 0, 1, VOCAB, 7, true);
    plain.next_batch();
    check(!plain.has_mask() && std::all_of(plain.mask(), plain.mask() + BT, [](int m) { return m == 1; }),
          "unmasked shards: has_mask() false, the mask all ones");
}

static void test_token_widths() {
    // the same token sequence at two offsets: small (uint16) and shifted past 65535 (uint32)
    const int n = 4 * BT + 1, SHIFT = 100000, WIDE_VOCAB = 200000;
    std::vector<int> small(n), wide(n);
    for (int i = 0; i < n; i++) {
        small[i] = (i * 37) % 1000;
        wide[i] = small[i] + SHIFT;
    }
    shard_write(path_in("w16_000.bin").c_str(), small.data(), n, 1000);
    shard_write(path_in("w32_000.bin").c_str(), wide.data(), n, WIDE_VOCAB);
    check(header_slot_of(path_in("w16_000.bin"), 1) == 1 && header_slot_of(path_in("w16_000.bin"), 3) == 2,
          "vocab 1000: shard_write writes version 1, 2 bytes per token (as earlier builds)");
    check(header_slot_of(path_in("w32_000.bin"), 1) == 2 && header_slot_of(path_in("w32_000.bin"), 3) == 4 &&
              file_size_or_fail(path_in("w32_000.bin").c_str()) == HEADER_BYTES + 4 * n,
          "vocab 200000: shard_write writes version 2, 4 bytes per token");
    DataLoader a(path_in("w16_000.bin").c_str(), B, T, 0, 1, 1000, 3, true);
    DataLoader b(path_in("w32_000.bin").c_str(), B, T, 0, 1, WIDE_VOCAB, 3, true);
    bool same = true;
    for (int i = 0; i < 10; i++) {
        a.next_batch();
        b.next_batch();
        for (int j = 0; j < BT; j++)
            same = same && b.inputs()[j] == a.inputs()[j] + SHIFT && b.targets()[j] == a.targets()[j] + SHIFT;
    }
    check(same, "uint32 shard: the batches of the uint16 shard, every id + 100000 (above 65535)");
    // the two widths in one loader, of one vocabulary (a hand-built uint32 shard of vocab 1000)
    std::vector<int> other(n);
    for (int i = 0; i < n; i++) other[i] = (i * 53) % 1000;
    shard_write(path_in("mixed_000.bin").c_str(), small.data(), n, 1000);
    write_shard_raw(path_in("mixed_001.bin"), 2, 4, 1000, other);
    DataLoader m(path_in("mixed_*.bin").c_str(), B, T, 0, 1, 1000, 0, false);
    bool mixed = m.num_windows() == 8 && m.header_vocab() == 1000;
    for (int w = 0; w < 8; w++) {
        m.next_batch();
        const std::vector<int>& src = w < 4 ? small : other;
        for (int j = 0; j < BT; j++)
            mixed = mixed && m.inputs()[j] == src[(w % 4) * BT + j] && m.targets()[j] == src[(w % 4) * BT + j + 1];
    }
    check(mixed, "a uint16 and a uint32 shard in one loader: 8 windows in file order, right ids");
    // shards of two vocabularies (two tokenizers) in one pattern are refused, even when the ids fit
    shard_write(path_in("twovocab_000.bin").c_str(), small.data(), n, 1000);
    shard_write(path_in("twovocab_001.bin").c_str(), wide.data(), n, WIDE_VOCAB);
    check_fails("shards of two vocabularies in one pattern",
                [] { DataLoader d(path_in("twovocab_*.bin").c_str(), B, T, 0, 1, 200000, 0, false); },
                {"twovocab_001.bin: vocab_size 200000 in its header", "twovocab_000.bin", "has 1000",
                 "different tokenizers"});
    // the trainers' rule (check_data_vocab): the header's vocab_size is the model's, or --data-vocab's
    DataLoader d1000(path_in("w16_000.bin").c_str(), B, T, 0, 1, 50257, 0, false);
    check_fails("a shard of a smaller vocabulary than the model's",
                [&] { check_data_vocab(d1000, 0, 50257); },
                {"w16_000.bin: written by a tokenizer of vocab_size 1000", "the model's vocab_size is 50257",
                 "--data-vocab 1000"});
    check_fails("a shard of a larger vocabulary than the model's",
                [&] { check_data_vocab(b, 0, 1000); },
                {"w32_000.bin: written by a tokenizer of vocab_size 200000", "larger than the model's vocab_size 1000"});
    check_fails("a shard of another vocabulary than --data-vocab's",
                [&] { check_data_vocab(d1000, 999, 50257); },
                {"w16_000.bin", "vocab_size 1000", "--data-vocab is 999"});
    check_data_vocab(d1000, 1000, 50257);
    check_data_vocab(a, 0, 1000);
    check(true, "check_data_vocab passes the model's vocab_size and --data-vocab's");
    // older and hand-made headers: version 1 (uint16), version 2 with uint16 ids
    write_shard_raw(path_in("v1.bin"), 1, 2, 1000, small);
    write_shard_raw(path_in("v2_16.bin"), 2, 2, 1000, small);
    for (const char* name : {"v1.bin", "v2_16.bin"}) {
        DataLoader o(path_in(name).c_str(), B, T, 0, 1, 1000, 0, false);
        o.next_batch();
        bool ok = true;
        for (int j = 0; j < BT; j++) ok = ok && o.inputs()[j] == small[j] && o.targets()[j] == small[j + 1];
        check(ok, std::string(name) + ": a hand-built shard of this version reads");
    }
    auto loader = [](const std::string& name, int vocab) {
        return [name, vocab] {
            DataLoader d(path_in(name).c_str(), B, T, 0, 1, vocab, 0, false);
            d.next_batch();
        };
    };
    write_shard_raw(path_in("width3.bin"), 2, 3, 1000, small);
    check_fails("bytes_per_token 3 is refused", loader("width3.bin", 1000),
                {"width3.bin", "bytes_per_token = 3", "must be 2 (uint16) or 4 (uint32)"});
    write_shard_raw(path_in("v1_width4.bin"), 1, 4, WIDE_VOCAB, wide);
    check_fails("a version-1 shard with 4 bytes per token is refused", loader("v1_width4.bin", WIDE_VOCAB),
                {"v1_width4.bin", "bytes_per_token = 4", "version-1 shard holds uint16"});
    write_shard_raw(path_in("v4.bin"), 4, 2, 1000, small);
    check_fails("a shard of a newer version is refused", loader("v4.bin", 1000),
                {"v4.bin", "unsupported version 4", "versions 1 to 3"});
    write_shard_raw(path_in("vocab16.bin"), 2, 2, 70000, small);
    check_fails("a uint16 shard claiming vocab 70000 is refused", loader("vocab16.bin", 1000),
                {"vocab16.bin", "vocab_size = 70000", "[1, 65536]"});
    std::vector<int> bad = wide;
    bad[2 * BT + 3] = WIDE_VOCAB;
    shard_write(path_in("badwide.bin").c_str(), bad.data(), n, WIDE_VOCAB);
    check_fails("uint32 shard: a token id >= the model's vocab_size", loader("badwide.bin", WIDE_VOCAB),
                {"badwide.bin", "token id 200000 at token offset 35 is >= vocab_size 200000"});
    std::string s = read_raw(path_in("w32_000.bin"));
    s.resize(s.size() - 2);  // half a uint32 id short
    write_raw(path_in("w32_trunc.bin"), s.data(), s.size());
    check_fails("uint32 shard: truncated", loader("w32_trunc.bin", WIDE_VOCAB), {"w32_trunc.bin", "truncated"});
}

// ---------------------------------------------------------------- eval loader
// The GPTE payload of `ex` (docs/formats.md): per example label, context length, K completion
// lengths, then the tokens. *max_row gets the longest context + completion.
struct EvalExample {
    int label;
    std::vector<uint16_t> ctx;
    std::vector<std::vector<uint16_t>> ends;
};
static std::vector<uint16_t> eval_payload(const std::vector<EvalExample>& ex, int64_t* max_row) {
    std::vector<uint16_t> payload;
    *max_row = 0;
    for (const EvalExample& e : ex) {
        payload.push_back((uint16_t)e.label);
        payload.push_back((uint16_t)e.ctx.size());
        for (auto& c : e.ends) payload.push_back((uint16_t)c.size());
        payload.insert(payload.end(), e.ctx.begin(), e.ctx.end());
        for (auto& c : e.ends) {
            payload.insert(payload.end(), c.begin(), c.end());
            *max_row = std::max<int64_t>(*max_row, e.ctx.size() + c.size());
        }
    }
    return payload;
}
static void write_eval_file(const std::string& path, int64_t n, int K, int64_t vocab, int64_t max_row,
                            const std::vector<uint16_t>& payload) {
    FileHeader hd = {};
    hd.h[0] = MAGIC_EVAL; hd.h[1] = FORMAT_VERSION; hd.h[2] = n; hd.h[3] = vocab; hd.h[4] = K;
    hd.h[5] = max_row; hd.h[6] = (int64_t)payload.size();
    AtomicFileWriter w(path);
    w.write(hd.h, HEADER_BYTES);
    w.write(payload.data(), payload.size() * 2);
    w.commit();
}
static void write_eval(const std::string& path, const std::vector<EvalExample>& ex, int K, int64_t vocab) {
    int64_t max_row;
    std::vector<uint16_t> payload = eval_payload(ex, &max_row);
    write_eval_file(path, (int64_t)ex.size(), K, vocab, max_row, payload);
}

static void test_eval_loader() {
    // 5 examples of 2 choices; example i: context (100i+1 .. 100i+1+i), completion k: 2 + k tokens
    const int K = 2;
    std::vector<EvalExample> ex;
    for (int i = 0; i < 5; i++) {
        EvalExample e;
        e.label = i % K;
        for (int t = 0; t <= i; t++) e.ctx.push_back((uint16_t)(100 * i + 1 + t));
        for (int k = 0; k < K; k++) {
            std::vector<uint16_t> c;
            for (int t = 0; t < 2 + k; t++) c.push_back((uint16_t)(100 * i + 50 + 10 * k + t));
            e.ends.push_back(c);
        }
        ex.push_back(e);
    }
    std::string path = path_in("eval.bin");
    write_eval(path, ex, K, 1000);  // longest row: 5 + 3 = 8 tokens, so T >= 7
    const int EB = 4, ET = 7;       // 2 examples per batch
    bool rows_ok = true, labels_ok = true, slots_ok = true;
    int batches_ok = 0;
    for (int r = 0; r < 2; r++) {  // rank 0: examples 0, 2, 4; rank 1: 1, 3 (and an empty slot)
        EvalLoader el(path.c_str(), EB, ET, r, 2, 1000);
        batches_ok += el.num_batches() == 2;
        for (int b = 0; b < el.num_batches(); b++) {
            el.next_batch();
            for (int e = 0; e < EB / K; e++) {
                int i = (b * (EB / K) + e) * 2 + r;
                if (i >= 5) {
                    slots_ok = slots_ok && el.labels()[e] == -1;
                    for (int t = 0; t < K * ET; t++) slots_ok = slots_ok && el.mask()[e * K * ET + t] == 0;
                    continue;
                }
                labels_ok = labels_ok && el.labels()[e] == ex[i].label;
                for (int k = 0; k < K; k++) {
                    std::vector<int> row(ex[i].ctx.begin(), ex[i].ctx.end());
                    row.insert(row.end(), ex[i].ends[k].begin(), ex[i].ends[k].end());
                    const int* in = el.inputs() + (e * K + k) * ET;
                    const int* tg = el.targets() + (e * K + k) * ET;
                    const int* m = el.mask() + (e * K + k) * ET;
                    int nctx = (int)ex[i].ctx.size(), n = (int)row.size();
                    for (int t = 0; t < ET; t++) {
                        bool want_mask = t >= nctx - 1 && t < n - 1;
                        rows_ok = rows_ok && in[t] == (t < n ? row[t] : 0) && tg[t] == (t + 1 < n ? row[t + 1] : 0) &&
                                  m[t] == (int)want_mask;
                    }
                }
            }
        }
    }
    check(batches_ok == 2, "eval: 5 examples, 2 ranks, 2 examples per batch -> 2 batches on each rank");
    check(rows_ok, "eval: rows are context + completion, targets shifted by one, mask on completion targets only");
    check(labels_ok && slots_ok, "eval: labels per example; rank 1's missing 4th example is an empty slot (-1)");

    check_fails("eval: T too small for the longest row", [&] { EvalLoader el(path.c_str(), EB, 6, 0, 1, 1000); },
                {"eval.bin", "T = 6 must be at least 7"});
    check_fails("eval: B not a multiple of the choices", [&] { EvalLoader el(path.c_str(), 3, ET, 0, 1, 1000); },
                {"B = 3", "multiple of 2"});
    check_fails("eval: token id >= the model's vocab_size", [&] { EvalLoader el(path.c_str(), EB, ET, 0, 1, 402); },
                {"eval.bin", "token id 402", ">= vocab_size 402"});
    std::vector<EvalExample> bad = ex;
    bad[3].label = 2;
    write_eval(path_in("eval_label.bin"), bad, K, 1000);
    check_fails("eval: label out of range", [&] { EvalLoader el(path_in("eval_label.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"eval_label.bin", "example 3 has label 2"});
    int64_t max_row;
    std::vector<uint16_t> payload = eval_payload(ex, &max_row);
    write_eval_file(path_in("eval_maxrow.bin"), 5, K, 1000, 6, payload);
    check_fails("eval: an example longer than the header's max_row_tokens",
                [&] { EvalLoader el(path_in("eval_maxrow.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"eval_maxrow.bin", "more than max_row_tokens"});
    std::vector<uint16_t> longer = payload;
    longer.insert(longer.end(), {0, 0, 0});
    write_eval_file(path_in("eval_extra.bin"), 5, K, 1000, max_row, longer);
    check_fails("eval: values after the last example",
                [&] { EvalLoader el(path_in("eval_extra.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"eval_extra.bin", "3 unexpected values after the last example"});
    std::vector<uint16_t> shorter(payload.begin(), payload.end() - 1);  // consistent length, short record
    write_eval_file(path_in("eval_short.bin"), 5, K, 1000, max_row, shorter);
    check_fails("eval: the last example's tokens run past the payload",
                [&] { EvalLoader el(path_in("eval_short.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"eval_short.bin", "truncated inside example 4"});
    std::string s = read_raw(path);
    s.resize(s.size() - 2);
    write_raw(path_in("eval_trunc.bin"), s.data(), s.size());
    check_fails("eval: truncated file", [&] { EvalLoader el(path_in("eval_trunc.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"eval_trunc.bin", "truncated"});
    check_fails("eval: a token shard is not an eval file",
                [&] { EvalLoader el(path_in("good_000.bin").c_str(), EB, ET, 0, 1, 1000); },
                {"good_000.bin", "token shard, not an eval file"});
}

// --eval-rows FILE B T: prints every row of every batch of an EvalLoader on FILE as one JSON line,
// so tests/python/test_data_scripts.py can check that the C++ reader sees what hellaswag.py wrote.
static int print_eval_rows(const char* path, int b, int t) {
    EvalLoader el(path, b, t, 0, 1, 65536);
    for (int i = 0; i < el.num_batches(); i++) {
        el.next_batch();
        for (int row = 0; row < b; row++) {
            printf("{\"label\": %d", el.labels()[row / el.num_choices()]);
            const char* names[] = {"inputs", "targets", "mask"};
            const int* arrays[] = {el.inputs(), el.targets(), el.mask()};
            for (int a = 0; a < 3; a++) {
                printf(", \"%s\": [", names[a]);
                for (int j = 0; j < t; j++) printf(j ? ", %d" : "%d", arrays[a][row * t + j]);
                printf("]");
            }
            printf("}\n");
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 5 && strcmp(argv[1], "--eval-rows") == 0) {
        int64_t b, t;
        if (!parse_int64(argv[3], &b) || !parse_int64(argv[4], &t) || b < 1 || t < 1 || b > 4096 || t > 65536)
            fail("--eval-rows FILE B T: B = %s and T = %s must be positive integers", argv[3], argv[4]);
        return print_eval_rows(argv[2], (int)b, (int)t);
    }
    if (argc != 1) fail("usage: %s  (or: %s --eval-rows FILE B T)", argv[0], argv[0]);
    char tmpl[] = "/tmp/test_dataloader_XXXXXX";
    if (!mkdtemp(tmpl)) fail("mkdtemp: %s", strerror(errno));
    g_dir = tmpl;
    write_fixture_shards();
    test_rank_coverage();
    test_seed_determinism();
    test_resume();
    test_bad_shards();
    test_token_widths();
    test_loss_mask();
    test_eval_loader();
    glob_t g;
    if (glob((g_dir + "/*").c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) remove(g.gl_pathv[i]);
        globfree(&g);
    }
    rmdir(g_dir.c_str());
    printf("test_dataloader: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
