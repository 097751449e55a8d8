// Which OpenBLAS kernels LibTorch's fp32 matrix products run on, and a better choice where
// OpenBLAS picked badly.
//
// Debian's LibTorch does its fp32 matrix products (linear layers: all of an MLP, a CNN's
// classifier) in OpenBLAS. OpenBLAS 0.3.21 (Debian 12) picks its kernels once, when it loads,
// from the CPU's vendor, family and model. A model it does not know (a Xeon newer than the
// library, or a virtual machine's CPU) gets Prescott's SSE3 kernels: on a 2-core Xeon with
// AVX-512 a 1024^3 product ran at about 20 GFLOP/s with them and at 156 GFLOP/s with
// OPENBLAS_CORETYPE=SkylakeX (docs/BENCHMARKS.md, "OpenBLAS kernels"). The choice can only be
// changed before the library loads, through that variable: the fedfleet program runs itself
// again with it set (cli/commands.cc), and the Python package, loaded after LibTorch, warns.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fedfleet::model {

// The core whose kernels the loaded OpenBLAS runs ("Prescott", "Haswell", "SkylakeX", ...), or
// "" when this process has no OpenBLAS (another BLAS, or a LibTorch built with MKL).
std::string openblasCoreName();

// The flags line of /proc/cpuinfo, after "flags :" ("" where the file is missing).
std::string cpuFlags();

// The OpenBLAS core to ask for instead of `detected` on a CPU with `flags` (space-separated, as
// /proc/cpuinfo writes them): "SkylakeX" where the flags have AVX-512 F, CD, BW, DQ and VL, else
// "Haswell" where they have AVX2 and FMA, when `detected` is a core without AVX2 kernels (OpenBLAS
// did not recognise the CPU). nullopt when `detected` is "" or a core with AVX2 kernels already
// (Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids, Excavator), or the flags offer no better.
std::optional<std::string> betterBlasCore(std::string_view detected, std::string_view flags);

// The core to ask OpenBLAS for in this process: betterBlasCore of the loaded core and this
// CPU's flags, nullopt when OPENBLAS_CORETYPE is set (OpenBLAS chose from it; a user's choice
// is kept).
std::optional<std::string> blasCoreToAsk();

// The kernels the fedfleet program's fp32 products run on: blasCoreToAsk, else the loaded core
// ("" without OpenBLAS).
std::string fedfleetBlasCore();

}  // namespace fedfleet::model
