// Request ids for compute calls and resetting fetches: the server answers a
// repeated id from its first outcome, so an id must never be reused by
// accident. 128 random bits as 32 hex digits make that practically certain.
#ifndef FLCE_CLIENT_CPP_REQUEST_ID_H_
#define FLCE_CLIENT_CPP_REQUEST_ID_H_

#include <string>

namespace flce {

std::string NewRequestId();

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_REQUEST_ID_H_
