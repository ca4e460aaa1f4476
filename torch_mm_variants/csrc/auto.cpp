#include "auto.h"

#include "cpu/simd.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>

#if __has_include(<sys/file.h>) && __has_include(<unistd.h>)
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#define MM_VARIANTS_HAS_FLOCK 1
#endif

namespace mm_variants {
namespace {

struct TuningState {
  std::mutex mutex;
  std::map<std::string, std::string> entries;  // bucket -> algorithm name
  // The entries this process measured: the only ones its saves write, so that a save never puts
  // back what another process has since measured afresh, or what was removed from the file.
  std::map<std::string, std::string> measured;
  std::string file;
  std::map<c10::DeviceType, DeviceTuner> tuners;
};

TuningState& state() {
  static TuningState s;
  return s;
}

// Off until set_autotune: the Python package reads MM_VARIANTS_AUTOTUNE at import, where a value
// it does not understand can be reported as a Python warning.
std::atomic<bool>& autotune_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Shapes within a factor of two share a choice: each dimension is rounded up to a power of two.
int64_t bucket_of(int64_t x) {
  constexpr int64_t kLargest = int64_t{1} << 62;  // sizes past it share the last bucket
  int64_t b = 1;
  while (b < x && b < kLargest) b <<= 1;
  return b;
}

// 'c' for a column-major operand (a transposed view), else 'r'.
char layout_of(const at::Tensor& t) { return t.stride(0) == 1 && t.stride(1) != 1 ? 'c' : 'r'; }

// The dtype as the kernels take it. float32 on a GPU runs in TF32 or in full precision as
// torch.backends.cuda.matmul.allow_tf32 says, often on other kernels (wgmma leaves full
// precision to tensor_core), so the two keep separate choices.
std::string dtype_key(const at::Tensor& a) {
  const bool tf32 = a.scalar_type() == at::kFloat && !a.is_cpu() &&
                    at::globalContext().allowTF32CuBLAS();
  return std::string(c10::toString(a.scalar_type())) + (tf32 ? "(tf32)" : "");
}

std::string bucket_key(const at::Tensor& a, const at::Tensor& b, const std::string& device_name) {
  return device_name + "|" + dtype_key(a) + "|" + layout_of(a) + layout_of(b) +
         "|" + std::to_string(bucket_of(a.size(0))) + "x" + std::to_string(bucket_of(b.size(1))) +
         "x" + std::to_string(bucket_of(a.size(1)));
}

// Whether auto may run `algorithm` on inputs of `dtype`, before their sizes are known.
bool auto_takes(const Algorithm& algorithm, c10::ScalarType dtype) {
  return algorithm.auto_candidate && algorithm.supports(dtype);
}

// Whether each of the candidates above `rung` (there is one at least) passes a single product of
// these inputs over for a lower rung.
bool all_above_defer(const std::vector<const Algorithm*>& candidates, int rung,
                     const at::Tensor& a, const at::Tensor& b) {
  bool any = false;
  for (const Algorithm* algorithm : candidates) {
    if (algorithm->rung <= rung) continue;
    if (algorithm->defers_to_lower == nullptr || !algorithm->defers_to_lower(a, b, 1)) return false;
    any = true;
  }
  return any;
}

// auto's candidates for these inputs, in ladder order: the auto candidates that take them, and a
// rung offered only where the ones above it defer (auto_where_deferred_to) where they all do.
// Each algorithm's dtype and `accepts` are checked once: this runs on every auto call.
std::vector<const Algorithm*> eligible(const at::Tensor& a, const at::Tensor& b) {
  std::vector<const Algorithm*> candidates, offered;
  for (const Algorithm* algorithm : algorithms_for(a.device())) {
    if (!algorithm->auto_candidate && !algorithm->auto_where_deferred_to) continue;
    if (!algorithm->supports(a.scalar_type())) continue;
    if (algorithm->accepts != nullptr && !algorithm->accepts(a, b)) continue;
    (algorithm->auto_candidate ? candidates : offered).push_back(algorithm);
  }
  std::vector<const Algorithm*> taken;
  for (const Algorithm* algorithm : offered) {
    if (all_above_defer(candidates, algorithm->rung, a, b)) taken.push_back(algorithm);
  }
  for (const Algorithm* algorithm : taken) {
    const auto above = std::find_if(candidates.begin(), candidates.end(),
                                    [&](const Algorithm* c) { return c->rung > algorithm->rung; });
    candidates.insert(above, algorithm);
  }
  return candidates;
}

// The highest rung of the candidates (in ladder order) that does not defer `entries` products of
// these inputs to a lower one.
const Algorithm* heuristic_choice(const std::vector<const Algorithm*>& candidates,
                                  const at::Tensor& a, const at::Tensor& b, int64_t entries = 1) {
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    const Algorithm* algorithm = *it;
    if (algorithm->defers_to_lower == nullptr || !algorithm->defers_to_lower(a, b, entries) ||
        std::next(it) == candidates.rend()) {
      return algorithm;
    }
  }
  return candidates.back();
}

const Algorithm* by_name(const std::vector<const Algorithm*>& candidates, const std::string& name) {
  for (const Algorithm* algorithm : candidates) {
    if (algorithm->name == name) return algorithm;
  }
  return nullptr;
}

// Holds an exclusive advisory lock on `path` while alive, so that processes sharing a tuning file
// save one at a time and none overwrites entries another has just written. The lock file is
// never removed: unlinking it would let two processes lock different files of the same name.
// Without flock, or where the lock file can be neither created nor read, saves go unlocked.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
#ifdef MM_VARIANTS_HAS_FLOCK
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    // flock needs no write access: a lock file that another user created, in a cache folder
    // they share, still orders this process's saves with theirs.
    if (fd_ < 0) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) release();  // a signal only interrupts the wait: wait again
    }
#else
    (void)path;
#endif
  }
  ~FileLock() { release(); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  void release() {
#ifdef MM_VARIANTS_HAS_FLOCK
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the lock
#endif
    fd_ = -1;
  }
  int fd_ = -1;
};

// `s` as a JSON string: quotes and backslashes escaped, and control characters, which JSON
// readers refuse raw (Python's json among them: a file holding one would be read as empty).
// Bytes past 0x7f are UTF-8 and go as they are.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[7];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void skip_whitespace(const std::string& text, size_t& pos) {
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
}

// Skips whitespace, then consumes `c` if it comes next.
bool consume(const std::string& text, size_t& pos, char c) {
  skip_whitespace(text, pos);
  if (pos == text.size() || text[pos] != c) return false;
  ++pos;
  return true;
}

// Reads the four hex digits of a \u escape at `pos` into `code`.
bool read_hex4(const std::string& text, size_t& pos, uint32_t& code) {
  if (text.size() - pos < 4) return false;
  code = 0;
  for (int i = 0; i < 4; ++i) {
    const char h = text[pos++];
    const int digit = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                      : (h >= 'a' && h <= 'f')                     ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F')                     ? h - 'A' + 10
                                                                   : -1;
    if (digit < 0) return false;
    code = code * 16 + static_cast<uint32_t>(digit);
  }
  return true;
}

// Appends code point `code` to `out` in UTF-8.
void append_utf8(uint32_t code, std::string& out) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// Reads a \u escape after its "\u" into `out` as UTF-8: one code point, or a surrogate pair's
// two escapes as one (as Python's json writes characters past the BMP). A lone surrogate has no
// UTF-8 form and becomes U+FFFD, so that the file's other entries still count (load_cache skips
// such an entry, and no bucket holds one).
bool read_unicode_escape(const std::string& text, size_t& pos, std::string& out) {
  uint32_t code = 0, low = 0;
  if (!read_hex4(text, pos, code)) return false;
  if (code >= 0xD800 && code < 0xDC00 && text.compare(pos, 2, "\\u") == 0) {
    size_t after = pos + 2;
    if (!read_hex4(text, after, low)) return false;
    if (low >= 0xDC00 && low < 0xE000) {
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
      pos = after;
    }
  }
  append_utf8(code >= 0xD800 && code < 0xE000 ? 0xFFFD : code, out);
  return true;
}

// Reads a JSON string at `pos` into `out` (UTF-8); false for anything else.
bool read_json_string(const std::string& text, size_t& pos, std::string& out) {
  static const std::map<char, char> kUnescaped = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},
                                                  {'b', '\b'}, {'f', '\f'},  {'n', '\n'},
                                                  {'r', '\r'}, {'t', '\t'}};
  if (!consume(text, pos, '"')) return false;
  out.clear();
  while (pos < text.size() && text[pos] != '"') {
    char c = text[pos++];
    if (c == '\\' && pos < text.size() && text[pos] == 'u') {
      if (!read_unicode_escape(text, ++pos, out)) return false;
      continue;
    }
    if (c == '\\') {
      const auto unescaped = pos < text.size() ? kUnescaped.find(text[pos++]) : kUnescaped.end();
      if (unescaped == kUnescaped.end()) return false;
      c = unescaped->second;
    }
    out += c;
  }
  return consume(text, pos, '"');
}

// Reads the members of a JSON object of strings; false if `text` is anything else.
bool read_json_entries(const std::string& text, std::map<std::string, std::string>& entries) {
  size_t pos = 0;
  if (!consume(text, pos, '{')) return false;
  if (!consume(text, pos, '}')) {
    do {
      std::string bucket, name;
      if (!read_json_string(text, pos, bucket) || !consume(text, pos, ':') ||
          !read_json_string(text, pos, name)) {
        return false;
      }
      entries[bucket] = name;
    } while (consume(text, pos, ','));
    if (!consume(text, pos, '}')) return false;
  }
  skip_whitespace(text, pos);
  return pos == text.size();
}

// The entries of a tuning file as write_tuning_file writes it. A missing, unreadable or malformed
// file counts as empty, as load_cache treats it.
std::map<std::string, std::string> read_tuning_file(const std::string& file) {
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::map<std::string, std::string> entries;
  return read_json_entries(text, entries) ? entries : std::map<std::string, std::string>{};
}

// The entries as a JSON object, one member a line.
std::string json_text(const std::map<std::string, std::string>& entries) {
  std::string text = "{\n";
  size_t i = 0;
  for (const auto& [bucket, name] : entries) {
    text += "  " + json_string(bucket) + ": " + json_string(name) +
            (++i < entries.size() ? ",\n" : "\n");
  }
  return text + "}\n";
}

#ifdef MM_VARIANTS_HAS_FLOCK
bool write_all(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Writes `text` to a new file beside `file`, and returns its name (empty where that failed). The
// file is created afresh (O_EXCL), so a file or a link that someone placed under the name in a
// shared cache folder is never written through.
std::string write_temporary(const std::string& file, const std::string& text) {
  static std::atomic<unsigned> serial{0};
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string tmp =
        file + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return "";
    const bool written = write_all(fd, text);
    if (::close(fd) == 0 && written) return tmp;
    ::unlink(tmp.c_str());
    return "";
  }
  return "";
}
#else
std::string write_temporary(const std::string& file, const std::string& text) {
  const std::string tmp = file + ".tmp";
  std::ofstream out(tmp);
  out << text;
  out.close();
  if (out) return tmp;
  std::remove(tmp.c_str());
  return "";
}
#endif

// Writes the file through a temporary and a rename, so that readers never see half of it. A
// partial write (a full disk) must not replace the file; an unwritable cache directory only costs
// re-measuring next time.
void write_tuning_file(const std::string& file, const std::map<std::string, std::string>& entries) {
  const std::string tmp = write_temporary(file, json_text(entries));
  if (!tmp.empty() && std::rename(tmp.c_str(), file.c_str()) != 0) std::remove(tmp.c_str());
}

// Adds the entries this process measured (the caller holds the state's mutex) to what the file
// holds now, under a file lock held across the read and the rewrite; for the same bucket, this
// process's measurement wins. Entries it only loaded are left to the file.
void save_locked(const TuningState& s) {
  if (s.file.empty()) return;
  try {
    const FileLock lock(s.file + ".lock");
    std::map<std::string, std::string> merged = read_tuning_file(s.file);
    for (const auto& [bucket, name] : s.measured) merged[bucket] = name;
    write_tuning_file(s.file, merged);
  } catch (const std::exception&) {
    // Only memory can run out here; the choice is still kept in memory for this process, and a
    // matmul must not fail for want of a cache file.
  }
}

// The CPU's tuner: wall-clock time, the median of three runs after a warm-up run. One run alone
// let near-ties flip from one process to the next (simd_packed against parallel at 64^3), and
// the choice is kept for good.
std::vector<double> time_on_cpu(const std::vector<const Algorithm*>& candidates,
                                const at::Tensor& a, const at::Tensor& b) {
  std::vector<double> ms;
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  for (const Algorithm* algorithm : candidates) {
    algorithm->run(a, b, out);
    std::array<double, 3> runs{};
    for (double& run_ms : runs) {
      const auto start = std::chrono::steady_clock::now();
      algorithm->run(a, b, out);
      const auto elapsed = std::chrono::steady_clock::now() - start;
      run_ms = std::chrono::duration<double, std::milli>(elapsed).count();
    }
    std::sort(runs.begin(), runs.end());
    ms.push_back(runs[1]);
  }
  return ms;
}

// The CPU's part of a bucket's key: what its kernels' speed depends on besides the shape, the
// vector instructions they use and the threads they get, so that a cache file shared by other
// machines, or read by a process with another thread count, holds separate choices for them.
std::string cpu_name(c10::Device) {
  return "cpu " + cpu::simd::isa() + " " + std::to_string(at::get_num_threads()) + " threads";
}

// Whether the kernels can be timed on these inputs: tensors with data, not the fake or functional
// ones of tracing (torch.compile, torch.export, explain_auto called under them), and no dispatch
// mode (FakeTensorMode) that would make the timing's own output fake.
bool can_time(const at::Tensor& a, const at::Tensor& b) {
  const auto holds_data = [](const at::Tensor& t) {
    return !t.is_meta() && !t.unsafeGetTensorImpl()->is_python_dispatch() &&
           !at::functionalization::impl::isFunctionalTensor(t);
  };
  return holds_data(a) && holds_data(b) && !c10::impl::dispatch_mode_enabled();
}

void check_has_candidate(const char* op, bool has_candidate, c10::Device device,
                         c10::ScalarType dtype) {
  TORCH_CHECK(has_candidate, op, ": no algorithm on ", device, " supports dtype ", dtype,
              algorithms_for(device).empty() ? " (this build has no kernels for that device)" : "");
}

}  // namespace

void check_auto_dtype(const char* op, c10::Device device, c10::ScalarType dtype) {
  const auto all = algorithms_for(device);
  check_has_candidate(op, std::any_of(all.begin(), all.end(),
                                  [&](const Algorithm* algorithm) {
                                    return auto_takes(*algorithm, dtype);
                                  }),
                      device, dtype);
}

AutoDecision decide_auto(const at::Tensor& a, const at::Tensor& b, const char* op,
                         bool with_bucket) {
  const auto candidates = eligible(a, b);
  check_has_candidate(op, !candidates.empty(), a.device(), a.scalar_type());
  AutoDecision heuristic{heuristic_choice(candidates, a, b), "heuristic", ""};
  TuningState& s = state();
  // Held while measuring too: one measurement at a time, so that no two threads time kernels on
  // one GPU at once (each would slow the other's). Other threads' auto calls wait for it, once
  // per new bucket.
  const std::lock_guard<std::mutex> lock(s.mutex);
  const auto tuner = s.tuners.find(a.device().type());
  if (tuner == s.tuners.end()) return heuristic;
  if (!with_bucket && s.entries.empty() && !autotune_flag().load()) return heuristic;
  heuristic.bucket = bucket_key(a, b, tuner->second.device_name(a.device()));
  // An empty product launches no kernel: nothing to measure (a GPU kernel cannot even be launched
  // on it), and its time would be filed under the bucket of real one-row calls.
  if (a.numel() == 0 || b.numel() == 0) return heuristic;

  const auto cached = s.entries.find(heuristic.bucket);
  if (cached != s.entries.end()) {
    if (const Algorithm* algorithm = by_name(candidates, cached->second)) {
      return {algorithm, "cached", heuristic.bucket};
    }
  }
  if (!autotune_flag().load() || candidates.size() == 1 || !can_time(a, b)) return heuristic;
  const std::vector<double> ms = tuner->second.time(candidates, a, b);
  if (ms.size() != candidates.size()) return heuristic;  // measuring not allowed right now
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i) {
    if (ms[i] < ms[best]) best = i;
  }
  s.entries[heuristic.bucket] = s.measured[heuristic.bucket] = candidates[best]->name;
  save_locked(s);
  return {candidates[best], "measured", heuristic.bucket};
}

const Algorithm* batched_candidate(const at::Tensor& a, const at::Tensor& b, int64_t entries) {
  std::vector<const Algorithm*> batched;
  for (const Algorithm* algorithm : eligible(a, b)) {
    if (algorithm->run_batched != nullptr) batched.push_back(algorithm);
  }
  return batched.empty() ? nullptr : heuristic_choice(batched, a, b, entries);
}

void set_autotune(bool enabled) { autotune_flag().store(enabled); }
bool autotune_enabled() { return autotune_flag().load(); }

void set_tuning_file(const std::string& path) {
  const std::lock_guard<std::mutex> lock(state().mutex);
  state().file = path;
}

void add_tuned_entries(const std::map<std::string, std::string>& entries) {
  const std::lock_guard<std::mutex> lock(state().mutex);
  for (const auto& [bucket, name] : entries) state().entries[bucket] = name;
}

std::map<std::string, std::string> tuned_entries() {
  const std::lock_guard<std::mutex> lock(state().mutex);
  return state().entries;
}

void clear_tuned_entries() {
  const std::lock_guard<std::mutex> lock(state().mutex);
  state().entries.clear();
  state().measured.clear();
}

void register_device_tuner(c10::DeviceType type, DeviceTuner tuner) {
  const std::lock_guard<std::mutex> lock(state().mutex);
  state().tuners[type] = tuner;
}

namespace {
const bool cpu_tuner_registered =
    (register_device_tuner(c10::kCPU, {&time_on_cpu, &cpu_name}), true);
}  // namespace

}  // namespace mm_variants
