import subprocess
import sys


def test_importing_the_engine_loads_no_qt():
    code = (
        "import sys, pkgutil, importlib, specula.engine as engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'specula.engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'shiboken6'))]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
