// ShardCollective over NCCL, which is loaded when a head is first sharded
// across distinct GPUs rather than linked: the library is ~200 MB, most
// servers run one GPU, and on the GPU hosts it comes with the Python
// packages (nvidia-nccl-cu13) instead of the CUDA toolkit.
#include <dlfcn.h>
#include <glob.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/sharded/shard_collective.h"

namespace flce::cuda {
namespace {

// The NCCL entry points flce uses, resolved once per process.
struct NcclApi {
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  std::string path;
};

// Where libnccl.so.2 may be: FLCE_NCCL_LIBRARY, the loader's search path,
// the CUDA toolkit, then the Python packages' copies.
std::vector<std::string> NcclCandidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("FLCE_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    out.push_back(env);
  }
  out.push_back("libnccl.so.2");
  out.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/opt/*/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g = {};
    if (glob(pattern, 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    }
    globfree(&g);
  }
  return out;
}

absl::StatusOr<NcclApi> LoadNccl() {
  std::vector<std::string> tried;
  for (const std::string& path : NcclCandidates()) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      tried.push_back(path);
      continue;
    }
    NcclApi api;
    api.path = path;
    bool ok = true;
    auto bind = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      ok = ok && fn != nullptr;
    };
    bind(api.CommInitAll, "ncclCommInitAll");
    bind(api.CommDestroy, "ncclCommDestroy");
    bind(api.AllGather, "ncclAllGather");
    bind(api.Send, "ncclSend");
    bind(api.Recv, "ncclRecv");
    bind(api.GroupStart, "ncclGroupStart");
    bind(api.GroupEnd, "ncclGroupEnd");
    bind(api.GetErrorString, "ncclGetErrorString");
    bind(api.GetVersion, "ncclGetVersion");
    if (ok) return api;  // the library stays loaded for the process's life
    dlclose(lib);
    tried.push_back(path + " (lacks the NCCL 2.7+ entry points)");
  }
  return absl::UnavailableError(absl::StrCat(
      "a head sharded across GPUs needs NCCL (libnccl.so.2), not found; tried: ",
      absl::StrJoin(tried, ", "),
      ". Install NCCL (e.g. pip's nvidia-nccl-cu13) or name it in FLCE_NCCL_LIBRARY."));
}

const absl::StatusOr<NcclApi>& Nccl() {
  static const absl::StatusOr<NcclApi>* api = new absl::StatusOr<NcclApi>(LoadNccl());
  return *api;
}

class NcclCollective : public ShardCollective {
 public:
  NcclCollective(const NcclApi* api, std::vector<ShardLane> lanes, std::vector<ncclComm_t> comms)
      : api_(api), lanes_(std::move(lanes)), comms_(std::move(comms)) {}
  ~NcclCollective() override {
    for (ncclComm_t c : comms_) api_->CommDestroy(c);
  }
  const char* name() const override { return "nccl"; }

  absl::Status AllGather(const std::vector<const void*>& send, const std::vector<void*>& recv,
                         int64_t bytes) override {
    FLCE_RETURN_IF_ERROR(Check(api_->GroupStart(), "ncclGroupStart"));
    absl::Status st;
    for (size_t s = 0; s < lanes_.size() && st.ok(); ++s) {
      st = Check(api_->AllGather(send[s], recv[s], bytes, ncclChar, comms_[s], lanes_[s].stream),
                 "ncclAllGather");
    }
    const absl::Status end = Check(api_->GroupEnd(), "ncclGroupEnd");
    return st.ok() ? end : st;
  }

  // Point-to-point into the first shard, then adds in shard order there: the
  // same traffic as ncclReduce on two GPUs, and a fixed summation order.
  absl::Status SumToFirst(const std::vector<float*>& parts, int64_t count,
                          float* scratch) override {
    const ShardLane& first = lanes_[0];
    for (size_t s = 1; s < lanes_.size(); ++s) {
      FLCE_RETURN_IF_ERROR(Check(api_->GroupStart(), "ncclGroupStart"));
      absl::Status st = Check(
          api_->Send(parts[s], count, ncclFloat32, 0, comms_[s], lanes_[s].stream), "ncclSend");
      if (st.ok()) {
        st = Check(api_->Recv(scratch, count, ncclFloat32, static_cast<int>(s), comms_[0],
                              first.stream),
                   "ncclRecv");
      }
      const absl::Status end = Check(api_->GroupEnd(), "ncclGroupEnd");
      FLCE_RETURN_IF_ERROR(st.ok() ? end : st);
      FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(first.device), first.health);
      FLCE_RETURN_IF_ERROR(LaunchAxpy(1.0f, scratch, parts[0], count, first.stream, first.health));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Check(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat(what, " failed: ", api_->GetErrorString(r), " (NCCL error ", r, ")"));
  }

  const NcclApi* api_;
  std::vector<ShardLane> lanes_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardCollective>> CreateNcclCollective(
    const std::vector<ShardLane>& lanes) {
  const absl::StatusOr<NcclApi>& api = Nccl();
  FLCE_RETURN_IF_ERROR(api.status());
  // NVLink SHARP (multicast) can take the GPUs of a shared host out of
  // service; flce's collectives are small and never need it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<int> devices;
  for (const ShardLane& lane : lanes) devices.push_back(lane.device);
  std::vector<ncclComm_t> comms(lanes.size(), nullptr);
  const ncclResult_t r =
      api->CommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("NCCL (", api->path, ") could not join GPUs ",
                                               absl::StrJoin(devices, ","), ": ",
                                               api->GetErrorString(r)));
  }
  return std::make_unique<NcclCollective>(&*api, lanes, std::move(comms));
}

}  // namespace flce::cuda
