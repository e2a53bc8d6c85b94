"""tools/compare_builds.py's pure-Python parts (the A/B itself needs a GPU and two builds)."""
from __future__ import annotations

import argparse

import pytest
from conftest import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("compare_builds")


def test_cases_are_op_and_version(tool):
    assert tool.parse_case("delta:8") == ("delta", 8)
    assert tool.parse_case("linear:12") == ("linear", 12)


@pytest.mark.parametrize("text", ["delta", "delta:", "delta:x", "mamba:2", ":3"])
def test_a_malformed_case_names_the_form_expected(tool, text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected op:version .* got {text!r}"):
        tool.parse_case(text)


def test_a_base_without_a_build_says_how_to_build_it(tool, tmp_path):
    (tmp_path / "minilin").mkdir()
    with pytest.raises(SystemExit, match="no extension built in .*: run `python setup.py build_ext --inplace` there"):
        tool.load_base_extension(tmp_path)
