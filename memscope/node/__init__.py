"""Code that reaches processes memscope did not launch: what a process is (from /proc), the
agent injected into a running one and detached from it, and the node-wide view.

Nothing here imports torch or textual: it reads processes from outside; the only thing it puts
inside one is the agent that ``memscope attach --pid`` injects.
"""
