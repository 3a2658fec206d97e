// The ReLU attention's compiled path: a forward program per key (the tensors q, k, v and the flags, scales
// and layout), backward programs by the output gradient's alignment, its autograd node and its module
// functions. A call's programs are those of the Python path's launch plans (crossfuse/ops/relu_attention
// /api.py records them); a call without one returns None and goes the Python way.
// Included once, by fastpath.cpp.

#pragma once

#include "programs.h"

namespace {
namespace attn {

// ---- entries ---------------------------------------------------------------------------------------

struct Backward {
  Program program;
  Layout dq, dk, dv;  // the gradients as the program was recorded for (allocated so)
};

struct Entry {
  Program forward;
  Layout q, k, v, out;  // the tensors' layouts (a saved-tensor hook may unpack others)
  bool q_aligned, k_aligned, v_aligned;
  PyObject* py_backward;  // (entry, q, k, v, dout, recordable) -> (dq, dk, dv); records a program
  std::shared_mutex lock;
  std::map<int, Backward> backward;  // by dout's 16-byte alignment; dout laid out as the output
};

Registry<Entry> registry(1024);

at::Tensor empty_as(const Layout& l, const at::Tensor& like) {
  return at::empty_strided(l.sizes, l.strides, like.options());
}

at::Tensor run_forward(Entry* e, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  at::Tensor out = empty_as(e->out, q);
  Slots slots = {&q, &k, &v, &out};
  run_with_scratch(e->forward, slots, 4, q, current_stream(q));
  return out;
}

// ---- the autograd node -----------------------------------------------------------------------------

struct AttentionBackward : public torch::autograd::Node {
  Entry* entry = nullptr;
  torch::autograd::SavedVariable q_, k_, v_;

  std::string name() const override { return "CrossfuseReLUAttentionBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> hold(mutex_);
    q_.reset_data();
    k_.reset_data();
    v_.reset_data();
  }
  variable_list apply(variable_list&& grads) override;
};

at::Tensor forward_with_node(Entry* e, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  at::Tensor out = run_forward(e, q, k, v);
  NodePtr node_ptr = make_node<AttentionBackward>();
  auto* node = static_cast<AttentionBackward*>(node_ptr.get());
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  node->entry = e;
  node->q_ = torch::autograd::SavedVariable(q, false);
  node->k_ = torch::autograd::SavedVariable(k, false);
  node->v_ = torch::autograd::SavedVariable(v, false);
  torch::autograd::set_history(out, node_ptr);
  return out;
}

bool as_recorded(const at::Tensor& t, const Layout& l, bool aligned, const at::Tensor& q) {
  return plain(t) && l == t && aligned16(t) == aligned && t.scalar_type() == q.scalar_type() &&
         t.device() == q.device();
}

variable_list AttentionBackward::apply(variable_list&& grads) {
  Entry* e = entry;
  at::Tensor q, k, v;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    q = q_.unpack();
    k = k_.unpack();
    v = v_.unpack();
  }
  at::Tensor dout = grads[0];
  if (!dout.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};  // a zero gradient's are zero
  at::Tensor dq, dk, dv;
  // the saved tensors and the gradient as the programs expect them, else the Python path
  bool fast = q.is_cuda() && as_recorded(q, e->q, e->q_aligned, q) && as_recorded(k, e->k, e->k_aligned, q) &&
              as_recorded(v, e->v, e->v_aligned, q) && dout.is_cuda() && plain(dout) && e->out == dout &&
              dout.scalar_type() == q.scalar_type() && dout.device() == q.device() && launchable(q);
  const Backward* hit = nullptr;
  if (fast) {
    std::shared_lock<std::shared_mutex> hold(e->lock);
    auto it = e->backward.find(int(aligned16(dout)));
    if (it != e->backward.end()) hit = &it->second;
  }
  if (hit != nullptr) {
    dq = empty_as(hit->dq, q);
    dk = empty_as(hit->dk, k);
    dv = empty_as(hit->dv, v);
    Slots slots = {&q, &k, &v, &dout, &dq, &dk, &dv};
    run_with_scratch(hit->program, slots, 7, q, current_stream(q));
  } else {
    pybind11::gil_scoped_acquire gil;
    // `fast`: whether a program recorded from this call may serve later ones (see the layer norm's)
    PyObject* out = PyObject_CallFunction(e->py_backward, "LNNNNO", static_cast<long long>(reinterpret_cast<intptr_t>(e)),
                                          THPVariable_Wrap(q), THPVariable_Wrap(k), THPVariable_Wrap(v),
                                          THPVariable_Wrap(dout), fast ? Py_True : Py_False);
    unpack_grads(out, {&dq, &dk, &dv}, "crossfuse.relu_attention");
  }
  return node_outputs(*this, {dq, dk, dv}, {dout, q, k, v}, "crossfuse.relu_attention");
}

// ---- a call's arguments ----------------------------------------------------------------------------

// None, or a float exactly (an int, a numpy float: the Python path, whose key tells them apart)
bool optional_real(PyObject* o, Key& key) {
  if (o == Py_None) {
    key.push_back(0);
    key.push_back(0);
    return true;
  }
  if (!PyFloat_CheckExact(o)) return false;
  double v = PyFloat_AS_DOUBLE(o);
  int64_t bits;
  std::memcpy(&bits, &v, 8);
  key.push_back(1);
  key.push_back(bits);
  return true;
}

struct CallArgs {
  at::Tensor q, k, v;
  Key key;
};

// (q, k, v, causal, squared, scale, relu_scale, layout): false where the fast path does not take them:
// tensors that are not plain CUDA tensors (or Parameters) of one device, flags that are not bools, scales
// that are not floats or None, a layout that is not one of the two
bool read_call(PyObject* const* args, CallArgs& c) {
  for (int i = 0; i < 3; ++i)
    if (!THPVariable_CheckExact(args[i])) return false;
  if (!PyBool_Check(args[3]) || !PyBool_Check(args[4]) || !PyUnicode_Check(args[7])) return false;
  int64_t layout;
  if (PyUnicode_CompareWithASCIIString(args[7], "bhld") == 0)
    layout = 0;
  else if (PyUnicode_CompareWithASCIIString(args[7], "blhd") == 0)
    layout = 1;
  else
    return false;
  c.q = THPVariable_Unpack(args[0]);
  c.k = THPVariable_Unpack(args[1]);
  c.v = THPVariable_Unpack(args[2]);
  c.key.reserve(48);
  c.key.push_back(args[3] == Py_True);
  c.key.push_back(args[4] == Py_True);
  c.key.push_back(layout);
  if (!optional_real(args[5], c.key) || !optional_real(args[6], c.key)) return false;
  for (const at::Tensor* t : {&c.q, &c.k, &c.v}) {
    if (!t->is_cuda() || !plain(*t) || t->device() != c.q.device()) return false;
    push_tensor(c.key, *t);
  }
  return true;
}

// ---- the module's functions ------------------------------------------------------------------------

// relu_attention(q, k, v, causal, squared, scale, relu_scale, layout) -> out, or None without a program
PyObject* relu_attention(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "relu_attention takes 8 arguments");
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    CallArgs c;
    if (launch_ex == nullptr || !read_call(args, c)) Py_RETURN_NONE;
    Entry* e = registry.find(c.key);
    if (e == nullptr || !launchable(c.q)) Py_RETURN_NONE;
    if (dual(&c.q) || dual(&c.k) || dual(&c.v)) Py_RETURN_NONE;  // forward-mode AD: the Python path
    bool grads = c.q.requires_grad() || c.k.requires_grad() || c.v.requires_grad();
    if (grads && at::GradMode::is_enabled()) return THPVariable_Wrap(forward_with_node(e, c.q, c.k, c.v));
    return THPVariable_Wrap(run_forward(e, c.q, c.k, c.v));
  });
}

// add_relu_attention(q, k, v, causal, squared, scale, relu_scale, layout, forward, out, py_backward,
// scratch) -> the entry (an int) or False: the forward's program for this call's key (`out`: an output, for
// its layout; `scratch`: example tensors of the buffers it allocates per call)
PyObject* add_relu_attention(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return guarded([&]() -> PyObject* {
    if (nargs != 12 || !THPVariable_Check(args[9]) || !PyCallable_Check(args[10])) {
      PyErr_SetString(PyExc_TypeError, "add_relu_attention(q, k, v, causal, squared, scale, relu_scale, layout, "
                                       "forward, out, backward, scratch)");
      return nullptr;
    }
    CallArgs c;
    if (!read_call(args, c)) Py_RETURN_FALSE;
    auto e = std::make_unique<Entry>();
    if (!parse_program(args[8], e->forward) || !parse_scratch(args[11], 4, e->forward)) return nullptr;
    e->q = layout_of(c.q);
    e->k = layout_of(c.k);
    e->v = layout_of(c.v);
    e->q_aligned = aligned16(c.q);
    e->k_aligned = aligned16(c.k);
    e->v_aligned = aligned16(c.v);
    e->out = layout_of(THPVariable_Unpack(args[9]));
    e->py_backward = args[10];
    return registry.add(c.key, std::move(e));
  });
}

// add_relu_attention_backward(entry, dout, program, dq, dk, dv, scratch) -> bool: the backward's program
// for a gradient laid out as dout (it must be as the output), its gradients allocated as dq, dk, dv, its
// scratch buffers as `scratch`'s tensors
PyObject* add_relu_attention_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return guarded([&]() -> PyObject* {
    if (nargs != 7 || !PyLong_Check(args[0]) || !THPVariable_Check(args[1]) || !THPVariable_Check(args[3]) ||
        !THPVariable_Check(args[4]) || !THPVariable_Check(args[5])) {
      PyErr_SetString(PyExc_TypeError, "add_relu_attention_backward(entry, dout, program, dq, dk, dv, scratch)");
      return nullptr;
    }
    Entry* e = registry.entry_of(args[0], "add_relu_attention");
    if (e == nullptr) return nullptr;
    const at::Tensor& dout = THPVariable_Unpack(args[1]);
    if (!(e->out == dout)) Py_RETURN_FALSE;
    Backward bwd;
    if (!parse_program(args[2], bwd.program) || !parse_scratch(args[6], 7, bwd.program)) return nullptr;
    bwd.dq = layout_of(THPVariable_Unpack(args[3]));
    bwd.dk = layout_of(THPVariable_Unpack(args[4]));
    bwd.dv = layout_of(THPVariable_Unpack(args[5]));
    std::unique_lock<std::shared_mutex> hold(e->lock);
    e->backward.emplace(int(aligned16(dout)), std::move(bwd));
    Py_RETURN_TRUE;
  });
}

}  // namespace attn
}  // namespace
