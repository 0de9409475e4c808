// FetchGrad: a header with the shape, then weight rows and bias elements in
// chunks, each placed by its offset and checked so that a missing or
// repeated piece cannot pass as zeros.
#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/request_id.h"
#include "client/cpp/row_assembler.h"
#include "client/cpp/wire_dtype.h"

namespace flce {

absl::StatusOr<FetchedGrad> Client::FetchGrad(const FetchGradArgs& args) {
  v1::FetchGradRequest request;
  request.set_head_id(args.head_id);
  request.set_session_id(args.session_id);
  request.set_dtype(args.dtype);
  request.set_reset(args.reset);
  request.set_chunk_rows(args.chunk_rows);
  FetchedGrad fetched;
  // A reset must be retry-safe: without an id a retried fetch would zero the
  // gradient a second time and return zeros.
  fetched.request_id = args.reset && args.request_id.empty() ? NewRequestId() : args.request_id;
  request.set_request_id(fetched.request_id);

  grpc::ClientContext context;
  Prepare(context);
  std::unique_ptr<grpc::ClientReader<v1::FetchGradResponse>> reader =
      BulkStub().FetchGrad(&context, request);

  absl::Status protocol;
  bool have_header = false;
  RowAssembler weight, bias;
  v1::FetchGradResponse response;
  while (protocol.ok() && reader->Read(&response)) {
    if (response.has_header()) {
      if (have_header) {
        protocol = absl::InternalError("server sent two grad headers");
        break;
      }
      fetched.header = response.header();
      const v1::GradHeader& h = fetched.header;
      const int64_t elem = WireDTypeSize(h.dtype());
      if (elem == 0 || h.vocab_size() <= 0 || h.hidden_size() <= 0) {
        protocol = absl::InternalError(
            absl::StrCat("server sent a grad header with V=", h.vocab_size(),
                         " H=", h.hidden_size(), " dtype=", WireDTypeName(h.dtype())));
        break;
      }
      weight = RowAssembler("grad_W", h.vocab_size(), h.hidden_size() * elem, &fetched.weight);
      if (h.has_bias()) bias = RowAssembler("grad_b", h.vocab_size(), elem, &fetched.bias);
      have_header = true;
    } else if (response.has_chunk()) {
      const v1::GradChunk& chunk = response.chunk();
      if (!have_header) {
        protocol = absl::InternalError("server sent a grad chunk before the header");
      } else if (chunk.role() == v1::TENSOR_BIAS) {
        protocol = fetched.header.has_bias()
                       ? bias.Place(chunk.row_offset(), chunk.rows(), chunk.data())
                       : absl::InternalError("server sent grad_b for a head without a bias");
      } else {
        protocol = weight.Place(chunk.row_offset(), chunk.rows(), chunk.data());
      }
    } else {
      protocol = absl::InternalError("server sent an empty fetch response");
    }
  }
  if (!protocol.ok()) {
    context.TryCancel();
    while (reader->Read(&response)) {
    }
  }
  const absl::Status status = FromGrpcStatus(reader->Finish());
  if (!protocol.ok()) return protocol;
  if (!status.ok()) return status;
  if (!have_header) return absl::DataLossError("the fetch ended without a grad header");
  for (const RowAssembler* t : {&weight, &bias}) {
    if (absl::Status s = t->CheckComplete("the fetch"); !s.ok()) return s;
  }
  return fetched;
}

}  // namespace flce
