#include "flce/v1/message_size.h"

#include <algorithm>

namespace flce {

int64_t PayloadBytesPerMessage(int64_t max_message_bytes) {
  return std::max<int64_t>(1, max_message_bytes - kMessageOverhead);
}

int64_t ItemsPerMessage(int64_t max_message_bytes, int64_t item_bytes) {
  return std::max<int64_t>(1, PayloadBytesPerMessage(max_message_bytes) / item_bytes);
}

}  // namespace flce
