"""Fake runs for ``memscope estimate`` / ``fit``: the script under FakeTensorMode, no memory."""
