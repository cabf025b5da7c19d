import os
import tempfile

# keep the tests' caches, settings and history away from the user's own
_tmp = tempfile.mkdtemp(prefix="specula-test-")
os.environ.setdefault("SPECULA_CONFIG_DIR", os.path.join(_tmp, "config"))
os.environ.setdefault("SPECULA_DATA_DIR", os.path.join(_tmp, "data"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
