/*
 * libosftrt — the one SWIG interface for every SWIG language (Python, Go).
 *
 * It %includes the public headers themselves (include/osftrt/*.h), so every
 * osft_* function, enum, struct and #define constant is wrapped as declared
 * there; nothing of the API is re-declared here. What this file adds:
 *
 *   common (every language)
 *     - a default constructor for every options/inputs/outputs/stats struct
 *       that runs its *_init() (or sets struct_size), so a struct made in
 *       the target language is always valid;
 *     - the OSFT_*_INIT(ptr) macros as functions of the same name;
 *   Python only (#ifdef SWIGPYTHON)
 *     - osft_status_t results: None on success, else an exception of the
 *       class of the status (osftrt.InvalidArgument, ..., all subclasses of
 *       osftrt.Error) carrying .status and the osft_last_error() text;
 *     - DLTensor * arguments take any object with __dlpack__ (torch, numpy
 *       >= 1.22, cupy, jax), zero-copy: the capsule is renamed to
 *       "used_dltensor", the producer's deleter runs after the call, and
 *       the object is referenced for the call; CUDA producers get the
 *       consumer stream (see _set_dlpack_stream);
 *     - the GIL is released inside every C call (module option threads);
 *     - opaque handles (contexts, layers, communicators, projectors, flce
 *       and mlp handles) are osftrt.capi.Handle objects: close(), context
 *       manager, a finalizer as a backstop; a closed handle raises
 *       osftrt.InvalidHandle, never reaches the library; a handle another
 *       handle depends on (a layer used by an MLP) cannot be closed first;
 *     - out-parameters become return values; arrays (QR lists, shard
 *       counts) take Python sequences; host callbacks (log sink, the
 *       communicator of a framework) take Python callables/objects;
 *     - the calls that load the CUDA module (a CUDA context or device
 *       count, the NCCL functions) first preload PyTorch's CUDA libraries
 *       (osftrt/_cudalibs.py), once.
 *
 * Go uses this file too (its own typemaps go in an #ifdef SWIGGO section).
 */
#ifdef SWIGPYTHON
%module(threads="1", package="osftrt") capi
#else
%module osftrt
#endif

%{
#include <stdlib.h>
#include <string.h>
#include <osftrt/osftrt.h>
%}

%include <stdint.i>
%include <typemaps.i>

/* ------------------------------------------------------------------------ */
/* Common: struct constructors that run the *_init, and the INIT macros.    */
/* ------------------------------------------------------------------------ */

%define OSFTRT_INIT_STRUCT(TAG, TYPE, INITFN, MACRO)
%extend TAG {
  TAG() {
    TYPE *p = (TYPE *)calloc(1, sizeof(TYPE));
    if (p) INITFN(p, sizeof(TYPE));
    return p;
  }
  ~TAG() { free($self); }
}
%{
static osft_status_t osftrt_swig_##INITFN(TYPE *p) { return MACRO(p); }
%}
%rename(MACRO) osftrt_swig_##INITFN;
osft_status_t osftrt_swig_##INITFN(TYPE *p);
%enddef

OSFTRT_INIT_STRUCT(osft_allocator_s, osft_allocator_t, osft_allocator_init, OSFT_ALLOCATOR_INIT)
OSFTRT_INIT_STRUCT(osft_context_options_s, osft_context_options_t, osft_context_options_init, OSFT_CONTEXT_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_comm_options_s, osft_comm_options_t, osft_comm_options_init, OSFT_COMM_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_comm_callbacks_s, osft_comm_callbacks_t, osft_comm_callbacks_init, OSFT_COMM_CALLBACKS_INIT)
OSFTRT_INIT_STRUCT(osft_flce_options_s, osft_flce_options_t, osft_flce_options_init, OSFT_FLCE_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_flce_inputs_s, osft_flce_inputs_t, osft_flce_inputs_init, OSFT_FLCE_INPUTS_INIT)
OSFTRT_INIT_STRUCT(osft_flce_outputs_s, osft_flce_outputs_t, osft_flce_outputs_init, OSFT_FLCE_OUTPUTS_INIT)
OSFTRT_INIT_STRUCT(osft_flinear_options_s, osft_flinear_options_t, osft_flinear_options_init, OSFT_FLINEAR_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_flinear_factors_s, osft_flinear_factors_t, osft_flinear_factors_init, OSFT_FLINEAR_FACTORS_INIT)
OSFTRT_INIT_STRUCT(osft_flinear_grads_s, osft_flinear_grads_t, osft_flinear_grads_init, OSFT_FLINEAR_GRADS_INIT)
OSFTRT_INIT_STRUCT(osft_mlp_weights_s, osft_mlp_weights_t, osft_mlp_weights_init, OSFT_MLP_WEIGHTS_INIT)
OSFTRT_INIT_STRUCT(osft_mlp_options_s, osft_mlp_options_t, osft_mlp_options_init, OSFT_MLP_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_mlp_grads_s, osft_mlp_grads_t, osft_mlp_grads_init, OSFT_MLP_GRADS_INIT)
OSFTRT_INIT_STRUCT(osft_projector_options_s, osft_projector_options_t, osft_projector_options_init, OSFT_PROJECTOR_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_projection_target_s, osft_projection_target_t, osft_projection_target_init, OSFT_PROJECTION_TARGET_INIT)
OSFTRT_INIT_STRUCT(osft_qr_options_s, osft_qr_options_t, osft_qr_options_init, OSFT_QR_OPTIONS_INIT)
OSFTRT_INIT_STRUCT(osft_memory_stats_s, osft_memory_stats_t, osft_memory_stats_init, OSFT_MEMORY_STATS_INIT)
OSFTRT_INIT_STRUCT(osft_comm_stats_s, osft_comm_stats_t, osft_comm_stats_init, OSFT_COMM_STATS_INIT)
OSFTRT_INIT_STRUCT(osft_flce_plan_s, osft_flce_plan_t, osft_flce_plan_init, OSFT_FLCE_PLAN_INIT)
OSFTRT_INIT_STRUCT(osft_projector_info_s, osft_projector_info_t, osft_projector_info_init, OSFT_PROJECTOR_INFO_INIT)
OSFTRT_INIT_STRUCT(osft_flinear_info_s, osft_flinear_info_t, osft_flinear_info_init, OSFT_FLINEAR_INFO_INIT)
OSFTRT_INIT_STRUCT(osft_mlp_plan_s, osft_mlp_plan_t, osft_mlp_plan_init, OSFT_MLP_PLAN_INIT)

/* ------------------------------------------------------------------------ */
/* Python                                                                   */
/* ------------------------------------------------------------------------ */
#ifdef SWIGPYTHON

%begin %{
#define PY_SSIZE_T_CLEAN
%}

%{
#include <structmember.h>

/* --- exceptions ---------------------------------------------------------- */
static PyObject *osftpy_error_base = NULL;  /* osftrt.Error */
static PyObject *osftpy_error_map = NULL;   /* dict status -> class */

static void osftpy_raise_msg(int status, const char *msg) {
  PyObject *cls = NULL;
  if (osftpy_error_map) {
    PyObject *key = PyLong_FromLong(status);
    cls = key ? PyDict_GetItem(osftpy_error_map, key) : NULL; /* borrowed */
    Py_XDECREF(key);
  }
  if (!cls) cls = osftpy_error_base ? osftpy_error_base : PyExc_RuntimeError;
  PyObject *inst = PyObject_CallFunction(cls, "is", status, msg ? msg : "");
  if (inst) {
    PyErr_SetObject((PyObject *)Py_TYPE(inst), inst);
    Py_DECREF(inst);
  }
}
static void osftpy_raise(osft_status_t status) { osftpy_raise_msg((int)status, osft_last_error()); }

/* --- the consumer stream passed to CUDA producers' __dlpack__ ----------- */
static _Thread_local long long osftpy_dlpack_stream = 0; /* 0: legacy default (1) */

/* --- DLPack import -------------------------------------------------------- */
typedef struct {
  DLManagedTensor *managed; /* to hand back to the producer's deleter */
  PyObject *capsule;
} osftpy_import_t;

static void osftpy_import_release(osftpy_import_t *im) {
  if (im->managed && im->managed->deleter) im->managed->deleter(im->managed);
  im->managed = NULL;
  Py_CLEAR(im->capsule);
}

/* torch's Tensor.__dlpack__ is Python code that costs several microseconds
 * per call; for CPU tensors (and any dtype the library takes: no conj or
 * neg bits, which only complex tensors carry) torch._C._to_dlpack gives the
 * same capsule. CUDA tensors go through __dlpack__(stream=...), which orders
 * the producer's stream before ours. Returns a new capsule, or NULL (with no
 * error set) when the fast path does not apply. */
static PyObject *osftpy_torch_tensor_type = NULL, *osftpy_torch_to_dlpack = NULL;
static PyObject *osftpy_torch_fast_export(PyObject *obj) {
  if (!osftpy_torch_tensor_type) {
    PyObject *mods = PyImport_GetModuleDict(); /* borrowed */
    PyObject *t = mods ? PyDict_GetItemString(mods, "torch") : NULL;
    PyObject *c = mods ? PyDict_GetItemString(mods, "torch._C") : NULL;
    if (!t || !c) return NULL;
    PyObject *tt = PyObject_GetAttrString(t, "Tensor");
    PyObject *fn = PyObject_GetAttrString(c, "_to_dlpack");
    if (!tt || !fn || !PyType_Check(tt)) {
      Py_XDECREF(tt);
      Py_XDECREF(fn);
      PyErr_Clear();
      return NULL;
    }
    osftpy_torch_tensor_type = tt;
    osftpy_torch_to_dlpack = fn;
  }
  if (!PyObject_TypeCheck(obj, (PyTypeObject *)osftpy_torch_tensor_type)) return NULL;
  PyObject *cap = PyObject_CallOneArg(osftpy_torch_to_dlpack, obj);
  if (!cap) {
    PyErr_Clear();
    return NULL;
  }
  DLManagedTensor *m = PyCapsule_IsValid(cap, "dltensor") ? (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor") : NULL;
  if (!m || (m->dl_tensor.device.device_type != kDLCPU && m->dl_tensor.device.device_type != kDLCUDAHost)) {
    Py_DECREF(cap); /* the capsule's destructor hands it back to torch */
    PyErr_Clear();
    return NULL;
  }
  return cap;
}

/* Imports `obj` (an object with __dlpack__, or a "dltensor" capsule):
 * returns the DLTensor, or NULL with a Python exception set. */
static DLTensor *osftpy_import(PyObject *obj, osftpy_import_t *im, const char *what) {
  PyObject *cap = NULL;
  im->managed = NULL;
  im->capsule = NULL;
  if (PyCapsule_CheckExact(obj)) {
    Py_INCREF(obj);
    cap = obj;
  } else if ((cap = osftpy_torch_fast_export(obj)) != NULL) {
    /* a CPU torch tensor, exported without the Python-level __dlpack__ */
  } else if (PyErr_Occurred()) {
    return NULL;
  } else {
    PyObject *fn = PyObject_GetAttrString(obj, "__dlpack__");
    if (!fn) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: expected an object with __dlpack__ (a torch tensor, a numpy array, ...), got %s",
                   what, Py_TYPE(obj)->tp_name);
      return NULL;
    }
    int devtype = 1;
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (dev && PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) >= 1) devtype = (int)PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
    Py_XDECREF(dev);
    PyErr_Clear();
    if (devtype == kDLCUDA || devtype == kDLCUDAManaged) {
      PyObject *kw = Py_BuildValue("{s:L}", "stream", osftpy_dlpack_stream ? osftpy_dlpack_stream : 1LL);
      PyObject *noargs = PyTuple_New(0);
      cap = (kw && noargs) ? PyObject_Call(fn, noargs, kw) : NULL;
      Py_XDECREF(kw);
      Py_XDECREF(noargs);
    } else {
      cap = PyObject_CallNoArgs(fn);
    }
    Py_DECREF(fn);
    if (!cap && (PyErr_ExceptionMatches(PyExc_RuntimeError) || PyErr_ExceptionMatches(PyExc_BufferError)) &&
        PyObject_HasAttrString(obj, "detach")) {
      /* torch refuses to export a tensor that requires grad (RuntimeError in
       * 1.13, BufferError in 2.x): export its detached alias (same storage). */
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyObject *det = PyObject_CallMethod(obj, "detach", NULL);
      if (det) {
        cap = PyObject_CallMethod(det, "__dlpack__", NULL);
        Py_DECREF(det);
      }
      if (cap) {
        Py_XDECREF(t); Py_XDECREF(v); Py_XDECREF(tb);
      } else {
        PyErr_Clear();
        PyErr_Restore(t, v, tb);
      }
    }
    if (!cap) {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyErr_Format(PyExc_TypeError, "%s: __dlpack__ failed: %S", what, v ? v : Py_None);
      Py_XDECREF(t); Py_XDECREF(v); Py_XDECREF(tb);
      return NULL;
    }
  }
  if (!PyCapsule_IsValid(cap, "dltensor")) {
    Py_DECREF(cap);
    PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return an unused \"dltensor\" capsule", what);
    return NULL;
  }
  DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
  if (!m || PyCapsule_SetName(cap, "used_dltensor") != 0) {
    Py_DECREF(cap);
    return NULL;
  }
  im->managed = m;
  im->capsule = cap;
  return &m->dl_tensor;
}

/* --- TensorRef: a persistent import, for struct fields ------------------- */
typedef struct {
  PyObject_HEAD
  osftpy_import_t im;
  PyObject *source; /* the producer object, kept alive */
} osftpy_TensorRef;

static int osftpy_TensorRef_init(osftpy_TensorRef *self, PyObject *args, PyObject *kw) {
  PyObject *obj;
  if (!PyArg_ParseTuple(args, "O", &obj)) return -1;
  osftpy_import_release(&self->im);
  Py_CLEAR(self->source);
  if (!osftpy_import(obj, &self->im, "TensorRef")) return -1;
  Py_INCREF(obj);
  self->source = obj;
  return 0;
}
static DLTensor *osftpy_tensorref_tensor(PyObject *o) {
  osftpy_TensorRef *r = (osftpy_TensorRef *)o;
  return r->im.managed ? &r->im.managed->dl_tensor : NULL;
}
static void osftpy_TensorRef_dealloc(osftpy_TensorRef *self) {
  osftpy_import_release(&self->im);
  Py_CLEAR(self->source);
  Py_TYPE(self)->tp_free((PyObject *)self);
}
static PyObject *osftpy_TensorRef_source(osftpy_TensorRef *self, void *c) {
  PyObject *s = self->source ? self->source : Py_None;
  Py_INCREF(s);
  return s;
}
static PyGetSetDef osftpy_TensorRef_getset[] = {
    {"source", (getter)osftpy_TensorRef_source, NULL, "the object the tensor came from", NULL},
    {NULL}};
static PyTypeObject osftpy_TensorRef_Type = {PyVarObject_HEAD_INIT(NULL, 0)};

/* --- DLView: a library-owned tensor exported through __dlpack__ ---------- */
typedef struct osftpy_Handle osftpy_Handle;
typedef struct {
  PyObject_HEAD
  DLTensor t;
  int64_t shape[8], strides[8];
  PyObject *owner; /* a Handle (users counted) or NULL */
  int valid;
} osftpy_DLView;
static PyTypeObject osftpy_DLView_Type = {PyVarObject_HEAD_INIT(NULL, 0)};

typedef struct {
  DLManagedTensor m;
  int64_t shape[8], strides[8];
  PyObject *view;
} osftpy_export_t;

static void osftpy_export_deleter(DLManagedTensor *m) {
  osftpy_export_t *e = (osftpy_export_t *)m;
  PyGILState_STATE g = PyGILState_Ensure();
  Py_XDECREF(e->view);
  PyGILState_Release(g);
  free(e);
}
static void osftpy_capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {
    DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
  }
}
static PyObject *osftpy_DLView_dlpack(osftpy_DLView *self, PyObject *args, PyObject *kw) {
  if (!self->valid) {
    osftpy_raise_msg(OSFT_STATUS_INVALID_HANDLE, "this tensor view is no longer valid (its buffer was only lent for a callback)");
    return NULL;
  }
  osftpy_export_t *e = (osftpy_export_t *)calloc(1, sizeof(osftpy_export_t));
  if (!e) return PyErr_NoMemory();
  e->m.dl_tensor = self->t;
  memcpy(e->shape, self->shape, sizeof e->shape);
  memcpy(e->strides, self->strides, sizeof e->strides);
  e->m.dl_tensor.shape = e->shape;
  e->m.dl_tensor.strides = self->t.strides ? e->strides : NULL;
  e->m.manager_ctx = e;
  e->m.deleter = osftpy_export_deleter;
  Py_INCREF(self);
  e->view = (PyObject *)self;
  PyObject *cap = PyCapsule_New(&e->m, "dltensor", osftpy_capsule_destructor);
  if (!cap) {
    Py_DECREF(self);
    free(e);
  }
  return cap;
}
static PyObject *osftpy_DLView_device(osftpy_DLView *self, PyObject *noargs) {
  return Py_BuildValue("(ii)", (int)self->t.device.device_type, (int)self->t.device.device_id);
}
static PyObject *osftpy_DLView_shape(osftpy_DLView *self, void *c) {
  PyObject *s = PyTuple_New(self->t.ndim);
  for (int i = 0; s && i < self->t.ndim; ++i) PyTuple_SET_ITEM(s, i, PyLong_FromLongLong(self->shape[i]));
  return s;
}
static PyObject *osftpy_DLView_dtype(osftpy_DLView *self, void *c) {
  return Py_BuildValue("(iii)", (int)self->t.dtype.code, (int)self->t.dtype.bits, (int)self->t.dtype.lanes);
}
static PyObject *osftpy_DLView_data(osftpy_DLView *self, void *c) {
  return PyLong_FromVoidPtr((char *)self->t.data + self->t.byte_offset);
}
static PyMethodDef osftpy_DLView_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))osftpy_DLView_dlpack, METH_VARARGS | METH_KEYWORDS, "DLPack export (zero-copy)"},
    {"__dlpack_device__", (PyCFunction)osftpy_DLView_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL}};
static PyGetSetDef osftpy_DLView_getset[] = {
    {"shape", (getter)osftpy_DLView_shape, NULL, NULL, NULL},
    {"dtype", (getter)osftpy_DLView_dtype, NULL, "(code, bits, lanes)", NULL},
    {"data_ptr", (getter)osftpy_DLView_data, NULL, NULL, NULL},
    {NULL}};

static void osftpy_handle_unuse(PyObject *h);
static void osftpy_handle_use(PyObject *h);

static void osftpy_DLView_dealloc(osftpy_DLView *self) {
  if (self->owner) osftpy_handle_unuse(self->owner);
  Py_CLEAR(self->owner);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *osftpy_view_new(const DLTensor *t, PyObject *owner) {
  if (t->ndim > 8) {
    PyErr_SetString(PyExc_ValueError, "tensor of more than 8 dimensions");
    return NULL;
  }
  osftpy_DLView *v = PyObject_New(osftpy_DLView, &osftpy_DLView_Type);
  if (!v) return NULL;
  v->t = *t;
  for (int i = 0; i < t->ndim; ++i) {
    v->shape[i] = t->shape[i];
    v->strides[i] = t->strides ? t->strides[i] : 0;
  }
  v->t.shape = v->shape;
  v->t.strides = t->strides ? v->strides : NULL;
  v->valid = 1;
  v->owner = owner;
  if (owner) {
    Py_INCREF(owner);
    osftpy_handle_use(owner);
  }
  return (PyObject *)v;
}

/* --- Handle ---------------------------------------------------------------- */
enum { OSFTPY_CONTEXT = 0, OSFTPY_FLINEAR, OSFTPY_COMM, OSFTPY_PROJECTOR, OSFTPY_FLCE, OSFTPY_MLP, OSFTPY_KINDS };
static const char *osftpy_kind_names[] = {"context", "flinear", "comm", "projector", "flce", "mlp"};

static osft_status_t osftpy_destroy(int kind, void *p) {
  switch (kind) {
    case OSFTPY_CONTEXT: return osft_context_destroy((osft_context_t)p);
    case OSFTPY_FLINEAR: return osft_flinear_destroy((osft_flinear_t)p);
    case OSFTPY_COMM: return osft_comm_destroy((osft_comm_t)p);
    case OSFTPY_PROJECTOR: return osft_projector_destroy((osft_projector_t)p);
    case OSFTPY_FLCE: return osft_flce_destroy((osft_flce_t)p);
    case OSFTPY_MLP: return osft_mlp_destroy((osft_mlp_t)p);
  }
  return OSFT_STATUS_INTERNAL_ERROR;
}

struct osftpy_Handle {
  PyObject_HEAD
  void *ptr;
  int kind;
  int owned;
  Py_ssize_t users; /* handles and views that depend on this one */
  Py_ssize_t busy;  /* calls in flight */
  PyObject *parents; /* list of Handles this one uses (their users counted) */
  PyObject *keep;    /* dict: objects whose memory the library borrows */
  PyObject *weakrefs;
};
static PyTypeObject osftpy_Handle_Type = {PyVarObject_HEAD_INIT(NULL, 0)};

static void osftpy_handle_use(PyObject *h) {
  if (Py_TYPE(h) == &osftpy_Handle_Type) ((osftpy_Handle *)h)->users++;
}
static void osftpy_handle_unuse(PyObject *h) {
  if (Py_TYPE(h) == &osftpy_Handle_Type) ((osftpy_Handle *)h)->users--;
}

static void osftpy_handle_drop_deps(osftpy_Handle *h) {
  if (h->parents) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(h->parents); ++i) osftpy_handle_unuse(PyList_GET_ITEM(h->parents, i));
  }
  Py_CLEAR(h->parents);
  Py_CLEAR(h->keep);
}

static int osftpy_handle_add_parent(osftpy_Handle *h, PyObject *p) {
  if (Py_TYPE(p) != &osftpy_Handle_Type || p == (PyObject *)h) return 0;
  if (!h->parents && !(h->parents = PyList_New(0))) return -1;
  if (PyList_Append(h->parents, p) != 0) return -1;
  osftpy_handle_use(p);
  return 0;
}

/* Keeps `obj` alive under `key`, replacing what was kept there. Handles found
 * in it (directly or in a struct's _refs) become parents. */
static int osftpy_handle_keep(osftpy_Handle *h, PyObject *key, PyObject *obj) {
  if (!obj || obj == Py_None) return 0;
  if (Py_TYPE(obj) == &osftpy_Handle_Type) return osftpy_handle_add_parent(h, obj);
  PyObject *refs = PyObject_GetAttrString(obj, "_refs");
  if (!refs) {
    PyErr_Clear();
  } else {
    if (PyDict_Check(refs)) {
      PyObject *k, *v;
      Py_ssize_t pos = 0;
      while (PyDict_Next(refs, &pos, &k, &v))
        if (Py_TYPE(v) == &osftpy_Handle_Type && osftpy_handle_add_parent(h, v) != 0) {
          Py_DECREF(refs);
          return -1;
        }
      /* a snapshot: later assignments to the struct do not drop these */
      PyObject *snap = PyDict_Copy(refs);
      Py_DECREF(refs);
      if (!snap) return -1;
      obj = snap;
    } else {
      Py_DECREF(refs);
      Py_INCREF(obj);
    }
  }
  if (!refs) Py_INCREF(obj);
  if (!h->keep && !(h->keep = PyDict_New())) {
    Py_DECREF(obj);
    return -1;
  }
  int rc = PyDict_SetItem(h->keep, key, obj);
  Py_DECREF(obj);
  return rc;
}

static PyObject *osftpy_handle_new(int kind, void *ptr, int owned) {
  osftpy_Handle *h = PyObject_GC_New(osftpy_Handle, &osftpy_Handle_Type);
  if (!h) return NULL;
  h->ptr = ptr;
  h->kind = kind;
  h->owned = owned;
  h->users = 0;
  h->busy = 0;
  h->parents = NULL;
  h->keep = NULL;
  h->weakrefs = NULL;
  PyObject_GC_Track((PyObject *)h);
  return (PyObject *)h;
}

/* The argument conversion of a handle: NULL for None, the pointer of a live
 * handle of the right kind; raises for a closed one or a wrong type. */
static int osftpy_handle_arg(PyObject *obj, int kind, void **out, osftpy_Handle **box, int destroying) {
  *box = NULL;
  if (obj == Py_None) {
    *out = NULL;
    return 0;
  }
  if (Py_TYPE(obj) != &osftpy_Handle_Type || ((osftpy_Handle *)obj)->kind != kind) {
    PyErr_Format(PyExc_TypeError, "expected a %s handle, got %s", osftpy_kind_names[kind], Py_TYPE(obj)->tp_name);
    return -1;
  }
  osftpy_Handle *h = (osftpy_Handle *)obj;
  if (!h->ptr) {
    char msg[128];
    snprintf(msg, sizeof msg, "this %s handle is closed", osftpy_kind_names[kind]);
    osftpy_raise_msg(OSFT_STATUS_INVALID_HANDLE, msg);
    return -1;
  }
  if (destroying && (h->users > 0 || h->busy > 0)) {
    char msg[160];
    snprintf(msg, sizeof msg, "this %s handle is still in use (%zd dependent handles or views, %zd calls)",
             osftpy_kind_names[kind], h->users, h->busy);
    osftpy_raise_msg(OSFT_STATUS_INVALID_ARGUMENT, msg);
    return -1;
  }
  h->busy++;
  *box = h;
  *out = h->ptr;
  return 0;
}

static PyObject *osftpy_Handle_close(osftpy_Handle *self, PyObject *noargs) {
  if (!self->ptr) Py_RETURN_NONE;
  if (self->owned) {
    if (self->users > 0 || self->busy > 0) {
      char msg[160];
      snprintf(msg, sizeof msg, "this %s handle is still in use (%zd dependent handles or views, %zd calls)",
               osftpy_kind_names[self->kind], self->users, self->busy);
      osftpy_raise_msg(OSFT_STATUS_INVALID_ARGUMENT, msg);
      return NULL;
    }
    osft_status_t st;
    void *p = self->ptr;
    Py_BEGIN_ALLOW_THREADS st = osftpy_destroy(self->kind, p);
    Py_END_ALLOW_THREADS
    if (st != OSFT_STATUS_SUCCESS) {
      osftpy_raise(st);
      return NULL;
    }
  }
  self->ptr = NULL;
  osftpy_handle_drop_deps(self);
  Py_RETURN_NONE;
}
static PyObject *osftpy_Handle_enter(PyObject *self, PyObject *noargs) {
  Py_INCREF(self);
  return self;
}
static PyObject *osftpy_Handle_exit(osftpy_Handle *self, PyObject *args) {
  PyObject *r = osftpy_Handle_close(self, NULL);
  if (!r) return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}
static PyObject *osftpy_Handle_keep_method(osftpy_Handle *self, PyObject *args) {
  PyObject *key, *obj;
  if (!PyArg_ParseTuple(args, "OO", &key, &obj)) return NULL;
  if (osftpy_handle_keep(self, key, obj) != 0) return NULL;
  Py_RETURN_NONE;
}
static PyObject *osftpy_Handle_closed(osftpy_Handle *self, void *c) { return PyBool_FromLong(self->ptr == NULL); }
static PyObject *osftpy_Handle_kind(osftpy_Handle *self, void *c) { return PyUnicode_FromString(osftpy_kind_names[self->kind]); }
static PyObject *osftpy_Handle_address(osftpy_Handle *self, void *c) { return PyLong_FromVoidPtr(self->ptr); }
static PyObject *osftpy_Handle_users(osftpy_Handle *self, void *c) { return PyLong_FromSsize_t(self->users); }
static PyObject *osftpy_Handle_repr(osftpy_Handle *self) {
  return PyUnicode_FromFormat("<osftrt %s handle %p%s>", osftpy_kind_names[self->kind], self->ptr, self->ptr ? "" : " (closed)");
}
static int osftpy_Handle_traverse(osftpy_Handle *self, visitproc visit, void *arg) {
  Py_VISIT(self->parents);
  Py_VISIT(self->keep);
  return 0;
}
static void osftpy_Handle_finalize(osftpy_Handle *self) {
  /* the backstop: destroy what the program did not close */
  if (self->ptr && self->owned) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    (void)osftpy_destroy(self->kind, self->ptr);
    PyErr_Restore(t, v, tb);
  }
  self->ptr = NULL;
}
static int osftpy_Handle_clear(osftpy_Handle *self) {
  /* called on cycles only: destroy first, while parents are still alive */
  osftpy_Handle_finalize(self);
  osftpy_handle_drop_deps(self);
  return 0;
}
static void osftpy_Handle_dealloc(osftpy_Handle *self) {
  PyObject_GC_UnTrack((PyObject *)self);
  if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
  osftpy_Handle_finalize(self);
  osftpy_handle_drop_deps(self);
  PyObject_GC_Del(self);
}
static PyMethodDef osftpy_Handle_methods[] = {
    {"close", (PyCFunction)osftpy_Handle_close, METH_NOARGS, "destroy the handle (idempotent); raises while other handles use it"},
    {"__enter__", (PyCFunction)osftpy_Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)osftpy_Handle_exit, METH_VARARGS, NULL},
    {"keep", (PyCFunction)osftpy_Handle_keep_method, METH_VARARGS, "keep(key, obj): keep obj alive with the handle"},
    {NULL}};
static PyGetSetDef osftpy_Handle_getset[] = {
    {"closed", (getter)osftpy_Handle_closed, NULL, NULL, NULL},
    {"kind", (getter)osftpy_Handle_kind, NULL, NULL, NULL},
    {"address", (getter)osftpy_Handle_address, NULL, NULL, NULL},
    {"users", (getter)osftpy_Handle_users, NULL, NULL, NULL},
    {NULL}};

/* A new handle from a create call: its parents are the handles among the
 * call's arguments (and in their structs' _refs), and it keeps what the
 * structs reference (caller-owned factors, borrowed weights, callbacks). */
static PyObject *osftpy_handle_from_create(int kind, void *ptr, PyObject **argv, Py_ssize_t argc) {
  PyObject *h = osftpy_handle_new(kind, ptr, 1);
  if (!h) {
    osftpy_destroy(kind, ptr);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < argc; ++i) {
    PyObject *a = argv[i];
    if (!a || a == Py_None) continue;
    PyObject *key = PyUnicode_FromFormat("create_arg%zd", i);
    int rc = -1;
    if (key) {
      if (Py_TYPE(a) == &osftpy_Handle_Type) {
        rc = osftpy_handle_add_parent((osftpy_Handle *)h, a);
      } else if (PyObject_HasAttrString(a, "_refs") || PyObject_HasAttrString(a, "allreduce_sum")) {
        rc = osftpy_handle_keep((osftpy_Handle *)h, key, a);
      } else {
        rc = 0;
      }
    }
    Py_XDECREF(key);
    if (rc != 0) {
      Py_DECREF(h);
      return NULL;
    }
  }
  return h;
}

/* --- tensor lists (QR) ------------------------------------------------------ */
typedef struct {
  size_t n;
  DLTensor **t;
  osftpy_import_t *im;
} osftpy_list_t;

static void osftpy_list_release(osftpy_list_t *l) {
  if (l->im)
    for (size_t i = 0; i < l->n; ++i) osftpy_import_release(&l->im[i]);
  free(l->im);
  free(l->t);
  l->im = NULL;
  l->t = NULL;
  l->n = 0;
}
/* count < 0: any length. allow_none: entries may be None (NULL). */
static int osftpy_list_from(PyObject *seq, osftpy_list_t *l, Py_ssize_t count, int allow_none, const char *what) {
  l->n = 0;
  l->t = NULL;
  l->im = NULL;
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of tensors");
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (count >= 0 && n != count) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "%s: %zd entries, expected %zd", what, n, count);
    return -1;
  }
  l->t = (DLTensor **)calloc(n ? n : 1, sizeof(DLTensor *));
  l->im = (osftpy_import_t *)calloc(n ? n : 1, sizeof(osftpy_import_t));
  if (!l->t || !l->im) {
    Py_DECREF(fast);
    osftpy_list_release(l);
    PyErr_NoMemory();
    return -1;
  }
  l->n = (size_t)n;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
    if (o == Py_None && allow_none) continue;
    char name[64];
    snprintf(name, sizeof name, "%s[%zd]", what, i);
    if (!(l->t[i] = osftpy_import(o, &l->im[i], name))) {
      Py_DECREF(fast);
      osftpy_list_release(l);
      return -1;
    }
  }
  Py_DECREF(fast);
  return 0;
}

/* --- host callbacks: the log sink ---------------------------------------- */
static PyObject *osftpy_log_callable = NULL;
static void osftpy_log_trampoline(void *user, osft_log_level_t level, const char *message) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *r = PyObject_CallFunction((PyObject *)user, "is", (int)level, message);
  if (!r)
    PyErr_WriteUnraisable((PyObject *)user);
  else
    Py_DECREF(r);
  PyGILState_Release(g);
}

/* --- host callbacks: a framework's communicator --------------------------- */
static osft_status_t osftpy_comm_status(PyObject *r) {
  osft_status_t st = OSFT_STATUS_SUCCESS;
  if (!r) {
    st = PyErr_ExceptionMatches(PyExc_TimeoutError) ? OSFT_STATUS_TIMEOUT : OSFT_STATUS_COMM_ERROR;
    PyErr_WriteUnraisable(NULL);
  } else {
    if (PyLong_Check(r)) st = (osft_status_t)PyLong_AsLong(r);
    Py_DECREF(r);
  }
  return st;
}
static void osftpy_invalidate(PyObject *v) {
  if (v && Py_TYPE(v) == &osftpy_DLView_Type) ((osftpy_DLView *)v)->valid = 0;
}
static osft_status_t osftpy_cb_allreduce(void *user, DLTensor *buf) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *v = osftpy_view_new(buf, NULL);
  PyObject *r = v ? PyObject_CallMethod((PyObject *)user, "allreduce_sum", "O", v) : NULL;
  osftpy_invalidate(v);
  Py_XDECREF(v);
  osft_status_t st = osftpy_comm_status(r);
  PyGILState_Release(g);
  return st;
}
static osft_status_t osftpy_cb_allgather(void *user, const DLTensor *send, DLTensor *recv, const int64_t *counts,
                                         int64_t n_counts) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *s = osftpy_view_new(send, NULL);
  PyObject *rv = osftpy_view_new(recv, NULL);
  PyObject *c = PyTuple_New((Py_ssize_t)n_counts);
  for (int64_t i = 0; c && i < n_counts; ++i) PyTuple_SET_ITEM(c, i, PyLong_FromLongLong(counts[i]));
  PyObject *r = (s && rv && c) ? PyObject_CallMethod((PyObject *)user, "allgather", "OOO", s, rv, c) : NULL;
  osftpy_invalidate(s);
  osftpy_invalidate(rv);
  Py_XDECREF(s);
  Py_XDECREF(rv);
  Py_XDECREF(c);
  osft_status_t st = osftpy_comm_status(r);
  PyGILState_Release(g);
  return st;
}
static osft_status_t osftpy_cb_barrier(void *user) {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *r = PyObject_CallMethod((PyObject *)user, "barrier", NULL);
  osft_status_t st = osftpy_comm_status(r);
  PyGILState_Release(g);
  return st;
}
static void osftpy_cb_release(void *user) {
  PyGILState_STATE g = PyGILState_Ensure();
  Py_DECREF((PyObject *)user);
  PyGILState_Release(g);
}

/* --- host callbacks: a Python allocator ---------------------------------- */
static void *osftpy_call_alloc(PyObject *r) {
  void *p = NULL;
  if (!r) {
    PyErr_WriteUnraisable(NULL);
    return NULL;
  }
  if (r != Py_None) p = PyLong_AsVoidPtr(r);
  if (PyErr_Occurred()) {
    PyErr_WriteUnraisable(NULL);
    p = NULL;
  }
  Py_DECREF(r);
  return p;
}
static void osftpy_call_free(PyObject *r) {
  if (!r)
    PyErr_WriteUnraisable(NULL);
  else
    Py_DECREF(r);
}
static void *osftpy_host_alloc(void *user, size_t bytes, size_t alignment) {
  PyGILState_STATE g = PyGILState_Ensure();
  void *p = osftpy_call_alloc(PyObject_CallMethod((PyObject *)user, "host_alloc", "nn", (Py_ssize_t)bytes, (Py_ssize_t)alignment));
  PyGILState_Release(g);
  return p;
}
static void osftpy_host_free(void *user, void *ptr, size_t bytes) {
  PyGILState_STATE g = PyGILState_Ensure();
  osftpy_call_free(PyObject_CallMethod((PyObject *)user, "host_free", "Nn", PyLong_FromVoidPtr(ptr), (Py_ssize_t)bytes));
  PyGILState_Release(g);
}
static void *osftpy_device_alloc(void *user, size_t bytes, int device_id, void *stream) {
  PyGILState_STATE g = PyGILState_Ensure();
  void *p = osftpy_call_alloc(PyObject_CallMethod((PyObject *)user, "device_alloc", "niN", (Py_ssize_t)bytes, device_id,
                                                  PyLong_FromVoidPtr(stream)));
  PyGILState_Release(g);
  return p;
}
static void osftpy_device_free(void *user, void *ptr, size_t bytes, int device_id, void *stream) {
  PyGILState_STATE g = PyGILState_Ensure();
  osftpy_call_free(PyObject_CallMethod((PyObject *)user, "device_free", "NniN", PyLong_FromVoidPtr(ptr), (Py_ssize_t)bytes,
                                       device_id, PyLong_FromVoidPtr(stream)));
  PyGILState_Release(g);
}

/* --- module-level helpers --------------------------------------------------- */
static PyObject *osftpy_register_errors(PyObject *base, PyObject *map) {
  Py_XINCREF(base);
  Py_XINCREF(map);
  Py_XSETREF(osftpy_error_base, base);
  Py_XSETREF(osftpy_error_map, map);
  Py_RETURN_NONE;
}
%}

%init %{
  osftpy_Handle_Type.tp_name = "osftrt.capi.Handle";
  osftpy_Handle_Type.tp_basicsize = sizeof(osftpy_Handle);
  osftpy_Handle_Type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  osftpy_Handle_Type.tp_doc = "An opaque libosftrt handle: close(), a context manager, destroyed at the latest when collected.";
  osftpy_Handle_Type.tp_dealloc = (destructor)osftpy_Handle_dealloc;
  osftpy_Handle_Type.tp_traverse = (traverseproc)osftpy_Handle_traverse;
  osftpy_Handle_Type.tp_clear = (inquiry)osftpy_Handle_clear;
  osftpy_Handle_Type.tp_methods = osftpy_Handle_methods;
  osftpy_Handle_Type.tp_getset = osftpy_Handle_getset;
  osftpy_Handle_Type.tp_repr = (reprfunc)osftpy_Handle_repr;
  osftpy_Handle_Type.tp_weaklistoffset = offsetof(osftpy_Handle, weakrefs);
  osftpy_TensorRef_Type.tp_name = "osftrt.capi.TensorRef";
  osftpy_TensorRef_Type.tp_basicsize = sizeof(osftpy_TensorRef);
  osftpy_TensorRef_Type.tp_flags = Py_TPFLAGS_DEFAULT;
  osftpy_TensorRef_Type.tp_doc = "TensorRef(obj): obj imported through __dlpack__ (zero-copy) for as long as this object lives; for struct fields.";
  osftpy_TensorRef_Type.tp_new = PyType_GenericNew;
  osftpy_TensorRef_Type.tp_init = (initproc)osftpy_TensorRef_init;
  osftpy_TensorRef_Type.tp_dealloc = (destructor)osftpy_TensorRef_dealloc;
  osftpy_TensorRef_Type.tp_getset = osftpy_TensorRef_getset;
  osftpy_DLView_Type.tp_name = "osftrt.capi.DLView";
  osftpy_DLView_Type.tp_basicsize = sizeof(osftpy_DLView);
  osftpy_DLView_Type.tp_flags = Py_TPFLAGS_DEFAULT;
  osftpy_DLView_Type.tp_doc = "Library-owned memory exported through __dlpack__ (zero-copy).";
  osftpy_DLView_Type.tp_dealloc = (destructor)osftpy_DLView_dealloc;
  osftpy_DLView_Type.tp_methods = osftpy_DLView_methods;
  osftpy_DLView_Type.tp_getset = osftpy_DLView_getset;
  if (PyType_Ready(&osftpy_Handle_Type) < 0 || PyType_Ready(&osftpy_TensorRef_Type) < 0 ||
      PyType_Ready(&osftpy_DLView_Type) < 0)
    return NULL;
  Py_INCREF(&osftpy_Handle_Type);
  PyModule_AddObject(m, "Handle", (PyObject *)&osftpy_Handle_Type);
  Py_INCREF(&osftpy_TensorRef_Type);
  PyModule_AddObject(m, "TensorRef", (PyObject *)&osftpy_TensorRef_Type);
  Py_INCREF(&osftpy_DLView_Type);
  PyModule_AddObject(m, "DLView", (PyObject *)&osftpy_DLView_Type);
%}

/* Helpers that use the Python API keep the GIL. */
%nothread;
%inline %{
static PyObject *_register_errors(PyObject *base, PyObject *map) { return osftpy_register_errors(base, map); }
static void _set_dlpack_stream(long long stream) { osftpy_dlpack_stream = stream; }
static long long _get_dlpack_stream(void) { return osftpy_dlpack_stream; }
/* The version of the headers this module was compiled against. */
static unsigned _built_version(void) { return OSFT_VERSION_NUMBER; }
%}
/* An osft_allocator_t whose callbacks call obj.host_alloc(bytes, alignment)
 * -> int address (0 or None: failure), obj.host_free(address, bytes),
 * obj.device_alloc(bytes, device_id, stream), obj.device_free(address,
 * bytes, device_id, stream); a pair the object lacks stays NULL (built-in).
 * Use python_allocator(obj), which keeps obj alive with the struct. */
%newobject _python_allocator;
%inline %{
static osft_allocator_t *_python_allocator(PyObject *obj) {
  osft_allocator_t *a = (osft_allocator_t *)calloc(1, sizeof(osft_allocator_t));
  if (!a) return NULL;
  OSFT_ALLOCATOR_INIT(a);
  a->user = obj;
  if (PyObject_HasAttrString(obj, "host_alloc") && PyObject_HasAttrString(obj, "host_free")) {
    a->host_alloc = osftpy_host_alloc;
    a->host_free = osftpy_host_free;
  }
  if (PyObject_HasAttrString(obj, "device_alloc") && PyObject_HasAttrString(obj, "device_free")) {
    a->device_alloc = osftpy_device_alloc;
    a->device_free = osftpy_device_free;
  }
  return a;
}
%}
%thread;

/* Status results: None, or the exception of the status (after the argouts,
 * so per-matrix results of a partly failed call reach their lists). */
%typemap(out) osft_status_t "$result = SWIG_Py_Void();";
%typemap(ret) osft_status_t {
  if ($1 != OSFT_STATUS_SUCCESS) {
    Py_XDECREF($result);
    osftpy_raise($1);
    return NULL;
  }
}
/* osft_status_string() takes a status as an input: a plain int */
%typemap(in) osft_status_t status (int v) {
  v = (int)PyLong_AsLong($input);
  if (v == -1 && PyErr_Occurred()) SWIG_fail;
  $1 = (osft_status_t)v;
}

/* Tensors as arguments: anything with __dlpack__ (None: NULL), imported for
 * the call. Struct fields take TensorRef objects (the struct's __setattr__
 * makes them), which live as long as the struct references them. */
%define OSFTPY_TENSOR_TYPEMAPS(TYPE)
%typemap(in) TYPE (osftpy_import_t im = {NULL, NULL}) {
  if (sizeof("$symname") > 4 && strcmp("$symname" + sizeof("$symname") - 5, "_set") == 0) {
    if ($input == Py_None) {
      $1 = NULL;
    } else if (Py_TYPE($input) == &osftpy_TensorRef_Type) {
      $1 = osftpy_tensorref_tensor($input);
    } else {
      PyErr_SetString(PyExc_TypeError, "$symname: expected a TensorRef or None");
      SWIG_fail;
    }
  } else if ($input == Py_None) {
    $1 = NULL;
  } else if (!($1 = ($1_ltype)osftpy_import($input, &im, "$1_name"))) {
    SWIG_fail;
  }
}
%typemap(freearg) TYPE { osftpy_import_release(&im$argnum); }
%typemap(out) TYPE {
  $result = $1 ? osftpy_view_new($1, NULL) : SWIG_Py_Void();
}
%enddef
OSFTPY_TENSOR_TYPEMAPS(const DLTensor *)
OSFTPY_TENSOR_TYPEMAPS(DLTensor *)
%typemap(typecheck) const DLTensor *, DLTensor * "$1 = 1;";

/* osft_flinear_get_factor(layer, which) -> a DLView of the factor, which
 * keeps the layer from being closed while it (or a tensor made from it)
 * lives. */
%typemap(in, numinputs=0) DLTensor *view (DLTensor tmp) {
  memset(&tmp, 0, sizeof tmp);
  $1 = &tmp;
}
%typemap(freearg) DLTensor *view "";
%typemap(argout) DLTensor *view {
  if (result == OSFT_STATUS_SUCCESS) {
    PyObject *v = osftpy_view_new($1, swig_obj[0]);
    if (!v) SWIG_fail;
    $result = SWIG_Python_AppendOutput($result, v);
  }
}

/* Handles. */
%define OSFTPY_HANDLE(TYPE, KIND, DESTROY)
%typemap(in) TYPE (osftpy_Handle *box = NULL) {
  void *p = NULL;
  if (osftpy_handle_arg($input, KIND, &p, &box, strcmp("$symname", #DESTROY) == 0) != 0) SWIG_fail;
  $1 = (TYPE)p;
}
%typemap(freearg) TYPE {
  if (box$argnum) box$argnum->busy--;
}
%typemap(ret) osft_status_t DESTROY {
  if ($1 == OSFT_STATUS_SUCCESS && box1) {
    box1->ptr = NULL;
    osftpy_handle_drop_deps(box1);
  } else if ($1 != OSFT_STATUS_SUCCESS) {
    Py_XDECREF($result);
    osftpy_raise($1);
    return NULL;
  }
}
%typemap(typecheck) TYPE "$1 = 1;";
%typemap(in, numinputs=0) TYPE * (TYPE tmp = NULL) "$1 = &tmp;";
%typemap(argout) TYPE * {
  if (result == OSFT_STATUS_SUCCESS && tmp$argnum) {
    PyObject *h = osftpy_handle_from_create(KIND, (void *)tmp$argnum, swig_obj,
                                            (Py_ssize_t)(sizeof(swig_obj) / sizeof(swig_obj[0])));
    if (!h) SWIG_fail;
    $result = SWIG_Python_AppendOutput($result, h);
  }
}
/* struct fields of handle type (set: a Handle or None; get: a borrowed one) */
%typemap(memberin) TYPE "$1 = $input;";
%typemap(out) TYPE {
  $result = $1 ? osftpy_handle_new(KIND, (void *)$1, 0) : SWIG_Py_Void();
}
%enddef

OSFTPY_HANDLE(osft_context_t, OSFTPY_CONTEXT, osft_context_destroy)
OSFTPY_HANDLE(osft_flinear_t, OSFTPY_FLINEAR, osft_flinear_destroy)
OSFTPY_HANDLE(osft_comm_t, OSFTPY_COMM, osft_comm_destroy)
OSFTPY_HANDLE(osft_projector_t, OSFTPY_PROJECTOR, osft_projector_destroy)
OSFTPY_HANDLE(osft_flce_t, OSFTPY_FLCE, osft_flce_destroy)
OSFTPY_HANDLE(osft_mlp_t, OSFTPY_MLP, osft_mlp_destroy)

/* Projector registrations borrow tensors: keep them with the projector. */
%typemap(argout) (const osft_projection_target_t *target, int64_t *index) {
  if (result == OSFT_STATUS_SUCCESS) {
    PyObject *key = PyUnicode_FromFormat("target%lld", (long long)*$2);
    int rc = key ? osftpy_handle_keep((osftpy_Handle *)swig_obj[0], key, swig_obj[1]) : -1;
    Py_XDECREF(key);
    if (rc != 0) SWIG_fail;
    $result = SWIG_Python_AppendOutput($result, PyLong_FromLongLong(*$2));
  }
}
%typemap(in, numinputs=1) (const osft_projection_target_t *target, int64_t *index) (void *argp = NULL, int64_t idx = -1) {
  if (!SWIG_IsOK(SWIG_ConvertPtr($input, &argp, $1_descriptor, 0))) {
    PyErr_SetString(PyExc_TypeError, "target: expected an osft_projection_target_t");
    SWIG_fail;
  }
  $1 = ($1_ltype)argp;
  $2 = &idx;
}
/* add_layer(projector, layer, grad_u_low, grad_v_low) -> index;
 * set_grads(projector, index, grad_u_low, grad_v_low) */
%typemap(argout) (int64_t *index) {
  if (result == OSFT_STATUS_SUCCESS) {
    PyObject *key = PyUnicode_FromFormat("grads%lld", (long long)*$1);
    PyObject *pair = PyTuple_Pack(2, swig_obj[2], swig_obj[3]);
    int rc = (key && pair) ? osftpy_handle_keep((osftpy_Handle *)swig_obj[0], key, pair) : -1;
    if (rc == 0) rc = osftpy_handle_add_parent((osftpy_Handle *)swig_obj[0], swig_obj[1]);
    Py_XDECREF(key);
    Py_XDECREF(pair);
    if (rc != 0) SWIG_fail;
    $result = SWIG_Python_AppendOutput($result, PyLong_FromLongLong(*$1));
  }
}
%typemap(in, numinputs=0) (int64_t *index) (int64_t idx = -1) "$1 = &idx;";
%typemap(argout) int64_t index {
  if (result == OSFT_STATUS_SUCCESS) {
    PyObject *key = PyUnicode_FromFormat("grads%lld", (long long)$1);
    PyObject *pair = PyTuple_Pack(2, swig_obj[2], swig_obj[3]);
    int rc = (key && pair) ? osftpy_handle_keep((osftpy_Handle *)swig_obj[0], key, pair) : -1;
    Py_XDECREF(key);
    Py_XDECREF(pair);
    if (rc != 0) SWIG_fail;
  }
}

/* Tensor lists (QR): count and a from one sequence; q a sequence of as many
 * (or None: in place); r None or a sequence whose entries may be None;
 * per_matrix_status None or a list, filled in place (also when the call
 * raises NumericalError). */
%typemap(in) (size_t count, const DLTensor *const *a) (osftpy_list_t la = {0, NULL, NULL}) {
  if (osftpy_list_from($input, &la, -1, 0, "a") != 0) SWIG_fail;
  $1 = la.n;
  $2 = ($2_ltype)la.t;
}
%typemap(freearg) (size_t count, const DLTensor *const *a) { osftpy_list_release(&la$argnum); }
%typemap(in) DLTensor *const *q (osftpy_list_t lq = {0, NULL, NULL}) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (osftpy_list_from($input, &lq, (Py_ssize_t)arg3, 0, "q") != 0) SWIG_fail;
    $1 = lq.t;
  }
}
%typemap(freearg) DLTensor *const *q { osftpy_list_release(&lq$argnum); }
%typemap(in) DLTensor *const *r (osftpy_list_t lr = {0, NULL, NULL}) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (osftpy_list_from($input, &lr, (Py_ssize_t)arg3, 1, "r") != 0) SWIG_fail;
    $1 = lr.t;
  }
}
%typemap(freearg) DLTensor *const *r { osftpy_list_release(&lr$argnum); }
%typemap(in) osft_status_t *per_matrix_status (osft_status_t *st = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (!PyList_Check($input)) {
    PyErr_SetString(PyExc_TypeError, "per_matrix_status: expected a list or None");
    SWIG_fail;
  } else {
    st = (osft_status_t *)calloc(arg3 ? arg3 : 1, sizeof(osft_status_t));
    for (size_t i = 0; st && i < arg3; ++i) st[i] = (osft_status_t)-1;
    $1 = st;
  }
}
%typemap(argout) osft_status_t *per_matrix_status {
  if (st$argnum && (result == OSFT_STATUS_SUCCESS || result == OSFT_STATUS_NUMERICAL_ERROR)) {
    PyObject *l = PyList_New((Py_ssize_t)arg3);
    for (size_t i = 0; l && i < arg3; ++i) PyList_SET_ITEM(l, (Py_ssize_t)i, PyLong_FromLong((long)st$argnum[i]));
    if (!l || PyList_SetSlice($input, 0, PY_SSIZE_T_MAX, l) != 0) {
      Py_XDECREF(l);
      SWIG_fail;
    }
    Py_DECREF(l);
  }
}
%typemap(freearg) osft_status_t *per_matrix_status { free(st$argnum); }

/* osft_qr_options_t.rank_deficient (an int array the call writes): set
 * from Python as an address (an int, e.g. a contiguous int32 tensor's
 * data_ptr(), kept alive by the caller through the call) or None (NULL);
 * read back as an address. osftrt.batched_qr / power_iteration do this. */
%typemap(in) int *rank_deficient {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    void *p = PyLong_AsVoidPtr($input);
    if (p == NULL && PyErr_Occurred()) SWIG_fail;
    $1 = (int *)p;
  }
}
%typemap(out) int *rank_deficient {
  $result = $1 ? PyLong_FromVoidPtr((void *)$1) : (Py_INCREF(Py_None), Py_None);
}

/* All-gather counts: a sequence of ints. */
%typemap(in) (const int64_t *counts, int64_t n_counts) (int64_t *c = NULL) {
  PyObject *fast = PySequence_Fast($input, "counts: expected a sequence of ints");
  if (!fast) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  c = (int64_t *)calloc(n ? n : 1, sizeof(int64_t));
  for (Py_ssize_t i = 0; c && i < n; ++i) c[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
  Py_DECREF(fast);
  if (!c) { PyErr_NoMemory(); SWIG_fail; }
  if (PyErr_Occurred()) SWIG_fail;
  $1 = c;
  $2 = (int64_t)n;
}
%typemap(freearg) (const int64_t *counts, int64_t n_counts) { free(c$argnum); }

/* Shard arrays in struct fields: any buffer of int64 (the struct's
 * __setattr__ turns a list into an array('q') and keeps it). */
%typemap(in) const int64_t *u_shards, const int64_t *v_shards {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    Py_buffer view;
    if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
    int ok = view.itemsize == 8;
    $1 = (int64_t *)view.buf;
    PyBuffer_Release(&view);
    if (!ok) { PyErr_SetString(PyExc_TypeError, "shards: expected 64-bit integers"); SWIG_fail; }
  }
}
%typemap(out) const int64_t *u_shards, const int64_t *v_shards "$result = PyLong_FromVoidPtr((void *)$1);";

/* The log sink: a callable(level, message) or None. */
%typemap(in) (osft_log_callback_t callback, void *user) {
  if ($input == Py_None) {
    $1 = NULL;
    $2 = NULL;
  } else if (!PyCallable_Check($input)) {
    PyErr_SetString(PyExc_TypeError, "callback: expected a callable(level, message) or None");
    SWIG_fail;
  } else {
    $1 = osftpy_log_trampoline;
    $2 = (void *)$input;
  }
}
%typemap(argout) (osft_log_callback_t callback, void *user) {
  if (result == OSFT_STATUS_SUCCESS) {
    PyObject *old = osftpy_log_callable;
    osftpy_log_callable = $input == Py_None ? NULL : $input;
    Py_XINCREF(osftpy_log_callable);
    Py_XDECREF(old);
  }
}

/* A framework's communicator: an object with rank, size,
 * allreduce_sum(buf), allgather(send, recv, counts) and optionally
 * barrier(); buffers are DLViews valid for the call. An
 * osft_comm_callbacks_t struct is accepted as well. */
%typemap(in) const osft_comm_callbacks_t *callbacks (osft_comm_callbacks_t cb, PyObject *pyuser = NULL) {
  void *argp = NULL;
  if (SWIG_IsOK(SWIG_ConvertPtr($input, &argp, $1_descriptor, 0))) {
    $1 = ($1_ltype)argp;
  } else {
    OSFT_COMM_CALLBACKS_INIT(&cb);
    PyObject *rk = PyObject_GetAttrString($input, "rank");
    PyObject *sz = rk ? PyObject_GetAttrString($input, "size") : NULL;
    if (sz) {
      cb.rank = (int)PyLong_AsLong(rk);
      cb.size = (int)PyLong_AsLong(sz);
    }
    Py_XDECREF(rk);
    Py_XDECREF(sz);
    if (!sz || PyErr_Occurred()) SWIG_fail;
    cb.allreduce_sum = osftpy_cb_allreduce;
    cb.allgather = osftpy_cb_allgather;
    cb.barrier = PyObject_HasAttrString($input, "barrier") ? osftpy_cb_barrier : NULL;
    cb.release = osftpy_cb_release;
    Py_INCREF($input);
    pyuser = $input;
    cb.user = pyuser;
    $1 = &cb;
  }
}
%typemap(freearg) const osft_comm_callbacks_t *callbacks {
  /* the library calls release only for a communicator it created */
  if (pyuser$argnum && result != OSFT_STATUS_SUCCESS) Py_DECREF(pyuser$argnum);
}

/* void * (streams, NCCL communicators, user data): ints. */
%typemap(in) void * {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    $1 = PyLong_AsVoidPtr($input);
    if (PyErr_Occurred()) SWIG_fail;
  }
}
%typemap(out) void * "$result = $1 ? PyLong_FromVoidPtr($1) : SWIG_Py_Void();";
%typemap(in, numinputs=0) void **stream (void *tmp = NULL) "$1 = &tmp;";
%typemap(argout) void **stream {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(tmp$argnum));
}

/* Out-parameters become return values. */
%apply int *OUTPUT { int *count, int *device_id, int *rank, int *size, int *n };
%apply long long *OUTPUT { int64_t *out_features, int64_t *in_features, int64_t *frozen_rank, int64_t *trainable_rank,
                          int64_t *num_tiles, int64_t *tile_tokens };
%apply unsigned long long *OUTPUT { size_t *bytes };
%apply double *OUTPUT { double *max_u, double *max_v };
%apply int *OUTPUT { osft_device_type_t *type, osft_comm_engine_t *engine, osft_flinear_strategy_t *chosen };

/* An NCCL unique id travels as bytes. */
%extend osft_nccl_unique_id_s {
  PyObject *to_bytes() { return PyBytes_FromStringAndSize($self->internal, OSFT_NCCL_UNIQUE_ID_BYTES); }
  void from_bytes(PyObject *b) {
    char *buf;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &buf, &n) == 0 && n == OSFT_NCCL_UNIQUE_ID_BYTES)
      memcpy($self->internal, buf, OSFT_NCCL_UNIQUE_ID_BYTES);
    else
      PyErr_SetString(PyExc_ValueError, "expected 128 bytes");
  }
}
%feature("nothread") osft_nccl_unique_id_s::to_bytes;
%feature("nothread") osft_nccl_unique_id_s::from_bytes;

/* The requests that load libosftrt's CUDA module (the first CUDA context,
 * CUDA device query or NCCL communicator) first load, once, PyTorch's copies
 * of the CUDA libraries the module needs (osftrt/_cudalibs.py), so that the
 * module and PyTorch share one copy of each; `import osftrt` loads none. */
%pythoncode %{
def _before_cuda():
    from . import _cudalibs

    _cudalibs.before_cuda()
%}
%pythonprepend osft_context_create %{
    if opts is not None and opts.device_type == OSFT_DEVICE_CUDA:
        _before_cuda()
%}
%pythonprepend osft_comm_nccl_unique_id "_before_cuda()"
%pythonprepend osft_comm_create_nccl "_before_cuda()"
%pythonprepend osft_comm_create_nccl_from_id "_before_cuda()"

/* Structs whose fields borrow tensors, handles or arrays keep them alive:
 * tensors are imported once (TensorRef), lists become array('q'). */
%pythoncode %{
import array as _array

Handle = _capi.Handle
TensorRef = _capi.TensorRef
DLView = _capi.DLView


def python_allocator(obj):
    """An osft_allocator_t routing the library's memory to obj's host_alloc/
    host_free and/or device_alloc/device_free methods (see osftrt.i); the
    struct keeps obj alive."""
    a = _capi._python_allocator(obj)
    a._owner = obj
    return a


def _osftpy_struct_setattr(self, name, value):
    if name not in ("this", "thisown"):
        if value is not None and not isinstance(value, (int, float, str, TensorRef, Handle)):
            if name.endswith("_shards"):  # int64 arrays (lists, numpy arrays, array('q'))
                value = _array.array("q", [int(v) for v in value])
            elif hasattr(value, "__dlpack__"):
                value = TensorRef(value)
        refs = self.__dict__.setdefault("_refs", {})
        if value is None or isinstance(value, (int, float, str)):
            refs.pop(name, None)
        else:
            refs[name] = value
    object.__setattr__(self, name, value)
%}

%define OSFTPY_KEEPING_STRUCT(TAG)
%extend TAG {
%pythoncode %{
    __setattr__ = _osftpy_struct_setattr
%}
}
%enddef
OSFTPY_KEEPING_STRUCT(osft_context_options_s)
OSFTPY_KEEPING_STRUCT(osft_flce_options_s)
OSFTPY_KEEPING_STRUCT(osft_flce_inputs_s)
OSFTPY_KEEPING_STRUCT(osft_flce_outputs_s)
OSFTPY_KEEPING_STRUCT(osft_flinear_factors_s)
OSFTPY_KEEPING_STRUCT(osft_flinear_grads_s)
OSFTPY_KEEPING_STRUCT(osft_mlp_weights_s)
OSFTPY_KEEPING_STRUCT(osft_mlp_grads_s)
OSFTPY_KEEPING_STRUCT(osft_projection_target_s)

#endif /* SWIGPYTHON */

/* Go: handles as uintptr, cgo-checked Go memory, and the tensor-call
 * entries (bindings/go/swig/osftrt_go.i; swig -I bindings/go/swig). */
#ifdef SWIGGO
%include "osftrt_go.i"
#endif /* SWIGGO */

/* ------------------------------------------------------------------------ */
/* The API: the public headers themselves.                                  */
/* ------------------------------------------------------------------------ */
#define DLPACK_EXTERN_C
#define DLPACK_DLL
%include "dlpack/dlpack.h"
%include "osftrt/export.h"
%include "osftrt/status.h"
%include "osftrt/version.h"
%include "osftrt/log.h"
%include "osftrt/context.h"
%include "osftrt/comm.h"
%include "osftrt/flinear.h"
%include "osftrt/projection.h"
%include "osftrt/mlp.h"
%include "osftrt/flce.h"
%include "osftrt/qr.h"
