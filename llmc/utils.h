// utils.h: error reporting and checked file I/O, shared by every binary (CPU and GPU).
// Every failure prints one line `error: <what>` naming the file or flag involved and exits 1:
// a bad input is never a crash and never a silent read past the end.
#pragma once
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#ifdef LLMC_FAIL_THROWS
// Fuzz builds (tests/fuzz/run.sh) define LLMC_FAIL_THROWS: fail() throws FailError carrying the
// message instead of exiting, so one process can feed a reader millions of bad inputs.
#include <stdexcept>
struct FailError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
#endif

// Called by fail() after the message, before exit: a data-parallel run's process group
// (llmc/dist.h) sets it so that one failing rank stops every rank at once (MPI_Abort).
inline void (*fail_hook)() = nullptr;
// Written after "error: " (a data-parallel run sets it to "rank R: ").
inline char fail_tag[32] = "";

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
#ifdef LLMC_FAIL_THROWS
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    throw FailError(msg);
#else
    fflush(stdout);
    // one write, so the lines of several ranks failing at once do not interleave
    char msg[2048];
    const int n = snprintf(msg, sizeof msg, "error: %s", fail_tag);
    vsnprintf(msg + n, sizeof msg - n - 1, fmt, ap);
    va_end(ap);
    strcat(msg, "\n");
    fputs(msg, stderr);
    if (fail_hook) fail_hook();
    exit(1);
#endif
}

// Closes a FILE when it goes out of scope, so a reader that fails part-way (fail() throws in fuzz
// builds) leaves no stream open.
struct FileCloser {
    void operator()(FILE* f) const { fclose(f); }
};
using UniqueFile = std::unique_ptr<FILE, FileCloser>;

inline FILE* fopen_or_fail(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (!f) fail("%s: cannot open (%s)", path, strerror(errno));
    return f;
}

// Reads exactly n items or fails; `path` is only used for the message.
inline void fread_or_fail(void* dst, size_t size, size_t n, FILE* f, const char* path) {
    size_t got = fread(dst, size, n, f);
    if (got != n) {
        if (ferror(f)) fail("%s: read error (%s)", path, strerror(errno));
        fail("%s: truncated (wanted %zu items of %zu bytes, got %zu)", path, n, size, got);
    }
}

inline void fwrite_or_fail(const void* src, size_t size, size_t n, FILE* f, const char* path) {
    if (fwrite(src, size, n, f) != n) fail("%s: write failed (%s)", path, strerror(errno));
}

inline void fseek_or_fail(FILE* f, long offset, const char* path) {
    if (fseek(f, offset, SEEK_SET) != 0) fail("%s: seek to %ld failed (%s)", path, offset, strerror(errno));
}

inline void fclose_or_fail(FILE* f, const char* path) {
    if (fclose(f) != 0) fail("%s: close failed (%s)", path, strerror(errno));
}

inline int64_t file_size_or_fail(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) fail("%s: cannot open (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", path);
    return (int64_t)st.st_size;
}

inline bool file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

inline void mkdir_or_fail(const char* path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) fail("%s: cannot create directory (%s)", path, strerror(errno));
}

// mkdir -p: creates `path` and any missing parents; `what` names the flag in the message.
inline void mkdirs_or_fail(const std::string& path, const char* what) {
    for (size_t i = 1; i <= path.size(); i++) {
        if (i < path.size() && path[i] != '/') continue;
        const std::string prefix = path.substr(0, i);
        struct stat st;
        if (stat(prefix.c_str(), &st) == 0) {
            if (!S_ISDIR(st.st_mode)) fail("%s %s: %s is not a directory", what, path.c_str(), prefix.c_str());
            continue;
        }
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
            fail("%s %s: cannot create directory %s (%s)", what, path.c_str(), prefix.c_str(), strerror(errno));
    }
}

// Fails unless the host has `bytes` of memory available (MemAvailable of /proc/meminfo; where that
// is unreadable, the check is skipped): a clear message instead of std::bad_alloc or the OOM killer.
inline void check_host_memory(size_t bytes, const char* what, const char* hint) {
    FILE* f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    const double GiB = 1073741824.0;
    if (kib > 0 && bytes > kib * 1024ull)
        fail("%s needs %.2f GiB of host memory but only %.2f GiB are available: %s", what, bytes / GiB,
             kib * 1024.0 / GiB, hint);
}

// "1h02m03s": elapsed and remaining time in the trainers' step lines.
inline std::string format_duration(double seconds) {
    const long s = seconds > 0 ? (long)seconds : 0;
    char buf[32];
    snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
    return buf;
}

// checksum64: a 64-bit checksum of a byte string that detects damage (not an adversary). The bytes
// are read as little-endian uint64 words w_i (the last one zero-padded); each word is mixed with its
// index by the splitmix64 finalizer and the results summed, so chunks hash independently and numpy
// computes the same value vectorized (scripts/llmc_formats.py). docs/formats.md has the formula.
inline uint64_t checksum64_mix(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
class Checksum64 {
  public:
    // Adds the next `bytes` of the string; every call but the last must pass a multiple of 8 bytes.
    void add(const void* data, size_t bytes) {
        const unsigned char* p = (const unsigned char*)data;
        const size_t words = bytes / 8;
        uint64_t sum = 0;
        for (size_t i = 0; i < words; i++) {
            uint64_t w;
            memcpy(&w, p + 8 * i, 8);
            sum += checksum64_mix(w + (words_ + i + 1) * 0x9E3779B97F4A7C15ull);
        }
        if (bytes % 8) {
            uint64_t w = 0;
            memcpy(&w, p + 8 * words, bytes % 8);
            sum += checksum64_mix(w + (words_ + words + 1) * 0x9E3779B97F4A7C15ull);
        }
        sum_ += sum;
        words_ += words + (bytes % 8 ? 1 : 0);
        bytes_ += bytes;
    }
    uint64_t value() const { return checksum64_mix(sum_ + bytes_); }

  private:
    uint64_t sum_ = 0, words_ = 0, bytes_ = 0;
};

// Size and checksum64 of a whole file; false (errno set) if it cannot be read.
inline bool file_checksum64(const char* path, int64_t* size, uint64_t* checksum) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    std::unique_ptr<unsigned char[]> buf(new unsigned char[1 << 20]);
    Checksum64 h;
    int64_t total = 0;
    size_t got;
    while ((got = fread(buf.get(), 1, 1 << 20, f)) > 0) {
        h.add(buf.get(), got);
        total += (int64_t)got;
        if (got % 8) break;  // only the end of the file is short
    }
    const bool ok = !ferror(f) && feof(f);
    fclose(f);
    if (!ok) return false;
    *size = total;
    *checksum = h.value();
    return true;
}

// Writes `path` through a temporary `path.tmp`: the data is flushed and fsynced, then renamed over
// `path`. A crash or a full disk mid-write leaves any earlier `path` intact; on failure the temp file
// is removed and the error names `path`.
class AtomicFileWriter {
  public:
    explicit AtomicFileWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
        f_ = fopen(tmp_.c_str(), "wb");
        if (!f_) fail("%s: cannot create (%s)", tmp_.c_str(), strerror(errno));
    }
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
    ~AtomicFileWriter() {
        if (f_) {  // never committed: drop the partial file
            fclose(f_);
            remove(tmp_.c_str());
        }
    }
    void write(const void* src, size_t bytes) {
        if (bytes && fwrite(src, 1, bytes, f_) != bytes) abort_with("write failed");
    }
    void commit() {
        if (fflush(f_) != 0) abort_with("flush failed");
        if (fsync(fileno(f_)) != 0) abort_with("fsync failed");
        if (fclose(f_) != 0) { f_ = nullptr; abort_with("close failed"); }
        f_ = nullptr;
        if (rename(tmp_.c_str(), path_.c_str()) != 0) abort_with("rename failed");
    }
    const std::string& path() const { return path_; }

  private:
    [[noreturn]] void abort_with(const char* what) {
        int e = errno;
        if (f_) fclose(f_);
        f_ = nullptr;
        remove(tmp_.c_str());
        fail("%s: %s (%s); the previous file, if any, is untouched", path_.c_str(), what, strerror(e));
    }
    std::string path_, tmp_;
    FILE* f_ = nullptr;
};

// Parses a whole string as a number; false on trailing junk, overflow or empty input.
inline bool parse_int64(const char* s, int64_t* out) {
    if (!s || !*s) return false;
    char* end = nullptr;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') return false;
    *out = v;
    return true;
}

// A whole string as a float into *out; "" on success, else why not: not a number, not finite, or out
// of a float's range (a nonzero value that would round to 0 is refused, not silently taken as 0).
inline std::string parse_float(const char* s, float* out) {
    const std::string quoted = std::string("'") + (s ? s : "") + "'";
    char* end = nullptr;
    errno = 0;
    const double d = s && *s ? strtod(s, &end) : 0.0;
    if (!s || !*s || *end != '\0' || std::isnan(d)) return quoted + " is not a number";
    if (std::isinf(d) && errno != ERANGE) return quoted + " is not a finite number";
    if (std::fabs(d) > FLT_MAX) return quoted + " is out of range: its magnitude is above a float's largest, 3.4e38";
    const float f = (float)d;
    // (strtod gives 0 and ERANGE for a nonzero value too small for a double, as 1e-400)
    if (f == 0.0f && (d != 0.0 || errno == ERANGE))
        return quoted + " is out of range: nonzero, but below the smallest float (1.4e-45), so it would be 0 "
               "(give 0 if that is meant)";
    *out = f;
    return "";
}
