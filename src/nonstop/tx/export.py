"""Query results as Arrow tables and pandas frames, without Spark (A5).

Built page by page from :meth:`nonstop.tx.query.Query.pages` (or a remote
query's), so the Python objects of one page at a time are alive while the
Arrow columns grow.  pyarrow and pandas are optional: a missing one is a
one-line ImportError that names the package to install.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nonstop.model.managed import Managed, TypeInfo
from nonstop.model.ref import Ref


def _require(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"to_{package}() needs {package}: pip install {package} "
            "(or the project's extra: pip install 'nonstop[spark]')"
        ) from None


def _value(value: Any) -> Any:
    if isinstance(value, Managed):
        return value._e.ref
    if isinstance(value, Ref):
        return value.raw
    return value


def to_arrow(info: TypeInfo, pages: Iterable[list[Any]]) -> Any:
    """A ``pyarrow.Table`` with one column per field of ``info``, from pages of handles."""
    pa = _require("pyarrow", "pyarrow")
    names = list(info.fields)
    batches = []
    for page in pages:
        columns = {n: [_value(obj._e.state[n]) for obj in page] for n in names}
        batches.append(pa.RecordBatch.from_pydict(columns))
    if not batches:
        return pa.table({n: pa.array([], type=pa.null()) for n in names})
    schema = pa.unify_schemas([b.schema for b in batches], promote_options="permissive")
    return pa.Table.from_batches([b.cast(schema) for b in batches], schema=schema)


def to_pandas(info: TypeInfo, pages: Iterable[list[Any]]) -> Any:
    """A ``pandas.DataFrame`` of the results (through :func:`to_arrow`)."""
    _require("pandas", "pandas")
    return to_arrow(info, pages).to_pandas()
