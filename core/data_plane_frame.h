// The data plane's bytes (docs/API.md, "The data plane"), as the server and
// the C++ client write and read them. A connection opens with the hello (the
// magic, then the 16-byte token of the call's PiecesOpened answer); then each
// side sends frames: two little-endian int64 (the first row's token offset,
// the payload's byte count), then the payload. The client ends its rows with
// the end frame (offset kEndOffset, count = the rows it sent, no payload).
#ifndef FLCE_CORE_DATA_PLANE_FRAME_H_
#define FLCE_CORE_DATA_PLANE_FRAME_H_

#include <cstddef>
#include <cstdint>

namespace flce::data_plane {

inline constexpr char kMagic[8] = {'F', 'L', 'C', 'E', 'D', 'P', '1', '\n'};
inline constexpr size_t kTokenBytes = 16;
inline constexpr size_t kHelloBytes = sizeof(kMagic) + kTokenBytes;
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr int64_t kEndOffset = -1;

struct FrameHeader {
  int64_t token_offset = 0;
  int64_t count = 0;  // payload bytes; for the end frame, the rows sent
};

inline void PutInt64(int64_t value, unsigned char* out) {
  const uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

inline int64_t GetInt64(const unsigned char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

inline void EncodeFrameHeader(const FrameHeader& header, unsigned char out[kFrameHeaderBytes]) {
  PutInt64(header.token_offset, out);
  PutInt64(header.count, out + 8);
}

inline FrameHeader DecodeFrameHeader(const unsigned char in[kFrameHeaderBytes]) {
  return FrameHeader{GetInt64(in), GetInt64(in + 8)};
}

}  // namespace flce::data_plane

#endif  // FLCE_CORE_DATA_PLANE_FRAME_H_
