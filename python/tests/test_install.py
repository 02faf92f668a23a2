"""README.md's install command works offline in a fresh venv (#41 item 1).

The command is read from README.md and python/README.md, so a README that
documents another route fails here. PIP_NO_INDEX=1 makes any attempt to
fetch a build dependency (setuptools, wheel) fail, as it does on a machine
without PyPI.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
# Debian's python3 (python3-venv), the interpreter README's prerequisites name.
PYTHON = os.environ.get("SPOTAGENT_TORCH_PYTHON", "/usr/bin/python3")
COMMAND = "pip install ./python"


class InstallTest(unittest.TestCase):
    def test_readmes_document_the_tested_command(self) -> None:
        for readme in ("README.md", os.path.join("python", "README.md")):
            with open(os.path.join(REPO, readme), encoding="utf-8") as f:
                text = f.read()
            self.assertIn("`%s`" % COMMAND if readme == "README.md" else COMMAND, text, readme)
            # The old routes that failed offline must not come back.
            self.assertNotRegex(text, r"no-build-isolation|setuptools\s*\(?>=", readme)

    def test_pip_install_offline_in_fresh_venv(self) -> None:
        tmp = tempfile.mkdtemp(prefix="spa-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        venv = os.path.join(tmp, "venv")
        subprocess.run([PYTHON, "-m", "venv", venv], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "SPOTAGENT_"))}
        env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HOME=tmp)
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
        # Exactly the documented command, from the repository root. The
        # build writes nothing into the checkout (no build/, no egg-info).
        def listing() -> list:
            return sorted(n for n in os.listdir(os.path.join(REPO, "python")) if n != "__pycache__")
        before = listing()
        r = subprocess.run(COMMAND.split(), cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(listing(), before)
        # Imported from the venv, not the checkout (cwd elsewhere), typed.
        code = ("import os, spotagent; d = os.path.dirname(spotagent.__file__); "
                "print(d); assert os.path.exists(os.path.join(d, 'py.typed')); "
                "import spotagent.torch, spotagent.dist")
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], cwd=tmp, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertTrue(r.stdout.strip().startswith(venv), r.stdout)
        self.assertTrue(re.search(r"site-packages", r.stdout), r.stdout)
        # pip names it with the version pyproject.toml gives.
        r = subprocess.run([os.path.join(venv, "bin", "pip"), "show", "spotagent"], env=env,
                           stdout=subprocess.PIPE, universal_newlines=True)
        self.assertIn("Version: 0.1.0", r.stdout)


if __name__ == "__main__":
    unittest.main()
