"""memscope's bootstrap in a process it attaches to by pid (``memscope attach --pid``).

Not a module (its name has a hyphen): the pending call's thread reads and runs this file with
``ARGS`` (memscope.node.bootstrap_text). It makes the command's memscope importable only for the
moment of ``import memscope`` (a package's submodules are found through the package itself
afterwards: nothing stays on ``sys.path``), refuses another memscope already imported here, and
hands over to :mod:`memscope.agent.runtime.attached`. A failure raises: the caller writes it into
the run file as ``attach_failed``.
"""

import os
import sys


def _where(module):
    return os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))


def _main(args):
    try:
        st = os.stat(args["db"])
    except OSError:
        return  # the command gave up and removed it: nothing to record into
    if [st.st_dev, st.st_ino] != list(args["db_id"]):
        return  # not the file the command made: never write into it
    root = args["root"]
    have = sys.modules.get("memscope")
    if have is not None:
        version = getattr(have, "__version__", "?")
        if _where(have) != root or version != args["version"]:
            raise RuntimeError("this process already imported memscope %s from %s; the command is "
                               "memscope %s from %s: attach with that one" % (version, _where(have),
                                                                             args["version"], root))
    else:
        sys.path.insert(0, root)
        try:
            import memscope
        finally:
            try:
                sys.path.remove(root)
            except ValueError:
                pass
        if _where(memscope) != root:
            raise RuntimeError("import memscope found %s, not the command's %s" % (_where(memscope), root))
    from memscope.agent.runtime.attached import start

    start(args)


_main(ARGS)  # type: ignore[name-defined]  # noqa: F821 - given by the pending call
