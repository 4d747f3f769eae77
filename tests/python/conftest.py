"""pytest setup for the Python bindings' tests.

The tp package is imported from PYTHONPATH (tools/test.sh points it at
<build>/python) or from an installed wheel; failing both, from ./build/python.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import tp  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(_ROOT, os.environ.get("TP_BUILD_DIR", "build"), "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [sys.path[0], os.environ.get("PYTHONPATH")]))
    try:
        import tp  # noqa: F401
    except ImportError:
        # Without a build, the modules that need tp fail at their own `import tp`;
        # those that need only Python packages (test_checkpoint_makers.py) still run.
        pass
