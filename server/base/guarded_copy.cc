#include "server/base/guarded_copy.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace flce::server {
namespace {

// volatile: the stores around memcpy are read by the signal handler, which the
// compiler does not see (it would drop the first store as dead otherwise).
thread_local sigjmp_buf* volatile t_copy_jump = nullptr;
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* jump = t_copy_jump; jump != nullptr) {
    t_copy_jump = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not ours: whatever handled SIGBUS before (the default: a core dump).
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0 && g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN &&
      g_previous_sigbus.sa_handler != nullptr) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallHandler() {
  struct sigaction action {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous_sigbus);
}

}  // namespace

absl::Status GuardedCopy(void* dst, const void* src, size_t bytes) {
  static std::once_flag installed;
  std::call_once(installed, InstallHandler);
  // A fault is delivered to the faulting thread, but one that blocks SIGBUS
  // (threads started by gRPC inherit a mask without it) is killed instead.
  sigset_t bus, old_mask;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &bus, &old_mask);
  sigjmp_buf jump;
  // savemask = 1: leaving the handler by siglongjmp restores this mask.
  if (sigsetjmp(jump, 1) != 0) {
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    return absl::FailedPreconditionError(
        "the shared-memory region is shorter than it was registered (the client truncated it): "
        "nothing of this call landed");
  }
  t_copy_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy_jump = nullptr;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return absl::OkStatus();
}

}  // namespace flce::server
