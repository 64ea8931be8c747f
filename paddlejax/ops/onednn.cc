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
// Channels-first activations go through the blocked layout the primitive prefers (oneDNN's
// plain-NCHW convolution is a slow im2col + GEMM); channels-last ones are used in place.
struct Conv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src, user_weights, dst, bias;
  std::unique_ptr<dnnl::reorder> reorder, src_in, dst_out;
  memory scratchpad, src_blocked, dst_blocked;
  memory weights;                  // in pd.weights_desc(), when it differs from user_weights
  std::vector<char> weights_copy;  // the plain weights `weights` was made from
  const void* weights_from = nullptr;
  bool scales = false, per_channel = false, dst_scale = false;
  std::mutex mu;
};

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
};

Conv* GetConv(const std::string& key, const ConvShape& c) {
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = conv_cache.find(key);
  if (it != conv_cache.end()) return it->second.get();
  auto conv = std::make_unique<Conv>();
  auto f32 = memory::data_type::f32;
  auto in_type = c.int8 ? memory::data_type::s8 : f32;
  auto fmt = c.nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw;
  auto& xd = c.xd;
  auto& yd = c.yd;
  auto& wd = c.wd;
  memory::dims x_dims = c.nhwc ? memory::dims{xd[0], xd[3], xd[1], xd[2]} : Dims(xd);
  memory::dims y_dims = c.nhwc ? memory::dims{yd[0], yd[3], yd[1], yd[2]} : Dims(yd);
  memory::dims w_dims = Dims(wd);
  auto w_fmt = memory::format_tag::oihw;
  if (c.groups > 1) {
    w_dims = {c.groups, wd[0] / c.groups, wd[1], wd[2], wd[3]};
    w_fmt = memory::format_tag::goihw;
  }
  memory::dims dil = {c.dilation[0] - 1, c.dilation[1] - 1};  // oneDNN counts dilation from 0
  conv->src = memory::desc(x_dims, in_type, fmt);
  auto out_type = c.int8_out ? memory::data_type::s8 : f32;
  conv->dst = memory::desc(y_dims, out_type, fmt);
  conv->user_weights = memory::desc(w_dims, in_type, w_fmt);
  conv->bias = memory::desc({y_dims[1]}, f32, memory::format_tag::x);
  dnnl::post_ops ops;
  if (!AppendActivation(ops, c.act, c.alpha)) return nullptr;
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
  auto src_any = c.nhwc ? conv->src : memory::desc(x_dims, in_type, any);
  auto dst_any = c.nhwc ? conv->dst : memory::desc(y_dims, out_type, any);
  auto weights_any = memory::desc(w_dims, in_type, any);
  conv->pd = c.has_bias
      ? dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, src_any, weights_any, conv->bias,
                                                  dst_any, Dims(c.stride), dil, Dims(c.pad_lo), Dims(c.pad_hi), attr)
      : dnnl::convolution_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_inference,
                                                  algorithm::convolution_direct, src_any, weights_any, dst_any,
                                                  Dims(c.stride), dil, Dims(c.pad_lo), Dims(c.pad_hi), attr);
  conv->prim = dnnl::convolution_forward(conv->pd);
  conv->scratchpad = memory(conv->pd.scratchpad_desc(), Engine());
  auto reorder = [](const memory::desc& from, const memory::desc& to) {
    return std::make_unique<dnnl::reorder>(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
  };
  if (conv->pd.weights_desc() != conv->user_weights) {
    conv->weights = memory(conv->pd.weights_desc(), Engine());
    conv->reorder = reorder(conv->user_weights, conv->pd.weights_desc());
  }
  if (conv->pd.src_desc() != conv->src) {
    conv->src_blocked = memory(conv->pd.src_desc(), Engine());
    conv->src_in = reorder(conv->src, conv->pd.src_desc());
  }
  if (conv->pd.dst_desc() != conv->dst) {
    conv->dst_blocked = memory(conv->pd.dst_desc(), Engine());
    conv->dst_out = reorder(conv->pd.dst_desc(), conv->dst);
  }
  return (conv_cache[key] = std::move(conv)).get();
}

std::string ConvKey(const ConvShape& c) {
  return Key({c.xd, c.wd, c.yd, c.stride, c.pad_lo, c.pad_hi, c.dilation},
             {c.groups, c.nhwc, c.has_bias, c.act, static_cast<int64_t>(c.alpha * 1e6), c.int8, c.per_channel,
              c.int8_out});
}

// Run `c` on XLA's buffers; the scales only for int8.
ffi::Error RunConv(const char* op, const ConvShape& c, const void* x, const void* w, size_t w_bytes,
                   const void* bias, void* y, const void* src_scale = nullptr,
                   const void* weight_scale = nullptr, const void* dst_scale = nullptr) {
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
    memory src(conv->src, Engine(), const_cast<void*>(x)), dst(conv->dst, Engine(), y);
    memory user_w(conv->user_weights, Engine(), const_cast<void*>(w));
    memory weights = user_w;
    if (conv->reorder) {
      bool same = conv->weights_from == w && conv->weights_copy.size() == w_bytes &&
                  std::memcmp(conv->weights_copy.data(), w, w_bytes) == 0;
      if (!same) {
        conv->reorder->execute(stream, user_w, conv->weights);
        conv->weights_copy.assign(static_cast<const char*>(w), static_cast<const char*>(w) + w_bytes);
        conv->weights_from = w;
      }
      weights = conv->weights;
    }
    if (conv->src_in) {
      conv->src_in->execute(stream, src, conv->src_blocked);
      src = conv->src_blocked;
    }
    memory out = conv->dst_out ? conv->dst_blocked : dst;
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights},
                                            {DNNL_ARG_DST, out}, {DNNL_ARG_SCRATCHPAD, conv->scratchpad}};
    if (c.has_bias) args[DNNL_ARG_BIAS] = memory(conv->bias, Engine(), const_cast<void*>(bias));
    if (conv->scales) {
      auto f32 = memory::data_type::f32;
      args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] =
          memory(memory::desc({1}, f32, memory::format_tag::x), Engine(), const_cast<void*>(src_scale));
      args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] =
          memory(memory::desc({conv->per_channel ? c.wd[0] : 1}, f32, memory::format_tag::x), Engine(),
                 const_cast<void*>(weight_scale));
    }
    if (conv->dst_scale) {
      args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = memory(
          memory::desc({1}, memory::data_type::f32, memory::format_tag::x), Engine(), const_cast<void*>(dst_scale));
    }
    conv->prim.execute(stream, args);
    if (conv->dst_out) conv->dst_out->execute(stream, out, dst);
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(op) + ": " + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Conv2dImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> b,
                      ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                      ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                      ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias, int64_t act,
                      float alpha) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha};
  return RunConv("oneDNN conv2d", c, x.untyped_data(), w.untyped_data(), w.size_bytes(), b.untyped_data(),
                 y->untyped_data());
}

// int8: y = act(x_scale * w_scale[oc] * conv(x_q, w_q) + bias), the scales already divided by 127
ffi::Error QuantizedConv2dImpl(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> x_scale,
                               ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                               ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> stride,
                               ffi::Span<const int64_t> pad_lo, ffi::Span<const int64_t> pad_hi,
                               ffi::Span<const int64_t> dilation, int64_t groups, bool nhwc, bool has_bias,
                               int64_t act, float alpha) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha, true, w_scale.element_count() > 1};
  return RunConv("oneDNN quantized_conv2d", c, x.untyped_data(), w.untyped_data(), w.size_bytes(),
                 b.untyped_data(), y->untyped_data(), x_scale.untyped_data(), w_scale.untyped_data());
}

// int8 dataflow: the same, requantized to int8 by out_scale (already divided by 127)
ffi::Error RequantizedConv2dImpl(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> x_scale,
                                 ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                                 ffi::Buffer<ffi::F32> out_scale, ffi::ResultBuffer<ffi::S8> y,
                                 ffi::Span<const int64_t> stride, ffi::Span<const int64_t> pad_lo,
                                 ffi::Span<const int64_t> pad_hi, ffi::Span<const int64_t> dilation, int64_t groups,
                                 bool nhwc, bool has_bias, int64_t act, float alpha) {
  ConvShape c{x.dimensions(), w.dimensions(), y->dimensions(), stride, pad_lo, pad_hi, dilation, groups, nhwc,
              has_bias, act, alpha, true, w_scale.element_count() > 1, true};
  return RunConv("oneDNN quantized_conv2d", c, x.untyped_data(), w.untyped_data(), w.size_bytes(),
                 b.untyped_data(), y->untyped_data(), x_scale.untyped_data(), w_scale.untyped_data(),
                 out_scale.untyped_data());
}

}  // namespace

#define CONV_ATTRS                                     \
  Attr<ffi::Span<const int64_t>>("stride")             \
      .Attr<ffi::Span<const int64_t>>("pad_lo")        \
      .Attr<ffi::Span<const int64_t>>("pad_hi")        \
      .Attr<ffi::Span<const int64_t>>("dilation")      \
      .Attr<int64_t>("groups")                         \
      .Attr<bool>("nhwc")                              \
      .Attr<bool>("has_bias")                          \
      .Attr<int64_t>("act")                            \
      .Attr<float>("alpha")

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnConv2d, Conv2dImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .CONV_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnQuantizedConv2d, QuantizedConv2dImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .CONV_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PaddlejaxOnednnRequantizedConv2d, RequantizedConv2dImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .CONV_ATTRS);
