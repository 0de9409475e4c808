// How many rows (or elements) of a tensor one gRPC message carries, so that
// every message stays under a --max-message-mb limit. Shared by the server
// (grad_input, token outputs, gradients) and the C++ client (hidden, head
// uploads).
//
// Usage:
//   int64_t rows = ItemsPerMessage(config.max_message_bytes, H *
//   DTypeSize(dtype));
#ifndef FLCE_PROTO_FLCE_V1_MESSAGE_SIZE_H_
#define FLCE_PROTO_FLCE_V1_MESSAGE_SIZE_H_

#include <cstdint>

namespace flce {

// Room kept in each message for the fields around its bytes payload
// (offsets, counts, tags): a few dozen bytes are used.
inline constexpr int64_t kMessageOverhead = 4096;

// Payload bytes one message of max_message_bytes may carry (at least 1).
int64_t PayloadBytesPerMessage(int64_t max_message_bytes);
// Items of item_bytes that fit one message (at least 1).
int64_t ItemsPerMessage(int64_t max_message_bytes, int64_t item_bytes);

}  // namespace flce

#endif  // FLCE_PROTO_FLCE_V1_MESSAGE_SIZE_H_
