#pragma once
// Layers and training in eager mode: everything in <dl/tensor.hpp>, plus convolution, pooling,
// normalisation and int8 ops, the layer concept and containers, layers, losses, optimizers,
// initialisers, metrics, and the profiler. No graph mode (<dl/graph.hpp>) and no files or data
// loading (<dl/data.hpp>).
#include "tensor.hpp"
#include "device/cpu/gemm.hpp"
#include "device/cpu/gemm_int8.hpp"
#include "autograd/conv.hpp"
#include "autograd/normalization.hpp"
#include "autograd/quantized.hpp"
#include "nn/attention.hpp"
#include "nn/conv.hpp"
#include "nn/embedding.hpp"
#include "nn/init.hpp"
#include "nn/layer.hpp"
#include "nn/layers.hpp"
#include "nn/loss.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/metrics.hpp"
#include "nn/normalization.hpp"
#include "nn/optim.hpp"
#include "nn/recurrent.hpp"
#include "nn/sequential.hpp"
#include "prof/plot.hpp"
#include "prof/profiler.hpp"
#include "prof/progress.hpp"
