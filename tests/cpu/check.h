// check.h: CHECK(cond, printf-style message) for the plain C++ tests that compare against known
// values rather than a fixture (tests/cpu/fixture_check.h): counts the checks and the failures, and
// prints "FAIL file:line: message" for each failure. main ends with `return check_failures ? 1 : 0`.
#pragma once
#include <cstdio>

inline int check_count = 0, check_failures = 0;

#define CHECK(cond, ...)                                \
    do {                                                \
        check_count++;                                  \
        if (!(cond)) {                                  \
            check_failures++;                           \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)
