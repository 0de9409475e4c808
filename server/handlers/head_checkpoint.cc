#include "server/handlers/head_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "server/handlers/head_info.h"
#include "server/handlers/optimizer_handlers.h"
#include "server/state/head_registry.h"
#include "server/state/upload_budget.h"
#include "server/storage/checkpoint_log.h"
#include "server/storage/head_loader.h"
#include "server/storage/safetensors.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

using Metadata = std::map<std::string, std::string>;

std::string Number(double value) { return absl::StrFormat("%.17g", value); }

absl::Status RequireCheckpointDir(const ServiceContext& ctx) {
  if (!ctx.config.checkpoint_dir.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this server keeps no checkpoints: start it with --checkpoint-dir");
}

// The state tensors (name, group, tensor) a config keeps for a head.
struct StateTensor {
  std::string name;
  HeadTensor group;
  OptimizerTensor tensor;
  int64_t elements;
};

std::vector<StateTensor> StateTensors(const HeadSpec& spec, const OptimizerConfig& config) {
  std::vector<StateTensor> out;
  for (HeadTensor group : {HeadTensor::kWeight, HeadTensor::kBias}) {
    if (group == HeadTensor::kBias && !spec.has_bias) continue;
    const int64_t n =
        group == HeadTensor::kWeight ? spec.vocab_size * spec.hidden_size : spec.vocab_size;
    const OptimizerGroup& hyper = group == HeadTensor::kWeight ? config.weight : config.bias;
    StateArrays kept = StateArraysFor(config.kind, hyper);
    std::vector<OptimizerTensor> tensors;
    if (spec.dtype != DType::kF32) tensors.push_back(OptimizerTensor::kMaster);
    if (kept.m) tensors.push_back(OptimizerTensor::kMomentum);
    if (kept.v) tensors.push_back(OptimizerTensor::kSecondMoment);
    if (kept.vmax) tensors.push_back(OptimizerTensor::kMaxSecondMoment);
    for (OptimizerTensor t : tensors) {
      out.push_back({absl::StrCat(HeadTensorName(group), ".", OptimizerTensorName(config.kind, t)),
                     group, t, n});
    }
  }
  return out;
}

void PutGroup(Metadata& meta, const char* group, const OptimizerGroup& g) {
  const std::string p = absl::StrCat(group, ".");
  meta[p + "weight_decay"] = Number(g.weight_decay);
  meta[p + "momentum"] = Number(g.momentum);
  meta[p + "dampening"] = Number(g.dampening);
  meta[p + "nesterov"] = g.nesterov ? "true" : "false";
  meta[p + "beta1"] = Number(g.beta1);
  meta[p + "beta2"] = Number(g.beta2);
  meta[p + "eps"] = Number(g.eps);
  meta[p + "amsgrad"] = g.amsgrad ? "true" : "false";
}

// Reads metadata values, naming the checkpoint and the key in every error.
class MetadataReader {
 public:
  MetadataReader(const Metadata& meta, std::string name) : meta_(meta), name_(std::move(name)) {}

  absl::StatusOr<std::string> Text(const std::string& key) const {
    auto it = meta_.find(key);
    if (it == meta_.end()) return Bad(absl::StrCat("has no metadata key \"", key, "\""));
    return it->second;
  }
  absl::StatusOr<int64_t> Int(const std::string& key) const {
    FLCE_ASSIGN_OR_RETURN(std::string text, Text(key));
    int64_t value;
    if (!absl::SimpleAtoi(text, &value)) return Bad(absl::StrCat(key, " = \"", text, "\""));
    return value;
  }
  absl::StatusOr<double> Double(const std::string& key) const {
    FLCE_ASSIGN_OR_RETURN(std::string text, Text(key));
    double value;
    if (!absl::SimpleAtod(text, &value)) return Bad(absl::StrCat(key, " = \"", text, "\""));
    return value;
  }
  absl::StatusOr<bool> Bool(const std::string& key) const {
    FLCE_ASSIGN_OR_RETURN(std::string text, Text(key));
    if (text == "true") return true;
    if (text == "false") return false;
    return Bad(absl::StrCat(key, " = \"", text, "\""));
  }
  absl::StatusOr<OptimizerGroup> Group(const char* group) const {
    const std::string p = absl::StrCat(group, ".");
    OptimizerGroup g;
    FLCE_ASSIGN_OR_RETURN(g.weight_decay, Double(p + "weight_decay"));
    FLCE_ASSIGN_OR_RETURN(g.momentum, Double(p + "momentum"));
    FLCE_ASSIGN_OR_RETURN(g.dampening, Double(p + "dampening"));
    FLCE_ASSIGN_OR_RETURN(g.nesterov, Bool(p + "nesterov"));
    FLCE_ASSIGN_OR_RETURN(g.beta1, Double(p + "beta1"));
    FLCE_ASSIGN_OR_RETURN(g.beta2, Double(p + "beta2"));
    FLCE_ASSIGN_OR_RETURN(g.eps, Double(p + "eps"));
    FLCE_ASSIGN_OR_RETURN(g.amsgrad, Bool(p + "amsgrad"));
    return g;
  }
  absl::Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint \"", name_, "\" is not a flce checkpoint: it ", what));
  }

 private:
  const Metadata& meta_;
  std::string name_;
};

// What a checkpoint file says, checked against itself before anything is
// allocated: the head's shape and every tensor the metadata implies.
struct CheckpointContents {
  HeadSpec spec;
  uint64_t version = 0;
  std::optional<OptimizerConfig> optimizer;
  int64_t steps = 0;
  int64_t skipped = 0;
  std::vector<StateTensor> state;
};

absl::Status CheckTensor(const SafetensorsFile& file, const MetadataReader& meta,
                         const std::string& tensor, DType dtype,
                         const std::vector<int64_t>& shape) {
  auto found = file.tensors().find(tensor);
  if (found == file.tensors().end()) return meta.Bad(absl::StrCat("lacks tensor \"", tensor, "\""));
  if (found->second.dtype != DTypeToSafetensors(dtype) || found->second.shape != shape) {
    return meta.Bad(absl::StrCat("has tensor \"", tensor, "\" as ", found->second.dtype,
                                 " of another shape than the metadata says"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointContents> ReadContents(const SafetensorsFile& file,
                                                const std::string& name) {
  MetadataReader meta(file.metadata(), name);
  FLCE_ASSIGN_OR_RETURN(std::string format, meta.Text("format"));
  if (format != kCheckpointFormat) {
    return meta.Bad(absl::StrCat("has format \"", format, "\", not \"", kCheckpointFormat, "\""));
  }
  CheckpointContents c;
  FLCE_ASSIGN_OR_RETURN(c.spec.vocab_size, meta.Int("vocab_size"));
  FLCE_ASSIGN_OR_RETURN(c.spec.hidden_size, meta.Int("hidden_size"));
  FLCE_ASSIGN_OR_RETURN(std::string dtype, meta.Text("dtype"));
  absl::StatusOr<DType> parsed = DTypeFromSafetensors(dtype);
  if (!parsed.ok()) return meta.Bad(absl::StrCat("has dtype \"", dtype, "\""));
  c.spec.dtype = *parsed;
  FLCE_ASSIGN_OR_RETURN(c.spec.has_bias, meta.Bool("has_bias"));
  FLCE_ASSIGN_OR_RETURN(int64_t version, meta.Int("head_version"));
  c.version = static_cast<uint64_t>(std::max<int64_t>(0, version));
  if (c.spec.vocab_size <= 0 || c.spec.hidden_size <= 0) return meta.Bad("has a shape <= 0");
  FLCE_RETURN_IF_ERROR(
      CheckTensor(file, meta, "weight", c.spec.dtype, {c.spec.vocab_size, c.spec.hidden_size}));
  size_t expected_tensors = 1;
  if (c.spec.has_bias) {
    FLCE_RETURN_IF_ERROR(CheckTensor(file, meta, "bias", c.spec.dtype, {c.spec.vocab_size}));
    ++expected_tensors;
  }
  FLCE_ASSIGN_OR_RETURN(std::string kind, meta.Text("optimizer"));
  if (kind != "none") {
    OptimizerConfig config;
    if (kind == "sgd") {
      config.kind = OptimizerKind::kSgd;
    } else if (kind == "adamw") {
      config.kind = OptimizerKind::kAdamW;
    } else {
      return meta.Bad(absl::StrCat("names optimizer \"", kind, "\""));
    }
    FLCE_ASSIGN_OR_RETURN(config.weight, meta.Group("weight"));
    config.bias = config.weight;
    if (c.spec.has_bias) {
      FLCE_ASSIGN_OR_RETURN(config.bias, meta.Group("bias"));
    }
    absl::Status valid = ValidateOptimizerGroup(config.kind, config.weight, "weight");
    if (valid.ok() && c.spec.has_bias) {
      valid = ValidateOptimizerGroup(config.kind, config.bias, "bias");
    }
    if (!valid.ok()) return meta.Bad(absl::StrCat("holds hyper-parameters: ", valid.message()));
    FLCE_ASSIGN_OR_RETURN(c.steps, meta.Int("steps"));
    FLCE_ASSIGN_OR_RETURN(c.skipped, meta.Int("skipped_steps"));
    if (c.steps < 0 || c.skipped < 0) return meta.Bad("has a negative step count");
    c.state = StateTensors(c.spec, config);
    for (const StateTensor& t : c.state) {
      FLCE_RETURN_IF_ERROR(
          CheckTensor(file, meta, t.name, DType::kF32,
                      t.group == HeadTensor::kWeight
                          ? std::vector<int64_t>{c.spec.vocab_size, c.spec.hidden_size}
                          : std::vector<int64_t>{c.spec.vocab_size}));
    }
    expected_tensors += c.state.size();
    c.optimizer = config;
  }
  if (file.tensors().size() != expected_tensors) {
    return meta.Bad(absl::StrCat("holds ", file.tensors().size(),
                                 " tensors where its metadata "
                                 "implies ",
                                 expected_tensors));
  }
  return c;
}

absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
}

}  // namespace

std::string TenantDirectoryName(const std::string& tenant) {
  if (tenant.empty()) return "anonymous";
  bool plain = tenant.size() <= 64;
  for (char c : tenant) plain = plain && (absl::ascii_isalnum(c) || c == '_' || c == '-');
  if (plain) return absl::StrCat("t-", tenant);
  std::string hex;
  for (unsigned char c : tenant) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return absl::StrCat("x-", hex);
}

absl::StatusOr<std::string> CheckpointPath(const std::string& checkpoint_dir,
                                           const std::string& tenant, const std::string& name) {
  bool valid = !name.empty() && name.size() <= 128 && absl::ascii_isalnum(name[0]);
  for (char c : name) valid = valid && (absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-');
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint name \"", absl::CHexEscape(name.substr(0, 160)),
                     "\" must be 1-128 of [A-Za-z0-9._-] starting with a letter or digit"));
  }
  return absl::StrCat(checkpoint_dir, "/", TenantDirectoryName(tenant), "/", name, ".safetensors");
}

absl::Status SaveHeadCheckpoint(const ServiceContext& ctx, const Principal& who,
                                const v1::SaveCheckpointRequest& request, v1::CheckpointInfo* out) {
  FLCE_RETURN_IF_ERROR(ValidateId(request.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(request.request_id(), "request_id"));
  FLCE_RETURN_IF_ERROR(RequireCheckpointDir(ctx));
  FLCE_ASSIGN_OR_RETURN(std::string path,
                        CheckpointPath(ctx.config.checkpoint_dir, who.tenant, request.name()));
  FLCE_ASSIGN_OR_RETURN(HeadEntry head, ctx.heads->Get(who.tenant, request.head_id()));
  FLCE_RETURN_IF_ERROR(CheckMayTrain(who, head));
  HeadTrainingState& training = *head.training;
  // Steps hold this lock: the file is one version of the head and its state.
  absl::MutexLock lock(&training.mu());
  if (!request.request_id().empty()) {
    if (std::optional<v1::CheckpointInfo> seen =
            ctx.checkpoints->Find(who.tenant, request.request_id())) {
      if (seen->name() != request.name()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request_id \"", request.request_id(), "\" saved checkpoint \"", seen->name(),
            "\", not \"", request.name(), "\": choose a new request id for a new save"));
      }
      *out = *seen;
      out->set_replayed(true);
      return absl::OkStatus();
    }
  }
  FLCE_ASSIGN_OR_RETURN(HeadEntry now, ctx.heads->Get(who.tenant, request.head_id()));
  if (now.training != head.training) {
    return absl::AbortedError(absl::StrCat("head \"", head.head_id, "\" was replaced"));
  }
  const HeadSpec& spec = now.head->spec();
  HeadOptimizer* optimizer = training.optimizer();

  Metadata meta;
  meta["format"] = kCheckpointFormat;
  meta["flce_version"] = ctx.version;
  meta["head_id"] = head.head_id;
  meta["vocab_size"] = absl::StrCat(spec.vocab_size);
  meta["hidden_size"] = absl::StrCat(spec.hidden_size);
  meta["dtype"] = DTypeToSafetensors(spec.dtype);
  meta["has_bias"] = spec.has_bias ? "true" : "false";
  meta["head_version"] = absl::StrCat(now.version);
  meta["optimizer"] = optimizer == nullptr ? "none" : OptimizerName(optimizer->config().kind);
  std::vector<TensorSource> tensors;
  const Head* resident = now.head.get();
  tensors.push_back({"weight",
                     spec.dtype,
                     {spec.vocab_size, spec.hidden_size},
                     [resident](int64_t begin, int64_t count, void* data) {
                       return resident->CopyOut(HeadTensor::kWeight, begin, count, data);
                     }});
  if (spec.has_bias) {
    tensors.push_back({"bias",
                       spec.dtype,
                       {spec.vocab_size},
                       [resident](int64_t begin, int64_t count, void* data) {
                         return resident->CopyOut(HeadTensor::kBias, begin, count, data);
                       }});
  }
  if (optimizer != nullptr) {
    const OptimizerConfig& config = optimizer->config();
    meta["steps"] = absl::StrCat(optimizer->steps());
    meta["skipped_steps"] = absl::StrCat(training.skipped());
    PutGroup(meta, "weight", config.weight);
    if (spec.has_bias) PutGroup(meta, "bias", config.bias);
    for (const StateTensor& t : StateTensors(spec, config)) {
      std::vector<int64_t> shape = t.group == HeadTensor::kWeight
                                       ? std::vector<int64_t>{spec.vocab_size, spec.hidden_size}
                                       : std::vector<int64_t>{spec.vocab_size};
      tensors.push_back(
          {t.name, DType::kF32, shape, [optimizer, t](int64_t begin, int64_t count, void* data) {
             return optimizer->ReadState(t.group, t.tensor, begin, count,
                                         static_cast<float*>(data));
           }});
    }
  }
  FLCE_RETURN_IF_ERROR(MakeDirectory(ctx.config.checkpoint_dir));
  FLCE_RETURN_IF_ERROR(
      MakeDirectory(absl::StrCat(ctx.config.checkpoint_dir, "/", TenantDirectoryName(who.tenant))));
  absl::StatusOr<int64_t> bytes = WriteSafetensors(path, tensors, meta, request.overwrite());
  if (absl::IsAlreadyExists(bytes.status())) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint \"", request.name(), "\" exists: set overwrite to replace it"));
  }
  FLCE_RETURN_IF_ERROR(bytes.status());
  out->set_name(request.name());
  out->set_bytes(*bytes);
  out->set_head_version(now.version);
  out->set_steps(optimizer == nullptr ? 0 : optimizer->steps());
  out->set_has_optimizer(optimizer != nullptr);
  if (!request.request_id().empty()) {
    ctx.checkpoints->Record(who.tenant, request.request_id(), *out);
  }
  return absl::OkStatus();
}

absl::Status LoadHeadCheckpoint(const ServiceContext& ctx, const Principal& who,
                                const v1::LoadCheckpointRequest& request, v1::HeadInfo* out) {
  FLCE_RETURN_IF_ERROR(ValidateId(request.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(request.request_id(), "request_id"));
  FLCE_RETURN_IF_ERROR(RequireCheckpointDir(ctx));
  FLCE_ASSIGN_OR_RETURN(std::string path,
                        CheckpointPath(ctx.config.checkpoint_dir, who.tenant, request.name()));
  FLCE_ASSIGN_OR_RETURN(std::string owner,
                        ctx.heads->WriteOwner(who.tenant, who.admin, request.head_id()));
  if (!request.request_id().empty()) {
    if (absl::StatusOr<HeadEntry> current = ctx.heads->Get(who.tenant, request.head_id());
        current.ok()) {
      bool repeat;
      std::string loaded_name;
      {
        absl::MutexLock lock(&current->training->mu());
        repeat = current->training->loaded_by() == request.request_id();
        loaded_name = current->training->loaded_name();
      }
      if (repeat && loaded_name != request.name()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request_id \"", request.request_id(), "\" loaded checkpoint \"", loaded_name,
            "\", not \"", request.name(), "\": choose a new request id for a new load"));
      }
      if (repeat) {
        FillHeadInfo(*current, ctx.sessions->Count(who.tenant, current->head_id), out);
        return absl::OkStatus();
      }
    }
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint \"", request.name(), "\" does not exist (among this tenant's)"));
  }
  FLCE_RETURN_IF_ERROR(file.status());
  FLCE_ASSIGN_OR_RETURN(CheckpointContents contents, ReadContents(*file, request.name()));

  auto training = std::make_shared<HeadTrainingState>();
  if (contents.optimizer) {
    training->set_state_bytes(OptimizerStateBytes(contents.spec, *contents.optimizer));
  }
  PutOptions options;
  options.reset_optimizer = request.reset_optimizer();
  options.min_version = contents.version;
  options.training = training;
  UploadBudget::Reservation reservation;
  auto check = [&](const HeadSpec& spec) -> absl::Status {
    FLCE_RETURN_IF_ERROR(ctx.heads->CheckPut(owner, request.head_id(), spec, options));
    FLCE_ASSIGN_OR_RETURN(reservation, ctx.uploads->Reserve(request.head_id(), HeadBytes(spec)));
    return absl::OkStatus();
  };
  FLCE_ASSIGN_OR_RETURN(
      std::shared_ptr<const Head> head,
      LoadSafetensorsHead(*ctx.engine, path, "weight", contents.spec.has_bias ? "bias" : "",
                          contents.spec.dtype, check));
  {
    absl::MutexLock lock(&training->mu());
    if (contents.optimizer) {
      FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadOptimizer> optimizer,
                            ctx.engine->CreateOptimizer(head, *contents.optimizer));
      std::vector<float> piece;
      constexpr int64_t kPiece = int64_t{4} << 20;  // floats
      for (const StateTensor& t : contents.state) {
        FLCE_ASSIGN_OR_RETURN(const SafetensorsTensor* tensor, file->Find(t.name));
        for (int64_t begin = 0; begin < t.elements; begin += kPiece) {
          const int64_t count = std::min(kPiece, t.elements - begin);
          piece.resize(count);
          FLCE_RETURN_IF_ERROR(file->Read(*tensor, begin * 4, count * 4, piece.data()));
          FLCE_RETURN_IF_ERROR(
              optimizer->WriteState(t.group, t.tensor, begin, count, piece.data()));
        }
      }
      optimizer->set_steps(contents.steps);
      training->set_optimizer(std::move(optimizer));
      training->set_skipped(contents.skipped);
    }
    training->set_loaded_by(request.request_id(), request.name());
  }
  FLCE_ASSIGN_OR_RETURN(HeadEntry entry,
                        ctx.heads->Put(owner, request.head_id(), std::move(head),
                                       absl::StrCat("checkpoint:", request.name()), options));
  FillHeadInfo(entry, ctx.sessions->Count(who.tenant, entry.head_id), out);
  return absl::OkStatus();
}

}  // namespace flce::server
