#include "registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace mm_variants {
namespace {

// A function-local static, so registrations from any translation unit's static initializers
// find it constructed.
std::vector<Algorithm>& all_algorithms() {
  static std::vector<Algorithm> algorithms;
  return algorithms;
}

std::string join_names(const std::vector<const Algorithm*>& algorithms) {
  std::ostringstream out;
  out << "auto";
  for (const Algorithm* algorithm : algorithms) out << ", " << algorithm->name;
  return out.str();
}

}  // namespace

std::string printable_name(c10::string_view name) {
  std::string out;
  for (const char c : name) {
    if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
      out += c;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", static_cast<unsigned>(c & 0xff));
    out += escaped;
  }
  return out;
}

bool Algorithm::supports(c10::ScalarType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

void register_algorithm(Algorithm algorithm) {
  auto& algorithms = all_algorithms();
  for (const Algorithm& existing : algorithms) {
    TORCH_CHECK(existing.name != algorithm.name || existing.device_type != algorithm.device_type,
                "mm_variants: algorithm '", algorithm.name, "' registered twice for ",
                c10::DeviceTypeName(algorithm.device_type, /*lower_case=*/true));
  }
  algorithms.push_back(std::move(algorithm));
  std::stable_sort(algorithms.begin(), algorithms.end(),
                   [](const Algorithm& x, const Algorithm& y) { return x.rung < y.rung; });
}

std::vector<const Algorithm*> algorithms_for(c10::Device device) {
  std::vector<const Algorithm*> result;
  for (const Algorithm& algorithm : all_algorithms()) {
    if (algorithm.device_type != device.type()) continue;
    if (algorithm.runs_on != nullptr && !algorithm.runs_on(device)) continue;
    result.push_back(&algorithm);
  }
  return result;
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (const Algorithm& algorithm : all_algorithms()) {
    if (std::find(names.begin(), names.end(), algorithm.name) == names.end()) {
      names.push_back(algorithm.name);
    }
  }
  return names;
}

const Algorithm& find_algorithm(c10::Device device, const std::string& name, const char* op) {
  const auto candidates = algorithms_for(device);
  for (const Algorithm* algorithm : candidates) {
    if (algorithm->name == name) return *algorithm;
  }
  const std::string device_name = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  TORCH_CHECK(!candidates.empty(), op, ": no ", device_name,
              " kernels are available in this build of torch_mm_variants (device ", device.str(),
              ")");
  for (const Algorithm& algorithm : all_algorithms()) {
    TORCH_CHECK(algorithm.name != name || algorithm.device_type != device.type(),
                op, ": algorithm '", printable_name(name), "' cannot run on ", device.str(),
                "; valid algorithms there: ", join_names(candidates));
  }
  TORCH_CHECK(false, op, ": unknown algorithm '", printable_name(name), "' for ", device_name,
              "; valid algorithms: ", join_names(candidates));
}

}  // namespace mm_variants
