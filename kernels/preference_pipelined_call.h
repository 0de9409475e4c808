// A preference objective's call whose rows arrive at a network's pace
// (ComputeSpec::wire_paced and not deterministic): the two passes of
// preference_call.h run while the rows still arrive, so that the gradient
// pass and grad_input's way back overlap the upload instead of following it.
//
// The first pass runs per segment of consecutive tokens (a forward-only call
// each, fed as the rows come, finished on this call's worker once the
// segment is whole). A pair's loss reads only its own two responses and its
// normaliser is known from the start, so once every token of a pair has its
// log-prob the pair's a_t are final. The gradient pass then runs over the
// longest run of tokens from the front whose a_t are final, in blocks of at
// least a segment, each a weighted call of its own adding into the same
// grad_W; a block is finished (its grad_input delivered) by a second thread
// while the next one computes. The results are the two-pass call's up to the
// order of grad_W's sums, which is why deterministic calls keep the two-pass
// call.
#ifndef FLCE_KERNELS_PREFERENCE_PIPELINED_CALL_H_
#define FLCE_KERNELS_PREFERENCE_PIPELINED_CALL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "kernels/held_rows.h"

namespace flce {

class PipelinedPreferenceCall : public ComputeCall {
 public:
  // Tokens per segment where the spec leaves chunk_tokens to the engine, at
  // least: small enough that the gradient pass trails the upload by a few
  // milliseconds of wire, large enough that each call fills the GPU. The
  // segment is a whole number of the engine's chunks for the call
  // (Engine::PlannedChunkTokens), and so is every gradient block but the
  // last, so that the pieces run the chunks the two-pass call would.
  static constexpr int64_t kSegmentTokens = 8192;
  // Gradient-pass blocks started and not yet finished: one computing while
  // the one before hands its grad_input to the wire.
  static constexpr size_t kBlocksInFlight = 2;

  // Whether a spec with a preference objective takes this call.
  static bool Suits(const ComputeSpec& spec);

  static absl::StatusOr<std::unique_ptr<ComputeCall>> Start(Engine& engine,
                                                            std::shared_ptr<const Head> head,
                                                            ComputeSpec spec, GradInputSink sink);
  ~PipelinedPreferenceCall() override;

  absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) override;
  absl::StatusOr<ComputeResult> Finish() override;

 private:
  struct Segment {
    int64_t begin = 0, end = 0;
    int64_t received = 0;
    std::unique_ptr<ComputeCall> call;  // the first pass over [begin, end)
  };
  struct Block {
    int64_t begin = 0;
    std::unique_ptr<ComputeCall> call;  // the gradient pass over the block's rows
  };

  PipelinedPreferenceCall(Engine& engine, std::shared_ptr<const Head> head, ComputeSpec spec,
                          GradInputSink sink, int64_t row_bytes, int64_t segment_tokens,
                          int64_t block_unit);

  // A segment's refusal of rows [offset, offset + rows) restated in the
  // call's token numbers where it was a non-finite value.
  absl::Status InCallTokens(const absl::Status& refused, int64_t offset, int64_t rows,
                            const void* data) const;
  absl::Status FeedSegment(Segment& segment, int64_t token_offset, int64_t rows, const char* data);
  void WorkerLoop();
  absl::Status FinishSegment(Segment& segment);
  // Runs the gradient pass over the ready run from the front: a block of at
  // least a segment in whole block units, or (final) whatever is left.
  absl::Status RunReadyBlocks(bool final);
  absl::Status StartBlock(int64_t begin, int64_t end);
  void FinisherLoop();
  absl::Status FinishBlock(Block& block);
  bool Ready(int64_t token) const;
  void Fail(const absl::Status& status);
  absl::Status status() const;

  Engine& engine_;
  std::shared_ptr<const Head> head_;
  ComputeSpec spec_;  // the caller's, objective included
  GradInputSink sink_;
  const int64_t row_bytes_;
  const int64_t segment_tokens_;
  const int64_t block_unit_;  // gradient blocks but the last are multiples of it
  const std::chrono::steady_clock::time_point start_time_;
  std::vector<uint8_t> counts_;  // per token: its target is not ignore_index

  // The receiving side (AddHidden), under intake_mu_.
  std::mutex intake_mu_;
  HeldRows held_;  // num_tokens x row_bytes, written once per row
  std::vector<uint8_t> received_;
  std::vector<Segment> segments_;
  bool finished_ = false;

  // Handed from the receiving side to the worker, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Segment*> whole_;  // segments with every row, in the order they completed
  std::deque<Block> started_;   // blocks started, in token order
  bool end_ = false;            // Finish: no more segments will come
  bool last_block_ = false;     // the worker has started every block
  bool stop_ = false;           // destroyed before Finish
  absl::Status status_;
  std::mutex sink_mu_;          // blocks in flight deliver grad_input one at a time

  // The worker's alone (segments, starting blocks).
  std::thread worker_;
  std::vector<float> logp_;               // the first pass's, per token
  std::vector<uint8_t> segment_done_;     // the first pass has run over the segment
  std::vector<int64_t> pair_remaining_;   // per pair: counted tokens without a log-prob
  int64_t cursor_ = 0;                    // the gradient pass has started over [0, cursor_)
  double first_pass_ms_ = 0.0;
  double wait_ms_ = 0.0;

  // The finisher's alone (finishing blocks).
  std::thread finisher_;
  ComputeResult gathered_;  // the gradient pass's blocks, merged
  double block_wait_ms_ = 0.0;
};

}  // namespace flce

#endif  // FLCE_KERNELS_PREFERENCE_PIPELINED_CALL_H_
