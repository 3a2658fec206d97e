// The layer norm's compiled path: its entries (a forward program per key, backward programs by the
// gradient's alignment and the gradients asked for), its autograd node and its module functions.
// Included once, by fastpath.cpp.

#pragma once

#include "programs.h"

namespace {
namespace ln {

// ---- entries ----------------------------------------------------------------------

struct Alloc {  // a parameter gradient: like the weight, or of this shape and dtype
  bool like_weight;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

struct Backward {
  Program program;
  Alloc dw, db;
};

struct Entry {
  Program forward;
  int64_t stats_numel;
  at::ScalarType stats_dtype;
  std::vector<int64_t> x_sizes;  // x as the key has it (a saved-tensor hook may unpack another)
  at::ScalarType x_dtype;
  PyObject* py_backward;  // (entry, dy, x, w, stats, need_dw, need_db, recordable) -> (dx, dw, db)
  std::shared_mutex lock;
  std::map<int, Backward> backward;  // by dy's 16-byte alignment, need_dw, need_db
};

Registry<Entry> registry(4096);

// The key of a call, or false where the fast path does not take it: x and the parameters contiguous
// CUDA tensors on one device, normalized_shape x's trailing dims.
bool call_key(const at::Tensor& x, int64_t k, const at::Tensor* w, const at::Tensor* b, double eps, Key& key) {
  if (!x.is_cuda() || !plain(x) || !x.is_contiguous() || k < 1 || k > x.dim()) return false;
  key.reserve(48);
  int64_t eps_bits;
  std::memcpy(&eps_bits, &eps, 8);
  key.push_back(k);
  key.push_back(eps_bits);
  push_tensor(key, x);
  for (const at::Tensor* p : {w, b}) {
    if (p == nullptr) {
      key.push_back(-1);
      continue;
    }
    if (!p->is_cuda() || !plain(*p) || !p->is_contiguous()) return false;
    push_tensor(key, *p);
  }
  return true;
}

void run_forward(Entry* e, const at::Tensor& x, const at::Tensor* w, const at::Tensor* b, at::Tensor& y,
                 at::Tensor& stats) {
  y = at::empty_like(x);
  stats = at::empty({e->stats_numel}, x.options().dtype(e->stats_dtype));
  Slots slots = {&x, w, b, &y, &stats};
  run_program(e->forward, slots, current_stream(x));
}

at::Tensor param_grad(const Alloc& a, const at::Tensor& w, const at::Tensor& x) {
  if (a.like_weight) return at::empty_like(w);
  return at::empty(a.shape, x.options().dtype(a.dtype));
}

// The autograd node of a call that records a graph. A Node of its own, as torch's generated ones are,
// rather than a torch::autograd::Function: no context object and no saved_data map of strings; the
// saved tensors are SavedVariables (version checks, saved-tensor hooks, freed after a backward that does
// not retain the graph, as for any node).
struct LayerNormBackward : public torch::autograd::Node {
  Entry* entry = nullptr;
  bool has_w = false, has_b = false;
  // what the programs were recorded for, of the tensors saved: a saved-tensor hook may unpack others
  bool x_aligned = false, w_aligned = false;
  at::ScalarType w_dtype = at::kFloat;
  int64_t w_numel = 0;
  torch::autograd::SavedVariable x_, w_, stats_;

  std::string name() const override { return "CrossfuseLayerNormBackward"; }
  void release_variables() override {  // under the node's lock, as torch's nodes (two threads' backwards)
    std::lock_guard<std::mutex> hold(mutex_);
    x_.reset_data();
    w_.reset_data();
    stats_.reset_data();
  }
  variable_list apply(variable_list&& grads) override;
};

// The forward of a call that records a graph: the kernels, then the node, its edges (x, weight, bias;
// an absent one's edge is empty) and what it saves.
at::Tensor forward_with_node(Entry* e, const at::Tensor& x, const at::Tensor* w, const at::Tensor* b) {
  at::Tensor y, stats;
  run_forward(e, x, w, b, y, stats);
  NodePtr node_ptr = make_node<LayerNormBackward>();
  auto* node = static_cast<LayerNormBackward*>(node_ptr.get());
  at::Tensor none;
  node->set_next_edges(torch::autograd::collect_next_edges(x, w ? *w : none, b ? *b : none));
  node->entry = e;
  node->has_w = w != nullptr;
  node->has_b = b != nullptr;
  node->x_aligned = aligned16(x);
  if (w != nullptr) {
    node->w_aligned = aligned16(*w);
    node->w_dtype = w->scalar_type();
    node->w_numel = w->numel();
  }
  node->x_ = torch::autograd::SavedVariable(x, false);
  node->w_ = torch::autograd::SavedVariable(w ? *w : none, false);
  node->stats_ = torch::autograd::SavedVariable(stats, false);
  torch::autograd::set_history(y, node_ptr);
  return y;
}

variable_list LayerNormBackward::apply(variable_list&& grads) {
  Entry* e = entry;
  at::Tensor x, w, stats;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    x = x_.unpack();
    w = w_.unpack();
    stats = stats_.unpack();
  }
  at::Tensor dy = grads[0];
  if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};  // a zero gradient's are zero
  bool need_dw = has_w && task_should_compute_output(1);
  bool need_db = has_b && task_should_compute_output(2);
  at::Tensor dx, dw, db;
  // the saved tensors as the programs expect them (a saved-tensor hook's unpack may give others): else
  // the Python path, which plans for what it is given
  bool saved_ok = plain(x) && x.is_contiguous() && aligned16(x) == x_aligned && x.sizes().equals(e->x_sizes) &&
                  x.scalar_type() == e->x_dtype && plain(stats) &&
                  stats.is_contiguous() && stats.device() == x.device() && aligned16(stats) &&
                  stats.scalar_type() == e->stats_dtype && stats.numel() == e->stats_numel &&
                  w.defined() == has_w &&
                  (!has_w || (plain(w) && w.is_contiguous() && w.device() == x.device() &&
                              aligned16(w) == w_aligned && w.scalar_type() == w_dtype && w.numel() == w_numel));
  bool fast = saved_ok && dy.is_cuda() && plain(dy) && dy.is_contiguous() &&
              dy.scalar_type() == x.scalar_type() && dy.sizes() == x.sizes() && launchable(x);
  const Backward* hit = nullptr;
  if (fast) {
    int bkey = int(aligned16(dy)) * 4 + int(need_dw) * 2 + int(need_db);
    std::shared_lock<std::shared_mutex> hold(e->lock);
    auto it = e->backward.find(bkey);
    if (it != e->backward.end()) hit = &it->second;
  }
  if (hit != nullptr) {
    dx = at::empty_like(x);
    if (need_dw) dw = param_grad(hit->dw, w, x);
    if (need_db) db = param_grad(hit->db, w, x);
    Slots slots = {&dy, &x, w.defined() ? &w : nullptr, &stats, &dx, dw.defined() ? &dw : nullptr,
                   db.defined() ? &db : nullptr};
    run_program(hit->program, slots, current_stream(x));
  } else {
    pybind11::gil_scoped_acquire gil;
    // `fast`: whether a program recorded from this call may serve later ones (the saved tensors and the
    // gradient as the entry's programs expect them); else the Python backward records none
    PyObject* out = PyObject_CallFunction(e->py_backward, "LNNNNOOO", static_cast<long long>(reinterpret_cast<intptr_t>(e)),
                                          THPVariable_Wrap(dy), THPVariable_Wrap(x), THPVariable_Wrap(w),
                                          THPVariable_Wrap(stats), need_dw ? Py_True : Py_False,
                                          need_db ? Py_True : Py_False, fast ? Py_True : Py_False);
    unpack_grads(out, {&dx, &dw, &db}, "crossfuse.layer_norm");
  }
  return node_outputs(*this, {dx, dw, db}, {dy, x, w}, "crossfuse.layer_norm");
}

// ---- a call's arguments ------------------------------------------------------------------------------

bool is_tensor_or_none(PyObject* o) { return o == Py_None || THPVariable_Check(o); }

at::Tensor* optional_tensor(PyObject* o, at::Tensor& holder) {
  if (o == Py_None) return nullptr;
  holder = THPVariable_Unpack(o);
  return &holder;
}

// the number of normalised dims where normalized_shape is x's trailing dims, else 0
int64_t normalised_dims(const at::Tensor& x, PyObject* shape) {
  if (PyLong_CheckExact(shape)) {
    long long n = PyLong_AsLongLong(shape);
    if (n == -1 && PyErr_Occurred()) {  // too large for any size
      PyErr_Clear();
      return 0;
    }
    return x.dim() >= 1 && x.size(-1) == n ? 1 : 0;
  }
  if (!PyTuple_Check(shape) && !PyList_CheckExact(shape)) return 0;  // torch.Size: a tuple
  PyObject* fast = PySequence_Fast(shape, "");
  if (fast == nullptr) {
    PyErr_Clear();
    return 0;
  }
  Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
  int64_t ok = k >= 1 && k <= x.dim() ? k : 0;
  for (Py_ssize_t i = 0; ok && i < k; ++i) {
    PyObject* d = PySequence_Fast_GET_ITEM(fast, i);
    if (!PyLong_CheckExact(d)) {
      ok = 0;
      break;
    }
    long long v = PyLong_AsLongLong(d);
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    if (v != x.size(x.dim() - k + i)) ok = 0;
  }
  Py_DECREF(fast);
  return ok;
}

bool real_eps(PyObject* o, double& eps) {
  if (PyFloat_CheckExact(o)) {
    eps = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (PyLong_CheckExact(o)) {
    eps = PyLong_AsDouble(o);
    return !PyErr_Occurred() || (PyErr_Clear(), false);
  }
  return false;
}

// A call's tensors and key, read from (x, normalized_shape, weight, bias, eps).
struct CallArgs {
  at::Tensor x, w_holder, b_holder;
  at::Tensor* w = nullptr;
  at::Tensor* b = nullptr;
  Key key;
};

// false where the fast path does not take these arguments (see call_key)
bool read_call(PyObject* const* args, CallArgs& c) {
  double eps;
  if (!THPVariable_Check(args[0]) || !is_tensor_or_none(args[2]) || !is_tensor_or_none(args[3]) ||
      !real_eps(args[4], eps))
    return false;
  c.x = THPVariable_Unpack(args[0]);
  int64_t k = normalised_dims(c.x, args[1]);
  c.w = optional_tensor(args[2], c.w_holder);
  c.b = optional_tensor(args[3], c.b_holder);
  return k != 0 && call_key(c.x, k, c.w, c.b, eps, c.key);
}

// ---- the module's functions ------------------------------------------------------------------------

// layer_norm(x, normalized_shape, weight, bias, eps) -> y, or None where no program is registered
PyObject* layer_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "layer_norm takes 5 arguments");
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    CallArgs c;
    if (launch_ex == nullptr || !read_call(args, c)) Py_RETURN_NONE;
    Entry* e = registry.find(c.key);
    const at::Tensor& x = c.x;
    at::Tensor *w = c.w, *b = c.b;
    if (e == nullptr || !launchable(x)) Py_RETURN_NONE;
    // forward-mode AD (dual tensors): the Python path, whose autograd.Function says what it supports
    if (dual(&x) || dual(w) || dual(b)) Py_RETURN_NONE;
    bool grads = x.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad());
    at::Tensor y;
    if (grads && at::GradMode::is_enabled()) {
      y = forward_with_node(e, x, w, b);
    } else {
      at::Tensor stats;
      run_forward(e, x, w, b, y, stats);
    }
    return THPVariable_Wrap(y);
  });
}

// add_layer_norm(x, normalized_shape, weight, bias, eps, forward, stats, py_backward) -> the entry (an
// int) or False: the forward's program for this call's key (`stats`: a statistics tensor, for its size
// and dtype)
PyObject* add_layer_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return guarded([&]() -> PyObject* {
    if (nargs != 8 || !THPVariable_Check(args[6]) || !PyCallable_Check(args[7])) {
      PyErr_SetString(PyExc_TypeError, "add_layer_norm(x, normalized_shape, weight, bias, eps, forward, stats, backward)");
      return nullptr;
    }
    CallArgs c;
    if (!read_call(args, c)) Py_RETURN_FALSE;
    auto e = std::make_unique<Entry>();
    if (!parse_program(args[5], e->forward)) return nullptr;
    const at::Tensor& stats = THPVariable_Unpack(args[6]);
    e->stats_numel = stats.numel();
    e->stats_dtype = stats.scalar_type();
    e->x_sizes = c.x.sizes().vec();
    e->x_dtype = c.x.scalar_type();
    e->py_backward = args[7];
    return registry.add(c.key, std::move(e));
  });
}

bool parse_alloc(PyObject* o, Alloc& a) {
  // (like_weight, shape tuple, example tensor for the dtype) or None
  if (o == Py_None) {
    a.like_weight = true;
    a.dtype = at::kFloat;
    return true;
  }
  int like;
  PyObject *shape, *example;
  if (!PyArg_ParseTuple(o, "pO!O", &like, &PyTuple_Type, &shape, &example) || !THPVariable_Check(example))
    return false;
  a.like_weight = like;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i) a.shape.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i)));
  a.dtype = THPVariable_Unpack(example).scalar_type();
  return !PyErr_Occurred();
}

// add_layer_norm_backward(entry, dy_aligned, need_dw, need_db, program, dw_alloc, db_alloc) -> bool
PyObject* add_layer_norm_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return guarded([&]() -> PyObject* {
    if (nargs != 7 || !PyLong_Check(args[0])) {
      PyErr_SetString(PyExc_TypeError, "add_layer_norm_backward takes 7 arguments, an entry first");
      return nullptr;
    }
    Entry* e = registry.entry_of(args[0], "add_layer_norm");
    if (e == nullptr) return nullptr;
    int flags[3];
    for (int i = 0; i < 3; ++i) {
      flags[i] = PyObject_IsTrue(args[1 + i]);
      if (flags[i] < 0) return nullptr;
    }
    Backward bwd;
    if (!parse_program(args[4], bwd.program) || !parse_alloc(args[5], bwd.dw) || !parse_alloc(args[6], bwd.db))
      return nullptr;
    std::unique_lock<std::shared_mutex> hold(e->lock);
    e->backward.emplace(flags[0] * 4 + flags[1] * 2 + flags[2], std::move(bwd));
    Py_RETURN_TRUE;
  });
}

}  // namespace ln
}  // namespace
