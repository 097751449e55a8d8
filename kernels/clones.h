// FEDFLEET_KERNEL_CLONES: builds a CPU kernel once per instruction set and picks one at load
// time through an ifunc resolver (GCC target_clones), without -march=native, so one binary runs
// on any x86-64. x86-64-v3 is AVX2 + FMA + F16C (Haswell, Zen 1 and later); "default" is the
// baseline build. Internal to kernels/*_cpu.cc.
//
// Every kernel computes the same bits in every build: element-wise work rounds once per
// operation as written (std::fma where a fused multiply-add is meant), and sums run in an order
// the code spells out.
#pragma once

// Defining FEDFLEET_NO_KERNEL_CLONES builds the baseline only (to test it on a newer machine).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(FEDFLEET_NO_KERNEL_CLONES)
#define FEDFLEET_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FEDFLEET_KERNEL_CLONES
#endif
