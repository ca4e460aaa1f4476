// algorithm="auto": which kernel runs for given inputs.
//
// Two modes. The heuristic (default) costs nothing at run time: the highest rung whose
// `accepts` takes the inputs, rungs being ordered so that each is faster than the ones below it
// on what it accepts. The measured mode (set_autotune(true), which the Python package calls at
// import under MM_VARIANTS_AUTOTUNE=1) times every eligible kernel once per shape bucket on the
// real inputs, keeps the winner in memory and in a JSON file, and reuses it from then on. It
// never measures during CUDA graph capture, nor on inputs that hold no data (the fake tensors of
// torch.compile or torch.export tracing, which run the fake kernel anyway, reach it through
// explain_auto): there the cached or heuristic choice is used. float32 on a GPU keeps separate
// choices with TF32 allowed and not.
#pragma once

#include "registry.h"

#include <map>
#include <string>

namespace mm_variants {

struct AutoDecision {
  const Algorithm* algorithm;
  std::string reason;  // "heuristic", "measured" or "cached"
  std::string bucket;  // the cache key: device, dtype, layouts and shape bucket
};

// `op` names the op in the refusal of a dtype that no candidate takes. `with_bucket` fills in
// the bucket even where nothing reads it (no cached choices, no measuring), for explain_auto;
// the ops' own calls skip building that key then.
AutoDecision decide_auto(const at::Tensor& a, const at::Tensor& b, const char* op = kMatmulOp,
                         bool with_bucket = true);

// decide_auto's refusal of a dtype that no candidate on `device` takes, before any sizes are
// known (the fake kernels run it through check_dtype_and_algorithm).
void check_auto_dtype(const char* op, c10::Device device, c10::ScalarType dtype);

inline const Algorithm& choose_auto(const at::Tensor& a, const at::Tensor& b, const char* op) {
  return *decide_auto(a, b, op, /*with_bucket=*/false).algorithm;
}

// Among the rungs that auto may run on these inputs and that take a whole batch in one launch
// (run_batched), the one auto's heuristic picks for a batch of `entries` such products (the
// highest that does not defer them to a lower one of them), or nullptr.
const Algorithm* batched_candidate(const at::Tensor& a, const at::Tensor& b, int64_t entries);

void set_autotune(bool enabled);
bool autotune_enabled();

// Where measured choices are saved (rewritten after each new measurement); empty: memory only.
void set_tuning_file(const std::string& path);
// Adds choices read from the tuning file; entries naming unknown algorithms are ignored.
void add_tuned_entries(const std::map<std::string, std::string>& entries);
std::map<std::string, std::string> tuned_entries();
void clear_tuned_entries();

// How a device type times candidate kernels on real inputs: milliseconds per candidate, or an
// empty vector when measuring is not allowed right now (e.g. during CUDA graph capture).
struct DeviceTuner {
  std::vector<double> (*time)(const std::vector<const Algorithm*>& candidates,
                              const at::Tensor& a, const at::Tensor& b);
  std::string (*device_name)(c10::Device device);
};
void register_device_tuner(c10::DeviceType type, DeviceTuner tuner);

}  // namespace mm_variants
