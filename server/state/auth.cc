#include "server/state/auth.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace flce::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       absl::string_view path) {
  std::vector<TokenEntry> entries;
  std::set<std::string> seen;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": ", why, " (want `token tenant [admin]`)"));
    };
    if (words.size() < 2 || words.size() > 3) return bad("wrong number of fields");
    if (words.size() == 3 && words[2] != "admin") return bad("third field is not `admin`");
    if (!seen.insert(std::string(words[0])).second) return bad("token given twice");
    entries.push_back(
        TokenEntry{std::string(words[0]), Principal{std::string(words[1]), words.size() == 3}});
  }
  return entries;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of the longer string is looked at whatever the contents.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const std::string& path) {
  std::unique_ptr<Authenticator> auth(new Authenticator(path));
  if (auth->enabled()) {
    absl::StatusOr<size_t> loaded = auth->Reload();
    if (!loaded.ok()) return loaded.status();
  }
  return auth;
}

absl::StatusOr<size_t> Authenticator::Reload() {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read --auth-token-file=", path_));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<TokenEntry>> parsed = ParseTokenFile(text.str(), path_);
  if (!parsed.ok()) return parsed.status();
  auto table = std::make_shared<const std::vector<TokenEntry>>(*std::move(parsed));
  absl::MutexLock lock(&mu_);
  tokens_ = std::move(table);
  return tokens_->size();
}

size_t Authenticator::token_count() const {
  absl::MutexLock lock(&mu_);
  return tokens_ == nullptr ? 0 : tokens_->size();
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (!enabled()) return Principal{"", true};
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "no `authorization: Bearer <token>` metadata (the server requires a token)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError("the authorization metadata is not `Bearer <token>`");
  }
  absl::string_view token = absl::StripAsciiWhitespace(value.substr(kBearer.size()));
  std::shared_ptr<const std::vector<TokenEntry>> table;
  {
    absl::MutexLock lock(&mu_);
    table = tokens_;
  }
  // Compare against every entry, no early exit: the time says nothing about
  // which token (or how much of one) matched.
  const Principal* found = nullptr;
  for (const TokenEntry& entry : *table) {
    if (ConstantTimeEquals(token, entry.token)) found = &entry.principal;
  }
  if (found == nullptr || token.empty()) {
    return absl::UnauthenticatedError("the bearer token is not valid");
  }
  return *found;
}

}  // namespace flce::server
