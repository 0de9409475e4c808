// A preference objective's call (ComputeSpec::preference) on any engine: a
// pair's loss needs its responses' whole log-probs before any gradient, so
// the rows go through the engine twice. The first pass (forward only, the
// log-probs) runs as the rows arrive; the rows are kept (host rows copied,
// peer rows by reference: the exporter's memory lives as long as the call);
// at Finish the objective turns the log-probs into a_t = -dL/dlogp_t and a
// second pass over the kept rows computes the cross-entropy's gradient
// weighted by them: grad_input, grad_W and the outputs asked for.
#ifndef FLCE_KERNELS_PREFERENCE_CALL_H_
#define FLCE_KERNELS_PREFERENCE_CALL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "kernels/held_rows.h"

namespace flce {

class PreferenceComputeCall : public ComputeCall {
 public:
  static absl::StatusOr<std::unique_ptr<ComputeCall>> Start(Engine& engine,
                                                            std::shared_ptr<const Head> head,
                                                            ComputeSpec spec, GradInputSink sink);

  absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) override;
  absl::StatusOr<PeerRows> AddHiddenFromPeer(int64_t token_offset, int64_t rows,
                                             const PeerMemory& memory,
                                             int64_t byte_offset) override;
  absl::StatusOr<ComputeResult> Finish() override;

 private:
  struct PeerPiece {
    int64_t token_offset;
    int64_t rows;
    const PeerMemory* memory;
    int64_t byte_offset;
  };

  PreferenceComputeCall(Engine& engine, std::shared_ptr<const Head> head, ComputeSpec spec,
                        GradInputSink sink, int64_t row_bytes);

  Engine& engine_;
  std::shared_ptr<const Head> head_;
  ComputeSpec spec_;  // the caller's, objective included
  GradInputSink sink_;
  int64_t row_bytes_;
  std::unique_ptr<ComputeCall> first_;  // the log-probs
  HeldRows held_;                       // host rows, num_tokens x row_bytes
  std::vector<uint8_t> held_rows_;      // per token: its row is in held_
  std::vector<PeerPiece> peer_pieces_;
  bool finished_ = false;
};

}  // namespace flce

#endif  // FLCE_KERNELS_PREFERENCE_CALL_H_
