// Client: the RPCs that read or write rows of a head's weight rather than
// compute with it: DownloadHead (the weight, or its fp32 master, to the
// trainer), Embed (the rows of token ids: a tied input embedding's lookup)
// and EmbedGrad (the embedding's gradient rows into the session's grad_W).
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/request_id.h"
#include "client/cpp/row_assembler.h"
#include "client/cpp/wire_dtype.h"
#include "core/status_macros.h"

namespace flce {
namespace {

std::string IdsBytes(const std::vector<int32_t>& ids) {
  std::string bytes(ids.size() * sizeof(int32_t), '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return bytes;
}

// Reads a server stream to its end after a protocol error (cancelled), so
// that Finish does not wait, and returns the first error of the two.
template <typename Reader, typename Response>
absl::Status FinishStream(grpc::ClientContext& context, Reader& reader, Response& response,
                          const absl::Status& protocol) {
  if (!protocol.ok()) {
    context.TryCancel();
    while (reader.Read(&response)) {
    }
  }
  const absl::Status status = FromGrpcStatus(reader.Finish());
  return protocol.ok() ? status : protocol;
}

}  // namespace

absl::StatusOr<DownloadedHead> Client::DownloadHead(const std::string& head_id, bool master,
                                                    int64_t chunk_rows) {
  v1::DownloadHeadRequest request;
  request.set_head_id(head_id);
  request.set_master(master);
  request.set_chunk_rows(chunk_rows);
  grpc::ClientContext context;
  Prepare(context);
  auto reader = BulkStub().DownloadHead(&context, request);
  DownloadedHead out;
  bool have_header = false;
  RowAssembler weight, bias;
  absl::Status protocol;
  v1::DownloadHeadResponse response;
  while (protocol.ok() && reader->Read(&response)) {
    if (response.has_header() && !have_header) {
      out.header = response.header();
      const v1::HeadInfo& head = out.header.head();
      const int64_t elem = WireDTypeSize(out.header.dtype());
      if (elem == 0 || head.vocab_size() <= 0 || head.hidden_size() <= 0) {
        protocol = absl::InternalError(absl::StrCat(
            "server sent a download header with V=", head.vocab_size(), " H=",
            head.hidden_size(), " dtype=", WireDTypeName(out.header.dtype())));
        break;
      }
      weight = RowAssembler("weight", head.vocab_size(), head.hidden_size() * elem, &out.weight);
      if (head.has_bias()) bias = RowAssembler("bias", head.vocab_size(), elem, &out.bias);
      have_header = true;
    } else if (response.has_chunk() && have_header) {
      const v1::GradChunk& chunk = response.chunk();
      if (chunk.role() == v1::TENSOR_BIAS && !out.header.head().has_bias()) {
        protocol = absl::InternalError("server sent a bias for a head without one");
      } else {
        protocol = (chunk.role() == v1::TENSOR_BIAS ? bias : weight)
                       .Place(chunk.row_offset(), chunk.rows(), chunk.data());
      }
    } else {
      protocol = absl::InternalError(
          have_header ? "server sent a second download header or an empty message"
                      : "server sent weight rows before the download header");
    }
  }
  FLCE_RETURN_IF_ERROR(FinishStream(context, *reader, response, protocol));
  if (!have_header) return absl::DataLossError("the download ended without a header");
  FLCE_RETURN_IF_ERROR(weight.CheckComplete("the download"));
  FLCE_RETURN_IF_ERROR(bias.CheckComplete("the download"));
  return out;
}

absl::StatusOr<EmbeddedRows> Client::Embed(const EmbedArgs& args) {
  v1::EmbedRequest request;
  request.set_head_id(args.head_id);
  request.set_token_ids(IdsBytes(args.token_ids));
  request.set_dtype(args.dtype);
  if (args.expected_head_version.has_value()) {
    request.set_expected_head_version(*args.expected_head_version);
  }
  request.set_chunk_rows(args.chunk_rows);
  grpc::ClientContext context;
  Prepare(context);
  auto reader = BulkStub().Embed(&context, request);
  EmbeddedRows out;
  bool have_header = false;
  RowAssembler rows;
  absl::Status protocol;
  v1::EmbedResponse response;
  const int64_t n = static_cast<int64_t>(args.token_ids.size());
  while (protocol.ok() && reader->Read(&response)) {
    if (response.has_header() && !have_header) {
      out.header = response.header();
      const int64_t elem = WireDTypeSize(out.header.dtype());
      if (elem == 0 || out.header.hidden_size() <= 0 || out.header.num_tokens() != n) {
        protocol = absl::InternalError(absl::StrCat(
            "server sent an embed header for ", out.header.num_tokens(), " tokens of H=",
            out.header.hidden_size(), " dtype=", WireDTypeName(out.header.dtype()), "; asked ",
            n, " tokens"));
        break;
      }
      rows = RowAssembler("embedding", n, out.header.hidden_size() * elem, &out.rows);
      have_header = true;
    } else if (response.has_rows() && have_header) {
      const v1::EmbedRows& r = response.rows();
      protocol = rows.Place(r.token_offset(), r.num_tokens(), r.data());
    } else {
      protocol = absl::InternalError(
          have_header ? "server sent a second embed header or an empty message"
                      : "server sent embedding rows before the header");
    }
  }
  FLCE_RETURN_IF_ERROR(FinishStream(context, *reader, response, protocol));
  if (!have_header) return absl::DataLossError("the embed call ended without a header");
  FLCE_RETURN_IF_ERROR(rows.CheckComplete("the embed call"));
  return out;
}

absl::StatusOr<v1::EmbedGradSummary> Client::EmbedGrad(const EmbedGradArgs& args) {
  v1::EmbedGradHeader header = args.header;
  const int64_t n = static_cast<int64_t>(args.token_ids.size());
  const int64_t elem = WireDTypeSize(header.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError("EmbedGrad: header.dtype must be FP32, FP16 or BF16");
  }
  const int64_t bytes = static_cast<int64_t>(args.rows.size());
  const bool whole_rows = n == 0 ? bytes == 0 : bytes % n == 0 && bytes / n % elem == 0;
  if (!whole_rows) {
    return absl::InvalidArgumentError(absl::StrCat("EmbedGrad: ", args.rows.size(),
                                                   " bytes of rows are not whole rows of ", n,
                                                   " tokens in ", WireDTypeName(header.dtype())));
  }
  // A repeat must never be applied twice: the server needs an id.
  if (header.request_id().empty()) header.set_request_id(NewRequestId());
  header.set_num_tokens(n);
  header.set_token_ids(IdsBytes(args.token_ids));
  const int64_t row_bytes = n == 0 ? 0 : bytes / n;
  const int64_t rows_per_message =
      row_bytes == 0 ? 1 : std::max<int64_t>(1, ChunkBytes(args.chunk_bytes) / row_bytes);

  grpc::ClientContext context;
  Prepare(context);
  v1::EmbedGradSummary summary;
  auto writer = BulkStub().EmbedGrad(&context, &summary);
  v1::EmbedGradRequest first;
  *first.mutable_header() = std::move(header);
  bool sent = writer->Write(first);
  for (int64_t t = 0; sent && t < n; t += rows_per_message) {
    const int64_t rows = std::min(rows_per_message, n - t);
    v1::EmbedGradRequest message;
    v1::EmbedRows* piece = message.mutable_rows();
    piece->set_token_offset(t);
    piece->set_num_tokens(rows);
    piece->set_data(std::string(args.rows.substr(t * row_bytes, rows * row_bytes)));
    sent = writer->Write(message);
  }
  if (sent) {
    // Only this says "done": the server lands nothing from a stream that just
    // stops, nor before the stream closes behind the end message: the
    // half-close travels with it.
    v1::EmbedGradRequest end;
    end.mutable_end()->set_num_tokens(n);
    writer->WriteLast(end, grpc::WriteOptions());
  } else {
    writer->WritesDone();
  }
  FLCE_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return summary;
}

}  // namespace flce
