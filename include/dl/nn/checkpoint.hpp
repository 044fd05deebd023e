#pragma once
// Checkpoints in the safetensors format (io/safetensors.hpp). save_checkpoint writes a model's
// parameters and buffers (and an optimizer's state); load_checkpoint checks every name, shape and dtype
// first and reports every mismatch at once, loading nothing unless all match.
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../autograd/node.hpp"
#include "../io/safetensors.hpp"
#include "layer.hpp"

namespace dl::nn {

/// Calls f(name, tensor) for every parameter of `model` and then every buffer (running statistics)
/// of the layers that have them.
template <layer L, class F>
void for_each_tensor(L& model, F&& f) {
    model.for_each_parameter(f);
    if constexpr (requires { model.for_each_buffer(f); }) model.for_each_buffer(f);
}

/// Saves the model's parameters and buffers, and the optimizer's state when given (as
/// "optimizer.<state>.<parameter index>" and "optimizer.steps").
template <layer L, class Optimizer = std::nullptr_t>
void save_checkpoint(const std::filesystem::path& path, L& model, Optimizer* optimizer = nullptr) {
    safetensors_writer w;
    for_each_tensor(model, [&](std::string_view name, const auto& t) { w.add(std::string(name), t); });
    if constexpr (!std::is_same_v<Optimizer, std::nullptr_t>) {
        if (optimizer) {
            optimizer->for_each_state([&](const std::string& name, const auto& t) { w.add("optimizer." + name, t); });
            w.add("optimizer.steps", scalar_tensor<std::int64_t>(optimizer->steps()));
        }
    }
    w.set_metadata("format", "dl");
    w.write(path);
}

/// Loads what save_checkpoint wrote (or any safetensors file with the same names). Every expected
/// tensor must be present with the same shape and dtype, and nothing unexpected may be in the file
/// (except optimizer state when no optimizer is given); otherwise the error lists every mismatch and
/// nothing is changed.
template <layer L, class Optimizer = std::nullptr_t>
void load_checkpoint(const std::filesystem::path& path, L& model, Optimizer* optimizer = nullptr) {
    const safetensors_file file(path);
    std::vector<std::string> problems;
    std::set<std::string> expected;
    auto check = [&](const std::string& name, DType dtype, const Shape& shape) {
        expected.insert(name);
        const auto it = file.tensors().find(name);
        if (it == file.tensors().end())
            problems.push_back("missing '" + name + "'");
        else if (it->second.dtype != dtype || it->second.shape != shape)
            problems.push_back(dl::detail::concat("'", name, "' is ", it->second.dtype, " ", it->second.shape,
                                                  " in the file, ", dtype, " ", shape, " in the model"));
    };
    for_each_tensor(model, [&](std::string_view name, const auto& t) { check(std::string(name), t.dtype(), t.shape()); });
    const bool with_optimizer = [&] {
        if constexpr (std::is_same_v<Optimizer, std::nullptr_t>)
            return false;
        else
            return optimizer != nullptr;
    }();
    if constexpr (!std::is_same_v<Optimizer, std::nullptr_t>) {
        if (optimizer) {
            optimizer->for_each_state(
                [&](const std::string& name, const auto& t) { check("optimizer." + name, t.dtype(), t.shape()); });
            check("optimizer.steps", DType::int64, Shape{});
        }
    }
    for (const auto& [name, stored] : file.tensors())
        if (!expected.count(name) && (with_optimizer || name.rfind("optimizer.", 0) != 0))
            problems.push_back("unexpected '" + name + "'");
    if (!problems.empty()) {
        std::string all;
        for (const auto& p : problems) all += "\n  " + p;
        dl::detail::fail("dl::nn: checkpoint ", path.string(), " does not match (nothing was loaded):", all);
    }
    for_each_tensor(model, [&](std::string_view name, auto& t) {
        no_grad off(t.context());
        auto target = t.detach();
        file.read_into(std::string(name), target);
    });
    if constexpr (!std::is_same_v<Optimizer, std::nullptr_t>) {
        if (optimizer) {
            optimizer->for_each_state([&](const std::string& name, auto& t) { file.read_into("optimizer." + name, t); });
            optimizer->set_steps(file.get<std::int64_t>("optimizer.steps").item());
        }
    }
}

}  // namespace dl::nn
