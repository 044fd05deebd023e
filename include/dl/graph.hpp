#pragma once
// Deferred mode: everything in <dl/tensor.hpp>, plus tracing a function or model into a graph, the
// passes, the executor, and the inference rewrites (int8, pruning). Training in graph mode
// (graph/differentiate.hpp) and saving graphs (graph/serialize.hpp) have headers of their own: they
// compile every op's gradient or rebuild, which a file that only runs a graph does not need.
#include "tensor.hpp"
#include "graph/inference.hpp"
#include "graph/trace.hpp"
