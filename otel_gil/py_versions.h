/* The CPython versions otel_gil's C parts tell apart, by name: the one place a
 * PY_VERSION_HEX is compared (as dd-trace-py's _pymacro.h). Test with #if NAME.
 */
#ifndef OTEL_GIL_PY_VERSIONS_H
#define OTEL_GIL_PY_VERSIONS_H

#include <Python.h>

/* Code objects keep their line table in co_linetable (before: co_lnotab). */
#define PY_3_10_OR_LATER (PY_VERSION_HEX >= 0x030A0000)
/* Instance attributes in the values of the type's shared keys (cpython_layouts.c reads them there). */
#define PY_3_11_ONLY (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)
/* Instance attributes behind a tagged dict-or-values pointer (cpython_layouts.c). */
#define PY_3_12_ONLY (PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000)
/* Instance attributes inline after the object, while their values are valid (cpython_layouts.c). */
#define PY_3_13_ONLY (PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000)
/* PyType_GetDict: static builtin types keep their dict per interpreter. */
#define PY_3_12_OR_LATER (PY_VERSION_HEX >= 0x030C0000)
/* PyObject_GetOptionalAttr (before: _PyObject_LookupAttr). */
#define PY_3_13_OR_LATER (PY_VERSION_HEX >= 0x030D0000)
/* PyContext_AddWatcher sees every context switch (before: Context.run, replaced in the type). */
#define PY_3_14_OR_LATER (PY_VERSION_HEX >= 0x030E0000)

/* What a module declares about the GIL (Py_mod_gil's values), for single-phase init: a call
 * on free-threaded builds, where an undeclared module turns the GIL on at import; nothing on
 * the others, which ignore it (0: no error). */
#ifdef Py_GIL_DISABLED
#define DECLARE_MODULE_GIL(module, value) PyUnstable_Module_SetGIL((module), (value))
#else
#define DECLARE_MODULE_GIL(module, value) 0
#endif

#endif
