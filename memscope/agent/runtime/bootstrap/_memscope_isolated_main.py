"""Run a script or module under ``python -I`` / ``-E`` / ``-S`` with memscope armed.

Those flags make Python ignore ``PYTHONPATH`` (or skip ``site``), so the ``sitecustomize``
bootstrap never runs. ``memscope attach`` then starts ``python -I THIS_FILE SCRIPT ARGS...``
(or ``... THIS_FILE -m MODULE ARGS...``): this file arms the agent as the bootstrap would, puts
``sys.argv`` and ``sys.path[0]`` back as ``python -I SCRIPT`` has them, and runs the script as
``__main__``. Standard library only until memscope is found; never breaks the user's command.
"""

import os
import runpy
import sys


def _arm() -> None:
    try:
        from memscope.agent.runtime import autostart
    except ImportError:
        where = os.environ.get("MEMSCOPE_PATH")
        if not where or os.environ.get("MEMSCOPE_PYTHON", "") != "%d.%d" % sys.version_info[:2]:
            return
        sys.path.append(where)  # at the end: the user's own modules come first
        try:
            from memscope.agent.runtime import autostart
        except ImportError:
            return
    try:
        autostart.install()
    except Exception as exc:  # never break the user's process
        sys.stderr.write("memscope: bootstrap failed: %s\n" % (exc,))


def _main() -> None:
    args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]  # this file's directory, which python -I SCRIPT would not have
    if args[:1] == ["-m"] and len(args) > 1:
        sys.argv[:] = args[1:]  # runpy puts the module's path in argv[0]
        if not getattr(sys.flags, "safe_path", False) and not sys.flags.isolated:
            sys.path.insert(0, os.getcwd())
        _arm()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv[:] = args
    if not getattr(sys.flags, "safe_path", False) and not sys.flags.isolated:
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    _arm()
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    _main()
