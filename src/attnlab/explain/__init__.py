"""Explanations: the guided tour, head-by-head reports, and their rendering (``explain.render``).

To observe attention's intermediate tensors, use ``attnlab.observe.Recorder``.
"""
