#include "server/state/compute_pieces.h"

#include <random>
#include <utility>

namespace flce::server {

std::string ComputePieces::Register(const std::string& tenant, std::weak_ptr<PieceTarget> target,
                                   bool data_plane) {
  std::random_device random;
  std::string token(16, '\0');
  absl::MutexLock lock(&mu_);
  do {
    for (size_t i = 0; i < token.size(); i += 4) {
      const uint32_t word = random();
      for (size_t k = 0; k < 4; ++k) token[i + k] = static_cast<char>(word >> (8 * k));
    }
  } while (calls_.count(token) != 0);
  calls_[token] = Entry{tenant, std::move(target), data_plane, nullptr};
  return token;
}

void ComputePieces::Remove(const std::string& token) {
  std::shared_ptr<BulkWriter> writer;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(token);
    if (it == calls_.end()) return;
    writer = std::move(it->second.writer);
    calls_.erase(it);
  }
  if (writer != nullptr) writer->Close();
}

absl::StatusOr<std::shared_ptr<PieceTarget>> ComputePieces::FindLocked(const std::string& token,
                                                                       const std::string* tenant,
                                                                       bool data_plane) const {
  auto it = calls_.find(token);
  std::shared_ptr<PieceTarget> target;
  if (it != calls_.end() && it->second.data_plane == data_plane &&
      (tenant == nullptr || it->second.tenant == *tenant)) {
    target = it->second.target.lock();
  }
  if (target == nullptr) {
    return absl::NotFoundError(
        data_plane
            ? "no Compute call that asked for the data plane holds that token (it ended, or it "
              "was never issued): a data-plane connection joins a call in progress with the "
              "token of its PiecesOpened answer"
            : "no Compute call of this tenant holds that token (it ended, or it was never "
              "issued): a piece joins a call in progress with the token of its PiecesOpened "
              "answer");
  }
  return target;
}

absl::StatusOr<std::shared_ptr<PieceTarget>> ComputePieces::Find(const std::string& token,
                                                                 const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(token, &tenant, /*data_plane=*/false);
}

absl::StatusOr<std::shared_ptr<PieceTarget>> ComputePieces::AttachDataPlane(
    const std::string& token, std::shared_ptr<BulkWriter> writer) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<PieceTarget>> target =
      FindLocked(token, nullptr, /*data_plane=*/true);
  if (!target.ok()) return target;
  Entry& entry = calls_.at(token);
  if (entry.writer != nullptr) {
    return absl::AlreadyExistsError("a data-plane connection has already joined this call");
  }
  entry.writer = std::move(writer);
  return target;
}

std::shared_ptr<BulkWriter> ComputePieces::DataPlaneWriter(const std::string& token) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(token);
  return it == calls_.end() ? nullptr : it->second.writer;
}

}  // namespace flce::server
