#include "server/state/compute_pieces.h"

#include <random>
#include <utility>

namespace flce::server {

std::string ComputePieces::Register(const std::string& tenant, std::weak_ptr<PieceTarget> target) {
  std::random_device random;
  std::string token(16, '\0');
  absl::MutexLock lock(&mu_);
  do {
    for (size_t i = 0; i < token.size(); i += 4) {
      const uint32_t word = random();
      for (size_t k = 0; k < 4; ++k) token[i + k] = static_cast<char>(word >> (8 * k));
    }
  } while (calls_.count(token) != 0);
  calls_[token] = Entry{tenant, std::move(target)};
  return token;
}

void ComputePieces::Remove(const std::string& token) {
  absl::MutexLock lock(&mu_);
  calls_.erase(token);
}

absl::StatusOr<std::shared_ptr<PieceTarget>> ComputePieces::Find(const std::string& token,
                                                                 const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(token);
  std::shared_ptr<PieceTarget> target;
  if (it != calls_.end() && it->second.tenant == tenant) target = it->second.target.lock();
  if (target == nullptr) {
    return absl::NotFoundError(
        "no Compute call of this tenant holds that token (it ended, or it was never issued): a "
        "piece joins a call in progress with the token of its PiecesOpened answer");
  }
  return target;
}

}  // namespace flce::server
