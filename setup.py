"""Build script: the pure-Python package always; the CUDA extension when nvcc is found (see csrc/)."""
from setuptools import setup

setup()
