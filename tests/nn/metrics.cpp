// Metrics against hand-computed values and brute force; the progress display's two modes.
#include "support.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

using dl::Tensor;

TEST_CASE("accuracy, top-k accuracy and the confusion matrix") {
    const auto scores = dl::tensor<float>({{0.1f, 0.7f, 0.2f}, {0.5f, 0.3f, 0.2f}, {0.2f, 0.3f, 0.5f}, {0.4f, 0.4f, 0.2f}});
    const auto labels = dl::tensor<std::int64_t>({1, 2, 2, 1});
    CHECK(dl::nn::accuracy(scores, labels) == doctest::Approx(0.5));  // row 3 ties: the first class wins
    CHECK(dl::nn::top_k_accuracy(scores, labels, 1) == doctest::Approx(0.5));
    CHECK(dl::nn::top_k_accuracy(scores, labels, 2) == doctest::Approx(0.75));  // row 1: label 2 is third
    CHECK(dl::nn::top_k_accuracy(scores, labels, 3) == doctest::Approx(1.0));
    dl::nn::confusion_matrix m(3);
    m.add(scores, labels);
    CHECK(m(1, 1) == 1);
    CHECK(m(1, 0) == 1);
    CHECK(m(2, 0) == 1);
    CHECK(m(2, 2) == 1);
    CHECK(m.total() == 4);
    CHECK(m.accuracy() == doctest::Approx(0.5));
    CHECK(m.recall(2) == doctest::Approx(0.5));
    CHECK(dl_test::to_string(m) == "0 0 0\n1 1 0\n1 0 1\n");
    CHECK(dl_test::error_message([&] { m.add(scores, dl::tensor<std::int64_t>({1, 2, 3, 0})); }).find("label 3") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::nn::accuracy(scores, dl::tensor<std::int64_t>({1})); }).find("[4, 3]") !=
          std::string::npos);
}

TEST_CASE("running mean weights by count; ROC AUC equals the pairwise definition, ties counting half") {
    dl::nn::running_mean r;
    CHECK(r.mean() == 0);
    r.add(1.0, 3);
    r.add(3.0, 1);
    CHECK(r.mean() == doctest::Approx(1.5));
    CHECK(r.count() == 4);

    dl::Context ctx({.seed = 9, .threads = 1});
    const auto scores = dl::round(dl::uniform<float>({200}, 0, 1, ctx) * 10.0f).eval();  // many ties
    const auto labels = (dl::uniform<float>({200}, 0, 1, ctx) < 0.3f).eval();
    double wins = 0, pairs = 0;
    for (std::int64_t i = 0; i < 200; ++i)
        for (std::int64_t j = 0; j < 200; ++j)
            if (labels(i) && !labels(j)) {
                wins += scores(i) > scores(j) ? 1 : scores(i) == scores(j) ? 0.5 : 0;
                pairs += 1;
            }
    CHECK(dl::nn::roc_auc(scores, labels) == doctest::Approx(wins / pairs).epsilon(1e-12));
    CHECK(dl::nn::roc_auc(dl::tensor<float>({1, 2, 3}), dl::tensor<int>({0, 1, 1})) == doctest::Approx(1.0));
    CHECK(dl_test::error_message([] { (void)dl::nn::roc_auc(dl::tensor<float>({1, 2}), dl::tensor<int>({1, 1})); })
              .find("both positive and negative") != std::string::npos);
}

TEST_CASE("progress: plain lines for logs, a redrawn bar with ETA on a terminal") {
    std::ostringstream log;
    {
        dl::prof::progress_bar bar("epoch 1/2", 4, 32, log, {.log_every = 1e9}, false);
        for (int i = 1; i <= 4; ++i) bar.update(i, {{"loss", 0.5}});
    }
    const std::string text = log.str();
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);  // only the final line: log_every not reached
    CHECK(text.find("epoch 1/2 4/4 loss 0.5 | ") != std::string::npos);
    CHECK(text.find("samples/s") != std::string::npos);

    std::ostringstream tty;
    dl::prof::progress_bar bar("train", 10, 1, tty, {.redraw_seconds = 0}, true);
    bar.update(5, {{"acc", 0.25}});
    CHECK(tty.str().find("\rtrain [===============>") != std::string::npos);
    CHECK(tty.str().find("5/10 acc 0.25") != std::string::npos);
    CHECK(tty.str().find("ETA") != std::string::npos);
    bar.finish();
    CHECK(tty.str().back() == '\n');
}

TEST_CASE("training curves as an SVG plot: one panel per group, one polyline per series") {
    const auto path = std::filesystem::temp_directory_path() / ("dl_test_plot_" + std::to_string(::getpid()) + ".svg");
    dl::prof::write_svg_plot(path, "run <1>", {{{"loss", {0.9, 0.5, 0.4}}}, {{"train", {0.7, 0.8, 0.9}}, {"test", {0.6, 0.7, 0.7}}}});
    std::ifstream in(path);
    const std::string svg{std::istreambuf_iterator<char>(in), {}};
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("</svg>") != std::string::npos);
    std::size_t lines = 0;
    for (auto at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
    CHECK(lines == 3);
    CHECK(svg.find(">test</text>") != std::string::npos);
    CHECK(svg.find("run &lt;1&gt;") != std::string::npos);
    std::filesystem::remove(path);
}
