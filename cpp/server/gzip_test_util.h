// Test-only: a gzip stream of some bytes, the client side of Gunzip (ingest_api.h), for the
// ingest tests and the ingest fuzz target.
#pragma once

#include <zlib.h>

#include <string>
#include <string_view>

namespace gpuprof::server {

inline std::string Gzip(std::string_view plain, int level = Z_BEST_COMPRESSION) {
  z_stream zs{};
  deflateInit2(&zs, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, plain.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  zs.avail_in = static_cast<uInt>(plain.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace gpuprof::server
