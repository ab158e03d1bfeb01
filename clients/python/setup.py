"""Build hook: regenerates the gRPC stubs from ../../proto before setuptools collects packages.

Everything else (metadata, dependencies, package discovery) is in pyproject.toml. A build from the
repository (``pip install ./clients/python``) always regenerates, so the stubs match the proto the
package was built from; a build from an sdist, which has no ../../proto, uses the stubs the sdist
carries.
"""

import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402  (beside this file)

if generate.PROTO_ROOT.is_dir():
    generate.generate()
elif not (HERE / "src" / generate.GENERATED_PACKAGE).is_dir():
    sys.exit(f"neither {generate.PROTO_ROOT} nor stubs in src/: build from the repository")

setup()
