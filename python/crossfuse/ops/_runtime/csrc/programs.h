// Recorded programs and what every op's compiled path shares: the driver's launch, a program's arguments
// (constants, addresses within a call's tensors, tensor maps kept per address), keys of tensors, the
// autograd node's pointer type, and the error a node's output gives when differentiated again.
//
// Included once, by fastpath.cpp (one translation unit: everything here has internal linkage).

#pragma once

#include <Python.h>
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
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
using MemsetD8Async = CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream);
LaunchEx launch_ex = nullptr;
MemsetD8Async memset_d8_async = nullptr;
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
  memset_d8_async = reinterpret_cast<MemsetD8Async>(dlsym(lib, "cuMemsetD8Async"));
  bool ok = launch_ex != nullptr && ctx_get_current != nullptr && ctx_get_device != nullptr &&
            memset_d8_async != nullptr;
  if (!ok) launch_ex = nullptr;  // what the module functions look at: no call is taken without all of them
  return ok;
}

// ---- programs --------------------------------------------------------------------------------------

enum Kind : int { kPtr = 0, kI32 = 1, kI64 = 2, kF32 = 3, kF64 = 4, kI8 = 5, kU32 = 6, kU64 = 7, kMap = 8 };

constexpr int kMaxSlots = 12;  // a call's tensors, then its scratch buffers
constexpr int kMaxArgs = 64;
constexpr int kMapBytes = 128;  // a CUtensorMap, passed to the kernel by value
constexpr int kMaxMaps = 8;     // tensor maps per launch
constexpr size_t kMaxKnown = 128;  // tensor maps kept per argument (addresses: then afresh)

// A tensor-map argument's maps by address. On a miss the Python encoder (Triton's own encoding, see
// native.py) is called with the slot's tensor and the byte offset, and its 128 bytes are kept: a map
// depends only on the address here (the program fixes shape, strides, box and dtype), and a training
// loop's caching allocator hands out the same addresses again.
struct MapCache {
  PyObject* encode = nullptr;  // (tensor, byte offset) -> bytes of the map
  std::mutex lock;
  std::unordered_map<uint64_t, std::array<unsigned char, kMapBytes>> known;
  // programs live as long as the process; a discarded registration (a key that had one) lets go here
  ~MapCache() {
    if (encode != nullptr && Py_IsInitialized()) {
      PyGILState_STATE gil = PyGILState_Ensure();
      Py_DECREF(encode);
      PyGILState_Release(gil);
    }
  }
};

struct Arg {
  int kind;
  int slot;       // kPtr, kMap: the tensor slot whose address plus `value` it is (kPtr -1: `value` itself)
  int64_t value;  // an integer constant, or the byte offset of an address
  double real;    // a float constant
  int map = -1;   // kMap: its cache in the launch's `maps`
};

// A kernel launch, or (fn null) the zeroing of `zero_bytes` bytes at `zero_at`'s address, in stream order:
// a kernel's counters and flags zeroed before it runs.
struct Launch {
  CUfunction fn = nullptr;
  Arg zero_at{kPtr, -1, 0, 0.0};
  size_t zero_bytes = 0;
  unsigned grid[3] = {0, 0, 0};
  unsigned block = 0;
  unsigned smem = 0;
  bool pdl = false;
  bool coop = false;
  std::vector<Arg> args;
  std::vector<std::shared_ptr<MapCache>> maps;
};

// A buffer a program's launches write before they read it (float32 attention's tf32 copies): allocated
// per call, as the Python path allocates it, into the slots after the call's tensors, and dropped once the
// launches are queued (the caching allocator orders its reuse on the stream, as for the Python path's).
struct Scratch {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Program {
  std::vector<Launch> launches;
  std::vector<Scratch> scratch;
};

// a program's tensors by slot (nullptr: an absent one)
using Slots = std::array<const at::Tensor*, kMaxSlots>;

uint64_t address(const Arg& a, const Slots& slots) {
  if (a.slot < 0 || slots[a.slot] == nullptr) return uint64_t(a.value);  // (an absent tensor: its offset)
  return uint64_t(reinterpret_cast<uintptr_t>(slots[a.slot]->data_ptr())) + a.value;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* text = "unknown error";
    if (error_string != nullptr) error_string(r, &text);
    TORCH_CHECK(false, "crossfuse: ", what, " failed: ", text);
  }
}

[[noreturn]] void raise_python_error() {  // the Python exception that is set, raised where it is caught
  python_error err;
  err.persist();
  throw std::move(err);
}

// The tensor map of `a` for this call into `out`: kept, or encoded by Python (the GIL taken for it; no
// lock held meanwhile, so that a thread that holds the GIL and waits for the lock cannot deadlock).
void tensor_map(MapCache& cache, const Arg& a, const Slots& slots, unsigned char* out) {
  TORCH_CHECK(slots[a.slot] != nullptr, "crossfuse: a tensor map over an absent tensor");
  uint64_t at_address = address(a, slots);
  {
    std::lock_guard<std::mutex> hold(cache.lock);
    auto it = cache.known.find(at_address);
    if (it != cache.known.end()) {
      std::memcpy(out, it->second.data(), kMapBytes);
      return;
    }
  }
  std::array<unsigned char, kMapBytes> map;
  {
    pybind11::gil_scoped_acquire gil;
    PyObject* got = PyObject_CallFunction(cache.encode, "NL", THPVariable_Wrap(*slots[a.slot]),
                                          static_cast<long long>(a.value));
    if (got == nullptr) raise_python_error();
    bool ok = PyBytes_Check(got) && PyBytes_GET_SIZE(got) == kMapBytes;
    if (ok) std::memcpy(map.data(), PyBytes_AS_STRING(got), kMapBytes);
    Py_DECREF(got);
    TORCH_CHECK(ok, "crossfuse: a tensor map's encoder did not return its 128 bytes");
  }
  std::memcpy(out, map.data(), kMapBytes);
  std::lock_guard<std::mutex> hold(cache.lock);
  if (cache.known.size() >= kMaxKnown) cache.known.clear();
  cache.known.emplace(at_address, map);
}

void run_program(const Program& p, const Slots& slots, CUstream stream) {
  for (const Launch& l : p.launches) {
    if (l.fn == nullptr) {
      TORCH_CHECK(slots[l.zero_at.slot] != nullptr, "crossfuse: a zeroing of an absent tensor");
      check(memset_d8_async(CUdeviceptr(address(l.zero_at, slots)), 0, l.zero_bytes, stream), "a memset");
      continue;
    }
    if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) continue;  // nothing to launch, as Triton's
    size_t n = l.args.size();
    TORCH_CHECK(n <= kMaxArgs, "crossfuse: a recorded launch has too many arguments");
    uint64_t store[kMaxArgs];
    alignas(64) unsigned char maps[kMaxMaps][kMapBytes];
    int used_maps = 0;
    void* params[kMaxArgs];
    for (size_t i = 0; i < n; ++i) {
      const Arg& a = l.args[i];
      void* at = &store[i];
      switch (a.kind) {
        case kPtr: {
          uint64_t v = address(a, slots);
          std::memcpy(at, &v, 8);
          break;
        }
        case kMap: {
          TORCH_CHECK(used_maps < kMaxMaps, "crossfuse: a recorded launch has too many tensor maps");
          at = maps[used_maps++];
          tensor_map(*l.maps[a.map], a, slots, static_cast<unsigned char*>(at));
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

// run_program with the program's scratch buffers allocated on `like`'s device into the slots from `first`
// on (kept until the launches are queued)
void run_with_scratch(const Program& p, Slots slots, size_t first, const at::Tensor& like, CUstream stream) {
  TORCH_CHECK(first + p.scratch.size() <= size_t(kMaxSlots), "crossfuse: a program's scratch past its slots");
  std::array<at::Tensor, kMaxSlots> held;
  for (size_t i = 0; i < p.scratch.size(); ++i) {
    const Scratch& s = p.scratch[i];
    held[i] = at::empty_strided(s.sizes, s.strides, like.options().dtype(s.dtype));
    slots[first + i] = &held[i];
  }
  run_program(p, slots, stream);
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

// ---- tensors and keys ------------------------------------------------------------------------------

using Key = std::vector<int64_t>;

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

bool dual(const at::Tensor* t) { return t != nullptr && t->_fw_grad(0).defined(); }

// A tensor's sizes and strides, as a program was recorded for (its outputs are allocated so).
struct Layout {
  std::vector<int64_t> sizes, strides;
  bool operator==(const at::Tensor& t) const { return t.sizes() == sizes && t.strides() == strides; }
};

Layout layout_of(const at::Tensor& t) { return {t.sizes().vec(), t.strides().vec()}; }

// ---- an op's entries -------------------------------------------------------------------------------

// An op's entries by key: E has a `lock` (std::shared_mutex), a `backward` map of its backward programs
// and its Python backward `py_backward`. Entries are never freed: a saved node may point to one; forget()
// only empties the look-up.
template <class E>
struct Registry {
  std::shared_mutex lock;
  std::map<Key, E*> entries;
  std::set<E*> handles;  // every entry ever made (the backward registrations' check)
  size_t max_entries;

  explicit Registry(size_t max) : max_entries(max) {}

  E* find(const Key& key) {
    std::shared_lock<std::shared_mutex> hold(lock);
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : it->second;
  }

  // the new entry's handle (an int), or False where the key has one or the table is full; the entry's
  // `py_backward` is taken a reference to where the entry is kept
  PyObject* add(const Key& key, std::unique_ptr<E> e) {
    std::unique_lock<std::shared_mutex> hold(lock);
    if (entries.size() >= max_entries || entries.count(key)) Py_RETURN_FALSE;
    Py_INCREF(e->py_backward);
    E* made = e.release();
    entries[key] = made;
    handles.insert(made);
    return PyLong_FromLongLong(static_cast<long long>(reinterpret_cast<intptr_t>(made)));
  }

  // the entry of a handle add() returned, or nullptr with a ValueError set
  E* entry_of(PyObject* handle, const char* op) {
    E* e = reinterpret_cast<E*>(static_cast<intptr_t>(PyLong_AsLongLong(handle)));
    std::shared_lock<std::shared_mutex> hold(lock);
    if (handles.count(e)) return e;
    PyErr_Format(PyExc_ValueError, "not an entry of %s", op);
    return nullptr;
  }

  void forget() {
    std::unique_lock<std::shared_mutex> hold(lock);
    entries.clear();
  }

  PyObject* counts() {  // (forward programs, backward programs)
    std::shared_lock<std::shared_mutex> hold(lock);
    size_t n = 0;
    for (auto& kv : entries) {
      std::shared_lock<std::shared_mutex> inner(kv.second->lock);
      n += kv.second->backward.size();
    }
    return Py_BuildValue("(nn)", Py_ssize_t(entries.size()), Py_ssize_t(n));
  }
};

// A module function's body, its C++ exceptions as Python ones: a Python exception raised inside (a
// saved-tensor hook's, a tensor map's encoder's) as it was raised, any other as a RuntimeError.
template <class F>
PyObject* guarded(F body) {
  try {
    return body();
  } catch (python_error& err) {
    err.restore();
    return nullptr;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

// ---- autograd --------------------------------------------------------------------------------------

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

// Under create_graph: gradients whose own gradient raises (the backward is not differentiable) rather than
// a silent zero. The raising node hangs on what the gradients depend on (`links`: the incoming gradient and
// the saved inputs, those that require grad), so that autograd.grad of the gradients or a Hessian reaches
// it; hung on the gradients' detached copies alone, as torch's once_differentiable hangs it, it is on no
// path to the inputs (as crossfuse.ops._runtime.autograd.backward_once).
variable_list once_differentiable(variable_list grads, const variable_list& links, const char* op) {
  variable_list in;
  for (at::Tensor& t : grads) {
    at::Tensor v;
    if (t.defined()) {
      v = t.detach();
      v.set_requires_grad(true);
    }
    in.push_back(v);
  }
  const size_t n = in.size();
  for (const at::Tensor& t : links)
    if (t.defined() && t.requires_grad()) in.push_back(t);
  torch::autograd::DelayedError err(std::string("trying to differentiate twice ") + op +
                                        ", which has no double backward (its gradients, taken with "
                                        "create_graph=True, cannot be differentiated again)",
                                    int64_t(in.size()));
  variable_list out = err.apply(std::move(in));
  out.resize(n);
  return out;
}

// A node's gradients as it returns them: those its edges do not ask for dropped, and under create_graph
// (grad mode on in a backward) the once_differentiable ones, whether the incoming gradient requires grad
// or not: a plain loss's does not, and the gradients' own derivatives would then come out silently zero.
variable_list node_outputs(const torch::autograd::Node& node, variable_list grads, const variable_list& links,
                           const char* op) {
  for (size_t i = 0; i < grads.size(); ++i)
    if (!node.task_should_compute_output(i)) grads[i] = at::Tensor();
  if (at::GradMode::is_enabled()) return once_differentiable(std::move(grads), links, op);
  return grads;
}

// The tuple of gradients a Python backward returned, each a tensor or None, into `out`; its exception
// (`got` null) raised again where the backward was called.
void unpack_grads(PyObject* got, std::initializer_list<at::Tensor*> out, const char* op) {
  if (got == nullptr) raise_python_error();
  bool ok = PyTuple_Check(got) && PyTuple_GET_SIZE(got) == Py_ssize_t(out.size());
  Py_ssize_t i = 0;
  for (at::Tensor* t : out) {
    if (!ok) break;
    PyObject* item = PyTuple_GET_ITEM(got, i++);
    if (THPVariable_Check(item))
      *t = THPVariable_Unpack(item);
    else
      ok = item == Py_None;
  }
  Py_XDECREF(got);
  TORCH_CHECK(ok, "crossfuse: ", op, "'s Python backward did not return its gradients");
}

// ---- parsing a registration ------------------------------------------------------------------------

bool parse_program(PyObject* launches, Program& p) {
  // [(function, gx, gy, gz, block, smem, pdl, coop, [(kind, slot, value, real[, encoder]), ...]), ...],
  // a zeroing as (slot, byte offset, bytes)
  if (!PyList_Check(launches)) {
    PyErr_SetString(PyExc_TypeError, "a program is a list of launches");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(launches); ++i) {
    PyObject* item = PyList_GET_ITEM(launches, i);
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
      Launch z;
      int slot;
      long long offset, bytes;
      if (!PyArg_ParseTuple(item, "iLL", &slot, &offset, &bytes)) return false;
      if (slot < 0 || slot >= kMaxSlots || offset < 0 || bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "a zeroing outside the slots");
        return false;
      }
      z.zero_at.slot = slot;
      z.zero_at.value = offset;
      z.zero_bytes = size_t(bytes);
      p.launches.push_back(std::move(z));
      continue;
    }
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
      PyObject* encode = nullptr;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(args, j), "iiLd|O", &a.kind, &a.slot, &value, &a.real, &encode))
        return false;
      a.value = value;
      bool slot_ok = a.kind == kMap ? a.slot >= 0 && a.slot < kMaxSlots : a.slot >= -1 && a.slot < kMaxSlots;
      if (a.kind < kPtr || a.kind > kMap || !slot_ok || (a.kind == kMap) != (encode != nullptr)) {
        PyErr_SetString(PyExc_ValueError, "an argument of an unknown kind or slot");
        return false;
      }
      if (a.kind == kMap) {
        if (!PyCallable_Check(encode) || l.maps.size() >= size_t(kMaxMaps)) {
          PyErr_SetString(PyExc_ValueError, "a tensor map needs a callable encoder (at most 8 a launch)");
          return false;
        }
        auto cache = std::make_shared<MapCache>();
        Py_INCREF(encode);  // kept as long as the program: programs are never freed
        cache->encode = encode;
        a.map = int(l.maps.size());
        l.maps.push_back(std::move(cache));
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

// A program's scratch buffers from a list of example tensors (their sizes, strides and dtype), to sit in
// the slots from `first` on: false, with an exception set, where they would not fit there.
bool parse_scratch(PyObject* buffers, size_t first, Program& p) {
  if (!PyList_Check(buffers)) {
    PyErr_SetString(PyExc_TypeError, "a program's scratch is a list of tensors");
    return false;
  }
  Py_ssize_t n = PyList_GET_SIZE(buffers);
  if (first + size_t(n) > size_t(kMaxSlots)) {
    PyErr_SetString(PyExc_ValueError, "a program's scratch buffers past its slots");
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(buffers, i);
    if (!THPVariable_Check(item)) {
      PyErr_SetString(PyExc_TypeError, "a program's scratch is a list of tensors");
      return false;
    }
    const at::Tensor& t = THPVariable_Unpack(item);
    p.scratch.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return true;
}

}  // namespace
