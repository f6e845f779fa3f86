"""Apache Spark integration: `SluiceDataSource`, a PySpark Python data source named `sluice`.

Needs the `spark` extra (`pip install sluicemq[spark]`). Register it once per session::

    from sluicemq.spark import SluiceDataSource
    spark.dataSource.register(SluiceDataSource)
    spark.readStream.format("sluice").option("destination", "/queue/orders").load()

How replay and exactly-once work is described in docs/spark.md.

``SluiceDataSource`` loads on first use (PEP 562): Spark unpickles a reader in processes that
plan and never read (one started for every streaming query), and importing a submodule should
not import Arrow and the sink there.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluicemq.spark.datasource import SluiceDataSource

__all__ = ["SluiceDataSource"]


def __getattr__(name: str) -> Any:
    if name == "SluiceDataSource":
        return importlib.import_module("sluicemq.spark.datasource").SluiceDataSource
    raise AttributeError(f"module 'sluicemq.spark' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
