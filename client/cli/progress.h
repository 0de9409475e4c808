// A one-line progress display on stderr for long operations (big uploads,
// bench). Silent unless enabled: flce-client enables it only when stderr is
// a terminal, so logs and pipes never see carriage returns.
#ifndef FLCE_CLIENT_CLI_PROGRESS_H_
#define FLCE_CLIENT_CLI_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace flce::cli {

class Progress {
 public:
  Progress(bool enabled, std::ostream& err, std::string label);
  ~Progress();  // ends the line if anything was drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Redraws at most ~10 times a second, and always at done == total.
  // unit "B" shows sizes and a rate; anything else plain counts.
  void Update(int64_t done, int64_t total, const std::string& unit = "B");

 private:
  bool enabled_;
  std::ostream& err_;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_PROGRESS_H_
