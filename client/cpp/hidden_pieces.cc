#include "client/cpp/hidden_pieces.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/grpc_status.h"

namespace flce {

HiddenPieces::HiddenPieces(std::vector<v1::Flce::Stub*> stubs,
                           std::function<void(grpc::ClientContext&)> prepare,
                           absl::string_view hidden, int64_t row_bytes, int64_t rows_per_chunk)
    : stubs_(std::move(stubs)),
      prepare_(std::move(prepare)),
      hidden_(hidden),
      row_bytes_(row_bytes),
      rows_per_chunk_(rows_per_chunk) {}

void HiddenPieces::Start(const std::string& token, std::function<void()> cancel_call) {
  if (!threads_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_call_ = std::move(cancel_call);
  }
  for (int stream = 1; stream < streams(); ++stream) {
    threads_.emplace_back([this, stream, token] { Send(stream, token); });
  }
}

void HiddenPieces::Join() {
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void HiddenPieces::Send(int stream, const std::string& token) {
  grpc::ClientContext context;
  prepare_(context);
  v1::ComputePieceResponse answer;
  std::unique_ptr<grpc::ClientWriter<v1::ComputePieceRequest>> writer =
      stubs_[stream - 1]->ComputePiece(&context, &answer);
  v1::ComputePieceRequest message;
  message.set_token(token);
  bool open = writer->Write(message);
  // One message reused: its data string keeps its capacity across chunks.
  v1::HiddenChunk* piece = message.mutable_hidden();
  const int64_t tokens = static_cast<int64_t>(hidden_.size()) / row_bytes_;
  int64_t rows_sent = 0;
  for (int64_t chunk = stream; open && chunk * rows_per_chunk_ < tokens; chunk += streams()) {
    const int64_t row = chunk * rows_per_chunk_;
    const int64_t rows = std::min(rows_per_chunk_, tokens - row);
    piece->set_token_offset(row);
    piece->mutable_data()->assign(hidden_.data() + row * row_bytes_, rows * row_bytes_);
    open = writer->Write(message);
    rows_sent += rows;
  }
  v1::ComputePieceRequest end;
  end.mutable_end()->set_num_tokens(rows_sent);
  if (open) writer->WriteLast(end, grpc::WriteOptions());
  const absl::Status status = FromGrpcStatus(writer->Finish());
  if (status.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (cancel_call_ && failure_.ok()) {
    failure_ = absl::Status(status.code(),
                            absl::StrCat("hidden on another connection (ComputePiece) failed: ",
                                         status.message()));
    cancel_call_();
    cancel_call_ = nullptr;
  }
}

void HiddenPieces::CallEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_call_ = nullptr;
}

absl::Status HiddenPieces::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace flce
