"""Apache Spark integration: `SluiceDataSource`, a PySpark Python data source named `sluice`.

Needs the `spark` extra (`pip install sluicemq[spark]`). Register it once per session::

    from sluicemq.spark import SluiceDataSource
    spark.dataSource.register(SluiceDataSource)
    spark.readStream.format("sluice").option("destination", "/queue/orders").load()

How replay and exactly-once work is described in docs/spark.md.
"""

from sluicemq.spark.datasource import SluiceDataSource

__all__ = ["SluiceDataSource"]
