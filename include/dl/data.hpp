#pragma once
// dl's data part: IDX files, Fashion-MNIST, datasets and the prefetching loader. Link dl::data (it
// brings zlib) to use it.
#include "dl.hpp"

#include "data/fashion_mnist.hpp"
#include "data/idx.hpp"
#include "data/loader.hpp"
