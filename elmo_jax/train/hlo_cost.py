"""FLOPs and bytes of a compiled XLA program, counting every loop body once per trip.

XLA's own ``compiled.cost_analysis()`` counts a ``while`` body once, whatever its trip
count: a 20-step and a 40-step ``lax.scan`` report the same FLOPs.  The LSTM scans, the
remat chunks and the chunked softmax of a training step are such loops, so a roofline from
those totals undercounts.  :func:`loop_aware_cost` walks the optimized HLO text
(``compiled.as_text()``) instead:

* a computation costs the sum of its instructions; a ``while`` costs its body times its
  trip count (XLA's ``known_trip_count``, or read from the loop's condition
  ``i < N`` and the counter's initial constant; a loop whose bound is data, by the longest
  first axis of the arrays it steps through), a ``conditional`` its dearest branch;
* FLOPs: ``2 x output x contracted size`` per ``dot`` and ``convolution`` (TPU writes
  matmuls as convolutions), one per output element of elementwise arithmetic and one per
  input element of a ``reduce``, also inside fusions;
* bytes: per top-level instruction (a fusion is one), the operands it reads and the
  result it writes; an operand that is only sliced or gathered counts the slices, an
  in-place ``dynamic-update-slice`` or ``scatter`` the updated part, an asynchronous op
  once at its start, tuples, bitcasts and parameters nothing;
* memory spaces: by default every buffer counts.  ``on_chip=True`` (for a TPU program) counts
  in :attr:`Cost.bytes` only the buffers in HBM (a layout without ``S(n)``, or ``S(0)``) and
  puts those that XLA placed in on-chip memory (``S(1)``: VMEM, and the small ``S(2)``,
  ``S(4)`` scalar and flag spaces) in :attr:`Cost.on_chip_bytes`: a copy between the two
  counts its HBM side.  A TPU program keeps much of a loop's working set on chip (the LSTM
  scans' weights stay in VMEM across the steps), and only HBM traffic is bound by the HBM
  bandwidth of a roofline; ``bytes + on_chip_bytes`` is the upper bound that counts all of it.

Pure text processing: no jax import, the same on any backend's HLO.
"""

from __future__ import annotations

import dataclasses
import math
import re

_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b(pred|[subfc]\d+|f8e\w+|bf16)\[([\d,]*)\]")
# an array with its layout, whose ``S(n)`` names the memory space (none, or 0: the main memory)
_ARRAY_LAYOUT = re.compile(_ARRAY.pattern + r"(\{[^}]*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")
_FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
    "copy-done",
    "all-reduce-done",
    "all-gather-done",
    "collective-permute-done",
    "async-done",
    "send-done",
    "recv-done",
    "opt-barrier",
    "domain",
    "add-dependency",
}
_ELEMENTWISE = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "negate",
    "abs",
    "compare",
    "select",
    "clamp",
    "exponential",
    "log",
    "tanh",
    "logistic",
    "rsqrt",
    "sqrt",
    "power",
    "exponential-minus-one",
    "log-plus-one",
    "sign",
    "floor",
    "ceil",
    "round-nearest-even",
    "remainder",
    "and",
    "or",
    "xor",
    "not",
    "erf",
    "cosine",
    "sine",
    "atan2",
    "cbrt",
}
_SLICING = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    args: str  # the text inside the opcode's parentheses (a parameter's number, a constant's value)
    attrs: str
    is_root: bool


@dataclasses.dataclass(frozen=True)
class Cost:
    """Loop-aware totals of one program (per device for an SPMD program)."""

    flops: float
    bytes: float
    loops: tuple[tuple[str, int], ...]  # (while instruction, trip count) as found, outermost first
    unknown_trip_counts: int  # data-dependent loops, counted at the bound their stacked arrays give
    on_chip_bytes: float = 0.0  # with on_chip=True: the traffic of buffers in on-chip memory (not in bytes)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.loops + other.loops,
            self.unknown_trip_counts + other.unknown_trip_counts,
            self.on_chip_bytes + other.on_chip_bytes,
        )

    def times(self, n: int) -> "Cost":
        return Cost(self.flops * n, self.bytes * n, self.loops, self.unknown_trip_counts, self.on_chip_bytes * n)


ZERO = Cost(0.0, 0.0, (), 0)


def shape_elements_and_bytes(shape: str, main_memory_only: bool = False) -> tuple[int, float]:
    """Elements and bytes of an HLO shape string (a tuple's arrays added up);
    ``main_memory_only``: the bytes of the arrays whose layout puts them in memory space 0."""
    elements, nbytes = 0, 0.0
    for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        elements += n
        space = _SPACE.search(layout)
        if not (main_memory_only and space and space.group(1) != "0"):
            nbytes += n * _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 4)
    return elements, nbytes


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced brackets in HLO line: {text[:200]}")


def _parse_instruction(line: str) -> Instruction | None:
    line = line.strip()
    is_root = line.startswith("ROOT ")
    if is_root:
        line = line[5:]
    if " = " not in line or not line.startswith("%"):
        return None
    name, rest = line[1:].split(" = ", 1)
    if rest.startswith("("):
        end = _closing(rest, 0)
        shape, rest = rest[: end + 1], rest[end + 1 :].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren]
    end = _closing(rest, paren)
    operands = tuple(m for part in _split_top(rest[paren + 1 : end]) for m in _NAME.findall(part)[-1:])
    return Instruction(name, shape, opcode, operands, rest[paren + 1 : end], rest[end + 1 :], is_root)


def parse_hlo(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """``({computation: instructions}, entry computation name)`` of an HLO module's text."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header and not line.startswith(" "):
            current = header.group(1)
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is not None:
            inst = _parse_instruction(line)
            if inst is not None:
                computations[current].append(inst)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text: pass compiled.as_text()")
    return computations, entry


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+|\{{[^}}]*\}})", attrs)
    return m.group(1) if m else None


class _Walker:
    def __init__(self, computations: dict[str, list[Instruction]], main_memory_only: bool = False):
        self.computations = computations
        self.main_memory_only = main_memory_only
        self.by_name = {c: {i.name: i for i in insts} for c, insts in computations.items()}
        self._flops_cache: dict[str, float] = {}
        self.records: list[tuple[float, float, int, str, str, str]] = []  # bytes, flops, trips, comp, name, op

    # -- FLOPs inside a computation, fusions included ----------------------------------
    def flops_of(self, comp: str) -> float:
        if comp not in self._flops_cache:
            self._flops_cache[comp] = sum(self._inst_flops(comp, i) for i in self.computations.get(comp, []))
        return self._flops_cache[comp]

    def _inst_flops(self, comp: str, inst: Instruction) -> float:
        out_elems, _ = shape_elements_and_bytes(inst.shape)
        op = inst.opcode
        if op == "fusion":
            return self.flops_of(_attr(inst.attrs, "calls") or "")
        if op == "dot":
            lhs = self.by_name[comp].get(inst.operands[0])
            dims = _attr(inst.attrs, "lhs_contracting_dims") or "{}"
            if lhs is None:
                return 0.0
            lhs_dims = _dims(lhs.shape)
            contracted = math.prod(lhs_dims[int(d)] for d in dims.strip("{}").split(",") if d)
            return 2.0 * out_elems * contracted
        if op == "convolution":
            kernel = self.by_name[comp].get(inst.operands[1])
            labels = _attr(inst.attrs, "dim_labels") or ""
            if kernel is None or "_" not in labels:
                return 0.0
            k_labels = labels.split("_")[1].split("->")[0]
            k_dims = _dims(kernel.shape)
            o = k_labels.find("o")
            per_output = math.prod(k_dims) / (k_dims[o] if 0 <= o < len(k_dims) else 1)
            return 2.0 * out_elems * per_output
        if op in _ELEMENTWISE:
            return float(out_elems)
        if op in ("reduce", "reduce-window"):
            operand = self.by_name[comp].get(inst.operands[0]) if inst.operands else None
            return float(shape_elements_and_bytes(operand.shape)[0]) if operand else float(out_elems)
        return 0.0

    # -- bytes of one top-level instruction -----------------------------------------------
    def _bytes(self, shape: str) -> float:
        return shape_elements_and_bytes(shape, self.main_memory_only)[1]

    def _operand_bytes(self, comp: str, name: str) -> float:
        inst = self.by_name[comp].get(name)
        return self._bytes(inst.shape) if inst else 0.0

    def _fusion_bytes(self, comp: str, inst: Instruction) -> float:
        fused = _attr(inst.attrs, "calls") or ""
        body = self.computations.get(fused, [])
        params = {i.name: _param_index(i) for i in body if i.opcode == "parameter"}
        read = 0.0
        for pname, index in params.items():
            if index < len(inst.operands):
                full = self._operand_bytes(comp, inst.operands[index])
                read += min(full, self._param_read(fused, pname, full, 0))
        root = next((i for i in body if i.is_root), None)
        if self.main_memory_only:  # a fused computation's own shapes seldom say where its result goes
            outputs = _split_top(inst.shape[1:-1]) if inst.shape.startswith("(") else [inst.shape]
            if root is not None and root.opcode == "tuple" and len(root.operands) == len(outputs):
                names = self.by_name[fused]
                return read + sum(
                    min(self._bytes(out), self._written(fused, names.get(o), names[o].shape if o in names else ""))
                    for o, out in zip(root.operands, outputs)
                )
            return read + min(self._bytes(inst.shape), self._written(fused, root, inst.shape))
        return read + self._written(fused, root, inst.shape)

    def _param_read(self, comp: str, name: str, full: float, depth: int) -> float:
        """Bytes read of the value ``name`` of fused computation ``comp`` (``full`` if read
        whole): only its slices where it is only sliced, nothing where it is only updated in
        place, following bitcasts and nested fusions."""
        if depth > 16:
            return full
        read = 0.0
        for user in (i for i in self.computations.get(comp, []) if name in i.operands):
            if user.opcode in _SLICING and user.operands[0] == name:
                read += shape_elements_and_bytes(user.shape)[1]  # bounded by the operand's bytes above
            elif user.opcode in ("dynamic-update-slice", "scatter") and user.operands[0] == name:
                continue
            elif user.opcode == "bitcast":
                read += self._param_read(comp, user.name, full, depth + 1)
            elif user.opcode == "fusion":
                inner = _attr(user.attrs, "calls") or ""
                params = {_param_index(i): i.name for i in self.computations.get(inner, []) if i.opcode == "parameter"}
                for k, o in enumerate(user.operands):
                    if o == name and k in params:
                        read += self._param_read(inner, params[k], full, depth + 1)
            else:
                return full
            if read >= full:
                return full
        return read

    def _written(self, comp: str, root: Instruction | None, shape: str) -> float:
        if root is None:
            return shape_elements_and_bytes(shape)[1]
        names = self.by_name[comp]
        if root.opcode == "tuple":
            return sum(self._written(comp, names.get(o), names[o].shape if o in names else "") for o in root.operands)
        if root.opcode == "dynamic-update-slice":
            return self._operand_bytes(comp, root.operands[1])
        if root.opcode == "scatter":
            return self._operand_bytes(comp, root.operands[-1])
        return shape_elements_and_bytes(root.shape)[1]

    def _inst_bytes(self, comp: str, inst: Instruction) -> float:
        op = inst.opcode
        if op in _FREE or op in ("while", "conditional", "call"):
            return 0.0
        out = self._bytes(inst.shape)
        if op == "fusion":
            return self._fusion_bytes(comp, inst)
        if op in _SLICING:  # the slice read (where its source is counted) and written
            source_counted = bool(inst.operands) and self._operand_bytes(comp, inst.operands[0]) > 0
            read = shape_elements_and_bytes(inst.shape)[1] if source_counted else 0.0
            return out + read + sum(self._operand_bytes(comp, o) for o in inst.operands[1:])
        if op == "dynamic-update-slice":  # the update read, and written in place where the buffer is counted
            update = self.by_name[comp].get(inst.operands[1])
            update_all = shape_elements_and_bytes(update.shape)[1] if update else 0.0
            return self._operand_bytes(comp, inst.operands[1]) + (update_all if out > 0 else 0.0)
        if op == "scatter":
            return 2.0 * self._operand_bytes(comp, inst.operands[-1]) + self._operand_bytes(comp, inst.operands[1])
        if op == "copy-start":  # (source, destination, context): each side where it is counted
            parts = _split_top(inst.shape[1:-1]) if inst.shape.startswith("(") else []
            destination = self._bytes(parts[1]) if len(parts) > 1 else self._operand_bytes(comp, inst.operands[0])
            return self._operand_bytes(comp, inst.operands[0]) + destination
        if op == "slice-start":  # an asynchronous slice: its tuple repeats the operand, only the slice moves
            operands = [self.by_name[comp].get(o) for o in inst.operands]
            slice_all = shape_elements_and_bytes(inst.shape)[1] - sum(
                shape_elements_and_bytes(o.shape)[1] for o in operands if o
            )
            slice_counted = out - sum(self._operand_bytes(comp, o) for o in inst.operands)
            source_counted = any(self._operand_bytes(comp, o) > 0 for o in inst.operands)
            return max(slice_counted, slice_all if source_counted else 0.0)
        if op.endswith("-start"):  # asynchronous collectives: the tuple holds the operands and the results
            return out
        if op.endswith("-done"):
            return 0.0
        return out + sum(self._operand_bytes(comp, o) for o in inst.operands)

    # -- the walk -----------------------------------------------------------------------
    def cost(self, comp: str, depth: int = 0, trips_outside: int = 1) -> Cost:
        if depth > 64:
            raise ValueError("HLO computations nest deeper than 64 levels")
        total = ZERO
        for inst in self.computations.get(comp, []):
            if inst.opcode == "while":
                body, cond = _attr(inst.attrs, "body"), _attr(inst.attrs, "condition")
                known = self.trip_count(comp, inst, cond)
                trips = known or _stacked_bound(inst.shape)
                # "" (no computation has that name) for a missing one: it costs nothing, as before
                inner = self.cost(body or "", depth + 1, trips_outside * trips) + self.cost(
                    cond or "", depth + 1, trips_outside * trips
                )
                found = Cost(0.0, 0.0, ((inst.name, trips),), 0 if known else 1)
                total = total + found + inner.times(trips)
            elif inst.opcode == "conditional":
                branches = re.findall(r"%([\w.\-]+)", _attr(inst.attrs, "branch_computations") or "")
                branches += [
                    b for b in (_attr(inst.attrs, "true_computation"), _attr(inst.attrs, "false_computation")) if b
                ]
                costs = [self.cost(b, depth + 1, trips_outside) for b in branches]
                total = total + max(costs, key=lambda c: c.flops + c.bytes, default=ZERO)
            elif inst.opcode in ("call", "async-start") or (inst.opcode.endswith("-start") and "calls=" in inst.attrs):
                total = total + self.cost(
                    _attr(inst.attrs, "to_apply") or _attr(inst.attrs, "calls") or "", depth + 1, trips_outside
                )
            else:
                one = Cost(self._inst_flops(comp, inst), self._inst_bytes(comp, inst), (), 0)
                self.records.append(
                    (one.bytes * trips_outside, one.flops * trips_outside, trips_outside, comp, inst.name, inst.opcode)
                )
                total = total + one
        return total

    def trip_count(self, comp: str, loop: Instruction, cond: str | None) -> int | None:
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
        if known:
            return int(known.group(1))
        body = self.computations.get(cond or "", [])
        names = self.by_name.get(cond or "", {})
        root = next((i for i in body if i.is_root), None)
        while root is not None and root.opcode == "fusion":  # a wrapped compare
            fused = self.computations.get(_attr(root.attrs, "calls") or "", [])
            inner = next((i for i in fused if i.is_root), None)
            if inner is None or inner.opcode != "compare":
                return None
            args = [names.get(o) for o in root.operands]
            order = [_param_index(next(i for i in fused if i.name == o)) for o in inner.operands]
            root = Instruction(
                root.name, root.shape, "compare", tuple(a.name for k in order if (a := args[k])), "", inner.attrs, True
            )
        if root is None or root.opcode != "compare" or len(root.operands) != 2:
            return None
        direction = _attr(root.attrs, "direction")
        a, b = (names.get(o) for o in root.operands)
        if a is None or b is None:
            return None
        limit_first = a.opcode == "constant"
        counter, limit = (b, a) if limit_first else (a, b)
        if limit.opcode != "constant" or counter.opcode != "get-tuple-element":
            return None
        n = _constant_value(limit)
        index = int(_attr(counter.attrs, "index") or -1)
        init = self._initial_value(comp, loop, index)
        if n is None or init is None:
            return None
        if limit_first:  # N > i  ==  i < N
            flipped: dict[str | None, str | None] = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}
            direction = flipped.get(direction, direction)
        trips_for: dict[str | None, int] = {
            "LT": n - init,
            "LE": n - init + 1,
            "GT": init - n,
            "GE": init - n + 1,
            "NE": abs(n - init),
        }
        trips = trips_for.get(direction)
        return trips if trips and trips > 0 else None

    def _initial_value(self, comp: str, loop: Instruction, index: int) -> int | None:
        names = self.by_name[comp]
        init = names.get(loop.operands[0]) if loop.operands else None
        if init is None or init.opcode != "tuple" or not 0 <= index < len(init.operands):
            return None
        value = names.get(init.operands[index])
        while value is not None and value.opcode in ("copy", "bitcast", "convert") and value.operands:
            value = names.get(value.operands[0])
        return _constant_value(value) if value is not None and value.opcode == "constant" else None


def _stacked_bound(shape: str) -> int:
    """A loop whose trip count depends on data (e.g. an LSTM run to the longest sentence of
    a batch) steps through arrays stacked along their first axis: their longest first axis
    (arrays of rank >= 3) bounds its trips; 1 when it carries none."""
    firsts = [int(dims.split(",")[0]) for _, dims in _ARRAY.findall(shape) if dims.count(",") >= 2]
    return max(firsts, default=1)


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _param_index(inst: Instruction) -> int:
    return int(inst.args) if inst.args.strip().isdigit() else -1


def _constant_value(inst: Instruction | None) -> int | None:
    if inst is None or not re.fullmatch(r"\s*-?\d+\s*", inst.args):
        return None
    return int(inst.args)


def biggest(
    hlo_text: str, top: int = 12, by: str = "bytes", on_chip: bool = False
) -> list[tuple[float, float, int, str, str, str]]:
    """The ``top`` instructions by total bytes (or ``by="flops"``), loops multiplied out:
    ``(bytes, flops, trips, computation, instruction, opcode)``; where a program's traffic goes
    (``on_chip=True``: its main-memory traffic, as :func:`loop_aware_cost`)."""
    computations, entry = parse_hlo(hlo_text)
    walker = _Walker(computations, main_memory_only=on_chip)
    walker.cost(entry)
    return sorted(walker.records, key=lambda r: -(r[0] if by == "bytes" else r[1]))[:top]


def loop_aware_cost(hlo_text: str, on_chip: bool = False) -> Cost:
    """FLOPs and bytes of the optimized HLO module ``hlo_text`` (``compiled.as_text()``)
    with every ``while`` body counted once per trip; per device for an SPMD program.

    ``on_chip=True``: ``bytes`` counts main memory (HBM) only and ``on_chip_bytes`` the rest
    (see the module's docstring); for programs whose ``S(n)`` spaces are on-chip, as a TPU's."""
    computations, entry = parse_hlo(hlo_text)
    every = _Walker(computations).cost(entry)
    if not on_chip:
        return every
    main = _Walker(computations, main_memory_only=True).cost(entry)
    return dataclasses.replace(main, on_chip_bytes=every.bytes - main.bytes)
