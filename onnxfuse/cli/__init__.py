"""The ``onnxfuse`` command line. ``main`` holds the click group; each command is a module of its own (``optimize``,
``report``, ``bench``, ``verify``, ``passes``, ``batch``); the pieces they share are ``exits`` (exit codes, one
line per error), ``console`` (stderr logging, -v/-q, progress), ``files`` (report files, output checks) and
``version``. An option that several commands take belongs to a group in ``args/``, declared there once with the
function that turns its values into the library's options; a new command takes the group's decorator and calls
that function.
"""
