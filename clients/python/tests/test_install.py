"""The package installs offline, as README.md says: plain pip install of the
checkout into a fresh venv, with no index and nothing else installed (the
project's own build backend needs nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PY = os.environ.get("KUNCI_INSTALL_PYTHON", sys.executable)


def _has(mod: str) -> bool:
    return subprocess.run([PY, "-c", "import " + mod], capture_output=True).returncode == 0


@unittest.skipUnless(_has("venv") and _has("ensurepip"), PY + " lacks venv (Debian: apt-get install python3-venv)")
class Install(unittest.TestCase):
    def test_pip_install_offline(self) -> None:
        tmp = tempfile.mkdtemp(prefix="kunci-py-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        venv = os.path.join(tmp, "venv")
        subprocess.run([PY, "-m", "venv", venv], check=True, capture_output=True)
        env = dict(os.environ, PIP_FIND_LINKS="", PIP_NO_INDEX="1")
        r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", str(HERE)],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        code = "import kunci, os; d = os.path.dirname(kunci.__file__); "
        code += "print(d, os.path.exists(os.path.join(d, 'py.typed')))"
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], cwd=tmp, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        where, typed = r.stdout.split()
        self.assertTrue(where.startswith(venv), where)
        self.assertEqual(typed, "True")
