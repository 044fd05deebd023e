#pragma once
// Random augmentation of image batches [N, ..., H, W], for a data_loader transform. Each image's
// draw comes from (seed, image index), so a batch's augmentation repeats with its batch.seed whatever
// thread builds it.
#include <cstdint>

#include "../core/random.hpp"
#include "../core/tensor.hpp"

namespace dl::data {

namespace detail {
template <class T>
void check_images(const Tensor<T>& images, const char* op) {
    if (images.rank() < 3) dl::detail::fail("dl::data::", op, ": expected images [N, ..., H, W], got shape ", images.shape());
}
}  // namespace detail

/// Mirrors each image left-right with probability p.
template <class T>
[[nodiscard]] Tensor<T> random_horizontal_flip(const Tensor<T>& images, std::uint64_t seed, double p = 0.5) {
    detail::check_images(images, "random_horizontal_flip");
    const Tensor<T> in = images.contiguous();
    Tensor<T> out(in.shape(), in.context());
    const std::int64_t n = in.shape()[0], w = in.shape()[in.rank() - 1], per_image = n ? in.numel() / n : 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const T* src = in.data() + i * per_image;
        T* dst = out.data() + i * per_image;
        const bool flip = dl::detail::uniform_at(seed, static_cast<std::uint64_t>(i)) < p;
        for (std::int64_t row = 0; row < per_image / w; ++row)
            for (std::int64_t x = 0; x < w; ++x) dst[row * w + x] = src[row * w + (flip ? w - 1 - x : x)];
    }
    return out;
}

/// Pads each image with `padding` zeros on every side and cuts an H x W window at a random position
/// (the classic CIFAR/MNIST shift augmentation).
template <class T>
[[nodiscard]] Tensor<T> random_crop(const Tensor<T>& images, std::int64_t padding, std::uint64_t seed) {
    detail::check_images(images, "random_crop");
    if (padding < 0) dl::detail::fail("dl::data::random_crop: padding must be >= 0, got ", padding);
    const Tensor<T> in = images.contiguous();
    Tensor<T> out(in.shape(), in.context());
    const int r = in.rank();
    const std::int64_t n = in.shape()[0], h = in.shape()[r - 2], w = in.shape()[r - 1];
    const std::int64_t planes = n ? in.numel() / (n * h * w) : 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto pick = [&](std::uint64_t k) {
            const double u = dl::detail::uniform_at(seed, 2 * static_cast<std::uint64_t>(i) + k);
            return static_cast<std::int64_t>(u * static_cast<double>(2 * padding + 1)) - padding;
        };
        const std::int64_t dy = pick(0), dx = pick(1);
        for (std::int64_t c = 0; c < planes; ++c) {
            const T* src = in.data() + (i * planes + c) * h * w;
            T* dst = out.data() + (i * planes + c) * h * w;
            for (std::int64_t y = 0; y < h; ++y)
                for (std::int64_t x = 0; x < w; ++x) {
                    const std::int64_t sy = y + dy, sx = x + dx;
                    dst[y * w + x] = sy >= 0 && sy < h && sx >= 0 && sx < w ? src[sy * w + sx] : T(0);
                }
        }
    }
    return out;
}

}  // namespace dl::data
