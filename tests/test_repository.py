"""Committed files name no absolute path of the machine they were made on (issue 12): commands in the docs run
from the repository root, and benchmark results record model paths relative to it."""

import re
import subprocess

import pytest

from tests.conftest import REPO

#: An absolute path under a folder that belongs to one machine (a home, a scratch or a work folder).
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users)/")
BINARY_SUFFIXES = (".onnx", ".npz", ".png", ".jpg")


def test_no_absolute_machine_paths_in_committed_files():
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed files cannot be listed")
    found = []
    for name in filter(None, listed.decode().split("\0")):
        path = REPO / name
        if name.endswith(BINARY_SUFFIXES) or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "absolute paths of this machine:\n" + "\n".join(found)
