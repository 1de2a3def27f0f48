"""The kinds' registry is the one place that knows the kinds: nothing else branches on a kind's name.

`test_no_kind_branch_outside_the_kinds` reads every module of the four packages (as Python, not text) and
fails on a `kind ==` or `kind in` branch, a lookup by a spec's kind, or a table of kind names outside
configs/kinds/ and the worker modules a kind names (its runtimes and operations), where such code belongs.
The other tests hold the registry to what its users rely on.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from shoal.configs import ConfigError, ModelSpec
from shoal.configs import kinds as registry
from shoal.configs.kinds import KINDS, Kind, kind_of
from shoal.configs.kinds.kind import OPTION_FLAGS, InvalidRequest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("configs", "scheduler_plugins", "workers", "pipeline", "shoal")
NAMES = {kind.name for kind in KINDS}


def _module_file(module: str) -> Path:
    """The repository file of a `shoal.PACKAGE.x.y` module."""
    parts = module.split(".")[1:]
    return ROOT.joinpath(*parts).with_suffix(".py")


def _kinds_own_files() -> set[Path]:
    """Where kind-specific code may live: the registry's package and every module a kind names."""
    own = set((ROOT / "configs" / "kinds").glob("*.py"))
    for kind in KINDS:
        own |= {_module_file(path.partition(":")[0]) for path in kind.runtimes.values()}
        own |= {_module_file(module) for module in kind.operations.values()}
    return own


def _names_a_kind(node: ast.AST) -> bool:
    """A string constant naming a kind, anywhere in `node` (a tuple of them, a set, ...)."""
    return any(isinstance(n, ast.Constant) and n.value in NAMES for n in ast.walk(node))


def _mentions_kind(node: ast.AST) -> bool:
    return "kind" in ast.unparse(node).lower()


def _a_specs_kind(node: ast.AST) -> bool:
    """`spec.kind`, `self.spec.kind`, `specs[name].kind`: a model's kind, never a device's or a media type's."""
    return isinstance(node, ast.Attribute) and node.attr == "kind" and "spec" in ast.unparse(node.value).lower()


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring constants: prose may name kinds."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def kind_branches(source: str) -> list[tuple[int, str]]:
    """(line, code) of each kind branch, lookup by kind, or table of kind names in `source`."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops
        ):
            sides = [node.left, *node.comparators]
            if any(_a_specs_kind(side) for side in sides) or (
                any(_names_a_kind(side) for side in sides) and any(_mentions_kind(side) for side in sides)
            ):
                found.append(node)
        elif isinstance(node, ast.Match) and (_a_specs_kind(node.subject) or _mentions_kind(node.subject)):
            found.append(node.subject)  # match spec.kind: case "sparse": ...
        elif isinstance(node, ast.Subscript) and _a_specs_kind(node.slice):
            found.append(node)  # TABLE[spec.kind]
        elif isinstance(node, ast.Dict) and sum(k is not None and _names_a_kind(k) for k in node.keys) > 1:
            found.append(node)  # a table keyed by kinds (one such key is a field's name: an eval report's "reranker")
        elif isinstance(node, ast.Call) and any(
            isinstance(a, ast.Constant) and a.value in NAMES for a in [*node.args, *(k.value for k in node.keywords)]
        ):
            found.append(node)  # model_for(..., "reranker"), ModelSpec(kind="embedder")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and any(
            isinstance(e, ast.Constant) and e.value in NAMES and id(e) not in prose for e in node.elts
        ):
            found.append(node)  # a tuple of kind names, a Literal's
    return sorted({(node.lineno, ast.unparse(node)[:100]) for node in found})


def test_the_guard_finds_each_form_of_kind_branch():
    """The check itself: each way of branching on kinds is found, and what is not one is left alone."""
    branches = [
        'if spec.kind == "sparse":\n    pass',
        'x = spec.kind in ("embedder", "reranker")',
        'x = self.spec.kind != "classifier"',
        "x = spec.kind in OPERATION_OF",
        'if kind == "sparse":\n    pass',
        'x = kind_of(spec).name == "reranker"',
        "x = JUDGES[spec.kind]",
        'spec = model_for(catalog, profile, name, "reranker")',
        'spec = ModelSpec(name=name, kind="embedder", dim=1, max_seq_length=1)',
        'TABLE = {"embedder": "embed", "sim": "embed"}',
        'KINDS = ("token_classifier", "span_extractor")',
        'Kind = Literal["embedder", "reranker"]',
        'match spec.kind:\n    case "sparse":\n        pass',
    ]
    for code in branches:
        assert kind_branches(code), code
    allowed = [
        'x = plan.kind == "cuda"',
        "x = kind == MSGPACK",
        'x = matrix.dtype.kind == "f"',
        'x = reply["sparse"]',
        'report = {"model": model, "reranker": reranker}',
        "x = kind_of(spec).operation == op",
        'def f():\n    """A sparse or reranker model."""',
    ]
    for code in allowed:
        assert not kind_branches(code), code


def test_no_kind_branch_outside_the_kinds():
    """Adding a kind touches its own modules and the registry's list: nothing else names kinds."""
    own = _kinds_own_files()
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in own:
                continue
            for line, code in kind_branches(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {code}")
    assert offenders == [], "ask the kinds' registry (configs/kinds) instead:\n" + "\n".join(offenders)


def test_each_kind_names_worker_code_that_exists():
    """Every runtime class and operation module a kind names imports, and has what its callers call."""
    for kind in KINDS:
        for runtime, path in kind.runtimes.items():
            module, _, name = path.partition(":")
            assert callable(getattr(importlib.import_module(module), name)), (kind.name, runtime, path)
        for op, module_name in kind.operations.items():
            module = importlib.import_module(module_name)
            for stage in ("read", "compute", "write"):
                assert callable(getattr(module, stage, None)), (kind.name, op, stage)
        if kind.route is not None or kind.operation in ("embed", "rerank"):  # its route's, or the API formats'
            assert callable(getattr(importlib.import_module(kind.operations[kind.operation]), "online", None)), kind


def test_an_operation_is_one_module_and_one_route():
    """Kinds that share an operation share its module and its route's answer shape."""
    for kind in KINDS:
        for op in kind.operations:
            assert registry.operation_module(op) == kind.operations[op]
    for op, action in registry.routes().items():
        sharing = registry.for_operation(op)
        assert all(k.route is not None and k.route.action == action for k in sharing), op
    with pytest.raises(ValueError, match="no kind of model runs the operation 'encode'"):
        registry.operation_module("encode")


def test_names_are_unique_and_specs_are_checked_against_them():
    assert len(NAMES) == len(KINDS)
    assert kind_of("sparse").operation == "sparse"
    with pytest.raises(ValueError, match="unknown kind 'colbert': one of span_extractor, image_embedder, reranker"):
        ModelSpec(name="m", kind="colbert", dim=8, max_seq_length=16)


def test_a_job_option_the_kind_does_not_take_is_refused_naming_who_takes_it():
    spec = ModelSpec(name="dense", kind="embedder", dim=8, max_seq_length=16)
    with pytest.raises(ConfigError, match=r"kind 'embedder', which takes no --top-k: an option of sparse, classifier"):
        kind_of(spec).check_job({"top_k": 3}, spec)
    kind_of(spec).check_job({"chunk": object(), "prompt": "query: "}, spec)  # its own options pass
    assert set(OPTION_FLAGS) >= {option for kind in KINDS for option in kind.options}


def test_a_span_extractor_needs_labels_and_reads_texts_whole():
    spec = ModelSpec(name="gliner", kind="span_extractor", dim=8, max_seq_length=16)
    with pytest.raises(ConfigError, match="name the entities with --labels"):
        kind_of(spec).check_job({}, spec)
    with pytest.raises(ConfigError, match="no --chunk windows"):
        kind_of(spec).check_job({"labels": ["person"], "chunk": object()}, spec)
    fields: dict = {"texts": ["a"]}
    kind_of(spec).route.parse({"labels": ["person"], "multi_label": True}, fields, spec)
    assert fields == {"texts": ["a"], "labels": ["person"], "multi_label": True}
    with pytest.raises(InvalidRequest, match="name the entities in labels"):
        kind_of(spec).route.parse({}, {"texts": ["a"]}, spec)


def test_measured_kinds_are_those_with_more_than_torch():
    measured = {kind.name for kind in KINDS if kind.measured}
    assert measured == {"embedder", "reranker", "image_embedder"}
    assert all(isinstance(kind, Kind) and next(iter(kind.runtimes)) == "torch" for kind in KINDS)
