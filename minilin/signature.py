"""What a mixer takes and returns, declared once in its own module as `SIGNATURE`.

    SIGNATURE = Signature(
        inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
                Tensor("g", "B T H", gate=True), Tensor("beta", "B T H")),
        output="B T H V", state="B H K V", gpu="delta")

Everything that needs to know a mixer's arguments reads this instead of keeping a list of its own: the input
checks (`Signature.check`), the named tuple of gradients (`Signature.gradients`), the layer stacks
(`minilin.hybrid`), the GPU front and benchmarks (`gpu`), and the tests.

Dimension letters (CONVENTIONS.md): B batch, T tokens, H heads, K key / query width, V value width, N state
size, P channels per head (Mamba-2), D channels (HGRN, Mamba-1, S4), R rank (Linformer). `step` drops T.
A tensor whose dims do not start with "B T" is a parameter (per head, per channel, per layer), not a
per-token input: Mamba-2's `A`, RWKV-6's `u`, S4's `dt`, `A`, `B`, `C`.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

from .backend import array_module
from .validation import Shapes, check_array, check_nonempty, common_dtype


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
    module, `shapes` the sizes bound to each letter, `dtype` the working dtype."""

    xp: object
    shapes: Shapes
    dtype: object
    arrays: dict

    def __getattr__(self, name):
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class Signature:
    """A mixer's arrays: positional `inputs` in order, array `keywords` (gamma, slope, ...), the dims of its
    output and of its fixed-size `state` (None when its memory is a cache of tokens, not one array), and the
    minilin.cuda op that serves its forward ("linear", "delta", "gla", "kda") or None."""

    inputs: tuple
    output: str
    state: str | None = "B H K V"
    keywords: tuple = ()
    gpu: str | None = None
    _gradients: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def names(self) -> tuple:
        return tuple(t.name for t in self.inputs)

    def tensor(self, name: str) -> Tensor:
        for t in self.inputs + self.keywords:
            if t.name == name:
                return t
        raise KeyError(name)

    def check(self, *arrays, step: bool = False, state=None, state_name: str | None = None,
              state_dims: str | None = None, extra: tuple = (), **keyword_arrays) -> Checked:
        """Check one call's arrays (positional `arrays` in signature order, then array keywords, then the
        state, then `extra`) and cast them to one floating dtype (float16 becomes float32). Every message
        names the argument, what was expected and what was given.

        step=True: the arrays hold one token (T dropped from every per-token dims); the state argument is
        then called `state`, else `initial_state`. `state_dims` overrides the signature's state dims.
        `extra`: (Tensor, array or None) pairs checked and cast with the rest, such as the arrays of a KV
        cache; they are returned under their Tensor's name and not affected by step.
        """
        if len(arrays) != len(self.inputs):
            raise TypeError(f"expected {len(self.inputs)} arrays ({', '.join(self.names)}), got {len(arrays)}")
        state_name = state_name or ("state" if step else "initial_state")
        specs = [(t, x) for t, x in zip(self.inputs, arrays)]
        specs += [(t, keyword_arrays.get(t.name)) for t in self.keywords]
        if state_dims or self.state:
            specs.append((Tensor(state_name, state_dims or self.state, optional=True), state))
        for t, x in specs:
            if x is None and not t.optional and t in self.inputs:
                raise TypeError(f"{t.name}: expected an array of shape [{', '.join(t.dims.split())}], got None")
        per_call = len(specs)
        specs += list(extra)
        given = [x for _, x in specs if x is not None]
        xp = array_module(*given)
        shapes = Shapes()
        for i, (t, x) in enumerate(specs):
            if x is not None:
                check_array(t.name, x, t.step_dims() if step and i < per_call else t.dims, shapes, xp)
        check_nonempty(shapes, [(t.name, t.dims) for t, x in specs if x is not None])
        dtype = common_dtype(xp, *given)
        cast = {t.name: None if x is None else x.astype(dtype, copy=False) for t, x in specs}
        if state_dims or self.state:
            cast["state"] = cast.pop(state_name)
        return Checked(xp, shapes, dtype, cast)

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
        if do is None:
            raise TypeError(f"do: expected an array of shape [{', '.join((output_dims or self.output).split())}] "
                            f"(the gradient of the loss with respect to the output), got None")
        do = check_array("do", do, output_dims or self.output, shapes, xp).astype(checked.dtype, copy=False)
        if dstate is not None:
            dims = state_dims or self.state
            if dims is None:
                raise ValueError("dstate: expected None (this mixer's memory is a cache of past tokens, not one "
                                 f"array: only its output is differentiated), got {type(dstate).__name__}")
            dstate = check_array("dstate", dstate, dims, shapes, xp).astype(checked.dtype, copy=False)
        return do, dstate


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))
