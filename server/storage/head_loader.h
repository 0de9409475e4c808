// Heads that do not arrive by upload: from a server-side .safetensors file
// (only under --head-root) and the embedded demo head. Both stream into the
// engine through a HeadBuilder a block of rows at a time, so a multi-GiB head
// never needs a second full copy in host memory.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(std::string path, ResolveUnderRoot(root, request.path()));
//   FLCE_ASSIGN_OR_RETURN(auto head, LoadSafetensorsHead(engine, path, "lm_head.weight",
//                                                        "", std::nullopt));
#ifndef FLCE_SERVER_STORAGE_HEAD_LOADER_H_
#define FLCE_SERVER_STORAGE_HEAD_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace flce::server {

// root/path (or an absolute path) resolved through symlinks; PERMISSION_DENIED
// unless it lies under root's own real path, FAILED_PRECONDITION without a root.
absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, const std::string& path);

// Called with the head's shape before any of it is allocated or read (the
// registry's --max-heads / --max-head-bytes check).
using HeadCheck = std::function<absl::Status(const HeadSpec &)>;

// weight_tensor must be [V, H]; bias_tensor (optional, "" = none) [V]. dtype
// empty keeps the weight's dtype from the file; values are converted
// (BF16, F16, F32 in any combination). `check`, if set, may refuse the shape.
absl::StatusOr<std::shared_ptr<const Head>> LoadSafetensorsHead(
    Engine &engine, const std::string &path, const std::string &weight_tensor,
    const std::string &bias_tensor, std::optional<DType> dtype, const HeadCheck &check = nullptr);

// The embedded demo head: V=32000, H=512, bf16, W ~ N(0, 1/H) from a fixed
// seed, no bias. The same on every server.
inline constexpr int64_t kDemoVocab = 32000;
inline constexpr int64_t kDemoHidden = 512;
inline constexpr uint64_t kDemoSeed = 20261129;
absl::StatusOr<std::shared_ptr<const Head>> BuildDemoHead(Engine& engine);

}  // namespace flce::server

#endif  // FLCE_SERVER_STORAGE_HEAD_LOADER_H_
