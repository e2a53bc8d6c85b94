"""Where a kernel's time goes between its block barriers, from an ncu source page (SASS).

A chunk kernel or the WY prepare kernel is a sequence of phases separated by block barriers (BAR.SYNC), and
the questions its profile has to answer are per phase: how many of the warp-state samples fall in it, how many
of those wait at the barrier that opens it, what its warps stall on, and which instructions it issues. On the
GPU machine (the profile needs one; this script does not):

    ncu --clock-control none --set full --import-source yes -k regex:wy_prepare -c 1 -o prep \\
        python tools/profile_chunked.py delta:9
    ncu -i prep.ncu-rep --page source --csv --print-source sass > prep.csv
    python tools/ncu_regions.py prep.csv        # or: python -m tools.ncu_regions prep.csv

A region runs from one BAR.SYNC to the next, in address order (a loop with a barrier inside, such as the
WY waves, is one region). ncu charges a warp waiting at a barrier to the instruction after it, so a region's
"barrier" share is the wait at the barrier that opens it, not at the one that closes it.
"""
from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Region:
    first: str                       # the region's first instruction, to find it in the source page
    samples: int = 0
    instructions: int = 0
    stalls: dict = field(default_factory=dict)   # stall reason -> samples
    opcodes: dict = field(default_factory=dict)  # opcode without modifiers -> instructions executed


def kernels(lines) -> list[tuple[str, list[dict]]]:
    """(kernel name, rows) for each kernel of an ncu source page in CSV: a "Kernel Name" line, the header, the
    rows (one per SASS instruction)."""
    out, name, header = [], None, None
    for record in csv.reader(lines):
        if not record:
            continue
        if record[0] == "Kernel Name":
            name, header = record[1], None
            out.append((name, []))
        elif header is None:
            if name is None:
                raise ValueError("not an ncu source page: expected a 'Kernel Name' line first "
                                 "(ncu -i REP --page source --csv --print-source sass)")
            header = record
            missing = [c for c in ("Source", SAMPLES, EXECUTED) if c not in header]
            if missing:
                raise ValueError(f"the source page lacks the columns {missing}: export it with --print-source sass "
                                 "from a report taken with --set full")
        else:
            out[-1][1].append(dict(zip(header, record)))
    return out


def instruction(source: str) -> str:
    """The instruction with its modifiers, without a predicate: '@!P0 BAR.SYNC.DEFER_BLOCKING 0x0' ->
    'BAR.SYNC.DEFER_BLOCKING'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def opcode(source: str) -> str:
    """'@!P0 BRA 0x1230' -> 'BRA'; 'HMMA.16816.F32.BF16 R4, ...' -> 'HMMA'."""
    return instruction(source).split(".")[0]


def is_block_barrier(source: str) -> bool:
    """BAR.SYNC (all of the block, or a named barrier's threads), not BAR.ARV, which only arrives."""
    return instruction(source).startswith("BAR.SYNC")


def regions(rows: list[dict]) -> list[Region]:
    """The rows split after every BAR.SYNC, with their samples, stall reasons and opcodes summed."""
    def count(text: str) -> int:
        return int(text) if text and text.lstrip("-").isdigit() else 0

    stall_columns = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c] if rows else []
    out: list[Region] = []
    current = None
    for row in rows:
        source = row["Source"].strip()
        if current is None:
            current = Region(first=source)
            out.append(current)
        current.samples += count(row[SAMPLES])
        executed = count(row[EXECUTED])
        current.instructions += executed
        op = opcode(source)
        current.opcodes[op] = current.opcodes.get(op, 0) + executed
        for column in stall_columns:
            reason = column[len("stall_"):]
            current.stalls[reason] = current.stalls.get(reason, 0) + count(row[column])
        if is_block_barrier(source):
            current = None
    return out


def report(name: str, rows: list[dict], top: int = 4) -> str:
    parts = regions(rows)
    samples = sum(r.samples for r in parts) or 1
    executed = sum(r.instructions for r in parts) or 1
    lines = [f"{name}: {samples} samples, {executed} instructions executed, {len(parts)} regions"]
    for i, r in enumerate(parts):
        stalls = [kv for kv in sorted(r.stalls.items(), key=lambda kv: -kv[1]) if kv[1]][:top]
        ops = [kv for kv in sorted(r.opcodes.items(), key=lambda kv: -kv[1]) if kv[1]][:top]
        lines.append(f"  region {i} (from `{r.first[:48]}`): {100 * r.samples / samples:.1f}% of the samples, "
                     f"{100 * r.instructions / executed:.1f}% of the instructions")
        lines.append("    stalls (% of all samples): " + ", ".join(f"{k} {100 * v / samples:.1f}" for k, v in stalls))
        lines.append("    opcodes (% of all instructions): "
                     + ", ".join(f"{k} {100 * v / executed:.1f}" for k, v in ops))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu -i REP --page source --csv --print-source sass > FILE")
    parser.add_argument("--top", type=int, default=4, help="stall reasons and opcodes listed per region")
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as f:
        found = kernels(f)
    if not found:
        print(f"{args.csv}: no kernel in it", file=sys.stderr)
        return 1
    for name, rows in found:
        print(report(name, rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
