// Registry and session-store entries as the proto messages clients see.
#ifndef FLCE_SERVER_HANDLERS_HEAD_INFO_H_
#define FLCE_SERVER_HANDLERS_HEAD_INFO_H_

#include <cstdint>

#include "flce/v1/flce.pb.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"

namespace flce::server {

void FillHeadInfo(const HeadEntry& entry, int64_t sessions, v1::HeadInfo* out);
void FillSessionInfo(const SessionSummary& summary, v1::SessionInfo* out);
v1::ContributionState ToProto(ContributionState state);

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_HEAD_INFO_H_
