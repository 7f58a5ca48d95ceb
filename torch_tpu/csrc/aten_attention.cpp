// Fused scaled_dot_product_attention: the "overrideable" SDPA backend.
//
// torch.nn.functional.scaled_dot_product_attention asks the device's
// _fused_sdp_choice stub which backend to use. For tpu tensors of a shape
// and dtype the fused kernel handles, it answers "overrideable", so
// PyTorch calls _scaled_dot_product_fused_attention_overrideable (and its
// backward through autograd); everything else takes the composite "math"
// path on the device, which also raises PyTorch's own errors for inputs
// that do not broadcast. The computation is tpurt_attention[_backward].
#include "glue.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <mutex>

namespace torch_tpu {
namespace {

bool fused_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Can the fused kernel take these inputs as they are?
bool fused_supported(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, double dropout_p, bool enable_gqa) {
  for (const at::Tensor* t : {&q, &k, &v})
    if (!t->defined() || t->device() != q.device() || t->is_nested() || t->layout() != at::kStrided) return false;
  if (q.device().type() != kTpu) return false;
  if (q.dim() != k.dim() || q.dim() != v.dim() || (q.dim() != 3 && q.dim() != 4)) return false;
  if (!fused_dtype(q.scalar_type()) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type())
    return false;
  if (q.size(-1) == 0 || q.size(-1) > 4096 || v.size(-1) > 4096 || k.size(-1) != q.size(-1) ||
      k.size(-2) != v.size(-2))
    return false;
  if (q.size(0) != k.size(0) || q.size(0) != v.size(0)) return false;
  if (q.dim() == 4) {
    int64_t hq = q.size(1), hk = k.size(1);
    if (v.size(1) != hk) return false;
    if (hq != hk && !(enable_gqa && hk > 0 && hq % hk == 0)) return false;
  }
  if (!(dropout_p >= 0 && dropout_p <= 1)) return false;
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    if (m.device() != q.device() || m.is_nested() || m.layout() != at::kStrided) return false;
    if (m.scalar_type() != at::kBool && !fused_dtype(m.scalar_type()) && m.scalar_type() != at::kDouble) return false;
    std::vector<int64_t> target(q.sizes().begin(), q.sizes().end() - 1);
    target.push_back(k.size(-2));
    if (m.dim() > q.dim() || !at::is_expandable_to(m.sizes(), target)) return false;
  }
  return true;
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  if (at::globalContext().userEnabledOverrideableSDP() && fused_supported(q, k, v, attn_mask, dropout_p, enable_gqa))
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  if (at::globalContext().userEnabledMathSDP()) return static_cast<int64_t>(at::SDPBackend::math);
  return static_cast<int64_t>(at::SDPBackend::error);
}

// Validates the fused op's direct inputs (it can also be called by name).
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
  TORCH_CHECK(q.dim() == k.dim() && q.dim() == v.dim() && (q.dim() == 3 || q.dim() == 4), op,
              ": expected query, key and value to be 3-D or 4-D tensors of the same rank, got ", q.dim(), "-D, ",
              k.dim(), "-D and ", v.dim(), "-D");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
              ": Expected query, key, and value to have the same dtype, but got query.dtype: ", q.scalar_type(),
              " key.dtype: ", k.scalar_type(), " and value.dtype: ", v.scalar_type(), " instead.");
  TORCH_CHECK(fused_dtype(q.scalar_type()), op, ": query, key and value must be float32, float16 or bfloat16, got ",
              q.scalar_type());
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->device() == q.device() && t->device().type() == kTpu, op,
                ": expected query, key and value on one tpu device");
  TORCH_CHECK(k.size(-1) == q.size(-1) && k.size(-2) == v.size(-2) && k.size(0) == q.size(0) &&
                  v.size(0) == q.size(0),
              op, ": shapes of query ", q.sizes(), ", key ", k.sizes(), " and value ", v.sizes(), " do not match");
  if (q.dim() == 4)
    TORCH_CHECK(k.size(1) == v.size(1) && k.size(1) > 0 && q.size(1) % k.size(1) == 0, op,
                ": number of heads in query (", q.size(1), ") must be a multiple of the heads of key and value (",
                k.size(1), ", ", v.size(1), ")");
}

at::Tensor as4(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }
at::Tensor on_device_like(const at::Tensor& t, const at::Tensor& like) {
  return t.device() == like.device() ? t : t.to(like.device());
}

// The mask / bias broadcast to [B, H, L, S] (as a view with stride 0).
at::Tensor mask4(const at::Tensor& m, const at::Tensor& q, int64_t S) {
  std::vector<int64_t> target(q.sizes().begin(), q.sizes().end() - 1);
  target.push_back(S);
  TORCH_CHECK(m.dim() <= q.dim() && at::is_expandable_to(m.sizes(), target),
              "scaled_dot_product_attention: attn_mask of shape ", m.sizes(),
              " cannot be broadcast to the attention weights' shape ", c10::IntArrayRef(target));
  TORCH_CHECK(m.device() == q.device(), "scaled_dot_product_attention: attn_mask must be on ", q.device(),
              ", got ", m.device());
  return as4(m.expand(target));
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// The forward's output takes the query's dimension order (as PyTorch's meta
// function for this op computes it), so graphs traced on meta tensors see
// the strides the kernel really produces: [B, L, H, D] storage under a
// [B, H, L, D] view when the query was made by a transpose.
at::Tensor empty_like_layout(const at::Tensor& q4, at::IntArrayRef sizes) {
  if (q4.sizes() == sizes) return at::empty_like(q4, at::MemoryFormat::Preserve);
  std::array<int64_t, 4> order{0, 1, 2, 3}, strides{};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q4.stride(a) > q4.stride(b); });
  int64_t st = 1;
  for (int i = 3; i >= 0; i--) {
    strides[order[i]] = st;
    st *= sizes[order[i]];
  }
  return at::empty_strided(sizes, strides, q4.options());
}

using FwdResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                             at::Tensor, at::Tensor>;

FwdResult sdpa_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                       bool return_debug_mask, std::optional<double> scale) {
  const char* op = "_scaled_dot_product_fused_attention_overrideable";
  check_inputs(query, key, value, op);
  TORCH_CHECK(dropout_p >= 0 && dropout_p <= 1, op, ": dropout probability has to be between 0 and 1, but got ",
              dropout_p);
  c10::DeviceGuard guard(query.device());
  at::Tensor q = as4(query), k = as4(key), v = as4(value);
  int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), Dv = v.size(3);
  at::Tensor out4 = empty_like_layout(q, {B, H, L, Dv});
  at::Tensor lse = at::empty({B, H, L}, q.options().dtype(at::kFloat));
  at::Tensor m;
  if (attn_bias.has_value() && attn_bias->defined()) m = mask4(*attn_bias, query, S);
  tpurt_attention_params p{};
  p.scale = scale_of(query, scale);
  p.is_causal = is_causal;
  p.dropout_p = dropout_p;
  p.precision = effective_matmul_precision();
  if (dropout_p > 0 && out4.numel() > 0) {
    const at::Generator& g = default_generator(query.device().index());
    std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(g).mutex());
    tpurt_generator* st = generator_state(g);
    p.seed = st->seed;
    p.offset = tpurt_generator_reserve(st, tpurt_attention_dropout_blocks(B * H, L, S));
  }
  tpurt_view ov = view_of(out4), lv = view_of(lse), qv = view_of(q), kv = view_of(k), vv = view_of(v), mv{};
  if (m.defined()) mv = view_of(m);
  check(tpurt_attention(current_stream(query.device().index()), &ov, &lv, &qv, &kv, &vv, m.defined() ? &mv : nullptr,
                        &p),
        op);
  at::Tensor out = query.dim() == 3 ? out4.squeeze(1) : out4;
  at::Tensor lse_out = query.dim() == 3 ? lse.squeeze(1) : lse;
  auto cpu64 = at::TensorOptions().dtype(at::kLong).device(at::kCPU);
  at::Tensor seed_t = at::scalar_tensor(static_cast<int64_t>(p.seed), cpu64);
  at::Tensor offset_t = at::scalar_tensor(static_cast<int64_t>(p.offset), cpu64);
  (void)return_debug_mask;  // no debug mask: the attention probabilities are never materialised
  return FwdResult(out, lse_out, at::empty({0}, q.options().dtype(at::kInt)),
                   at::empty({0}, q.options().dtype(at::kInt)), c10::SymInt(L), c10::SymInt(S), seed_t, offset_t,
                   at::empty({0}, q.options()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  const char* op = "_scaled_dot_product_fused_attention_overrideable_backward";
  if (!grad_out.defined()) return {};
  check_inputs(query, key, value, op);
  c10::DeviceGuard guard(query.device());
  at::Tensor q = as4(query), k = as4(key), v = as4(value), go = as4(grad_out), o = as4(out);
  at::Tensor lse = query.dim() == 3 ? logsumexp.unsqueeze(1) : logsumexp;
  int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2);
  TORCH_CHECK(go.sizes() == o.sizes() && o.size(0) == B && o.size(1) == H && o.size(2) == L, op, ": grad_out ",
              grad_out.sizes(), " and out ", out.sizes(), " do not match the query ", query.sizes());
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == B && lse.size(1) == H && lse.size(2) == L &&
                  lse.scalar_type() == at::kFloat && lse.device() == query.device(),
              op, ": logsumexp must be the float32 [B, H, L] output of the forward");
  // gradients in their input's layout (empty_like), as the meta function has them
  at::Tensor dq = grad_input_mask[0] ? at::empty_like(query, at::MemoryFormat::Preserve) : at::Tensor();
  at::Tensor dk = grad_input_mask[1] ? at::empty_like(key, at::MemoryFormat::Preserve) : at::Tensor();
  at::Tensor dv = grad_input_mask[2] ? at::empty_like(value, at::MemoryFormat::Preserve) : at::Tensor();
  at::Tensor m, dm;
  if (attn_bias.defined()) {
    m = mask4(attn_bias, query, S);
    if (grad_input_mask[3] && at::isFloatingType(attn_bias.scalar_type()))
      dm = at::zeros({B, H, L, S}, q.options().dtype(at::kFloat));
  }
  tpurt_attention_params p{};
  p.scale = scale_of(query, scale);
  p.is_causal = is_causal;
  p.dropout_p = dropout_p;
  p.precision = effective_matmul_precision();
  if (dropout_p > 0) {
    TORCH_CHECK(philox_seed.defined() && philox_offset.defined() && philox_seed.numel() == 1 &&
                    philox_offset.numel() == 1,
                op, ": dropout needs the philox seed and offset of the forward");
    p.seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
    p.offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  }
  at::Tensor dq4 = dq.defined() ? as4(dq) : dq, dk4 = dk.defined() ? as4(dk) : dk, dv4 = dv.defined() ? as4(dv) : dv;
  tpurt_view qv = view_of(q), kv = view_of(k), vv = view_of(v), gv = view_of(go), ov = view_of(o), lv = view_of(lse);
  tpurt_view dqv{}, dkv{}, dvv{}, dmv{}, mv{};
  if (dq4.defined()) dqv = view_of(dq4);
  if (dk4.defined()) dkv = view_of(dk4);
  if (dv4.defined()) dvv = view_of(dv4);
  if (dm.defined()) dmv = view_of(dm);
  if (m.defined()) mv = view_of(m);
  check(tpurt_attention_backward(current_stream(query.device().index()), dq4.defined() ? &dqv : nullptr,
                                 dk4.defined() ? &dkv : nullptr, dv4.defined() ? &dvv : nullptr,
                                 dm.defined() ? &dmv : nullptr, &gv, &qv, &kv, &vv, &ov, &lv,
                                 m.defined() ? &mv : nullptr, &p),
        op);
  at::Tensor dbias;
  if (dm.defined()) {
    at::Tensor d = query.dim() == 3 ? dm.squeeze(1) : dm;
    dbias = at::sum_to(d, attn_bias.sizes()).to(attn_bias.scalar_type());
  }
  return {dq, dk, dv, dbias};
}

// nn.MultiheadAttention's inference fast path (eval, no grad, batch_first, self-attention), composed
// of the device's kernels as the CPU's native_multi_head_attention composes its own: the packed
// in-projection, q scaled by 1/sqrt(head_dim), softmax(q k^T + mask) v (the fused SDPA kernel when the
// weights are not asked for and there is no mask), the out-projection. mask_type 0: [L, S]
// (attn_mask), 1: [B, S] (key_padding_mask), 2: broadcastable to [B, H, L, S].
std::tuple<at::Tensor, at::Tensor> native_multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim, int64_t num_head,
    const at::Tensor& qkv_weight, const at::Tensor& qkv_bias, const at::Tensor& proj_weight,
    const at::Tensor& proj_bias, const std::optional<at::Tensor>& mask, bool need_weights,
    bool average_attn_weights, std::optional<int64_t> mask_type) {
  const char* op = "_native_multi_head_attention";
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3, op,
              ": expected 3-D `query`, `key` and `value`, got ", query.dim(), "-D, ", key.dim(), "-D and ",
              value.dim(), "-D");
  TORCH_CHECK(num_head > 0 && embed_dim % num_head == 0, op, ": embed_dim ", embed_dim,
              " must be divisible by num_head ", num_head);
  TORCH_CHECK(query.size(2) == embed_dim && key.size(2) == embed_dim && value.size(2) == embed_dim, op,
              ": query, key and value must have embed_dim (", embed_dim, ") features");
  TORCH_CHECK(query.sizes() == key.sizes() && key.sizes() == value.sizes(),
              "expected `query`/`key`/`value` shapes to match");
  TORCH_CHECK(qkv_weight.dim() == 2 && qkv_weight.size(0) == 3 * embed_dim && qkv_weight.size(1) == embed_dim, op,
              ": expected qkv_weight of shape [", 3 * embed_dim, ", ", embed_dim, "], got ", qkv_weight.sizes());
  TORCH_CHECK(qkv_bias.dim() == 1 && qkv_bias.size(0) == 3 * embed_dim, op, ": expected qkv_bias of shape [",
              3 * embed_dim, "], got ", qkv_bias.sizes());
  c10::DeviceGuard guard(query.device());
  const int64_t B = query.size(0), L = query.size(1), S = key.size(1), H = num_head, dh = embed_dim / num_head;
  auto w = qkv_weight.chunk(3, 0);
  auto b = qkv_bias.chunk(3, 0);
  auto heads = [&](const at::Tensor& x, int64_t T) { return x.view({B, T, H, dh}).transpose(1, 2); };
  at::Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {   // one product, as the CPU's
    auto qkv = at::linear(query, qkv_weight, qkv_bias).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = at::linear(query, w[0], b[0]);
    k = at::linear(key, w[1], b[1]);
    v = at::linear(value, w[2], b[2]);
  }
  q = heads(q, L).mul(1.0 / std::sqrt(static_cast<double>(dh)));
  k = heads(k, S);
  v = heads(v, S);
  at::Tensor masked;   // True where attention is not allowed, broadcast to [B, H, L, S]
  if (mask.has_value() && mask->defined()) {
    at::Tensor m = on_device_like(*mask, query);
    int64_t mt = mask_type.value_or(2);
    if (mt == 1) {
      TORCH_CHECK(m.dim() == 2 && m.size(0) == B && m.size(1) == S, op, ": expected a [", B, ", ", S,
                  "] key padding mask, got ", m.sizes());
      m = m.view({B, 1, 1, S});
    } else if (mt == 0) {
      TORCH_CHECK(m.dim() == 2 && m.size(0) == L && m.size(1) == S, op, ": expected an [", L, ", ", S,
                  "] attention mask, got ", m.sizes());
    }
    // as the CPU's masked softmax: a float mask counts where it is nonzero (MultiheadAttention's
    // masks are 0 / -inf), and a row with no allowed position gets zero weights
    masked = (m.scalar_type() == at::kBool ? m : m.ne(0)).expand({B, H, L, S});
  }
  at::Tensor ctx, weights;
  if (need_weights || masked.defined()) {
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
    if (masked.defined()) scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
    at::Tensor attn = at::softmax(scores, -1);
    if (masked.defined()) attn = attn.masked_fill(masked.all(-1, /*keepdim=*/true), 0);
    ctx = at::matmul(attn, v);
    if (need_weights) weights = average_attn_weights ? attn.mean(1) : attn;
  } else {   // the fused kernel (q is already scaled)
    ctx = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, false, 1.0);
  }
  // no weights asked for: an undefined tensor (None in Python), as the CPU returns
  at::Tensor out = at::linear(ctx.transpose(1, 2).reshape({B, L, embed_dim}), proj_weight, proj_bias);
  return {out, weights};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", TORCH_FN(native_multi_head_attention));
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_backward));
}

}  // namespace torch_tpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::fused_sdp_choice)
}
