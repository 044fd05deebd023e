#pragma once
// dl's data and file part: IDX files, Fashion-MNIST, datasets and the prefetching loader, and
// safetensors checkpoints. Link dl::data (it brings zlib and nlohmann-json) to use it.
#include "dl.hpp"

#include "data/augment.hpp"
#include "data/fashion_mnist.hpp"
#include "data/idx.hpp"
#include "data/loader.hpp"
#include "io/records.hpp"
#include "nn/checkpoint.hpp"
#include "nn/trainer.hpp"
