"""tools/ncu_regions.py on small hand-written source pages (the profile itself needs a GPU and ncu)."""
from __future__ import annotations

import pytest
from conftest import load_tool

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_short_sb","stall_barrier (Not Issued)"')


@pytest.fixture(scope="module")
def tool():
    return load_tool("ncu_regions")


def page(kernel: str, rows: list[tuple[str, int, int, int, int]]) -> list[str]:
    """An ncu source page: (source, samples, executed, barrier samples, short-scoreboard samples) per row."""
    lines = [f'"Kernel Name","{kernel}",', HEADER]
    for i, (source, samples, executed, barrier, short_sb) in enumerate(rows):
        lines.append(f'"0x{16 * i:x}","{source}","{samples}","0","{executed}","{barrier}","{short_sb}","{barrier}"')
    return lines


PREPARE = [
    ("LDC R1, c[0x0][0x28]", 10, 100, 0, 0),
    ("LDS R4, [R2]", 20, 100, 0, 15),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", 0, 100, 0, 0),
    ("HMMA.16816.F32.BF16 R8, R4, R6, R8", 40, 300, 30, 5),  # warps waiting at the barrier above
    ("@!P0 BAR.SYNC.DEFER_BLOCKING 0x1, 0x200", 0, 100, 0, 0),
    ("BAR.ARV 0x2, 0x40", 10, 100, 10, 0),                   # arrives only: no new region
    ("@P1 BRA 0x40", 20, 200, 0, 0),
]


def test_regions_split_after_each_block_barrier_only(tool):
    (name, rows), = tool.kernels(page("prepare<128>", PREPARE))
    parts = tool.regions(rows)
    assert name == "prepare<128>"
    assert [p.first for p in parts] == ["LDC R1, c[0x0][0x28]", "HMMA.16816.F32.BF16 R8, R4, R6, R8",
                                        "BAR.ARV 0x2, 0x40"]
    assert [p.samples for p in parts] == [30, 40, 30]
    assert [p.instructions for p in parts] == [300, 400, 300]
    assert parts[1].stalls == {"barrier": 30, "short_sb": 5}           # "(Not Issued)" columns are not summed
    assert parts[1].opcodes == {"HMMA": 300, "BAR": 100}
    assert parts[2].opcodes == {"BAR": 100, "BRA": 200}                # the predicate is not the opcode


def test_every_kernel_of_a_page_is_reported(tool):
    lines = page("first", PREPARE[:3]) + page("second", PREPARE[3:])
    found = tool.kernels(lines)
    assert [name for name, _ in found] == ["first", "second"]
    text = tool.report(*found[0])
    assert text.startswith("first: 30 samples, 300 instructions executed, 1 regions")
    assert "region 0 (from `LDC R1, c[0x0][0x28]`): 100.0% of the samples" in text
    assert "short_sb 50.0" in text


def test_a_file_that_is_not_a_source_page_says_how_to_make_one(tool):
    with pytest.raises(ValueError, match="not an ncu source page: expected a 'Kernel Name' line first"):
        tool.kernels(['"ID","Kernel Name","Duration"', '"0","k","1.0"'])


def test_a_page_without_the_sampling_columns_names_them(tool):
    lines = ['"Kernel Name","k",', '"Address","Source","Instructions Executed"', '"0x0","NOP","1"']
    with pytest.raises(ValueError, match=r"lacks the columns \['Warp Stall Sampling \(All Samples\)'\]"):
        tool.kernels(lines)


def test_the_command_line_prints_one_report_per_kernel(tool, tmp_path, capsys):
    path = tmp_path / "page.csv"
    path.write_text("\n".join(page("first", PREPARE) + page("second", PREPARE[:2])) + "\n")
    assert tool.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("instructions executed") == 2 and "second: 30 samples" in out
