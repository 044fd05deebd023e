#pragma once
// Synchronous data-parallel training in graph mode. data_parallel() rewrites a differentiated training
// graph (graph/differentiate.hpp) for one rank of a group: the loss and the gradients are weighted by
// the rank's share of the global batch, packed into one bucket, summed over the group by one allreduce
// node, and unpacked, so every rank ends a run with the global batch's loss and gradients. One
// collective per step (as DDP's buckets do) also keeps the ranks' collectives in the same order whatever
// order an executor runs the nodes in.
//
// train_data_parallel() runs N such replicas in one process: each on its own thread and Context, each on
// its slice of the batch, the parameters shared (read by all, updated once by the optimizer after the
// replicas agree). train_distributed() is one rank's part when ranks are processes (an MPI
// communicator, dist/mpi.hpp) or threads with models of their own: the rank's replica and its own
// optimizer, which applies the same gradients (the same bits) on every rank.
//
// The rewrite assumes the loss is a mean over the batch (the losses' default reduction): the global
// mean is the sum over ranks of (rank's rows / all rows) · rank's mean.
#include <atomic>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../autograd/indexing.hpp"
#include "../autograd/node.hpp"
#include "../autograd/tracing.hpp"
#include "../core/thread_pool.hpp"
#include "../graph/differentiate.hpp"
#include "communicator.hpp"

namespace dl::dist {

/// x combined element by element over the ranks of comm's group (every rank calls it with the same
/// shape). Recorded as an effectful op when traced (the trace itself does not communicate); the
/// communicator must outlive the graph. Its
/// gradient (sum and mean) is the same allreduce of the output's gradient, so every rank must run
/// backward through it too.
template <class T>
    requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
[[nodiscard]] Tensor<T> allreduce(const Tensor<T>& x, communicator& comm, reduce_op op = reduce_op::sum) {
    if (auto* r = x.context().recorder()) {
        // Recording (a trace, or a pass splicing nodes into a graph) does not communicate: the peers
        // are not running with this rank then. A copy of x stands in for the result.
        autograd::op_record record;
        record.name = "allreduce";
        record.attributes = autograd::attributes("op", op, "rank", comm.rank(), "size", comm.size());
        record.kind = autograd::op_kind::effectful;
        record.inputs = {x};
        Tensor<T> stand_in;
        {
            const autograd::recording_paused pause(x.context());
            stand_in = x.clone();
        }
        record.output = stand_in;
        record.kernel = [&comm, op](std::span<const autograd::any_tensor> in, autograd::any_tensor& out) {
            out = allreduce(std::get<Tensor<T>>(in[0]), comm, op);
        };
        r->record(std::move(record));
        return stand_in;
    }
    Tensor<T> out = x.clone();
    comm.allreduce(std::span<T>(out.data(), static_cast<std::size_t>(out.numel())), op);
    if (autograd::records(x)) {
        if (op != reduce_op::sum && op != reduce_op::mean)
            dl::detail::fail("dl::dist::allreduce: no gradient for a max or min reduction");
        autograd::record(
            out,
            [&comm, op](const Tensor<T>& g, const Tensor<T>& in) {
                autograd::accumulate(*autograd::node_of(in), allreduce(g.detach(), comm, op));
            },
            x);
    }
    return out;
}

/// Rewrites a training graph, as graph::differentiate() leaves it (float32 outputs: a loss averaged
/// over the batch, then gradients), for one rank of comm's group: the graph takes one more input, a
/// float32 scalar holding the rank's share of the global batch (its rows / all rows), and its outputs
/// become the global loss and gradients. ctx is the Context the graph was traced on.
inline void data_parallel(graph::Graph& g, communicator& comm, Context& ctx) {
    if (g.outputs.empty()) dl::detail::fail("dl::dist::data_parallel: the graph has no outputs");
    for (int id : g.outputs)
        if (g.values[static_cast<std::size_t>(id)].dtype != DType::float32)
            dl::detail::fail("dl::dist::data_parallel: output %", id, " is ", g.describe_type(id),
                             "; a training graph's outputs (loss, gradients) are float32");
    const int share = g.add_value({DType::float32, Shape{}, false, graph::value_source::input, -1, {}});
    g.inputs.push_back(share);
    std::vector<std::pair<int, autograd::any_tensor>> bound;
    std::vector<Tensor<float>> outputs;  // stand-ins while the new nodes record
    for (int id : g.outputs) {
        outputs.push_back(zeros<float>(g.values[static_cast<std::size_t>(id)].shape, ctx));
        bound.emplace_back(id, outputs.back());
    }
    const Tensor<float> weight = zeros<float>({}, ctx);
    bound.emplace_back(share, weight);
    g.outputs = graph::splice(g, g.nodes.size(), ctx, bound, [&] {
        std::vector<Tensor<float>> flat;
        for (const auto& t : outputs) flat.push_back(t.reshape({-1}));
        const Tensor<float> bucket = allreduce(Tensor<float>(cat(flat, 0) * weight), comm, reduce_op::sum);
        std::vector<Tensor<float>> global;
        std::int64_t at = 0;
        for (const auto& t : outputs) {
            global.push_back(bucket.slice(0, at, at + t.numel()).reshape(t.shape()));
            at += t.numel();
        }
        return global;
    });
    g.verify();
}

namespace detail {

/// Rows [begin, end) of x as a tensor of ctx that borrows x's memory.
template <class T>
[[nodiscard]] Tensor<T> rows_of(const Tensor<T>& x, std::int64_t begin, std::int64_t end, Context& ctx) {
    Shape shape = x.shape();
    shape[0] = end - begin;
    return Tensor<T>::borrow(x.data() + begin * x.strides()[0], shape, x.strides(), ctx);
}

[[nodiscard]] inline std::string message_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

}  // namespace detail

/// A data-parallel training step (see train_data_parallel()). Not safe to call from two threads at once.
template <class Optimizer>
class data_parallel_step {
public:
    data_parallel_step(graph::detail::differentiated_loss d, Optimizer& optimizer, int replicas)
        : group_(replicas), runners_(replicas), optimizer_(optimizer), parameters_(std::move(d.parameters)), context_(*d.context) {
        const int threads = std::max(1, context_.concurrency() / replicas);
        for (int r = 0; r < replicas; ++r) {
            // Each replica has its own pool and autograd state; memory comes from the one allocator, so
            // tensors pass freely between replicas and the caller.
            contexts_.push_back(std::make_unique<Context>(context_options{.seed = context_.seed() + 1 + static_cast<std::uint64_t>(r),
                                                                          .threads = threads,
                                                                          .allocator = context_.shared_allocator(),
                                                                          .flush_denormals = context_.flushes_denormals()}));
            graph::Graph g = d.graph;
            data_parallel(g, group_[r], context_);
            graph::detail::backward_passes().run(g);
            replicas_.emplace_back(std::move(g), *contexts_.back());
        }
    }

    [[nodiscard]] int replicas() const noexcept { return group_.size(); }
    /// Replica r's graph (the rewritten, optimised one).
    [[nodiscard]] graph::function& replica(int r) { return replicas_.at(static_cast<std::size_t>(r)); }
    void set_strategy(graph::strategy s) {
        for (auto& f : replicas_) f.set_strategy(s);
    }

    /// Splits the batch (dimension 0 of every input) into one contiguous slice per replica, runs the
    /// replicas side by side, then the optimizer's step on the gradients they agreed on; returns the
    /// global batch's loss. The batch needs at least as many rows as there are replicas.
    template <class... T>
    Tensor<float> operator()(const Tensor<T>&... batch) {
        const std::int64_t rows = std::get<0>(std::tie(batch...)).rank() > 0 ? std::get<0>(std::tie(batch...)).shape()[0] : 0;
        auto check = [&]<class V>(const Tensor<V>& t) {
            if (t.rank() == 0 || t.shape()[0] != rows)
                dl::detail::fail("dl::dist::data_parallel_step: every input needs the batch of ", rows, " rows as dimension 0, got ",
                                 t.shape());
        };
        (check(batch), ...);
        const int n = replicas();
        if (rows < n) dl::detail::fail("dl::dist::data_parallel_step: a batch of ", rows, " rows cannot be split over ", n, " replicas");
        std::vector<std::vector<autograd::any_tensor>> outputs(static_cast<std::size_t>(n));
        std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
        std::atomic<int> first_failure{-1};
        // As in graph::train_step: the last step's gradients go back to the allocator while warm.
        for (const auto& p : parameters_) autograd::node_of(p)->drop_grad();
        {
            // Ops reading the shared parameters may consult their Context's autograd state.
            const no_grad off(context_);
            // One task per replica on a pool of that many threads: a task blocks in the allreduce until
            // every replica has reached it, and a thread takes a new task only after finishing one, so
            // each thread takes exactly one.
            runners_.parallel_for(n, [&](std::int64_t r) {
                Context& ctx = *contexts_[static_cast<std::size_t>(r)];
                // As on the Context's own threads: the caller runs a replica too, and arithmetic on
                // denormal values (tiny late-training gradients) is ~100× slower without flushing.
                const dl::flush_denormals mode(ctx.flushes_denormals());
                const std::int64_t begin = rows * r / n, end = rows * (r + 1) / n;
                try {
                    const autograd::any_tensor in[] = {autograd::any_tensor(detail::rows_of(batch, begin, end, ctx))...,
                                                       full<float>({}, static_cast<float>(end - begin) / static_cast<float>(rows), ctx)};
                    outputs[static_cast<std::size_t>(r)] = replicas_[static_cast<std::size_t>(r)].run(in);
                } catch (...) {
                    errors[static_cast<std::size_t>(r)] = std::current_exception();
                    int none = -1;
                    first_failure.compare_exchange_strong(none, static_cast<int>(r));  // before the abort makes peers fail
                    group_[static_cast<int>(r)].abort(detail::message_of(errors[static_cast<std::size_t>(r)]));
                }
            });
        }
        if (const int failed = first_failure.load(); failed >= 0) {
            group_.reset();  // every replica has returned: the next step starts clean
            std::rethrow_exception(errors[static_cast<std::size_t>(failed)]);
        }
        const auto& agreed = outputs[0];
        for (std::size_t i = 0; i < parameters_.size(); ++i)
            autograd::node_of(parameters_[i])->grad = std::get<Tensor<float>>(agreed[1 + i]);
        optimizer_.step();
        return std::get<Tensor<float>>(agreed[0]);
    }

private:
    in_process_group group_;
    thread_pool runners_;
    Optimizer& optimizer_;
    std::vector<Tensor<float>> parameters_;  ///< in the order of the graph's gradient outputs
    Context& context_;
    std::vector<std::unique_ptr<Context>> contexts_;
    std::vector<graph::function> replicas_;
};

/// graph::train() over `replicas` in-process replicas: traces loss(examples...), differentiates it,
/// rewrites the graph once per rank (data_parallel()) and optimises each copy. Each call splits the
/// batch, runs the replicas on their own threads (the Context's threads divided among them) and
/// applies the optimizer once to the averaged gradients: the same update as one graph on the whole
/// batch, up to float rounding.
template <class F, class Optimizer, class... T>
[[nodiscard]] data_parallel_step<Optimizer> train_data_parallel(F&& loss, Optimizer& optimizer, int replicas,
                                                                const Tensor<T>&... examples) {
    if (replicas < 1) dl::detail::fail("dl::dist::train_data_parallel: needs at least one replica, got ", replicas);
    return {graph::detail::differentiate_loss(std::forward<F>(loss), examples...), optimizer, replicas};
}

/// One rank's part of synchronous data-parallel training over `comm` (see train_distributed()). Each
/// rank calls it with its own slice of the batch; not safe to call from two threads at once.
template <class Optimizer>
class distributed_step {
public:
    distributed_step(graph::detail::differentiated_loss d, Optimizer& optimizer, communicator& comm)
        : comm_(comm), optimizer_(optimizer), parameters_(starting_from_rank_0(std::move(d.parameters), comm)),
          context_(*d.context), function_(rewritten(std::move(d.graph), comm, *d.context), *d.context) {}

    [[nodiscard]] graph::function& graph() noexcept { return function_; }

    /// Runs this rank's replica on its slice of the global batch (dimension 0 of every input; slices
    /// may differ in size, one may be empty), then the optimizer's step on the gradients every rank
    /// agreed on; returns the global batch's loss. When the replica fails, the group is aborted (peers
    /// throw, or an MPI job ends) and the error is rethrown here.
    template <class... T>
    Tensor<float> operator()(const Tensor<T>&... batch) {
        try {
            const auto& first = std::get<0>(std::tie(batch...));
            const std::int64_t rows = first.rank() > 0 ? first.shape()[0] : 0;
            auto check = [&]<class V>(const Tensor<V>& t) {
                if (t.rank() == 0 || t.shape()[0] != rows)
                    dl::detail::fail("dl::dist::distributed_step: every input needs this rank's ", rows,
                                     " rows as dimension 0, got ", t.shape());
            };
            (check(batch), ...);
            double all_rows = static_cast<double>(rows);  // exact up to 2^53 rows
            comm_.allreduce(std::span<double>(&all_rows, 1), reduce_op::sum);
            if (all_rows == 0) dl::detail::fail("dl::dist::distributed_step: the global batch is empty");
            const autograd::any_tensor in[] = {autograd::any_tensor(batch)...,
                                               full<float>({}, static_cast<float>(static_cast<double>(rows) / all_rows), context_)};
            for (const auto& p : parameters_) autograd::node_of(p)->drop_grad();  // as in graph::train_step
            const auto out = function_.run(in);
            for (std::size_t i = 0; i < parameters_.size(); ++i)
                autograd::node_of(parameters_[i])->grad = std::get<Tensor<float>>(out[1 + i]);
            optimizer_.step();
            return std::get<Tensor<float>>(out[0]);
        } catch (const std::exception& e) {
            comm_.abort(e.what());
            throw;
        }
    }

private:
    /// Every rank starts from rank 0's parameter values, whatever its own initialisation.
    static std::vector<Tensor<float>> starting_from_rank_0(std::vector<Tensor<float>> parameters, communicator& comm) {
        for (Tensor<float>& p : parameters) {
            if (!p.is_contiguous()) dl::detail::fail("dl::dist::distributed_step: a parameter of shape ", p.shape(), " is not contiguous");
            comm.broadcast(std::span<float>(p.data(), static_cast<std::size_t>(p.numel())), 0);
        }
        return parameters;
    }
    static graph::Graph rewritten(graph::Graph g, communicator& comm, Context& ctx) {
        data_parallel(g, comm, ctx);
        graph::detail::backward_passes().run(g);
        return g;
    }

    communicator& comm_;
    Optimizer& optimizer_;
    std::vector<Tensor<float>> parameters_;  ///< in the order of the graph's gradient outputs
    Context& context_;
    graph::function function_;
};

/// This rank's training step for synchronous data parallelism over `comm`, whose every rank calls it
/// with the same loss function over its own model (same architecture; the parameters start from rank
/// 0's values), its own optimizer and example inputs: traces loss(examples...), differentiates it and
/// rewrites it for the rank (data_parallel()). Every step then updates all ranks' models identically,
/// as one graph would on the whole batch (up to float rounding).
template <class F, class Optimizer, class... T>
[[nodiscard]] distributed_step<Optimizer> train_distributed(communicator& comm, F&& loss, Optimizer& optimizer,
                                                            const Tensor<T>&... examples) {
    return {graph::detail::differentiate_loss(std::forward<F>(loss), examples...), optimizer, comm};
}

}  // namespace dl::dist
