// The data loader: every example once per epoch, shuffles that repeat whatever the worker count,
// drop_last, early exit, errors from a transform, bounded prefetch.
#include "support.hpp"

#include <dl/data.hpp>

#include <algorithm>
#include <atomic>
#include <set>
#include <stdexcept>

namespace {

using dl::Tensor;
using dataset = dl::data::tensor_dataset<float, std::int64_t>;

dataset numbered(std::int64_t n, dl::Context& ctx) {
    Tensor<float> x({n, 2}, ctx);
    Tensor<std::int64_t> y({n}, ctx);
    for (std::int64_t i = 0; i < n; ++i) x(i, 0) = float(i), x(i, 1) = float(-i), y(i) = i;
    return {x, y};
}

/// The targets of every batch of one epoch, in order.
template <class Loader>
std::vector<std::vector<std::int64_t>> one_epoch(Loader& loader) {
    std::vector<std::vector<std::int64_t>> out;
    for (auto& b : loader.epoch()) {
        CHECK(b.inputs.shape()[0] == b.targets.numel());
        for (std::int64_t i = 0; i < b.targets.numel(); ++i) CHECK(b.inputs(i, 0) == float(b.targets(i)));
        out.push_back(dl_test::to_vector(b.targets));
    }
    return out;
}

}  // namespace

TEST_CASE("each epoch visits every example once; the order depends on the seed, not on the workers") {
    std::vector<std::vector<std::vector<std::int64_t>>> runs;
    for (int workers : {0, 1, 3}) {
        CAPTURE(workers);
        dl::Context ctx({.seed = 42, .threads = 2});
        dl::data::data_loader loader(numbered(103, ctx), {.batch_size = 10, .workers = workers, .prefetch = 2}, ctx);
        CHECK(loader.batches_per_epoch() == 11);
        const auto first = one_epoch(loader), second = one_epoch(loader);
        REQUIRE(first.size() == 11);
        CHECK(first.back().size() == 3);
        std::set<std::int64_t> seen;
        for (const auto& b : first) seen.insert(b.begin(), b.end());
        CHECK(seen.size() == 103);
        CHECK(first != second);  // a new order each epoch
        runs.push_back(first);
    }
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);

    dl::Context other({.seed = 43, .threads = 1});
    dl::data::data_loader loader(numbered(103, other), {.batch_size = 10}, other);
    CHECK(one_epoch(loader) != runs[0]);
}

TEST_CASE("in-order loading, drop_last, and batch sizes of 1 and of the whole set") {
    dl::Context ctx({.seed = 1, .threads = 1});
    dl::data::data_loader ordered(numbered(7, ctx), {.batch_size = 3, .shuffle = false, .drop_last = true}, ctx);
    CHECK(one_epoch(ordered) == std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3, 4, 5}});
    dl::data::data_loader ones(numbered(3, ctx), {.batch_size = 1, .shuffle = false, .workers = 2}, ctx);
    CHECK(one_epoch(ones) == std::vector<std::vector<std::int64_t>>{{0}, {1}, {2}});
    dl::data::data_loader all(numbered(3, ctx), {.batch_size = 10, .shuffle = false}, ctx);
    CHECK(one_epoch(all) == std::vector<std::vector<std::int64_t>>{{0, 1, 2}});
    CHECK(dl_test::error_message([&] { dl::data::data_loader bad(numbered(3, ctx), {.batch_size = 0}, ctx); })
              .find("batch_size") != std::string::npos);
    CHECK(dl_test::error_message([&] { dataset bad(Tensor<float>({3, 2}), Tensor<std::int64_t>({4})); })
              .find("dimension 0") != std::string::npos);
}

TEST_CASE("transforms run on the workers with bounded prefetch; their errors reach the consumer") {
    dl::Context ctx({.seed = 1, .threads = 1});
    std::atomic<int> built{0};
    auto counting = [&](dl::data::batch<float, std::int64_t> b) {
        ++built;
        return b;
    };
    {
        dl::data::data_loader loader(numbered(100, ctx), {.batch_size = 1, .workers = 2, .prefetch = 3}, ctx, counting);
        auto run = loader.epoch();
        auto it = run.begin();  // the first batch is taken
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK(built.load() <= 1 + 3 + 2);  // taken + queued + one in the hands of each worker
        CHECK((*it).index == 0);
    }  // leaving early joins the workers
    auto failing = [](dl::data::batch<float, std::int64_t> b) {
        if (b.index == 2) throw std::runtime_error("bad batch 2");
        return b;
    };
    for (int workers : {0, 2}) {
        dl::data::data_loader loader(numbered(10, ctx), {.batch_size = 2, .workers = workers}, ctx, failing);
        std::string what;
        int taken = 0;
        try {
            for (auto& b : loader.epoch()) (void)b, ++taken;
        } catch (const std::runtime_error& e) {
            what = e.what();
        }
        CHECK(what == "bad batch 2");
        CHECK(taken == 2);
    }
    // Batch seeds differ per batch and per epoch (for augmentation), and repeat with the seed.
    dl::data::data_loader loader(numbered(4, ctx), {.batch_size = 2}, ctx);
    std::set<std::uint64_t> seeds;
    for (int e = 0; e < 2; ++e)
        for (auto& b : loader.epoch()) seeds.insert(b.seed);
    CHECK(seeds.size() == 4);
    CHECK(loader.last_wait_seconds() >= 0);
}

TEST_CASE("augmentation: flips and shifted crops per image, repeatable from the seed") {
    const auto images = dl_test::iota<float>({4, 1, 3, 3});
    const auto flipped = dl::data::random_horizontal_flip(images, 7, 0.5);
    for (std::int64_t i = 0; i < 4; ++i) {
        const bool f = flipped(i, 0, 1, 0) == images(i, 0, 1, 2);
        for (std::int64_t y = 0; y < 3; ++y)
            for (std::int64_t x = 0; x < 3; ++x) CHECK(flipped(i, 0, y, x) == images(i, 0, y, f ? 2 - x : x));
    }
    CHECK(dl_test::same_elements(dl::data::random_horizontal_flip(images, 7, 0.5), flipped));
    CHECK(dl_test::same_elements(dl::data::random_horizontal_flip(images, 7, 0.0), images));
    CHECK(dl_test::same_elements(dl::data::random_horizontal_flip(images, 7, 1.0), dl::data::random_horizontal_flip(
                                                                                         dl::data::random_horizontal_flip(images, 7, 1.0), 8, 0.0)));
    // Crops: each image is the original shifted by at most `padding`, zeros coming in from the border.
    const auto cropped = dl::data::random_crop(images, 1, 3);
    for (std::int64_t i = 0; i < 4; ++i) {
        bool some_shift_fits = false;
        for (std::int64_t dy = -1; dy <= 1; ++dy)
            for (std::int64_t dx = -1; dx <= 1; ++dx) {
                bool fits = true;
                for (std::int64_t y = 0; y < 3; ++y)
                    for (std::int64_t x = 0; x < 3; ++x) {
                        const std::int64_t sy = y + dy, sx = x + dx;
                        const float expected = sy >= 0 && sy < 3 && sx >= 0 && sx < 3 ? images(i, 0, sy, sx) : 0.0f;
                        fits = fits && cropped(i, 0, y, x) == expected;
                    }
                some_shift_fits = some_shift_fits || fits;
            }
        CHECK(some_shift_fits);
    }
    CHECK(dl_test::same_elements(dl::data::random_crop(images, 0, 3), images));
    CHECK(dl_test::error_message([&] { (void)dl::data::random_crop(images.select(0, 0).select(0, 0), 1, 0); })
              .find("[N, ..., H, W]") != std::string::npos);
}
