#pragma once
// dl: a header-only C++20 deep-learning library. This header is the public API: the CPU parts of
// everything. CUDA, NCCL and MPI parts live behind their own headers and CMake options.
#include "version.hpp"

#include "core/allocator.hpp"
#include "core/context.hpp"
#include "core/denormals.hpp"
#include "core/creation.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/print.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "core/thread_pool.hpp"

#include "expr/expression.hpp"
#include "expr/operators.hpp"

#include "device/cpu/elementwise.hpp"
#include "device/cpu/reduce.hpp"

#include "autograd/conv.hpp"
#include "autograd/elementwise.hpp"
#include "autograd/gradcheck.hpp"
#include "autograd/indexing.hpp"
#include "autograd/linalg.hpp"
#include "autograd/node.hpp"
#include "autograd/normalization.hpp"
#include "autograd/reduce.hpp"
#include "autograd/softmax.hpp"
#include "autograd/views.hpp"

#include "nn/attention.hpp"
#include "nn/conv.hpp"
#include "nn/embedding.hpp"
#include "nn/init.hpp"
#include "nn/layer.hpp"
#include "nn/layers.hpp"
#include "nn/loss.hpp"
#include "nn/metrics.hpp"
#include "nn/normalization.hpp"
#include "nn/optim.hpp"
#include "nn/recurrent.hpp"
#include "nn/sequential.hpp"

#include "prof/plot.hpp"
#include "prof/profiler.hpp"
#include "prof/progress.hpp"
