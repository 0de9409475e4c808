// download-head and embed: a head's weight, or rows of it, back to .npy files
// (the head trained on the server, exported; a tied embedding's lookup).
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/json_views.h"
#include "client/cli/tensor_files.h"
#include "client/cpp/wire_dtype.h"
#include "core/status_macros.h"

namespace flce::cli {

void DeclareDownloadHead(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("out", "write the weight here (.npy, V x H; bf16 as '<u2')").Required();
  flags.String("out-bias", "write the bias here (.npy, V) when the head has one");
  flags.Bool("master", "a 16-bit head's fp32 master weight (the optimizer's) instead");
  flags.Int("chunk-rows", "rows per message; 0 = the server's choice", "0");
}

absl::StatusOr<CommandResult> RunDownloadHead(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  const std::string head_id = flags.str("head");
  FLCE_ASSIGN_OR_RETURN(DownloadedHead head, client->DownloadHead(head_id, flags.flag("master"),
                                                                  flags.i64("chunk-rows")));
  const v1::HeadInfo& info = head.header.head();
  if (flags.has("out-bias") && !info.has_bias()) {
    return absl::FailedPreconditionError(
        absl::StrCat("head ", head_id, " has no bias: nothing to write to --out-bias"));
  }
  FLCE_RETURN_IF_ERROR(WriteWireTensor(
      flags.str("out"),
      WireTensor{head.header.dtype(), {info.vocab_size(), info.hidden_size()},
                 std::move(head.weight)}));
  nlohmann::json json = HeadInfoJson(info);
  json["out"] = flags.str("out");
  json["out_dtype"] = WireDTypeName(head.header.dtype());
  json["master"] = flags.flag("master");
  if (flags.has("out-bias")) {
    FLCE_RETURN_IF_ERROR(WriteWireTensor(
        flags.str("out-bias"),
        WireTensor{head.header.dtype(), {info.vocab_size()}, std::move(head.bias)}));
    json["out_bias"] = flags.str("out-bias");
  }
  return CommandResult{json};
}

void DeclareEmbed(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("ids", "token ids (.npy, int32 or int64, any shape)").Required();
  flags.String("out", "write the rows here (.npy, ids' shape x H; bf16 as '<u2')").Required();
  flags.String("dtype", "dtype of the rows: fp32, fp16 or bf16; default: the head's");
  flags.Int("chunk-rows", "rows per message; 0 = the server's choice", "0");
}

absl::StatusOr<CommandResult> RunEmbed(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Targets ids, ReadTargets(flags.str("ids")));
  EmbedArgs args;
  args.head_id = flags.str("head");
  args.token_ids = std::move(ids.values);
  if (flags.has("dtype")) {
    FLCE_ASSIGN_OR_RETURN(args.dtype, ParseWireDType(flags.str("dtype")));
  }
  args.chunk_rows = flags.i64("chunk-rows");
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(EmbeddedRows rows, client->Embed(args));
  std::vector<int64_t> shape = ids.shape;
  shape.push_back(rows.header.hidden_size());
  FLCE_RETURN_IF_ERROR(
      WriteWireTensor(flags.str("out"), WireTensor{rows.header.dtype(), shape, std::move(rows.rows)}));
  return CommandResult{{{"head_id", args.head_id},
                        {"num_tokens", rows.header.num_tokens()},
                        {"hidden_size", rows.header.hidden_size()},
                        {"dtype", WireDTypeName(rows.header.dtype())},
                        {"head_version", rows.header.head_version()},
                        {"out", flags.str("out")}}};
}

}  // namespace flce::cli
