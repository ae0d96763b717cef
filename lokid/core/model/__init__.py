"""The model file: the GGUF header probe (``modelinfo``, ``ggmltypes``, ``archs``), what
a file that is not GGUF most likely is (``notgguf``), what a model can do for a client
(``modeltraits``), and a model pulled from the hub: the preset key, the reference and the
pull's transient unit (``pulled``, ``pullref``, ``pullunit``, issue 48).

Who uses it: the planner (``lokid prestart``, ``lokid plan``), the daemon's pulls and its
model properties, the gateway's model list through :mod:`lokid.core.fleet`.
May import: :mod:`lokid.core.launch` (the flags that change what a model can do), and the
core's root modules.
"""
