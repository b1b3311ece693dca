"""The public face: uni.__all__ is complete, has no duplicates, and holds the SPEC names."""

from __future__ import annotations

import collections
import types

import pytest

import uni
import uni.concepts
import uni.cuda
import uni.storage

SPEC_2_METADATA = [
    "Extents", "dynamic_extent", "layout_right", "layout_left", "layout_stride",
    "DefaultAccessor", "ConstAccessor", "ConjugateAccessor", "ScaledAccessor",
    "TransformAccessor", "HOST", "CUDA", "MdSpec", "MdSpan", "concepts", "is_mdspec_like",
    "is_mdspan_like", "is_tensor_view", "is_immediate_tensor_view", "mdspec_of", "strides",
]
SPEC_2_CONCEPTS = [
    "MdspecLike", "MdspanLike", "StridedMdspecLike", "MutableMdspecLike", "TensorView",
    "MutableTensorView", "ImmediateTensorView", "ReadMdspanLease", "WriteMdspanLease",
    "ReadTensorLease", "WriteTensorLease", "TensorAccessState",
]
SPEC_3_TENSORS = ["Tensor", "empty", "zeros", "full", "from_numpy", "from_dlpack", "arange",
                  "storage"]
SPEC_3_STORAGE = ["HostStorage", "MappedFileStorage", "Storage"]
SPEC_3_TENSOR_MEMBERS = [
    "from_storage", "T", "transpose", "conj", "scaled", "as_readonly", "reshape", "shape",
    "dtype", "strides", "mapping", "accessor", "offset", "device", "storage", "mdspec",
    "backend_selector", "__getitem__",
]
SPEC_8_ERRORS = [
    "UniError", "LayoutError", "ShapeError", "DTypeError", "DomainError", "LeaseError",
    "LeaseReleasedError", "LeaseConflictError", "WouldBlockError", "PoisonedError",
    "KernelDispatchError", "CudaError",
]


def test_every_name_in_all_exists() -> None:
    missing = [name for name in uni.__all__ if not hasattr(uni, name)]
    assert missing == []


def test_all_lists_each_name_once() -> None:
    duplicates = [n for n, k in collections.Counter(uni.__all__).items() if k > 1]
    assert duplicates == []


def test_each_public_class_or_function_is_exported_under_one_name() -> None:
    names: dict[int, list[str]] = collections.defaultdict(list)
    for name in uni.__all__:
        obj = getattr(uni, name)
        if isinstance(obj, (type, types.FunctionType)):
            names[id(obj)].append(name)
    assert [n for n in names.values() if len(n) > 1] == []


def test_every_public_attribute_is_in_all() -> None:
    public = {
        name for name in dir(uni)
        if not name.startswith("_") and not isinstance(getattr(uni, name), types.ModuleType)
    }
    assert sorted(public - set(uni.__all__)) == []


@pytest.mark.parametrize("name", SPEC_2_METADATA + SPEC_3_TENSORS + SPEC_8_ERRORS)
def test_spec_name_is_exported(name: str) -> None:
    assert name in uni.__all__
    assert getattr(uni, name) is not None or name == "dynamic_extent"


@pytest.mark.parametrize("name", SPEC_2_CONCEPTS)
def test_spec_concept_exists(name: str) -> None:
    assert isinstance(getattr(uni.concepts, name), type)


@pytest.mark.parametrize("name", SPEC_3_STORAGE)
def test_spec_storage_name_exists(name: str) -> None:
    assert name in uni.storage.__all__
    assert isinstance(getattr(uni.storage, name), type)


@pytest.mark.parametrize("name", SPEC_3_TENSOR_MEMBERS)
def test_tensor_has_the_spec_member(name: str) -> None:
    assert hasattr(uni.Tensor, name)


def test_cuda_module_names_from_section_2() -> None:
    assert isinstance(uni.cuda.CudaPointerAccessor, type)
    assert callable(uni.cuda.is_available)


def test_storage_all_lists_existing_names_once() -> None:
    assert len(set(uni.storage.__all__)) == len(uni.storage.__all__)
    assert all(hasattr(uni.storage, name) for name in uni.storage.__all__)


def test_the_metadata_layer_does_not_import_leases_ops_or_backends() -> None:
    # Lower layers never import higher ones (STYLE: "a house you can read in an hour").
    import ast
    import pathlib

    root = pathlib.Path(uni.__file__).parent
    higher = ("uni._lease", "uni._acquire", "uni._core", "uni.backends", "uni.ops",
              "uni._operations", "uni._dispatch", "uni.plan")
    for module in ("_extents", "_mapping", "_accessor", "_mdspec", "concepts", "_dtypes",
                   "_errors"):
        tree = ast.parse((root / f"{module}.py").read_text())
        imported = {
            node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        } | {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert not {m for m in imported if m.startswith(higher)}, module
