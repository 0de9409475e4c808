// UploadHead: the header, then the weight and the bias in order, each cut
// into chunks that fit one message.
#include <grpcpp/client_context.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/wire_dtype.h"

namespace flce {

absl::StatusOr<v1::HeadInfo> Client::UploadHead(const HeadUpload& upload,
                                                const ProgressCallback& progress) {
  const int64_t elem = WireDTypeSize(upload.dtype);
  if (elem == 0) return absl::InvalidArgumentError("upload dtype is unspecified");
  if (upload.vocab_size <= 0 || upload.hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head shape must be positive; got V=", upload.vocab_size, " H=", upload.hidden_size));
  }
  // Checked here too so that a mistake costs no upload: the server rejects it
  // only after the bytes have travelled.
  const int64_t weight_bytes = upload.vocab_size * upload.hidden_size * elem;
  if (static_cast<int64_t>(upload.weight.size()) != weight_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight is ", upload.weight.size(), " bytes; V=", upload.vocab_size,
        " x H=", upload.hidden_size, " in ", WireDTypeName(upload.dtype), " needs ", weight_bytes));
  }
  const bool has_bias = !upload.bias.empty();
  if (has_bias && static_cast<int64_t>(upload.bias.size()) != upload.vocab_size * elem) {
    return absl::InvalidArgumentError(absl::StrCat("bias is ", upload.bias.size(),
                                                   " bytes; V=", upload.vocab_size, " needs ",
                                                   upload.vocab_size * elem));
  }

  // Before the stream opens: it may ask the server for its message limit.
  const int64_t chunk = ChunkBytes(0);
  grpc::ClientContext context;
  Prepare(context);
  v1::HeadInfo info;
  std::unique_ptr<grpc::ClientWriter<v1::UploadHeadRequest>> writer =
      BulkStub().UploadHead(&context, &info);

  v1::UploadHeadRequest request;
  v1::UploadHeadHeader* header = request.mutable_header();
  header->set_head_id(upload.head_id);
  header->set_vocab_size(upload.vocab_size);
  header->set_hidden_size(upload.hidden_size);
  header->set_dtype(upload.dtype);
  header->set_has_bias(has_bias);
  bool open = writer->Write(request);

  const int64_t total = weight_bytes + static_cast<int64_t>(upload.bias.size());
  int64_t sent = 0;
  auto send_tensor = [&](v1::TensorRole role, absl::string_view bytes) {
    for (int64_t offset = 0; open && offset < static_cast<int64_t>(bytes.size());) {
      const int64_t n = std::min<int64_t>(chunk, bytes.size() - offset);
      v1::UploadHeadRequest message;
      v1::TensorChunk* piece = message.mutable_chunk();
      piece->set_role(role);
      piece->set_byte_offset(offset);
      piece->set_data(bytes.data() + offset, n);
      open = writer->Write(message);
      offset += n;
      sent += n;
      if (progress) progress(sent, total);
    }
  };
  send_tensor(v1::TENSOR_WEIGHT, upload.weight);
  if (has_bias) send_tensor(v1::TENSOR_BIAS, upload.bias);
  // A failed Write means the server already ended the call; Finish says why.
  if (open) writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return status;
  return info;
}

}  // namespace flce
