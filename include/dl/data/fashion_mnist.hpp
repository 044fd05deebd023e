#pragma once
// Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 28x28 grey images of 10 kinds of clothing, 60,000 for
// training and 10,000 for testing, as four gzip'd IDX files. Debian's dataset-fashion-mnist package
// installs them in /usr/share/datasets/fashion-mnist; DL_FASHION_MNIST or an explicit folder
// overrides that.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "idx.hpp"

namespace dl::data {

/// The class names, in label order.
inline constexpr std::array<const char*, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

/// One split: images [N, 28, 28] and labels [N], both uint8.
struct image_split {
    Tensor<std::uint8_t> images, labels;
};

/// The folder holding the four files: `folder` when given, else $DL_FASHION_MNIST, else the Debian
/// package's. Fails naming every place it looked.
[[nodiscard]] inline std::filesystem::path find_fashion_mnist(const std::filesystem::path& folder = {}) {
    std::vector<std::filesystem::path> candidates;
    if (!folder.empty()) {
        candidates.push_back(folder);
    } else {
        if (const char* env = std::getenv("DL_FASHION_MNIST"); env && *env) candidates.emplace_back(env);
        candidates.emplace_back("/usr/share/datasets/fashion-mnist");
    }
    std::string looked;
    for (const auto& dir : candidates) {
        std::error_code ec;
        if (std::filesystem::exists(dir / "train-images-idx3-ubyte.gz", ec) ||
            std::filesystem::exists(dir / "train-images-idx3-ubyte", ec))
            return dir;
        looked += (looked.empty() ? "" : ", ") + dir.string();
    }
    dl::detail::fail("dl::data: Fashion-MNIST not found; looked in ", looked,
                     " (install Debian's dataset-fashion-mnist, or set DL_FASHION_MNIST to the folder with "
                     "train-images-idx3-ubyte.gz)");
}

/// Reads the training (60,000) or test (10,000) split, checking that images and labels agree.
[[nodiscard]] inline image_split load_fashion_mnist(bool train, const std::filesystem::path& folder = {},
                                                    Context& ctx = default_context()) {
    const std::filesystem::path dir = find_fashion_mnist(folder);
    const std::string prefix = train ? "train" : "t10k";
    auto file = [&](const std::string& name) {
        const auto gz = dir / (name + ".gz");
        return std::filesystem::exists(gz) ? gz : dir / name;
    };
    image_split s{read_idx<std::uint8_t>(file(prefix + "-images-idx3-ubyte"), ctx),
                  read_idx<std::uint8_t>(file(prefix + "-labels-idx1-ubyte"), ctx)};
    if (s.images.rank() != 3 || s.labels.rank() != 1 || s.images.shape()[0] != s.labels.shape()[0])
        dl::detail::fail("dl::data: Fashion-MNIST ", prefix, " images ", s.images.shape(), " and labels ",
                         s.labels.shape(), " do not match (expected [N, 28, 28] and [N])");
    return s;
}

}  // namespace dl::data
