// oneDNN kernels for XLA's CPU backend, called through typed XLA FFI custom calls.
//
// It holds: the float32 convolution (bias and activation fused) and its backward passes; the
// int8 convolutions (requantized, with a residual); batch norm in training, forward and
// backward; max and average pooling (float32; max pooling of int8 and uint8 too, for the int8
// dataflow); a float32 channels-last convolution and the pooling after it in one call, the
// convolution's output pooled chunk by chunk while in cache (Conv2dPoolImpl).
//
// Each handler builds its oneDNN primitive once per shape and attributes (a process-wide cache)
// and runs it on the buffers XLA hands in. Activations stay in the program's plain layout
// (NCHW or NHWC); weights are reordered into the layout the primitive picked, once per weight
// buffer and content (see ReorderedWeights).
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

// libgomp's, reached through libdnnl (weak: the build needs no OpenMP flags of its own)
extern "C" void omp_set_num_threads(int) __attribute__((weak));
extern "C" int omp_get_max_threads() __attribute__((weak));

namespace ffi = xla::ffi;
using dnnl::algorithm;
using dnnl::memory;

namespace {

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Activations a convolution may fuse, numbered as paddlejax/ops/onednn.py numbers them.
enum Act : int64_t { kNone = 0, kRelu, kLeakyRelu, kRelu6, kSigmoid, kTanh, kGelu, kGeluTanh, kSwish, kHardSwish };

bool AppendActivation(dnnl::post_ops& ops, int64_t act, float alpha) {
  switch (act) {
    case kNone: return true;
    case kRelu: ops.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f); return true;
    case kLeakyRelu: ops.append_eltwise(algorithm::eltwise_relu, alpha, 0.f); return true;
    case kRelu6: ops.append_eltwise(algorithm::eltwise_clip, 0.f, 6.f); return true;
    case kSigmoid: ops.append_eltwise(algorithm::eltwise_logistic, 0.f, 0.f); return true;
    case kTanh: ops.append_eltwise(algorithm::eltwise_tanh, 0.f, 0.f); return true;
    case kGelu: ops.append_eltwise(algorithm::eltwise_gelu_erf, 0.f, 0.f); return true;
    case kGeluTanh: ops.append_eltwise(algorithm::eltwise_gelu_tanh, 0.f, 0.f); return true;
    case kSwish: ops.append_eltwise(algorithm::eltwise_swish, 1.f, 0.f); return true;
    case kHardSwish: ops.append_eltwise(algorithm::eltwise_hardswish, 1.f / 6.f, 0.5f); return true;
    default: return false;
  }
}

memory::dims Dims(ffi::Span<const int64_t> s) { return memory::dims(s.begin(), s.end()); }

std::string Key(std::initializer_list<ffi::Span<const int64_t>> spans, std::initializer_list<int64_t> scalars) {
  std::string key;
  for (auto s : spans) {
    key.append(reinterpret_cast<const char*>(s.begin()), s.size() * sizeof(int64_t));
    key.push_back('|');
  }
  key.append(reinterpret_cast<const char*>(scalars.begin()), scalars.size() * sizeof(int64_t));
  return key;
}

// Weights in a primitive's layout, made from the plain ones at `from`. Weights frozen into the
// executable come with `id`, a hash of their content taken when the program was traced: the
// buffer keeps that content while the executable lives, and another executable's constant at
// the same address has another id. Other weights (arguments) have id 0 and a copy is kept to
// tell when the buffer's content changes: a training step writes new values where the last were.
struct Reordered {
  const void* from;
  int64_t id;
  std::vector<char> copy;
  memory weights;
};

// The weight buffers one primitive keeps reordered. A network has several convolutions of one
// shape (ResNet-18: four 64x64x3x3), which share the primitive; a frozen program passes each
// its own constant every call, and with a single slot each call reordered again (a third of
// the int8 ResNet-18's time).
constexpr size_t kWeightsPerShape = 8;

// A convolution primitive for one shape, with the weights it reordered (the most recently used
// first). Channels-first activations go through the blocked layout the primitive prefers
// (oneDNN's plain-NCHW convolution is a slow im2col + GEMM); channels-last ones are used in place.
struct Conv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src, user_weights, dst, bias;
  std::unique_ptr<dnnl::reorder> reorder, src_in, dst_out;
  memory scratchpad, src_blocked, dst_blocked;
  std::vector<memory> part_scratchpads;  // one per part of a split call running at once
  std::list<Reordered> weights;  // in pd.weights_desc(), when it differs from user_weights
  bool scales = false, per_channel = false, dst_scale = false;
  std::mutex mu;
};

// `conv`'s weights for the plain ones at `w` (content hash `id`, 0 for unknown), reordered only
// when that buffer is new to it or its content changed; past kWeightsPerShape buffers the least
// recently used slot is reused.
memory ReorderedWeights(Conv* conv, dnnl::stream& stream, memory user_w, const void* w, size_t w_bytes, int64_t id) {
  auto& slots = conv->weights;
  auto it = std::find_if(slots.begin(), slots.end(), [w](const Reordered& r) { return r.from == w; });
  if (it == slots.end()) {
    if (slots.size() < kWeightsPerShape) {
      slots.push_back({nullptr, 0, {}, memory(conv->pd.weights_desc(), Engine())});
    }
    it = std::prev(slots.end());
    it->from = w;
    it->id = 0;
    it->copy.clear();
  }
  slots.splice(slots.begin(), slots, it);
  Reordered& r = slots.front();
  bool same = id != 0 ? r.id == id
                      : r.id == 0 && r.copy.size() == w_bytes && std::memcmp(r.copy.data(), w, w_bytes) == 0;
  if (!same) {
    conv->reorder->execute(stream, user_w, r.weights);
    r.id = id;
    if (id != 0) {
      std::vector<char>().swap(r.copy);
    } else {
      r.copy.assign(static_cast<const char*>(w), static_cast<const char*>(w) + w_bytes);
    }
  }
  return r.weights;
}

std::mutex cache_mu;
std::unordered_map<std::string, std::unique_ptr<Conv>> conv_cache;

// What a handler passes to GetConv: the problem, and the int8 options.
struct ConvShape {
  ffi::AnyBuffer::Dimensions xd, wd, yd;
  ffi::Span<const int64_t> stride, pad_lo, pad_hi, dilation;
  int64_t groups;
  bool nhwc, has_bias;
  int64_t act;
  float alpha;
  bool int8 = false, per_channel = false;  // s8 x s8 -> f32 with runtime scales
  bool int8_out = false;                   // ... -> s8 with a runtime dst scale
  bool sum = false;                        // ... + sum_scale * (the s8 residual in dst), before act
  float sum_scale = 0.f;
  bool x_unsigned = false;                 // s8 src known non-negative: read as u8 (no compensation)
  float clip = 0.f;                        // int8_out: the result clipped to [-clip, clip] before the
                                           // dst scale, so that it saturates at -127 as the reference
  int64_t threads = 0;                     // 1: a part of a split call, planned for one thread
};

// The convolution's dimensions in oneDNN's order (activations NCHW-indexed whatever their
// layout, grouped weights goihw), with the layouts of the program's buffers.
struct Geometry {
  memory::dims x, y, w, stride, dil, pad_lo, pad_hi;
  memory::format_tag act_fmt, w_fmt = memory::format_tag::oihw;

  explicit Geometry(const ConvShape& c)
      : x(c.nhwc ? memory::dims{c.xd[0], c.xd[3], c.xd[1], c.xd[2]} : Dims(c.xd)),
        y(c.nhwc ? memory::dims{c.yd[0], c.yd[3], c.yd[1], c.yd[2]} : Dims(c.yd)),
        w(Dims(c.wd)),
        stride(Dims(c.stride)),
        dil{c.dilation[0] - 1, c.dilation[1] - 1},  // oneDNN counts dilation from 0
        pad_lo(Dims(c.pad_lo)),
        pad_hi(Dims(c.pad_hi)),
        act_fmt(c.nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw) {
    if (c.groups > 1) {
      w = {c.groups, c.wd[0] / c.groups, c.wd[1], c.wd[2], c.wd[3]};
      w_fmt = memory::format_tag::goihw;
    }
  }
};

std::unique_ptr<dnnl::reorder> MakeReorder(const memory::desc& from, const memory::desc& to) {
  return std::make_unique<dnnl::reorder>(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

Conv* GetConv(const std::string& key, const ConvShape& c) {
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = conv_cache.find(key);
  if (it != conv_cache.end()) return it->second.get();
  auto conv = std::make_unique<Conv>();
  auto f32 = memory::data_type::f32;
  auto in_type = c.int8 ? memory::data_type::s8 : f32;
  auto src_type = c.x_unsigned ? memory::data_type::u8 : in_type;
  Geometry g(c);
  conv->src = memory::desc(g.x, src_type, g.act_fmt);
  auto out_type = c.int8_out ? memory::data_type::s8 : f32;
  conv->dst = memory::desc(g.y, out_type, g.act_fmt);
  conv->user_weights = memory::desc(g.w, in_type, g.w_fmt);
  conv->bias = memory::desc({g.y[1]}, f32, memory::format_tag::x);
  dnnl::post_ops ops;
  if (c.sum) ops.append_sum(c.sum_scale);
  if (!AppendActivation(ops, c.act, c.alpha)) return nullptr;
  if (c.clip > 0.f) ops.append_eltwise(algorithm::eltwise_clip, -c.clip, c.clip);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  // each primitive its own scratchpad, used under its lock: oneDNN's shared one is not safe
  // for the concurrent calls XLA's thread pool makes
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (c.int8) {  // dst = src_scale * weight_scale[oc] * sum(src * weight) + bias
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, !c.per_channel ? 0 : c.groups > 1 ? 3 : 1);
    conv->scales = true;
    conv->per_channel = c.per_channel;
    if (c.int8_out) attr.set_scales_mask(DNNL_ARG_DST, 0);  // dst = result / dst_scale, rounded, saturated
    conv->dst_scale = c.int8_out;
  }
  auto any = memory::format_tag::any;
  auto src_any = c.nhwc ? conv->src : memory::desc(g.x, src_type, any);
  // the sum post-op reads the residual where XLA put it: in the plain layout
  auto dst_any = c.nhwc || c.sum ? conv->dst : memory::desc(g.y, out_type, any);
  auto weights_any = memory::desc(g.w, in_type, any);
  conv->pd = c.has_bias
      ? dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, src_any, weights_any, conv->bias,
                                                  dst_any, g.stride, g.dil, g.pad_lo, g.pad_hi, attr)
      : dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, src_any, weights_any, dst_any,
                                                  g.stride, g.dil, g.pad_lo, g.pad_hi, attr);
  conv->prim = dnnl::convolution_forward(conv->pd);
  conv->scratchpad = memory(conv->pd.scratchpad_desc(), Engine());
  if (conv->pd.weights_desc() != conv->user_weights) {
    conv->reorder = MakeReorder(conv->user_weights, conv->pd.weights_desc());
  }
  if (conv->pd.src_desc() != conv->src) {
    conv->src_blocked = memory(conv->pd.src_desc(), Engine());
    conv->src_in = MakeReorder(conv->src, conv->pd.src_desc());
  }
  if (conv->pd.dst_desc() != conv->dst) {
    conv->dst_blocked = memory(conv->pd.dst_desc(), Engine());
    conv->dst_out = MakeReorder(conv->pd.dst_desc(), conv->dst);
  }
  return (conv_cache[key] = std::move(conv)).get();
}

std::string ConvKey(const ConvShape& c) {
  int32_t sum_scale_bits, clip_bits;  // primitive attributes: each value its own primitive
  std::memcpy(&sum_scale_bits, &c.sum_scale, sizeof sum_scale_bits);
  std::memcpy(&clip_bits, &c.clip, sizeof clip_bits);
  return Key({c.xd, c.wd, c.yd, c.stride, c.pad_lo, c.pad_hi, c.dilation},
             {c.groups, c.nhwc, c.has_bias, c.act, static_cast<int64_t>(c.alpha * 1e6), c.int8, c.per_channel,
              c.int8_out, c.sum, sum_scale_bits, c.x_unsigned, clip_bits, c.threads});
}

// A convolution call's buffers (the scales only for int8).
struct ConvBuffers {
  const void* x;
  const void* w;
  size_t w_bytes;
  int64_t weights_id;
  const void* bias;
  void* y;
  const void* src_scale = nullptr;
  const void* weight_scale = nullptr;
  const void* dst_scale = nullptr;
};

// The execute arguments of `conv` for `c` on src, weights, dst and a scratchpad.
std::unordered_map<int, memory> ExecuteArgs(Conv* conv, const ConvShape& c, const ConvBuffers& b, memory src,
                                            memory weights, memory dst, memory scratchpad) {
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratchpad}};
  auto f32 = memory::data_type::f32;
  auto scalar = [&](const void* p) { return memory(memory::desc({1}, f32, memory::format_tag::x), Engine(),
                                                   const_cast<void*>(p)); };
  if (c.has_bias) args[DNNL_ARG_BIAS] = memory(conv->bias, Engine(), const_cast<void*>(b.bias));
  if (conv->scales) {
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scalar(b.src_scale);
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] =
        memory(memory::desc({conv->per_channel ? c.wd[0] : 1}, f32, memory::format_tag::x), Engine(),
               const_cast<void*>(b.weight_scale));
  }
  if (conv->dst_scale) args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scalar(b.dst_scale);
  return args;
}

// Sets the calling thread's OpenMP team size for a scope (oneDNN plans and runs a primitive for
// omp_get_max_threads() of the thread that creates it).
class OmpThreads {
 public:
  explicit OmpThreads(int n) : before_(omp_get_max_threads ? omp_get_max_threads() : 0) {
    if (omp_set_num_threads && before_ != n) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_set_num_threads && before_ > 0) omp_set_num_threads(before_);
  }

 private:
  int before_;
};

// Runs work(0), ..., work(n - 1) at once, on the calling thread and on XLA's intra-op pool,
// whose threads run the program's other ops and so are awake. A part that no pool thread has
// claimed by the time the caller is free runs on the caller: a busy pool costs no waiting.
void RunParts(ffi::ThreadPool& pool, int n, const std::function<void(int)>& work) {
  struct State {
    std::atomic<int> next{0}, done{0};
    int n;
    const std::function<void(int)>* work;
  };
  auto state = std::make_shared<State>();
  state->n = n;
  state->work = &work;
  auto claim = [state] {  // a late pool thread finds nothing left and never touches `work`
    for (int i; (i = state->next.fetch_add(1)) < state->n;) {
      (*state->work)(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int i = 1; i < n; ++i) pool.Schedule([claim] { claim(); });
  claim();
  // the other parts are running: spin briefly, then yield the core (a part's owner may be
  // waiting for it on a machine busy with other work)
  for (int spins = 0; state->done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) {
      __builtin_ia32_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

// RunParts for parts that each execute primitives planned for one thread: work(i, stream) runs
// with the OpenMP team at one and a stream of its own. The first oneDNN error a part met (empty
// when none did).
std::string RunOneThreadParts(ffi::ThreadPool& pool, int n, const std::function<void(int, dnnl::stream&)>& work) {
  std::mutex error_mu;
  std::string error;
  RunParts(pool, n, [&](int i) {
    try {
      OmpThreads one(1);
      dnnl::stream stream(Engine());
      work(i, stream);
      stream.wait();
    } catch (const dnnl::error& e) {
      std::lock_guard<std::mutex> lock(error_mu);
      error = e.what();
    }
  });
  return error;
}

// One part of a split convolution: a slice of the batch, or (batch 1) a band of output rows and
// the input rows it reads, with the padding that falls in the band. Its ConvShape points at its
// own dimensions, so a part is not copied.
struct ConvPart {
  std::array<int64_t, 4> xd, yd;
  std::array<int64_t, 2> pad_lo, pad_hi;
  ConvShape c;
  size_t x_offset = 0, y_offset = 0;  // bytes

  explicit ConvPart(const ConvShape& whole) : c(whole) {
    std::copy(whole.xd.begin(), whole.xd.end(), xd.begin());
    std::copy(whole.yd.begin(), whole.yd.end(), yd.begin());
    std::copy(whole.pad_lo.begin(), whole.pad_lo.end(), pad_lo.begin());
    std::copy(whole.pad_hi.begin(), whole.pad_hi.end(), pad_hi.begin());
    c.xd = {xd.data(), 4};
    c.yd = {yd.data(), 4};
    c.pad_lo = {pad_lo.data(), 2};
    c.pad_hi = {pad_hi.data(), 2};
    c.threads = 1;
  }
  ConvPart(const ConvPart&) = delete;
};

// The CPUs this process may run on (its affinity mask), read once.
int AvailableCpus() {
  static const int n = [] {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  }();
  return n;
}

// `c` (channels-last) cut into at most `n` parts, or none where it does not cut.
std::vector<std::unique_ptr<ConvPart>> SplitConv(const ConvShape& c, int64_t n) {
  std::vector<std::unique_ptr<ConvPart>> parts;
  if (!c.nhwc || n < 2) return parts;
  size_t x_row = c.xd[2] * c.xd[3] * (c.int8 ? 1 : 4), y_row = c.yd[2] * c.yd[3] * (c.int8_out ? 1 : 4);
  int64_t batch = c.xd[0], height = c.xd[1], out_height = c.yd[1];
  if (batch >= 2) {
    int64_t chunk = (batch + n - 1) / n;
    for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
      auto& p = *parts.emplace_back(std::make_unique<ConvPart>(c));
      p.xd[0] = p.yd[0] = std::min(chunk, batch - b0);
      p.x_offset = b0 * height * x_row;
      p.y_offset = b0 * out_height * y_row;
    }
    return parts;
  }
  if (out_height < 2) return parts;
  int64_t rows = (out_height + n - 1) / n, stride = c.stride[0];
  int64_t window = (c.wd[2] - 1) * c.dilation[0] + 1;
  for (int64_t o0 = 0; o0 < out_height; o0 += rows) {
    int64_t o1 = std::min(out_height, o0 + rows);
    int64_t first = o0 * stride - c.pad_lo[0], end = (o1 - 1) * stride - c.pad_lo[0] + window;
    int64_t r0 = std::max<int64_t>(0, first), r1 = std::min(height, end);
    if (r1 <= r0) return {};  // a band that reads padding only
    auto& p = *parts.emplace_back(std::make_unique<ConvPart>(c));
    p.xd[1] = r1 - r0;
    p.yd[1] = o1 - o0;
    p.pad_lo[0] = r0 - first;
    p.pad_hi[0] = end - r1;
    p.x_offset = r0 * x_row;
    p.y_offset = o0 * y_row;
  }
  return parts;
}

// Whether convolutions are cut across XLA's threads (PADDLEJAX_ONEDNN_SPLIT=0: no).
bool SplitEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("PADDLEJAX_ONEDNN_SPLIT");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// One-thread convolution primitives for several shapes of one call, held under their locks (taken
// in address order: no two calls deadlock), with the weights each uses; RunSplit and the fused
// convolution + pooling share this.
struct LockedConvs {
  std::vector<Conv*> convs;  // one per shape
  std::unordered_map<Conv*, memory> weights;
  std::vector<std::unique_lock<std::mutex>> locks;
};

// Primitives for `shapes` (planned for one thread: the caller sets the OpenMP team to one), each
// with `parts` part scratchpads, locked, and their weights for b.w reordered.
ffi::Error LockConvs(const char* op, const std::vector<const ConvShape*>& shapes, const ConvBuffers& b, int parts,
                     LockedConvs& out) {
  try {
    for (const ConvShape* c : shapes) out.convs.push_back(GetConv(ConvKey(*c), *c));
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string(op) + ": " + e.what());
  }
  if (std::count(out.convs.begin(), out.convs.end(), nullptr)) {
    return ffi::Error::InvalidArgument(std::string(op) + ": unknown activation");
  }
  std::vector<Conv*> distinct(out.convs);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (Conv* conv : distinct) out.locks.emplace_back(conv->mu);
  try {
    dnnl::stream stream(Engine());
    // weights once per primitive: the batch slices share one, and checking an argument's
    // weights compares their bytes
    for (Conv* conv : distinct) {
      memory user_w(conv->user_weights, Engine(), const_cast<void*>(b.w));
      out.weights[conv] = conv->reorder ? ReorderedWeights(conv, stream, user_w, b.w, b.w_bytes, b.weights_id)
                                        : user_w;
      while (conv->part_scratchpads.size() < static_cast<size_t>(parts)) {
        conv->part_scratchpads.emplace_back(conv->pd.scratchpad_desc(), Engine());
      }
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  return ffi::Error::Success();
}

// Run `parts` of one convolution at once, each planned for one thread.
ffi::Error RunSplit(const char* op, const std::vector<std::unique_ptr<ConvPart>>& parts, const ConvBuffers& b,
                    ffi::ThreadPool& pool) {
  OmpThreads one(1);
  int n = static_cast<int>(parts.size());
  std::vector<const ConvShape*> shapes;
  for (auto& p : parts) shapes.push_back(&p->c);
  LockedConvs locked;
  if (ffi::Error error = LockConvs(op, shapes, b, n, locked); error.failure()) return error;
  std::vector<std::unordered_map<int, memory>> args(n);
  try {
    for (int i = 0; i < n; ++i) {
      Conv* conv = locked.convs[i];
      const ConvPart& p = *parts[i];
      memory src(conv->src, Engine(), const_cast<char*>(static_cast<const char*>(b.x)) + p.x_offset);
      memory dst(conv->dst, Engine(), static_cast<char*>(b.y) + p.y_offset);
      args[i] = ExecuteArgs(conv, p.c, b, src, locked.weights[conv], dst, conv->part_scratchpads[i]);
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  std::string error = RunOneThreadParts(
      pool, n, [&](int i, dnnl::stream& stream) { locked.convs[i]->prim.execute(stream, args[i]); });
  if (!error.empty()) return ffi::Error::Internal(std::string(op) + ": " + error);
  return ffi::Error::Success();
}

// Run `c` on XLA's buffers: cut across XLA's threads where the pool has more than one and the
// convolution cuts, else whole on the calling thread with oneDNN's OpenMP team.
ffi::Error RunConv(const char* op, const ConvShape& c, const ConvBuffers& b, ffi::ThreadPool& pool) {
  int64_t threads = SplitEnabled() ? std::min<int64_t>(pool.num_threads(), AvailableCpus()) : 1;
  auto parts = SplitConv(c, threads);
  if (parts.size() > 1) return RunSplit(op, parts, b, pool);
  Conv* conv;
  try {
    conv = GetConv(ConvKey(c), c);
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string(op) + ": " + e.what());
  }
  if (conv == nullptr) return ffi::Error::InvalidArgument(std::string(op) + ": unknown activation");
  try {
    dnnl::stream stream(Engine());
    std::lock_guard<std::mutex> lock(conv->mu);
    memory src(conv->src, Engine(), const_cast<void*>(b.x)), dst(conv->dst, Engine(), b.y);
    memory user_w(conv->user_weights, Engine(), const_cast<void*>(b.w));
    memory weights = conv->reorder ? ReorderedWeights(conv, stream, user_w, b.w, b.w_bytes, b.weights_id) : user_w;
    if (conv->src_in) {
      conv->src_in->execute(stream, src, conv->src_blocked);
      src = conv->src_blocked;
    }
    memory out = conv->dst_out ? conv->dst_blocked : dst;
    conv->prim.execute(stream, ExecuteArgs(conv, c, b, src, weights, out, conv->scratchpad));
    if (conv->dst_out) conv->dst_out->execute(stream, out, dst);
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Conv2dImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                      ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                      ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                      ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias, int64_t act,
                      float alpha, int64_t weights_id) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha};
  return RunConv("oneDNN conv2d", c,
                 {x.untyped_data(), w.untyped_data(), w.size_bytes(), weights_id, b.untyped_data(), y->untyped_data()},
                 pool);
}

// int8: y = act(x_scale * w_scale[oc] * conv(x_q, w_q) + bias), the scales already divided by 127
ffi::Error QuantizedConv2dImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                               ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                               ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                               ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                               ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias,
                               int64_t act, float alpha, int64_t weights_id, bool x_unsigned) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha, true, w_scale.element_count() > 1};
  c.x_unsigned = x_unsigned;
  return RunConv("oneDNN quantized_conv2d", c,
                 {x.untyped_data(), w.untyped_data(), w.size_bytes(), weights_id, b.untyped_data(), y->untyped_data(),
                  x_scale.untyped_data(), w_scale.untyped_data()},
                 pool);
}

// int8 dataflow: the same, requantized to int8 by out_scale (already divided by 127) and clipped
// to [-127, 127] as the reference clips (oneDNN alone would saturate at -128); `c` says the rest
ffi::Error RunRequantized(ffi::ThreadPool& pool, ConvShape c, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                          ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                          ffi::Buffer<ffi::F32> out_scale, ffi::ResultBuffer<ffi::S8>& y, int64_t weights_id) {
  c.int8 = c.int8_out = true;
  c.per_channel = w_scale.element_count() > 1;
  c.clip = 127.f * *out_scale.typed_data();
  return RunConv("oneDNN quantized_conv2d", c,
                 {x.untyped_data(), w.untyped_data(), w.size_bytes(), weights_id, b.untyped_data(), y->untyped_data(),
                  x_scale.untyped_data(), w_scale.untyped_data(), out_scale.untyped_data()},
                 pool);
}

ffi::Error RequantizedConv2dImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                                 ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                                 ffi::Buffer<ffi::F32> out_scale, ffi::ResultBuffer<ffi::S8> y,
                                 ffi::Span<const int64_t> stride, ffi::Span<const int64_t> pad_lo,
                                 ffi::Span<const int64_t> pad_hi, ffi::Span<const int64_t> dilation, int64_t groups,
                                 bool nhwc, bool has_bias, int64_t act, float alpha, int64_t weights_id,
                                 bool x_unsigned) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha};
  c.x_unsigned = x_unsigned;
  return RunRequantized(pool, c, x, w, x_scale, w_scale, b, out_scale, y, weights_id);
}

// int8 residual connection: the same, plus residual_scale * residual before the activation (the
// residual is copied into y unless XLA aliased them; oneDNN's sum post-op adds it in place)
ffi::Error ResidualConv2dImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                              ffi::Buffer<ffi::F32> x_scale, ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                              ffi::Buffer<ffi::F32> out_scale, ffi::Buffer<ffi::S8> residual,
                              ffi::Buffer<ffi::F32> residual_scale,
                              ffi::ResultBuffer<ffi::S8> y, ffi::Span<const int64_t> stride,
                              ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                              ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias,
                              int64_t act, float alpha, int64_t weights_id, bool x_unsigned) {
  if (residual.size_bytes() != y->size_bytes()) {
    return ffi::Error::InvalidArgument("oneDNN quantized_conv2d: the residual's shape is not the output's");
  }
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha};
  c.x_unsigned = x_unsigned;
  c.sum = true;
  c.sum_scale = *residual_scale.typed_data();
  if (y->untyped_data() != residual.untyped_data()) {
    std::memcpy(y->untyped_data(), residual.untyped_data(), residual.size_bytes());
  }
  return RunRequantized(pool, c, x, w, x_scale, w_scale, b, out_scale, y, weights_id);
}

// The convolution's backward passes, for training: the input's gradient (backward data: from
// the output's gradient and the weights) and the weights' (backward weights: from the input and
// the output's gradient). Weights change every step, so they are reordered on every call.
enum Direction : int64_t { kBackwardData = 0, kBackwardWeights = 1 };

// One buffer of a primitive's: the program's plain layout, and the layout the primitive uses
// (with a reorder and a staging buffer where they differ).
struct Operand {
  int arg;
  memory::desc user;
  std::unique_ptr<dnnl::reorder> reorder;
  memory staged;

  Operand(int arg, const memory::desc& user, const memory::desc& used, bool into)
      : arg(arg), user(user) {
    if (used != user) {
      staged = memory(used, Engine());
      reorder = into ? MakeReorder(user, used) : MakeReorder(used, user);
    }
  }
};

struct ConvBackward {
  dnnl::primitive prim;
  std::vector<Operand> inputs;  // two
  std::unique_ptr<Operand> output;
  memory scratchpad;
  std::mutex mu;
};

std::unordered_map<std::string, std::unique_ptr<ConvBackward>> backward_cache;

ConvBackward* GetBackward(const std::string& key, const ConvShape& c, Direction direction) {
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = backward_cache.find(key);
  if (it != backward_cache.end()) return it->second.get();
  auto f32 = memory::data_type::f32;
  auto any = memory::format_tag::any;
  Geometry g(c);
  memory::desc x(g.x, f32, g.act_fmt), y(g.y, f32, g.act_fmt), w(g.w, f32, g.w_fmt);
  // channels-last buffers are used in place; channels-first ones through the blocked layout
  auto x_any = c.nhwc ? x : memory::desc(g.x, f32, any);
  auto y_any = c.nhwc ? y : memory::desc(g.y, f32, any);
  auto w_any = memory::desc(g.w, f32, any);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::convolution_forward::primitive_desc hint(Engine(), dnnl::prop_kind::forward_training,
                                                 algorithm::convolution_direct, x_any, w_any, y_any, g.stride, g.dil,
                                                 g.pad_lo, g.pad_hi);
  auto bwd = std::make_unique<ConvBackward>();
  if (direction == kBackwardData) {
    dnnl::convolution_backward_data::primitive_desc pd(Engine(), algorithm::convolution_direct, x_any, w_any, y_any,
                                                       g.stride, g.dil, g.pad_lo, g.pad_hi, hint, attr);
    bwd->prim = dnnl::convolution_backward_data(pd);
    bwd->inputs.emplace_back(DNNL_ARG_DIFF_DST, y, pd.diff_dst_desc(), true);
    bwd->inputs.emplace_back(DNNL_ARG_WEIGHTS, w, pd.weights_desc(), true);
    bwd->output = std::make_unique<Operand>(DNNL_ARG_DIFF_SRC, x, pd.diff_src_desc(), false);
    bwd->scratchpad = memory(pd.scratchpad_desc(), Engine());
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(Engine(), algorithm::convolution_direct, x_any, w_any,
                                                          y_any, g.stride, g.dil, g.pad_lo, g.pad_hi, hint, attr);
    bwd->prim = dnnl::convolution_backward_weights(pd);
    bwd->inputs.emplace_back(DNNL_ARG_SRC, x, pd.src_desc(), true);
    bwd->inputs.emplace_back(DNNL_ARG_DIFF_DST, y, pd.diff_dst_desc(), true);
    bwd->output = std::make_unique<Operand>(DNNL_ARG_DIFF_WEIGHTS, w, pd.diff_weights_desc(), false);
    bwd->scratchpad = memory(pd.scratchpad_desc(), Engine());
  }
  return (backward_cache[key] = std::move(bwd)).get();
}

ffi::Error RunBackward(const char* op, const ConvShape& c, Direction direction, const void* a, const void* b,
                       void* out) {
  ConvBackward* bwd;
  try {
    bwd = GetBackward(Key({c.xd, c.wd, c.yd, c.stride, c.pad_lo, c.pad_hi, c.dilation},
                          {c.groups, c.nhwc, direction}),
                      c, direction);
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string(op) + ": " + e.what());
  }
  try {
    dnnl::stream stream(Engine());
    std::lock_guard<std::mutex> lock(bwd->mu);
    std::unordered_map<int, memory> args = {{DNNL_ARG_SCRATCHPAD, bwd->scratchpad}};
    const void* data[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
      Operand& in = bwd->inputs[i];
      memory user(in.user, Engine(), const_cast<void*>(data[i]));
      if (in.reorder) in.reorder->execute(stream, user, in.staged);
      args[in.arg] = in.reorder ? in.staged : user;
    }
    Operand& o = *bwd->output;
    memory user(o.user, Engine(), out);
    args[o.arg] = o.reorder ? o.staged : user;
    bwd->prim.execute(stream, args);
    if (o.reorder) o.reorder->execute(stream, o.staged, user);
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  return ffi::Error::Success();
}

// dx from dy and the weights
ffi::Error Conv2dBackwardDataImpl(ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> dx,
                                  ffi::Span<const int64_t> stride, ffi::Span<const int64_t> pad_lo,
                                  ffi::Span<const int64_t> pad_hi, ffi::Span<const int64_t> dilation,
                                  int64_t groups, bool nhwc) {
  ConvShape c{dx->dimensions(), w.dimensions(), dy.dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              false, kNone, 0.f};
  return RunBackward("oneDNN conv2d backward data", c, kBackwardData, dy.untyped_data(), w.untyped_data(),
                     dx->untyped_data());
}

// dw from x and dy
ffi::Error Conv2dBackwardWeightsImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                                     ffi::ResultBuffer<ffi::F32> dw, ffi::Span<const int64_t> stride,
                                     ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                                     ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc) {
  ConvShape c{x.dimensions(), dw->dimensions(), dy.dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              false, kNone, 0.f};
  return RunBackward("oneDNN conv2d backward weights", c, kBackwardWeights, x.untyped_data(), dy.untyped_data(),
                     dw->untyped_data());
}

// Batch norm in training, for 4-D activations in NCHW or NHWC order (other ranks are viewed
// as 4-D by the caller): the forward pass normalises with the batch's statistics and returns
// them; the backward pass takes the output's gradient to the input's, the scale's and the
// shift's. Built together (the backward primitive needs the forward's as its hint).
struct BatchNorm {
  dnnl::batch_normalization_forward forward;
  dnnl::batch_normalization_backward backward;
  memory::desc data, stat;
  memory forward_scratchpad, backward_scratchpad;
  std::mutex mu;
};

std::unordered_map<std::string, std::unique_ptr<BatchNorm>> batch_norm_cache;

BatchNorm* GetBatchNorm(ffi::Span<const int64_t> dims, bool nhwc, float epsilon) {
  int32_t epsilon_bits;
  std::memcpy(&epsilon_bits, &epsilon, sizeof epsilon_bits);
  std::string key = Key({dims}, {nhwc, epsilon_bits});
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = batch_norm_cache.find(key);
  if (it != batch_norm_cache.end()) return it->second.get();
  auto bn = std::make_unique<BatchNorm>();
  auto f32 = memory::data_type::f32;
  // oneDNN's dimensions are NCHW-indexed whatever the layout
  memory::dims nchw = nhwc ? memory::dims{dims[0], dims[3], dims[1], dims[2]} : Dims(dims);
  bn->data = memory::desc(nchw, f32, nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw);
  bn->stat = memory::desc({nchw[1]}, f32, memory::format_tag::x);
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::batch_normalization_forward::primitive_desc forward(Engine(), dnnl::prop_kind::forward_training, bn->data,
                                                            bn->data, epsilon, flags, attr);
  dnnl::batch_normalization_backward::primitive_desc backward(Engine(), dnnl::prop_kind::backward, bn->data,
                                                              bn->data, bn->data, epsilon, flags, forward, attr);
  bn->forward = dnnl::batch_normalization_forward(forward);
  bn->backward = dnnl::batch_normalization_backward(backward);
  bn->forward_scratchpad = memory(forward.scratchpad_desc(), Engine());
  bn->backward_scratchpad = memory(backward.scratchpad_desc(), Engine());
  return (batch_norm_cache[key] = std::move(bn)).get();
}

// Run `prim` of the batch norm for `dims` on XLA's buffers, each named by its oneDNN argument.
ffi::Error RunBatchNorm(const char* op, ffi::Span<const int64_t> dims, bool nhwc, float epsilon, bool backward,
                        std::initializer_list<std::pair<int, const void*>> data,
                        std::initializer_list<std::pair<int, const void*>> stats) {
  if (dims.size() != 4) return ffi::Error::InvalidArgument(std::string(op) + ": expects a 4-D input");
  BatchNorm* bn;
  try {
    bn = GetBatchNorm(dims, nhwc, epsilon);
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string(op) + ": " + e.what());
  }
  try {
    dnnl::stream stream(Engine());
    std::lock_guard<std::mutex> lock(bn->mu);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SCRATCHPAD, backward ? bn->backward_scratchpad : bn->forward_scratchpad}};
    for (auto [arg, ptr] : data) args[arg] = memory(bn->data, Engine(), const_cast<void*>(ptr));
    for (auto [arg, ptr] : stats) args[arg] = memory(bn->stat, Engine(), const_cast<void*>(ptr));
    if (backward) {
      bn->backward.execute(stream, args);
    } else {
      bn->forward.execute(stream, args);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  return ffi::Error::Success();
}

// y = (x - mean) / sqrt(var + epsilon) * scale + shift, with the batch's mean and biased variance
ffi::Error BatchNormTrainingImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> shift,
                                 ffi::ResultBuffer<ffi::F32> y, ffi::ResultBuffer<ffi::F32> mean,
                                 ffi::ResultBuffer<ffi::F32> var, float epsilon, bool nhwc) {
  return RunBatchNorm("oneDNN batch_norm", x.dimensions(), nhwc, epsilon, false,
                      {{DNNL_ARG_SRC, x.untyped_data()}, {DNNL_ARG_DST, y->untyped_data()}},
                      {{DNNL_ARG_SCALE, scale.untyped_data()}, {DNNL_ARG_SHIFT, shift.untyped_data()},
                       {DNNL_ARG_MEAN, mean->untyped_data()}, {DNNL_ARG_VARIANCE, var->untyped_data()}});
}

// dx, dscale, dshift from x, dy and the forward pass's scale and statistics
ffi::Error BatchNormBackwardImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> scale,
                                 ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> var,
                                 ffi::ResultBuffer<ffi::F32> dx, ffi::ResultBuffer<ffi::F32> dscale,
                                 ffi::ResultBuffer<ffi::F32> dshift, float epsilon, bool nhwc) {
  return RunBatchNorm("oneDNN batch_norm backward", x.dimensions(), nhwc, epsilon, true,
                      {{DNNL_ARG_SRC, x.untyped_data()}, {DNNL_ARG_DIFF_DST, dy.untyped_data()},
                       {DNNL_ARG_DIFF_SRC, dx->untyped_data()}},
                      {{DNNL_ARG_SCALE, scale.untyped_data()}, {DNNL_ARG_MEAN, mean.untyped_data()},
                       {DNNL_ARG_VARIANCE, var.untyped_data()}, {DNNL_ARG_DIFF_SCALE, dscale->untyped_data()},
                       {DNNL_ARG_DIFF_SHIFT, dshift->untyped_data()}});
}

// Max or average pooling over 2-D windows, for activations in NCHW or NHWC order. Inference
// only: training differentiates the reference kernel (see onednn.py), which needs no indices of
// the maxima from here.
struct PoolShape {
  memory::dims x, y;  // NCHW-indexed whatever the layout
  memory::dims kernel, stride, pad_lo, pad_hi;
  algorithm alg;
  memory::data_type type;
  bool nhwc;
  int64_t threads = 0;  // 1: a part of a split call, planned for one thread
};

// A pooling primitive for one shape. A scratchpad, where the primitive has one (oneDNN's
// channels-first kernels transpose through one; the channels-last ones need none), is made per
// call: calls on one primitive from several threads then share nothing and take no lock.
struct Pool {
  dnnl::pooling_forward prim;
  memory::desc src, dst, scratchpad;
};

std::unordered_map<std::string, std::unique_ptr<Pool>> pool_cache;

const Pool& GetPool(const PoolShape& p) {
  std::string key = Key({p.x, p.y, p.kernel, p.stride, p.pad_lo, p.pad_hi},
                        {static_cast<int64_t>(p.alg), static_cast<int64_t>(p.type), p.nhwc, p.threads});
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = pool_cache.find(key);
  if (it != pool_cache.end()) return *it->second;
  auto pool = std::make_unique<Pool>();
  auto fmt = p.nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw;
  pool->src = memory::desc(p.x, p.type, fmt);
  pool->dst = memory::desc(p.y, p.type, fmt);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::pooling_forward::primitive_desc pd(Engine(), dnnl::prop_kind::forward_inference, p.alg, pool->src,
                                           pool->dst, p.stride, p.kernel, memory::dims{0, 0}, p.pad_lo, p.pad_hi,
                                           attr);
  pool->prim = dnnl::pooling_forward(pd);
  pool->scratchpad = pd.scratchpad_desc();
  return *(pool_cache[key] = std::move(pool));
}

void ExecutePool(const Pool& pool, dnnl::stream& stream, const void* x, void* y) {
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, memory(pool.src, Engine(), const_cast<void*>(x))},
                                          {DNNL_ARG_DST, memory(pool.dst, Engine(), y)}};
  if (pool.scratchpad.get_size() > 0) args[DNNL_ARG_SCRATCHPAD] = memory(pool.scratchpad, Engine());
  pool.prim.execute(stream, args);
}

// oneDNN's type for an element type the pooling takes: f32, and s8 and u8 (max pooling of the
// int8 dataflow's tensors)
std::optional<memory::data_type> PoolType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return memory::data_type::f32;
    case ffi::DataType::S8: return memory::data_type::s8;
    case ffi::DataType::U8: return memory::data_type::u8;
    default: return std::nullopt;
  }
}

algorithm PoolAlgorithm(bool max, bool exclusive) {
  return max ? algorithm::pooling_max
             : exclusive ? algorithm::pooling_avg_exclude_padding : algorithm::pooling_avg_include_padding;
}

// y = the max, or the mean, of x over each window (`exclusive`: the mean of the real elements
// it covers, else the sum over kh * kw). Where the pool has more than one thread and the batch
// more than one image, the batch is cut into slices that run at once, each a one-thread
// primitive (as convolutions are cut); else the whole on the calling thread's OpenMP team.
ffi::Error Pool2dImpl(ffi::ThreadPool threads, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, bool max,
                      bool exclusive, ffi::Span<const int64_t> kernel, ffi::Span<const int64_t> stride,
                      ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi, bool nhwc) {
  const std::string op = "oneDNN pool2d";
  auto type = PoolType(x.element_type());
  if (!type || y->element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument(op + ": expects f32, s8 or u8 input and output of one type");
  }
  if (x.dimensions().size() != 4 || y->dimensions().size() != 4 || kernel.size() != 2 || stride.size() != 2 ||
      pad_lo.size() != 2 || pad_hi.size() != 2) {
    return ffi::Error::InvalidArgument(op + ": expects 4-D input and output and a 2-D window");
  }
  auto nchw = [nhwc](ffi::Span<const int64_t> d) { return nhwc ? memory::dims{d[0], d[3], d[1], d[2]} : Dims(d); };
  PoolShape whole{nchw(x.dimensions()), nchw(y->dimensions()), Dims(kernel), Dims(stride), Dims(pad_lo),
                  Dims(pad_hi), PoolAlgorithm(max, exclusive), *type, nhwc};
  int64_t batch = whole.x[0];
  int64_t n = SplitEnabled() ? std::min<int64_t>({threads.num_threads(), AvailableCpus(), batch}) : 1;
  auto* from = static_cast<const char*>(x.untyped_data());
  auto* to = static_cast<char*>(y->untyped_data());
  if (n < 2) {
    const Pool* pool;
    try {
      pool = &GetPool(whole);
    } catch (const dnnl::error& e) {
      return ffi::Error::InvalidArgument(op + ": " + e.what());
    }
    try {
      dnnl::stream stream(Engine());
      ExecutePool(*pool, stream, from, to);
      stream.wait();
    } catch (const dnnl::error& e) {
      return ffi::Error::Internal(op + ": " + e.what());
    }
    return ffi::Error::Success();
  }
  int64_t chunk = (batch + n - 1) / n;
  size_t x_image = x.size_bytes() / batch, y_image = y->size_bytes() / batch;
  std::vector<const Pool*> parts;  // at most two primitives: the slices, and a shorter last one
  try {
    OmpThreads one(1);  // planned for the one thread each part runs on
    for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
      PoolShape part = whole;
      part.x[0] = part.y[0] = std::min(chunk, batch - b0);
      part.threads = 1;
      parts.push_back(&GetPool(part));
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(op + ": " + e.what());
  }
  std::string error = RunOneThreadParts(threads, static_cast<int>(parts.size()), [&](int i, dnnl::stream& stream) {
    ExecutePool(*parts[i], stream, from + i * chunk * x_image, to + i * chunk * y_image);
  });
  if (!error.empty()) return ffi::Error::Internal(op + ": " + error);
  return ffi::Error::Success();
}

// The fused convolution + pooling writes each chunk's convolution output here and pools it from
// here: a chunk of this size stays in the core's cache, where the whole output would go to memory
// and come back (on a VM with ~25 GB/s per core, as long as the pooling itself). Smaller chunks
// pay per-execute costs instead: SmallCNN's first layer (batch 32, one thread) took 0.47 ms at
// 1 MiB, 0.55 at 512 KiB, 0.57 at 256 KiB and 0.62 whole (0.70 unfused).
constexpr size_t kChunkBytes = 1 << 20;

// y = pool(act(conv(x, w) + b)), channels last: the batch is cut across XLA's threads as RunSplit
// cuts it, and each part convolves a chunk of images at a time (as many as keep the chunk's
// output within kChunkBytes) into a scratch buffer of its own, then pools that chunk into y; the
// convolution's whole output never exists. Every chunk size (a part's chunks, its remainder, the
// last part's) has its own one-thread primitives, the batch being part of their shape. Uncut (one
// thread, or PADDLEJAX_ONEDNN_SPLIT=0), the calling thread's OpenMP team runs every chunk.
ffi::Error Conv2dPoolImpl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                          ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                          ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                          ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias, int64_t act,
                          float alpha, int64_t weights_id, bool max, bool exclusive,
                          ffi::Span<const int64_t> pool_kernel, ffi::Span<const int64_t> pool_stride,
                          ffi::Span<const int64_t> pool_pad_lo, ffi::Span<const int64_t> pool_pad_hi) {
  const char* op = "oneDNN conv2d_pool";
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (!nhwc || xd.size() != 4 || wd.size() != 4 || yd.size() != 4 || stride.size() != 2 || pad_lo.size() != 2 ||
      pad_hi.size() != 2 || dilation.size() != 2 || pool_kernel.size() != 2 || pool_stride.size() != 2 ||
      pool_pad_lo.size() != 2 || pool_pad_hi.size() != 2 || x.element_count() == 0 || y->element_count() == 0) {
    return ffi::Error::InvalidArgument(std::string(op) + ": expects non-empty 4-D channels-last activations, a "
                                       "4-D weight and 2-D windows");
  }
  std::array<int64_t, 4> conv_yd{xd[0], 0, 0, wd[0]};
  for (int i = 0; i < 2; ++i) {
    conv_yd[i + 1] = (xd[i + 1] + pad_lo[i] + pad_hi[i] - dilation[i] * (wd[i + 2] - 1) - 1) / stride[i] + 1;
  }
  if (yd[0] != xd[0] || yd[3] != wd[0]) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the output's batch or channels are not the input's");
  }
  ConvShape whole{xd, wd, {conv_yd.data(), 4}, stride, pad_lo, pad_hi, dilation, groups, true, has_bias, act, alpha};
  int64_t batch = xd[0];
  size_t x_image = x.size_bytes() / batch, y_image = y->size_bytes() / batch;
  size_t conv_image = conv_yd[1] * conv_yd[2] * conv_yd[3] * sizeof(float);
  int64_t chunk = std::max<int64_t>(1, kChunkBytes / conv_image);
  int64_t n = SplitEnabled() ? std::min<int64_t>({threads.num_threads(), AvailableCpus(), batch}) : 1;
  int64_t part = (batch + n - 1) / n;
  n = (batch + part - 1) / part;
  chunk = std::min(chunk, part);
  std::vector<int64_t> sizes;  // the chunk sizes the parts run
  for (int64_t b0 = 0; b0 < batch; b0 += part) {
    int64_t len = std::min(part, batch - b0);
    sizes.push_back(std::min(chunk, len));
    if (len % chunk != 0) sizes.push_back(len % chunk);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // a cut call's primitives are planned for the one thread each part runs on (RunOneThreadParts
  // runs them so); an uncut one's for the calling thread's OpenMP team, which it runs on
  bool cut = n > 1;
  std::optional<OmpThreads> one;
  if (cut) one.emplace(1);
  std::vector<std::unique_ptr<ConvPart>> convs;
  std::vector<const ConvShape*> shapes;
  std::vector<const Pool*> pools;
  try {
    for (int64_t k : sizes) {
      auto& p = *convs.emplace_back(std::make_unique<ConvPart>(whole));
      p.xd[0] = p.yd[0] = k;
      p.c.threads = cut ? 1 : 0;
      shapes.push_back(&p.c);
      pools.push_back(&GetPool({{k, conv_yd[3], conv_yd[1], conv_yd[2]}, {k, yd[3], yd[1], yd[2]},
                                Dims(pool_kernel), Dims(pool_stride), Dims(pool_pad_lo), Dims(pool_pad_hi),
                                PoolAlgorithm(max, exclusive), memory::data_type::f32, true, cut ? 1 : 0}));
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string(op) + ": " + e.what());
  }
  ConvBuffers buffers{x.untyped_data(), w.untyped_data(), w.size_bytes(), weights_id, b.untyped_data(), nullptr};
  LockedConvs locked;
  if (ffi::Error error = LockConvs(op, shapes, buffers, static_cast<int>(n), locked); error.failure()) return error;
  // uninitialised: every chunk is written before it is read
  std::unique_ptr<char[]> scratch(new char[n * chunk * conv_image]);
  auto* from = static_cast<const char*>(x.untyped_data());
  auto* to = static_cast<char*>(y->untyped_data());
  auto run = [&](int i, dnnl::stream& stream) {
    char* mine = scratch.get() + i * chunk * conv_image;
    int64_t b0 = i * part, end = std::min(batch, b0 + part);
    for (int64_t c0 = b0; c0 < end; c0 += chunk) {
      size_t s = std::lower_bound(sizes.begin(), sizes.end(), std::min(chunk, end - c0)) - sizes.begin();
      Conv* conv = locked.convs[s];
      memory src(conv->src, Engine(), const_cast<char*>(from + c0 * x_image)), dst(conv->dst, Engine(), mine);
      conv->prim.execute(stream, ExecuteArgs(conv, *shapes[s], buffers, src, locked.weights.at(conv), dst,
                                             conv->part_scratchpads[i]));
      ExecutePool(*pools[s], stream, mine, to + c0 * y_image);
    }
  };
  std::string error;
  if (cut) {
    error = RunOneThreadParts(threads, static_cast<int>(n), run);
  } else {
    try {
      dnnl::stream stream(Engine());
      run(0, stream);
      stream.wait();
    } catch (const dnnl::error& e) {
      error = e.what();
    }
  }
  if (!error.empty()) return ffi::Error::Internal(std::string(op) + ": " + error);
  return ffi::Error::Success();
}

}  // namespace

#define CONV_GEOMETRY                                  \
  Attr<ffi::Span<const int64_t>>("stride")             \
      .Attr<ffi::Span<const int64_t>>("pad_lo")        \
      .Attr<ffi::Span<const int64_t>>("pad_hi")        \
      .Attr<ffi::Span<const int64_t>>("dilation")      \
      .Attr<int64_t>("groups")                         \
      .Attr<bool>("nhwc")

#define CONV_ATTRS                                     \
  CONV_GEOMETRY                                        \
      .Attr<bool>("has_bias")                          \
      .Attr<int64_t>("act")                            \
      .Attr<float>("alpha")                            \
      .Attr<int64_t>("weights_id")

// x_q, w_q, x_scale, w_scale, bias: the operands every int8 convolution takes first
#define INT8_CONV_OPERANDS                             \
  Arg<ffi::Buffer<ffi::S8>>()                          \
      .Arg<ffi::Buffer<ffi::S8>>()                     \
      .Arg<ffi::Buffer<ffi::F32>>()                    \
      .Arg<ffi::Buffer<ffi::F32>>()                    \
      .Arg<ffi::Buffer<ffi::F32>>()

#define INT8_CONV_ATTRS                                \
  CONV_ATTRS                                           \
      .Attr<bool>("x_unsigned")

// float32 x, weight and bias in, y out (the convolution and the convolution + pooling)
#define FLOAT_CONV                                     \
  Ctx<ffi::ThreadPool>()                               \
      .Arg<ffi::Buffer<ffi::F32>>()                    \
      .Arg<ffi::Buffer<ffi::F32>>()                    \
      .Arg<ffi::Buffer<ffi::F32>>()                    \
      .Ret<ffi::Buffer<ffi::F32>>()                    \
      .CONV_ATTRS

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2d, Conv2dImpl,
                              ffi::Ffi::Bind().FLOAT_CONV);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnQuantizedConv2d, QuantizedConv2dImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .INT8_CONV_OPERANDS
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .INT8_CONV_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnRequantizedConv2d, RequantizedConv2dImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .INT8_CONV_OPERANDS
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .INT8_CONV_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnResidualConv2d, ResidualConv2dImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .INT8_CONV_OPERANDS
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .INT8_CONV_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2dBackwardData, Conv2dBackwardDataImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .CONV_GEOMETRY);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2dBackwardWeights, Conv2dBackwardWeightsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .CONV_GEOMETRY);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnBatchNormTraining, BatchNormTrainingImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon")
                                  .Attr<bool>("nhwc"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnBatchNormBackward, BatchNormBackwardImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon")
                                  .Attr<bool>("nhwc"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnPool2d, Pool2dImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("max")
                                  .Attr<bool>("exclusive")
                                  .Attr<ffi::Span<const int64_t>>("kernel")
                                  .Attr<ffi::Span<const int64_t>>("stride")
                                  .Attr<ffi::Span<const int64_t>>("pad_lo")
                                  .Attr<ffi::Span<const int64_t>>("pad_hi")
                                  .Attr<bool>("nhwc"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2dPool, Conv2dPoolImpl,
                              ffi::Ffi::Bind().FLOAT_CONV
                                  .Attr<bool>("max")
                                  .Attr<bool>("exclusive")
                                  .Attr<ffi::Span<const int64_t>>("pool_kernel")
                                  .Attr<ffi::Span<const int64_t>>("pool_stride")
                                  .Attr<ffi::Span<const int64_t>>("pool_pad_lo")
                                  .Attr<ffi::Span<const int64_t>>("pool_pad_hi"));

#ifndef PADDLEJAX_ONEDNN_SOURCE_SHA256
#define PADDLEJAX_ONEDNN_SOURCE_SHA256 ""
#endif

// The sha256 of the onednn.cc this library was built from (empty when the build did not say).
extern "C" const char* PaddlejaxOnednnSourceSha256() { return PADDLEJAX_ONEDNN_SOURCE_SHA256; }
