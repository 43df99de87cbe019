"""The example kernels, loaded by file path so ``examples/`` needs no package install.

Each ``examples/<name>/`` holds ``kernel.cu`` (the naive kernel), ``inputs.py``
(``make_inputs(rng, scale=1.0) -> KernelInputs``), ``reference.py``
(``reference(inputs) -> {buffer name: expected contents}``), ``example.toml`` and a README.
Load this module itself the same way::

    spec = importlib.util.spec_from_file_location("r3_examples_catalog", "examples/catalog.py")

The bytes and FLOPs formulas in ``example.toml`` are arithmetic expressions over the launch's
scalar arguments and whatever the example's optional ``problem_size(inputs)`` returns.
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal, cast

import numpy as np

from r3tui.errors import ConfigError
from r3tui.record.spec import KernelInputs, Scalar

EXAMPLES_DIR = Path(__file__).resolve().parent

Bound = Literal["memory", "compute"]
MakeInputs = Callable[..., KernelInputs]  # (rng, scale=1.0) -> KernelInputs
Reference = Callable[[KernelInputs], dict[str, np.ndarray]]
ProblemSize = Callable[[KernelInputs], Mapping[str, int | float]]


@dataclass(frozen=True)
class Example:
    """One example kernel with everything needed to record, check and benchmark it."""

    name: str
    path: Path  # the example's folder
    kernel_name: str  # the extern "C" entry point
    source: str  # kernel.cu as text
    make_inputs: MakeInputs
    reference: Reference
    bound: Bound
    description: str
    bytes_formula: str
    flops_formula: str
    problem_size: ProblemSize | None = None

    @property
    def kernel_path(self) -> Path:
        return self.path / "kernel.cu"

    @property
    def inputs_path(self) -> Path:
        return self.path / "inputs.py"

    def sizes(self, inputs: KernelInputs) -> dict[str, int | float]:
        """Names the formulas may use: scalar arguments, then ``problem_size``'s extras."""
        names: dict[str, int | float] = {
            a.name: a.value for a in inputs.args if isinstance(a, Scalar)
        }
        if self.problem_size is not None:
            names.update(self.problem_size(inputs))
        return names

    def bytes_moved(self, inputs: KernelInputs) -> float:
        """Compulsory DRAM traffic of one launch, for achieved-bandwidth reports."""
        return evaluate_formula(self.bytes_formula, self.sizes(inputs))

    def flops(self, inputs: KernelInputs) -> float:
        """Floating-point operations of one launch."""
        return evaluate_formula(self.flops_formula, self.sizes(inputs))


def list_examples() -> list[str]:
    """Names of the examples (folders with an ``example.toml``), sorted."""
    return sorted(p.parent.name for p in EXAMPLES_DIR.glob("*/example.toml"))


def load_example(name: str) -> Example:
    """Load ``examples/<name>/``; a bad name is a :class:`ConfigError` naming the known ones."""
    folder = EXAMPLES_DIR / name
    manifest = folder / "example.toml"
    if not manifest.is_file():
        known = ", ".join(list_examples())
        raise ConfigError(f"unknown example {name!r}", hint=f"known examples: {known}")
    with manifest.open("rb") as handle:
        meta = tomllib.load(handle)
    bound = meta.get("bound")
    if bound not in ("memory", "compute"):
        raise ConfigError(f"{manifest}: bound must be 'memory' or 'compute', got {bound!r}")
    inputs_module = _load_module(folder / "inputs.py", f"r3_example_{name}_inputs")
    reference_module = _load_module(folder / "reference.py", f"r3_example_{name}_reference")
    problem_size = getattr(inputs_module, "problem_size", None)
    return Example(
        name=name,
        path=folder,
        kernel_name=str(meta["kernel"]),
        source=(folder / "kernel.cu").read_text(),
        make_inputs=cast(MakeInputs, inputs_module.make_inputs),
        reference=cast(Reference, reference_module.reference),
        bound=cast(Bound, bound),
        description=str(meta.get("description", "")),
        bytes_formula=str(meta["bytes_formula"]),
        flops_formula=str(meta["flops_formula"]),
        problem_size=cast(ProblemSize | None, problem_size),
    )


def _load_module(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def evaluate_formula(formula: str, names: Mapping[str, int | float]) -> float:
    """Evaluate an arithmetic formula (``+ - * / // **``, numbers, ``names``), nothing else."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ConfigError(f"formula {formula!r} uses unknown size {node.id!r}")
            return float(names[node.id])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return float(_BINARY[type(node.op)](walk(node.left), walk(node.right)))
        raise ConfigError(f"formula {formula!r}: only arithmetic on sizes is allowed")

    try:
        tree = ast.parse(formula, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"formula {formula!r} is not an expression: {exc.msg}") from exc
    return walk(tree)
