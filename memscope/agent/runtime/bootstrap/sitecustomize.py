"""memscope's bootstrap, put first on PYTHONPATH by ``memscope attach``.

It arms the agent in this process, then runs the user's own ``sitecustomize`` (the next one on
``sys.path``), if there is one, so that keeps working.
"""

import os
import sys


def _memscope_arm() -> None:
    try:
        from memscope.agent.runtime import autostart
    except ImportError:
        # A Python that cannot import memscope (another interpreter in the command): use the
        # supervisor's copy only when it is the same Python version, else stay out of the way.
        where = os.environ.get("MEMSCOPE_PATH")
        wanted = os.environ.get("MEMSCOPE_PYTHON", "")
        if not where or wanted != "%d.%d" % sys.version_info[:2]:
            return
        sys.path.append(where)
        try:
            from memscope.agent.runtime import autostart
        except ImportError:
            return
    try:
        autostart.install()
    except Exception as exc:  # never break the user's process
        sys.stderr.write("memscope: bootstrap failed: %s\n" % (exc,))


def _memscope_chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_memscope_arm()
_memscope_chain()
