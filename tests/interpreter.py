"""Triton's interpreter (TRITON_INTERPRET=1), each launch's patches made once.

A launch patches triton.language's builtins with NumPy ones for the kernel's module (and restores
them when the launch ends); every device-function call inside it patches them again for the
callee's module, in every program: most of an interpreted test's time where the kernel calls its
helpers a few dozen times a program. Within one launch a second patch for the same module globals
sets what the first set, so install() lets only the first of each through.

This uses two private names of triton.runtime.interpreter, GridExecutor.__call__ (the launch) and
_patch_lang (the patch), checked on Triton 3.8 and 3.9. Where a release lacks them, install()
leaves the interpreter as it is: the tests run as before, only slower. The results are the same
either way; the interpreted tests check them.
"""

_launch: set | None = None  # ids of the module globals patched within the running launch


def install() -> bool:
    """Patch each module once per launch; whether this Triton has what that needs."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    names = ("GridExecutor", "_patch_lang", "_LangPatchScope")
    if not all(hasattr(interpreter, name) for name in names):
        return False
    launch, patch = interpreter.GridExecutor.__call__, interpreter._patch_lang
    if getattr(patch, "once_per_launch", False):  # installed already
        return True

    def launch_patching_once(self, *args, **kwargs):
        global _launch
        _launch = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launch = None

    def patch_once(fn):
        if _launch is not None:
            if id(fn.__globals__) in _launch:
                return interpreter._LangPatchScope()  # nothing to patch, nor to restore
            _launch.add(id(fn.__globals__))
        return patch(fn)

    patch_once.once_per_launch = True
    interpreter.GridExecutor.__call__ = launch_patching_once
    interpreter._patch_lang = patch_once
    return True
