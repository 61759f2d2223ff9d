#include "record/phase_names.h"

namespace gpuprof::record {

PhaseNames::PhaseNames() {
  for (const char* n : {"forward", "backward", "optimizer"}) Intern(n);
}

uint32_t PhaseNames::Intern(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = ids_.find(name);
  if (it != ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(names_.size());
  names_.push_back(name);
  ids_.emplace(name, id);
  return id;
}

std::string PhaseNames::Name(uint32_t id) const {
  std::lock_guard lock(mu_);
  return id < names_.size() ? names_[id] : std::string();
}

}  // namespace gpuprof::record
