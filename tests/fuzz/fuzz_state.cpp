// fuzz_state: the training state reader (GPTS, llmc/formats.h), as --resume calls it. The model's
// parameter count is taken from the input's own num_params slot when it is small enough to
// allocate, so the fuzzer gets past the count check to the length and payload checks; the input's
// first payload byte picks whether the caller has room for fp32 master weights.
// An accepted state's data loader slots then go to DataLoader::load_state, as on --resume, for a
// loader over a fixed shard of LOADER_TOKENS tokens (B = 2, T = 4, seed 1337, shuffled);
// tests/fuzz/make_seeds.py writes seeds whose slots match it.
// Invariants: an accepted file has exactly 2 or 3 (with master weights) arrays of num_params
// floats; a loader that accepts a state yields valid batches.
#include <vector>
#include "llmc/dataloader.h"
#include "tests/fuzz/fuzz_common.h"

constexpr int LOADER_B = 2, LOADER_T = 4, LOADER_TOKENS = 101, LOADER_VOCAB = 256;

// The fixed shard: token i is i % LOADER_VOCAB.
static const char* loader_shard_path() {
    static MemFile shard("loader_shard.bin");
    static bool written = false;
    if (!written) {
        std::vector<uint8_t> bytes(HEADER_BYTES + 2 * LOADER_TOKENS);
        FileHeader hd = {};
        hd.h[0] = MAGIC_SHARD; hd.h[1] = FORMAT_VERSION; hd.h[2] = LOADER_TOKENS; hd.h[3] = 2; hd.h[4] = LOADER_VOCAB;
        memcpy(bytes.data(), hd.h, HEADER_BYTES);
        for (int i = 0; i < LOADER_TOKENS; i++) {
            uint16_t t = (uint16_t)(i % LOADER_VOCAB);
            memcpy(&bytes[HEADER_BYTES + 2 * i], &t, 2);
        }
        shard.set(bytes.data(), bytes.size());
        written = true;
    }
    return shard.path();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("state.bin");
    const char* path = file.set(data, size);
    int64_t expected = header_slot(data, size, 3, 0);
    if (expected < 0 || expected > (int64_t)size) expected = 0;
    const bool want_master = size > HEADER_BYTES && (data[HEADER_BYTES] & 1);
    std::vector<float> m(expected), v(expected), master(want_master ? expected : 0);
    TrainState s;
    try {
        s = state_read(path, expected, m.data(), v.data(), want_master ? master.data() : nullptr);
    } catch (const FailError&) {
        return 0;
    }
    FUZZ_CHECK(s.num_params == expected);
    FUZZ_CHECK(s.has_master == 0 || s.has_master == 1);
    FUZZ_CHECK((int64_t)size == HEADER_BYTES + expected * 4 * (2 + s.has_master));
    try {
        DataLoader dl(loader_shard_path(), LOADER_B, LOADER_T, 0, 1, LOADER_VOCAB, 1337, true);
        dl.load_state(s.loader);
        for (int i = 0; i < 3; i++) {
            dl.next_batch();
            for (int j = 0; j < LOADER_B * LOADER_T; j++)
                FUZZ_CHECK(dl.targets()[j] == (dl.inputs()[j] + 1) % LOADER_VOCAB);
        }
    } catch (const FailError&) {
    }
    return 0;
}
