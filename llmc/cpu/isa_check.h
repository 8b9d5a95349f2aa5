// isa_check.h: a CPU program built for x86-64-v3 (the Makefile's NATIVE=0: AVX2 and FMA, any x86-64
// CPU since 2013-2015) refuses, with one line on stderr, to start on a CPU without them, instead of
// dying of an illegal instruction somewhere inside the first matmul. The check runs before main and
// before any other static initializer (constructor priority 101), compiled for the baseline x86-64
// so that it cannot itself use the instructions it checks for. Builds for the machine they run on
// (-march=native) or for other ISAs compile it out.
#pragma once
#if defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <cstdio>
#include <unistd.h>

__attribute__((constructor(101), target("arch=x86-64"))) static void llmc_require_avx2_fma() {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return;
    fputs("error: this build needs a CPU with AVX2 and FMA (x86-64-v3); rebuild on this machine with "
          "`make NATIVE=1` (the default, -march=native)\n", stderr);
    _exit(1);
}
#endif
