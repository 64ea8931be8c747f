// oneDNN kernels for XLA's CPU backend, called through typed XLA FFI custom calls.
//
// Each handler builds its oneDNN primitive once per shape and attributes (a process-wide cache)
// and runs it on the buffers XLA hands in. Activations stay in the program's plain layout
// (NCHW or NHWC); weights are reordered into the layout the primitive picked, once per weight
// buffer and content (see WeightCache).
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

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

// A convolution primitive for one shape, with the weights it last reordered. The weights are
// reordered again when their buffer or content changes: a frozen program passes the same
// constant every call, a training step new values (compared against a copy kept here).
struct Conv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src, user_weights, dst, bias;
  std::unique_ptr<dnnl::reorder> reorder;
  memory scratchpad;
  memory weights;                 // in pd.weights_desc(), when it differs from user_weights
  std::vector<char> weights_copy;  // the plain weights `weights` was made from
  const void* weights_from = nullptr;
  std::mutex mu;
};

std::mutex cache_mu;
std::unordered_map<std::string, std::unique_ptr<Conv>> conv_cache;

Conv* GetConv(const std::string& key, const ffi::AnyBuffer::Dimensions& xd, const ffi::AnyBuffer::Dimensions& wd,
              const ffi::AnyBuffer::Dimensions& yd, ffi::Span<const int64_t> stride,
              ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
              ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias, int64_t act, float alpha) {
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = conv_cache.find(key);
  if (it != conv_cache.end()) return it->second.get();
  auto conv = std::make_unique<Conv>();
  auto f32 = memory::data_type::f32;
  auto fmt = nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw;
  memory::dims x_dims = nhwc ? memory::dims{xd[0], xd[3], xd[1], xd[2]} : Dims(xd);
  memory::dims y_dims = nhwc ? memory::dims{yd[0], yd[3], yd[1], yd[2]} : Dims(yd);
  memory::dims w_dims = Dims(wd);
  auto w_fmt = memory::format_tag::oihw;
  if (groups > 1) {
    w_dims = {groups, wd[0] / groups, wd[1], wd[2], wd[3]};
    w_fmt = memory::format_tag::goihw;
  }
  memory::dims dil = {dilation[0] - 1, dilation[1] - 1};  // oneDNN counts dilation from 0
  conv->src = memory::desc(x_dims, f32, fmt);
  conv->dst = memory::desc(y_dims, f32, fmt);
  conv->user_weights = memory::desc(w_dims, f32, w_fmt);
  conv->bias = memory::desc({y_dims[1]}, f32, memory::format_tag::x);
  dnnl::post_ops ops;
  if (!AppendActivation(ops, act, alpha)) return nullptr;
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  // each primitive its own scratchpad, used under its lock: oneDNN's shared one is not safe
  // for the concurrent calls XLA's thread pool makes
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto any_weights = memory::desc(w_dims, f32, memory::format_tag::any);
  conv->pd = has_bias
      ? dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, conv->src, any_weights, conv->bias,
                                                  conv->dst, Dims(stride), dil, Dims(pad_lo), Dims(pad_hi), attr)
      : dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, conv->src, any_weights, conv->dst,
                                                  Dims(stride), dil, Dims(pad_lo), Dims(pad_hi), attr);
  conv->prim = dnnl::convolution_forward(conv->pd);
  conv->scratchpad = memory(conv->pd.scratchpad_desc(), Engine());
  if (conv->pd.weights_desc() != conv->user_weights) {
    conv->weights = memory(conv->pd.weights_desc(), Engine());
    conv->reorder = std::make_unique<dnnl::reorder>(
        dnnl::reorder::primitive_desc(Engine(), conv->user_weights, Engine(), conv->pd.weights_desc()));
  }
  return (conv_cache[key] = std::move(conv)).get();
}

ffi::Error Conv2dImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> b,
                      ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                      ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                      ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias, int64_t act,
                      float alpha) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  std::string key = Key({xd, wd, yd, stride, pad_lo, pad_hi, dilation},
                        {groups, nhwc, has_bias, act, static_cast<int64_t>(alpha * 1e6)});
  Conv* conv;
  try {
    conv = GetConv(key, xd, wd, yd, stride, pad_lo, pad_hi, dilation, groups, nhwc, has_bias, act, alpha);
  } catch (const dnnl::error& e) {
    return ffi::Error::InvalidArgument(std::string("oneDNN conv2d: ") + e.what());
  }
  if (conv == nullptr) return ffi::Error::InvalidArgument("oneDNN conv2d: unknown activation");
  dnnl::stream stream(Engine());
  std::lock_guard<std::mutex> lock(conv->mu);
  memory src(conv->src, Engine(), x.typed_data()), dst(conv->dst, Engine(), y->typed_data());
  memory user_w(conv->user_weights, Engine(), w.typed_data());
  memory weights = user_w;
  if (conv->reorder) {
    size_t bytes = w.size_bytes();
    bool same = conv->weights_from == w.untyped_data() && conv->weights_copy.size() == bytes &&
                std::memcmp(conv->weights_copy.data(), w.untyped_data(), bytes) == 0;
    if (!same) {
      conv->reorder->execute(stream, user_w, conv->weights);
      conv->weights_copy.assign(static_cast<const char*>(w.untyped_data()),
                                static_cast<const char*>(w.untyped_data()) + bytes);
      conv->weights_from = w.untyped_data();
    }
    weights = conv->weights;
  }
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst},
                                          {DNNL_ARG_SCRATCHPAD, conv->scratchpad}};
  if (has_bias) args[DNNL_ARG_BIAS] = memory(conv->bias, Engine(), b.typed_data());
  conv->prim.execute(stream, args);
  stream.wait();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2d, Conv2dImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<ffi::Span<const int64_t>>("stride")
                                  .Attr<ffi::Span<const int64_t>>("pad_lo")
                                  .Attr<ffi::Span<const int64_t>>("pad_hi")
                                  .Attr<ffi::Span<const int64_t>>("dilation")
                                  .Attr<int64_t>("groups")
                                  .Attr<bool>("nhwc")
                                  .Attr<bool>("has_bias")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("alpha"));
