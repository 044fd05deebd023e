#pragma once
// Tensors and the ops on them, without layers or graphs: dtypes (bfloat16, float16), Shape, Tensor and
// its views, Context, creation, printing, elementwise expressions (one fused loop forward, one
// backward), reductions, indexing, matmul, softmax, and autograd over all of them. For a file that
// computes with tensors; <dl/nn.hpp> adds layers, <dl/graph.hpp> tracing, <dl/dl.hpp> everything.
#include "version.hpp"
#include "core/allocator.hpp"
#include "core/context.hpp"
#include "core/creation.hpp"
#include "core/denormals.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/print.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "core/thread_pool.hpp"
#include "expr/expression.hpp"
#include "expr/operators.hpp"
#include "device/cpu/elementwise.hpp"
#include "device/cpu/reduce.hpp"
#include "autograd/elementwise.hpp"
#include "autograd/gradcheck.hpp"
#include "autograd/indexing.hpp"
#include "autograd/linalg.hpp"
#include "autograd/node.hpp"
#include "autograd/reduce.hpp"
#include "autograd/softmax.hpp"
#include "autograd/views.hpp"
