// The layer norm's eager calls once their plans are known: a C++ look-up, allocations and driver launches.
//
// A Python call of an autograd.Function costs more host time than torch's whole C++ operator (its node,
// the Python frames around the launches, the launcher's argument parsing). Here the key of a call (the
// tensors' sizes, strides, dtypes, device and 16-byte alignment, the normalised dims and eps) selects a
// recorded program: the outputs to allocate and the kernels to launch (function, grid, block, shared
// memory and every argument, each a constant or an address within one of the call's tensors). The
// Python side records a program from a plan that already launches straight to its compiled kernels
// (crossfuse/ops/_runtime/native.py) and registers it here; a call without one returns None and goes
// the Python way. The backward is a C++ autograd node: the engine calls it without the GIL; a
// gradient layout without a program calls back into Python, which records one where it can.

#include <Python.h>
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda.h>

namespace {

using torch::autograd::variable_list;

// ---- the driver ------------------------------------------------------------------------------------

using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using ErrorString = CUresult (*)(CUresult, const char**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxGetDevice = CUresult (*)(CUdevice*);
LaunchEx launch_ex = nullptr;
ErrorString error_string = nullptr;
CtxGetCurrent ctx_get_current = nullptr;
CtxGetDevice ctx_get_device = nullptr;

bool load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) return false;
  launch_ex = reinterpret_cast<LaunchEx>(dlsym(lib, "cuLaunchKernelEx"));
  error_string = reinterpret_cast<ErrorString>(dlsym(lib, "cuGetErrorString"));
  ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
  ctx_get_device = reinterpret_cast<CtxGetDevice>(dlsym(lib, "cuCtxGetDevice"));
  return launch_ex != nullptr && ctx_get_current != nullptr && ctx_get_device != nullptr;
}

// ---- programs --------------------------------------------------------------------------------------

enum Kind : int { kPtr = 0, kI32 = 1, kI64 = 2, kF32 = 3, kF64 = 4, kI8 = 5, kU32 = 6, kU64 = 7 };

struct Arg {
  int kind;
  int slot;       // kPtr: the tensor slot whose address plus `value` it is (-1: `value` itself)
  int64_t value;  // an integer constant, or the byte offset of an address
  double real;    // a float constant
};

struct Launch {
  CUfunction fn;
  unsigned grid[3];
  unsigned block;
  unsigned smem;
  bool pdl;
  bool coop;
  std::vector<Arg> args;
};

struct Program {
  std::vector<Launch> launches;
};

constexpr int kMaxSlots = 8;
constexpr int kMaxArgs = 64;

uint64_t address(const Arg& a, const void* const* base) {
  return a.slot < 0 ? uint64_t(a.value) : uint64_t(reinterpret_cast<uintptr_t>(base[a.slot])) + a.value;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* text = "unknown error";
    if (error_string != nullptr) error_string(r, &text);
    TORCH_CHECK(false, "crossfuse: ", what, " failed: ", text);
  }
}

void run_program(const Program& p, const void* const* base, CUstream stream) {
  for (const Launch& l : p.launches) {
    if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) continue;  // nothing to launch, as Triton's
    size_t n = l.args.size();
    TORCH_CHECK(n <= kMaxArgs, "crossfuse: a recorded launch has too many arguments");
    uint64_t store[kMaxArgs];
    void* params[kMaxArgs];
    for (size_t i = 0; i < n; ++i) {
      const Arg& a = l.args[i];
      void* at = &store[i];
      switch (a.kind) {
        case kPtr: {
          uint64_t v = address(a, base);
          std::memcpy(at, &v, 8);
          break;
        }
        case kI32:
        case kU32: {
          int32_t v = int32_t(a.value);
          std::memcpy(at, &v, 4);
          break;
        }
        case kI8: {
          int8_t v = int8_t(a.value);
          std::memcpy(at, &v, 1);
          break;
        }
        case kF32: {
          float v = float(a.real);
          std::memcpy(at, &v, 4);
          break;
        }
        case kF64: {
          double v = a.real;
          std::memcpy(at, &v, 8);
          break;
        }
        default: {  // kI64, kU64
          int64_t v = a.value;
          std::memcpy(at, &v, 8);
        }
      }
      params[i] = at;
    }
    CUlaunchAttribute attrs[2];
    unsigned num_attrs = 0;
    if (l.pdl) {
      attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
      ++num_attrs;
    }
    if (l.coop) {
      attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[num_attrs].value.cooperative = 1;
      ++num_attrs;
    }
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof(config));
    config.gridDimX = l.grid[0];
    config.gridDimY = l.grid[1];
    config.gridDimZ = l.grid[2];
    config.blockDimX = l.block;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = l.smem;
    config.hStream = stream;
    config.attrs = attrs;
    config.numAttrs = num_attrs;
    check(launch_ex(&config, l.fn, params, nullptr), "a kernel launch");
  }
}

c10::impl::VirtualGuardImpl& cuda_guard() {
  static c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  return guard;
}

CUstream current_stream(const at::Tensor& t) {
  auto& guard = cuda_guard();
  return reinterpret_cast<CUstream>(guard.getStreamNativeHandle(guard.getStream(t.device())));
}

// Whether this thread can launch for t's device: t is on the current CUDA device, and that device's
// context is current (the programs' functions belong to it; the Python path makes the device current
// where another one is, and Triton's launcher binds a context where a new thread has none yet).
bool launchable(const at::Tensor& t) {
  int index = t.device().index();
  if (index != cuda_guard().getDevice().index()) return false;
  CUcontext ctx = nullptr;
  CUdevice dev = -1;
  return ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr && ctx_get_device(&dev) == CUDA_SUCCESS &&
         dev == index;
}

// ---- the layer norm's entries ----------------------------------------------------------------------

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
  PyObject* py_backward;  // (entry, dy, x, w, stats, need_dw, need_db) -> (dx, dw, db); records a program
  std::shared_mutex lock;
  std::map<int, Backward> backward;  // by dy's 16-byte alignment, need_dw, need_db
};

using Key = std::vector<int64_t>;

std::shared_mutex entries_lock;
std::map<Key, Entry*> entries;  // entries are never freed: a saved node may point to one
std::set<Entry*> handles;        // every entry ever made (add_layer_norm_backward's check)
constexpr size_t kMaxEntries = 4096;

bool plain(const at::Tensor& t) {  // a dense tensor of this process's memory: no wrapper, no lazy bits
  static const c10::DispatchKeySet wrappers({c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched,
                                             c10::DispatchKey::FuncTorchGradWrapper,
                                             c10::DispatchKey::Functionalize});
  return t.layout() == at::kStrided && !t.key_set().has_any(wrappers) && !t.is_neg() && !t.is_conj();
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

void push_tensor(Key& key, const at::Tensor& t) {
  key.push_back(int64_t(t.scalar_type()));
  key.push_back(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    key.push_back(t.size(d));
    key.push_back(t.stride(d));
  }
  key.push_back(t.device().index());
  key.push_back(int64_t(aligned16(t)));
}

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

Entry* find(const Key& key) {
  std::shared_lock<std::shared_mutex> hold(entries_lock);
  auto it = entries.find(key);
  return it == entries.end() ? nullptr : it->second;
}

void run_forward(Entry* e, const at::Tensor& x, const at::Tensor* w, const at::Tensor* b, at::Tensor& y,
                 at::Tensor& stats) {
  y = at::empty_like(x);
  stats = at::empty({e->stats_numel}, x.options().dtype(e->stats_dtype));
  const void* base[kMaxSlots] = {x.data_ptr(), w ? w->data_ptr() : nullptr, b ? b->data_ptr() : nullptr,
                                 y.data_ptr(), stats.data_ptr()};
  run_program(e->forward, base, current_stream(x));
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

// torch's nodes are held by std::shared_ptr (with torch's deleter, which frees long chains without
// recursion) in some versions and by c10::intrusive_ptr in others: the edges' own type says which
using NodePtr = decltype(std::declval<torch::autograd::Edge>().function);

template <class T>
NodePtr make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    // deleteNode found by argument-dependent look-up when instantiated: only the versions that have it
    return std::shared_ptr<T>(new T(), [](auto* p) { deleteNode(p); });
  } else {
    return c10::make_intrusive<T>();
  }
}

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
  bool saved_ok = plain(x) && x.is_contiguous() && aligned16(x) == x_aligned && plain(stats) &&
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
    const void* base[kMaxSlots] = {dy.data_ptr(), x.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
                                   stats.data_ptr(), dx.data_ptr(), dw.defined() ? dw.data_ptr() : nullptr,
                                   db.defined() ? db.data_ptr() : nullptr};
    run_program(hit->program, base, current_stream(x));
  } else {
    pybind11::gil_scoped_acquire gil;
    PyObject* out = PyObject_CallFunction(e->py_backward, "LNNNNOO", static_cast<long long>(reinterpret_cast<intptr_t>(e)),
                                          THPVariable_Wrap(dy), THPVariable_Wrap(x), THPVariable_Wrap(w),
                                          THPVariable_Wrap(stats), need_dw ? Py_True : Py_False,
                                          need_db ? Py_True : Py_False);
    if (out == nullptr) {  // the Python exception itself, raised again where the backward was called
      python_error err;
      err.persist();
      throw std::move(err);
    }
    bool ok = PyTuple_Check(out) && PyTuple_GET_SIZE(out) == 3;
    at::Tensor* got[3] = {&dx, &dw, &db};
    for (int i = 0; ok && i < 3; ++i) {
      PyObject* t = PyTuple_GET_ITEM(out, i);
      if (THPVariable_Check(t))
        *got[i] = THPVariable_Unpack(t);
      else
        ok = t == Py_None;
    }
    Py_DECREF(out);
    TORCH_CHECK(ok, "crossfuse: the layer norm's Python backward did not return (dx, dw, db)");
  }
  if (!need_dw) dw = at::Tensor();
  if (!need_db) db = at::Tensor();
  if (!task_should_compute_output(0)) dx = at::Tensor();
  if (at::GradMode::is_enabled() && dy.requires_grad()) {
    // create_graph: as once_differentiable does, outputs whose own gradient raises (this backward is
    // not differentiable), rather than a silent zero
    variable_list fake;
    for (at::Tensor* t : {&dx, &dw, &db}) {
      at::Tensor v;
      if (t->defined()) {
        v = t->detach();
        v.set_requires_grad(true);
      }
      fake.push_back(v);
    }
    torch::autograd::DelayedError err(
        "trying to differentiate twice crossfuse.layer_norm, whose backward is not differentiable "
        "(a function marked with @once_differentiable)",
        3);
    variable_list out = err.apply(std::move(fake));
    dx = out[0];
    dw = out[1];
    db = out[2];
  }
  return {dx, dw, db};
}

// ---- parsing the registrations ---------------------------------------------------------------------

bool parse_program(PyObject* launches, Program& p) {
  // [(function, gx, gy, gz, block, smem, pdl, coop, [(kind, slot, value, real), ...]), ...]
  if (!PyList_Check(launches)) {
    PyErr_SetString(PyExc_TypeError, "a program is a list of launches");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(launches); ++i) {
    PyObject* item = PyList_GET_ITEM(launches, i);
    unsigned long long fn;
    unsigned gx, gy, gz, block, smem;
    int pdl, coop;
    PyObject* args;
    if (!PyArg_ParseTuple(item, "KIIIIIppO!", &fn, &gx, &gy, &gz, &block, &smem, &pdl, &coop, &PyList_Type,
                          &args))
      return false;
    Launch l;
    l.fn = reinterpret_cast<CUfunction>(fn);
    l.grid[0] = gx;
    l.grid[1] = gy;
    l.grid[2] = gz;
    l.block = block;
    l.smem = smem;
    l.pdl = pdl;
    l.coop = coop;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(args); ++j) {
      Arg a;
      long long value;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(args, j), "iiLd", &a.kind, &a.slot, &value, &a.real)) return false;
      a.value = value;
      if (a.kind < kPtr || a.kind > kU64 || a.slot < -1 || a.slot >= kMaxSlots) {
        PyErr_SetString(PyExc_ValueError, "an argument of an unknown kind or slot");
        return false;
      }
      l.args.push_back(a);
    }
    if (l.fn == nullptr || l.args.size() > size_t(kMaxArgs)) {
      PyErr_SetString(PyExc_ValueError, "a launch without a function, or with too many arguments");
      return false;
    }
    p.launches.push_back(std::move(l));
  }
  return true;
}

at::Tensor* optional_tensor(PyObject* o, at::Tensor& holder) {
  if (o == Py_None) return nullptr;
  holder = THPVariable_Unpack(o);
  return &holder;
}

bool is_tensor_or_none(PyObject* o) { return o == Py_None || THPVariable_Check(o); }

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
  try {
    CallArgs c;
    if (launch_ex == nullptr || !read_call(args, c)) Py_RETURN_NONE;
    Entry* e = find(c.key);
    const at::Tensor& x = c.x;
    at::Tensor *w = c.w, *b = c.b;
    if (e == nullptr || !launchable(x)) Py_RETURN_NONE;
    // forward-mode AD (dual tensors): the Python path, whose autograd.Function says what it supports
    for (const at::Tensor* t : {&x, static_cast<const at::Tensor*>(w), static_cast<const at::Tensor*>(b)})
      if (t != nullptr && t->_fw_grad(0).defined()) Py_RETURN_NONE;
    bool grads = x.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad());
    at::Tensor y;
    if (grads && at::GradMode::is_enabled()) {
      y = forward_with_node(e, x, w, b);
    } else {
      at::Tensor stats;
      run_forward(e, x, w, b, y, stats);
    }
    return THPVariable_Wrap(y);
  } catch (python_error& err) {  // a saved-tensor hook's own exception, as it was raised
    err.restore();
    return nullptr;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

// add_layer_norm(x, normalized_shape, weight, bias, eps, forward, stats, py_backward) -> the entry (an
// int) or False: the forward's program for this call's key (`stats`: a statistics tensor, for its size
// and dtype)
PyObject* add_layer_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8 || !THPVariable_Check(args[6]) || !PyCallable_Check(args[7])) {
    PyErr_SetString(PyExc_TypeError, "add_layer_norm(x, normalized_shape, weight, bias, eps, forward, stats, backward)");
    return nullptr;
  }
  try {
    CallArgs c;
    if (!read_call(args, c)) Py_RETURN_FALSE;
    const Key& key = c.key;
    auto e = std::make_unique<Entry>();
    if (!parse_program(args[5], e->forward)) return nullptr;
    const at::Tensor& stats = THPVariable_Unpack(args[6]);
    e->stats_numel = stats.numel();
    e->stats_dtype = stats.scalar_type();
    Py_INCREF(args[7]);
    e->py_backward = args[7];
    std::unique_lock<std::shared_mutex> hold(entries_lock);
    if (entries.size() >= kMaxEntries || entries.count(key)) {
      Py_DECREF(args[7]);
      Py_RETURN_FALSE;
    }
    Entry* made = e.release();
    entries[key] = made;
    handles.insert(made);
    return PyLong_FromLongLong(static_cast<long long>(reinterpret_cast<intptr_t>(made)));
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
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
  if (nargs != 7 || !PyLong_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "add_layer_norm_backward takes 7 arguments, an entry first");
    return nullptr;
  }
  Entry* e = reinterpret_cast<Entry*>(static_cast<intptr_t>(PyLong_AsLongLong(args[0])));
  {
    std::shared_lock<std::shared_mutex> hold(entries_lock);
    if (!handles.count(e)) {
      PyErr_SetString(PyExc_ValueError, "not an entry of add_layer_norm");
      return nullptr;
    }
  }
  int flags[3];
  for (int i = 0; i < 3; ++i) {
    flags[i] = PyObject_IsTrue(args[1 + i]);
    if (flags[i] < 0) return nullptr;
  }
  try {
    Backward bwd;
    if (!parse_program(args[4], bwd.program) || !parse_alloc(args[5], bwd.dw) || !parse_alloc(args[6], bwd.db))
      return nullptr;
    std::unique_lock<std::shared_mutex> hold(e->lock);
    e->backward.emplace(flags[0] * 4 + flags[1] * 2 + flags[2], std::move(bwd));
    Py_RETURN_TRUE;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

PyObject* clear(PyObject*, PyObject*) {
  // entries stay allocated (a saved node may point to one); only the look-up forgets them
  std::unique_lock<std::shared_mutex> hold(entries_lock);
  entries.clear();
  Py_RETURN_NONE;
}

PyObject* count(PyObject*, PyObject*) {
  std::shared_lock<std::shared_mutex> hold(entries_lock);
  size_t n = 0;
  for (auto& kv : entries) {
    std::shared_lock<std::shared_mutex> inner(kv.second->lock);
    n += kv.second->backward.size();
  }
  return Py_BuildValue("(nn)", Py_ssize_t(entries.size()), Py_ssize_t(n));
}

PyMethodDef methods[] = {
    {"layer_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(layer_norm)), METH_FASTCALL,
     "the layer norm's eager call, or None without a program"},
    {"add_layer_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(add_layer_norm)), METH_FASTCALL,
     "register a forward program"},
    {"add_layer_norm_backward",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(add_layer_norm_backward)), METH_FASTCALL,
     "register a backward program"},
    {"clear", clear, METH_NOARGS, "forget every program"},
    {"count", count, METH_NOARGS, "(forward programs, backward programs)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "crossfuse_fastpath", nullptr, -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_crossfuse_fastpath() {
  bool driver = load_driver();  // without it (a machine without CUDA) no call is taken
  PyObject* m = PyModule_Create(&module_def);
  if (m != nullptr && PyModule_AddObject(m, "driver", PyBool_FromLong(driver)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
