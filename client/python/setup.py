"""Generates the gRPC stubs from ../../proto before the package is built (see flce/_codegen.py).

Install into a venv that sees Debian's torch/grpcio/numpy:
    /usr/bin/python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation client/python
"""
import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _codegen():
    # loaded by path: importing the flce package would import torch and the stubs
    spec = importlib.util.spec_from_file_location("flce_codegen", HERE / "flce" / "_codegen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithStubs(build_py):
    def run(self):
        codegen = _codegen()
        if codegen.stale(HERE):
            codegen.generate(out_dir=HERE)
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
