// An engine that passes everything to another one: tests derive from it to
// change or watch one thing (what it reports, the specs it is given, the
// chunk it plans).
#ifndef FLCE_TESTS_SUPPORT_DELEGATING_ENGINE_H_
#define FLCE_TESTS_SUPPORT_DELEGATING_ENGINE_H_

#include <memory>
#include <utility>

#include "kernels/engine.h"

namespace flce::test {

class DelegatingEngine : public Engine {
 public:
  // Owns the engine it passes to.
  explicit DelegatingEngine(std::unique_ptr<Engine> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}
  // Passes to an engine owned elsewhere, which must outlive this one.
  explicit DelegatingEngine(Engine& inner) : inner_(&inner) {}

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
  absl::StatusOr<std::shared_ptr<const PeerMemory>> OpenPeerMemory(
      const PeerMemoryHandle& handle) override {
    return inner_->OpenPeerMemory(handle);
  }
  absl::StatusOr<std::shared_ptr<const PeerMemory>> RegisterHostMemory(void* base,
                                                                       int64_t bytes) override {
    return inner_->RegisterHostMemory(base, bytes);
  }
  absl::Status ReadPeerMemory(const PeerMemory& memory, int64_t offset, int64_t bytes,
                              void* host_out) override {
    return inner_->ReadPeerMemory(memory, offset, bytes, host_out);
  }
  int64_t PlannedChunkTokens(const Head& head, const ComputeSpec& spec) const override {
    return inner_->PlannedChunkTokens(head, spec);
  }
  bool healthy() const override { return inner_->healthy(); }

 private:
  std::unique_ptr<Engine> owned_;
  Engine* inner_;
};

}  // namespace flce::test

#endif  // FLCE_TESTS_SUPPORT_DELEGATING_ENGINE_H_
