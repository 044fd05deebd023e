// A click-through-rate model trained against the parameter server: DeepFM on a synthetic click log.
// Run: scripts/run-example recommender [--train N] [--test N] [--epochs N] [--workers N] [--batch N]
//      [--dim K] [--admit N] [--optimizer adagrad|ftrl] [--lr X] [--l1 X] [--l2 X] [--init X]
//      [--servers host:port,...] [--threads N] [--data DIR]
//
// The click log: 26 sparse fields whose ids follow a Zipf law (s = 1.1) over vocabularies of 20k to
// 95k ranks each (1.5M ids in all), hashed to 64-bit feature ids as production systems do. Clicks
// are drawn from a hidden logistic model: a weight for each of the 100 most frequent ids of every
// field, none for the long tail (which still has to be stored, or kept out). So the best AUC any
// model can reach on the test set is known: that of the true click probabilities. The log is written
// once to --data (default ./recommender_data) in dl's record format, a block of examples as a CSR
// record of ids and a record of labels, and read back from there.
//
// The model (DeepFM): each id has a row of 1 + K floats on the parameter server, a first-order
// weight and a K-dim factor; logit = Σ weights + FM(factors) + MLP(concatenated factors). The MLP's
// weights live on the server too (a dense table, Adam); the embedding table uses Adagrad (or FTRL)
// and admits an id at its --admit-th push (default 20), so the rare ids whose weights could only be
// noise never get a row. --workers threads train asynchronously, each with its own client: it
// prefetches the next batch's rows while computing the current one and pushes its gradients without
// waiting for the previous step's. Without --servers the service runs in-process (embedded); with
// it, on ps_server processes over TCP.
//
// Per epoch it prints the loss, the test AUC against the best and examples/s, and it ends with
// `test_auc=... best_auc=... gap=...`.
#include <dl/data.hpp>
#include <dl/prof/progress.hpp>
#include <dl/ps.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
namespace nn = dl::nn;
using dl::Tensor;

constexpr int fields = 26;
constexpr std::uint32_t embedding_table = 1, dense_table = 2, dense_row = 64;

struct settings {
    std::int64_t train = 1'000'000, test = 100'000, batch = 512;
    int epochs = 2, workers = 2, dim = 8;
    unsigned threads = 2;
    std::uint32_t admit = 20;
    float lr = 0.05f, l1 = 0, l2 = 0, init = 0.01f;
    std::string optimizer = "adagrad";
    std::vector<std::string> servers;
    std::string data = "recommender_data";
};

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + flag);
            return argv[++i];
        };
        if (flag == "--train") s.train = std::stoll(value());
        else if (flag == "--test") s.test = std::stoll(value());
        else if (flag == "--epochs") s.epochs = std::stoi(value());
        else if (flag == "--workers") s.workers = std::stoi(value());
        else if (flag == "--batch") s.batch = std::stoll(value());
        else if (flag == "--dim") s.dim = std::stoi(value());
        else if (flag == "--admit") s.admit = static_cast<std::uint32_t>(std::stoul(value()));
        else if (flag == "--lr") s.lr = std::stof(value());
        else if (flag == "--l1") s.l1 = std::stof(value());
        else if (flag == "--init") s.init = std::stof(value());
        else if (flag == "--l2") s.l2 = std::stof(value());
        else if (flag == "--optimizer") s.optimizer = value();
        else if (flag == "--threads") s.threads = static_cast<unsigned>(std::stoul(value()));
        else if (flag == "--data") s.data = value();
        else if (flag == "--servers") {
            std::string list = value();
            for (std::size_t at = 0; at <= list.size();) {
                const std::size_t comma = std::min(list.find(',', at), list.size());
                if (comma > at) s.servers.push_back(list.substr(at, comma - at));
                at = comma + 1;
            }
        } else {
            throw std::runtime_error("unknown flag " + flag + " (see the top of examples/recommender/main.cpp)");
        }
    }
    if (s.workers < 1 || s.batch < 1 || s.dim < 1 || s.train < s.batch || s.test < 2) throw std::runtime_error("sizes must be positive");
    return s;
}

// --- the synthetic click log ---

/// The hidden model the clicks come from, and the Zipf samplers of the fields.
class click_model {
public:
    static constexpr std::uint32_t signal_ranks = 100;  ///< ids of rank below this carry a weight

    click_model() {
        for (int f = 0; f < fields; ++f) {
            const std::uint32_t ranks = 20'000 + 3'000 * static_cast<std::uint32_t>(f);
            auto& cdf = cdf_[f];
            cdf.resize(ranks);
            double total = 0;
            for (std::uint32_t r = 0; r < ranks; ++r) cdf[r] = total += std::pow(r + 1.0, -1.1);
            for (double& c : cdf) c /= total;
        }
    }
    [[nodiscard]] static std::uint64_t total_ids() {
        std::uint64_t n = 0;
        for (int f = 0; f < fields; ++f) n += 20'000 + 3'000 * static_cast<std::uint64_t>(f);
        return n;
    }
    /// A rank of field f drawn from its Zipf law.
    [[nodiscard]] std::uint32_t sample_rank(int f, double u) const {
        return static_cast<std::uint32_t>(std::lower_bound(cdf_[f].begin(), cdf_[f].end(), u) - cdf_[f].begin());
    }
    /// The 64-bit feature id of (field, rank): a hash, as production systems key their features.
    [[nodiscard]] static std::uint64_t feature_id(int f, std::uint32_t rank) {
        return dl::ps::detail::mix64((std::uint64_t(f) << 32) | rank) | 1;
    }
    /// The true click probability of an example given as ranks.
    [[nodiscard]] static double probability(const std::array<std::uint32_t, fields>& ranks) {
        double logit = -1.4;
        for (int f = 0; f < fields; ++f) logit += weight(f, ranks[f]);
        return 1 / (1 + std::exp(-logit));
    }

private:
    [[nodiscard]] static double weight(int f, std::uint32_t rank) {
        return rank < signal_ranks ? 0.5 * dl::detail::normal_at(77, (std::uint64_t(f) << 32) | rank) : 0.0;
    }
    std::array<std::vector<double>, fields> cdf_;
};

/// Examples as CSR rows of `fields` ids each, with their labels (and, for the test set, the true
/// click probability the labels were drawn from).
struct click_set {
    std::vector<std::uint64_t> ids;  // [n * fields]
    std::vector<float> labels;       // [n]
    std::vector<float> truth;        // [n]
    [[nodiscard]] std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
};

/// Writes n examples (seeded by `seed`) to a record file, in blocks of 4096: a CSR record of the ids,
/// then a record of the labels and the true probabilities.
void write_clicks(const fs::path& file, std::int64_t n, std::uint64_t seed, const click_model& model) {
    dl::data::record_writer out(file);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> unit(0, 1);
    constexpr std::int64_t block = 4096;
    dl::prof::progress_bar bar("generating " + file.filename().string(), (n + block - 1) / block, block);
    for (std::int64_t first = 0, b = 0; first < n; first += block, ++b) {
        const std::int64_t rows = std::min(block, n - first);
        std::vector<std::uint64_t> offsets(static_cast<std::size_t>(rows) + 1), ids;
        std::vector<float> labels_and_truth(static_cast<std::size_t>(2 * rows));
        ids.reserve(static_cast<std::size_t>(rows * fields));
        for (std::int64_t r = 0; r < rows; ++r) {
            std::array<std::uint32_t, fields> ranks;
            for (int f = 0; f < fields; ++f) {
                ranks[f] = model.sample_rank(f, unit(rng));
                ids.push_back(click_model::feature_id(f, ranks[f]));
            }
            offsets[r + 1] = ids.size();
            const double p = click_model::probability(ranks);
            labels_and_truth[r] = unit(rng) < p ? 1.0f : 0.0f;
            labels_and_truth[rows + r] = static_cast<float>(p);
        }
        const auto csr = dl::data::encode_csr(offsets, ids);
        out.write(csr);
        out.write(std::as_bytes(std::span(labels_and_truth)));
        bar.update(b + 1);
    }
    out.close();
}

click_set read_clicks(const fs::path& file) {
    click_set set;
    dl::data::record_reader in(file);
    while (auto csr_record = in.next()) {
        const dl::data::csr_view csr = dl::data::decode_csr(*csr_record);
        if (csr.ids.size() != static_cast<std::size_t>(csr.rows()) * fields) throw std::runtime_error(file.string() + ": a row without 26 ids");
        set.ids.insert(set.ids.end(), csr.ids.begin(), csr.ids.end());
        const auto rows = static_cast<std::size_t>(csr.rows());
        const auto values = in.next();
        if (!values || values->size() != rows * 8) throw std::runtime_error(file.string() + ": a block without its labels");
        const auto* f = reinterpret_cast<const float*>(values->data());
        set.labels.insert(set.labels.end(), f, f + rows);
        set.truth.insert(set.truth.end(), f + rows, f + 2 * rows);
    }
    return set;
}

double auc(const std::vector<float>& scores, const std::vector<float>& labels) {
    const auto n = static_cast<std::int64_t>(scores.size());
    Tensor<float> s({n}), l({n});
    std::copy(scores.begin(), scores.end(), s.data());
    std::copy(labels.begin(), labels.end(), l.data());
    return nn::roc_auc(s, l);
}

// --- the model ---

/// DeepFM's dense part, replicated in every worker; its weights come from the dense table.
struct deep_part {
    nn::linear<float> hidden, out;
    deep_part(std::int64_t in, dl::Context& ctx) : hidden(in, 32, true, ctx), out(32, 1, true, ctx) {}
    template <class F>
    void for_each_parameter(F&& f) {
        nn::visit(f, "hidden", hidden);
        nn::visit(f, "out", out);
    }
    void train(bool) {}
};

/// logit [B] of DeepFM from the batch's rows E [B * fields, 1 + K].
Tensor<float> deepfm(const Tensor<float>& rows, deep_part& deep, std::int64_t batch, std::int64_t k) {
    const Tensor<float> e = rows.reshape({batch, fields, 1 + k});
    const Tensor<float> first = dl::sum(e.slice(2, 0, 1), {1, 2});
    const Tensor<float> v = e.slice(2, 1, 1 + k);
    const Tensor<float> s = dl::sum(v, {1});
    const Tensor<float> fm = (dl::sum(dl::square(s), {1}) - dl::sum(dl::square(v), {1, 2})) * 0.5f;
    const Tensor<float> mlp = deep.out(dl::Tensor<float>(dl::relu(deep.hidden(v.reshape({batch, fields * k}))))).reshape({batch});
    return first + fm + mlp;
}

/// Moves the dense parameters between the model and rows of the dense table.
struct dense_layout {
    std::vector<Tensor<float>> params;
    std::size_t floats = 0;
    std::vector<std::uint64_t> row_ids;
    explicit dense_layout(deep_part& deep) : params(nn::parameters(deep)) {
        for (const auto& p : params) floats += static_cast<std::size_t>(p.numel());
        row_ids.resize((floats + dense_row - 1) / dense_row);
        std::iota(row_ids.begin(), row_ids.end(), 0);
    }
    [[nodiscard]] std::size_t padded() const { return row_ids.size() * dense_row; }
    void load(const std::vector<float>& flat) const {
        std::size_t at = 0;
        for (const auto& p : params) {
            std::copy_n(flat.data() + at, p.numel(), p.data());
            at += static_cast<std::size_t>(p.numel());
        }
    }
    void gradients(std::vector<float>& flat) const {
        flat.assign(padded(), 0.0f);
        std::size_t at = 0;
        for (const auto& p : params) {
            const Tensor<float> g = p.grad().contiguous();
            std::copy_n(g.data(), p.numel(), flat.data() + at);
            at += static_cast<std::size_t>(p.numel());
        }
    }
};

}  // namespace

int main(int argc, char** argv) try {
    const settings s = parse(argc, argv);
    const std::int64_t k = s.dim;
    fs::create_directories(s.data);
    const fs::path train_file = fs::path(s.data) / ("clicks_train_" + std::to_string(s.train) + ".rec");
    const fs::path test_file = fs::path(s.data) / ("clicks_test_" + std::to_string(s.test) + ".rec");
    {
        const click_model model;
        if (!fs::exists(train_file)) write_clicks(train_file, s.train, 1, model);
        if (!fs::exists(test_file)) write_clicks(test_file, s.test, 2, model);
    }
    const click_set train = read_clicks(train_file), test = read_clicks(test_file);
    const double best_auc = auc(test.truth, test.labels);
    std::printf("click log: %lld train and %lld test examples, %d fields, %llu ids in the vocabularies; best test AUC %.4f\n",
                static_cast<long long>(train.size()), static_cast<long long>(test.size()), fields,
                static_cast<unsigned long long>(click_model::total_ids()), best_auc);

    // The parameter server: in-process, or the given cluster.
    std::unique_ptr<dl::ps::service> embedded;
    auto make_client = [&] {
        if (s.servers.empty()) return std::make_unique<dl::ps::client>(*embedded);
        return std::make_unique<dl::ps::client>(dl::ps::client_options{s.servers, std::chrono::milliseconds(10000)});
    };
    if (s.servers.empty()) embedded = std::make_unique<dl::ps::service>(dl::ps::service_options{.threads = s.threads});
    dl::Context seed_ctx({.seed = 7, .threads = 1});
    deep_part seed_model(fields * k, seed_ctx);
    const dense_layout seed_layout(seed_model);
    {
        auto c = make_client();
        dl::ps::table_config emb;
        emb.id = embedding_table;
        emb.dim = static_cast<std::uint32_t>(1 + k);
        emb.init = {dl::ps::initializer_kind::uniform, s.init};
        emb.optimizer = {.kind = s.optimizer == "ftrl" ? dl::ps::optimizer_kind::ftrl : dl::ps::optimizer_kind::adagrad,
                         .lr = s.lr,
                         .initial_accumulator = 0.1f,
                         .l1 = s.l1,
                         .l2 = s.l2};
        emb.admit_after = s.admit;
        c->create_table(emb).get();
        // The dense table holds the MLP's weights minus their initial values (it starts at zero):
        // workers add the seed model's initial weights to what they pull, so the MLP starts from a
        // proper random init and the gradients are the same.
        dl::ps::table_config dense;
        dense.id = dense_table;
        dense.dim = dense_row;
        dense.init.kind = dl::ps::initializer_kind::zeros;
        dense.optimizer = {.kind = dl::ps::optimizer_kind::adam, .lr = 1e-3f, .eps = 1e-8f};
        c->create_table(dense).get();
    }
    std::vector<float> dense_offset(seed_layout.padded(), 0.0f);
    {
        std::size_t at = 0;
        for (const auto& p : seed_layout.params) {
            const Tensor<float> v = p.contiguous();
            std::copy_n(v.data(), p.numel(), dense_offset.data() + at);
            at += static_cast<std::size_t>(p.numel());
        }
    }

    const std::int64_t batches = train.size() / s.batch;
    for (int epoch = 1; epoch <= s.epochs; ++epoch) {
        std::atomic<std::int64_t> next{0}, done{0};
        std::mutex report;
        double loss_sum = 0;
        std::int64_t seen = 0;
        dl::prof::progress_bar bar("epoch " + std::to_string(epoch), batches, s.batch, std::cout, {.unit = "examples"});
        const auto start = std::chrono::steady_clock::now();
        std::vector<std::thread> workers;
        for (int w = 0; w < s.workers; ++w)
            workers.emplace_back([&, w] {
                dl::Context ctx({.seed = 100 + static_cast<std::uint64_t>(w), .threads = 1});
                deep_part deep(fields * k, ctx);
                const dense_layout layout(deep);
                auto c = make_client();
                const auto rows_per_batch = static_cast<std::size_t>(s.batch * fields);
                std::array<std::vector<float>, 2> rows{std::vector<float>(rows_per_batch * (1 + k)), std::vector<float>(rows_per_batch * (1 + k))};
                std::array<std::vector<float>, 2> dense{std::vector<float>(layout.padded()), std::vector<float>(layout.padded())};
                std::array<std::future<void>, 2> rows_ready, dense_ready;
                std::future<void> pushed_rows, pushed_dense;
                std::vector<float> dense_grads;
                auto batch_ids = [&](std::int64_t b) { return std::span(train.ids).subspan(static_cast<std::size_t>(b * s.batch * fields), rows_per_batch); };
                auto fetch = [&](std::int64_t b, int slot) {
                    rows_ready[slot] = c->pull(embedding_table, batch_ids(b), rows[slot]);
                    dense_ready[slot] = c->pull(dense_table, layout.row_ids, dense[slot]);
                };
                std::int64_t b = next++;
                int slot = 0;
                if (b < batches) fetch(b, slot);
                double local_loss = 0;
                std::int64_t local_seen = 0;
                while (b < batches) {
                    const std::int64_t following = next++;
                    if (following < batches) fetch(following, 1 - slot);  // prefetch while this batch computes
                    rows_ready[slot].get();
                    dense_ready[slot].get();
                    for (std::size_t i = 0; i < dense_offset.size(); ++i) dense[slot][i] += dense_offset[i];
                    layout.load(dense[slot]);
                    nn::zero_grad(layout.params);
                    Tensor<float> e({s.batch * fields, 1 + k}, ctx);
                    std::copy(rows[slot].begin(), rows[slot].end(), e.data());
                    e.requires_grad_();
                    Tensor<float> labels({s.batch}, ctx);
                    std::copy_n(train.labels.data() + b * s.batch, s.batch, labels.data());
                    const Tensor<float> loss = nn::binary_cross_entropy_with_logits(deepfm(e, deep, s.batch, k), labels);
                    loss.backward();
                    local_loss += static_cast<double>(loss.item()) * static_cast<double>(s.batch);
                    local_seen += s.batch;
                    // One push of each kind in flight: wait for the previous before sending the next.
                    if (pushed_rows.valid()) pushed_rows.get();
                    if (pushed_dense.valid()) pushed_dense.get();
                    const Tensor<float> g = e.grad().contiguous();
                    pushed_rows = c->push(embedding_table, batch_ids(b), std::span<const float>(g.data(), static_cast<std::size_t>(g.numel())));
                    layout.gradients(dense_grads);
                    pushed_dense = c->push(dense_table, layout.row_ids, dense_grads);
                    const std::int64_t finished = ++done;
                    if (w == 0) bar.update(finished, {{"loss", local_loss / static_cast<double>(local_seen)}});
                    b = following;
                    slot = 1 - slot;
                }
                if (pushed_rows.valid()) pushed_rows.get();
                if (pushed_dense.valid()) pushed_dense.get();
                std::lock_guard lock(report);
                loss_sum += local_loss;
                seen += local_seen;
            });
        for (auto& t : workers) t.join();
        bar.update(batches, {{"loss", loss_sum / static_cast<double>(seen)}});
        bar.finish();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

        // Test AUC with the current server state.
        dl::Context ctx({.seed = 1, .threads = 1});
        deep_part deep(fields * k, ctx);
        const dense_layout layout(deep);
        auto c = make_client();
        std::vector<float> dense(layout.padded());
        c->pull(dense_table, layout.row_ids, dense).get();
        for (std::size_t i = 0; i < dense_offset.size(); ++i) dense[i] += dense_offset[i];
        layout.load(dense);
        std::vector<float> scores(static_cast<std::size_t>(test.size()));
        dl::no_grad off(ctx);
        for (std::int64_t first = 0; first < test.size(); first += s.batch) {
            const std::int64_t n = std::min(s.batch, test.size() - first);
            const auto ids = std::span(test.ids).subspan(static_cast<std::size_t>(first * fields), static_cast<std::size_t>(n * fields));
            Tensor<float> e({n * fields, 1 + k}, ctx);
            c->pull(embedding_table, ids, std::span(e.data(), static_cast<std::size_t>(e.numel()))).get();
            const Tensor<float> logits = deepfm(e, deep, n, k);
            std::copy_n(logits.data(), n, scores.data() + first);
        }
        const double test_auc = auc(scores, test.labels);
        std::printf("epoch %d: loss %.4f  test AUC %.4f (best %.4f)  %.0f examples/s with %d workers\n", epoch, loss_sum / static_cast<double>(seen),
                    test_auc, best_auc, static_cast<double>(seen) / seconds, s.workers);
        if (epoch == s.epochs) {
            const auto stats = c->stats(embedding_table).get();
            std::printf("embedding rows stored: %llu (%.1f MB)\n", static_cast<unsigned long long>(stats.rows), static_cast<double>(stats.reserved_bytes) / 1e6);
            std::printf("test_auc=%.4f best_auc=%.4f gap=%.4f\n", test_auc, best_auc, best_auc - test_auc);
        }
    }
    return 0;
} catch (const std::exception& e) {
    std::cerr << "recommender: " << e.what() << "\n";
    return 1;
}
