// fuzz_common.h: what every libFuzzer target in tests/fuzz/ shares.
// The targets are built by tests/fuzz/run.sh with -DLLMC_FAIL_THROWS, so a reader that rejects an
// input throws FailError (llmc/utils.h) instead of exiting; a target catches exactly that and
// nothing else. Anything else is a finding: a sanitizer report, an uncaught exception
// (std::bad_alloc from an unchecked size, ...), a failed FUZZ_CHECK, a hang or a leak.
#pragma once
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include "llmc/utils.h"

#ifndef LLMC_FAIL_THROWS
#error "fuzz targets need fail() to throw: build them with tests/fuzz/run.sh (-DLLMC_FAIL_THROWS)"
#endif

// An invariant the code under test promises for every input it accepts; a violation aborts,
// which libFuzzer reports as a crash with the input that caused it.
#define FUZZ_CHECK(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);      \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

// The readers take a path: each input is written to an in-memory file (memfd) that is opened
// again through its /proc/self/fd/N name, so the reader sees a regular file of exactly the input's
// bytes and the fuzzer never touches the disk.
class MemFile {
  public:
    explicit MemFile(const char* name) {
        fd_ = memfd_create(name, 0);
        if (fd_ < 0) { perror("memfd_create"); abort(); }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;
    ~MemFile() { close(fd_); }

    // Replaces the file's contents with data[0..size); returns its path.
    const char* set(const uint8_t* data, size_t size) {
        if (ftruncate(fd_, 0) != 0) { perror("ftruncate"); abort(); }
        for (size_t done = 0; done < size;) {
            ssize_t n = pwrite(fd_, data + done, size - done, (off_t)done);
            if (n <= 0) { perror("pwrite"); abort(); }
            done += (size_t)n;
        }
        return path_.c_str();
    }
    const char* path() const { return path_.c_str(); }

  private:
    int fd_ = -1;
    std::string path_;
};

// Little-endian int64 slot `i` of a 1024-byte format header at the start of the input, or
// `fallback` when the input is too short to hold it. Targets use it to pick the sizes a reader
// is called with, so the fuzzer reaches the payload checks instead of stopping at a size mismatch.
inline int64_t header_slot(const uint8_t* data, size_t size, int i, int64_t fallback) {
    if (size < (size_t)(i + 1) * 8) return fallback;
    int64_t v;
    memcpy(&v, data + (size_t)i * 8, 8);
    return v;
}
