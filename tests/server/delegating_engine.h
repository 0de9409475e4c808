// An engine that passes everything to another one: tests derive from it to
// change or watch one thing (what it reports, the specs it is given).
#ifndef FLCE_TESTS_SERVER_DELEGATING_ENGINE_H_
#define FLCE_TESTS_SERVER_DELEGATING_ENGINE_H_

#include <memory>
#include <utility>

#include "kernels/engine.h"

namespace flce::server::test {

class DelegatingEngine : public Engine {
 public:
  explicit DelegatingEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  EngineInfo info() const override { return inner_->info(); }
  absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) override {
    return inner_->BeginHead(spec);
  }
  absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) override {
    return inner_->NewGradBuffer(spec);
  }
  absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                            ComputeSpec spec,
                                                            GradInputSink sink) override {
    return inner_->StartCompute(std::move(head), std::move(spec), std::move(sink));
  }
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(
      std::shared_ptr<const Head> head, const OptimizerConfig& config) override {
    return inner_->CreateOptimizer(std::move(head), config);
  }
  bool healthy() const override { return inner_->healthy(); }

 private:
  std::unique_ptr<Engine> inner_;
};

}  // namespace flce::server::test

#endif  // FLCE_TESTS_SERVER_DELEGATING_ENGINE_H_
