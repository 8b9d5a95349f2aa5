// flags.h: the command-line parser every program shares: a table of flag descriptors (name, value
// placeholder, help text with the default, setter that validates). Flags are `--name value`. A bad
// value, a missing value or an unknown flag fails with one line `error: --flag: <why>`; `--help`
// prints the usage and exits 0.
#pragma once
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include "llmc/utils.h"

// A closed or half-open interval for numeric flags, printed in messages as [lo, hi) etc.
struct FlagRange {
    double lo, hi;
    bool hi_open = false;
};

class FlagParser {
  public:
    struct Flag {
        std::string name;     // "--lr"
        std::string metavar;  // "X"
        std::string help;     // one line, ends with the default
        // parses and stores the value; returns "" on success, else why the value is bad
        std::function<std::string(const char* value)> set;
    };

    FlagParser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

    void add(Flag f) {
        for (const Flag& g : flags_)
            if (g.name == f.name) fail("internal: flag %s registered twice", f.name.c_str());
        flags_.push_back(std::move(f));
    }

    void add_int(const char* name, int* dst, FlagRange r, const char* help) { add_integer(name, dst, r, help, true); }
    void add_int64(const char* name, int64_t* dst, FlagRange r, const char* help) {
        add_integer(name, dst, r, help, true);
    }
    // An int whose initial value marks "not given" (e.g. -1): the help states the default itself.
    void add_int_unset(const char* name, int* dst, FlagRange r, const char* help) {
        add_integer(name, dst, r, help, false);
    }
    void add_uint64(const char* name, uint64_t* dst, const char* help) {
        add({name, "N", help + (" (default " + std::to_string(*dst) + ")"), [dst](const char* s) -> std::string {
                 int64_t v;
                 if (!parse_int64(s, &v) || v < 0) return std::string("'") + s + "' is not a non-negative integer";
                 *dst = (uint64_t)v;
                 return "";
             }});
    }
    // One of `names`, stored as given; a bad value is "unknown NOUN 'x' (a, b, ...)". The help states
    // the default itself.
    void add_choice(const char* name, const char* metavar, std::string* dst, std::vector<const char*> names,
                    const char* noun, const char* help) {
        add({name, metavar, help, [dst, names, noun](const char* s) -> std::string {
                 std::string list;
                 for (const char* n : names) {
                     if (strcmp(s, n) == 0) {
                         *dst = s;
                         return "";
                     }
                     list += std::string(list.empty() ? "" : ", ") + n;
                 }
                 return std::string("unknown ") + noun + " '" + s + "' (" + list + ")";
             }});
    }
    void add_float(const char* name, float* dst, FlagRange r, const char* help) {
        add({name, "X", help + (" (default " + number_text(*dst) + ")"), [dst, r](const char* s) -> std::string {
                 float v = 0.0f;
                 const std::string why = parse_float(s, &v);
                 if (!why.empty()) return why;
                 if (!in_range(v, r)) return "must be in " + range_text(r) + ", got " + s;
                 *dst = v;
                 return "";
             }});
    }
    void add_string(const char* name, const char* metavar, std::string* dst, const char* help) {
        std::string def = dst->empty() ? "" : " (default " + *dst + ")";
        add({name, metavar, help + def, [dst](const char* s) -> std::string {
                 if (!*s) return "needs a non-empty value";
                 *dst = s;
                 return "";
             }});
    }

    // Parses argv[1..]; fails on the first bad flag. `--help` / `-h` prints the usage and exits 0.
    void parse(int argc, char** argv) const {
        for (int i = 1; i < argc; i++) {
            const char* arg = argv[i];
            if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
                print_usage(stdout);
                exit(0);
            }
            const Flag* f = find(arg);
            if (!f) fail("%s: unknown flag (see --help)", arg);
            if (i + 1 >= argc) fail("%s: missing value (%s)", arg, f->metavar.c_str());
            // `--out-dir --log x` would make a directory named --log: no value starts with "--"
            // (a negative number has one dash; a file named --x can be given as ./--x)
            if (strncmp(argv[i + 1], "--", 2) == 0)
                fail("%s: missing value (%s) before %s", arg, f->metavar.c_str(), argv[i + 1]);
            std::string why = f->set(argv[++i]);
            if (!why.empty()) fail("%s: %s", arg, why.c_str());
        }
    }

    void print_usage(FILE* out) const {
        fprintf(out, "usage: %s [flags]\n%s\n\nflags:\n", program_.c_str(), summary_.c_str());
        for (const Flag& f : flags_) {
            std::string lhs = f.name + " " + f.metavar;
            fprintf(out, "  %-24s %s\n", lhs.c_str(), f.help.c_str());
        }
    }

  private:
    template <class Int>
    void add_integer(const char* name, Int* dst, FlagRange r, const char* help, bool show_default) {
        std::string text = help;
        if (show_default) text += " (default " + std::to_string(*dst) + ")";
        add({name, "N", text, [dst, r](const char* s) -> std::string {
                 int64_t v;
                 if (!parse_int64(s, &v)) return std::string("'") + s + "' is not an integer";
                 if (!in_range((double)v, r)) return "must be in " + range_text(r, true) + ", got " + s;
                 *dst = (Int)v;
                 return "";
             }});
    }
    const Flag* find(const char* name) const {
        for (const Flag& f : flags_)
            if (f.name == name) return &f;
        return nullptr;
    }
    static bool in_range(double v, const FlagRange& r) { return v >= r.lo && (r.hi_open ? v < r.hi : v <= r.hi); }
    static std::string number_text(double v) {
        char buf[32];
        snprintf(buf, sizeof buf, "%g", v);
        return buf;
    }
    // an integer flag's bounds as integers ("[1, 1048576]", not "[1, 1.04858e+06]")
    static std::string range_text(const FlagRange& r, bool integer = false) {
        auto bound = [integer](double v) { return integer ? std::to_string((long long)v) : number_text(v); };
        return "[" + bound(r.lo) + ", " + bound(r.hi) + (r.hi_open ? ")" : "]");
    }
    std::string program_, summary_;
    std::vector<Flag> flags_;
};
