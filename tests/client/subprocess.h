// Child processes for the end-to-end tests: run a program to completion and
// capture its output, or keep a server running for the test's duration.
#ifndef FLCE_TESTS_CLIENT_SUBPROCESS_H_
#define FLCE_TESTS_CLIENT_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace flce::test {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out;
  std::string err;
};

// Runs argv[0] with argv, waits, and returns its exit status and output.
// scratch_dir holds the files stdout and stderr go through.
ProcessResult RunProcess(const std::vector<std::string>& argv, const std::string& scratch_dir);

// A background process whose stdout and stderr go to log_path. The
// destructor stops it with SIGTERM (SIGKILL after a few seconds).
class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // e.g. to send SIGHUP
  // False once the process has exited (it is then reaped).
  bool Running();
  // SIGTERM, then waits up to timeout_s; SIGKILL after that. Returns the
  // exit status as RunProcess does.
  int Stop(double timeout_s = 10);

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

std::string ReadFile(const std::string& path);

}  // namespace flce::test

#endif  // FLCE_TESTS_CLIENT_SUBPROCESS_H_
