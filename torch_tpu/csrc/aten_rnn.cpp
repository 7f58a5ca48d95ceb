// ATen kernels of the `tpu` backend for the fused recurrent cells
// (aten::_thnn_fused_lstm_cell / _thnn_fused_gru_cell and their backward):
// what nn.LSTM, nn.GRU, LSTMCell and GRUCell call on an accelerator after
// the two gate products. The cells are computed by the runtime
// (tpurt_lstm_cell / tpurt_gru_cell, runtime/src/kernels/rnn.c); the glue
// checks shapes and dtypes as CUDA does, allocates the outputs and leaves the
// bias gradients (column sums of the gate gradients) to the tpu reduction.
#include "glue.h"

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_tpu {
namespace {

tpurt_stream* stream_of(const at::Tensor& t) { return current_stream(t.device().index()); }

void check_cell_args(const char* op, const at::Tensor& igates, const at::Tensor& hgates, const at::Tensor& state,
                     const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb, int64_t gates) {
  TORCH_CHECK(igates.dim() == 2, op, ": input_gates must be 2-D, got ", igates.dim(), " dimensions");
  TORCH_CHECK(igates.sizes() == hgates.sizes(), op, ": input_gates ", igates.sizes(),
              " and hidden_gates ", hgates.sizes(), " must have the same size");
  TORCH_CHECK(state.dim() == 2 && state.size(0) == igates.size(0) && igates.size(1) == gates * state.size(1), op,
              ": expected the state of size [", igates.size(0), ", ", igates.size(1) / gates, "], got ", state.sizes());
  for (const at::Tensor* t : {&hgates, &state})
    TORCH_CHECK(t->scalar_type() == igates.scalar_type() && t->device() == igates.device(), op,
                ": all tensors must have the dtype and device of input_gates (", igates.scalar_type(), ", ",
                igates.device(), "), got ", t->scalar_type(), " on ", t->device());
  bool has_ib = ib.has_value() && ib->defined(), has_hb = hb.has_value() && hb->defined();
  TORCH_CHECK(has_ib == has_hb, op, ": input_bias and hidden_bias must both be given or both be None");
  if (has_ib)
    for (const at::Tensor* b : {&*ib, &*hb}) {
      TORCH_CHECK(b->dim() == 1 && b->size(0) == igates.size(1), op, ": expected a bias of size [", igates.size(1),
                  "], got ", b->sizes());
      TORCH_CHECK(b->scalar_type() == igates.scalar_type() && b->device() == igates.device(), op,
                  ": the biases must have the dtype and device of input_gates");
    }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& igates, const at::Tensor& hgates,
                                                         const at::Tensor& cx, const std::optional<at::Tensor>& ib,
                                                         const std::optional<at::Tensor>& hb) {
  const char* op = "_thnn_fused_lstm_cell";
  check_cell_args(op, igates, hgates, cx, ib, hb, 4);
  c10::DeviceGuard g(igates.device());
  at::Tensor hy = at::empty(cx.sizes(), cx.options()), cy = at::empty(cx.sizes(), cx.options());
  at::Tensor ws = at::empty(igates.sizes(), igates.options());
  bool bias = ib.has_value() && ib->defined();
  tpurt_view hyv = view_of(hy), cyv = view_of(cy), wsv = view_of(ws), igv = view_of(igates), hgv = view_of(hgates),
             cxv = view_of(cx), ibv{}, hbv{};
  if (bias) {
    ibv = view_of(*ib);
    hbv = view_of(*hb);
  }
  check(tpurt_lstm_cell(stream_of(hy), &hyv, &cyv, &wsv, &igv, &hgv, &cxv, bias ? &ibv : nullptr,
                        bias ? &hbv : nullptr),
        op);
  return {hy, cy, ws};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward_impl(const std::optional<at::Tensor>& grad_hy,
                                                                       const std::optional<at::Tensor>& grad_cy,
                                                                       const at::Tensor& cx, const at::Tensor& cy,
                                                                       const at::Tensor& ws, bool has_bias) {
  const char* op = "_thnn_fused_lstm_cell_backward";
  bool gh = grad_hy.has_value() && grad_hy->defined(), gc = grad_cy.has_value() && grad_cy->defined();
  if (!gh && !gc) return {at::Tensor(), at::Tensor(), at::Tensor()};
  TORCH_CHECK(ws.dim() == 2 && cx.dim() == 2 && ws.size(1) == 4 * cx.size(1) && ws.size(0) == cx.size(0) &&
                  cy.sizes() == cx.sizes(),
              op, ": workspace ", ws.sizes(), ", cx ", cx.sizes(), " and cy ", cy.sizes(), " do not match");
  for (const at::Tensor* t : {gh ? &*grad_hy : nullptr, gc ? &*grad_cy : nullptr})
    if (t)
      TORCH_CHECK(t->sizes() == cx.sizes() && t->scalar_type() == cx.scalar_type(), op, ": expected a gradient of ",
                  "size ", cx.sizes(), " and dtype ", cx.scalar_type(), ", got ", t->sizes(), " ", t->scalar_type());
  c10::DeviceGuard g(cx.device());
  at::Tensor grad_gates = at::empty(ws.sizes(), ws.options()), grad_cx = at::empty(cx.sizes(), cx.options());
  tpurt_view ggv = view_of(grad_gates), gcxv = view_of(grad_cx), cxv = view_of(cx), cyv = view_of(cy),
             wsv = view_of(ws), ghv{}, gcv{};
  if (gh) ghv = view_of(*grad_hy);
  if (gc) gcv = view_of(*grad_cy);
  check(tpurt_lstm_cell_backward(stream_of(cx), &ggv, &gcxv, gh ? &ghv : nullptr, gc ? &gcv : nullptr, &cxv, &cyv,
                                 &wsv),
        op);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& igates, const at::Tensor& hgates, const at::Tensor& hx,
                                            const std::optional<at::Tensor>& ib,
                                            const std::optional<at::Tensor>& hb) {
  const char* op = "_thnn_fused_gru_cell";
  check_cell_args(op, igates, hgates, hx, ib, hb, 3);
  c10::DeviceGuard g(igates.device());
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor ws = at::empty({hx.size(0), 5 * hx.size(1)}, hx.options());
  bool bias = ib.has_value() && ib->defined();
  tpurt_view hyv = view_of(hy), wsv = view_of(ws), igv = view_of(igates), hgv = view_of(hgates), hxv = view_of(hx),
             ibv{}, hbv{};
  if (bias) {
    ibv = view_of(*ib);
    hbv = view_of(*hb);
  }
  check(tpurt_gru_cell(stream_of(hy), &hyv, &wsv, &igv, &hgv, &hxv, bias ? &ibv : nullptr, bias ? &hbv : nullptr),
        op);
  return {hy, ws};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                         const at::Tensor& ws,
                                                                                         bool has_bias) {
  const char* op = "_thnn_fused_gru_cell_backward";
  TORCH_CHECK(grad_hy.dim() == 2 && ws.dim() == 2 && ws.size(0) == grad_hy.size(0) &&
                  ws.size(1) == 5 * grad_hy.size(1),
              op, ": workspace ", ws.sizes(), " does not match grad_hy ", grad_hy.sizes());
  TORCH_CHECK(grad_hy.scalar_type() == ws.scalar_type() && grad_hy.device() == ws.device(), op,
              ": grad_hy and workspace must have the same dtype and device");
  c10::DeviceGuard g(ws.device());
  int64_t B = grad_hy.size(0), H = grad_hy.size(1);
  at::Tensor gi = at::empty({B, 3 * H}, ws.options()), gh = at::empty({B, 3 * H}, ws.options());
  at::Tensor ghx = at::empty({B, H}, ws.options());
  tpurt_view giv = view_of(gi), ghv = view_of(gh), ghxv = view_of(ghx), gyv = view_of(grad_hy), wsv = view_of(ws);
  check(tpurt_gru_cell_backward(stream_of(ws), &giv, &ghv, &ghxv, &gyv, &wsv), op);
  at::Tensor gib = has_bias ? gi.sum(0) : at::Tensor(), ghb = has_bias ? gh.sum(0) : at::Tensor();
  return {gi, gh, ghx, gib, ghb};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace torch_tpu
