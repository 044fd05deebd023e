#pragma once
// dl: a header-only C++20 deep-learning library. This header is the public API: the CPU parts of
// everything. CUDA, NCCL and MPI parts live behind their own headers and CMake options.
#include "graph.hpp"
#include "nn.hpp"
#include "tensor.hpp"
