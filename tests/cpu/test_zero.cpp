// test_zero: the ZeRO plan and the sharded optimizer state of llmc/zero.h, without processes.
//  - for many parameter counts and world sizes the shards tile [0, n), start on an aligned
//    element, are at most one alignment longer than n / world, and zero_for_each_piece cuts any
//    range along them;
//  - state files written as the shards of world size W (each rank's slice) read back, through
//    zero_read_state, as any slice of any other plan (world sizes 1..5, stages 0..2), element for
//    element, with the master weights; a missing or a foreign shard is refused with its reason;
//  - the data position moves across world sizes when the windows divide, and fails otherwise;
//  - the gradient buckets (zero_buckets) of GPT-2 and Llama layouts at several bucket sizes: every
//    parameter in exactly one range of one bucket, bucket 0 the tensors outside the layers, the
//    others consecutive layers; packed ranges disjoint, inside the buffer and as aligned as in the
//    whole buffer; zero_bucket_grads points at the element the whole buffer's layer slice holds;
//  - ZeRO-2 simulated at world sizes 1-4 with 3 micro-batches (integer gradients, so sums are
//    exact): buffers filled with the owner's shard (zeros only in the first micro-batch, whose
//    reductions must replace every value of the NaN-filled shards), += per rank, pieces reduced to
//    their owners' shards in the backward's order; every shard ends holding the sum over ranks and
//    micro-batches;
//  - --optimizer muon's ownership plan (llmc/cpu/muon.h) of GPT-2 and Llama layouts at world sizes
//    1-4: the matrices tile the Muon tensors (every element in exactly one, nothing else), each has
//    one owner in [0, world), no rank holds more than the largest matrix above any other, and the
//    plan is the same when computed again (each rank computes it alone).
// Run: build/test_zero (a second).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/cpu/muon.h"
#include "llmc/model_config.h"
#include "llmc/zero.h"
#include "tests/cpu/check.h"

static void write_shards(const std::string& dir, int64_t n, int world, int stage) {
    mkdir(dir.c_str(), 0755);
    for (int r = 0; r < world; r++) {
        const ZeroPlan p = zero_plan(n, stage, r, world, 16);
        if (!zero_writes_state(p)) continue;
        const int64_t b = p.opt_begin(), k = p.opt_count();
        std::vector<float> m(k), v(k), master(k);
        for (int64_t i = 0; i < k; i++) m[i] = (float)(b + i), v[i] = (float)(b + i) * 2, master[i] = -(float)(b + i);
        TrainState st;
        st.step = 7;
        st.num_params = k;
        st.loader[2] = 3;
        st.loader[7] = world;
        const bool whole = k == n;
        st.shard_begin = whole ? 0 : b;
        st.total_params = whole ? 0 : n;
        state_write((dir + "/" + zero_state_file_name(p)).c_str(), st, m.data(), v.data(), master.data());
    }
}

// The ZeRO-2 step of llmc/cpu/data_parallel.h and llmc/model_dist.cuh on W simulated ranks: rank r's
// gradient of element i in micro-batch k is grad(r, k, i); returns the shards after `micro` batches.
// The shards start as NaN (they are not zeroed at a step's start: they hold the last step's sums),
// and the first micro-batch copies nothing in from them, so a shard element that no piece of the
// first micro-batch's reductions replaces stays NaN and fails the comparison.
static std::vector<std::vector<float>> simulate_zero2(const ModelConfig& c, int64_t max_elems, int world, int micro) {
    const int64_t n = (int64_t)model_num_params(c);
    const std::vector<ZeroBucket> buckets = zero_buckets(c, max_elems, 16);
    auto grad = [](int r, int k, int64_t i) { return (float)((i * 7 + r * 3 + k * 5) % 11); };
    std::vector<ZeroPlan> plans;
    std::vector<std::vector<float>> shards;
    for (int r = 0; r < world; r++) {
        plans.push_back(zero_plan(n, 2, r, world, 16));
        shards.emplace_back((size_t)plans[r].opt_count(), std::nanf(""));
    }
    std::vector<size_t> order;  // the backward's: bucket 0 filled first, reduced last; layer buckets top down
    for (size_t k = buckets.size() - 1; k >= 1; k--) order.push_back(k);
    order.push_back(0);
    for (int k = 0; k < micro; k++)
        for (size_t bi : order) {
            const ZeroBucket& b = buckets[bi];
            std::vector<std::vector<float>> buf(world, std::vector<float>((size_t)b.elems, 0.0f));
            for (int r = 0; r < world; r++) {
                const int64_t first = plans[r].shard_begin(r);
                zero_for_each_bucket_piece(plans[r], b, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
                    if (owner == r && k > 0) std::copy(&shards[r][lo - first], &shards[r][hi - first], &buf[r][at]);
                });
                for (const ZeroRange& rg : b.ranges)
                    for (int64_t i = rg.begin; i < rg.end; i++) buf[r][rg.packed + (i - rg.begin)] += grad(r, k, i);
            }
            zero_for_each_bucket_piece(plans[0], b, [&](int owner, int64_t lo, int64_t hi, int64_t at) {
                const int64_t first = plans[owner].shard_begin(owner);
                for (int64_t i = 0; i < hi - lo; i++) {
                    float sum = 0.0f;
                    for (int r = 0; r < world; r++) sum += buf[r][at + i];
                    shards[owner][lo - first + i] = sum;
                }
            });
        }
    std::vector<std::vector<float>> expect(world);
    for (int r = 0; r < world; r++)
        for (int64_t i = plans[r].shard_begin(r); i < plans[r].shard_end(r); i++) {
            float sum = 0.0f;
            for (int k = 0; k < micro; k++)
                for (int q = 0; q < world; q++) sum += grad(q, k, i);
            expect[r].push_back(sum);
        }
    for (int r = 0; r < world; r++)
        if (expect[r] != shards[r]) return {};
    return shards;
}

static void check_buckets(const ModelConfig& c, const char* name, int64_t max_elems) {
    const int64_t n = (int64_t)model_num_params(c), align = 16;
    const int L = c.num_layers;
    const std::vector<ZeroBucket> buckets = zero_buckets(c, max_elems, align);
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, offsets);
    std::vector<int> owner((size_t)n, -1);
    int next_layer = 0;
    bool ok = buckets.size() >= 2 && buckets[0].first_layer == -1;
    const std::vector<int> of = zero_bucket_of_layer(buckets, L);
    std::vector<float> base((size_t)n), buffer;
    const ModelTensors<float> whole = model_point_tensors(base.data(), c);
    for (size_t k = 0; k < buckets.size(); k++) {
        const ZeroBucket& b = buckets[k];
        if (k > 0) {
            ok &= b.first_layer == next_layer && b.last_layer >= b.first_layer && b.last_layer < L;
            for (int l = b.first_layer; l <= b.last_layer; l++) ok &= of[l] == (int)k;
            next_layer = b.last_layer + 1;
        }
        int64_t packed_end = 0;
        for (const ZeroRange& r : b.ranges) {
            ok &= model_param_per_layer(r.tensor) == (k > 0) && r.packed >= packed_end && r.packed % align == r.begin % align;
            ok &= r.begin >= (int64_t)offsets[r.tensor] && r.end <= (int64_t)(offsets[r.tensor] + sizes[r.tensor]);
            packed_end = r.packed + (r.end - r.begin);
            for (int64_t i = r.begin; i < r.end; i++) {
                ok &= owner[i] == -1;
                owner[i] = (int)k;
            }
        }
        ok &= packed_end == b.elems;
        buffer.assign((size_t)b.elems, 0.0f);
        for (int l = std::max(b.first_layer, 0); l <= b.last_layer || (k == 0 && l == 0); l++) {
            const int at = k == 0 ? -1 : l;
            ModelTensors<float> in_bucket = zero_bucket_grads(buffer.data(), b, at);
            ModelTensors<float> in_whole = k == 0 ? whole : model_layer_slices(whole, c, l);
            for (const ZeroRange& r : b.ranges) {
                const int64_t w = model_tensor(in_whole, r.tensor) - base.data(), p = model_tensor(in_bucket, r.tensor) - buffer.data();
                ok &= w - r.begin == p - r.packed && p >= 0 && p < b.elems;
            }
            if (k == 0) break;
        }
    }
    ok &= next_layer == L;
    for (int64_t i = 0; i < n; i++) ok &= owner[i] >= 0;
    CHECK(ok, "%s, buckets of %lld elements: the bucket plan is wrong", name, (long long)max_elems);
    for (int world = 1; world <= 4; world++)
        CHECK(!simulate_zero2(c, max_elems, world, 3).empty(), "%s, buckets of %lld elements, %d ranks: ZeRO-2's shards "
              "do not hold the sums", name, (long long)max_elems, world);
}

static void check_muon_owners(const ModelConfig& c, const char* name) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, offsets);
    const size_t n = model_num_params(c);
    std::vector<int> covered(n, 0);
    const std::vector<cpu::MuonMatrix> mats = cpu::muon_matrices(c);
    size_t largest = 0;
    for (const cpu::MuonMatrix& x : mats) {
        for (size_t i = x.offset; i < x.offset + x.size() && i < n; i++) covered[i]++;
        largest = std::max(largest, x.size());
    }
    bool tiles = !mats.empty();
    for (int t = 0; t < NUM_PARAM_TENSORS; t++)
        for (size_t i = offsets[t]; i < offsets[t] + sizes[t]; i++) tiles &= covered[i] == (model_param_muon(t) ? 1 : 0);
    CHECK(tiles, "%s: the %zu Muon matrices do not tile the Muon tensors", name, mats.size());
    for (int world = 1; world <= 4; world++) {
        std::vector<cpu::MuonMatrix> plan = mats, again = mats;
        cpu::muon_assign_owners(plan, world);
        cpu::muon_assign_owners(again, world);
        std::vector<size_t> load((size_t)world, 0);
        bool owned = true, same = true;
        for (size_t k = 0; k < plan.size(); k++) {
            owned &= plan[k].owner >= 0 && plan[k].owner < world;
            same &= plan[k].owner == again[k].owner;
            if (owned) load[(size_t)plan[k].owner] += plan[k].size();
        }
        CHECK(owned && same, "%s, %d ranks: a matrix without a rank, or two plans differ", name, world);
        const size_t most = *std::max_element(load.begin(), load.end()), least = *std::min_element(load.begin(), load.end());
        CHECK(most - least <= largest, "%s, %d ranks: loads %zu..%zu differ by more than the largest matrix (%zu)", name,
              world, least, most, largest);
    }
}

int main() {
    // 1. plans
    for (int64_t n : {1, 7, 100, 128, 129, 1000, 4096, 12345, 1 << 20})
        for (int world = 1; world <= 9; world++) {
            int64_t covered = 0;
            for (int r = 0; r < world; r++) {
                const ZeroPlan p = zero_plan(n, 1, r, world);
                CHECK(p.shard_begin(r) == covered, "n=%lld world=%d rank %d starts at %lld, expected %lld", (long long)n,
                      world, r, (long long)p.shard_begin(r), (long long)covered);
                CHECK(p.shard_begin(r) % ZERO_ALIGN == 0 || p.shard_begin(r) == n, "unaligned shard");
                CHECK(p.shard <= (n + world - 1) / world + ZERO_ALIGN, "shard %lld too long", (long long)p.shard);
                covered = p.shard_end(r);
                CHECK(zero_plan(n, 0, r, world).opt_count() == n, "stage 0 keeps everything");
            }
            CHECK(covered == n, "n=%lld world=%d: shards cover %lld", (long long)n, world, (long long)covered);
            const ZeroPlan p = zero_plan(n, 2, 0, world);
            int64_t pieces = 0, next = n / 3;
            zero_for_each_piece(p, n / 3, n, [&](int r, int64_t lo, int64_t hi) {
                CHECK(lo == next && hi > lo && lo >= p.shard_begin(r) && hi <= p.shard_end(r), "bad piece");
                next = hi;
                pieces++;
            });
            CHECK(next == n || n / 3 == n, "pieces end at %lld of %lld", (long long)next, (long long)n);
        }
    // 2. state shards, written at one world size and read at another
    char root[] = "/tmp/test_zero_XXXXXX";
    if (!mkdtemp(root)) return 1;
    const int64_t n = 1000;
    for (int world = 1; world <= 4; world++)
        for (int stage = 0; stage <= 2; stage++) {
            const std::string dir = std::string(root) + "/w" + std::to_string(world) + "s" + std::to_string(stage);
            write_shards(dir, n, world, stage);
            for (int w2 = 1; w2 <= 5; w2++)
                for (int r2 = 0; r2 < w2; r2++) {
                    const ZeroPlan p = zero_plan(n, 2, r2, w2, 16);
                    const int64_t b = p.opt_begin(), k = p.opt_count();
                    std::vector<float> m(k, 0), v(k, 0), master(k, 0);
                    const TrainState st = zero_read_state(dir, n, b, p.opt_end(), m.data(), v.data(), master.data());
                    bool same = st.step == 7 && st.num_params == n && st.has_master == 1 && st.loader[7] == world;
                    for (int64_t i = 0; i < k; i++)
                        same &= m[i] == (float)(b + i) && v[i] == (float)(b + i) * 2 && master[i] == -(float)(b + i);
                    CHECK(same, "world %d stage %d read at rank %d of %d: wrong values", world, stage, r2, w2);
                }
        }
    {  // a missing shard: refused, naming where the gap is (run in a child: fail() exits)
        const std::string dir = std::string(root) + "/w3s1";
        remove((dir + "/state_00001.bin").c_str());
        fflush(stdout);
        if (fork() == 0) {
            if (!freopen((std::string(root) + "/gap.txt").c_str(), "w", stderr)) _exit(2);
            std::vector<float> m(n), v(n);
            zero_read_state(dir, n, 0, n, m.data(), v.data(), nullptr);
            _exit(0);
        }
        int status = 0;
        wait(&status);
        FILE* f = fopen((std::string(root) + "/gap.txt").c_str(), "r");
        char line[512] = "";
        if (f) {
            if (!fgets(line, sizeof line, f)) line[0] = 0;
            fclose(f);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(line, "do not tile"),
              "a missing shard is not refused: %s", line);
    }
    // 3. the data position across world sizes
    int64_t s[16] = {};
    s[1] = 2, s[2] = 6, s[7] = 2;  // epoch 2, 6 batches at 2 ranks = 12 windows
    zero_loader_state_for_world(s, 3, "test");
    CHECK(s[2] == 4 && s[7] == 3 && s[1] == 2, "12 windows at 3 ranks: %lld batches", (long long)s[2]);
    zero_loader_state_for_world(s, 1, "test");
    CHECK(s[2] == 12 && s[7] == 1, "12 windows at 1 rank: %lld batches", (long long)s[2]);
    fflush(stdout);
    if (fork() == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        zero_loader_state_for_world(s, 5, "test");  // 12 windows cannot be split 5 ways
        _exit(0);
    }
    int status = 0;
    wait(&status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "12 windows at 5 ranks was accepted");
    // 4. gradient buckets and the ZeRO-2 step on them
    ModelConfig gpt = model_shape(3, 32, 2, 100);  // GPT-2: biases, LayerNorm, learned positions, tied head
    gpt.max_seq_len = 16;
    const ModelConfig llama = model_config_from_descriptor("llama:L4,C32,H4,KV2,V70,untied");  // no biases, lm_head
    for (int64_t max_elems : {1, 25000, 40000, 1 << 30}) {
        check_buckets(gpt, "gpt2 L3", max_elems);
        check_buckets(llama, "llama L4", max_elems);
    }
    // 5. Muon's matrices dealt out whole
    check_muon_owners(gpt, "gpt2 L3");
    check_muon_owners(llama, "llama L4");
    check_muon_owners(model_config_from_descriptor("llama:L3,C48,H6,KV2,V70,untied"), "llama L3 C48");
    std::string rm = std::string("rm -rf ") + root;
    if (system(rm.c_str()) != 0) printf("could not remove %s\n", root);
    printf("test_zero: %s\n", check_failures ? "FAILED" : "all checks passed");
    return check_failures ? 1 : 0;
}
