"""`SluiceDataSource`: the entry point Spark instantiates for `format("sluice")`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from sluicemq.spark import schema
from sluicemq.spark.options import OptionError, SinkOptions, SourceOptions
from sluicemq.spark.reader import SluiceBatchReader, SluicePushdownReader
from sluicemq.spark.schema import TEXT_SCHEMA
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
        fmt = opts.get("streams.format")
        if fmt is not None:
            if fmt.strip().lower() == "text":
                return TEXT_SCHEMA
            raise OptionError(f"option streams.format={fmt} parses the files' rows: give their "
                              "schema, e.g. .schema(\"region STRING, amount DOUBLE\") (extra "
                              "columns _stream_id, _stream_name, _offset are filled for you)")
        return schema.for_options(opts.get("mode", "messages").lower(), shape)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = _with_schema(SourceOptions.parse(self.options), schema)
        return SluicePushdownReader(opts) if opts.pushdown else SluiceBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(_with_schema(SourceOptions.parse(self.options), schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from sluicemq.spark.arrow_sink import SluiceBatchArrowWriter  # Arrow: writes only

        opts = SinkOptions.parse(self.options, streaming=False)
        return SluiceBatchArrowWriter(opts) if _arrow(self.options) else SluiceBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from sluicemq.spark.arrow_sink import SluiceStreamArrowWriter  # Arrow: writes only

        opts = SinkOptions.parse(self.options, streaming=True)
        return SluiceStreamArrowWriter(opts) if _arrow(self.options) else SluiceStreamWriter(opts)


def _with_schema(opts: SourceOptions, schema: StructType) -> SourceOptions:
    """Parsing files needs the query's schema on every executor (as JSON: it pickles)."""
    if opts.stream_format is None:
        return opts
    return replace(opts, file_schema=schema.json())


def _arrow(options: Mapping[str, str]) -> bool:
    """Option ``bulk`` (default true): the sink takes Arrow record batches and stages column
    batches; false: one SEND frame per row."""
    value = {str(k).lower(): str(v) for k, v in options.items()}.get("bulk", "true")
    return value.strip().lower() not in ("false", "0", "no")
