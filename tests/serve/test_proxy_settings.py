"""`serve` loads without the proxy's web framework: the notebooks, the CLI and the nodes'
commands import it, and only the process that serves needs fastapi."""

import subprocess
import sys


def test_serve_imports_without_fastapi():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, lab_utils.serve, lab_utils.serve.router; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fastapi'))"],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
