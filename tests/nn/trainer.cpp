// fit(): it trains, evaluates, calls its hooks, stops early, checkpoints, and says when it is input-bound.
#include "support.hpp"

#include <dl/data.hpp>

#include <filesystem>
#include <sstream>
#include <thread>

namespace {

using dl::Tensor;

/// Two separable blobs: class 0 around (-2, 0), class 1 around (2, 0).
dl::data::tensor_dataset<float, std::int64_t> blobs(std::int64_t n, dl::Context& ctx) {
    Tensor<float> x = dl::normal<float>({n, 2}, 0, 0.5, ctx);
    Tensor<std::int64_t> y({n}, ctx);
    for (std::int64_t i = 0; i < n; ++i) {
        y(i) = i % 2;
        x(i, 0) += y(i) ? 2.0f : -2.0f;
    }
    return {x, y};
}

auto cross_entropy = [](const Tensor<float>& s, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(s, y); };

}  // namespace

TEST_CASE("fit trains and evaluates, calls its hooks, and stops when told") {
    dl::Context ctx({.seed = 4, .threads = 1});
    dl::nn::sequential model{dl::nn::linear<float>(2, 8, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(8, 2, true, ctx)};
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.1});
    dl::data::data_loader train(blobs(200, ctx), {.batch_size = 20}, ctx);
    dl::data::data_loader eval(blobs(100, ctx), {.batch_size = 50, .shuffle = false}, ctx);
    std::ostringstream log;
    int steps = 0, epochs_started = 0;
    const auto result = dl::nn::fit(model, opt, cross_entropy, train, &eval,
                                    {.epochs = 3,
                                     .progress = false,
                                     .log = &log,
                                     .after_step = [&](dl::nn::step_info& s) { CHECK(s.step == ++steps); },
                                     .before_epoch = [&](dl::nn::epoch_info&) { ++epochs_started; }});
    CHECK(steps == 30);
    CHECK(epochs_started == 3);
    REQUIRE(result.epochs.size() == 3);
    CHECK(result.epochs.back().eval_accuracy > 0.95);
    CHECK(result.epochs.back().train_loss < result.epochs.front().train_loss);
    CHECK(log.str().find("epoch 3: train loss") != std::string::npos);
    CHECK(log.str().find("input-bound") == std::string::npos);

    // A step hook stops training; without evaluation data the eval figures are NaN.
    const auto stopped = dl::nn::fit(model, opt, cross_entropy, train,
                                     {.epochs = 5, .progress = false, .log = &log,
                                      .after_step = [](dl::nn::step_info& s) { s.stop = s.step == 4; }});
    REQUIRE(stopped.epochs.size() == 1);
    CHECK(std::isnan(stopped.epochs[0].eval_accuracy));
}

TEST_CASE("fit stops early without progress, checkpoints every N steps, and reports waiting for data") {
    dl::Context ctx({.seed = 5, .threads = 1});
    dl::nn::linear<float> model(2, 2, true, ctx);
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.0});  // never improves
    dl::data::data_loader train(blobs(40, ctx), {.batch_size = 10}, ctx);
    dl::data::data_loader eval(blobs(20, ctx), {.batch_size = 20}, ctx);
    const auto path = std::filesystem::temp_directory_path() / ("dl_test_fit_" + std::to_string(::getpid()) + ".safetensors");
    std::ostringstream log;
    const auto result = dl::nn::fit(model, opt, cross_entropy, train, &eval,
                                    {.epochs = 10, .progress = false, .log = &log, .checkpoint_every = 3,
                                     .checkpoint_path = path, .early_stopping_patience = 2});
    CHECK(result.stopped_early);
    CHECK(result.epochs.size() == 3);  // the first sets the best, two more without gain
    CHECK(log.str().find("early stopping") != std::string::npos);
    REQUIRE(std::filesystem::exists(path));
    dl::nn::linear<float> restored(2, 2, true, ctx);
    dl::nn::sgd<float> restored_opt(dl::nn::parameters(restored), {.lr = 0.0});
    dl::nn::load_checkpoint(path, restored, &restored_opt);
    CHECK(restored_opt.steps() == 12);  // the last multiple of 3 of 12 steps
    std::filesystem::remove(path);

    // A slow transform on the training thread: most of each epoch is spent waiting for data.
    auto slow = [](dl::data::batch<float, std::int64_t> b) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return b;
    };
    dl::data::data_loader slow_train(blobs(40, ctx), {.batch_size = 10, .workers = 0}, ctx, slow);
    std::ostringstream slow_log;
    (void)dl::nn::fit(model, opt, cross_entropy, slow_train, {.epochs = 1, .progress = false, .log = &slow_log});
    CHECK(slow_log.str().find("input-bound: the loop waited") != std::string::npos);
}
