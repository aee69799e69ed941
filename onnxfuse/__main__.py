"""``python -m onnxfuse``: the same as the ``onnxfuse`` command.

``python -m`` puts the current folder first on ``sys.path``. Run from the folder above a clone of this repository
(a folder named ``onnxfuse`` that holds the package in ``onnxfuse/onnxfuse``), Python imports that outer folder as
a namespace package ``onnxfuse`` (it has no ``__init__.py``) and, through an editable install's import hook, this
file from the installed package: a mix in which the package's ``__init__`` never ran (an ImportError naming
neither, or code running on a half-imported package). So before importing anything
else, a namespace ``onnxfuse`` is replaced by the package this file belongs to (the installed one). Without an
installed package Python stops before this file runs ("No module named onnxfuse.__main__"); README.md says to run
``python -m onnxfuse`` from the repository root or after installing.
"""

import importlib.util
import os
import sys
from types import FrameType


def _use_this_package() -> None:
    """Make ``sys.modules["onnxfuse"]`` the package in this file's folder when it is a namespace package."""
    found = sys.modules.get("onnxfuse")
    if found is None or getattr(found, "__file__", None) is not None:
        return  # a regular package: the one this file was found in
    for name in [m for m in sys.modules if m == "onnxfuse" or m.startswith("onnxfuse.")]:
        del sys.modules[name]
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("onnxfuse", os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    if spec is None or spec.loader is None:  # an existing .py file always has a spec and a loader
        raise ImportError(f"cannot load the onnxfuse package in {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["onnxfuse"] = module
    spec.loader.exec_module(module)


def _stop(signum: int, frame: FrameType | None) -> None:
    """Signal handler for SIGTERM and SIGHUP: raise :class:`onnxfuse.errors.Interrupted` in the main thread, as
    Python's own SIGINT handler raises KeyboardInterrupt. Termination signals that follow are ignored, so that they
    cannot cut short the clean-up the first one started."""
    import signal

    from onnxfuse.errors import Interrupted

    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """Handle SIGTERM (what CI runners, ``timeout`` and ``kill`` send) and SIGHUP (a closed terminal) like Ctrl-C:
    an exception that unwinds the stack, so temporary files are removed, then one line and exit ``128 + signum``.
    A signal the parent set to be ignored (``nohup``) stays ignored. Main thread only (``signal.signal``)."""
    import signal

    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _stop)


#: Allocations between two collections of the youngest generation in the ``onnxfuse`` process (Python's default
#: is 700): importing onnx and numpy and building a graph of thousands of nodes allocate hundreds of thousands of
#: objects, and each collection of the older generations walks all of them again.
GC_THRESHOLD0 = 10_000


def _collect_less_often() -> None:
    """Run the cyclic garbage collector less often in the command's own process (``gc.set_threshold``, the older
    generations' thresholds unchanged): on a 1400-node model it took 20-40 ms of a 1 s run at the default. Cycles
    are still collected; only the command's process is affected, not a program that imports the library."""
    import gc

    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, older, oldest)


def _leave_objects_to_exit() -> None:
    """``gc.freeze()`` once the command is done, just before the interpreter exits: its final collection then
    skips what the command made (the graphs of the model it wrote, tens of thousands of objects in reference
    cycles: 40-70 ms of exit on a 1400-node model), and the operating system takes the memory back. No clean-up
    waits for that collection: files are closed by ``with``, temporary folders are removed in ``finally`` blocks
    or by their ``weakref.finalize``, which runs at exit whether or not the collector frees the folder object."""
    import gc

    gc.freeze()


def run() -> None:
    """The ``onnxfuse`` command (the console script's entry point, and ``python -m onnxfuse``): install the
    SIGTERM/SIGHUP handlers, import the CLI (click; the library is imported by the command that runs), then run it.
    A Ctrl-C or SIGTERM during that import, before the CLI's own handling is in place, exits 130 or 143 with one
    line, as one later does. An exception that escapes the commands' own handling (``cli.exits.fail_cleanly``) exits 3
    with one line (``errors.internal_error_line``; ``ONNXFUSE_DEBUG=1`` keeps the traceback), never 1, the code for
    "the optimized model does not match"."""
    from onnxfuse.errors import EXIT_INTERNAL, debug_requested, internal_error_line, interrupted_exit

    install_signal_handlers()
    _collect_less_often()
    try:
        from onnxfuse.cli.main import main
    except KeyboardInterrupt as exc:
        message, code = interrupted_exit(exc, working=False)
        sys.stderr.write(message + "\n")
        sys.exit(code)
    try:
        main()
    except Exception as exc:
        if debug_requested():
            raise
        from onnxfuse.cli.exits import say

        say(internal_error_line(exc))
        sys.exit(EXIT_INTERNAL)
    finally:
        _leave_objects_to_exit()


if __name__ == "__main__":
    _use_this_package()
    run()
