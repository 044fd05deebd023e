#pragma once
// fit(): the training loop with hooks, in the spirit of tf.estimator. It runs what a hand-written loop
// runs — forward, loss, zero_grad, backward, step — and around it the things every run wants: a
// progress bar, running loss and accuracy, evaluation after each epoch, checkpoints every N steps,
// early stopping, and hooks that see every step and epoch and may stop training. It hides nothing: the
// model, optimizer and loaders stay the caller's, usable before and after.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../prof/progress.hpp"
#include "checkpoint.hpp"
#include "metrics.hpp"

namespace dl::nn {

/// What a step hook sees. Setting `stop` ends training after this step.
struct step_info {
    std::int64_t epoch = 0;  ///< 1-based
    std::int64_t step = 0;   ///< steps finished since fit() began
    double loss = 0;         ///< this batch's loss
    double running_loss = 0, running_accuracy = 0;
    bool stop = false;
};

/// What an epoch hook sees. eval_* are NaN without evaluation data.
struct epoch_info {
    std::int64_t epoch = 0;
    double train_loss = 0, train_accuracy = 0;
    double eval_loss = 0, eval_accuracy = 0;
    double seconds = 0;       ///< training time of the epoch (evaluation excluded)
    double wait_seconds = 0;  ///< of which the loop waited for data
    bool stop = false;
};

struct fit_options {
    int epochs = 1;
    bool progress = true;          ///< a progress bar per epoch (plain lines when not a terminal)
    std::ostream* log = &std::cout;
    std::int64_t checkpoint_every = 0;  ///< steps between checkpoints (0: none)
    std::filesystem::path checkpoint_path = "checkpoint.safetensors";
    int early_stopping_patience = 0;  ///< stop after this many epochs without a better eval accuracy (0: never)
    std::function<void(step_info&)> after_step = {};
    std::function<void(epoch_info&)> before_epoch = {}, after_epoch = {};
};

struct fit_result {
    std::vector<epoch_info> epochs;
    double train_seconds = 0;
    bool stopped_early = false;
};

/// Mean loss and accuracy of `model` over one epoch of `loader`, without recording, in eval mode.
template <class Model, class Loss, class Loader>
[[nodiscard]] std::pair<double, double> evaluate(Model& model, Loss&& loss_fn, Loader& loader) {
    running_mean loss, accuracy;
    model.train(false);
    for (auto& b : loader.epoch()) {
        no_grad off(b.inputs.context());
        const auto scores = model(b.inputs);
        const auto n = b.targets.shape()[0];
        loss.add(static_cast<double>(loss_fn(scores, b.targets).item()), n);
        accuracy.add(nn::accuracy(scores, b.targets), n);
    }
    model.train(true);
    return {loss.mean(), accuracy.mean()};
}

/// Trains `model` with `optimizer` on `loss_fn(model(inputs), targets)` over `train` for
/// options.epochs epochs, evaluating on `eval` (may be null) after each. Batches are anything with
/// .inputs and .targets (a data_loader's).
template <class Model, class Optimizer, class Loss, class TrainLoader, class EvalLoader>
fit_result fit(Model& model, Optimizer& optimizer, Loss&& loss_fn, TrainLoader& train, EvalLoader* eval,
               fit_options options = {}) {
    fit_result result;
    std::ostream& log = *options.log;
    double best = -1;
    int epochs_without_gain = 0;
    std::int64_t step = 0;
    bool stop = false;
    for (int epoch = 1; epoch <= options.epochs && !stop; ++epoch) {
        epoch_info info;
        info.epoch = epoch;
        if (options.before_epoch) options.before_epoch(info);
        std::optional<prof::progress_bar> bar;
        if (options.progress)
            bar.emplace("epoch " + std::to_string(epoch) + "/" + std::to_string(options.epochs),
                        train.batches_per_epoch(), train.options().batch_size, log);
        running_mean loss_mean, accuracy_mean;
        const auto start = std::chrono::steady_clock::now();
        std::int64_t in_epoch = 0;
        {
            auto run = train.epoch();
            for (auto& b : run) {
                const auto scores = model(b.inputs);
                auto loss = loss_fn(scores, b.targets);
                optimizer.zero_grad();
                loss.backward();
                optimizer.step();
                ++step, ++in_epoch;
                const auto n = b.targets.shape()[0];
                step_info s{epoch, step, static_cast<double>(loss.item()), 0, 0, false};
                loss_mean.add(s.loss, n);
                accuracy_mean.add(nn::accuracy(scores.detach(), b.targets), n);
                s.running_loss = loss_mean.mean();
                s.running_accuracy = accuracy_mean.mean();
                if (bar) bar->update(in_epoch, {{"loss", s.running_loss}, {"acc", s.running_accuracy}});
                if (options.checkpoint_every > 0 && step % options.checkpoint_every == 0)
                    save_checkpoint(options.checkpoint_path, model, &optimizer);
                if (options.after_step) options.after_step(s);
                if (s.stop) {
                    stop = true;
                    break;
                }
            }
            info.wait_seconds = run.wait_seconds();
        }
        if (bar) bar->finish();
        info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        result.train_seconds += info.seconds;
        info.train_loss = loss_mean.mean();
        info.train_accuracy = accuracy_mean.mean();
        info.eval_loss = info.eval_accuracy = std::numeric_limits<double>::quiet_NaN();
        if (eval) std::tie(info.eval_loss, info.eval_accuracy) = evaluate(model, loss_fn, *eval);
        char line[256];
        std::snprintf(line, sizeof line, "epoch %d: train loss %.4f, accuracy %.4f; eval loss %.4f, accuracy %.4f; %.1f s\n",
                      epoch, info.train_loss, info.train_accuracy, info.eval_loss, info.eval_accuracy, info.seconds);
        log << line;
        // Ignore waits too short to matter (the first batch of a tiny epoch is most of it).
        if (info.wait_seconds > 0.05 && info.wait_seconds > 0.1 * info.seconds) {
            std::snprintf(line, sizeof line,
                          "input-bound: the loop waited %.0f%% of the epoch for data; give the loader more workers "
                          "(loader_options::workers)\n",
                          100 * info.wait_seconds / info.seconds);
            log << line;
        }
        if (options.early_stopping_patience > 0 && eval) {
            if (info.eval_accuracy > best) {
                best = info.eval_accuracy;
                epochs_without_gain = 0;
            } else if (++epochs_without_gain >= options.early_stopping_patience) {
                log << "early stopping: no better eval accuracy for " << epochs_without_gain << " epoch(s)\n";
                info.stop = true;
                result.stopped_early = true;
            }
        }
        if (options.after_epoch) options.after_epoch(info);
        stop = stop || info.stop;
        result.epochs.push_back(info);
    }
    return result;
}

/// fit() without evaluation data.
template <class Model, class Optimizer, class Loss, class TrainLoader>
fit_result fit(Model& model, Optimizer& optimizer, Loss&& loss_fn, TrainLoader& train, fit_options options = {}) {
    return fit(model, optimizer, std::forward<Loss>(loss_fn), train, static_cast<TrainLoader*>(nullptr),
               std::move(options));
}

}  // namespace dl::nn
