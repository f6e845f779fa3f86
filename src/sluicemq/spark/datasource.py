"""`SluiceDataSource`: the entry point Spark instantiates for `format("sluice")`."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from sluicemq.spark import schema
from sluicemq.spark.arrow_sink import SluiceBatchArrowWriter, SluiceStreamArrowWriter
from sluicemq.spark.options import OptionError, SinkOptions, SourceOptions
from sluicemq.spark.reader import SluiceBatchReader
from sluicemq.spark.stream_reader import SluiceStreamReader
from sluicemq.spark.writer import SluiceBatchWriter, SluiceStreamWriter


class SluiceDataSource(DataSource):
    """Read SluiceMQ queues, durable topic subscriptions and whole file streams; write rows
    back as persistent messages. Options are listed in docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> str:
        opts = {str(k).lower(): str(v) for k, v in self.options.items()}
        try:
            shape = schema.parse_shape(opts.get("headers"), opts.get("headercolumns"))
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        return schema.for_options(opts.get("mode", "messages").lower(), shape)

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = SinkOptions.parse(self.options, streaming=False)
        return SluiceBatchArrowWriter(opts) if _arrow(self.options) else SluiceBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = SinkOptions.parse(self.options, streaming=True)
        return SluiceStreamArrowWriter(opts) if _arrow(self.options) else SluiceStreamWriter(opts)


def _arrow(options: dict[str, str]) -> bool:
    """Option ``bulk`` (default true): the sink takes Arrow record batches and stages column
    batches; false: one SEND frame per row."""
    value = {str(k).lower(): str(v) for k, v in options.items()}.get("bulk", "true")
    return value.strip().lower() not in ("false", "0", "no")
