"""Load deploy/k8s/components/confidential/render_initdata.py as the module `deploy_initdata`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "components" / "confidential" / "render_initdata.py"
_spec = importlib.util.spec_from_file_location("deploy_initdata", _PATH)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
sys.modules["deploy_initdata"] = _module
