"""What a mixer takes and returns, declared once in its own module as `SIGNATURE`.

    SIGNATURE = Signature(
        inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
                Tensor("g", "B T H", gate=True), Tensor("beta", "B T H")),
        output="B T H V", state="B H K V", gpu="delta")

Everything that needs to know a mixer's arguments reads this instead of keeping a list of its own: the input
checks (`Signature.check`), the named tuple of gradients (`Signature.gradients`), the layer stacks
(`minilin.hybrid`), the GPU front and benchmarks (`gpu`), and the tests.

Dimension letters (CONVENTIONS.md): B batch, T tokens, H heads, HV value heads (grouped layout, below), K key /
query width, V value width, N state size (Mamba-2) or packed sequences (cu_seqlens, below), P channels per
head (Mamba-2), D channels (HGRN, Mamba-1; S4 calls its channels H), R rank (Linformer). `step` drops T.
A tensor whose dims do not start with "B T" is a parameter (per head, per channel, per layer), not a
per-token input: Mamba-2's `A`, RWKV-6's `u`, S4's `dt`, `A`, `B`, `C`.

Two layouts are bound here, for the mixers that declare them:
- grouped value heads (`minilin.heads`): a signature with `grouped=("q", "k")` lets v and everything on the
  value side (gates, beta, the state, the output) have HV heads, a multiple of q and k's H. `check` binds
  the letter HV for them (HV = H in the plain layout) and `Checked.group` = HV // H.
- packed sequences (`minilin.varlen`): `check(..., cu_seqlens=...)` checks the offsets (B = 1) and binds
  N, the number of sequences, as the state's first dim in place of B; `Checked.cu_seqlens` holds them.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

from .backend import array_module
from .validation import EMPTY_ALLOWED, Shapes, check_array, check_nonempty, common_dtype
from .varlen import check_cu_seqlens


@dataclass(frozen=True)
class Tensor:
    """One array argument: its name, its dims as letters, whether it may be None, whether it is a log-gate."""

    name: str
    dims: str
    optional: bool = False
    gate: bool = False  # a log-space decay, <= 0

    @property
    def per_token(self) -> bool:
        """A [B, T, ...] input (sliced by time), as opposed to a parameter."""
        return self.dims.split()[:2] == ["B", "T"]

    def step_dims(self) -> str:
        """The dims of one token's slice: T dropped."""
        return " ".join(d for d in self.dims.split() if d != "T")


@dataclass(frozen=True)
class Checked:
    """The checked arrays of one call, cast to one floating dtype, by name (None kept); `xp` the array
    module, `shapes` the sizes bound to each letter, `dtype` the working dtype; `group` the value heads per
    q/k head (HV // H, 1 in the plain layout); `cu_seqlens` the packed sequences' offsets as a tuple of ints,
    or None."""

    xp: object
    shapes: Shapes
    dtype: object
    arrays: dict
    group: int = 1
    cu_seqlens: tuple | None = None

    def __getattr__(self, name):
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class Signature:
    """A mixer's arrays: positional `inputs` in order, array `keywords` (gamma, slope, ...), the dims of its
    output and of its fixed-size `state` (None when its memory is a cache of tokens, not one array), and the
    minilin.cuda op that serves its forward ("linear", "delta", "gla", "kda") or None. `grouped`: the inputs
    that keep the query/key heads H when the value heads are grouped (GVA, `minilin.heads`); every other
    per-token input, the output and the state then count HV heads. () = the mixer has no grouped layout."""

    inputs: tuple
    output: str
    state: str | None = "B H K V"
    keywords: tuple = ()
    gpu: str | None = None
    grouped: tuple = ()
    _gradients: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def names(self) -> tuple:
        return tuple(t.name for t in self.inputs)

    def tensor(self, name: str) -> Tensor:
        for t in self.inputs + self.keywords:
            if t.name == name:
                return t
        raise KeyError(name)

    def value_dims(self, dims: str, *, packed: bool = False) -> str:
        """The dims of an array on the value side (not in `grouped`): H becomes HV where the mixer has the
        grouped layout; packed=True (a state under cu_seqlens): the leading B becomes N, one per sequence."""
        letters = dims.split()
        if self.grouped:
            letters = ["HV" if d == "H" else d for d in letters]
        if packed and letters[0] == "B":
            letters[0] = "N"
        return " ".join(letters)

    def check(self, *arrays, step: bool = False, state=None, state_name: str | None = None,
              state_dims: str | None = None, extra: tuple = (), cu_seqlens=None, **keyword_arrays) -> Checked:
        """Check one call's arrays (positional `arrays` in signature order, then array keywords, then the
        state, then `extra`) and cast them to one floating dtype (float16 becomes float32). Every message
        names the argument, what was expected and what was given.

        step=True: the arrays hold one token (T dropped from every per-token dims); the state argument is
        then called `state`, else `initial_state`. `state_dims` overrides the signature's state dims.
        `extra`: (Tensor, array or None) pairs checked and cast with the rest, such as the arrays of a KV
        cache; they are returned under their Tensor's name and not affected by step.

        Grouped value heads (a signature with `grouped`): the value-side arrays bind HV, which must be a
        multiple of H. cu_seqlens (not with step): checked after the per-token inputs (`varlen`), binding
        N = len(cu_seqlens) - 1, the state's first dim.
        """
        if len(arrays) != len(self.inputs):
            raise TypeError(f"expected {len(self.inputs)} arrays ({', '.join(self.names)}), got {len(arrays)}")
        if cu_seqlens is not None and step:
            raise TypeError("cu_seqlens: expected None in step (one token per sequence has no packing), "
                            f"got {type(cu_seqlens).__name__}")
        state_name = state_name or ("state" if step else "initial_state")
        specs = [(t if t.name in self.grouped else Tensor(t.name, self.value_dims(t.dims), t.optional, t.gate), x)
                 for t, x in zip(self.inputs, arrays)]
        specs += [(t, keyword_arrays.get(t.name)) for t in self.keywords]
        inputs = len(specs)
        if state_dims or self.state:
            dims = self.value_dims(state_dims or self.state, packed=cu_seqlens is not None)
            specs.append((Tensor(state_name, dims, optional=True), state))
        for t, x in specs[:len(self.inputs)]:
            if x is None and not t.optional:
                raise TypeError(f"{t.name}: expected an array of shape [{', '.join(t.dims.split())}], got None")
        per_call = len(specs)
        specs += list(extra)
        given = [x for _, x in specs if x is not None]
        xp = array_module(*given)
        shapes = Shapes()
        for i, (t, x) in enumerate(specs[:inputs]):
            if x is not None:
                check_array(t.name, x, t.step_dims() if step else t.dims, shapes, xp)
        # The inputs are bound: the layouts' own checks, before the state's shape depends on them.
        self._check_groups(shapes)
        cu = None
        if cu_seqlens is not None:
            if "N" in shapes.sizes:  # a mixer whose own arrays use N (Mamba-2's state size) cannot pack
                raise TypeError(f"cu_seqlens: expected None for a mixer whose arrays have a dim N (state size "
                                f"{shapes['N']}), got {type(cu_seqlens).__name__}")
            cu = check_cu_seqlens(cu_seqlens, shapes["B"], shapes["T"])
            shapes.sizes["N"] = len(cu) - 1
        for i, (t, x) in enumerate(specs[inputs:], start=inputs):
            if x is not None:
                check_array(t.name, x, t.step_dims() if step and i < per_call else t.dims, shapes, xp)
        # A cache may hold no entries yet (its P or L = 0), but a letter an input uses (Mamba-2's P channels) may not.
        in_inputs = {letter for t, x in specs[:inputs] if x is not None for letter in t.dims.split()}
        check_nonempty(shapes, [(t.name, t.dims) for t, x in specs if x is not None], EMPTY_ALLOWED - in_inputs)
        dtype = common_dtype(xp, *given)
        cast = {t.name: None if x is None else x.astype(dtype, copy=False) for t, x in specs}
        if state_dims or self.state:
            cast["state"] = cast.pop(state_name)
        group = shapes["HV"] // shapes["H"] if "HV" in shapes.sizes else 1
        return Checked(xp, shapes, dtype, cast, group, cu)

    def _check_groups(self, shapes: Shapes) -> None:
        """HV (the value heads) a multiple of H (the query/key heads): value head j reads q/k head
        j // (HV / H)."""
        if "HV" not in shapes.sizes or "H" not in shapes.sizes:
            return
        H, HV = shapes["H"], shapes["HV"]
        if H >= 1 and HV % H != 0:
            qk = " and ".join(self.grouped)
            value_side = [t.name for t in self.inputs if t.name not in self.grouped]
            raise ValueError(
                f"{qk}, {value_side[0]}: expected the value heads HV a multiple of the query/key heads H = {H} "
                f"(each q/k head shared by HV / H value heads), got {value_side[0]} with HV = {HV} heads and "
                f"{qk} with H = {H}")

    def gradients(self, mixer: str):
        """The named tuple a backward returns: `d<name>` for every positional array, every array keyword,
        and the initial state, in that order (CONVENTIONS.md, Gradients)."""
        if mixer not in self._gradients:
            fields = [f"d{t.name}" for t in self.inputs + self.keywords] + ["dinitial_state"]
            self._gradients[mixer] = namedtuple(f"{_camel(mixer)}Gradients", fields, defaults=(None,) * len(fields))
        return self._gradients[mixer]

    def check_cotangents(self, checked: Checked, do, dstate, *, output_dims: str | None = None,
                         state_dims: str | None = None):
        """Check `do` (the output's cotangent) and `dstate` (the final state's; None = zeros) against the
        shapes bound by `checked`, and cast them to its dtype. Mixers whose memory is a cache accept
        dstate=None only."""
        shapes = Shapes(**checked.shapes.sizes)
        xp = checked.xp
        output_dims = self.value_dims(output_dims or self.output)
        if do is None:
            raise TypeError(f"do: expected an array of shape [{', '.join(output_dims.split())}] "
                            f"(the gradient of the loss with respect to the output), got None")
        do = check_array("do", do, output_dims, shapes, xp).astype(checked.dtype, copy=False)
        if dstate is not None:
            dims = state_dims or self.state
            if dims is not None:
                dims = self.value_dims(dims, packed=checked.cu_seqlens is not None)
            if dims is None:
                raise ValueError("dstate: expected None (this mixer's memory is a cache of past tokens, not one "
                                 f"array: only its output is differentiated), got {type(dstate).__name__}")
            dstate = check_array("dstate", dstate, dims, shapes, xp).astype(checked.dtype, copy=False)
        return do, dstate


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))
