// What a client does with regions, for the server's tests: a shared-memory
// object as flce.shm makes one, and one Regions stream.
#ifndef FLCE_TESTS_SERVER_REGION_HELPERS_H_
#define FLCE_TESTS_SERVER_REGION_HELPERS_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace flce::server::test {

// A client's shared-memory object, as flce.shm makes one.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes) : bytes_(bytes) {
    std::random_device random;
    name_ = "flce-";
    for (int i = 0; i < 4; ++i) name_ += absl::StrFormat("%08x", random());
    fd_ = shm_open(("/" + name_).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0) << strerror(errno);
    EXPECT_EQ(ftruncate(fd_, bytes), 0);
    base_ = static_cast<char*>(
        mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(base_, MAP_FAILED);
  }
  ~ShmObject() {
    munmap(base_, static_cast<size_t>(bytes_));
    close(fd_);
    shm_unlink(("/" + name_).c_str());
  }
  const std::string& name() const { return name_; }
  char* data() { return base_; }
  void Truncate(int64_t bytes) { ASSERT_EQ(ftruncate(fd_, bytes), 0); }
  std::string Key() const { return std::string(base_, 16); }

 private:
  int64_t bytes_;
  std::string name_;
  int fd_ = -1;
  char* base_ = nullptr;
};

// One Regions stream.
class RegionStream {
 public:
  explicit RegionStream(v1::Flce::Stub& stub, const std::string& token = "") {
    if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
    stream_ = stub.Regions(&context_);
  }

  // The region id, or "" with *status set when the server ended the stream.
  std::string Register(const std::string& name, int64_t bytes, const std::string& key,
                       grpc::Status* status = nullptr) {
    v1::RegionRequest request;
    request.mutable_register_()->set_name(name);
    request.mutable_register_()->set_bytes(bytes);
    request.mutable_register_()->set_key(key);
    v1::RegionResponse response;
    if (stream_->Write(request) && stream_->Read(&response)) return response.region_id();
    grpc::Status end = Close();
    if (status != nullptr) *status = end;
    return "";
  }

  // CUDA IPC memory; the status the server ended the stream with ("" id).
  std::string RegisterDevice(const std::string& name, grpc::Status* status) {
    v1::RegionRequest request;
    v1::RegisterRegion* reg = request.mutable_register_();
    reg->set_name(name);
    reg->set_bytes(1 << 20);
    reg->set_key(std::string(16, 'k'));
    reg->mutable_cuda_ipc()->set_memory_handle(std::string(64, '\1'));
    reg->mutable_cuda_ipc()->set_event_handle(std::string(64, '\2'));
    reg->mutable_cuda_ipc()->set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
    v1::RegionResponse response;
    if (stream_->Write(request) && stream_->Read(&response)) return response.region_id();
    *status = Close();
    return "";
  }

  // Whether the server answered that it released the region.
  bool Release(const std::string& region_id) {
    v1::RegionRequest request;
    request.mutable_release()->set_region_id(region_id);
    v1::RegionResponse response;
    return stream_->Write(request) && stream_->Read(&response) && response.released();
  }

  // The object's first 16 bytes are the proof that this client can write it.
  std::string Register(ShmObject& object, int64_t bytes, grpc::Status* status = nullptr) {
    return Register(object.name(), bytes, object.Key(), status);
  }

  grpc::Status Close() {
    if (!closed_) {
      stream_->WritesDone();
      v1::RegionResponse ignored;
      while (stream_->Read(&ignored)) {
      }
      status_ = stream_->Finish();
      closed_ = true;
    }
    return status_;
  }

  ~RegionStream() { Close(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RegionRequest, v1::RegionResponse>> stream_;
  bool closed_ = false;
  grpc::Status status_;
};

}  // namespace flce::server::test

#endif  // FLCE_TESTS_SERVER_REGION_HELPERS_H_
