// fuzz_checkpoint_manifest: the DONE manifest of a checkpoint directory (checkpoint_problem in
// llmc/checkpoint.h), which --resume reads to choose the checkpoint and to verify its model.bin
// and state.bin. The input is DONE; the directory is a fixed step_00000003 in a temp folder whose
// model.bin and state.bin hold fixed bytes (CHECKPOINT_BYTES; tests/fuzz/make_seeds.py writes
// manifests of the same files).
// Invariant: a checkpoint that verifies has a DONE of the current or the legacy ("ok") kind.
#include <sys/stat.h>
#include <string>
#include "llmc/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"

// model.bin: 100 bytes of 'm', state.bin: 13 bytes of 's' (neither a multiple of 8, so the
// checksum's tail word is covered)
static const std::string CHECKPOINT_BYTES[2] = {std::string(100, 'm'), std::string(13, 's')};

static void write_file(const std::string& path, const void* data, size_t size) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) { perror(path.c_str()); abort(); }
}

static const std::string& checkpoint_dir() {
    static std::string dir;
    if (dir.empty()) {
        char root[] = "/tmp/fuzz_checkpoint_XXXXXX";
        if (!mkdtemp(root)) { perror("mkdtemp"); abort(); }
        dir = std::string(root) + "/step_00000003";
        if (mkdir(dir.c_str(), 0755) != 0) { perror(dir.c_str()); abort(); }
        for (int i = 0; i < 2; i++)
            write_file(dir + "/" + CHECKPOINT_FILES[i], CHECKPOINT_BYTES[i].data(), CHECKPOINT_BYTES[i].size());
        atexit([] {
            for (const char* name : {"DONE", "model.bin", "state.bin"}) remove((dir + "/" + name).c_str());
            rmdir(dir.c_str());
            rmdir(dir.substr(0, dir.rfind('/')).c_str());
        });
    }
    return dir;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& dir = checkpoint_dir();
    write_file(dir + "/DONE", data, size);
    try {
        const std::string problem = checkpoint_problem(dir);
        const std::string done((const char*)data, size);
        if (problem.empty()) FUZZ_CHECK(done.rfind("ok\n", 0) == 0 || done.rfind(CHECKPOINT_MANIFEST, 0) == 0);
    } catch (const FailError&) {
    }
    return 0;
}
