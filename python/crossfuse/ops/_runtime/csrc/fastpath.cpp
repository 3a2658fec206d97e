// The ops' eager calls once their plans are known: a C++ look-up, allocations and driver launches.
//
// A Python call of an autograd.Function costs more host time than torch's whole C++ operator (its node,
// the Python frames around the launches, the launcher's argument parsing). Here the key of a call (the
// tensors' sizes, strides, dtypes, device and 16-byte alignment, and the op's flags) selects a recorded
// program: the outputs to allocate and the kernels to launch (function, grid, block, shared memory and
// every argument: a constant, an address within one of the call's tensors, or a tensor map over one,
// kept per address). The Python side records a program from a plan that already launches straight to
// its compiled kernels (crossfuse/ops/_runtime/native.py) and registers it here; a call without one
// returns None and goes the Python way. The backward is a C++ autograd node: the engine calls it without
// the GIL; a gradient layout without a program calls back into Python, which records one where it can.
//
// programs.h: the driver, programs, keys and autograd helpers; layer_norm.h and attention.h: each op's
// entries, node and functions; this file: the module.

#include "programs.h"
#include "layer_norm.h"
#include "attention.h"

namespace {

// entries stay allocated (a saved node may point to one); only the look-up forgets them
PyObject* clear(PyObject*, PyObject*) {
  ln::registry.forget();
  Py_RETURN_NONE;
}

PyObject* clear_attention(PyObject*, PyObject*) {
  attn::registry.forget();
  Py_RETURN_NONE;
}

PyObject* count(PyObject*, PyObject*) { return ln::registry.counts(); }

PyObject* count_attention(PyObject*, PyObject*) { return attn::registry.counts(); }

template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
PyCFunction fastcall() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

PyMethodDef methods[] = {
    {"layer_norm", fastcall<ln::layer_norm>(), METH_FASTCALL, "the layer norm's eager call, or None without a program"},
    {"add_layer_norm", fastcall<ln::add_layer_norm>(), METH_FASTCALL, "register a layer norm's forward program"},
    {"add_layer_norm_backward", fastcall<ln::add_layer_norm_backward>(), METH_FASTCALL,
     "register a layer norm's backward program"},
    {"relu_attention", fastcall<attn::relu_attention>(), METH_FASTCALL,
     "the ReLU attention's eager call, or None without a program"},
    {"add_relu_attention", fastcall<attn::add_relu_attention>(), METH_FASTCALL,
     "register a ReLU attention's forward program"},
    {"add_relu_attention_backward", fastcall<attn::add_relu_attention_backward>(), METH_FASTCALL,
     "register a ReLU attention's backward program"},
    {"clear", clear, METH_NOARGS, "forget the layer norm's programs"},
    {"clear_attention", clear_attention, METH_NOARGS, "forget the attention's programs"},
    {"count", count, METH_NOARGS, "the layer norm's (forward programs, backward programs)"},
    {"count_attention", count_attention, METH_NOARGS, "the attention's (forward programs, backward programs)"},
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
