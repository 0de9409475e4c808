// load-weight, load-file, describe, list-heads, unload.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/json_views.h"
#include "client/cli/progress.h"
#include "client/cli/tensor_files.h"
#include "client/cpp/wire_dtype.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

void DeclareLoadWeight(FlagSet& flags) {
  flags.String("head", "head id to create or replace").Required();
  flags.String("weight", "V x H weight .npy: '<f4', '<f2', or '<u2' with --dtype bf16").Required();
  flags.String("bias", "length-V bias .npy, same rules as --weight");
  flags.Choice("dtype", {"bf16", "fp16", "fp32"}, "",
               "the head's dtype (converted if the file differs); default: the file's");
}

absl::StatusOr<CommandResult> RunLoadWeight(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(WireTensor weight,
                        ReadFloatTensor(flags.str("weight"), flags.str("dtype")));
  if (weight.shape.size() != 2 || weight.shape[0] == 0 || weight.shape[1] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flags.str("weight"),
                                                   ": the weight must be 2-D (V, H); got shape ",
                                                   ShapeText(weight.shape)));
  }
  WireTensor bias;
  if (flags.has("bias")) {
    FLCE_ASSIGN_OR_RETURN(bias, ReadFloatTensor(flags.str("bias"), WireDTypeName(weight.dtype)));
    if (bias.shape != std::vector<int64_t>{weight.shape[0]}) {
      return absl::InvalidArgumentError(absl::StrCat(flags.str("bias"), ": the bias must be (",
                                                     weight.shape[0], ",); got shape ",
                                                     ShapeText(bias.shape)));
    }
  }
  HeadUpload upload;
  upload.head_id = flags.str("head");
  upload.vocab_size = weight.shape[0];
  upload.hidden_size = weight.shape[1];
  upload.dtype = weight.dtype;
  upload.weight = weight.bytes;
  upload.bias = bias.bytes;

  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  Progress progress(env.show_progress(), env.err(), "upload " + upload.head_id);
  const auto start = std::chrono::steady_clock::now();
  FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head,
                        client->UploadHead(upload, [&](int64_t done, int64_t total) {
                          progress.Update(done, total);
                        }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json json = HeadInfoJson(head);
  json["uploaded_bytes"] = static_cast<int64_t>(weight.bytes.size() + bias.bytes.size());
  json["upload_seconds"] = seconds;
  return CommandResult{json};
}

void DeclareLoadFile(FlagSet& flags) {
  flags.String("head", "head id to create or replace").Required();
  flags.String("path", ".safetensors file, relative to the server's --head-root").Required();
  flags.String("weight-tensor", "tensor name of the weight, e.g. lm_head.weight").Required();
  flags.String("bias-tensor", "tensor name of the bias, e.g. lm_head.bias");
  flags.Choice("dtype", {"bf16", "fp16", "fp32"}, "", "resident dtype; default: the file's");
}

absl::StatusOr<CommandResult> RunLoadFile(const FlagSet& flags, CliEnv& env) {
  v1::LoadHeadFromFileRequest request;
  request.set_head_id(flags.str("head"));
  request.set_path(flags.str("path"));
  request.set_weight_tensor(flags.str("weight-tensor"));
  request.set_bias_tensor(flags.str("bias-tensor"));
  if (flags.has("dtype")) {
    FLCE_ASSIGN_OR_RETURN(v1::DType dtype, ParseWireDType(flags.str("dtype")));
    request.set_dtype(dtype);
  }
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head, client->LoadHeadFromFile(request));
  return CommandResult{HeadInfoJson(head)};
}

void DeclareDescribe(FlagSet& flags) { flags.String("head", "head id").Required(); }

absl::StatusOr<CommandResult> RunDescribe(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head, client->DescribeHead(flags.str("head")));
  return CommandResult{HeadInfoJson(head)};
}

void DeclareListHeads(FlagSet&) {}

absl::StatusOr<CommandResult> RunListHeads(const FlagSet&, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(std::vector<v1::HeadInfo> heads, client->ListHeads());
  nlohmann::json list = nlohmann::json::array();
  for (const v1::HeadInfo& head : heads) list.push_back(HeadInfoJson(head));
  return CommandResult{{{"heads", list}}};
}

void DeclareUnload(FlagSet& flags) { flags.String("head", "head id").Required(); }

absl::StatusOr<CommandResult> RunUnload(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::UnloadHeadResponse response, client->UnloadHead(flags.str("head")));
  return CommandResult{
      {{"head", HeadInfoJson(response.head())}, {"sessions_dropped", response.sessions_dropped()}}};
}

}  // namespace flce::cli
