"""The private parts of kernels and transformers the package relies on, in one place: each says
what for, and the releases it was checked on (kernels 0.18.3 to 0.19.1, transformers 5.24 to
5.25). tests/test_internals.py fails with the part's name when a release changes one."""


def kernels_function(layer_type):
    """The function that `layer_type`, the class kernels' use_kernel_forward_from_hub makes of a
    function, wraps; None for any other class. kernels keeps it only in the closure of that class's
    forward (`func`), and a layer kernelize gives such a module must know the function it replaces:
    kernels maps layer names, and transformers gives functions of several variants one name."""
    forward = getattr(layer_type, "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None or "func" not in code.co_freevars or forward.__closure__ is None:
        return None
    function = forward.__closure__[code.co_freevars.index("func")].cell_contents
    return function if callable(function) else None
