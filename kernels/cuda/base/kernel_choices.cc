#include "kernels/cuda/base/kernel_choices.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/sm90_support.h"

namespace flce::cuda {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Each switch's spellings, as KernelSwitchesFromEnvironment reads them;
// FLCE_CUDA_GEMM_TILES is GemmAlgos's to check (a list of tiles).
struct SwitchSpellings {
  const char* name;
  const char* values;  // "|"-separated; "#" for a non-negative integer
};
constexpr SwitchSpellings kSpellings[] = {
    {"FLCE_CUDA_GENERIC", "0|1"},
    {"FLCE_CUDA_LOGITS", "cublas"},
    {"FLCE_CUDA_STATS_KERNEL", "cooperative|pingpong128|pingpong192|pingpong"},
    {"FLCE_CUDA_STATS_PAIRS", "0|1"},
    {"FLCE_CUDA_STATS_GROUP", "#"},
    {"FLCE_CUDA_ROW_KERNEL", "cluster"},
    {"FLCE_CUDA_OVERLAP", "0|1"},
    {"FLCE_CUDA_DLOGITS_PASS", "0|1"},
    {"FLCE_CUDA_BACKWARD", "own|cublas"},
    {"FLCE_CUDA_GRAD_WEIGHT", "pingpong|cooperative|cublas"},
    {"FLCE_CUDA_BACKWARD_OVERLAP", "0|1"},
    {"FLCE_CUDA_GRAD_WEIGHT_PAIRS", "0|1"},
    {"FLCE_CUDA_THIN_GRAD_WEIGHT", "0|1"},
    {"FLCE_CUDA_WIRE_SLOTS", "2|3"},
};

bool Spelled(absl::string_view value, absl::string_view values) {
  if (values == "#") {
    int n = 0;
    return absl::SimpleAtoi(value, &n) && n >= 0;
  }
  for (const absl::string_view v : absl::StrSplit(values, '|')) {
    if (value == v) return true;
  }
  return false;
}

// The FLCE_CUDA_ variables read elsewhere: the grad_W tile list (GemmAlgos)
// and the plugin's path (the engine factory).
constexpr const char* kOtherVariables[] = {"FLCE_CUDA_GEMM_TILES", "FLCE_CUDA_PLUGIN"};

bool KnownVariable(absl::string_view name) {
  for (const SwitchSpellings& s : kSpellings) {
    if (name == s.name) return true;
  }
  for (const char* other : kOtherVariables) {
    if (name == other) return true;
  }
  return false;
}

}  // namespace

absl::Status CheckKernelSwitchSpellings() {
  // A misspelt or retired switch would otherwise leave the default running
  // while its operator believes it switched.
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view variable = *entry;
    const size_t eq = variable.find('=');
    const absl::string_view name = variable.substr(0, eq);
    if (!absl::StartsWith(name, "FLCE_CUDA_") || KnownVariable(name)) continue;
    if (eq == absl::string_view::npos || eq + 1 == variable.size()) continue;  // set to nothing
    std::vector<std::string> names;
    for (const SwitchSpellings& s : kSpellings) names.push_back(s.name);
    for (const char* other : kOtherVariables) names.push_back(other);
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a variable the CUDA engine reads (unset it; it reads ",
                     absl::StrJoin(names, ", "), ")"));
  }
  for (const SwitchSpellings& s : kSpellings) {
    const std::string value = Env(s.name);
    if (value.empty() || Spelled(value, s.values)) continue;
    const absl::string_view values = s.values;
    const std::string expected =
        values == "#" ? "a token-tile count (0 or more)"
                      : absl::StrJoin(absl::StrSplit(values, '|'), ", ");
    return absl::InvalidArgumentError(absl::StrCat(s.name, "=", value, ": expected ", expected,
                                                   ", or unset for the default"));
  }
  return absl::OkStatus();
}

KernelSwitches KernelSwitchesFromEnvironment() {
  KernelSwitches s;
  s.generic = Env("FLCE_CUDA_GENERIC") == "1";
  s.cublas_logits = Env("FLCE_CUDA_LOGITS") == "cublas";
  const std::string stats = Env("FLCE_CUDA_STATS_KERNEL");
  if (stats == "cooperative") s.stats_kernel = StatsKernelSwitch::kCooperative;
  if (stats == "pingpong128") s.stats_kernel = StatsKernelSwitch::kPingPong128;
  if (stats == "pingpong192" || stats == "pingpong") {
    s.stats_kernel = StatsKernelSwitch::kPingPong192;
  }
  s.stats_pairs = Env("FLCE_CUDA_STATS_PAIRS") != "0";
  s.stats_group = std::atoi(Env("FLCE_CUDA_STATS_GROUP").c_str());
  s.cluster_rows = Env("FLCE_CUDA_ROW_KERNEL") == "cluster";
  s.overlap = Env("FLCE_CUDA_OVERLAP") == "1";
  s.dlogits_pass = Env("FLCE_CUDA_DLOGITS_PASS") == "1";
  const std::string backward = Env("FLCE_CUDA_BACKWARD");
  if (backward == "own") s.backward = BackwardGemmChoice::kOwn;
  if (backward == "cublas") s.backward = BackwardGemmChoice::kCublas;
  const std::string grad_weight = Env("FLCE_CUDA_GRAD_WEIGHT");
  if (grad_weight == "cublas") s.grad_weight = GradWeightSwitch::kCublas;
  if (grad_weight == "pingpong") s.grad_weight = GradWeightSwitch::kPingPong;
  if (grad_weight == "cooperative") s.grad_weight = GradWeightSwitch::kCooperative;
  s.backward_overlap = Env("FLCE_CUDA_BACKWARD_OVERLAP") != "0";
  s.grad_weight_pairs = Env("FLCE_CUDA_GRAD_WEIGHT_PAIRS") != "0";
  s.thin_grad_weight = Env("FLCE_CUDA_THIN_GRAD_WEIGHT") != "0";
  s.gemm_tiles = Env("FLCE_CUDA_GEMM_TILES");
  s.wire_slots = std::atoi(Env("FLCE_CUDA_WIRE_SLOTS").c_str());
  return s;
}

const KernelSwitches& SwitchesOrDefaults(const KernelSwitches* s) {
  static const KernelSwitches kDefaults;
  return s != nullptr ? *s : kDefaults;
}

bool HopperKernelsFor(const KernelSwitches& s, DType dtype, int64_t hidden) {
  return !s.generic && sm90::HeadFitsHopperKernels(dtype, hidden);
}

bool LogitsStatsChosen(const KernelSwitches& s, DType dtype, int64_t hidden) {
  return !s.cublas_logits && HopperKernelsFor(s, dtype, hidden);
}

int StatsPingPongCols(const KernelSwitches& s, int64_t rows) {
  switch (s.stats_kernel) {
    case StatsKernelSwitch::kCooperative:
      return 0;
    case StatsKernelSwitch::kPingPong128:
      return 128;
    case StatsKernelSwitch::kPingPong192:
      return 192;
    case StatsKernelSwitch::kAuto:
      break;
  }
  // The ping-pong kernel hides the epilogue behind the other warpgroup's
  // MMAs, and 192-column tiles move a sixth fewer bytes from L2 per flop than
  // 128-column ones. A chunk of under 3/4 of a token tile only streams W,
  // which the cooperative kernel's 256-column tiles do faster
  // (docs/perf/cuda.md steps 34, 39, 41).
  return rows >= 3 * kOwnTileRows / 4 ? 192 : 0;
}

// Two CTAs of a pair load half of each W tile into both by TMA multicast:
// fewer bytes from L2 per flop, where there are two token tiles to pair.
bool StatsPingPongPairs(const KernelSwitches& s, int64_t rows) {
  return s.stats_pairs && rows > kOwnTileRows;
}

int32_t StatsTokenTilesPerGroup(const KernelSwitches& s, int32_t m_tiles) {
  return s.stats_group > 0 && s.stats_group < m_tiles ? s.stats_group : m_tiles;
}

bool ClusterRowsChosen(const KernelSwitches& s) { return s.cluster_rows && !s.generic; }

bool OverlapChosen(const KernelSwitches& s, int64_t rows) {
  return s.overlap && rows >= 2 * ChunkPolicy::kTokenAlign;
}

bool UseOwnGradInputGemm(const KernelSwitches& s, DType dtype, int64_t rows, int64_t hidden,
                         int splits, bool grad_weight_beside) {
  if (s.backward == BackwardGemmChoice::kCublas || !HopperKernelsFor(s, dtype, hidden)) {
    return false;
  }
  if (s.backward == BackwardGemmChoice::kOwn) return true;
  return OwnGradInputByDefault(rows, hidden, splits, grad_weight_beside);
}

bool OwnGradInputByDefault(int64_t rows, int64_t hidden, int splits, bool grad_weight_beside) {
  // At one split the own kernel is behind cuBLAS's alone; grad_W beside it,
  // on the SMs its last wave leaves idle, more than makes up for that up to
  // kBesideMaxHidden, and above only evens it out (docs/perf/cuda.md).
  if (rows < kOwnBackwardMinRows) return false;
  return splits >= 2 || (grad_weight_beside && hidden <= kBesideMaxHidden);
}

bool UseOwnGradWeightGemm(const KernelSwitches& s, DType dtype, int64_t rows, int64_t hidden) {
  if (s.backward == BackwardGemmChoice::kCublas || !HopperKernelsFor(s, dtype, hidden)) {
    return false;
  }
  if (s.backward == BackwardGemmChoice::kOwn) return true;
  switch (s.grad_weight) {
    case GradWeightSwitch::kCublas:
      return false;
    case GradWeightSwitch::kPingPong:
    case GradWeightSwitch::kCooperative:
      return true;
    case GradWeightSwitch::kAuto:
      break;
  }
  return OwnGradWeightByDefault(rows, hidden);
}

bool OwnGradWeightByDefault(int64_t rows, int64_t hidden) {
  // Above kBesideMaxHidden the ping-pong kernel would run alone, and cuBLAS's
  // 128 x 160 algorithm is ahead of it; at H = 1024 cuBLAS's 128 x 128 one is
  // (gemm_algos.h; docs/perf/cuda.md).
  return rows >= kOwnBackwardMinRows && hidden >= 1536 && hidden <= kBesideMaxHidden;
}

bool GradWeightBesideGradInput(const KernelSwitches& s) {
  return s.backward_overlap && GradWeightKernelOf(s) == GradWeightKernel::kPingPong;
}

GradWeightKernel GradWeightKernelOf(const KernelSwitches& s) {
  return s.grad_weight == GradWeightSwitch::kCooperative ? GradWeightKernel::kCooperative
                                                         : GradWeightKernel::kPingPong;
}

bool GradWeightPairs(const KernelSwitches& s) { return s.grad_weight_pairs; }

bool UseThinGradWeight(const KernelSwitches& s, int64_t rows) {
  return s.thin_grad_weight && rows >= 1 && rows <= kThinGradWeightRows;
}

int WireSlots(const KernelSwitches& s) {
  return s.wire_slots == ChunkPolicy::kStreamSlots ? ChunkPolicy::kStreamSlots
                                                    : ChunkPolicy::kWirePacedSlots;
}

}  // namespace flce::cuda
