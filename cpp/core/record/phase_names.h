// Interns phase names to small integer ids so that events carry an id, not a string.
// Thread-safe (mutex); meant for the cold path: callers cache the id per name.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpuprof::record {

class PhaseNames {
 public:
  static constexpr uint32_t kForward = 0;
  static constexpr uint32_t kBackward = 1;
  static constexpr uint32_t kOptimizer = 2;

  PhaseNames();
  uint32_t Intern(const std::string& name);
  // Returns "" for an unknown id.
  std::string Name(uint32_t id) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> ids_;
};

}  // namespace gpuprof::record
