// FEDFLEET_CHECK: a broken invariant is a bug; print where and why, then abort.
// Expected failures use Status (common/status.h) instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FEDFLEET_CHECK(cond)                                                                    \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "fedfleet: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

#define FEDFLEET_CHECK_MSG(cond, msg)                                                        \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "fedfleet: check failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, (msg));                                                            \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
