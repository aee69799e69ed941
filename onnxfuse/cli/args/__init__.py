"""Option groups shared by the commands, each declared once: a decorator that adds the group's options to a
command (in the order ``--help`` shows them) and a function that turns the parsed values into the library's
options or arguments, raising :class:`onnxfuse.errors.InputError` for a value click cannot check.

The library is imported inside those functions, not here: click parses the command line before it calls a
command, so ``--help``, ``--version`` and usage errors answer without loading it. The choices ``--help`` shows are
therefore spelled out in these modules; tests/test_startup.py checks them against the library's own lists.
"""
